"""FileFeed: NDJSON / CSV / Arrow IPC read in chunks, followed, resumed (asyncio and trio)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.feeds import Feed, FeedState, FileFeed, Message, ingest

from ..helpers import KV_SCHEMA, Ticker
from .support import (
    CrashBeforeAck,
    batch_of,
    expected_rows,
    lsm_rows,
    mem_wal_table,
    new_shard,
    row_json,
)

pytestmark = pytest.mark.anyio

FORMATS = ["ndjson", "csv", "ipc-stream", "ipc-file"]


def write_rows(path: Path, fmt: str, ids: range | list[int]) -> None:
    """Rows id=i, value=10*i, name=f"n{i}" in the given format."""
    ids = list(ids)
    if fmt == "ndjson":
        path.write_bytes(b"".join(row_json(i) + b"\n" for i in ids))
    elif fmt == "csv":
        path.write_text("name,id,value\n" + "".join(f"n{i},{i},{10 * i}\n" for i in ids))
    else:
        writer_cls: Any = pa.ipc.new_stream if fmt == "ipc-stream" else pa.ipc.new_file
        with pa.OSFile(str(path), "wb") as sink, writer_cls(sink, KV_SCHEMA) as w:
            for start in range(0, len(ids), 7):  # many small IPC messages
                w.write_batch(batch_of(ids[start : start + 7]))


def suffix(fmt: str) -> str:
    return {"ndjson": ".ndjson", "csv": ".csv", "ipc-stream": ".arrows", "ipc-file": ".arrow"}[fmt]


class Recording:
    """Passes a feed through, keeping every message it handed out."""

    def __init__(self, feed: FileFeed) -> None:
        self.feed = feed
        self.messages: list[Message] = []

    @property
    def exhausted(self) -> bool:
        return self.feed.exhausted

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        out = await self.feed.fetch(max_messages, timeout)
        self.messages.extend(out)
        return out

    async def aclose(self) -> None:
        await self.feed.aclose()


async def drain(feed: FileFeed, max_messages: int = 1000) -> list[Message]:
    out: list[Message] = []
    while not feed.exhausted:
        out.extend(await feed.fetch(max_messages, 0.1))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
async def test_each_format_is_read_in_chunks_and_ingested(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"rows{suffix(fmt)}"
    write_rows(path, fmt, range(200))
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer:
        async with FileFeed(path, schema=KV_SCHEMA, chunk_size=256) as feed:
            recording = Recording(feed)
            stats = await ingest(recording, writer, max_batch=4)
            assert feed.exhausted
            assert feed.committed is not None
            if fmt == "ipc-file":  # the footer after the end-of-stream marker is not read
                assert 0 < feed.committed < path.stat().st_size
            else:
                assert feed.committed == path.stat().st_size
        assert stats.rows == 200
        # read in chunks, never whole: a message spans one 256-byte chunk plus at most
        # the rest of one record (an IPC message of 7 rows is under 512 bytes)
        spans = [m.offset - m.headers["start"] for m in recording.messages]
        assert len(spans) > 5
        assert max(spans) < 256 + 512
        assert await lsm_rows(writer) == expected_rows(range(200))


async def test_offsets_are_record_boundaries_and_chunks_stay_small(tmp_path: Path) -> None:
    path = tmp_path / "rows.ndjson"
    write_rows(path, "ndjson", range(300))
    data = path.read_bytes()
    longest = max(len(line) + 1 for line in data.splitlines())
    async with FileFeed(path, schema=KV_SCHEMA, chunk_size=100) as feed:
        messages = await drain(feed, max_messages=3)
    previous = 0
    seen: list[int] = []
    for m in messages:
        assert m.headers["start"] == previous
        assert data[: m.offset].endswith(b"\n")
        assert m.offset - previous < 100 + longest
        lines = data[previous : m.offset].splitlines()
        assert isinstance(m.payload, pa.RecordBatch)
        assert m.payload.column("id").to_pylist() == [json.loads(x)["id"] for x in lines]
        seen.extend(m.payload.column("id").to_pylist())
        previous = m.offset
    assert previous == len(data)
    assert seen == list(range(300))


async def test_csv_quoted_newlines_and_a_missing_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    names = [f'line {i}\nwith "quotes", and commas' if i % 3 == 0 else f"n{i}" for i in range(40)]
    body = "".join(
        f'{i},{10 * i},"{n.replace(chr(34), chr(34) * 2)}"\n' for i, n in enumerate(names)
    )
    path.write_text("id,value,name\n" + body.rstrip("\n"))
    async with FileFeed(path, schema=KV_SCHEMA, chunk_size=50) as feed:
        messages = await drain(feed)
    table = pa.Table.from_batches([m.payload for m in messages])
    assert table.column("name").to_pylist() == names
    assert table.column("id").to_pylist() == list(range(40))
    assert messages[-1].offset == path.stat().st_size


async def test_follow_reads_a_growing_file(tmp_path: Path) -> None:
    path = tmp_path / "growing.ndjson"
    path.write_bytes(b"")
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer:
        feed = FileFeed(path, schema=KV_SCHEMA, follow=True, poll_interval=0.02, chunk_size=64)

        async def append() -> None:
            for i in range(30):
                line = row_json(i) + b"\n"
                async with await anyio.open_file(path, "ab") as f:
                    if i % 5 == 0:  # half a line now, the rest a little later
                        await f.write(line[:7])
                        await f.flush()
                        await anyio.sleep(0.05)
                    await f.write(line[7:] if i % 5 == 0 else line)
                await anyio.sleep(0.005)

        async with feed, anyio.create_task_group() as tg:
            tg.start_soon(append)
            stats = await ingest(feed, writer, fetch_timeout=0.05, idle_timeout=0.6)
            assert not feed.exhausted  # a followed file never ends by itself
            assert feed.committed == path.stat().st_size
        assert stats.rows == 30
        assert await lsm_rows(writer) == expected_rows(range(30))


async def test_a_followed_ipc_stream_ends_at_its_end_marker(tmp_path: Path) -> None:
    path = tmp_path / "rows.arrows"
    write_rows(path, "ipc-stream", range(20))
    async with FileFeed(path, schema=KV_SCHEMA, follow=True, poll_interval=0.02) as feed:
        messages = await drain(feed)
    assert sum(m.payload.num_rows for m in messages) == 20  # type: ignore[union-attr]
    assert feed.exhausted


@pytest.mark.parametrize("fmt", ["ndjson", "csv", "ipc-stream", "ipc-file"])
async def test_a_restart_resumes_at_the_stored_offset(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"rows{suffix(fmt)}"
    write_rows(path, fmt, range(120))
    store = tmp_path / "offset.json"
    ds = await mem_wal_table(tmp_path)
    shard = new_shard()
    async with ds.mem_wal_writer(shard) as writer:
        with anyio.CancelScope() as scope:
            async with FileFeed(path, schema=KV_SCHEMA, chunk_size=200, offset_store=store) as feed:
                crashing = CrashBeforeAck(feed, allow=3, scope=scope)
                await ingest(crashing, writer, max_batch=2)
        assert crashing.crashed_at is not None  # died with written, unacknowledged rows
        stored = json.loads(store.read_text())["offset"]
        assert stored == crashing.acked[-1]
        assert (await writer.lsm.point_lookup(0)).num_rows == 1
    # restart: a new feed on the same store, the same shard (its WAL replays)
    async with ds.mem_wal_writer(shard) as writer:
        async with FileFeed(path, schema=KV_SCHEMA, chunk_size=200, offset_store=store) as feed:
            assert feed.start == stored
            recording = Recording(feed)
            await ingest(recording, writer, max_batch=2)
            assert json.loads(store.read_text())["offset"] == feed.committed
        assert recording.messages[0].headers["start"] == stored
        ids = [i for m in recording.messages for i in m.payload.column("id").to_pylist()]  # type: ignore[union-attr]
        assert ids[0] > 0 and ids == list(range(ids[0], 120))  # resumed, not restarted
        assert await lsm_rows(writer) == expected_rows(range(120))


async def test_callable_offset_store_and_explicit_start_offset(tmp_path: Path) -> None:
    path = tmp_path / "rows.ndjson"
    write_rows(path, "ndjson", range(50))
    saved: list[int] = []

    async def save(offset: int) -> None:
        await anyio.lowlevel.checkpoint()
        saved.append(offset)

    async with FileFeed(path, schema=KV_SCHEMA, chunk_size=128, offset_store=save) as feed:
        messages = await feed.fetch(2, 0.1)
        for m in messages:
            await m.ack()
    assert saved == [m.offset for m in messages]
    async with FileFeed(path, schema=KV_SCHEMA, chunk_size=128, start_offset=saved[-1]) as feed:
        rest = await drain(feed)
    before = sum(m.payload.num_rows for m in messages)  # type: ignore[union-attr]
    assert rest[0].payload.column("id")[0].as_py() == before  # type: ignore[union-attr]
    assert sum(m.payload.num_rows for m in rest) == 50 - before  # type: ignore[union-attr]


async def test_a_bad_record_raises_decode_error_with_its_chunk_offset(tmp_path: Path) -> None:
    path = tmp_path / "rows.ndjson"
    good = b"".join(row_json(i) + b"\n" for i in range(20))
    path.write_bytes(good + b'{"id": "not a number"}\n' + row_json(99) + b"\n")
    async with FileFeed(path, schema=KV_SCHEMA, chunk_size=64) as feed:
        delivered: list[Message] = []
        with pytest.raises(la.DecodeError) as info:
            while True:
                delivered.extend(await feed.fetch(1, 0.1))
        offset = info.value.offset
        assert isinstance(offset, int)
        assert offset <= len(good) < offset + 64 + 40
        assert offset == (delivered[-1].offset if delivered else 0)
        assert str(path) in str(info.value)
        with pytest.raises(la.DecodeError):  # the feed stays failed
            await feed.fetch(1, 0.1)


async def test_a_followed_file_that_shrinks_raises_source_changed(tmp_path: Path) -> None:
    path = tmp_path / "rows.ndjson"
    write_rows(path, "ndjson", range(10))
    async with FileFeed(path, schema=KV_SCHEMA, follow=True, poll_interval=0.01) as feed:
        assert sum(m.payload.num_rows for m in await feed.fetch(100, 0.05)) == 10  # type: ignore[union-attr]
        path.write_bytes(row_json(0) + b"\n")
        with pytest.raises(la.SourceChangedError):
            await feed.fetch(100, 0.05)


async def test_resuming_past_the_end_raises_source_changed(tmp_path: Path) -> None:
    path = tmp_path / "rows.ndjson"
    write_rows(path, "ndjson", range(3))
    feed = FileFeed(path, schema=KV_SCHEMA, start_offset=path.stat().st_size + 1)
    with pytest.raises(la.SourceChangedError):
        await feed.open()
    await feed.aclose()


async def test_cancelled_fetches_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    write_rows(path, "csv", range(400))
    ids: list[int] = []
    async with FileFeed(path, schema=KV_SCHEMA, chunk_size=97) as feed:
        cancelled = 0
        while not feed.exhausted:
            with anyio.move_on_after(0.0005) as scope:
                for m in await feed.fetch(2, 0.1):
                    ids.extend(m.payload.column("id").to_pylist())  # type: ignore[union-attr]
            cancelled += scope.cancelled_caught
    assert ids == list(range(400))
    assert cancelled > 0


async def test_life_cycle_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "rows.ndjson"
    write_rows(path, "ndjson", range(3))
    feed = FileFeed(path, schema=KV_SCHEMA)
    assert isinstance(feed, Feed)
    # each state read into a name of its own: mypy keeps feed.state narrowed past awaits
    made = feed.state
    assert made is FeedState.NEW
    assert len(await feed.fetch(10, 0.1)) == 1  # opens on first use
    opened = feed.state
    assert opened is FeedState.OPEN
    await feed.aclose()
    await feed.aclose()  # twice is fine
    assert feed.state is FeedState.CLOSED
    with pytest.raises(la.ClosedError):
        await feed.fetch(10, 0.1)
    missing = FileFeed(tmp_path / "missing.ndjson", schema=KV_SCHEMA)
    with pytest.raises(la.SourceError):
        await missing.fetch(1, 0.1)
    await missing.aclose()
    with pytest.raises(ValueError, match="needs a schema"):
        FileFeed(path)
    with pytest.raises(ValueError, match="cannot tell the format"):
        FileFeed(tmp_path / "rows.txt", schema=KV_SCHEMA)


async def test_regression_the_loop_stays_free_while_a_large_quoted_csv_is_read(
    tmp_path: Path,
) -> None:
    # cutting quoted CSV at record ends (and combining a chunk's batches) ran on
    # the event loop: about 0.5 s per 1 MiB chunk of this file
    path = tmp_path / "quoted.csv"
    row = b'"a","b, with a comma","c\nwith a newline and ""quotes"""\n'
    rows = 400_000
    path.write_bytes(b"a,b,c\n" + row * rows)
    schema = pa.schema([pa.field(name, pa.string()) for name in "abc"])
    ticker = Ticker()
    got = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        async with FileFeed(path, schema=schema) as feed:
            while not feed.exhausted:
                for m in await feed.fetch(100, 0.1):
                    assert isinstance(m.payload, pa.RecordBatch)
                    got += m.payload.num_rows
                    last = m.payload
        ticker.running = False
    assert got == rows
    assert last.column("c")[-1].as_py() == 'c\nwith a newline and "quotes"'
    assert len(ticker.lags) > 10
    ticker.assert_free()
    ticker.assert_off_loop()


async def test_chunks_before_a_bad_one_are_handed_out_first(tmp_path: Path) -> None:
    path = tmp_path / "rows.ndjson"
    good = b"".join(row_json(i) + b"\n" for i in range(40))
    path.write_bytes(good + b"null\n" + row_json(99) + b"\n")
    async with FileFeed(path, schema=KV_SCHEMA, chunk_size=128) as feed:
        first = await feed.fetch(100, 0.1)  # meets the bad chunk, returns what came before
        ids = [i for m in first for i in m.payload.column("id").to_pylist()]  # type: ignore[union-attr]
        assert first and ids == list(range(len(ids))) and len(ids) < 40
        with pytest.raises(la.DecodeError, match="expected a JSON object, got null") as info:
            await feed.fetch(100, 0.1)
        assert info.value.offset == first[-1].offset
        with pytest.raises(la.DecodeError):  # the feed stays failed
            await feed.fetch(100, 0.1)
