"""Request bodies: their media types, limits and statistics, and the body-schema check.

=====================================  ==========  =====================================
media type                             format      body schema
=====================================  ==========  =====================================
application/vnd.apache.arrow.stream    ``ipc``     the stream's schema message
application/vnd.apache.arrow.file      ``ipc``     (the file format is read as a stream)
application/x-ndjson (jsonl, ndjson)   ``ndjson``  the keys of the first non-blank line
application/json                       ``json``    the keys of the first object (an array
                                                   of objects, or objects one per line)
text/csv                               ``csv``     the header line
=====================================  ==========  =====================================

The body schema is checked against the table before a single row moves
(:func:`body_schema`): unknown, duplicated or (for IPC) retyped columns and
missing required ones raise :class:`~lance_async.errors.SchemaMismatchError`
naming the column.

Limits (:class:`BodyLimits`): ``max_body_bytes`` (counted as bytes arrive,
and checked against ``Content-Length`` first), ``max_batch_rows`` and
``max_batch_bytes`` (an IPC message is refused as soon as its header
arrives, before its body is buffered; a text record longer than the limit is
refused too). Passing a limit raises
:class:`~lance_async.errors.PayloadTooLargeError`. Slow clients: the time
to the first bytes (``body_start_timeout``), the pauses between chunks
(``body_idle_timeout``), the average rate after a grace period
(``min_body_rate``, ``body_rate_grace``) and the whole body's time
(``max_body_time``) are bounded; passing one is a 408
(:class:`~lance_async.web.errors.BodyTimeoutError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from ..errors import SchemaMismatchError
from ..sources.spool import SPOOL_MEMORY_BYTES
from .errors import UnsupportedMediaTypeError

__all__ = [
    "CSV",
    "FEED_BYTES",
    "IPC_FILE",
    "IPC_STREAM",
    "MEDIA_TYPES",
    "NDJSON",
    "RESPONSE_MEDIA_TYPES",
    "SLICE_ROWS",
    "SPOOL_MEMORY_BYTES",
    "BodyLimits",
    "BodyStats",
    "body_format",
    "body_schema",
]

IPC_STREAM = "application/vnd.apache.arrow.stream"
IPC_FILE = "application/vnd.apache.arrow.file"
NDJSON = "application/x-ndjson"
JSON = "application/json"
CSV = "text/csv"

#: Request media types and the decoder each one gets.
MEDIA_TYPES: dict[str, str] = {
    IPC_STREAM: "ipc",
    IPC_FILE: "ipc",
    NDJSON: "ndjson",
    "application/ndjson": "ndjson",
    "application/jsonl": "ndjson",
    "application/x-jsonlines": "ndjson",
    JSON: "json",
    CSV: "csv",
}
#: Response media type of each encoder.
RESPONSE_MEDIA_TYPES: dict[str, str] = {"ipc": IPC_STREAM, "ndjson": NDJSON}

#: Bytes collected on the loop before they are handed to a decoder thread.
FEED_BYTES = 1 << 20
#: Rows per batch handed on by a body (larger batches are sliced, zero-copy):
#: Lance's merge keeps a smaller working set with batches of this size.
SLICE_ROWS = 8192


@dataclass(frozen=True)
class BodyLimits:
    """Limits on request bodies.

    Attributes
    ----------
    max_body_bytes : int
        Bytes one body may hold (default 1 GiB). Checked against
        ``Content-Length`` before reading and counted as bytes arrive.
    max_batch_rows : int
        Rows in one Arrow IPC record batch (default 262,144). Text bodies
        (NDJSON, CSV) are never refused for it, since their client does not
        choose batch sizes: every body is handed on in slices of at most
        ``slice_rows`` rows (see :class:`BodyBatches`).
    max_batch_bytes : int
        Bytes of one Arrow IPC message, or of one text record (a line, or a
        CSV row with quoted newlines), default 64 MiB. Also bounds what is
        buffered while such a message or record is incomplete.
    drain_bytes : int
        After an early error response, how many more body bytes a server may
        read and discard so the client sees the response (default 8 MiB; see
        :class:`lance_async.fastapi.BodyDrainMiddleware`).
    drain_timeout : float
        Seconds that discarding may take (default 5).
    body_start_timeout : float
        Seconds the first body bytes may take to reach a handler that asks
        for them (default 10; 0 waits forever). Past it the request fails
        with :class:`BodyConsumedError` (HTTP 400): a middleware outside
        :class:`lance_async.fastapi.BodyDrainMiddleware` may have read the
        body (a server then never delivers it again), or the client stalled.
        Only :func:`lance_async.fastapi.request_batches` applies it.
    body_idle_timeout : float
        Seconds the client may go without sending body bytes once the body
        has started (default 30; 0 waits forever). Past it the request fails
        with :class:`~lance_async.web.errors.BodyTimeoutError` (HTTP 408) and
        nothing is written: a stalled upload holds a connection, never an
        engine thread, and not for longer than this. Only
        :func:`lance_async.fastapi.request_batches` applies it.
    min_body_rate : float
        Bytes per second a body must average, counted from its first bytes,
        once ``body_rate_grace`` has passed (default 1,024, 1 KiB/s; 0 turns
        it off). A client that trickles a byte every few seconds never trips
        the idle timeout; below this rate it gets a
        :class:`~lance_async.web.errors.BodyTimeoutError` (HTTP 408) and
        nothing is written, so it cannot hold an upload slot for long.
    body_rate_grace : float
        Seconds from the first body bytes before ``min_body_rate`` applies
        (default 10): a connection may start slowly.
    max_body_time : float
        Seconds a body may take from its first bytes to its end, however
        steadily it arrives (default 3,600, one hour; 0 turns it off). Past
        it: :class:`~lance_async.web.errors.BodyTimeoutError` (HTTP 408).

    Raises
    ------
    ValueError
        A limit below 1 (or a negative drain, start, idle, rate or time setting).
    """

    max_body_bytes: int = 1 << 30
    max_batch_rows: int = 1 << 18
    max_batch_bytes: int = 64 << 20
    drain_bytes: int = 8 << 20
    drain_timeout: float = 5.0
    body_start_timeout: float = 10.0
    body_idle_timeout: float = 30.0
    min_body_rate: float = 1024.0
    body_rate_grace: float = 10.0
    max_body_time: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_batch_rows", "max_batch_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "drain_bytes",
            "drain_timeout",
            "body_start_timeout",
            "body_idle_timeout",
            "min_body_rate",
            "body_rate_grace",
            "max_body_time",
        ):
            value = getattr(self, name)
            if not value >= 0:  # NaN too
                raise ValueError(f"{name} must be >= 0, got {value}")


@dataclass(frozen=True)
class BodyStats:
    """What a :class:`BodyBatches` has read so far.

    Attributes
    ----------
    format : str
        ``"ipc"``, ``"ndjson"``, ``"json"`` or ``"csv"``.
    bytes_received : int
        Body bytes read from the client.
    batches : int
        Record batches decoded.
    rows : int
        Rows decoded.
    complete : bool
        True once the body ended and every row was decoded.
    """

    format: str
    bytes_received: int
    batches: int
    rows: int
    complete: bool


def body_format(content_type: str | None) -> str:
    """The decoder for a request's ``Content-Type`` header.

    Parameters
    ----------
    content_type : str or None
        The header value, parameters included (``text/csv; charset=utf-8``).

    Returns
    -------
    str
        ``"ipc"``, ``"ndjson"`` or ``"csv"``.

    Raises
    ------
    UnsupportedMediaTypeError
        A missing or unknown media type, or a text charset other than UTF-8.

    Notes
    -----
    Does not block.
    """
    if not content_type:
        raise UnsupportedMediaTypeError(
            f"the request has no Content-Type; send one of {sorted(MEDIA_TYPES)}",
            content_type=None,
        )
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    fmt = MEDIA_TYPES.get(media)
    if fmt is None:
        raise UnsupportedMediaTypeError(
            f"cannot decode {media[:100]!r}; send one of {sorted(MEDIA_TYPES)}",
            content_type=content_type,
        )
    for param in params.split(";"):
        key, _, value = param.partition("=")
        charset = value.strip().strip('"').lower()
        if key.strip().lower() == "charset" and charset not in ("utf-8", "utf8", "us-ascii"):
            raise UnsupportedMediaTypeError(
                f"only UTF-8 text is accepted, got charset={charset[:40]!r}",
                content_type=content_type,
            )
    return fmt


def body_schema(
    table: pa.Schema,
    names: Sequence[str],
    types: pa.Schema | None,
    required: Sequence[str],
    all_columns: bool,
) -> pa.Schema:
    """The table's fields that the body holds, in table order (or raise)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SchemaMismatchError(
                f"column {name[:64]!r} appears more than once in the body", field=name
            )
        seen.add(name)
        if name not in table.names:
            raise SchemaMismatchError(
                f"the body has column {name[:64]!r}, which the table does not have "
                f"(table columns: {table.names})",
                field=name,
            )
        if types is not None:
            body_type = types.field(name).type
            table_type = table.field(name).type
            if not body_type.equals(table_type):
                raise SchemaMismatchError(
                    f"column {name!r} is {body_type} in the body but {table_type} in the table",
                    field=name,
                )
    wanted = list(table.names) if all_columns else list(required)
    for name in wanted:
        if name not in seen:
            why = "every table column is needed here" if all_columns else "this write needs it"
            raise SchemaMismatchError(f"the body lacks column {name!r} ({why})", field=name)
    return pa.schema([f for f in table if f.name in seen], metadata=table.metadata)
