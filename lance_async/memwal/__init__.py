"""The MemWAL's write side: Lance's LSM write path, from async code.

One module per job (imports run down this list, never up; the table is an
argument typed by :class:`~lance_async._table.Table`; the reads are the
``lsm`` package's):

``acks.py``
    :class:`Ack` / :class:`PutSummary`: one acknowledgement per send.
``stats.py``
    :class:`WriterState`, :class:`WriterStats`.
``policy.py``
    Commit policies (``commit="adaptive"`` / ``"latency"`` / ``"throughput"``)
    and the writer's options, checked.
``accumulator.py``
    The writer's queue: room (backpressure), validation, coalescing, linger.
``sharding.py``
    One key, one shard: the shard of every row by the table's sharding spec.
``retired.py``
    Initializing a MemWAL over an earlier one's shards; derived shard ids.
``committer.py``
    The writer task: engine puts and deletes, acks settled, fatal failures,
    memtables flushed by age.
``writer.py``
    :class:`AsyncShardWriter`: the API of one shard writer.
``router.py``
    :class:`ShardRouter`: rows split by shard, one writer per shard.
``check.py``
    :func:`check_shards`: keys found in more than one shard, or the wrong one.
``compaction.py``, ``compactor.py``
    :func:`compact_mem_wal`: flushed generations merged into the base table,
    one guarded commit per shard; :class:`Compactor`: the same in the
    background, by a :class:`CompactionPolicy`.
``cleanup.py``
    :func:`cleanup_table`: the garbage collector -- old base versions,
    compacted generation folders, flushed WAL entries, superseded shard
    manifests -- by a retention (the compactor runs it too).
"""

from __future__ import annotations

from .acks import Ack, PutSummary
from .check import ShardCheck
from .cleanup import CleanupPlan, CleanupStats, cleanup_table, plan_cleanup
from .compaction import CompactionResult, compact_mem_wal
from .compactor import CompactionPolicy, Compactor, CompactorStats
from .policy import WriterOptions
from .router import ShardRouter
from .stats import WriterState, WriterStats
from .writer import AsyncShardWriter

__all__ = [
    "Ack",
    "AsyncShardWriter",
    "CleanupPlan",
    "CleanupStats",
    "CompactionPolicy",
    "CompactionResult",
    "Compactor",
    "CompactorStats",
    "PutSummary",
    "ShardCheck",
    "ShardRouter",
    "WriterOptions",
    "WriterState",
    "WriterStats",
    "cleanup_table",
    "compact_mem_wal",
    "plan_cleanup",
]
