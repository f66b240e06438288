"""The engine's log filter: the harmless MemWAL index ERROR gone, real engine lines kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
import anyio, pyarrow as pa
import lance_async as la

PK = {"lance-schema:unenforced-primary-key": "true"}
schema = pa.schema(
    [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.float64())]
)

async def main() -> None:
    rows = pa.table({"id": [1], "v": [1.0]}, schema=schema)
    ds = await la.write_dataset(rows, sys.argv[1], mode="overwrite")  # the engine WARNs: new
    await ds.initialize_mem_wal()
    async with ds.mem_wal_writer() as w:
        await w.put(pa.table({"id": [5, 6], "v": [5.0, 6.0]}, schema=schema))
    await ds.compact_mem_wal()
    async for batch in ds.scan(columns=["id"], filter="id >= 5"):
        pass
    import os
    print(os.environ.get("LANCE_LOG"))

anyio.run(main)
"""


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "LANCE_LOG"}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "t.lance")],
        env={**base, **env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_a_memwal_scan_prints_no_engine_error_but_engine_warnings_show(tmp_path: Path) -> None:
    done = run(tmp_path)
    assert "ERROR" not in done.stderr, done.stderr
    assert "WARN" in done.stderr and "it will be created" in done.stderr, done.stderr
    assert done.stdout.strip() == "warn,lance::index=off,lance::index::=warn"


@pytest.mark.parametrize("level", ["info"])
def test_a_lance_log_of_the_users_is_left_alone(tmp_path: Path, level: str) -> None:
    done = run(tmp_path, LANCE_LOG=level)
    assert done.stdout.strip() == level
    # the line the default filter drops is really there without it
    assert "Index __lance_mem_wal has no fields" in done.stderr, done.stderr
