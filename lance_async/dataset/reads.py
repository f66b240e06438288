"""Reads of the base table: scans, counts, takes, samples (``ReadsMixin``).

Every read runs on a worker thread (scans on their own prefetch thread, see
:class:`~lance_async.AsyncBatchStream`) and reads the version the object is
at. The LSM reads (base table and MemWAL together) are in ``memwal.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from .._args import check_batch_size, check_int, check_knn
from .._filters import check_filter
from .._metrics import record_scan
from ..errors import InvalidInputError, SchemaMismatchError, raise_mapped
from ..sources.streams import AsyncBatchStream
from ._core import DatasetCore, engine_call

__all__ = ["SLICED_BELOW", "ReadsMixin"]

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
        **scanner_options: Any,
    ) -> AsyncBatchStream:
        """Scan the dataset as an ``async for`` stream of record batches.

        The twin of ``LanceDataset.scanner(...).to_reader()`` and
        ``to_batches`` (pylance); extra keyword arguments are passed
        through to ``scanner``.

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
        """
        ds = self._ds
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

    async def to_table(self, **scanner_options: Any) -> pa.Table:
        """Read rows into one table (``LanceDataset.to_table`` on a worker thread).

        Keyword arguments are those of ``LanceDataset.scanner`` (columns,
        filter, limit, offset, nearest, ...); a string ``filter`` must be
        one expression (:class:`~lance_async.errors.FilterError`).

        Raises
        ------
        ValueError, TypeError
            A negative ``limit`` or ``offset``, one past int64, a
            ``batch_size`` outside 1..2**32-1 (at the call).
        """
        if "filter" in scanner_options:
            scanner_options["filter"] = check_filter(scanner_options["filter"])
        _check_scanner_ints(scanner_options)
        return await engine_call(lambda: self._ds.to_table(**scanner_options))

    async def count_rows(self, filter: str | None = None) -> int:
        """Number of rows, optionally matching a Lance SQL ``filter``
        (``LanceDataset.count_rows`` on a worker thread).

        Raises
        ------
        FilterError
            ``filter`` is not one expression.
        """
        checked = check_filter(filter)
        return int(await engine_call(lambda: self._ds.count_rows(checked)))

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
