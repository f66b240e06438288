"""Kafka consumer groups as the coordinator of workers: :class:`KafkaCoordinator`.

With Kafka the broker's group protocol assigns partitions: every worker joins
the same consumer group on one topic of N partitions (N = the table's
buckets), and the group's assignment is the ownership. The consumer is
librdkafka's (confluent-kafka's ``AIOConsumer``), with the
``cooperative-sticky`` assignor by default (or the KIP-848 protocol), so a
rebalance is *incremental*: a member joining or leaving moves only the
partitions that change hands, and every other partition of every member
goes on being fetched and ingested through it. :class:`KafkaCoordinator`
turns the group's callbacks into a :class:`~lance_async.cluster.Worker`'s
assign and revoke:

* **assigned** partitions are fetched at once (each into a queue of its
  own), while their shard writers open (opening one fences any stale
  writer) in a task of the coordinator's: the callback returns at once, so
  the other partitions' records never wait for a writer to open;
* **revoked** partitions are drained before the callback returns -- no more
  fetches, the acks in flight settled, their offsets committed (the
  partition is still ours during the callback, as Kafka's guidance asks),
  the writer closed -- so the next owner starts after everything
  acknowledged here;
* **lost** partitions (this member's session expired: another member may
  own them already) are stopped at once, acknowledging and committing
  nothing more.

One consumer fetches for every assigned partition
(:class:`~lance_async.feeds.KafkaFeed`: contiguous per-partition commits,
never past an unacknowledged record, fenced by assignment epoch); a
dispatcher hands each record to its partition's queue, read by that
partition's ingest loop; a partition whose queue is full is paused in the
consumer until its ingest has caught up, so a slow partition never holds up
the others' records. The dispatcher is the only task that calls the
consumer (confluent-kafka serializes the calls of one consumer, and the
rebalance callbacks run inside its fetch); acknowledgements, resumes and
restarts are handed to it.

A partition whose work ended while the group still assigns it here (a
failure that is not a fence: the store of its writer, say) is restarted in
place, after the back-off the worker asks for: revoked, rewound to its last
acknowledged record, and assigned again. A fenced partition is not: a fence
means the group gave it to another member, and the rebalance that follows
revokes it here.

A worker waits for its broker: librdkafka reconnects by itself (a broker
restarting, or not up yet), with a backoff of at most
``reconnect.backoff.max.ms``; the worker logs ``no Kafka broker answers``
once per spell, and :meth:`KafkaCoordinator.stop` ends it at once, owning
nothing, even while no broker answers.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._loop import unwrap_groups
from ..errors import InvalidInputError
from ..feeds.base import Message
from ..feeds.kafka import KafkaFeed
from ..feeds.kafkaclient import BrokerWatch
from .balancer import Assign, Revoke

__all__ = ["KafkaCoordinator"]

log = logging.getLogger("lance_async.cluster")

RETRY_START = 1.0
"""Seconds before a partition whose start failed is started again in place
(if the group still assigns it here): a start fails while another member
still holds its shard, until the group's rebalance has moved it."""

CLOSE_TIMEOUT = 30.0
"""Seconds the consumer's close (leaving the group) may take."""


class _PartitionFeed:
    """One assigned partition's records, as dispatched from the shared consumer.

    ``on_room`` is called (on the loop) after a fetch that left at most
    ``low_water`` records queued: the coordinator resumes the partition's
    fetching if it paused it.
    """

    def __init__(
        self,
        coordinator: KafkaCoordinator,
        partition: int,
        receive: MemoryObjectReceiveStream[Message],
        low_water: int,
    ) -> None:
        self._coordinator = coordinator
        self._partition = partition
        self._receive = receive
        self._low_water = low_water

    @property
    def exhausted(self) -> bool:
        return False

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        out: list[Message] = []
        with anyio.move_on_after(timeout):
            try:
                out.append(await self._receive.receive())
            except anyio.EndOfStream:
                return out
        while len(out) < max_messages:
            try:
                out.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        if self._receive.statistics().current_buffer_used <= self._low_water:
            self._coordinator._room(self._partition, self._receive)
        return out

    async def ack_batch(self, messages: Sequence[Message]) -> None:
        await self._coordinator._feed_().ack_batch(messages)

    async def aclose(self) -> None:
        self._receive.close()


