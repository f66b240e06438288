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
  (``vector.py``); :meth:`LsmReader.full_text_search` each level's own
  matches (``text.py``). Both live in ``searches.py``, the checks every read
  shares (and :meth:`LsmReader.snapshot`) in ``readerbase.py``.

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

from .._args import (
    check_batch_size,
    check_int,
)
from .._filters import check_lsm_filter
from .._metrics import record_lookup, record_scan
from .._threads import call_timeouts, run_engine
from ..sources.streams import AsyncBatchStream
from .cache import LevelCacheStats
from .expiry import expired_views, expiring
from .levels import level_cache_stats, open_view, read_view
from .lookup import CoalescerStats, LookupCoalescer, coalescer_for, lookup_view, split_rows
from .readerbase import fresh
from .scan import output_schema, scan_view
from .searches import SearchReads
from .snapshots import LsmSnapshot, ShardSnapshot, ShardSnapshots
from .wal import read_wal_tail

__all__ = ["SLICED_BELOW", "LsmReader"]

SLICED_BELOW = 16_384
"""Scans asking for smaller batches read batches of about this size and slice them."""


class LsmReader(SearchReads):
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
        views = self._views(snapshots, snapshot)
        table = self._table
        record_scan(table.uri, self._path)
        read_size, max_rows = batch_size, None
        if batch_size is not None and batch_size < SLICED_BELOW:  # read large, slice on the loop
            read_size, max_rows = batch_size * -(-SLICED_BELOW // batch_size), batch_size

        async def prepare() -> Callable[[], Any]:
            with call_timeouts(table.storage_timeout):
                view = await fresh(views.open, views.given)
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
            return await fresh(read, snapshots or pinned)

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
