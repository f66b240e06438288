"""JSON rows: newline-delimited JSON objects decoded into record batches of a schema.

One coercion rule for JSON everywhere in lance_async (HTTP bodies, files,
feeds, the command line; Python rows given to a writer or a merge follow it
too, see :func:`rows_table`). A value goes into a column when the conversion
cannot change what it means:

* a number into an integer column when it is a whole number in range
  (``2.0`` is 2; ``1.5`` does not fit), into a float column as the nearest
  float, as any JSON parser reads it (``5`` into float64 is 5.0);
* a string into a number, decimal, date or timestamp column when it parses
  as one (JSON carries int64 beyond 2**53, decimals and dates as strings);
* a number into a timestamp column as a count of the column's unit;
* nothing else changes kind: a number is never a string (send ``"5"``), a
  boolean is never a number, nor a number a boolean (``true`` is not the
  key 1);
* an integer outside its column's range is refused, never wrapped or
  rounded (pyarrow reads ``-9223372036854775809`` as a float that would cast
  to the int64 minimum); so is a number written as a float at or past 2**53
  for an integer column, and a string that is not decimal digits (``"0x10"``,
  which Arrow's cast would read as 16).

Values are parsed with the table's schema first; when that fails, the chunk
is parsed with inferred types and each column is cast to the table's type
with ``safe=True`` casts under the rule above. What does not fit raises
:class:`~lance_async.errors.DecodeError` naming the line and the field
(``.field``).

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
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pjson

from .._schema import conform_batch
from ..errors import DecodeError, SchemaMismatchError
from .jsondepth import MAX_JSON_DEPTH, check_json_depth, json_depth
from .jsondepth import LineError as _LineError

__all__ = [
    "LEADING_NULL",
    "MAX_JSON_DEPTH",
    "check_json_depth",
    "coerce_columns",
    "conform_all",
    "decode_json_rows",
    "few_chunks",
    "is_blank",
    "json_depth",
    "rows_schema",
    "rows_table",
]

BLOCK_BYTES = 1 << 20
"""JSON text pyarrow's reader parses at a time (bytes): its working memory is
about one block, and a large text becomes one chunk per block instead of
costing its parser's copy of the whole (a line longer than a block is read
again with larger blocks)."""

COMBINE_BYTES = 8 << 20
"""Tables up to this size (bytes) are made one chunk after decoding; larger
ones keep their chunks (one per block) rather than being copied whole."""

_BLANK = re.compile(rb"[ \t\n\r\x0b\x0c]*")

ROWS_SLICE = 8_192
"""Python rows converted per pyarrow call by :func:`rows_table` (a few ms each)."""


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_number(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def _refusal(have: pa.DataType, want: pa.DataType) -> str | None:
    """Why a column of inferred type ``have`` may not become ``want`` (None: it may try)."""
    if pa.types.is_null(have) or have.equals(want):
        return None
    if pa.types.is_boolean(have) != pa.types.is_boolean(want) and not _is_text(have):
        return "JSON true and false are not numbers, nor numbers booleans"
    if _is_text(want) and not _is_text(have):
        kind = "a number" if _is_number(have) else str(have)
        return f"{kind} is not a string (send it as a JSON string)"
    return None


EXACT_FLOAT_INTEGERS = 2**53
"""Past this magnitude a float64 no longer holds every integer: a JSON number
that reached an integer column as a float (pyarrow reads an integer beyond
int64 as one) is refused there, never rounded into the column."""

_DECIMAL_INTEGER = r"^-?[0-9]+$"


def _integer_range(t: pa.DataType) -> tuple[int, int]:
    info = np.iinfo(t.to_pandas_dtype())
    return int(info.min), int(info.max)


def _check_into_integer(col: pa.ChunkedArray, field: pa.Field) -> None:
    """Refuse values Arrow's cast to an integer column would take but the
    coercion rule does not: a float that may not be the integer written (at
    or past 2**53: pyarrow reads ``-9223372036854775809`` as the float
    ``-2**63``, which would become the int64 ``-2**63``), and a string that
    is not a decimal integer (Arrow's cast reads ``"0x10"`` as 16)."""
    have = col.type
    if pa.types.is_floating(have):
        big = pc.greater_equal(pc.abs(col), EXACT_FLOAT_INTEGERS)
        if pc.any(big).as_py():
            value = col.filter(big)[0].as_py()
            low, high = _integer_range(field.type)
            raise DecodeError(
                f"field {field.name!r}: {value:.17g} does not fit {field.type} exactly: an "
                f"integer outside [{low}, {high}], or a number written as a float at or past "
                "2**53 (send integers as JSON integers, or wide ones as strings)",
                field=field.name,
            )
    elif _is_text(have):
        bad = pc.invert(pc.match_substring_regex(col, _DECIMAL_INTEGER))
        if pc.any(bad).as_py():
            value = col.filter(bad)[0].as_py()
            raise DecodeError(
                f"field {field.name!r}: {str(value)[:40]!r} is not a decimal integer "
                f'({field.type}); write integers in digits, as 16 or "16"',
                field=field.name,
            )
        long = col.filter(pc.greater(pc.utf8_length(col), 18))  # may be out of range
        low, high = _integer_range(field.type)
        for text in long.to_pylist():
            if len(text) > 21 or not low <= int(text) <= high:  # 21: a sign and 20 digits
                raise DecodeError(
                    f"field {field.name!r}: {text[:40]} is out of range for {field.type} "
                    f"[{low}, {high}]",
                    field=field.name,
                )


def coerce_columns(table: pa.Table, schema: pa.Schema, extra: str = "error") -> pa.Table:
    """Cast a table of inferred types to ``schema`` by the module's rule.

    Parameters
    ----------
    table : pa.Table
        Values as parsed, with inferred types (``pyarrow.json`` or
        ``pa.Table.from_pylist``).
    schema : pa.Schema
        The table's schema; a column ``table`` lacks is all nulls.
    extra : {"error", "ignore"}
        What to do with a column ``schema`` does not have.

    Returns
    -------
    pa.Table
        With exactly ``schema``.

    Raises
    ------
    DecodeError
        A value does not fit its column (``.field`` names it), or an unknown
        column with ``extra="error"``.

    Notes
    -----
    Blocking, O(rows) (Arrow casts); run it on a worker thread.
    """
    unknown = [n for n in table.column_names if n not in schema.names]
    if unknown and extra == "error":
        raise DecodeError(
            f"unknown field {unknown[0]!r} (the table has {schema.names})", field=unknown[0]
        )
    columns = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            if not col.type.equals(field.type):
                why = _refusal(col.type, field.type)
                if why is not None:
                    raise DecodeError(
                        f"field {field.name!r}: cannot convert {col.type} to {field.type}: {why}",
                        field=field.name,
                    )
                if pa.types.is_integer(field.type):
                    _check_into_integer(col, field)
                try:
                    col = pc.cast(col, field.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                    raise DecodeError(
                        f"field {field.name!r}: cannot convert {col.type} to {field.type}: {exc}",
                        field=field.name,
                    ) from exc
        else:
            col = pa.nulls(table.num_rows, field.type)
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def few_chunks(table: pa.Table) -> pa.Table:
    """``table`` as one chunk when it is small (:data:`COMBINE_BYTES`), else as
    it is: combining a large table would copy it whole (pure CPU; blocking)."""
    return table.combine_chunks() if table.nbytes <= COMBINE_BYTES else table


def is_blank(data: bytes | bytearray) -> bool:
    """True when ``data`` holds only whitespace (no copy, unlike ``strip``)."""
    return _BLANK.fullmatch(data) is not None


def conform_all(table: pa.Table, schema: pa.Schema) -> list[pa.RecordBatch]:
    """The non-empty batches of ``table`` checked against ``schema`` (nulls in
    non-nullable columns refused as :class:`DecodeError` naming the field)."""
    out = []
    for batch in few_chunks(table).to_batches():
        if batch.num_rows:
            try:
                out.append(conform_batch(batch, schema))
            except SchemaMismatchError as exc:
                raise DecodeError(str(exc), field=exc.field) from exc
    return out


def decode_json_rows(
    data: bytes | bytearray, schema: pa.Schema, *, extra_fields: str = "error", first_line: int = 1
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
        raise DecodeError(str(exc), field=exc.field) from None  # it names its line already
    except DecodeError as exc:
        where = _first_bad_line(data, schema, extra_fields, first_line)
        if where is None:
            if data.strip().count(b"\n"):
                try:
                    return _decode_by_line(data, schema, extra_fields, first_line)
                except DecodeError:
                    pass
            raise
        raise DecodeError(where[0], field=where[1] or exc.field) from exc


# pyarrow's JSON reader (26.0.1 here) crashes the process (SIGSEGV) when the first value
# of its input is ``null``; a later ``null`` becomes a row of nulls, which is as
# wrong. The first case is refused before pyarrow sees the bytes (this match
# reads only the leading whitespace), the second after it parsed them.
LEADING_NULL = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*null")


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


def _first_non_object(data: bytes | bytearray, first_line: int) -> str | None:
    """The first top-level JSON value of ``data`` that is not an object, as a
    line-numbered message; None if there is none (only on the error path:
    Python's JSON parser, line by line). Several values on one line (pyarrow
    reads ``{..} {..}`` as two rows) are checked one by one; a line Python
    cannot parse is left to pyarrow's verdict."""
    check_json_depth(data, first_line=first_line)  # before Python's recursive parser
    decoder = json.JSONDecoder()
    for number, raw in enumerate(bytes(data).split(b"\n"), first_line):
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


def _refuse_null_rows(table: pa.Table, data: bytes | bytearray, first_line: int) -> None:
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


def _parse_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with fixed-size lists (vectors) read as lists: pyarrow's JSON
    reader cannot read a fixed-size list (ArrowNotImplementedError)."""
    if not any(pa.types.is_fixed_size_list(f.type) for f in schema):
        return schema  # the common case: the table's schema as it is
    fields = [
        f.with_type(pa.list_(f.type.value_field)) if pa.types.is_fixed_size_list(f.type) else f
        for f in schema
    ]
    return pa.schema(fields, metadata=schema.metadata)


def _fixed_size_lists(
    table: pa.Table, schema: pa.Schema, data: bytes | bytearray, first_line: int
) -> pa.Table:
    """The vector columns of ``table`` cast to their fixed size (a list of
    another length is a :class:`DecodeError` naming its line and field)."""
    for i, name in enumerate(table.column_names):
        want = schema.field(name).type if name in schema.names else None
        if want is None or not pa.types.is_fixed_size_list(want):
            continue
        col = table.column(i)
        lengths = pc.list_value_length(col)
        bad = pc.and_(pc.is_valid(lengths), pc.not_equal(lengths, want.list_size))
        if pc.any(bad).as_py():
            row = pc.index(bad, True).as_py()
            got = lengths[row].as_py()
            lines = [n for n, text in enumerate(bytes(data).split(b"\n")) if text.strip()]
            raise _LineError(
                f"line {first_line + lines[row]}: field {name!r} holds {got} values; "
                f"the column takes exactly {want.list_size}",
                field=name,
            )
        table = table.set_column(i, schema.field(name), col.cast(want))
    return table


def _read_blocks(buf: pa.Buffer, parse_options: pjson.ParseOptions) -> pa.Table:
    """``buf`` read by pyarrow's JSON reader in blocks of :data:`BLOCK_BYTES`
    (a line longer than a block: read again with blocks 16 times larger)."""
    size = buf.size
    block = max(min(BLOCK_BYTES, size + 1), 1 << 16)
    while True:
        try:
            return pjson.read_json(
                buf,
                read_options=pjson.ReadOptions(use_threads=False, block_size=block),
                parse_options=parse_options,
            )
        except pa.ArrowInvalid as exc:
            if block > size or "straddl" not in str(exc):
                raise
            block = min(block * 16, size + 1)


def _decode_json(
    data: bytes | bytearray, schema: pa.Schema, extra_fields: str, first_line: int
) -> pa.Table:
    if is_blank(data):
        return schema.empty_table()
    if LEADING_NULL.match(data):
        where = _first_non_object(data, first_line)
        raise _LineError(where or f"line {first_line}: expected a JSON object, got null")
    behavior = "error" if extra_fields == "error" else "ignore"
    buf = pa.py_buffer(data)  # no copy (a last line needs no newline)
    read_options = pjson.ReadOptions(use_threads=False, block_size=max(len(data) + 1, 1 << 16))
    parse_schema = _parse_schema(schema)
    try:
        table = _read_blocks(
            buf,
            pjson.ParseOptions(explicit_schema=parse_schema, unexpected_field_behavior=behavior),
        )
        if parse_schema is not schema:
            table = _fixed_size_lists(table, schema, data, first_line)
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
        table = coerce_columns(inferred, schema, extra_fields)
    else:
        _refuse_null_rows(table, data, first_line)
    try:
        table.validate(full=True)  # the JSON reader lets invalid UTF-8 into strings
    except pa.ArrowInvalid as exc:
        raise DecodeError(f"invalid JSON text: {exc}") from exc
    return pa.Table.from_batches(conform_all(table, schema), schema=schema)


def _first_bad_line(
    data: bytes | bytearray, schema: pa.Schema, extra_fields: str, first_line: int
) -> tuple[str, str | None] | None:
    """Find the first line that fails, and say why and in which field (only
    on the error path)."""
    try:
        check_json_depth(data, first_line=first_line)  # before Python's recursive parser
    except _LineError as exc:
        return str(exc), None
    for number, line in enumerate(bytes(data).split(b"\n"), first_line):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            non_object = _first_non_object(line, number)
            if non_object is not None:
                return non_object, None
            return f"line {number}: malformed JSON ({getattr(exc, 'msg', exc)})", None
        if not isinstance(obj, dict):
            return f"line {number}: expected a JSON object, got {_json_kind(obj)}", None
        unknown = [k for k in obj if k not in schema.names]
        if unknown and extra_fields == "error":
            return (
                f"line {number}: unknown field {unknown[0]!r} (the table has {schema.names})",
                unknown[0],
            )
        wide = _out_of_range_integer(obj, schema)
        if wide is not None:
            return f"line {number}: {wide[0]}", wide[1]
        missing = [f.name for f in schema if not f.nullable and obj.get(f.name) is None]
        if missing:
            return (
                f"line {number}: field {missing[0]!r} is missing or null, and it is required",
                missing[0],
            )
        try:
            _decode_json(line, schema, extra_fields, number)
        except _LineError as exc:
            return str(exc), exc.field
        except DecodeError as exc:
            return f"line {number}: {exc}", exc.field
    return None


def _shown_int(value: int) -> str:
    """An int for a message: its digits, or its size when they are too many
    (Python refuses to print an int of more than 4,300 digits)."""
    if value.bit_length() > 128:
        return f"an integer of {len(format(value, 'x')) * 4} bits"
    return str(value)


def _out_of_range_integer(obj: dict[str, Any], schema: pa.Schema) -> tuple[str, str] | None:
    """The first integer of a parsed JSON object outside its integer column's
    range, as (message, field); Python's JSON parser keeps the exact digits
    that pyarrow's turns into a float (only on the error path)."""
    for field in schema:
        value = obj.get(field.name)
        if (
            pa.types.is_integer(field.type)
            and isinstance(value, int)
            and not isinstance(value, bool)
        ):
            low, high = _integer_range(field.type)
            if not low <= value <= high:
                shown = _shown_int(value)
                return (
                    f"field {field.name!r}: {shown} is out of range for {field.type} "
                    f"[{low}, {high}]",
                    field.name,
                )
    return None


def _decode_by_line(
    data: bytes | bytearray, schema: pa.Schema, extra_fields: str, first_line: int
) -> pa.Table:
    """Decode each line on its own (the error path, when every line decodes
    alone but the chunk did not: a column whose values pyarrow inferred as
    one type across lines, such as an integer past 2**53 beside a float)."""
    tables = [
        _decode_json(line, schema, extra_fields, number)
        for number, line in enumerate(bytes(data).split(b"\n"), first_line)
        if line.strip()
    ]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _is_wide(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63


def _wide_column(name: str, values: list[Any], schema: pa.Schema) -> pa.Array:
    """A column of Python rows holding an int outside int64 (which pyarrow's
    inference cannot hold), built with its column's type by the coercion rule."""
    if name not in schema.names:
        raise SchemaMismatchError(
            f"unknown field {name!r} (the table has {schema.names})", field=name
        )
    field = schema.field(name)
    numbers = all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values
    )
    if pa.types.is_integer(field.type):
        low, high = _integer_range(field.type)
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and not low <= v <= high:
                raise SchemaMismatchError(
                    f"field {name!r}: {_shown_int(v)} is out of range for {field.type} "
                    f"[{low}, {high}]",
                    field=name,
                )
        if all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values):
            return pa.array(values, type=field.type)
    elif pa.types.is_floating(field.type) and numbers:
        return pa.array([None if v is None else float(v) for v in values], type=field.type)
    wide = next(v for v in values if _is_wide(v))
    raise SchemaMismatchError(
        f"field {name!r}: cannot convert the integer {_shown_int(wide)} and the column's "
        "other values "
        f"to {field.type}",
        field=name,
    )


def _wide_rows(part: Any, schema: pa.Schema) -> pa.Table:
    """Python rows with an int outside int64 as a table (pyarrow's inference
    raises OverflowError): those columns built with the table's types (a
    uint64 column takes 2**63), the others inferred as usual."""
    if isinstance(part, dict):
        columns = {name: list(values) for name, values in part.items()}
    else:
        names = list(dict.fromkeys(name for row in part for name in row))
        columns = {name: [row.get(name) for row in part] for name in names}
    wide = {name for name, values in columns.items() if any(_is_wide(v) for v in values)}
    rest = {name: values for name, values in columns.items() if name not in wide}
    try:
        others = pa.table(rest)
        arrays = [
            _wide_column(name, values, schema) if name in wide else others.column(name)
            for name, values in columns.items()
        ]
        return pa.Table.from_arrays(arrays, names=list(columns))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise SchemaMismatchError(f"cannot read the rows: {exc}") from exc


def rows_schema(data: object, schema: pa.Schema, values: bool = True) -> pa.Schema | None:
    """The part of a table's ``schema`` that Python rows fill, or None when
    ``data`` is not Python rows (or ``values`` is False: keys of a delete
    follow the strict key rule of :mod:`lance_async.memwal.keys` instead).

    Python rows are a column dict (``{"id": [1, 2]}``) or a non-empty list or
    tuple of row dicts (``[{"id": 1}]``). Their values follow the JSON rule
    (:func:`rows_table`), so a writer or a merge hands them the table's schema
    rather than letting pyarrow infer one (``5`` would be int64 and not fit a
    float64 column). A column dict holding Arrow arrays is Arrow data, never
    cast. Columns the rows lack are left out (a merge may update
    some columns); names the table lacks are kept out too, and
    :func:`rows_table` refuses them by name.
    """
    if not values:
        return None
    if isinstance(data, dict):
        if any(isinstance(v, (pa.Array, pa.ChunkedArray)) for v in data.values()):
            return None  # Arrow arrays are typed already: never cast
        names = set(data)
    elif isinstance(data, (list, tuple)) and data and all(isinstance(r, dict) for r in data):
        names = set().union(*data)
    else:
        return None
    if not names:
        return None
    present = [f for f in schema if f.name in names]
    return pa.schema(present, metadata=schema.metadata)


def rows_table(data: object, schema: pa.Schema) -> pa.Table:
    """Python rows (a column dict, or a list of row dicts) as a table of ``schema``.

    The values are read as pyarrow infers them, then cast by the module's
    rule -- the rule JSON text follows: ``5`` into float64 is 5.0, ``1.5``
    into int64, ``True`` into a number or ``5`` into a string column do not
    fit. pyarrow's own conversion with a schema would take ``True`` as 1.0
    and truncate ``1.5`` to 1, silently.

    Parameters
    ----------
    data : dict of str to sequence, or sequence of dict
    schema : pa.Schema
        The target schema (every column; see :func:`rows_schema` for the part
        of a table's schema some rows fill).

    Returns
    -------
    pa.Table
        With exactly ``schema``.

    Raises
    ------
    SchemaMismatchError
        A value does not fit its column, a name is not a column, a required
        value is missing, or the values cannot be read at all; ``.field``
        names the column when one can be named.

    Notes
    -----
    Blocking, O(rows); lance_async's entry points run it on a worker thread.
    """
    if isinstance(data, dict):
        parts: list[Any] = [data]
    else:
        rows = list(data)  # type: ignore[call-overload]
        # slices keep each conversion short: the GIL is let go between them
        parts = [rows[i : i + ROWS_SLICE] for i in range(0, len(rows), ROWS_SLICE)] or [rows]
    tables = []
    for part in parts:
        try:
            inferred = pa.table(part) if isinstance(part, dict) else pa.Table.from_pylist(part)
        except OverflowError:
            inferred = _wide_rows(part, schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            raise SchemaMismatchError(f"cannot read the rows: {exc}") from exc
        try:
            tables.append(coerce_columns(inferred, schema))
        except DecodeError as exc:
            raise SchemaMismatchError(str(exc), field=exc.field) from exc
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    try:
        return pa.Table.from_batches(conform_all(table, schema), schema=schema)
    except DecodeError as exc:
        raise SchemaMismatchError(str(exc), field=exc.field) from exc