class KafkaCoordinator:
    """A Kafka consumer group assigns a worker its partitions (one topic).

    Parameters
    ----------
    config : mapping
        The member's librdkafka settings
        (:func:`~lance_async.feeds.kafkaclient.consumer_config`: a group,
        offsets committed by lance_async only, ``cooperative-sticky`` or
        KIP-848). The coordinator makes the consumer in :meth:`run`,
        subscribes it to ``topic``, and closes it.
    topic : str
        The topic; its partition count must be the table's buckets.
    num_partitions : int
        The topic's partitions (checked at the first assignment).
    member : str
        This worker's name, for logs and stats.
    queue : int
        Records dispatched to a partition and not yet fetched by its ingest
        loop before the consumer stops fetching that partition (default
        10,000; resumed once its ingest has taken half of them). The other
        partitions' records keep flowing: one slow partition holds up only
        itself. A partition may hold up to one fetch (1,000 records) more.

    Notes
    -----
    asyncio only (confluent-kafka's asyncio consumer).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        num_partitions: int,
        member: str,
        *,
        queue: int = 10_000,
    ) -> None:
        self._config = dict(config)
        self._topic = topic
        self.num_partitions = num_partitions
        self.member = member
        self._queue = queue
        self._consumer: Any = None
        self._feed: KafkaFeed | None = None
        self._queues: dict[int, MemoryObjectSendStream[Message]] = {}
        self._feeds: dict[int, _PartitionFeed] = {}
        self._owned: set[int] = set()  # the group's assignment here
        self._running: set[int] = set()  # partitions the worker was asked to start
        self._paused: set[int] = set()  # partitions whose fetching we paused (queue full)
        self._resume: set[int] = set()  # paused ones whose ingest took half: resume them
        self._rewind: set[int] = set()  # restarted in place: read again before dispatching
        self._dropped: set[int] = set()
        self._restarts: dict[int, float] = {}  # partition -> monotonic time to restart it
        self._wake: anyio.Event | None = None  # the restarter's and starter's
        self._to_start: set[int] = set()
        self._checked = False
        self._error: BaseException | None = None
        self._on_assign: Assign | None = None
        self._on_revoke: Revoke | None = None
        self._stop = anyio.Event()
        self._changing: anyio.Lock | None = None  # rebalances and restarts, one at a time
        self.watch = BrokerWatch(f"lance_async worker {member}")
        """Whether a broker answers (the consumer's ``error_cb``)."""

    def __repr__(self) -> str:
        return f"<KafkaCoordinator {self.member} topic={self._topic!r} owned={sorted(self._owned)}>"

    @property
    def owned(self) -> set[int]:
        """The partitions the group assigns this member now (a copy)."""
        return set(self._owned)

    @property
    def paused(self) -> set[int]:
        """The partitions whose fetching is paused now: their queue is full (a copy)."""
        return set(self._paused)

    # -- the Coordinator protocol ---------------------------------------------------
    def valid(self, partition: int) -> bool:
        """True while the group has ``partition`` assigned to this member."""
        return partition in self._owned and partition not in self._dropped

    def drop(self, partition: int, *, fenced: bool = False, retry_after: float = 0.0) -> None:
        """Stop acknowledging ``partition`` at once.

        ``fenced``: the group moved it already, and the rebalance that
        follows revokes it here. Otherwise (its work failed or ended) it is
        restarted in place after ``retry_after`` seconds, if the group still
        assigns it here then. Does not block.
        """
        self._dropped.add(partition)
        if not fenced:
            self._restarts[partition] = time.monotonic() + retry_after
            self._poke()

    def stop(self) -> None:
        """Leave the group cleanly: every partition is drained and committed.

        While no broker answers, the worker stops at once, owning nothing.
        """
        self._stop.set()

    async def open_partition(self, partition: int) -> _PartitionFeed:
        """The feed of an assigned partition (records from the shared consumer,
        queued since the group assigned it)."""
        feed = self._feeds.pop(partition, None)
        if feed is None:
            feed = self._new_queue(partition)
            self._feeds.pop(partition, None)
        return feed

    async def run(self, on_assign: Assign, on_revoke: Revoke) -> None:
        """Join the group and dispatch records until :meth:`stop`; leave cleanly.

        Raises
        ------
        InvalidInputError
            The topic's partitions are not the table's buckets.
        confluent_kafka.KafkaException
            A fatal consumer error, or settings librdkafka refuses.
        """
        from confluent_kafka.aio import AIOConsumer

        self._on_assign, self._on_revoke = on_assign, on_revoke
        config = dict(self._config)
        config["error_cb"] = self.watch

        async def on_commit(error: Any, partitions: Any) -> None:
            if self._feed is not None:
                await self._feed.on_commit(error, partitions)

        config["on_commit"] = on_commit
        self._consumer = consumer = AIOConsumer(config, max_workers=4)
        self._feed = KafkaFeed(consumer, revoke_timeout=0.0, retry_for=math.inf)
        try:
            await consumer.subscribe(
                [self._topic],
                on_assign=self._assigned_cb,
                on_revoke=self._revoked_cb,
                on_lost=self._lost_cb,
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._starter)
                tg.start_soon(self._restarter)
                await self._dispatch()  # until stop(): never cancelled inside a consume
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    # leaving the group revokes everything: drained and committed first
                    async with self._lock():
                        await self._revoked(set(self._owned))
                    # the consumer is idle (the dispatcher ended between two fetches), and
                    # no lock is held across its calls: a callback may need the lock
                    await self._feed.revoke(self._tps(self._owned))
                    self._owned.clear()
                    for p in list(self._queues):
                        self._close_queue(p)
                finally:
                    with anyio.move_on_after(CLOSE_TIMEOUT):
                        await consumer.close()
        if self._error is not None:
            raise self._error

    # -- the group's callbacks (librdkafka runs them inside the dispatcher's fetch) --------
    async def _assigned_cb(self, consumer: Any, partitions: Sequence[Any]) -> None:
        feed = self._feed_()
        new = {tp.partition for tp in partitions if tp.topic == self._topic}
        feed.assign([(tp.topic, tp.partition) for tp in partitions])
        if not self._checked:
            self._checked = True
            await self._check_topic(consumer)
        for p in sorted(new):
            self._owned.add(p)
            self._dropped.discard(p)
            self._new_queue(p)  # records are queued from now on, while its writer opens
        self._to_start |= new
        self._poke()
        log.info(
            "lance_async worker %s: assigned %s (owns %s)",
            self.member,
            sorted(new),
            sorted(self._owned),
            extra={"member": self.member},
        )

    async def _revoked_cb(self, consumer: Any, partitions: Sequence[Any]) -> None:
        await self._take_back({tp.partition for tp in partitions if tp.topic == self._topic}, False)

    async def _lost_cb(self, consumer: Any, partitions: Sequence[Any]) -> None:
        await self._take_back({tp.partition for tp in partitions if tp.topic == self._topic}, True)

    async def _take_back(self, partitions: set[int], lost: bool) -> None:
        """Revoke partitions together: their drains overlap, so a rebalance
        waits for the slowest one, not for their sum (the group's rebalance
        timeout bounds the callback)."""
        log.info(
            "lance_async worker %s: %s %s",
            self.member,
            "lost" if lost else "revoked",
            sorted(partitions),
            extra={"member": self.member},
        )
        feed = self._feed_()
        if lost:  # no ack from now on: another member may own them
            self._dropped |= partitions
        async with self._lock():
            self._to_start -= partitions
            await self._revoked(partitions, lost=lost)
            await feed.revoke(self._tps(partitions), lost=lost)  # commits what is acked
            paused = sorted(partitions & self._paused)
            if paused:  # a partition assigned again later starts unpaused
                self._paused -= set(paused)
                await self._quietly("resume", paused)
            self._owned -= partitions
            self._resume -= partitions
            self._rewind -= partitions

    async def _check_topic(self, consumer: Any) -> None:
        """The topic's partition count is the table's buckets (else the worker stops)."""
        try:
            metadata = await consumer.list_topics(self._topic, timeout=10.0)
            found = metadata.topics[self._topic].partitions
        except Exception as exc:  # not known yet: the assignment itself is the check
            log.debug("lance_async worker %s: topic metadata: %r", self.member, exc)
            return
        if len(found) != self.num_partitions:
            self._error = InvalidInputError(
                f"topic {self._topic!r} has {len(found)} partitions and the table "
                f"{self.num_partitions} buckets: a feed must be partitioned like the table"
            )
            self._stop.set()

    # -- internals --------------------------------------------------------------------
    def _feed_(self) -> KafkaFeed:
        assert self._feed is not None
        return self._feed

    def _lock(self) -> anyio.Lock:
        if self._changing is None:
            self._changing = anyio.Lock()
        return self._changing

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _tps(self, partitions: set[int] | Sequence[int]) -> list[tuple[str, int]]:
        return [(self._topic, p) for p in sorted(partitions)]

    def _tps_kafka(self, partitions: Sequence[int]) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition(self._topic, p) for p in partitions]

    def _close_queue(self, partition: int) -> None:
        """Close ``partition``'s queue (and its feed, if never handed out)."""
        queue = self._queues.pop(partition, None)
        if queue is not None:
            queue.close()
        feed = self._feeds.pop(partition, None)
        if feed is not None:
            feed._receive.close()

    async def _quietly(self, method: str, partitions: Sequence[int]) -> None:
        """``pause`` or ``resume`` partitions; one no longer assigned is no error."""
        from confluent_kafka import KafkaException

        try:
            await getattr(self._consumer, method)(self._tps_kafka(partitions))
        except KafkaException as exc:
            log.debug("lance_async worker %s: %s %s: %s", self.member, method, partitions, exc)

    def _new_queue(self, partition: int) -> _PartitionFeed:
        """A fresh queue for ``partition`` (an earlier one is closed)."""
        self._close_queue(partition)
        # unbounded: the dispatcher never waits on one partition; a full one is paused
        send, receive = anyio.create_memory_object_stream[Message](math.inf)
        self._queues[partition] = send
        feed = self._feeds[partition] = _PartitionFeed(self, partition, receive, self._queue // 2)
        return feed

    def _room(self, partition: int, receive: MemoryObjectReceiveStream[Message]) -> None:
        """A partition's ingest took half its queue: resume its fetching if paused."""
        if partition in self._paused and partition in self._queues:
            self._resume.add(partition)

    async def _starter(self) -> None:
        """Open the writers of newly assigned partitions, outside the callbacks."""
        while True:
            self._wake = anyio.Event()
            if not self._to_start:
                await self._wake.wait()
                continue
            async with self._lock():
                start, self._to_start = self._to_start & self._owned, set()
                await self._assigned_now(start)

    def _due(self) -> list[int]:
        now = time.monotonic()
        return sorted(p for p, at in self._restarts.items() if at <= now)

    def _next_restart(self) -> float:
        if not self._restarts:
            return 60.0
        return max(0.0, min(self._restarts.values()) - time.monotonic())

    async def _restarter(self) -> None:
        """Restart dropped, unfenced partitions still assigned here, when due."""
        while True:
            due = self._due()
            if not due:
                with anyio.move_on_after(min(self._next_restart(), 0.5)):
                    await self._stop.wait()
                continue
            for p in due:
                del self._restarts[p]
                async with self._lock():
                    if p in self._owned and p in self._dropped:
                        await self._restart(p)

    async def _restart(self, partition: int) -> None:
        """Revoke ``partition`` here, rewind it to its last acknowledged record,
        assign it again (the dispatcher rewinds it: it alone calls the consumer)."""
        log.info("lance_async: restarting partition %d in place", partition)
        await self._revoked({partition})
        self._rewind.add(partition)  # its records are dropped until it is rewound
        self._new_queue(partition)
        await self._assigned_now({partition})

    async def _apply(self) -> None:
        """What other tasks asked of the consumer: rewinds and resumes."""
        feed = self._feed_()
        for p in sorted(self._rewind):
            if p in self._paused:
                self._paused.discard(p)
                await self._quietly("resume", [p])
            await feed.rewind((self._topic, p))
            self._rewind.discard(p)
        resume = sorted(self._resume & self._paused)
        self._resume.clear()
        if resume:
            self._paused -= set(resume)
            await self._quietly("resume", resume)

    async def _dispatch(self) -> None:
        feed = self._feed_()
        while not self._stop.is_set():
            await self._apply()
            skip = self._dropped | self._rewind  # rewound by the next _apply, or restarted
            messages = await feed.fetch(1000, 0.2)
            filled: dict[int, MemoryObjectSendStream[Message]] = {}
            for message in messages:  # no await until dispatched: the epochs still hold
                partition = int(message.offset.partition)
                if partition in skip or partition in self._dropped or partition in self._rewind:
                    continue  # never acked: read again from the last acked record on restart
                queue = self._queues.get(partition)
                if queue is None:
                    continue
                try:
                    queue.send_nowait(message)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    continue
                filled[partition] = queue
            full = [
                p
                for p, queue in filled.items()  # once per fetch, not per record
                if self._queues.get(p) is queue
                and p not in self._paused
                and queue.statistics().current_buffer_used >= self._queue
            ]
            if full:  # their next records wait in the broker
                self._paused.update(full)
                await self._quietly("pause", sorted(full))

    async def _assigned_now(self, partitions: set[int]) -> None:
        """Start the partitions together (each opens its shard's writer: their
        waits on the store overlap, so they start after the slowest, not
        after their sum)."""
        on_assign = self._on_assign
        assert on_assign is not None

        async def start(p: int) -> None:
            try:
                await on_assign(p)
            except Exception as exc:
                log.error("lance_async: starting partition %d failed: %r", p, exc)
                self.drop(p, retry_after=RETRY_START)  # its records wait: not dispatched

        new = sorted(p for p in partitions if p not in self._running)
        for p in new:
            self._running.add(p)
            self._dropped.discard(p)
        with unwrap_groups():
            async with anyio.create_task_group() as tg:
                for p in new:
                    tg.start_soon(start, p)

    async def _revoked(self, partitions: set[int], *, lost: bool = False) -> None:
        """The worker hands the partitions back (drained unless ``lost``);
        their queues close."""
        on_revoke = self._on_revoke
        assert on_revoke is not None

        async def revoke(p: int) -> None:
            try:
                await on_revoke(p, lost or p in self._dropped)
            finally:
                self._running.discard(p)

        async with anyio.create_task_group() as tg:
            for p in sorted(partitions & self._running):
                tg.start_soon(revoke, p)
        for p in partitions:
            self._close_queue(p)
