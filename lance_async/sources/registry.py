"""Which kind of source an object is: :func:`coerce_source` and :func:`resolve_source`.

A :func:`functools.singledispatch` function with one registration per type,
as LanceDB's ``scannable.py`` does; pandas and polars converters are
registered the first time such a frame is seen (never imported otherwise).
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pds

from .._schema import describe_difference
from .._threads import run_sync, stream_limiter
from ..errors import SchemaMismatchError, UnsupportedSourceError
from .base import WriteSource
from .files import file_source
from .jsonrows import rows_schema, rows_table
from .kinds import (
    ArrowDatasetSource,
    AsyncIteratorSource,
    IteratorSource,
    LanceDatasetSource,
    MaterializedSource,
    ReaderSource,
)

__all__ = ["coerce_source", "resolve_source"]


def _table_batches(table: pa.Table) -> list[pa.RecordBatch]:
    return [b for b in table.to_batches() if b.num_rows]


def _cast_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Fit a materialized table to an explicit schema; only lossless casts."""
    if table.schema.equals(schema, check_metadata=True):
        return table
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise SchemaMismatchError(f"column {missing[0]!r} is missing", field=missing[0])
    extra = [n for n in table.column_names if n not in schema.names]
    if extra:
        raise SchemaMismatchError(f"unexpected column {extra[0]!r}", field=extra[0])
    table = table.select(schema.names)
    try:
        return table.cast(schema, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise SchemaMismatchError(f"cannot convert the rows to the given schema: {exc}") from exc


def _unknown(obj: object) -> TypeError:
    name = f"{type(obj).__module__}.{type(obj).__qualname__}"
    return UnsupportedSourceError(
        f"cannot use a {name} as a write source. Pass a pyarrow Table, RecordBatch, "
        "RecordBatchReader, dataset, an (async) iterator of RecordBatch, or teach "
        f"lance_async the type: @lance_async.coerce_source.register({type(obj).__name__})"
    )


_COMPACT = {
    pa.large_string(): pa.string(),
    pa.large_binary(): pa.binary(),
    pa.string_view(): pa.string(),
    pa.binary_view(): pa.binary(),
}


def _compact_types(table: pa.Table) -> pa.Table:
    """Frames hand over large / view string types; tables use plain ones.

    The cast is checked (``safe``): it fails rather than lose data (a column
    over 2 GiB of text stays large).
    """
    fields = [
        pa.field(f.name, _COMPACT.get(f.type, f.type), f.nullable, f.metadata) for f in table.schema
    ]
    target = pa.schema(fields, metadata=table.schema.metadata)
    if target.equals(table.schema):
        return table
    try:
        return table.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return table


_optional_done: set[str] = set()


def _register_optional(obj: object) -> bool:
    """Register pandas / polars converters the first time one is seen."""
    module = type(obj).__module__.split(".", 1)[0]
    if module in _optional_done or module not in ("pandas", "polars"):
        return False
    _optional_done.add(module)
    if module == "pandas":
        import pandas as pd

        @coerce_source.register(pd.DataFrame)
        def _from_pandas(obj: Any, *, schema: pa.Schema | None = None) -> WriteSource:
            table = pa.Table.from_pandas(obj, schema=schema, preserve_index=False)
            if schema is None:
                table = _compact_types(table.replace_schema_metadata(None))
            return _from_table(table)

    else:
        import polars as pl

        @coerce_source.register(pl.DataFrame)
        def _from_polars(obj: Any, *, schema: pa.Schema | None = None) -> WriteSource:
            table = obj.to_arrow()
            return _from_table(_compact_types(table) if schema is None else table, schema=schema)

    return True


@functools.singledispatch
def coerce_source(obj: Any, *, schema: pa.Schema | None = None) -> WriteSource:
    """Turn any supported object into a :class:`WriteSource`.

    Parameters
    ----------
    obj : object
        A table, batch(es), frame, dataset, reader, (async) iterator, file path
        or WriteSource (see the module docstring for the modes).
    schema : pa.Schema, optional
        The schema to use. Required for an empty list; for a generator or
        async generator it saves peeking at the first batch. Materialized
        inputs are converted to it with lossless casts only.

    Returns
    -------
    WriteSource

    Raises
    ------
    TypeError
        An unsupported type; the message says how to register it.
    SchemaMismatchError
        The rows do not fit ``schema``.

    Notes
    -----
    A :func:`functools.singledispatch` function: add a type with
    ``@lance_async.coerce_source.register(MyType)``. Wrapping tables,
    batches, readers, datasets, files and iterators does not block (files and
    datasets are opened later, on worker threads); converting Python rows,
    column dicts or DataFrames, or casting to ``schema=``, is O(rows) and
    blocks -- lance_async's own entry points do that on a worker thread.
    """
    if _register_optional(obj):
        return coerce_source(obj, schema=schema)
    if isinstance(obj, AsyncIterable) or hasattr(obj, "__aiter__"):
        return AsyncIteratorSource(obj, schema)
    raise _unknown(obj)


def _from_table(table: pa.Table, *, schema: pa.Schema | None = None) -> WriteSource:
    if schema is not None:
        table = _cast_table(table, schema)
    return MaterializedSource(_table_batches(table), table.schema)


@coerce_source.register(WriteSource)
def _(obj: WriteSource, *, schema: pa.Schema | None = None) -> WriteSource:
    if schema is not None and obj._schema is not None:
        diff = describe_difference(schema, obj._schema)
        if diff is not None:
            raise SchemaMismatchError(
                f"the source does not match schema=: {diff[0]}", field=diff[1]
            )
    return obj


@coerce_source.register(pa.Table)
def _(obj: pa.Table, *, schema: pa.Schema | None = None) -> WriteSource:
    return _from_table(obj, schema=schema)


@coerce_source.register(pa.RecordBatch)
def _(obj: pa.RecordBatch, *, schema: pa.Schema | None = None) -> WriteSource:
    return _from_table(pa.Table.from_batches([obj]), schema=schema)


@coerce_source.register(list)
@coerce_source.register(tuple)
def _(obj: list[Any] | tuple[Any, ...], *, schema: pa.Schema | None = None) -> WriteSource:
    items = list(obj)
    if not items:
        if schema is None:
            raise SchemaMismatchError("an empty list needs schema= to say what rows it holds")
        return MaterializedSource([], schema)
    if all(isinstance(i, pa.RecordBatch) for i in items):
        first = schema or items[0].schema
        if schema is not None and not items[0].schema.equals(schema, check_metadata=True):
            table = pa.Table.from_batches(items)
            return _from_table(table, schema=schema)
        return MaterializedSource(items, first)
    if all(isinstance(i, pa.Table) for i in items):
        return _from_table(pa.concat_tables(items), schema=schema)
    if all(isinstance(i, Mapping) for i in items):
        if schema is not None:  # the JSON rule (jsonrows.py), never pyarrow's lax conversion
            table = rows_table([dict(i) for i in items], schema)
            return MaterializedSource(_table_batches(table), table.schema)
        try:
            table = pa.Table.from_pylist(items)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SchemaMismatchError(f"cannot convert the rows: {exc}") from exc
        return MaterializedSource(_table_batches(table), table.schema)
    kinds = sorted({type(i).__name__ for i in items})
    raise UnsupportedSourceError(
        f"a list source must hold only RecordBatch, Table or dict items, got {', '.join(kinds)}"
    )


@coerce_source.register(dict)
def _(obj: dict[str, Any], *, schema: pa.Schema | None = None) -> WriteSource:
    if schema is not None:  # the JSON rule (jsonrows.py), never pyarrow's lax conversion
        table = rows_table(obj, schema)
        return MaterializedSource(_table_batches(table), table.schema)
    try:
        table = pa.table(obj)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise SchemaMismatchError(f"cannot convert the columns: {exc}") from exc
    return MaterializedSource(_table_batches(table), table.schema)


@coerce_source.register(pa.RecordBatchReader)
def _(obj: pa.RecordBatchReader, *, schema: pa.Schema | None = None) -> WriteSource:
    return ReaderSource(obj, schema)


@coerce_source.register(pds.Scanner)
def _(obj: pds.Scanner, *, schema: pa.Schema | None = None) -> WriteSource:
    return ReaderSource(obj, schema)


@coerce_source.register(pds.Dataset)
def _(obj: pds.Dataset, *, schema: pa.Schema | None = None) -> WriteSource:
    from lance.dataset import LanceDataset

    if isinstance(obj, LanceDataset):
        return _lance_source(obj, schema=schema)
    return ArrowDatasetSource(obj, schema)


def _lance_source(obj: Any, *, schema: pa.Schema | None = None) -> WriteSource:
    source = LanceDatasetSource(obj)
    if schema is not None:
        diff = describe_difference(schema, source.schema)
        if diff is not None:
            raise SchemaMismatchError(
                f"the dataset does not match schema=: {diff[0]}", field=diff[1]
            )
    return source


@coerce_source.register(str)
@coerce_source.register(bytes)
def _(obj: str | bytes, *, schema: pa.Schema | None = None) -> WriteSource:
    raise UnsupportedSourceError(
        "a string is not a write source; for a file use lance_async.file_source(path) "
        "or pass a pathlib.Path"
    )


@coerce_source.register(os.PathLike)
def _(obj: os.PathLike[str], *, schema: pa.Schema | None = None) -> WriteSource:
    return file_source(obj, schema=schema)


@coerce_source.register(Iterator)
def _(obj: Iterator[Any], *, schema: pa.Schema | None = None) -> WriteSource:
    return IteratorSource(obj, schema)


@coerce_source.register(AsyncIterable)
def _(obj: AsyncIterable[Any], *, schema: pa.Schema | None = None) -> WriteSource:
    return AsyncIteratorSource(obj, schema)


async def resolve_source(
    obj: Any, *, schema: pa.Schema | None = None, rows_into: pa.Schema | None = None
) -> WriteSource:
    """Coerce ``obj`` and make sure its schema is known (peeking if needed).

    The async twin of :func:`coerce_source`, used by every lance_async entry
    point: an iterator given without ``schema=`` is advanced by one batch (on
    a worker thread for sync iterators) and that batch is kept for the pass.
    Conversions that touch every row (Python rows, column dicts, DataFrames,
    casts to ``schema=``) run on a worker thread; tables, batches, readers,
    datasets and iterators are wrapped on the loop (O(1)).

    ``rows_into``: a table's schema that Python rows (a column dict, a list
    of row dicts) given without ``schema=`` are read into, by the one JSON
    rule (:func:`~lance_async.sources.jsonrows.rows_schema`); other sources
    ignore it.

    Returns
    -------
    WriteSource
        With :attr:`WriteSource.schema` available.
    """
    if schema is None and rows_into is not None:
        schema = rows_schema(obj, rows_into)
    if _converts_rows(obj, schema):
        source = await run_sync(
            functools.partial(coerce_source, obj, schema=schema), limiter=stream_limiter()
        )
    else:
        source = coerce_source(obj, schema=schema)
    await source.resolve_schema()
    return source


def _converts_rows(obj: Any, schema: pa.Schema | None) -> bool:
    """Whether coercing ``obj`` converts or casts its rows (O(rows), blocking)."""
    if isinstance(obj, (pa.Table, pa.RecordBatch)):
        return schema is not None and not obj.schema.equals(schema, check_metadata=True)
    if isinstance(obj, (list, tuple)):
        return bool(obj) and (
            schema is not None or not isinstance(obj[0], (pa.RecordBatch, pa.Table))
        )
    if isinstance(obj, dict):
        return True
    return type(obj).__module__.split(".", 1)[0] in ("pandas", "polars")
