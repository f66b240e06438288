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

A message whose rows do not all belong to its partition (a producer that did
not partition by the table's buckets) is never written to the wrong shard:
it goes to the dead-letter hook (default: logged and counted), then is
acknowledged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pyarrow as pa
import pyarrow.compute as pc
from anyio.abc import TaskGroup

from .._loop import unwrap_groups
from ..errors import DecodeError, FencedError, InvalidInputError, LanceAsyncError
from ..feeds._common import broker_errors
from ..feeds.base import DeadLetter, Feed, IngestStats, Message, decode_json, ingest
from ..memwal.compactor import CompactionPolicy, Compactor
from ..memwal.writer import AsyncShardWriter
from .balancer import Coordinator, LeaseCoordinator
from .feeds import PartitionedFeed
from .leases import LeaseTable
from .partitions import Partitioner

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = ["Worker", "WorkerStats"]

#: What a partition's ingest may fail with without taking the worker down.
PARTITION_FAILURES: tuple[type[BaseException], ...] = (LanceAsyncError, *broker_errors())

log = logging.getLogger("lance_async.cluster")


@dataclass
class WorkerStats:
    """What a :class:`Worker` has done so far.

    Attributes
    ----------
    member : str
    partitions : list of int
        Partitions owned now.
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


class _LeaseGuard:
    """A partition's feed that fetches and acknowledges only while the lease is valid."""

    def __init__(self, feed: Feed, valid: Callable[[], bool], partition: int, shard: str) -> None:
        self._feed = feed
        self._valid = valid
        self._partition = partition
        self._shard = shard
        self._batch_ack = getattr(feed, "ack_batch", None)

    def _check(self) -> None:
        if not self._valid():
            raise FencedError(
                f"partition {self._partition} may have a new owner (this worker's lease on it "
                "expired or was lost): nothing more is acknowledged",
                shard_id=self._shard,
            )

    @property
    def exhausted(self) -> bool:
        return bool(self._feed.exhausted)

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        self._check()
        return await self._feed.fetch(max_messages, timeout)

    async def ack_batch(self, messages: Sequence[Message]) -> None:
        self._check()
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

    Raises
    ------
    InvalidInputError
        On :meth:`run`: the table is not bucket-sharded (or unsharded), or
        its buckets differ from the feed's partitions.
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
    ) -> None:
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
            messages=finished_messages,
            rows=finished_rows,
            dead_letters=s.dead_letters,
            assigned=s.assigned,
            revoked=s.revoked,
            lost=s.lost,
            seconds=time.monotonic() - self._started,
        )

    def stop(self) -> None:
        """Stop cleanly: hand every partition back (drained), then return from :meth:`run`."""
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
        return self.stats()

    def _owned(self) -> list[str]:
        """The shards of the partitions owned now (the compactor's shards)."""
        return [r.writer.shard_id for r in self._running.values()]

    # -- partitions ---------------------------------------------------------------------
    def _decoder(self, partition: int) -> Callable[[Sequence[Message], pa.Schema], pa.Table]:
        partitioner = self._partitioner
        assert partitioner is not None

        def decode(messages: Sequence[Message], schema: pa.Schema) -> pa.Table:
            table = decode_json(messages, schema)
            if table.num_rows:
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
            return table

        return decode

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
        writer = self._dataset.mem_wal_writer(shard, **self._writer_options)
        await writer.open(self._tg)  # claims the shard: a stale writer is fenced
        try:
            feed = await self._coordinator.open_partition(partition)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await writer.aclose()
            raise
        running = _Running(feed, writer, anyio.Event(), anyio.Event(), anyio.CancelScope())
        self._running[partition] = running
        self._stats.assigned += 1
        self._tg.start_soon(self._ingest, partition, running)
        log.info(
            "lance_async worker %s: took partition %d (shard %s)",
            self.member,
            partition,
            shard,
            extra=self._fields(partition),
        )

    async def _ingest(self, partition: int, running: _Running) -> None:
        coordinator = self._coordinator
        guarded = _LeaseGuard(
            running.feed, lambda: coordinator.valid(partition), partition, running.writer.shard_id
        )
        try:
            with running.scope:
                await ingest(
                    guarded,
                    running.writer,
                    decode=self._decoder(partition),
                    dead_letter=self._dead,
                    stop=running.stop,
                    on_progress=partial(self._progress, running),
                    **self._ingest_options,  # type: ignore[arg-type]
                )
        except FencedError as exc:
            log.warning(
                "lance_async worker %s: partition %d fenced: %s",
                self.member,
                partition,
                exc,
                extra=self._fields(partition),
            )
            coordinator.drop(partition)
        except PARTITION_FAILURES as exc:
            log.error(
                "lance_async worker %s: partition %d failed: %r",
                self.member,
                partition,
                exc,
                extra=self._fields(partition),
            )
            coordinator.drop(partition)
        finally:
            running.done.set()

    @staticmethod
    def _progress(running: _Running, stats: IngestStats) -> None:
        running.stats = stats

    async def _revoke(self, partition: int, lost: bool) -> None:
        running = self._running.pop(partition, None)
        if running is None:
            return
        self._leaving[partition] = running  # its figures still count while it drains
        with anyio.CancelScope(shield=True):
            if lost:
                running.scope.cancel()  # acks are refused already: stop at once
            else:
                running.stop.set()  # drain: settle and acknowledge what is in flight
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
            "lance_async worker %s: %s partition %d",
            self.member,
            "lost" if lost else "handed back",
            partition,
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
