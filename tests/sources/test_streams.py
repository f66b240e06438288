"""Stream bridges in both directions (asyncio and trio)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import lance
import pyarrow as pa
import pytest

import lance_async as la
from lance_async._threads import run_sync, stream_limiter

from ..helpers import Ticker

pytestmark = pytest.mark.anyio

SCHEMA = pa.schema([("i", pa.int64())])


def batch(i: int, rows: int = 1) -> pa.RecordBatch:
    return pa.record_batch([pa.array([i] * rows, pa.int64())], schema=SCHEMA)


# -- reader -> async iterator -------------------------------------------------


async def test_reader_to_async_reads_everything_in_order() -> None:
    reader = pa.RecordBatchReader.from_batches(SCHEMA, [batch(i) for i in range(50)])
    stream = la.iterate_reader(reader, prefetch=3)
    assert stream.schema == SCHEMA
    got = [b.column(0)[0].as_py() async for b in stream]
    assert got == list(range(50))
    assert stream.state is la.StreamState.EXHAUSTED
    stats = stream.statistics()
    assert stats.batches_read == 50 and stats.max_buffered_batches <= 3


async def test_prefetch_is_bounded_while_the_consumer_is_slow(no_stream_threads: None) -> None:
    produced = 0

    def source() -> Iterator[pa.RecordBatch]:
        nonlocal produced
        for i in range(100):
            produced += 1
            yield batch(i)

    stream = la.iterate_reader(source, prefetch=4)
    async with stream:
        first = await stream.__anext__()
        assert first.column(0)[0].as_py() == 0
        await anyio.sleep(0.2)  # the thread fills the buffer, then waits
        # 1 taken + 4 buffered + 1 read and waiting for room
        assert produced <= 6
        assert stream.statistics().buffered_batches <= 4


async def test_break_stops_the_thread_and_closes_the_reader(no_stream_threads: None) -> None:
    closed = threading.Event()

    class Reader:
        def __iter__(self) -> Iterator[pa.RecordBatch]:
            i = 0
            while True:
                i += 1
                yield batch(i)

        def close(self) -> None:
            closed.set()

    for _ in range(100):
        closed.clear()
        async for _b in la.iterate_reader(lambda: Reader(), prefetch=2):
            break
        await anyio.to_thread.run_sync(closed.wait, 5)
        assert closed.is_set()


async def test_aclose_and_cancel_leave_no_thread(no_stream_threads: None) -> None:
    def endless() -> Iterator[pa.RecordBatch]:
        while True:
            time.sleep(0.001)
            yield batch(1)

    stream = la.iterate_reader(endless, prefetch=2)
    await stream.__anext__()
    await stream.aclose()
    await stream.aclose()  # twice is fine
    with pytest.raises(la.ClosedError):
        await stream.__anext__()

    stream2 = la.iterate_reader(endless, prefetch=2)
    with anyio.move_on_after(0.1):
        async with stream2:
            async for _ in stream2:
                pass
    assert stream2.state is la.StreamState.CLOSED


async def test_reader_errors_surface_as_themselves() -> None:
    class Boom(Exception):
        pass

    def failing() -> Iterator[pa.RecordBatch]:
        yield batch(1)
        raise Boom("reader broke")

    stream = la.iterate_reader(failing)
    assert (await stream.__anext__()).num_rows == 1
    with pytest.raises(Boom, match="reader broke"):
        await stream.__anext__()


async def test_exhaustion_never_hangs() -> None:
    stream = la.iterate_reader(lambda: iter([]))
    with anyio.fail_after(5):
        assert [b async for b in stream] == []
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()


async def test_to_table_of_an_empty_reader_keeps_the_schema() -> None:
    reader = pa.RecordBatchReader.from_batches(SCHEMA, [])
    table = await la.iterate_reader(reader).to_table()
    assert table.schema == SCHEMA and table.num_rows == 0


# -- async iterator -> reader ---------------------------------------------------


async def test_bridge_moves_batches_by_reference() -> None:
    originals = [batch(i, rows=10) for i in range(20)]

    async def produce() -> AsyncIterator[pa.RecordBatch]:
        for b in originals:
            yield b

    async with la.bridge_reader(produce(), SCHEMA) as bridged:
        got = await anyio.to_thread.run_sync(lambda: list(bridged.reader))
    assert len(got) == 20
    for a, b in zip(got, originals, strict=True):
        assert a.column(0).buffers()[1].address == b.column(0).buffers()[1].address


async def test_producer_of_1000_batches_with_buffer_4_has_at_most_5_in_flight() -> None:
    """In flight: produced by the producer and not yet taken by the reader."""
    produced = 0
    peak = 0
    holder: list[la.streams.BridgedReader] = []

    async def produce() -> AsyncIterator[pa.RecordBatch]:
        nonlocal produced, peak
        for i in range(1000):
            produced += 1  # this one is now held by the producer
            taken = holder[0].statistics().batches_consumed if holder else 0
            peak = max(peak, produced - taken)
            yield batch(i)

    def consume(reader: pa.RecordBatchReader) -> int:
        n = 0
        for _b in reader:
            time.sleep(0.0002)  # a slow consumer
            n += 1
        return n

    async with la.bridge_reader(produce(), SCHEMA, max_batches=4) as bridged:
        holder.append(bridged)
        n = await anyio.to_thread.run_sync(consume, bridged.reader)
        stats = bridged.statistics()
    assert n == 1000
    assert peak <= 5, peak
    assert stats.max_buffered_batches == 4


async def test_bytes_limit_bounds_the_buffer() -> None:
    big = batch(1, rows=100_000)  # 800 kB

    async def produce() -> AsyncIterator[pa.RecordBatch]:
        for _ in range(20):
            yield big

    async with la.bridge_reader(produce(), SCHEMA, max_batches=100, max_bytes=2_000_000) as bridged:
        await anyio.sleep(0.1)
        assert bridged.statistics().buffered_bytes <= 2_000_000
        assert (
            await anyio.to_thread.run_sync(lambda: sum(b.num_rows for b in bridged.reader))
            == 2_000_000
        )


async def test_producer_error_after_3_batches_surfaces_from_the_reader() -> None:
    class Boom(Exception):
        pass

    async def produce() -> AsyncIterator[pa.RecordBatch]:
        for i in range(3):
            yield batch(i)
        raise Boom("after three")

    async with la.bridge_reader(produce(), SCHEMA) as bridged:
        with pytest.raises(Boom, match="after three"):
            await anyio.to_thread.run_sync(bridged.reader.read_all)
        assert isinstance(bridged.error, Boom)


async def test_consumer_failure_cancels_the_producer() -> None:
    cancelled = anyio.Event()

    async def produce() -> AsyncIterator[pa.RecordBatch]:
        try:
            i = 0
            while True:
                i += 1
                yield batch(i)
        finally:
            cancelled.set()

    def consume(reader: pa.RecordBatchReader) -> None:
        reader.read_next_batch()
        raise RuntimeError("consumer failed")

    with pytest.raises(RuntimeError, match="consumer failed"):
        async with la.bridge_reader(produce(), SCHEMA) as bridged:
            await anyio.to_thread.run_sync(consume, bridged.reader)
    with anyio.fail_after(5):
        await cancelled.wait()


async def test_consumer_stopping_early_releases_the_producer() -> None:
    async def produce() -> AsyncIterator[pa.RecordBatch]:
        while True:
            yield batch(1)

    with anyio.fail_after(5):
        async with la.bridge_reader(produce(), SCHEMA, max_batches=2) as bridged:
            await anyio.to_thread.run_sync(bridged.reader.read_next_batch)
            await anyio.to_thread.run_sync(bridged.reader.close)


async def test_no_deadlock_when_the_consumer_is_the_only_worker_thread() -> None:
    la.configure_threads(engine=1, stream=1)
    try:
        source = la.iterate_reader(lambda: iter([batch(i) for i in range(20)]))

        async with la.bridge_reader(source, SCHEMA) as bridged:
            with anyio.fail_after(10):
                table = await run_sync(bridged.reader.read_all)
        assert table.num_rows == 20
    finally:
        la.configure_threads(engine=16, stream=16)


async def test_open_streams_never_take_the_threads_their_consumers_need() -> None:
    # One parse/encode thread and one reader thread: the open stream holds the
    # reader slot for its life, while its consumer encodes each batch on the
    # stream limiter (what a scan response does).
    la.configure_threads(stream=1, reader=1)
    try:
        encoded = 0
        with anyio.fail_after(10):
            async with la.iterate_reader(lambda: iter([batch(i) for i in range(8)])) as stream:
                async for b in stream:
                    await run_sync(b.to_pylist, limiter=stream_limiter())
                    encoded += 1
        assert encoded == 8
        # a second open stream waits for the reader slot, and gets it on close
        first = la.iterate_reader(lambda: iter([batch(i) for i in range(8)]))
        second = la.iterate_reader(lambda: iter([batch(i) for i in range(8)]))
        await first.__anext__()
        with anyio.move_on_after(0.3) as waited:
            await second.__anext__()
        assert waited.cancelled_caught
        await first.aclose()
        with anyio.fail_after(10):
            assert (await second.to_table()).num_rows == 8
    finally:
        la.configure_threads(stream=16, reader=16)


async def test_cancelled_producer_never_looks_like_a_clean_end() -> None:
    async def produce() -> AsyncIterator[pa.RecordBatch]:
        yield batch(1)
        await anyio.sleep_forever()
        yield batch(2)  # pragma: no cover

    result: list[object] = []

    async def consume(bridged: la.streams.BridgedReader) -> None:
        try:
            result.append(await anyio.to_thread.run_sync(bridged.reader.read_all))
        except BaseException as exc:
            result.append(exc)

    with anyio.move_on_after(0.2):
        async with la.bridge_reader(produce(), SCHEMA) as bridged:
            await consume(bridged)
    assert result and isinstance(result[0], la.SourceError)


async def test_stream_from_another_event_loop_is_refused() -> None:
    stream = la.iterate_reader(lambda: iter([batch(i) for i in range(10)]), prefetch=1)
    await stream.__anext__()
    errors: list[BaseException] = []

    def other_loop() -> None:
        async def use() -> None:
            try:
                await stream.__anext__()
            except BaseException as exc:
                errors.append(exc)

        anyio.run(use)

    await anyio.to_thread.run_sync(other_loop)
    assert errors and isinstance(errors[0], la.WrongEventLoopError)
    await stream.aclose()


# -- loop latency -------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_loop_stays_free_while_a_bridge_moves_1_gib() -> None:
    chunk = pa.record_batch([pa.array(range(128 * 1024), pa.int64())], schema=SCHEMA)  # 1 MiB
    ticker = Ticker()

    async def produce() -> AsyncIterator[pa.RecordBatch]:
        for _ in range(1024):
            yield chunk

    def drain(reader: pa.RecordBatchReader) -> int:
        return sum(b.nbytes for b in reader)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        async with la.bridge_reader(produce(), SCHEMA) as bridged:
            moved = await anyio.to_thread.run_sync(drain, bridged.reader)
        back = 0
        async for b in la.iterate_reader(lambda: (chunk for _ in range(1024))):
            back += b.nbytes
        ticker.running = False
    assert moved == back == 1024 * chunk.nbytes
    ticker.assert_free()


async def test_max_rows_slices_large_batches_on_the_loop(table_uri: str) -> None:
    """Small requested batches are sliced from larger engine batches, in order."""
    ds = await la.write_dataset(pa.table({"id": list(range(5000))}), table_uri)
    stream = ds.scan(batch_size=300)
    sizes: list[int] = []
    ids: list[int] = []
    async with stream:
        async for batch in stream:
            sizes.append(batch.num_rows)
            ids.extend(batch.column("id").to_pylist())
    assert ids == list(range(5000))
    assert max(sizes) == 300 and len(sizes) >= 5000 // 300
    assert stream.statistics().rows_read == 5000
    with pytest.raises(ValueError):
        la.AsyncBatchStream(lambda: iter([]), max_rows=0)


# -- issue 17, item 10: streams left open when their loop ends ---------------------


def _stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lance_async-stream"]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_regression_a_stream_left_open_is_stopped_when_its_loop_ends(
    backend: str, tmp_path: Path
) -> None:
    # Before: the reader thread outlived the loop, inside the engine, and the
    # process aborted (SIGABRT) at exit about one run in five.
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": list(range(10_000))}), uri)
    kept: list[la.AsyncBatchStream] = []

    async def main() -> None:
        ds = await la.open_dataset(uri)
        stream = ds.scan(batch_size=10, prefetch=1)
        await stream.__anext__()
        kept.append(stream)  # still held, never closed

    anyio.run(main, backend=backend)
    assert _stream_threads() == []
    assert kept[0].statistics().buffered_batches == 0


def test_regression_a_process_leaving_scans_open_exits_cleanly(tmp_path: Path) -> None:
    lance.write_dataset(pa.table({"id": list(range(200_000))}), str(tmp_path / "t.lance"))
    code = f"""
import asyncio, lance_async as la
streams = []
async def main():
    ds = await la.open_dataset({str(tmp_path / "t.lance")!r})
    for _ in range(4):
        s = ds.scan(batch_size=100)
        await s.__anext__()
        streams.append(s)
asyncio.run(main())
print("done")
"""
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "done"
