"""The writer task: engine puts and deletes, acks settled, fatal failures.

The last of a shard writer's three parts (aiokafka's ``Sender``): one task
per writer takes runs from its :class:`Runs` -- the writer's own
:class:`~lance_async.memwal.accumulator.Accumulator`, or, for a shard
writer of a :class:`~lance_async.ShardRouter`, the
:class:`~lance_async.memwal.handoff.Handoff` its router hands parts to --
makes one engine call per run on a worker thread, and settles the run's
acks, giving their room back to where it was taken.

* A run the engine rejects as bad input is retried item by item, so exactly
  the bad items fail and the writer stays usable.
* Any other engine error is fatal: the writer fails, and every pending and
  later ack fails with one :class:`~lance_async.WriterFailedError` (a
  :class:`~lance_async.errors.StorageError` when the store failed it).
* Engine calls hold the writer's *gate* (an ``anyio.Lock``), so the LSM
  reads can plan while no put can seal another memtable.
* A memtable is never left unflushed for long: when it has held rows for
  ``max_memtable_age`` seconds and no put is running, the engine writer is
  closed (which flushes the memtable to a generation) and opened again, so
  compaction does not wait for a quiet process to stop.
* Every engine call has a deadline, ``storage_timeout``: pylance 14's put
  retries for ever when the store refuses every request, so a call still
  running at its deadline is abandoned (``_threads.run_sync``), the writer
  fails with :class:`~lance_async.errors.StorageTimeoutError` -- or, when a
  quick probe of the store gets an answer, with the error that answer means
  (:class:`~lance_async.errors.StoragePermissionError` for a 403) -- and the
  engine writer the stuck call holds is never closed (closing would wait on
  it). Rows acknowledged before are in the WAL.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

import anyio
import pyarrow as pa

from .._engine_errors import map_engine_error
from .._memory import memory_freed
from .._metrics import record_settled, track_queue
from .._schema import TableFit
from .._threads import DEFAULT_STORAGE_TIMEOUT, run_sync
from ..errors import (
    ClosedError,
    FencedError,
    InvalidInputError,
    LanceAsyncError,
    StorageError,
    StorageTimeoutError,
    WriterFailedError,
)
from ..lsm.memtable import MemtableMirror
from ..lsm.wal import follow_tail
from ..lsm.walfiles import CHECKPOINT_ENTRIES
from .abandoned import (
    may_still_land,
    probe_timeout,
)
from .accumulator import BatchAck, Entry, Item, Kind
from .engine import claimed_epoch

__all__ = ["LATENCY_SAMPLES", "Committer", "Runs"]

log = logging.getLogger("lance_async.memwal")

FENCE_CHECK_INTERVAL = 0.25
"""Seconds between two reads of the shard's epoch while :meth:`Committer.wait_flushed` waits."""
LATENCY_SAMPLES = 20_000
"""Ack latencies kept for the percentiles of :class:`~lance_async.WriterStats`."""
ENGINE_STATS_INTERVAL = 1.0
"""Seconds between two reads of the engine's ``stats()`` after puts at least
(:attr:`WriterStats.engine <lance_async.WriterStats>`): each read is a call
into the engine on the put's thread, and a routing writer makes several puts
per routed run."""


class Runs(Protocol):
    """Where a committer takes its runs from and gives their room back: an
    :class:`~lance_async.memwal.accumulator.Accumulator` (a writer's queue)
    or a :class:`~lance_async.memwal.handoff.Handoff` (a routed shard's)."""

    queue_rows: int
    queue_bytes: int
    last_put_seconds: float

    async def next_run(self) -> list[Entry] | None:
        """The next run for one engine call; None once closed and drained."""
        ...

    def release(self, rows: int, nbytes: int) -> None:
        """Give back the room of rows written or failed."""
        ...

    def put_took(self, seconds: float) -> None:
        """An engine put took ``seconds``."""
        ...

    def wake_senders(self) -> None:
        """Let senders waiting for room look again."""
        ...

    def close(self) -> None:
        """No more rows: drain, then end."""
        ...

    def end(self) -> list[Entry]:
        """The task ended; what is left to fail."""
        ...


