"""The streaming LSM scan (scan.py) and the memtable mirror it reads (mirror.py)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import anyio
import anyio.lowlevel
import pyarrow as pa
import pytest

import lance_async as la
from lance_async._threads import reader_limiter

from ..helpers import PK, kv_table


def _ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


@pytest.mark.asyncio
async def test_an_lsm_scan_streams_in_bounded_memory(
    table_uri: str, no_stream_threads: None
) -> None:
    ds = await la.write_dataset(kv_table(range(20_000)), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=1000) as w:
        for start in range(0, 6000, 1000):  # six generations shadowing base rows
            await w.put(kv_table(range(start, start + 1000), 1))
        await w.put(kv_table(range(30_000, 30_500), 2))  # memtable only
        stream = w.lsm.scan(columns=["id", "value"], batch_size=512)
        seen = 0
        values: dict[int, int] = {}
        async with stream:
            async for batch in stream:
                assert batch.num_rows <= 512
                stats = stream.statistics()
                assert stats.buffered_batches <= 4  # the prefetch bound, not the result
                seen += batch.num_rows
                for i, v in zip(
                    batch.column("id").to_pylist(), batch.column("value").to_pylist(), strict=True
                ):
                    values[i] = v
                await anyio.lowlevel.checkpoint()  # a slow consumer: the reader waits for it
        assert stream.statistics().max_buffered_batches <= 4
    assert seen == len(values) == 20_500  # every key once
    assert all(values[i] == (1 if i < 6000 else 2 if i >= 30_000 else 0) for i in values)


@pytest.mark.asyncio
async def test_cancelling_an_lsm_scan_frees_its_thread(
    table_uri: str, no_stream_threads: None
) -> None:
    ds = await la.write_dataset(kv_table(range(50_000)), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=2000) as w:
        for start in range(0, 10_000, 2000):
            await w.put(kv_table(range(start, start + 2000), 1))
    got_one = anyio.Event()
    with anyio.CancelScope() as scope:
        stream = ds.lsm.scan(batch_size=256)
        async with stream:
            async for _batch in stream:
                got_one.set()
                scope.cancel()
                await anyio.sleep(1)  # cancelled here
    assert scope.cancelled_caught and got_one.is_set()
    # the scan's reader thread has stopped reading and given its slot back (the
    # no_stream_threads fixture then checks that the thread itself ends)
    assert reader_limiter().borrowed_tokens == 0
    assert stream.state is la.StreamState.CLOSED


@pytest.mark.asyncio
async def test_rows_of_a_memtable_sealed_by_the_last_put_are_visible(table_uri: str) -> None:
    """pylance 14's writer scanner misses them for 50-80 ms; the mirror does not."""
    ds = await la.write_dataset(kv_table(range(10)), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    opts: dict[str, Any] = {"max_memtable_rows": 100, "max_put_rows": 100, "durable_write": False}
    async with ds.mem_wal_writer(str(uuid.uuid4()), **opts) as w:
        expected = set(range(10))
        for step in range(8):
            ids = range(100 + step * 100, 200 + step * 100)  # exactly fills: seals
            await w.put(kv_table(ids, step))
            expected |= set(ids)
            assert _ids(await w.lsm.scan(columns=["id"]).to_table()) == sorted(expected), step
            last = await w.lsm.point_lookup(199 + step * 100)
            assert last.column("value").to_pylist() == [step]


@pytest.mark.asyncio
async def test_filters_limits_and_deletes_on_string_keys(table_uri: str) -> None:
    schema = pa.schema(
        [pa.field("k", pa.string(), nullable=False, metadata=PK), pa.field("n", pa.int64())]
    )
    ds = await la.write_dataset(
        pa.table({"k": [f"k{i}" for i in range(300)], "n": list(range(300))}, schema=schema),
        table_uri,
    )
    await ds.initialize_mem_wal(manual_shards=True)
    model = {f"k{i}": i for i in range(300)}
    async with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=40) as w:
        for step in range(5):
            keys = [f"k{i}" for i in range(step, 400, 7)]
            await w.put(pa.table({"k": keys, "n": [-step] * len(keys)}, schema=schema))
            model.update({k: -step for k in keys})
            dead = [f"k{i}" for i in range(step * 11, 300, 50)]
            await w.delete({"k": dead})
            for k in dead:
                model.pop(k, None)
        got = await w.lsm.scan(filter="n < 0").to_table()
        assert dict(zip(got["k"].to_pylist(), got["n"].to_pylist(), strict=True)) == {
            k: v for k, v in model.items() if v < 0
        }
        limited = await w.lsm.scan(filter="n >= 0", limit=7).to_table()
        assert limited.num_rows == 7 and all(model[k] >= 0 for k in limited["k"].to_pylist())
        with pytest.raises(la.InvalidInputError):
            await w.lsm.scan(filter="n >>> 1").to_table()
        with pytest.raises(la.SchemaMismatchError):
            w.lsm.scan(columns=["nope"])
    scanned = await ds.lsm.scan().to_table()
    assert dict(zip(scanned["k"].to_pylist(), scanned["n"].to_pylist(), strict=True)) == model


CRASH = """
import sys, lance, pyarrow as pa, os
sys.path.insert(0, {root!r})
from tests.helpers import kv_table
ds = lance.dataset({uri!r})
w = ds.mem_wal_writer({shard!r}, max_memtable_rows=1000)
w.put(kv_table(range(100, 150), 5))
w.delete(pa.table({{"id": [1, 2]}}))
os._exit(0)  # no close: the rows live only in the WAL
"""


@pytest.mark.asyncio
async def test_a_reopened_shard_shows_the_rows_replayed_from_its_wal(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(10)), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = str(uuid.uuid4())
    root = str(__import__("pathlib").Path(__file__).parents[2])
    code = CRASH.format(root=root, uri=table_uri, shard=shard)
    await anyio.to_thread.run_sync(
        lambda: subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    )
    async with ds.mem_wal_writer(shard) as w:
        got = await w.lsm.scan(columns=["id", "value"]).to_table()
        assert _ids(got) == sorted({*range(10), *range(100, 150)} - {1, 2})
        assert (await w.lsm.point_lookup(120)).column("value").to_pylist() == [5]
        assert (await w.lsm.point_lookup(1)).num_rows == 0
