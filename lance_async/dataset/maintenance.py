"""Indexes, compaction, clean-up and statistics (``MaintenanceMixin``).

Index builds, index optimisation and file compaction commit new versions
through the copy-mutate-move pattern (:meth:`DatasetCore.mutate`); reads
of index and dataset statistics run on a worker thread against the version
this object reads. All of these can take minutes on large tables: the loop
stays free meanwhile, and a cancelled caller gets its cancellation once the
engine call has finished (a build cannot be interrupted half-way).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pyarrow as pa

from .._args import check_int, check_timedelta
from ..errors import SchemaMismatchError
from ..memwal.cleanup import (
    ENGINE_DEFAULT_AGE,
    CleanupStats,
    engine_stats,
    execute_plan,
    plan_cleanup,
    version_seconds,
    with_engine_counts,
)
from ._core import DatasetCore, engine_call

if TYPE_CHECKING:
    from .._table import Table

__all__ = ["MaintenanceMixin"]

D = TypeVar("D", bound="MaintenanceMixin")


def _check_column(schema: pa.Schema, column: str | list[str]) -> None:
    """Every indexed column (a nested one by its top-level name) is in the table."""
    for name in [column] if isinstance(column, str) else list(column):
        if not isinstance(name, str):
            raise TypeError(f"a column name is a str, got {type(name).__name__}")
        if name.split(".", 1)[0] not in schema.names:
            raise SchemaMismatchError(f"no column {name!r} in the table", field=name)


def _index_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"an index name is a str, got {type(name).__name__}")
    if not name:
        raise ValueError("an index name cannot be empty")
    return name


class MaintenanceMixin(DatasetCore):
    """Indexes, compaction and clean-up of :class:`~lance_async.AsyncDataset`."""

    # -- indexes -------------------------------------------------------------
    async def create_index(self: D, column: str | list[str], index_type: str, **options: Any) -> D:
        """Build a vector index (``LanceDataset.create_index``, every pylance
        option accepted); returns ``self`` at the new version.

        Raises
        ------
        SchemaMismatchError
            A column is not in the table (at the call).
        """
        _check_column(self.schema, column)
        await self._mutate(lambda d: d.create_index(column, index_type, **options))
        return self

    async def create_scalar_index(
        self: D, column: str, index_type: Any = "BTREE", **options: Any
    ) -> D:
        """Build a scalar index (``LanceDataset.create_scalar_index``); returns
        ``self`` at the new version.

        Raises
        ------
        SchemaMismatchError
            The column is not in the table (at the call).
        """
        _check_column(self.schema, column)
        await self._mutate(lambda d: d.create_scalar_index(column, index_type, **options))
        return self

    async def optimize_indices(self: D, **options: Any) -> D:
        """Bring indexes up to date with rows added since they were built
        (``LanceDataset.optimize.optimize_indices``: new rows indexed in a
        delta, or indexes merged with ``num_indices_to_merge=``, or
        retrained with ``retrain=True``; ``index_names=`` picks indexes);
        returns ``self`` at the new version.

        Raises
        ------
        ConflictError
            A concurrent commit conflicted (``retryable`` says whether to try again).
        """
        await self._mutate(lambda d: d.optimize.optimize_indices(**options))
        return self

    async def drop_index(self: D, name: str) -> D:
        """Remove an index by name (``LanceDataset.drop_index``); returns ``self``
        at the new version.

        Raises
        ------
        ValueError, TypeError
            ``name`` empty or not a str (at the call); pylance's refusal of an
            unknown index name.
        """
        index = _index_name(name)
        await self._mutate(lambda d: d.drop_index(index))
        return self

    async def describe_indices(self) -> list[Any]:
        """The indexes of the version this object reads
        (``LanceDataset.describe_indices``: ``IndexDescription`` objects)."""
        return list(await engine_call(self._ds.describe_indices))

    async def index_statistics(self, name: str) -> dict[str, Any]:
        """Statistics of one index (``LanceDataset.stats.index_stats``: type,
        indexed and unindexed rows, ...)."""
        index = _index_name(name)
        return dict(await engine_call(lambda: self._ds.stats.index_stats(index)))

    async def prewarm_index(self, name: str, **options: Any) -> None:
        """Load an index into the engine's cache ahead of queries
        (``LanceDataset.prewarm_index``)."""
        index = _index_name(name)
        await engine_call(lambda: self._ds.prewarm_index(index, **options))

    # -- files and versions ----------------------------------------------------
    async def compact_files(self, **options: Any) -> Any:
        """Compact small fragments (``LanceDataset.optimize.compact_files``, every
        pylance option accepted); returns its ``CompactionMetrics``."""
        return await self._mutate(lambda d: d.optimize.compact_files(**options))

    async def cleanup_old_versions(
        self,
        older_than: timedelta | None = None,
        retain_versions: int | None = None,
        *,
        mem_wal: bool = True,
        **options: Any,
    ) -> CleanupStats:
        """Delete old versions' files (``LanceDataset.cleanup_old_versions``,
        every pylance option accepted), then what the MemWAL no longer needs.

        The base table is cleaned by the engine with pylance's own rules
        (``older_than``: versions *created* before it; ``retain_versions``;
        default two weeks). Then, unless ``mem_wal=False``, the MemWAL's
        garbage collector (:mod:`lance_async.memwal.cleanup`): generation
        folders that every version left has compacted, shard manifests
        superseded before the same cut-off, and WAL entries every kept
        manifest has flushed (fence sentinels stay).

        Returns
        -------
        CleanupStats
            pylance's counts (``bytes_removed``, ``old_versions``, ...) and the
            MemWAL's (``wal_entries_removed``, ``generations_removed``,
            ``manifests_removed``, ``mem_wal_bytes_removed``).

        Raises
        ------
        ValueError, TypeError
            ``older_than`` negative or not a timedelta, ``retain_versions``
            below 1 (at the call).
        StorageError
            The store failed.

        Notes
        -----
        A read holding a view older than the cut-off may get
        :class:`~lance_async.ViewExpiredError` (never wrong rows). For a
        retention measured from when a version stopped being current (what
        readers need), use ``lance_async.memwal.cleanup_table`` or
        ``lance-async cleanup``.
        """
        if older_than is not None:
            check_timedelta("older_than", older_than)
        if retain_versions is not None:
            check_int("retain_versions", retain_versions, minimum=1)
        lance_stats = await engine_call(
            lambda: self._ds.cleanup_old_versions(
                older_than=older_than, retain_versions=retain_versions, **options
            )
        )
        base = engine_stats(lance_stats)
        if not mem_wal:
            return base
        now = time.time()
        left = await engine_call(self._ds.versions)
        kept = sorted(int(v["version"]) for v in left)
        if older_than is None and retain_versions is None:
            older_than = ENGINE_DEFAULT_AGE
        if older_than is not None:
            retention = older_than
        else:  # retain_versions alone: what a reader of the oldest version kept may read
            oldest = min(version_seconds(v) for v in left)
            retention = timedelta(seconds=max(0.0, now - oldest))
        table = cast("Table", self)  # the assembled AsyncDataset is one
        plan = await plan_cleanup(table, retention, now=now, retained_versions=(kept, []))
        gc = await execute_plan(table, plan, base=False)
        return with_engine_counts(gc, base)

    async def explain_cleanup_old_versions(
        self,
        older_than: timedelta | None = None,
        retain_versions: int | None = None,
        **options: Any,
    ) -> Any:
        """What :meth:`cleanup_old_versions` would remove, without removing it
        (``LanceDataset.explain_cleanup_old_versions``)."""
        if older_than is not None:
            check_timedelta("older_than", older_than)
        if retain_versions is not None:
            check_int("retain_versions", retain_versions, minimum=1)
        return await engine_call(
            lambda: self._ds.explain_cleanup_old_versions(
                older_than=older_than, retain_versions=retain_versions, **options
            )
        )

    async def validate(self) -> None:
        """Check the dataset's internal consistency (``LanceDataset.validate``).

        Raises
        ------
        OSError
            The engine's report of what is inconsistent.
        """
        await engine_call(self._ds.validate)

    async def data_stats(self) -> Any:
        """Per-field data statistics (``LanceDataset.stats.data_stats``)."""
        return await engine_call(lambda: self._ds.stats.data_stats())

    async def migrate_manifest_paths_v2(self) -> None:
        """Move the version files to Lance's V2 manifest naming
        (``LanceDataset.migrate_manifest_paths_v2``)."""
        await engine_call(self._ds.migrate_manifest_paths_v2)
