"""``AsyncShardWriter``: a MemWAL shard writer with a bounded queue and group commit.

A durable ``ShardWriter.put`` waits for a WAL flush whatever the batch size,
and puts on one writer serialize, so throughput
comes only from putting many rows per put. The writer coalesces: while one
engine put is in flight, everything that arrives queues up; the next put
takes all of it (up to ``max_put_rows`` / ``max_put_bytes``, concatenated
into one batch), like aiokafka's accumulator batches records while a request
is in flight.

The writer is three objects, as aiokafka's producer is: this module's
:class:`AsyncShardWriter` (the API and the life cycle), the
:class:`~lance_async.memwal.accumulator.Accumulator` (room, validation,
coalescing, linger) and the :class:`~lance_async.memwal.committer.Committer`
(the writer task: engine calls, acks, failures). A writer a
:class:`~lance_async.ShardRouter` opens has no accumulator: its committer
takes the parts its router hands it (``handoff.py``), and their room is the
router's queue's, so every send waits in one queue. Its LSM reads are an
:class:`~lance_async.lsm.LsmReader` (``writer.lsm``) that includes its
memtable.

Guarantees
----------
* Backpressure: :meth:`AsyncShardWriter.send` waits while the queue holds
  ``max_queue_rows`` rows or ``max_queue_bytes`` bytes (queued or in flight).
  Nothing is dropped; ``timeout=`` turns a long wait into
  :class:`~lance_async.BackpressureTimeoutError`.
* Validation before queueing: each batch is checked against the table
  (names, types, nulls in key and non-nullable columns) before it enters the
  queue, so a bad batch fails only its sender.
* Acks: an :class:`~lance_async.Ack` resolves when the engine put that
  carried its rows returned -- after the WAL flush when ``durable_write`` is
  on (the engine's default). If the engine still rejects a coalesced put, its
  items are retried one by one so exactly the bad ones fail; the writer stays
  usable.
* Fatal errors: an engine error that is not about the input (an I/O error, a
  failed WAL flush) fails every pending and later ack, promptly, with one
  :class:`~lance_async.WriterFailedError` (a
  :class:`~lance_async.errors.StorageError` when the store failed it; see
  :attr:`AsyncShardWriter.failure`). A shard writer does not heal: once the
  store is back, close it and open a new writer on the same shard, which
  claims the next writer epoch (fencing whatever call of the old one is
  still running) and replays every acknowledged row from the WAL::

      try:
          await writer.put(rows)
      except lance_async.StorageError as exc:
          await writer.aclose()
          writer = await ds.mem_wal_writer(shard_id).open(task_group)
          if exc.may_have_landed:  # its put may still have been written
              ...                  # an upsert sent again is safe (keyed)

  Wait for the store first (a probe, a back-off): an open the store leaves
  hanging is abandoned at ``storage_timeout`` and may still claim the shard
  later, fencing the writer opened after it. The routing writer
  (:class:`~lance_async.ShardRouter`) does all of this itself.
* Order: puts and deletes on one writer reach the engine in the order they
  were queued.
* Read-your-writes: the writer's LSM reads (``writer.lsm``) read its
  memtable from a mirror, sealed memtables included, so every row it took is
  visible to them (the engine's own scanner hides a sealed memtable's rows
  until its SSTable is written); every durable row is visible to every
  other read, in any process, through the shard's WAL tail.
* Flushes: a memtable that has held rows for ``max_memtable_age`` seconds
  (default 60) is flushed to a generation, so compaction never waits for a
  quiet writer to stop.

Cancellation rule
-----------------
A send of in-memory rows (a batch, a table, a frame, a ``send_many``
group...) is queued whole or not at all; a streamed send (an iterator, a
reader) is queued whole or not at all per batch. Cancelling a task blocked
in ``send``/``put`` before its rows were queued queues nothing; cancelling
it afterwards (while it awaits the ack) leaves the rows queued: they are
written exactly once and the :class:`~lance_async.Ack` (kept by ``send``
callers) still resolves. Closing the writer flushes everything queued
(shielded from cancellation, bounded by ``close_timeout``).

Commit policies
---------------
``commit=`` chooses how queued rows become engine puts (``policy.py``):
``"adaptive"`` (the default: every put flushes its WAL at once, puts paced
by the last one's duration), ``"latency"``, ``"throughput"``. Figures per
policy: ``python -m bench`` (bench/results/REPORT.md).

The cheap path: a send of one record batch is one queue entry whose
:class:`~lance_async.Ack` is the entry itself; :meth:`AsyncShardWriter.send_many`
queues a group of batches under one ack; a feed's micro-batch reaches the
writer as one batch (:func:`~lance_async.feeds.ingest`).
"""

