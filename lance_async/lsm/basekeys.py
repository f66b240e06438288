"""The base table's keys by row offset, one version at a time: lookups without a filtered scan.

The engine answers ``key = k`` on a base table, even with a BTREE index on
the key, through a filtered scan, several times dearer than a ``take`` of
known row offsets (bench/: the lookup figures). So for a base table of at
most ``max_rows`` rows, the keys of one version are read once -- one scan of
the key columns, about 30 MB per million integer keys -- into a
:class:`~lance_async.lsm.keyindex.KeyIndex`; lookups on that version then
find their rows' offsets in memory and ``take`` them. It is the key cache of
Cassandra's read path (partition key to its offset in an SSTable) applied to
the base table.

Exact for its version: the keys are read from a dataset object checked out
at that version which nobody else holds (no commit moves it), row offsets
are positions in its in-order scan (what ``take`` expects), and rows come
from the same object; rows deleted at that version are in neither. A
lookup on any other version takes the engine's filtered path.

A version is indexed only once it has been looked up ``min_lookups`` times
(a base that a compaction replaces every few seconds does not pay a build
per commit for a handful of lookups), on a daemon thread of its own, one
build at a time per process; meanwhile lookups take the engine's path, so
no lookup waits for a build. At most ``keep`` tables are indexed at once
(least recently used dropped).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .keyindex import KeyIndex

__all__ = ["BaseKeyCache", "BaseKeys", "VersionId", "base_keys", "version_id"]

VersionId = tuple[int, Any]
"""A base version's number and commit time (a ``datetime``)."""


def version_id(base: Any) -> VersionId:
    """Which version of which table a dataset object reads: its number and
    its commit time (pylance's ``get_version()``, from the loaded manifest:
    no I/O). The number alone does not tell a table deleted and created
    again at the same URI from the old one; caches of a version key on
    both."""
    return int(base.version), base.get_version()["timestamp"]


log = logging.getLogger("lance_async.memwal")

MAX_ROWS = 4_000_000
"""Base tables with more rows than this are never indexed (about 30 bytes a row)."""
MIN_LOOKUPS = 8
"""Lookups of one version before its keys are read."""
KEEP = 2
"""Tables whose base keys are kept at once."""


@dataclass(frozen=True)
class BaseKeys:
    """The keys of one version of a base table, by row offset.

    Attributes
    ----------
    version : int
    dataset : lance.LanceDataset
        Checked out at ``version``, held only here: ``take`` rows from it.
    index : KeyIndex
        Position of each key in the version's in-order scan (its row offset).
    """

    version: VersionId
    dataset: Any
    index: KeyIndex


class _Slot:
    """What the cache knows of one table: its newest indexed version, lookups seen."""

    __slots__ = ("entry", "seen", "seen_version", "skip")

    def __init__(self) -> None:
        self.entry: BaseKeys | None = None
        self.seen_version: VersionId | None = None
        self.seen = 0
        self.skip: VersionId | None = None  # not to index (too large, or its build failed)


class BaseKeyCache:
    """Base-table key indexes, built in the background (see the module notes).

    Parameters
    ----------
    max_rows : int
        Tables with more live rows are not indexed.
    min_lookups : int
        Lookups of one version before its keys are read.
    keep : int
        Tables indexed at once.

    Notes
    -----
    Thread-safe; :meth:`get` never blocks on I/O (it may start a build
    thread). :meth:`wait_built` exists for tests.
    """

    def __init__(
        self, max_rows: int = MAX_ROWS, min_lookups: int = MIN_LOOKUPS, keep: int = KEEP
    ) -> None:
        self.max_rows = max_rows
        self.min_lookups = min_lookups
        self.keep = keep
        self._lock = threading.Lock()
        self._slots: OrderedDict[tuple[str, tuple[str, ...]], _Slot] = OrderedDict()
        self._building: threading.Thread | None = None
        self.builds = 0
        """Indexes built so far (for stats and tests)."""

    def get(self, base: Any, keys: Sequence[str]) -> BaseKeys | None:
        """The index of ``base``'s version, or None (then use the engine's path).

        Counts the lookup; the ``min_lookups``-th of a version starts its
        build unless one is running. Does not block.
        """
        version = version_id(base)
        name = (str(base.uri), tuple(keys))
        with self._lock:
            slot = self._slots.get(name)
            if slot is None:
                slot = self._slots[name] = _Slot()
                while len(self._slots) > self.keep:
                    self._slots.popitem(last=False)
            else:
                self._slots.move_to_end(name)
            entry = slot.entry
            if entry is not None and entry.version == version:
                return entry
            if slot.seen_version != version:
                slot.seen_version, slot.seen = version, 0
            slot.seen += 1
            if (
                slot.seen < self.min_lookups
                or slot.skip == version
                # an older version's lookup (commit times order a table's versions,
                # and a table made again at the URI commits after the old one)
                or (entry is not None and entry.version[1] > version[1])
                or self._building is not None
            ):
                return None
            thread = threading.Thread(
                target=self._build,
                args=(base, version, name, slot),
                name="lance_async base keys",
                daemon=True,
            )
            self._building = thread
        thread.start()
        return None

    def _build(
        self, base: Any, version: VersionId, name: tuple[str, tuple[str, ...]], slot: _Slot
    ) -> None:
        try:
            pinned = base.checkout_version(version[0])
            if version_id(pinned) != version:  # the table was made again meanwhile
                slot.skip = version
                return
            if pinned.count_rows() > self.max_rows:
                slot.skip = version
                return
            table = pinned.to_table(columns=list(name[1]))
            entry = BaseKeys(version, pinned, KeyIndex([table.column(k) for k in name[1]]))
            offset = 0  # one row of each fragment: its files' metadata is read now, not
            for fragment in pinned.get_fragments():  # by the first lookups
                rows = fragment.count_rows()
                if rows:
                    pinned.take([offset])
                offset += rows
            with self._lock:
                if slot.entry is None or slot.entry.version[1] < version[1]:
                    slot.entry = entry
                self.builds += 1
        except Exception as exc:  # a failed build only means the engine's path
            log.debug("lance_async: base keys of %s v%d not built: %s", name[0], version[0], exc)
            slot.skip = version
        finally:
            with self._lock:
                self._building = None

    def wait_built(self, timeout: float = 30.0) -> None:
        """Wait for a running build to end (blocking; for tests)."""
        thread = self._building
        if thread is not None:
            thread.join(timeout)

    def clear(self) -> None:
        """Forget every index (does not block)."""
        with self._lock:
            self._slots.clear()


base_keys = BaseKeyCache()
"""The process's cache (the LSM point lookups use it)."""
