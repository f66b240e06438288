"""The engine's memory pool and spill space, sized from lance_async.

pylance runs merges, index builds and sorts as DataFusion plans whose
working memory comes from one pool per execution, sized by the
``LANCE_MEM_POOL_SIZE`` environment variable (bytes; the engine's default is
a little over 100 MiB per partition), with spills bounded by
``LANCE_MAX_TEMP_DIRECTORY_SIZE`` (bytes; default 100 GiB). The engine reads
both when it plans each operation, so setting them at run time takes effect
from the next engine call. A plan that needs more than its pool and cannot
spill -- a hash join on a BTREE-indexed key, for example -- fails with
"Resources exhausted", which lance_async raises as
:class:`~lance_async.errors.ResourceExhaustedError`, advice included.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

__all__ = ["MemoryLimits", "configure_memory", "memory_limits"]

POOL_ENV: Final = "LANCE_MEM_POOL_SIZE"
TEMP_ENV: Final = "LANCE_MAX_TEMP_DIRECTORY_SIZE"


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()
"""Leave a setting as it is (the default of :func:`configure_memory`)."""


@dataclass(frozen=True)
class MemoryLimits:
    """The engine's memory settings for this process.

    Attributes
    ----------
    pool_bytes : int or None
        Memory pool of each engine execution, in bytes (None: the engine's
        default, a little over 100 MiB per partition).
    max_temp_directory_bytes : int or None
        Spill space an execution may use, in bytes (None: the engine's
        default, 100 GiB).
    """

    pool_bytes: int | None
    max_temp_directory_bytes: int | None


def _read(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def memory_limits() -> MemoryLimits:
    """The engine's memory settings now (read from the environment; does not block)."""
    return MemoryLimits(_read(POOL_ENV), _read(TEMP_ENV))


def _apply(name: str, value: int | _Keep | None, what: str) -> None:
    if isinstance(value, _Keep):
        return
    if value is None:
        os.environ.pop(name, None)
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive number of bytes or None, got {value!r}")
    os.environ[name] = str(value)


def configure_memory(
    *,
    pool_bytes: int | _Keep | None = KEEP,
    max_temp_directory_bytes: int | _Keep | None = KEEP,
) -> MemoryLimits:
    """Size the engine's memory pool and spill space for this process.

    Parameters
    ----------
    pool_bytes : int or None, optional
        Bytes of working memory each engine execution (a merge, an index
        build) may hold before it spills or, where it cannot spill, fails
        with :class:`~lance_async.errors.ResourceExhaustedError`. None
        restores the engine's default; omitted leaves it as it is.
    max_temp_directory_bytes : int or None, optional
        Bytes of temporary files an execution may spill (None: the engine's
        default, 100 GiB; omitted: unchanged).

    Returns
    -------
    MemoryLimits
        The settings now in force.

    Raises
    ------
    ValueError
        A size that is not a positive integer.

    Notes
    -----
    Process-wide: the engine reads ``LANCE_MEM_POOL_SIZE`` and
    ``LANCE_MAX_TEMP_DIRECTORY_SIZE`` from the environment when it plans each
    operation, and this sets them; it takes effect from the next engine call
    (calls in flight keep their pool). Setting the variables before the
    process starts does the same. Does not block.
    """
    _apply(POOL_ENV, pool_bytes, "pool_bytes")
    _apply(TEMP_ENV, max_temp_directory_bytes, "max_temp_directory_bytes")
    return memory_limits()
