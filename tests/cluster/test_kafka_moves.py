"""A Kafka worker's dispatcher on a real broker (Tansu): partitions moved away and back,
shards held elsewhere, slow partitions.

The coordinator fetches records of every assigned partition in one batch and
hands them to each partition's queue. If the group moves a partition away
and back meanwhile, records of the earlier assignment still queued or in
hand belong to it: another member may have written and committed them, and
newer records of the same keys, since. Handed to the new assignment, they
would be written again after those newer ones (a key back at an old
version; seen under chaos, kill -9 and a CPU hog). A partition whose queue
is full is paused in the consumer, so the others' records never wait
behind it. The coordinators, librdkafka's consumers and the group are real;
the "worker" is a harness that opens each partition's feed and reads it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import pytest_asyncio

from lance_async.cluster import kafka
from lance_async.cluster.kafka import KafkaCoordinator
from lance_async.errors import ConflictError, InvalidInputError
from lance_async.feeds import KafkaProducer, Message
from lance_async.feeds.kafkaclient import consumer_config

from ..helpers import eventually
from ..services import GroupOffsets, create_topic, unique_name

#: Short enough that a member that left (Tansu ignores LeaveGroup) is seen gone
#: soon, long enough that one beside other work on 2 cores keeps its session (at
#: 2 s a member under a CI run lost it, and a test saw its partitions revoked).
FAST = {"session.timeout.ms": 5000, "heartbeat.interval.ms": 500, "max.poll.interval.ms": 15000}


class Topic:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.name = unique_name("moves")
        self.group = unique_name("g")

    async def produce(self, partition: int, values: list[bytes]) -> None:
        async with KafkaProducer({"bootstrap.servers": self.bootstrap}) as producer:
            for value in values:
                await producer.send_and_wait(self.name, value, partition=partition)


@pytest_asyncio.fixture
async def topic(kafka_bootstrap: str) -> AsyncIterator[Topic]:
    t = Topic(kafka_bootstrap)
    await create_topic(kafka_bootstrap, t.name, 2)
    yield t


class Board:
    """Tells the members' changes (a partition's feed opened or closed)."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def changed(self) -> None:
        self._event.set()

    async def until(self, done: Any) -> None:
        with anyio.fail_after(60):  # only tells an answer from a hang
            while not done():
                self._event = anyio.Event()
                await self._event.wait()


class Member:
    """A coordinator of the topic's group, and the partition feeds it opened;
    ``start(p)`` is called before each opens."""

    def __init__(
        self, topic: Topic, name: str, queue: int = 1, board: Board | None = None, buckets: int = 2
    ) -> None:
        config = consumer_config(topic.bootstrap, topic.group, client_id=name, options=FAST)
        self.coordinator = KafkaCoordinator(config, topic.name, buckets, name, queue=queue)
        self.feeds: dict[int, Any] = {}
        self.board = board or Board()

    async def start(self, p: int) -> None:
        """Override: what happens before partition ``p``'s feed opens."""

    async def on_assign(self, p: int) -> None:
        await self.start(p)
        self.feeds[p] = await self.coordinator.open_partition(p)
        self.board.changed()

    async def on_revoke(self, p: int, lost: bool) -> None:
        feed = self.feeds.pop(p, None)
        if feed is not None:
            await feed.aclose()
        self.board.changed()

    async def holding(self, partitions: set[int]) -> None:
        """Until this member's feeds are those of ``partitions``."""
        await self.board.until(lambda: set(self.feeds) == partitions)

    async def taken(self, p: int, count: int, ack: bool = False) -> list[bytes]:
        """The payloads of partition ``p``'s next ``count`` records."""
        out: list[Message] = []
        with anyio.fail_after(60):  # only tells an answer from a hang
            while len(out) < count:
                out += await self.feeds[p].fetch(count - len(out), 0.1)
        if ack:
            await self.feeds[p].ack_batch(out)
        return [m.payload for m in out]

    async def run(self) -> None:
        await self.coordinator.run(self.on_assign, self.on_revoke)


