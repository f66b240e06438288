"""What the commands read: a source's checks, its format, CSV errors at the file's line.

Like every command module it imports only typer, rich and anyio at module
level (start-up); pylance and pyarrow load inside the functions that use
them.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

import anyio
import typer

from .. import errors
from .common import _one_line, fail

__all__ = [
    "ROWS_FORMAT",
    "ROW_FORMATS",
    "check_format",
    "check_source",
    "csv_extra_columns",
    "format_of",
    "inferred_csv_error",
    "source_schema",
    "with_csv_line",
]


def _csv_error_line(path: str, schema: Any, seconds: float) -> tuple[int, str] | None:
    """The first line of ``path`` where CSV decoding fails, and the error
    there (blocking; None when not found within ``seconds``).

    The decoder is fed 64 KiB of whole lines at a time, a copy of it kept
    before each feed; the piece that fails is fed again, to the copy, one
    line at a time.
    """
    import copy
    import csv

    from ..sources.decoders import make_decoder

    failures = (errors.DecodeError, csv.Error)
    decoder = make_decoder("csv", schema)
    deadline = time.monotonic() + seconds
    lines = 0
    with open(path, "rb") as f:
        while piece := f.read(1 << 16) + f.readline():
            if time.monotonic() > deadline:
                return None
            before = copy.deepcopy(decoder)
            try:
                decoder.feed(piece)
            except failures as exc:
                for raw in piece.splitlines(keepends=True):
                    lines += 1
                    try:
                        before.feed(raw)
                    except failures as first:
                        return lines, str(first)
                return lines, str(exc)
            lines += piece.count(b"\n")
    open_quote = bool(getattr(decoder, "_in_quotes", False))  # before finish() resets it
    try:
        decoder.finish()
    except failures as exc:
        hint = " (a quoted value is never closed)" if open_quote else ""
        return max(lines, 1), f"{exc}{hint}"
    return None


def _csv_header(path: str) -> list[str]:
    """The column names on a CSV file's first line (blocking)."""
    import csv

    with open(path, "rb") as f:
        text = f.readline().rstrip(b"\r\n").decode("utf-8", errors="replace").removeprefix("\ufeff")
    return next(csv.reader([text]), [])


_SCAN = 8 << 20  # bytes of a JSON file searched at a time for a field name


def _names_a_field(path: str, name: str) -> bool:
    """Whether any object of a JSON / NDJSON file names ``name`` as a key (blocking).

    The file is searched for the quoted name followed by a colon (spaces
    allowed): inside a JSON string a quote is escaped (``\\"``), so only a
    key matches. A key spelled with escapes (``"d\\u0069st"``) is not found:
    the decoder then refuses it as a field the merge's columns lack, it is
    never dropped silently.
    """
    import json

    needle = ('"' + json.dumps(name)[1:-1] + '"').encode()
    keep = len(needle) + 64  # a needle (and the spaces after it) cut by a read
    tail = b""
    with open(path, "rb") as f:
        while piece := f.read(_SCAN):
            data = tail + piece
            start = data.find(needle)
            while start >= 0:
                rest = data[start + len(needle) : start + len(needle) + 64].lstrip()
                if rest.startswith(b":"):
                    return True
                if not rest and len(data) - start < keep:
                    break  # cut at the end of this read: look again with the next
                start = data.find(needle, start + 1)
            tail = data[-keep:]
    return False


def source_schema(path: str, fmt: str, table: Any) -> Any:
    """The table's columns that the file at ``path`` gives, in table order (blocking).

    The one rule for partial rows: a merge updates the columns its source
    gives; a column it lacks keeps the stored value of an updated row and is
    null in an inserted one (pylance's merge of a subset of the columns). A
    CSV file gives its header's columns; a JSON / NDJSON file the fields its
    objects name (any of them: an object that lacks a field others name is
    null there, as JSON writers leave nulls out); an Arrow IPC file its own
    schema (not read here: None).

    Raises
    ------
    SchemaMismatchError
        A CSV header names a column the table lacks.
    """
    import pyarrow as pa

    if fmt == "ipc":
        return None
    if fmt == "csv":
        header = _csv_header(path)
        unknown = [n for n in header if n not in table.names]
        if unknown:
            raise errors.SchemaMismatchError(
                f"the CSV header names column {unknown[0]!r}, which the table lacks "
                f"(its columns: {', '.join(table.names)})",
                field=unknown[0],
            )
        given = set(header)
    else:
        given = {f.name for f in table if _names_a_field(path, f.name)}
    if not given:  # an empty file, or no known field: the decoder says what is wrong
        return table
    return pa.schema([f for f in table if f.name in given], metadata=table.metadata)


def csv_extra_columns(path: str, schema: Any) -> list[str]:
    """Columns a CSV file's header names that ``schema`` lacks (blocking)."""
    return [n for n in _csv_header(path) if n not in schema.names]


