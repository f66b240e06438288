"""REPORT.md and the PNG charts, from the sections the benchmarks returned."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ._common import (
    LANCE_ASYNC,
    CodeState,
    LatencyHistogram,
    Metric,
    Section,
    Series,
    Table,
    fmt_num,
    summarize,
    summary_table,
)

LAG_METRICS = [
    Metric("lag_p50_ms", "lag p50 (ms)", 1.0, 2),
    Metric("lag_p99_ms", "lag p99 (ms)", 1.0, 2),
    Metric("lag_max_ms", "lag max (ms)", 1.0, 1),
    Metric("wall_s", "operation wall (s)", 1.0, 3),
]


def lag_section(shared: dict[str, Any], lancedb: bool, lancedb_note: str) -> Section:
    """Event-loop lag of a 1 ms ticker task during each workload."""
    series: list[Series] = []
    for workload, key in (("merge_insert", "lag_merge"), ("ingestion", "lag_ingest")):
        for s in shared.get(key, []):
            series.append(Series(f"{workload}: {s.case}", s.config, s.samples))
    for workload, key in (("scan", "lag_scan"), ("point lookups", "lag_lookup")):
        for config, stats in shared.get(key, {}).items():
            series.append(Series(workload, config, [stats]))
    ingest_counts = ", ".join(f"{s.config} {s.case}" for s in shared.get("lag_ingest", []))
    notes = [
        "Ratio column: lance_async's median p99 lag ÷ the configuration's, in the same "
        "workload (below 1: the loop is less delayed with lance_async).",
        "pylance_in_async_def: the pylance call made directly inside `async def` (the loop "
        "awaits between messages, batches or keys, as a feed or a handler would, but not "
        "during a call). Its lag is the length of the calls: every tick that falls inside "
        "one waits for it to end.",
        "Ticks are counted from the operation's start to its end; a blocked loop yields few "
        "ticks, each as late as the blocking call was long.",
    ]
    if ingest_counts:
        notes.append(
            "Ingestion runs on different feed lengths per configuration (" + ingest_counts + "; "
            "durable per-message puts take about 100 ms each); the lag is a per-tick figure, so "
            "the p99s compare, but the operation walls do not."
        )
    if not lancedb:
        notes.append(f"LanceDB not measured: {lancedb_note}")
    return Section(
        key="loop_lag",
        title="Event-loop lag during each workload",
        intro=(
            "A task sleeping 1 ms in a loop runs beside each workload on the same asyncio "
            "loop; lag = how late it wakes. merge_insert and ingestion: 3 runs per "
            "configuration (fresh child each; medians [min–max] of each run's figure); "
            "scan and lookups: one pass in the measuring child."
        ),
        tables=[
            summary_table(
                "Ticker lag per workload and configuration: medians [min–max]",
                series,
                LAG_METRICS,
                LAG_METRICS[1],
                "lance_async ÷ config (lag p99)",
                group=lambda s: s.case.split(":")[0],
            )
        ],
        series=series,
        charts=[],
        notes=notes,
    )


# ---------------------------------------------------------------------------
# charts
# ---------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by_config(configs: set[str]) -> list[str]:
    """lance_async first, then the alternatives by name (legend and bar order)."""
    return sorted(configs, key=lambda c: (c != LANCE_ASYNC, c))


def _save(plt: Any, fig: Any, ax: Any, out: Path, name: str, grid_axis: str = "both") -> str:
    """Grid, legend, layout; write ``out/name`` at 110 dpi and close the figure."""
    ax.grid(True, axis=grid_axis, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def chart_ingest_sweep(shared: dict[str, Any], out: Path) -> str | None:
    """rows/s against rows per message, log-log; the 10k pre-batched floor as a line."""
    sweep: list[Series] = shared.get("ingest_sweep", [])
    if not sweep:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    configs = _by_config({s.config for s in sweep})
    for config in configs:
        points = sorted(
            (int(s.case.split()[0]), s.median("rows_per_s")) for s in sweep if s.config == config
        )
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=config, linewidth=2.2 if config == LANCE_ASYNC else 1.4)
    floors = [
        s.median("rows_per_s") for s in shared.get("ingest_series", []) if s.config == "floor"
    ]
    if floors:
        ax.axhline(max(floors), color="grey", linestyle="--", label="floor: 10,000-row puts")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows per message")
    ax.set_ylabel("rows/s acknowledged durable (median)")
    ax.set_title("MemWAL ingestion: throughput against message size")
    return _save(plt, fig, ax, out, "ingest_throughput_vs_message_size.png")


def chart_scan_sweep(shared: dict[str, Any], out: Path) -> str | None:
    """Scan rows/s against batch size."""
    sweep: list[Series] = shared.get("scan_sweep", [])
    if not sweep:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for config in _by_config({s.config for s in sweep}):
        points = sorted(
            (int(s.case.split()[-1]), s.median("rows_per_s")) for s in sweep if s.config == config
        )
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, [y / 1e6 for y in ys], marker="o", label=config)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("scan batch_size (rows)")
    ax.set_ylabel("million rows/s (median)")
    ax.set_title("Full scan: throughput against batch size")
    return _save(plt, fig, ax, out, "scan_throughput_vs_batch_size.png")


def chart_ack_histogram(shared: dict[str, Any], out: Path, limit_ms: float) -> str | None:
    """The distribution of lance_async ack latencies (10xN runs pooled)."""
    hists: list[dict[str, Any]] = shared.get("ack_histograms", [])
    if not hists:
        return None
    pooled: dict[float, int] = {}
    total = 0
    worst = 0.0
    for h in hists:
        total += int(h["n"])
        worst = max(worst, float(h["max"]))
        for edge, count in h["bins"]:
            pooled[edge] = pooled.get(edge, 0) + int(count)
    merged = LatencyHistogram()
    for edge, count in pooled.items():
        idx = round(math.log10(edge / merged.LOW) * merged.PER_DECADE)
        merged.counts[max(0, min(idx, len(merged.counts) - 1))] += count
    merged.n = total
    merged.max = worst
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    edges = sorted(pooled)
    lefts = [e / 10 ** (1 / merged.PER_DECADE) * 1000 for e in edges]
    widths = [e * 1000 - left for e, left in zip(edges, lefts, strict=True)]
    ax.bar(lefts, [pooled[e] for e in edges], width=widths, align="edge", color="tab:blue")
    p50 = merged.quantile(0.5) * 1000
    p99 = merged.quantile(0.99) * 1000
    ax.axvline(p50, color="tab:green", linestyle="--", label=f"p50 {p50:.0f} ms")
    ax.axvline(p99, color="tab:orange", linestyle="--", label=f"p99 {p99:.0f} ms")
    ax.axvline(limit_ms, color="tab:red", linestyle=":", label=f"target p99 ≤ {limit_ms:.0f} ms")
    ax.set_xscale("log")
    ax.set_xlabel("ack latency (ms): send() to durable ack")
    ax.set_ylabel("messages")
    ax.set_title(f"lance_async ack latency, 10-row messages ({total:,} acks, {len(hists)} runs)")
    return _save(plt, fig, ax, out, "ack_latency_distribution.png")


def chart_lag(section: Section, out: Path) -> str | None:
    """p99 ticker lag per workload and configuration (log scale)."""
    series = section.series
    if not series:
        return None
    plt = _pyplot()
    workloads: list[str] = []
    for s in series:
        w = s.case.split(":")[0]
        if w not in workloads:
            workloads.append(w)
    configs = _by_config({s.config for s in series})
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    width = 0.8 / max(1, len(configs))
    for i, config in enumerate(configs):
        xs, ys = [], []
        for j, w in enumerate(workloads):
            match = [s for s in series if s.case.split(":")[0] == w and s.config == config]
            if match:
                xs.append(j + i * width)
                ys.append(max(0.01, summarize(match[0].values("lag_p99_ms"))[0]))
        ax.bar(xs, ys, width=width, label=config)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(workloads))], workloads)
    ax.set_yscale("log")
    ax.set_ylabel("p99 lag of a 1 ms ticker (ms, median of runs)")
    ax.set_title("Event-loop lag during each workload")
    return _save(plt, fig, ax, out, "loop_lag_p99.png", grid_axis="y")


# ---------------------------------------------------------------------------
# markdown
# ---------------------------------------------------------------------------


def _md_table(table: Table) -> list[str]:
    lines = [f"**{table.title}**", ""]
    lines.append("| " + " | ".join(table.header) + " |")
    lines.append("| " + " | ".join("---" for _ in table.header) + " |")
    for row in table.rows:
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    if table.note:
        lines += ["", f"_{table.note}_"]
    lines.append("")
    return lines


def write_report(
    out: Path,
    sections: list[Section],
    facts: dict[str, str],
    command: str,
    mode: str,
    wall_seconds: float,
    started: str,
    runs: int,
    lancedb_line: str,
    code: CodeState | None = None,
    raw_json: str = "",
) -> Path:
    """Write REPORT.md; returns its path."""
    lines = [
        "# lance_async benchmark report",
        "",
        f"- Command: `{command}` (from the repository root)",
        f"- Mode: {mode}; {runs} runs per configuration unless a table says otherwise",
        f"- Started: {started}; whole suite took {wall_seconds:.0f} s",
        f"- LanceDB alternative: {lancedb_line}",
    ]
    if raw_json:
        lines.append(f"- Raw results (every run's figures): [{raw_json}]({raw_json})")
    if code is not None:
        if code.dirty:
            lines.append(
                f"- **Working tree dirty at start**: commit {code.commit} plus uncommitted "
                f"changes to {len(code.changed)} path(s) (listed under Machine); the code "
                "measured is not exactly that commit."
            )
        else:
            lines.append(f"- Code: commit {code.commit}, working tree clean at start")
    lines += [
        "",
        "## Machine",
        "",
        "| fact | value |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v} |" for k, v in facts.items()]
    lines += ["", "## Targets", ""]
    all_targets = [t for s in sections for t in s.targets]
    if all_targets:
        passed = sum(t.passed for t in all_targets)
        lines += [
            f"{len(all_targets)} targets checked: {passed} PASS, {len(all_targets) - passed} MISS.",
            "",
        ]
    for section in sections:
        for target in section.targets:
            lines.append(f"- {target.line()}")
    if not any(s.targets for s in sections):
        lines.append("- (no targets evaluated)")
    lines += [
        "",
        "## How to read this",
        "",
        "- Tables titled 'medians [min–max]' show `median [min–max]` over the runs, with a "
        "runs column; a cell is a single number when there was one run or every run gave "
        "the same value at the digits shown.",
        "- Ratio cells (`0.95x`) are `lance_async ÷ alternative` of the medians, in the same "
        "case (the lag table: the same workload); each ratio column or table says which "
        "direction is better. The bytes-written table and the growth table hold medians and "
        "ratios of medians only, as their titles say.",
        "- A target's measured value is printed with as many decimals as it takes not to "
        "round a miss into a pass (three when it is within 1% of the limit).",
        "- merge_insert and ingestion runs each run in a fresh child process forked from a "
        "server that has only imported the libraries (no engine call before the fork), so "
        "peak RSS (`ru_maxrss`) and bytes written (`write_bytes`) are that run's own; the "
        "baseline RSS of an idle child is in the raw JSON (`base_rss_mib`).",
        "- Sizes were chosen so the full suite fits in 10 minutes on this machine.",
        "- The machine may be shared: a load average above the core count (see Machine) "
        "means other processes competed for the 2 cores during the run, which widens the "
        "[min–max] ranges; configurations alternate within each round so that such noise "
        "spreads over all of them.",
        "- On a virtual machine the hypervisor may run other guests on the same cores: "
        "'CPU steal during <section>' (see Machine; Linux's `/proc/stat`) is the share of the "
        "cores' time taken from this guest meanwhile, and each run's own share is `steal_pct` "
        "in the raw JSON. A few percent or more slows runs unevenly, even in the same round. "
        "Steal does not show everything: a guest's cores also run slower at times (a busy "
        "sibling thread, the host's clock); the ingestion section's `harness_only` row (no "
        "writer at all) is the speed reference of each round.",
        "",
    ]
    for section in sections:
        lines += [f"## {section.title}", "", section.intro, ""]
        for target in section.targets:
            lines.append(f"- {target.line()}")
        if section.targets:
            lines.append("")
        for table in section.tables:
            lines += _md_table(table)
        for note in section.notes:
            lines.append(f"- {note}")
        if section.notes:
            lines.append("")
        for chart in section.charts:
            lines += [f"![{chart}]({chart})", ""]
        lines.append(f"_Section time: {section.seconds:.0f} s{section.seconds_note}._")
        lines.append("")
    path = out / "REPORT.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def fmt_seconds(value: float) -> str:
    """Seconds for prose."""
    return fmt_num(value, 1)
