"""``ShardRouter``: the routing writer -- every row to its own shard, one writer per shard.

``dataset.mem_wal_writer()`` with no shard id returns one. For a table whose
MemWAL has a sharding spec (bucket, identity or unsharded; bucket sharding on
the primary key is lance_async's default), the router computes each row's
shard with the engine (``evaluate_sharding_spec``, see ``sharding.py``) and
hands each part to the :class:`~lance_async.AsyncShardWriter` of its shard,
opened lazily the first time the shard receives rows (the shards new to a
run open side by side). All writers run in the
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
from collections.abc import AsyncIterable, Iterable
from functools import partial
from typing import Any

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup

from .._args import check_batches
from .._loop import LoopHandle, unwrap_groups
from .._schema import TableFit, primary_key
from .._table import Table
from .._threads import run_sync
from ..errors import ClosedError, InvalidInputError
from ..lsm.memtable import MemtableMirror
from ..lsm.reader import LsmMethods, LsmReader
from .accumulator import Accumulator, Entry, Kind
from .acks import Ack, PutSummary
from .committer import DEFAULT_MAX_MEMTABLE_ROWS
from .compactor import CompactionPolicy, Compactor
from .policy import LoopLoad, WriterConfig
from .routing import FanOut, RoutedPart, ShardCut, cut_part, split_run
from .sharding import Sharding, default_shard_id, read_sharding
from .stats import RouterStats, WriterState, percentiles
from .writer import AsyncShardWriter, room_deadline

__all__ = [
    "MAX_RUN_SHARDS",
    "ROUTE_INLINE_ROWS",
    "ROUTE_MIN_INTERVAL",
    "ShardRouter",
    "default_shard_id",
]

MAX_RUN_SHARDS = 8
"""A routed run holds up to this many shard puts' rows (fewer shards: fewer)."""

ROUTE_MIN_INTERVAL = 0.001
"""Seconds between the starts of two routed runs at least, whatever the
commit policy (the latency and throughput policies pace no puts): without
it a busy router would route each send as a run of its own."""

