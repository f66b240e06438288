"""Incremental decoders for NDJSON, CSV and Arrow IPC bytes.

Each decoder takes bytes in chunks of any size (``feed``) and returns the
record batches that became complete, then ``finish()`` at the end of input.
They never need the whole input, so files and feeds are read in bounded
chunks. Decoding is CPU work: lance_async runs it on worker threads, never on
the event loop. Parsing is pyarrow's (``pyarrow.json``, ``pyarrow.csv``,
``pyarrow.ipc``); this module only cuts the byte stream at record boundaries.

Type coercion
-------------
JSON values are parsed with the table's schema. When that fails (for example a
number sent as a string), the chunk is parsed with inferred types and each
column is cast to the table's type with ``safe=True`` casts, which parse
strings into numbers and timestamps but refuse anything that would lose data.
What still does not fit raises :class:`~lance_async.errors.DecodeError`.
"""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson

from ._schema import conform_batch, describe_difference
from .errors import DecodeError, SchemaMismatchError

__all__ = [
    "CsvDecoder",
    "Decoder",
    "IpcStreamDecoder",
    "NdjsonDecoder",
    "csv_record_cut",
    "decode_json_rows",
    "ipc_message_cut",
    "make_decoder",
]

FORMATS = ("ndjson", "csv", "ipc")


def _coerce_table(table: pa.Table, schema: pa.Schema, extra: str) -> pa.Table:
    unknown = [n for n in table.column_names if n not in schema.names]
    if unknown and extra == "error":
        raise DecodeError(f"unknown field {unknown[0]!r} (the table has {schema.names})")
    columns = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            if not col.type.equals(field.type):
                try:
                    col = pc.cast(col, field.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                    raise DecodeError(
                        f"field {field.name!r}: cannot convert {col.type} to {field.type}: {exc}"
                    ) from exc
        else:
            col = pa.nulls(table.num_rows, field.type)
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def _conform_all(table: pa.Table, schema: pa.Schema) -> list[pa.RecordBatch]:
    out = []
    for batch in table.combine_chunks().to_batches():
        if batch.num_rows:
            try:
                out.append(conform_batch(batch, schema))
            except SchemaMismatchError as exc:
                raise DecodeError(str(exc)) from exc
    return out


def decode_json_rows(
    data: bytes, schema: pa.Schema, *, extra_fields: str = "error", first_line: int = 1
) -> pa.Table:
    """Decode newline-delimited JSON objects into a table of ``schema``.

    Parameters
    ----------
    data : bytes
        One or more JSON objects, one per line (a single object is fine).
    schema : pa.Schema
        The target schema; values are coerced to its types (see module notes).
    extra_fields : {"error", "ignore"}
        What to do with a field the schema does not have.
    first_line : int
        The line number of ``data``'s first line, for error messages.

    Returns
    -------
    pa.Table
        With exactly ``schema`` (rows in input order).

    Raises
    ------
    DecodeError
        Malformed JSON, a value that is not an object (``null``, a number, a
        string, an array), an unknown field (with ``extra_fields="error"``),
        a value that cannot be converted, or a null in a non-nullable column;
        the message names the line (1-based) and the field.

    Notes
    -----
    Blocking CPU work (pyarrow's JSON reader); call it on a worker thread.
    """
    try:
        return _decode_json(data, schema, extra_fields, first_line)
    except _LineError as exc:
        raise DecodeError(str(exc)) from None  # it names its line already
    except DecodeError as exc:
        where = _first_bad_line(data, schema, extra_fields, first_line)
        if where is None:
            raise
        raise DecodeError(where) from exc


# pyarrow's JSON reader (26.0.1 here) crashes the process (SIGSEGV) when the first value
# of its input is ``null``; a later ``null`` becomes a row of nulls, which is as
# wrong. The first case is refused before pyarrow sees the bytes (this match
# reads only the leading whitespace), the second after it parsed them.
_LEADING_NULL = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*null")


class _LineError(DecodeError):
    """Internal: a decode error whose message names its line already."""


_JSON_KINDS = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "an array",
}


