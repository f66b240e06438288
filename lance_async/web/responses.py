"""Responses: record batches as Arrow IPC stream bytes or NDJSON lines, and JSON.

:func:`make_encoder` gives an encoder that turns batches into Arrow IPC
stream bytes or NDJSON lines (blocking; run it on a worker thread);
:func:`dumps_json` and :func:`jsonable_rows` turn Arrow values into JSON
(timestamps as ISO 8601, bytes as base64, non-finite floats as null).
:func:`ndjson_bytes` / :func:`json_rows_bytes` encode rows with Arrow's
compute kernels, column at a time (no ``to_pylist``).
:func:`negotiate_format` reads the ``Accept`` header (Werkzeug's parser);
:class:`BatchStreamResponse` and :func:`scan_response` stream a scan,
stopping it (and closing its reader) at once when the client leaves.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import math
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pyarrow as pa
import pyarrow.compute as pc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header

from .._threads import run_sync, stream_limiter
from .errors import NotAcceptableError
from .limits import IPC_STREAM, NDJSON

if TYPE_CHECKING:
    from ..sources.composed import BatchStream

__all__ = [
    "BatchEncoder",
    "BatchStreamResponse",
    "dumps_json",
    "json_response",
    "json_rows_bytes",
    "json_texts",
    "jsonable_rows",
    "make_encoder",
    "ndjson_bytes",
    "negotiate_format",
    "scan_response",
]


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return str(value)
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return item()
    tolist = getattr(value, "tolist", None)  # numpy arrays
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _finite(value: Any) -> Any:
    """Replace NaN and infinities (which JSON cannot hold) with None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    try:
        return json.dumps(
            value,
            default=_json_default,
            ensure_ascii=False,
            allow_nan=False,
            separators=(",", ":"),
        )
    except ValueError:
        return json.dumps(
            _finite(value), default=_json_default, ensure_ascii=False, separators=(",", ":")
        )


def dumps_json(value: Any) -> bytes:
    """Encode a value as compact UTF-8 JSON.

    Timestamps and dates become ISO 8601 strings, binary becomes base64,
    decimals become strings, NaN and infinities become ``null``.

    Returns
    -------
    bytes

    Raises
    ------
    TypeError
        A value of a type JSON cannot express.

    Notes
    -----
    Blocking CPU work proportional to the value's size.
    """
    return _dumps(value).encode("utf-8")


def jsonable_rows(data: pa.Table | pa.RecordBatch) -> list[dict[str, Any]]:
    """Rows as dicts of plain Python values (blocking; see :func:`dumps_json`)."""
    return [dict(row) for row in data.to_pylist()]


# -- Arrow-native JSON: each column turned into JSON text by Arrow's kernels ----

_CONTROL = [chr(c) for c in range(0x20)]


def _quoted(text: pa.Array) -> pa.Array:
    """JSON string literals of a string array (escapes done by Arrow kernels)."""
    if pc.any(pc.match_substring_regex(text, '[\\\\"\\x00-\\x1f]')).as_py():
        text = pc.replace_substring(text, "\\", "\\\\")
        text = pc.replace_substring(text, '"', '\\"')
        for ch in _CONTROL:
            text = pc.replace_substring(text, ch, f"\\u{ord(ch):04x}")
    return pc.binary_join_element_wise('"', text, '"', "")


def _python_json(values: pa.Array) -> pa.Array:
    """JSON text of each value through the standard library (nested and rare types)."""
    return pa.array([None if v is None else _dumps(v) for v in values.to_pylist()], pa.string())


