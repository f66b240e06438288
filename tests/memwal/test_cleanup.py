"""The MemWAL's garbage collector: storage stays bounded, and what a reader
inside the retention needs is never touched."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.memwal import CompactionPolicy, Compactor, cleanup_table, plan_cleanup

from ..helpers import eventually, kv_table
from ..services import S3Bucket


def files(uri: str) -> dict[str, dict[str, int]]:
    """Per shard: WAL entries, generation folders, manifest versions on disk."""
    out = {}
    root = Path(uri) / "_mem_wal"
    for shard in sorted(p for p in root.iterdir() if p.is_dir()):
        wal = shard / "wal"
        out[shard.name] = {
            "wal": len(list(wal.iterdir())) if wal.exists() else 0,
            "generations": sum(1 for p in shard.iterdir() if "_gen_" in p.name),
            "manifests": sum(1 for p in (shard / "manifest").iterdir() if p.suffix == ".binpb"),
        }
    return out


def disk_bytes(uri: str) -> int:
    return sum(f.stat().st_size for f in Path(uri).rglob("*") if f.is_file())


def by_id(table: pa.Table) -> dict[int, int]:
    return dict(zip(table.column("id").to_pylist(), table.column("value").to_pylist(), strict=True))


async def churn(ds: la.AsyncDataset, rounds: int, keys: int = 200) -> dict[int, int]:
    """Upsert the same keys ``rounds`` times through one routing writer, small
    memtables (many generations), compacting after each round."""
    model = {}
    async with ds.mem_wal_writer(max_memtable_rows=20) as w:
        for r in range(rounds):
            for start in range(0, keys, 10):
                await w.send(kv_table(range(start, start + 10), r))
            model = dict.fromkeys(range(keys), r)
            await w.flush()
            await ds.compact_mem_wal()
    await ds.compact_mem_wal()  # what the close flushed
    return model


@pytest.mark.anyio
async def test_cleanup_with_no_retention_after_churn_leaves_a_few_wal_files_and_no_generation(
    tmp_path: Path,
) -> None:
    """The held-back check: 200 keys upserted for 3 rounds, compacted after each."""
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(1)), uri)
    await ds.initialize_mem_wal(num_buckets=4, bucket_column="id")
    model = await churn(ds, 3)
    model[0] = model.get(0, 0)
    before = files(uri)
    assert sum(s["wal"] for s in before.values()) > 40
    assert sum(s["generations"] for s in before.values()) > 20
    reader = await la.open_dataset(uri)  # opened before the clean-up
    assert by_id(await reader.lsm.scan(columns=["id", "value"]).to_table()) == model

    dry = await cleanup_table(ds, timedelta(0), dry_run=True)
    assert dry.dry_run and files(uri) == before  # a dry run removes nothing
    assert dry.wal_entries_removed > 30 and dry.generations_removed == sum(
        s["generations"] for s in before.values()
    )
    assert len(dry.plan.lines()) >= dry.generations_removed  # type: ignore[union-attr]
    size = disk_bytes(uri)

    done = await cleanup_table(ds, timedelta(0))
    assert (done.wal_entries_removed, done.generations_removed) == (
        dry.wal_entries_removed,
        dry.generations_removed,
    )
    after = files(uri)
    for shard in after.values():
        assert shard["generations"] == 0
        assert shard["wal"] <= 3  # the fence sentinels of the writer claims (one per round)
        assert shard["manifests"] == 1
    assert disk_bytes(uri) < size / 3
    assert by_id(await ds.lsm.scan(columns=["id", "value"]).to_table()) == model
    assert by_id(await reader.lsm.scan(columns=["id", "value"]).to_table()) == model
    assert by_id(await reader.lsm.point_lookups(list(range(200)), columns=["id", "value"])) == {
        k: model[k] for k in range(200)
    }
    assert by_id(await reader.to_table(columns=["id", "value"])) == model
    again = await cleanup_table(ds, timedelta(0))
    assert (again.wal_entries_removed, again.generations_removed, again.old_versions) == (0, 0, 0)


@pytest.mark.asyncio
async def test_nothing_inside_the_retention_is_removed(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(1)), uri)
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    await churn(ds, 2, keys=60)
    before = files(uri)
    kept = await cleanup_table(ds, timedelta(hours=1))
    assert (kept.old_versions, kept.wal_entries_removed, kept.generations_removed) == (0, 0, 0)
    assert files(uri) == before
    # two hours on (a mock clock): everything superseded is past the retention
    later = await plan_cleanup(ds, timedelta(hours=1), now=time.time() + 7200)
    assert later.generations == sum(s["generations"] for s in before.values())
    assert later.base_versions and later.retained_versions == (ds.version,)


@pytest.mark.asyncio
async def test_a_view_held_past_the_retention_gets_view_expired_never_missing_rows(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(1)), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = "6b9c3c0e-5a51-4b5e-9a3f-4a1d5d2b7f10"
    async with ds.mem_wal_writer(shard, max_memtable_rows=10) as w:
        await w.put(kv_table(range(100, 130), 1))  # three generations flushed
        await w.wait_flushed()
        old = await ds.lsm.snapshots()  # generations listed, more rows in the tail next
        await w.put(kv_table(range(130, 135), 1))
    assert old[0].sstables
    await ds.compact_mem_wal()
    await cleanup_table(ds, timedelta(0))
    with pytest.raises(la.ViewExpiredError) as info:
        await ds.lsm.scan(snapshots=old).to_table()
    assert info.value.retryable
    with pytest.raises(la.ViewExpiredError):
        await ds.lsm.point_lookups([100, 131], snapshots=old)
    # a view read now is whole
    assert sorted(by_id(await ds.lsm.scan(columns=["id", "value"]).to_table())) == [
        0,
        *range(100, 135),
    ]


@pytest.mark.asyncio
async def test_a_wal_tail_removed_under_an_old_view_is_an_error_not_an_empty_tail(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(1)), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = "6b9c3c0e-5a51-4b5e-9a3f-4a1d5d2b7f10"
    async with ds.mem_wal_writer(shard) as w:
        await w.put(kv_table(range(10, 20), 1))
        old = await ds.lsm.snapshots()  # nothing flushed: the rows are in the tail
    assert not old[0].sstables and old[0].replay_after == 0
    await cleanup_table(ds, timedelta(0))  # the close flushed them: entries go
    reader = await la.open_dataset(uri)  # a process that never read the tail
    with pytest.raises(la.ViewExpiredError):
        await reader.lsm.scan(snapshots=old).to_table()
    got = by_id(await reader.lsm.scan(columns=["id", "value"]).to_table())
    assert got == {0: 0, **dict.fromkeys(range(10, 20), 1)}


@pytest.mark.asyncio
async def test_a_stalled_writer_is_still_fenced_after_the_clean_up(tmp_path: Path) -> None:
    """The sentinel a newer writer leaves stays: a stalled writer's next put
    collides with it instead of landing in a removed position (and being
    acknowledged, and lost)."""
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(1)), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = "6b9c3c0e-5a51-4b5e-9a3f-4a1d5d2b7f10"
    with pytest.raises(la.FencedError):  # its close, after the put below
        async with ds.mem_wal_writer(shard) as stalled:
            await stalled.put(kv_table(range(5), 1))
            other = await la.open_dataset(uri)
            async with other.mem_wal_writer(shard) as newer:  # claims the shard
                await newer.put(kv_table(range(5, 10), 2))
            await ds.compact_mem_wal()
            done = await cleanup_table(ds, timedelta(0))
            assert done.wal_entries_removed > 0 and done.plan is not None
            assert done.plan.shards[0].fences_kept == 1
            with pytest.raises(la.FencedError):
                await stalled.put(kv_table(range(50, 55), 3))
    got = by_id(await ds.lsm.scan(columns=["id", "value"]).to_table())
    assert got == {0: 0, **dict.fromkeys(range(5), 1), **dict.fromkeys(range(5, 10), 2)}


@pytest.mark.anyio
async def test_the_compactor_cleans_up_by_its_retention(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(1)), uri)
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    policy = CompactionPolicy(
        max_generations=0,
        interval=0.02,
        optimize_indices=False,
        retention=timedelta(0),
        cleanup_interval=0.02,
    )
    model = {0: 0}
    async with ds.mem_wal_writer(max_memtable_rows=10) as w:
        for r in range(4):
            await w.put(kv_table(range(100), r))
            model.update(dict.fromkeys(range(100), r))
    async with Compactor(await la.open_dataset(uri), policy) as compactor:

        def caught_up() -> bool:
            s = compactor.stats()
            return bool(s.cleanups and s.generations and s.generations == s.generations_removed)

        await eventually(caught_up, 60, "a clean-up after the last compaction")
    stats = compactor.stats()
    assert stats.cleanup_failures == 0 and stats.wal_entries_removed > 0, stats
    assert all(s["generations"] == 0 for s in files(uri).values())
    assert by_id(await ds.lsm.scan(columns=["id", "value"]).to_table()) == model


@pytest.mark.anyio
async def test_the_tail_checkpoints_of_flushed_entries_go_with_them(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(3)), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = "00000000-0000-4000-8000-000000000001"
    points = Path(uri) / "_mem_wal" / shard / "lance_async_tail"
    async with ds.mem_wal_writer(shard, max_wal_flush_interval_ms=1) as writer:
        for i in range(300):  # a WAL entry each: past a checkpoint's 256
            await writer.put(kv_table([1000 + i], value=i))
        # a reader's read of the tail checkpoints it (in the background)
        assert (await ds.lsm.point_lookup(1299)).num_rows == 1
        await eventually(lambda: points.is_dir() and any(points.iterdir()), 60, "a checkpoint")
    await ds.compact_mem_wal()
    plan = await plan_cleanup(ds, timedelta(0))
    assert sum(s.checkpoints for s in plan.shards) >= 1
    assert any("lance_async_tail" in line for line in plan.lines())
    await cleanup_table(ds, timedelta(0))
    assert not points.is_dir() or not any(points.iterdir())
    fresh = await la.open_dataset(uri)
    assert await fresh.count_rows(use_lsm=True) == 303


def test_the_policy_checks_its_retention() -> None:
    with pytest.raises(TypeError):
        CompactionPolicy(retention=60)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        CompactionPolicy(retention=timedelta(seconds=-1))
    with pytest.raises(ValueError):
        CompactionPolicy(cleanup_interval=0)
    assert CompactionPolicy().retention == timedelta(hours=1)


@pytest.mark.asyncio
async def test_dataset_cleanup_old_versions_cleans_the_mem_wal_too(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(1)), uri)
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    model = await churn(ds, 2, keys=60)
    stats = await ds.cleanup_old_versions(older_than=timedelta(0))
    assert stats.old_versions > 0 and stats.bytes_removed > 0  # pylance's half
    assert stats.generations_removed > 0 and stats.wal_entries_removed > 0
    assert all(s["generations"] == 0 for s in files(uri).values())
    got = by_id(await ds.lsm.scan(columns=["id", "value"]).to_table())
    assert got == {0: 0, **model}
    base_only = await ds.cleanup_old_versions(older_than=timedelta(0), mem_wal=False)
    assert base_only.wal_entries_removed == 0 and base_only.plan is None


@pytest.mark.asyncio
async def test_cleanup_on_s3(s3_bucket: S3Bucket) -> None:
    uri = s3_bucket.uri("gc.lance")
    options: dict[str, Any] = s3_bucket.storage_options
    ds = await la.write_dataset(kv_table(range(1)), uri, storage_options=options)
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    model = await churn(ds, 2, keys=40)
    dry = await cleanup_table(ds, timedelta(0), dry_run=True)
    done = await cleanup_table(ds, timedelta(0))
    assert done.generations_removed == dry.generations_removed > 0
    assert done.wal_entries_removed == dry.wal_entries_removed > 0
    left = await plan_cleanup(ds, timedelta(0))
    assert left.generations == left.wal_entries == left.manifests == 0
    assert all(s.generations_left == 0 and s.wal_left <= 2 for s in left.shards)
    reader = await la.open_dataset(uri, storage_options=options)
    got = by_id(await reader.lsm.scan(columns=["id", "value"]).to_table())
    assert got == {0: 0, **model}


def test_the_command_lists_then_removes(tmp_path: Path) -> None:
    import subprocess
    import sys

    uri = str(tmp_path / "t.lance")

    async def make() -> None:
        ds = await la.write_dataset(kv_table(range(1)), uri)
        await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
        await churn(ds, 2, keys=40)

    anyio.run(make)
    before = files(uri)
    cmd = [sys.executable, "-m", "lance_async", "cleanup", uri, "--retention", "0"]
    env = {**os.environ, "LANCE_LOG": "critical"}
    dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "would remove" in dry.stdout and "_gen_" in dry.stdout
    assert files(uri) == before
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("removed")
    assert all(s["generations"] == 0 for s in files(uri).values())
    bad = subprocess.run([*cmd[:-1], "soon"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "not a duration" in bad.stderr
