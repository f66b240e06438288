"""Incremental decoders for NDJSON, CSV and Arrow IPC bytes.

Each decoder takes bytes in chunks of any size (``feed``) and returns the
record batches that became complete, then ``finish()`` at the end of input.
They never need the whole input, so files and feeds are read in bounded
chunks. Decoding is CPU work: lance_async runs it on worker threads, never on
the event loop. Parsing is pyarrow's (``pyarrow.json``, ``pyarrow.csv``,
``pyarrow.ipc``); this module only cuts the byte stream at record boundaries
(NDJSON at newlines, CSV at record ends outside quotes, Arrow IPC with the one
framer of ``ipc.py``). JSON values follow the coercion rule of ``jsonrows.py``.
"""

from __future__ import annotations

import csv
import io
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from .._schema import conform_batch, describe_difference
from ..errors import DecodeError, SchemaMismatchError
from .ipc import IpcFramer
from .jsonarray import JsonTextSplitter, element_error
from .jsonrows import conform_all, decode_json_rows

__all__ = [
    "FORMATS",
    "CsvDecoder",
    "Decoder",
    "IpcStreamDecoder",
    "JsonDecoder",
    "NdjsonDecoder",
    "csv_record_cut",
    "make_decoder",
]

FORMATS = ("ndjson", "json", "csv", "ipc")


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


class JsonDecoder(Decoder):
    """JSON text: an array of objects (``application/json``), or objects.

    The text is cut into NDJSON as it arrives
    (:class:`~lance_async.sources.jsonarray.JsonTextSplitter`) and decoded by
    :class:`NdjsonDecoder`, so values follow the same coercion rule; an error
    names the array element (``object 3 of the array``).
    """

    def __init__(self, schema: pa.Schema, *, extra_fields: str = "error") -> None:
        super().__init__(schema)
        self._splitter = JsonTextSplitter()
        self._rows = NdjsonDecoder(schema, extra_fields=extra_fields)

    @property
    def pending(self) -> int:
        """Bytes of the incomplete last element."""
        return self._rows.pending

    def feed(self, chunk: bytes) -> list[pa.RecordBatch]:
        try:
            return self._rows.feed(self._splitter.feed(chunk))
        except DecodeError as exc:
            raise element_error(exc, self._splitter.mode) from exc

    def finish(self) -> list[pa.RecordBatch]:
        try:
            self._splitter.finish()
            return self._rows.finish()
        except DecodeError as exc:
            raise element_error(exc, self._splitter.mode) from exc


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


def _record_line(data: bytes, row: int, delimiter: str) -> int:
    """Lines before the ``row``-th record (1-based, blank lines not counted, as
    pyarrow counts rows) of CSV ``data``; only on the error path."""
    reader = csv.reader(
        io.StringIO(data.decode("utf-8", errors="replace"), newline=""), delimiter=delimiter
    )
    lines_before, seen = 0, 0
    try:
        for record in reader:
            if record:
                seen += 1
                if seen == row:
                    return lines_before
            lines_before = reader.line_num
    except csv.Error:
        pass
    return lines_before


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
        self._line = 2  # number of the first pending line, for messages (the header is 1)

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
            raise self._located(data, exc) from exc
        finally:
            first_line, self._line = self._line, self._line + data.count(b"\n")
        try:
            return conform_all(table, self._schema)
        except DecodeError as exc:
            where = f"CSV lines {first_line}-{self._line - 1}"
            if exc.field in table.column_names:
                nulls = pc.is_null(table.column(exc.field))
                row = pc.index(nulls, True).as_py()
                if row >= 0:
                    where = f"CSV line {first_line + _record_line(data, row + 1, self._delimiter)}"
            raise DecodeError(f"{where}: {exc}", field=exc.field) from exc

    def _located(self, data: bytes, exc: pa.ArrowInvalid) -> DecodeError:
        """pyarrow's complaint about ``data`` as a message naming the body's line
        and the column (pyarrow counts rows from the start of each chunk)."""
        text = str(exc)
        field = None
        column = re.search(r"In CSV column #(\d+)", text)
        if column is not None and self._header is not None:
            index = int(column.group(1))
            if index < len(self._header):
                field = self._header[index]
        row = re.search(r"Row #(\d+)", text)
        where = f"CSV line {self._line}"
        if row is not None:
            where = (
                f"CSV line {self._line + _record_line(data, int(row.group(1)), self._delimiter)}"
            )
        why = text.split(": ", 2)[-1] if row is not None else text
        why = why.replace("CSV conversion error to ", "cannot convert to ").replace(
            "invalid UTF8 data", "not valid UTF-8"
        )
        why = why[:1].lower() + why[1:]
        if field is not None:
            why = f"column {field!r}: {why}"
        return DecodeError(f"{where}: {why[:300]}", field=field)

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
        rest = rest if rest.endswith(b"\n") else rest + b"\n"
        last, _, in_quotes = _csv_scan(rest, 0, False, self._delim)
        if in_quotes:
            # the input ended inside a quoted field: pyarrow would read every
            # byte up to the end into that one value
            opened = self._line + rest.count(b"\n", 0, max(last, 0))
            raise DecodeError(
                f"CSV line {opened}: a quoted field opened in this record is never closed "
                "(unterminated quote); the input ended inside it"
            )
        return self._parse(rest)


