"""Memory: the engine's pool and spill space, and lance_async's LSM read cache.

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

lance_async's own long-lived memory is the LSM readers' cache of flushed
generations (keys, row addresses, open datasets; ``lsm/cache.py``), bounded
by ``LANCE_ASYNC_LSM_CACHE_BYTES`` (bytes; default 256 MiB) and emptied of
each generation once it is compacted.

**Memory the allocators keep.** A long-lived MemWAL writer or LSM reader
frees much of what it allocates -- WAL entries once a flush covers them, a
memtable once flushed, generations once compacted -- from Python, from
pyarrow and from the engine's threads. glibc's malloc keeps freed memory in
per-thread arenas (up to 8 per core) and returns to the operating system
only the free top of each heap, so the process's resident size climbs long
after its live memory stopped growing (issue 37: a soak reader's RSS went
from 330 to 620 MB in 8 minutes with 45-75 MB allocated; 240 MB of it was
free memory inside glibc's arenas). So lance_async returns it
(:func:`release_memory`: pyarrow's pool ``release_unused()``, then glibc's
``malloc_trim(0)``, which gives back the free pages of every arena) after
such frees, at most once every ``LANCE_ASYNC_TRIM_SECONDS`` (default 10 s;
0 turns it off), on a thread of its own. ``LANCE_ASYNC_MALLOC_ARENA_MAX``
(or ``configure_memory(malloc_arena_max=...)``) caps glibc's arenas for the
threads that start afterwards, as the C library's own ``MALLOC_ARENA_MAX``
does from the process's start. It is jemalloc's and TCMalloc's background
release, done for glibc by the one call it offers.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

__all__ = [
    "MemoryLimits",
    "MemoryStats",
    "configure_memory",
    "lsm_cache_bytes",
    "memory_freed",
    "memory_limits",
    "memory_stats",
    "release_memory",
    "trim_seconds",
]

log = logging.getLogger("lance_async")

POOL_ENV: Final = "LANCE_MEM_POOL_SIZE"
TEMP_ENV: Final = "LANCE_MAX_TEMP_DIRECTORY_SIZE"
LSM_CACHE_ENV: Final = "LANCE_ASYNC_LSM_CACHE_BYTES"
LSM_CACHE_DEFAULT: Final = 256 << 20
"""The LSM read cache's budget when ``LANCE_ASYNC_LSM_CACHE_BYTES`` is not set (bytes)."""
TRIM_ENV: Final = "LANCE_ASYNC_TRIM_SECONDS"
TRIM_DEFAULT: Final = 10.0
"""Seconds between two returns of freed memory at most, when ``LANCE_ASYNC_TRIM_SECONDS``
is not set."""
ARENA_ENV: Final = "LANCE_ASYNC_MALLOC_ARENA_MAX"
_M_ARENA_MAX: Final = -8  # glibc's mallopt parameter (malloc.h)
_SETTLE: Final = 0.2  # seconds the trim thread waits, so the frees that woke it are done


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
    lsm_cache_bytes : int or None
        Budget of the LSM readers' cache of flushed generations, in bytes
        (None: the default, 256 MiB).
    trim_seconds : float or None
        Seconds between two returns of freed memory to the operating system
        at most (0: never; None: the default, 10 s).
    malloc_arena_max : int or None
        glibc's malloc arenas at most, as set through lance_async (None: not
        set here; the C library's own ``MALLOC_ARENA_MAX``, or 8 per core).
    """

    pool_bytes: int | None
    max_temp_directory_bytes: int | None
    lsm_cache_bytes: int | None = None
    trim_seconds: float | None = None
    malloc_arena_max: int | None = None


def _read(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _read_seconds(name: str) -> float | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def memory_limits() -> MemoryLimits:
    """The memory settings now (read from the environment; does not block)."""
    return MemoryLimits(
        _read(POOL_ENV),
        _read(TEMP_ENV),
        _read(LSM_CACHE_ENV),
        _read_seconds(TRIM_ENV),
        _read(ARENA_ENV),
    )


def trim_seconds() -> float:
    """Seconds between two automatic returns of freed memory at most (0: off;
    ``LANCE_ASYNC_TRIM_SECONDS``, else :data:`TRIM_DEFAULT`; does not block)."""
    value = _read_seconds(TRIM_ENV)
    return TRIM_DEFAULT if value is None else value


def lsm_cache_bytes() -> int:
    """The LSM read cache's budget in force, in bytes (does not block).

    ``LANCE_ASYNC_LSM_CACHE_BYTES`` when it holds a positive integer, else
    :data:`LSM_CACHE_DEFAULT` (256 MiB).
    """
    value = _read(LSM_CACHE_ENV)
    return value if value is not None and value > 0 else LSM_CACHE_DEFAULT


def _apply_seconds(value: float | _Keep | None) -> None:
    if isinstance(value, _Keep):
        return
    if value is None:
        os.environ.pop(TRIM_ENV, None)
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value >= 0
        or value == float("inf")
    ):
        raise ValueError(
            f"trim_seconds must be a finite number of seconds >= 0 or None, got {value!r}"
        )
    os.environ[TRIM_ENV] = repr(float(value))


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
    lsm_cache_bytes: int | _Keep | None = KEEP,
    trim_seconds: float | _Keep | None = KEEP,
    malloc_arena_max: int | _Keep | None = KEEP,
) -> MemoryLimits:
    """Size the engine's memory pool and spill space, and lance_async's LSM
    read cache, for this process.

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
    lsm_cache_bytes : int or None, optional
        Bytes the LSM reads of this process may keep of flushed generations
        (their keys, row addresses and open datasets, read once and reused
        by every lookup, scan and vector search): least recently used ones
        go past it, and each generation goes as soon as a view sees it
        compacted. Size it to hold every live generation of the tables read
        -- about 17 bytes a row for an integer key plus 64 KiB a
        generation (see ``docs/scale-out.md``); below that, reads load
        generations again. None: the default, 256 MiB; omitted: unchanged.
    trim_seconds : float or None, optional
        After lance_async frees memory (WAL entries a flush covered, a
        flushed memtable's mirror, compacted or evicted generations, a
        compaction's pass; and at each LSM read and engine put, as the
        previous ones' working memory is free by then),
        :func:`release_memory` runs on a thread of its
        own, at most once every this many seconds; 0 never (then call
        :func:`release_memory` yourself, or let RSS hold what the
        allocators keep). None: the default, 10 s; omitted: unchanged.
    malloc_arena_max : int or None, optional
        Cap glibc's malloc arenas (``mallopt(M_ARENA_MAX)``) for threads that
        start from now on: fewer arenas keep less free memory apart, at the
        cost of more contention between threads allocating at once (2 is
        the usual choice for a service). Kept in
        ``LANCE_ASYNC_MALLOC_ARENA_MAX``, which lance_async applies when it
        is imported; the C library's ``MALLOC_ARENA_MAX`` does the same from
        the process's start. None forgets the setting (arenas made stay);
        omitted: unchanged. Ignored where the C library is not glibc.

    Returns
    -------
    MemoryLimits
        The settings now in force.

    Raises
    ------
    ValueError
        A size that is not a positive integer, ``trim_seconds`` below 0 or
        not finite.

    Notes
    -----
    Process-wide: the engine reads ``LANCE_MEM_POOL_SIZE`` and
    ``LANCE_MAX_TEMP_DIRECTORY_SIZE`` from the environment when it plans each
    operation, and this sets them; it takes effect from the next engine call
    (calls in flight keep their pool). The LSM cache reads
    ``LANCE_ASYNC_LSM_CACHE_BYTES`` at each insertion, so a smaller budget
    applies from the next generation cached. Setting the variables before
    the process starts does the same. Does not block.
    """
    _apply(POOL_ENV, pool_bytes, "pool_bytes")
    _apply(TEMP_ENV, max_temp_directory_bytes, "max_temp_directory_bytes")
    _apply(LSM_CACHE_ENV, lsm_cache_bytes, "lsm_cache_bytes")
    _apply_seconds(trim_seconds)
    _apply(ARENA_ENV, malloc_arena_max, "malloc_arena_max")
    if isinstance(malloc_arena_max, int):
        _set_arena_max(malloc_arena_max)
    return memory_limits()


@cache
def _glibc() -> Any:
    """The C library when it is glibc (it has ``malloc_trim`` and ``mallopt``), else None."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        lib = ctypes.CDLL("libc.so.6")
        lib.malloc_trim.argtypes, lib.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        lib.mallopt.argtypes, lib.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


def _set_arena_max(arenas: int) -> None:
    lib = _glibc()
    if lib is not None:
        lib.mallopt(_M_ARENA_MAX, arenas)


@dataclass(frozen=True)
class MemoryStats:
    """What lance_async returned of freed memory so far in this process.

    Attributes
    ----------
    releases : int
        Calls of :func:`release_memory` (by hand and automatic).
    automatic : int
        Those started by lance_async after it freed memory.
    seconds : float
        Time spent in them, in seconds.
    """

    releases: int
    automatic: int
    seconds: float


class _Releaser:
    """Counts releases; starts one automatic release at a time, spaced by
    :func:`trim_seconds`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.releases = self.automatic = 0
        self.seconds = 0.0
        self.running = False
        self.last = -float("inf")  # time.monotonic() of the last automatic release

    def freed(self) -> None:
        interval = trim_seconds()
        if interval <= 0:
            return
        with self.lock:
            now = time.monotonic()
            if self.running or now - self.last < interval:
                return
            self.running, self.last = True, now
        try:
            threading.Thread(target=self._run, name="lance_async release", daemon=True).start()
        except RuntimeError:  # no new threads (interpreter shutting down)
            with self.lock:
                self.running = False

    def _run(self) -> None:
        try:
            time.sleep(_SETTLE)
            _release(automatic=True)
        except Exception as exc:  # only memory kept longer
            log.debug("lance_async: freed memory not returned: %s", exc)
        finally:
            with self.lock:
                self.running, self.last = False, time.monotonic()


_releaser = _Releaser()


def release_memory() -> bool:
    """Return memory freed in this process to the operating system now.

    Calls pyarrow's ``default_memory_pool().release_unused()`` and, where the
    C library is glibc, ``malloc_trim(0)``, which gives back the free pages
    of every malloc arena (not only the top of each heap, as ``free`` does).
    lance_async calls it by itself after it frees much memory (see
    ``configure_memory(trim_seconds=...)``); call it after work of your own
    that freed much.

    Returns
    -------
    bool
        True when glibc's trim ran (False elsewhere: only pyarrow's pool was
        asked).

    Notes
    -----
    Blocks for about 1-50 ms (it walks every arena under its lock, so other
    threads' allocations wait meanwhile); thread-safe. Live memory is never
    touched: only pages no allocation holds go back.
    """
    return _release(automatic=False)


def _release(automatic: bool) -> bool:
    import pyarrow as pa

    started = time.perf_counter()
    pa.default_memory_pool().release_unused()
    lib = _glibc()
    if lib is not None:
        lib.malloc_trim(0)
    with _releaser.lock:
        _releaser.releases += 1
        _releaser.automatic += int(automatic)
        _releaser.seconds += time.perf_counter() - started
    return lib is not None


def memory_freed() -> None:
    """lance_async just freed much memory: return it soon (does not block).

    Starts :func:`release_memory` on a thread of its own unless one runs or
    ran less than :func:`trim_seconds` ago (or that is 0).
    """
    _releaser.freed()


def memory_stats() -> MemoryStats:
    """What lance_async returned of freed memory so far (does not block)."""
    with _releaser.lock:
        return MemoryStats(_releaser.releases, _releaser.automatic, _releaser.seconds)


if (_arenas := _read(ARENA_ENV)) is not None and _arenas > 0:
    _set_arena_max(_arenas)
