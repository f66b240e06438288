"""The ``create`` command (a table from a file or a schema, with its primary key),
the schema spec it reads, and standard input spooled for commands that must
read their rows twice."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import typer

from .common import (
    STORAGE_OPTION,
    Progress,
    Writes,
    app,
    count,
    file_size,
    out,
    parse_storage_options,
    run_command,
)
from .inputs import (
    ROWS_FORMAT,
    check_format,
    check_source,
    csv_extra_columns,
    format_of,
    inferred_csv_error,
    with_csv_line,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["create", "parse_schema_spec", "spooled_stdin", "with_primary_key"]

_ALIASES = {
    "int": "int64",
    "integer": "int64",
    "long": "int64",
    "float": "float64",
    "double": "float64",
    "str": "string",
    "text": "string",
    "boolean": "bool",
    "bytes": "binary",
    "timestamp": "timestamp[us]",
    "datetime": "timestamp[us]",
    "date": "date32",
}
_VECTOR = re.compile(r"^(?P<item>[a-z0-9_]+)\[(?P<size>\d+)\]$")
_MAX_LIST_SIZE = 2**31 - 1  # Arrow's fixed-size list: an int32 size


def _split_items(spec: str) -> list[str]:
    """``spec`` cut at the commas outside brackets and parentheses
    (``a:decimal(10,2)`` stays one item, to be refused by its type)."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(spec):
        if char in "([<":
            depth += 1
        elif char in ")]>":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    items.append(spec[start:])
    return [item.strip() for item in items]


def _parse_type(text: str, column: str) -> pa.DataType:
    import pyarrow as pa

    name = _ALIASES.get(text.strip().lower(), text.strip().lower())
    match = _VECTOR.match(name)
    if match and not name.startswith(("timestamp", "time", "duration")):
        item = _parse_type(match["item"], column)
        size = int(match["size"])
        if not 1 <= size <= _MAX_LIST_SIZE:
            raise typer.BadParameter(
                f"column {column!r}: a vector's size must be in 1..{_MAX_LIST_SIZE:,}, "
                f"got {match['size']}",
                param_hint="'--schema'",
            )
        return pa.list_(item, size)
    try:
        return pa.type_for_alias(name)
    except ValueError:
        raise typer.BadParameter(
            f"column {column!r}: unknown type {text!r} (int64, float64, string, bool, "
            "timestamp[ms], date32, binary, float32[128] for a vector, ...)",
            param_hint="'--schema'",
        ) from None


def parse_schema_spec(spec: str) -> pa.Schema:
    """A schema from ``NAME:TYPE,NAME:TYPE`` (``id:int64,name:string,emb:float32[8]``).

    Types are pyarrow's aliases (``int64``, ``float64``, ``string``, ``bool``,
    ``timestamp[ms]``, ``date32``, ``binary``, ...) plus ``int``, ``float``,
    ``str``, ``date``, ``timestamp`` (microseconds), and ``TYPE[N]`` for a
    fixed-size list (a vector). A ``!`` after the type makes the column
    non-nullable (key columns always are).

    Raises
    ------
    typer.BadParameter
        An item without ``:``, an unknown type, or a repeated name (exit 2).
    """
    import pyarrow as pa

    fields = []
    seen: set[str] = set()
    for item in _split_items(spec):
        if not item:
            continue
        name, sep, kind = item.partition(":")
        name = name.strip()
        if not sep or not name or not kind.strip():
            raise typer.BadParameter(f"expected NAME:TYPE, got {item!r}", param_hint="'--schema'")
        if name in seen:
            raise typer.BadParameter(f"column {name!r} is named twice", param_hint="'--schema'")
        seen.add(name)
        required = kind.strip().endswith("!")
        fields.append(pa.field(name, _parse_type(kind.strip().rstrip("!"), name), not required))
    if not fields:
        raise typer.BadParameter("no columns", param_hint="'--schema'")
    return pa.schema(fields)


def with_primary_key(schema: pa.Schema, key: list[str]) -> pa.Schema:
    """``schema`` with ``key`` marked as Lance's primary key (non-nullable,
    ``lance-schema:unenforced-primary-key`` and its position for composite keys)."""
    import pyarrow as pa

    from .._schema import PRIMARY_KEY_META

    fields = []
    for f in schema:
        if f.name in key:
            meta = dict(f.metadata or {})
            meta[PRIMARY_KEY_META] = b"true"
            if len(key) > 1:
                meta[PRIMARY_KEY_META + b"-position"] = str(key.index(f.name)).encode()
            f = pa.field(f.name, f.type, False, metadata=meta)
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


