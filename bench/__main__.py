"""``python -m bench``: run the benchmark suite and write bench/results/REPORT.md.

Workloads run one at a time (never two side by side on the 2 cores), each
comparing lance_async with pylance sync calls, pylance wrapped in
``asyncio.to_thread`` and LanceDB's async API where it does the same job:

1. merge_replay    -- merge_insert with a replayable source (issue 3)
2. mem_wal_ingest  -- MemWAL ingestion of small messages (issue 4)
3. scan            -- full scans and LSM point lookups (issue 5)
4. scaling         -- time and peak RSS at 1x, 4x, 16x input (issue 8)
5. sharding        -- routing cost and worker take-over time (issue 13)
6. object_storage  -- durable ingestion on S3 (moto) vs local; 1-3 workers (issue 14)
7. lsm             -- LSM reads under background compaction, lookups, cancel,
                      NDJSON, first engine call, LSM vector and full-text
                      search (issues 18, 39)
8. visibility      -- durable rows seen from another process: visibility lag,
                      WAL-tail read cost (issue 23)
9. event-loop lag of a 1 ms ticker during each workload (issue 8)

``--quick`` runs small sizes in one to three minutes (a smoke run, not a
measurement). Without it the suite takes 11 to 30 minutes on 2 cores (the
committed report's run: 1,809 s on a machine with slow thread hand-offs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import (
    lsm,
    mem_wal_ingest,
    merge_replay,
    object_storage,
    report,
    scaling,
    scan,
    sharding,
    visibility,
)
from ._common import (
    REPO_ROOT,
    Section,
    Settings,
    close_zygotes,
    code_state,
    cpu_times,
    log,
    machine_facts,
    set_child_log,
    steal_share,
)

WORKLOADS = [
    "merge_replay",
    "mem_wal_ingest",
    "scan",
    "scaling",
    "sharding",
    "object_storage",
    "lsm",
    "visibility",
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke run of 1-3 minutes"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "bench" / "results",
        help="where REPORT.md, the PNGs and runs/ go (default bench/results)",
    )
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per configuration (default 5; quick 2)"
    )
    parser.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help="comma-separated subset of: "
        + ", ".join(WORKLOADS)
        + " (scaling needs the first two)",
    )
    parser.add_argument(
        "--no-lancedb", action="store_true", help="do not measure LanceDB (it is slow to import)"
    )
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="scratch directory (default: a new temp dir)"
    )
    return parser.parse_args(argv)


def _lancedb(args: argparse.Namespace) -> tuple[bool, str]:
    if args.no_lancedb:
        return False, "skipped: --no-lancedb given"
    if importlib.util.find_spec("lancedb") is None:
        return False, "skipped: lancedb is not importable in this environment"
    return True, ""


def main(argv: list[str] | None = None) -> int:
    """Run the suite; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in WORKLOADS]
    if unknown:
        print(f"unknown workload(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    if "scaling" in wanted and not {"merge_replay", "mem_wal_ingest"} <= set(wanted):
        print("scaling reuses merge_replay's and mem_wal_ingest's runs: add them", file=sys.stderr)
        return 2
    use_lancedb, lancedb_note = _lancedb(args)
    if not use_lancedb and not args.quick and not args.no_lancedb:
        print(
            f"the full run compares against LanceDB, which is missing ({lancedb_note}); "
            "install lancedb or pass --no-lancedb",
            file=sys.stderr,
        )
        return 2
    runs = args.runs or (2 if args.quick else 5)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs").mkdir(exist_ok=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lance_async_bench-"))
    work.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        quick=args.quick,
        runs=runs,
        out=out,
        work=work,
        lancedb=use_lancedb,
        lancedb_note=lancedb_note,
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    set_child_log(out / "runs" / f"children-{stamp}.log")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    code = code_state()  # before anything runs: the code the zygotes import
    load_at_start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    t_start = time.perf_counter()
    command = shlex.join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])])
    shared: dict[str, Any] = {}
    sections: list[Section] = []
    steal: dict[str, float] = {}  # the machine's CPU steal during each section
    modules = {
        "merge_replay": merge_replay,
        "mem_wal_ingest": mem_wal_ingest,
        "scan": scan,
        "scaling": scaling,
        "sharding": sharding,
        "object_storage": object_storage,
        "lsm": lsm,
        "visibility": visibility,
    }
    try:
        for name in wanted:
            log(f"{name}: starting")
            t0, cpu0 = time.perf_counter(), cpu_times()
            section = modules[name].run(settings, shared)
            section.seconds = time.perf_counter() - t0
            steal[name] = steal_share(cpu0, cpu_times())
            sections.append(section)
            log(f"{name}: {section.seconds:.0f} s")
        lag = report.lag_section(shared, use_lancedb, lancedb_note)
        # the lag runs happen inside the workloads' sections (their times include them)
        lag.seconds = float(shared.get("lag_seconds", 0.0))
        lag.seconds_note = " (spent inside the sections above and included in their times)"
        sections.append(lag)
        charts = _charts(shared, sections, lag, out)
    finally:
        close_zygotes()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.perf_counter() - t_start
    facts = machine_facts()
    facts["load average (1, 5, 15 min) at start"] = load_at_start
    facts["lance_async commit"] = code.describe()
    for name, share in steal.items():
        if not math.isnan(share):  # Linux only
            facts[f"CPU steal during {name}"] = f"{share:.1%}"
    raw = {
        "command": command,
        "started": started,
        "wall_seconds": wall,
        "settings": {"quick": args.quick, "runs": runs, "lancedb": use_lancedb},
        "machine": facts,
        "code": {"commit": code.commit, "changed": code.changed},
        "sections": {
            s.key: {"series": [x.to_json() for x in s.series], "raw": s.raw} for s in sections
        },
        "charts": charts,
    }
    raw_name = f"runs/results-{stamp}.json"
    (out / raw_name).write_text(json.dumps(raw, indent=1, default=str))
    path = report.write_report(
        out,
        sections,
        facts,
        command,
        "quick (smoke run, small sizes)" if args.quick else "full",
        wall,
        started,
        runs,
        "measured" if use_lancedb else lancedb_note,
        code,
        raw_name,
    )
    log(f"wrote {path} ({wall:.0f} s in all)")
    return 0


def _charts(shared: dict[str, Any], sections: list[Section], lag: Section, out: Path) -> list[str]:
    """Draw the PNGs and attach each to its section; notes why when impossible."""
    if importlib.util.find_spec("matplotlib") is None:
        lag.notes.append("Charts skipped: matplotlib is not installed.")
        return []
    by_key = {s.key: s for s in sections}
    made: list[str] = []
    ingest = by_key.get("mem_wal_ingest")
    if ingest is not None:
        for name in (
            report.chart_ingest_sweep(shared, out),
            report.chart_ack_histogram(shared, out, mem_wal_ingest.ACK_P99_MS),
        ):
            if name:
                ingest.charts.append(name)
                made.append(name)
    scan_section = by_key.get("scan")
    if scan_section is not None:
        name = report.chart_scan_sweep(shared, out)
        if name:
            scan_section.charts.append(name)
            made.append(name)
    name = report.chart_lag(lag, out)
    if name:
        lag.charts.append(name)
        made.append(name)
    return made


if __name__ == "__main__":
    raise SystemExit(main())
