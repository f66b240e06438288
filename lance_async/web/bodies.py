"""Request bodies as Arrow record batches, with no web framework involved.

:class:`BodyBatches` turns the chunks of a request body (any async iterable of
``bytes``) into record batches checked against a table, incrementally: the
body is never read whole, and nothing runs on anyio's default thread pool.

* Arrow IPC: the loop cuts the stream into messages with the one framer of
  :mod:`lance_async.sources.ipc`, which copies each message once, into an
  Arrow buffer of exactly its size, and refuses a message passing a limit
  from its header, before its body is buffered; worker threads turn whole
  messages into batches (zero-copy).
* NDJSON and CSV: the loop collects chunks (about 1 MiB, cut after a newline)
  and the incremental decoders of :mod:`lance_async.sources.decoders` parse
  them on the library's ``stream`` worker threads.

A body is a one-shot source (``SourceMode.STREAMING``); with ``spool=True``
it is copied to a :class:`~lance_async.web.spool.Spool` as it is read, for
replays. Media types, limits and the body-schema check are in ``limits.py``.
"""

from __future__ import annotations

import csv
import json
from collections import deque
from collections.abc import AsyncIterable, Sequence
from functools import partial

import anyio
import pyarrow as pa

from .._schema import conform_batch
from .._threads import run_sync, stream_limiter
from ..errors import (
    DecodeError,
    PayloadTooLargeError,
    SchemaMismatchError,
    SourceConsumedError,
    SourceError,
)
from ..sources import WriteSource, replayable
from ..sources.decoders import CsvDecoder, Decoder, NdjsonDecoder
from ..sources.ipc import IpcFramer
from ..sources.jsonarray import JsonTextSplitter, element_error
from ..sources.jsonrows import check_json_depth
from ..sources.spool import Spool
from .errors import BodyConsumedError, EmptyBodyError
from .limits import (
    FEED_BYTES,
    SLICE_ROWS,
    BodyLimits,
    BodyStats,
    body_schema,
)

__all__ = ["BodyBatches"]


