"""Row filters from query strings: :func:`compile_filter`.

Only comparisons ``column <op> literal``, combined with ``AND``, ``OR``,
``NOT`` and parentheses, each literal parsed against its column's type and
quoted safely, unless the app enables raw Lance SQL for trusted clients
(``lance-async serve --allow-raw-sql``). Repeated ``filter`` parameters must
all hold (AND). The expression is parsed here (a small recursive descent
over tokens) and the SQL is rendered from the parse, never copied from the
query string.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence

import pyarrow as pa

from .._filters import DECIMAL_FLOAT, DECIMAL_INT, sql_int
from ..errors import FilterError

__all__ = ["MAX_COMPARISONS", "MAX_FILTERS", "MAX_FILTER_CHARS", "compile_filter"]

MAX_FILTERS = 16
MAX_FILTER_CHARS = 1024
_FILTER_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|<>|<=|>=|=|<|>)\s*(.*?)\s*", re.S)
_TOKEN = re.compile(
    r"""\s*(?:(?P<paren>[()])|(?P<op>==|!=|<>|<=|>=|=|<|>)"""
    r"""|(?P<quoted>'(?:[^']|'')*'?|"(?:[^"]|"")*"?)|(?P<word>[^\s()=!<>'"]+))""",
    re.S,
)
_COMBINED = re.compile(r"[()]|\b(?:and|or|not)\b", re.I)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORDS = ("AND", "OR", "NOT")
#: Comparisons and nesting one filter may hold at most.
MAX_COMPARISONS = 64
MAX_DEPTH = 16
_FORM = (
    "comparisons `column <op> value` (op: = != < <= > >=) joined by AND, OR, NOT and "
    "parentheses; raw SQL is not enabled on this server (start it with --allow-raw-sql, "
    "for trusted clients only)"
)
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


class _Parser:
    """``expr := or; or := and (OR and)*; and := not (AND not)*;
    not := NOT not | '(' or ')' | column op literal`` over one filter's tokens."""

    def __init__(self, raw: str, schema: pa.Schema) -> None:
        self.raw = raw
        self.schema = schema
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = raw.rstrip()
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                raise self.error()
            kind = match.lastgroup or "word"
            self.tokens.append((kind, match.group(kind)))
            pos = match.end()
        self.at = 0
        self.comparisons = 0

    def error(self, why: str = "") -> FilterError:
        reason = f" ({why})" if why else ""
        return FilterError(f"filter {self.raw[:200]!r} is not {_FORM}{reason}", filter=self.raw)

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def keyword(self, word: str) -> bool:
        token = self.peek()
        if token is not None and token[0] == "word" and token[1].upper() == word:
            self.at += 1
            return True
        return False

    def parse(self) -> tuple[str, bool]:
        """(SQL, whether it is more than one comparison)."""
        if not self.tokens:
            raise self.error("it is empty")
        sql, compound = self.or_(0)
        if self.peek() is not None:
            raise self.error(f"unexpected {self.peek()[1][:40]!r}")  # type: ignore[index]
        return sql, compound

    def or_(self, depth: int) -> tuple[str, bool]:
        parts = [self.and_(depth)]
        while self.keyword("OR"):
            parts.append(self.and_(depth))
        return self.join(parts, "OR")

    def and_(self, depth: int) -> tuple[str, bool]:
        parts = [self.not_(depth)]
        while self.keyword("AND"):
            parts.append(self.not_(depth))
        return self.join(parts, "AND")

    @staticmethod
    def join(parts: list[tuple[str, bool]], op: str) -> tuple[str, bool]:
        if len(parts) == 1:
            return parts[0]
        return f" {op} ".join(f"({sql})" if compound else sql for sql, compound in parts), True

    def not_(self, depth: int) -> tuple[str, bool]:
        if depth > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH}")
        if self.keyword("NOT"):
            sql, _ = self.not_(depth + 1)
            return f"NOT ({sql})", True
        token = self.peek()
        if token == ("paren", "("):
            self.at += 1
            sql, compound = self.or_(depth + 1)
            if self.peek() != ("paren", ")"):
                raise self.error("a parenthesis is not closed")
            self.at += 1
            return sql, compound
        return self.comparison(), False

    def comparison(self) -> str:
        tokens = self.tokens[self.at : self.at + 3]
        if len(tokens) < 3 or tokens[0][0] != "word" or tokens[1][0] != "op":
            raise self.error()
        (_, column), (_, op), (kind, text) = tokens
        if not _IDENT.fullmatch(column) or column.upper() in _KEYWORDS:
            raise self.error(f"{column[:40]!r} is not a column name")
        if kind not in ("word", "quoted") or (kind == "word" and text.upper() in _KEYWORDS):
            raise self.error(f"no value after {column} {op}")
        self.at += 3
        self.comparisons += 1
        if self.comparisons > MAX_COMPARISONS:
            raise self.error(f"more than {MAX_COMPARISONS} comparisons")
        return _comparison(column, op, text, self.schema, self.raw)


def _comparison(column: str, op: str, text: str, schema: pa.Schema, raw: str) -> str:
    if column not in schema.names:
        raise FilterError(
            f"unknown column {column!r} in filter (columns: {schema.names})", filter=raw
        )
    literal = _literal(text, schema.field(column), raw)
    return f"`{column}` {_OPERATORS[op]} {literal}"


def _one(raw: str, schema: pa.Schema) -> tuple[str, bool]:
    """One filter as SQL, and whether it is more than one comparison."""
    try:
        return _Parser(raw, schema).parse()
    except FilterError as exc:
        # one comparison whose bare value holds spaces (name = John Smith), as before
        match = _FILTER_RE.fullmatch(raw)
        if match is None or exc.args[0].startswith("unknown column") or _COMBINED.search(raw):
            raise
        column, op, text = match.groups()
        return _comparison(column, op, text, schema, raw), False


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
        Each one a comparison ``column <op> literal`` (``op`` in ``= == != <>
        < <= > >=``) or comparisons combined with ``AND``, ``OR``, ``NOT``
        and parentheses (``(a = 1 OR b < 2) AND NOT c = 'x'``); all the
        filters must hold (AND). String literals may be quoted (``'O''Brien'``
        or ``"x"``) or bare (a bare value with spaces only in a filter of one
        comparison); numbers, ``true`` / ``false``, ISO dates and timestamps
        are checked against the column's type.
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
        Too many or too long filters, a filter not in the allowed form (the
        message names ``--allow-raw-sql``), an unknown column or a literal
        that does not fit its column (HTTP 400).

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
        sql, compound = _one(raw, schema)
        clauses.append(f"({sql})" if compound and len(items) > 1 else sql)
    return " AND ".join(clauses)
