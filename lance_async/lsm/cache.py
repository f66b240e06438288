"""The read side's cache of flushed generations, bounded by bytes: :class:`LevelCache`.

A long-lived reader keeps, per flushed generation it has read, the
generation's key columns, row addresses and tombstone flags plus its open
``LanceDataset`` (``levels.py``: :func:`~lance_async.lsm.levels.load_generation`),
and per shard the resolved winners of each list of generations it has seen
(:func:`~lance_async.lsm.levels.resolve_shard`). SSTables never change, so
none of it goes stale -- but generations stop being *read* once a
compaction merges them into the base table, and a reader polling a table for
hours would otherwise keep every generation it ever saw.

So the cache forgets in two ways:

* **compacted**: when a view finds that a shard's compaction mark reached
  generation ``N`` (:meth:`LevelCache.compacted`), the generations of that
  shard up to ``N`` and every resolved list holding one are dropped at once
  (a view opened before keeps its own references; a view pinned to older
  snapshots reads them again, if a clean-up has not removed them);
* **by bytes**: the least recently used entries go once the cache holds more
  than its budget, ``configure_memory(lsm_cache_bytes=...)`` (environment
  ``LANCE_ASYNC_LSM_CACHE_BYTES``; default 256 MiB). Sizes are estimates:
  the arrays' bytes plus :data:`GENERATION_OVERHEAD` per open generation.

With both, a reader's memory follows the table's shape (live generations per
shard, rows per generation), not its age. The idea is Cassandra's key cache
and RocksDB's table cache: a byte-bounded LRU over immutable files, entries
dropped when compaction deletes their file.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from .._memory import lsm_cache_bytes, memory_freed

__all__ = ["GENERATION_OVERHEAD", "LevelCache", "LevelCacheStats", "SameLevels", "keep_live"]

GENERATION_OVERHEAD = 64 << 10
"""Bytes counted per cached generation beyond its arrays: its open
``LanceDataset`` and the engine's metadata of its files (an estimate)."""


@dataclass(frozen=True)
class LevelCacheStats:
    """What a :class:`LevelCache` holds.

    Attributes
    ----------
    entries : int
        Generations and resolved shard lists cached.
    nbytes : int
        Their estimated size, in bytes.
    budget : int
        The byte budget in force.
    evicted : int
        Entries dropped for the budget so far.
    compacted : int
        Entries dropped because their generations were compacted, so far.
    """

    entries: int
    nbytes: int
    budget: int
    evicted: int
    compacted: int


class _Entry:
    __slots__ = ("group", "low", "nbytes", "value")

    def __init__(self, value: Any, nbytes: int, group: Hashable | None, low: int | None) -> None:
        self.value, self.nbytes, self.group, self.low = value, nbytes, group, low


