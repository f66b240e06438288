"""Repartitioning through the broker: a feed's rows republished to their partitions.

When a feed's partitioning does not follow the table's buckets (one stream
of every key, or partitions by another field), rows of one key may arrive at
any worker. A repartitioner reads that feed and republishes each row to its
partition of an aligned feed (partition = bucket, see ``partitions.py``),
which the workers read. Kafka Streams' repartition topics and Flink's
``keyBy`` do the same.

:class:`RepartitionWriter` is a writer for :func:`~lance_async.feeds.ingest`:
``ingest(source_feed, RepartitionWriter(...))`` decodes each micro-batch
(dead-lettering bad messages), splits its rows by partition, publishes one
NDJSON message per partition, and acknowledges the source messages only
once the broker stored every part (in feed order, as for a table write). Per
partition, micro-batches are published one after the other, so a key's rows
keep their order. A crash republishes the unacknowledged suffix, in order:
the target may hold a row twice, never out of order.
"""

from __future__ import annotations

import datetime
import decimal
import json
import logging
from functools import partial
from typing import Any

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from .._loop import LoopHandle, unwrap_groups
from .._threads import run_sync, stream_limiter
from ..errors import ClosedError
from ..memwal.acks import Ack
from .feeds import Publisher
from .partitions import Partitioner

__all__ = ["RepartitionWriter"]

log = logging.getLogger("lance_async.cluster")


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _encode(partitioner: Partitioner, table: pa.Table) -> list[tuple[int, bytes, int]]:
    """(partition, NDJSON payload, rows) of each partition present (blocking)."""
    out: list[tuple[int, bytes, int]] = []
    for batch in table.combine_chunks().to_batches():
        for p, part in partitioner.split(batch):
            lines = [json.dumps(row, default=_json_default) for row in part.to_pylist()]
            out.append((p, ("\n".join(lines) + "\n").encode(), part.num_rows))
    return out


class RepartitionWriter:
    """Publish rows to their partitions of an aligned feed, as a writer for ``ingest``.

    Use it as ``async with``; pass it to :func:`~lance_async.feeds.ingest` as
    the writer.

    Parameters
    ----------
    publisher : Publisher
        The aligned feed (``RedisPublisher``, ``NatsPublisher``); it must have
        ``partitioner.num_partitions`` partitions.
    partitioner : Partitioner
        The table's partitions.
    max_pending : int
        Parts queued per partition before ``send`` waits (default 64).
    """

    def __init__(
        self, publisher: Publisher, partitioner: Partitioner, *, max_pending: int = 64
    ) -> None:
        if publisher.num_partitions != partitioner.num_partitions:
            raise ValueError(
                f"the target feed has {publisher.num_partitions} partitions and the table "
                f"{partitioner.num_partitions} buckets; they must be equal"
            )
        self._publisher = publisher
        self._partitioner = partitioner
        self._max_pending = max_pending
        self._queues: dict[int, MemoryObjectSendStream[tuple[bytes, int, Ack]]] = {}
        self._tg: TaskGroup | None = None
        self._loop: LoopHandle | None = None
        self.published = 0
        """Messages published to the target so far (acknowledged by the broker)."""

    @property
    def schema(self) -> pa.Schema:
        """The table's schema: what ``ingest`` decodes the source into."""
        return self._partitioner.schema

    async def __aenter__(self) -> RepartitionWriter:
        self._loop = LoopHandle()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for queue in self._queues.values():
            queue.close()  # each partition's publisher drains, then ends
        assert self._tg is not None
        with unwrap_groups():
            await self._tg.__aexit__(None, None, None)

    async def _publish_partition(self, partition: int, receive: Any) -> None:
        async with receive:
            async for payload, rows, ack in receive:
                try:
                    await self._publisher.publish(partition, payload)
                except Exception as exc:  # the ack carries it to ingest, which stops
                    ack.part_failed(exc)
                    continue
                self.published += 1
                ack.part_done(rows=rows, batches=1, put_id=("repartition", partition))

    def _queue(self, partition: int) -> MemoryObjectSendStream[tuple[bytes, int, Ack]]:
        queue = self._queues.get(partition)
        if queue is None:
            assert self._tg is not None
            send, receive = anyio.create_memory_object_stream[tuple[bytes, int, Ack]](
                self._max_pending
            )
            self._queues[partition] = queue = send
            self._tg.start_soon(self._publish_partition, partition, receive)
        return queue

    async def send(self, data: pa.Table, *, timeout: float | None = None) -> Ack:
        """Queue ``data``'s rows for their partitions; the ack resolves once
        the broker stored every part.

        Raises
        ------
        ClosedError
            Not entered (``async with``).
        InvalidInputError
            A row lacks the sharded column.
        """
        if self._tg is None:
            raise ClosedError("use the RepartitionWriter as `async with`")
        parts = await run_sync(partial(_encode, self._partitioner, data), limiter=stream_limiter())
        ack = Ack(self._loop)
        for p, payload, rows in parts:
            ack.add_part()
            await self._queue(p).send((payload, rows, ack))
        ack.seal()
        return ack
