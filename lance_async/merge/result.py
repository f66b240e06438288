"""What a merge_insert did (:class:`MergeResult`); the wait before a retry (backoff)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ..memwal.acks import PutSummary
from ..sources import SourceMode

__all__ = ["BASE_BACKOFF", "MAX_BACKOFF", "MergeResult", "backoff_delay", "engine_stats"]

BASE_BACKOFF = 0.05
MAX_BACKOFF = 5.0


@dataclass(frozen=True)
class MergeResult:
    """What one merge_insert did.

    Attributes
    ----------
    num_inserted_rows, num_updated_rows, num_deleted_rows : int
        Row counts reported by Lance for the committed attempt.
    num_attempts : int
        Attempts lance_async ran (1 + retries). For MATERIALIZED sources Lance
        retries inside one attempt, so this stays 1 there.
    source_mode : SourceMode
        How the source was read (decides the retry strategy).
    version : int
        The dataset version the merge committed (the version read, when
        nothing was committed).
    committed : bool
        False when the source held no rows and nothing was written (an
        empty merge is no new version; with
        ``when_not_matched_by_source_delete`` an empty source still runs).
        Through the MemWAL: True once rows were written there (durably with
        the writer's ``durable_write``, the default), though no version was
        committed.
    mem_wal : PutSummary or None
        Set when the merge went through the MemWAL (``via_mem_wal()``): the
        rows put and keys deleted. The insert / update / delete counts are
        then 0 -- which keys were new is known only when the rows are
        compacted, as in LanceDB's LSM write path -- and ``version`` is the
        version read.
    """

    num_inserted_rows: int
    num_updated_rows: int
    num_deleted_rows: int
    num_attempts: int
    source_mode: SourceMode
    version: int
    committed: bool = True
    mem_wal: PutSummary | None = None


def backoff_delay(
    attempt: int, last_attempt_seconds: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based).

    ``0.05 * 2**(attempt-1)`` seconds -- 50, 100, 200, 400 ms ... -- times a
    jitter in [0.5, 1.5), capped at 5 s. From the third retry on, the wait is
    at least half the last attempt's duration, so writers whose attempts are
    slow spread out instead of colliding again; the first retries stay short,
    since one conflict usually means one competitor that has just committed.
    The shape follows Lance's own commit retry backoff.
    """
    base = BASE_BACKOFF * (2 ** max(attempt - 1, 0))
    if attempt >= 3:
        base = max(base, 0.5 * last_attempt_seconds)
    jitter = (rng or random).uniform(0.5, 1.5)
    return float(min(MAX_BACKOFF, base * jitter))


def engine_stats(result: Any) -> tuple[int, int, int]:
    """Inserted, updated and deleted row counts of pylance's merge result (a dict or an object)."""
    get = result.get if isinstance(result, dict) else (lambda k, d=0: getattr(result, k, d))
    return (
        int(get("num_inserted_rows", 0)),
        int(get("num_updated_rows", 0)),
        int(get("num_deleted_rows", 0)),
    )
