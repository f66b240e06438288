"""LSM reads across levels and shards, and compaction (asyncio and trio).

The scenario: a base table with a vector index, two shards writing disjoint
keys (even / odd) through AsyncShardWriters with tiny memtables, so that
generations flush while the writers are open. A Python model tracks the
newest state of every key; every read is checked against it before a flush,
after flushes, after the writers close and after compaction.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_async as la

from ..helpers import PK, Ticker
from .support import (
    DIM,
    SCHEMA,
    check_dataset_reads,
    model_plain,
    plain,
    rows,
    setup,
    vec_for,
)


@pytest.mark.asyncio
async def test_reads_through_every_stage_of_the_lsm(table_uri: str) -> None:
    ds, model = await setup(table_uri)
    shard_a, shard_b = str(uuid.uuid4()), str(uuid.uuid4())
    # durable writes: each writer's acked rows are in its shard's WAL, which
    # every read sees (the other writer's too) before any flush
    opts: dict[str, Any] = {"max_memtable_rows": 64, "max_put_rows": 64}
    async with ds.mem_wal_writer(shard_a, **opts) as a, ds.mem_wal_writer(shard_b, **opts) as b:
        first_a, first_b = rows(range(0, 20, 2), 1), rows(range(1, 20, 2), 1)
        await a.put(first_a)
        await b.put(first_b)
        model.put(first_a)
        model.put(first_b)
        seen_by_a = model
        stream = a.lsm.scan(columns=["value", "id"])
        assert stream.schema.names == ["value", "id"]  # known before it opens
        assert plain(await stream.to_table()) == {
            i: {"value": r["value"], "id": i} for i, r in seen_by_a.rows.items()
        }
        assert plain(await b.lsm.scan().to_table()) == model_plain(model.rows)
        assert plain(await a.lsm.point_lookup(2)) == model_plain(model.subset([2]))
        assert plain(await b.lsm.point_lookup(3)) == model_plain(model.subset([3]))
        assert plain(await a.lsm.point_lookup(3)) == model_plain(model.subset([3]))
        assert plain(await ds.lsm.point_lookup(3)) == model_plain(model.subset([3]))
        query = vec_for(2, 1)
        near = await a.lsm.vector_search(
            query, column="vec", k=4, nprobes=5, columns=["id", "value"]
        )
        assert near.column_names == ["id", "value", "_distance"]
        assert near.column("id").to_pylist() == seen_by_a.knn(query, 4)
        assert near.column("value").to_pylist() == [
            seen_by_a.rows[i]["value"] for i in seen_by_a.knn(query, 4)
        ]
        # more writes: memtables seal and flush while the writers are open
        for v in range(2, 6):
            upd_a = rows(range(0, 120, 2), v)
            upd_b = rows(range(1, 120, 2), v)
            await a.put(upd_a)
            await b.put(upd_b)
            model.put(upd_a)
            model.put(upd_b)
        new_a, new_b = rows(range(200, 240, 2), 9), rows(range(201, 240, 2), 9)
        await a.put(new_a)
        await b.put(new_b)
        model.put(new_a)
        model.put(new_b)
        await b.delete({"id": [51, 53, 203]})
        model.delete([51, 53, 203])
        # writer reads include their own memtable and everything durable in the other shard
        await a.wait_flushed()
        await b.wait_flushed()
        snaps = await ds.lsm.snapshots()
        assert {s.shard_id for s in snaps} == {shard_a, shard_b}
        assert all(s.sstables for s in snaps)
        for key, writer in ((2, a), (51, b), (203, b), (238, a)):
            got = await writer.lsm.point_lookup(key, snapshots=snaps)
            assert plain(got) == model_plain(model.subset([key])), key
        # each writer's own keys (even ids for a, odd for b) are exact in its
        # view: its memtable, both shards' flushed generations and the base
        for writer, parity in ((a, 0), (b, 1)):
            own = plain(await writer.lsm.scan(filter=f"id % 2 = {parity}").to_table())
            assert own == model_plain({i: r for i, r in model.rows.items() if i % 2 == parity})
            query = vec_for(100 + parity, 5)
            top = await writer.lsm.vector_search(
                query, column="vec", k=5, filter=f"id % 2 = {parity}"
            )
            expected = model.knn(query, 5, keep=lambda i, p=parity: i % 2 == p)
            assert top.column("id").to_pylist() == expected
            assert plain(top.drop_columns(["_distance"])) == model_plain(model.subset(expected))
    # after close: both memtables are flushed; dataset-level reads see everything
    await check_dataset_reads(ds, model.rows)
    for q in ([100.53] * DIM, [7.21] * DIM, [230.87] * DIM):
        got = await ds.lsm.vector_search(q, column="vec", k=6)
        assert got.column("id").to_pylist() == model.knn(q, 6)
        assert "_distance" in got.column_names
    # compaction: same answers, generations marked compacted
    before = await ds.lsm.snapshots()
    result = await ds.compact_mem_wal()
    assert set(result.generations) == {shard_a, shard_b}
    assert result.rows_deleted >= 2
    after = await ds.lsm.snapshots()
    for snap in after:
        assert snap.sstables == ()
        prior = next(s for s in before if s.shard_id == snap.shard_id)
        assert snap.compacted_generation == max(g for g, _ in prior.sstables)
    stats = ds.lance.stats.index_stats("__lance_mem_wal")
    assert stats["num_compacted_sstables"] == 2
    await check_dataset_reads(ds, model.rows)
    assert plain(await ds.to_table()) == model_plain(model.rows)  # the base table alone
    got = await ds.lsm.vector_search([100.53] * DIM, column="vec", k=6)
    assert got.column("id").to_pylist() == model.knn([100.53] * DIM, 6)
    # compacted SSTables no longer shadow the base: a later base update wins
    await ds.update({"value": "77"}, where="id = 2")
    assert (await ds.lsm.point_lookup(2)).column("value").to_pylist() == [77]
    # nothing left to compact
    again = await ds.compact_mem_wal()
    assert again.commits == 0


@pytest.mark.asyncio
async def test_lookup_right_after_flushes_never_fails(table_uri: str) -> None:
    ds = await la.write_dataset(rows(range(10), 0), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    errors: list[BaseException] = []
    done = anyio.Event()
    found = 0

    async def lookups() -> None:
        nonlocal found
        while not done.is_set():
            try:
                got = await ds.lsm.point_lookup(5)
                found += got.num_rows
            except Exception as exc:  # pragma: no cover - shown by the assert
                errors.append(exc)
            await anyio.lowlevel.checkpoint()

    writer = ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=50, max_put_rows=50)
    async with writer as w, anyio.create_task_group() as tg:
        tg.start_soon(lookups)
        for start in range(100, 3_100, 50):
            await w.put(rows(range(start, start + 50), 1))  # every put seals a memtable
        done.set()
    assert not errors, errors[:3]
    assert found > 0
    assert (await ds.lsm.scan(columns=["id"]).to_table()).num_rows == 10 + 3_000


@pytest.mark.asyncio
async def test_composite_keys_and_bad_keys(table_uri: str) -> None:
    schema = pa.schema(
        [
            pa.field("region", pa.string(), nullable=False, metadata=PK),
            pa.field("n", pa.int32(), nullable=False, metadata=PK),
            pa.field("v", pa.float64()),
        ]
    )
    ds = await la.write_dataset(
        pa.table(
            {"region": ["eu", "us", "eu"], "n": [1, 1, 2], "v": [1.0, 2.0, 3.0]}, schema=schema
        ),
        table_uri,
    )
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(str(uuid.uuid4())) as w:
        await w.put(pa.table({"region": ["eu"], "n": [2], "v": [30.0]}, schema=schema))
        got = await w.lsm.point_lookup({"region": "eu", "n": 2})
        assert got.column("v").to_pylist() == [30.0]
        got = await w.lsm.point_lookup(("us", 1))
        assert got.column("v").to_pylist() == [2.0]
        with pytest.raises(la.InvalidInputError):
            await w.lsm.point_lookup("eu")  # composite key needs both parts
        with pytest.raises(la.SchemaMismatchError):
            await w.lsm.point_lookup({"region": "eu"})
        assert (await w.lsm.point_lookup(("o'neil", 1))).num_rows == 0  # quoting is safe
    got = await ds.lsm.point_lookup({"region": "eu", "n": 2})
    assert got.column("v").to_pylist() == [30.0]
    with pytest.raises(la.InvalidInputError):
        await ds.lsm.point_lookup(("eu", "not a number"))


@pytest.mark.asyncio
async def test_shard_snapshots_of_a_table_without_mem_wal(table_uri: str) -> None:
    ds = await la.write_dataset(rows(range(3), 0), table_uri)
    assert await ds.lsm.snapshots() == []
    assert (await ds.lsm.scan().to_table()).num_rows == 3
    assert (await ds.lsm.point_lookup(1)).num_rows == 1


@pytest.mark.asyncio
async def test_snapshots_convert_to_engine_snapshots(table_uri: str) -> None:
    ds, _ = await setup(table_uri)
    async with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=10, max_put_rows=10) as w:
        await w.put(rows(range(300, 350), 1))
    snaps = await ds.lsm.snapshots()
    assert len(snaps) == 1 and len(snaps[0].sstables) >= 4
    engine = [s.lance for s in snaps]
    scanner = lance.mem_wal.LsmScanner.from_snapshots(ds.lance, engine)
    assert scanner.count_rows() == 250


@pytest.mark.asyncio
async def test_loop_stays_free_during_an_lsm_scan(tmp_path: Path) -> None:
    n = 1_000_000
    uri = str(tmp_path / "t.lance")
    base = pa.table(
        {
            "id": pa.array(np.arange(n), pa.int64()),
            "value": pa.array(np.zeros(n, dtype=np.int64)),
            "vec": pa.FixedSizeListArray.from_arrays(
                pa.array(np.zeros(n * DIM, dtype=np.float32)), DIM
            ),
        },
        schema=SCHEMA,
    )
    ds = await la.write_dataset(base, uri)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(str(uuid.uuid4()), durable_write=False) as w:
        await w.put(rows(range(0, 20_000), 3))
    ticker = Ticker()
    total = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        async for batch in ds.lsm.scan(columns=["id", "value"]):
            total += batch.num_rows
        ticker.running = False
    assert total == n
    ticker.assert_free()


@pytest.mark.asyncio
async def test_regression_bad_filters_and_keys_are_typed(table_uri: str) -> None:
    ds = await la.write_dataset(rows(range(3), 0), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    with pytest.raises(la.InvalidInputError):
        await ds.lsm.scan(filter="id >>> 1").to_table()
    with pytest.raises(la.InvalidInputError, match="null"):
        await ds.lsm.point_lookup(None)
    async with ds.mem_wal_writer(str(uuid.uuid4())) as w:
        with pytest.raises(la.InvalidInputError):
            await w.lsm.scan(filter="id >>> 1").to_table()
        with pytest.raises(la.InvalidInputError, match="integer"):
            await w.lsm.point_lookup("abc")


@pytest.mark.asyncio
async def test_regression_a_writer_sees_other_shards_flushed_rows(table_uri: str) -> None:
    ds = await la.write_dataset(rows(range(5), 0), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(str(uuid.uuid4())) as reader_side:
        other = await la.open_dataset(table_uri)
        async with other.mem_wal_writer(str(uuid.uuid4())) as a:
            await a.put(rows([7, 8], 3))
        # a's rows are in its flushed generations; the open writer sees them
        got = await reader_side.lsm.point_lookup(7)
        assert got.column("value").to_pylist() == [3]
        scanned = await reader_side.lsm.scan(columns=["id"]).to_table()
        assert sorted(scanned["id"].to_pylist()) == [0, 1, 2, 3, 4, 7, 8]
        # compaction moves them to the base table, which this writer opened before
        await other.compact_mem_wal()
        got = await reader_side.lsm.point_lookup(8)
        assert got.column("value").to_pylist() == [3]
