"""Views removed by a clean-up: correct rows or :class:`~lance_async.errors.ViewExpiredError`.

A view names files: a base version's data files, each shard's generation
folders, WAL entries after a position. A clean-up (``memwal/cleanup.py``)
keeps them for its retention after they stop being current; a read whose
view is older than that may find one gone. The engine then answers "Not
found" (an ``OSError`` or ``ArrowInvalid`` whose text says so, or
``FileNotFoundError`` from the filesystem): here that becomes
:class:`~lance_async.errors.ViewExpiredError`, never an empty level and
so never missing rows. Reads that opened the view themselves try once more
with a fresh one (``reader.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from .._faults import strip_engine_prefix
from ..errors import (
    DatasetNotFoundError,
    LanceAsyncError,
    StorageNotFoundError,
    ViewExpiredError,
)

__all__ = ["expired_views", "expiring", "is_not_found"]

_NOT_FOUND = ("Not found:", "was not found", "NotFound", "No such file or directory")


def is_not_found(exc: BaseException) -> bool:
    """True when ``exc`` says a file the read needs is not there."""
    if isinstance(exc, (FileNotFoundError, DatasetNotFoundError, StorageNotFoundError)):
        return True
    if isinstance(exc, LanceAsyncError):
        cause = exc.__cause__
        return cause is not None and not isinstance(cause, LanceAsyncError) and is_not_found(cause)
    if not isinstance(exc, (OSError, ValueError, RuntimeError, pa.ArrowException)):
        return False
    text = strip_engine_prefix(str(exc))
    return any(mark in text for mark in _NOT_FOUND)


def expired(exc: BaseException) -> ViewExpiredError:
    """The error a read gets for a file of its view that a clean-up removed."""
    error = ViewExpiredError(
        "a file this read's view needs was removed by a clean-up (the view is older than "
        f"the table's retention, or the table was removed): {strip_engine_prefix(str(exc))}. "
        "Read again from a fresh view (dataset.lsm reads without snapshots=, or snapshots taken "
        "now); to hold views longer, raise the retention (CompactionPolicy.retention, "
        "lance-async cleanup --retention)"
    )
    error.__cause__ = exc
    return error


@contextmanager
def expired_views() -> Iterator[None]:
    """Turn a "not found" inside into :class:`~lance_async.errors.ViewExpiredError`."""
    try:
        yield
    except ViewExpiredError:
        raise
    except (OSError, ValueError, RuntimeError, LanceAsyncError) as exc:
        if is_not_found(exc):
            raise expired(exc) from exc
        raise


def expiring(func: Callable[..., Iterator[Any]], *args: Any, **kwargs: Any) -> Iterator[Any]:
    """``func(*args, **kwargs)`` (a generator), its "not found" errors made
    :class:`~lance_async.errors.ViewExpiredError` (blocking, as ``func`` is)."""
    with expired_views():
        yield from func(*args, **kwargs)
