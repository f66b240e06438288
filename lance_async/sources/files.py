"""Files as replayable write sources (Arrow IPC file and stream, NDJSON, CSV).

A file is replayable as long as it does not change: its size and
modification time are recorded on the first pass and checked before and
after every pass; a difference raises
:class:`~lance_async.errors.SourceChangedError` (and, because the check at
the end runs before the engine sees the end of the stream, nothing is
committed). Files are read in chunks, never whole: with ``aiofiles`` on
asyncio (anyio's file API on trio, where aiofiles cannot run) for
:meth:`FileSource.open`, or with blocking reads on a worker thread when an
engine drains :meth:`FileSource.open_reader`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import aiofiles
import anyio
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import sniffio

from .._loop import aclose_shielded
from .._threads import run_sync, stream_limiter
from ..errors import DecodeError, SourceChangedError, SourceError
from .base import SourceMode, WriteSource, achecked, checked
from .decoders import FORMATS, Decoder, make_decoder
from .jsonarray import infer_json_sample
from .jsonrows import LEADING_NULL, check_json_depth

__all__ = ["FileSource", "file_source", "guess_format", "open_async_file"]

DEFAULT_CHUNK = 1 << 20
_EXTENSIONS = {
    ".arrow": "ipc",
    ".arrows": "ipc",
    ".ipc": "ipc",
    ".feather": "ipc",
    ".ndjson": "ndjson",
    ".jsonl": "ndjson",
    ".json": "json",
    ".csv": "csv",
}


@asynccontextmanager
async def open_async_file(path: str) -> AsyncIterator[Any]:
    """Open a file for async binary reads: aiofiles on asyncio, anyio on trio.

    aiofiles only runs on asyncio; under trio the same reads go through
    :func:`anyio.open_file`. Both read on worker threads; the object yielded
    has ``await f.read(n)`` and ``await f.seek(pos)``.
    """
    if sniffio.current_async_library() == "asyncio":
        async with aiofiles.open(path, "rb") as f:
            yield f
    else:
        async with await anyio.open_file(path, "rb") as g:
            yield g


def guess_format(path: str | os.PathLike[str]) -> str:
    """The format implied by a file name's extension.

    Raises
    ------
    ValueError
        The extension is not one of .arrow .arrows .ipc .feather .ndjson
        .jsonl .json .csv.
    """
    suffix = Path(path).suffix.lower()
    try:
        return _EXTENSIONS[suffix]
    except KeyError:
        raise ValueError(
            f"cannot tell the format of {str(path)!r} from its extension; pass format= one of "
            f"{FORMATS}"
        ) from None


class FileSource(WriteSource):
    """One file, read in chunks; REPLAYABLE while it does not change.

    Parameters
    ----------
    path : str or PathLike
    format : {"ipc", "ndjson", "csv"}
    schema : pa.Schema, optional
        The rows' schema. An IPC file carries its own; for NDJSON and CSV it
        is inferred from the first chunk when not given (give it to be safe).
    chunk_size : int
        Bytes per read (default 1 MiB).
    on_read : callable, optional
        Called with the bytes read so far in the current pass after each
        chunk (on the thread that reads: a worker thread), for progress.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        format: str,
        schema: pa.Schema | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        on_read: Callable[[int], None] | None = None,
        **options: Any,
    ) -> None:
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}; expected one of {FORMATS}")
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.path = os.fspath(path)
        self.format = format
        self.chunk_size = chunk_size
        self._options = options
        self._on_read = on_read
        self._fingerprint: tuple[int, int] | None = None
        super().__init__(schema, SourceMode.REPLAYABLE)

    def __repr__(self) -> str:
        return f"<FileSource {self.format} {self.path!r}>"

    # -- fingerprints -----------------------------------------------------
    def _stat(self) -> tuple[int, int]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise SourceError(f"no such file: {self.path!r}") from None
        return st.st_size, st.st_mtime_ns

    def _check_fingerprint(self, where: str) -> None:
        now = self._stat()
        if self._fingerprint is None:
            self._fingerprint = now
        elif now != self._fingerprint:
            raise SourceChangedError(
                f"{self.path!r} changed {where} (size or mtime); nothing was committed"
            )

    # -- schema -----------------------------------------------------------
    async def resolve_schema(self) -> pa.Schema:
        if self._schema is None:
            self._schema = await run_sync(self._infer_schema, limiter=stream_limiter())
        return self._schema

    def _infer_schema(self) -> pa.Schema:
        if self.format == "ipc":
            decoder = make_decoder("ipc", None)
            with open(self.path, "rb") as f:
                while decoder.schema is None:
                    chunk = f.read(self.chunk_size)
                    if not chunk:
                        raise SourceError(f"{self.path!r} holds no Arrow IPC schema")
                    decoder.feed(chunk)
            assert decoder.schema is not None
            return decoder.schema
        with open(self.path, "rb") as f:
            head = f.read(self.chunk_size)
        cut = head.rfind(b"\n")
        sample = head[: cut + 1] if cut >= 0 else head
        if self.format == "json":
            sample = infer_json_sample(head)
        if not sample.strip():
            raise SourceError(f"{self.path!r} is empty; pass schema=")
        if self.format != "csv" and LEADING_NULL.match(sample):  # pyarrow would crash
            raise DecodeError(f"line 1 of {self.path!r}: expected a JSON object, got null")
        if self.format != "csv":
            check_json_depth(sample)  # inferred types recurse: pyarrow would crash
        try:
            if self.format == "csv":
                schema = pcsv.read_csv(pa.py_buffer(sample)).schema
            else:
                schema = pjson.read_json(pa.py_buffer(sample)).schema
        except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
            raise DecodeError(
                f"cannot infer a schema from the start of {self.path!r} ({exc}); pass schema="
            ) from exc
        return wide_integers_inferred(schema, sample, self.format, str(self.path))

    # -- passes -----------------------------------------------------------
    def _decoder(self) -> Decoder:
        return make_decoder(self.format, self.schema, **self._options)

    def _blocking_batches(self) -> Iterator[pa.RecordBatch]:
        decoder = self._decoder()
        done = 0
        with open(self.path, "rb") as f:
            while chunk := f.read(self.chunk_size):
                done += len(chunk)
                if self._on_read is not None:
                    self._on_read(done)
                yield from decoder.feed(chunk)
        yield from decoder.finish()
        self._check_fingerprint("while it was read")

    def _open_reader(self, pass_no: int) -> pa.RecordBatchReader:
        self._check_fingerprint("between passes")
        if self._schema is None:
            self._schema = self._infer_schema()
        return pa.RecordBatchReader.from_batches(
            self.schema,
            checked(self._blocking_batches(), self.schema, pass_no, self._sink(pass_no)),
        )

    def _open(self, pass_no: int) -> AsyncIterator[pa.RecordBatch]:
        return self._open_resolved(pass_no)

    async def _open_resolved(self, pass_no: int) -> AsyncIterator[pa.RecordBatch]:
        schema = await self.resolve_schema()  # read from the file when not given
        inner = achecked(self._async_batches(), schema, pass_no)
        try:
            async for batch in inner:
                yield batch
        finally:
            await aclose_shielded(inner)

    async def _async_batches(self) -> AsyncIterator[pa.RecordBatch]:
        await run_sync(lambda: self._check_fingerprint("between passes"), limiter=stream_limiter())
        decoder = self._decoder()
        done = 0
        async with open_async_file(self.path) as f:
            while True:
                chunk = await f.read(self.chunk_size)
                if not chunk:
                    break
                done += len(chunk)
                if self._on_read is not None:
                    self._on_read(done)
                batches = await run_sync(partial(decoder.feed, chunk), limiter=stream_limiter())
                for batch in batches:
                    yield batch
        for batch in await run_sync(decoder.finish, limiter=stream_limiter()):
            yield batch
        await run_sync(
            lambda: self._check_fingerprint("while it was read"), limiter=stream_limiter()
        )
        await anyio.lowlevel.checkpoint()