@asynccontextmanager
async def spooled_stdin(source: str) -> AsyncIterator[str]:
    """``source`` itself, or for ``-`` a temporary file holding standard input.

    A merge may read its rows twice (a conflict is retried by reading the
    source again), so standard input is copied to a file first, on a worker
    thread; the file is deleted afterwards.
    """
    if source != "-":
        yield source
        return
    folder = tempfile.mkdtemp(prefix="lance-async-stdin-")
    path = os.path.join(folder, "stdin")

    def copy() -> None:
        with open(path, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)

    try:
        await anyio.to_thread.run_sync(copy)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@app.command()
def create(
    table_uri: str = typer.Argument(
        ..., metavar="TABLE_URI", help="Where the new Lance table goes."
    ),
    source: str | None = typer.Option(
        None,
        "--from",
        metavar="FILE",
        help="Rows to start with: a file (.ndjson/.jsonl, .json, .csv, .arrow/.ipc) or '-' "
        "for stdin; the columns and types come from it unless --schema is given.",
    ),
    schema_spec: str | None = typer.Option(
        None,
        "--schema",
        metavar="SPEC",
        help="Columns as NAME:TYPE,... e.g. id:int64,name:string,emb:float32[8] "
        "(TYPE! for not null).",
    ),
    key: list[str] = typer.Option(
        None,
        "--key",
        "-k",
        metavar="COLUMN",
        help="The primary key column (repeat for a composite key); merges and the MemWAL need one.",
    ),
    no_key: bool = typer.Option(
        False, "--no-key", help="Create the table without a primary key (not recommended)."
    ),
    format: str | None = ROWS_FORMAT,
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Create TABLE_URI from a file (--from) or a schema (--schema), with its primary key.

    Without --key the command refuses (exit 2): a table without a declared
    key cannot take a MemWAL, and concurrent merges cannot detect two
    inserts of the same new key in it. Pass --no-key to create one anyway.
    """
    check_format(format)
    if source is None and schema_spec is None:
        raise typer.BadParameter("give --from FILE or --schema SPEC (or both)")
    if schema_spec is not None and not schema_spec.strip():
        raise typer.BadParameter("is empty: give NAME:TYPE,...", param_hint="'--schema'")
    repeated = sorted({k for k in key or [] if list(key).count(k) > 1})
    if repeated:
        raise typer.BadParameter(f"column {repeated[0]!r} is named twice", param_hint="'--key'")
    if key and no_key:
        raise typer.BadParameter("--key and --no-key exclude each other", param_hint="'--no-key'")
    if not key and not no_key:
        raise typer.BadParameter(
            "name the primary key (merges match on it, and the MemWAL needs it), "
            "or pass --no-key to create a table without one",
            param_hint="'--key'",
        )
    if source is not None:
        check_source(source)
    declared = parse_schema_spec(schema_spec) if schema_spec is not None else None
    fmt = format or ("ndjson" if source in (None, "-") else format_of(str(source)))
    storage = parse_storage_options(storage_option)
    writes = Writes()

    async def run() -> tuple[int, list[str]]:
        from .. import errors
        from ..dataset import open_dataset, write_dataset
        from ..sources.files import file_source

        try:
            await open_dataset(table_uri, storage_options=storage)
        except errors.DatasetNotFoundError:
            pass
        else:
            raise errors.InvalidInputError(
                f"a table exists at {table_uri} already; see it with: lance-async info {table_uri}"
            )
        async with _cleanup_on_failure(table_uri):
            if source is None:
                assert declared is not None
                schema = _keyed(declared, key)
                ds = await write_dataset(schema.empty_table(), table_uri, storage_options=storage)
                return await ds.count_rows(), ds.primary_key
            async with spooled_stdin(source) as path:
                label = "stdin" if source == "-" else Path(source).name
                size = await file_size(path)
                if size == 0:
                    what = "standard input" if source == "-" else source
                    raise _NoRows(
                        f"{what} is empty: no rows, nothing was created (to create a table "
                        "without rows, give --schema and leave out --from)"
                    )
                if declared is not None and fmt == "csv":
                    extra = await anyio.to_thread.run_sync(
                        partial(csv_extra_columns, path, declared)
                    )
                    if extra:  # never dropped silently
                        raise typer.BadParameter(
                            f"{label} has column(s) {', '.join(map(repr, extra))} that the "
                            "schema lacks: name them in --schema too, or leave --schema out "
                            "to take every column with inferred types",
                            param_hint="'--schema'",
                        )
                probe = file_source(path, format=fmt, schema=declared)
                try:
                    inferred = await probe.resolve_schema()
                except Exception as exc:
                    located = await inferred_csv_error(exc, path, label, fmt)
                    if located is exc:
                        raise
                    raise located from exc
                schema = _keyed(inferred, key)
                rows = await _check_rows(path, fmt, schema, key, label, size)
                if rows == 0:
                    raise _NoRows(
                        f"{label} holds no rows: nothing was created (to create a table "
                        "without rows, give --schema and leave out --from)"
                    )
                with Progress(f"create from {label}", size, unit="bytes") as progress:
                    src = file_source(path, format=fmt, schema=schema, on_read=progress.update)
                    writes.started = True
                    ds = await write_dataset(src, table_uri, schema=schema, storage_options=storage)
                return await ds.count_rows(), ds.primary_key

    rows, pk = run_command(run, writes)
    what = f"primary key {', '.join(pk)}" if pk else "no primary key"
    # a MemWAL needs a primary key: without one, only merges (--allow-non-key) apply
    nexts = f"lance-async merge FILE {table_uri}"
    nexts += f", or lance-async init-wal {table_uri}" if pk else " --on COLUMN --allow-non-key"
    out.print(f"created {table_uri}: {count(rows, 'row')}, {what}; next: {nexts}", markup=False)


class _NoRows(ValueError):
    """``--from`` gave no rows (an empty file or standard input)."""


async def _check_rows(
    path: str, fmt: str, schema: pa.Schema, key: list[str] | None, label: str, size: int
) -> int:
    """Decode the whole file once before anything is written, and check that
    no primary key repeats in it (the merges' check, :class:`KeyTracker`).

    Returns the number of rows. Raises :class:`~lance_async.DecodeError` for
    a bad row and :class:`~lance_async.errors.DuplicateKeyError` for a
    repeated key, both before the table exists.
    """
    from .._duplicates import KeyTracker
    from .._threads import run_sync
    from ..sources.files import file_source

    tracker = KeyTracker(key, what=label) if key else None
    rows = 0
    with Progress(f"check {label}", size, unit="bytes") as progress:
        src = file_source(path, format=fmt, schema=schema, on_read=progress.update)
        try:
            async for batch in src.open():
                rows += batch.num_rows
                if tracker is not None:
                    await run_sync(partial(tracker.add, batch))
        except Exception as exc:
            located = await with_csv_line(exc, path, label, fmt, schema)
            if located is exc:
                raise
            raise located from exc
    if tracker is not None:
        await run_sync(tracker.check)
    return rows


@asynccontextmanager
async def _cleanup_on_failure(uri: str) -> AsyncIterator[None]:
    """Remove what a failed ``create`` made at a local ``uri`` (the table
    folder when it did not exist before, else the entries it added), so a
    failure leaves no half-made table; object stores are left as they are."""
    local = uri[len("file://") :] if uri.startswith("file://") else uri
    if "://" in local:
        yield
        return

    def entries() -> tuple[bool, set[str] | None]:
        return os.path.lexists(local), set(os.listdir(local)) if os.path.isdir(local) else None

    existed, before = await anyio.to_thread.run_sync(entries)
    try:
        yield
    except BaseException:

        def remove() -> None:
            versions = os.path.join(local, "_versions")
            if os.path.isdir(versions) and os.listdir(versions):
                return  # a committed table (another writer's): not ours to remove
            if not existed:
                shutil.rmtree(local, ignore_errors=True)
            elif before is not None and os.path.isdir(local):
                for name in set(os.listdir(local)) - before:
                    target = os.path.join(local, name)
                    if os.path.isdir(target) and not os.path.islink(target):
                        shutil.rmtree(target, ignore_errors=True)
                    else:
                        with contextlib.suppress(OSError):
                            os.remove(target)

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(remove)
        raise


def _keyed(schema: pa.Schema, key: list[str] | None) -> pa.Schema:
    """The table schema: ``key`` checked against the columns and marked."""
    import pyarrow as pa

    unknown = [k for k in key or [] if k not in schema.names]
    if unknown:
        raise typer.BadParameter(
            f"no column {unknown[0]!r} (the columns are {', '.join(schema.names)})",
            param_hint="'--key'",
        )
    nested = [k for k in key or [] if pa.types.is_nested(schema.field(k).type)]
    if nested:
        raise typer.BadParameter(
            f"column {nested[0]!r} is a {schema.field(nested[0]).type}: a key is a scalar "
            "(an integer, a string, ...), which the MemWAL's shards hash",
            param_hint="'--key'",
        )
    return with_primary_key(schema, list(key or [])) if key else schema
