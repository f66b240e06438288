"""The unflushed levels of a read: :class:`MemLevel`, from a live writer's mirror or a WAL tail.

Both hold rows no flushed generation has yet, newest state per key, and are
read the same way: probed by key (point lookups), scanned (their live rows,
with the scan's filter), ranked (vector search). A WAL tail's level is made
from the tail's resolved rows (``wal.py`` keeps them incrementally) without
copying, and is kept while the tail does not move, so its derived state --
the mask of live rows, and the in-memory Lance dataset that a filter runs
on -- is built once, not per read: a filter is pushed into the tail as it is
into a generation's scanner.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from .keyindex import KeyIndex, first_occurrence
from .memtable import MemPart, MemtableMirror
from .snapshots import ShardSnapshot
from .wal import TOMBSTONE, TailRows, read_wal_tail

__all__ = ["MemLevel", "resolve_memtable", "tail_level"]

_TAILS = 1024  # tail levels kept (one per shard read)


@dataclass
class MemLevel:
    """The newest state of each key of one shard's unflushed rows.

    Attributes
    ----------
    shard_id : str
    table : pa.Table
        One row per key (table columns, nullable, plus ``_tombstone``).
    index : KeyIndex
        Over ``table``'s key columns.
    """

    shard_id: str
    table: pa.Table
    index: KeyIndex
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @cached_property
    def tomb(self) -> np.ndarray:
        """True where the newest state of the key is a delete."""
        return np.asarray(self.table.column(TOMBSTONE).to_numpy(zero_copy_only=False), dtype=bool)

    @cached_property
    def _live(self) -> pa.Table | None:
        keep = ~self.tomb
        if not keep.any():
            return None
        return self.table.filter(pa.array(keep)).drop_columns([TOMBSTONE])

    def live(self) -> pa.Table | None:
        """The rows whose newest state is not a delete, without ``_tombstone``
        (None when there are none; built once)."""
        return self._live

    def _dataset(self) -> Any:
        """The live rows as an in-memory Lance dataset (built once, blocking)."""
        with self._lock:
            ds = self.__dict__.get("_ds")
            if ds is None:
                import lance

                live = self.live()
                assert live is not None
                ds = lance.write_dataset(live, f"memory://lance_async-{uuid.uuid4().hex}")
                self.__dict__["_ds"] = ds
            return ds

    def select(self, columns: list[str], filter: str | None) -> pa.Table | None:
        """The live rows that pass ``filter`` (Lance SQL), projected on
        ``columns`` (blocking; None when no row is live)."""
        live = self.live()
        if live is None:
            return None
        if not filter:
            return live.select(columns)
        result: pa.Table = self._dataset().to_table(columns=columns, filter=filter)
        return result


def resolve_memtable(
    shard_id: str,
    parts: Sequence[MemPart],
    keys: Sequence[str],
    mirror: MemtableMirror | None = None,
) -> MemLevel:
    """The newest row per key among a shard's mirrored memtable parts (blocking).

    ``mirror``, the live writer's mirror the parts were taken from, keeps the
    result until its rows change: reads of unchanged rows get the same
    level object (the read caches of the levels key on their identity) and
    skip the work. A part only ever grows, so its generation and row count
    tell its rows apart.
    """
    if mirror is None:
        return _resolve(shard_id, parts, keys)
    key = (tuple(keys), tuple((p.generation, p.table.num_rows) for p in parts))
    hit = mirror.resolved
    if hit is not None and hit[0] == key:
        level: MemLevel = hit[1]
        return level
    level = _resolve(shard_id, parts, keys)
    mirror.resolved = (key, level)
    return level


def _resolve(shard_id: str, parts: Sequence[MemPart], keys: Sequence[str]) -> MemLevel:
    ordered = sorted(parts, key=lambda p: p.generation)
    table = pa.concat_tables([p.table for p in ordered]) if ordered else None
    if table is None or table.num_rows == 0:
        empty = ordered[0].table.schema.empty_table() if ordered else pa.table({})
        return MemLevel(shard_id, empty, KeyIndex([pa.array([], pa.int64())]))
    n = table.num_rows
    rev = pa.array(np.arange(n - 1, -1, -1))
    cols = [table.column(k).combine_chunks().take(rev) for k in keys]
    win = first_occurrence(cols, n)
    rows = np.sort(n - 1 - np.flatnonzero(win))
    newest = table.take(pa.array(rows)).combine_chunks()
    return MemLevel(shard_id, newest, KeyIndex([newest.column(k) for k in keys]))


_levels: dict[tuple[str, str, bool], tuple[TailRows, MemLevel]] = {}
_levels_lock = threading.Lock()


def tail_level(
    uri: str,
    snap: ShardSnapshot,
    schema: pa.Schema,
    keys: list[str],
    storage_options: dict[str, str] | None,
) -> MemLevel | None:
    """The shard's WAL tail after ``snap.replay_after`` (up to ``snap.wal_end``
    when the snapshot pins one) as a level, or None when it is empty
    (blocking; the level is kept while the tail does not move).

    Raises
    ------
    ViewExpiredError
        A pinned entry is gone (see :func:`~lance_async.lsm.wal.read_wal_tail`).
    """
    tail = read_wal_tail(
        uri,
        snap.shard_id,
        snap.replay_after,
        schema,
        storage_options,
        keys=keys,
        stop=snap.wal_end,
        manifest_version=snap.manifest_version or None,
    )
    rows = tail.newest
    if rows is None or not rows.table.num_rows:
        return None
    name = (uri, snap.shard_id, snap.wal_end is not None)
    with _levels_lock:
        hit = _levels.get(name)
        if hit is not None and hit[0] is rows:
            return hit[1]
    level = MemLevel(snap.shard_id, rows.table, rows.index)
    with _levels_lock:
        _levels[name] = (rows, level)
        while len(_levels) > _TAILS:
            _levels.pop(next(iter(_levels)))
    return level
