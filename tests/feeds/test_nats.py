"""JetStreamFeed against the real NATS JetStream server on 127.0.0.1:4222 (asyncio only)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
import pytest_asyncio
import trio
from nats.js.client import JetStreamContext

import lance_async as la
from lance_async.feeds import Feed, FeedState, JetStreamFeed, Message, ingest

from ..conftest import broker_or_skip
from .support import (
    CrashBeforeAck,
    Recording,
    expected_rows,
    lsm_rows,
    mem_wal_table,
    new_shard,
    row_json,
)

pytestmark = pytest.mark.broker

URL = "nats://127.0.0.1:4222"


@dataclass
class Stream:
    name: str
    subject: str
    js: JetStreamContext

    async def publish(self, payloads: list[bytes]) -> list[int]:
        return [(await self.js.publish(self.subject, p)).seq for p in payloads]

    async def consumer(self, durable: str) -> Any:
        return await self.js.consumer_info(self.name, durable)

    async def settled(self, durable: str, acked_through: int) -> Any:
        """The consumer's info once the server has applied the acks up to
        stream sequence ``acked_through`` (up to about 2 s). ``ack()``
        publishes without waiting for the server, and this query comes on
        another connection, so it can overtake the last acks."""
        for _ in range(100):
            info = await self.consumer(durable)
            if info.ack_floor.stream_seq >= acked_through:
                return info
            await anyio.sleep(0.02)
        return info


@pytest_asyncio.fixture
async def stream() -> AsyncIterator[Stream]:
    broker_or_skip("NATS JetStream", 4222)
    name = f"LA_{uuid.uuid4().hex}"
    nc = await nats.connect(URL)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.rows"])
    try:
        yield Stream(name, f"{name}.rows", js)
    finally:
        await js.delete_stream(name)
        await nc.close()


@pytest.mark.asyncio
async def test_ingest_acks_each_message_after_its_rows_are_written(
    stream: Stream, tmp_path: Path
) -> None:
    payloads = [row_json(i) for i in range(28)] + [row_json(28) + b"\n" + row_json(29)]
    seqs = await stream.publish(payloads)
    ds = await mem_wal_table(tmp_path)
    async with (
        ds.mem_wal_writer(new_shard()) as writer,
        await JetStreamFeed.connect(
            URL, stream=stream.name, subject=stream.subject, durable="ingest"
        ) as feed,
    ):
        recording = Recording(feed)
        stats = await ingest(recording, writer, max_batch=8, fetch_timeout=0.2, idle_timeout=0.3)
        assert recording.offsets == seqs  # offsets are stream sequences, in order
        assert (stats.messages, stats.rows) == (29, 30)
        assert (feed.fetched, feed.acked) == (29, 29)
        assert await lsm_rows(writer) == expected_rows(range(30))
    info = await stream.settled("ingest", seqs[-1])
    assert (info.num_ack_pending, info.num_pending) == (0, 0)
    assert info.ack_floor.stream_seq == seqs[-1]
    assert info.config.ack_policy == "explicit"


@pytest.mark.asyncio
async def test_fetch_times_out_empty_and_an_unacked_message_comes_back(stream: Stream) -> None:
    seqs = await stream.publish([row_json(1), row_json(2)])
    async with await JetStreamFeed.connect(
        URL, stream=stream.name, subject=stream.subject, durable="d", ack_wait=1.0
    ) as feed:
        first = await feed.fetch(10, 0.5)
        assert [m.offset for m in first] == seqs
        assert first[0].payload == row_json(1)
        await first[0].ack()
        with anyio.fail_after(2):
            assert await feed.fetch(10, 0.1) == []  # nothing new; 2 not yet redelivered
        with anyio.fail_after(3):
            again: list[Message] = []
            while not again:
                again = await feed.fetch(10, 0.2)
        assert [m.offset for m in again] == [seqs[1]]  # only the unacknowledged one
        await again[0].ack()
    info = await stream.settled("d", seqs[-1])
    assert info.num_ack_pending == 0
    assert info.config.ack_wait == 1.0


@pytest.mark.asyncio
async def test_a_taken_over_durable_never_hands_out_an_old_message_after_newer_ones(
    stream: Stream,
) -> None:
    """ack_wait runs out while the first copies are in flight (a slow write
    under load): JetStream delivers them again behind newer messages.
    Handing them out would write old versions over newer ones (the chaos
    test's stale keys); the feed holds them back and acks them with the
    originals."""
    old = await stream.publish([row_json(1), row_json(2)])
    async with await JetStreamFeed.connect(
        URL,
        stream=stream.name,
        subject=stream.subject,
        durable="d",
        ack_wait=1.0,
        take_over=True,
    ) as feed:
        first = await feed.fetch(10, 0.5)
        assert [m.offset for m in first] == old
        new = await stream.publish([row_json(3)])
        handed: list[Message] = []
        with anyio.fail_after(20):  # only stops a hung test
            while feed.held_back < len(old):  # the server redelivers after ack_wait
                handed += await feed.fetch(10, 0.2)
        assert [m.offset for m in handed] == new  # never an old one again
        for m in [*first, *handed]:
            await m.ack()  # the originals' acks settle the held-back copies too
    info = await stream.settled("d", new[-1])
    assert (info.num_ack_pending, info.num_pending) == (0, 0)


@pytest.mark.asyncio
async def test_a_crash_between_write_and_ack_redelivers_without_duplicates(
    stream: Stream, tmp_path: Path
) -> None:
    seqs = await stream.publish([row_json(i) for i in range(30)])
    ds = await mem_wal_table(tmp_path)
    shard = new_shard()
    connect = dict(stream=stream.name, subject=stream.subject, durable="crashy", ack_wait=1.0)
    async with ds.mem_wal_writer(shard) as writer:
        async with await JetStreamFeed.connect(URL, **connect) as feed:  # type: ignore[arg-type]
            with anyio.CancelScope() as scope:
                crashing = CrashBeforeAck(feed, allow=10, scope=scope)
                await ingest(crashing, writer, max_batch=5, fetch_timeout=0.2)
        assert crashing.acked == seqs[:10]
        assert crashing.crashed_at == seqs[10]
        # the message that "crashed" had its rows durable before its ack
        assert (await writer.lsm.point_lookup(10)).num_rows == 1
    info = await stream.settled("crashy", seqs[9])
    assert info.ack_floor.stream_seq == seqs[9]  # the server saw exactly the ten acks

    # restart: a new connection on the same durable, the same shard (its WAL replays)
    async with ds.mem_wal_writer(shard) as writer:
        assert (await writer.lsm.point_lookup(10)).num_rows == 1
        async with await JetStreamFeed.connect(URL, **connect) as feed:  # type: ignore[arg-type]
            recording = Recording(feed)
            stats = await ingest(recording, writer, fetch_timeout=0.2, idle_timeout=1.5)
        # after ack_wait the server redelivers what was never acknowledged; a
        # message whose ack took longer than ack_wait (1 s) on a loaded machine
        # comes once more (JetStream is at least once: CI saw it): rows stay unique
        assert sorted(set(recording.offsets)) == seqs[10:]
        assert stats.messages == len(recording.offsets) >= 20
        rows = await lsm_rows(writer)
        assert rows == expected_rows(range(30))
        assert len({r["id"] for r in rows}) == len(rows)
    info = await stream.settled("crashy", seqs[-1])
    assert (info.num_ack_pending, info.num_pending) == (0, 0)


@pytest.mark.asyncio
async def test_a_dead_letter_is_acked_with_its_sequence(stream: Stream, tmp_path: Path) -> None:
    seqs = await stream.publish([row_json(0), b"{broken", row_json(2)])
    letters: list[Any] = []
    ds = await mem_wal_table(tmp_path)
    async with (
        ds.mem_wal_writer(new_shard()) as writer,
        await JetStreamFeed.connect(
            URL, stream=stream.name, subject=stream.subject, durable="dl", ack_wait=1.0
        ) as feed,
    ):
        stats = await ingest(
            feed,
            writer,
            dead_letter=lambda m, e: letters.append((m.offset, type(e))),
            fetch_timeout=0.2,
            idle_timeout=0.3,
        )
        assert letters == [(seqs[1], la.DecodeError)]
        assert (stats.messages, stats.dead_letters, stats.rows) == (3, 1, 2)
    info = await stream.settled("dl", seqs[-1])
    assert (info.num_ack_pending, info.ack_floor.stream_seq) == (0, seqs[-1])


@pytest.mark.asyncio
async def test_without_a_hook_the_bad_message_stays_unacked(stream: Stream, tmp_path: Path) -> None:
    seqs = await stream.publish([b"{broken"])
    ds = await mem_wal_table(tmp_path)
    async with (
        ds.mem_wal_writer(new_shard()) as writer,
        await JetStreamFeed.connect(
            URL, stream=stream.name, subject=stream.subject, durable="strict", ack_wait=5.0
        ) as feed,
    ):
        with pytest.raises(la.DecodeError) as info:
            await ingest(feed, writer, fetch_timeout=0.2, idle_timeout=0.3)
        assert info.value.offset == seqs[0]
    consumer = await stream.consumer("strict")
    assert consumer.num_ack_pending == 1


@pytest.mark.asyncio
async def test_create_stream_life_cycle_and_closed_errors() -> None:
    broker_or_skip("NATS JetStream", 4222)
    name = f"LA_{uuid.uuid4().hex}"
    nc = await nats.connect(URL)
    js = nc.jetstream()
    feed = await JetStreamFeed.connect(
        URL, stream=name, subject=f"{name}.x", durable="d", create_stream=True
    )
    try:
        assert isinstance(feed, Feed)
        opened = feed.state  # not feed.state narrowed: mypy would keep it past aclose()
        assert opened is FeedState.OPEN
        assert not feed.exhausted
        assert (await js.stream_info(name)).config.subjects == [f"{name}.x"]
        await js.publish(f"{name}.x", row_json(5))
        (message,) = await feed.fetch(5, 1.0)
        assert message.offset == 1
    finally:
        await feed.aclose()
        await js.delete_stream(name)
        await nc.close()
    await feed.aclose()  # twice is fine
    assert feed.state is FeedState.CLOSED
    with pytest.raises(la.ClosedError):
        await feed.fetch(1, 0.1)
    with pytest.raises(la.ClosedError):
        await message.ack()


@pytest.mark.asyncio
async def test_a_missing_stream_raises_and_closes_the_connection() -> None:
    broker_or_skip("NATS JetStream", 4222)
    with pytest.raises(nats.js.errors.NotFoundError):
        await JetStreamFeed.connect(
            URL, stream=f"LA_{uuid.uuid4().hex}", subject="nowhere.x", durable="d"
        )


def test_connect_on_trio_says_asyncio_only() -> None:
    async def main() -> None:
        await JetStreamFeed.connect(URL, stream="s", subject="s.x", durable="d")

    with pytest.raises(la.LanceAsyncError, match="asyncio only"):
        trio.run(main)


@pytest.mark.asyncio
async def test_ack_sync_waits_for_the_server(stream: Stream) -> None:
    seqs = await stream.publish([row_json(1), row_json(2)])
    async with await JetStreamFeed.connect(
        URL, stream=stream.name, subject=stream.subject, durable="sync", ack_sync=True
    ) as feed:
        messages = await feed.fetch(10, 0.5)
        for m in messages:
            await m.ack()
        # no flush or close needed: the server confirmed each ack before ack() returned
        info = await stream.consumer("sync")
        assert (info.num_ack_pending, info.ack_floor.stream_seq) == (0, seqs[-1])