def _inferred_csv_error(path: str, label: str) -> Exception | None:
    """The line where pyarrow's schema inference of a CSV file stops, as a
    :class:`~lance_async.DecodeError` naming it (blocking; None when not found).

    Inference reads the start of the file; a row there that does not parse
    (another number of fields) fails it. pyarrow's reader with one thread
    numbers rows as the file's lines, and hands the first bad one over.
    """
    import pyarrow as pa
    import pyarrow.csv as pcsv

    with open(path, "rb") as f:
        head = f.read(1 << 20)
    sample = head[: head.rfind(b"\n") + 1] or head
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError:  # not text: pyarrow could not hand the row over
        return None
    bad: list[Any] = []

    def handler(row: Any) -> str:
        bad.append(row)
        return "error"

    try:
        pcsv.read_csv(
            pa.py_buffer(sample),
            read_options=pcsv.ReadOptions(use_threads=False),
            parse_options=pcsv.ParseOptions(invalid_row_handler=handler),
        )
    except (pa.ArrowInvalid, ValueError):
        pass
    if not bad or bad[0].number < 1:
        return None
    row = bad[0]
    where = "standard input" if label == "stdin" else label
    text = _one_line(row.text or "")
    return errors.DecodeError(
        f"line {row.number} of {where}: expected {row.expected_columns} columns, got "
        f"{row.actual_columns}: {text} (the columns and their types are inferred from the "
        "start of the file: fix the line, or give --schema SPEC)"
    )


async def inferred_csv_error(exc: Exception, path: str, label: str, fmt: str | None) -> Exception:
    """``exc`` (schema inference of the file at ``path`` failed) as an error
    naming the file's line, when it is a CSV file and the line is found; else
    ``exc`` itself."""
    if fmt != "csv" or not isinstance(exc, errors.DecodeError):
        return exc
    from functools import partial

    found = await anyio.to_thread.run_sync(partial(_inferred_csv_error, path, label))
    return exc if found is None else found


async def with_csv_line(
    exc: Exception, path: str, label: str, fmt: str | None, schema: Any
) -> Exception:
    """``exc`` (a CSV decoding error of the file at ``path``) as a
    :class:`~lance_async.DecodeError` that names the file's line, when the
    line can be found within a few seconds; else ``exc`` itself.

    pyarrow's ``Row #N`` counts rows from the start of the chunk being
    parsed, not of the file, so it is replaced by the line.
    """
    import csv

    if fmt != "csv" or not isinstance(exc, (errors.DecodeError, csv.Error)):
        return exc
    from functools import partial

    found = await anyio.to_thread.run_sync(partial(_csv_error_line, path, schema, 10.0))
    if found is None:
        return exc
    line, message = found
    text = re.sub(r"Row #\d+: ", "", _one_line(message))
    text = re.sub(r"^CSV lines? [\d-]+: ", "", text)  # the decoder's own count: said below
    column = re.search(r"In CSV column #(\d+): ", text)
    if column is not None:
        header = await anyio.to_thread.run_sync(partial(_csv_header, path))
        index = int(column[1])
        if index < len(header):
            text = text.replace(column[0], f"column {header[index]!r}: ")
    if isinstance(exc, csv.Error):
        text = f"not CSV: {text}"
    where = "standard input" if label == "stdin" else label
    return errors.DecodeError(f"line {line} of {where}: {text}")


def check_source(source: str) -> None:
    """Exit 2 for a ``SOURCE`` that cannot be read: a missing file, a
    directory, or ``-`` when standard input is closed or a directory."""
    import stat

    if source == "-":
        if sys.stdin is None:
            fail("standard input is closed: pipe rows into '-', or give a file", 2)
        try:
            mode = os.fstat(sys.stdin.fileno()).st_mode
        except (OSError, ValueError):
            return  # not a file descriptor (a test runner's stream): readable
        if stat.S_ISDIR(mode):
            fail("standard input is a directory: pipe rows into '-', or give a file", 2)
        return
    if not os.path.exists(source):
        fail(f"no such file: {source}", 2)
    if os.path.isdir(source):
        fail(f"{source} is a directory: give a file", 2)


def format_of(path: str) -> str:
    """A file's format from its extension (exit 2 for an unknown one)."""
    from ..sources.files import guess_format

    try:
        return guess_format(path)
    except ValueError as exc:
        raise typer.BadParameter(f"{exc} (--format)") from None


#: The formats a command reads rows in.
ROW_FORMATS = ("ndjson", "json", "csv", "ipc")


def check_format(fmt: str | None) -> str | None:
    """``--format``'s value, or exit 2 for an unknown one."""
    if fmt is not None and fmt not in ROW_FORMATS:
        raise typer.BadParameter(
            f"must be one of {', '.join(ROW_FORMATS)}, got {fmt!r}", param_hint="'--format'"
        )
    return fmt


#: The ``--storage-option`` option of every command that opens a table.
ROWS_FORMAT: Any = typer.Option(
    None,
    "--format",
    "-f",
    metavar="FORMAT",
    help="ndjson, json, csv or ipc (default: from the extension; stdin: ndjson).",
)
"""``--format`` of the commands that read rows (a file, stdin or a feed)."""
