"""KafkaFeed, tested against a FAKE aiokafka consumer (no Kafka broker runs here).

``FakeConsumer`` implements exactly the ``AIOKafkaConsumer`` calls KafkaFeed
makes -- ``getmany(timeout_ms=, max_records=)``, ``commit(offsets)``,
``assignment()``, ``stop()``, and the ``pause()`` / ``resume()`` of a
Kafka worker's dispatcher -- with aiokafka's own record and offset types
and its rules (a commit for an unassigned partition raises
``IllegalStateError``; after a rebalance positions restart at the committed
offsets), and ``rebalance()`` drives the listener as aiokafka's group
coordinator does: ``on_partitions_revoked(previous assignment)`` while the
partitions are still assigned, then the new assignment, then
``on_partitions_assigned``. The writes go to a real Lance MemWAL table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition

import lance_async as la
from lance_async.feeds import Feed, FeedState, KafkaFeed, KafkaOffset, ingest

from .support import (
    CrashBeforeAck,
    Recording,
    expected_rows,
    lsm_rows,
    mem_wal_table,
    new_shard,
    row_json,
)

P0 = TopicPartition("events", 0)
P1 = TopicPartition("events", 1)


class FakeBroker:
    """Partition logs and one consumer group's committed offsets, in memory."""

    def __init__(self) -> None:
        self.logs: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
        self.committed: dict[TopicPartition, int] = {}
        self.commit_log: list[tuple[TopicPartition, int]] = []

    def produce(self, tp: TopicPartition, values: list[Any], headers: Any = ()) -> list[int]:
        log = self.logs.setdefault(tp, [])
        offsets = []
        for value in values:
            offset = len(log)
            log.append(
                ConsumerRecord(
                    tp.topic, tp.partition, offset, 0, 0, None, value, None, 0, 0, tuple(headers)
                )
            )
            offsets.append(offset)
        return offsets


