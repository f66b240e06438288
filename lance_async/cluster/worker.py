"""``Worker``: one of N processes ingesting one partitioned feed into one table.

Each worker owns the partitions its broker gives it -- a Kafka consumer
group's assignment, or its share of the leases held in NATS or Redis
(``balancer.py``) -- and, since the feed is partitioned like the table
(``partitions.py``), the shards they feed. For each partition it owns it runs
one shard writer (opening it claims the shard: any stale writer is fenced)
and one :func:`~lance_async.feeds.ingest` loop that acknowledges each message
only after its rows are durable, and only while it still owns the partition.

Hand-over (``docs/sharding.md``): a partition given back is drained first --
no more fetches, the acks in flight settled and sent, the writer closed
(flushing its memtable) -- and only then released. A partition found lost
(its lease expired and was taken, or the shard was fenced) is stopped at
once, acknowledging nothing more.

A partition's work ends the partition, never the worker: whatever its
ingest loop ends with -- a fence (one :class:`~lance_async.FencedError`, or
an exception group of them when the sender and the acker both saw it), a
failure, or an unexpected return -- the partition is given up at once
(``Coordinator.drop``) and the worker goes on with the others; a failed
partition may be taken again after a back-off that doubles with each
failure in a row. The worker ends with an error only when it can do
nothing: ``max_failures`` partition failures in a row with no message
acknowledged in between (the last failure is raised, after every other
partition was handed back).

A message whose rows do not all belong to its partition (a producer that did
not partition by the table's buckets) is never written to the wrong shard:
it goes to the dead-letter hook (default: logged and counted), then is
acknowledged.

A message with the header ``lance-op: delete`` (:data:`DELETE`) deletes its
rows by key instead of writing them, in feed order with the puts
(``messages.py``).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pyarrow as pa
from anyio.abc import TaskGroup

from .._loop import unwrap_groups
from .._retry import exponential
from ..errors import ConflictError, FencedError, InvalidInputError, LanceAsyncError
from ..feeds.base import DeadLetter, Feed, IngestStats, Message, ingest
from ..memwal.compactor import CompactionPolicy, Compactor
from ..memwal.writer import AsyncShardWriter
from .balancer import Coordinator, LeaseCoordinator
from .feeds import PartitionedFeed
from .leases import LeaseTable
from .messages import DELETE, PartitionWriter, partition_decoder
from .partitions import Partitioner

if sys.version_info < (3, 11):  # pragma: no cover - anyio brings the backport
    from exceptiongroup import BaseExceptionGroup

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = ["DELETE", "Worker", "WorkerStats", "partition_outcome"]

#: Seconds before a failed partition is taken again, doubled per failure in a
#: row (the first retry is at once), up to :data:`MAX_BACKOFF`.
BACKOFF = 0.5
MAX_BACKOFF = 30.0


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``, exception groups flattened (nested too)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def held_elsewhere(exc: BaseException) -> bool:
    """Whether opening a partition's shard writer failed because another
    process holds or claims the shard (a fence, or a claim that lost the race):
    the group has not finished moving the partition, which is no failure of
    this worker's."""
    return isinstance(exc, FencedError) or (isinstance(exc, ConflictError) and exc.retryable)


def partition_outcome(exc: BaseException) -> str | None:
    """How a partition's ingest ended, from what it raised.

    ``"fenced"``: every error in it (an exception group flattened) is a
    :class:`~lance_async.FencedError`; ``"failed"``: every error is an
    ``Exception``; ``None``: something else (a cancellation from outside,
    ``KeyboardInterrupt``), which must propagate.
    """
    leaves = _leaves(exc)
    if all(isinstance(e, FencedError) for e in leaves):
        return "fenced"
    if all(isinstance(e, Exception) for e in leaves):
        return "failed"
    return None


log = logging.getLogger("lance_async.cluster")


