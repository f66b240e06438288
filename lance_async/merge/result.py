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
        Engine merges run until one committed (1 + retries), for every source
        kind: in-memory and replayable sources are replayed by lance_async
        with Lance's own retries off. A streamed source (one pass) retries
        inside Lance, which pylance 14 does not count: 1 there.
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
    group_size : int
        How many upserts the commit held: 1 alone; more when concurrent
        upserts of this table were coalesced into one engine merge (group
        commit, see ``merge/coalesce.py``). The counts are still this
        upsert's own, in the group's serial order.
    group_index : int
        This upsert's place in its group's serial order, from 0 (0 alone):
        the rows of a lower index were applied first.
    """

    num_inserted_rows: int
    num_updated_rows: int
    num_deleted_rows: int
    num_attempts: int
    source_mode: SourceMode
    version: int
    committed: bool = True
    mem_wal: PutSummary | None = None
    group_size: int = 1
    group_index: int = 0


def backoff_delay(
    attempt: int, last_attempt_seconds: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): a random slot.

    Slotted exponential backoff, as Ethernet's and Lance's own commit retries
    (``SlotBackoff``): a slot is as long as the last attempt took (at least
    50 ms), and retry ``k`` waits a whole number of slots drawn from
    ``[0, 2**(k+1))`` -- 4 slots before the first retry, 8 before the second
    -- capped at 5 s. Contenders whose attempts collide spread over as many
    attempt lengths as there are of them, so most retries find the table
    free, where a fixed short wait makes them collide again.
    """
    slot = max(BASE_BACKOFF, last_attempt_seconds)
    slots = 2 ** min(max(attempt, 1) + 1, 16)
    return float(min(MAX_BACKOFF, (rng or random).randrange(slots) * slot))


def engine_stats(result: Any) -> tuple[int, int, int]:
    """Inserted, updated and deleted row counts of pylance's merge result (a dict or an object)."""
    get = result.get if isinstance(result, dict) else (lambda k, d=0: getattr(result, k, d))
    return (
        int(get("num_inserted_rows", 0)),
        int(get("num_updated_rows", 0)),
        int(get("num_deleted_rows", 0)),
    )
