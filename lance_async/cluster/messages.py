"""What a partition's messages become: rows to put, keys to delete, in feed order.

A worker's partition is co-partitioned with the table (``partitions.py``),
so every row of its messages must belong to it: one that does not is
refused, never written to the wrong shard. A message with the header
``lance-op: delete`` (:data:`DELETE`; on Redis a field of the entry beside
``data``) deletes its rows by key instead: each JSON object needs the key
column(s) only. Puts and deletes reach the shard in the partition's order
(Debezium's ``__op`` field and Kafka's tombstones carry the same idea in
the message).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DecodeError
from ..feeds.base import Message, decode_json
from ..memwal.writer import AsyncShardWriter
from .partitions import Partitioner

__all__ = ["DELETE", "PartitionWriter", "partition_decoder"]

#: The message header that makes a message's rows deletes by key: ``{"lance-op": "delete"}``.
DELETE: tuple[str, str] = ("lance-op", "delete")
_OP_COLUMN = "__lance_async_delete"


def _is_delete(message: Message) -> bool:
    value = message.headers.get(DELETE[0]) if message.headers else None
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value == DELETE[1]


def _runs(messages: Sequence[Message]) -> list[tuple[bool, list[Message]]]:
    """Consecutive messages of one kind (delete or not), in order."""
    out: list[tuple[bool, list[Message]]] = []
    for m in messages:
        delete = _is_delete(m)
        if out and out[-1][0] == delete:
            out[-1][1].append(m)
        else:
            out.append((delete, [m]))
    return out


class PartitionWriter:
    """A partition's shard writer as :func:`~lance_async.feeds.ingest` sees it.

    A micro-batch with deletes (the op column of :func:`partition_decoder`)
    becomes puts and deletes in feed order: the puts before a delete are
    durable before it is queued, and the delete is durable before what
    follows is queued; one without deletes is sent as it is (one send, one
    ack). :meth:`send` returns the last put's ack, or None when everything
    in the micro-batch is durable already.
    """

    def __init__(self, writer: AsyncShardWriter, keys: list[str]) -> None:
        self._writer = writer
        self._keys = keys
        self.schema = writer.schema

    async def send(self, table: pa.Table) -> Any:
        if _OP_COLUMN not in table.column_names:
            return await self._writer.send(table)
        flags = table.column(_OP_COLUMN).to_pylist()
        pending: Any = None
        start = 0
        for end in range(1, len(flags) + 1):
            if end < len(flags) and flags[end] == flags[start]:
                continue
            rows = table.slice(start, end - start)
            if flags[start]:
                if pending is not None:
                    await pending  # the puts before it, durable (or failed) first
                    pending = None
                keys = rows.select(self._keys)
                await self._writer.delete(keys)  # durable when it returns
            else:
                rows = rows.drop_columns([_OP_COLUMN]).cast(self.schema)
                if pending is not None:
                    await pending
                pending = await self._writer.send(rows)
            start = end
        return pending  # None: everything in it is durable already


def partition_decoder(
    partitioner: Partitioner, keys: list[str], partition: int
) -> Callable[[Sequence[Message], pa.Schema], pa.Table]:
    """The ``decode`` of partition ``partition``'s ingest loop (it runs on a worker thread).

    JSON payloads become rows of the table (:func:`~lance_async.feeds.decode_json`);
    a row of another partition is a :class:`~lance_async.DecodeError` (the
    message goes to the dead-letter hook, never to the wrong shard). A
    micro-batch holding deletes (:data:`DELETE`) becomes one table with an op
    column, which :class:`PartitionWriter` reads; one without is the plain
    table.
    """
    column = partitioner.sharding.column
    key_schema = pa.schema([f for f in partitioner.schema if f.name in keys or f.name == column])

    def check(table: pa.Table) -> None:
        for batch in table.to_batches():
            values = partitioner.partitions(batch)
            foreign = pc.not_equal(values, partition)
            if pc.any(foreign).as_py():
                other = pc.filter(values, foreign)[0].as_py()
                raise DecodeError(
                    f"a row of partition {other} came on partition {partition}: the "
                    "producer did not partition rows by the table's buckets "
                    "(lance_async.cluster.Partitioner); not written"
                )

    def decode(messages: Sequence[Message], schema: pa.Schema) -> pa.Table:
        if not any(_is_delete(m) for m in messages):
            table = decode_json(messages, schema)
            if table.num_rows:
                check(table)
            return table
        # runs of puts and of deletes, in feed order, in one table with an op column
        wide = pa.schema([f.with_nullable(True) for f in schema])
        parts: list[pa.Table] = []
        for delete, run in _runs(messages):
            part = decode_json(run, key_schema if delete else schema)
            if not part.num_rows:
                continue
            check(part)
            columns = [
                part.column(f.name)
                if f.name in part.column_names
                else pa.nulls(part.num_rows, f.type)
                for f in wide
            ]
            flags = pa.array([delete] * part.num_rows, pa.bool_())
            parts.append(
                pa.Table.from_arrays(
                    [*columns, flags], schema=wide.append(pa.field(_OP_COLUMN, pa.bool_()))
                )
            )
        if not parts:
            return schema.empty_table()
        return pa.concat_tables(parts)

    return decode