def _json_kind(value: object) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _first_non_object(data: bytes, first_line: int) -> str | None:
    """The first top-level JSON value of ``data`` that is not an object, as a
    line-numbered message; None if there is none (only on the error path:
    Python's JSON parser, line by line). Several values on one line (pyarrow
    reads ``{..} {..}`` as two rows) are checked one by one; a line Python
    cannot parse is left to pyarrow's verdict."""
    decoder = json.JSONDecoder()
    for number, raw in enumerate(data.split(b"\n"), first_line):
        text = raw.decode("utf-8", errors="replace")
        if number == first_line:
            text = text.removeprefix("\ufeff")
        pos, end = 0, len(text)
        while True:
            while pos < end and text[pos] in " \t\r":
                pos += 1
            if pos >= end:
                break
            try:
                value, pos = decoder.raw_decode(text, pos)
            except ValueError:
                if text.startswith("null", pos):
                    value = None  # ``nullx``: pyarrow reads the null first
                else:
                    break
            if not isinstance(value, dict):
                return f"line {number}: expected a JSON object, got {_json_kind(value)}"
    return None


def _refuse_null_rows(table: pa.Table, data: bytes, first_line: int) -> None:
    """Raise if a row of ``table`` came from a top-level ``null`` of ``data``.

    Cheap on good data: a column without nulls proves every row held an
    object (O(columns)); only when every column has nulls are the rows
    checked, and only when some row is all nulls is the text read again.
    """
    if not table.num_rows:
        return
    if table.num_columns:
        if any(col.null_count == 0 for col in table.columns):
            return
        all_null = pc.is_null(table.column(0))
        for col in table.columns[1:]:
            all_null = pc.and_(all_null, pc.is_null(col))
        if not pc.any(all_null).as_py():
            return
    where = _first_non_object(data, first_line)
    if where is not None:
        raise _LineError(where)


def _decode_json(data: bytes, schema: pa.Schema, extra_fields: str, first_line: int) -> pa.Table:
    if not data.strip():
        return schema.empty_table()
    if _LEADING_NULL.match(data):
        where = _first_non_object(data, first_line)
        raise _LineError(where or f"line {first_line}: expected a JSON object, got null")
    behavior = "error" if extra_fields == "error" else "ignore"
    buf = pa.py_buffer(data if data.endswith(b"\n") else data + b"\n")
    read_options = pjson.ReadOptions(use_threads=False, block_size=max(len(data) + 1, 1 << 16))
    try:
        table = pjson.read_json(
            buf,
            read_options=read_options,
            parse_options=pjson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior=behavior
            ),
        )
    except pa.ArrowInvalid as first:
        if "unexpected" in str(first).lower():
            raise DecodeError(f"unknown field in JSON: {first}") from first
        try:
            inferred = pjson.read_json(
                buf,
                read_options=read_options,
                parse_options=pjson.ParseOptions(unexpected_field_behavior="infer"),
            )
        except pa.ArrowInvalid as exc:
            raise DecodeError(f"malformed JSON: {exc}") from exc
        _refuse_null_rows(inferred, data, first_line)
        table = _coerce_table(inferred, schema, extra_fields)
    else:
        _refuse_null_rows(table, data, first_line)
    try:
        table.validate(full=True)  # the JSON reader lets invalid UTF-8 into strings
    except pa.ArrowInvalid as exc:
        raise DecodeError(f"invalid JSON text: {exc}") from exc
    return pa.Table.from_batches(_conform_all(table, schema), schema=schema)


def _first_bad_line(
    data: bytes, schema: pa.Schema, extra_fields: str, first_line: int
) -> str | None:
    """Find the first line that fails, and say why (only on the error path)."""
    for number, line in enumerate(data.split(b"\n"), first_line):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            non_object = _first_non_object(line, number)
            if non_object is not None:
                return non_object
            return f"line {number}: malformed JSON ({getattr(exc, 'msg', exc)})"
        if not isinstance(obj, dict):
            return f"line {number}: expected a JSON object, got {_json_kind(obj)}"
        unknown = [k for k in obj if k not in schema.names]
        if unknown and extra_fields == "error":
            return f"line {number}: unknown field {unknown[0]!r} (the table has {schema.names})"
        missing = [f.name for f in schema if not f.nullable and obj.get(f.name) is None]
        if missing:
            return f"line {number}: field {missing[0]!r} is missing or null, and it is required"
        try:
            _decode_json(line, schema, extra_fields, number)
        except _LineError as exc:
            return str(exc)
        except DecodeError as exc:
            return f"line {number}: {exc}"
    return None


