"""The LSM reads of a table: :class:`LsmReader`, one object that every door uses.

``dataset.lsm``, ``writer.lsm`` and ``router.lsm`` are each an
:class:`LsmReader` over the same table; they differ only in which live
memtables of this process they include (none, the writer's, every writer the
router has open). Every read sees the base table, every shard's flushed
generations and every shard's WAL tail, so a row acknowledged as durable by
any writer, in any process, is visible at once; through a writer (or
router) its rows not yet durable are visible too. The arguments are checked
here, once, and every read records its metric here. The facades' methods of
the same name (:class:`LsmMethods`: ``lsm_scan``, ``lsm_point_lookup``,
``lsm_point_lookups``, ``lsm_vector_search``) delegate to it, as lancedb's
tables make LSM one flag of one query path and aiokafka's producer delegates
to one accumulator.

* :meth:`LsmReader.scan` streams (``scan.py``): memory bounded by the batch
  size, the first batch after the small levels are read, a cancel that lands
  within one batch.
* :meth:`LsmReader.point_lookup` calls issued concurrently on one reader are
  answered together by a :class:`~lance_async.lsm.lookup.LookupCoalescer`
  (one view of the levels and one probe of each per batch);
  :meth:`LsmReader.point_lookups` is the batch form.
* :meth:`LsmReader.vector_search` ranks each level's own nearest live rows
  (``vector.py``).

Every engine call of a read has the table's ``storage_timeout`` (a store
that does not answer fails the read with
:class:`~lance_async.errors.StorageTimeoutError`), and the engine's errors
reach the caller mapped (a refusing store is a
:class:`~lance_async.errors.StorageError`), as on the write side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from .._args import check_batch_size, check_columns, check_int, check_knn
from .._filters import check_filter
from .._metrics import record_lookup, record_scan
from .._schema import NO_KEY
from .._table import Table
from .._threads import call_timeouts, run_engine
from ..errors import InvalidInputError, SchemaMismatchError
from ..sources.streams import AsyncBatchStream
from .keyvalues import key_columns
from .levels import open_view, read_view
from .lookup import CoalescerStats, LookupCoalescer, coalescer_for, lookup_view, split_rows
from .memtable import MemtableMirror
from .scan import output_schema, scan_view
from .snapshots import ShardSnapshot, ShardSnapshots, shard_snapshots
from .vector import search_view, vector_query
from .wal import read_wal_tail

__all__ = ["SLICED_BELOW", "LsmMethods", "LsmReader"]

SLICED_BELOW = 16_384
"""Scans asking for smaller batches read batches of about this size and slice them."""

Memtables = Callable[[], Sequence[MemtableMirror]]


def _no_memtables() -> Sequence[MemtableMirror]:
    return ()


class LsmReader:
    """The LSM reads of one table: base, flushed generations, WAL tails, memtables.

    Reach it as ``dataset.lsm``, ``writer.lsm`` or ``router.lsm`` (see the
    module notes); build one directly only to read a table with the live
    memtables of your own choosing.

    Parameters
    ----------
    table : Table
        An :class:`~lance_async.AsyncDataset`; moved to its latest version by
        every read that discovers the shards.
    memtables : callable, optional
        Returns this process's live writers' memtables to read besides the
        stored levels (a writer's or a router's); raises if the owner cannot
        be read now (a closed writer: :class:`~lance_async.errors.ClosedError`).
    path : str
        The metrics label of these reads (``"lsm"`` for a dataset,
        ``"writer"`` for a writer or router).

    Notes
    -----
    Every engine call runs on a worker thread; nothing here blocks the event
    loop. Point lookups are coalesced per reader and event loop.
    """

    def __init__(
        self, table: Table, memtables: Memtables | None = None, *, path: str = "lsm"
    ) -> None:
        self._table = table
        self._memtables = memtables or _no_memtables
        self._path = path

    def __repr__(self) -> str:
        return f"<LsmReader {self._table.uri!r} path={self._path}>"

    # -- checks (no I/O) -----------------------------------------------------
    def _columns(self, columns: Sequence[str] | None) -> list[str] | None:
        check_columns(columns)
        if columns is None:
            return None
        schema = self._table.schema
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise SchemaMismatchError(f"no column {missing[0]!r} in the table", field=missing[0])
        return list(columns)

    def _keys(self, values: Any) -> list[pa.Array]:
        pk = self._table.primary_key
        if not pk:
            raise InvalidInputError(NO_KEY)
        return key_columns(self._table.schema, pk, values)

    @staticmethod
    def _snapshots(snapshots: ShardSnapshots | None) -> list[ShardSnapshot] | None:
        if snapshots is None:
            return None
        snaps = list(snapshots)
        if not all(isinstance(s, ShardSnapshot) for s in snaps):
            raise InvalidInputError(
                "LSM reads take lance_async ShardSnapshot objects (dataset.shard_snapshots())"
            )
        return snaps

    # -- reads ---------------------------------------------------------------
    async def snapshots(self) -> list[ShardSnapshot]:
        """Each live shard's flushed generations and where its WAL tail starts
        (see :func:`~lance_async.lsm.snapshots.shard_snapshots`)."""
        self._memtables()
        with call_timeouts(self._table.storage_timeout):
            return await shard_snapshots(self._table)

    def scan(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        limit: int | None = None,
        *,
        offset: int | None = None,
        with_row_id: bool = False,
        batch_size: int | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> AsyncBatchStream:
        """Every key's newest live row across the levels, streamed.

        Parameters
        ----------
        columns : list of str, optional
            Default all.
        filter : str, optional
            Lance SQL, applied to the newest version of each row.
        limit : int, optional
            Rows at most.
        offset : int, optional
            Rows to skip first, in the order of the scan (unflushed rows,
            generations newest first, then the base table).
        with_row_id : bool
            Add ``_rowid`` (uint64): a base row's id; null for rows of the
            newer levels, which have none until compacted.
        batch_size : int, optional
            Rows per batch at most.
        snapshots : list of ShardSnapshot, optional
            Read these (and their WAL tails) instead of discovering the shards
            when the scan starts.

        Returns
        -------
        AsyncBatchStream
            Memory is bounded by the prefetch (4 batches), not the result;
            closing the stream (or leaving ``async with``) frees its thread
            within one batch. Does not block.

        Raises
        ------
        TypeError, ValueError
            ``columns`` given as one string, a negative ``limit`` or
            ``offset``, ``batch_size`` below 1 (at the call).
        SchemaMismatchError
            A column not in the table (at the call).
        InvalidInputError
            The table has no primary key, or a bad filter (on the first batch).
        ClosedError
            The writer (or router) this reader belongs to is not open.
        """
        cols = self._columns(columns)
        if limit is not None:
            check_int("limit", limit, minimum=0)
        skip = check_int("offset", offset, minimum=0) if offset is not None else 0
        if batch_size is not None:
            check_batch_size("batch_size", batch_size)
        filter = check_filter(filter)  # one expression, as on every read path
        snaps = self._snapshots(snapshots)
        self._memtables()
        table, memtables = self._table, self._memtables
        record_scan(table.uri, self._path)
        read_size, max_rows = batch_size, None
        if batch_size is not None and batch_size < SLICED_BELOW:  # read large, slice on the loop
            read_size, max_rows = batch_size * -(-SLICED_BELOW // batch_size), batch_size

        async def prepare() -> Callable[[], Any]:
            with call_timeouts(table.storage_timeout):
                view = await open_view(table, snaps, memtables())
            return partial(
                scan_view,
                view,
                cols,
                filter,
                limit,
                read_size,
                offset=skip,
                with_row_id=with_row_id,
            )

        schema = output_schema(table.schema, cols, with_row_id)
        return AsyncBatchStream(None, schema=schema, prepare=prepare, prefetch=4, max_rows=max_rows)

    async def _lookup_batch(
        self,
        probe: list[pa.Array],
        columns: Sequence[str] | None,
        snapshots: list[ShardSnapshot] | None = None,
    ) -> tuple[pa.Table, np.ndarray]:
        answer = partial(lookup_view, probe=probe, columns=columns)
        with call_timeouts(self._table.storage_timeout):
            if snapshots is None:
                return await read_view(self._table, answer, self._memtables())
            view = await open_view(self._table, snapshots, self._memtables())
            return await run_engine(partial(answer, view))

    def _coalescer(self) -> LookupCoalescer:
        return coalescer_for(self, lambda: LookupCoalescer(self._lookup_batch))

    async def point_lookup(
        self,
        key: Any,
        columns: Sequence[str] | None = None,
        *,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row of one primary key.

        Lookups issued concurrently on one reader are answered together, in
        batches (one discovery of the shards and one probe of each level per
        batch).

        Parameters
        ----------
        key : scalar, dict or tuple
            The key value; composite keys as ``{"a": 1, "b": "x"}`` or ``(1, "x")``.
        columns : list of str, optional
        snapshots : list of ShardSnapshot, optional
            Default: discovered now (then the lookup is coalesced).

        Returns
        -------
        pa.Table
            0 rows (absent or deleted) or 1 row.

        Raises
        ------
        InvalidInputError
            A key of the wrong shape or type, or a table without a primary key.
        SchemaMismatchError
            A column not in the table.
        ClosedError
            The writer (or router) this reader belongs to is not open.
        """
        cols = self._columns(columns)
        probe = self._keys([key])
        snaps = self._snapshots(snapshots)
        self._memtables()
        record_lookup(self._table.uri, self._path)
        if snaps is not None:
            rows, owner = await self._lookup_batch(probe, cols, snaps)
            return split_rows(rows, owner, 1)[0]
        return await self._coalescer().lookup(probe, cols)

    async def point_lookups(
        self,
        keys: Any,
        columns: Sequence[str] | None = None,
        *,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row of each of many primary keys, in one batch.

        Parameters
        ----------
        keys : sequence of keys, or key columns (pa.Table, mapping of lists, pa.Array)
            As :meth:`point_lookup` takes one key.
        columns : list of str, optional
        snapshots : list of ShardSnapshot, optional

        Returns
        -------
        pa.Table
            One row per key found (absent and deleted keys have none), in the
            order of ``keys``; a key given twice is answered twice.

        Raises
        ------
        InvalidInputError, SchemaMismatchError, ClosedError
            As :meth:`point_lookup`.
        """
        cols = self._columns(columns)
        probe = self._keys(keys)
        snaps = self._snapshots(snapshots)
        self._memtables()
        record_lookup(self._table.uri, self._path, len(probe[0]))
        if not len(probe[0]):
            return output_schema(self._table.schema, cols).empty_table()
        rows, owner = await self._lookup_batch(probe, cols, snaps)
        order = owner.argsort(kind="stable")
        return rows.take(pa.array(order)) if len(order) else rows

    async def vector_search(
        self,
        query: Any,
        *,
        column: str,
        k: int = 10,
        nprobes: int | None = 20,
        filter: str | None = None,
        columns: Sequence[str] | None = None,
        metric: str = "l2",
        refine_factor: int | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The ``k`` nearest rows across the levels, newest version per key.

        Parameters
        ----------
        query : array-like of float, shape (dim,)
        column : str
            The vector column (fixed-size list of floats).
        k : int
            Rows to return (default 10).
        nprobes : int, optional
            IVF partitions to search in the base table's index (default 20).
        filter : str, optional
            Lance SQL, applied before ranking (a prefilter).
        columns : list of str, optional
            Columns to return besides ``_distance`` (default all).
        metric : {"l2", "cosine", "dot"}
        refine_factor : int, optional
            Re-rank ``refine_factor * k`` base candidates with exact distances.
        snapshots : list of ShardSnapshot, optional
            Default: discovered now.

        Returns
        -------
        pa.Table
            At most ``k`` rows with ``_distance`` (float32), nearest first;
            equal distances in key order. Rows a newer level hides are
            excluded before ranking, so ``k`` rows come back whenever ``k``
            live rows exist (no over-fetch is needed, so none is offered).

        Raises
        ------
        TypeError, ValueError
            ``k``, ``nprobes`` or ``refine_factor`` below 1, an unknown
            ``metric``, ``columns`` given as one string (at the call).
        SchemaMismatchError
            ``column`` or a ``columns`` entry is not in the table.
        InvalidInputError
            A query that is not a vector of the column's dimension.

        Notes
        -----
        The base table's search is as exact as its index (``nprobes``,
        ``refine_factor``); the other levels are searched exactly.
        """
        check_knn(
            {
                "k": k,
                "nprobes": nprobes,
                "refine_factor": refine_factor,
                "metric": metric,
                "columns": columns,
            }
        )
        filter = check_filter(filter)
        q = vector_query(self._table.schema, column, query, columns)
        snaps = self._snapshots(snapshots)
        self._memtables()
        record_lookup(self._table.uri, f"{self._path}-vector")
        with call_timeouts(self._table.storage_timeout):
            view = await open_view(self._table, snaps, self._memtables())
        work = partial(
            search_view,
            view,
            q,
            column,
            k,
            nprobes=nprobes,
            refine_factor=refine_factor,
            filter=filter,
            columns=columns,
            metric=metric,
        )
        with call_timeouts(self._table.storage_timeout):
            return await run_engine(work)

    async def unflushed_rows(self) -> dict[str, int]:
        """Rows (puts and deletes) each live shard holds in its WAL tail:
        durable, visible to every read, not yet in a flushed generation.

        Returns
        -------
        dict of str to int
            By shard id (shards with an empty tail included).
        """
        snaps = await self.snapshots()
        table = self._table
        schema, uri, options = table.schema, table.uri, table.storage_options

        def count() -> dict[str, int]:
            return {
                s.shard_id: read_wal_tail(
                    uri, s.shard_id, s.replay_after, schema, options
                ).rows.num_rows
                for s in snaps
            }

        with call_timeouts(table.storage_timeout):
            return await run_engine(count)

    def lookup_stats(self) -> CoalescerStats:
        """What this reader's point-lookup coalescer did in this event loop (does not block)."""
        current: LookupCoalescer | None = getattr(self, "_lance_async_lookups", None)
        if current is None:
            return CoalescerStats(0, 0, 0, 0)
        return current.stats()


class LsmMethods:
    """The LSM reads as methods of a facade (dataset, shard writer, router).

    Each delegates to the facade's :class:`LsmReader`, its ``lsm`` attribute;
    the documentation is the reader's.
    """

    lsm: LsmReader
    """This object's LSM reads (see :class:`LsmReader`)."""

    def lsm_scan(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        limit: int | None = None,
        *,
        offset: int | None = None,
        with_row_id: bool = False,
        batch_size: int | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> AsyncBatchStream:
        """Every key's newest live row across the LSM levels, streamed
        (:meth:`LsmReader.scan`)."""
        return self.lsm.scan(
            columns,
            filter,
            limit,
            offset=offset,
            with_row_id=with_row_id,
            batch_size=batch_size,
            snapshots=snapshots,
        )

    async def lsm_point_lookup(
        self,
        key: Any,
        columns: Sequence[str] | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row of one primary key, 0 or 1 row (:meth:`LsmReader.point_lookup`)."""
        return await self.lsm.point_lookup(key, columns, snapshots=snapshots)

    async def lsm_point_lookups(
        self,
        keys: Any,
        columns: Sequence[str] | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row of each of many keys, in their order
        (:meth:`LsmReader.point_lookups`)."""
        return await self.lsm.point_lookups(keys, columns, snapshots=snapshots)

    async def lsm_vector_search(self, query: Any, *, column: str, **options: Any) -> pa.Table:
        """The k nearest rows across the LSM levels, with ``_distance``
        (:meth:`LsmReader.vector_search`; the same keywords)."""
        return await self.lsm.vector_search(query, column=column, **options)
