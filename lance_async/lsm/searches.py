"""The searches of an LSM read: nearest vectors and full-text matches across the levels.

:class:`SearchReads` adds :meth:`~SearchReads.vector_search` (``vector.py``)
and :meth:`~SearchReads.full_text_search` (``text.py``) to the shared
checks of :class:`~lance_async.lsm.readerbase.ReaderBase`;
:class:`~lance_async.lsm.reader.LsmReader` builds on it. Both rank each
level's own live rows (a key's newest version only) and merge them, as
LanceDB's MemWAL reads do.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import pyarrow as pa

from .._args import KNN_MAX_K, check_columns, check_distance_range, check_int, check_knn
from .._filters import check_lsm_filter
from .._metrics import record_lookup
from .readerbase import ReaderBase
from .snapshots import LsmSnapshot, ShardSnapshots
from .text import search_text, text_query
from .vector import search_view, vector_query

__all__ = ["SearchReads"]


class SearchReads(ReaderBase):
    """Vector and full-text search across the levels (see the module notes).

    Reached as :class:`~lance_async.LsmReader`'s methods; its parameters
    are :class:`~lance_async.lsm.readerbase.ReaderBase`'s.
    """

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
        views = self._views(snapshots, snapshot)
        record_lookup(self._table.uri, f"{self._path}-vector")
        work = partial(
            search_view,
            query=q,
            column=column,
            k=k,
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
        return await views.run(work, self._table.storage_timeout)

    async def full_text_search(
        self,
        query: Any,
        *,
        fts_columns: str | Sequence[str] | None = None,
        limit: int | None = 10,
        offset: int = 0,
        filter: str | None = None,
        columns: Sequence[str] | None = None,
        snapshots: ShardSnapshots | None = None,
        snapshot: LsmSnapshot | None = None,
    ) -> pa.Table:
        """The rows best matching a full-text query across the levels, newest version per key.

        Parameters
        ----------
        query : str, dict or lance.query object
            What pylance's ``full_text_query`` takes: words (``"quick fox"``),
            ``{"query": ..., "columns": [...]}``, or a ``lance.query`` object
            (``MatchQuery``, ``PhraseQuery``, ``BooleanQuery``, ...).
        fts_columns : str or list of str, optional
            The columns to search (LanceDB's ``fts_columns``); default every
            column of the base table with an INVERTED index.
        limit : int or None
            Rows to return (default 10, as LanceDB's; None: every match).
        offset : int
            Skip the best ``offset`` rows (default 0: ``offset=limit`` is the
            second page).
        filter : str, optional
            Lance SQL, applied before ranking (a prefilter, in every level);
            it may not name ``_rowid`` or ``_rowaddr``.
        columns : list of str, optional
            Columns to return besides ``_score`` (default all).
        snapshots : list of ShardSnapshot, optional
            Only these shards, as listed (see :meth:`scan`).
        snapshot : LsmSnapshot, optional
            Read this point-in-time view (:meth:`snapshot`) instead of now.

        Returns
        -------
        pa.Table
            At most ``limit`` rows with ``_score`` (float32, BM25), best
            first; equal scores in key order.

        Raises
        ------
        TypeError, ValueError
            A query of another type or an empty one, ``limit`` below 1 or
            above 1,000,000, a negative ``offset``, ``columns`` given as one
            string (at the call).
        FilterError
            ``filter`` is not one expression, or names a row id or address.
        SchemaMismatchError
            A column named is not in the table.
        InvalidInputError
            No INVERTED index on a column searched (or
            more than one: which one ranks is not defined).
        ViewExpiredError
            ``snapshot`` given and a file it pins was deleted since.

        Notes
        -----
        The base table is searched through its INVERTED index, the rows of
        the other levels through one built for the read with the base
        index's tokenizer settings, so a word matches alike in every level
        (``text.py``): the set of rows is exact, scores are BM25 within the
        base and within the rest. Unlike LanceDB's MemWAL search, no index
        need be "maintained" by the writers, and a filter is always a
        prefilter (LanceDB refuses ``postfilter()`` here too).
        """
        q = text_query(query, fts_columns)
        if limit is not None:
            limit = check_int("limit", limit, minimum=1, maximum=KNN_MAX_K)
        skip = check_int("offset", offset, minimum=0, maximum=KNN_MAX_K)
        cols = self._columns(check_columns(columns))
        filter = check_lsm_filter(filter)
        views = self._views(snapshots, snapshot)
        record_lookup(self._table.uri, f"{self._path}-text")
        work = partial(search_text, query=q, limit=limit, offset=skip, filter=filter, columns=cols)
        return await views.run(work, self._table.storage_timeout)
