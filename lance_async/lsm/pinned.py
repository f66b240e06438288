"""What a point-in-time view needs beside the levels: its base version, and files gone.

A view (:class:`~lance_async.lsm.snapshots.LsmSnapshot`) reads the base
table at the version it pinned, kept checked out per process
(:func:`pinned_base`), and the generations and WAL entries it pinned. Those
files stay until a clean-up deletes them; a read that finds one gone fails
with :class:`~lance_async.errors.ViewExpiredError` (:func:`raise_expired`),
never with other rows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from .._engine_errors import map_engine_error
from ..errors import DatasetNotFoundError, StorageNotFoundError, ViewExpiredError

__all__ = ["expired", "pinned_base", "raise_expired"]

_bases: OrderedDict[tuple[str, int], Any] = OrderedDict()
_bases_lock = threading.Lock()


def pinned_base(ds: Any, uri: str, version: int) -> Any:
    """``ds`` checked out at ``version`` (blocking; kept per process: a pinned
    view reads the same version on every read)."""
    if int(ds.version) == version:
        return ds
    with _bases_lock:
        hit = _bases.get((uri, version))
        if hit is not None:
            _bases.move_to_end((uri, version))
            return hit
    base = ds.checkout_version(version)
    with _bases_lock:
        _bases[(uri, version)] = base
        while len(_bases) > _PINNED_BASES:
            _bases.popitem(last=False)
    return base


_PINNED_BASES = 8


def expired(exc: BaseException) -> bool:
    """True when ``exc`` says a file of a pinned view is gone (not found)."""
    if isinstance(exc, FileNotFoundError | DatasetNotFoundError | StorageNotFoundError):
        return True
    mapped = map_engine_error(exc) if isinstance(exc, OSError | ValueError) else None
    return isinstance(mapped, DatasetNotFoundError | StorageNotFoundError)


def raise_expired(exc: BaseException, what: str) -> None:
    """Raise :class:`ViewExpiredError` (from ``exc``) when ``exc`` is a file of
    a pinned view gone; return otherwise."""
    if expired(exc):
        raise ViewExpiredError(
            f"{what} of this pinned view is gone (a clean-up deleted it after the view "
            "was taken): take a new snapshot"
        ) from exc