class BodyBatches:
    """A request body as a one-shot ``async for`` stream of checked record batches.

    Parameters
    ----------
    chunks : async iterable of bytes
        The body as it arrives (for Starlette, ``request.stream()``; see
        :func:`lance_async.fastapi.request_batches`). Closed by :meth:`aclose`.
    format : {"ipc", "ndjson", "json", "csv"}
        The body's format (see :func:`body_format`).
    table_schema : pa.Schema
        The target table's schema.
    limits : BodyLimits
    required_columns : sequence of str
        Columns the body must hold (for example the merge keys).
    all_columns : bool
        The body must hold every table column (MemWAL puts need that).
    content_length : int, optional
        The ``Content-Length`` header: checked against ``max_body_bytes``
        before reading, and against the bytes that arrive.
    spool : bool
        Keep a copy of the decoded batches (in memory up to 4 MiB, then in an
        Arrow IPC file) so that :meth:`replay_source` can replay the body
        after the first pass, for example after a commit conflict.
    spool_dir : str, optional
        Directory for spool files (default: the system's temporary directory).
    slice_rows : int
        Batches are handed on in zero-copy slices of at most this many rows
        (default 8,192): Lance's merge holds less memory per batch in flight
        (measured: about 42 MiB of engine working set for a 100 MiB upload,
        against 60-86 MiB with 50,000-row batches).

    Notes
    -----
    * Nothing is read until :meth:`start` (or the first ``__anext__``).
    * The loop only collects chunks (about 1 MiB at a time); decoding, checks
      and spool writes run on the library's ``stream`` worker threads.
    * Every batch has the schema :attr:`schema`: the table's fields (types,
      nullability, metadata) that the body holds, in table order.
    * An error -- a limit, a decode error, a bad row, the client leaving --
      is raised by ``__anext__``; an engine reading this source then aborts,
      so nothing is committed. A closed or failed body never looks like a
      clean end of stream.
    """

    def __init__(
        self,
        chunks: AsyncIterable[bytes],
        *,
        format: str,
        table_schema: pa.Schema,
        limits: BodyLimits | None = None,
        required_columns: Sequence[str] = (),
        all_columns: bool = False,
        content_length: int | None = None,
        spool: bool = False,
        spool_dir: str | None = None,
        slice_rows: int = SLICE_ROWS,
    ) -> None:
        if format not in ("ipc", "ndjson", "json", "csv"):
            raise ValueError(f"unknown body format {format!r}; expected ipc, ndjson, json or csv")
        self._chunks = chunks.__aiter__()
        self._media = format
        # JSON text is cut into NDJSON as it arrives, then read as NDJSON
        self._splitter = JsonTextSplitter() if format == "json" else None
        self._format = "ndjson" if format == "json" else format
        self._table = table_schema
        self._limits = limits or BodyLimits()
        if slice_rows < 1:
            raise ValueError(f"slice_rows must be >= 1, got {slice_rows}")
        self._slice_rows = min(slice_rows, self._limits.max_batch_rows)
        self._required = list(required_columns)
        self._all_columns = all_columns
        self._content_length = content_length
        self._spool = Spool(spool_dir, self._slice_rows) if spool else None
        self._schema: pa.Schema | None = None
        self._framer = (
            IpcFramer(
                max_message_bytes=self._limits.max_batch_bytes,
                max_message_rows=self._limits.max_batch_rows,
            )
            if format == "ipc"
            else None
        )
        self._stream_schema: pa.Schema | None = None
        self._decoder: Decoder | None = None
        self._head: bytearray | None = bytearray() if format != "ipc" else None
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_newline = False
        self._since_rows = 0
        self._carry = 0
        self._tail = b""
        self._ready: deque[pa.RecordBatch] = deque()
        self._bytes = 0
        self._rows = 0
        self._batches = 0
        self._input_done = False
        self._complete = False
        self._started = False
        self._closed = False
        self._failed: BaseException | None = None

    def __repr__(self) -> str:
        return (
            f"<BodyBatches {self._format} bytes={self._bytes} rows={self._rows} "
            f"complete={self._complete}>"
        )

    # -- properties ---------------------------------------------------------
    @property
    def format(self) -> str:
        """``"ipc"``, ``"ndjson"``, ``"json"`` or ``"csv"``."""
        return self._media

    @property
    def schema(self) -> pa.Schema:
        """The batches' schema (table fields the body holds, in table order).

        Raises
        ------
        SourceError
            Before :meth:`start` has learned it.
        """
        if self._schema is None:
            raise SourceError("the body's schema is known after `await body.start()`")
        return self._schema

    @property
    def complete(self) -> bool:
        """True once the whole body was read and decoded."""
        return self._complete

    @property
    def spooled(self) -> bool:
        """True when the body keeps a replay spool (``spool=True``, not discarded)."""
        return self._spool is not None

    def statistics(self) -> BodyStats:
        """Bytes, batches and rows read so far (does not block)."""
        return BodyStats(self._media, self._bytes, self._batches, self._rows, self._complete)

    # -- reading ------------------------------------------------------------
    async def start(self) -> pa.Schema:
        """Read until the body's schema is checked and its first rows are decoded.

        Call it before handing the body to an engine: every problem that can be
        seen at the start (limits, format, schema, no rows) is raised here,
        before anything is written.

        Returns
        -------
        pa.Schema
            :attr:`schema`.

        Raises
        ------
        PayloadTooLargeError
            ``Content-Length`` or the bytes read pass ``max_body_bytes``, or the
            first message or record passes a batch limit.
        SchemaMismatchError
            The body's columns do not fit the table (names the column).
        DecodeError
            The bytes are not valid in the body's format.
        EmptyBodyError, BodyConsumedError
            No bytes arrived, or no rows.
        ClientDisconnectedError, BaseException
            Whatever the chunk iterator raised.
        """
        if not self._started:
            self._started = True
            length = self._content_length
            if length is not None and length > self._limits.max_body_bytes:
                raise PayloadTooLargeError(
                    f"the body is {length:,} bytes (Content-Length); the limit max_body_bytes "
                    f"is {self._limits.max_body_bytes:,}",
                    limit="max_body_bytes",
                    maximum=self._limits.max_body_bytes,
                    actual=length,
                )
            while not self._ready and not self._complete:
                await self._pump()
            if self._rows == 0:
                raise EmptyBodyError(
                    "the body holds no rows; nothing was written (send at least one row)"
                )
        return self.schema

    def __aiter__(self) -> BodyBatches:
        return self

    async def __anext__(self) -> pa.RecordBatch:
        if self._closed and not self._complete:
            raise SourceConsumedError("the body was closed before its end")
        if self._failed is not None:
            raise self._failed
        try:
            if not self._started:
                await self.start()
            pumped = False
            while not self._ready:
                if self._complete:
                    raise StopAsyncIteration
                await self._pump()
                pumped = True
            if not pumped:
                await anyio.lowlevel.checkpoint()
        except StopAsyncIteration:
            raise
        except BaseException as exc:
            if isinstance(exc, Exception):
                self._failed = exc
            raise
        return self._ready.popleft()

    async def aclose(self) -> None:
        """Stop reading and close the chunk iterator (safe to call twice).

        Does not delete the replay spool; :meth:`discard_spool` does.
        """
        if self._closed:
            return
        self._closed = True
        self._ready.clear()
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                await close()

    async def _next_chunk(self) -> bytes | None:
        while True:
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                return None
            if not chunk:
                continue
            self._bytes += len(chunk)
            maximum = self._limits.max_body_bytes
            if self._bytes > maximum:
                raise PayloadTooLargeError(
                    f"the body passed {maximum:,} bytes, the limit max_body_bytes; nothing "
                    "was written",
                    limit="max_body_bytes",
                    maximum=maximum,
                    actual=self._bytes,
                )
            return chunk if isinstance(chunk, bytes) else bytes(chunk)

    def _check_end(self) -> None:
        length = self._content_length
        if self._bytes == 0:
            if length:
                raise BodyConsumedError(
                    f"Content-Length announced {length:,} bytes but the body was empty: a "
                    "middleware or an earlier reader consumed it; nothing was written"
                )
            raise EmptyBodyError(
                "the request body is empty (if a middleware read it first, it consumed it); "
                "nothing was written"
            )
        if length is not None and self._bytes != length:
            raise BodyConsumedError(
                f"{self._bytes:,} body bytes arrived but Content-Length announced {length:,}: "
                "part of the body was consumed elsewhere; nothing was written"
            )

    def _should_feed(self) -> bool:
        """Whether the text collected on the loop goes to a decoder thread now."""
        if not self._pending_newline:
            if self._pending_bytes + self._carry > self._limits.max_batch_bytes:
                raise self._record_too_large(self._pending_bytes + self._carry)
            return False
        if self._schema is None:
            return True  # learn and check the columns as early as possible
        return self._pending_bytes >= min(FEED_BYTES, self._limits.max_batch_bytes)

    def _record_too_large(self, actual: int) -> PayloadTooLargeError:
        maximum = self._limits.max_batch_bytes
        return PayloadTooLargeError(
            f"a {self._format} record (line) is longer than {maximum:,} bytes, the limit "
            "max_batch_bytes; nothing was written",
            limit="max_batch_bytes",
            maximum=maximum,
            actual=actual,
        )

    def _check_lines(self, data: bytes) -> None:
        """Refuse a text line longer than ``max_batch_bytes`` (worker thread).

        Only the line carried over from earlier data and the last one are
        measured, unless ``data`` itself is longer than the limit.
        """
        limit = self._limits.max_batch_bytes
        first = data.find(b"\n")
        if first < 0:
            self._carry += len(data)
            if self._carry > limit:
                raise self._record_too_large(self._carry)
            return
        if self._carry + first + 1 > limit:
            raise self._record_too_large(self._carry + first + 1)
        last = data.rfind(b"\n")
        if last - first > limit:
            pos = first + 1
            while pos <= last:
                end = data.find(b"\n", pos)
                if end - pos + 1 > limit:
                    raise self._record_too_large(end - pos + 1)
                pos = end + 1
        self._carry = len(data) - last - 1
        if self._carry > limit:
            raise self._record_too_large(self._carry)

    async def _pump(self) -> None:
        """Read one chunk, and decode what has collected when it is time to."""
        if self._framer is not None:
            await self._pump_ipc(self._framer)
            return
        if not self._input_done:
            chunk = await self._next_chunk()
            if chunk is None:
                self._input_done = True
                self._check_end()
            else:
                self._pending.append(chunk)
                self._pending_bytes += len(chunk)
                if not self._pending_newline:
                    self._pending_newline = b"\n" in chunk
                if not self._should_feed():
                    return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self._pending_newline = False
        final = self._input_done
        batches = await run_sync(partial(self._process_text, data, final), limiter=stream_limiter())
        self._ready.extend(batches)
        if final:
            self._complete = True

    async def _pump_ipc(self, framer: IpcFramer) -> None:
        if not self._input_done:
            chunk = await self._next_chunk()
            if chunk is None:
                self._input_done = True
                self._check_end()
                framer.finish()
            else:
                framer.feed(chunk)  # on the loop: a few slices and one memcpy
                ready = framer.ready_bytes
                threshold = min(FEED_BYTES, self._limits.max_batch_bytes)
                if not ready or (self._schema is not None and ready < threshold):
                    return  # until the schema is checked, decode every message at once
        messages = framer.take()
        final = self._input_done
        if messages or final:
            batches = await run_sync(
                partial(self._process_ipc, messages, final), limiter=stream_limiter()
            )
            self._ready.extend(batches)
        if final:
            self._complete = True

    # -- decoding (worker thread) ------------------------------------------
    def _account(self, decoded: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        step = self._slice_rows
        out: list[pa.RecordBatch] = []
        for batch in decoded:
            if batch.num_rows > step:
                out.extend(batch.slice(i, step) for i in range(0, batch.num_rows, step))
            elif batch.num_rows:
                out.append(batch)
        self._batches += len(out)
        self._rows += sum(b.num_rows for b in out)
        if self._spool is not None and out and self._format != "ipc":
            assert self._schema is not None
            self._spool.add_batches(self._schema, out)
        return out

    def _process_ipc(self, messages: list[pa.Buffer], final: bool) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        for buffer in messages:
            try:
                message = pa.ipc.read_message(buffer)
            except (pa.ArrowInvalid, OSError) as exc:
                raise DecodeError(f"an invalid IPC message: {exc}") from exc
            kind = message.type
            if kind == "schema":
                if self._stream_schema is not None:
                    raise DecodeError("the IPC stream holds a second schema message")
                stream_schema = pa.ipc.read_schema(message)
                self._schema = body_schema(
                    self._table,
                    stream_schema.names,
                    stream_schema,
                    self._required,
                    self._all_columns,
                )
                self._stream_schema = stream_schema
            elif kind == "record batch":
                if self._stream_schema is None or self._schema is None:
                    raise DecodeError("an IPC record batch came before the schema")
                try:
                    batch = pa.ipc.read_record_batch(message, self._stream_schema)
                except (pa.ArrowInvalid, OSError) as exc:
                    raise DecodeError(f"an invalid IPC record batch: {exc}") from exc
                if batch.num_rows:
                    names = self._schema.names
                    shaped = batch if batch.schema.names == names else batch.select(names)
                    out.append(conform_batch(shaped, self._schema, self._batches + len(out)))
            elif kind == "dictionary batch":
                raise DecodeError("dictionary-encoded IPC streams are not supported")
            else:
                raise DecodeError(f"unexpected IPC message {kind!r}")
        if final and self._stream_schema is None:
            raise DecodeError("the IPC stream ended before its schema")
        if self._spool is not None:
            self._spool.add_messages(messages)
        return self._account(out)

    def _first_names(self, head: bytes, final: bool) -> list[str] | None:
        """Column names from the header (CSV) or the first non-blank line (NDJSON).

        None while that line is incomplete, or when the body holds only blanks.
        """
        if self._format == "csv":
            nl = head.find(b"\n")
            if nl < 0 and not final:
                return None
            line = head if nl < 0 else head[:nl]
            text = line.rstrip(b"\r").decode("utf-8", errors="replace")
            if not text.strip():
                if final and not head.strip():
                    return None
                raise DecodeError("a CSV body must start with its header line")
            return list(next(csv.reader([text]), []))
        pos = 0
        while True:
            nl = head.find(b"\n", pos)
            if nl < 0:
                if not final or not head[pos:].strip():
                    return None
                line = head[pos:]
                break
            line = head[pos:nl]
            if line.strip():
                break
            pos = nl + 1
        check_json_depth(line)  # before Python's recursive parser
        try:
            first = json.loads(line)
        except ValueError as exc:
            raise DecodeError(f"the first NDJSON line is not valid JSON: {exc}") from exc
        if not isinstance(first, dict):
            raise DecodeError(
                f"each NDJSON line must be a JSON object, the first is a {type(first).__name__}"
            )
        return [str(k) for k in first]

    def _process_text(self, data: bytes, final: bool) -> list[pa.RecordBatch]:
        if self._splitter is None:
            return self._process_lines(data, final)
        try:
            text = self._splitter.feed(data)
            if final:
                self._splitter.finish()
            return self._process_lines(text, final)
        except DecodeError as exc:
            raise element_error(exc, self._splitter.mode) from exc

    def _process_lines(self, data: bytes, final: bool) -> list[pa.RecordBatch]:
        if self._decoder is None:
            assert self._head is not None
            if not self._head and data.startswith(b"\xef\xbb\xbf"):
                data = data[3:]  # a UTF-8 byte order mark
            self._head += data
            names = self._first_names(bytes(self._head), final)
            if names is None:
                if len(self._head) > self._limits.max_batch_bytes:
                    raise self._record_too_large(len(self._head))
                return []
            self._schema = body_schema(self._table, names, None, self._required, self._all_columns)
            if self._format == "csv":
                self._decoder = CsvDecoder(self._schema)
            else:
                self._decoder = NdjsonDecoder(self._schema, extra_fields="error")
            data = bytes(self._head)
            self._head = None
        self._check_lines(data)
        try:
            decoded = self._decoder.feed(data) if data else []
            if final:
                decoded += self._decoder.finish()
        except DecodeError as exc:
            if self._format == "ndjson" and "unknown field" in str(exc):
                self._raise_unknown_key(self._tail + data, exc)
            raise
        if self._format == "ndjson":
            cut = data.rfind(b"\n")
            self._tail = data[cut + 1 :] if cut >= 0 else self._tail + data
        if any(b.num_rows for b in decoded):
            self._since_rows = 0
        else:  # CSV rows may hold quoted newlines: bound what waits for a row end
            self._since_rows += len(data)
            if self._since_rows > self._limits.max_batch_bytes:
                raise self._record_too_large(self._since_rows)
        return self._account(decoded)

    def _raise_unknown_key(self, data: bytes, cause: DecodeError) -> None:
        """Name the column behind an NDJSON "unknown field" error, if it can be found."""
        assert self._schema is not None
        known = set(self._schema.names)
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                check_json_depth(line)  # before Python's recursive parser
            except DecodeError:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            extra = [str(k) for k in row if k not in known] if isinstance(row, dict) else []
            if extra:
                raise SchemaMismatchError(
                    f"an NDJSON line has column {extra[0][:64]!r}, which the body's first line "
                    f"does not have (the first line sets the columns: {self._schema.names})",
                    field=extra[0],
                ) from cause

    # -- replay ---------------------------------------------------------------
    async def replay_source(self) -> WriteSource:
        """A replayable source holding every row of this body, from its spool.

        Returns
        -------
        WriteSource
            Mode REPLAYABLE: each pass reads the spool again (from memory or
            from its file, never holding more than a batch or two of a file
            spool in memory).

        Raises
        ------
        SourceError
            The body was not created with ``spool=True``, or is not complete.
        """
        if self._spool is None:
            raise SourceError("this body keeps no spool; create it with spool=True")
        if not self._complete:
            raise SourceError("the body was not read to its end, so it cannot be replayed")
        spool = self._spool
        await run_sync(spool.seal, limiter=stream_limiter())
        return replayable(spool.factory(self.schema), schema=self.schema)

    async def discard_spool(self) -> None:
        """Delete the replay spool (its file, if any). Safe to call twice."""
        if self._spool is not None:
            spool, self._spool = self._spool, None
            with anyio.CancelScope(shield=True):
                await run_sync(spool.discard, limiter=stream_limiter())