class FakeConsumer:
    """The AIOKafkaConsumer calls KafkaFeed uses (see the module docstring)."""

    def __init__(
        self,
        broker: FakeBroker,
        assignment: set[TopicPartition],
        before_commit: Callable[[dict[TopicPartition, Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.broker = broker
        self._assigned = set(assignment)
        self._positions = {tp: broker.committed.get(tp, 0) for tp in assignment}
        self.listener: Any = None
        self.before_commit = before_commit
        self.fail_commits = 0
        self.stopped = False
        self.revoking = False
        self.commits_while_revoking: list[tuple[TopicPartition, int]] = []
        self._paused: set[TopicPartition] = set()
        self.pauses = 0

    def subscribe(self, topics: list[str], listener: Any) -> None:
        assert isinstance(listener, ConsumerRebalanceListener)  # aiokafka checks this too
        self.listener = listener

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def pause(self, *tps: TopicPartition) -> None:
        for tp in tps:
            if tp not in self._assigned:
                raise IllegalStateError(f"No current assignment for partition {tp}")
            self.pauses += tp not in self._paused
            self._paused.add(tp)

    def resume(self, *tps: TopicPartition) -> None:
        for tp in tps:
            if tp not in self._assigned:
                raise IllegalStateError(f"No current assignment for partition {tp}")
            self._paused.discard(tp)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        assert not partitions
        with anyio.move_on_after(timeout_ms / 1000):
            while True:
                out: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
                room = max_records or 1_000_000
                for tp in sorted(self._assigned - self._paused):
                    pos = self._positions[tp]
                    records = self.broker.logs.get(tp, [])[pos : pos + room]
                    if records:
                        out[tp] = records
                        self._positions[tp] = pos + len(records)
                        room -= len(records)
                    if room == 0:
                        break
                if out:
                    return out
                await anyio.sleep(0.01)
        return {}

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        for tp, value in offsets.items():
            if tp not in self._assigned:
                raise IllegalStateError(f"Partition {tp} is not assigned")
            assert isinstance(value, OffsetAndMetadata)
        if self.fail_commits:
            self.fail_commits -= 1
            raise CommitFailedError()
        if self.before_commit is not None:
            await self.before_commit(offsets)
        for tp, value in offsets.items():
            self.broker.committed[tp] = value.offset
            self.broker.commit_log.append((tp, value.offset))
            if self.revoking:
                self.commits_while_revoking.append((tp, value.offset))

    async def stop(self) -> None:
        self.stopped = True

    async def rebalance(self, new_assignment: set[TopicPartition]) -> None:
        """What aiokafka's coordinator does on a rebalance (eager protocol)."""
        self.revoking = True
        try:
            await self.listener.on_partitions_revoked(self.assignment())
        finally:
            self.revoking = False
        self._assigned = set(new_assignment)
        self._paused = set()  # a new assignment starts unpaused (aiokafka's too)
        self._positions = {tp: self.broker.committed.get(tp, 0) for tp in new_assignment}
        await self.listener.on_partitions_assigned(self.assignment())

    def unassign_silently(self, tp: TopicPartition) -> None:
        """The assignment changed with no listener call (a user-managed assignment)."""
        self._assigned.discard(tp)


def subscribed(consumer: FakeConsumer, **options: Any) -> KafkaFeed:
    feed = KafkaFeed(consumer, **options)
    consumer.subscribe(["events"], listener=feed.rebalance_listener)
    return feed


def offsets_per_partition(log: list[tuple[TopicPartition, int]]) -> dict[TopicPartition, list[int]]:
    out: dict[TopicPartition, list[int]] = {}
    for tp, offset in log:
        out.setdefault(tp, []).append(offset)
    return out


@pytest.mark.asyncio
async def test_ingest_commits_each_partition_only_after_its_rows_are_written(
    tmp_path: Path,
) -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(i) for i in range(15)])
    broker.produce(P1, [row_json(i) for i in range(15, 30)])
    ds = await mem_wal_table(tmp_path)
    unreadable: list[tuple[TopicPartition, int]] = []
    async with ds.mem_wal_writer(new_shard()) as writer:

        async def rows_must_be_readable(offsets: dict[TopicPartition, Any]) -> None:
            for tp, om in offsets.items():
                row_id = om.offset - 1 + (15 if tp == P1 else 0)  # the last committed record
                if (await writer.lsm_point_lookup(row_id)).num_rows != 1:
                    unreadable.append((tp, om.offset))

        consumer = FakeConsumer(broker, {P0, P1}, before_commit=rows_must_be_readable)
        async with subscribed(consumer) as feed:
            recording = Recording(feed)
            stats = await ingest(
                recording, writer, max_batch=4, fetch_timeout=0.05, idle_timeout=0.3
            )
            assert feed.committed == {P0: 15, P1: 15}
        assert (stats.messages, stats.rows) == (30, 30)
        assert unreadable == []
        assert recording.offsets[0] == KafkaOffset("events", 0, 0)
        assert await lsm_rows(writer) == expected_rows(range(30))
    assert broker.committed == {P0: 15, P1: 15}
    per_partition = offsets_per_partition(broker.commit_log)
    for offsets in per_partition.values():
        assert offsets == sorted(set(offsets))  # monotonic, in order, never repeated
        assert offsets[-1] == 15
        assert len(offsets) > 1  # one commit per fetch, not one at the end


@pytest.mark.asyncio
async def test_a_crash_before_the_commit_redelivers_from_the_committed_offset(
    tmp_path: Path,
) -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(i) for i in range(15)])
    broker.produce(P1, [row_json(i) for i in range(15, 30)])
    ds = await mem_wal_table(tmp_path)
    shard = new_shard()
    async with ds.mem_wal_writer(shard) as writer:
        async with subscribed(FakeConsumer(broker, {P0, P1})) as feed:
            with anyio.CancelScope() as scope:
                crashing = CrashBeforeAck(feed, allow=10, scope=scope)
                await ingest(crashing, writer, max_batch=5, fetch_timeout=0.05)
        assert crashing.crashed_at == KafkaOffset("events", 0, 10)
        assert (await writer.lsm_point_lookup(10)).num_rows == 1  # durable, not committed
    assert broker.committed == {P0: 10}

    # restart: a new consumer of the group resumes at the committed offsets
    async with ds.mem_wal_writer(shard) as writer:
        async with subscribed(FakeConsumer(broker, {P0, P1})) as feed:
            recording = Recording(feed)
            stats = await ingest(recording, writer, fetch_timeout=0.05, idle_timeout=0.3)
        assert sorted(recording.offsets) == [KafkaOffset("events", 0, o) for o in range(10, 15)] + [
            KafkaOffset("events", 1, o) for o in range(15)
        ]
        assert stats.messages == 20
        rows = await lsm_rows(writer)
        assert rows == expected_rows(range(30))
        assert len({r["id"] for r in rows}) == len(rows)
    assert broker.committed == {P0: 15, P1: 15}
    for offsets in offsets_per_partition(broker.commit_log).values():
        assert offsets == sorted(set(offsets))


