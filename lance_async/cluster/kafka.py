"""Kafka consumer groups as the coordinator of workers: :class:`KafkaCoordinator`.

With Kafka the broker assigns partitions itself: every worker joins the same
consumer group on one topic of N partitions (N = the table's buckets), and the
group's assignment is the ownership. :class:`KafkaCoordinator` turns the
group's rebalance callbacks into a :class:`~lance_async.cluster.Worker`'s
assign and revoke:

* **assigned** partitions get their shard writer (opening it fences any
  stale writer) and a feed of their own;
* **revoked** partitions are drained before the callback returns -- no more
  fetches, the acks in flight settled, their offsets committed (the partition
  is still ours during the callback, as Kafka's guidance asks), the writer
  closed -- so the next owner starts after everything acknowledged here.

One consumer fetches for every assigned partition
(:class:`~lance_async.feeds.KafkaFeed`: contiguous per-partition commits,
never past an unacknowledged record, fenced by assignment epoch); a
dispatcher hands each record to its partition's queue, read by that
partition's ingest loop; a partition whose queue is full is paused in the
consumer (aiokafka's ``pause``) until its ingest has caught up, so a slow
partition never holds up the others' records. A member paused past its
session timeout finds its commits refused by the group (a new generation)
and its puts fenced by the next owner's writer epoch.

A partition whose work ended while the group still assigns it here (a
failure that is not a fence: the broker connection of its writer's store,
say) is restarted in place, after the back-off the worker asks for: revoked,
rewound to its committed offset, and assigned again. A fenced partition is
not: a fence means the group gave it to another member, and the rebalance
that follows revokes it here.

A worker waits for its broker: a consumer that finds no broker to bootstrap
from (one restarting, or not up yet) tries again after a back-off (doubling,
up to :data:`MAX_START_BACKOFF`), until the broker answers or the worker is
stopped (then it returns at once, having owned nothing). Once started, aiokafka
itself reconnects and rejoins the group.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._loop import unwrap_groups
from ..feeds.base import Message
from ..feeds.kafka import KafkaFeed
from .balancer import Assign, Revoke

__all__ = ["KafkaCoordinator"]

log = logging.getLogger("lance_async.cluster")

#: Seconds before a consumer that found no broker to bootstrap from tries
#: again, doubled per failure in a row up to :data:`MAX_START_BACKOFF`.
START_BACKOFF = 0.2
MAX_START_BACKOFF = 5.0
RETRY_START = 1.0
"""Seconds before a partition whose start failed is started again in place
(if the group still assigns it here): a start fails while another member
still holds its shard, until the group's rebalance has moved it."""


class _PartitionFeed:
    """One assigned partition's records, as dispatched from the shared consumer.

    ``on_room`` is called (on the loop) after a fetch that left at most
    ``low_water`` records queued: the coordinator resumes the partition's
    fetching if it paused it.
    """

    def __init__(
        self,
        receive: MemoryObjectReceiveStream[Message],
        on_room: Callable[[], None],
        low_water: int,
    ) -> None:
        self._receive = receive
        self._on_room = on_room
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
            self._on_room()
        return out

    async def aclose(self) -> None:
        self._receive.close()


