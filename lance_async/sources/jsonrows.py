"""JSON rows: newline-delimited JSON objects decoded into record batches of a schema.

One coercion rule for JSON everywhere in lance_async: values are parsed with
the table's schema; when that fails (for example a number sent as a string),
the chunk is parsed with inferred types and each column is cast to the
table's type with ``safe=True`` casts, which parse strings into numbers and
timestamps but refuse anything that would lose data; a JSON boolean is never
taken for a number, nor a number for a boolean (``true`` is not the key 1).
What still does not fit raises :class:`~lance_async.errors.DecodeError`
naming the line and field.

Nesting is limited (:data:`MAX_JSON_DEPTH` levels). pyarrow's JSON reader
with an explicit schema stops at the first value that does not fit, so deep
input never nests there; but with inferred types it recurses and crashes the
process (SIGSEGV) from about 7,000 levels, and Python's ``json`` raises an
untyped ``RecursionError`` from about 1,000. Input is measured with
:func:`check_json_depth` before either of them sees it.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pjson

from .._schema import conform_batch
from ..errors import DecodeError, SchemaMismatchError

__all__ = [
    "LEADING_NULL",
    "MAX_JSON_DEPTH",
    "check_json_depth",
    "conform_all",
    "decode_json_rows",
    "json_depth",
]

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects lance_async decodes (a row object is level 1)."""

_IS_BRACKET = np.zeros(256, dtype=bool)
_IS_BRACKET[[ord("["), ord("]"), ord("{"), ord("}")]] = True
_BRACKET_STEP = np.zeros(256, dtype=np.int64)
_BRACKET_STEP[[ord("["), ord("{")]] = 1
_BRACKET_STEP[[ord("]"), ord("}")]] = -1


def _unescaped(arr: np.ndarray, quotes: np.ndarray) -> np.ndarray:
    """The quotes of ``quotes`` (positions in ``arr``) not escaped by a backslash."""
    after = quotes[quotes > 0]
    suspects = after[arr[after - 1] == ord("\\")]
    if not len(suspects):
        return quotes
    run = np.ones(len(suspects), dtype=np.int64)  # backslashes right before each suspect
    live = np.arange(len(suspects))
    while len(live):
        at = suspects[live] - run[live] - 1
        more = at >= 0
        more[more] = arr[at[more]] == ord("\\")
        live = live[more]
        run[live] += 1
    escaped = suspects[(run & 1) == 1]
    return np.setdiff1d(quotes, escaped, assume_unique=True) if len(escaped) else quotes


def _depths(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the brackets outside strings, and an upper bound of the
    nesting depth a JSON parser can reach at each (vectorized, numpy)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    brackets = np.flatnonzero(np.take(_IS_BRACKET, arr))
    if not len(brackets):
        return brackets, brackets
    quotes = np.flatnonzero(arr == ord('"'))
    if len(quotes):
        quotes = _unescaped(arr, quotes)
        # A raw newline cannot be inside a JSON string, so every line starts
        # outside one: count the quotes before a bracket from its line's start.
        newlines = np.flatnonzero(arr == ord("\n"))
        starts = np.concatenate(([0], newlines + 1))[np.searchsorted(newlines, brackets)]
        inside = (np.searchsorted(quotes, brackets) - np.searchsorted(quotes, starts)) & 1
        brackets = brackets[inside == 0]
    level = np.cumsum(_BRACKET_STEP[arr[brackets]])
    # A parse may start at any line (the error paths parse line by line) and
    # a value may span lines: bound the depth by the rise over any start.
    floor = np.minimum.accumulate(np.concatenate(([0], level)))[:-1]
    return brackets, level - floor


def json_depth(data: bytes) -> int:
    """An upper bound of how deep the JSON text ``data`` nests (0 for scalars).

    Parameters
    ----------
    data : bytes
        JSON text: one value, or newline-delimited values.

    Returns
    -------
    int
        For valid JSON, the exact depth (``{"a": [1]}`` is 2); for invalid
        JSON, at least the depth any parser reaches before it stops at the
        error, wherever it starts reading (at any line).

    Notes
    -----
    Blocking CPU work, linear in ``len(data)`` and vectorized (numpy): about
    as long as parsing the text. Brackets inside strings (escapes included)
    do not count.
    """
    _, depth = _depths(data)
    return int(depth.max()) if len(depth) else 0


def check_json_depth(data: bytes, *, first_line: int = 1, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON text that nests deeper than ``max_depth`` levels.

    Call it before handing untrusted JSON to a parser that recurses: pyarrow's
    JSON reader with inferred types crashes the process from about 7,000
    levels, Python's ``json`` raises ``RecursionError`` from about 1,000.

    Parameters
    ----------
    data : bytes
        JSON text (one value or newline-delimited values).
    first_line : int
        The line number of ``data``'s first line, for the message.
    max_depth : int
        Levels allowed (default :data:`MAX_JSON_DEPTH`, 64).

    Raises
    ------
    DecodeError
        The text nests deeper; the message names the line (1-based).

    Notes
    -----
    Blocking CPU work (see :func:`json_depth`); a text with at most
    ``max_depth`` brackets is passed after two ``bytes.count`` calls.
    """
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return
    positions, depth = _depths(data)
    deep = np.flatnonzero(depth > max_depth)
    if len(deep):
        line = first_line + data.count(b"\n", 0, int(positions[deep[0]]))
        raise _LineError(
            f"line {line}: JSON nested deeper than {max_depth} levels; nothing was decoded"
        )


def _coerce_table(table: pa.Table, schema: pa.Schema, extra: str) -> pa.Table:
    unknown = [n for n in table.column_names if n not in schema.names]
    if unknown and extra == "error":
        raise DecodeError(f"unknown field {unknown[0]!r} (the table has {schema.names})")
    columns = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            if not col.type.equals(field.type):
                if pa.types.is_boolean(col.type) != pa.types.is_boolean(field.type) and not (
                    pa.types.is_null(col.type) or pa.types.is_string(col.type)
                ):
                    raise DecodeError(
                        f"field {field.name!r}: cannot convert {col.type} to {field.type}: "
                        "JSON true and false are not numbers, nor numbers booleans"
                    )
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


def conform_all(table: pa.Table, schema: pa.Schema) -> list[pa.RecordBatch]:
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
LEADING_NULL = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*null")


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
    check_json_depth(data, first_line=first_line)  # before Python's recursive parser
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
    if LEADING_NULL.match(data):
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
        check_json_depth(data, first_line=first_line)  # inferred types recurse: measure first
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
    return pa.Table.from_batches(conform_all(table, schema), schema=schema)


def _first_bad_line(
    data: bytes, schema: pa.Schema, extra_fields: str, first_line: int
) -> str | None:
    """Find the first line that fails, and say why (only on the error path)."""
    try:
        check_json_depth(data, first_line=first_line)  # before Python's recursive parser
    except _LineError as exc:
        return str(exc)
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
