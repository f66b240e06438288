"""LSM vector search: k nearest rows across the levels, newest version per key.

With a vector index that covers every base row (and the SSTables), the
engine's ``LsmVectorSearchPlanner`` runs with over-fetch; otherwise the
search is exact over the LSM view (slower, always right). :func:`exact_knn`
ranks in numpy on a worker thread.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from lance.mem_wal import LsmScanner, LsmVectorSearchPlanner
from lance.mem_wal import ShardSnapshot as LanceShardSnapshot

from .._filters import check_filter
from .._schema import primary_key
from ..errors import InvalidInputError, SchemaMismatchError
from .snapshots import ShardSnapshot, ShardSnapshots, with_snapshots

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = ["exact_knn", "exact_knn_scan", "lsm_vector_search"]


def _distances(vectors: pa.Array, query: np.ndarray, metric: str) -> np.ndarray:
    if len(vectors) == 0:
        return np.zeros(0, dtype=np.float32)
    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks()
    dim = query.shape[0]
    valid = np.asarray(vectors.is_valid())
    flat = vectors.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    mat = np.full((len(vectors), dim), np.nan, dtype=np.float32)
    mat[valid] = flat.reshape(-1, dim)
    if metric == "l2":
        out = ((mat - query) ** 2).sum(axis=1)
    elif metric == "cosine":
        norms = np.linalg.norm(mat, axis=1) * np.linalg.norm(query)
        out = 1.0 - (mat @ query) / np.where(norms == 0, np.nan, norms)
    elif metric == "dot":
        out = -(mat @ query)
    else:
        raise InvalidInputError(f"unknown metric {metric!r}; use l2, cosine or dot")
    return np.where(np.isnan(out), np.inf, out).astype(np.float32)


def exact_knn(table: pa.Table, column: str, query: Any, k: int, metric: str = "l2") -> pa.Table:
    """Rank ``table``'s rows by exact distance from ``query`` (blocking, numpy).

    Returns the ``k`` nearest rows with a ``_distance`` column (float32, the
    squared L2 distance for ``"l2"`` as Lance reports it).
    """
    if k < 1:
        raise InvalidInputError("k must be >= 1")
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    if column not in table.column_names:
        raise SchemaMismatchError(f"no vector column {column!r}", field=column)
    dist = _distances(table.column(column), q, metric)
    order = np.argsort(dist, kind="stable")[:k]
    order = order[np.isfinite(dist[order])]
    picked = table.take(pa.array(order, type=pa.int64()))
    return picked.append_column("_distance", pa.array(dist[order], type=pa.float32()))


def exact_knn_scan(
    scanner: Any,
    column: str,
    query: Any,
    k: int,
    metric: str = "l2",
    *,
    filter: str | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Exact k nearest rows of an engine ``LsmScanner`` (blocking).

    Reads only ``columns`` plus the vector column when ``columns`` is given
    (every column otherwise); the result has ``columns`` (or all) and
    ``_distance``.
    """
    filter = check_filter(filter)
    sc = scanner.filter(filter) if filter else scanner
    if columns is not None:
        sc = sc.project(list(dict.fromkeys([*columns, column])))
    result = exact_knn(sc.to_table(), column, query, k, metric)
    return result.select([*columns, "_distance"]) if columns is not None else result


def _has_vector_index(ds: Any, column: str, *, complete: bool = False) -> bool:
    """True when ``column`` has a vector index (covering every row if ``complete``)."""
    try:
        names = [
            d.name
            for d in ds.describe_indices()
            if column in (d.field_names or []) and "VectorIndex" in (d.type_url or "")
        ]
        if not names:
            return False
        if not complete:
            return True
        return any(int(ds.stats.index_stats(n).get("num_unindexed_rows", 1)) == 0 for n in names)
    except (OSError, ValueError, RuntimeError, KeyError):
        return False


async def lsm_vector_search(
    dataset: AsyncDataset,
    query: Any,
    *,
    column: str,
    k: int = 10,
    nprobes: int = 20,
    filter: str | None = None,
    snapshots: ShardSnapshots | None = None,
    columns: Sequence[str] | None = None,
    metric: str = "l2",
    overfetch_factor: float = 4.0,
) -> pa.Table:
    """k nearest rows across the base table and SSTables, newest version per key.

    With a vector index on ``column`` that covers every base row, created
    before the MemWAL writes (so the SSTables carry it too), this runs
    ``LsmVectorSearchPlanner`` with ``overfetch_factor`` (default 4: the
    planner otherwise under-fills when newer generations shadow base rows).
    pylance 14's planner ignores unindexed base rows, so without such an
    index -- or when an SSTable lacks it -- the search is exact over the LSM
    view (slower, always right). :func:`compact_mem_wal` brings indexes up to
    date after compacting, keeping the fast path.

    Returns
    -------
    pa.Table
        At most ``k`` rows with ``_distance``, nearest first.

    Raises
    ------
    InvalidInputError
        ``k`` < 1, a bad metric or query.
    """
    filter = check_filter(filter)  # one expression, as on every read path
    if k < 1:
        raise InvalidInputError("k must be >= 1")
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    cols = list(columns) if columns is not None else None
    keys = primary_key(dataset.schema)
    uri = dataset.uri
    storage_options = dataset.storage_options

    def index_covers(ds: Any, snaps: list[Any]) -> bool:
        import lance

        if not _has_vector_index(ds, column, complete=True):
            return False
        for snap in snaps:
            if not isinstance(snap, ShardSnapshot):
                continue  # an engine snapshot given by the caller: trust it
            for _gen, path in snap.sstables:
                gen_ds = lance.dataset(
                    posixpath.join(uri, "_mem_wal", snap.shard_id, path),
                    storage_options=storage_options,
                )
                if not _has_vector_index(gen_ds, column):
                    return False
        return True

    on_object_store = bool(storage_options)

    def work(ds: Any, snaps: list[Any], raw: list[LanceShardSnapshot]) -> pa.Table:
        # pylance 14's planners open generations without the table's
        # storage_options: object-store tables search exactly over the scanner
        if not on_object_store and index_covers(ds, snaps):
            planner = LsmVectorSearchPlanner(
                ds, raw, column, pk_columns=keys or None, distance_type=metric, filter=filter
            )
            plan = planner.plan_search(
                pa.array(q, type=pa.float32()),
                k=k,
                nprobes=nprobes,
                columns=[*(cols if cols is not None else ds.schema.names), "_distance"],
                overfetch_factor=overfetch_factor,
            )
            return plan.to_table()
        sc = LsmScanner.from_snapshots(ds, raw)
        return exact_knn_scan(sc, column, q, k, metric, filter=filter, columns=cols)

    table: pa.Table = await with_snapshots(dataset, snapshots, work)
    return table
