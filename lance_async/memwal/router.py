"""``ShardRouter``: split rows by MemWAL shard and feed one writer per shard.

For a table initialized with bucket sharding (``bucket_column`` +
``num_buckets``) or identity sharding (``identity_column``), Lance computes
each row's shard value with ``lance.mem_wal.evaluate_sharding_spec``. The
router groups each batch's rows by that value and hands every group to the
:class:`~lance_async.AsyncShardWriter` of its shard, all writers running
concurrently in the router's task group.

Shard ids
---------
pylance 14 leaves the choice of a shard's UUID to the caller. The router
derives it deterministically from the sharding spec and the shard value,
``uuid5(SHARD_NAMESPACE, f"{spec_id}/{value}")``, so every process routes a
value to the same shard (and reopening replays that shard's WAL). After the
MemWAL was initialized again over an overwritten table's shards, the MemWAL
epoch is mixed in (``f"{epoch}/{spec_id}/{value}"``) so the new MemWAL gets
fresh shards. Pass ``shard_id_for=`` to use your own mapping.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pyarrow as pa
import pyarrow.compute as pc
from anyio.abc import TaskGroup
from lance.mem_wal import evaluate_sharding_spec

from .._loop import aclose_shielded, unwrap_groups
from .._schema import TableFit, primary_key
from .._threads import run_sync, stream_limiter
from ..errors import ClosedError, InvalidInputError
from ..sources import SourceMode, resolve_source
from .acks import Ack, PutSummary
from .retired import current_epoch, derived_shard_id
from .writer import AsyncShardWriter

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = ["ROUTE_INLINE_ROWS", "SHARD_NAMESPACE", "ShardRouter", "default_shard_id"]

SHARD_NAMESPACE = uuid.UUID("6c616e63-655f-6173-796e-635f73686172")
ROUTE_INLINE_ROWS = 1_024
"""Sends of up to this many rows are routed on the loop (a fraction of a
millisecond); larger ones on a worker thread."""


def default_shard_id(spec_id: int, value: Any, epoch: str | None = None) -> str:
    """The shard UUID the router uses for a shard value (deterministic).

    ``epoch`` is the table's MemWAL epoch (set when the MemWAL was
    initialized again over retired shards; see ``lance_async.memwal.retired``):
    it gives the new MemWAL fresh shard ids. None for a first MemWAL.
    """
    return derived_shard_id(SHARD_NAMESPACE, f"{spec_id}/{value}", epoch)


class ShardRouter:
    """Route rows of a sharded MemWAL table to one writer per shard.

    Obtain it with :meth:`AsyncDataset.shard_router` and use it as
    ``async with``. Writers open lazily, the first time a shard receives rows.

    Parameters
    ----------
    dataset : AsyncDataset
        A table initialized with bucket or identity sharding.
    shard_id_for : callable, optional
        ``(spec_id, value) -> shard UUID string``; default
        :func:`default_shard_id` with the table's MemWAL epoch.
    **writer_options
        Passed to every :class:`AsyncShardWriter` (queue limits, ``linger``,
        ``durable_write``, ...).

    Raises
    ------
    InvalidInputError
        On entry, when the table has no MemWAL sharding spec.
    """

    def __init__(
        self,
        dataset: AsyncDataset,
        *,
        shard_id_for: Callable[[int, Any], str] | None = None,
        **writer_options: Any,
    ) -> None:
        self._dataset = dataset
        self._shard_id_for = shard_id_for
        self._options = writer_options
        self._writers: dict[Any, AsyncShardWriter] = {}
        self._spec: dict[str, Any] | None = None
        self._tg: TaskGroup | None = None
        self._open = False
        self._closed = False
        self._open_lock: anyio.Lock | None = None
        self._fit = TableFit(dataset.schema, primary_key(dataset.schema))

    @property
    def writers(self) -> dict[str, AsyncShardWriter]:
        """Open writers by shard id."""
        return {w.shard_id: w for w in self._writers.values()}

    async def __aenter__(self) -> ShardRouter:
        details = await self._dataset.mem_wal_index_details()
        specs = (details or {}).get("sharding_specs") or []
        if not specs:
            raise InvalidInputError(
                "the table has no MemWAL sharding spec; initialize_mem_wal(bucket_column=..., "
                "num_buckets=...) or (identity_column=...), or use mem_wal_writer(shard_id)"
            )
        self._spec = max(specs, key=lambda s: int(s["spec_id"]))
        if self._shard_id_for is None:
            epoch = await current_epoch(self._dataset)
            self._shard_id_for = partial(default_shard_id, epoch=epoch)
        self._open_lock = anyio.Lock()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._open = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Flush and close every writer, then the router (safe to call twice)."""
        if self._closed or not self._open:
            self._closed = True
            return
        self._closed = True
        assert self._tg is not None
        try:
            with unwrap_groups(), anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as closing:
                    for writer in self._writers.values():
                        closing.start_soon(writer.aclose)
        finally:
            with unwrap_groups():
                await self._tg.__aexit__(None, None, None)

    def _route(self, batch: pa.RecordBatch) -> list[tuple[Any, pa.RecordBatch]]:
        """(shard value, rows) parts of one checked batch (blocking for large ones)."""
        assert self._spec is not None
        if batch.num_rows == 0:
            return []
        values = evaluate_sharding_spec(batch, self._spec, self._dataset.lance.lance_schema).column(
            0
        )
        uniques = pc.unique(values)
        if len(uniques) == 1:
            return [(uniques[0].as_py(), batch)]
        out = []
        for value in uniques:
            mask = pc.equal(values, value)
            out.append((value.as_py(), batch.filter(mask)))
        return out

    async def _writer(self, value: Any) -> AsyncShardWriter:
        writer = self._writers.get(value)
        if writer is not None:
            return writer
        assert self._open_lock is not None and self._spec is not None
        assert self._shard_id_for is not None
        async with self._open_lock:
            writer = self._writers.get(value)
            if writer is None:
                shard_id = self._shard_id_for(int(self._spec["spec_id"]), value)
                writer = AsyncShardWriter(self._dataset, shard_id, **self._options)
                assert self._tg is not None
                await writer.open(self._tg)
                self._writers[value] = writer
        return writer

    async def send(self, data: Any, *, timeout: float | None = None) -> Ack:
        """Route rows to their shards' writers; wait only for queue room.

        In-memory rows are checked against the table whole before any shard
        receives a row, so a bad row anywhere queues nothing. A stream is
        checked and routed batch by batch (batches before a bad one stay
        queued, as with :meth:`AsyncShardWriter.send`). Routing a batch of
        more than :data:`ROUTE_INLINE_ROWS` rows runs on a worker thread.

        Returns
        -------
        Ack
            Resolves when every row, in every shard, is written.

        Raises
        ------
        SchemaMismatchError
            Rows do not fit the table (nothing of an in-memory send is queued).
        BackpressureTimeoutError, WriterFailedError
            As :meth:`AsyncShardWriter.send` (parts already handed to other
            shards stay queued).
        ClosedError
            The router is closed.
        """
        if not self._open or self._closed:
            raise ClosedError("the ShardRouter is not open; use `async with`")
        acks: list[Ack] = []
        if isinstance(data, (pa.RecordBatch, pa.Table)):  # in memory already: no coercion
            source = None
            in_memory = [data] if isinstance(data, pa.RecordBatch) else data.to_batches()
        else:
            source = await resolve_source(data)
            in_memory = source.batches() if source.mode is SourceMode.MATERIALIZED else None
        if in_memory is not None:
            checked = [self._fit.check(b, i) for i, b in enumerate(in_memory)]
            await self._send_parts(await self._route_all(checked), acks, timeout)
        else:
            assert source is not None
            stream = source.open()
            try:
                index = 0
                async for batch in stream:
                    checked = [self._fit.check(batch, index)]
                    await self._send_parts(await self._route_all(checked), acks, timeout)
                    index += 1
            finally:
                await aclose_shielded(stream)
        return Ack.combine(acks)

    async def _route_all(self, batches: list[pa.RecordBatch]) -> list[tuple[Any, pa.RecordBatch]]:
        def work() -> list[tuple[Any, pa.RecordBatch]]:
            return [part for batch in batches for part in self._route(batch)]

        if sum(b.num_rows for b in batches) <= ROUTE_INLINE_ROWS:
            return work()
        return await run_sync(work, limiter=stream_limiter())

    async def _send_parts(
        self, parts: list[tuple[Any, pa.RecordBatch]], acks: list[Ack], timeout: float | None
    ) -> None:
        for value, part in parts:
            writer = await self._writer(value)
            acks.append(await writer.send(part, timeout=timeout))

    async def put(self, data: Any, *, timeout: float | None = None) -> PutSummary:
        """Route rows and wait until every shard has written them."""
        ack = await self.send(data, timeout=timeout)
        return await ack

    async def flush(self) -> None:
        """Wait until every writer has written what was queued."""
        async with anyio.create_task_group() as tg:
            for writer in list(self._writers.values()):
                tg.start_soon(writer.flush)
