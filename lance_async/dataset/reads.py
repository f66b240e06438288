"""Reads of the base table: scans, counts, takes, samples, SQL, blobs, fragments (``ReadsMixin``).

Every read runs on a worker thread (scans on their own prefetch thread, see
:class:`~lance_async.AsyncBatchStream`) and reads the version the object is
at. ``scan``, ``to_table`` and ``count_rows`` take LanceDB's ``use_lsm=``
switch: True reads the LSM view instead (base table, flushed generations
and WAL tails: every durable row; ``lsm/``'s reader). A plain read of a
MemWAL table says once, in the log, when it misses durable rows
(``hints.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa

from .._args import check_batch_size, check_int, check_knn
from .._engine_errors import raise_mapped
from .._filters import check_filter
from .._metrics import record_scan
from ..errors import InvalidInputError, SchemaMismatchError
from ..sources.streams import AsyncBatchStream
from ._core import DatasetCore, engine_call
from .handles import AsyncBlobFile, AsyncFragment, AsyncSqlQuery
from .hints import hint_once

__all__ = ["SLICED_BELOW", "ReadsMixin"]

_LSM_SCAN = frozenset({"columns", "filter", "limit", "offset", "with_row_id", "batch_size"})
_LSM_SEARCH = frozenset({"columns", "filter", "nearest", "prefilter"})
_LSM_NEAREST = ("k", "nprobes", "refine_factor", "metric", "distance_range")
_LSM_TEXT = frozenset({"columns", "filter", "full_text_query", "limit", "offset", "prefilter"})


def _lsm_only(options: Mapping[str, Any], allowed: frozenset[str], call: str) -> None:
    """``use_lsm=True`` takes the options the LSM reads have; others are a TypeError."""
    extra = sorted(k for k, v in options.items() if k not in allowed and v is not None)
    if extra:
        raise TypeError(
            f"{call}(use_lsm=True) does not take {', '.join(extra)}: the LSM read takes "
            f"{', '.join(sorted(allowed))} (see AsyncDataset.lsm)"
        )


SLICED_BELOW = 16_384
"""Scans asking for batches smaller than this read batches of about this size
and slice them on the loop."""


def _projected_schema(
    schema: pa.Schema,
    columns: Sequence[str] | Mapping[str, str] | None,
    with_row_id: bool,
    nearest: Mapping[str, Any] | None,
) -> pa.Schema | None:
    if columns is not None and not isinstance(columns, (list, tuple)):
        return None  # SQL projections: known once the scan opens
    fields = [schema.field(c) for c in columns] if columns is not None else list(schema)
    if any(f is None for f in fields):
        return None
    if nearest:
        fields.append(pa.field("_distance", pa.float32()))
    if with_row_id:
        fields.append(pa.field("_rowid", pa.uint64()))
    return pa.schema(fields, metadata=schema.metadata)


def _check_columns(schema: pa.Schema, columns: Sequence[str] | None) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, str):
        raise TypeError("columns must be a list of column names, not a string")
    names = list(columns)
    unknown = [c for c in names if c not in schema.names]
    if unknown:
        raise SchemaMismatchError(
            f"no column {unknown[0]!r} in the table (it has {schema.names})", field=unknown[0]
        )
    return names


def _check_nearest(nearest: object) -> None:
    """The integer options of a scanner's ``nearest`` (``k``, ``nprobes``,
    ``refine_factor``), bounded as :func:`~lance_async._args.check_knn` does:
    the engine aborts the process on a ``k`` it cannot allocate room for."""
    if isinstance(nearest, Mapping):
        check_knn({n: nearest[n] for n in ("k", "nprobes", "refine_factor") if n in nearest})


def _check_scanner_ints(options: Mapping[str, Any]) -> None:
    """The integer scanner options of ``to_table``/``to_pandas``, checked at the call."""
    _check_nearest(options.get("nearest"))
    for name in ("limit", "offset"):
        if options.get(name) is not None:
            check_int(name, options[name], minimum=0)
    if options.get("batch_size") is not None:
        check_batch_size("batch_size", options["batch_size"])


class ReadsMixin(DatasetCore):
    """Base-table reads of :class:`~lance_async.AsyncDataset`."""

    def scan(
        self,
        columns: Sequence[str] | Mapping[str, str] | None = None,
        filter: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        batch_size: int | None = None,
        with_row_id: bool = False,
        nearest: Mapping[str, Any] | None = None,
        prefetch: int | None = None,
        use_lsm: bool = False,
        **scanner_options: Any,
    ) -> AsyncBatchStream:
        """Scan the dataset as an ``async for`` stream of record batches.

        The twin of ``LanceDataset.scanner(...).to_reader()`` and
        ``to_batches`` (pylance); extra keyword arguments are passed
        through to ``scanner``. With ``use_lsm=True`` (LanceDB's switch) it
        is :meth:`LsmReader.scan <lance_async.LsmReader.scan>`: every
        durable row, MemWAL included.

        Parameters
        ----------
        columns : list of str or dict, optional
            Columns to read, or ``{name: SQL expression}``.
        filter : str, optional
            Lance SQL filter: one expression (see :func:`check_filter`;
            :class:`~lance_async.errors.FilterError` otherwise, at the call).
        limit, offset : int, optional
            Rows to return / skip (>= 0).
        batch_size : int, optional
            Rows per batch at most (>= 1; Lance's default otherwise); smaller
            than 16,384, larger batches are read and sliced on the loop
            (zero-copy).
        with_row_id : bool
            Add the ``_rowid`` column.
        nearest : dict, optional
            Vector search, as in ``LanceDataset.scanner(nearest=...)``; adds
            ``_distance``.
        prefetch : int, optional
            Batches read ahead by the worker thread (default 4, >= 1).
        use_lsm : bool
            Read the LSM view (base table, flushed generations, WAL tails)
            instead of the base table alone; takes ``columns``, ``filter``,
            ``limit``, ``offset``, ``with_row_id`` and ``batch_size``. False
            (the default): the base table, and on a MemWAL table the first
            such read in a process logs (once) what durable rows it misses.

        Returns
        -------
        AsyncBatchStream
            Reads this object's current version. Nothing happens until the
            first ``__anext__``. Leaving ``async with`` or ``aclose()`` stops
            the scan and closes the reader promptly; so does ``break`` when
            nothing else holds the stream (see :class:`AsyncBatchStream`).

        Raises
        ------
        ValueError, TypeError
            A negative ``limit`` or ``offset``, ``batch_size`` or
            ``prefetch`` below 1, ``columns`` given as one string (at the call).
        SchemaMismatchError
            A listed column is not in the table (at the call).
        TypeError
            ``use_lsm=True`` with an option the LSM scan does not take.
        """
        if use_lsm:
            _lsm_only(
                {"nearest": nearest, "prefetch": prefetch, **scanner_options}, _LSM_SCAN, "scan"
            )
            if isinstance(columns, Mapping):
                raise TypeError("scan(use_lsm=True) takes a list of column names")
            return self.lsm.scan(
                columns,
                filter,
                limit,
                offset=offset,
                with_row_id=with_row_id,
                batch_size=batch_size,
            )
        ds = self._ds
        uri, storage = self.uri, self.storage_options
        record_scan(self.uri, "base")
        if isinstance(columns, (list, tuple, str)):
            _check_columns(ds.schema, columns)
        _check_nearest(nearest)
        options: dict[str, Any] = dict(scanner_options)
        for key, value in (
            ("columns", columns),
            ("filter", check_filter(filter)),
            ("limit", None if limit is None else check_int("limit", limit, minimum=0)),
            ("offset", None if offset is None else check_int("offset", offset, minimum=0)),
            (
                "batch_size",
                None if batch_size is None else check_batch_size("batch_size", batch_size),
            ),
            ("nearest", nearest),
        ):
            if value is not None:
                options[key] = value
        if with_row_id:
            options["with_row_id"] = True

        def opener() -> pa.RecordBatchReader:
            hint_once(ds, uri, storage)
            try:
                return ds.scanner(**options).to_reader()
            except (OSError, ValueError) as exc:
                raise_mapped(exc)
                raise

        schema = None
        if not scanner_options:
            schema = _projected_schema(ds.schema, columns, with_row_id, nearest)
        max_rows = None
        if batch_size is not None and batch_size < SLICED_BELOW:
            # small batches: read ~16k-row ones and slice them on the loop (zero-copy);
            # the engine and the thread hand-over cost per batch, not per row
            options["batch_size"] = batch_size * -(-SLICED_BELOW // batch_size)
            max_rows = batch_size
        return AsyncBatchStream(
            opener, schema=schema, prefetch=4 if prefetch is None else prefetch, max_rows=max_rows
        )

    async def to_table(self, *, use_lsm: bool = False, **scanner_options: Any) -> pa.Table:
        """Read rows into one table (``LanceDataset.to_table`` on a worker thread).

        Keyword arguments are those of ``LanceDataset.scanner`` (columns,
        filter, limit, offset, nearest, ...); a string ``filter`` must be
        one expression (:class:`~lance_async.errors.FilterError`).

        Parameters
        ----------
        use_lsm : bool
            Read the LSM view instead of the base table alone (LanceDB's
            switch): every durable row, MemWAL included. Takes ``columns``,
            ``filter``, ``limit``, ``offset``, ``with_row_id``,
            ``batch_size``, or ``nearest`` (a vector search:
            :meth:`LsmReader.vector_search <lance_async.LsmReader.vector_search>`
            with the dict's ``column``, ``q``, ``k``, ``nprobes``,
            ``refine_factor``, ``metric``, ``distance_range`` and
            ``use_index`` (False: ``bypass_vector_index``), and ``columns``,
            ``filter``, ``prefilter``: unlike pylance's scanner, whose
            default is False, the LSM search prefilters unless given
            ``prefilter=False`` (then ``postfilter``)), or
            ``full_text_query`` (a full-text search:
            :meth:`LsmReader.full_text_search <lance_async.LsmReader.full_text_search>`
            with ``columns``, ``filter`` (always a prefilter: ``prefilter=False``
            is refused), ``limit`` (default every match, as pylance's) and
            ``offset``).

        Raises
        ------
        ValueError, TypeError
            A negative ``limit`` or ``offset``, one past int64, a
            ``batch_size`` outside 1..2**32-1 (at the call); with
            ``use_lsm``, an option the LSM reads do not take.
        """
        if use_lsm:
            nearest = scanner_options.get("nearest")
            text = scanner_options.get("full_text_query")
            if text is not None:
                _lsm_only(scanner_options, _LSM_TEXT, "to_table")
                return await self._lsm_text(text, scanner_options)
            if nearest is not None:
                _lsm_only(scanner_options, _LSM_SEARCH, "to_table")
                return await self._lsm_search(nearest, scanner_options)
            _lsm_only(scanner_options, _LSM_SCAN, "to_table")
            return await self.scan(use_lsm=True, **scanner_options).to_table()
        if "filter" in scanner_options:
            scanner_options["filter"] = check_filter(scanner_options["filter"])
        _check_scanner_ints(scanner_options)
        ds, uri, storage = self._ds, self.uri, self.storage_options

        def read() -> pa.Table:
            hint_once(ds, uri, storage)
            return ds.to_table(**scanner_options)

        return await engine_call(read)

    async def _lsm_text(self, query: Any, options: Mapping[str, Any]) -> pa.Table:
        if options.get("prefilter") is False:
            raise InvalidInputError(
                "to_table(use_lsm=True, full_text_query=...) filters before ranking in every "
                "level: prefilter=False (a postfilter) is not supported (LanceDB refuses it too)"
            )
        return await self.lsm.full_text_search(
            query,
            filter=options.get("filter"),
            columns=options.get("columns"),
            limit=options.get("limit"),
            offset=options.get("offset") or 0,
        )

    async def _lsm_search(self, nearest: Any, options: Mapping[str, Any]) -> pa.Table:
        if not isinstance(nearest, Mapping) or "column" not in nearest or "q" not in nearest:
            raise TypeError("nearest must be a dict with 'column' and 'q' (as pylance's)")
        unknown = sorted(set(nearest) - {"column", "q", "use_index", *_LSM_NEAREST})
        if unknown:
            raise TypeError(f"to_table(use_lsm=True) does not take nearest={unknown}")
        extra = {n: nearest[n] for n in _LSM_NEAREST if n in nearest}
        use_index = True if nearest.get("use_index") is None else nearest["use_index"]
        prefilter = True if options.get("prefilter") is None else options["prefilter"]
        for name, flag in (("use_index", use_index), ("prefilter", prefilter)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {type(flag).__name__}")
        return await self.lsm.vector_search(
            nearest["q"],
            column=nearest["column"],
            filter=options.get("filter"),
            columns=options.get("columns"),
            postfilter=not prefilter,
            bypass_vector_index=not use_index,
            **extra,
        )

    async def count_rows(self, filter: str | None = None, *, use_lsm: bool = False) -> int:
        """Number of rows, optionally matching a Lance SQL ``filter``
        (``LanceDataset.count_rows`` on a worker thread).

        With ``use_lsm=True``: the live keys of the LSM view (base table,
        flushed generations, WAL tails; a key counts once, deleted keys not
        at all), read as a scan of the key columns.

        Raises
        ------
        FilterError
            ``filter`` is not one expression.
        InvalidInputError
            ``use_lsm=True`` on a table without a primary key.
        """
        checked = check_filter(filter)
        if use_lsm:
            keys = self.primary_key
            if not keys:
                raise InvalidInputError("count_rows(use_lsm=True) needs a primary key")
            total = 0
            async with self.lsm.scan(keys, checked) as stream:
                async for batch in stream:
                    total += batch.num_rows
            return total
        ds, uri, storage = self._ds, self.uri, self.storage_options

        def count() -> int:
            hint_once(ds, uri, storage)
            return int(ds.count_rows(checked))

        return await engine_call(count)

    async def take(self, indices: Sequence[int], columns: Sequence[str] | None = None) -> pa.Table:
        """Rows at the given offsets (0-based, in the given order;
        ``LanceDataset.take`` on a worker thread).

        Raises
        ------
        ValueError, TypeError
            A negative offset, or ``columns`` given as one string (at the call).
        SchemaMismatchError
            A listed column is not in the table.
        """
        cols = _check_columns(self.schema, columns)
        wanted = [check_int("indices[]", i, minimum=0) for i in indices]
        return await engine_call(lambda: self._ds.take(wanted, columns=cols))

    async def head(self, n: int = 5) -> pa.Table:
        """The first ``n`` rows (``LanceDataset.head``; ``n`` >= 0)."""
        limit = check_int("n", n, minimum=0)
        table: pa.Table = await engine_call(lambda: self._ds.to_table(limit=limit))
        return table

    async def sample(
        self,
        num_rows: int,
        columns: Sequence[str] | None = None,
        randomize_order: bool = True,
    ) -> pa.Table:
        """``num_rows`` rows picked at random, without repeats
        (``LanceDataset.sample`` on a worker thread).

        Raises
        ------
        ValueError, TypeError
            ``num_rows`` negative (at the call).
        SchemaMismatchError
            A listed column is not in the table.
        InvalidInputError
            ``num_rows`` is more than the table holds.
        """
        count = check_int("num_rows", num_rows, minimum=0)
        cols = _check_columns(self.schema, columns)

        def work() -> pa.Table:
            total = self._ds.count_rows()
            if count > total:
                raise InvalidInputError(f"cannot sample {count} rows from a table of {total}")
            return self._ds.sample(count, cols, randomize_order=randomize_order)

        return await engine_call(work)

    async def slice(self, start: int, end: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows ``start`` (inclusive) to ``end`` (exclusive) by position
        (``LanceDataset.slice`` on a worker thread).

        Raises
        ------
        ValueError, TypeError
            A negative ``start``, ``end`` before ``start`` (at the call).
        """
        first = check_int("start", start, minimum=0)
        last = check_int("end", end, minimum=first)
        cols = _check_columns(self.schema, columns)
        return await engine_call(lambda: self._ds.slice(first, last, columns=cols))

    async def to_pandas(self, **scanner_options: Any) -> Any:
        """Rows as a pandas DataFrame (``LanceDataset.to_pandas``): read and
        converted on a worker thread (the conversion copies every value, so it
        must not run on the loop). Keyword arguments as :meth:`to_table`."""
        if "filter" in scanner_options:
            scanner_options["filter"] = check_filter(scanner_options["filter"])
        _check_scanner_ints(scanner_options)
        return await engine_call(lambda: self._ds.to_table(**scanner_options).to_pandas())

    # -- SQL, blobs, fragments ---------------------------------------------
    def sql(self, query: str) -> AsyncSqlQuery:
        """A SQL query over this dataset (``LanceDataset.sql``), awaitable.

        Parameters
        ----------
        query : str
            A SQL ``SELECT``; the dataset is ``dataset`` in it (or the name
            given to ``.table_name()``), or the ``FROM`` is left out.

        Returns
        -------
        AsyncSqlQuery
            Settings as pylance's builder (``.with_row_id()``, ``.batch_size(n)``
            ...); then ``await q.to_table()``, ``await q.to_batch_records()``
            or ``async for batch in q.to_batches()``. Does not block; the
            query reads the version this object reads when it runs.

        Raises
        ------
        TypeError
            ``query`` is not a non-empty string (at the call).
        InvalidInputError
            A query the engine cannot plan (when it runs).
        """
        if not isinstance(query, str) or not query.strip():
            raise TypeError("query must be a non-empty SQL string")
        ds = self._ds
        return AsyncSqlQuery(lambda: ds.sql(query), query)

    async def take_blobs(
        self,
        blob_column: str,
        ids: Sequence[int] | pa.Array | None = None,
        addresses: Sequence[int] | pa.Array | None = None,
        indices: Sequence[int] | pa.Array | None = None,
        *,
        buffer_size: int = 524_288,
    ) -> list[AsyncBlobFile | None]:
        """Blobs as file-like objects read lazily (``LanceDataset.take_blobs``).

        Exactly one of ``ids`` (row ids), ``addresses`` (row addresses) or
        ``indices`` (offsets in the dataset) selects the rows.

        Returns
        -------
        list of AsyncBlobFile or None
            One per row selected (None for a null blob); each reads on a
            worker thread (``await blob.read()``) and is an ``async with``.

        Raises
        ------
        ValueError, TypeError
            Not exactly one selector, ``buffer_size`` below 1 (at the call).
        SchemaMismatchError
            ``blob_column`` is not a column of the table.
        """
        selector = _blob_selector(self.schema, blob_column, ids, addresses, indices)
        size = check_int("buffer_size", buffer_size, minimum=1)
        ds = self._ds
        blobs = await engine_call(lambda: ds.take_blobs(blob_column, **selector, buffer_size=size))
        return [AsyncBlobFile(b) if b is not None else None for b in blobs]

    async def read_blobs(
        self,
        blob_column: str,
        ids: Sequence[int] | pa.Array | None = None,
        addresses: Sequence[int] | pa.Array | None = None,
        indices: Sequence[int] | pa.Array | None = None,
        *,
        io_buffer_size: int | None = None,
        preserve_order: bool | None = None,
    ) -> list[tuple[int, bytes | None]]:
        """Blobs read whole, in one planned read (``LanceDataset.read_blobs``):
        ``(row, bytes or None)`` per row selected. Selectors as :meth:`take_blobs`."""
        selector = _blob_selector(self.schema, blob_column, ids, addresses, indices)
        if io_buffer_size is not None:
            check_int("io_buffer_size", io_buffer_size, minimum=1)
        ds = self._ds
        found: list[tuple[int, bytes | None]] = await engine_call(
            lambda: ds.read_blobs(
                blob_column,
                **selector,
                io_buffer_size=io_buffer_size,
                preserve_order=preserve_order,
            )
        )
        return found

    async def read_blob_ranges(
        self,
        blob_column: str,
        requests: Sequence[tuple[int, int, int]],
        *,
        selector: Literal["ids", "addresses", "indices"],
        io_buffer_size: int | None = None,
        preserve_order: bool | None = None,
    ) -> list[tuple[int, int, bytes | None]]:
        """Byte ranges of blobs, ``(row, offset, length)`` each, in one planned
        read (``LanceDataset.read_blob_ranges``)."""
        _blob_column(self.schema, blob_column)
        if selector not in ("ids", "addresses", "indices"):
            raise ValueError(f"selector must be 'ids', 'addresses' or 'indices', got {selector!r}")
        wanted = [
            (
                check_int("row", r, minimum=0),
                check_int("offset", o, minimum=0),
                check_int("length", n, minimum=0),
            )
            for r, o, n in requests
        ]
        ds = self._ds
        found: list[tuple[int, int, bytes | None]] = await engine_call(
            lambda: ds.read_blob_ranges(
                blob_column,
                wanted,
                selector=selector,
                io_buffer_size=io_buffer_size,
                preserve_order=preserve_order,
            )
        )
        return found

    async def get_fragments(self) -> list[AsyncFragment]:
        """The fragments of the version this object reads (``LanceDataset.get_fragments``)."""
        ds = self._ds
        return [AsyncFragment(f) for f in await engine_call(ds.get_fragments)]

    async def get_fragment(self, fragment_id: int) -> AsyncFragment | None:
        """One fragment by id, or None (``LanceDataset.get_fragment``)."""
        number = check_int("fragment_id", fragment_id, minimum=0)
        ds = self._ds
        found = await engine_call(lambda: ds.get_fragment(number))
        return AsyncFragment(found) if found is not None else None

    async def fragment_ids(self) -> list[int]:
        """The ids of the fragments of the version this object reads."""
        ds = self._ds
        return [int(i) for i in await engine_call(ds.fragment_ids)]


def _blob_column(schema: pa.Schema, name: str) -> None:
    if not isinstance(name, str):
        raise TypeError(f"blob_column must be a column name, got {type(name).__name__}")
    if name not in schema.names:
        raise SchemaMismatchError(f"no column {name!r} in the table", field=name)


def _blob_selector(
    schema: pa.Schema, column: str, ids: Any, addresses: Any, indices: Any
) -> dict[str, Any]:
    """The one selector of a blob read, as pylance's keyword (checked at the call)."""
    _blob_column(schema, column)
    named = (("ids", ids), ("addresses", addresses), ("indices", indices))
    given = {k: v for k, v in named if v is not None}
    if len(given) != 1:
        raise ValueError("give exactly one of ids=, addresses= or indices=")
    ((name, value),) = given.items()
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a list of ints or an integer array")
    return {name: value}
