"""RedisStreamFeed against the real Redis server on 127.0.0.1:6379 (asyncio only)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio
import redis.asyncio
import trio
from redis.typing import EncodableT, FieldT

import lance_async as la
from lance_async.feeds import Feed, FeedState, Message, RedisStreamFeed, ingest

from ..conftest import broker_or_skip
from ..helpers import eventually
from .support import (
    CrashBeforeAck,
    Recording,
    entry_id,
    expected_rows,
    lsm_rows,
    mem_wal_table,
    new_shard,
    row_json,
)

pytestmark = pytest.mark.broker

URL = "redis://127.0.0.1:6379"


def entry_order(entry_id: str) -> tuple[int, int]:
    """A Redis stream entry id (``"<ms>-<seq>"``) as numbers: ids sort as
    XADD made them, which their text does not once a millisecond holds ten."""
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


@dataclass
class Stream:
    key: str
    client: redis.asyncio.Redis

    async def add(self, payloads: list[bytes], **extra: bytes) -> list[str]:
        ids = []
        for p in payloads:
            fields: dict[FieldT, EncodableT] = {"data": p}
            fields.update(extra.items())
            ids.append(entry_id(await self.client.xadd(self.key, fields)))
        return ids

    async def pending(self, group: str = "g") -> dict[str, int]:
        """Pending (delivered, unacknowledged) entries per consumer."""
        summary: Any = await self.client.xpending(self.key, group)
        return {c["name"].decode(): int(c["pending"]) for c in summary["consumers"]}

    def feed(self, consumer: str, **options: Any) -> Any:
        return RedisStreamFeed.connect(
            URL, stream=self.key, group="g", consumer=consumer, **options
        )


@pytest_asyncio.fixture
async def stream() -> AsyncIterator[Stream]:
    broker_or_skip("Redis", 6379)
    client = redis.asyncio.Redis.from_url(URL)
    key = f"lance_async:test:{uuid.uuid4().hex}"
    try:
        yield Stream(key, client)
    finally:
        await client.delete(key)
        await client.aclose()


async def crash_after(
    stream: Stream, ds: la.AsyncDataset, shard: str, consumer: str, allow: int
) -> tuple[CrashBeforeAck, int]:
    """Ingest as ``consumer`` until the ack after ``allow`` acks, then "die".

    Returns the crash injector and how many entries the feed had fetched.
    """
    async with ds.mem_wal_writer(shard) as writer, await stream.feed(consumer) as feed:
        with anyio.CancelScope() as scope:
            crashing = CrashBeforeAck(feed, allow=allow, scope=scope)
            await ingest(crashing, writer, max_batch=5, fetch_timeout=0.1)
        # the message that "crashed" had its rows durable before its ack
        assert (await writer.lsm.point_lookup(allow)).num_rows == 1
        assert crashing.crashed_at is not None
        return crashing, feed.fetched


@pytest.mark.asyncio
async def test_ingest_acks_each_entry_after_its_rows_are_written(
    stream: Stream, tmp_path: Path
) -> None:
    ids = await stream.add([row_json(i) for i in range(29)])
    ids += await stream.add([row_json(29)], source=b"sensor-7")
    ds = await mem_wal_table(tmp_path)
    seen: list[Message] = []
    async with ds.mem_wal_writer(new_shard()) as writer, await stream.feed("c1") as feed:
        recording = Recording(feed)
        stats = await ingest(recording, writer, max_batch=8, fetch_timeout=0.1, idle_timeout=0.3)
        assert recording.offsets == ids  # offsets are entry ids, in stream order
        assert (stats.messages, stats.rows) == (30, 30)
        assert (feed.fetched, feed.acked, feed.in_flight) == (30, 30, 0)
        assert await lsm_rows(writer) == expected_rows(range(30))
        # headers carry the entry's other fields
        await stream.client.xadd(stream.key, {"data": row_json(30), "source": b"s"})
        (message,) = await feed.fetch(5, 1.0)
        seen.append(message)
        await message.ack()
    assert seen[0].headers == {"source": b"s"}
    assert await stream.pending() == {}


@pytest.mark.asyncio
async def test_ingest_acks_a_micro_batch_with_one_xack(stream: Stream, tmp_path: Path) -> None:
    await stream.add([row_json(i) for i in range(400)])
    ds = await mem_wal_table(tmp_path)

    async def xack_calls() -> int:
        stats = await stream.client.info("commandstats")
        return int(stats.get("cmdstat_xack", {}).get("calls", 0))

    before = await xack_calls()
    async with ds.mem_wal_writer(new_shard()) as writer, await stream.feed("c1") as feed:
        stats = await ingest(feed, writer, max_batch=400, fetch_timeout=0.1, idle_timeout=0.3)
        assert (stats.messages, feed.acked, feed.in_flight) == (400, 400, 0)
    assert await stream.pending() == {}
    # one XACK per micro-batch, not one per entry (other clients of this
    # Redis may add a few of their own meanwhile)
    assert await xack_calls() - before < 100


@pytest.mark.asyncio
async def test_a_restart_under_the_same_name_rereads_its_own_pending_entries(
    stream: Stream, tmp_path: Path
) -> None:
    ids = await stream.add([row_json(i) for i in range(30)])
    ds = await mem_wal_table(tmp_path)
    shard = new_shard()
    crashing, fetched = await crash_after(stream, ds, shard, "worker-1", allow=10)
    assert crashing.acked == ids[:10]
    unacked = fetched - 10
    assert unacked > 0
    # the crash may also cut a read in flight: what Redis delivered to it is pending too
    pending = await stream.pending()
    assert set(pending) == {"worker-1"} and unacked <= pending["worker-1"] <= 20

    async with ds.mem_wal_writer(shard) as writer:
        assert (await writer.lsm.point_lookup(10)).num_rows == 1  # the WAL replayed
        # min_idle_time is an hour, far beyond the test's own timeout: no entry
        # can be claimed while it runs, so all 20 come from its own pending list
        async with await stream.feed("worker-1", min_idle_time=3600.0) as feed:
            recording = Recording(feed)
            stats = await ingest(recording, writer, fetch_timeout=0.1, idle_timeout=0.3)
            assert feed.claimed == 0
        assert recording.offsets[:unacked] == ids[10 : 10 + unacked]  # own pending first
        assert sorted(recording.offsets, key=entry_order) == ids[10:]
        assert stats.messages == 20
        rows = await lsm_rows(writer)
        assert rows == expected_rows(range(30))
        assert len({r["id"] for r in rows}) == len(rows)
    assert await stream.pending() == {}


@pytest.mark.asyncio
async def test_another_consumer_claims_a_dead_consumers_entries(
    stream: Stream, tmp_path: Path
) -> None:
    ids = await stream.add([row_json(i) for i in range(30)])
    ds = await mem_wal_table(tmp_path)
    shard = new_shard()
    crashing, fetched = await crash_after(stream, ds, shard, "dead", allow=10)
    assert crashing.acked == ids[:10]
    # the crash may also cut a read in flight: what Redis delivered to it is pending too
    pending = await stream.pending()
    assert set(pending) == {"dead"} and fetched - 10 <= pending["dead"] <= 20
    unacked = pending["dead"]

    async with (
        ds.mem_wal_writer(shard) as writer,
        await stream.feed("alive", min_idle_time=0.3, claim_interval=0.2) as feed,
    ):
        recording = Recording(feed)
        stats = await ingest(recording, writer, fetch_timeout=0.1, idle_timeout=1.0)
        assert feed.claimed == unacked  # XAUTOCLAIM moved them over once idle
        assert sorted(recording.offsets, key=entry_order) == ids[10:]
        assert stats.messages == 20
        assert await lsm_rows(writer) == expected_rows(range(30))
    pending = await stream.pending()
    assert pending.get("dead", 0) == 0 and pending.get("alive", 0) == 0


@pytest.mark.asyncio
async def test_a_live_consumers_in_flight_entries_are_not_redelivered_to_it(
    stream: Stream,
) -> None:
    ids = await stream.add([row_json(i) for i in range(3)])
    async with await stream.feed("c", min_idle_time=0.0, claim_interval=0.05) as feed:
        first = await feed.fetch(10, 0.5)
        assert [m.offset for m in first] == ids
        await anyio.sleep(0.1)
        # a claim pass runs (and takes our own idle entries), but hands nothing out twice
        assert await feed.fetch(10, 0.2) == []
        assert feed.in_flight == 3
        detail: Any = await stream.client.xpending_range(stream.key, "g", "-", "+", 10)
        assert [d["times_delivered"] for d in detail] == [2, 2, 2]  # claimed, not re-handed
        for m in first:
            await m.ack()
    assert await stream.pending() == {}


@pytest.mark.asyncio
async def test_a_pending_entry_deleted_meanwhile_is_acked_without_rows(
    stream: Stream, tmp_path: Path
) -> None:
    """Its data is gone: nothing to write, nothing to set aside. The feed acks
    it itself and hands it out to nobody (an empty message is a bad one)."""
    ids = await stream.add([row_json(i) for i in range(3)])
    async with await stream.feed("c") as feed:
        assert len(await feed.fetch(10, 0.5)) == 3  # delivered, never acknowledged
    await stream.client.xdel(stream.key, ids[1])
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer, await stream.feed("c") as feed:
        recording = Recording(feed)
        stats = await ingest(recording, writer, fetch_timeout=0.1, idle_timeout=0.3)
        assert recording.offsets == [ids[0], ids[2]]
        assert (stats.messages, stats.rows) == (2, 2)
        assert feed.vanished == 1
        assert [r["id"] for r in await lsm_rows(writer)] == [0, 2]
    assert await stream.pending() == {}


@pytest.mark.asyncio
async def test_entries_without_the_payload_field_are_decoded_from_all_fields(
    stream: Stream, tmp_path: Path
) -> None:
    good = entry_id(await stream.client.xadd(stream.key, {"id": "7", "value": "70", "name": "n7"}))
    bad = entry_id(await stream.client.xadd(stream.key, {"colour": "red"}))
    letters: list[tuple[Any, type[BaseException]]] = []
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer, await stream.feed("c") as feed:
        stats = await ingest(
            feed,
            writer,
            dead_letter=lambda m, e: letters.append((m.offset, type(e))),
            fetch_timeout=0.1,
            idle_timeout=0.3,
        )
        assert await lsm_rows(writer) == expected_rows([7])
    assert letters == [(bad, la.DecodeError)]
    assert (stats.messages, stats.rows, stats.dead_letters) == (2, 1, 1)
    assert good < bad
    assert await stream.pending() == {}


@pytest.mark.asyncio
async def test_a_field_name_that_is_not_utf8_does_not_stop_the_stream(
    stream: Stream, tmp_path: Path
) -> None:
    await stream.add([row_json(1)])
    await stream.client.xadd(stream.key, {"data": row_json(2), b"\xfe": b"x"})
    await stream.add([row_json(3)])
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer, await stream.feed("c") as feed:
        stats = await ingest(feed, writer, fetch_timeout=0.1, idle_timeout=0.3)
        assert await lsm_rows(writer) == expected_rows([1, 2, 3])
    assert (stats.messages, stats.rows) == (3, 3)
    assert await stream.pending() == {}


async def blocked_in_xreadgroup(stream: Stream, name: str) -> bool:
    """The connection named ``name`` (``CLIENT SETNAME``) waits in a blocking
    ``XREADGROUP`` (``CLIENT LIST``: flag ``b``)."""
    clients: Any = await stream.client.client_list()
    return any(
        c["name"] == name and "b" in c["flags"] and c["cmd"] == "xreadgroup" for c in clients
    )


@pytest.mark.asyncio
async def test_fetch_blocks_until_an_entry_or_the_timeout(stream: Stream) -> None:
    name = f"lance_async-test-{uuid.uuid4().hex[:12]}"
    async with await stream.feed("c", client_options={"client_name": name}) as feed:
        assert await feed.fetch(10, 0.3) == []  # nothing came: empty at the timeout
        got: list[Message] = []

        async def fetch() -> None:
            got.extend(await feed.fetch(10, 3600.0))

        async with anyio.create_task_group() as tg:
            tg.start_soon(fetch)
            # the read waits inside Redis, not in a polling loop of the feed
            await eventually(
                lambda: blocked_in_xreadgroup(stream, name), 60, "a blocking XREADGROUP"
            )
            assert got == []
            # its timeout is an hour, far beyond the test's own: only the entry can end it
            await stream.add([row_json(1)])
        assert [m.payload for m in got] == [row_json(1)]
        await got[0].ack()


@pytest.mark.asyncio
async def test_group_creation_start_id_and_life_cycle(stream: Stream) -> None:
    await stream.add([row_json(0)])
    feed = await RedisStreamFeed.connect(URL, stream=stream.key, group="late", start_id="$")
    try:
        assert feed.consumer.startswith("lance_async-")
        assert isinstance(feed, Feed)
        opened = feed.state  # not feed.state narrowed: mypy would keep it past aclose()
        assert opened is FeedState.OPEN and not feed.exhausted
        assert not await feed.ensure_group()  # it exists now
        assert await feed.fetch(10, 0.1) == []  # "$": entries before the group are skipped
        await stream.add([row_json(1)])
        (message,) = await feed.fetch(10, 1.0)
        assert message.payload == row_json(1)
    finally:
        await feed.aclose()
    await feed.aclose()
    assert feed.state is FeedState.CLOSED
    with pytest.raises(la.ClosedError):
        await feed.fetch(1, 0.1)
    with pytest.raises(la.ClosedError):
        await message.ack()


def test_connect_on_trio_says_asyncio_only() -> None:
    async def main() -> None:
        await RedisStreamFeed.connect(URL, stream="s", group="g")

    with pytest.raises(la.LanceAsyncError, match="asyncio only"):
        trio.run(main)