class Decoder:
    """Base of the incremental decoders.

    Parameters
    ----------
    schema : pa.Schema or None
        The rows' schema. Required for NDJSON and CSV in this version (types
        are never guessed per chunk); IPC streams carry their own.

    Notes
    -----
    ``feed`` and ``finish`` are blocking CPU work (cutting and parsing): call
    them on a worker thread. A decoder is not thread-safe; one caller at a
    time.
    """

    def __init__(self, schema: pa.Schema | None) -> None:
        self.schema = schema

    def feed(self, chunk: bytes) -> list[pa.RecordBatch]:  # pragma: no cover - abstract
        """Take more bytes; return the batches that are now complete."""
        raise NotImplementedError

    def finish(self) -> list[pa.RecordBatch]:  # pragma: no cover - abstract
        """End of input; return the last batches.

        Raises
        ------
        DecodeError
            The input ended in the middle of a record.
        """
        raise NotImplementedError

    @property
    def pending(self) -> int:  # pragma: no cover - abstract
        """Bytes taken by ``feed`` and not decoded yet (an incomplete record
        at the end of the input so far, or bytes after an end-of-stream
        marker). The input up to ``bytes fed - pending`` is decoded."""
        raise NotImplementedError

    @property
    def ended(self) -> bool:
        """True once the input's own end marker was read (Arrow IPC only)."""
        return False


class NdjsonDecoder(Decoder):
    """Newline-delimited JSON, cut at the last complete line of each chunk.

    Only the new chunk is searched for its last newline, so a long line
    arriving in many chunks is not searched again each time.
    """

    def __init__(self, schema: pa.Schema, *, extra_fields: str = "error") -> None:
        super().__init__(schema)
        self._schema = schema
        self._pending = bytearray()
        self._extra = extra_fields
        self._line = 1  # number of the first pending line, for messages

    @property
    def pending(self) -> int:
        """Bytes of the incomplete last line."""
        return len(self._pending)

    def _decode(self, data: bytes) -> list[pa.RecordBatch]:
        table = decode_json_rows(
            data, self._schema, extra_fields=self._extra, first_line=self._line
        )
        self._line += data.count(b"\n")
        return list(table.to_batches())

    def feed(self, chunk: bytes) -> list[pa.RecordBatch]:
        cut = chunk.rfind(b"\n")
        if cut < 0:
            self._pending += chunk
            return []
        if self._pending:
            with memoryview(chunk) as view:
                data = b"".join((self._pending, view[: cut + 1]))
        else:
            data = chunk[: cut + 1]
        self._pending = bytearray(chunk[cut + 1 :])
        return self._decode(bytes(data))

    def finish(self) -> list[pa.RecordBatch]:
        rest = bytes(self._pending)
        self._pending.clear()
        if not rest.strip():
            return []
        return self._decode(rest)


_CSV_TOKENS = re.compile(rb'["\n]')
_QUOTE = ord('"')
_NEWLINE = ord("\n")


def _csv_scan_records(
    data: bytes | bytearray, pos: int, end: int, in_quotes: bool, delimiter: int, stop: bool
) -> tuple[int, int, bool]:
    """Scan ``data[pos:end]`` one quote or newline at a time (pure Python).

    The reference reading of a record end, and the fallback of
    :func:`_csv_scan` once a quote breaks the simple parity rule. With
    ``stop`` it returns at the first record end. Returns ``(last, pos,
    in_quotes)``: the index just past the last record-ending newline (-1
    if none) and where the scan stopped, in which state. ``data[end - 1]``
    must not be a quote (so ``""`` is never split at ``end``).
    """
    last = -1
    skip_at = -1
    starts = (delimiter, _NEWLINE, ord("\r"))
    for match in _CSV_TOKENS.finditer(data, pos, end):
        at = match.start()
        if data[at] == _NEWLINE:
            if not in_quotes:
                last = at + 1
                if stop:
                    return last, last, False
        elif at == skip_at:
            continue  # the second quote of an escaped pair
        elif in_quotes:
            if data[at + 1] == _QUOTE:
                skip_at = at + 1
            else:
                in_quotes = False
        elif at == 0 or data[at - 1] in starts:
            in_quotes = True
    return last, end, in_quotes


