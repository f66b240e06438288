"""The read side of a MemWAL table: LSM reads that see every acknowledged row.

One module per job (imports run down this list, never up; the table is an
argument typed by :class:`~lance_async._table.Table`):

``manifest.py``
    Shard manifests and compaction progress read from storage (what the
    engine does not expose).
``wal.py``
    A shard's WAL tail: durable rows no generation holds yet, read with the
    engine's replay rules, incrementally.
``snapshots.py``
    :func:`shard_snapshots`: which shards are live, what each has flushed,
    where its WAL tail starts; shards retired by a later MemWAL.
``keys.py``, ``keyindex.py``, ``basekeys.py``
    Key values given by callers (strict literals, arrays); key sets and
    positions built once and probed per batch; a base version's keys by row
    offset.
``memtable.py``
    A live shard writer's memtable, mirrored for this process's reads.
``levels.py``
    The levels of one read resolved: the newest version of each key.
``scan.py``, ``lookup.py``, ``vector.py``
    The streaming scan; batched and coalesced point lookups; vector search.
``reader.py``
    :class:`LsmReader`, the one read object (``dataset.lsm``, ``writer.lsm``,
    ``router.lsm``), and :class:`LsmMethods`, the facades' methods.
"""

from __future__ import annotations

from .lookup import CoalescerStats
from .memtable import MemtableMirror
from .reader import LsmMethods, LsmReader
from .snapshots import ShardSnapshot, ShardSnapshots, shard_snapshots
from .wal import WalTail, read_wal_tail

__all__ = [
    "CoalescerStats",
    "LsmMethods",
    "LsmReader",
    "MemtableMirror",
    "ShardSnapshot",
    "ShardSnapshots",
    "WalTail",
    "read_wal_tail",
    "shard_snapshots",
]
