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

The knobs of LanceDB's vector query (and pylance's scanner) keep their
meaning across the levels because every level is searched for the same
candidates and the merge applies them once, to the newest version of each
key: ``distance_range`` is pushed into each level's search (the engine's
``distance_range``; a mask in numpy) and checked again on the merged
distances; ``offset`` makes each level give ``k + offset`` rows and the
merge skip the nearest ``offset``; ``postfilter`` searches every level
unfiltered and evaluates the filter on the merged nearest rows (an
in-memory Lance dataset of them, so the filter means what it means to the
engine); ``use_index=False`` searches the base table exactly. A base row a
newer level hides is left out of the base's search *before* ranking in every
case, so it never comes back, whether the newer version is in the range,
filtered out or deleted.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import InvalidInputError, SchemaMismatchError
from .basekeys import version_id
from .cache import SameLevels, keep_live
from .levels import ROWADDR, LsmView

__all__ = [
    "Range",
    "exact_knn",
    "hidden_blocklist",
    "in_range",
    "live_allowlist",
    "matching",
    "search_view",
    "serialize_addresses",
    "vector_query",
]

_METRICS = ("l2", "cosine", "dot")
_base_keys: OrderedDict[tuple[str, Any, tuple[str, ...]], tuple[list[pa.Array], np.ndarray]] = (
    OrderedDict()
)
_base_lock = threading.Lock()
_blocklists: OrderedDict[tuple[Any, ...], tuple[SameLevels, bytes | None]] = OrderedDict()
"""The blocklists of the last few sets of levels read (of live ones only)."""


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


Range = tuple[float | None, float | None]


def in_range(dist: np.ndarray, distance_range: Range | None) -> np.ndarray:
    """Mask of the distances in ``[lower, upper)`` (a bound None is open; pure)."""
    mask: np.ndarray = np.isfinite(dist)
    if distance_range is not None:
        lower, upper = distance_range
        if lower is not None:
            mask &= dist >= np.float32(lower)
        if upper is not None:
            mask &= dist < np.float32(upper)
    return mask


def exact_knn(
    table: pa.Table,
    column: str,
    query: Any,
    k: int,
    metric: str = "l2",
    distance_range: Range | None = None,
) -> pa.Table:
    """Rank ``table``'s rows by exact distance from ``query`` (blocking, numpy).

    Returns the ``k`` nearest rows with a ``_distance`` column (float32, the
    distance as Lance reports it: squared L2, 1 - cosine similarity, or
    1 - dot product); with ``distance_range=(lower, upper)`` the ``k``
    nearest of those with ``lower <= _distance < upper`` (pylance's
    ``distance_range``: a bound None is open).
    """
    if k < 1:
        raise InvalidInputError("k must be >= 1")
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    if column not in table.column_names:
        raise SchemaMismatchError(f"no vector column {column!r}", field=column)
    dist = _distances(table.column(column), q, metric)
    dist = np.where(in_range(dist, distance_range), dist, np.float32(np.inf))
    order = np.argsort(dist, kind="stable")[:k]
    order = order[np.isfinite(dist[order])]
    picked = table.take(pa.array(order, type=pa.int64()))
    return picked.append_column("_distance", pa.array(dist[order], type=pa.float32()))


def base_keys(view: LsmView) -> tuple[list[pa.Array], np.ndarray]:
    """(key columns, row addresses) of every base row, read once per version (blocking)."""
    base = view.base
    cache_key = (base.uri, version_id(base), tuple(view.keys))
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


def serialize_addresses(addresses: np.ndarray) -> bytes:
    """Row addresses (uint64) in the form a scanner's ``row_addr_*list`` takes."""
    from lance.dataset import serialize_row_addrs

    result: bytes = serialize_row_addrs(addresses.tolist())
    return result


def live_allowlist(rowaddr: np.ndarray, keep: np.ndarray) -> bytes | None:
    """A generation's ``row_addr_allowlist``: its rows in ``keep``; None when all are."""
    return None if keep.all() else serialize_addresses(np.sort(rowaddr[keep]))


