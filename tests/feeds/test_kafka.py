"""KafkaFeed on a real Kafka-protocol broker (Tansu), librdkafka's consumer, a real MemWAL.

Every test has its own topic and group on the session's Tansu broker
(``kafka_bootstrap``) and reads through confluent-kafka's ``AIOConsumer``,
made by :meth:`KafkaFeed.connect` (``cooperative-sticky``). What is checked
is what the broker keeps: the group's committed offsets (read with a
consumer that never joins the group) and the table's rows. Tansu ignores
LeaveGroup, so a member that closes is dropped when its session expires
(``FAST``: 2 s).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio
from confluent_kafka import KafkaError, KafkaException

import lance_async as la
from lance_async.feeds import FeedState, KafkaFeed, KafkaOffset, KafkaProducer, Message, ingest

from ..services import GroupOffsets, create_topic, free_port, unique_name
from .support import (
    CrashBeforeAck,
    Recording,
    expected_rows,
    lsm_rows,
    mem_wal_table,
    new_shard,
    row_json,
)

pytestmark = pytest.mark.asyncio

FAST = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 200, "max.poll.interval.ms": 6000}
#: librdkafka's codes for "no broker answers" (all down, a connection refused, a name unknown)
NO_BROKER = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}
"""Group settings that make Tansu's rebalances quick (a few seconds)."""


