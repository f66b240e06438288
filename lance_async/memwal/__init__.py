"""The MemWAL: Lance's LSM write path, from async code.

One module per job (imports run down this list, never up; nothing here
imports ``lance_async.dataset`` at run time -- the dataset is an argument):

``acks.py``
    :class:`Ack` / :class:`PutSummary`: one acknowledgement per send.
``stats.py``
    :class:`WriterState`, :class:`WriterStats`.
``policy.py``
    Commit policies (``commit="adaptive"`` / ``"latency"`` / ``"throughput"``)
    and the writer's options, checked.
``accumulator.py``
    The writer's queue: room (backpressure), validation, coalescing, linger.
``committer.py``
    The writer task: engine puts and deletes, acks settled, fatal failures.
``manifest.py``
    Shard manifests and compaction progress read from storage (what pylance
    14 does not expose).
``retired.py``
    Shards of an earlier MemWAL of the same table; the MemWAL epoch.
``snapshots.py``
    :func:`shard_snapshots`: which shards exist and what each has flushed.
``keys.py``, ``keyindex.py``
    Primary-key values turned into engine filters and arrays; key sets and
    positions built once and probed per batch.
``mirror.py``
    A shard writer's memtable, mirrored for its reads (sealed ones too).
``levels.py``
    The levels of one read resolved: newest version of each key.
``scan.py``, ``lookup.py``, ``vector.py``, ``reads.py``
    The streaming LSM scan; batched and coalesced point lookups; LSM vector
    search; the public reads (a writer's too).
``writer.py``
    :class:`AsyncShardWriter`: the API of one shard writer.
``router.py``
    :class:`ShardRouter`: rows split by shard, one writer per shard.
``compaction.py``, ``compactor.py``
    :func:`compact_mem_wal`: flushed generations merged into the base table;
    :class:`Compactor`: the same in the background, by a :class:`CompactionPolicy`.
"""

from __future__ import annotations

from .acks import Ack, PutSummary
from .compaction import CompactionResult, compact_mem_wal
from .compactor import CompactionPolicy, Compactor, CompactorStats
from .lookup import CoalescerStats
from .reads import lsm_point_lookup, lsm_point_lookups, lsm_scan
from .router import ShardRouter
from .snapshots import ShardSnapshot, ShardSnapshots, shard_snapshots
from .stats import WriterState, WriterStats
from .vector import lsm_vector_search
from .writer import AsyncShardWriter

__all__ = [
    "Ack",
    "AsyncShardWriter",
    "CoalescerStats",
    "CompactionPolicy",
    "CompactionResult",
    "Compactor",
    "CompactorStats",
    "PutSummary",
    "ShardRouter",
    "ShardSnapshot",
    "ShardSnapshots",
    "WriterState",
    "WriterStats",
    "compact_mem_wal",
    "lsm_point_lookup",
    "lsm_point_lookups",
    "lsm_scan",
    "lsm_vector_search",
    "shard_snapshots",
]
