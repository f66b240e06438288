"""The LSM reads of a table: :class:`LsmReader`, one object that every door uses.

``dataset.lsm``, ``writer.lsm`` and ``router.lsm`` are each an
:class:`LsmReader` over the same table; they differ only in which live
memtables of this process they include (none, the writer's, every writer the
router has open). Every read sees the base table, every shard's flushed
generations and every shard's WAL tail, so a row acknowledged as durable by
any writer, in any process, is visible at once; through a writer (or
router) its rows not yet durable are visible too. The arguments are checked
here, once, and every read records its metric here. It is the one spelling
of each LSM read (the facades hold it as ``.lsm``; their plain reads reach
it through ``use_lsm=True``), as lancedb's tables make LSM one flag of one
query path and aiokafka's producer delegates to one accumulator.

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

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from .._args import (
    check_batch_size,
    check_columns,
    check_distance_range,
    check_int,
    check_knn,
)
from .._filters import check_lsm_filter
from .._metrics import record_lookup, record_scan
from .._schema import NO_KEY
from .._table import Table
from .._threads import call_timeouts, run_engine
from ..errors import InvalidInputError, SchemaMismatchError, ViewExpiredError
from ..sources.streams import AsyncBatchStream
from .cache import LevelCacheStats
from .expiry import expired_views, expiring
from .keyvalues import key_columns
from .levels import level_cache_stats, open_view, read_view, take_snapshot
from .lookup import CoalescerStats, LookupCoalescer, coalescer_for, lookup_view, split_rows
from .memtable import MemtableMirror
from .scan import output_schema, scan_view
from .snapshots import LsmSnapshot, ShardSnapshot, ShardSnapshots, shard_snapshots
from .vector import search_view, vector_query
from .wal import read_wal_tail

__all__ = ["SLICED_BELOW", "LsmReader"]

SLICED_BELOW = 16_384
"""Scans asking for smaller batches read batches of about this size and slice them."""

Memtables = Callable[[], Sequence[MemtableMirror]]
T = TypeVar("T")


def _no_memtables() -> Sequence[MemtableMirror]:
    return ()


async def _fresh(read: Callable[[], Awaitable[T]], given: object) -> T:
    """``await read()``, a "not found" made :class:`~lance_async.errors.ViewExpiredError`;
    a read that discovers its own view (``given`` None: no snapshot list, no
    pinned snapshot) tries once more with a fresh one when a clean-up
    removed a file of the first."""
    try:
        with expired_views():
            return await read()
    except ViewExpiredError:
        if given is not None:
            raise
    with expired_views():
        return await read()


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
                "LSM reads take lance_async ShardSnapshot objects (dataset.lsm.snapshots())"
            )
        return snaps

    def _pinned(
        self, snapshot: LsmSnapshot | None, snapshots: ShardSnapshots | None
    ) -> LsmSnapshot | None:
        """The point-in-time view of a read, checked (no I/O)."""
        if snapshot is None:
            return None
        if snapshots is not None:
            raise ValueError("give snapshot= (a point-in-time view) or snapshots=, not both")
        if not isinstance(snapshot, LsmSnapshot):
            raise InvalidInputError(
                f"snapshot= takes an LsmSnapshot (await dataset.lsm.snapshot()), "
                f"got {type(snapshot).__name__}"
            )
        if snapshot.uri != self._table.uri:
            raise InvalidInputError(
                f"this snapshot is of {snapshot.uri!r}, not of {self._table.uri!r}"
            )
        return snapshot

    def _check_live(self, snaps: object, pin: object) -> None:
        """Refuse a read that discovers the live state on a checked-out table.

        Such a read moves the table object to the latest version (it reads the
        MemWAL, which is live state): on an object from ``checkout(version)``
        that would silently end its time travel. A read of snapshots given
        (``snapshots=``, ``snapshot=``) is allowed. LanceDB refuses the same.
        """
        if snaps is None and pin is None and self._table.checked_out:
            raise InvalidInputError(
                f"{self._table.uri!r} is checked out at version {self._table.version}: "
                "an LSM read shows the table's live state (the MemWAL is not versioned "
                "with the base table); read that version with plain reads, or await "
                "refresh() (or open the table again) to read it live"
            )

    # -- reads ---------------------------------------------------------------
    async def snapshots(self) -> list[ShardSnapshot]:
        """Each live shard's flushed generations and where its WAL tail starts
        (see :func:`~lance_async.lsm.snapshots.shard_snapshots`)."""
        self._check_live(None, None)
        self._memtables()
        with call_timeouts(self._table.storage_timeout):
            return await shard_snapshots(self._table)

    async def snapshot(self) -> LsmSnapshot:
        """Pin the table's LSM state now: a point-in-time view for later reads.

        Every read given the result (``snapshot=``: :meth:`scan`,
        :meth:`point_lookup`, :meth:`point_lookups`, :meth:`vector_search`)
        sees exactly the state of this moment -- the shard set, each shard's
        flushed generations and WAL position, the base table's version, and
        (through a writer's or router's reader) the rows of its live
        memtables -- however long it is held and whatever is written,
        flushed or compacted meanwhile, in any process. Reads without one
        see the table as it is when they run.

        Returns
        -------
        LsmSnapshot
            Immutable, holds no resource; one of a dataset's reader pickles
            (another process may read the same view).

        Raises
        ------
        InvalidInputError
            The table has no primary key.
        ClosedError
            The writer (or router) this reader belongs to is not open.

        Notes
        -----
        One thread hop: the latest version, the shard manifests, each
        shard's WAL tail read to its end (cached for the reads that follow).
        A view stays readable while the files it pins exist: past the
        MemWAL's storage retention (or a ``cleanup_old_versions`` of its
        base version) its reads raise
        :class:`~lance_async.errors.ViewExpiredError`. A storage engine's
        read snapshot (RocksDB's ``GetSnapshot()``) is the model.
        """
        self._check_live(None, None)
        mirrors = self._memtables()
        with call_timeouts(self._table.storage_timeout):
            return await take_snapshot(self._table, mirrors)

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
        snapshot: LsmSnapshot | None = None,
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
            Read only these shards, as listed: their generations, their WAL
            tails (up to each one's ``wal_end``, or up to now when it has
            none), over the base table at the version the dataset object
            reads. Default: the shards discovered when the scan starts.
        snapshot : LsmSnapshot, optional
            Read this point-in-time view (:meth:`snapshot`) instead of now.

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
        FilterError
            ``filter`` is not one expression, or names a row id or address
            (``_rowid``, ``_rowaddr``: each level numbers its own rows), at
            the call.
        InvalidInputError
            The table has no primary key, or a bad filter (on the first batch).
        ClosedError
            The writer (or router) this reader belongs to is not open (a
            ``snapshot=`` read does not need it open: the view holds its rows).
        ViewExpiredError
            ``snapshot`` given and a file it pins was deleted since.
        """
        cols = self._columns(columns)
        if limit is not None:
            check_int("limit", limit, minimum=0)
        skip = check_int("offset", offset, minimum=0) if offset is not None else 0
        if batch_size is not None:
            check_batch_size("batch_size", batch_size)
        filter = check_lsm_filter(filter)  # one expression, as on every read path
        snaps = self._snapshots(snapshots)
        pin = self._pinned(snapshot, snapshots)
        self._check_live(snaps, pin)
        memtables = self._memtables if pin is None else _no_memtables
        memtables()
        table = self._table
        record_scan(table.uri, self._path)
        read_size, max_rows = batch_size, None
        if batch_size is not None and batch_size < SLICED_BELOW:  # read large, slice on the loop
            read_size, max_rows = batch_size * -(-SLICED_BELOW // batch_size), batch_size

        async def prepare() -> Callable[[], Any]:
            with call_timeouts(table.storage_timeout):
                view = await _fresh(
                    lambda: open_view(table, snaps, memtables(), pinned=pin), snaps or pin
                )
            return partial(
                expiring,
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
        pinned: LsmSnapshot | None = None,
    ) -> tuple[pa.Table, np.ndarray]:
        answer = partial(lookup_view, probe=probe, columns=columns)

        async def read() -> tuple[pa.Table, np.ndarray]:
            if pinned is not None:
                view = await open_view(self._table, pinned=pinned)
            elif snapshots is None:
                return await read_view(self._table, answer, self._memtables())
            else:
                view = await open_view(self._table, snapshots, self._memtables())
            return await run_engine(partial(answer, view))

        with call_timeouts(self._table.storage_timeout):
            return await _fresh(read, snapshots or pinned)

    def _coalescer(self) -> LookupCoalescer:
        return coalescer_for(self, lambda: LookupCoalescer(self._lookup_batch))

    async def point_lookup(
        self,
        key: Any,
        columns: Sequence[str] | None = None,
        *,
        snapshots: ShardSnapshots | None = None,
        snapshot: LsmSnapshot | None = None,
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
            Only these shards, as listed (see :meth:`scan`). Default:
            discovered now (then the lookup is coalesced).
        snapshot : LsmSnapshot, optional
            Read this point-in-time view (:meth:`snapshot`) instead of now.

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
        ViewExpiredError
            ``snapshot`` given and a file it pins was deleted since.
        """
        cols = self._columns(columns)
        probe = self._keys([key])
        snaps = self._snapshots(snapshots)
        pin = self._pinned(snapshot, snapshots)
        self._check_live(snaps, pin)
        if pin is None:
            self._memtables()
        record_lookup(self._table.uri, self._path)
        if snaps is not None or pin is not None:
            rows, owner = await self._lookup_batch(probe, cols, snaps, pin)
            return split_rows(rows, owner, 1)[0]
        return await self._coalescer().lookup(probe, cols)

    async def point_lookups(
        self,
        keys: Any,
        columns: Sequence[str] | None = None,
        *,
        snapshots: ShardSnapshots | None = None,
        snapshot: LsmSnapshot | None = None,
    ) -> pa.Table:
        """The newest row of each of many primary keys, in one batch.

        Parameters
        ----------
        keys : sequence of keys, or key columns (pa.Table, mapping of lists, pa.Array)
            As :meth:`point_lookup` takes one key.
        columns : list of str, optional
        snapshots : list of ShardSnapshot, optional
        snapshot : LsmSnapshot, optional
            As :meth:`point_lookup`.

        Returns
        -------
        pa.Table
            One row per key found (absent and deleted keys have none), in the
            order of ``keys``; a key given twice is answered twice.

        Raises
        ------
        InvalidInputError, SchemaMismatchError, ClosedError, ViewExpiredError
            As :meth:`point_lookup`.
        """
        cols = self._columns(columns)
        probe = self._keys(keys)
        snaps = self._snapshots(snapshots)
        pin = self._pinned(snapshot, snapshots)
        self._check_live(snaps, pin)
        if pin is None:
            self._memtables()
        record_lookup(self._table.uri, self._path, len(probe[0]))
        if not len(probe[0]):
            return output_schema(self._table.schema, cols).empty_table()
        rows, owner = await self._lookup_batch(probe, cols, snaps, pin)
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
        overfetch_factor: float = 1.0,
        distance_range: tuple[float | None, float | None] | None = None,
        offset: int = 0,
        postfilter: bool = False,
        bypass_vector_index: bool = False,
        snapshots: ShardSnapshots | None = None,
        snapshot: LsmSnapshot | None = None,
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
            Lance SQL, applied before ranking (a prefilter) unless
            ``postfilter``; it may not name ``_rowid`` or ``_rowaddr``.
        columns : list of str, optional
            Columns to return besides ``_distance`` (default all).
        metric : {"l2", "cosine", "dot"}
        refine_factor : int, optional
            Re-rank ``refine_factor * k`` base candidates with exact distances.
        overfetch_factor : float
            Each level gives its ``ceil(k * overfetch_factor)`` nearest live
            rows before the merge keeps the ``k`` nearest (default 1.0, at
            least 1.0), as pylance's ``LsmVectorSearchPlanner.plan_search``
            takes it. Rows a newer level hides are excluded *before* ranking
            here, so ``k`` rows come back whenever ``k`` live rows exist
            without it; a larger pool only raises the recall of an
            approximate base index (more of its candidates are ranked).
        distance_range : (float or None, float or None), optional
            ``(lower, upper)``: only rows with ``lower <= _distance < upper``
            (half-open, in the metric's distance as ``_distance`` reports
            it: squared L2, 1 - cosine, 1 - dot; a bound None is open), the
            ``k`` nearest of them. pylance's ``nearest["distance_range"]``
            and LanceDB's ``distance_range(lower_bound, upper_bound)``.
            Applied inside each level's search, so a level whose nearest
            rows are below ``lower`` still gives its rows in range.
        offset : int
            Skip the ``offset`` nearest rows of the merged ranking (default
            0): ``offset=k`` is the second page of ``k``. Each level gives
            ``k + offset`` rows, so a page is full whenever that many live
            rows exist (LanceDB's ``offset``; pylance's ``offset`` over
            ``k + offset`` nearest).
        postfilter : bool
            Rank first, then filter (default False: filter, then rank):
            the ``k + offset`` nearest live rows are found unfiltered, those
            failing ``filter`` are dropped, then ``offset`` skips; fewer
            than ``k`` rows may come back. LanceDB's ``postfilter()``,
            pylance's ``prefilter=False``. A key's newest version is the one
            ranked and filtered: an older version never stands in for it.
        bypass_vector_index : bool
            Search the base table exactly (every row's distance) instead of
            through its vector index; ``nprobes`` and ``refine_factor`` are
            then unused (LanceDB's ``bypass_vector_index()``, pylance's
            ``use_index=False``). The other levels are always exact.
        snapshots : list of ShardSnapshot, optional
            Only these shards, as listed (see :meth:`scan`). Default:
            discovered now.
        snapshot : LsmSnapshot, optional
            Read this point-in-time view (:meth:`snapshot`) instead of now.

        Returns
        -------
        pa.Table
            At most ``k`` rows with ``_distance`` (float32), nearest first;
            equal distances in key order.

        Raises
        ------
        TypeError, ValueError
            ``k``, ``nprobes`` or ``refine_factor`` below 1, a negative
            ``offset`` (or ``k + offset`` above 1,000,000), an unknown
            ``metric``, ``columns`` given as one string, ``overfetch_factor``
            below 1 or not a number, a ``distance_range`` that is not a pair
            of numbers (or None) with ``lower < upper``, ``postfilter`` or
            ``bypass_vector_index`` not a bool (at the call).
        FilterError
            ``filter`` is not one expression, or names a row id or address
            (at the call).
        SchemaMismatchError
            ``column`` or a ``columns`` entry is not in the table.
        InvalidInputError
            A query that is not a vector of the column's dimension.
        ViewExpiredError
            ``snapshot`` given and a file it pins was deleted since.

        Notes
        -----
        The base table's search is as exact as its index (``nprobes``,
        ``refine_factor``); the other levels are searched exactly.
        pylance 14's ``LsmVectorSearchPlanner`` is not a substitute: it
        returns no row when the base table has no vector index, and with an
        IVF index on the base it misses rows held in flushed generations
        (``docs/lsm-reads.md``; ``tests/lsm/test_vector_parity.py`` pins it).
        """
        check_knn(
            {
                "k": k,
                "nprobes": nprobes,
                "refine_factor": refine_factor,
                "overfetch_factor": overfetch_factor,
                "metric": metric,
                "columns": columns,
                "offset": offset,
                "postfilter": postfilter,
                "bypass_vector_index": bypass_vector_index,
            }
        )
        bounds = check_distance_range(distance_range)
        filter = check_lsm_filter(filter)
        q = vector_query(self._table.schema, column, query, columns)
        snaps = self._snapshots(snapshots)
        pin = self._pinned(snapshot, snapshots)
        self._check_live(snaps, pin)
        memtables = self._memtables if pin is None else _no_memtables
        memtables()
        record_lookup(self._table.uri, f"{self._path}-vector")

        async def search() -> pa.Table:
            view = await open_view(self._table, snaps, memtables(), pinned=pin)
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
                overfetch_factor=float(overfetch_factor),
                distance_range=bounds,
                offset=int(offset),
                postfilter=postfilter,
                use_index=not bypass_vector_index,
            )
            return await run_engine(work)

        with call_timeouts(self._table.storage_timeout):
            return await _fresh(search, snaps or pin)

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
                    uri,
                    s.shard_id,
                    s.replay_after,
                    schema,
                    options,
                    manifest_version=s.manifest_version,
                ).row_count
                for s in snaps
            }

        with call_timeouts(table.storage_timeout), expired_views():
            return await run_engine(count)

    @staticmethod
    def cache_stats() -> LevelCacheStats:
        """What this process's cache of flushed generations holds (every
        reader of every table shares it; does not block).

        Its budget is ``configure_memory(lsm_cache_bytes=...)``; a
        generation leaves it once a view sees it compacted
        (:mod:`lance_async.lsm.cache`).
        """
        return level_cache_stats()

    def lookup_stats(self) -> CoalescerStats:
        """What this reader's point-lookup coalescer did in this event loop (does not block)."""
        current: LookupCoalescer | None = getattr(self, "_lance_async_lookups", None)
        if current is None:
            return CoalescerStats(0, 0, 0, 0)
        return current.stats()
