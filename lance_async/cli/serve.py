"""The ``serve`` command: the example FastAPI app."""

from __future__ import annotations

import gc
from pathlib import Path

import typer

from .common import (
    app,
    err,
)


@app.command()
def serve(
    root: str = typer.Option(".", "--root", help="Directory of <name>.lance tables."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    allow_raw_sql: bool = typer.Option(False, "--allow-raw-sql", help="Accept raw SQL filters."),
    max_body_bytes: int | None = typer.Option(None, "--max-body-bytes"),
    spool_dir: str | None = typer.Option(None, "--spool-dir", help="Where replay spools go."),
) -> None:
    """Serve a directory of Lance tables over HTTP (the 'fastapi' extra)."""
    try:
        from ..web.server import main as serve_main
    except ImportError as exc:
        err.print(f"[red]error:[/red] {exc}; pip install 'lance-async[fastapi]'")
        raise typer.Exit(2) from None
    gc.freeze()  # start-up objects out of the collector's way (README, GC)
    serve_main(
        host,
        port,
        Path(root),
        allow_raw_sql=allow_raw_sql,
        max_body_bytes=max_body_bytes,
        spool_dir=spool_dir,
    )