@pytest.mark.asyncio
async def test_a_revocation_waits_for_in_flight_acks_and_commits_them() -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(i) for i in range(6)])
    consumer = FakeConsumer(broker, {P0})
    # a timeout far past the acks: the revocation must end on them, not on it
    feed = subscribed(consumer, revoke_timeout=60.0)
    messages = await feed.fetch(100, 0.1)
    assert feed.in_flight() == 6
    async with anyio.create_task_group() as tg:
        started = anyio.current_time()
        tg.start_soon(consumer.rebalance, {P1})
        await anyio.sleep(0.2)  # the "writes" finish while the revocation waits
        for m in messages:
            await m.ack()
    waited = anyio.current_time() - started
    assert 0.15 < waited < 30.0  # ended by the acks (at 0.2 s), not the 60 s timeout
    assert consumer.commits_while_revoking == [(P0, 6)]  # committed before P0 was handed over
    assert broker.committed == {P0: 6}
    assert feed.in_flight() == 0 and feed.fenced_acks == 0
    await feed.aclose()


@pytest.mark.asyncio
async def test_acks_after_the_revoke_timeout_are_fenced_and_the_records_come_again() -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(i) for i in range(6)])
    consumer = FakeConsumer(broker, {P0})
    feed = subscribed(consumer, revoke_timeout=0.2)
    stale = await feed.fetch(100, 0.1)
    started = anyio.current_time()
    await consumer.rebalance({P0})  # eager rebalance: P0 revoked, then assigned back
    # waited for the revoke timeout, then went on (the bound only tells it from a hang)
    assert 0.15 < anyio.current_time() - started < 30
    for m in stale:  # the slow writes finish only now
        await m.ack()
    assert feed.fenced_acks == 6
    assert broker.commit_log == []  # nothing committed for them...
    again = await feed.fetch(100, 0.1)  # ...so they are delivered again
    assert [m.offset.offset for m in again] == list(range(6))
    for m in again:
        await m.ack()
    assert broker.committed == {P0: 6}
    await feed.aclose()


@pytest.mark.asyncio
async def test_only_partitions_still_assigned_are_committed() -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(i) for i in range(3)])
    broker.produce(P1, [row_json(i) for i in range(3, 6)])
    consumer = FakeConsumer(broker, {P0, P1})
    async with subscribed(consumer) as feed:
        messages = await feed.fetch(100, 0.1)
        consumer.unassign_silently(P1)
        for m in messages:
            await m.ack()
        assert feed.skipped_commits == 1
    assert broker.committed == {P0: 3}


@pytest.mark.asyncio
async def test_out_of_order_acks_commit_only_the_contiguous_prefix() -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(i) for i in range(5)])
    consumer = FakeConsumer(broker, {P0})
    async with subscribed(consumer) as feed:
        m = await feed.fetch(100, 0.1)
        for i in (0, 1, 3, 4):  # 4 is the fetch's last record: it triggers a commit
            await m[i].ack()
        assert broker.commit_log == [(P0, 2)]  # not past the unacknowledged offset 2
        assert feed.in_flight() == 1
        await m[2].ack()
        assert broker.commit_log == [(P0, 2), (P0, 5)]


@pytest.mark.asyncio
async def test_a_failed_commit_is_skipped_and_retried_later() -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(i) for i in range(3)])
    consumer = FakeConsumer(broker, {P0})
    async with subscribed(consumer) as feed:
        consumer.fail_commits = 1
        for m in await feed.fetch(100, 0.1):
            await m.ack()  # the group "rebalanced": logged, not raised
        assert feed.skipped_commits == 1 and broker.commit_log == []
        assert await feed.commit() == {P0: 3}
        assert await feed.commit() == {}  # nothing new: never the same offset twice
    assert broker.commit_log == [(P0, 3)]


