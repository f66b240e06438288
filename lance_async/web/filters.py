"""Row filters from query strings: :func:`compile_filter`.

Only ``column <op> literal`` clauses (joined with AND), with each literal
parsed against its column's type and quoted safely, unless the app enables
raw Lance SQL for trusted clients.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence

import pyarrow as pa

from .._filters import DECIMAL_FLOAT, DECIMAL_INT, sql_int
from ..errors import FilterError

__all__ = ["MAX_FILTERS", "MAX_FILTER_CHARS", "compile_filter"]

MAX_FILTERS = 16
MAX_FILTER_CHARS = 1024
_FILTER_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|<>|<=|>=|=|<|>)\s*(.*?)\s*", re.S)
_OPERATORS = {
    "=": "=",
    "==": "=",
    "!=": "!=",
    "<>": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}


def _unquote(text: str, raw: str) -> str:
    if text[:1] in ("'", '"'):
        quote = text[0]
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != quote or quote in inner.replace(quote * 2, ""):
            raise FilterError(f"unterminated or badly quoted string in {raw!r}", filter=raw)
        text = inner.replace(quote * 2, quote)
    if "\x00" in text:
        raise FilterError("a filter literal cannot hold NUL characters", filter=raw)
    return text


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _literal(text: str, field: pa.Field, raw: str) -> str:
    dtype = field.type
    if not text:
        raise FilterError(f"the filter {raw!r} has no value", filter=raw)
    if pa.types.is_integer(dtype):
        if not DECIMAL_INT.fullmatch(text):
            raise FilterError(f"{field.name!r} is {dtype}: {text[:40]!r} is not one", filter=raw)
        value = int(text)
        bits = dtype.bit_width
        low, high = (
            (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
            if pa.types.is_signed_integer(dtype)
            else (0, (1 << bits) - 1)
        )
        if not low <= value <= high:
            raise FilterError(f"{value} is out of range for {field.name!r} ({dtype})", filter=raw)
        return sql_int(value)
    if pa.types.is_floating(dtype):
        try:
            if not DECIMAL_FLOAT.fullmatch(text) and text.lower().lstrip("+-") not in (
                "inf",
                "infinity",
                "nan",
            ):
                raise ValueError(text)
            number = float(text)
        except ValueError:
            raise FilterError(
                f"{field.name!r} is {dtype}: {text[:40]!r} is not a number", filter=raw
            ) from None
        if number != number or number in (float("inf"), float("-inf")):
            raise FilterError("filter numbers must be finite", filter=raw)
        return repr(number)
    if pa.types.is_boolean(dtype):
        if text.lower() not in ("true", "false"):
            raise FilterError(f"{field.name!r} is boolean: use true or false", filter=raw)
        return text.upper()
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return _sql_string(_unquote(text, raw))
    if pa.types.is_date(dtype):
        try:
            day = datetime.date.fromisoformat(_unquote(text, raw))
        except ValueError:
            raise FilterError(f"{field.name!r} is a date: use YYYY-MM-DD", filter=raw) from None
        return f"CAST('{day.isoformat()}' AS DATE)"
    if pa.types.is_timestamp(dtype):
        try:
            moment = datetime.datetime.fromisoformat(_unquote(text, raw))
        except ValueError:
            raise FilterError(f"{field.name!r} is a timestamp: use ISO 8601", filter=raw) from None
        return f"CAST('{moment.replace(tzinfo=None).isoformat(sep=' ')}' AS TIMESTAMP)"
    raise FilterError(
        f"filters on {field.name!r} ({dtype}) are not supported in the allowed form", filter=raw
    )


def compile_filter(
    filters: str | Sequence[str] | None,
    schema: pa.Schema,
    *,
    allow_raw_sql: bool = False,
) -> str | None:
    """Turn client filters into one Lance SQL filter that is safe to run.

    Parameters
    ----------
    filters : str or list of str or None
        Each one ``column <op> literal``, with ``op`` in ``= == != <> < <= >
        >=``; all of them must hold (AND). String literals may be quoted
        (``'O''Brien'`` or ``"x"``) or bare; numbers, ``true`` / ``false``,
        ISO dates and timestamps are checked against the column's type.
    schema : pa.Schema
        The table's schema (columns must exist in it).
    allow_raw_sql : bool
        Accept any Lance SQL expression instead (each wrapped in parentheses
        and joined with AND). Only for trusted clients.

    Returns
    -------
    str or None
        The SQL (identifiers backquoted, literals re-rendered from their
        parsed values), or None when there is no filter.

    Raises
    ------
    FilterError
        Too many or too long filters, a filter not in the allowed form, an
        unknown column or a literal that does not fit its column (HTTP 400).

    Notes
    -----
    Pure and fast; does not block.
    """
    items = [filters] if isinstance(filters, str) else list(filters or [])
    items = [f for f in items if f.strip()]
    if not items:
        return None
    if len(items) > MAX_FILTERS:
        raise FilterError(f"at most {MAX_FILTERS} filters are accepted, got {len(items)}")
    for raw in items:
        if len(raw) > MAX_FILTER_CHARS:
            raise FilterError(f"a filter may hold at most {MAX_FILTER_CHARS} characters")
    if allow_raw_sql:
        return " AND ".join(f"({raw})" for raw in items)
    clauses = []
    for raw in items:
        match = _FILTER_RE.fullmatch(raw)
        if match is None:
            raise FilterError(
                f"filter {raw[:200]!r} is not of the form `column <op> value` "
                "(op: = != < <= > >=); raw SQL is not enabled on this server",
                filter=raw,
            )
        column, op, text = match.groups()
        if column not in schema.names:
            raise FilterError(
                f"unknown column {column!r} in filter (columns: {schema.names})", filter=raw
            )
        literal = _literal(text, schema.field(column), raw)
        clauses.append(f"`{column}` {_OPERATORS[op]} {literal}")
    return " AND ".join(clauses)
