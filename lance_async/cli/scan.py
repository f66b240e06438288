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
    lsm: bool = typer.Option(
        False,
        "--lsm",
        help="Read the LSM view: the base table, flushed MemWAL generations and the rows "
        "acknowledged in the WAL by any writer, newest per key.",
    ),
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
                stream = ds.lsm.scan(columns=cols, filter=filter, limit=limit)
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


def _key_value(text: str, field: pa.Field) -> Any:
    """One key value from the command line, by its column's type (exit 2 when it does not fit)."""
    import datetime

    import pyarrow as pa

    dtype = field.type
    try:
        if pa.types.is_integer(dtype):
            return int(text)
        if pa.types.is_floating(dtype):
            return float(text)
        if pa.types.is_boolean(dtype):
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if pa.types.is_date(dtype):
            return datetime.date.fromisoformat(text)
        if pa.types.is_timestamp(dtype):
            return datetime.datetime.fromisoformat(text)
        if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
            return text
    except ValueError:
        raise typer.BadParameter(
            f"{text[:64]!r} is not a value of type {dtype} (the key column {field.name!r})",
            param_hint="'KEY'",
        ) from None
    raise typer.BadParameter(f"lookups by a {dtype} key are not supported", param_hint="'KEY'")


def parse_keys(texts: list[str], schema: pa.Schema, key: list[str]) -> list[Any]:
    """KEY arguments as key values: one value each for a one-column key; for a
    composite key, one JSON array each (``'[1, "a"]'``), in key order."""
    if len(key) == 1:
        return [_key_value(t, schema.field(key[0])) for t in texts]
    values = []
    for text in texts:
        try:
            parts = json.loads(text)
        except ValueError:
            parts = None
        if not isinstance(parts, list) or len(parts) != len(key):
            raise typer.BadParameter(
                f"the key is ({', '.join(key)}): give each KEY as a JSON array of "
                f"{len(key)} values, got {text[:64]!r}",
                param_hint="'KEY'",
            )
        values.append(
            {k: _key_value(str(v), schema.field(k)) for k, v in zip(key, parts, strict=True)}
        )
    return values


@app.command()
def lookup(
    table_uri: str = typer.Argument(..., metavar="TABLE_URI", help="The Lance table."),
    keys: list[str] = typer.Argument(
        ...,
        metavar="KEY...",
        help="Primary key values (a JSON array each for a composite key).",
    ),
    columns: str | None = typer.Option(
        None, "--columns", metavar="A,B,...", help="Comma-separated columns."
    ),
    base: bool = typer.Option(
        False, "--base", help="Read the base table only, not the MemWAL's newer rows."
    ),
    format: str | None = typer.Option(
        None,
        "--format",
        "-f",
        metavar="FORMAT",
        help="table or ndjson (default: table on a terminal, ndjson in a pipe).",
    ),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """The newest row of each KEY in TABLE_URI (an LSM point lookup: rows in the
    MemWAL's flushed generations included).

    Rows come in the order of the keys; exit status 1 when a key has no row
    (it is named on standard error).
    """
    fmt = format or ("table" if sys.stdout.isatty() else "ndjson")
    if fmt not in ("table", "ndjson"):
        raise typer.BadParameter("--format must be table or ndjson")
    cols = [c.strip() for c in columns.split(",")] if columns else None

    async def run() -> tuple[list[dict[str, Any]], list[str], list[str]]:
        from .._threads import run_sync

        ds = await open_table(table_uri, storage_option)
        key = list(ds.primary_key)
        if not key:
            raise typer.BadParameter(
                f"{table_uri} has no primary key to look rows up by; use scan --filter",
                param_hint="'KEY'",
            )
        if cols:
            check_columns(ds, cols, "--columns")
        values = parse_keys(keys, ds.schema, key)
        wanted = None if cols is None else list(dict.fromkeys([*key, *cols]))
        found = await ds.lsm.point_lookups(values, columns=wanted, snapshots=[] if base else None)
        rows = await run_sync(found.to_pylist)
        got = {json.dumps([r[k] for k in key], default=str) for r in rows}
        missing = [
            t
            for t, v in zip(keys, values, strict=True)
            if json.dumps([v[k] for k in key] if isinstance(v, dict) else [v], default=str)
            not in got
        ]
        shown = [{k: v for k, v in r.items() if cols is None or k in cols} for r in rows]
        return shown, list(found.column_names if cols is None else cols), missing

    rows, names, missing = run_command(run)
    if fmt == "ndjson":
        for row in rows:
            sys.stdout.write(json.dumps(row, default=_json_default) + "\n")
        sys.stdout.flush()
    elif rows:
        _print_preview(_Preview(names, rows, len(rows)))
    for key_text in missing:
        err.print(f"no row for key {key_text}", markup=False)
    if missing:
        raise typer.Exit(1)
