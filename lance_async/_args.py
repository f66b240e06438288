"""Argument checks: one rule for arguments that are wrong in themselves.

lance_async raises :class:`TypeError` for an argument of the wrong type and
:class:`ValueError` for one of the right type whose value no call could
accept (a negative limit, ``k=0``, an unknown mode), at the call, before any
I/O, as Python's own functions do. :class:`~lance_async.errors.InvalidInputError`
is kept for *data* the table refuses: rows, keys and filters whose fitness
depends on the table (see ``errors.py``). ``tests/test_arguments.py`` walks
the bad-argument cases of every public call.

Everything here is pure and does not block.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pyarrow as pa

__all__ = [
    "check_batches",
    "check_choice",
    "check_columns",
    "check_fetch",
    "check_int",
    "check_knn",
    "check_seconds",
    "check_timedelta",
]

T = TypeVar("T")


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` as an int, or the error a bad one deserves.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    value : object
        What the caller passed; ``bool`` is refused (``True`` is no count).
    minimum : int, optional
        The smallest value accepted.

    Returns
    -------
    int

    Raises
    ------
    TypeError
        ``value`` is not an integer (or is a bool).
    ValueError
        ``value`` is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """A duration in seconds: a finite real number >= 0 (> 0 with ``positive``).

    Raises
    ------
    TypeError
        Not a real number (or a bool).
    ValueError
        Negative (zero with ``positive``), infinite or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value}")
    return seconds


def check_timedelta(name: str, value: object) -> timedelta:
    """A ``datetime.timedelta`` that is not negative.

    Raises
    ------
    TypeError
        Not a timedelta.
    ValueError
        Negative.
    """
    if not isinstance(value, timedelta):
        raise TypeError(f"{name} must be a datetime.timedelta, got {type(value).__name__}")
    if value < timedelta(0):
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


def check_choice(name: str, value: T, choices: Collection[T]) -> T:
    """``value`` if it is one of ``choices``.

    Raises
    ------
    ValueError
        Any other value (the message lists the choices).
    """
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}; got {value!r}")
    return value


def check_fetch(max_messages: object, timeout: object) -> tuple[int, float]:
    """The arguments of a feed's ``fetch``: ``max_messages`` >= 1 and a
    ``timeout`` of seconds >= 0.

    Raises
    ------
    TypeError, ValueError
        As :func:`check_int` and :func:`check_seconds`.
    """
    return check_int("max_messages", max_messages, minimum=1), check_seconds("timeout", timeout)


def check_columns(columns: T) -> T:
    """A list of column names, or None; one string is a :class:`TypeError`
    (it would be read as a list of one-letter columns)."""
    if isinstance(columns, str):
        raise TypeError("columns must be a list of column names, not a string")
    return columns


def check_knn(options: dict[str, object]) -> None:
    """The arguments of an LSM vector search (``k``, ``nprobes``,
    ``refine_factor``, ``metric``, ``columns``), as keywords.

    Raises
    ------
    TypeError, ValueError
        ``k``, ``nprobes`` or ``refine_factor`` below 1, an unknown metric,
        ``columns`` given as one string.
    """
    for name in ("k", "nprobes", "refine_factor"):
        if options.get(name) is not None:
            check_int(name, options[name], minimum=1)
    if "metric" in options:
        check_choice("metric", options["metric"], ("l2", "cosine", "dot"))
    check_columns(options.get("columns"))


def check_batches(name: str, batches: Iterable[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``batches`` as a list of record batches, or a :class:`TypeError`.

    ``send_many``'s argument: an iterable of ``pyarrow.RecordBatch`` (not
    tables, dicts or readers, which :meth:`send` takes). Drains the iterable.
    """
    import pyarrow as pa

    if isinstance(batches, (str, bytes, pa.RecordBatch, pa.Table)):
        raise TypeError(
            f"{name} takes an iterable of pyarrow.RecordBatch, got {type(batches).__name__}"
        )
    out = list(batches)
    for i, batch in enumerate(out):
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(
                f"{name} takes pyarrow.RecordBatch items; item {i} is a {type(batch).__name__}"
                " (send() takes tables and other sources)"
            )
    return out
