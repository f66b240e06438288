"""Row filters (Lance SQL) checked to be exactly one expression, on every read path.

pylance parses a filter as ``SELECT 1 FROM t WHERE <filter>`` and ignores
whatever follows the first complete expression: ``id < 3; DROP TABLE x``,
``id < 3 foo`` and ``id < 3) OR (1 = 1`` all scan ``id < 3``, while the LSM
scanner refuses some of them. :func:`check_filter` gives every path the same
rule: the text must be one expression, so it is refused when it holds a
statement separator, a comment or unbalanced parentheses (outside string
literals and quoted identifiers), and it is handed to the engine wrapped in
parentheses, so anything left inside them after a complete expression is a
parse error instead of being dropped.
"""

from __future__ import annotations

import re
from typing import TypeVar

from .errors import FilterError

T = TypeVar("T")

__all__ = [
    "DECIMAL_FLOAT",
    "DECIMAL_INT",
    "LEVEL_LOCAL_COLUMNS",
    "MAX_FILTER_LENGTH",
    "check_filter",
    "check_lsm_filter",
    "sql_int",
]

#: Characters a filter may hold.
MAX_FILTER_LENGTH = 16_384

_CLOSERS = {"'": "'", '"': '"', "`": "`"}


#: An integer as clients write one in a query string: ASCII digits only (``\\d``
#: and ``int()`` take other scripts' digits, ``int("٣")`` is 3).
DECIMAL_INT = re.compile(r"[+-]?[0-9]{1,20}")

#: A decimal number in ASCII (``float()`` also takes ``1_000`` and other
#: scripts' digits).
DECIMAL_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def sql_int(value: int) -> str:
    """An integer as a Lance SQL literal that the engine reads back exactly.

    pylance parses ``-9223372036854775808`` (the smallest int64) as the
    negation of ``9223372036854775808``, which does not fit an int64, so it
    becomes a float64 and no longer compares equal to any int64 column
    ("could not convert to literal of type 'Int64'"). That one value is
    written as ``(-9223372036854775807 - 1)``; every other int is its digits.
    """
    if value == -(2**63):
        return "(-9223372036854775807 - 1)"
    return str(value)


def check_filter(filter: T) -> T:
    """Check that ``filter`` is one Lance SQL expression; return it ready for the engine.

    Parameters
    ----------
    filter : str, None or pyarrow.compute.Expression
        A Lance SQL boolean expression (``id < 3 AND name = 'x'``); None and
        Arrow expressions (which pylance also takes) pass through unchanged.

    Returns
    -------
    str, None or pyarrow.compute.Expression
        ``(filter)`` for a string.

    Raises
    ------
    FilterError
        Empty, longer than :data:`MAX_FILTER_LENGTH`, or not
        one expression: a ``;``, a ``--`` or ``/*`` comment, or a parenthesis
        without its pair outside quotes, or an unterminated quote. (The
        engine then refuses what does not parse as one expression:
        :class:`~lance_async.errors.InvalidInputError`.)

    Notes
    -----
    Pure and fast (one pass over the text); does not block.
    """
    if not isinstance(filter, str):
        return filter
    if not filter.strip():
        raise FilterError("the filter is empty: pass None for no filter", filter=filter)
    if len(filter) > MAX_FILTER_LENGTH:
        raise FilterError(
            f"the filter is {len(filter):,} characters; at most {MAX_FILTER_LENGTH:,}",
            filter=filter,
        )
    depth = 0
    quote: str | None = None
    i = 0
    n = len(filter)
    while i < n:
        ch = filter[i]
        if quote is not None:
            if ch == quote:
                if i + 1 < n and filter[i + 1] == quote:
                    i += 1  # a doubled quote stays inside
                else:
                    quote = None
        elif ch in _CLOSERS:
            quote = ch
        elif ch == ";":
            raise FilterError(
                "a filter is one expression: ';' (a second statement) is not allowed",
                filter=filter,
            )
        elif filter.startswith(("--", "/*"), i):
            raise FilterError("comments are not allowed in filters", filter=filter)
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise FilterError(
                    "a filter is one expression: ')' closes no '(' (text after the "
                    "expression is not allowed)",
                    filter=filter,
                )
        i += 1
    if quote is not None:
        raise FilterError(f"the filter has an unterminated {quote} quote", filter=filter)
    if depth:
        raise FilterError("the filter has a '(' without its ')'", filter=filter)
    return f"({filter})"  # type: ignore[return-value]  # a str in, a str out


#: Lance's system columns whose values belong to one dataset: each flushed
#: generation (and the in-memory dataset of a WAL tail) numbers its rows
#: from 0 again, so across the LSM levels they name no row of the table.
LEVEL_LOCAL_COLUMNS = (
    "_rowid",
    "_rowaddr",
    "_rowoffset",
    "_row_created_at_version",
    "_row_last_updated_at_version",
)
_LEVEL_LOCAL = re.compile(
    r"(?<![A-Za-z0-9_$])(" + "|".join(LEVEL_LOCAL_COLUMNS) + r")(?![A-Za-z0-9_$])",
    re.IGNORECASE,
)
_STRING_LITERAL = re.compile(r"'(?:[^']|'')*'")


def check_lsm_filter(filter: T) -> T:
    """:func:`check_filter`, and refuse a filter an LSM read cannot mean.

    A filter naming a row id or row address (``_rowid``, ``_rowaddr``, any
    of :data:`LEVEL_LOCAL_COLUMNS`, quoted or not, outside string literals)
    would be evaluated on each level's own numbering and keep rows of newer
    levels whose local id happens to match (LanceDB refuses a take by row
    id through its LSM scanner for the same reason). Read base rows by row
    id with a plain read (``ds.to_table(filter="_rowid IN (...)")``).

    Raises
    ------
    FilterError
        As :func:`check_filter`, or a row-id column named (does not block).
    """
    checked = check_filter(filter)
    if checked is None:
        return checked
    text = _STRING_LITERAL.sub("''", str(checked))
    found = _LEVEL_LOCAL.search(text.replace('"', " ").replace("`", " "))
    if found:
        raise FilterError(
            f"an LSM read cannot filter on {found.group(1)}: a row id or address names a "
            "row of one level (each generation numbers its rows from 0), not of the "
            "table; filter base rows by row id with a plain read (use_lsm=False), or "
            "filter on the primary key",
            filter=str(filter),
        )
    return checked