def file_source(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    schema: pa.Schema | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    on_read: Callable[[int], None] | None = None,
    **options: Any,
) -> FileSource:
    """A replayable source reading one file in chunks.

    Parameters
    ----------
    path : str or PathLike
        The file. Its size and mtime must not change while it is a source.
    format : {"ipc", "ndjson", "json", "csv"}, optional
        Default: from the extension (see :func:`guess_format`). "ipc" reads
        both the Arrow IPC file and stream formats; "json" (``.json``) an
        array of objects, or objects one per line.
    schema : pa.Schema, optional
        Target schema. JSON values are coerced to it; CSV columns are parsed
        as its types (matched by header name).
    chunk_size : int
        Bytes per read (default 1 MiB).
    on_read : callable, optional
        Called with the bytes read so far in the pass after each chunk (on
        the reading thread), for progress.
    **options
        ``extra_fields="error"|"ignore"`` (NDJSON), ``delimiter`` (CSV).

    Returns
    -------
    FileSource

    Raises
    ------
    ValueError
        Unknown format or extension.

    Notes
    -----
    Does not touch the file; it is opened on the first pass.
    """
    return FileSource(
        path,
        format=format or guess_format(path),
        schema=schema,
        chunk_size=chunk_size,
        on_read=on_read,
        **options,
    )