def _csv_scan(
    data: bytes | bytearray, pos: int, in_quotes: bool, delimiter: int
) -> tuple[int, int, bool]:
    """Find record ends in ``data[pos:]``, resuming a scan stopped at ``pos``.

    ``data`` starts at a record boundary; ``in_quotes`` is the state at
    ``pos`` (False when ``pos`` is 0). Returns ``(last, pos, in_quotes)``:
    the index just past the last newline in ``data[pos:]`` that ends a
    record (-1 if none), and where to resume next time with which state. A
    run of quotes at the very end is left for next time (``""`` may be an
    escaped quote or a closing one, depending on the next byte).

    Vectorized (numpy, which releases the GIL): outside quotes, a quote
    opens a quoted field only at the start of a field; inside, ``""`` is a
    literal quote and one quote closes the field. When every quote that
    the parity of the quote count reads as an opener is at the start of a
    field (or right after the quote before it: an escaped pair), that
    parity *is* the state, so the record ends are the newlines after an
    even number of quotes. A stray quote in the middle of an unquoted field
    (literal, as pyarrow reads it) breaks the parity: from there the rest
    is scanned by :func:`_csv_scan_records`.
    """
    end = len(data)
    while end > pos and data[end - 1] == _QUOTE:
        end -= 1
    if end <= pos:
        return -1, pos, in_quotes
    arr = np.frombuffer(data, dtype=np.uint8, count=end - pos, offset=pos)
    quotes = np.flatnonzero(arr == _QUOTE)
    newlines = np.flatnonzero(arr == _NEWLINE)
    if not len(quotes):
        if in_quotes or not len(newlines):
            return -1, end, in_quotes
        return pos + int(newlines[-1]) + 1, end, False
    first = 1 if in_quotes else 0
    openers = quotes[first::2]
    limit = end - pos  # where the parity reading holds (relative)
    if len(openers):
        # The byte before each opener: a field start (delimiter, CR, LF, the
        # start of the data) or a quote -- the one just before it in this
        # scan, a closer, so the two are an escaped pair. (A scan never
        # resumes right after a quote: trailing quotes wait for the next one.)
        before = arr[np.maximum(openers - 1, 0)]
        if openers[0] == 0:
            before[0] = data[pos - 1] if pos else delimiter
        allowed = np.zeros(256, dtype=bool)
        allowed[[delimiter, _NEWLINE, ord("\r"), _QUOTE]] = True
        stray = np.flatnonzero(~allowed[before])
        if len(stray):
            limit = int(openers[stray[0]])
    newlines = newlines[: np.searchsorted(newlines, limit)]
    outside = newlines[(np.searchsorted(quotes, newlines) + first) % 2 == 0]
    last = pos + int(outside[-1]) + 1 if len(outside) else -1
    if limit == end - pos:
        state = bool((len(quotes) + first) % 2)
        return last, end, state
    # a stray quote at ``limit``: literal; scan the rest one token at a time
    del arr
    rest, stopped, state = _csv_scan_records(data, pos + limit + 1, end, False, delimiter, False)
    return max(last, rest), stopped, state


def csv_record_cut(data: bytes, delimiter: bytes = b",") -> int:
    """Index just past the last newline that ends a CSV record, or -1.

    ``data`` must start at a record boundary. A double quote opens a quoted
    field only at the start of a field (as the CSV parser reads it); inside
    one, ``""`` is a literal quote and newlines belong to the field. A stray
    quote in the middle of an unquoted field is literal, so it never makes
    the rest of the input look quoted. Linear in ``len(data)``, vectorized
    (see :class:`CsvDecoder`); blocking CPU work.
    """
    if b'"' not in data:
        return data.rfind(b"\n") + 1 or -1
    last, _, _ = _csv_scan(data, 0, False, delimiter[0])
    return last


