"""``ShardRouter``: the routing writer -- every row to its own shard, one writer per shard.

``dataset.mem_wal_writer()`` with no shard id returns one. For a table whose
MemWAL has a sharding spec (bucket, identity or unsharded; bucket sharding on
the primary key is lance_async's default), the router computes each row's
shard with the engine (``evaluate_sharding_spec``, see ``sharding.py``) and
hands each part to the :class:`~lance_async.AsyncShardWriter` of its shard,
opened lazily the first time the shard receives rows (the shards new to a
run open side by side). All writers run in the router's task group. So in
one process, writes with overlapping keys -- two ingests, a feed and an HTTP
upload -- always meet in the same shard, and the newest value wins in every
read and in compaction.

One queue: a send waits for room in the router's queue only, and keeps its
room there until every shard put holding its rows returned; the shard
writers have no queue of their own (their committers take the parts the
routing task hands them: ``handoff.py``). The path, top to bottom:
:meth:`ShardRouter.send` -> ``Accumulator.submit_batch`` (``accumulator.py``)
-> the routing task (``_route``: ``cut_run`` in ``routing.py``, then
``AsyncShardWriter.hand``) -> ``Committer.run`` (``committer.py``), whose
settled puts give the room back.

In several processes, each shard must still have one writer: either one
process owns the whole table, or the shards are divided among workers (see
``docs/sharding.md``); a second router opening a shard fences the first
(:class:`~lance_async.errors.FencedError`).

Writers that heal
-----------------
A shard writer failed by its store stays failed; the router opens the
shard again on the next run with rows for it (after a probe of the store,
never beside an earlier open still running, with a back-off), so the first
send after the store is back is acknowledged: ``healing.py``. A fenced
shard is not reopened.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup
from typing_extensions import Unpack

from .._args import check_batches
from .._loop import LoopHandle, unwrap_groups
from .._schema import TableFit, primary_key
from .._table import Table
from ..errors import ClosedError, InvalidInputError
from ..lsm.memtable import MemtableMirror
from ..lsm.reader import LsmReader
from .accumulator import Accumulator, Entry, Kind
from .acks import Ack, PutSummary
from .compactor import CompactionPolicy, Compactor
from .engine import DEFAULT_MAX_MEMTABLE_ROWS
from .healing import ShardWriters
from .policy import LoopLoad, WriterConfig, WriterOptions
from .routing import FanOut, RoutedPart, ShardCut, cut_part, cut_run
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


class ShardRouter:
    """Write a MemWAL table without naming shards: each row goes to its own shard.

    Obtain it with ``dataset.mem_wal_writer()`` (no shard id), and use it
    as ``async with``. It has the writer's API (``send`` / ``put`` / ``delete`` /
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
        (``commit=``, ``min_put_interval=``), put limits, ``linger``,
        ``durable_write``, ... The queue limits (``max_queue_rows=``,
        ``max_queue_bytes=``) bound the router's one queue, every row sent
        and not yet written; by default it holds two runs of one put per
        shard (one being written, the next filling; bytes:
        ``max_queue_bytes`` per shard and one more). Up to
        :data:`MAX_RUN_SHARDS` shards count.

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
        **writer_options: Unpack[WriterOptions],
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
        self._shards = ShardWriters(
            dataset,
            writer_options,
            float(self.config.storage_timeout or dataset.storage_timeout),
            describe=self.__repr__,
            keeps_late_opens=lambda: self._state is WriterState.OPEN,
            prepare=self._prepare,
        )
        self._writers = self._shards.writers  # the same dict: open writers by shard id
        self._sharding: Sharding | None = None
        self._tg: TaskGroup | None = None
        self._state = WriterState.NEW
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
        """The write path's one queue: room for every row sent and not yet
        written (the shard writers have no queue of their own: ``handoff.py``),
        and runs of up to one put per shard (:data:`MAX_RUN_SHARDS` at most).
        By default it holds two runs' rows (one being written, the next
        filling: a put in flight per shard and the next) and the bytes of a
        run and each shard writer's queue; ``max_queue_rows=`` /
        ``max_queue_bytes=`` bound the whole."""
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
        queue_bytes = config.max_queue_bytes
        if config.max_queue_rows is None:  # a run being written, the next one filling
            queue_rows = max(2 * run_rows, queue_rows * shards)
        if "max_queue_bytes" not in self._options:
            queue_bytes *= 1 + shards
        return Accumulator(
            fit=self._fit,
            key_fit=self._key_fit,
            keys=routed,
            max_queue_rows=queue_rows,
            max_queue_bytes=queue_bytes,
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
                await self._shards.drop_kept()
        finally:
            self._state = WriterState.CLOSED
            self._acc.wake_senders()
            with unwrap_groups():
                await self._tg.__aexit__(None, None, None)

    def _prepare(self, writer: AsyncShardWriter) -> None:
        """A shard writer about to open: fed by this router (no queue of its own)."""
        assert self._acc is not None
        writer.routed(self._acc)

    def _check_open(self) -> None:
        if self._loop is not None and not self._loop.is_current():
            self._loop.check(repr(self))
        self._check_state()

    def _check_state(self) -> None:
        if self._state is not WriterState.OPEN:
            raise ClosedError(f"{self!r} is not open; use `async with dataset.mem_wal_writer()`")

    async def writer(self, shard_id: str) -> AsyncShardWriter:
        """The writer of ``shard_id``, opened now if it is not open yet.

        Opening claims the shard (a writer of it elsewhere is fenced). It has
        no queue of its own: rows sent to the router reach it through the
        router's queue, and so do rows sent to it (checked for its shard,
        in order with the router's sends).

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
        assert self._tg is not None
        return await self._shards.open(shard_id, self._tg)

    async def _open_writers(self, shard_ids: Iterable[str]) -> dict[str, Exception]:
        """Open the writers of these shards not open (or failed), side by
        side (:meth:`ShardWriters.open_many`)."""
        assert self._tg is not None
        return await self._shards.open_many(shard_ids, self._tg)

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
                    entry.ack.part_failed(error)
            self._routed.set()

    async def _route(self, run: list[Entry]) -> None:
        """Route one run: cut it per shard (one evaluation; a large run on a worker
        thread, see :data:`ROUTE_INLINE_ROWS`) and hand each shard writer its
        part. The run's room stays taken until the parts' puts settle; what
        was not handed over (rows refused, shards that could not take them)
        is given back here."""
        assert self._acc is not None
        kind = run[0].kind
        if kind is Kind.FLUSH:  # everything before it was handed to the writers
            for entry in run:
                entry.ack.part_done()
            return
        fit = self._fit if kind is Kind.PUT else self._key_fit
        room = (sum(e.rows for e in run), sum(e.nbytes for e in run))
        handed = [0, 0]  # rows and bytes handed over (given back as their puts settle)
        try:
            parts = await cut_run(self.sharding, fit, run, ROUTE_INLINE_ROWS)
            # the parts of open shards go first: a shard still to open (or to
            # reopen: a probe, an open) does not hold back the others' puts; a
            # shard's own parts keep their order
            usable = self._shards.usable
            ready = [p for p in parts if usable(p[1].shard_id)]
            waiting = [p for p in parts if not usable(p[1].shard_id)]
            left = [*ready, *waiting]  # not handed over yet
            self._hand_over_all(kind, ready, left, {}, room, handed)
            if waiting:
                try:  # the shards not open yet open side by side, not one per hand-over
                    failed = await self._open_writers(cut.shard_id for _, cut in waiting)
                except BaseException:  # cancelled: these were not handed over
                    self._fail_parts(kind, left)
                    raise
                self._hand_over_all(kind, waiting, left, failed, room, handed)
        finally:
            self._acc.release(room[0] - handed[0], room[1] - handed[1])
        self._pace({cut.shard_id for _, cut in parts})

    def _hand_over_all(
        self,
        kind: Kind,
        parts: list[tuple[list[Entry], ShardCut]],
        left: list[tuple[list[Entry], ShardCut]],
        failed: dict[str, Exception],
        room: tuple[int, int],
        handed: list[int],
    ) -> None:
        """Hand ``parts`` over in order, each removed from ``left`` first
        (``room``, ``handed``: as :meth:`_hand_over`)."""
        for part in parts:
            del left[next(i for i, p in enumerate(left) if p is part)]  # by identity
            entries, shard_cut = part
            self._hand_over(kind, entries, shard_cut, failed.get(shard_cut.shard_id), room, handed)

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

    def _fail_parts(self, kind: Kind, parts: list[tuple[list[Entry], ShardCut]]) -> None:
        """Fail the members of parts that were never handed over (cancelled)."""
        error = ClosedError(f"{self!r} was cancelled before these rows were routed")
        for rest, left in parts:
            acks = [rest[i].ack for i in left.entries]
            FanOut(kind, acks, left.rows, left.batches, left.starts).part_failed(error)

    def _hand_over(
        self,
        kind: Kind,
        run: list[Entry],
        cut: ShardCut,
        unopened: Exception | None,
        room: tuple[int, int],
        handed: list[int],
    ) -> None:
        """Hand one shard's part of a run to its writer, cut to the writer's
        ``max_put_rows`` (``unopened``: the error its opening failed with).
        Each piece holds the run's ``room`` (rows, bytes) in proportion to
        its rows; what is handed is added to ``handed``. Does not block."""
        acks = [run[i].ack for i in cut.entries]
        writer = self._writers.get(cut.shard_id)
        if unopened is not None or writer is None:  # the shard cannot take rows
            error = unopened or ClosedError(f"{self!r}: shard {cut.shard_id} is not open")
            FanOut(kind, acks, cut.rows, cut.batches, cut.starts).part_failed(error)
            return
        queued_at = run[cut.entries[0]].queued_at
        limit = writer.max_put_rows or cut.batch.num_rows
        fans = cut_part(kind, cut, acks, limit)
        rows = cut.batch
        if kind is Kind.DELETE and rows.num_columns > len(self._keys):
            rows = rows.select(self._keys)  # the sharded column routed it; the engine takes keys
        run_rows, run_bytes = room
        for i, fan in enumerate(fans):
            batch = rows.slice(i * limit, limit)
            n = batch.num_rows
            nbytes = run_bytes * n // max(1, run_rows)
            part = RoutedPart(kind, batch, fan, n, nbytes, queued_at)
            try:
                writer.hand(part)
            except Exception as exc:  # the writer failed or closed: its members fail
                part.batch = None
                fan.part_failed(exc)
            else:
                handed[0] += n
                handed[1] += nbytes

    # -- sending -------------------------------------------------------------------
    async def _send(self, kind: Kind, data: Any, timeout: float | None, schema: Any) -> Ack:
        self._check_open()
        assert self._acc is not None
        deadline = room_deadline(timeout)
        await anyio.lowlevel.checkpoint()  # every send is a checkpoint (trio's rule)
        if kind is Kind.PUT and schema is None and data.__class__ is pa.RecordBatch:
            fast = await self._acc.submit_batch(data, self._loop, deadline)
            if fast is not None:
                return fast
        ack = Ack(self._loop)
        await self._acc.submit(kind, data, ack, deadline, schema)
        return ack

    async def send(
        self, data: Any, *, timeout: float | None = None, schema: pa.Schema | None = None
    ) -> Ack:
        """Queue rows for routing to their shards' writers; wait only for queue room.

        The router queues each send whole; its task routes what queued in
        bulk (one evaluation of the sharding spec per run) and hands each
        shard writer one part; the send's room stays taken until its rows
        are written. In-memory rows are checked
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
            The router's queue (every row sent and not yet written) stayed
            full past ``timeout`` (nothing of that batch is queued).
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
                        tg.start_soon(writer.drain)
        except Exception as exc:
            if self._state is not WriterState.OPEN:
                raise ClosedError(f"{self!r} was closed while the flush waited") from exc
            raise

    def stats(self) -> RouterStats:
        """Every open writer's statistics and their totals; the queue figures
        are the router's queue's, which holds every row until it is written
        (does not block)."""
        writers = {sid: w.stats() for sid, w in self._writers.items()}
        samples = [lat for w in self._writers.values() for lat in w.ack_latencies()]
        p50, p99 = percentiles(samples, 0.50, 0.99)
        acc = self._acc
        return RouterStats(
            writers=writers,
            engine_puts=sum(s.engine_puts for s in writers.values()),
            rows=sum(s.rows for s in writers.values()),
            queue_rows=acc.queue_rows if acc else 0,
            queue_bytes=acc.queue_bytes if acc else 0,
            ack_latency_p50=p50,
            ack_latency_p99=p99,
            reopens=self._shards.reopens,
        )

    # -- reads ----------------------------------------------------------------------
    def _memtables(self) -> list[MemtableMirror]:
        """The memtables of every writer this router has open (for ``lsm``)."""
        self._check_open()
        return [m for w in self._writers.values() for m in w.memtables()]
