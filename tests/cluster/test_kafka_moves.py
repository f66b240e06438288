"""A Kafka worker's dispatcher: partitions moved away and back, slow partitions.

The dispatcher fetches records of every assigned partition in one batch and
hands them to each partition's queue. If the group moves a partition away
and back meanwhile, records of the earlier assignment still queued or in
hand belong to it: another member may have written and committed them, and
newer records of the same keys, since. Handed to the new assignment, they
would be written again after those newer ones (a key back at an old
version; seen under chaos, kill -9 and a CPU hog). A partition whose queue
is full is paused in the consumer, so the others' records never wait
behind it. Driven here with the fake aiokafka consumer of
``tests/feeds/test_kafka.py``, whose rebalance follows aiokafka's eager
protocol; the dispatcher and KafkaFeed are the real ones.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from aiokafka.structs import TopicPartition

from lance_async.cluster import kafka
from lance_async.cluster.kafka import KafkaCoordinator
from lance_async.errors import ConflictError
from lance_async.feeds import Message

from ..feeds.test_kafka import FakeBroker, FakeConsumer

P0 = TopicPartition("events", 0)
P1 = TopicPartition("events", 1)


class GroupConsumer(FakeConsumer):
    """The calls a KafkaCoordinator adds: start, and the topic's partitions."""

    def __init__(self, broker: FakeBroker, assignment: set[TopicPartition]) -> None:
        super().__init__(broker, assignment)
        self.started = anyio.Event()  # subscribed, and its listener given

    async def start(self) -> None:
        self.started.set()

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.broker.committed.get(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._positions[tp] = offset

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        for tp in tps:
            self._positions[tp] = 0

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}


class Member:
    """A coordinator over the fake consumer (queues of one record), and the
    partition feeds it opened; ``start(p)`` is called before each opens."""

    def __init__(self, broker: FakeBroker) -> None:
        self.consumer = GroupConsumer(broker, set())
        self.coordinator = KafkaCoordinator(self.consumer, "events", 2, "m", queue=1)
        self.feeds: dict[int, Any] = {}
        self.assigned = anyio.Event()  # set when both partitions have feeds

    async def start(self, p: int) -> None:
        """Override: what happens before partition ``p``'s feed opens."""

    async def on_assign(self, p: int) -> None:
        await self.start(p)
        self.feeds[p] = await self.coordinator.open_partition(p)
        if len(self.feeds) == 2:
            self.assigned.set()

    async def on_revoke(self, p: int, lost: bool) -> None:
        feed = self.feeds.pop(p, None)
        if feed is not None:
            await feed.aclose()

    async def taken(self, p: int, count: int) -> list[bytes]:
        """The payloads of partition ``p``'s next ``count`` records."""
        out: list[Message] = []
        with anyio.fail_after(30):  # only tells an answer from a hang
            while len(out) < count:
                out += await self.feeds[p].fetch(count - len(out), 0.1)
        return [m.payload for m in out]  # type: ignore[misc]

    async def aclose(self) -> None:
        for feed in self.feeds.values():
            await feed.aclose()


@pytest.mark.asyncio
async def test_records_fetched_before_a_move_never_reach_the_new_assignment() -> None:
    broker = FakeBroker()
    broker.produce(P0, [b"a0", b"a1", b"a2"])
    broker.produce(P1, [b"b0", b"b1", b"b2"])
    m = Member(broker)
    async with anyio.create_task_group() as tg:
        tg.start_soon(m.coordinator.run, m.on_assign, m.on_revoke)
        await m.consumer.started.wait()
        await m.consumer.rebalance({P0, P1})
        await m.assigned.wait()
        # the batch holds a0-a2 and b0-b2, all queued; P0's and P1's queues
        # (of one record) are full, so both partitions are paused
        assert await m.taken(0, 1) == [b"a0"]
        # meanwhile the group moved both partitions away and back: another
        # member consumed P1 up to b2, committed, and P1 got a newer record
        broker.committed[P1] = 3
        broker.produce(P1, [b"b3"])
        m.assigned = anyio.Event()
        await m.consumer.rebalance(set())
        await m.consumer.rebalance({P0, P1})
        await m.assigned.wait()
        # P0 is read again from its committed offset, in order (a1 and a2 of
        # the earlier batch were not handed on: they come once, from the new fetch)
        assert await m.taken(0, 3) == [b"a0", b"a1", b"a2"]
        # the new assignment of P1 starts where the group stands: b3, never
        # the b0-b2 fetched under the earlier one
        assert await m.taken(1, 1) == [b"b3"]
        m.coordinator.stop()
    await m.aclose()


@pytest.mark.asyncio
async def test_a_partition_whose_shard_is_held_elsewhere_is_started_again_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its start fails while another member still holds the shard (the group
    has not finished moving it): its records are not dispatched meanwhile (no
    other partition waits behind them), and it is started again, read from
    its committed offset, while the group still assigns it here."""
    monkeypatch.setattr(kafka, "RETRY_START", 0.05)
    broker = FakeBroker()
    broker.produce(P0, [b"a0", b"a1"])
    broker.produce(P1, [b"b0", b"b1"])
    starts = {0: 0, 1: 0}

    class Held(Member):
        async def start(self, p: int) -> None:
            starts[p] += 1
            if p == 0 and starts[p] == 1:
                raise ConflictError("another writer claimed the shard", retryable=True)

    m = Held(broker)
    async with anyio.create_task_group() as tg:
        tg.start_soon(m.coordinator.run, m.on_assign, m.on_revoke)
        await m.consumer.started.wait()
        await m.consumer.rebalance({P0, P1})
        assert not m.coordinator.valid(0) and m.coordinator.valid(1)
        # P0's records are not dispatched: P1's queue of one is not stuck behind them
        assert await m.taken(1, 2) == [b"b0", b"b1"]
        with anyio.fail_after(30):
            await m.assigned.wait()  # P0 started again
        assert m.coordinator.valid(0)
        assert await m.taken(0, 2) == [b"a0", b"a1"]
        assert starts == {0: 2, 1: 1}
        m.coordinator.stop()
    await m.aclose()


@pytest.mark.asyncio
async def test_a_partition_nobody_reads_is_paused_and_the_others_flow() -> None:
    """P0's ingest takes nothing: its queue fills, its fetching is paused, and
    every record of P1 still arrives; once P0's ingest takes its records, it
    is resumed and the rest come in order, each once."""
    broker = FakeBroker()
    broker.produce(P0, [f"a{i}".encode() for i in range(6)])
    m = Member(broker)
    m.coordinator = KafkaCoordinator(m.consumer, "events", 2, "m", queue=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(m.coordinator.run, m.on_assign, m.on_revoke)
        await m.consumer.started.wait()
        await m.consumer.rebalance({P0, P1})
        await m.assigned.wait()
        for i in range(20):  # P1 keeps flowing while P0 sits full
            broker.produce(P1, [f"b{i}".encode()])
            assert await m.taken(1, 1) == [f"b{i}".encode()]
            # fetched and dispatched after P0's records: P0 is paused by now
            assert m.consumer.paused() == {P0}
        assert await m.taken(0, 6) == [f"a{i}".encode() for i in range(6)]
        assert m.consumer.paused() == set()
        broker.produce(P0, [b"a6"])
        assert await m.taken(0, 1) == [b"a6"]
        m.coordinator.stop()
    await m.aclose()