@pytest.mark.asyncio
async def test_a_partition_nobody_reads_is_paused_and_the_others_flow(topic: Topic) -> None:
    """P0's ingest takes nothing: its queue fills, its fetching is paused, and
    every record of P1 still arrives; once P0's ingest takes its records, it
    is resumed and the rest come in order, each once."""
    await topic.produce(0, [f"a{i}".encode() for i in range(6)])
    m = Member(topic, "m", queue=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(m.run)
        await m.holding({0, 1})
        # P0's six records fill its queue of two: it is paused (when: as the
        # fetches come, which librdkafka may interleave with P1's)
        await eventually(lambda: m.coordinator.paused == {0}, 60, "P0 paused")
        for i in range(5):  # P1 keeps flowing while P0 sits full and paused
            await topic.produce(1, [f"b{i}".encode()])
            assert await m.taken(1, 1) == [f"b{i}".encode()]
            assert m.coordinator.paused == {0}
        assert await m.taken(0, 6) == [f"a{i}".encode() for i in range(6)]
        await topic.produce(0, [b"a6"])
        assert await m.taken(0, 1) == [b"a6"]  # resumed, and nothing came twice
        assert m.coordinator.paused == set()
        m.coordinator.stop()


@pytest.mark.asyncio
async def test_a_partition_whose_shard_is_held_elsewhere_is_started_again_in_place(
    topic: Topic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its start fails while another member still holds the shard (the group
    has not finished moving it): its records are not dispatched meanwhile (no
    other partition waits behind them), and it is started again, read from
    its last acknowledged record, while the group still assigns it here."""
    monkeypatch.setattr(kafka, "RETRY_START", 0.05)
    await topic.produce(0, [b"a0", b"a1"])
    await topic.produce(1, [b"b0", b"b1"])
    starts = {0: 0, 1: 0}

    class Held(Member):
        async def start(self, p: int) -> None:
            starts[p] += 1
            if p == 0 and starts[p] == 1:
                raise ConflictError("another writer claimed the shard", retryable=True)

    m = Held(topic, "m")
    async with anyio.create_task_group() as tg:
        tg.start_soon(m.run)
        await m.holding({1})
        assert not m.coordinator.valid(0) and m.coordinator.valid(1)
        # P1's queue of one is not stuck behind P0's records
        assert await m.taken(1, 2) == [b"b0", b"b1"]
        await m.holding({0, 1})  # P0 started again
        assert m.coordinator.valid(0)
        assert await m.taken(0, 2) == [b"a0", b"a1"]
        assert starts == {0: 2, 1: 1}
        m.coordinator.stop()


@pytest.mark.asyncio
async def test_records_fetched_before_a_move_never_reach_the_new_assignment(
    topic: Topic,
) -> None:
    """a holds both partitions with records queued; b joins and the group
    moves one partition to it (only that one: cooperative-sticky), b writes
    and commits its three records, a newer record arrives, b leaves, and a
    gets the partition back: a's new assignment starts where the group
    stands, never at the records queued under its earlier one."""
    for p in (0, 1):
        await topic.produce(p, [f"{p}-{i}".encode() for i in range(3)])
    board = Board()
    a, b = Member(topic, "a", board=board), Member(topic, "b", board=board)
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        await a.holding({0, 1})
        assert await a.taken(0, 1) == [b"0-0"]  # the rest stays queued (or in the broker)
        async with anyio.create_task_group() as group_b:
            group_b.start_soon(b.run)
            await board.until(lambda: len(a.feeds) == len(b.feeds) == 1)
            (moved,) = b.feeds
            assert a.coordinator.owned == {1 - moved}  # the other was never revoked
            assert await b.taken(moved, 3, ack=True) == [f"{moved}-{i}".encode() for i in range(3)]
            offsets = GroupOffsets(topic.bootstrap, topic.group, topic.name)
            with anyio.fail_after(60):
                while (await offsets.committed(2))[moved] != 3:  # noqa: ASYNC110 - the broker
                    await anyio.sleep(0.05)  # offers no event for a commit: poll it
            await offsets.aclose()
            await topic.produce(moved, [f"{moved}-3".encode()])
            b.coordinator.stop()
        await a.holding({0, 1})  # after b's session expired (Tansu ignores LeaveGroup)
        assert await a.taken(moved, 1) == [f"{moved}-3".encode()]
        a.coordinator.stop()


@pytest.mark.asyncio
async def test_a_topic_not_partitioned_like_the_table_stops_the_worker(topic: Topic) -> None:
    """The topic has 2 partitions and the table 3 buckets: the first
    assignment finds it out, and the coordinator leaves the group and says so."""
    m = Member(topic, "m", buckets=3)
    with pytest.raises(InvalidInputError, match="has 2 partitions and the table 3 buckets"):
        with anyio.fail_after(60):  # only tells an answer from a hang
            await m.run()
    assert m.coordinator.owned == set() and m.feeds == {}