_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def _sample_values(sample: bytes, fmt: str, names: list[str]) -> dict[str, list[object]]:
    """The values of columns ``names`` in an inference sample, as written:
    Python ints for JSON integers (exact digits), text for CSV."""
    if fmt == "csv":
        options = pcsv.ConvertOptions(column_types={n: pa.string() for n in names})
        table = pcsv.read_csv(pa.py_buffer(sample), convert_options=options)
        return {n: table.column(n).to_pylist() for n in names}
    values: dict[str, list[object]] = {n: [] for n in names}
    for line in sample.split(b"\n"):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            for n in names:
                values[n].append(row.get(n))
    return values


def _as_integer(value: object) -> int | None:
    """``value`` as the integer it was written as, or None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
        return int(value)
    return None


def wide_integers_inferred(schema: pa.Schema, sample: bytes, fmt: str, where: str) -> pa.Schema:
    """An inferred schema with no integer rounded into a float64 column.

    pyarrow infers ``float64`` for a column holding an integer outside int64
    (JSON and CSV alike), and every later value of it would lose its low
    digits without an error. Such a column becomes ``uint64`` when every
    value is an integer in ``[0, 2**64)``; otherwise the inference is refused.

    Raises
    ------
    DecodeError
        A float64-inferred column holds an integer at or past 2**53 that
        no inferable type holds exactly (names the field); pass ``schema=``.
    """
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    if not floats or not re.search(rb"[0-9]{16}", sample):
        return schema
    values = _sample_values(sample, fmt, floats)
    for name in floats:
        column = [v for v in values[name] if v is not None and v != ""]
        integers = [_as_integer(v) for v in column]
        wide = [i for i in integers if i is not None and abs(i) >= 2**53]
        if not wide:
            continue
        if all(i is not None and 0 <= i < 2**64 for i in integers):
            index = schema.get_field_index(name)
            schema = schema.set(index, schema.field(name).with_type(pa.uint64()))
            continue
        raise DecodeError(
            f"cannot infer a type for column {name!r} of {where!r}: it holds the integer "
            f"{wide[0]}, past 2**53, where float64 (the type pyarrow infers) rounds integers; "
            "pass schema= (an integer, decimal or string column)",
            field=name,
        )
    return schema