def hidden_blocklist(view: LsmView) -> bytes | None:
    """The base's ``row_addr_blocklist``: its rows a newer level of ``view``
    hides (a newer version of the key, or its deletion); None when none is
    (blocking: reads the base's keys once per version)."""
    if not view.shadow.size and not any(m.table.num_rows for m in view.memtables):
        return None
    # the levels are immutable objects, cached while nothing new is flushed
    # or written: the same ones hide the same base rows of one version
    levels = (*view.shards, *view.memtables)
    same = SameLevels(levels)
    cache_key = (view.base.uri, version_id(view.base), same.key())
    with _base_lock:
        hit = _blocklists.get(cache_key)
    if hit is not None and hit[0].of(levels):
        return hit[1]
    keys, addresses = base_keys(view)
    hidden = addresses[view.hidden(keys)]
    block = serialize_addresses(hidden) if len(hidden) else None
    with _base_lock:
        _blocklists[cache_key] = (same, block)
        keep_live(_blocklists, 4, lambda entry: entry[0])
    return block


def matching(table: pa.Table, filter: str) -> np.ndarray:
    """Mask of ``table``'s rows that pass ``filter`` (Lance SQL; blocking).

    The rows are written to an in-memory Lance dataset and filtered by the
    engine, so the filter means what it means on every level (a NULL result
    is no match, as in SQL).
    """
    import lance

    position = "_lance_async_position"
    marked = table.append_column(position, pa.array(np.arange(table.num_rows), pa.int64()))
    ds = lance.write_dataset(marked, f"memory://lance_async-{uuid.uuid4().hex}")
    passed = ds.to_table(columns=[position], filter=filter).column(position).to_numpy()
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[passed] = True
    return mask


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
    overfetch_factor: float = 1.0,
    distance_range: Range | None = None,
    offset: int = 0,
    postfilter: bool = False,
    use_index: bool = True,
) -> pa.Table:
    """The ``k`` nearest live rows of a view's levels after the nearest
    ``offset`` (blocking; see the module notes).

    Each level gives its ``ceil((k + offset) * overfetch_factor)`` nearest
    live rows (within ``distance_range``; passing ``filter`` unless
    ``postfilter``); the merge keeps the ``k + offset`` nearest of all,
    drops those failing ``filter`` when ``postfilter``, then skips
    ``offset`` and keeps at most ``k``.
    """
    cols = list(columns) if columns is not None else list(view.schema.names)
    late = filter if postfilter else None  # evaluated on the merged rows
    level_filter = None if postfilter else filter
    extra = list(view.schema.names) if late else []  # what the filter may name
    read = list(dict.fromkeys([*cols, column, *view.keys, *extra]))
    wanted = k + offset
    fetch = max(wanted, math.ceil(wanted * overfetch_factor))
    nearest: dict[str, Any] = {"column": column, "q": query, "k": fetch, "metric": metric}
    if distance_range is not None:
        nearest["distance_range"] = distance_range
    found: list[pa.Table] = []
    for mem in view.memtables:
        table = mem.select(read, level_filter)
        if table is not None:
            found.append(exact_knn(table, column, query, fetch, metric, distance_range))
    for gen, keep in view.live_generations():
        allow = live_allowlist(gen.rowaddr, keep)
        found.append(
            gen.dataset.scanner(
                columns=[*read, "_distance"],
                nearest={**nearest, "use_index": False},  # exact: generations are small
                filter=level_filter,
                prefilter=True,
                row_addr_allowlist=allow,
            ).to_table()
        )
    base_nearest = dict(nearest, use_index=use_index)
    if nprobes is not None and use_index:
        base_nearest["nprobes"] = nprobes
    if refine_factor is not None and use_index:
        base_nearest["refine_factor"] = refine_factor
    block = hidden_blocklist(view)
    found.append(
        view.base.scanner(
            columns=[*read, "_distance"],
            nearest=base_nearest,
            filter=level_filter,
            prefilter=True,
            row_addr_blocklist=block,
        ).to_table()
    )
    names = list(dict.fromkeys([*cols, *view.keys, *extra]))
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
    if distance_range is not None:  # the engine's bounds, held to on the merged distances too
        dist = merged.column("_distance").to_numpy()
        merged = merged.filter(pa.array(in_range(dist, distance_range)))
    # nearest first; equal distances in key order, so the answer is deterministic
    ranked = merged.sort_by(
        [("_distance", "ascending")] + [(key, "ascending") for key in view.keys]
    ).slice(0, wanted)
    if late and ranked.num_rows:
        ranked = ranked.filter(pa.array(matching(ranked.combine_chunks(), late)))
    return ranked.slice(offset, k).select([*cols, "_distance"]).combine_chunks()


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
