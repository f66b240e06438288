"""What a shard writer reports: :class:`WriterState`, :class:`WriterStats`."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RouterStats", "WriterState", "WriterStats", "collect_stats", "percentiles"]


class WriterState(enum.Enum):
    """Life cycle of an :class:`AsyncShardWriter`."""

    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


@dataclass(frozen=True)
class WriterStats:
    """A snapshot of an :class:`AsyncShardWriter` (from :meth:`~AsyncShardWriter.stats`).

    Attributes
    ----------
    state : WriterState
    queue_rows, queue_bytes : int
        Rows / bytes accepted and not yet acknowledged (queued or in flight).
    max_queue_rows_seen, max_queue_bytes_seen : int
        The highest those have been.
    engine_puts, engine_deletes : int
        Engine calls made.
    rows : int
        Rows written.
    rows_per_put : float
        ``rows / engine_puts``.
    ack_latency_p50, ack_latency_p99 : float
        Seconds from queueing to ack, over the last 20,000 acked parts.
    failed_puts : int
        Engine puts rejected (their items were retried one by one).
    engine : dict
        The engine's ``stats()``, read after a put at most once a second
        (:meth:`AsyncShardWriter.engine_stats` reads it fresh).
    memtable : dict
        The engine's ``memtable_stats()`` after the last put.
    entries : int
        Queue entries handed to the writer task so far: one per send of one
        batch (or of rows that fit one put), per ``send_many`` group that
        fits one put, per piece of a larger send, per delete and flush.
    abandoned_calls : int
        Engine calls given up at their ``storage_timeout`` (their threads
        were left behind, perhaps stuck in the engine; each is logged).
    """

    state: WriterState
    queue_rows: int
    queue_bytes: int
    max_queue_rows_seen: int
    max_queue_bytes_seen: int
    engine_puts: int
    engine_deletes: int
    rows: int
    rows_per_put: float
    ack_latency_p50: float
    ack_latency_p99: float
    failed_puts: int
    engine: dict[str, Any] = field(default_factory=dict)
    memtable: dict[str, Any] = field(default_factory=dict)
    entries: int = 0
    abandoned_calls: int = 0


@dataclass(frozen=True)
class RouterStats:
    """A snapshot of a :class:`~lance_async.ShardRouter` (from its ``stats()``).

    Attributes
    ----------
    writers : dict of str to WriterStats
        Each open shard writer's statistics, by shard id.
    engine_puts, rows : int
        Summed over the writers.
    queue_rows, queue_bytes : int
        Rows / bytes accepted and not yet acknowledged, over all writers.
    ack_latency_p50, ack_latency_p99 : float
        Seconds from queueing to ack, over the recent samples of every writer.
    reopens : int
        Shard writers opened again after theirs failed (a store that came back).
    """

    writers: dict[str, WriterStats]
    engine_puts: int
    rows: int
    queue_rows: int
    queue_bytes: int
    ack_latency_p50: float
    ack_latency_p99: float
    reopens: int = 0


def percentiles(values: Sequence[float], *qs: float) -> list[float]:
    """Nearest-rank percentiles (``q`` in 0..1) of ``values``, sorted once;
    zeros for no values."""
    if not values:
        return [0.0 for _ in qs]
    ordered = sorted(values)
    n = len(ordered)
    return [float(ordered[min(n - 1, max(0, math.ceil(q * n) - 1))]) for q in qs]


def collect_stats(state: WriterState, acc: Any, com: Any) -> WriterStats:
    """A :class:`WriterStats` from a writer's accumulator and committer (either
    may be None before the writer opened). Does not block."""
    p50, p99 = percentiles(list(com.latencies) if com else [], 0.50, 0.99)
    puts = com.engine_puts if com else 0
    rows = com.rows if com else 0
    return WriterStats(
        state=state,
        queue_rows=acc.queue_rows if acc else 0,
        queue_bytes=acc.queue_bytes if acc else 0,
        max_queue_rows_seen=acc.max_rows_seen if acc else 0,
        max_queue_bytes_seen=acc.max_bytes_seen if acc else 0,
        engine_puts=puts,
        engine_deletes=com.engine_deletes if com else 0,
        rows=rows,
        rows_per_put=rows / puts if puts else 0.0,
        ack_latency_p50=p50,
        ack_latency_p99=p99,
        failed_puts=com.failed_puts if com else 0,
        engine=dict(com.engine_stats) if com else {},
        memtable=dict(com.memtable_stats) if com else {},
        entries=acc.entries if acc else 0,
        abandoned_calls=com.abandoned_calls if com else 0,
    )
