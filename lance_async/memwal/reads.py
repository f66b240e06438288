"""LSM reads: scans and point lookups over the base table, flushed SSTables and memtables.

Newest row per primary key wins across the levels (``levels.py`` resolves
them). :func:`lsm_scan` streams (``scan.py``): memory bounded by the batch
size, the first batch after the small levels are read, a cancel that lands
within one batch. :func:`lsm_point_lookup` calls issued concurrently on one
table are answered together by a :class:`~lance_async.memwal.lookup.LookupCoalescer`
(one view of the levels and one probe of each per batch);
:func:`lsm_point_lookups` is the batch form. The :class:`WriterReads` mixin
gives a live writer the same reads over its memtable too: every row acked so
far is visible, sealed memtables included (read from the writer's
:class:`~lance_async.memwal.mirror.MemtableMirror`, not from pylance 14's
scanner, which hides a sealed memtable for 50-80 ms).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pyarrow as pa

from .._args import check_batch_size, check_int, check_seconds
from .._filters import check_filter
from .._threads import run_sync
from ..errors import InvalidInputError, LanceAsyncError, SchemaMismatchError
from ..sources.streams import AsyncBatchStream
from .levels import open_view, read_view
from .lookup import LookupCoalescer, coalescer_for, key_columns, lookup_view, split_rows
from .mirror import MemtableMirror
from .retired import NO_KEY
from .scan import output_schema, scan_view
from .snapshots import ShardSnapshots
from .vector import lsm_vector_search

if TYPE_CHECKING:
    import numpy as np

    from ..dataset import AsyncDataset

__all__ = [
    "WriterReads",
    "lsm_point_lookup",
    "lsm_point_lookups",
    "lsm_scan",
    "wait_unsealed",
]

Mirrors = Callable[[], Sequence[MemtableMirror]]
SLICED_BELOW = 16_384
"""Scans asking for smaller batches read batches of about this size and slice them."""


def _no_mirrors() -> Sequence[MemtableMirror]:
    return ()


def _check_columns(schema: pa.Schema, columns: Sequence[str] | None) -> None:
    if columns is None:
        return
    if isinstance(columns, str):
        raise TypeError("columns must be a list of column names, not a string")
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise SchemaMismatchError(f"no column {missing[0]!r} in the table", field=missing[0])


def scan_stream(
    dataset: AsyncDataset,
    mirrors: Mirrors,
    snapshots: ShardSnapshots | None,
    columns: Sequence[str] | None,
    filter: str | None,
    limit: int | None,
    batch_size: int | None,
    prefetch: int = 4,
) -> AsyncBatchStream:
    """An LSM scan as an :class:`AsyncBatchStream` (the levels are resolved on first use)."""
    _check_columns(dataset.schema, columns)
    if limit is not None:
        check_int("limit", limit, minimum=0)
    if batch_size is not None:
        check_batch_size("batch_size", batch_size)
    cols = list(columns) if columns is not None else None
    filter = check_filter(filter)  # one expression, as on every read path
    read_size, max_rows = batch_size, None
    if batch_size is not None and batch_size < SLICED_BELOW:  # read large, slice on the loop
        read_size, max_rows = batch_size * -(-SLICED_BELOW // batch_size), batch_size

    async def prepare() -> Callable[[], Any]:
        view = await open_view(dataset, snapshots, mirrors())
        return partial(scan_view, view, cols, filter, limit, read_size)

    schema = output_schema(dataset.schema, cols)
    return AsyncBatchStream(
        None, schema=schema, prepare=prepare, prefetch=prefetch, max_rows=max_rows
    )


def lsm_scan(
    dataset: AsyncDataset,
    snapshots: ShardSnapshots | None = None,
    columns: Sequence[str] | None = None,
    filter: str | None = None,
    limit: int | None = None,
    *,
    batch_size: int | None = None,
) -> AsyncBatchStream:
    """Scan the base table and flushed SSTables, newest row per primary key, streamed.

    Parameters
    ----------
    dataset : AsyncDataset
    snapshots : list of ShardSnapshot, optional
        Default: discovered when the scan starts (:func:`shard_snapshots`).
    columns : list of str, optional
    filter : str, optional
        Lance SQL, applied to the newest version of each row.
    limit : int, optional
    batch_size : int, optional
        Rows per batch at most.

    Returns
    -------
    AsyncBatchStream
        Memtable rows of live writers are not included; use the writer's
        :meth:`~lance_async.AsyncShardWriter.lsm_scan` for those. Memory is
        bounded by the prefetch (4 batches), not by the result; closing the
        stream (or leaving ``async with``) frees its thread within one batch.

    Raises
    ------
    SchemaMismatchError
        A column not in the table (at once).
    InvalidInputError
        The table has no primary key, or a bad filter (on the first batch).
    """
    return scan_stream(dataset, _no_mirrors, snapshots, columns, filter, limit, batch_size)


async def lookup_batch(
    dataset: AsyncDataset,
    mirrors: Mirrors,
    probe: list[pa.Array],
    columns: Sequence[str] | None,
    snapshots: ShardSnapshots | None = None,
) -> tuple[pa.Table, np.ndarray]:
    """Open a view and answer a batch of keys (see :func:`lookup_view`)."""
    answer = partial(lookup_view, probe=probe, columns=columns)
    if snapshots is None:
        return await read_view(dataset, answer, mirrors())
    view = await open_view(dataset, snapshots, mirrors())
    return await run_sync(partial(answer, view))


def _coalescer(owner: Any, dataset: AsyncDataset, mirrors: Mirrors) -> LookupCoalescer:
    async def run(probe: list[pa.Array], columns: list[str] | None) -> tuple[pa.Table, Any]:
        return await lookup_batch(dataset, mirrors, probe, columns)

    return coalescer_for(owner, lambda: LookupCoalescer(run))


def _keys_of(dataset: AsyncDataset, keys: Any) -> list[pa.Array]:
    pk = dataset.primary_key
    if not pk:
        raise InvalidInputError(NO_KEY)
    return key_columns(dataset.schema, pk, keys)


async def point_lookup(
    owner: Any,
    dataset: AsyncDataset,
    mirrors: Mirrors,
    key: Any,
    columns: Sequence[str] | None,
    snapshots: ShardSnapshots | None,
) -> pa.Table:
    """One key through the owner's coalescer (or alone, with explicit snapshots)."""
    _check_columns(dataset.schema, columns)
    probe = _keys_of(dataset, [key])
    if snapshots is not None:
        rows, owner_of = await lookup_batch(dataset, mirrors, probe, columns, snapshots)
        return split_rows(rows, owner_of, 1)[0]
    return await _coalescer(owner, dataset, mirrors).lookup(probe, columns)