class KafkaCoordinator:
    """A Kafka consumer group assigns a worker its partitions (one topic).

    Parameters
    ----------
    consumer : aiokafka.AIOKafkaConsumer
        Created by the caller with ``group_id`` and
        ``enable_auto_commit=False`` (not started, not subscribed: the
        coordinator subscribes it to ``topic`` and starts and stops it).
    topic : str
        The topic; its partition count must be the table's buckets.
    num_partitions : int
        The topic's partitions (checked when the consumer starts).
    member : str
        This worker's name, for logs and stats.
    queue : int
        Records dispatched to a partition and not yet fetched by its ingest
        loop before the consumer stops fetching that partition (default
        10,000; aiokafka's ``pause``, resumed once its ingest has taken half
        of them). The other partitions' records keep flowing: one slow
        partition holds up only itself. A partition may hold up to one
        fetch (1,000 records) more than this.
    """

    def __init__(
        self,
        consumer: Any,
        topic: str,
        num_partitions: int,
        member: str,
        *,
        queue: int = 10_000,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self.num_partitions = num_partitions
        self.member = member
        self._queue = queue
        self._feed = KafkaFeed(consumer, revoke_timeout=0.0)
        self._queues: dict[int, MemoryObjectSendStream[Message]] = {}
        self._paused: set[int] = set()  # partitions whose fetching we paused (queue full)
        self._assigned: set[int] = set()
        self._on_assign: Assign | None = None
        self._on_revoke: Revoke | None = None
        self._stop = anyio.Event()
        self._dropped: set[int] = set()
        self._ready: dict[int, anyio.Event] = {}
        self._restarts: dict[int, float] = {}  # partition -> monotonic time to restart it
        self._restart_wake: anyio.Event | None = None
        self._changing: anyio.Lock | None = None  # rebalances and restarts, one at a time
        self._starting: anyio.CancelScope | None = None  # the consumer's start, until stop()

    # -- the Coordinator protocol ---------------------------------------------------
    def valid(self, partition: int) -> bool:
        """True while the group has ``partition`` assigned to this member."""
        return partition in self._assigned and partition not in self._dropped

    def drop(self, partition: int, *, fenced: bool = False, retry_after: float = 0.0) -> None:
        """Stop acknowledging ``partition`` at once.

        ``fenced``: the group moved it already, and the rebalance that
        follows revokes it here (``lost=True``). Otherwise (its work failed or
        ended) it is restarted in place after ``retry_after`` seconds, if the
        group still assigns it here then. Does not block.
        """
        self._dropped.add(partition)
        if not fenced:
            self._restarts[partition] = time.monotonic() + retry_after
            if self._restart_wake is not None:
                self._restart_wake.set()

    def stop(self) -> None:
        """Leave the group cleanly: every partition is drained and committed.

        A consumer still starting (waiting for its broker) stops at once.
        """
        self._stop.set()
        if self._starting is not None:
            self._starting.cancel()

    async def open_partition(self, partition: int) -> _PartitionFeed:
        """The feed of an assigned partition (records from the shared consumer)."""
        # unbounded: the dispatcher never waits on one partition; a full one is paused
        send, receive = anyio.create_memory_object_stream[Message](math.inf)
        self._queues[partition] = send
        return _PartitionFeed(receive, partial(self._resume, partition, send), self._queue // 2)

    async def run(self, on_assign: Assign, on_revoke: Revoke) -> None:
        """Join the group and dispatch records until :meth:`stop`; leave cleanly."""
        from aiokafka.abc import ConsumerRebalanceListener

        coordinator = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
                async with coordinator._lock():
                    await coordinator._revoked({tp.partition for tp in revoked})
                    await coordinator._feed._on_revoked(set(revoked))

            async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
                assigned = set(assigned)
                async with coordinator._lock():
                    coordinator._feed._on_assigned(assigned)
                    await coordinator._assigned_now({tp.partition for tp in assigned})

        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._consumer.subscribe([self._topic], listener=Listener())
        try:
            if not await self._start():
                return  # stopped before the broker answered
            partitions = self._consumer.partitions_for_topic(self._topic)
            if partitions is not None and len(partitions) != self.num_partitions:
                from ..errors import InvalidInputError

                raise InvalidInputError(
                    f"topic {self._topic!r} has {len(partitions)} partitions and the table "
                    f"{self.num_partitions} buckets: a feed must be partitioned like the table"
                )
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._dispatch)
                tg.start_soon(self._restarter)
                await self._stop.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                # leaving the group revokes everything: drained and committed first
                await self._revoked(set(self._assigned))
                await self._feed.commit()
                await self._consumer.stop()

    # -- internals --------------------------------------------------------------------
    async def _start(self) -> bool:
        """Start the consumer (join the group), waiting for the broker: a
        bootstrap that reaches no broker is tried again after a back-off.
        False when :meth:`stop` came first."""
        from aiokafka.errors import KafkaConnectionError

        delay = START_BACKOFF
        while not self._stop.is_set():
            with anyio.CancelScope() as self._starting:
                try:
                    await self._consumer.start()
                    return True
                except KafkaConnectionError as exc:
                    # raised by the bootstrap, before anything was started: start() may
                    # be called again
                    log.warning(
                        "lance_async worker %s: no Kafka broker answers (%s); "
                        "trying again in %.1f s",
                        self.member,
                        exc,
                        delay,
                        extra={"member": self.member},
                    )
                finally:
                    self._starting = None
            with anyio.move_on_after(delay):
                await self._stop.wait()
            delay = min(delay * 2, MAX_START_BACKOFF)
        return False

    def _lock(self) -> anyio.Lock:
        if self._changing is None:
            self._changing = anyio.Lock()
        return self._changing

    async def _restarter(self) -> None:
        """Restart dropped, unfenced partitions still assigned here, when due."""
        while True:
            self._restart_wake = anyio.Event()
            now = time.monotonic()
            due = sorted(p for p, at in self._restarts.items() if at <= now)
            if not due:
                wait = min(self._restarts.values(), default=now + 60.0) - now
                with anyio.move_on_after(wait):
                    await self._restart_wake.wait()
                continue
            for p in due:
                del self._restarts[p]
                async with self._lock():
                    if p in self._assigned and p in self._dropped:
                        await self._restart(p)

    async def _restart(self, partition: int) -> None:
        """Revoke ``partition`` here, rewind it to its committed offset, assign it again."""
        from aiokafka import TopicPartition

        log.info("lance_async: restarting partition %d in place", partition)
        tp = TopicPartition(self._topic, partition)
        await self._revoked({partition})
        await self._feed._on_revoked({tp})  # what was acknowledged is committed
        if tp not in self._consumer.assignment():
            return  # the group moved it meanwhile
        committed = await self._consumer.committed(tp)
        if committed is None:
            await self._consumer.seek_to_beginning(tp)
        else:
            self._consumer.seek(tp, committed)
        await self._assigned_now({partition})

    def _topic_partition(self, partition: int) -> Any:
        from aiokafka import TopicPartition

        return TopicPartition(self._topic, partition)

    def _pause(self, partition: int) -> None:
        """Stop fetching ``partition`` (its queue is full); the rest go on."""
        if partition in self._paused:
            return
        tp = self._topic_partition(partition)
        if tp in self._consumer.assignment():
            self._consumer.pause(tp)
            self._paused.add(partition)

    def _resume(self, partition: int, queue: MemoryObjectSendStream[Message]) -> None:
        """Fetch ``partition`` again (its ingest took half its queue), if it
        is still this queue's partition and paused."""
        if partition in self._paused and self._queues.get(partition) is queue:
            self._unpause(partition)

    def _unpause(self, partition: int) -> None:
        self._paused.discard(partition)
        tp = self._topic_partition(partition)
        if tp in self._consumer.assignment():  # a new assignment starts unpaused
            self._consumer.resume(tp)

    def _ready_event(self, partition: int) -> anyio.Event:
        event = self._ready.get(partition)
        if event is None:
            event = self._ready[partition] = anyio.Event()
        return event

    def _owned_by_group(self, partition: int) -> bool:
        return any(tp.partition == partition for tp in self._consumer.assignment())

    async def _dispatch(self) -> None:
        while True:
            messages = await self._feed.fetch(1000, 0.2)
            epochs = self._feed.epochs()  # as fetched: no await since
            waited = False  # no await since the fetch: the epochs still hold
            filled: dict[int, MemoryObjectSendStream[Message]] = {}
            for message in messages:
                partition = int(message.offset.partition)
                if partition in self._dropped:
                    continue  # never acked: read again from the committed offset on restart
                queue = self._queues.get(partition)
                while queue is None and self._owned_by_group(partition):
                    # the fetcher may run ahead of the assignment callback: wait for
                    # the partition's writer and queue instead of losing the record
                    waited = True
                    with anyio.move_on_after(0.5):
                        await self._ready_event(partition).wait()
                    queue = self._queues.get(partition)
                if queue is None:
                    continue  # fetched before a revocation: never acked, read again by the owner
                if waited and self._feed.epoch(message.offset) != epochs.get(
                    self._topic_partition(partition), 0
                ):
                    # fetched before the group moved the partition (this batch
                    # waited meanwhile): never committed, and the partition's
                    # owner since may have written newer records of its keys
                    continue
                try:
                    queue.send_nowait(message)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    continue
                filled[partition] = queue
            for partition, queue in filled.items():  # once per fetch, not per record
                if (
                    self._queues.get(partition) is queue
                    and queue.statistics().current_buffer_used >= self._queue
                ):
                    self._pause(partition)  # its next records wait in the broker

    async def _assigned_now(self, partitions: set[int]) -> None:
        """Start the partitions together (each opens its shard's writer: their
        waits on the store overlap, so the group's members resume after the
        slowest start, not after their sum)."""
        on_assign = self._on_assign
        assert on_assign is not None

        async def start(p: int) -> None:
            try:
                await on_assign(p)
            except Exception as exc:
                log.error("lance_async: starting partition %d failed: %r", p, exc)
                self.drop(p, retry_after=RETRY_START)  # its records wait: not dispatched
            finally:
                self._ready_event(p).set()

        new = sorted(partitions - self._assigned)
        for p in new:
            self._assigned.add(p)
            self._dropped.discard(p)
        with unwrap_groups():
            async with anyio.create_task_group() as tg:
                for p in new:
                    tg.start_soon(start, p)

    async def _revoked(self, partitions: set[int]) -> None:
        """Revoke partitions together: their drains overlap, so a rebalance
        waits for the slowest one, not for their sum (the group's rebalance
        timeout bounds the callback)."""
        on_revoke = self._on_revoke
        assert on_revoke is not None

        async def revoke(p: int) -> None:
            lost = p in self._dropped
            try:
                await on_revoke(p, lost)
            finally:
                self._assigned.discard(p)
                self._ready.pop(p, None)
                queue = self._queues.pop(p, None)
                if queue is not None:
                    queue.close()
                if p in self._paused:  # still assigned when restarted in place
                    self._unpause(p)

        async with anyio.create_task_group() as tg:
            for p in sorted(partitions & self._assigned):
                tg.start_soon(revoke, p)
