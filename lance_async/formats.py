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
        Malformed JSON, an unknown field (with ``extra_fields="error"``), a
        value that cannot be converted, or a null in a non-nullable column;
        the message names the line (1-based) and the field.
    """
    try:
        return _decode_json(data, schema, extra_fields)
    except DecodeError as exc:
        where = _first_bad_line(data, schema, extra_fields, first_line)
        if where is None:
            raise
        raise DecodeError(where) from exc


def _decode_json(data: bytes, schema: pa.Schema, extra_fields: str) -> pa.Table:
    if not data.strip():
        return schema.empty_table()
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
        table = _coerce_table(inferred, schema, extra_fields)
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
            return f"line {number}: malformed JSON ({getattr(exc, 'msg', exc)})"
        if not isinstance(obj, dict):
            return f"line {number}: expected a JSON object, got {type(obj).__name__}"
        unknown = [k for k in obj if k not in schema.names]
        if unknown and extra_fields == "error":
            return f"line {number}: unknown field {unknown[0]!r} (the table has {schema.names})"
        missing = [f.name for f in schema if not f.nullable and obj.get(f.name) is None]
        if missing:
            return f"line {number}: field {missing[0]!r} is missing or null, and it is required"
        try:
            _decode_json(line, schema, extra_fields)
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


class NdjsonDecoder(Decoder):
    """Newline-delimited JSON, cut at the last complete line of each chunk."""

    def __init__(self, schema: pa.Schema, *, extra_fields: str = "error") -> None:
        super().__init__(schema)
        self._schema = schema
        self._pending = b""
        self._extra = extra_fields
        self._line = 1  # number of the first pending line, for messages

    def _decode(self, data: bytes) -> list[pa.RecordBatch]:
        table = decode_json_rows(
            data, self._schema, extra_fields=self._extra, first_line=self._line
        )
        self._line += data.count(b"\n")
        return list(table.to_batches())

    def feed(self, chunk: bytes) -> list[pa.RecordBatch]:
        data = self._pending + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self._pending = data
            return []
        self._pending = data[cut + 1 :]
        return self._decode(data[: cut + 1])

    def finish(self) -> list[pa.RecordBatch]:
        rest, self._pending = self._pending, b""
        if not rest.strip():
            return []
        return self._decode(rest)


_CSV_TOKENS = re.compile(rb'["\n]')


def csv_record_cut(data: bytes, delimiter: bytes = b",") -> int:
    """Index just past the last newline that ends a CSV record, or -1.

    ``data`` must start at a record boundary. A double quote opens a quoted
    field only at the start of a field (as the CSV parser reads it); inside
    one, ``""`` is a literal quote and newlines belong to the field. A stray
    quote in the middle of an unquoted field is literal, so it never makes
    the rest of the input look quoted. Linear in ``len(data)``.
    """
    if b'"' not in data:
        return data.rfind(b"\n") + 1 or -1
    in_quotes = False
    last = -1
    skip_at = -1
    starts = (delimiter[0], ord("\n"), ord("\r"))
    for match in _CSV_TOKENS.finditer(data):
        pos = match.start()
        if data[pos] == ord("\n"):
            if not in_quotes:
                last = pos + 1
        elif pos == skip_at:
            continue  # the second quote of an escaped pair
        elif in_quotes:
            if pos + 1 < len(data) and data[pos + 1] == ord('"'):
                skip_at = pos + 1
            else:
                in_quotes = False
        elif pos == 0 or data[pos - 1] in starts:
            in_quotes = True
    return last


class CsvDecoder(Decoder):
    """CSV with a header row; rows may hold quoted newlines.

    Columns are matched by the header's names (any order); every schema column
    must be present.
    """

    def __init__(self, schema: pa.Schema, *, delimiter: str = ",") -> None:
        super().__init__(schema)
        self._schema = schema
        self._delimiter = delimiter
        self._header: list[str] | None = None
        self._pending = b""

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

    def _take_header(self, data: bytes) -> bytes | None:
        nl = data.find(b"\n")
        if nl < 0:
            return None
        line = data[:nl].rstrip(b"\r").decode("utf-8", errors="replace").removeprefix("\ufeff")
        names = next(csv.reader([line], delimiter=self._delimiter), [])
        missing = [n for n in self._schema.names if n not in names]
        if missing:
            raise DecodeError(f"CSV header lacks column {missing[0]!r} (header: {names})")
        self._header = names
        return data[nl + 1 :]

    def feed(self, chunk: bytes) -> list[pa.RecordBatch]:
        data = self._pending + chunk
        if self._header is None:
            rest = self._take_header(data)
            if rest is None:
                self._pending = data
                return []
            data = rest
        cut = csv_record_cut(data, self._delimiter.encode())
        if cut <= 0:
            self._pending = data
            return []
        self._pending = data[cut:]
        return self._parse(data[:cut])

    def finish(self) -> list[pa.RecordBatch]:
        rest, self._pending = self._pending, b""
        if self._header is None:
            if rest.strip():
                rest = self._take_header(rest + b"\n") or b""
            else:
                return []
        if not rest.strip():
            return []
        return self._parse(rest if rest.endswith(b"\n") else rest + b"\n")


_ARROW_FILE_MAGIC = b"ARROW1"
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


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
        many messages ``cut`` holds. Never copies ``buf``.
    """
    pos = 0
    if at_stream_start and len(buf) >= 8 and bytes(buf[:6]) == _ARROW_FILE_MAGIC:
        pos = 8
    taken = 0
    view = pa.py_buffer(buf)  # zero-copy; released before the caller resizes ``buf``
    try:
        while len(buf) - pos >= 8 and (limit is None or taken < limit):
            head = bytes(buf[pos : pos + 8])
            if head == _EOS:
                return pos + 8, True, taken
            if head[:4] == b"\x00\x00\x00\x00":  # the pre-1.0 end-of-stream marker
                return pos + 4, True, taken
            reader = pa.BufferReader(view.slice(pos))
            try:
                pa.ipc.read_message(reader)
            except (pa.ArrowInvalid, EOFError, OSError):
                break  # incomplete: wait for more bytes
            pos += reader.tell()
            del reader
            taken += 1
        return pos, False, taken
    finally:
        del view


class IpcStreamDecoder(Decoder):
    """Arrow IPC stream format (also the body of the IPC file format).

    Each complete message is copied out of the input buffer once, so batches
    never point into memory that is reused. Dictionary-encoded streams are not
    supported in this version.
    """

    def __init__(self, schema: pa.Schema | None = None) -> None:
        super().__init__(schema)
        self._declared = schema
        self._buf = bytearray()
        self._stream_schema: pa.Schema | None = None
        self._started = False
        self._ended = False
        self.batches_decoded = 0

    def feed(self, chunk: bytes) -> list[pa.RecordBatch]:
        self._buf += chunk
        at_start = not self._started
        if at_start and len(self._buf) < 8:
            return []
        self._started = True
        cut, ended, count = ipc_message_cut(self._buf, at_start)
        data = bytes(self._buf[:cut])  # one copy: batches must not point into the buffer
        del self._buf[:cut]
        self._ended = self._ended or ended
        reader = pa.BufferReader(pa.py_buffer(data))
        if at_start and data[:6] == _ARROW_FILE_MAGIC:
            reader.seek(8)
        out: list[pa.RecordBatch] = []
        for _ in range(count):
            out.extend(self._handle(pa.ipc.read_message(reader)))
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