class CsvDecoder(Decoder):
    """CSV with a header row; rows may hold quoted newlines.

    Columns are matched by the header's names (any order); every schema column
    must be present. The search for record ends resumes where the last one
    stopped, so a record arriving in many chunks is scanned once.
    """

    def __init__(self, schema: pa.Schema, *, delimiter: str = ",") -> None:
        super().__init__(schema)
        self._schema = schema
        self._delimiter = delimiter
        self._delim = delimiter.encode()[0]
        self._header: list[str] | None = None
        self._pending = bytearray()  # starts at a record boundary (after the header)
        self._scanned = 0  # where the search for record ends resumes in _pending
        self._in_quotes = False  # the CSV state there

    @property
    def pending(self) -> int:
        """Bytes of the incomplete last record (or of the header, until it is complete)."""
        return len(self._pending)

    def _parse(self, data: bytes) -> list[pa.RecordBatch]:
        assert self._header is not None
        types = {f.name: f.type for f in self._schema}
        try:
            table = pcsv.read_csv(
                io.BytesIO(data),
                read_options=pcsv.ReadOptions(
                    column_names=self._header, use_threads=False, block_size=max(len(data), 1 << 16)
                ),
                parse_options=pcsv.ParseOptions(delimiter=self._delimiter),
                convert_options=pcsv.ConvertOptions(
                    column_types=types,
                    include_columns=self._schema.names,
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,
                ),
            )
        except pa.ArrowInvalid as exc:
            raise DecodeError(f"bad CSV: {exc}") from exc
        return _conform_all(table, self._schema)

    def _set_header(self, line: bytes) -> None:
        text = line.rstrip(b"\r").decode("utf-8", errors="replace").removeprefix("\ufeff")
        names = next(csv.reader([text], delimiter=self._delimiter), [])
        missing = [n for n in self._schema.names if n not in names]
        if missing:
            raise DecodeError(f"CSV header lacks column {missing[0]!r} (header: {names})")
        self._header = names

    def feed(self, chunk: bytes) -> list[pa.RecordBatch]:
        searched = len(self._pending)
        self._pending += chunk
        if self._header is None:
            nl = self._pending.find(b"\n", max(searched - 1, 0))
            if nl < 0:
                return []
            self._set_header(bytes(self._pending[:nl]))
            del self._pending[: nl + 1]
        last, self._scanned, self._in_quotes = _csv_scan(
            self._pending, self._scanned, self._in_quotes, self._delim
        )
        if last <= 0:
            return []
        with memoryview(self._pending) as view:
            data = bytes(view[:last])
        del self._pending[:last]
        self._scanned -= last
        return self._parse(data)

    def finish(self) -> list[pa.RecordBatch]:
        rest = bytes(self._pending)
        self._pending.clear()
        self._scanned, self._in_quotes = 0, False
        if self._header is None:
            if not rest.strip():
                return []
            nl = rest.find(b"\n")
            self._set_header(rest if nl < 0 else rest[:nl])
            rest = b"" if nl < 0 else rest[nl + 1 :]
        if not rest.strip():
            return []
        return self._parse(rest if rest.endswith(b"\n") else rest + b"\n")


_ARROW_FILE_MAGIC = b"ARROW1"
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def _read_messages(
    buf: bytes | bytearray, pos: int, limit: int | None
) -> tuple[list[pa.ipc.Message], int, bool]:
    """The complete IPC messages of ``buf`` from ``pos`` (zero-copy: the
    messages point into ``buf``). Returns ``(messages, end, ended)``."""
    messages: list[pa.ipc.Message] = []
    view = pa.py_buffer(buf)
    size = len(buf)
    while size - pos >= 8 and (limit is None or len(messages) < limit):
        head = bytes(buf[pos : pos + 8])
        if head == _EOS:
            return messages, pos + 8, True
        if head[:4] == b"\x00\x00\x00\x00":  # the pre-1.0 end-of-stream marker
            return messages, pos + 4, True
        reader = pa.BufferReader(view.slice(pos))
        try:
            messages.append(pa.ipc.read_message(reader))
        except (pa.ArrowInvalid, EOFError, OSError):
            break  # incomplete: wait for more bytes
        pos += reader.tell()
    return messages, pos, False


