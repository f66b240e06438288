"""compact_mem_wal: flushed generations merged into the base table."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import lance_async as la

from ..helpers import CommitHook, upsert_sync
from .support import check_dataset_reads, model_plain, plain, rows, setup


@pytest.mark.asyncio
async def test_compaction_of_chosen_shards_leaves_the_others(table_uri: str) -> None:
    ds, model = await setup(table_uri)
    shard_a, shard_b = str(uuid.uuid4()), str(uuid.uuid4())
    opts: dict[str, Any] = {"max_memtable_rows": 10, "max_put_rows": 10, "durable_write": False}
    async with ds.mem_wal_writer(shard_a, **opts) as a, ds.mem_wal_writer(shard_b, **opts) as b:
        for v in (1, 2):
            upd_a, upd_b = rows(range(0, 40, 2), v), rows(range(1, 40, 2), v)
            await a.put(upd_a)
            await b.put(upd_b)
            model.put(upd_a)
            model.put(upd_b)
    result = await ds.compact_mem_wal([shard_a])
    assert set(result.generations) == {shard_a}
    snaps = {s.shard_id: s for s in await ds.lsm.snapshots()}
    assert snaps[shard_a].sstables == () and snaps[shard_b].sstables
    await check_dataset_reads(ds, model.rows)  # base + shard b's generations
    rest = await ds.compact_mem_wal()
    assert set(rest.generations) == {shard_b}
    await check_dataset_reads(ds, model.rows)
    assert plain(await ds.to_table()) == model_plain(model.rows)


@pytest.mark.asyncio
@pytest.mark.commit_lock
async def test_compaction_that_loses_a_commit_race_replays_the_sstable(table_uri: str) -> None:
    ds, model = await setup(table_uri)
    async with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=20, max_put_rows=20) as w:
        upd = rows(range(0, 60), 4)
        await w.put(upd)
        model.put(upd)
    # a base write to rows the generations update commits first: the
    # compaction's commit conflicts, and its retry re-reads the SSTable
    competing = rows(range(0, 10), 8)
    hook = CommitHook(lambda: upsert_sync(table_uri, competing), times=1)
    contended = await la.open_dataset(table_uri, commit_lock=hook)
    result = await contended.compact_mem_wal(optimize_indices=False)
    assert result.num_attempts > result.commits  # the lost commit was retried by replay
    # the generations are newer than the base: their rows win over the competitor's
    assert plain(await contended.to_table()) == model_plain(model.rows)
    assert all(s.sstables == () for s in await contended.lsm.snapshots())
