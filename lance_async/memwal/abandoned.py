"""Engine calls abandoned at their deadline, as the MemWAL writers see them.

An abandoned call is not stopped (``_threads.run_sync``): pylance goes on
retrying it until the store answers. Two things follow, both kept here:

* the rows of an abandoned put may still be written: their acks fail with
  :func:`may_still_land`'s error (``may_have_landed``);
* an abandoned open may still claim its shard, and so fence a writer opened
  since: :func:`late_opens` counts those still running (per process), and
  one that returns is closed, or kept for its opener (:func:`keep_late_open`,
  :func:`take_late_open`: the routing writer takes it instead of opening
  the shard again, see ``healing.py``).

The probe of the store that says why a call timed out gets a share of the
deadline, :func:`probe_timeout`.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import TYPE_CHECKING

from ..errors import LanceAsyncError

if TYPE_CHECKING:
    from .engine import OpenedEngine

__all__ = [
    "PROBE_SHARE",
    "PROBE_TIMEOUT",
    "close_late_open",
    "count_late_open",
    "keep_late_open",
    "late_opens",
    "may_still_land",
    "probe_timeout",
    "take_late_open",
]

log = logging.getLogger("lance_async.memwal")

PROBE_TIMEOUT = 5.0
"""Seconds a probe of the store may take at most."""
PROBE_SHARE = 0.25
"""The probe's share of ``storage_timeout`` at most: an ack that fails at a
put's deadline fails within 1.25 times ``storage_timeout`` of the put's
start, the probe that says why included (it took up to twice: a 503 store
retried the probe to a deadline of its own)."""


def probe_timeout(storage_timeout: float) -> float:
    """Seconds a probe of the store may take after (or before) calls that
    wait ``storage_timeout`` seconds (pure; does not block)."""
    return min(PROBE_TIMEOUT, storage_timeout * PROBE_SHARE)


# -- opens abandoned at their deadline ------------------------------------------------

_late_lock = threading.Lock()
_late_opens: dict[tuple[str, str], int] = {}
_kept_opens: dict[tuple[str, str], OpenedEngine] = {}


def late_opens(uri: str, shard_id: str) -> int:
    """Opens of ``shard_id`` of the table at ``uri`` abandoned at their
    deadline that have not returned yet (in this process; does not block).

    Such an open may still claim the shard once the store answers, and so
    fence a writer opened since: wait for it to return before opening the
    shard again.
    """
    with _late_lock:
        return max(0, _late_opens.get((uri, shard_id), 0))


def count_late_open(key: tuple[str, str], step: int) -> None:
    """+1 when an opener learns its open was abandoned, -1 when that open
    returns (the two may come in either order). Does not block."""
    with _late_lock:
        left = _late_opens.get(key, 0) + step
        if left:
            _late_opens[key] = left
        else:
            _late_opens.pop(key, None)


def take_late_open(uri: str, shard_id: str) -> OpenedEngine | None:
    """An engine writer of ``shard_id`` whose open was abandoned at its
    deadline, returned since and was kept for its opener
    (:func:`keep_late_open`); the opener takes it instead of opening the
    shard again (None when there is none). Does not block.

    An open abandoned because it was slow, not because the store failed,
    is not wasted: it claimed the shard, and the writer made of it is as
    good as a new one (had anything claimed the shard since, it would be
    fenced, and its first put would say so).
    """
    with _late_lock:
        return _kept_opens.pop((uri, shard_id), None)


def keep_late_open(key: tuple[str, str], opened: OpenedEngine) -> None:
    """Keep a late open for :func:`take_late_open` (on its worker thread);
    of two, the newer claim (the higher epoch) is kept, the other closed."""
    with _late_lock:
        before = _kept_opens.pop(key, None)
        if before is not None and before.epoch > opened.epoch:
            before, opened = opened, before
        _kept_opens[key] = opened
    close_late_open(before)


def close_late_open(opened: OpenedEngine | None) -> None:
    """Close the engine writer of an open nobody takes (blocking; on the
    open's worker thread). Its claim of the shard stays: a writer opened
    since is fenced, one opened later claims the next epoch."""
    if opened is not None:
        try:
            opened.engine.close()
        except Exception as exc:  # the store is still failing; nobody uses this writer
            log.debug("lance_async: closing a writer opened too late: %s", exc)


def may_still_land(error: LanceAsyncError) -> LanceAsyncError:
    """The error of rows whose engine call was abandoned at its deadline,
    not stopped: ``error`` with
    :attr:`~lance_async.LanceAsyncError.may_have_landed` set and said.
    pylance goes on retrying such a call until the store answers, and then
    writes the rows unless another writer claimed the shard first (884 of
    1,000 such rows were visible once a 403 store answered again, over 50
    outages). Pure; does not block."""
    landing = copy.copy(error)
    landing.may_have_landed = True
    landing.args = (
        f"{error}. These rows may still be written: the engine call carrying them was "
        "abandoned at its deadline, not stopped, and writes them if the store answers "
        "again before another writer claims the shard. Sending them again is safe for "
        "an upsert (keyed rows: the newest wins)",
    )
    landing.__cause__ = error.__cause__
    return landing