class Topic:
    """A topic of its own on the session's broker, its group, and what was produced."""

    def __init__(self, bootstrap: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.name = unique_name("feed")
        self.group = unique_name("g")
        self.partitions = partitions

    async def produce(
        self, partition: int, values: Sequence[bytes | None], headers: Any = None
    ) -> None:
        async with KafkaProducer({"bootstrap.servers": self.bootstrap}) as producer:
            for value in values:
                await producer.send_and_wait(self.name, value, partition=partition, headers=headers)

    async def member(self, **options: Any) -> KafkaFeed:
        return await KafkaFeed.connect(
            self.bootstrap, [self.name], self.group, options=FAST, **options
        )

    async def committed(self) -> dict[int, int]:
        offsets = GroupOffsets(self.bootstrap, self.group, self.name)
        try:
            return await offsets.committed(self.partitions)
        finally:
            await offsets.aclose()


@pytest_asyncio.fixture
async def topic2(kafka_bootstrap: str) -> AsyncIterator[Topic]:
    topic = Topic(kafka_bootstrap, 2)
    await create_topic(kafka_bootstrap, topic.name, 2)
    yield topic


async def take(feed: Any, count: int) -> list[Message]:
    """The next ``count`` messages of a feed (it joins its group meanwhile)."""
    out: list[Message] = []
    with anyio.fail_after(60):  # only tells an answer from a hang
        while len(out) < count:
            out += await feed.fetch(count - len(out), 0.2)
    return out


async def until(feed: KafkaFeed, done: Any) -> None:
    """Fetch (serving the group's callbacks) until ``done()``; returns nothing fetched."""
    with anyio.fail_after(60):  # only tells an answer from a hang
        while not done():
            assert await feed.fetch(100, 0.1) == []


async def test_ingest_commits_each_partition_only_after_its_rows_are_durable(
    topic2: Topic, tmp_path: Path
) -> None:
    await topic2.produce(0, [row_json(i) for i in range(15)])
    await topic2.produce(1, [row_json(i) for i in range(15, 30)])
    ds = await mem_wal_table(tmp_path)
    unreadable: list[tuple[int, int]] = []
    commits: list[tuple[int, int]] = []
    async with ds.mem_wal_writer(new_shard()) as writer:
        feed = await topic2.member()
        commit = feed.consumer.commit

        async def rows_must_be_durable(*args: Any, offsets: Any, **kwargs: Any) -> Any:
            for tp in offsets:
                row_id = tp.offset - 1 + (15 if tp.partition == 1 else 0)  # its last record
                if (await writer.lsm.point_lookup(row_id)).num_rows != 1:
                    unreadable.append((tp.partition, tp.offset))
                commits.append((tp.partition, tp.offset))
            return await commit(*args, offsets=offsets, **kwargs)

        feed.consumer.commit = rows_must_be_durable  # a spy on the real consumer
        stop = anyio.Event()

        def progress(stats: la.feeds.IngestStats) -> None:
            if stats.messages == 30:
                stop.set()

        async with feed:
            recording = Recording(feed)
            stats = await ingest(
                recording, writer, max_batch=4, fetch_timeout=0.05, on_progress=progress, stop=stop
            )
        assert (stats.messages, stats.rows) == (30, 30)
        assert unreadable == []
        assert await lsm_rows(writer) == expected_rows(range(30))
    assert await topic2.committed() == {0: 15, 1: 15}
    for p in (0, 1):
        sent = [offset for part, offset in commits if part == p]
        # monotonic (the last offset sent without waiting is sent again, waiting, at close)
        assert sent == sorted(sent) and len(sent) - len(set(sent)) <= 1
        assert sent[-1] == 15


async def test_a_crash_before_the_ack_redelivers_from_the_committed_offset(
    topic2: Topic, tmp_path: Path
) -> None:
    await topic2.produce(0, [row_json(i) for i in range(15)])
    await topic2.produce(1, [row_json(i) for i in range(15, 30)])
    ds = await mem_wal_table(tmp_path)
    shard = new_shard()
    async with ds.mem_wal_writer(shard) as writer:
        async with await topic2.member() as feed:
            with anyio.CancelScope() as scope:
                crashing = CrashBeforeAck(feed, allow=10, scope=scope)
                await ingest(crashing, writer, max_batch=5, fetch_timeout=0.05)
        assert crashing.crashed_at is not None
        # durable, not acknowledged: written again after the restart
        assert (await writer.lsm.point_lookup(crashing.crashed_at.offset)).num_rows >= 0
    committed = await topic2.committed()
    assert sum(committed.values()) == 10

    # a new member of the group resumes at the committed offsets
    async with ds.mem_wal_writer(shard) as writer:
        async with await topic2.member() as feed:
            recording = Recording(feed)
            stop = anyio.Event()
            await ingest(
                recording,
                writer,
                fetch_timeout=0.05,
                on_progress=lambda s: stop.set() if s.messages >= 20 else None,
                stop=stop,
            )
        want = {(p, o) for p in (0, 1) for o in range(committed[p], 15)}
        assert {(o.partition, o.offset) for o in recording.offsets} == want
        rows = await lsm_rows(writer)
        assert rows == expected_rows(range(30))
    assert await topic2.committed() == {0: 15, 1: 15}


class Watched(KafkaFeed):
    """A KafkaFeed that says when a revocation begins (a seam for the test)."""

    revoking: anyio.Event

    async def revoke(self, partitions: Any, *, lost: bool = False) -> None:
        if partitions:
            self.revoking.set()
        await super().revoke(partitions, lost=lost)


#: For tests whose members must stay in the group through a rebalance on a
#: loaded machine: a stalled heartbeat of 2 s (FAST) lost a member its session,
#: and the group handed all its partitions to the other; a member that did
#: not poll for 10.4 s beside a soak overran a 10 s max.poll.interval.ms; at a
#: 5 s session a CI run still lost one (the other read both partitions).
STEADY = {"session.timeout.ms": 15000, "heartbeat.interval.ms": 500, "max.poll.interval.ms": 30000}


async def two_members(
    topic: Topic, group: dict[str, Any] = FAST, **options: Any
) -> tuple[Watched, list[Message]]:
    """Member a, alone in the group, with 6 records of each partition fetched
    and not acknowledged."""
    for p in (0, 1):
        await topic.produce(p, [row_json(10 * p + i) for i in range(6)])
    a = await Watched.connect(topic.bootstrap, [topic.name], topic.group, options=group, **options)
    a.revoking = anyio.Event()
    held = await take(a, 12)
    assert a.assigned == {(topic.name, 0), (topic.name, 1)}
    return a, held


async def test_a_revocation_waits_for_the_acks_in_flight_and_commits_them(
    topic2: Topic,
) -> None:
    """A second member joins: cooperative-sticky moves one partition, whose
    records a holds in flight; the revocation waits for their acks and commits
    them before the partition is handed over, so b starts after them."""
    seen: list[dict[int, int]] = []

    async def after(consumer: Any, partitions: Any) -> None:  # chained: after the commit
        seen.append(await topic2.committed())

    a, held = await two_members(topic2, revoke_timeout=60.0, on_revoke=after)
    b = await topic2.member()
    async with a, b:
        async with anyio.create_task_group() as tg:
            tg.start_soon(until, a, lambda: len(a.assigned) == 1)
            with anyio.fail_after(60):
                await a.revoking.wait()  # inside a's fetch, waiting for the acks
            for m in held:
                await m.ack()
        (kept,) = a.assigned
        moved = 1 - kept[1]
        assert a.fenced_acks == 0
        assert seen and seen[0][moved] == 6  # committed before the callback returned
        await topic2.produce(moved, [row_json(99)])
        fresh = await take(b, 1)  # b reads on from what a committed
    assert [(m.offset.partition, m.offset.offset) for m in fresh] == [(moved, 6)]


async def test_acks_after_the_revoke_timeout_are_fenced_and_the_next_owner_reads_them(
    topic2: Topic,
) -> None:
    """The moved partition's records are acknowledged only after its
    revocation gave up waiting: nothing of them is committed, and the new
    owner reads them again; the partition a keeps is never revoked, and its
    acks commit as usual."""
    a, held = await two_members(topic2, STEADY, revoke_timeout=0.05)
    b = await KafkaFeed.connect(topic2.bootstrap, [topic2.name], topic2.group, options=STEADY)
    async with a, b:
        # both keep polling until the rebalance has ended for both: a member that
        # stopped once its own share was settled served none of the cooperative
        # protocol's second round, overran max.poll.interval.ms and left the
        # group, and b was handed both partitions
        def settled() -> bool:
            return len(a.assigned) == 1 and len(b.assigned) == 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(until, a, settled)
            tg.start_soon(until, b, settled)
        (kept,) = a.assigned
        (moved,) = b.assigned
        epochs = a.epochs()
        for m in held:  # the slow writes end only now
            await m.ack()
        assert a.fenced_acks == 6
        assert epochs.get(kept, 0) == 0 and epochs[moved] == 1  # only the moved one revoked
        assert await a.commit() == {kept: 6}
        again = await take(b, 6)
    assert sorted(m.offset.offset for m in again) == list(range(6))
    assert {m.offset.partition for m in again} == {moved[1]}
    committed = await topic2.committed()
    assert committed[kept[1]] == 6 and committed[moved[1]] == 0


async def test_out_of_order_acks_commit_only_the_contiguous_prefix(topic2: Topic) -> None:
    await topic2.produce(0, [row_json(i) for i in range(5)])
    async with await topic2.member() as feed:
        m = await take(feed, 5)
        for i in (0, 1, 3, 4):
            await m[i].ack()
        assert await feed.commit() == {(topic2.name, 0): 2}  # not past offset 2
        assert feed.in_flight() == 1
        await m[2].ack()
        assert await feed.commit() == {(topic2.name, 0): 5}
        assert await feed.commit() == {}  # nothing new: never the same offset twice
    assert (await topic2.committed())[0] == 5


async def test_aclose_commits_what_was_acked_and_closes_its_consumer(topic2: Topic) -> None:
    await topic2.produce(1, [row_json(i) for i in range(5)])
    feed = await topic2.member()
    messages = await take(feed, 5)
    for m in messages[:3]:
        await m.ack()
    await feed.aclose()
    assert await topic2.committed() == {0: 0, 1: 3}
    assert feed.state is FeedState.CLOSED
    await feed.aclose()
    with pytest.raises(la.ClosedError):
        await feed.fetch(1, 0.1)
    with pytest.raises(la.ClosedError):
        await messages[3].ack()
    with pytest.raises(RuntimeError, match="closed"):  # the consumer was closed with it
        await feed.consumer.assignment()


async def test_record_values_headers_and_offsets(topic2: Topic) -> None:
    await topic2.produce(0, [row_json(1), None, b"text"], headers={"trace": "abc"})
    async with await topic2.member() as feed:
        m = await take(feed, 3)
        assert [x.payload for x in m] == [row_json(1), b"", b"text"]  # a tombstone has no rows
        assert m[0].headers == {"trace": b"abc"}
        assert m[2].offset == KafkaOffset(topic2.name, 0, 2)
        assert not feed.exhausted


async def test_regression_an_undecodable_record_value_is_a_sticky_decode_error(
    topic2: Topic, tmp_path: Path
) -> None:
    """A consumer whose value deserializer returns a dict: the fetch that meets
    it hands nothing out, the feed stays failed, nothing passes the bad record."""
    from confluent_kafka.aio import AsyncDeserializingConsumer

    from lance_async.feeds.kafkaclient import consumer_config

    await topic2.produce(0, [row_json(0), row_json(1)])
    config = consumer_config(topic2.bootstrap, topic2.group, options=FAST)
    config["value.deserializer"] = lambda value, ctx: (
        json.loads(value) if value[:1] == b"[" else value
    )
    await topic2.produce(0, [b"[1]", row_json(3)])
    consumer = await AsyncDeserializingConsumer(config)
    feed = KafkaFeed(consumer, close_consumer=True)
    await feed.subscribe([topic2.name])
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer, feed:
        first = await take(feed, 2)
        for m in first:
            await m.ack()
        with pytest.raises(la.DecodeError, match="list") as info:
            await take(feed, 2)
        assert info.value.offset == KafkaOffset(topic2.name, 0, 2)
        assert feed.in_flight() == 0  # nothing of the failed fetch was handed out
        with pytest.raises(la.DecodeError):  # the feed stays failed
            await feed.fetch(100, 0.1)
        with pytest.raises(la.DecodeError):
            await ingest(feed, writer, idle_timeout=0.3)
    assert (await topic2.committed())[0] == 2  # never past the bad record


async def test_a_feed_with_no_broker_for_retry_for_seconds_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka retries for ever; the feed gives up after ``retry_for``."""
    feed = await KafkaFeed.connect(
        f"127.0.0.1:{free_port()}", ["t"], "g", options=FAST, retry_for=0.5
    )
    async with feed:
        with pytest.raises(KafkaException) as info, anyio.fail_after(60):
            while True:
                assert await feed.fetch(10, 0.2) == []
    # the feed's broker watch gave up, not another error: it warned once, and
    # raises librdkafka's own "no broker" error
    assert caplog.text.count("no Kafka broker answers") == 1, caplog.text
    assert info.value.args[0].code() in NO_BROKER


async def test_consumer_settings_are_cooperative_and_commit_nothing_by_themselves() -> None:
    from lance_async.feeds.kafkaclient import consumer_config

    classic = consumer_config("b:9092", "g", client_id="w1", options={"session_timeout_ms": 3000})
    assert classic["partition.assignment.strategy"] == "cooperative-sticky"
    assert classic["enable.auto.commit"] is False and classic["enable.auto.offset.store"] is False
    assert (classic["session.timeout.ms"], classic["client.id"]) == (3000, "w1")
    kip848 = consumer_config("b:9092", "g", protocol="consumer")
    assert kip848["group.protocol"] == "consumer"
    assert "partition.assignment.strategy" not in kip848
    with pytest.raises(ValueError, match="set by the broker"):
        consumer_config("b:9092", "g", protocol="consumer", options={"session.timeout.ms": 1})
    with pytest.raises(ValueError, match="never automatically"):
        consumer_config("b:9092", "g", options={"enable_auto_commit": "true"})
    with pytest.raises(ValueError, match="protocol must be one of"):
        consumer_config("b:9092", "g", protocol="eager")


async def test_regression_a_commit_sent_and_never_confirmed_is_sent_again() -> None:
    """Under chaos the group refused the last asynchronous commits of a
    partition during a rebalance; nothing new arrived to move its watermark,
    so nothing was ever sent again, and the group's offsets stayed behind
    records that were durable (the backlog never drained, 230 s)."""
    from lance_async.feeds.kafkaoffsets import CONFIRM, PartitionOffsets

    part = PartitionOffsets(("t", 0), 0, feed=None)
    for offset in range(3):
        part.hand_out(offset)
    assert part.ack(0) and part.ack(2) and not part.ack(7)
    part.advance()
    assert part.watermark == 1 and part.in_flight() == 1  # not past the unacked 1
    assert part.due("sent", now=0.0)
    part.was_sent(1, now=0.0)
    assert not part.due("sent", now=CONFIRM / 2)  # sent, not yet confirmed: wait
    assert part.due("sent", now=CONFIRM + 1)  # never confirmed: send it again
    part.was_sent(1, now=10.0)
    part.refused()  # the group said no: at the next fetch
    assert part.due("sent", now=10.0)
    part.was_sent(1, now=10.0)
    part.confirmed(1)
    assert not part.due("sent", now=100.0) and not part.due("committed", now=100.0)
