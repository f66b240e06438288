"""Clean-up across processes, with kills: nothing lost, nothing read wrong.

A writer (``tests/lsm/procs.py``), a reader and a compactor that cleans up
with no retention (``gcprocs.py``) each run in their own process on one
table; the writer and the compactor are killed with SIGKILL half-way and
started again. Every scan the reader made must be the table after some
prefix of the acknowledged operations, the prefixes never going back; the
table at the end must be the table after all of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

import lance_async as la
from lance_async.memwal import cleanup_table

from ..helpers import eventually, kv_table
from ..lsm.procs import ops

ROOT = Path(__file__).resolve().parents[2]
BASE = {i: -1 for i in range(0, 300, 7)}


class Proc:
    """A helper process whose JSON lines a thread collects as they come."""

    def __init__(self, module: str, *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "LANCE_LOG": "critical"},
        )
        self.lines: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(json.loads(line))

    def count(self, key: str) -> int:
        return sum(key in line for line in list(self.lines))

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.wait()

    def wait(self) -> None:
        self.popen.wait()
        self._thread.join()
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def state_after(sequence: list[tuple[str, list[int], int]]) -> list[tuple[tuple[int, int], ...]]:
    """The table after each prefix of ``sequence`` (0 to all operations)."""
    state = dict(BASE)
    out = [tuple(sorted(state.items()))]
    for op, ids, value in sequence:
        for i in ids:
            if op == "put":
                state[i] = value
            else:
                state.pop(i, None)
        out.append(tuple(sorted(state.items())))
    return out


@pytest.mark.asyncio
async def test_a_compactor_cleaning_up_beside_a_killed_writer_and_a_reader(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(0, 300, 7), value=-1), uri)
    await ds.initialize_mem_wal(num_buckets=1, bucket_column="id")  # one shard: ops atomic
    stop = str(tmp_path / "stop")
    maintainer = Proc("tests.memwal.gcprocs", "maintainer", uri, stop)
    reader = Proc("tests.memwal.gcprocs", "reader", uri, stop)
    first = Proc(
        "tests.lsm.procs", "writer", uri, "21", "400", "--memtable-rows", "30", "--pace", "0.005"
    )
    procs = [maintainer, reader, first]
    try:
        await eventually(lambda: first.count("op") >= 60, 120, "the first writer's acks")
        first.kill()  # mid-stream: one operation may be durable but not acknowledged
        maintainer.kill()
        acked = first.count("op")
        maintainer = Proc("tests.memwal.gcprocs", "maintainer", uri, stop)
        procs.append(maintainer)
        second = Proc(
            "tests.lsm.procs", "writer", uri, "22", "50", "--memtable-rows", "30", "--then", "close"
        )
        procs.append(second)
        await anyio.to_thread.run_sync(second.wait)
        assert second.count("done") == 1
        await eventually(lambda: reader.count("read") >= 20, 120, "the reader's scans")
        # the second compactor has cleaned up what the second writer flushed
        # (it may start after the writer ends on a loaded machine: wait for it)
        await eventually(
            lambda: any(line.get("wal_entries_removed", 0) > 0 for line in maintainer.lines),
            120,
            "a clean-up by the second compactor",
        )
        await anyio.Path(stop).touch()
        await anyio.to_thread.run_sync(reader.wait)
        await anyio.to_thread.run_sync(maintainer.wait)
    finally:
        for p in procs:
            p.kill()
    (stats,) = [line for line in maintainer.lines if "cleanups" in line]
    assert stats["failures"] == 0, stats
    assert stats["cleanups"] > 0 and stats["wal_entries_removed"] > 0, stats

    final = await la.open_dataset(uri)
    got = await final.lsm.scan(columns=["id", "value"]).to_table()
    seen = tuple(sorted(by_pairs(got)))
    # the killed writer's last operation is in the table if it became durable
    candidates = {j: ops(21, 400)[:j] + ops(22, 50) for j in (acked, acked + 1) if j <= 400}
    matching = [j for j, seq in candidates.items() if state_after(seq)[-1] == seen]
    assert matching, "the table after both writers is not any acknowledged history"
    history = state_after(candidates[matching[0]])
    where: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for k, state in enumerate(history):
        where.setdefault(state, []).append(k)
    last = 0
    reads = [line["read"] for line in reader.lines if "read" in line]
    assert len(reads) >= 20
    for n, read in enumerate(reads):
        state = tuple(sorted((i, v) for i, v in read))
        assert len(state) == len(read), f"read {n}: a key twice"
        ks = [k for k in where.get(state, []) if k >= last]
        assert ks, f"read {n} is no prefix of the history from {last} on (lost or stale rows)"
        last = ks[0]

    await final.compact_mem_wal()
    await cleanup_table(final, timedelta(0))
    wal = list((Path(uri) / "_mem_wal").glob("*/wal/*.arrow"))
    gens = list((Path(uri) / "_mem_wal").glob("*/*_gen_*"))
    assert len(wal) <= 4 and not gens, (len(wal), len(gens))  # fence sentinels stay
    assert tuple(sorted(by_pairs(await final.lsm.scan(columns=["id", "value"]).to_table()))) == seen


def by_pairs(table: Any) -> list[tuple[int, int]]:
    return list(zip(table.column("id").to_pylist(), table.column("value").to_pylist(), strict=True))
