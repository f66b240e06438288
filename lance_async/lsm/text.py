"""LSM full-text search: the rows matching a query across the levels, newest version per key.

The base table is searched by the engine through its INVERTED index (rows a
newer level hides are left out *before* ranking: ``row_addr_blocklist``, as
the vector search does). The other levels -- each flushed generation's
winning rows, the unflushed rows of the WAL tails and live memtables -- are
small, hold no index of their own, and are searched together: their live
rows that pass the filter go into one in-memory Lance dataset, indexed with
the base index's own tokenizer settings (language, stemming, stop words,
positions...), and searched by the engine with the same query. So a word
matches in every level exactly as it matches in the base table, phrase and
boolean queries included, and a key whose newest version does not match (or
is filtered out, or deleted) never comes back in an older one.

The unflushed part's dataset is kept for the reads that follow: a read of
the same levels -- the same shard levels, WAL tails and live memtables,
immutable objects handed out again while nothing new is flushed or written
(``cache.SameLevels``) -- with the same columns, filter and index settings
searches it again instead of building it again (building is most of a
search's cost). A new generation, a longer tail or a live memtable's next
put is another set of levels, whose first search builds its own; a part
goes once its levels are gone (at most four are kept, the last used).

Scores are BM25 within each part (the base table's statistics for base rows,
the unflushed part's for the rest) and the parts are merged by score, best
first: the set of rows is exact, the order across parts is an approximation,
as in any LSM search that scores each level on its own (LanceDB's MemWAL
full-text search searches its levels the same way, each with its own index).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..errors import InvalidInputError, SchemaMismatchError
from .basekeys import VersionId, version_id
from .cache import SameLevels, keep_live
from .levels import LsmView
from .vector import hidden_blocklist, live_allowlist

__all__ = ["TextQuery", "search_text", "text_columns", "text_query"]

TextQuery = Any
"""A query pylance's ``full_text_query`` takes: a string, a dict with
``query`` (and ``columns``), or a ``lance.query`` query object."""

_PARAMS = (
    "base_tokenizer",
    "language",
    "with_position",
    "max_token_length",
    "lower_case",
    "stem",
    "remove_stop_words",
    "custom_stop_words",
    "ascii_folding",
    "min_ngram_length",
    "max_ngram_length",
    "prefix_only",
)
"""The INVERTED index settings copied from the base index to the unflushed part's."""


def text_query(query: Any, fts_columns: Sequence[str] | str | None) -> TextQuery:
    """The query as pylance's ``full_text_query`` takes it (does not block).

    Raises
    ------
    TypeError
        Not a string, a dict with a string ``query``, or a ``lance.query``
        query object; ``fts_columns`` given with a query object (it names its
        own columns) or not a list of column names.
    ValueError
        An empty query string.
    """
    if isinstance(fts_columns, str):
        fts_columns = [fts_columns]
    if fts_columns is not None and (
        not isinstance(fts_columns, (list, tuple))
        or not fts_columns
        or not all(isinstance(c, str) for c in fts_columns)
    ):
        raise TypeError("fts_columns must be a column name or a non-empty list of them")
    if isinstance(query, Mapping):
        unknown = sorted(set(query) - {"query", "columns"})
        if "query" not in query or unknown:
            raise TypeError("a full-text query dict has 'query' and optionally 'columns'")
        columns = query.get("columns")
        if fts_columns is not None and columns is not None:
            raise TypeError("give the columns in the query dict or as fts_columns, not both")
        return text_query(query["query"], columns if columns is not None else fts_columns)
    if isinstance(query, str):
        if not query.strip():
            raise ValueError("the full-text query is empty")
        return {"query": query, "columns": list(fts_columns)} if fts_columns else query
    from lance.query import FullTextQuery

    if isinstance(query, FullTextQuery):
        if fts_columns is not None:
            raise TypeError("a lance.query object names its columns; leave fts_columns out")
        return query
    raise TypeError(
        "a full-text query is a string, a dict with 'query', or a lance.query object, "
        f"got {type(query).__name__}"
    )


