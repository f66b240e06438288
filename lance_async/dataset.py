"""``AsyncDataset``: a Lance dataset whose every blocking call runs off the loop.

:func:`open_dataset` and :func:`write_dataset` are the entry points. Reads
(:meth:`AsyncDataset.scan`, :meth:`~AsyncDataset.count_rows`, ...) and
mutations (:meth:`~AsyncDataset.delete`, :meth:`~AsyncDataset.update`, index
builds, compaction) run on the library's engine threads. Mutations work on a
private copy of the dataset object and then move this ``AsyncDataset`` to the
version they committed, so concurrent reads never see a dataset object change
under them (pylance mutates its ``LanceDataset`` in place).

MemWAL and LSM features hang off the same object: :meth:`~AsyncDataset.merge_insert`
(``merge.py``), :meth:`~AsyncDataset.mem_wal_writer` and the LSM reads and
compaction (the ``memwal`` package). Those take the dataset as an argument
and never import this module at run time: imports run from here down.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

import anyio
import lance
import pyarrow as pa
from lance.dataset import LanceDataset

from ._filters import check_filter
from ._schema import primary_key
from ._threads import run_sync
from .errors import DatasetNotFoundError, SchemaMismatchError, raise_mapped
from .memwal import retired
from .memwal.check import ShardCheck, check_shards
from .memwal.compaction import compact_mem_wal
from .memwal.compactor import CompactionPolicy, Compactor
from .memwal.reads import lsm_point_lookup, lsm_point_lookups, lsm_scan
from .memwal.router import ShardRouter
from .memwal.sharding import Sharding, read_sharding, sharding_options
from .memwal.snapshots import shard_snapshots
from .memwal.vector import lsm_vector_search
from .memwal.writer import AsyncShardWriter
from .merge import AsyncMergeInsertBuilder
from .sources import resolve_source
from .sources.streams import AsyncBatchStream

if TYPE_CHECKING:
    from .memwal.compaction import CompactionResult
    from .memwal.snapshots import ShardSnapshots

__all__ = ["AsyncDataset", "open_dataset", "write_dataset"]

T = TypeVar("T")
SLICED_BELOW = 16_384
"""Scans asking for batches smaller than this read batches of about this size
and slice them on the loop."""


async def _engine(func: Callable[[], T]) -> T:
    """Run an engine call on a worker thread, mapping engine errors."""
    try:
        return await run_sync(func)
    except (OSError, ValueError, RuntimeError) as exc:
        raise_mapped(exc)
        raise


def _projected_schema(
    schema: pa.Schema,
    columns: Sequence[str] | None,
    with_row_id: bool,
    nearest: Mapping[str, Any] | None,
) -> pa.Schema | None:
    if columns is not None and not isinstance(columns, (list, tuple)):
        return None  # SQL projections: known once the scan opens
    fields = [schema.field(c) for c in columns] if columns is not None else list(schema)
    if any(f is None for f in fields):
        return None
    if nearest:
        fields.append(pa.field("_distance", pa.float32()))
    if with_row_id:
        fields.append(pa.field("_rowid", pa.uint64()))
    return pa.schema(fields, metadata=schema.metadata)


class AsyncDataset:
    """A Lance dataset for async code (asyncio or trio).

    Obtain one with :func:`open_dataset` or :func:`write_dataset`. Every
    method that touches storage is a coroutine and runs its pylance call on a
    worker thread (see :func:`lance_async.configure_threads`).

    Parameters
    ----------
    dataset : lance.LanceDataset
        The pylance dataset to wrap (not copied).
    storage_options : dict, optional
        The object-store options it was opened with; every file lance_async
        reads itself (MemWAL manifests, generations) is read with them.
    """

    def __init__(
        self, dataset: LanceDataset, *, storage_options: Mapping[str, str] | None = None
    ) -> None:
        self._ds = dataset
        self._storage_options = dict(storage_options) if storage_options else None

    def __repr__(self) -> str:
        return f"<AsyncDataset {self.uri!r} version={self.version}>"

    # -- identity ---------------------------------------------------------
    @property
    def lance(self) -> LanceDataset:
        """The underlying ``lance.LanceDataset`` (for sync code on a worker thread)."""
        return self._ds

    @property
    def uri(self) -> str:
        """The dataset's URI."""
        return str(self._ds.uri)

    @property
    def storage_options(self) -> dict[str, str] | None:
        """The object-store options the dataset was opened with (a copy), or None."""
        return dict(self._storage_options) if self._storage_options else None

    @property
    def version(self) -> int:
        """The version this object reads (does not block)."""
        return int(self._ds.version)

    @property
    def schema(self) -> pa.Schema:
        """The dataset's Arrow schema, field metadata included (does not block)."""
        return self._ds.schema

    @property
    def primary_key(self) -> list[str]:
        """Primary-key column names, from Lance's field metadata ([] if none)."""
        return primary_key(self.schema)

    def _replace(self, dataset: LanceDataset) -> None:
        """Move to a newer dataset object (never backwards)."""
        if int(dataset.version) >= self.version:
            self._ds = dataset

    async def latest_version(self) -> int:
        """The newest committed version (reads the version hint on a worker thread)."""
        return int(await _engine(lambda: self._ds.latest_version))

    async def checkout(self, version: int | str) -> AsyncDataset:
        """A new ``AsyncDataset`` at ``version`` (a number or a tag).

        Raises
        ------
        DatasetNotFoundError
            No such version.
        """
        try:
            return AsyncDataset(
                await _engine(lambda: self._ds.checkout_version(version)),
                storage_options=self._storage_options,
            )
        except DatasetNotFoundError as exc:
            raise DatasetNotFoundError(
                f"the Lance dataset at {self.uri!r} has no version {version!r}"
            ) from exc.__cause__

    async def refresh(self) -> AsyncDataset:
        """Move this object to the latest version; returns ``self``."""

        def work() -> LanceDataset | None:
            latest = self._ds.latest_version
            return self._ds.checkout_version(latest) if latest != self._ds.version else None

        newer = await _engine(work)
        if newer is not None:
            self._replace(newer)
        return self

    async def versions(self) -> list[dict[str, Any]]:
        """All versions with their timestamps and metadata."""
        return [dict(v) for v in await _engine(self._ds.versions)]

    # -- reads --------------------------------------------------------------
    def scan(
        self,
        columns: Sequence[str] | Mapping[str, str] | None = None,
        filter: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        batch_size: int | None = None,
        with_row_id: bool = False,
        nearest: Mapping[str, Any] | None = None,
        prefetch: int | None = None,
        **scanner_options: Any,
    ) -> AsyncBatchStream:
        """Scan the dataset as an ``async for`` stream of record batches.

        Parameters mirror ``LanceDataset.scanner`` (pylance 14); extra keyword
        arguments are passed through to it.

        Parameters
        ----------
        columns : list of str or dict, optional
            Columns to read, or ``{name: SQL expression}``.
        filter : str, optional
            Lance SQL filter: one expression (see :func:`check_filter`;
            :class:`~lance_async.errors.FilterError` otherwise, at the call).
        limit, offset : int, optional
            Rows to return / skip.
        batch_size : int, optional
            Rows per batch at most (Lance's default otherwise); smaller than
            16,384, larger batches are read and sliced on the loop (zero-copy).
        with_row_id : bool
            Add the ``_rowid`` column.
        nearest : dict, optional
            Vector search, as in ``LanceDataset.scanner(nearest=...)``; adds
            ``_distance``.
        prefetch : int, optional
            Batches read ahead by the worker thread (default 4).

        Returns
        -------
        AsyncBatchStream
            Reads this object's current version. Nothing happens until the
            first ``__anext__``. Leaving ``async with`` or ``aclose()`` stops
            the scan and closes the reader promptly; so does ``break`` when
            nothing else holds the stream (see :class:`AsyncBatchStream`).
        """
        ds = self._ds
        if isinstance(columns, (list, tuple)):
            unknown = [c for c in columns if c not in ds.schema.names]
            if unknown:
                raise SchemaMismatchError(
                    f"no column {unknown[0]!r} in the table (it has {ds.schema.names})",
                    field=unknown[0],
                )
        options: dict[str, Any] = dict(scanner_options)
        for key, value in (
            ("columns", columns),
            ("filter", check_filter(filter)),
            ("limit", limit),
            ("offset", offset),
            ("batch_size", batch_size),
            ("nearest", nearest),
        ):
            if value is not None:
                options[key] = value
        if with_row_id:
            options["with_row_id"] = True

        def opener() -> pa.RecordBatchReader:
            try:
                return ds.scanner(**options).to_reader()
            except (OSError, ValueError) as exc:
                raise_mapped(exc)
                raise

        schema = None
        if not scanner_options:
            schema = _projected_schema(ds.schema, columns, with_row_id, nearest)  # type: ignore[arg-type]
        max_rows = None
        if batch_size is not None and batch_size < SLICED_BELOW:
            # small batches: read ~16k-row ones and slice them on the loop (zero-copy);
            # the engine and the thread hand-over cost per batch, not per row
            options["batch_size"] = batch_size * -(-SLICED_BELOW // batch_size)
            max_rows = batch_size
        return AsyncBatchStream(opener, schema=schema, prefetch=prefetch or 4, max_rows=max_rows)

    async def to_table(self, **scanner_options: Any) -> pa.Table:
        """Read rows into one table (``LanceDataset.to_table`` on a worker thread).

        Keyword arguments are those of ``LanceDataset.scanner`` (columns,
        filter, limit, offset, nearest, ...); a string ``filter`` must be
        one expression (:class:`~lance_async.errors.FilterError`).
        """
        if "filter" in scanner_options:
            scanner_options["filter"] = check_filter(scanner_options["filter"])
        return await _engine(lambda: self._ds.to_table(**scanner_options))

    async def count_rows(self, filter: str | None = None) -> int:
        """Number of rows, optionally matching a Lance SQL ``filter`` (one
        expression: :class:`~lance_async.errors.FilterError` otherwise)."""
        checked = check_filter(filter)
        return int(await _engine(lambda: self._ds.count_rows(checked)))

    async def take(self, indices: Sequence[int], columns: Sequence[str] | None = None) -> pa.Table:
        """Rows at the given offsets (0-based, in the given order)."""
        cols = list(columns) if columns is not None else None
        return await _engine(lambda: self._ds.take(list(indices), columns=cols))

    async def head(self, n: int = 5) -> pa.Table:
        """The first ``n`` rows."""
        table: pa.Table = await _engine(lambda: self._ds.to_table(limit=n))
        return table

    # -- mutations (copy, mutate, move) -----------------------------------
    async def _mutate(self, action: Callable[[LanceDataset], T]) -> T:
        def work() -> tuple[LanceDataset, T]:
            copy = self._ds.checkout_version(self._ds.latest_version)
            result = action(copy)
            return copy, result

        copy, result = await _engine(work)
        self._replace(copy)
        return result

    async def delete(self, filter: str, **options: Any) -> Any:
        """Delete rows matching a Lance SQL ``filter``; returns pylance's DeleteResult.

        Raises
        ------
        FilterError
            ``filter`` is not one expression (pylance would ignore what
            follows the first one and delete by that).
        """
        checked = check_filter(filter)
        return await self._mutate(lambda d: d.delete(checked, **options))

    async def update(
        self, values: Mapping[str, str], where: str | None = None, **options: Any
    ) -> dict[str, Any]:
        """Set columns to SQL expressions where ``where`` holds.

        Returns
        -------
        dict
            pylance's result, e.g. ``{"num_rows_updated": n}``.

        Raises
        ------
        FilterError
            ``where`` is not one expression.
        """
        checked = check_filter(where)
        return dict(await self._mutate(lambda d: d.update(dict(values), where=checked, **options)))

    async def create_index(
        self, column: str | list[str], index_type: str, **options: Any
    ) -> AsyncDataset:
        """Build a vector index (``LanceDataset.create_index``); returns ``self``."""
        await self._mutate(lambda d: d.create_index(column, index_type, **options))
        return self

    async def create_scalar_index(
        self, column: str, index_type: Any = "BTREE", **options: Any
    ) -> AsyncDataset:
        """Build a scalar index (``LanceDataset.create_scalar_index``); returns ``self``."""
        await self._mutate(lambda d: d.create_scalar_index(column, index_type, **options))
        return self

    async def compact_files(self, **options: Any) -> Any:
        """Compact small fragments (``dataset.optimize.compact_files``); returns its metrics."""
        return await self._mutate(lambda d: d.optimize.compact_files(**options))

    async def cleanup_old_versions(
        self,
        older_than: timedelta | None = None,
        retain_versions: int | None = None,
        **options: Any,
    ) -> Any:
        """Delete old versions' files (``LanceDataset.cleanup_old_versions``)."""
        return await _engine(
            lambda: self._ds.cleanup_old_versions(
                older_than=older_than, retain_versions=retain_versions, **options
            )
        )

    # -- merge_insert ------------------------------------------------------
    def merge_insert(self, on: str | Iterable[str] | None = None) -> AsyncMergeInsertBuilder:
        """Start an upsert (see :class:`~lance_async.AsyncMergeInsertBuilder`).

        Parameters
        ----------
        on : str or list of str, optional
            Join columns; default the schema's primary key.
        """

        return AsyncMergeInsertBuilder(self, on)

    # -- MemWAL ---------------------------------------------------------------
    async def initialize_mem_wal(
        self, *, manual_shards: bool = False, **options: Any
    ) -> AsyncDataset:
        """Enable the MemWAL (``LanceDataset.initialize_mem_wal``, every pylance 14
        argument accepted); returns ``self`` at the new version.

        Every key must have one shard (Lance's MemWAL spec), so the MemWAL
        gets a sharding spec: with no sharding option, bucket sharding on the
        (first) primary-key column into
        :data:`~lance_async.memwal.sharding.DEFAULT_NUM_BUCKETS` buckets.
        Pass ``bucket_column=`` and ``num_buckets=``, ``identity_column=`` or
        ``unsharded=True`` to choose, or ``manual_shards=True`` for pylance's
        manual mode (shard ids are then the callers' to choose, and keeping
        every key in one shard is theirs too; see ``docs/sharding.md``).

        Shard folders left by an earlier MemWAL of this table (pylance keeps
        them when a table is overwritten) are retired first, in a commit of
        their own: LSM reads leave them out, writers refuse them, derived
        shard ids change (see ``lance_async.memwal.retired``).

        Raises
        ------
        InvalidInputError
            The table (at its latest version) has no primary key (pylance 14
            would accept the MemWAL, but LSM reads and compaction need the
            key, so its rows could never be read back); the MemWAL is already
            initialized, or was by a concurrent call; an unknown maintained
            index (the engine's "Invalid user input"). Nothing is committed.
        ValueError
            Conflicting sharding options (raised by pylance).
        """
        chosen = sharding_options(self.schema, options, manual_shards)
        storage = self._storage_options
        await self._mutate(lambda d: retired.initialize_mem_wal(d, chosen, storage))
        return self

    async def check_shards(self) -> ShardCheck:
        """Find keys in more than one shard, or in the wrong shard (see
        :func:`lance_async.memwal.check.check_shards`)."""
        return await check_shards(self)

    async def sharding(self) -> Sharding:
        """How the MemWAL maps rows to shards (:class:`~lance_async.memwal.sharding.Sharding`).

        Raises
        ------
        InvalidInputError
            No MemWAL is initialized.
        """
        return await read_sharding(self)

    async def mem_wal_index_details(self) -> dict[str, Any] | None:
        """The MemWAL index details (shards, specs, writer defaults) or None."""
        await self.refresh()
        details = await _engine(self._ds.mem_wal_index_details)
        return dict(details) if details is not None else None

    @overload
    def mem_wal_writer(self, shard_id: None = None, **options: Any) -> ShardRouter: ...

    @overload
    def mem_wal_writer(self, shard_id: str, **options: Any) -> AsyncShardWriter: ...

    def mem_wal_writer(
        self, shard_id: str | None = None, **options: Any
    ) -> AsyncShardWriter | ShardRouter:
        """A MemWAL writer; use it as ``async with``.

        With no ``shard_id``: a :class:`~lance_async.ShardRouter`, which puts
        every row in its own shard (by the table's sharding spec) through one
        writer per shard, opened lazily. This is the writer to use unless
        shards are divided among processes. With a ``shard_id``: an
        :class:`~lance_async.AsyncShardWriter` of that one shard, which refuses
        rows of other shards (:class:`~lance_async.errors.WrongShardError`).
        ``options`` are the writer's (see :class:`~lance_async.AsyncShardWriter`);
        the router also takes ``compaction=CompactionPolicy(...)`` to compact
        flushed generations in the background while it is open (for one
        shard writer, run a :class:`~lance_async.memwal.Compactor` beside it).
        """
        if shard_id is None:
            return ShardRouter(self, **options)
        if "compaction" in options:
            raise TypeError(
                "compaction= is for the routing writer (mem_wal_writer() with no shard id); "
                "beside one shard writer, use `async with lance_async.memwal.Compactor(ds, policy)`"
            )
        return AsyncShardWriter(self, shard_id, **options)

    def shard_router(self, **options: Any) -> ShardRouter:
        """The routing writer, as ``mem_wal_writer()`` with no shard id (``async with``)."""

        return ShardRouter(self, **options)

    def compactor(self, policy: CompactionPolicy | None = None) -> Compactor:
        """A background :class:`~lance_async.memwal.Compactor` of this table (``async with``)."""

        return Compactor(self, policy)

    # -- LSM reads (memwal) ------------------------------------------------
    async def shard_snapshots(self) -> ShardSnapshots:
        """Each MemWAL shard's flushed generations (see ``memwal.shard_snapshots``)."""

        return await shard_snapshots(self)

    def lsm_scan(
        self,
        snapshots: ShardSnapshots | None = None,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        limit: int | None = None,
        *,
        batch_size: int | None = None,
    ) -> AsyncBatchStream:
        """Scan base table and flushed SSTables, newest row per primary key, streamed
        (see :func:`lance_async.memwal.lsm_scan`)."""

        return lsm_scan(
            self,
            snapshots=snapshots,
            columns=columns,
            filter=filter,
            limit=limit,
            batch_size=batch_size,
        )

    async def lsm_point_lookup(
        self,
        key: Any,
        columns: Sequence[str] | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row for one primary key (a table of 0 or 1 row); concurrent
        lookups are answered in batches (see :func:`lance_async.memwal.lsm_point_lookup`)."""

        return await lsm_point_lookup(self, key, columns=columns, snapshots=snapshots)

    async def lsm_point_lookups(
        self,
        keys: Any,
        columns: Sequence[str] | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row of each of many primary keys, in one batch, in the order
        of ``keys`` (see :func:`lance_async.memwal.lsm_point_lookups`)."""

        return await lsm_point_lookups(self, keys, columns=columns, snapshots=snapshots)

    async def lsm_vector_search(
        self,
        query: Any,
        *,
        column: str,
        k: int = 10,
        nprobes: int | None = 20,
        filter: str | None = None,
        snapshots: ShardSnapshots | None = None,
        **options: Any,
    ) -> pa.Table:
        """k nearest rows across the LSM levels, with ``_distance`` (see
        :func:`lance_async.memwal.lsm_vector_search`)."""

        return await lsm_vector_search(
            self,
            query,
            column=column,
            k=k,
            nprobes=nprobes,
            filter=filter,
            snapshots=snapshots,
            **options,
        )

    async def compact_mem_wal(
        self,
        shard_ids: Iterable[str] | None = None,
        *,
        chunk_rows: int = 65_536,
        optimize_indices: bool = True,
        max_generations: int | None = None,
    ) -> CompactionResult:
        """Merge flushed MemWAL generations into the base table.

        Every flushed, not yet compacted generation of each shard (all shards,
        or ``shard_ids``) is merged with merge_insert and marked compacted in
        the same commit; conflicts replay the immutable SSTables.
        See :func:`lance_async.memwal.compact_mem_wal` for the parameters, the
        result and the errors.
        """

        return await compact_mem_wal(
            self,
            shard_ids,
            chunk_rows=chunk_rows,
            optimize_indices=optimize_indices,
            max_generations=max_generations,
        )


async def open_dataset(
    uri: str | os.PathLike[str],
    *,
    version: int | str | None = None,
    storage_options: Mapping[str, str] | None = None,
    **options: Any,
) -> AsyncDataset:
    """Open a Lance dataset without blocking the loop.

    Parameters
    ----------
    uri : str or PathLike
        Local path or object-store URI.
    version : int or str, optional
        A version number or tag; default the latest.
    storage_options : dict, optional
        Passed to pylance.
    **options
        Other ``lance.dataset`` arguments (``commit_lock``, caches, ...).

    Returns
    -------
    AsyncDataset

    Raises
    ------
    DatasetNotFoundError
        No dataset at ``uri``.
    """
    path = os.fspath(uri)

    def work() -> LanceDataset:
        return lance.dataset(
            path,
            version=version,
            storage_options=dict(storage_options) if storage_options else None,
            **options,
        )

    try:
        return AsyncDataset(await _engine(work), storage_options=storage_options)
    except DatasetNotFoundError as exc:
        if version is not None and await anyio.Path(path, "_versions").is_dir():
            raise DatasetNotFoundError(
                f"the Lance dataset at {path!r} has no version {version!r}"
            ) from exc.__cause__
        raise DatasetNotFoundError(
            f"no Lance dataset at {path!r}; check the path or create it with write_dataset"
        ) from exc.__cause__
    except (OSError, ValueError) as exc:
        text = str(exc)
        if "not found" in text.lower() or "LanceError(IO)" in text or "Not a directory" in text:
            raise DatasetNotFoundError(
                f"no Lance dataset at {path!r} ({text.split(', /home/runner', 1)[0]})"
            ) from exc
        raise


async def write_dataset(
    source: Any,
    uri: str | os.PathLike[str],
    *,
    mode: str = "create",
    schema: pa.Schema | None = None,
    **lance_kwargs: Any,
) -> AsyncDataset:
    """Write a source to a Lance dataset, streaming it from the source.

    Parameters
    ----------
    source : anything :func:`~lance_async.coerce_source` accepts
        Tables, readers, datasets, (async) iterators of batches, files...
        Streams are never materialized: a bounded bridge feeds the writer.
    uri : str or PathLike
        Where to write.
    mode : {"create", "append", "overwrite"}
    schema : pa.Schema, optional
        Schema of the rows (and of a new dataset: put primary-key metadata
        here). Materialized inputs are converted to it losslessly; streams
        are checked against it batch by batch.
    **lance_kwargs
        Passed to ``lance.write_dataset`` (``max_rows_per_file``,
        ``data_storage_version``, ``storage_options``, ...).

    Returns
    -------
    AsyncDataset
        At the version written.

    Raises
    ------
    SchemaMismatchError
        A batch does not match the schema, or (``mode="append"``) the
        dataset's schema (nothing is committed).
    InvalidInputError
        ``mode="create"`` where a dataset already exists.
    BaseException
        Whatever the source raised, as itself (nothing is committed).
    """
    if mode not in ("create", "append", "overwrite"):
        raise ValueError(f"mode must be 'create', 'append' or 'overwrite', got {mode!r}")
    path = os.fspath(uri)
    src = await resolve_source(source, schema=schema)
    async with src.reader_plan() as plan:

        def work() -> LanceDataset:
            return lance.write_dataset(
                plan.data(), path, schema=src.schema, mode=mode, **lance_kwargs
            )

        try:
            written = await run_sync(work)
        except BaseException as exc:
            plan.reraise(exc)
            if isinstance(exc, (OSError, ValueError, RuntimeError)):
                raise_mapped(exc)
            raise
    await anyio.lowlevel.checkpoint()
    return AsyncDataset(written, storage_options=lance_kwargs.get("storage_options"))
