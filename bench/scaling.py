"""Scaling: wall time and peak RSS at 1x, 4x and 16x input.

Issue 8. Two workloads, each measured in fresh child processes:

merge_insert
    A LanceDataset source of 1x, 4x and 16x rows (16x is merge_replay's
    ~130 MiB source, whose no-conflict runs are reused) upserted into the
    same 1M-row target, by lance_async and by pylance with default retries.
ingestion
    A feed of 1x, 4x and 16x the N 10-row messages of mem_wal_ingest (1x
    reuses its runs), by lance_async's AsyncShardWriter (the default commit
    policy), beside the engine floor (one thread putting pre-batched
    10,000-row batches) at 1x and 16x: the engine's own memory grows with
    the feed (memtables, flush buffers), so lance_async's growth is read
    against the floor's, as mem_wal_ingest's RSS target does.

Metrics: wall seconds and peak RSS (MiB). The report states the growth:
time 4x/1x and 16x/1x, the fitted exponent ``log(t16/t1) / log(16)`` (1.0 is
linear), and peak RSS 16x/1x (1.0 is flat).
"""

from __future__ import annotations

import math
from typing import Any

from . import mem_wal_ingest, merge_replay
from ._common import (
    LANCE_ASYNC,
    Metric,
    Section,
    Series,
    Settings,
    Table,
    find,
    fmt_num,
    log,
    ratio,
    summary_table,
)

MERGE_CONFIGS = [LANCE_ASYNC, "pylance_default"]
FLOOR_RUNS = 3


def _growth(series_by_mult: dict[int, Series], key: str) -> tuple[float, float]:
    one = series_by_mult.get(1)
    four = series_by_mult.get(4)
    sixteen = series_by_mult.get(16)
    if one is None:
        return math.nan, math.nan
    r4 = ratio(four.median(key), one.median(key)) if four else math.nan
    r16 = ratio(sixteen.median(key), one.median(key)) if sixteen else math.nan
    return r4, r16


POINT_METRICS = [
    Metric("wall_s", "wall (s)", 1.0, 3),
    Metric("peak_rss_mib", "peak RSS (MiB)", 1.0, 0),
]


def _row(workload: str, config: str, by_mult: dict[int, Series]) -> list[str]:
    runs = " / ".join(str(len(by_mult[m].samples)) if m in by_mult else "0" for m in (1, 4, 16))
    t4, t16 = _growth(by_mult, "wall_s")
    m4, m16 = _growth(by_mult, "peak_rss_mib")
    exponent = math.log(t16) / math.log(16) if t16 > 0 and math.isfinite(t16) else math.nan
    return [
        workload,
        config,
        runs,
        f"{fmt_num(t4)}x / {fmt_num(t16)}x",
        fmt_num(exponent),
        f"{fmt_num(m4)}x / {fmt_num(m16)}x",
    ]


def _points(label: str, inputs: dict[int, str], by_mult: dict[int, Series]) -> list[Series]:
    """The per-size series, named for the points table."""
    return [
        Series(f"{label} {mult}x ({inputs[mult]})", s.config, s.samples)
        for mult, s in sorted(by_mult.items())
    ]


def _statement(workload: str, config: str, by_mult: dict[int, Series]) -> str:
    t4, t16 = _growth(by_mult, "wall_s")
    m4, m16 = _growth(by_mult, "peak_rss_mib")
    if not math.isfinite(t16):
        return f"{workload} / {config}: not enough points measured."
    exponent = math.log(t16) / math.log(16) if t16 > 0 else math.nan
    shape = (
        "about linear"
        if 0.85 <= exponent <= 1.15
        else (
            "sub-linear (fixed costs weigh on the small input)"
            if exponent < 0.85
            else "super-linear"
        )
    )
    one, sixteen = by_mult[1], by_mult[16]
    extra = sixteen.median("peak_rss_mib") - one.median("peak_rss_mib")
    memory = "flat" if m16 <= 1.10 else ("grows with the input" if m16 >= 1.5 else "grows modestly")
    return (
        f"{workload} / {config}: time grows {t4:.2f}x at 4x input and {t16:.2f}x at 16x "
        f"(exponent {exponent:.2f}, {shape}); peak RSS grows {m4:.2f}x and {m16:.2f}x "
        f"({extra:+.0f} MiB from 1x to 16x: {memory})."
    )


def _floor_statement(ingest: dict[int, Series], floor: dict[int, Series]) -> str:
    """lance_async's peak RSS growth at 16x against the engine floor's."""
    _, la16 = _growth(ingest, "peak_rss_mib")
    _, fl16 = _growth(floor, "peak_rss_mib")
    if not (math.isfinite(la16) and math.isfinite(fl16)):
        return "ingestion vs the engine floor: not enough points measured."
    return (
        f"ingestion: peak RSS at 16x the messages grows {la16:.2f}x with lance_async and "
        f"{fl16:.2f}x with the engine alone fed pre-batched (the floor); the difference, "
        f"{la16 - fl16:+.2f}, is lance_async's own share of the growth."
    )


