"""LSM reads: scans and point lookups over the base table, flushed SSTables and memtables.

Newest row per primary key wins across the levels. :func:`lsm_scan` and
:func:`lsm_point_lookup` read the base table and the flushed generations
(``LsmScanner`` / ``LsmPointLookupPlanner`` on worker threads); the
:class:`WriterReads` mixin gives a live writer the same reads over its
memtable too, with the read-your-writes rule of
:class:`~lance_async.AsyncShardWriter` (a sealed memtable is waited out, so
every acked row is visible).

Notes
-----
pylance 14's ``LsmScanner`` has no streaming reader: the scan is collected
in the engine on a worker thread (without the GIL), then handed to the loop
batch by batch. Project the columns you need.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pyarrow as pa
from lance.mem_wal import LsmPointLookupPlanner, LsmScanner
from lance.mem_wal import ShardSnapshot as LanceShardSnapshot

from .._filters import check_filter
from .._schema import primary_key
from .._threads import run_sync
from ..errors import (
    InvalidInputError,
    LanceAsyncError,
    SchemaMismatchError,
    raise_mapped,
)
from ..sources.streams import AsyncBatchStream
from .keys import key_array, key_filter
from .snapshots import ShardSnapshots, lance_snapshots, shard_snapshots, with_snapshots
from .vector import exact_knn_scan

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = ["WriterReads", "lsm_point_lookup", "lsm_scan", "scanner_stream", "wait_unsealed"]


def scanner_stream(
    make_scanner: Callable[[], Awaitable[Any]],
    schema: pa.Schema,
    columns: Sequence[str] | None,
    filter: str | None,
    limit: int | None,
) -> AsyncBatchStream:
    """An :class:`AsyncBatchStream` over an engine ``LsmScanner``.

    ``schema`` is the table schema; the stream's schema is its projection.
    """
    if columns is not None:
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise SchemaMismatchError(f"no column {missing[0]!r} in the table", field=missing[0])
        schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
    filter = check_filter(filter)  # one expression, as on every read path

    async def prepare() -> Callable[[], Any]:
        scanner = await make_scanner()

        def opener() -> pa.RecordBatchReader:
            sc = scanner
            try:
                if columns is not None:
                    sc = sc.project(list(columns))
                if filter:
                    sc = sc.filter(filter)
                if limit is not None:
                    sc = sc.limit(limit)
                batches = [b for b in sc.to_batches() if b.num_rows]
            except (OSError, ValueError, RuntimeError) as exc:
                raise_mapped(exc)
                raise
            if not batches:
                return pa.RecordBatchReader.from_batches(schema, [])
            return pa.RecordBatchReader.from_batches(batches[0].schema, batches)

        return opener

    return AsyncBatchStream(None, schema=schema, prepare=prepare)


def lsm_scan(
    dataset: AsyncDataset,
    snapshots: ShardSnapshots | None = None,
    columns: Sequence[str] | None = None,
    filter: str | None = None,
    limit: int | None = None,
) -> AsyncBatchStream:
    """Scan the base table and flushed SSTables, newest row per primary key.

    Parameters
    ----------
    dataset : AsyncDataset
    snapshots : list of ShardSnapshot, optional
        Default: discovered now (:func:`shard_snapshots`).
    columns : list of str, optional
    filter : str, optional
        Lance SQL, applied to the newest version of each row.
    limit : int, optional

    Returns
    -------
    AsyncBatchStream
        Rows of live memtables are not included; use the writer's
        :meth:`~lance_async.AsyncShardWriter.lsm_scan` for those.
    """

    async def make() -> Any:
        return await with_snapshots(
            dataset, snapshots, lambda ds, _snaps, raw: LsmScanner.from_snapshots(ds, raw)
        )

    return scanner_stream(make, dataset.schema, columns, filter, limit)


async def lsm_point_lookup(
    dataset: AsyncDataset,
    key: Any,
    columns: Sequence[str] | None = None,
    snapshots: ShardSnapshots | None = None,
) -> pa.Table:
    """The newest row for one primary key across base table and SSTables.

    Parameters
    ----------
    key : scalar, dict or tuple
        The key value; composite keys as ``{"a": 1, "b": "x"}`` or ``(1, "x")``.
    columns : list of str, optional
    snapshots : list of ShardSnapshot, optional
        Default: discovered now.

    Returns
    -------
    pa.Table
        0 rows (absent or deleted) or 1 row.

    Raises
    ------
    InvalidInputError
        A key of the wrong shape or type.
    """
    schema = dataset.schema
    keys = primary_key(schema)
    array = key_array(schema, keys, key)
    cols = list(columns) if columns is not None else None
    # pylance 14's LsmPointLookupPlanner opens the generations without the
    # table's storage_options (on an object store it then resolves no region
    # or credentials); the LSM scanner passes them on, so object-store tables
    # look up through a filtered scan
    on_object_store = bool(dataset.storage_options)
    expr = key_filter(schema, keys, key) if on_object_store else ""

    def work(ds: Any, _snaps: list[Any], raw: list[LanceShardSnapshot]) -> pa.Table:
        if on_object_store:
            sc = LsmScanner.from_snapshots(ds, raw).filter(expr).limit(1)
            return (sc.project(cols) if cols is not None else sc).to_table()
        planner = LsmPointLookupPlanner(ds, raw, keys)
        return planner.plan_lookup(array, cols).to_table()

    result: pa.Table = await with_snapshots(dataset, snapshots, work)
    return result


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

    They see this writer's memtable as well as the base table and the flushed
    generations, and every row acked so far: pylance 14's own scanner hides a
    sealed ("frozen") memtable's rows until its SSTable is written, so sealed
    memtables are waited out first, without holding up the puts, and the plan
    is made while no put can seal another one (under the writer's engine
    gate). A subclass provides ``_engine_and_gate()``, ``_dataset``,
    ``shard_id`` and ``schema``.
    """

    shard_id: str
    _dataset: AsyncDataset

    @property
    def schema(self) -> pa.Schema:  # pragma: no cover - provided by the writer
        raise NotImplementedError

    def _engine_and_gate(self) -> tuple[Any, anyio.Lock]:  # pragma: no cover
        raise NotImplementedError

    async def _scanner(self, snapshots: ShardSnapshots | None) -> Any:
        """An engine LSM scanner over the memtable that sees every acked row.

        With ``snapshots=None`` the other shards' flushed generations are
        discovered, compacted ones included: the writer's base table is the
        version it opened on.
        """
        engine, gate = self._engine_and_gate()
        if snapshots is None:
            snapshots = await shard_snapshots(self._dataset, include_compacted=True)
        raw = lance_snapshots(s for s in snapshots if s.shard_id != self.shard_id)
        deadline = time.monotonic() + 30.0
        while True:
            await wait_unsealed(engine, max(0.0, deadline - time.monotonic()), repr(self))
            async with gate:
                mt = await run_sync(engine.memtable_stats)
                if not mt.get("frozen_count"):
                    return await run_sync(lambda: engine.lsm_scanner(raw))

    async def wait_flushed(self, timeout: float = 30.0) -> None:
        """Wait until no sealed (frozen) memtable is waiting to be written.

        After it returns, every memtable sealed so far is a flushed
        generation (an SSTable) that :meth:`AsyncDataset.shard_snapshots`
        lists. It does not seal the active memtable; closing the writer does.

        Raises
        ------
        LanceAsyncError
            Still sealed after ``timeout`` seconds.
        ClosedError
            The writer is not open.
        """
        engine, _gate = self._engine_and_gate()
        await wait_unsealed(engine, timeout, repr(self))

    def lsm_scan(
        self,
        snapshots: ShardSnapshots | None = None,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        limit: int | None = None,
    ) -> AsyncBatchStream:
        """Scan base table, flushed SSTables and this writer's memtable.

        Newest row per primary key wins; every row acked so far is visible.
        With ``snapshots=None`` the other shards' flushed generations are
        discovered and included (their live memtables are not: pylance 14
        reads a memtable only through its own writer). The base table is the
        version the writer was opened on.

        Returns
        -------
        AsyncBatchStream
        """
        return scanner_stream(lambda: self._scanner(snapshots), self.schema, columns, filter, limit)

    async def lsm_point_lookup(
        self,
        key: Any,
        columns: Sequence[str] | None = None,
        snapshots: ShardSnapshots | None = None,
    ) -> pa.Table:
        """The newest row for ``key`` across all levels, this writer's memtable
        included (a table of 0 or 1 row). Composite keys as a dict or tuple."""
        schema = self.schema
        expr = key_filter(schema, primary_key(schema), key)
        scanner = await self._scanner(snapshots)

        def work() -> pa.Table:
            sc = scanner.filter(expr).limit(1)
            if columns is not None:
                sc = sc.project(list(columns))
            return sc.to_table()

        return await run_sync(work)

    async def lsm_vector_search(
        self,
        query: Any,
        *,
        column: str,
        k: int = 10,
        nprobes: int = 20,
        filter: str | None = None,
        snapshots: ShardSnapshots | None = None,
        columns: Sequence[str] | None = None,
        metric: str = "l2",
    ) -> pa.Table:
        """Exact k-nearest search over every level, this writer's memtable included.

        The parameters of :meth:`AsyncDataset.lsm_vector_search`. pylance 14
        gives no vector planner over a live memtable, so this scans the LSM
        view on a worker thread (only ``columns`` and ``column`` when
        ``columns`` is given) and ranks exactly; ``nprobes`` is accepted for
        the same call shape and has no effect. For large tables prefer
        :meth:`AsyncDataset.lsm_vector_search` (indexed, flushed levels only).

        Returns
        -------
        pa.Table
            At most ``k`` rows, newest version per key, with ``_distance``
            (``columns`` and ``_distance`` when ``columns`` is given).

        Raises
        ------
        InvalidInputError
            ``k`` < 1 or a bad metric or query.
        SchemaMismatchError
            ``column`` is not in the table.
        ClosedError
            The writer is not open.
        """
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        scanner = await self._scanner(snapshots)
        return await run_sync(
            partial(
                exact_knn_scan, scanner, column, query, k, metric, filter=filter, columns=columns
            )
        )
