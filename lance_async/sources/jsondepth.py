"""JSON nesting measured before any parser that recurses.

pyarrow's JSON reader with inferred types recurses and crashes the process
(SIGSEGV) from about 7,000 levels of nesting; Python's ``json`` raises an
untyped ``RecursionError`` from about 1,000. lance_async measures the depth
of arrays and objects in the raw bytes first (numpy over the bytes: brackets
outside strings, escapes honoured) and refuses input deeper than
:data:`MAX_JSON_DEPTH` with a line-numbered
:class:`~lance_async.errors.DecodeError`. Pure; does not block beyond the
numpy pass over the bytes.
"""

from __future__ import annotations

import numpy as np

from ..errors import DecodeError

__all__ = ["MAX_JSON_DEPTH", "LineError", "check_json_depth", "json_depth"]


class LineError(DecodeError):
    """Internal: a decode error whose message names its line already."""


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


def _depths(data: bytes | bytearray) -> tuple[np.ndarray, np.ndarray]:
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


def json_depth(data: bytes | bytearray) -> int:
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


def check_json_depth(
    data: bytes | bytearray, *, first_line: int = 1, max_depth: int = MAX_JSON_DEPTH
) -> None:
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
        raise LineError(
            f"line {line}: JSON nested deeper than {max_depth} levels; nothing was decoded"
        )
