"""Point-in-time LSM views: ``ds.lsm.snapshot()`` pins the shard set, each shard's
generations and WAL position, and the base version; every read given it sees
exactly that state, in any process, whatever is written, flushed or compacted
meanwhile, until a clean-up deletes what it pins (then ``ViewExpiredError``).

The writers run in other processes (``tests/lsm/procs.py``); a pickled view
is read by a fresh process too.
"""

from __future__ import annotations

import pickle
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest

import lance_async as la
from lance_async import LsmSnapshot

from ..helpers import kv_table
from .procs import ops
from .test_wal_tail import Proc, by_id, model_of, new_table


async def reads(ds: la.AsyncDataset, snapshot: LsmSnapshot | None) -> dict[str, dict[int, int]]:
    """What a scan and a lookup of every key show (through ``snapshot``, or now)."""
    scan = await ds.lsm.scan(columns=["id", "value"], snapshot=snapshot).to_table()
    found = await ds.lsm.point_lookups(list(range(300)), ["id", "value"], snapshot=snapshot)
    return {"scan": by_id(scan), "lookups": by_id(found)}


def read_elsewhere(uri: str, snapshot: LsmSnapshot, work: Path) -> dict[str, Any]:
    """The same reads in a fresh process, through the pickled view (blocking)."""
    path = work / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    proc = Proc("read", uri, str(path))
    try:
        line = next(proc.lines())
    finally:
        proc.kill()
    if "error" in line:
        return line
    return {k: {int(i): v for i, v in line[k].items()} for k in ("scan", "lookups")}


def acked_rows_ops(seed: int, rows: int) -> int:
    """Operations of ``ops(seed, ...)`` whose ids add up to at least ``rows``."""
    total = 0
    for n, (_op, ids, _v) in enumerate(ops(seed, 10_000), 1):
        total += len(ids)
        if total >= rows:
            return n
    raise AssertionError("unreachable")  # pragma: no cover


