"""``ShardRouter``: the routing writer -- every row to its own shard, one writer per shard.

``dataset.mem_wal_writer()`` with no shard id returns one. For a table whose
MemWAL has a sharding spec (bucket, identity or unsharded; bucket sharding on
the primary key is lance_async's default), the router computes each row's
shard with the engine (``evaluate_sharding_spec``, see ``sharding.py``) and
hands each part to the :class:`~lance_async.AsyncShardWriter` of its shard,
opened lazily the first time the shard receives rows. All writers run in the
router's task group. So in one process, writes with overlapping keys -- two
ingests, a feed and an HTTP upload -- always meet in the same shard, and the
newest value wins in every read and in compaction.

In several processes, each shard must still have one writer: either one
process owns the whole table, or the shards are divided among workers (see
``docs/sharding.md``); a second router opening a shard fences the first
(:class:`~lance_async.errors.FencedError`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, Iterable, Sequence
from typing import Any

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup

from .._args import check_batches
from .._loop import aclose_shielded, unwrap_groups
from .._schema import TableFit, primary_key
from .._table import Table
from .._threads import run_sync, stream_limiter
from ..errors import ClosedError, InvalidInputError, SchemaMismatchError
from ..lsm.memtable import MemtableMirror
from ..lsm.reader import LsmMethods, LsmReader
from ..sources import SourceMode, resolve_source
from .accumulator import Kind
from .acks import Ack, PutSummary
from .compactor import CompactionPolicy, Compactor
from .policy import WriterConfig
from .sharding import Sharding, default_shard_id, read_sharding
from .stats import RouterStats, WriterState, percentiles
from .writer import AsyncShardWriter

__all__ = ["ROUTE_INLINE_ROWS", "ShardRouter", "default_shard_id"]

ROUTE_INLINE_ROWS = 1_024
"""Sends of up to this many rows are routed on the loop (a fraction of a
millisecond); larger ones on a worker thread."""


class ShardRouter(LsmMethods):
    """Write a MemWAL table without naming shards: each row goes to its own shard.

    Obtain it with ``dataset.mem_wal_writer()`` (no shard id) or
    :meth:`AsyncDataset.shard_router`, and use it as ``async with``. It has
    the writer's API (``send`` / ``put`` / ``put_stream`` / ``delete`` /
    ``flush`` / ``stats`` / the LSM reads); writers open lazily, the first
    time their shard receives rows.

    Parameters
    ----------
    dataset : AsyncDataset
        A table whose MemWAL has a sharding spec.
    compaction : CompactionPolicy, optional
        Run a :class:`~lance_async.memwal.compactor.Compactor` with this
        policy in the router's task group while it is open (see
        :attr:`compactor`).
    **writer_options
        Passed to every :class:`AsyncShardWriter`: the commit policy
        (``commit=``, ``min_put_interval=``), queue limits, ``linger``,
        ``durable_write``, ...

    Raises
    ------
    TypeError, ValueError
        A writer option of the wrong type or out of range (checked here,
        not when a shard first receives rows).
    InvalidInputError
        On entry: the table has no MemWAL, or its shards are manual (name a
        shard: ``dataset.mem_wal_writer(shard_id)``).
    """

    def __init__(
        self,
        dataset: Table,
        *,
        compaction: CompactionPolicy | None = None,
        **writer_options: Any,
    ) -> None:
        # the writers open lazily: check their options now, as a writer does
        # at construction (ValueError / TypeError at the call)
        AsyncShardWriter(dataset, str(uuid.UUID(int=0)), **writer_options)
        self._dataset = dataset
        self.config = WriterConfig.from_options(**writer_options)
        """The writers' options, checked."""
        self.compactor = Compactor(dataset, compaction) if compaction is not None else None
        """The background :class:`~lance_async.memwal.compactor.Compactor`, if any."""
        self._options = writer_options
        self.durable_write = bool(writer_options.get("durable_write", True))
        """Whether the writers wait for the WAL flush before acking (the default)."""
        self._writers: dict[str, AsyncShardWriter] = {}
        self._sharding: Sharding | None = None
        self._tg: TaskGroup | None = None
        self._state = WriterState.NEW
        self._open_lock: anyio.Lock | None = None
        self._keys = primary_key(dataset.schema)
        self._fit = TableFit(dataset.schema, self._keys)
        self._key_fit = TableFit(
            pa.schema([dataset.schema.field(k) for k in self._keys]), self._keys
        )
        self.lsm = LsmReader(dataset, self._memtables, path="writer")
        """The LSM reads of the table with every open writer's memtable included."""

    def __repr__(self) -> str:
        return f"<ShardRouter {self._dataset.uri!r} writers={len(self._writers)}>"

    # -- properties --------------------------------------------------------------
    @property
    def writers(self) -> dict[str, AsyncShardWriter]:
        """Open writers by shard id."""
        return dict(self._writers)

    @property
    def schema(self) -> pa.Schema:
        """The table schema that every row must match."""
        return self._dataset.schema

    @property
    def state(self) -> WriterState:
        """NEW, OPEN, CLOSING or CLOSED (a failed shard fails its own acks)."""
        return self._state

    @property
    def sharding(self) -> Sharding:
        """The table's sharding (read on entry)."""
        if self._sharding is None:
            raise ClosedError(f"{self!r} is not open; use `async with`")
        return self._sharding

    # -- life cycle ----------------------------------------------------------------
    async def __aenter__(self) -> ShardRouter:
        if self._state is not WriterState.NEW:
            raise ClosedError(f"{self!r} was already opened; open a new router")
        sharding = await read_sharding(self._dataset)
        if not sharding.sharded:
            raise InvalidInputError(
                "the table's MemWAL has manual shards (no sharding spec), so rows cannot be "
                "routed: name a shard (dataset.mem_wal_writer(shard_id)) and keep every key "
                "in one shard, or initialize the MemWAL with a sharding spec"
            )
        self._sharding = sharding
        self._open_lock = anyio.Lock()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._state = WriterState.OPEN
        if self.compactor is not None:
            await self.compactor.start(self._tg)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Flush and close every writer, then the router (safe to call twice)."""
        if self._state is not WriterState.OPEN:
            self._state = WriterState.CLOSED
            return
        self._state = WriterState.CLOSING
        assert self._tg is not None
        try:
            if self.compactor is not None:
                await self.compactor.aclose()
            with unwrap_groups(), anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as closing:
                    for writer in self._writers.values():
                        closing.start_soon(writer.aclose)
        finally:
            self._state = WriterState.CLOSED
            with unwrap_groups():
                await self._tg.__aexit__(None, None, None)

    def _check_open(self) -> None:
        if self._state is not WriterState.OPEN:
            raise ClosedError(f"{self!r} is not open; use `async with dataset.mem_wal_writer()`")

    async def writer(self, shard_id: str) -> AsyncShardWriter:
        """The writer of ``shard_id``, opened now if it is not open yet.

        Opening claims the shard (a writer of it elsewhere is fenced).
        """
        self._check_open()
        writer = self._writers.get(shard_id)
        if writer is not None:
            return writer
        assert self._open_lock is not None and self._tg is not None
        async with self._open_lock:
            writer = self._writers.get(shard_id)
            if writer is None:
                writer = AsyncShardWriter(self._dataset, shard_id, **self._options)
                await writer.open(self._tg)
                self._writers[shard_id] = writer
        return writer

    async def recover(self) -> list[str]:
        """Replay and flush every shard of the table whose WAL tail holds rows.

        A writer that died leaves its durable rows in its shard's WAL. Every
        LSM read shows them already, but only a writer of the shard flushes
        them into a generation that compaction can merge. This opens the
        writer of each such shard now (opening replays the WAL and flushes
        it) instead of when rows next arrive for it, which may be never.
        Call it when this router owns the whole table (``lance-async ingest``
        and :func:`~lance_async.ingest` do): opening a shard's writer fences a
        writer of it elsewhere.

        Returns
        -------
        list of str
            The shards recovered.

        Raises
        ------
        ClosedError
            The router is not open.
        """
        self._check_open()
        sharding = self.sharding
        tails = await self.lsm.unflushed_rows()
        mine = set(sharding.shard_ids()) if sharding.kind in ("bucket", "unsharded") else set(tails)
        ids = sorted(sid for sid, rows in tails.items() if rows and sid in mine)
        for shard_id in ids:
            await self.writer(shard_id)
        return ids

    # -- routing -------------------------------------------------------------------
    def _split_all(self, batches: Sequence[pa.RecordBatch]) -> list[tuple[str, pa.RecordBatch]]:
        sharding = self.sharding
        return [part for batch in batches for part in sharding.split(batch)]

    async def _split(self, batches: Sequence[pa.RecordBatch]) -> list[tuple[str, pa.RecordBatch]]:
        if sum(b.num_rows for b in batches) <= ROUTE_INLINE_ROWS:
            return self._split_all(batches)
        return await run_sync(lambda: self._split_all(batches), limiter=stream_limiter())

    def _conform_keys(self, batch: pa.RecordBatch, index: int) -> pa.RecordBatch:
        if not self._keys:
            raise InvalidInputError("delete needs a primary key, and the table has none")
        missing = [k for k in self._keys if k not in batch.schema.names]
        if missing:
            raise SchemaMismatchError(f"delete keys lack column {missing[0]!r}", field=missing[0])
        return self._key_fit.check(batch.select(self._keys), index)

    async def _send(self, kind: Kind, data: Any, timeout: float | None, schema: Any) -> Ack:
        self._check_open()
        conform = self._fit.check if kind is Kind.PUT else self._conform_keys
        acks: list[Ack] = []
        if isinstance(data, (pa.RecordBatch, pa.Table)) and schema is None:
            source = None
            in_memory = [data] if isinstance(data, pa.RecordBatch) else data.to_batches()
        elif _batch_list(data) and schema is None:
            source, in_memory = None, data
        else:
            source = await resolve_source(
                data, schema=schema, rows_into=self._fit.schema if kind is Kind.PUT else None
            )
            in_memory = source.batches() if source.mode is SourceMode.MATERIALIZED else None
        if in_memory is not None:  # checked whole: a bad row anywhere queues nothing
            checked = [conform(b, i) for i, b in enumerate(in_memory) if b.num_rows]
            await self._hand_over(kind, await self._split(checked), acks, timeout)
            await anyio.lowlevel.checkpoint()
            return Ack.combine(acks)
        assert source is not None
        stream = source.open()
        try:
            index = 0
            async for batch in stream:
                checked = [conform(batch, index)] if batch.num_rows else []
                await self._hand_over(kind, await self._split(checked), acks, timeout)
                index += 1
        finally:
            await aclose_shielded(stream)
        return Ack.combine(acks)

    async def _hand_over(
        self,
        kind: Kind,
        parts: list[tuple[str, pa.RecordBatch]],
        acks: list[Ack],
        timeout: float | None,
    ) -> None:
        """Each shard's parts to its writer: one send per shard, in order."""
        by_shard: dict[str, list[pa.RecordBatch]] = {}
        for shard_id, part in parts:
            by_shard.setdefault(shard_id, []).append(part)
        for shard_id, group in by_shard.items():
            writer = await self.writer(shard_id)
            data = group[0] if len(group) == 1 else group
            acks.append(await writer._submit(kind, data, timeout, None, routed=True))

    async def send(
        self, data: Any, *, timeout: float | None = None, schema: pa.Schema | None = None
    ) -> Ack:
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
        BackpressureTimeoutError, WriterFailedError, FencedError
            As :meth:`AsyncShardWriter.send` (parts already handed to other
            shards stay queued).
        ClosedError
            The router is closed.
        """
        return await self._send(Kind.PUT, data, timeout, schema)

    async def send_many(
        self, batches: Iterable[pa.RecordBatch], *, timeout: float | None = None
    ) -> Ack:
        """Route several in-memory batches under one ack (see
        :meth:`AsyncShardWriter.send_many`): checked whole, then each shard's
        rows handed to its writer in one send (one queue entry when they fit
        one put).

        Raises
        ------
        SchemaMismatchError
            A batch does not fit the table (nothing is queued).
        BackpressureTimeoutError, WriterFailedError, FencedError, ClosedError
            As :meth:`send`.
        """
        return await self._send(Kind.PUT, check_batches("send_many", batches), timeout, None)

    async def put(
        self, data: Any, *, timeout: float | None = None, schema: pa.Schema | None = None
    ) -> PutSummary:
        """Route rows and wait until every shard has written them."""
        ack = await self.send(data, timeout=timeout, schema=schema)
        return await ack

    async def put_stream(
        self, stream: AsyncIterable[Any] | Iterable[Any], *, timeout: float | None = None
    ) -> PutSummary:
        """Drain a feed of batches through the writers' queues and wait for all of it."""
        return await self.put(stream, timeout=timeout)

    async def delete(self, keys: Any, *, timeout: float | None = None) -> PutSummary:
        """Delete rows by primary key, each key in its own shard (in order with
        the puts queued there before it)."""
        ack = await self._send(Kind.DELETE, keys, timeout, None)
        return await ack

    async def flush(self) -> None:
        """Wait until every writer has written what was queued.

        Raises
        ------
        ClosedError
            The router is not open (never entered, closing or closed), as
            for every other call; also when it closes while the flush waits.
        WriterFailedError, FencedError
            A shard's writer broke.
        """
        self._check_open()
        try:
            with unwrap_groups():
                async with anyio.create_task_group() as tg:
                    for writer in list(self._writers.values()):
                        tg.start_soon(writer.flush)
        except Exception as exc:
            if self._state is not WriterState.OPEN:
                raise ClosedError(f"{self!r} was closed while the flush waited") from exc
            raise

    def stats(self) -> RouterStats:
        """Every open writer's statistics and their totals (does not block)."""
        writers = {sid: w.stats() for sid, w in self._writers.items()}
        samples = [lat for w in self._writers.values() for lat in w.ack_latencies()]
        p50, p99 = percentiles(samples, 0.50, 0.99)
        return RouterStats(
            writers=writers,
            engine_puts=sum(s.engine_puts for s in writers.values()),
            rows=sum(s.rows for s in writers.values()),
            queue_rows=sum(s.queue_rows for s in writers.values()),
            queue_bytes=sum(s.queue_bytes for s in writers.values()),
            ack_latency_p50=p50,
            ack_latency_p99=p99,
        )

    # -- reads ----------------------------------------------------------------------
    def _memtables(self) -> list[MemtableMirror]:
        """The memtables of every writer this router has open (for ``lsm``)."""
        self._check_open()
        return [m for w in self._writers.values() for m in w._memtables()]


def _batch_list(data: Any) -> bool:
    """Whether ``data`` is a list of record batches (``send_many``'s argument)."""
    return isinstance(data, list) and all(isinstance(b, pa.RecordBatch) for b in data)