class LevelCache:
    """A least-recently-used cache bounded by entries and by bytes, whose
    entries belong to a shard and may be dropped when it compacts.

    Parameters
    ----------
    max_entries : int
        Entries kept at most.
    budget : callable, optional
        Returns the byte budget (read at every insertion, so
        ``configure_memory`` takes effect at once); default
        :func:`~lance_async._memory.lsm_cache_bytes`.

    Notes
    -----
    Thread-safe; nothing blocks beyond its lock.
    """

    def __init__(self, max_entries: int, budget: Callable[[], int] = lsm_cache_bytes) -> None:
        self.max_entries = max_entries
        self.budget = budget
        self.lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._groups: dict[Hashable, set[Hashable]] = {}
        self._compacted: dict[Hashable, int] = {}  # per group: the mark already applied
        self.nbytes = 0
        self.evicted = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_item(self, key: Hashable) -> Any:
        """The value cached under ``key`` (now the most recently used), or None."""
        with self.lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.value

    def put(
        self,
        key: Hashable,
        value: Any,
        nbytes: int = 0,
        *,
        group: Hashable | None = None,
        low: int | None = None,
    ) -> Any:
        """Cache ``value`` (about ``nbytes``); returns it.

        ``group`` is the shard it belongs to and ``low`` the oldest
        generation it holds: :meth:`compacted` drops it once the shard's
        compaction mark reaches ``low``. Least recently used entries go while
        more than ``max_entries`` or the budget is held (never the new one).
        """
        with self.lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._forget(key, old)
            mark = self._compacted.get(group) if group is not None else None
            if mark is not None and low is not None and low <= mark:
                return value  # compacted already: nothing will read it again
            self._entries[key] = _Entry(value, nbytes, group, low)
            self.nbytes += nbytes
            if group is not None:
                self._groups.setdefault(group, set()).add(key)
            budget = self.budget()
            evicted = self.evicted
            while len(self._entries) > 1 and (
                len(self._entries) > self.max_entries or self.nbytes > budget
            ):
                first, entry = self._entries.popitem(last=False)
                self._forget(first, entry)
                self.evicted += 1
            freed = self.evicted > evicted
        if freed:
            memory_freed()
        return value

    def compacted(self, group: Hashable, generation: int) -> None:
        """The shard ``group`` compacted every generation up to ``generation``:
        drop its entries holding one (cheap when the mark has not moved)."""
        known = self._compacted.get(group, 0)
        if generation == known:
            return  # read without the lock: at worst the work below runs twice
        with self.lock:
            self._compacted[group] = generation
            if generation < known:
                return  # the mark went back (a restore, a table made again): keep all
            dropped = self.dropped
            for key in list(self._groups.get(group, ())):
                entry = self._entries.get(key)
                if entry is not None and entry.low is not None and entry.low <= generation:
                    del self._entries[key]
                    self._forget(key, entry)
                    self.dropped += 1
            freed = self.dropped > dropped
        if freed:
            memory_freed()

    def _forget(self, key: Hashable, entry: _Entry) -> None:
        self.nbytes -= entry.nbytes
        if entry.group is not None:
            keys = self._groups.get(entry.group)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._groups[entry.group]

    def clear(self) -> None:
        """Forget everything (the compaction marks too)."""
        with self.lock:
            self._entries.clear()
            self._groups.clear()
            self._compacted.clear()
            self.nbytes = 0

    def stats(self) -> LevelCacheStats:
        """What the cache holds now."""
        with self.lock:
            return LevelCacheStats(
                len(self._entries), self.nbytes, self.budget(), self.evicted, self.dropped
            )


class SameLevels:
    """Which level objects a cached result was made from, held weakly.

    A view's levels -- each shard's resolved generations, each WAL tail and
    live memtable -- are immutable objects that the caches above hand out
    again while nothing new is flushed or written, so their identities name
    a set of rows. A result cached for one view (the full-text search's
    indexed unflushed part, the vector and text searches' blocklist of
    hidden base rows) serves a later view only when :meth:`of` says it reads
    the very same objects; the weak references keep none of them alive, and
    an object gone can never be mistaken for a new one at the same address.

    Parameters
    ----------
    levels : sequence of object
        The level objects, in the view's order.
    """

    __slots__ = ("_refs",)

    def __init__(self, levels: Sequence[object]) -> None:
        self._refs = tuple(weakref.ref(level) for level in levels)

    def of(self, levels: Sequence[object]) -> bool:
        """Whether ``levels`` are the very objects this was made from (does not block)."""
        return len(levels) == len(self._refs) and all(
            ref() is level for ref, level in zip(self._refs, levels, strict=True)
        )

    def alive(self) -> bool:
        """Whether every object it was made from still exists: once one is gone
        no view can read the same set again, and the cached result is dead weight."""
        return all(ref() is not None for ref in self._refs)

    def key(self) -> tuple[int, ...]:
        """The objects' identities (a dictionary key; check with :meth:`of`)."""
        return tuple(id(ref()) for ref in self._refs)


def keep_live(
    cache: OrderedDict[Any, Any], limit: int, levels: Callable[[Any], SameLevels]
) -> None:
    """Drop from ``cache`` (most recently used last) every entry whose levels
    are gone, then the least recently used beyond ``limit`` (does not block;
    the caller holds the cache's lock)."""
    for key in [k for k, v in cache.items() if not levels(v).alive()]:
        del cache[key]
    while len(cache) > limit:
        cache.popitem(last=False)
