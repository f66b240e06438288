"""Point lookups through the base table's key index (basekeys.py): the same rows as the
engine's filtered path, never a stale version's."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

import lance_async as la
from lance_async.lsm import lookup
from lance_async.lsm.basekeys import BaseKeyCache

from ..helpers import PK, kv_table
from .support import sid


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[BaseKeyCache]:
    """A cache that indexes a version at its first lookup."""
    fresh = BaseKeyCache(min_lookups=1)
    monkeypatch.setattr(lookup, "base_keys", fresh)
    yield fresh
    fresh.wait_built()


async def values(ds: la.AsyncDataset, keys: list[int]) -> dict[int, int]:
    rows = await ds.lsm.point_lookups(keys)
    return dict(zip(rows.column("id").to_pylist(), rows.column("value").to_pylist(), strict=True))


@pytest.mark.asyncio
async def test_indexed_lookups_answer_what_the_engine_does(
    table_uri: str, cache: BaseKeyCache
) -> None:
    ds = await la.write_dataset(kv_table(range(400)), table_uri)
    await ds.delete("id % 7 = 0")  # rows deleted in the base itself
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(sid(), max_memtable_rows=40) as w:
        await w.put(kv_table(range(0, 400, 5), 1))  # generations that shadow base rows
        await w.delete({"id": list(range(1, 400, 11))})
    expected = {i: 0 for i in range(400) if i % 7}
    expected.update({i: 1 for i in range(0, 400, 5)})
    for i in range(1, 400, 11):
        expected.pop(i, None)
    keys = [*range(-3, 410), 3, 3]
    await ds.lsm.point_lookup(2)  # the first lookup of this version starts its build
    cache.wait_built()
    assert cache.builds == 1
    got = await values(ds, keys)
    assert got == {k: v for k, v in expected.items() if k in keys}
    repeated = await ds.lsm.point_lookups([3, 3, 14, 5])
    assert repeated.column("id").to_pylist() == [3, 3, 5]  # 14 deleted in the base
    for key in (1, 2, 5, 7, 12, 399, 400):  # single lookups take the same path
        rows = (await ds.lsm.point_lookup(key)).column("value").to_pylist()
        assert rows == ([expected[key]] if key in expected else []), key
    assert cache.builds == 1  # one version, one build


@pytest.mark.asyncio
async def test_a_new_base_version_is_not_answered_from_an_old_index(
    table_uri: str, cache: BaseKeyCache
) -> None:
    ds = await la.write_dataset(kv_table(range(100)), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    await ds.lsm.point_lookup(1)
    cache.wait_built()
    assert cache.builds == 1
    async with ds.mem_wal_writer(sid(), max_memtable_rows=10) as w:
        await w.put(kv_table(range(0, 100, 2), 5))
        await w.delete({"id": [1, 3]})
    await ds.compact_mem_wal()  # the base moves: rows rewritten, rows deleted
    # the first lookups of the new version take the engine's path, then its own index
    for _ in range(2):
        got = await values(ds, list(range(100)))
        assert got == {i: (5 if i % 2 == 0 else 0) for i in range(100) if i not in (1, 3)}
        cache.wait_built()
    assert cache.builds == 2


@pytest.mark.asyncio
async def test_tables_past_the_row_limit_are_not_indexed(
    table_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = BaseKeyCache(max_rows=10, min_lookups=1)
    monkeypatch.setattr(lookup, "base_keys", small)
    ds = await la.write_dataset(kv_table(range(50)), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    for _ in range(3):
        assert await values(ds, [4, 60]) == {4: 0}
        small.wait_built()
    assert small.builds == 0


@pytest.mark.asyncio
async def test_composite_string_keys_through_the_index(table_uri: str, cache: BaseKeyCache) -> None:
    schema = pa.schema(
        [
            pa.field("user", pa.string(), nullable=False, metadata=PK),
            pa.field("day", pa.int32(), nullable=False, metadata=PK),
            pa.field("score", pa.float64()),
        ]
    )
    users = [f"u{i:03d}" for i in range(60)] + ["", "é"]
    rows = pa.table(
        {"user": users * 2, "day": [1] * len(users) + [2] * len(users), "score": [1.0] * 124},
        schema=schema,
    )
    ds = await la.write_dataset(rows, table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    await ds.lsm.point_lookup(("u000", 1))
    cache.wait_built()
    assert cache.builds == 1
    got = await ds.lsm.point_lookups([("é", 2), ("u059", 1), ("nobody", 1), ("", 1), ("u001", 3)])
    pairs = zip(got.column("user").to_pylist(), got.column("day").to_pylist(), strict=True)
    assert list(pairs) == [
        ("é", 2),
        ("u059", 1),
        ("", 1),
    ]