class Committer:
    """Runs one shard writer's engine calls and settles their acks.

    Parameters
    ----------
    engine : lance.mem_wal.ShardWriter
        The engine writer (open).
    runs : Runs
        Where the runs come from and where room is given back.
    shard_id : str
        For the ack's put ids (unique across writers).
    fit, key_fit : TableFit
        Relabel checked batches to the table's schema before the engine sees them.
    on_failure : callable
        Called once when the writer fails (the writer marks itself FAILED).
    describe : callable
        The writer's repr, for messages.
    mirror : MemtableMirror, optional
        Sees every engine put and delete (the writer's LSM reads read it).
    reopen : callable, optional
        Opens the engine writer again (blocking); with ``max_memtable_age``,
        an old memtable is flushed by closing the engine writer and calling it.
    max_memtable_age : float, optional
        Seconds a memtable may hold rows before it is flushed (None: never by age).
    storage_options : mapping, optional
        The table's, to read the shard manifest's epoch after a reopen.
    uri : str
        The table's URI.
    storage_timeout : float
        Seconds each engine call may take (see the module notes).
    probe : callable, optional
        A quick blocking read of the store (one listing: the table's tags),
        made after a call timed out to tell a refusing store from a silent
        one.
    """

    def __init__(
        self,
        engine: Any,
        runs: Runs,
        *,
        shard_id: str,
        fit: TableFit,
        key_fit: TableFit,
        on_failure: Callable[[], None],
        describe: Callable[[], str],
        mirror: MemtableMirror | None = None,
        reopen: Callable[[], Any] | None = None,
        max_memtable_age: float | None = None,
        storage_options: Mapping[str, str] | None = None,
        uri: str = "",
        storage_timeout: float = DEFAULT_STORAGE_TIMEOUT,
        probe: Callable[[], object] | None = None,
    ) -> None:
        self.engine = engine
        self.mirror = mirror
        self._reopen = reopen
        self.max_memtable_age = max_memtable_age if reopen is not None else None
        self._storage_options = storage_options
        self._uri = uri
        self.dirty_since: float | None = None
        """When the current memtable first took rows (monotonic seconds), or None."""
        self.age_flushes = 0
        """Memtables flushed because they grew old."""
        self.age_scope = anyio.CancelScope()
        self.gate = anyio.Lock()
        self._runs = runs
        track_queue(shard_id, ds_uri=None, accumulator=runs)
        self._shard_id = shard_id
        self._fit = fit
        self._key_fit = key_fit
        self._on_failure = on_failure
        self._describe = describe
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.failure: LanceAsyncError | None = None
        self.storage_timeout = storage_timeout
        self._probe = probe
        self.abandoned_calls = 0
        """Engine calls abandoned at their deadline (each one's thread may still be stuck)."""
        self._abandoned: StorageTimeoutError | None = None
        self.engine_puts = 0
        self.engine_deletes = 0
        self.rows = 0
        self.failed_puts = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self.engine_stats: dict[str, Any] = {}
        """The engine's ``stats()``, read after a put at most every
        :data:`ENGINE_STATS_INTERVAL` seconds."""
        self._stats_read = -math.inf
        self.memtable_stats: dict[str, Any] = {}
        self._put_seq = 0

    # -- the task -------------------------------------------------------------
    async def run(self) -> None:
        """The writer task: runs until its runs are closed and drained
        (or :attr:`scope` is cancelled); then fails whatever is left."""
        try:
            with self.scope:
                while True:
                    run = await self._runs.next_run()
                    if run is None:
                        return
                    await self._execute(run)
        finally:
            error = self.failure or ClosedError(
                f"{self._describe()} closed before these rows were written"
            )
            for entry in self._runs.end():
                self.fail_item(entry, error)
            self.done.set()

    async def shutdown(self, timeout: float, failed: bool) -> None:
        """Drain the queue, stop the task, close the engine writer.

        Shielded from cancellation; the drain is bounded by ``timeout``
        seconds, after which the task is cancelled and what is left fails
        (the call in flight, if any, ends within its ``storage_timeout``).
        Closing the engine writer (which flushes its WAL) is bounded by
        ``storage_timeout``; it is skipped when an abandoned call still holds
        the engine writer.

        Raises
        ------
        LanceAsyncError
            Closing the engine failed (mapped; the writer is failed):
            :class:`StorageTimeoutError` when it did not return in time.
        """
        self.age_scope.cancel()

        def close_engine() -> None:
            try:
                self.engine.close()
            except (OSError, ValueError, RuntimeError) as exc:
                if failed or "already closed" in str(exc):
                    log.debug("lance_async: closing a failed writer: %s", exc)
                    return
                raise

        with anyio.CancelScope(shield=True):
            self._runs.close()  # the task drains the queue, then ends
            with anyio.move_on_after(timeout):
                await self.done.wait()
            if not self.done.is_set():
                log.warning("lance_async: %s did not drain within close_timeout", self._describe())
                self.scope.cancel()
                await self.done.wait()
            if self.abandoned_calls:
                log.warning(
                    "lance_async: %s is not closed: an abandoned engine call still holds it",
                    self._describe(),
                )
                return
            try:
                async with self.gate:  # an age flush in progress finishes first
                    await run_sync(
                        close_engine,
                        timeout=self.storage_timeout,
                        what=f"closing {self._describe()}",
                        on_cancel_result=self._noted,
                    )
            except StorageTimeoutError as exc:
                self._noted(None, exc)
                if failed:  # its acks failed already; closing it was a courtesy
                    return
                raise self.fail_writer(exc) from None
            except (OSError, ValueError, RuntimeError) as exc:
                mapped = map_engine_error(exc)
                if mapped is None or isinstance(mapped, FencedError):
                    raise self.fail_writer(exc) from exc
                raise mapped from exc

    def _noted(self, result: object, error: BaseException | None) -> None:
        """Count an engine call abandoned at its deadline (``run_sync``'s
        ``on_cancel_result``, and after a timeout)."""
        if isinstance(error, StorageTimeoutError):
            self.abandoned_calls += 1
            self._abandoned = error

    async def _diagnose(self, timeout: StorageTimeoutError) -> LanceAsyncError:
        """After a timed-out call: the error a quick read of the store gets,
        when it is a refusal the engine kept retrying (a 403, a bucket
        gone), else ``timeout`` itself."""
        if self._probe is None:
            return timeout
        try:
            await run_sync(
                self._probe,
                timeout=probe_timeout(self.storage_timeout),
                what=f"a probe of the store of {self._describe()}",
            )
        except (OSError, ValueError, RuntimeError) as exc:
            mapped = map_engine_error(exc)
            if isinstance(mapped, StorageError) and not isinstance(mapped, StorageTimeoutError):
                found = copy.copy(mapped)
                found.args = (f"{timeout}; the store answers: {mapped}",)
                found.__cause__ = exc
                return found
        except StorageTimeoutError:
            pass
        return timeout

    # -- settling ---------------------------------------------------------------
    def fail_item(self, item: Entry, error: BaseException) -> None:
        """Free an entry's room and fail its ack part."""
        if item.kind is not Kind.FLUSH:
            self._runs.release(item.rows, item.nbytes)
        item.batch = None
        item.ack.part_failed(error)

    def _settle(self, run: list[Entry], put_id: int) -> None:
        """The run's rows are written: free their room once, resolve their acks."""
        now = time.monotonic()
        rows = nbytes = 0
        put = (self._shard_id, put_id)  # unique across writers, for Ack.combine
        latency = self.latencies.append
        for item in run:
            if item.__class__ is BatchAck:  # a one-batch send: its ack is the entry
                assert isinstance(item, BatchAck)
                rows += item.rows
                nbytes += item.nbytes
                latency(now - item.created)
                item.written(put, now)
                continue
            assert isinstance(item, Item)
            if item.kind is Kind.FLUSH:
                item.ack.part_done()
                continue
            rows += item.rows
            nbytes += item.nbytes
            latency(now - item.queued_at)
            batch = item.batch
            item.batch = None
            if item.kind is Kind.PUT:
                n = len(batch) if isinstance(batch, list) else 1
                item.ack.part_done(rows=item.rows, batches=n, put_id=put)
            else:
                item.ack.part_done(deletes=item.rows, put_id=put)
        if rows or nbytes:
            self._runs.release(rows, nbytes)
        record_settled(self._shard_id, run, now)

    def fail_writer(self, exc: BaseException) -> LanceAsyncError:
        """Mark the writer failed (once); returns the error every ack gets:
        a :class:`FencedError` for a real fence, the :class:`StorageError`
        for a store that failed it, else a :class:`WriterFailedError`."""
        if self.failure is None:
            failure: LanceAsyncError
            mapped = map_engine_error(exc)
            if isinstance(mapped, FencedError):
                failure = FencedError(
                    f"{self._describe()} was fenced: another writer claimed shard "
                    f"{self._shard_id} (a newer writer epoch). Rows acknowledged before the "
                    "fence are safe (the new owner replayed the WAL); nothing is written or "
                    "acknowledged after it. Close this writer and leave the shard to its owner",
                    shard_id=self._shard_id,
                )
            elif isinstance(mapped, StorageError):
                failure = copy.copy(mapped)
                failure.args = (
                    f"{self._describe()} failed and cannot write any more: {mapped}. Rows "
                    "acknowledged before are safe in the WAL: close it and open a new writer "
                    "on the shard once the store is back",
                )
            else:
                failure = WriterFailedError(
                    f"{self._describe()} failed and cannot write any more: {exc}. Close it and "
                    "open a new writer on the same shard; acknowledged rows are replayed from "
                    "the WAL"
                )
            failure.__cause__ = exc if mapped is not exc else exc.__cause__
            self.failure = failure
            self._on_failure()
            self._runs.wake_senders()
        return self.failure

    async def check_fenced(self) -> None:
        """Fail the writer with :class:`FencedError` if the shard manifest records
        a newer writer epoch than this writer's (one manifest read; a fenced
        writer the engine has not told yet, because nothing was put since)."""
        if self.mirror is None or not self.mirror.epoch or self._uri is None:
            return
        epoch = await run_sync(
            partial(claimed_epoch, self._uri, self._shard_id, self._storage_options),
            timeout=self.storage_timeout,
            what=f"reading the epoch of {self._describe()}",
        )
        if epoch > self.mirror.epoch:
            raise self.fail_writer(FencedError(f"epoch {self.mirror.epoch} < stored epoch {epoch}"))

    async def wait_flushed(self, timeout: float) -> None:
        """Wait until no sealed memtable waits to be written (polling the
        engine's ``memtable_stats()``; see ``AsyncShardWriter.wait_flushed``).

        Raises
        ------
        LanceAsyncError
            Still sealed after ``timeout`` seconds.
        FencedError, WriterFailedError
            The writer was fenced or failed: at once.
        """
        checked: float | None = None
        with anyio.move_on_after(timeout):
            while True:  # the engine offers no event: poll its stats
                if self.failure is not None:
                    raise self.failure  # failed or fenced: it will never flush
                try:
                    async with self.gate:
                        stats = await run_sync(self.engine.memtable_stats)
                except (OSError, ValueError, RuntimeError) as exc:
                    raise self.fail_writer(exc) from exc
                if not stats.get("frozen_count"):
                    return
                now = anyio.current_time()
                if checked is None or now - checked >= FENCE_CHECK_INTERVAL:
                    # a fenced writer's sealed memtable never flushes, and the
                    # engine says so only at the next put: ask the manifest
                    checked = now
                    await self.check_fenced()
                await anyio.sleep(0.005)
        raise LanceAsyncError(
            f"{self._describe()}: a sealed memtable was not flushed in {timeout} s"
        )

    # -- engine calls ---------------------------------------------------------------
    async def _engine_call(self, kind: Kind, batches: list[pa.RecordBatch]) -> None:
        fit = self._fit if kind is Kind.PUT else self._key_fit
        mirror = self.mirror
        now = time.monotonic()
        read_stats = now - self._stats_read >= ENGINE_STATS_INTERVAL
        if read_stats:
            self._stats_read = now

        def work(engine: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
            data = (
                fit.relabel(batches) if kind is Kind.PUT else fit.relabel(batches).combine_chunks()
            )
            if mirror is not None:  # the mirror makes the engine call and records it
                memtable = (mirror.put if kind is Kind.PUT else mirror.delete)(engine, data)
            else:
                if kind is Kind.PUT:
                    engine.put(data)
                else:
                    engine.delete(data)
                memtable = engine.memtable_stats()
            # stats() keeps the GIL; memtable_stats() gives it up (see mirror._before)
            return (engine.stats() if read_stats else None), memtable

        async with self.gate:  # the engine writer is read inside: an age flush may replace it
            engine_stats, self.memtable_stats = await run_sync(
                partial(work, self.engine),
                timeout=self.storage_timeout,
                what=f"the {kind.name.lower()} of {self._describe()}",
                on_cancel_result=self._noted,
            )
            if engine_stats is not None:
                self.engine_stats = engine_stats
            self._note_memtable()

    def _note_memtable(self) -> None:
        """Track how long the memtable has held rows (after each engine call)."""
        if not self.memtable_stats.get("row_count"):
            self.dirty_since = None
        elif self.dirty_since is None:
            self.dirty_since = time.monotonic()

    async def run_age_flush(self) -> None:
        """The writer's second task: flush a memtable older than ``max_memtable_age``.

        Sleeps until the memtable could be due, then, holding the gate (no
        put runs meanwhile), closes the engine writer -- which flushes the
        memtable to a generation -- and opens it again. Runs until cancelled
        (the writer's close cancels it). A failure fails the writer, as a
        failed put does.
        """
        age = self.max_memtable_age
        if age is None or self._reopen is None:
            return
        with self.age_scope:
            await self._age_loop(age)

    async def _age_loop(self, age: float) -> None:
        while self.failure is None:
            since = self.dirty_since
            wait = age if since is None else max(0.0, since + age - time.monotonic())
            await anyio.sleep(max(wait, 0.01))
            since = self.dirty_since
            if since is None or time.monotonic() - since < age or self.failure is not None:
                continue
            async with self.gate:
                if self.dirty_since is None or self.failure is not None:
                    continue
                try:
                    await self._flush_by_age()
                except anyio.get_cancelled_exc_class():
                    raise
                except BaseException as exc:
                    self.fail_writer(exc)
                    return

    async def _flush_by_age(self) -> None:
        """Close and reopen the engine writer (the caller holds the gate)."""
        engine, reopen = self.engine, self._reopen
        assert reopen is not None
        uri, shard_id, options = self._uri, self._shard_id, self._storage_options

        def work() -> tuple[Any, int, dict[str, Any]]:
            engine.close()
            fresh = reopen()
            return fresh, claimed_epoch(uri, shard_id, options), fresh.memtable_stats()

        with anyio.CancelScope(shield=True):  # the old engine is closed: keep the new one
            fresh, epoch, stats = await run_sync(
                work,
                timeout=self.storage_timeout,
                what=f"flushing the memtable of {self._describe()}",
                on_cancel_result=self._noted,
            )
        self.engine = fresh
        self.memtable_stats = stats
        self.dirty_since = None
        self.age_flushes += 1
        if self.mirror is not None:
            self.mirror.reopened(epoch)
        log.debug("lance_async: shard %s memtable flushed by age", self._shard_id)

    async def _execute(self, run: list[Entry]) -> None:
        kind = run[0].kind
        if self.failure is not None:  # a flush too: what came before it failed
            for item in run:
                self.fail_item(item, self.failure)
            return
        if kind is Kind.FLUSH:
            self._settle(run, 0)
            return
        outcome = await self._try_engine(kind, run)
        if outcome is None:
            return
        # The engine rejected the input. Retry one by one so only bad items
        # fail (a routed part: send by send), in place, so the shard's order holds.
        pieces = [
            piece for item in run for piece in (item.split() if isinstance(item, Item) else [item])
        ]
        if len(pieces) == 1:
            self.fail_item(pieces[0], outcome)
            return
        for piece in pieces:
            single = await self._try_engine(kind, [piece])
            if single is not None:
                self.fail_item(piece, single)

    async def _try_engine(self, kind: Kind, run: list[Entry]) -> BaseException | None:
        """One engine call; resolve acks on success. Returns an input error to
        retry item by item, or None when the run is settled."""
        batches: list[pa.RecordBatch] = []
        for item in run:
            batch = item.batch
            if isinstance(batch, list):
                batches.extend(batch)
            elif batch is not None:
                batches.append(batch)
        started = time.monotonic()
        self._abandoned = None  # set by _noted if this call is abandoned while cancelled
        try:
            await self._engine_call(kind, batches)
        except anyio.get_cancelled_exc_class():
            # run_sync let the engine call finish (or abandoned it at its
            # deadline); its outcome is unknown to us. Treat the rows as not written.
            stuck, self._abandoned = self._abandoned, None
            error = (
                may_still_land(self.fail_writer(stuck))
                if stuck is not None
                else ClosedError("the writer task was cancelled")
            )
            for item in run:
                self.fail_item(item, error)
            raise
        except BaseException as exc:
            abandoned = isinstance(exc, StorageTimeoutError)  # run_sync's: left running
            if isinstance(exc, StorageTimeoutError):
                self._noted(None, exc)
                exc = await self._diagnose(exc)
            mapped = map_engine_error(exc)
            if isinstance(mapped, InvalidInputError):
                self.failed_puts += 1
                mapped.__cause__ = exc
                return mapped
            failure = self.fail_writer(exc)
            if abandoned:  # this run's rows, not those queued behind it
                failure = may_still_land(failure)
            for item in run:
                self.fail_item(item, failure)
            return None
        self._put_seq += 1
        memory_freed()  # the put's batches and the engine's working memory went (rate-limited)
        if self._uri and self._put_seq % CHECKPOINT_ENTRIES == 0:  # readers' first reads
            follow_tail(self._uri, self._shard_id, self._fit.schema, self._storage_options)
        if kind is Kind.PUT:
            self._runs.put_took(time.monotonic() - started)
            self.engine_puts += 1
            self.rows += sum(item.rows for item in run)
        else:
            self.engine_deletes += 1
        self._settle(run, self._put_seq)
        return None
