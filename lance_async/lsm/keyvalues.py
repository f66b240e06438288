"""Primary-key values given by callers, turned into engine filters and arrays.

A lookup key is a scalar (one key column), a dict or a tuple (composite
keys). Values are checked against the key column's type before anything
reaches the engine, by one rule for every path (:func:`key_value`: no bool
as a number, no lossy float, the column's range checked): a value that does
not fit is an :class:`~lance_async.errors.InvalidInputError`, never a lossy
conversion, on the dataset's and the writer's lookups alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .._filters import sql_int
from ..errors import InvalidInputError, SchemaMismatchError

__all__ = [
    "key_array",
    "key_columns",
    "key_filter",
    "key_value",
    "key_values",
    "keys_filter",
    "sql_literal",
]


def key_value(value: Any, field: pa.Field) -> Any:
    """One primary-key value, converted by the one strict rule of every lookup path.

    Parameters
    ----------
    value : object
        The caller's value.
    field : pa.Field
        The key column.

    Returns
    -------
    object
        A Python value of the column's type: an ``int`` for integer
        columns (a float only when it is integral: ``2.0`` is 2), a ``float``
        for floating columns, a ``str``, a ``bool``, a date or a timestamp.

    Raises
    ------
    InvalidInputError
        Null; a bool for a number column or a number for a bool column; a
        lossy float (``1.5`` for an integer key); a value outside the
        column's range (``2**70`` for int64, ``-1`` for uint32); a value of
        another kind (a string for a number column, a number for a string
        column); a type lookups do not support. The message names the
        column and its type.
    """
    dtype = field.type

    def refuse(why: str) -> InvalidInputError:
        return InvalidInputError(
            f"key {value!r} does not fit {field.name!r} ({dtype}): {why}"[:300]
        )

    if value is None:
        raise InvalidInputError(f"a primary-key value cannot be null ({field.name!r})")
    if isinstance(value, np.generic):
        value = value.item()
    if pa.types.is_integer(dtype):
        if isinstance(value, bool):
            raise refuse("a boolean is not an integer")
        if isinstance(value, float):
            if not (math.isfinite(value) and value.is_integer()):
                raise refuse("not an integer (a float key must be integral)")
            value = int(value)
        if not isinstance(value, int):
            raise refuse(f"expected an integer, got {type(value).__name__}")
        info = np.iinfo(dtype.to_pandas_dtype())
        if not info.min <= value <= info.max:
            raise refuse(f"out of range [{info.min}, {info.max}]")
        return value
    if pa.types.is_floating(dtype):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise refuse(f"expected a number, got {type(value).__name__}")
        number = float(value)
        if not math.isfinite(number):
            raise refuse("not a finite number")
        return number
    if pa.types.is_boolean(dtype):
        if not isinstance(value, bool):
            raise refuse(f"expected a boolean, got {type(value).__name__}")
        return value
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        if not isinstance(value, str):
            raise refuse(f"expected a string, got {type(value).__name__}")
        return value
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype):
        if isinstance(value, (bool, int, float)):
            raise refuse(f"expected a date or datetime, got {type(value).__name__}")
        try:
            return pa.scalar(value, type=dtype).as_py()
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise refuse(str(exc)) from None
    raise InvalidInputError(f"lookups by a {dtype} key are not supported ({field.name!r})")


def sql_literal(value: Any, field: pa.Field) -> str:
    """One key value as a Lance SQL literal of ``field``'s type (strict, as
    :func:`key_value`).

    Raises
    ------
    InvalidInputError
        The value does not fit the column (see :func:`key_value`).
    """
    value = key_value(value, field)
    dtype = field.type
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "'" + str(value).replace("'", "''") + "'"
    if pa.types.is_integer(dtype):
        return sql_int(int(value))
    if pa.types.is_floating(dtype):
        return repr(value)
    if pa.types.is_boolean(dtype):
        return "true" if value else "false"
    scalar = pa.scalar(value, type=dtype)
    return f"CAST('{scalar}' AS {'TIMESTAMP' if pa.types.is_timestamp(dtype) else 'DATE'})"


def key_values(schema: pa.Schema, keys: Sequence[str], key: Any) -> list[tuple[str, Any]]:
    """Pair each key column with the caller's value for it (shape only, no conversion).

    Raises
    ------
    InvalidInputError, SchemaMismatchError
        No key, the wrong number of values, a dict lacking a column.
    """
    if not keys:
        raise InvalidInputError("point lookups need a primary key, and the table has none")
    if isinstance(key, Mapping):
        missing = [k for k in keys if k not in key]
        if missing:
            raise SchemaMismatchError(f"the key lacks column {missing[0]!r}", field=missing[0])
        return [(k, key[k]) for k in keys]
    if isinstance(key, (tuple, list)):
        if len(key) != len(keys):
            raise InvalidInputError(f"the primary key has {len(keys)} column(s): {keys}")
        return list(zip(keys, key, strict=True))
    if len(keys) != 1:
        raise InvalidInputError(f"the primary key is composite {keys}: pass a dict or a tuple")
    return [(keys[0], key)]


def key_filter(schema: pa.Schema, keys: Sequence[str], key: Any) -> str:
    """A Lance SQL filter selecting one primary key (values quoted safely).

    Raises
    ------
    InvalidInputError
        A key of the wrong shape, or a value :func:`key_value` refuses.
    """
    return " AND ".join(
        f"`{name}` = {sql_literal(value, schema.field(name))}"
        for name, value in key_values(schema, keys, key)
    )


def key_array(schema: pa.Schema, keys: Sequence[str], key: Any) -> pa.Array:
    """One primary key as a one-element array (a struct array for composite keys).

    Raises
    ------
    InvalidInputError
        A key of the wrong shape, or a value :func:`key_value` refuses.
    """
    pairs = [
        (name, key_value(value, schema.field(name)))
        for name, value in key_values(schema, keys, key)
    ]
    try:
        arrays = [pa.array([value], type=schema.field(name).type) for name, value in pairs]
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise InvalidInputError(f"key {key!r} does not fit the key type: {exc}") from exc
    if len(arrays) == 1:
        return arrays[0]
    return pa.StructArray.from_arrays(arrays, names=[n for n, _ in pairs])


def key_columns(schema: pa.Schema, keys: Sequence[str], values: Any) -> list[pa.Array]:
    """Primary-key values as one array per key column (checked against the key types).

    Parameters
    ----------
    values : sequence of keys, pa.Table, pa.RecordBatch, mapping of columns, or pa.Array
        Keys as ``LsmReader.point_lookups`` takes them (scalars, or
        dicts / tuples for composite keys), or the key columns themselves.

    Raises
    ------
    InvalidInputError
        A key of the wrong shape or type.
    SchemaMismatchError
        Key columns missing.
    """
    fields = [schema.field(k) for k in keys]
    if isinstance(values, Mapping) and all(k in values for k in keys):
        values = pa.table({k: values[k] for k in keys})
    if isinstance(values, (pa.Array, pa.ChunkedArray)) and len(keys) == 1:
        values = pa.table({keys[0]: values})
    if isinstance(values, (pa.Table, pa.RecordBatch)):
        missing = [k for k in keys if k not in values.schema.names]
        if missing:
            raise SchemaMismatchError(f"the keys lack column {missing[0]!r}", field=missing[0])
        out = []
        for f in fields:
            col = values.column(f.name)
            col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            if col.null_count:
                raise InvalidInputError("a primary-key value cannot be null")
            try:
                out.append(col if col.type == f.type else col.cast(f.type, safe=True))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidInputError(f"keys do not fit {f.name!r} ({f.type}): {exc}") from exc
        return out
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidInputError("pass a sequence of keys (or the key columns as a table)")
    arrays = []
    for value in values:
        key_filter(schema, keys, value)  # the strict literal rules (no bool for an int...)
        arrays.append(key_array(schema, keys, value))
    if not arrays:
        return [pa.array([], f.type) for f in fields]
    merged = pa.concat_arrays(arrays)
    if len(keys) == 1:
        return [merged]
    return [merged.field(i) for i in range(len(keys))]


def keys_filter(schema: pa.Schema, keys: Sequence[str], probe: Sequence[pa.Array]) -> str:
    """A Lance SQL filter that matches exactly the given keys (does not block).

    ``probe`` holds the key columns (one array per key column, m rows): one
    ``IN`` list for a single-column key, an ``OR`` of ``AND``s otherwise.
    Values are checked as :func:`key_value` checks them.
    """
    if len(keys) == 1:
        field = schema.field(keys[0])
        literals = sorted({sql_literal(v, field) for v in probe[0].to_pylist()})
        return f"`{keys[0]}` IN ({', '.join(literals)})"
    rows = zip(*(c.to_pylist() for c in probe), strict=True)
    return " OR ".join(
        "("
        + " AND ".join(
            f"`{k}` = {sql_literal(v, schema.field(k))}" for k, v in zip(keys, row, strict=True)
        )
        + ")"
        for row in sorted(set(rows), key=repr)
    )