from __future__ import annotations

import math
import uuid
import warnings
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup
from typing_extensions import Unpack

from .._args import check_batches, check_seconds
from .._loop import LoopHandle, unwrap_groups
from .._schema import NO_KEY, TableFit, primary_key
from .._table import Table
from .._threads import run_sync
from ..errors import ClosedError, InvalidInputError, LanceAsyncError
from ..lsm.memtable import MemtableMirror
from ..lsm.reader import LsmReader
from .accumulator import Accumulator, Item, Kind, ShardCheck
from .acks import Ack, PutSummary
from .committer import Committer, Runs
from .engine import OpenedEngine, start_engine
from .handoff import Handoff
from .policy import WriterConfig, WriterOptions
from .sharding import Sharding
from .stats import WriterState, WriterStats, collect_stats

__all__ = ["AsyncShardWriter"]


def room_deadline(timeout: float | None) -> float | None:
    """When a wait for room of ``timeout`` seconds from now ends (None: never),
    on anyio's clock.

    Raises
    ------
    ValueError
        ``timeout`` is negative, NaN or infinite.
    """
    if timeout is None:
        return None
    if not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout}")
    return anyio.current_time() + timeout


class AsyncShardWriter:
    """Write one MemWAL shard from async code, with group commit.

    Obtain it from :meth:`AsyncDataset.mem_wal_writer` and use it as
    ``async with``; it owns one ``lance.mem_wal.ShardWriter`` and one writer
    task (in a task group owned by the ``async with`` block, so the task's
    errors reach you). See the module notes for what it guarantees.

    Parameters
    ----------
    dataset : AsyncDataset
        A dataset on which ``initialize_mem_wal`` ran.
    shard_id : str
        The shard's UUID, in any spelling ``uuid.UUID`` takes; kept (and
        shown as :attr:`shard_id`) in its canonical lower-case form.
        Reopening the same shard replays its WAL.
    **options : WriterOptions
        The writer's options, each a named keyword
        (:class:`~lance_async.WriterOptions`): lance_async's (below,
        under Other Parameters) and the engine writer's, passed to
        ``LanceDataset.mem_wal_writer`` (``durable_write``,
        ``max_memtable_rows``, ``max_wal_flush_interval_ms``, ...).

    Other Parameters
    ----------------
    commit : {"adaptive", "latency", "throughput"}
        The commit policy (default ``"adaptive"``; see ``policy.py``).
    min_put_interval : float, optional
        Seconds between the starts of two engine puts at least (adaptive:
        0.005, stretched up to 0.02 while puts are slow; others: 0); an
        idle writer puts at once.
    max_queue_rows : int, optional
        Rows queued or in flight before senders wait (default ``2 * max_put_rows``;
        latency policy: ``max_put_rows``).
    max_queue_bytes : int
        Bytes queued or in flight before senders wait (default 256 MiB).
    max_put_rows : int, optional
        Rows per engine put (adaptive: 10,000; latency: 1,000; throughput:
        half the engine's ``max_memtable_rows``; never above that, since one
        put never spans memtables).
    max_put_bytes : int
        Bytes per engine put (default 64 MiB).
    linger : float
        Seconds to wait, from the first queued row, for a whole put's rows
        (Kafka's ``linger.ms``; default 0).
    close_timeout, storage_timeout : float
        Seconds that closing may spend flushing (default 60); that an engine
        call may wait on the store (default: the dataset's ``storage_timeout``).

    Raises
    ------
    TypeError, ValueError
        An option of the wrong type or out of range (an unknown policy, a
        limit below 1, a negative wait).
    """

    def __init__(self, dataset: Table, shard_id: str, **options: Unpack[WriterOptions]) -> None:
        try:
            canonical = str(uuid.UUID(str(shard_id)))  # the engine's folder name
        except ValueError:
            raise ValueError(f"shard_id must be a UUID string, got {shard_id!r}") from None
        self.config = config = WriterConfig.from_options(**options)
        """The writer's options, checked."""
        self._dataset = dataset
        self.shard_id = canonical
        self.commit = config.policy.name
        self.max_queue_bytes, self.max_put_bytes = config.max_queue_bytes, config.max_put_bytes
        self.max_queue_rows = self.max_put_rows = 0  # known once open (from the memtable)
        self.linger, self.close_timeout = config.linger, config.close_timeout
        self.storage_timeout: float = config.storage_timeout or dataset.storage_timeout
        self.engine_options: dict[str, Any] = dict(config.engine)
        """The engine writer's keywords (once open: with what the policy added)."""
        self.durable_write = bool(self.engine_options.get("durable_write", True))
        self._table_schema = dataset.schema
        self._keys = primary_key(self._table_schema)
        self._fit = TableFit(self._table_schema, self._keys)
        self._key_fit = TableFit(
            pa.schema([self._table_schema.field(k) for k in self._keys]), self._keys
        )
        self._state = WriterState.NEW
        self._loop: LoopHandle | None = None
        self._tg: TaskGroup | None = None
        self._acc: Accumulator | None = None  # its own queue (none when routed)
        self._runs: Runs | None = None  # where its committer takes runs: _acc, or a Handoff
        self._room: Accumulator | None = None  # a router's queue (see routed)
        self._shard_check: ShardCheck | None = None  # rows of other shards refused at the send
        self._committer: Committer | None = None
        self._opened: OpenedEngine | None = None  # see adopt
        self._keep_late: Callable[[], bool] | None = None
        self.sharding: Sharding | None = None
        """The table's sharding, read when the writer opens."""
        self.lsm = LsmReader(dataset, self.memtables, path="writer")
        """The LSM reads of the table with this writer's memtable included (open writers)."""

    def __repr__(self) -> str:
        return f"<AsyncShardWriter shard={self.shard_id} state={self._state.value}>"

    def __del__(self) -> None:
        if getattr(self, "_state", None) in (WriterState.OPEN, WriterState.FAILED):
            warnings.warn(
                f"{self!r} was never closed; use `async with` or await aclose()",
                ResourceWarning,
                stacklevel=1,
            )

    # -- life cycle ---------------------------------------------------------
    @property
    def state(self) -> WriterState:
        """Where the writer is in its life cycle."""
        return self._state

    @property
    def schema(self) -> pa.Schema:
        """The table schema that every batch must match."""
        return self._table_schema

    @property
    def failure(self) -> LanceAsyncError | None:
        """The error every ack fails with once the writer has failed (None
        while it has not): a :class:`~lance_async.errors.FencedError`, the
        :class:`~lance_async.errors.StorageError` of its store, or a
        :class:`~lance_async.errors.WriterFailedError`."""
        return self._committer.failure if self._committer is not None else None

    async def __aenter__(self) -> AsyncShardWriter:
        await self._open(None)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def open(self, task_group: TaskGroup) -> AsyncShardWriter:
        """Open the engine writer and start the writer task in ``task_group``.

        ``async with dataset.mem_wal_writer(...)`` is the usual way. Use
        ``open`` when the writer must outlive one block: its task runs in the
        task group you pass (trio's rule: no task outlives its caller unless a
        task group is passed), so ``await writer.aclose()`` before it ends.

        Raises
        ------
        ClosedError
            Already opened once.
        InvalidInputError
            The table has no primary key; the shard was retired by a later
            ``initialize_mem_wal`` (see ``lance_async.memwal.retired``); or the
            engine refused: the MemWAL is not initialized, or an option is
            out of range.
        StorageError
            The store failed the open, or did not answer within ``storage_timeout``.
        """
        return await self._open(task_group)

    def adopt(
        self, opened: OpenedEngine | None, keep_late: Callable[[], bool] | None
    ) -> AsyncShardWriter:
        """Before :meth:`open`, for a routing writer: ``opened``, an engine
        writer opened already (a late open, ``take_late_open``), is used
        instead of opening one; ``keep_late`` is ``start_engine``'s."""
        self._opened, self._keep_late = opened, keep_late
        return self

    def routed(self, room: Accumulator) -> AsyncShardWriter:
        """Before :meth:`open`, for a routing writer: this writer has no queue
        of its own. ``room`` is the router's queue: the router hands this
        writer its parts (:meth:`hand`), whose room stays taken there until
        they are written, and what is sent to this writer itself (checked
        for its shard) queues there too, in order with the router's sends.
        See ``handoff.py``."""
        self._room = room
        return self

    async def _open(self, task_group: TaskGroup | None) -> AsyncShardWriter:
        if self._state is not WriterState.NEW:
            raise ClosedError(f"{self!r} was already opened; open a new writer")
        self._loop = LoopHandle()
        config = self.config
        if not self._keys:
            raise InvalidInputError(f"{self!r}: {NO_KEY}")
        ds = self._dataset.lance
        options = self._dataset.storage_options
        opened, self._opened = self._opened, None
        if opened is None:
            opened = await start_engine(
                ds,
                self.shard_id,
                config,
                self.storage_timeout,
                repr(self),
                options,
                self._keep_late,
            )
        self.sharding, self.engine_options = opened.sharding, opened.options
        sharding = opened.sharding
        if sharding.sharded:
            self._shard_check = partial(sharding.check, shard_id=self.shard_id)
        self.max_put_rows, self.max_queue_rows = config.limits(opened.memtable_rows)
        if self._room is not None:  # routed: parts handed straight to the committer
            runs: Runs = Handoff(
                self._room,
                max_put_rows=self.max_put_rows,
                max_put_bytes=config.max_put_bytes,
                check=self._check_state,
                describe=self.__repr__,
            )
        else:
            runs = self._acc = Accumulator.for_writer(
                config,
                (self.max_put_rows, self.max_queue_rows),
                self._fit,
                self._key_fit,
                check=self._check_state,
                describe=self.__repr__,
            )
        self._runs = runs
        mirror = MemtableMirror(ds.uri, self.shard_id, self._table_schema, self._keys, options)
        mirror.epoch = opened.epoch
        self._committer = Committer(
            opened.engine,
            runs,
            shard_id=self.shard_id,
            fit=self._fit,
            key_fit=self._key_fit,
            on_failure=self._mark_failed,
            describe=self.__repr__,
            mirror=mirror,
            reopen=opened.reopen,
            max_memtable_age=config.max_memtable_age,
            storage_options=options,
            uri=str(ds.uri),
            storage_timeout=self.storage_timeout,
            probe=lambda: ds.tags.list(),
        )
        if task_group is None:
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            task_group = self._tg
        name = f"lance_async writer {self.shard_id}"
        task_group.start_soon(self._committer.run, name=name)
        if config.max_memtable_age is not None:
            task_group.start_soon(self._committer.run_age_flush, name=f"{name} (age flush)")
        self._state = WriterState.OPEN
        return self

    def _mark_failed(self) -> None:
        if self._state is WriterState.OPEN:
            self._state = WriterState.FAILED

    def _check_usable(self) -> None:
        if self._loop is not None and not self._loop.is_current():
            self._loop.check(repr(self))
        self._check_state()

    def _check_state(self) -> None:
        if self._state is WriterState.FAILED:
            assert self._committer is not None and self._committer.failure is not None
            raise self._committer.failure
        if self._state is not WriterState.OPEN:
            raise ClosedError(f"{self!r} is not open; use `async with dataset.mem_wal_writer(...)`")

    def _queue(self) -> Accumulator:
        """Where this writer's sends queue: its own accumulator, or its router's."""
        queue = self._acc if self._acc is not None else self._room
        assert queue is not None
        return queue

    def _parts(self) -> tuple[Runs, Committer]:
        assert self._runs is not None and self._committer is not None
        return self._runs, self._committer

    async def flush(self) -> PutSummary:
        """Wait until everything queued before this call is written.

        With ``durable_write`` on (the default) written means durable in the
        WAL; with it off, accepted by the engine (durable after close). A
        writer opened by a router waits for what its router's queue holds
        for this shard.

        Raises
        ------
        WriterFailedError
            The writer broke before the queue drained.
        """
        self._check_usable()
        if self._room is not None:  # first what the router's queue holds, then the hand-off
            marker = Ack(self._loop)
            self._room.submit_flush(marker)
            await marker
        return await self.drain()

    async def drain(self) -> PutSummary:
        """Wait until every row this writer's task was given before this call
        is written: its queue's (:meth:`flush`), or the parts its router
        handed it (what a router's flush waits for, shard by shard).

        Raises
        ------
        WriterFailedError, FencedError, ClosedError
            The writer broke or closed before they were written.
        """
        self._check_usable()
        ack = Ack(self._loop)
        runs = self._parts()[0]
        assert isinstance(runs, (Accumulator, Handoff))
        runs.submit_flush(ack)
        return await ack

    async def aclose(self) -> None:
        """Flush what is queued, close the engine writer, stop the writer task.

        Safe to call twice. The flush is shielded from cancellation and
        bounded by ``close_timeout``; acks still pending after it fail with
        :class:`ClosedError`. Errors of the writer task are raised here.
        """
        if self._state in (WriterState.NEW, WriterState.CLOSED, WriterState.CLOSING):
            if self._state is WriterState.NEW:
                self._state = WriterState.CLOSED
            return
        if self._loop is not None and not self._loop.is_current():
            self._loop.check(repr(self))  # close it from the loop that opened it
        failed = self._state is WriterState.FAILED
        self._state = WriterState.CLOSING
        runs, committer = self._parts()
        try:
            await committer.shutdown(self.close_timeout, failed)
        finally:
            self._state = WriterState.CLOSED
            runs.wake_senders()
            if self._tg is not None:
                tg, self._tg = self._tg, None
                with unwrap_groups():
                    await tg.__aexit__(None, None, None)

    # -- sending -------------------------------------------------------------
    async def _submit(
        self,
        kind: Kind,
        data: Any,
        timeout: float | None,
        schema: pa.Schema | None,
    ) -> Ack:
        self._check_usable()
        deadline = room_deadline(timeout)
        await anyio.lowlevel.checkpoint()  # every send is a checkpoint (trio's rule)
        acc, check = self._queue(), self._shard_check
        if kind is Kind.PUT and schema is None and data.__class__ is pa.RecordBatch:
            # the cheap path: one batch, one queue entry, its ack
            fast = await acc.submit_batch(data, self._loop, deadline, check)
            if fast is not None:
                return fast
        ack = Ack(self._loop)
        await acc.submit(kind, data, ack, deadline, schema, check)
        return ack

    @property
    def last_put_seconds(self) -> float:
        """How long this writer's last engine put took (seconds; 0 before
        any put). A :class:`~lance_async.ShardRouter` paces its runs by it."""
        return self._runs.last_put_seconds if self._runs is not None else 0.0

    def hand(self, part: Item) -> None:
        """Take a routing writer's part for this shard (see ``handoff.py``):
        rows already checked, relabelled and of this shard, their room held
        in the router's queue. Does not block; the part's ack settles the
        sends it carries.

        Raises
        ------
        ClosedError, WriterFailedError, FencedError, StorageError
            The writer can take no more rows, or was not opened by a router
            (nothing was handed).
        """
        self._check_usable()
        runs = self._parts()[0]
        if not isinstance(runs, Handoff):
            raise ClosedError(f"{self!r} was not opened by a router: send rows to it instead")
        runs.hand(part)

    async def send(
        self, data: Any, *, timeout: float | None = None, schema: pa.Schema | None = None
    ) -> Ack:
        """Queue rows for writing; wait only for room in the queue.

        Parameters
        ----------
        data : anything :func:`~lance_async.coerce_source` accepts
            Rows with exactly the table's column names (any order) and types.
            A stream (iterator, async iterator, reader) is queued batch by
            batch under backpressure; this returns after its last batch.
        timeout : float, optional
            Seconds to wait for room; then :class:`BackpressureTimeoutError`
            (batches queued before the timeout stay queued).
        schema : pa.Schema, optional
            The data's schema, for generators (saves peeking).

        Returns
        -------
        Ack
            Resolves when every row is written (see the module notes).

        Raises
        ------
        SchemaMismatchError
            A batch does not fit the table (nothing of that batch is queued).
        WrongShardError
            A row's key maps to another shard (nothing of that batch is queued).
        BackpressureTimeoutError
            No room before ``timeout``.
        ClosedError, WriterFailedError, FencedError
            The writer is closed, broken, or fenced by a newer writer of its shard.
        """
        return await self._submit(Kind.PUT, data, timeout, schema)

    async def send_many(
        self, batches: Iterable[pa.RecordBatch], *, timeout: float | None = None
    ) -> Ack:
        """Queue several in-memory batches under one ack: one hand-off, one ack.

        Far cheaper than a :meth:`send` per batch for a caller holding many
        (a feed's fetch). The group is checked whole (schema, then shard),
        then queued whole or not at all (cancellation too): one queue entry
        when it fits one put, else cut like a large table.

        Returns
        -------
        Ack
            Resolves when every row of the group is written;
            ``PutSummary.batches`` counts the group's non-empty batches.

        Raises
        ------
        SchemaMismatchError, WrongShardError
            A batch does not fit (nothing of the group is queued).
        BackpressureTimeoutError, ClosedError, WriterFailedError, FencedError
            As :meth:`send`.
        """
        return await self._submit(Kind.PUT, check_batches("send_many", batches), timeout, None)

    def send_nowait(self, data: pa.RecordBatch | pa.Table) -> Ack:
        """Queue in-memory rows at once, or fail at once when there is no room.

        The ``send`` / ``send_nowait`` pair of anyio's memory streams: no
        waiting, no checkpoint, the cheapest way to hand a writer many small
        batches (check the returned ack later, or call :meth:`flush`).

        Raises
        ------
        anyio.WouldBlock
            The queue has no room for these rows now (nothing was queued).
        SchemaMismatchError
            The rows do not fit the table (nothing was queued).
        TypeError
            ``data`` is not a RecordBatch or Table; use :meth:`send`.
        ClosedError, WriterFailedError, WrongEventLoopError
            As :meth:`send`.
        """
        self._check_usable()
        return self._queue().submit_nowait(data, self._loop, self._shard_check)

    async def put(
        self, data: Any, *, timeout: float | None = None, schema: pa.Schema | None = None
    ) -> PutSummary:
        """Write rows and wait until they are written (``await (await send(data))``).

        Raises
        ------
        SchemaMismatchError, BackpressureTimeoutError, ClosedError, WriterFailedError
            As :meth:`send`.
        InvalidInputError
            The engine rejected these rows (the writer stays usable).
        """
        ack = await self.send(data, timeout=timeout, schema=schema)
        return await ack

    async def delete(self, keys: Any, *, timeout: float | None = None) -> PutSummary:
        """Delete rows by primary key, in order with the puts queued before it.

        ``keys``: rows holding the primary-key column(s), other columns
        ignored (a dict of columns works: ``{"id": [1, 2]}``). Returns a
        :class:`PutSummary` with ``deletes`` = number of keys.
        """
        ack = await self._submit(Kind.DELETE, keys, timeout, None)
        return await ack

    # -- statistics ---------------------------------------------------------
    def stats(self) -> WriterStats:
        """Queue depth, engine puts, rows per put, ack latency (does not block).

        The engine's own ``memtable_stats()`` is the one read after the last
        put, its ``stats()`` one read after a put at most a second ago;
        :meth:`engine_stats` reads both fresh.
        """
        return collect_stats(self._state, self._runs, self._committer)

    def ack_latencies(self) -> list[float]:
        """The most recent acks' latencies, in seconds from queueing to written
        (up to :data:`~lance_async.memwal.committer.LATENCY_SAMPLES`; does not block)."""
        return list(self._committer.latencies) if self._committer is not None else []

    async def engine_stats(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The engine's ``stats()`` and ``memtable_stats()``, read on a worker thread."""
        committer = self._committer
        if committer is None:
            raise ClosedError(f"{self!r} is not open")
        async with committer.gate:  # an age flush may be replacing the engine writer
            engine = committer.engine
            return await run_sync(lambda: (engine.stats(), engine.memtable_stats()))

    # -- reads -------------------------------------------------------------
    def memtables(self) -> list[MemtableMirror]:
        """This writer's memtable, for its LSM reads (open or failed writers only)."""
        if self._state not in (WriterState.OPEN, WriterState.FAILED):
            raise ClosedError(f"{self!r} is not open")
        if self._loop is not None:
            self._loop.check(repr(self))
        mirror = self._parts()[1].mirror
        assert mirror is not None  # every open writer has one
        return [mirror]

    async def wait_flushed(self, timeout: float = 30.0) -> None:
        """Wait until no sealed (frozen) memtable is waiting to be written.

        After it returns, every memtable sealed so far is a flushed
        generation (an SSTable) that :meth:`AsyncDataset.shard_snapshots`
        lists. It does not seal the active memtable; closing the writer does
        (and so does ``max_memtable_age``).

        Raises
        ------
        TypeError, ValueError
            ``timeout`` is not a number of seconds >= 0.
        LanceAsyncError
            Still sealed after ``timeout`` seconds.
        FencedError
            A newer writer claimed the shard (its sealed memtable can never
            flush): at once, not after ``timeout``.
        WriterFailedError
            The writer failed (at once).
        ClosedError
            The writer is not open.
        """
        timeout = check_seconds("timeout", timeout)
        self.memtables()
        await self._parts()[1].wait_flushed(timeout)
