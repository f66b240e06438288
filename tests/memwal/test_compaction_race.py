"""Compaction cannot lose or resurrect a row, whoever else compacts, in any process.

The case that once lost rows: generation 1 puts keys 0..49, generation 2
deletes 0..9, compactor X reads its snapshots, generation 3 re-inserts
0..49, another compactor merges 1..3, then X commits. X's deletes and
upserts travel in the one commit that marks its generations compacted, and
the engine refuses that mark: X commits nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.memwal.compaction import compact_shard

from ..helpers import kv_table
from .support import sid

ROOT = Path(__file__).resolve().parents[2]


async def generation(
    ds: la.AsyncDataset, shard: str, *, put: pa.Table | None = None, delete: list[int] | None = None
) -> None:
    """One flushed generation of ``shard``: a writer opened, written, closed."""
    async with ds.mem_wal_writer(shard) as w:
        if put is not None:
            await w.put(put)
        if delete is not None:
            await w.delete(pa.table({"id": pa.array(delete, pa.int64())}))


def ids_values(table: pa.Table) -> dict[int, int]:
    return dict(zip(table.column("id").to_pylist(), table.column("value").to_pylist(), strict=True))


@pytest.mark.asyncio
async def test_a_stale_compaction_commits_nothing(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table([1000]), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = sid()
    await generation(ds, shard, put=kv_table(range(50), value=1))
    await generation(ds, shard, delete=list(range(10)))
    (stale,) = await ds.lsm.snapshots()  # compactor X reads generations 1 and 2
    assert [g for g, _ in stale.sstables] == [1, 2]
    await generation(ds, shard, put=kv_table(range(50), value=3))
    other = await la.open_dataset(uri)
    done = await other.compact_mem_wal()  # another compactor merges 1..3
    assert done.generations == {shard: [1, 2, 3]} and not done.stale
    version = (await la.open_dataset(uri)).version

    result = await compact_shard(ds, stale)  # X commits at last
    assert result.stale and result.commits == 0 and not result.generations
    after = await la.open_dataset(uri)
    assert after.version == version  # nothing committed: no delete, no upsert
    expected = {i: 3 for i in range(50)} | {1000: 0}
    assert ids_values(await after.to_table(columns=["id", "value"])) == expected
    assert ids_values(await after.lsm.scan(columns=["id", "value"]).to_table()) == expected
    again = await ds.compact_mem_wal()  # and the public call counts the lost race as done
    assert again.commits == 0


def spawn_compactor(uri: str, stop: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.lsm.procs", "compactor", uri, str(stop)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LANCE_LOG": "critical"},
    )


@pytest.mark.asyncio
@pytest.mark.slow
async def test_two_compactor_processes_race_deletes_and_reinserts(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table([1000]), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    shard = sid()
    stop = tmp_path / "stop"
    procs = [spawn_compactor(uri, stop) for _ in range(2)]
    rounds = 50
    try:
        for p in procs:  # both compactors running before the first round
            assert p.stdout is not None
            ready = await anyio.to_thread.run_sync(p.stdout.readline)
            assert "ready" in json.loads(ready), p.stderr.read() if p.stderr else ""
        for r in range(rounds):
            await generation(ds, shard, put=kv_table(range(50), value=3 * r))
            await generation(ds, shard, delete=list(range(r % 40, r % 40 + 10)))
            await generation(ds, shard, put=kv_table(range(r % 40, r % 40 + 10), value=3 * r + 2))
            # every key is back at the newest value after each round, in every read
            seen = ids_values(await ds.lsm.scan(columns=["id", "value"]).to_table())
            want = {i: 3 * r for i in range(50)} | {1000: 0}
            want.update({i: 3 * r + 2 for i in range(r % 40, r % 40 + 10)})
            assert seen == want, f"round {r}"
    finally:
        stop.touch()
        outputs = []
        for p in procs:
            out, err = await anyio.to_thread.run_sync(p.communicate)
            outputs.append((p.returncode, out, err))
    for code, _out, err in outputs:
        assert code == 0, err[-3000:]
    passes = [json.loads(line) for _, out, _ in outputs for line in out.splitlines()]
    merged = [p for p in passes if p.get("generations")]
    assert merged, "the compactors never merged anything"
    final = await la.open_dataset(uri)
    await final.compact_mem_wal()
    assert ids_values(await final.to_table(columns=["id", "value"])) == want
    assert ids_values(await final.lsm.scan(columns=["id", "value"]).to_table()) == want