async def point_lookups(
    dataset: AsyncDataset,
    mirrors: Mirrors,
    keys: Any,
    columns: Sequence[str] | None,
    snapshots: ShardSnapshots | None,
) -> pa.Table:
    """Many keys in one batch: found rows in the order of ``keys``."""
    _check_columns(dataset.schema, columns)
    probe = _keys_of(dataset, keys)
    if not len(probe[0]):
        return output_schema(dataset.schema, columns).empty_table()
    rows, owner_of = await lookup_batch(dataset, mirrors, probe, columns, snapshots)
    order = owner_of.argsort(kind="stable")
    return rows.take(pa.array(order)) if len(order) else rows


async def lsm_point_lookup(
    dataset: AsyncDataset,
    key: Any,
    columns: Sequence[str] | None = None,
    snapshots: ShardSnapshots | None = None,
) -> pa.Table:
    """The newest row for one primary key across base table and SSTables.

    Lookups issued concurrently on one dataset are answered together, in
    batches (one discovery of the shard manifests and one probe of each
    level per batch).

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
    """
    return await point_lookup(dataset, dataset, _no_mirrors, key, columns, snapshots)


async def lsm_point_lookups(
    dataset: AsyncDataset,
    keys: Any,
    columns: Sequence[str] | None = None,
    snapshots: ShardSnapshots | None = None,
) -> pa.Table:
    """The newest row of each of many primary keys, in one batch.

    Parameters
    ----------
    keys : sequence of keys, or key columns (pa.Table, mapping of lists, pa.Array)
        As :func:`lsm_point_lookup` takes one key.
    columns : list of str, optional
    snapshots : list of ShardSnapshot, optional

    Returns
    -------
    pa.Table
        One row per key found (absent and deleted keys have none), in the
        order of ``keys``; a key given twice is answered twice.

    Raises
    ------
    InvalidInputError, SchemaMismatchError
        As :func:`lsm_point_lookup`.
    """
    return await point_lookups(dataset, _no_mirrors, keys, columns, snapshots)


# -- a live writer's view: its memtable too ------------------------------------


