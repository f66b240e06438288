"""Durable is visible: every LSM read sees the WAL tail of every shard, in any process.

The writer runs in another process (``tests/lsm/procs.py``); the reads here
never open a writer on its shards, until the engine itself is asked to
replay them for the comparison: what a new writer of a shard replays is what
a reader showed before.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import lance
import pyarrow as pa
import pytest
from lance.mem_wal import LsmScanner

import lance_async as la
from lance_async.lsm import ShardSnapshot, wal, walfiles

from ..helpers import KV_SCHEMA, eventually, kv_table
from .procs import ops

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    """A helper process that prints JSON lines (``tests/lsm/procs.py``)."""

    def __init__(self, *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.lsm.procs", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "LANCE_LOG": "critical"},
        )

    def lines(self) -> Iterator[dict[str, Any]]:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            yield json.loads(line)
        err = self.popen.stderr.read() if self.popen.stderr else ""
        raise AssertionError(f"the helper process ended: {self.popen.wait()} {err[-2000:]}")

    def until(self, key: str) -> list[dict[str, Any]]:
        """Lines up to (and with) the first that has ``key`` (blocking)."""
        seen = []
        for line in self.lines():
            seen.append(line)
            if key in line:
                return seen
        raise AssertionError("unreachable")  # pragma: no cover

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()


BASE = {i: -1 for i in range(0, 300, 7)}


def model_of(lines: list[dict[str, Any]]) -> dict[int, int]:
    """id -> value after the acknowledged operations, in order, over the base rows."""
    state = dict(BASE)
    for line in lines:
        if "op" not in line:
            continue
        for i in line["ids"]:
            if line["op"] == "put":
                state[i] = line["value"]
            else:
                state.pop(i, None)
    return state


def by_id(table: pa.Table) -> dict[int, int]:
    ids, values = table.column("id").to_pylist(), table.column("value").to_pylist()
    assert len(set(ids)) == len(ids), "a key twice in one read"
    return dict(zip(ids, values, strict=True))


def engine_replays(uri: str) -> dict[int, int]:
    """What the engine shows once a new writer replayed every shard: each
    shard's writer opened (it replays the WAL) and closed (it flushes), then
    the engine's own scanner over every generation (blocking)."""
    from lance_async.lsm.snapshots import discover_latest

    ds = lance.dataset(uri)
    _, before = discover_latest(ds, uri)
    for snap in before:
        ds.mem_wal_writer(snap.shard_id).close()
    ds = lance.dataset(uri)
    _, snaps = discover_latest(ds, uri)
    return by_id(LsmScanner.from_snapshots(ds, [s.lance for s in snaps]).to_table())


async def new_table(uri: str) -> la.AsyncDataset:
    ds = await la.write_dataset(kv_table(range(0, 300, 7), value=-1), uri)
    return await ds.initialize_mem_wal()


