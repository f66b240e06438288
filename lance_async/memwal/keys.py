"""Primary-key values given by callers, turned into engine filters and arrays.

A lookup key is a scalar (one key column), a dict or a tuple (composite
keys). Values are checked against the key column's type before anything
reaches the engine: a value that does not fit is an
:class:`~lance_async.errors.InvalidInputError`, never a lossy conversion.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from ..errors import InvalidInputError, SchemaMismatchError

__all__ = ["key_array", "key_filter", "key_values"]


def _sql_literal(value: Any, dtype: pa.DataType) -> str:
    if value is None:
        raise InvalidInputError("a primary-key value cannot be null")
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "'" + str(value).replace("'", "''") + "'"
    if pa.types.is_integer(dtype):
        try:
            if isinstance(value, (bool, str, bytes)) or int(value) != value:
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise InvalidInputError(f"key {value!r} is not an integer") from None
        return str(int(value))
    if pa.types.is_floating(dtype):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InvalidInputError(f"key {value!r} is not a number") from None
        if not math.isfinite(number):
            raise InvalidInputError(f"key {value!r} is not a finite number")
        return repr(number)
    if pa.types.is_boolean(dtype):
        return "true" if value else "false"
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype):
        scalar = pa.scalar(value, type=dtype)
        return f"CAST('{scalar}' AS {'TIMESTAMP' if pa.types.is_timestamp(dtype) else 'DATE'})"
    raise InvalidInputError(f"lookups by a {dtype} key are not supported")


def key_values(schema: pa.Schema, keys: Sequence[str], key: Any) -> list[tuple[str, Any]]:
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
    """A Lance SQL filter selecting one primary key (values quoted safely)."""
    return " AND ".join(
        f"`{name}` = {_sql_literal(value, schema.field(name).type)}"
        for name, value in key_values(schema, keys, key)
    )


def key_array(schema: pa.Schema, keys: Sequence[str], key: Any) -> pa.Array:
    pairs = key_values(schema, keys, key)
    if any(value is None for _, value in pairs):
        raise InvalidInputError("a primary-key value cannot be null")
    try:
        arrays = [pa.array([value], type=schema.field(name).type) for name, value in pairs]
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise InvalidInputError(f"key {key!r} does not fit the key type: {exc}") from exc
    if len(arrays) == 1:
        return arrays[0]
    return pa.StructArray.from_arrays(arrays, names=[n for n, _ in pairs])