async def wait_unsealed(engine: Any, timeout: float, what: str) -> None:
    """Wait until the engine writer holds no sealed (frozen) memtable.

    Raises
    ------
    LanceAsyncError
        Still sealed after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        mt = await run_sync(engine.memtable_stats)
        if not mt.get("frozen_count"):
            return
        if time.monotonic() > deadline:
            raise LanceAsyncError(f"{what}: a sealed memtable was not flushed in {timeout} s")
        await anyio.sleep(0.005)


class WriterReads:
    """The LSM reads of a live :class:`~lance_async.AsyncShardWriter` (a mixin).

    They see this writer's memtable (sealed ones included, through its
    mirror), the flushed generations of every shard and the latest base
    table: every row acked so far is visible. A subclass provides
    ``_engine_and_gate()``, ``_committer.mirror``, ``_dataset``, ``shard_id``
    and ``schema``.
    """

    shard_id: str
    _dataset: AsyncDataset

    @property
    def schema(self) -> pa.Schema:  # pragma: no cover - provided by the writer
        raise NotImplementedError

    def _engine_and_gate(self) -> tuple[Any, anyio.Lock]:  # pragma: no cover
        raise NotImplementedError

    def _mirror(self) -> MemtableMirror:
        """The mirror of this writer's memtable (open writers only)."""
        self._engine_and_gate()
        mirror: MemtableMirror | None = getattr(getattr(self, "_committer", None), "mirror", None)
        if mirror is None:  # pragma: no cover - every open writer has one
            raise LanceAsyncError(f"{self!r} keeps no mirror of its memtable")
        return mirror

    def _mirrors(self) -> Sequence[MemtableMirror]:
        return [self._mirror()]

    async def wait_flushed(self, timeout: float = 30.0) -> None:
        """Wait until no sealed (frozen) memtable is waiting to be written.

        After it returns, every memtable sealed so far is a flushed
        generation (an SSTable) that :meth:`AsyncDataset.shard_snapshots`
        lists. It does not seal the active memtable; closing the writer does.

        Raises
        ------
        TypeError, ValueError
            ``timeout`` is not a number of seconds >= 0.
        LanceAsyncError
            Still sealed after ``timeout`` seconds.
        ClosedError
            The writer is not open.
        """
        timeout = check_seconds("timeout", timeout)
        engine, _gate = self._engine_and_gate()
        await wait_unsealed(engine, timeout, repr(self))

    def lsm_scan(
        self,
        snapshots: ShardSnapshots | None = None,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        limit: int | None = None,
        *,
        batch_size: int | None = None,
    ) -> AsyncBatchStream:
        """Scan base table, flushed SSTables and this writer's memtable, streamed.

        Newest row per primary key wins; every row acked so far is visible.
        With ``snapshots=None`` every shard's flushed generations are
        discovered when the scan starts (other writers' memtables are not
        included: pylance reads a memtable only through its own writer).
        See :func:`lsm_scan` for the parameters.

        Returns
        -------
        AsyncBatchStream

        Raises
        ------
        ClosedError
            The writer is not open (when the scan starts).
        """
        self._engine_and_gate()
        return scan_stream(
            self._dataset, self._mirrors, snapshots, columns, filter, limit, batch_size
        )

    async def lsm_point_lookup(
        self,
        key: Any,
        columns: Sequence[str] | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row for ``key`` across all levels, this writer's memtable
        included (a table of 0 or 1 row). Composite keys as a dict or tuple.
        Concurrent lookups on one writer are answered in batches."""
        self._engine_and_gate()
        return await point_lookup(self, self._dataset, self._mirrors, key, columns, snapshots)

    async def lsm_point_lookups(
        self,
        keys: Any,
        columns: Sequence[str] | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row of each of ``keys``, this writer's memtable included
        (see :func:`lsm_point_lookups`)."""
        self._engine_and_gate()
        return await point_lookups(self._dataset, self._mirrors, keys, columns, snapshots)

    async def lsm_vector_search(
        self,
        query: Any,
        *,
        column: str,
        k: int = 10,
        nprobes: int | None = 20,
        filter: str | None = None,
        snapshots: ShardSnapshots | None = None,
        columns: Sequence[str] | None = None,
        metric: str = "l2",
        refine_factor: int | None = None,
    ) -> pa.Table:
        """k nearest rows over every level, this writer's memtable included.

        The parameters of :func:`~lance_async.memwal.vector.lsm_vector_search`.

        Returns
        -------
        pa.Table
            At most ``k`` rows, newest version per key, with ``_distance``.

        Raises
        ------
        InvalidInputError
            ``k`` < 1 or a bad metric or query.
        SchemaMismatchError
            ``column`` is not in the table.
        ClosedError
            The writer is not open.
        """
        self._engine_and_gate()
        return await lsm_vector_search(
            self._dataset,
            query,
            column=column,
            k=k,
            nprobes=nprobes,
            filter=filter,
            snapshots=snapshots,
            columns=columns,
            metric=metric,
            refine_factor=refine_factor,
            mirrors=self._mirrors(),
        )