@pytest.mark.asyncio
async def test_a_view_held_across_a_flush_a_compaction_and_1000_acked_rows(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    await new_table(uri)
    first = Proc("writer", uri, "11", "120", "--memtable-rows", "150")
    try:
        lines = await anyio.to_thread.run_sync(first.until, "done")
    finally:
        first.kill()  # its acked rows stay in WAL tails and generations
    ds = await la.open_dataset(uri)
    assert sum((await ds.lsm.unflushed_rows()).values()) > 0, "the view must pin a WAL tail"
    snapshot = await ds.lsm.snapshot()
    assert any(s.sstables for s in snapshot.shards), "the view must pin generations"
    assert all(s.wal_end is not None for s in snapshot.shards)
    before = await reads(ds, snapshot)
    assert before["scan"] == before["lookups"] == model_of(lines)

    n = acked_rows_ops(12, 1_000)
    second = Proc("writer", uri, "12", str(n), "--memtable-rows", "100", "--then", "close")
    try:
        more = await anyio.to_thread.run_sync(second.until, "done")
        assert await anyio.to_thread.run_sync(second.popen.wait) == 0  # closed: all flushed
    finally:
        second.kill()
    assert sum(len(line["ids"]) for line in more if "op" in line) >= 1_000
    result = await ds.compact_mem_wal(optimize_indices=False)
    assert result.generations, "a compaction must have merged generations"
    now = await la.open_dataset(uri)
    assert sum((await now.lsm.unflushed_rows()).values()) == 0  # the pinned tail was flushed
    pinned_tails = {s.shard_id: (s.replay_after, s.wal_end) for s in snapshot.shards}
    later = {s.shard_id: s.replay_after for s in await now.lsm.snapshots()}
    assert any(later[s] > after for s, (after, _) in pinned_tails.items())

    expected = model_of(lines + more)
    assert expected != before["scan"]
    assert await reads(now, None) == {"scan": expected, "lookups": expected}
    assert await reads(now, snapshot) == before  # a reader that never saw the view
    assert await reads(ds, snapshot) == before
    assert await anyio.to_thread.run_sync(read_elsewhere, uri, snapshot, tmp_path) == before


@pytest.mark.asyncio
async def test_a_view_whose_files_a_clean_up_deleted_is_expired(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await new_table(uri)
    async with ds.mem_wal_writer(max_memtable_rows=20) as w:
        for i in range(6):
            await w.put(kv_table(range(i * 10, i * 10 + 10), value=i))
    async with ds.mem_wal_writer() as w:
        await w.put(kv_table(range(100, 130), value=7))
        snapshot = await ds.lsm.snapshot()
        before = await reads(ds, snapshot)
        assert {100, 129} <= set(before["scan"])
    await ds.compact_mem_wal(optimize_indices=False)
    # what a storage retention deletes: the base version pinned, the pinned
    # generations' folders and WAL entries (the clean-up removes what it may;
    # the rest goes by hand, as a shorter retention would take it)
    await ds.cleanup_old_versions(older_than=timedelta(0))
    for snap in snapshot.shards:
        folder = Path(uri) / "_mem_wal" / snap.shard_id
        for _gen, path in snap.sstables:
            shutil.rmtree(folder / path, ignore_errors=True)
        shutil.rmtree(folder / "wal", ignore_errors=True)
    elsewhere = await anyio.to_thread.run_sync(read_elsewhere, uri, snapshot, tmp_path)
    assert elsewhere == {"error": "ViewExpiredError"}
    try:  # here, what is in memory may still answer: the same rows, or the error
        assert await reads(ds, snapshot) == before
    except la.ViewExpiredError:
        pass


@pytest.mark.anyio
async def test_a_writers_view_holds_its_memtable_rows(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(5), value=-1), uri)
    await ds.initialize_mem_wal()
    async with ds.mem_wal_writer(durable_write=False) as w:
        await w.put(kv_table([1, 2, 50], value=1))
        snapshot = await w.lsm.snapshot()
        await w.put(kv_table([1, 51], value=2))
        await w.delete({"id": [2]})
        pinned = by_id(await w.lsm.scan(columns=["id", "value"], snapshot=snapshot).to_table())
        assert pinned == {0: -1, 1: 1, 2: 1, 3: -1, 4: -1, 50: 1}
        assert by_id(await w.lsm.scan(columns=["id", "value"]).to_table()) == {
            0: -1, 1: 2, 3: -1, 4: -1, 50: 1, 51: 2,
        }  # fmt: skip
    # the writer is closed (its rows flushed); the view still reads what it held
    row = await w.lsm.point_lookup(2, ["value"], snapshot=snapshot)
    assert row.column("value").to_pylist() == [1]
    assert (await ds.lsm.point_lookup(2)).num_rows == 0


@pytest.mark.asyncio
async def test_a_view_taken_with_one_shard_stays_one_shard(tmp_path: Path) -> None:
    """The issue's case: a list taken with one shard, read after the table had
    four. A view shows exactly what was there; a hand-made list of shard
    snapshots reads what it names, as documented (its tails up to now)."""
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(3), value=-1), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shards = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(4)]
    async with ds.mem_wal_writer(shards[0]) as w:
        await w.put(kv_table([10, 11], value=0))
        view = await ds.lsm.snapshot()
        listed = await ds.lsm.snapshots()
    assert [s.shard_id for s in view.shards] == [shards[0]]
    for i, shard in enumerate(shards):
        async with ds.mem_wal_writer(shard) as w:
            await w.put(kv_table([20 + i, 11], value=i + 1))
    then = {0: -1, 1: -1, 2: -1, 10: 0, 11: 0}
    assert by_id(await ds.lsm.scan(columns=["id", "value"], snapshot=view).to_table()) == then
    by_hand = await ds.lsm.scan(columns=["id", "value"], snapshots=listed).to_table()
    assert by_id(by_hand) == {0: -1, 1: -1, 2: -1, 10: 0, 11: 1, 20: 1}  # shard 0, up to now
    pinned_by_hand = await ds.lsm.scan(columns=["id", "value"], snapshots=view.shards).to_table()
    assert by_id(pinned_by_hand) == then  # its tail pinned (wal_end), the same base


@pytest.mark.anyio
async def test_bad_views_are_refused_before_any_read(tmp_path: Path) -> None:
    one = await new_table(str(tmp_path / "one.lance"))
    other = await new_table(str(tmp_path / "other.lance"))
    view = await one.lsm.snapshot()
    with pytest.raises(la.InvalidInputError, match="not of"):
        other.lsm.scan(snapshot=view)
    with pytest.raises(la.InvalidInputError, match="LsmSnapshot"):
        await one.lsm.point_lookup(1, snapshot=view.shards)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        await one.lsm.point_lookups([1], snapshots=view.shards, snapshot=view)
    with pytest.raises(la.InvalidInputError, match="not of"):
        await other.lsm.vector_search([1.0], column="value", snapshot=view)
    plain = await la.write_dataset(pa.table({"x": [1]}), str(tmp_path / "plain.lance"))
    with pytest.raises(la.InvalidInputError):
        await plain.lsm.snapshot()
    assert repr(view).startswith("<LsmSnapshot")