@dataclass
class WorkerStats:
    """What a :class:`Worker` has done so far.

    Attributes
    ----------
    member : str
    partitions : list of int
        Partitions owned now.
    owned_messages : dict of str to int
        Messages acknowledged per partition owned now (the partition number
        as a string key, so the stats serialize as JSON), since this worker
        took it.
    messages, rows : int
        Messages acknowledged and rows written (durable) since the start.
    dead_letters : int
        Messages refused (undecodable, or rows of another partition).
    assigned, revoked, lost : int
        Partitions taken, handed back, and lost (fenced or lease expired).
    seconds : float
        Since the worker started.
    """

    member: str
    partitions: list[int] = field(default_factory=list)
    owned_messages: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    rows: int = 0
    dead_letters: int = 0
    assigned: int = 0
    revoked: int = 0
    lost: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        """Throughput since the start."""
        return self.rows / self.seconds if self.seconds else 0.0


class _LeaseExpired(FencedError):
    """This worker's lease on a partition may have expired (it could not renew
    it in time): it acknowledges nothing more. Unlike an engine fence, no
    one is known to have the shard: the partition may be taken back at once."""


class _LeaseGuard:
    """A partition's feed that fetches and acknowledges only while the lease
    is valid, and whose fetch in progress ends at once when the partition is
    handed back (what it would have returned is delivered again to the next
    owner: nothing of it was acknowledged).

    A lease past its margin (the worker was paused, say) is first given a
    chance with ``revalidate`` (the coordinator's, when it has one: a lease
    renewed and found still this worker's keeps the partition going with
    the same writer and feed); only then is the partition given up."""

    def __init__(
        self,
        feed: Feed,
        valid: Callable[[], bool],
        partition: int,
        shard: str,
        stop: anyio.Event | None = None,
        revalidate: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._feed = feed
        self._valid = valid
        self._revalidate = revalidate
        self._partition = partition
        self._shard = shard
        self._stop = stop
        self._fetching: anyio.CancelScope | None = None
        self._batch_ack = getattr(feed, "ack_batch", None)

    def interrupt(self) -> None:
        """End a fetch in progress now (it returns no message)."""
        if self._fetching is not None:
            self._fetching.cancel()

    async def _check(self) -> None:
        if self._valid():
            return
        # past the lease's margin (a pause, say): go on if a renewal finds it
        # still ours, with the same writer and feed
        if self._revalidate is None or not await self._revalidate():
            raise _LeaseExpired(
                f"partition {self._partition} may have a new owner (this worker's lease on it "
                "expired or was lost): nothing more is acknowledged",
                shard_id=self._shard,
            )

    @property
    def exhausted(self) -> bool:
        return bool(self._feed.exhausted)

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        await self._check()
        if self._stop is not None and self._stop.is_set():
            return []
        with anyio.CancelScope() as scope:
            self._fetching = scope
            try:
                return await self._feed.fetch(max_messages, timeout)
            finally:
                self._fetching = None
        return []  # interrupted: handed back

    async def ack_batch(self, messages: Sequence[Message]) -> None:
        await self._check()
        if self._batch_ack is not None:
            await self._batch_ack(messages)
        else:
            for m in messages:
                await m.ack()

    async def aclose(self) -> None:
        await self._feed.aclose()


@dataclass
class _Running:
    feed: Feed
    writer: AsyncShardWriter
    stop: anyio.Event
    done: anyio.Event
    scope: anyio.CancelScope
    stats: IngestStats = field(default_factory=IngestStats)
    guard: _LeaseGuard | None = None


class Worker:
    """Ingest a partitioned feed into a MemWAL table, owning the partitions it is given.

    Use it as ``async with Worker(...) as worker: await worker.run()`` (or
    :meth:`run` alone); :meth:`stop` (a SIGTERM handler, say) ends it
    cleanly: every partition is drained and released.

    Parameters
    ----------
    dataset : AsyncDataset
        A table whose MemWAL is bucket-sharded with as many buckets as the
        feed has partitions.
    feeds : PartitionedFeed, optional
        The partitions (``feeds.py``), divided with ``leases``.
    leases : LeaseTable, optional
        The group's leases (``leases.py``); its ``member`` names this worker.
    coordinator : Coordinator, optional
        Instead of ``feeds`` and ``leases``: who owns which partition and
        their feeds (``KafkaCoordinator`` for a Kafka consumer group).
    writer_options : mapping, optional
        Passed to every :class:`~lance_async.AsyncShardWriter`.
    max_batch, fetch_timeout, max_pending_acks : optional
        Passed to :func:`~lance_async.feeds.ingest`.
    dead_letter : callable, optional
        ``(message, error)`` for a message that cannot be written (bad JSON,
        rows of another partition); default: logged at WARNING and counted.
    drain_timeout : float
        Seconds a partition handed back may take to settle its acks before
        it is cancelled (default 10; unacknowledged messages are delivered
        again to the next owner).
    compaction : CompactionPolicy, optional
        Compact the shards this worker owns in the background by this
        policy (a :class:`~lance_async.memwal.Compactor` asked for the owned
        shards at every pass). Default None: no compaction here (run
        ``lance-async compact`` or a Compactor elsewhere); ``lance-async
        worker`` passes ``CompactionPolicy()``.
    max_failures : int
        Partition failures in a row, with no message acknowledged by any
        partition in between, after which the worker gives up (default 10;
        fences and lost leases are hand-overs, not failures, and so is a
        start refused because another writer still holds or claims the
        shard: the partition is taken again later).

    Raises
    ------
    InvalidInputError
        On :meth:`run`: the table is not bucket-sharded (or unsharded), or
        its buckets differ from the feed's partitions.
    Exception
        On :meth:`run`: the last partition failure, once ``max_failures``
        came in a row (every partition is handed back first).
    """

    def __init__(
        self,
        dataset: AsyncDataset,
        feeds: PartitionedFeed | None = None,
        leases: LeaseTable | None = None,
        *,
        coordinator: Coordinator | None = None,
        writer_options: dict[str, Any] | None = None,
        max_batch: int = 1000,
        fetch_timeout: float = 0.5,
        max_pending_acks: int = 16,
        dead_letter: DeadLetter | None = None,
        drain_timeout: float = 10.0,
        compaction: CompactionPolicy | None = None,
        max_failures: int = 10,
    ) -> None:
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        if coordinator is None:
            if feeds is None or leases is None:
                raise TypeError("a Worker needs feeds and leases, or a coordinator")
            coordinator = LeaseCoordinator(feeds, leases)
        self._dataset = dataset
        self._coordinator = coordinator
        self._writer_options = dict(writer_options or {})
        self._ingest_options = {
            "max_batch": max_batch,
            "fetch_timeout": fetch_timeout,
            "max_pending_acks": max_pending_acks,
        }
        self._dead_letter = dead_letter
        self.drain_timeout = drain_timeout
        self._compaction = compaction
        self._running: dict[int, _Running] = {}
        self._leaving: dict[int, _Running] = {}
        self._partitioner: Partitioner | None = None
        self._tg: TaskGroup | None = None
        self._started = time.monotonic()
        self._stats = WorkerStats(member=coordinator.member)
        self.max_failures = max_failures
        self._failures = 0  # partition failures in a row, no ack in between
        self._partition_failures: dict[int, int] = {}
        self._fatal: BaseException | None = None

    def __repr__(self) -> str:
        return f"<Worker {self.member} partitions={sorted(self._running)}>"

    # -- public -----------------------------------------------------------------------
    @property
    def member(self) -> str:
        """This worker's name in its group."""
        return self._coordinator.member

    def stats(self) -> WorkerStats:
        """A snapshot of what the worker has done (does not block)."""
        s = self._stats
        finished_messages = s.messages
        finished_rows = s.rows
        for running in (*self._running.values(), *self._leaving.values()):
            finished_messages += running.stats.messages
            finished_rows += running.stats.rows
        return WorkerStats(
            member=s.member,
            partitions=sorted(self._running),
            owned_messages={str(p): r.stats.messages for p, r in sorted(self._running.items())},
            messages=finished_messages,
            rows=finished_rows,
            dead_letters=s.dead_letters,
            assigned=s.assigned,
            revoked=s.revoked,
            lost=s.lost,
            seconds=time.monotonic() - self._started,
        )

    def stop(self) -> None:
        """Stop cleanly: hand every partition back (drained), then return from :meth:`run`.

        Fetching ends at once on every partition (a fetch in progress is
        interrupted), so nothing read after the stop is acknowledged here:
        the next owners read it. Does not block.
        """
        for running in self._running.values():
            running.stop.set()
            if running.guard is not None:
                running.guard.interrupt()
        self._coordinator.stop()

    async def __aenter__(self) -> Worker:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop()

    async def run(self) -> WorkerStats:
        """Own partitions and ingest them until :meth:`stop` or cancellation.

        Returns the final :class:`WorkerStats` (after every partition was
        drained and released).
        """
        partitioner = await Partitioner.for_dataset(self._dataset)
        partitions = self._coordinator.num_partitions
        if partitioner.num_partitions != partitions:
            raise InvalidInputError(
                f"the feed has {partitions} partitions and the table "
                f"{partitioner.num_partitions} buckets: a feed must be partitioned like the "
                "table (see docs/sharding.md)"
            )
        self._partitioner = partitioner
        with unwrap_groups():
            async with anyio.create_task_group() as tg:
                self._tg = tg
                compactor = None
                if self._compaction is not None:
                    compactor = Compactor(self._dataset, self._compaction, shard_ids=self._owned)
                    await compactor.start(tg)
                try:
                    await self._coordinator.run(self._assign, self._revoke)
                finally:
                    if compactor is not None:
                        await compactor.aclose()
                tg.cancel_scope.cancel()  # nothing of ours is left running
        if self._fatal is not None:
            raise self._fatal
        return self.stats()

    def _owned(self) -> list[str]:
        """The shards of the partitions owned now (the compactor's shards)."""
        return [r.writer.shard_id for r in self._running.values()]

    # -- partitions ---------------------------------------------------------------------
    def _decoder(self, partition: int) -> Callable[[Sequence[Message], pa.Schema], pa.Table]:
        assert self._partitioner is not None
        return partition_decoder(self._partitioner, self._dataset.primary_key, partition)

    async def _dead(self, message: Message, error: BaseException) -> None:
        self._stats.dead_letters += 1
        if self._dead_letter is not None:
            result = self._dead_letter(message, error)
            if result is not None:
                await result
            return
        log.warning(
            "lance_async worker %s: message %r refused: %s",
            self.member,
            message.offset,
            error,
            extra=self._fields(offset=message.offset),
        )

    async def _assign(self, partition: int) -> None:
        assert self._partitioner is not None and self._tg is not None
        shard = self._partitioner.shard_of(partition)
        began = time.monotonic()
        writer = self._dataset.mem_wal_writer(shard, **self._writer_options)
        try:
            await writer.open(self._tg)  # claims the shard: a stale writer is fenced
            try:
                feed = await self._coordinator.open_partition(partition)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await writer.aclose()
                raise
        except Exception as exc:
            if held_elsewhere(exc):  # not counted: the partition is still moving
                log.warning(
                    "lance_async worker %s: partition %d: its shard is held by another "
                    "writer (%s); taken again later",
                    self.member,
                    partition,
                    exc,
                    extra=self._fields(partition),
                )
            else:
                self._failed(partition, exc, "starting")
            raise
        running = _Running(feed, writer, anyio.Event(), anyio.Event(), anyio.CancelScope())
        self._running[partition] = running
        self._stats.assigned += 1
        self._tg.start_soon(self._ingest, partition, running)
        log.info(
            "lance_async worker %s: took partition %d (shard %s) in %.2f s",
            self.member,
            partition,
            shard,
            time.monotonic() - began,
            extra=self._fields(partition),
        )

    async def _ingest(self, partition: int, running: _Running) -> None:
        coordinator = self._coordinator
        revalidate = getattr(coordinator, "revalidate", None)  # LeaseCoordinator's
        guarded = running.guard = _LeaseGuard(
            running.feed,
            lambda: coordinator.valid(partition),
            partition,
            running.writer.shard_id,
            running.stop,
            revalidate=partial(revalidate, partition) if revalidate is not None else None,
        )
        outcome, error = "ended", None
        try:
            with running.scope:
                await ingest(
                    guarded,
                    PartitionWriter(running.writer, self._dataset.primary_key),
                    decode=self._decoder(partition),
                    dead_letter=self._dead,
                    stop=running.stop,
                    on_progress=partial(self._progress, running, partition),
                    **self._ingest_options,  # type: ignore[arg-type]
                )
        except BaseException as exc:
            found = partition_outcome(exc)
            if found is None:
                raise  # cancelled from outside: the worker is going away
            outcome, error = found, exc
        finally:
            running.done.set()
        if self._running.get(partition) is not running or running.stop.is_set():
            return  # revoked, or being handed back: the balancer does the rest
        # it ended by itself: give the partition up at once, the worker goes on
        if (
            outcome == "fenced"
            and error is not None
            and all(isinstance(e, _LeaseExpired) for e in _leaves(error))
        ):
            log.warning(
                "lance_async worker %s: partition %d: %s",
                self.member,
                partition,
                error,
                extra=self._fields(partition),
            )
            coordinator.drop(partition)  # taken back at once if no one else has it
            return
        if outcome == "fenced":
            log.warning(
                "lance_async worker %s: partition %d fenced: %s",
                self.member,
                partition,
                error,
                extra=self._fields(partition),
            )
            coordinator.drop(partition, fenced=True)
            return
        if error is None:
            error = RuntimeError(f"the ingest of partition {partition} returned by itself")
        retry_after = self._failed(partition, error, "running")
        coordinator.drop(partition, retry_after=retry_after)

    def _failed(self, partition: int, error: BaseException, doing: str) -> float:
        """Count a partition failure; give up after ``max_failures`` in a
        row. Returns the back-off before the partition is taken again."""
        self._failures += 1
        count = self._partition_failures.get(partition, 0) + 1
        self._partition_failures[partition] = count
        log.error(
            "lance_async worker %s: partition %d failed while %s (%d in a row): %r",
            self.member,
            partition,
            doing,
            self._failures,
            error,
            extra=self._fields(partition),
        )
        if self._failures >= self.max_failures and self._fatal is None:
            log.error(
                "lance_async worker %s: %d partition failures in a row and no message "
                "acknowledged in between: giving up",
                self.member,
                self._failures,
                extra=self._fields(),
            )
            self._fatal = error
            self.stop()
        return exponential(count - 1, BACKOFF, MAX_BACKOFF)  # the first restart at once

    def _progress(self, running: _Running, partition: int, stats: IngestStats) -> None:
        running.stats = stats
        self._failures = 0
        self._partition_failures.pop(partition, None)

    async def _revoke(self, partition: int, lost: bool) -> None:
        running = self._running.pop(partition, None)
        if running is None:
            return
        self._leaving[partition] = running  # its figures still count while it drains
        began = time.monotonic()
        with anyio.CancelScope(shield=True):
            if lost:
                running.scope.cancel()  # acks are refused already: stop at once
            else:
                running.stop.set()  # drain: settle and acknowledge what is in flight
                if running.guard is not None:
                    running.guard.interrupt()  # no waiting out a fetch
            with anyio.move_on_after(self.drain_timeout):
                await running.done.wait()
            if not running.done.is_set():
                running.scope.cancel()
                await running.done.wait()
            self._stats.messages += running.stats.messages
            self._stats.rows += running.stats.rows
            del self._leaving[partition]
            if lost:
                self._stats.lost += 1
            else:
                self._stats.revoked += 1
            try:
                await running.feed.aclose()
            except Exception as exc:  # a broken connection: the lease is what matters
                log.debug(
                    "lance_async worker: closing partition %d's feed: %r",
                    partition,
                    exc,
                    extra=self._fields(partition),
                )
            try:
                await running.writer.aclose()
            except LanceAsyncError as exc:  # fenced: a new owner has the shard
                log.info(
                    "lance_async worker: closing partition %d's writer: %s",
                    partition,
                    exc,
                    extra=self._fields(partition),
                )
        log.info(
            "lance_async worker %s: %s partition %d (stopped in %.2f s)",
            self.member,
            "lost" if lost else "handed back",
            partition,
            time.monotonic() - began,
            extra=self._fields(partition),
        )

    def _fields(self, partition: int | None = None, **more: object) -> dict[str, object]:
        """The structured fields of a log record (``extra=``): table, member,
        partition and its shard."""
        fields: dict[str, object] = {"table": self._dataset.uri, "member": self.member}
        if partition is not None:
            fields["partition"] = partition
            if self._partitioner is not None:
                fields["shard"] = self._partitioner.shard_of(partition)
        fields.update(more)
        return fields
