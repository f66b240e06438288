"""The ``demo`` command: the main job on the 2013 NYC flights."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer

from .common import (
    app,
    err,
    escape,
    out,
    run_command,
)


class _RichDemoProgress:
    """The demo's stages as rich bars (standard error is a terminal)."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}

    def stage(self, name: str, total: float | None) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.progress.add_task(name, total=total)

    def advance(self, name: str, amount: float) -> None:
        if name in self.tasks:
            self.progress.advance(self.tasks[name], amount)

    def log(self, message: str) -> None:
        self.progress.console.print(f"  {message}", markup=False)

    def done(self, name: str) -> None:
        if name in self.tasks:
            self.progress.update(self.tasks[name], total=1, completed=1)


class _PlainDemoProgress:
    """The demo's stages as plain lines (standard error is a log or a pipe):
    one when a stage starts and ends, and at most one every ``interval``
    seconds while it runs."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self.totals: dict[str, float | None] = {}
        self.done_so_far: dict[str, float] = {}
        self.last = time.monotonic()

    def _print(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def stage(self, name: str, total: float | None) -> None:
        if name not in self.totals:
            self.totals[name] = total
            self.done_so_far[name] = 0.0
            self._print(f"{name}: started")

    def advance(self, name: str, amount: float) -> None:
        if name not in self.totals:
            return
        self.done_so_far[name] += amount
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            total = self.totals[name]
            of = f" of {total:,.0f}" if total else ""
            self._print(f"{name}: {self.done_so_far[name]:,.0f}{of}")

    def log(self, message: str) -> None:
        self._print(f"  {message}")

    def done(self, name: str) -> None:
        if name in self.totals:
            self._print(f"{name}: done")


@app.command()
def demo(
    dir: str = typer.Option(
        "lance_async_demo", "--dir", metavar="DIR", help="Where the demo's tables go."
    ),
) -> None:
    """Run the whole mission on the 2013 NYC flights (336,776 rows)."""
    from rich.table import Table

    from ..demo import run_demo

    if sys.stderr.isatty():
        from rich import progress as rp

        bar = rp.Progress(
            rp.SpinnerColumn(),
            rp.TextColumn("[bold]{task.description}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TimeElapsedColumn(),
            console=err,
        )
        with bar:
            report = run_command(lambda: run_demo(Path(dir), _RichDemoProgress(bar)))
    else:
        report = run_command(lambda: run_demo(Path(dir), _PlainDemoProgress()))
    summary = Table(title="lance-async demo", show_header=False)
    summary.add_row("rows ingested (durable, acked)", f"{report.rows_ingested:,}")
    summary.add_row("engine puts (group commit)", f"{report.engine_puts:,}")
    summary.add_row("ingest rows/s", f"{report.rows_per_second:,.0f}")
    summary.add_row(
        "ack latency p50 / p99",
        f"{report.ack_latency_p50 * 1000:.0f} ms / {report.ack_latency_p99 * 1000:.0f} ms",
    )
    summary.add_row("late corrections", f"{report.corrections:,}")
    summary.add_row("weather merge attempts", " ".join(str(a) for a in report.merge_attempts))
    summary.add_row(
        "LSM point lookups (p99)", f"{report.lookups:,} ({report.lookup_p99 * 1000:.0f} ms)"
    )
    summary.add_row("generations compacted", str(report.compacted_generations))
    summary.add_row("max event-loop lag", f"{report.max_loop_lag * 1000:.1f} ms")
    summary.add_row("wall time", f"{report.seconds:.1f} s")
    out.print(summary)
    for name, ok in report.checks.items():
        out.print(f"  {'[green]PASS' if ok else '[red]FAIL'}[/] {escape(name)}")
    if not report.ok:
        raise typer.Exit(1)
