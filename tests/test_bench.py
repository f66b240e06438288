"""The benchmark suite's smoke run works and writes a complete report.

The suite itself is not a test (``python -m bench`` takes minutes); this
runs ``python -m bench --quick`` once, without LanceDB, and checks what it
writes, plus the rule that a target's printed value never rounds a miss into
a pass.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("value", "limit", "at_most", "expected"),
    [
        (0.95, 0.75, True, "0.95x"),  # far from the limit: 2 decimals
        (1.101, 1.10, True, "1.101x"),  # within 1%: 3 decimals, visibly above
        (1.1004, 1.10, True, "1.1004x"),  # 3 decimals would print the limit itself
        (1.0996, 1.10, True, "1.100x"),  # a pass may print as the limit
        (0.7996, 0.80, False, "0.7996x"),  # an at-least target missed by a hair
        (99.6, 100.0, False, "99.600x"),
    ],
)
def test_target_values_never_round_across_the_limit(
    value: float, limit: float, at_most: bool, expected: str
) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from bench._common import fmt_vs_limit

    assert fmt_vs_limit(value, limit, at_most=at_most) == expected


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ((10, 1_000), (60, 2_000), 0.05),  # 50 of 1,000 ticks stolen
        ((10, 1_000), (10, 2_000), 0.0),
        (None, (10, 2_000), math.nan),  # no /proc/stat
        ((10, 1_000), (10, 1_000), math.nan),  # no time passed
    ],
)
def test_steal_share_is_the_stolen_part_of_the_cores_time(
    before: tuple[int, int] | None, after: tuple[int, int] | None, expected: float
) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from bench._common import steal_share

    got = steal_share(before, after)
    assert got == pytest.approx(expected, nan_ok=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_cpu_times_reads_steal_and_total_ticks() -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from bench._common import cpu_times

    first = cpu_times()
    assert first is not None
    sum(i * i for i in range(200_000))  # some CPU time passes
    second = cpu_times()
    assert second is not None
    assert 0 <= first[0] <= first[1]
    assert second[0] >= first[0] and second[1] >= first[1]


@pytest.mark.timeout(600)  # the run's own limit (480 s) first
def test_quick_run_writes_report_and_charts(tmp_path: Path) -> None:
    """The harness end to end on three quick workloads (the others share it;
    their own quick runs are ``python -m bench --quick``'s, a minute more)."""
    pytest.importorskip("matplotlib", reason="the suite draws its charts with matplotlib")
    pytest.importorskip("psutil", reason="the suite reads write_bytes with psutil")
    out = tmp_path / "results"
    only = "merge_replay,scan,visibility"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--no-lancedb",
            "--only",
            only,
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=480,  # about half a minute on an idle machine; room for a loaded one
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = (out / "REPORT.md").read_text(encoding="utf-8")
    for heading in (
        "## Machine",
        "## Targets",
        "## merge_insert with a replayable source",
        "## Scans and LSM point lookups",
        "## Durable is visible across processes",
        "## Event-loop lag during each workload",
    ):
        assert heading in report, heading
    assert "LanceDB not measured" in report
    assert "--no-lancedb" in report
    assert "PASS" in report or "MISS" in report
    assert "median" in report
    assert "| cpu_model |" in report
    raw = report.split("- Raw results (every run's figures): [", 1)[1].split("]", 1)[0]
    assert (out / raw).is_file(), raw
    assert "lance_async ÷ config (lag p99)" in report  # the lag table has ratios
    assert "spent inside the sections above" in report  # the lag section's time is set
    # each merge target where it measures lance_async (listed once up top, once in the section)
    assert report.count("source, no conflict] wall vs pylance default retries") == 2  # big only
    assert report.count("source, no conflict] bytes written vs pylance default") == 2
    assert report.count("one conflict] wall vs the hand-written loop with the same backoff") == 4
    assert report.count("lance_async writes no replay bytes") == 8  # all four cases
    assert report.count("concurrent upserters") >= 2
    assert "visibility lag p99" in report
    if sys.platform.startswith("linux"):  # /proc/stat: each section's CPU steal is reported
        for section in only.split(","):
            assert f"| CPU steal during {section} |" in report, section
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs, "no chart was written"
    for png in pngs:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in report
