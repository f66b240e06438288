"""The read side of a MemWAL table: LSM reads that see every acknowledged row.

One module per job (imports run down this list, never up; the table is an
argument typed by :class:`~lance_async._table.Table`):

``manifest.py``
    Shard manifests and compaction progress read from storage (what the
    engine does not expose).
``walfiles.py``
    A WAL's files: entries decoded; lance_async's tail checkpoints.
``wal.py``
    A shard's WAL tail: durable rows no generation holds yet, read with the
    engine's replay rules, incrementally, kept resolved.
``snapshots.py``
    :func:`shard_snapshots`: which shards are live, what each has flushed,
    where its WAL tail starts; shards retired by a later MemWAL;
    :class:`LsmSnapshot`, a point-in-time view that reads are given.
``keys.py``, ``keyindex.py``, ``basekeys.py``
    Key values given by callers (strict literals, arrays); key sets and
    positions built once and probed per batch; a base version's keys by row
    offset.
``memtable.py``
    A live shard writer's memtable, mirrored for this process's reads.
``unflushed.py``
    The unflushed levels of a read (a mirror's rows, a WAL tail's), with a
    filter pushed into them.
``cache.py``
    The process's cache of flushed generations: bounded by bytes, emptied
    of what compaction merged.
``levels.py``
    The levels of one read resolved: the newest version of each key.
``scan.py``, ``lookup.py``, ``vector.py``
    The streaming scan; batched and coalesced point lookups; vector search.
``reader.py``
    :class:`LsmReader`, the one read object (``dataset.lsm``, ``writer.lsm``,
    ``router.lsm``).
"""

from __future__ import annotations

from .cache import LevelCacheStats
from .lookup import CoalescerStats
from .memtable import MemtableMirror
from .reader import LsmReader
from .snapshots import LsmSnapshot, ShardSnapshot, ShardSnapshots, shard_snapshots
from .wal import WalTail, read_wal_tail

__all__ = [
    "CoalescerStats",
    "LevelCacheStats",
    "LsmReader",
    "LsmSnapshot",
    "MemtableMirror",
    "ShardSnapshot",
    "ShardSnapshots",
    "WalTail",
    "read_wal_tail",
    "shard_snapshots",
]