def json_texts(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The JSON text of each value of a column, ``null`` for nulls (blocking).

    Numbers, booleans, strings, dates, times and timestamps (ISO 8601; zoned
    ones in UTC, with ``Z``) are converted by Arrow's compute kernels,
    column at a time; NaN and infinities become ``null``, durations seconds,
    decimals strings. Binary values (base64), lists, structs and maps go
    through the standard ``json`` module, value by value.
    """
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    t = arr.type
    if pa.types.is_dictionary(t):
        return json_texts(arr.dictionary_decode())
    if pa.types.is_null(t):
        out: pa.Array = pa.nulls(len(arr), pa.string())
    elif pa.types.is_boolean(t):
        out = pc.if_else(arr, "true", "false")
    elif pa.types.is_integer(t):
        out = pc.cast(arr, pa.string())
    elif pa.types.is_floating(t):
        out = pc.cast(arr, pa.string())
        finite = pc.is_finite(arr)
        if not pc.all(finite).as_py():
            out = pc.if_else(finite, out, None)
    elif (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or pa.types.is_decimal(t)
    ):
        out = _quoted(pc.cast(arr, pa.string()))
    elif pa.types.is_timestamp(t):  # "2013-01-01 05:17:00.000" (+ "Z" when zoned)
        iso = pc.replace_substring(pc.cast(arr, pa.string()), " ", "T", max_replacements=1)
        out = pc.binary_join_element_wise('"', iso, '"', "")
    elif pa.types.is_date(t):
        out = _quoted(pc.strftime(arr, format="%Y-%m-%d"))
    elif pa.types.is_time(t):
        out = _quoted(pc.cast(arr, pa.string()))
    elif pa.types.is_duration(t):
        per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[t.unit]
        seconds = pc.divide(pc.cast(arr.view(pa.int64()), pa.float64()), float(per_second))
        out = pc.cast(seconds, pa.string())
    else:
        out = _python_json(arr)
    return pc.fill_null(out, "null")


def _row_texts(batch: pa.RecordBatch | pa.Table, end: str) -> pa.Array:
    """One JSON object per row, each followed by ``end`` (a string array)."""
    parts: list[Any] = []
    for i, name in enumerate(batch.schema.names):
        parts.append(("{" if i == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":")
        parts.append(json_texts(batch.column(i)))
    if not parts:
        return pa.array(["{}" + end] * batch.num_rows, pa.string())
    parts.append("}" + end)
    joined: pa.Array = pc.binary_join_element_wise(*parts, "")
    return joined


def _string_bytes(text: pa.Array) -> bytes:
    """The concatenated UTF-8 bytes of a string array's values (one copy)."""
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    if not len(text):
        return b""
    offsets = text.buffers()[1]
    width = 8 if pa.types.is_large_string(text.type) else 4
    start = int.from_bytes(offsets[text.offset * width : (text.offset + 1) * width], "little")
    stop_at = (text.offset + len(text)) * width
    stop = int.from_bytes(offsets[stop_at : stop_at + width], "little")
    data = text.buffers()[2]
    return data[start:stop].to_pybytes() if data is not None else b""


def ndjson_bytes(data: pa.Table | pa.RecordBatch) -> bytes:
    """Rows as NDJSON: one JSON object per line, each line ended by ``\\n`` (blocking).

    Values are converted column at a time by Arrow's kernels (see
    :func:`json_texts`), not by ``json.dumps`` over ``to_pylist()`` rows
    (bench/: the NDJSON figures).
    """
    if not data.num_rows:
        return b""
    return _string_bytes(_row_texts(data, "\n"))


def json_rows_bytes(data: pa.Table | pa.RecordBatch) -> bytes:
    """Rows as one JSON array of objects (blocking; see :func:`ndjson_bytes`)."""
    if not data.num_rows:
        return b"[]"
    return b"[" + _string_bytes(_row_texts(data, ","))[:-1] + b"]"


class BatchEncoder:
    """Turns record batches into response bytes (blocking CPU work).

    Attributes
    ----------
    media_type : str
        The response's ``Content-Type``.
    """

    media_type: str = "application/octet-stream"

    def encode(self, batch: pa.RecordBatch) -> bytes:  # pragma: no cover - abstract
        """The bytes for one batch (may be empty)."""
        raise NotImplementedError

    def finish(self) -> bytes:  # pragma: no cover - abstract
        """The bytes that end the response."""
        raise NotImplementedError


class _Collector(io.RawIOBase):
    """A writable file that keeps what is written until :meth:`take`."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        return len(chunk)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class _IpcEncoder(BatchEncoder):
    media_type = IPC_STREAM

    def __init__(self, schema: pa.Schema | None) -> None:
        self._schema = schema
        self._sink = _Collector()
        self._writer: Any = None

    def _open(self, schema: pa.Schema) -> Any:
        if self._writer is None:
            self._writer = pa.ipc.new_stream(pa.PythonFile(self._sink, mode="w"), schema)
        return self._writer

    def encode(self, batch: pa.RecordBatch) -> bytes:
        self._open(batch.schema).write_batch(batch)
        return self._sink.take()

    def finish(self) -> bytes:
        if self._writer is None:
            if self._schema is None:
                raise ValueError("an empty Arrow stream needs a schema")
            self._open(self._schema)
        self._writer.close()
        return self._sink.take()


class _NdjsonEncoder(BatchEncoder):
    media_type = NDJSON

    def encode(self, batch: pa.RecordBatch) -> bytes:
        return ndjson_bytes(batch)

    def finish(self) -> bytes:
        return b""


def make_encoder(format: str, schema: pa.Schema | None = None) -> BatchEncoder:
    """An encoder for response bodies.

    Parameters
    ----------
    format : {"ipc", "ndjson"}
        Arrow IPC stream (schema, batches, end-of-stream marker) or one JSON
        object per row and line.
    schema : pa.Schema, optional
        Needed for an IPC response that may hold no batch at all.

    Returns
    -------
    BatchEncoder

    Raises
    ------
    ValueError
        An unknown format.
    """
    if format == "ipc":
        return _IpcEncoder(schema)
    if format == "ndjson":
        return _NdjsonEncoder()
    raise ValueError(f"unknown response format {format!r}; expected 'ipc' or 'ndjson'")


_ACCEPT: dict[str, str] = {IPC_STREAM: "ipc", NDJSON: "ndjson", "application/jsonl": "ndjson"}
_CANONICAL = frozenset({IPC_STREAM, NDJSON})
_FORMAT_NAMES: dict[str, str] = {
    "arrow": "ipc",
    "ipc": "ipc",
    "arrows": "ipc",
    "ndjson": "ndjson",
    "jsonl": "ndjson",
}


def negotiate_format(
    request: Request, *, override: str | None = None, default: str = "ndjson"
) -> str:
    """Choose a response format: ``override`` if given, else the ``Accept`` header.

    The header is parsed by Werkzeug's ``MIMEAccept``, which gives each
    format's media type the quality of the most specific range that matches
    it (RFC 9110 proactive negotiation): ``q=0`` excludes it, the highest
    quality wins, a tie goes to ``default``. The alias ``application/jsonl``
    counts only when named, so ``application/x-ndjson;q=0, */*`` answers in
    Arrow IPC, never NDJSON.

    Parameters
    ----------
    request : Request
    override : str, optional
        ``"arrow"`` / ``"ipc"`` or ``"ndjson"`` / ``"jsonl"`` (a ``?format=``).
    default : {"ndjson", "ipc"}
        For a missing ``Accept`` header, a wildcard, or a tie.

    Returns
    -------
    str
        ``"ipc"`` or ``"ndjson"``.

    Raises
    ------
    NotAcceptableError
        Nothing acceptable (HTTP 406).
    """
    if override is not None:
        fmt = _FORMAT_NAMES.get(override.lower())
        if fmt is None:
            raise NotAcceptableError(
                f"unknown format {override[:40]!r}; use one of {sorted(_FORMAT_NAMES)}"
            )
        return fmt
    accept = request.headers.get("accept")
    if not accept or not accept.strip():
        return default
    parsed = parse_accept_header(accept, MIMEAccept)
    named = {value.lower() for value, _quality in parsed}
    scores: dict[str, float] = {}
    for media, fmt in _ACCEPT.items():
        if media not in _CANONICAL and media not in named:
            continue  # an alias counts only when named, never through a wildcard
        scores[fmt] = max(scores.get(fmt, 0.0), float(parsed.quality(media)))
    best = max(scores.values(), default=0.0)
    if best <= 0:
        raise NotAcceptableError(
            f"cannot answer in {accept[:100]!r}; accept {IPC_STREAM} or {NDJSON}"
        )
    return (
        default if scores.get(default) == best else next(f for f, q in scores.items() if q == best)
    )


class BatchStreamResponse(StreamingResponse):
    """A streaming response of record batches (Arrow IPC stream or NDJSON).

    Parameters
    ----------
    batches : async iterable of pa.RecordBatch
        For example an :class:`~lance_async.AsyncBatchStream`. Closed
        (``aclose``) when the response ends, fails, or the client leaves.
    format : {"ndjson", "ipc"}
    schema : pa.Schema, optional
        Needed for an Arrow response that may hold no batch.
    status_code : int
    headers : mapping, optional
    on_close : callable, optional
        Called with the response once it is over, whatever the outcome.

    Attributes
    ----------
    rows_sent, batches_sent, bytes_sent : int
        Handed to the server so far.
    completed : bool
        True when every batch was sent.

    Notes
    -----
    Batches are encoded on the library's ``stream`` threads. A client that
    disconnects stops the response at once; the source is closed before the
    ASGI call returns (an :class:`AsyncBatchStream` stops its reader thread
    and closes the engine reader). An error after the first bytes aborts the
    connection: an Arrow stream then lacks its end marker and a chunked NDJSON
    body its last chunk, so clients never mistake it for a complete answer.
    """

    def __init__(
        self,
        batches: AsyncIterable[pa.RecordBatch],
        *,
        format: str = "ndjson",
        schema: pa.Schema | None = None,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        on_close: Callable[[BatchStreamResponse], object] | None = None,
    ) -> None:
        self._source = batches
        self._encoder = make_encoder(format, schema)
        self._on_close = on_close
        self._finished = False
        self.rows_sent = 0
        self.batches_sent = 0
        self.bytes_sent = 0
        self.completed = False
        self._chunks = self._generate()
        super().__init__(
            self._chunks,
            status_code=status_code,
            headers=headers,
            media_type=self._encoder.media_type,
        )

    async def _close_source(self) -> None:
        aclose = getattr(self._source, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()

    async def _generate(self) -> AsyncIterator[bytes]:
        encoder = self._encoder
        try:
            async for batch in self._source:
                data = await run_sync(partial(encoder.encode, batch), limiter=stream_limiter())
                if data:
                    yield data
                    self.bytes_sent += len(data)
                self.rows_sent += batch.num_rows
                self.batches_sent += 1
            tail = await run_sync(encoder.finish, limiter=stream_limiter())
            if tail:
                yield tail
                self.bytes_sent += len(tail)
            self.completed = True
        finally:
            await self._close_source()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._chunks.aclose()  # type: ignore[attr-defined]
                await self._close_source()
            if not self._finished:
                self._finished = True
                if self._on_close is not None:
                    self._on_close(self)


async def scan_response(
    request: Request,
    stream: BatchStream,
    *,
    format: str | None = None,
    headers: Mapping[str, str] | None = None,
    on_close: Callable[[BatchStreamResponse], object] | None = None,
) -> BatchStreamResponse:
    """Stream a scan to the client in the format it accepts.

    The scan is opened before the response starts, so a bad filter or column
    raises here (and becomes a 4xx), not in the middle of a 200.

    Parameters
    ----------
    request : Request
        For the ``Accept`` header.
    stream : BatchStream
        For example ``dataset.scan(...)``; this function owns it from now on.
    format : str, optional
        ``"arrow"`` / ``"ndjson"``, overriding ``Accept``.
    headers : mapping, optional
    on_close : callable, optional
        See :class:`BatchStreamResponse`.

    Returns
    -------
    BatchStreamResponse
        Return it from the handler (it closes the stream when done).

    Raises
    ------
    NotAcceptableError
        Nothing acceptable (the scan is not started).
    BaseException
        What opening the scan raised (the stream is closed).
    """
    try:
        fmt = negotiate_format(request, override=format)
        await stream.open()
    except BaseException:
        await stream.aclose()
        raise
    return BatchStreamResponse(
        stream, format=fmt, schema=stream.schema, headers=headers, on_close=on_close
    )


def json_response(content: Any, status_code: int = 200) -> Response:
    """A JSON response encoded with :func:`dumps_json` (timestamps, binary and
    NaN handled). Blocking CPU work: use it for small payloads."""
    return Response(dumps_json(content), status_code=status_code, media_type="application/json")
