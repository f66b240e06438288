"""The benchmark suite's smoke run works and writes a complete report.

The suite itself is not a test (``python -m bench`` takes minutes); this
runs ``python -m bench --quick`` once, without LanceDB, and checks what it
writes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_quick_run_writes_report_and_charts(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the suite draws its charts with matplotlib")
    pytest.importorskip("psutil", reason="the suite reads write_bytes with psutil")
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--no-lancedb", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = (out / "REPORT.md").read_text(encoding="utf-8")
    for heading in (
        "## Machine",
        "## Targets",
        "## merge_insert with a replayable source",
        "## MemWAL ingestion of small messages",
        "## Scans and LSM point lookups",
        "## Scaling: time and peak RSS",
        "## Event-loop lag during each workload",
    ):
        assert heading in report, heading
    assert "LanceDB not measured" in report
    assert "--no-lancedb" in report
    assert "PASS" in report or "MISS" in report
    assert "median" in report
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs, "no chart was written"
    for png in pngs:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in report