def _query_columns(query: TextQuery) -> list[str] | None:
    if isinstance(query, dict):
        columns: list[str] = query["columns"]
        return columns
    return None


def text_columns(base: Any, query: TextQuery) -> dict[str, dict[str, Any]]:
    """The columns the query searches, each with its INVERTED index's settings (blocking).

    Raises
    ------
    SchemaMismatchError
        A column the query names is not in the table.
    InvalidInputError
        The base table has no INVERTED index on a column the query searches
        (or none at all), or more than one on a column: which one the
        engine would rank by is not defined, and the unflushed rows would be
        tokenized by a guess.
    """
    by_column = _inverted_indexes(base)
    wanted = _query_columns(query)
    for name in wanted or []:
        if name not in base.schema.names:
            raise SchemaMismatchError(f"no column {name!r} in the table", field=name)
    columns = wanted if wanted is not None else sorted(by_column)
    if not columns:
        raise InvalidInputError(
            "a full-text search needs an INVERTED index on the base table: "
            "await ds.create_scalar_index(column, 'INVERTED')"
        )
    settings: dict[str, dict[str, Any]] = {}
    for name in columns:
        names = by_column.get(name, [])
        if not names:
            raise InvalidInputError(
                f"no INVERTED index on {name!r}: await ds.create_scalar_index({name!r}, 'INVERTED')"
            )
        if len(names) > 1:
            listed = ", ".join(sorted(n for n, _ in names))
            raise InvalidInputError(
                f"multiple INVERTED indexes on {name!r} ({listed}): an LSM "
                "full-text search needs one per column (drop_index the others)"
            )
        settings[name] = names[0][1]
    return settings


_indexes_lock = threading.Lock()
_indexes: OrderedDict[tuple[str, VersionId], dict[str, list[tuple[str, dict[str, Any]]]]] = (
    OrderedDict()
)


def _inverted_indexes(base: Any) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Per column, the base version's single-column INVERTED indexes: (name,
    the settings of :data:`_PARAMS` it was built with) -- read once per
    version (blocking: ``describe_indices``, ``index_stats``)."""
    key = (str(base.uri), version_id(base))
    with _indexes_lock:
        hit = _indexes.get(key)
    if hit is not None:
        return hit
    by_column: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for index in base.describe_indices():
        if "Inverted" in index.type_url and len(index.field_names) == 1:
            stats = base.stats.index_stats(index.name)
            params = stats["indices"][0].get("params", {}) if stats.get("indices") else {}
            settings = {k: params[k] for k in _PARAMS if k in params}
            by_column.setdefault(index.field_names[0], []).append((index.name, settings))
    with _indexes_lock:
        _indexes[key] = by_column
        while len(_indexes) > 8:
            _indexes.popitem(last=False)
    return by_column


def _unflushed_rows(view: LsmView, read: list[str], filter: str | None) -> list[pa.Table]:
    """The live rows of every level above the base that pass ``filter`` (blocking)."""
    found: list[pa.Table] = []
    for mem in view.memtables:
        table = mem.select(read, filter)
        if table is not None and table.num_rows:
            found.append(table)
    for gen, keep in view.live_generations():
        allow = live_allowlist(gen.rowaddr, keep)
        table = gen.dataset.scanner(
            columns=read, filter=filter, prefilter=True, row_addr_allowlist=allow
        ).to_table()
        if table.num_rows:
            found.append(table)
    return found


SCRATCH_ENTRIES = 4
"""Unflushed parts kept for later reads at most (the last used, of live levels)."""


@dataclass
class _Scratch:
    """An unflushed part, indexed, and the levels it was built from."""

    levels: SameLevels
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while it is built: a read of the same levels waits instead of building too."""
    built: bool = False
    dataset: Any = None
    """The in-memory Lance dataset; None when no row of the levels passes the filter."""


_scratch_lock = threading.Lock()
_scratch: OrderedDict[tuple[Any, ...], _Scratch] = OrderedDict()