@pytest.mark.asyncio
async def test_aclose_commits_what_was_acked_and_can_stop_the_consumer() -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(i) for i in range(5)])
    consumer = FakeConsumer(broker, {P0})
    feed = subscribed(consumer, stop_consumer=True)
    messages = await feed.fetch(100, 0.1)
    for m in messages[:3]:
        await m.ack()
    assert broker.commit_log == []  # no commit point reached yet
    await feed.aclose()
    assert broker.commit_log == [(P0, 3)]
    assert consumer.stopped
    assert feed.state is FeedState.CLOSED
    await feed.aclose()
    with pytest.raises(la.ClosedError):
        await feed.fetch(1, 0.1)
    with pytest.raises(la.ClosedError):
        await messages[3].ack()


@pytest.mark.asyncio
async def test_a_chained_listener_runs_after_the_feeds_commit() -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(i) for i in range(2)])
    calls: list[tuple[str, set[TopicPartition], dict[TopicPartition, int]]] = []

    class Mine(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            calls.append(("revoked", set(revoked), dict(broker.committed)))

        async def on_partitions_assigned(self, assigned: Any) -> None:
            calls.append(("assigned", set(assigned), dict(broker.committed)))

    consumer = FakeConsumer(broker, {P0})
    feed = subscribed(consumer, listener=Mine(), revoke_timeout=1.0)
    messages = await feed.fetch(100, 0.1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer.rebalance, {P0, P1})
        for m in messages:
            await m.ack()
    assert calls == [("revoked", {P0}, {P0: 2}), ("assigned", {P0, P1}, {P0: 2})]
    await feed.aclose()


@pytest.mark.asyncio
async def test_record_values_headers_and_offsets() -> None:
    broker = FakeBroker()
    broker.produce(P0, [row_json(1), None, "text"], headers=[("trace", b"abc")])
    broker.produce(P1, [12345])
    consumer = FakeConsumer(broker, {P0})
    async with subscribed(consumer, revoke_timeout=0.05) as feed:
        assert isinstance(feed, Feed)
        assert not feed.exhausted
        m = await feed.fetch(100, 0.1)
        assert [x.payload for x in m] == [row_json(1), b"", b"text"]  # a tombstone has no rows
        assert m[0].headers == {"trace": b"abc"}
        assert m[2].offset == KafkaOffset("events", 0, 2)
        assert m[2].offset.partition == 0
        await consumer.rebalance({P1})
        with pytest.raises(la.DecodeError, match="value_deserializer") as info:
            await feed.fetch(100, 0.1)
        assert info.value.offset == KafkaOffset("events", 1, 0)


@pytest.mark.asyncio
async def test_regression_an_undecodable_record_value_is_a_sticky_decode_error(
    tmp_path: Path,
) -> None:
    # a value_deserializer returning a dict raised a bare TypeError mid-fetch, after
    # the records before it in the fetch were registered as handed out
    broker = FakeBroker()
    broker.produce(P0, [row_json(0), row_json(1)])
    broker.produce(P0, [{"id": 2}])  # what a JSON value_deserializer would return
    broker.produce(P0, [row_json(3)])
    consumer = FakeConsumer(broker, {P0})
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer:
        feed = subscribed(consumer, revoke_timeout=0.05)
        first = await feed.fetch(2, 0.1)
        assert [m.offset.offset for m in first] == [0, 1]
        for m in first:
            await m.ack()
        with pytest.raises(la.DecodeError) as info:
            await ingest(feed, writer, idle_timeout=0.3)
        assert info.value.offset == KafkaOffset("events", 0, 2)
        assert "dict" in str(info.value)
        assert feed.in_flight() == 0  # nothing of the failed fetch was handed out
        with pytest.raises(la.DecodeError):  # the feed stays failed
            await feed.fetch(100, 0.1)
        await feed.aclose()
    assert broker.committed == {P0: 2}  # never past the bad record
