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
from collections.abc import Collection, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pyarrow as pa

__all__ = [
    "BATCH_SIZE_MAX",
    "INT64_MAX",
    "KNN_MAX_CANDIDATES",
    "KNN_MAX_K",
    "check_batch_size",
    "check_batches",
    "check_choice",
    "check_columns",
    "check_distance_range",
    "check_fetch",
    "check_flag",
    "check_int",
    "check_knn",
    "check_seconds",
    "check_timedelta",
]

T = TypeVar("T")

#: The largest count, offset, version or size any call takes: the engine
#: holds them in 64-bit integers, and a larger Python int would reach it as
#: an ``OverflowError`` (or wrap around).
INT64_MAX = 2**63 - 1

#: The largest ``batch_size`` the engine takes (it holds it in 32 bits).
BATCH_SIZE_MAX = 2**32 - 1


def check_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int = INT64_MAX
) -> int:
    """``value`` as an int, or the error a bad one deserves.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    value : object
        What the caller passed; ``bool`` is refused (``True`` is no count).
    minimum : int, optional
        The smallest value accepted.
    maximum : int, optional
        The largest value accepted; by default the largest int64
        (:data:`INT64_MAX`), so that no value reaches the engine as an
        ``OverflowError``.

    Returns
    -------
    int

    Raises
    ------
    TypeError
        ``value`` is not an integer (or is a bool).
    ValueError
        ``value`` is below ``minimum`` or above ``maximum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    if number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return number


def check_batch_size(name: str, value: object) -> int:
    """A ``batch_size``: an int from 1 to :data:`BATCH_SIZE_MAX` (what the engine takes).

    Raises
    ------
    TypeError, ValueError
        As :func:`check_int`.
    """
    return check_int(name, value, minimum=1, maximum=BATCH_SIZE_MAX)


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


#: The largest ``k`` of a nearest-neighbour search. The engine allocates room
#: for ``k`` (times ``refine_factor``) candidates up front: ``k=2**32`` aborts
#: the process with a failed allocation instead of raising.
KNN_MAX_K = 1_000_000

#: The most candidates (``k * refine_factor``) a search may ask the engine to
#: re-rank, for the same reason.
KNN_MAX_CANDIDATES = 10_000_000


def check_distance_range(value: object) -> tuple[float | None, float | None] | None:
    """A ``distance_range``: None, or ``(lower, upper)`` with each bound a real
    number or None (open), ``lower < upper`` -- the half-open range
    ``lower <= distance < upper`` of pylance's ``nearest["distance_range"]``
    and LanceDB's ``distance_range(lower_bound, upper_bound)``.

    Returns
    -------
    tuple of (float or None, float or None), or None
        None for no range (also for ``(None, None)``).

    Raises
    ------
    TypeError
        Not a tuple or list of two, or a bound that is not a real number
        (a bool is no distance).
    ValueError
        A NaN bound, ``lower >= upper`` (an empty range: nothing could be
        returned).
    """
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"distance_range must be a (lower, upper) pair, got {type(value).__name__}")
    bounds: list[float | None] = []
    for name, bound in zip(("lower", "upper"), value, strict=True):
        if bound is None:
            bounds.append(None)
            continue
        if isinstance(bound, bool) or not isinstance(bound, numbers.Real):
            raise TypeError(
                f"distance_range's {name} bound must be a number or None, "
                f"got {type(bound).__name__}"
            )
        if math.isnan(float(bound)):
            raise ValueError(f"distance_range's {name} bound is NaN")
        bounds.append(float(bound))
    lower, upper = bounds
    if lower is not None and upper is not None and lower >= upper:
        raise ValueError(
            f"distance_range ({lower}, {upper}) is empty: it keeps lower <= distance < upper"
        )
    if lower is None and upper is None:
        return None
    return lower, upper


def check_flag(name: str, value: object) -> bool:
    """A keyword flag: ``True`` or ``False`` only (``postfilter=1`` is a TypeError)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
    return value


def check_knn(options: Mapping[str, object]) -> None:
    """The arguments of a nearest-neighbour search (``k``, ``offset``,
    ``nprobes``, ``refine_factor``, ``overfetch_factor``, ``metric``,
    ``columns``, ``distance_range``, ``postfilter``, ``bypass_vector_index``),
    as keywords.

    ``k`` is at most :data:`KNN_MAX_K`, and so is ``k + offset`` (the rows
    ranked); ``(k + offset) * refine_factor`` (and ``* overfetch_factor``)
    at most :data:`KNN_MAX_CANDIDATES`; ``nprobes`` at most an int64;
    ``overfetch_factor`` a finite real number >= 1 (as pylance's
    ``LsmVectorSearchPlanner.plan_search`` wants); ``distance_range`` as
    :func:`check_distance_range`; the flags bools.

    Raises
    ------
    TypeError, ValueError
        ``k``, ``nprobes`` or ``refine_factor`` below 1 or above their
        bounds, a negative ``offset``, ``overfetch_factor`` not a number or
        below 1, an unknown metric, ``columns`` given as one string, a bad
        ``distance_range``, a flag that is not a bool.
    """
    k = 10
    if options.get("k") is not None:
        k = check_int("k", options["k"], minimum=1, maximum=KNN_MAX_K)
    if options.get("offset") is not None:
        skip = check_int("offset", options["offset"], minimum=0, maximum=KNN_MAX_K)
        if k + skip > KNN_MAX_K:
            raise ValueError(f"k + offset must be <= {KNN_MAX_K:,} rows, got {k} + {skip}")
        k += skip
    if options.get("nprobes") is not None:
        check_int("nprobes", options["nprobes"], minimum=1)
    if options.get("refine_factor") is not None:
        factor = check_int(
            "refine_factor", options["refine_factor"], minimum=1, maximum=KNN_MAX_CANDIDATES
        )
        if k * factor > KNN_MAX_CANDIDATES:
            raise ValueError(
                f"(k + offset) * refine_factor must be <= {KNN_MAX_CANDIDATES:,} candidates, "
                f"got {k} * {factor}"
            )
    if options.get("overfetch_factor") is not None:
        over = options["overfetch_factor"]
        if isinstance(over, bool) or not isinstance(over, numbers.Real):
            raise TypeError(f"overfetch_factor must be a number, got {type(over).__name__}")
        if not math.isfinite(float(over)) or float(over) < 1.0:
            raise ValueError(f"overfetch_factor must be a finite number >= 1.0, got {over}")
        if math.ceil(k * float(over)) > KNN_MAX_CANDIDATES:
            raise ValueError(
                f"(k + offset) * overfetch_factor must be <= {KNN_MAX_CANDIDATES:,} "
                f"candidates, got {k} * {over}"
            )
    if "metric" in options:
        check_choice("metric", options["metric"], ("l2", "cosine", "dot"))
    check_columns(options.get("columns"))
    check_distance_range(options.get("distance_range"))
    for flag in ("postfilter", "bypass_vector_index"):
        if flag in options:
            check_flag(flag, options[flag])


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
