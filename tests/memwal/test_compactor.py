"""Background compaction (Compactor, CompactionPolicy) under concurrent ingest and lookups."""

from __future__ import annotations

import random
from typing import Any

import anyio
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.memwal import CompactionPolicy, Compactor

from ..helpers import kv_table


def _rows(table: pa.Table) -> dict[int, tuple[Any, Any]]:
    return {r["id"]: (r["value"], r["name"]) for r in table.to_pylist()}


@pytest.mark.asyncio
async def test_compaction_under_concurrent_ingest_and_lookups(table_uri: str) -> None:
    """No row lost, none resurrected, deletes honoured, newest version wins,
    while a compactor merges generations that keep flushing."""
    ds = await la.write_dataset(kv_table(range(300)), table_uri)
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    model: dict[int, tuple[Any, Any]] = {i: (0, f"n{i}") for i in range(300)}
    policy = CompactionPolicy(max_generations=1, interval=0.02, optimize_indices=False)
    opts: dict[str, Any] = {"max_memtable_rows": 40, "max_put_rows": 40, "durable_write": False}
    rng = random.Random(7)
    async with ds.mem_wal_writer(compaction=policy, **opts) as router:
        assert router.compactor is not None
        for step in range(1, 60):
            ids = rng.sample(range(400), 25)
            await router.put(kv_table(ids, step))
            for i in ids:
                model[i] = (step, f"n{i}")
            gone = rng.sample(range(400), 4)
            await router.delete({"id": gone})
            for i in gone:
                model.pop(i, None)
            # read-your-writes while generations flush and compact underneath
            probe = [*ids[:4], *gone[:2], rng.randrange(400)]
            async with anyio.create_task_group() as tg:
                for key in probe:

                    async def one(k: int = key, at: int = step) -> None:
                        got = _rows(await router.lsm.point_lookup(k))
                        assert got == ({k: model[k]} if k in model else {}), (at, k)

                    tg.start_soon(one)
            if step % 20 == 0:
                scanned = _rows(await router.lsm.scan().to_table())
                assert scanned == model, step
        compactor = router.compactor
    stats = compactor.stats()
    assert stats.compactions >= 3, stats
    assert stats.generations >= stats.compactions
    assert stats.rows_upserted > 0 and stats.rows_deleted > 0
    assert stats.failures == 0, stats.last_error
    assert stats.state is la.WriterState.CLOSED
    # after the writers flushed on close: the dataset's own LSM view, then compact the rest
    assert _rows(await ds.lsm.scan().to_table()) == model
    await ds.compact_mem_wal()
    assert all(not s.sstables for s in await ds.lsm.snapshots())
    assert _rows(await ds.to_table()) == model
    assert _rows(await ds.lsm.point_lookups(sorted(model)[:50])) == {
        k: model[k] for k in sorted(model)[:50]
    }


@pytest.mark.asyncio
async def test_compactor_standalone_follows_its_policy(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(10)), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = "6b9c3c0e-5a51-4b5e-9a3f-4a1d5d2b7f10"
    async with ds.mem_wal_writer(shard, max_memtable_rows=5, durable_write=False) as w:
        for i in range(4):
            await w.put(kv_table(range(i * 5, i * 5 + 5), 1))
        await w.wait_flushed()
    snaps = await ds.lsm.snapshots()
    assert len(snaps[0].sstables) >= 4
    quiet = Compactor(ds, CompactionPolicy(max_generations=10))
    result = await quiet.run_once()
    assert result.commits == 0 and quiet.stats().compactions == 0  # 4 <= 10: not due
    async with Compactor(ds, CompactionPolicy(max_generations=2, interval=0.01)) as busy:
        with anyio.fail_after(30):
            while busy.stats().compactions == 0:  # noqa: ASYNC110 - polling a counter
                await anyio.sleep(0.01)
    assert busy.stats().state is la.WriterState.CLOSED
    assert (await ds.lsm.snapshots())[0].sstables == ()
    assert _rows(await ds.to_table()) == {i: (1, f"n{i}") for i in range(20)}
    with pytest.raises(la.ClosedError):
        await busy.start(None)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_callable_shard_set_is_asked_at_every_pass(table_uri: str) -> None:
    """A cluster worker's compactor: only the shards it owns now are compacted."""
    ds = await la.write_dataset(kv_table([]), table_uri)
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    sharding = await ds.sharding()
    first, second = sharding.shard_ids()
    async with ds.mem_wal_writer(max_memtable_rows=5, durable_write=False) as router:
        for i in range(8):
            await router.put(kv_table(range(i * 10, i * 10 + 10), 1))
        await router.flush()
    owned: list[str] = []
    compactor = Compactor(ds, CompactionPolicy(max_generations=0), shard_ids=lambda: owned)
    nothing = await compactor.run_once()
    assert nothing.commits == 0 and nothing.generations == {}  # owns no shard yet
    owned.append(first)
    result = await compactor.run_once()
    assert set(result.generations) == {first}
    snaps = {s.shard_id: s for s in await ds.lsm.snapshots()}
    assert snaps[first].sstables == () and snaps[second].sstables != ()
    owned[:] = [second]
    assert set((await compactor.run_once()).generations) == {second}
    assert _rows(await ds.to_table()) == {i: (1, f"n{i}") for i in range(80)}


@pytest.mark.asyncio
async def test_compaction_policy_checks_its_values() -> None:
    with pytest.raises(ValueError):
        CompactionPolicy(max_generations=-1)
    with pytest.raises(ValueError):
        CompactionPolicy(interval=0)
    with pytest.raises(ValueError):
        CompactionPolicy(interval=5, max_backoff=1)
    assert CompactionPolicy(max_bytes=0).max_bytes == 0


@pytest.mark.asyncio
async def test_generations_holding_only_deletes_are_marked_compacted(table_uri: str) -> None:
    """The upsert pass has no rows then; its commit must still mark the generations."""
    ds = await la.write_dataset(kv_table(range(10)), table_uri)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer("6b9c3c0e-5a51-4b5e-9a3f-4a1d5d2b7f10") as w:
        await w.delete({"id": [1, 2, 3]})
    result = await ds.compact_mem_wal()
    assert result.rows_deleted == 3 and result.rows_upserted == 0
    assert (await ds.lsm.snapshots())[0].sstables == ()
    assert sorted(_rows(await ds.to_table())) == [0, 4, 5, 6, 7, 8, 9]
