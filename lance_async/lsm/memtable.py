"""A live shard writer's memtable, mirrored: the newest level of that writer's reads.

The engine's own ``ShardWriter.lsm_scanner()`` hides the rows of a *sealed*
memtable until its SSTable is written, and collects its whole result before
returning. So a live shard in this process is read from a mirror instead:
the committer routes each engine put and delete through
:meth:`MemtableMirror.put` / :meth:`MemtableMirror.delete`, which keep
references to the rows (no copy) grouped by the memtable generation they
went into, until the shard manifest lists that generation as flushed. A
read takes :meth:`MemtableMirror.parts` *before* it reads the shard
manifests; a part whose generation the manifest lists is skipped (the
SSTable has the same rows), so no acked row is ever missing. The mirror
also holds rows not yet durable (``durable_write=False``): this process's
reads through the writer see them; every other read sees the WAL tail.

Which generation a put went into is read from ``memtable_stats()`` before
and after it (a put is never split across memtables): the generation did
not change; or it advanced and the memtable now holds exactly the put's rows
(sealed before the put); or it advanced and the memtable is empty (sealed
after the put, which went into the one before). Anything else marks the
mirror broken: reads then fail loudly rather than miss rows.

A mirror knows the writer epoch its engine writer claimed: when the shard
manifest shows a newer one, a writer elsewhere fenced this one, and reads
use the shard's WAL tail instead.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .._memory import memory_freed
from ..errors import LanceAsyncError
from . import manifest as _manifest
from .wal import TOMBSTONE, level_schema

__all__ = ["MemPart", "MemtableMirror"]


@dataclass(frozen=True)
class MemPart:
    """The mirrored rows of one memtable generation of one shard.

    Attributes
    ----------
    shard_id : str
    generation : int
    table : pa.Table
        Table columns (all nullable) plus ``_tombstone``, in put order: the
        last row of a key is its newest state.
    """

    shard_id: str
    generation: int
    table: pa.Table


class MemtableMirror:
    """The rows of a shard writer's unflushed memtables (see the module notes).

    Parameters
    ----------
    uri : str
        The table's URI (to read the shard manifest when forgetting).
    shard_id : str
    schema : pa.Schema
        The table schema.
    keys : list of str
        The primary-key columns.
    storage_options : dict, optional
        The table's (an object store's credentials and endpoint).

    Notes
    -----
    :meth:`put` and :meth:`delete` run on the committer's worker thread, one
    at a time (the writer's gate); :meth:`parts` may run on any thread.
    """

    def __init__(
        self,
        uri: str,
        shard_id: str,
        schema: pa.Schema,
        keys: list[str],
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self.shard_id = shard_id
        self.keys = list(keys)
        self.schema = level_schema(schema)
        self.epoch = 0
        """The writer epoch the engine writer claimed (0 until known)."""
        self._lock = threading.Lock()
        self._parts: dict[int, list[pa.Table]] = {}
        self._version = 0
        self._stats: dict[str, Any] | None = None  # memtable_stats() after the last call
        self.broken: BaseException | None = None
        self.resolved: tuple[Any, Any] | None = None
        """The readers' newest-row-per-key level of these rows (``unflushed.resolve_memtable``),
        dropped whenever the rows change."""

    # -- the committer's side --------------------------------------------------
    def reopened(self, epoch: int) -> None:
        """The engine writer was closed (its memtable flushed) and opened again,
        claiming ``epoch`` (does not block)."""
        self.epoch = epoch
        self._stats = None

    def put(self, engine: Any, table: pa.Table) -> dict[str, Any]:
        """``engine.put(table)`` and mirror its rows (blocking).

        Returns the engine's ``memtable_stats()`` after the put. The engine's
        errors are raised unchanged (nothing is mirrored then).
        """
        before = self._before(engine)
        engine.put(table)
        rows = table.append_column(
            pa.field(TOMBSTONE, pa.bool_(), nullable=False),
            pa.array(np.zeros(table.num_rows, dtype=bool)),
        )
        return self._after(engine, before, rows)

    def delete(self, engine: Any, keys: pa.Table) -> dict[str, Any]:
        """``engine.delete(keys)`` and mirror the deletes as tombstones (blocking)."""
        before = self._before(engine)
        engine.delete(keys)
        n = keys.num_rows
        columns = [
            keys.column(f.name) if f.name in self.keys else pa.nulls(n, f.type)
            for f in self.schema
            if f.name != TOMBSTONE
        ]
        rows = pa.Table.from_arrays(
            [*columns, pa.array(np.ones(n, dtype=bool))], names=self.schema.names
        )
        return self._after(engine, before, rows)

    def _before(self, engine: Any) -> dict[str, Any]:
        """The memtable's stats before a call: those read after the previous one.

        Only the committer puts into its engine writer, so nothing moves the
        memtable between two of its calls; and were a memtable sealed
        meanwhile, :meth:`_generation` still places the rows right (its
        rules hold for any earlier reading). Each ``memtable_stats()`` call
        gives up the GIL and waits to take it back, up to the interpreter's
        switch interval while the event loop is busy: one call per put
        instead of two.
        """
        stats = self._stats
        self._stats = None  # unknown until this call has returned
        if stats is None:
            stats = engine.memtable_stats()
        return stats

    def _after(self, engine: Any, before: dict[str, Any], rows: pa.Table) -> dict[str, Any]:
        try:
            after: dict[str, Any] = engine.memtable_stats()
            self._stats = after
            target = self._generation(before, after, rows.num_rows)
            relabelled = pa.Table.from_arrays(rows.columns, schema=self.schema)
            with self._lock:
                self._parts.setdefault(target, []).append(relabelled)
                self._version += 1
                self.resolved = None
            if not after.get("frozen_count") and any(g < after["generation"] for g in self._parts):
                self._forget_flushed()
            return after
        except BaseException as exc:
            self.broken = exc
            raise

    def _generation(self, before: dict[str, Any], after: dict[str, Any], n: int) -> int:
        old, new = int(before["generation"]), int(after["generation"])
        if new == old:
            return old
        if int(after["row_count"]) == 0:
            return new - 1  # the put filled its memtable, which was then sealed
        if int(after["row_count"]) == n:
            return new  # sealed before the put, which went into a new memtable
        raise LanceAsyncError(
            f"shard {self.shard_id}: cannot tell which memtable a put of {n} rows went into "
            f"(generation {old} -> {new}, {after['row_count']} rows after); the writer's LSM "
            "reads are disabled. Close the writer and open it again"
        )

    def _forget_flushed(self) -> None:
        manifest = _manifest.read_shard_manifest(self.uri, self.shard_id, self.storage_options)
        if manifest is not None:
            self.forget({s.generation for s in manifest.sstables})

    # -- the readers' side ------------------------------------------------------
    def forget(self, flushed: set[int]) -> None:
        """Drop the rows of generations the shard manifest lists as flushed."""
        with self._lock:
            gone = [g for g in self._parts if g in flushed]
            for g in gone:
                del self._parts[g]
            if gone:
                self._version += 1
                self.resolved = None
        if gone:
            memory_freed()  # the flushed rows go with the last reference to them

    @property
    def version(self) -> int:
        """Changes whenever the mirrored rows change (for caches)."""
        return self._version

    def parts(self) -> tuple[int, list[MemPart]]:
        """(version, the mirrored generations), oldest first (does not block).

        Raises
        ------
        LanceAsyncError
            The mirror is broken (a put it could not place, or an engine
            failure between a put and its stats).
        """
        if self.broken is not None:
            raise LanceAsyncError(
                f"shard {self.shard_id}: the writer's memtable cannot be read ({self.broken}); "
                "close the writer and open it again"
            ) from self.broken
        with self._lock:
            items = [(g, list(ts)) for g, ts in sorted(self._parts.items())]
            version = self._version
        return version, [
            MemPart(self.shard_id, g, pa.concat_tables(ts) if len(ts) > 1 else ts[0])
            for g, ts in items
            if ts
        ]

    def rows(self) -> int:
        """Rows (puts and deletes) mirrored now (does not block)."""
        with self._lock:
            return sum(t.num_rows for ts in self._parts.values() for t in ts)
