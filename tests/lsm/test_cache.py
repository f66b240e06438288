"""The cache of flushed generations: bounded by bytes, emptied of what
compaction merged (issue 37)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import lance_async as la
from lance_async.lsm.cache import LevelCache

from ..helpers import kv_table


def test_the_budget_drops_the_least_recently_used_and_the_mark_drops_compacted() -> None:
    budget = [100]
    cache = LevelCache(10, budget=lambda: budget[0])
    for g in (1, 2, 3):
        cache.put(("gen", g), f"g{g}", 40, group="shard-a", low=g)
    assert cache.get_item(("gen", 1)) is None  # 120 bytes > 100: the oldest went
    assert cache.get_item(("gen", 2)) == "g2"  # now the most recently used
    cache.put(("gen", 4), "g4", 40, group="shard-a", low=4)
    assert cache.get_item(("gen", 3)) is None and cache.get_item(("gen", 2)) == "g2"
    cache.put(("list", 2, 4), "l24", 10, group="shard-a", low=2)
    cache.put(("gen", 9), "other", 10, group="shard-b", low=1)
    assert cache.stats().nbytes == 100 and cache.stats().evicted == 2

    cache.compacted("shard-a", 2)  # generations up to 2 merged into the base
    assert cache.get_item(("gen", 2)) is None and cache.get_item(("list", 2, 4)) is None
    assert cache.get_item(("gen", 4)) == "g4" and cache.get_item(("gen", 9)) == "other"
    assert cache.stats().compacted == 2 and cache.stats().nbytes == 50
    cache.put(("gen", 2), "again", 40, group="shard-a", low=2)  # an old view read it
    assert cache.get_item(("gen", 2)) is None  # compacted: not kept
    cache.compacted("shard-a", 1)  # the mark went back (a restore): nothing dropped
    cache.put(("gen", 2), "again", 40, group="shard-a", low=2)
    assert cache.get_item(("gen", 2)) == "again"
    budget[0] = 10  # a smaller budget applies at the next insertion
    cache.put(("gen", 5), "g5", 5, group="shard-a", low=5)
    assert len(cache) == 1 and cache.get_item(("gen", 5)) == "g5"


@pytest.fixture
def restore_budget() -> Iterator[None]:
    names = ("LANCE_ASYNC_LSM_CACHE_BYTES", "LANCE_ASYNC_TRIM_SECONDS")
    saved = {k: os.environ.get(k) for k in names}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.mark.anyio
async def test_a_polling_reader_keeps_only_live_generations_and_its_budget(
    tmp_path: Path, restore_budget: None
) -> None:
    """A reader that keeps reading while generations are flushed and
    compacted holds the live ones only; under a small budget it evicts and
    reads them again, with the same rows; what it drops is returned to the
    operating system (issue 37)."""
    la.configure_memory(trim_seconds=1e-9)  # every drop may release
    released = la.memory_stats().automatic
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(1)), uri)
    await ds.initialize_mem_wal(num_buckets=1, bucket_column="id")
    reader = await la.open_dataset(uri)
    stats = reader.lsm.cache_stats
    keys = list(range(0, 200, 7))
    expected: dict[int, int] = {}

    async def read() -> None:
        got = await reader.lsm.point_lookups(keys, columns=["id", "value"])
        assert (
            dict(zip(got.column("id").to_pylist(), got.column("value").to_pylist(), strict=True))
            == expected
        )

    for r in range(3):
        async with ds.mem_wal_writer(max_memtable_rows=20) as w:  # closed: all flushed
            for start in range(0, 200, 10):
                await w.send(kv_table(range(start, start + 10), r))
        expected = {k: r for k in keys}
        before = stats()
        await read()
        flushed = sum(len(s.sstables) for s in await reader.lsm.snapshots())
        cached = stats().entries - before.entries
        assert flushed >= 2 and cached == flushed + 1  # each generation, the shard's list
        await ds.compact_mem_wal()
        await read()  # the view that sees the compaction forgets its generations
        assert stats().compacted - before.compacted >= cached
        assert stats().entries <= before.entries + 1

    la.configure_memory(lsm_cache_bytes=1)  # nothing fits: each generation evicted once read
    async with ds.mem_wal_writer(max_memtable_rows=20) as w:
        for start in range(0, 200, 10):
            await w.send(kv_table(range(start, start + 10), 9))
        await w.flush()
    expected = {k: 9 for k in keys}
    evicted = stats().evicted
    await read()
    await read()
    flushed = sum(len(s.sstables) for s in await reader.lsm.snapshots())
    assert stats().evicted - evicted >= flushed and stats().entries <= 1  # the newest stays
    assert stats().budget == 1
    la.configure_memory(lsm_cache_bytes=None)
    assert stats().budget == 256 << 20
    deadline = anyio.current_time() + 30  # a timeout for "eventually"
    while la.memory_stats().automatic == released:  # the drops above each asked for one
        assert anyio.current_time() < deadline
        await anyio.sleep(0.01)
