"""The engine's memory pool: sized from lance_async, a typed error with advice (item 8);
freed memory returned to the operating system (issue 37)."""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

import lance_async as la

from .helpers import PK

SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.float64())]
)


@pytest.fixture
def restore_memory() -> Iterator[None]:
    names = (
        "LANCE_MEM_POOL_SIZE",
        "LANCE_MAX_TEMP_DIRECTORY_SIZE",
        "LANCE_ASYNC_TRIM_SECONDS",
        "LANCE_ASYNC_MALLOC_ARENA_MAX",
    )
    saved = {k: os.environ.get(k) for k in names}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def rows(lo: int, hi: int, v: float) -> pa.Table:
    return pa.table({"id": np.arange(lo, hi), "v": np.full(hi - lo, v)}, schema=SCHEMA)


def test_configure_memory_sets_restores_and_checks(restore_memory: None) -> None:
    limits = la.configure_memory(pool_bytes=256 << 20, max_temp_directory_bytes=1 << 30)
    assert limits == la.MemoryLimits(256 << 20, 1 << 30)
    assert la.configure_memory(pool_bytes=None) == la.MemoryLimits(None, 1 << 30)  # the other kept
    assert la.memory_limits().pool_bytes is None
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="pool_bytes"):
            la.configure_memory(pool_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_regression_an_exhausted_memory_pool_is_a_typed_error_with_advice(
    table_uri: str, restore_memory: None
) -> None:
    # Before: a bare OSError("Resources exhausted ...") and no way to size the pool
    ds = await la.write_dataset(rows(0, 50_000, 0.0), table_uri)
    await ds.create_scalar_index("id", "BTREE")
    version = ds.version
    upsert = rows(25_000, 75_000, 1.0)
    la.configure_memory(pool_bytes=4096)
    with pytest.raises(la.ResourceExhaustedError, match="configure_memory") as err:
        await (
            ds.merge_insert()
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(upsert)
        )
    assert err.value.pool_bytes == 4096
    assert "4,096 bytes" in str(err.value)
    assert (await la.open_dataset(table_uri)).version == version
    la.configure_memory(pool_bytes=None)  # the engine's default again, from the next call
    result = (
        await ds.merge_insert()
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(upsert)
    )
    assert (result.num_updated_rows, result.num_inserted_rows) == (25_000, 25_000)


GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_release_memory_gives_back_free_pages_inside_the_heap() -> None:
    # 4 KiB blocks come from malloc's heap, not from mmap; one kept in 64
    # pins the heap, so free() can give back nothing but its top (the
    # pattern of a long-lived process: WAL entries freed around live ones)
    blocks = [bytes(4096) for _ in range(40_000)]  # ~160 MiB
    kept = blocks[::64]
    del blocks
    before = rss_bytes()
    assert la.release_memory() is True
    after = rss_bytes()
    assert before - after > 64 << 20, (before, after)
    assert len(kept) == 625 and all(len(b) == 4096 for b in kept)  # live memory untouched
    stats = la.memory_stats()
    assert stats.releases >= 1 and stats.seconds > 0


def test_configure_memory_sets_and_checks_the_release_knobs(restore_memory: None) -> None:
    limits = la.configure_memory(trim_seconds=2.5, malloc_arena_max=4)
    assert (limits.trim_seconds, limits.malloc_arena_max) == (2.5, 4)
    assert la.configure_memory(trim_seconds=0).trim_seconds == 0.0  # off
    assert la.configure_memory(trim_seconds=None, malloc_arena_max=None) == la.memory_limits()
    assert (la.memory_limits().trim_seconds, la.memory_limits().malloc_arena_max) == (None, None)
    for bad in (-1, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ValueError, match="trim_seconds"):
            la.configure_memory(trim_seconds=bad)  # type: ignore[arg-type]
    for bad_arenas in (0, -2, 1.5):
        with pytest.raises(ValueError, match="malloc_arena_max"):
            la.configure_memory(malloc_arena_max=bad_arenas)  # type: ignore[arg-type]


def releasing() -> bool:
    return any(t.name == "lance_async release" for t in threading.enumerate())


def wait_for(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout  # a timeout for "eventually", not a bound
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not reached before the deadline"
        time.sleep(0.01)


def test_freed_memory_is_returned_at_most_once_per_interval(restore_memory: None) -> None:
    from lance_async._memory import memory_freed

    wait_for(lambda: not releasing())
    la.configure_memory(trim_seconds=0)  # off: nothing starts
    memory_freed()
    assert not releasing()
    la.configure_memory(trim_seconds=1e-9)
    before = la.memory_stats().automatic
    memory_freed()
    wait_for(lambda: la.memory_stats().automatic > before)
    wait_for(lambda: not releasing())
    la.configure_memory(trim_seconds=3600)  # the one just done was less than an hour ago
    done = la.memory_stats().automatic
    memory_freed()
    memory_freed()
    assert not releasing() and la.memory_stats().automatic == done