@pytest.mark.asyncio
async def test_rows_acked_by_a_killed_writer_are_visible_at_once_elsewhere(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    await new_table(uri)
    proc = Proc("writer", uri, "11", "120", "--memtable-rows", "150")
    try:
        lines = await anyio.to_thread.run_sync(proc.until, "done")
    finally:
        proc.kill()  # after its acks, with no writer left to flush or replay
    model = model_of(lines)
    assert sum(op == "delete" for op, _, _ in ops(11, 120)) > 10  # deletes in the tail too
    ds = await la.open_dataset(uri)
    tails = await ds.lsm.unflushed_rows()
    assert sum(tails.values()) > 0, "the test must leave rows in a WAL tail"
    seen = by_id(await ds.lsm.scan(columns=["id", "value"]).to_table())
    assert seen == model
    keys = list(range(300))
    looked = by_id(await ds.lsm.point_lookups(keys, columns=["id", "value"]))
    assert looked == model
    # the engine, replaying every shard as a new writer does, agrees
    assert await anyio.to_thread.run_sync(engine_replays, uri) == model
    ds = await la.open_dataset(uri)
    assert sum((await ds.lsm.unflushed_rows()).values()) == 0
    assert by_id(await ds.lsm.scan(columns=["id", "value"]).to_table()) == model


@pytest.mark.asyncio
async def test_a_live_writer_in_another_process_is_seen_while_it_writes(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    await new_table(uri)
    proc = Proc("writer", uri, "5", "40", "--pace", "0.02", "--then", "close")
    ds = await la.open_dataset(uri)
    try:
        lines = proc.lines()
        await anyio.to_thread.run_sync(next, lines)  # ready
        checked = 0
        while True:
            line = await anyio.to_thread.run_sync(next, lines)
            if "done" in line:
                break
            if line["op"] != "put":
                continue
            key, value = line["ids"][0], line["value"]

            async def visible(key: int = key, value: int = value) -> bool:
                row = await ds.lsm.point_lookup(key, columns=["value"])
                if row.num_rows != 1:
                    return False
                seen: int = row.column("value")[0].as_py()
                return seen >= value  # a later op of the writer may have moved it on already

            await eventually(visible, 60, f"key {key} at value {value}")
            checked += 1
        assert checked > 10
    finally:
        proc.kill()


@pytest.mark.asyncio
async def test_the_tail_is_read_incrementally(tmp_path: Path, monkeypatch: Any) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await new_table(uri)
    reads: list[int] = []
    real = walfiles.read_entry  # what wal imports as _read_entry, the seam patched below

    def counting(fs: Any, folder: str, position: int, schema: pa.Schema) -> Any:
        reads.append(position)
        return real(fs, folder, position, schema)

    monkeypatch.setattr(wal, "_read_entry", counting)
    async with ds.mem_wal_writer() as w:
        await w.put(kv_table([1, 2, 3], value=10))
        reader = await la.open_dataset(uri)
        assert by_id(await reader.lsm.point_lookups([1, 2, 3])) == {1: 10, 2: 10, 3: 10}
        first = len(reads)
        assert by_id(await reader.lsm.point_lookups([1, 2, 3])) == {1: 10, 2: 10, 3: 10}
        shards = len(await reader.lsm.snapshots())
        assert len(reads) - first == shards  # one probe per shard, nothing re-read
        await w.put(kv_table([2], value=20))
        before = len(reads)
        assert by_id(await reader.lsm.point_lookups([1, 2, 3])) == {1: 10, 2: 20, 3: 10}
        assert len(reads) - before == shards + 1  # the new entry, then the probe past it


@pytest.mark.asyncio
async def test_a_table_made_again_at_the_same_uri_shows_its_own_wal_only(tmp_path: Path) -> None:
    """The tail cache of a long-lived process is keyed by table and shard, and
    shard ids come back the same: a table deleted and made again must not
    show the old table's cached entries, even where the new WAL has entries
    at the same positions."""
    uri = str(tmp_path / "t.lance")
    shard = "5d1e2f3a-0b4c-4d5e-8f60-718293a4b5c6"

    async def made(values: list[int]) -> Any:
        ds = await la.write_dataset(kv_table(range(3)), uri)
        await ds.initialize_mem_wal(manual_shards=True)
        writer = ds.lance.mem_wal_writer(shard)
        for v in values:  # one WAL entry each
            writer.put(kv_table([10 + v], value=v))
        return writer

    old = await made([1, 2, 3])
    seen = by_id(await (await la.open_dataset(uri)).lsm.scan(columns=["id", "value"]).to_table())
    assert seen == {0: 0, 1: 0, 2: 0, 11: 1, 12: 2, 13: 3}
    old.close()
    shutil.rmtree(uri)
    new = await made([7, 8, 9])  # as many entries: the same positions, other files
    reader = await la.open_dataset(uri)
    seen = by_id(await reader.lsm.scan(columns=["id", "value"]).to_table())
    assert seen == {0: 0, 1: 0, 2: 0, 17: 7, 18: 8, 19: 9}
    assert by_id(await reader.lsm.point_lookups([11, 17])) == {17: 7}
    new.close()


@pytest.mark.asyncio
async def test_a_fenced_writers_late_puts_are_never_visible(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(3)), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = "2c2f0d6e-4f5e-4f44-9d5b-7d1f4b5f6a01"
    first = ds.lance.mem_wal_writer(shard)
    first.put(kv_table([10], value=1))
    second = ds.lance.mem_wal_writer(shard)  # claims the shard: the first is fenced
    with pytest.raises(OSError, match="fenced"):
        first.put(kv_table([11], value=1))
    second.put(kv_table([12], value=2))
    reader = await la.open_dataset(uri)
    seen = by_id(await reader.lsm.scan(columns=["id", "value"]).to_table())
    assert seen == {0: 0, 1: 0, 2: 0, 10: 1, 12: 2}
    second.close()
    assert await anyio.to_thread.run_sync(engine_replays, uri) == seen


@pytest.mark.asyncio
async def test_a_generation_without_a_tombstone_column_is_read(tmp_path: Path) -> None:
    """Lance's own tests write such generations (a Lance dataset of the table's
    columns only); the engine's planners read them given the snapshot, and so
    do we. (The engine's scanner also wants the primary-key sidecar a real
    flush writes, so the comparison is with the rows written.)"""
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(5)), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = "7b0c3f52-93a4-4d0e-a36b-0e3f5bd2b7c1"
    folder = "0badc0de_gen_1"
    lance.write_dataset(kv_table([3, 4, 5], value=9), f"{uri}/_mem_wal/{shard}/{folder}")
    snap = ShardSnapshot(shard, 0, 2, ((1, folder),))
    ours = by_id(await ds.lsm.scan(columns=["id", "value"], snapshots=[snap]).to_table())
    assert ours == {0: 0, 1: 0, 2: 0, 3: 9, 4: 9, 5: 9}
    row = await ds.lsm.point_lookup(4, columns=["value"], snapshots=[snap])
    assert row.column("value").to_pylist() == [9]


@pytest.mark.asyncio
async def test_scan_offset_and_row_ids(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await new_table(uri)
    async with ds.mem_wal_writer() as w:
        await w.put(kv_table([1000, 1001], value=5))
    full = await ds.lsm.scan(columns=["id"], with_row_id=True).to_table()
    assert full.schema.field("_rowid").type == pa.uint64()
    ids = full.column("id").to_pylist()
    rowids = dict(zip(ids, full.column("_rowid").to_pylist(), strict=True))
    base = await ds.to_table(columns=["id"], with_row_id=True)
    assert {i: rowids[i] for i in base.column("id").to_pylist()} == dict(
        zip(base.column("id").to_pylist(), base.column("_rowid").to_pylist(), strict=True)
    )
    assert rowids[1000] is None and rowids[1001] is None  # not compacted: no row id yet
    part = await ds.lsm.scan(columns=["id"], offset=3, limit=4, batch_size=2).to_table()
    assert part.column("id").to_pylist() == ids[3:7]
    assert (await ds.lsm.scan(offset=len(ids)).to_table()).num_rows == 0


def test_wal_rows_conform_to_the_table_schema() -> None:
    """An entry written before a column was added reads with nulls for it."""
    schema = KV_SCHEMA.append(pa.field("extra", pa.float64()))
    old = pa.table({"id": [1], "value": [2], "name": ["a"], "_tombstone": [False]})
    rows = walfiles.conform(old, walfiles.level_schema(schema), "entry")
    assert rows.column("extra").to_pylist() == [None]
    assert rows.schema == walfiles.level_schema(schema)


@pytest.mark.asyncio
async def test_ingest_recovers_every_shard_a_dead_writer_left(tmp_path: Path) -> None:
    """The routing writer's recover() (which ingest() runs first) flushes every
    shard with a WAL tail, not only those its next rows touch."""
    uri = str(tmp_path / "t.lance")
    await new_table(uri)
    proc = Proc("writer", uri, "3", "60")
    try:
        lines = await anyio.to_thread.run_sync(proc.until, "done")
    finally:
        proc.kill()
    model = model_of(lines)
    ds = await la.open_dataset(uri)
    left = {s for s, n in (await ds.lsm.unflushed_rows()).items() if n}
    assert len(left) > 1
    async with ds.mem_wal_writer() as w:
        recovered = await w.recover()
        assert set(recovered) == left
        assert sum((await ds.lsm.unflushed_rows()).values()) == 0
        assert by_id(await w.lsm.scan(columns=["id", "value"]).to_table()) == model
    done = await ds.compact_mem_wal()
    assert set(done.generations) >= left
    assert by_id(await ds.to_table(columns=["id", "value"])) == model


@pytest.mark.asyncio
async def test_a_quiet_writer_flushes_an_old_memtable(tmp_path: Path) -> None:
    """max_memtable_age: a memtable holding rows that long becomes a generation
    (so compaction can merge it) while the writer stays open and usable."""
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(3)), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = "0e6f3c1a-5d8b-4a77-9f0e-3c1d2b4a5e6f"
    async with ds.mem_wal_writer(shard, max_memtable_age=0.2) as w:
        await w.put(kv_table([10, 11], value=1))

        async def flushed() -> bool:
            return any(s.sstables for s in await ds.lsm.snapshots())

        await eventually(flushed, 60, "the old memtable flushed")
        assert w.stats().state is la.WriterState.OPEN
        await w.put(kv_table([11, 12], value=2))  # the reopened engine writer takes rows
        seen = by_id(await w.lsm.scan(columns=["id", "value"]).to_table())
        assert seen == {0: 0, 1: 0, 2: 0, 10: 1, 11: 2, 12: 2}
        elsewhere = await la.open_dataset(uri)
        assert by_id(await elsewhere.lsm.scan(columns=["id", "value"]).to_table()) == seen
        done = await elsewhere.compact_mem_wal()
        assert done.generations[shard] == [1]
    assert by_id(await ds.lsm.scan(columns=["id", "value"]).to_table()) == seen


@pytest.mark.asyncio
async def test_check_reads_the_wal_tails_too(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(3)), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    async with (
        ds.mem_wal_writer("5a1e7d2c-0b3f-4e9a-8c6d-1f2e3a4b5c6d") as a,
        ds.mem_wal_writer("6b2f8e3d-1c4a-4f0b-9d7e-2a3b4c5d6e7f") as b,
    ):
        await a.put(kv_table([3, 4]))
        await b.put(kv_table([3, 5]))  # key 3 in two shards, neither flushed
        report = await (await la.open_dataset(uri)).check_shards()
        assert (report.generations, report.rows, report.split_keys) == (0, 4, 1)