def run(settings: Settings, shared: dict[str, Any]) -> Section:
    """Measure the scaling runs not already measured by merge_replay and mem_wal_ingest."""
    paths = shared["merge_paths"]
    merge_series: list[Series] = shared["merge_series"]
    big_case = merge_replay.case_label(paths, "big", False)
    merge: dict[str, dict[int, Series]] = {}
    for config in MERGE_CONFIGS:
        merge[config] = {}
        reused = find(merge_series, big_case, config)
        if reused is not None:
            merge[config][16] = Series("16x", config, reused.samples)
    for mult, name in ((1, "x1"), (4, "x4")):
        for config in MERGE_CONFIGS:
            merge[config][mult] = Series(f"{mult}x", config)
        for _ in range(settings.runs):
            for config in MERGE_CONFIGS:
                merge[config][mult].samples.append(
                    merge_replay.run_merge(settings, paths, name, f"{mult}x", config, False)
                )
        log(f"scaling: merge {mult}x done")

    n = mem_wal_ingest.sizes(settings.quick)["N"]
    ingest_series: list[Series] = shared["ingest_series"]
    ingest: dict[int, Series] = {}
    reused_1x = find(ingest_series, f"N = {n:,} messages", LANCE_ASYNC)
    if reused_1x is not None:
        ingest[1] = Series("1x", LANCE_ASYNC, reused_1x.samples)
    for mult in (4, 16):
        ingest[mult] = Series(f"{mult}x", LANCE_ASYNC)
        for _ in range(settings.runs):
            ingest[mult].samples.append(mem_wal_ingest.ingest_once(settings, LANCE_ASYNC, mult * n))
        log(f"scaling: ingestion {mult}x done")
    floor: dict[int, Series] = {}
    reused_floor = find(ingest_series, f"N = {n:,} messages", "floor")
    if reused_floor is not None:
        floor[1] = Series("1x", "floor", reused_floor.samples)
    floor[16] = Series("16x", "floor")
    for _ in range(min(settings.runs, FLOOR_RUNS)):
        floor[16].samples.append(mem_wal_ingest.ingest_once(settings, "floor", 16 * n))
    log("scaling: ingestion floor 16x done")

    sizes = paths["sizes"]
    merge_inputs = {
        1: f"{sizes['x1']:,} source rows",
        4: f"{sizes['x4']:,} source rows",
        16: f"{sizes['big']:,} source rows",
    }
    ingest_inputs = {m: f"{m * n:,} messages" for m in (1, 4, 16)}
    points: list[Series] = []
    for mult in (1, 4, 16):
        for config in MERGE_CONFIGS:
            if mult in merge[config]:
                points += _points("merge_insert", merge_inputs, {mult: merge[config][mult]})
    points += _points("ingestion", ingest_inputs, ingest)
    points += _points("ingestion", ingest_inputs, floor)
    header = [
        "workload",
        "configuration",
        "runs (1x / 4x / 16x)",
        "time 4x / 16x vs 1x",
        "time exponent",
        "peak RSS 4x / 16x vs 1x",
    ]
    rows = [_row("merge_insert", c, merge[c]) for c in MERGE_CONFIGS]
    rows.append(_row("ingestion", LANCE_ASYNC, ingest))
    rows.append(_row("ingestion", "floor", floor))
    statements = [_statement("merge_insert", c, merge[c]) for c in MERGE_CONFIGS]
    statements.append(_statement("ingestion", LANCE_ASYNC, ingest))
    statements.append(_floor_statement(ingest, floor))
    all_series = (
        [s for by in merge.values() for s in by.values()]
        + list(ingest.values())
        + list(floor.values())
    )
    return Section(
        key="scaling",
        title="Scaling: time and peak RSS at 1x, 4x and 16x input",
        intro=(
            "Fresh child per run. Peak RSS includes the interpreter and its imports (about "
            "the 1x figure minus the data the run holds). The 16x merge_insert runs are "
            "merge_replay's no-conflict runs on the big source, and the 1x ingestion runs "
            "mem_wal_ingest's N runs (reused, not run again), as are its floor runs at N; the "
            f"floor at 16x runs {FLOOR_RUNS} times at most (about 10 s each)."
        ),
        tables=[
            summary_table(
                "Time and peak RSS per input size: medians [min–max]",
                points,
                POINT_METRICS,
                None,
            ),
            Table(
                "Growth with the input (ratios of the medians above)",
                header,
                rows,
                "time exponent = log(time 16x / time 1x) / log(16): 1.0 is linear.",
            ),
        ],
        notes=["Observed growth: " + s for s in statements],
        series=all_series,
    )