ROUTE_INLINE_ROWS = 50_000
"""Runs of up to this many rows are cut on the event loop (one evaluation of
the spec, one sort, one take), larger ones on a worker thread. A default run
holds at most 40,000 rows (four shards' puts), so every default run is cut
on the loop: on 2 cores the thread hop cost more than the cut (issue 25,
the ingestion bench's ``send_many`` and ``ingest()`` runs of 120,000
messages: with runs of more than 4,096 rows cut on a thread the routing
writer reached 0.79x and 0.74x of one shard's rows/s, cut on the loop 0.98x
and 0.90x, medians of three). Cutting 40,000 rows of
4,000 batches holds the loop about 12 ms on that machine, 20,000 rows of two
batches about 2 ms."""


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
        self._open_locks: dict[str, anyio.Lock] = {}  # one per shard being opened
        self._loop: LoopHandle | None = None
        self._load: LoopLoad | None = None  # the loop's busy share, for the pacing
        self._acc: Accumulator | None = None
        self._routed: anyio.Event | None = None  # set when the routing task ended
        self._keys = primary_key(dataset.schema)
        self._fit = TableFit(dataset.schema, self._keys)
        # deletes: the key columns, and the sharded column once open (_route_queue)
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
        self._loop = LoopHandle()
        self._load = LoopLoad()
        self._acc = self._route_queue(sharding)
        self._routed = anyio.Event()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._route_task, name=f"lance_async router {self._dataset.uri}")
        self._state = WriterState.OPEN
        if self.compactor is not None:
            await self.compactor.start(self._tg)
        return self

    def _route_queue(self, sharding: Sharding) -> Accumulator:
        """The router's own queue: room for what waits to be routed, and runs
        of up to one put per shard (:data:`MAX_RUN_SHARDS` at most)."""
        config = self.config
        put_rows, queue_rows = config.limits(
            int(config.engine.get("max_memtable_rows") or DEFAULT_MAX_MEMTABLE_ROWS)
        )
        shards = min(MAX_RUN_SHARDS, sharding.num_buckets or 1)
        run_rows = put_rows * shards
        # a delete's shard comes from the sharded column: keep it when it is no key
        # column (identity sharding on another column); the parts drop it again
        routed = list(self._keys)
        if sharding.column is not None and sharding.column not in routed:
            routed.append(sharding.column)
        self._key_fit = TableFit(
            pa.schema([self._dataset.schema.field(c) for c in routed]), self._keys
        )
        if config.max_queue_rows is None:  # room for a whole run, by default
            queue_rows = max(queue_rows, run_rows)
        return Accumulator(
            fit=self._fit,
            key_fit=self._key_fit,
            keys=routed,
            max_queue_rows=queue_rows,
            max_queue_bytes=config.max_queue_bytes,
            max_put_rows=min(run_rows, queue_rows),
            max_put_bytes=config.max_put_bytes * shards,
            linger=0.0,
            min_put_interval=max(ROUTE_MIN_INTERVAL, config.policy.min_put_interval),
            check=self._check_state,
            describe=self.__repr__,
        )

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Route what is queued, then flush and close every writer, then the
        router (safe to call twice)."""
        if self._state is not WriterState.OPEN:
            self._state = WriterState.CLOSED
            return
        self._state = WriterState.CLOSING
        assert self._tg is not None and self._acc is not None and self._routed is not None
        try:
            if self.compactor is not None:
                await self.compactor.aclose()
            with unwrap_groups(), anyio.CancelScope(shield=True):
                self._acc.close()
                await self._routed.wait()
                async with anyio.create_task_group() as closing:
                    for writer in self._writers.values():
                        closing.start_soon(writer.aclose)
        finally:
            self._state = WriterState.CLOSED
            self._acc.wake_senders()
            with unwrap_groups():
                await self._tg.__aexit__(None, None, None)

    def _check_open(self) -> None:
        if self._loop is not None and not self._loop.is_current():
            self._loop.check(repr(self))
        self._check_state()

    def _check_state(self) -> None:
        if self._state is not WriterState.OPEN:
            raise ClosedError(f"{self!r} is not open; use `async with dataset.mem_wal_writer()`")

    async def writer(self, shard_id: str) -> AsyncShardWriter:
        """The writer of ``shard_id``, opened now if it is not open yet.

        Opening claims the shard (a writer of it elsewhere is fenced). Rows
        sent to the router reach it through the router's queue; writing to
        it directly bypasses that queue's order.

        Raises
        ------
        ClosedError
            The router is not open.
        InvalidInputError, StorageError
            As :meth:`AsyncShardWriter.open`.
        """
        self._check_open()
        return await self._writer(shard_id)

    async def _writer(self, shard_id: str) -> AsyncShardWriter:
        writer = self._writers.get(shard_id)
        if writer is not None:
            return writer
        assert self._tg is not None
        lock = self._open_locks.get(shard_id)
        if lock is None:  # shards open side by side; each one once
            lock = self._open_locks[shard_id] = anyio.Lock()
        async with lock:
            writer = self._writers.get(shard_id)
            if writer is None:
                writer = AsyncShardWriter(self._dataset, shard_id, **self._options)
                await writer.open(self._tg)
                writer.unpaced()  # the router paces its runs instead
                self._writers[shard_id] = writer
        return writer

    async def _open_writers(self, shard_ids: Iterable[str]) -> dict[str, Exception]:
        """Open the writers of these shards that are not open yet, side by side.

        Opening claims a shard and replays its WAL tail: storage round
        trips, so one after another a fresh router's first run (or
        :meth:`recover`) waited for their sum. Four shards behind 20 ms of
        latency per request (moto behind ``tests/s3faults.py``'s slow proxy):
        a fresh router's first 100-row put took 1.71-1.75 s with the shards
        opened one after another, 0.58-0.63 s side by side. Returns the
        error of each shard that could not be opened (``Exception``s only;
        cancellation propagates). Blocks only the calling task.
        """
        missing = sorted({s for s in shard_ids if s not in self._writers})
        failed: dict[str, Exception] = {}

        async def open_one(shard_id: str) -> None:
            try:
                await self._writer(shard_id)
            except Exception as exc:  # the shard's rows fail with it, the others go on
                failed[shard_id] = exc

        if missing:
            async with anyio.create_task_group() as tg:
                for shard_id in missing:
                    tg.start_soon(open_one, shard_id)
        return failed

    async def recover(self) -> list[str]:
        """Replay and flush every shard of the table whose WAL tail holds rows.

        A writer that died leaves its durable rows in its shard's WAL. Every
        LSM read shows them already, but only a writer of the shard flushes
        them into a generation that compaction can merge. This opens the
        writer of each such shard now (opening replays the WAL and flushes
        it) instead of when rows next arrive for it, which may be never; the
        shards open side by side. Call it when this router owns the whole
        table (``lance-async ingest`` and :func:`~lance_async.ingest` do):
        opening a shard's writer fences a writer of it elsewhere.

        Returns
        -------
        list of str
            The shards recovered.

        Raises
        ------
        ClosedError
            The router is not open.
        InvalidInputError, StorageError
            A shard's writer could not be opened (as
            :meth:`AsyncShardWriter.open`): the first such error in shard
            order, once every shard was tried.
        """
        self._check_open()
        sharding = self.sharding
        tails = await self.lsm.unflushed_rows()
        mine = set(sharding.shard_ids()) if sharding.kind in ("bucket", "unsharded") else set(tails)
        ids = sorted(sid for sid, rows in tails.items() if rows and sid in mine)
        failed = await self._open_writers(ids)
        for shard_id in ids:  # the first failure, in shard order
            if shard_id in failed:
                raise failed[shard_id]
        return ids

    # -- routing (the router's task) --------------------------------------------------
    async def _route_task(self) -> None:
        """Take runs of queued sends and hand each shard its part, until the
        queue is closed and drained; then fail whatever is left."""
        assert self._acc is not None and self._routed is not None
        acc = self._acc
        run: list[Entry] = []
        try:
            while True:
                next_run = await acc.next_run()
                if next_run is None:
                    return
                run = next_run
                await self._route(run)
                run = []
        finally:
            error = ClosedError(f"{self!r} closed before these rows were routed")
            for entry in [*run, *acc.end()]:
                if entry.batch is not None or entry.kind is Kind.FLUSH:
                    entry.batch = None
                    entry.ack._part_failed(error)
            self._routed.set()

    async def _route(self, run: list[Entry]) -> None:
        """Route one run: cut it per shard (one evaluation; a large run on a worker
        thread, see :data:`ROUTE_INLINE_ROWS`),
        queue one part per shard, then release the run's room."""
        assert self._acc is not None
        kind = run[0].kind
        if kind is Kind.FLUSH:  # everything before it is in the writers' queues
            for entry in run:
                entry.ack._part_done()
            return
        fit = self._fit if kind is Kind.PUT else self._key_fit
        rows = sum(e.rows for e in run)
        nbytes = sum(e.nbytes for e in run)
        try:
            if rows <= ROUTE_INLINE_ROWS:  # cheaper than the thread hop it would take
                groups = [(run, split_run(self.sharding, fit, run))]
            else:
                groups = [(run, await run_sync(partial(split_run, self.sharding, fit, run)))]
        except Exception:  # route entry by entry: only the entry at fault fails
            groups = []
            for entry in run:
                try:
                    one = await run_sync(partial(split_run, self.sharding, fit, [entry]))
                except Exception as exc:
                    self._refuse(entry, exc)
                else:
                    groups.append(([entry], one))
        for entries, cut in groups:
            for entry, shards in zip(entries, cut.touched, strict=True):
                # the entry's own part (held while it was routed) becomes one per shard
                entry.batch = None
                entry.ack._parts += shards - 1
                if not shards:
                    entry.ack._maybe_resolve()
        parts = [(entries, shard_cut) for entries, cut in groups for shard_cut in cut.cuts]
        try:  # the shards not open yet open side by side, not one per hand-over
            failed = await self._open_writers(cut.shard_id for _, cut in parts)
        except BaseException:  # cancelled: nothing was handed over
            self._fail_parts(kind, parts)
            raise
        for done, (entries, shard_cut) in enumerate(parts):
            try:
                await self._hand_over(kind, entries, shard_cut, failed.get(shard_cut.shard_id))
            except BaseException:  # cancelled: the parts not handed over fail
                self._fail_parts(kind, parts[done + 1 :])
                raise
        self._acc.release(rows, nbytes)
        self._pace({cut.shard_id for _, cut in parts})

    def _pace(self, shards: set[str]) -> None:
        """Set the wait before the next run from the last puts of the shards
        this run wrote, how busy the loop is and the wait before this run
        (:meth:`CommitPolicy.pace_run`), and at least
        :data:`ROUTE_MIN_INTERVAL` -- a run's fixed cost is paid per run, not
        per send."""
        assert self._load is not None and self._acc is not None
        writers = self._writers
        took = [writers[s].last_put_seconds for s in shards if s in writers]
        acc = self._acc
        interval = self.config.policy.pace_run(took, self._load.sample(), acc.put_interval)
        acc.put_interval = max(ROUTE_MIN_INTERVAL, interval)

    @staticmethod
    def _refuse(entry: Entry, exc: Exception) -> None:
        """Fail an entry whose rows the sharding spec could not be evaluated on."""
        error = (
            exc
            if isinstance(exc, InvalidInputError)
            else InvalidInputError(f"the sharding spec could not be evaluated on these rows: {exc}")
        )
        if error is not exc:
            error.__cause__ = exc
        entry.batch = None
        entry.ack._part_failed(error)

    def _fail_parts(self, kind: Kind, parts: list[tuple[list[Entry], ShardCut]]) -> None:
        """Fail the members of parts that were never handed over (cancelled)."""
        error = ClosedError(f"{self!r} was cancelled before these rows were routed")
        for rest, left in parts:
            acks = [rest[i].ack for i in left.entries]
            FanOut(kind, acks, left.rows, left.batches, left.starts)._part_failed(error)

    async def _hand_over(
        self, kind: Kind, run: list[Entry], cut: ShardCut, unopened: Exception | None = None
    ) -> None:
        """Queue one shard's part of a run with its writer (opened if need be;
        ``unopened``: the error its opening already failed with), cut to the
        writer's ``max_put_rows``."""
        acks = [run[i].ack for i in cut.entries]
        try:
            if unopened is not None:
                raise unopened
            writer = await self._writer(cut.shard_id)
        except BaseException as exc:  # the shard cannot take rows: its members fail
            error = (
                exc
                if isinstance(exc, Exception)
                else ClosedError(f"{self!r} was cancelled before these rows were queued")
            )
            FanOut(kind, acks, cut.rows, cut.batches, cut.starts)._part_failed(error)
            if error is not exc:
                raise
            return
        queued_at = run[cut.entries[0]].queued_at
        limit = writer.max_put_rows or cut.batch.num_rows
        fans = cut_part(kind, cut, acks, limit)
        rows = cut.batch
        if kind is Kind.DELETE and rows.num_columns > len(self._keys):
            rows = rows.select(self._keys)  # the sharded column routed it; the engine takes keys
        total = cut.batch.num_rows
        for i, fan in enumerate(fans):
            batch = rows.slice(i * limit, limit)
            n = batch.num_rows
            nbytes = cut.nbytes if n == total else cut.nbytes * n // total
            part = RoutedPart(kind, batch, fan, n, nbytes, queued_at)
            try:
                await writer._submit_part(part)
            except Exception as exc:  # the writer failed or closed: its members fail
                part.batch = None
                fan._part_failed(exc)
            except BaseException:  # cancelled: this piece and the rest fail
                error = ClosedError(f"{self!r} was cancelled before these rows were queued")
                for rest in fans[i:]:
                    rest._part_failed(error)
                raise

    # -- sending -------------------------------------------------------------------
    async def _send(self, kind: Kind, data: Any, timeout: float | None, schema: Any) -> Ack:
        self._check_open()
        assert self._acc is not None
        deadline = room_deadline(timeout)
        await anyio.lowlevel.checkpoint()  # every send is a checkpoint (trio's rule)
        if kind is Kind.PUT and schema is None and data.__class__ is pa.RecordBatch:
            fast = await self._acc.submit_batch(data, self._loop, deadline, routed=True)
            if fast is not None:
                return fast
        ack = Ack(self._loop)
        await self._acc.submit(kind, data, ack, deadline, schema, routed=True)
        return ack

    async def send(
        self, data: Any, *, timeout: float | None = None, schema: pa.Schema | None = None
    ) -> Ack:
        """Queue rows for routing to their shards' writers; wait only for queue room.

        The router queues each send whole; its task routes what queued in
        bulk (one evaluation of the sharding spec per run, on a worker
        thread) and hands each shard one part. In-memory rows are checked
        against the table whole before anything is queued, so a bad row
        anywhere queues nothing. A stream is checked and queued batch by
        batch (batches before a bad one stay queued, as with
        :meth:`AsyncShardWriter.send`).

        Returns
        -------
        Ack
            Resolves when every row, in every shard it went to, is written;
            fails with the error of a shard put that carried its rows (an
            engine rejection fails only the send that caused it). A failed
            ack does not mean that none of its rows were written: its rows in
            other shards (or in another put of the same shard) may have been.
            Send it again: an upsert of the same rows is idempotent.

        Raises
        ------
        SchemaMismatchError
            Rows do not fit the table (nothing of an in-memory send is queued).
        BackpressureTimeoutError
            The router's queue stayed full past ``timeout`` (nothing of that
            batch is queued).
        ClosedError
            The router is closed.
        """
        return await self._send(Kind.PUT, data, timeout, schema)

    async def send_many(
        self, batches: Iterable[pa.RecordBatch], *, timeout: float | None = None
    ) -> Ack:
        """Route several in-memory batches under one ack (see
        :meth:`AsyncShardWriter.send_many`): checked whole, queued whole
        (one entry when they fit one run), routed with whatever queued
        beside them.

        Raises
        ------
        SchemaMismatchError
            A batch does not fit the table (nothing is queued).
        BackpressureTimeoutError, ClosedError
            As :meth:`send`.
        """
        return await self._send(Kind.PUT, check_batches("send_many", batches), timeout, None)

    def send_nowait(self, data: pa.RecordBatch | pa.Table) -> Ack:
        """Queue in-memory rows for routing at once, or fail at once when the
        router's queue has no room (see :meth:`AsyncShardWriter.send_nowait`).

        Raises
        ------
        anyio.WouldBlock
            No room now (nothing was queued).
        SchemaMismatchError
            The rows do not fit the table (nothing was queued).
        TypeError
            ``data`` is not a RecordBatch or Table.
        ClosedError, WrongEventLoopError
            The router is not open, or is called from another event loop.
        """
        self._check_open()
        assert self._acc is not None
        return self._acc.submit_nowait(data, self._loop)

    async def put(
        self, data: Any, *, timeout: float | None = None, schema: pa.Schema | None = None
    ) -> PutSummary:
        """Route rows and wait until every shard has written them."""
        ack = await self.send(data, timeout=timeout, schema=schema)
        return await ack

    async def put_stream(
        self, stream: AsyncIterable[Any] | Iterable[Any], *, timeout: float | None = None
    ) -> PutSummary:
        """Drain a feed of batches through the router's queue and wait for all of it."""
        return await self.put(stream, timeout=timeout)

    async def delete(self, keys: Any, *, timeout: float | None = None) -> PutSummary:
        """Delete rows by primary key, each key in its own shard (in order with
        the puts sent before it); wait until every shard has written the deletes.

        Parameters
        ----------
        keys : rows holding the key columns
            As :meth:`AsyncShardWriter.delete`: a dict of key columns
            (``{"id": [1, 2]}``), a list of dict rows (``[{"id": 1}]``), a
            RecordBatch or Table; other columns are ignored.

        Returns
        -------
        PutSummary
            ``deletes`` counts the keys.

        Raises
        ------
        SchemaMismatchError
            A key column is missing, mistyped or null.
        InvalidInputError
            The table has no primary key.
        BackpressureTimeoutError, ClosedError, WriterFailedError, FencedError
            As :meth:`send`.
        """
        ack = await self._send(Kind.DELETE, keys, timeout, None)
        return await ack

    async def flush(self) -> None:
        """Wait until everything sent before this call is written.

        Raises
        ------
        ClosedError
            The router is not open (never entered, closing or closed), as
            for every other call; also when it closes while the flush waits.
        WriterFailedError, FencedError
            A shard's writer broke.
        """
        self._check_open()
        assert self._acc is not None
        marker = Ack(self._loop)
        self._acc.submit_flush(marker)
        try:
            await marker
            with unwrap_groups():
                async with anyio.create_task_group() as tg:
                    for writer in list(self._writers.values()):
                        tg.start_soon(writer.flush)
        except Exception as exc:
            if self._state is not WriterState.OPEN:
                raise ClosedError(f"{self!r} was closed while the flush waited") from exc
            raise

    def stats(self) -> RouterStats:
        """Every open writer's statistics and their totals, the router's queue
        included in the queue figures (does not block)."""
        writers = {sid: w.stats() for sid, w in self._writers.items()}
        samples = [lat for w in self._writers.values() for lat in w.ack_latencies()]
        p50, p99 = percentiles(samples, 0.50, 0.99)
        acc = self._acc
        return RouterStats(
            writers=writers,
            engine_puts=sum(s.engine_puts for s in writers.values()),
            rows=sum(s.rows for s in writers.values()),
            queue_rows=sum(s.queue_rows for s in writers.values()) + (acc.queue_rows if acc else 0),
            queue_bytes=sum(s.queue_bytes for s in writers.values())
            + (acc.queue_bytes if acc else 0),
            ack_latency_p50=p50,
            ack_latency_p99=p99,
        )

    # -- reads ----------------------------------------------------------------------
    def _memtables(self) -> list[MemtableMirror]:
        """The memtables of every writer this router has open (for ``lsm``)."""
        self._check_open()
        return [m for w in self._writers.values() for m in w._memtables()]