def _build_scratch(
    view: LsmView, read: list[str], filter: str | None, settings: dict[str, dict[str, Any]]
) -> Any:
    """The unflushed part's rows in a new in-memory dataset with the base
    index's settings, or None without rows (blocking)."""
    import lance

    upper = _unflushed_rows(view, read, filter)
    if not upper:
        return None
    fields = [view.schema.field(c) for c in read]
    rows = pa.concat_tables(
        [pa.Table.from_arrays([t.column(c) for c in read], schema=pa.schema(fields)) for t in upper]
    )
    scratch = lance.write_dataset(rows, f"memory://lance_async-text-{uuid.uuid4().hex}")
    for name, params in settings.items():
        scratch.create_scalar_index(name, "INVERTED", **params)
    return scratch


def _unflushed_part(
    view: LsmView, read: list[str], filter: str | None, settings: dict[str, dict[str, Any]]
) -> Any:
    """The unflushed part of ``view`` (:func:`_build_scratch`), built once per
    set of levels and search shape (blocking; see the module notes). A part
    whose levels are gone (a write made a new set, and nothing holds the
    old one) is dropped at the next build."""
    levels = (*view.shards, *view.memtables)
    same = SameLevels(levels)
    key = (
        view.base.uri,
        tuple(read),
        filter,
        repr(sorted((name, sorted(p.items())) for name, p in settings.items())),
        same.key(),
    )
    with _scratch_lock:
        entry = _scratch.get(key)
        if entry is None or not entry.levels.of(levels):
            entry = _scratch[key] = _Scratch(same)
            keep_live(_scratch, SCRATCH_ENTRIES, lambda e: e.levels)
        _scratch.move_to_end(key)
    with entry.lock:
        if not entry.built:
            entry.dataset = _build_scratch(view, read, filter, settings)
            entry.built = True
    return entry.dataset


def _text_fields(schema: pa.Schema) -> list[str]:
    """The string columns of ``schema`` (what a full-text query may search)."""
    return [
        f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
    ]


def search_text(
    view: LsmView,
    query: TextQuery,
    *,
    limit: int | None,
    offset: int = 0,
    filter: str | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The best ``limit`` live rows matching ``query`` after the best
    ``offset`` (blocking; see the module notes).

    Returns the ``columns`` asked for (default all) and ``_score``
    (float32), best first; equal scores in key order.
    """
    settings = text_columns(view.base, query)
    cols = list(columns) if columns is not None else list(view.schema.names)
    # a query object names its columns out of sight, and the engine searches an
    # unindexed one by scanning it: every text column goes into the unflushed part
    named = [] if isinstance(query, (str, Mapping)) else _text_fields(view.schema)
    read = list(dict.fromkeys([*cols, *settings, *named, *view.keys]))
    names = list(dict.fromkeys([*cols, *view.keys]))
    fetch = None if limit is None else limit + offset
    found: list[pa.Table] = []
    scratch = _unflushed_part(view, read, filter, settings)
    if scratch is not None:
        found.append(
            scratch.scanner(
                columns=[*names, "_score"], full_text_query=query, limit=fetch
            ).to_table()
        )
    block = hidden_blocklist(view)
    found.append(
        view.base.scanner(
            columns=[*names, "_score"],
            full_text_query=query,
            filter=filter,
            prefilter=True,
            limit=fetch,
            row_addr_blocklist=block,
        ).to_table()
    )
    fields = [view.schema.field(c) for c in names] + [pa.field("_score", pa.float32())]
    schema = pa.schema(fields, metadata=view.schema.metadata)
    parts = [
        pa.Table.from_arrays(
            [t.column(c) for c in names] + [t.column("_score").cast(pa.float32())], schema=schema
        )
        for t in found
        if t.num_rows
    ]
    if not parts:
        return schema.empty_table().select([*cols, "_score"])
    ranked = pa.concat_tables(parts).sort_by(
        [("_score", "descending")] + [(key, "ascending") for key in view.keys]
    )
    return ranked.slice(offset, limit).select([*cols, "_score"]).combine_chunks()
