"""The ``scan`` command: a table's rows to standard output."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import typer

from .. import errors
from .common import (
    STORAGE_OPTION,
    app,
    check_columns,
    err,
    escape,
    number,
    open_table,
    out,
    run_command,
)

if TYPE_CHECKING:
    import pyarrow as pa


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


@app.command()
def scan(
    table_uri: str = typer.Argument(..., metavar="TABLE_URI", help="The Lance table."),
    filter: str | None = typer.Option(None, "--filter", metavar="EXPR", help="Lance SQL filter."),
    columns: str | None = typer.Option(
        None, "--columns", metavar="A,B,...", help="Comma-separated columns."
    ),
    limit: int | None = typer.Option(
        None, "--limit", metavar="N", help="At most this many rows.", callback=number("--limit")
    ),
    format: str | None = typer.Option(
        None,
        "--format",
        "-f",
        metavar="FORMAT",
        help="table, ndjson or ipc (default: table on a terminal, ndjson in a pipe).",
    ),
    lsm: bool = typer.Option(False, "--lsm", help="Include flushed MemWAL generations."),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Stream TABLE_URI's rows to standard output."""
    fmt = format or ("table" if sys.stdout.isatty() else "ndjson")
    if fmt not in ("table", "ndjson", "ipc"):
        raise typer.BadParameter("--format must be table, ndjson or ipc")
    cols = [c.strip() for c in columns.split(",")] if columns else None

    async def run() -> _Preview | None:
        ds = await open_table(table_uri, storage_option)
        if cols:
            check_columns(ds, cols, "--columns")
        try:  # a filter is checked at the call (one expression) and at open (columns)
            if lsm:
                stream = ds.lsm_scan(columns=cols, filter=filter, limit=limit)
            else:
                stream = ds.scan(columns=cols, filter=filter, limit=limit)
        except errors.InvalidInputError as exc:
            if filter is None:
                raise
            raise typer.BadParameter(str(exc), param_hint="'--filter'") from None
        async with stream:
            try:
                await stream.open()
            except errors.InvalidInputError as exc:
                if filter is None:
                    raise
                raise typer.BadParameter(str(exc), param_hint="'--filter'") from None
            if fmt == "ipc":
                await _write_ipc(stream)
            elif fmt == "ndjson":
                await _write_ndjson(stream)
            else:
                return await _preview(stream)
        return None

    try:
        preview = run_command(run)
        if preview is not None:
            _print_preview(preview)
    except BrokenPipeError:  # `| head` closed the pipe: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _ndjson_out(batch: pa.RecordBatch) -> None:
    """Write a batch to standard output as NDJSON (blocking: encoding and write)."""
    if batch.num_rows:
        lines = [json.dumps(r, default=_json_default) for r in batch.to_pylist()]
        sys.stdout.write("\n".join(lines) + "\n")


async def _write_ndjson(stream: Any) -> None:
    from .._threads import run_sync, stream_limiter

    limiter = stream_limiter()
    async for batch in stream:
        await run_sync(partial(_ndjson_out, batch), limiter=limiter)
    await run_sync(sys.stdout.flush, limiter=limiter)


async def _write_ipc(stream: Any) -> None:
    """The stream as an Arrow IPC stream on standard output. Its end-of-stream
    marker is written only after the last batch, so a scan that fails half
    way leaves a stream its reader sees as cut short."""
    import pyarrow as pa

    from .._threads import run_sync, stream_limiter

    sink = sys.stdout.buffer
    limiter = stream_limiter()
    writer = await run_sync(partial(pa.ipc.new_stream, sink, stream.schema), limiter=limiter)
    async for batch in stream:
        await run_sync(partial(writer.write_batch, batch), limiter=limiter)

    def close() -> None:
        writer.close()
        sink.flush()

    await run_sync(close, limiter=limiter)


@dataclass
class _Preview:
    """The first rows of a scan, for the ``table`` format."""

    names: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0


async def _preview(stream: Any, most: int = 1_000) -> _Preview:
    """Up to ``most`` rows as Python values (converted on a worker thread)."""
    from .._threads import run_sync, stream_limiter

    preview = _Preview(list(stream.schema.names))
    async for batch in stream:
        preview.total += batch.num_rows
        room = most - len(preview.rows)
        if room > 0:
            part = batch.slice(0, room)
            preview.rows.extend(await run_sync(part.to_pylist, limiter=stream_limiter()))
    return preview


def _print_preview(preview: _Preview) -> None:
    """A table when narrow, one block per row when wide (after the event loop ended)."""
    from rich.table import Table

    names, rows = preview.names, preview.rows
    if len(names) <= 8:
        table = Table(*(escape(n) for n in names))
        for row in rows:
            table.add_row(*("" if v is None else escape(str(v)) for v in row.values()))
        out.print(table)
    else:
        width = max(len(n) for n in names)
        for i, row in enumerate(rows):
            out.print(f"[bold]-- row {i + 1}[/bold]")
            for name, value in row.items():
                line = f"{name:>{width}}  {'' if value is None else value}"
                out.print(line, highlight=False, markup=False)
    if preview.total > len(rows):
        err.print(f"(showing {len(rows):,} of {preview.total:,} rows; use --format ndjson for all)")
