"""LSM vector search: the k nearest rows across the levels, newest version per key.

Each level is searched for its own k nearest *live* rows, and the candidates
are merged by distance:

* the base table by the engine, with its vector index when it has one
  (``nprobes``, ``refine_factor``) and with the rows a newer level hides
  excluded *before* ranking (``row_addr_blocklist``, a prefilter: so k rows
  come back even when newer generations shadow many base rows);
* each flushed generation by the engine, exactly (its index, when a flush
  built one, is quantized), restricted to its winning rows
  (``row_addr_allowlist``);
* the unflushed rows (memtables, WAL tails) exactly, in numpy (:func:`exact_knn`).

A row whose key a newer level holds is never returned, and k rows come back
whenever k live rows exist (flat and IVF_PQ indexes alike; the tests check
both). The base table's keys and row addresses are read once per table
version to find the hidden rows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import InvalidInputError, SchemaMismatchError
from .levels import ROWADDR, LsmView
from .scan import filter_in_memory

__all__ = ["exact_knn", "search_view", "vector_query"]

_METRICS = ("l2", "cosine", "dot")
_base_keys: OrderedDict[tuple[str, int, tuple[str, ...]], tuple[list[pa.Array], np.ndarray]] = (
    OrderedDict()
)
_base_lock = threading.Lock()


def _distances(vectors: pa.Array | pa.ChunkedArray, query: np.ndarray, metric: str) -> np.ndarray:
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
        out = 1.0 - mat @ query  # Lance's dot distance
    else:
        raise InvalidInputError(f"unknown metric {metric!r}; use l2, cosine or dot")
    return np.where(np.isnan(out), np.inf, out).astype(np.float32)


def exact_knn(table: pa.Table, column: str, query: Any, k: int, metric: str = "l2") -> pa.Table:
    """Rank ``table``'s rows by exact distance from ``query`` (blocking, numpy).

    Returns the ``k`` nearest rows with a ``_distance`` column (float32, the
    distance as Lance reports it: squared L2, 1 - cosine similarity, or
    1 - dot product).
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


def base_keys(view: LsmView) -> tuple[list[pa.Array], np.ndarray]:
    """(key columns, row addresses) of every base row, read once per version (blocking)."""
    base = view.base
    cache_key = (base.uri, int(base.version), tuple(view.keys))
    with _base_lock:
        hit = _base_keys.get(cache_key)
    if hit is not None:
        return hit
    t = base.to_table(columns=view.keys, with_row_address=True)
    value = ([t.column(k).combine_chunks() for k in view.keys], t.column(ROWADDR).to_numpy())
    with _base_lock:
        _base_keys[cache_key] = value
        while len(_base_keys) > 4:
            _base_keys.popitem(last=False)
    return value


def _serialize(addresses: np.ndarray) -> bytes:
    from lance.dataset import serialize_row_addrs

    result: bytes = serialize_row_addrs(addresses.tolist())
    return result


def search_view(
    view: LsmView,
    query: np.ndarray,
    column: str,
    k: int,
    *,
    nprobes: int | None = None,
    refine_factor: int | None = None,
    filter: str | None = None,
    columns: Sequence[str] | None = None,
    metric: str = "l2",
) -> pa.Table:
    """The ``k`` nearest live rows of a view's levels (blocking; see the module notes)."""
    cols = list(columns) if columns is not None else list(view.schema.names)
    read = list(dict.fromkeys([*cols, column, *view.keys]))
    nearest: dict[str, Any] = {"column": column, "q": query, "k": k, "metric": metric}
    found: list[pa.Table] = []
    hides_mem = any(m.table.num_rows for m in view.memtables)
    for mem in view.memtables:
        table = mem.live()
        if table is not None:
            found.append(exact_knn(filter_in_memory(table, read, filter), column, query, k, metric))
    for gen, keep in view.live_generations():
        allow = None if keep.all() else _serialize(np.sort(gen.rowaddr[keep]))
        found.append(
            gen.dataset.scanner(
                columns=[*read, "_distance"],
                nearest={**nearest, "use_index": False},  # exact: generations are small
                filter=filter,
                prefilter=True,
                row_addr_allowlist=allow,
            ).to_table()
        )
    base_nearest = dict(nearest)
    if nprobes is not None:
        base_nearest["nprobes"] = nprobes
    if refine_factor is not None:
        base_nearest["refine_factor"] = refine_factor
    block = None
    if view.shadow.size or hides_mem:
        keys, addresses = base_keys(view)
        hidden = addresses[view.hidden(keys)]
        block = _serialize(hidden) if len(hidden) else None
    found.append(
        view.base.scanner(
            columns=[*read, "_distance"],
            nearest=base_nearest,
            filter=filter,
            prefilter=True,
            row_addr_blocklist=block,
        ).to_table()
    )
    names = list(dict.fromkeys([*cols, *view.keys]))
    fields = [view.schema.field(c) for c in names] + [pa.field("_distance", pa.float32())]
    merged_schema = pa.schema(fields, metadata=view.schema.metadata)
    parts = [
        pa.Table.from_arrays(
            [t.column(c) for c in names] + [t.column("_distance").cast(pa.float32())],
            schema=merged_schema,
        )
        for t in found
        if t.num_rows
    ]
    if not parts:
        return merged_schema.empty_table().select([*cols, "_distance"])
    merged = pa.concat_tables(parts)
    # nearest first; equal distances in key order, so the answer is deterministic
    ranked = merged.sort_by(
        [("_distance", "ascending")] + [(key, "ascending") for key in view.keys]
    )
    return ranked.slice(0, k).select([*cols, "_distance"]).combine_chunks()


def vector_query(schema: pa.Schema, column: str, query: Any, columns: Any) -> np.ndarray:
    """The query as a float32 vector of the column's dimension (does not block).

    Raises
    ------
    SchemaMismatchError
        ``column`` or a ``columns`` entry is not in the table.
    InvalidInputError
        The query is not a vector of numbers, or of another dimension.
    """
    for name in [column, *(columns or [])]:
        if name not in schema.names:
            raise SchemaMismatchError(f"no column {name!r} in the table", field=name)
    dim = getattr(schema.field(column).type, "list_size", None)
    try:
        q = np.asarray(query, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"the query is not a vector of numbers: {exc}") from exc
    if dim is not None and dim > 0 and q.shape[0] != dim:
        raise InvalidInputError(f"the query has {q.shape[0]} dimensions; {column!r} has {dim}")
    return q