class IpcStreamDecoder(Decoder):
    """Arrow IPC stream format (also the body of the IPC file format).

    Cut by :class:`~lance_async.sources.ipc.IpcFramer`: each message is
    copied once, into an Arrow buffer of exactly its size, and decoded from
    it, so batches never point into memory that is reused. Dictionary-encoded
    streams are not supported in this version.

    Parameters
    ----------
    schema : pa.Schema, optional
        The schema the stream must have; default whatever it carries.
    max_message_bytes, max_message_rows : int, optional
        Limits checked from each message's header, before its body is
        buffered (:class:`~lance_async.errors.PayloadTooLargeError`).
    """

    def __init__(
        self,
        schema: pa.Schema | None = None,
        *,
        max_message_bytes: int | None = None,
        max_message_rows: int | None = None,
    ) -> None:
        super().__init__(schema)
        self._declared = schema
        self._framer = IpcFramer(
            max_message_bytes=max_message_bytes, max_message_rows=max_message_rows
        )
        self._stream_schema: pa.Schema | None = None
        self.batches_decoded = 0

    @property
    def pending(self) -> int:
        """Bytes of an incomplete message, or after the end-of-stream marker."""
        return self._framer.pending

    @property
    def ended(self) -> bool:
        """True once the end-of-stream marker was read."""
        return self._framer.ended

    def feed(self, chunk: bytes) -> list[pa.RecordBatch]:
        self._framer.feed(chunk)
        return self.decode_messages(self._framer.take())

    def decode_messages(self, buffers: list[pa.Buffer]) -> list[pa.RecordBatch]:
        """Decode complete IPC messages (as cut by an :class:`IpcFramer`).

        Raises
        ------
        DecodeError
            A message that does not decode, or does not fit the schema.
        """
        out: list[pa.RecordBatch] = []
        for buffer in buffers:
            try:
                message = pa.ipc.read_message(buffer)
            except (pa.ArrowException, EOFError) as exc:
                raise DecodeError(
                    f"IPC message {self.batches_decoded} is malformed: {exc}"
                ) from exc
            out.extend(self._handle(message))
        return out

    def _handle(self, message: pa.ipc.Message) -> list[pa.RecordBatch]:
        if message.type == "schema":
            try:
                schema = pa.ipc.read_schema(message)
            except pa.ArrowException as exc:
                raise DecodeError(f"the IPC stream's schema does not decode: {exc}") from exc
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
        try:
            batch = pa.ipc.read_record_batch(message, self._stream_schema)
        except pa.ArrowException as exc:
            raise DecodeError(f"IPC batch {self.batches_decoded} does not decode: {exc}") from exc
        index = self.batches_decoded
        self.batches_decoded += 1
        if self._declared is not None:
            try:
                batch = conform_batch(batch, self._declared, index)
            except SchemaMismatchError as exc:
                raise DecodeError(str(exc)) from exc
        return [batch] if batch.num_rows else []

    def finish(self) -> list[pa.RecordBatch]:
        self._framer.finish()
        if self._stream_schema is None and not self.ended:
            raise DecodeError("the IPC stream ended before its schema")
        return []


def make_decoder(fmt: str, schema: pa.Schema | None, **options: object) -> Decoder:
    """A decoder for ``fmt`` in ``("ndjson", "json", "csv", "ipc")``.

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
    if fmt == "json":
        return JsonDecoder(schema, extra_fields=str(options.get("extra_fields", "error")))
    return CsvDecoder(schema, delimiter=str(options.get("delimiter", ",")))
