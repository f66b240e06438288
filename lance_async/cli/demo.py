"""The ``demo`` command: the main job on the 2013 NYC flights."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import Progress, TaskID
from rich.table import Table

from .common import (
    app,
    out,
    progress_bar,
    run_command,
)


class _RichDemoProgress:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}

    def stage(self, name: str, total: float | None) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.progress.add_task(name, total=total)

    def advance(self, name: str, amount: float) -> None:
        if name in self.tasks:
            self.progress.advance(self.tasks[name], amount)

    def log(self, message: str) -> None:
        self.progress.console.print(f"  {message}")

    def done(self, name: str) -> None:
        if name in self.tasks:
            self.progress.update(self.tasks[name], total=1, completed=1)


@app.command()
def demo(
    dir: str = typer.Option("lance_async_demo", "--dir", help="Where the demo's tables go."),
) -> None:
    """Run the whole mission on the 2013 NYC flights (336,776 rows)."""
    from ..demo import run_demo

    with progress_bar() as progress:
        report = run_command(lambda: run_demo(Path(dir), _RichDemoProgress(progress)))
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
        out.print(f"  {'[green]PASS' if ok else '[red]FAIL'}[/] {name}")
    if not report.ok:
        raise typer.Exit(1)
