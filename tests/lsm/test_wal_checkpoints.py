"""Tail checkpoints: the first read of a long WAL tail in a process reads a few
checkpoint files instead of every entry, and never a checkpoint that is not
this WAL's or does not decode.

A process's caches are dropped between reads here (``wal._tails``) to stand
for a new process; the writers run in other processes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import lance_async as la
from lance_async.lsm import wal, walfiles

from ..helpers import eventually, kv_table
from .test_wal_tail import Proc, by_id, model_of, new_table

EVERY = 16


@pytest.fixture
def small_checkpoints(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Checkpoints every 16 entries; the positions of entries read one by one."""
    monkeypatch.setattr(walfiles, "CHECKPOINT_ENTRIES", EVERY)
    reads: list[int] = []
    real = walfiles.read_entry  # what wal imports as _read_entry, the seam patched below

    def counting(fs: Any, folder: str, position: int, schema: Any) -> Any:
        reads.append(position)
        return real(fs, folder, position, schema)

    monkeypatch.setattr(wal, "_read_entry", counting)
    wal._tails.clear()
    yield reads
    wal._tails.clear()


def checkpoints(uri: str) -> list[Path]:
    return sorted(Path(uri).glob(f"_mem_wal/*/{walfiles.CHECKPOINT_FOLDER}/*.arrows"))


def valid_checkpoints(uri: str) -> int:
    """Checkpoints that this table's WAL would use now."""
    import lance
    import pyarrow.fs as pafs

    target = walfiles.interned(walfiles.level_schema(lance.dataset(uri).schema))
    fs = pafs.LocalFileSystem()
    found = 0
    for shard in Path(uri).glob("_mem_wal/*"):
        for point in walfiles._checkpoints(fs, str(shard)):
            found += walfiles._read_checkpoint(fs, point, f"{shard}/wal", target) is not None
    return found


async def killed_writer(uri: str, seed: int, n: int) -> dict[int, int]:
    proc = Proc("writer", uri, str(seed), str(n))
    try:
        lines = await anyio.to_thread.run_sync(proc.until, "done")
    finally:
        proc.kill()  # its acked rows stay in the WAL tails
    return model_of(lines)


async def read_all(uri: str) -> dict[int, int]:
    ds = await la.open_dataset(uri)
    return by_id(await ds.lsm.scan(columns=["id", "value"]).to_table())


@pytest.mark.asyncio
async def test_a_new_process_reads_a_long_tail_from_checkpoints(
    tmp_path: Path, small_checkpoints: list[int]
) -> None:
    uri = str(tmp_path / "t.lance")
    await new_table(uri)
    model = await killed_writer(uri, 21, 120)
    assert await read_all(uri) == model
    ds = await la.open_dataset(uri)
    unflushed = await ds.lsm.unflushed_rows()
    entries = len(small_checkpoints)
    assert entries >= 120  # every entry read once, one by one
    await eventually(lambda: valid_checkpoints(uri) >= 4, 30, "a checkpoint per shard")

    wal._tails.clear()  # a new process
    small_checkpoints.clear()
    assert await read_all(uri) == model
    ds = await la.open_dataset(uri)
    shards = len(await ds.lsm.snapshots())
    assert len(small_checkpoints) <= shards * (EVERY + 1)  # what no checkpoint holds yet
    assert len(small_checkpoints) < entries // 2
    assert await ds.lsm.unflushed_rows() == unflushed


@pytest.mark.asyncio
async def test_a_checkpoint_of_another_wal_or_a_torn_one_is_not_used(
    tmp_path: Path, small_checkpoints: list[int]
) -> None:
    uri = str(tmp_path / "t.lance")
    await new_table(uri)
    await killed_writer(uri, 22, 60)
    await read_all(uri)
    await eventually(lambda: valid_checkpoints(uri) >= 4, 30, "a checkpoint per shard")
    kept = tmp_path / "kept"
    for path in checkpoints(uri):
        target = kept / path.relative_to(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    # the table made again at the same URI: the same shard ids and positions
    shutil.rmtree(uri)
    await new_table(uri)
    model = await killed_writer(uri, 23, 60)
    for path in kept.rglob("*.arrows"):  # the old table's checkpoints put back
        target = Path(uri) / path.relative_to(kept)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    assert valid_checkpoints(uri) == 0
    wal._tails.clear()
    assert await read_all(uri) == model
    # torn checkpoints (half written by a process that died) are passed over
    await eventually(lambda: valid_checkpoints(uri) >= 4, 30, "this table's checkpoints")
    for path in checkpoints(uri):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    wal._tails.clear()
    assert await read_all(uri) == model


@pytest.mark.anyio
async def test_a_writer_checkpoints_its_own_tail(
    tmp_path: Path, small_checkpoints: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """So the first read after the writer died is bounded too, whoever reads."""
    from lance_async.memwal import committer

    monkeypatch.setattr(committer, "CHECKPOINT_ENTRIES", EVERY)
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(3)), uri)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer("00000000-0000-4000-8000-0000000000c1") as w:
        for i in range(3 * EVERY):
            await w.put(kv_table([100 + i], value=i))
        # each 16th put starts a read of the writer's tail, unless one is
        # still under way (then the next one covers its entries): once none is,
        # the checkpoints cover all but the last 16 entries at most
        await eventually(
            lambda: not wal._following and valid_checkpoints(uri) >= 2,
            30,
            "the writer's checkpoints, and no read of its tail under way",
        )
        wal._tails.clear()
        small_checkpoints.clear()
        reader = await la.open_dataset(uri)
        found = by_id(await reader.lsm.scan(columns=["id", "value"]).to_table())
        assert found == {0: 0, 1: 0, 2: 0, **{100 + i: i for i in range(3 * EVERY)}}
        assert len(small_checkpoints) <= EVERY + 1
