"""HTTP response bodies: record batches as Arrow IPC stream bytes or NDJSON lines.

:func:`make_encoder` gives an encoder that turns batches into Arrow IPC
stream bytes or NDJSON lines (blocking; run it on a worker thread);
:func:`dumps_json` and :func:`jsonable_rows` turn Arrow values into JSON
(timestamps as ISO 8601, bytes as base64, non-finite floats as null).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import math
from typing import Any

import pyarrow as pa

from ._http_bodies import IPC_STREAM, NDJSON

__all__ = ["BatchEncoder", "dumps_json", "jsonable_rows", "make_encoder"]

# ---------------------------------------------------------------------------
# response bodies
# ---------------------------------------------------------------------------


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
        if not batch.num_rows:
            return b""
        lines = [_dumps(row) for row in batch.to_pylist()]
        lines.append("")
        return "\n".join(lines).encode("utf-8")

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