def ipc_message_cut(
    buf: bytes | bytearray, at_stream_start: bool, limit: int | None = None
) -> tuple[int, bool, int]:
    """How many leading bytes of ``buf`` are complete Arrow IPC messages.

    Parameters
    ----------
    buf : bytes or bytearray
        Bytes of an IPC stream (or file) starting at a message boundary.
    at_stream_start : bool
        ``buf`` starts at the beginning of the input: an IPC file's 8-byte
        magic is skipped (and counted in the cut).
    limit : int, optional
        Take at most this many messages.

    Returns
    -------
    tuple of (cut, ended, messages)
        The end of the last complete message (bytes), whether the
        end-of-stream marker was reached (it is included in ``cut``), and how
        many messages ``cut`` holds. Never copies ``buf``; blocking CPU work
        (one metadata read per message).
    """
    pos = 0
    if at_stream_start and len(buf) >= 8 and bytes(buf[:6]) == _ARROW_FILE_MAGIC:
        pos = 8
    messages, cut, ended = _read_messages(buf, pos, limit)
    count = len(messages)
    del messages  # they point into ``buf``: released before the caller resizes it
    return cut, ended, count


class IpcStreamDecoder(Decoder):
    """Arrow IPC stream format (also the body of the IPC file format).

    Bytes are read once: when the first buffered message is complete, the
    buffer is copied once and every complete message is decoded from that
    copy, so batches never point into memory that is reused (an incomplete
    message is only probed, never copied, until it is complete).
    Dictionary-encoded streams are not supported in this version.
    """

    def __init__(self, schema: pa.Schema | None = None) -> None:
        super().__init__(schema)
        self._declared = schema
        self._buf = bytearray()
        self._stream_schema: pa.Schema | None = None
        self._started = False
        self._ended = False
        self.batches_decoded = 0

    @property
    def pending(self) -> int:
        """Bytes of an incomplete message, or after the end-of-stream marker."""
        return len(self._buf)

    @property
    def ended(self) -> bool:
        """True once the end-of-stream marker was read."""
        return self._ended

    def feed(self, chunk: bytes) -> list[pa.RecordBatch]:
        if self._ended:
            return []  # what follows the stream (an IPC file's footer) is not read
        self._buf += chunk
        at_start = not self._started
        if at_start and len(self._buf) < 8:
            return []
        self._started = True
        cut, ended, count = ipc_message_cut(self._buf, at_start, limit=1)
        if not count and not ended:
            del self._buf[:cut]  # an IPC file's magic, if any
            return []
        data = bytes(self._buf)  # the one copy the batches point into
        start = 8 if at_start and data[:6] == _ARROW_FILE_MAGIC else 0
        messages, end, ended = _read_messages(data, start, None)
        del self._buf[:end]
        self._ended = ended
        out: list[pa.RecordBatch] = []
        for message in messages:
            out.extend(self._handle(message))
        return out

    def _handle(self, message: pa.ipc.Message) -> list[pa.RecordBatch]:
        if message.type == "schema":
            schema = pa.ipc.read_schema(message)
            if self._declared is not None:
                diff = describe_difference(self._declared, schema)
                if diff is not None:
                    raise DecodeError(f"the IPC stream's schema does not match: {diff[0]}")
            self._stream_schema = schema
            if self.schema is None:
                self.schema = schema
            return []
        if message.type == "dictionary batch":
            raise DecodeError("dictionary-encoded IPC streams are not supported")
        if message.type != "record batch" or self._stream_schema is None:
            raise DecodeError(f"unexpected IPC message {message.type!r}")
        batch = pa.ipc.read_record_batch(message, self._stream_schema)
        index = self.batches_decoded
        self.batches_decoded += 1
        if self._declared is not None:
            try:
                batch = conform_batch(batch, self._declared, index)
            except SchemaMismatchError as exc:
                raise DecodeError(str(exc)) from exc
        return [batch] if batch.num_rows else []

    def finish(self) -> list[pa.RecordBatch]:
        if not self._ended and self._buf:
            raise DecodeError("the IPC stream ended in the middle of a message")
        if self._stream_schema is None and not self._ended:
            raise DecodeError("the IPC stream ended before its schema")
        return []


def make_decoder(fmt: str, schema: pa.Schema | None, **options: object) -> Decoder:
    """A decoder for ``fmt`` in ``("ndjson", "csv", "ipc")``.

    Raises
    ------
    ValueError
        Unknown format, or NDJSON / CSV without a schema.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    if fmt == "ipc":
        return IpcStreamDecoder(schema)
    if schema is None:
        raise ValueError(f"{fmt} input needs a schema (the target table's)")
    if fmt == "ndjson":
        return NdjsonDecoder(schema, extra_fields=str(options.get("extra_fields", "error")))
    return CsvDecoder(schema, delimiter=str(options.get("delimiter", ",")))
