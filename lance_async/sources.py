"""Write sources: anything that can feed rows to an upsert or a MemWAL put.

A :class:`WriteSource` is a schema, a :class:`SourceMode` and a way to make a
fresh pass over the rows on every call -- as an async iterator for the loop
(:meth:`WriteSource.open`) or as a blocking ``pa.RecordBatchReader`` for a
worker thread (:meth:`WriteSource.open_reader`). The idea follows LanceDB's
``scannable.py``: a reader factory plus a flag saying whether it can be
scanned again, made by a :func:`functools.singledispatch` function with one
registration per type.

============  ================================================  =======================
mode          examples                                          what a retry does
============  ================================================  =======================
MATERIALIZED  pa.Table, pa.RecordBatch, lists of batches,       Lance's in-memory
              dicts of columns, lists of dicts, pandas /        retries
              polars frames
REPLAYABLE    LanceDataset (pinned to a version), unfiltered    call the factory again
              pyarrow.dataset datasets, :func:`replayable`
              factories, :func:`lance_async.file_source`
              files, WriteSource objects
STREAMING     pa.RecordBatchReader, pyarrow.dataset.Scanner,    one pass only
              generators, iterators, async generators, async
              iterators
============  ================================================  =======================

Every pass of a replayable source is checked: a reader whose schema differs
from the first pass (metadata included) raises
:class:`~lance_async.errors.SourceChangedError` before a row moves. Every
batch that crosses into the engine is checked against the declared schema; a
drifting batch raises :class:`~lance_async.errors.SchemaMismatchError` naming
the batch and the field (never a Rust panic, never a lossy cast).
"""

from __future__ import annotations

import enum
import functools
import inspect
import itertools
import os
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as pds

from ._loop import aclose_shielded
from ._schema import conform_batch, describe_difference
from ._threads import run_sync, stream_limiter
from .errors import (
    SchemaMismatchError,
    SourceChangedError,
    SourceConsumedError,
    SourceError,
    UnsupportedSourceError,
)
from .streams import AsyncBatchStream, bridge_reader

__all__ = [
    "ReaderPlan",
    "SourceMode",
    "WriteSource",
    "coerce_source",
    "replayable",
    "resolve_source",
]

Factory = Callable[[], Any]
DEFAULT_BRIDGE_BATCHES = 4
DEFAULT_BRIDGE_BYTES = 64 * 1024 * 1024


class SourceMode(str, enum.Enum):
    """How a source can be read, and so how a conflict retry can re-read it."""

    MATERIALIZED = "materialized"
    """All rows are in memory already (tables, batches, frames)."""
    REPLAYABLE = "replayable"
    """A factory gives a fresh, identical pass on every call."""
    STREAMING = "streaming"
    """One pass only (readers, generators, async iterators)."""


# ---------------------------------------------------------------------------
# batch checking helpers
# ---------------------------------------------------------------------------


def _check_pass(
    batch: pa.RecordBatch, schema: pa.Schema, index: int, pass_no: int
) -> pa.RecordBatch:
    """Check one batch of pass ``pass_no``; a mismatch on a replay is a changed source."""
    try:
        return conform_batch(batch, schema, index)
    except SchemaMismatchError as exc:
        if pass_no > 1:
            raise SourceChangedError(
                f"pass {pass_no} of a replayable source differs from pass 1: {exc}"
            ) from exc
        raise


def _checked(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    pass_no: int,
    sink: Callable[[BaseException], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Check each batch; record any error in ``sink`` before raising it.

    The sink matters when Rust drains the reader: it turns Python exceptions
    into text, so callers raise the recorded exception instead.
    """
    try:
        for i, batch in enumerate(batches):
            yield _check_pass(batch, schema, i, pass_no)
    except GeneratorExit:
        raise
    except BaseException as exc:
        if sink is not None:
            sink(exc)
        raise


async def _achecked(
    batches: AsyncIterable[pa.RecordBatch], schema: pa.Schema, pass_no: int
) -> AsyncIterator[pa.RecordBatch]:
    i = 0
    iterator = batches.__aiter__()
    try:
        async for batch in iterator:
            yield _check_pass(batch, schema, i, pass_no)
            i += 1
    finally:
        await aclose_shielded(iterator)


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


# ---------------------------------------------------------------------------
# WriteSource
# ---------------------------------------------------------------------------


class ReaderPlan:
    """A reader to be made on a worker thread, plus where a producer error went.

    Returned by :meth:`WriteSource.reader_plan`. ``make()`` is blocking and
    must be called on the thread that drains the reader; ``error`` holds the
    exception an async producer raised (engines that turn errors into text
    lose it -- raise this one instead).
    """

    def __init__(
        self,
        make: Callable[[], pa.RecordBatchReader],
        error: Callable[[], Any],
        rows: tuple[list[pa.RecordBatch], pa.Schema] | None = None,
    ) -> None:
        self.make = make
        self._error = error
        self._rows = rows

    def data(self) -> pa.Table | pa.RecordBatchReader:
        """What to hand an engine call (blocking; on its worker thread): the
        rows as one table for in-memory sources -- Lance's in-memory path --
        or a fresh reader from :meth:`make`."""
        if self._rows is not None:
            batches, schema = self._rows
            return pa.Table.from_batches(batches, schema=schema)
        return self.make()

    @property
    def error(self) -> BaseException | None:
        """The producer's exception, if it raised one."""
        err = self._error()
        return err if isinstance(err, BaseException) else None

    def reraise(self, exc: BaseException) -> None:
        """Raise the source's own error in place of ``exc``, the engine's
        text-only version of it. Does nothing for a cancellation (let it
        propagate) or when the source did not fail."""
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            return
        err = self.error
        if err is not None and err is not exc:
            raise err


class WriteSource:
    """A source of rows with a schema, a mode and a fresh pass per call.

    Parameters
    ----------
    schema : pa.Schema or None
        The rows' schema (metadata included). ``None`` only for iterators
        whose schema is learned from their first batch and files given
        without ``schema=`` (read from the file); see :meth:`resolve_schema`.
    mode : SourceMode
    num_rows : int, optional
        Rows per pass when known without reading (in-memory rows); None
        otherwise.

    Notes
    -----
    Subclass it (or use :func:`replayable`) to teach lance_async a new kind
    of source; register a converter with ``coerce_source.register``.
    """

    #: True when :meth:`open_reader` reads without a loop round-trip per batch.
    native: bool = True

    def __init__(
        self, schema: pa.Schema | None, mode: SourceMode, num_rows: int | None = None
    ) -> None:
        self._schema = schema
        self.mode = mode
        self.num_rows = num_rows
        self.passes = 0
        """How many passes were opened so far (each retry of a replay adds one)."""
        self._pass_errors: dict[int, BaseException] = {}

    def __repr__(self) -> str:
        schema = self._schema.names if self._schema is not None else "?"
        return f"<{type(self).__name__} mode={self.mode.value} columns={schema}>"

    # -- schema -----------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        """The rows' schema.

        Raises
        ------
        SourceError
            For an iterator given without ``schema=`` whose first batch has not
            been seen yet; ``await source.resolve_schema()`` first.
        """
        if self._schema is None:
            raise SourceError(
                f"the schema of {self!r} is not known yet: pass schema=..., "
                "or await source.resolve_schema()"
            )
        return self._schema

    async def resolve_schema(self) -> pa.Schema:
        """Learn the schema (peeking the first batch of an iterator if needed).

        Returns
        -------
        pa.Schema

        Raises
        ------
        SourceError
            An empty iterator given without ``schema=``.
        """
        return self.schema

    @property
    def replayable(self) -> bool:
        """True unless the source is STREAMING (one pass only)."""
        return self.mode is not SourceMode.STREAMING

    def _sink(self, pass_no: int) -> Callable[[BaseException], None]:
        def record(exc: BaseException) -> None:
            self._pass_errors.setdefault(pass_no, exc)

        return record

    def _begin_pass(self) -> int:
        if self.mode is SourceMode.STREAMING and self.passes >= 1:
            raise SourceConsumedError(
                f"{self!r} is a one-shot stream and was already read; wrap a reader "
                "factory with lance_async.replayable(...) to allow replays"
            )
        self.passes += 1
        return self.passes

    # -- passes -----------------------------------------------------------
    def open(self) -> AsyncIterator[pa.RecordBatch]:
        """Start a fresh pass as an async iterator of batches (for the loop).

        Each batch is checked against :attr:`schema`. Close the iterator
        (``aclose``) if you stop early.

        Raises
        ------
        SourceConsumedError
            A STREAMING source asked for a second pass.
        """
        pass_no = self._begin_pass()
        return self._open(pass_no)

    def open_reader(self) -> pa.RecordBatchReader:
        """Start a fresh pass as a blocking ``pa.RecordBatchReader``.

        Blocking: call it on a worker thread (``lance_async`` does). Native
        sources (Lance, Arrow datasets, tables, sync factories, files) read
        without any event-loop round-trip. Sources whose rows are produced on
        the loop (async iterators and async factories) cannot be read this way:
        use ``async with source.reader() as reader`` instead.

        Raises
        ------
        SourceConsumedError
            A STREAMING source asked for a second pass.
        SourceError
            The source is not native (``source.native is False``).
        """
        if not self.native:
            raise SourceError(
                f"{self!r} produces its rows on the event loop; use "
                "`async with source.reader() as reader:` to get a blocking reader"
            )
        pass_no = self._begin_pass()
        return self._open_reader(pass_no)

    def batches(self) -> list[pa.RecordBatch] | None:
        """The rows in memory, for MATERIALIZED sources (None otherwise)."""
        return None

    def _open(self, pass_no: int) -> AsyncIterator[pa.RecordBatch]:
        return AsyncBatchStream(lambda: self._open_reader(pass_no), schema=self._schema)

    def _open_reader(self, pass_no: int) -> pa.RecordBatchReader:  # pragma: no cover
        raise NotImplementedError

    @asynccontextmanager
    async def reader_plan(
        self, *, max_batches: int = DEFAULT_BRIDGE_BATCHES, max_bytes: int | None = None
    ) -> AsyncIterator[ReaderPlan]:
        """Prepare one pass for an engine call on a worker thread.

        Native sources make their reader on that thread (``plan.make()``);
        others are bridged from the loop with a bounded buffer. Used by every
        engine call in lance_async.

        Yields
        ------
        ReaderPlan
        """
        if self.native:
            pass_no = self._begin_pass()

            def make() -> pa.RecordBatchReader:
                try:
                    return self._open_reader(pass_no)
                except BaseException as exc:
                    self._sink(pass_no)(exc)
                    raise

            batches = self.batches()
            rows = (batches, self.schema) if batches is not None else None
            try:
                yield ReaderPlan(make, lambda: self._pass_errors.get(pass_no), rows)
            finally:
                self._pass_errors.pop(pass_no, None)
            return
        schema = await self.resolve_schema()
        iterator = self.open()
        async with bridge_reader(
            iterator,
            schema,
            max_batches=max_batches,
            max_bytes=max_bytes or DEFAULT_BRIDGE_BYTES,
            check=False,
        ) as bridged:
            yield ReaderPlan(lambda: bridged.reader, lambda: bridged.error)

    @asynccontextmanager
    async def reader(
        self, *, max_batches: int = DEFAULT_BRIDGE_BATCHES, max_bytes: int | None = None
    ) -> AsyncIterator[pa.RecordBatchReader]:
        """A fresh pass as a blocking reader, for any source.

        Drain the reader on a worker thread (``anyio.to_thread.run_sync``)
        inside the ``async with`` block. Native sources' readers are opened on
        a worker thread; loop-produced rows are bridged with a bounded buffer
        (``max_batches``, ``max_bytes``).

        Yields
        ------
        pa.RecordBatchReader
        """
        async with self.reader_plan(max_batches=max_batches, max_bytes=max_bytes) as plan:
            if self.native:
                reader = await run_sync(plan.make, limiter=stream_limiter())
            else:
                reader = plan.make()
            try:
                yield reader
            finally:
                reader.close()


# ---------------------------------------------------------------------------
# concrete sources
# ---------------------------------------------------------------------------


class MaterializedSource(WriteSource):
    """Rows held in memory as record batches (MATERIALIZED)."""

    def __init__(self, batches: list[pa.RecordBatch], schema: pa.Schema) -> None:
        checked = [conform_batch(b, schema, i) for i, b in enumerate(batches)]
        super().__init__(schema, SourceMode.MATERIALIZED, sum(b.num_rows for b in checked))
        self._batches = checked

    def batches(self) -> list[pa.RecordBatch]:
        """The batches, already checked against the schema."""
        return list(self._batches)

    def _open(self, pass_no: int) -> AsyncIterator[pa.RecordBatch]:
        return _aiter_list(self._batches)

    def _open_reader(self, pass_no: int) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, self._batches)


async def _aiter_list(batches: list[pa.RecordBatch]) -> AsyncIterator[pa.RecordBatch]:
    for batch in batches:
        await anyio.lowlevel.checkpoint()
        yield batch


class LanceDatasetSource(WriteSource):
    """A Lance dataset pinned to one version (REPLAYABLE).

    Every pass scans the same version with the same settings, so passes are
    identical. The scan's reader is made on the worker thread and handed to
    Rust directly.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        version: int | None = None,
        scan_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._dataset = dataset
        self.version = int(version if version is not None else dataset.version)
        self._scan = dict(scan_options or {})
        schema = dataset.schema
        columns = self._scan.get("columns")
        if columns:
            schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
        super().__init__(schema, SourceMode.REPLAYABLE)

    def _pinned(self) -> Any:
        if self._dataset.version == self.version:
            return self._dataset
        return self._dataset.checkout_version(self.version)

    def _open_reader(self, pass_no: int) -> pa.RecordBatchReader:
        reader = self._pinned().scanner(**self._scan).to_reader()
        diff = describe_difference(self.schema, reader.schema)
        if diff is not None:
            raise SourceChangedError(f"dataset version {self.version} scans differently: {diff[0]}")
        return reader


def _file_fingerprints(dataset: pds.Dataset) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    if isinstance(dataset, pds.FileSystemDataset):
        infos = dataset.filesystem.get_file_info(list(dataset.files))
        out.extend((i.path, int(i.size or -1), int(i.mtime_ns or -1)) for i in infos)
    elif isinstance(dataset, pds.UnionDataset):
        for child in dataset.children:
            out.extend(_file_fingerprints(child))
    return out


class ArrowDatasetSource(WriteSource):
    """An unfiltered pyarrow dataset (REPLAYABLE; STREAMING when filtered).

    For file-backed datasets the files' sizes and modification times are
    recorded on the first pass and checked before every later pass: a change
    raises :class:`SourceChangedError`.
    """

    def __init__(self, dataset: pds.Dataset, schema: pa.Schema | None = None) -> None:
        filtered = bool(getattr(dataset, "_scan_options", {}).get("filter") is not None)
        self._dataset = dataset
        self._fingerprints: list[tuple[str, int, int]] | None = None
        self._declared = schema
        mode = SourceMode.STREAMING if filtered else SourceMode.REPLAYABLE
        super().__init__(schema or dataset.schema, mode)

    def _open_reader(self, pass_no: int) -> pa.RecordBatchReader:
        prints = _file_fingerprints(self._dataset)
        if self._fingerprints is None:
            self._fingerprints = prints
        elif prints != self._fingerprints:
            raise SourceChangedError(
                "the dataset's files changed between passes (size or mtime); nothing was committed"
            )
        reader = self._dataset.scanner().to_reader()
        # Checked even when the schemas agree: files of one dataset may disagree.
        return pa.RecordBatchReader.from_batches(
            self.schema, _checked(reader, self.schema, pass_no, self._sink(pass_no))
        )


class ReaderSource(WriteSource):
    """A one-shot blocking reader: ``pa.RecordBatchReader`` or a ``Scanner``."""

    def __init__(self, reader: Any, schema: pa.Schema | None = None) -> None:
        self._reader = reader
        base = reader.projected_schema if isinstance(reader, pds.Scanner) else reader.schema
        super().__init__(schema or base, SourceMode.STREAMING)

    def _open_reader(self, pass_no: int) -> pa.RecordBatchReader:
        reader = self._reader
        if isinstance(reader, pds.Scanner):
            reader = reader.to_reader()
        self._reader = None
        return pa.RecordBatchReader.from_batches(
            self.schema, _checked(reader, self.schema, pass_no, self._sink(pass_no))
        )


class IteratorSource(WriteSource):
    """A one-shot iterator or generator of record batches (STREAMING).

    Without ``schema=`` the first batch is read (on a worker thread, by
    :meth:`resolve_schema`) to learn the schema, then passed on.
    """

    def __init__(self, iterator: Iterator[pa.RecordBatch], schema: pa.Schema | None) -> None:
        self._iterator = iterator
        self._peeked: list[pa.RecordBatch] = []
        super().__init__(schema, SourceMode.STREAMING)

    async def resolve_schema(self) -> pa.Schema:
        if self._schema is None:
            first = await run_sync(lambda: next(self._iterator, None), limiter=stream_limiter())
            if first is None:
                raise SourceError("the iterator is empty and no schema= was given")
            if isinstance(first, pa.Table):
                first = first.combine_chunks().to_batches()[0] if first.num_rows else None
            if not isinstance(first, pa.RecordBatch):
                raise SchemaMismatchError(
                    f"expected pyarrow.RecordBatch items, got {type(first).__name__}", batch_index=0
                )
            self._peeked.append(first)
            self._schema = first.schema
        return self._schema

    def _open_reader(self, pass_no: int) -> pa.RecordBatchReader:
        items = itertools.chain(self._peeked, self._iterator)
        self._peeked = []
        return pa.RecordBatchReader.from_batches(
            self.schema, _checked(items, self.schema, pass_no, self._sink(pass_no))
        )


class AsyncIteratorSource(WriteSource):
    """A one-shot async iterator or async generator of batches (STREAMING)."""

    native = False

    def __init__(self, iterator: AsyncIterable[pa.RecordBatch], schema: pa.Schema | None) -> None:
        self._iterator = iterator.__aiter__()
        self._peeked: list[pa.RecordBatch] = []
        super().__init__(schema, SourceMode.STREAMING)

    async def resolve_schema(self) -> pa.Schema:
        if self._schema is None:
            try:
                first = await self._iterator.__anext__()
            except StopAsyncIteration:
                raise SourceError("the async iterator is empty and no schema= was given") from None
            if not isinstance(first, pa.RecordBatch):
                raise SchemaMismatchError(
                    f"expected pyarrow.RecordBatch items, got {type(first).__name__}", batch_index=0
                )
            self._peeked.append(first)
            self._schema = first.schema
        return self._schema

    def _open(self, pass_no: int) -> AsyncIterator[pa.RecordBatch]:
        peeked, self._peeked = self._peeked, []
        return _achecked(_prepend(peeked, self._iterator), self.schema, pass_no)


async def _prepend(
    first: list[pa.RecordBatch], rest: AsyncIterator[pa.RecordBatch]
) -> AsyncIterator[pa.RecordBatch]:
    try:
        for batch in first:
            yield batch
        async for batch in rest:
            yield batch
    finally:
        await aclose_shielded(rest)


class FactorySource(WriteSource):
    """A reader factory called once per pass (REPLAYABLE); see :func:`replayable`.

    A sync factory is taken to be native (its reader is made on the worker
    thread that drains it) until a call shows it returns an async iterable:
    the first engine pass calls it on a worker thread first to find out, and
    from then on its passes are bridged from the loop.
    """

    def __init__(self, factory: Factory, schema: pa.Schema) -> None:
        if not callable(factory):
            raise TypeError(f"replayable() needs a callable factory, got {type(factory).__name__}")
        self._factory = factory
        self._is_async = inspect.iscoroutinefunction(factory) or inspect.isasyncgenfunction(factory)
        self._first_schema: pa.Schema | None = None
        self._probed = self._is_async
        self._made: Any = None  # what the probe's call returned, for the pass it opened
        super().__init__(schema, SourceMode.REPLAYABLE)
        self.native = not self._is_async

    def _check_pass_schema(self, pass_schema: pa.Schema, pass_no: int) -> None:
        """The first pass fits ``schema``; later passes give exactly its schema."""
        if self._first_schema is None:
            diff = describe_difference(self.schema, pass_schema)
            if diff is not None:
                raise SchemaMismatchError(
                    f"the factory's rows do not match schema=: {diff[0]}", field=diff[1]
                )
            self._first_schema = pass_schema
            return
        diff = describe_difference(self._first_schema, pass_schema, check_metadata=True)
        if diff is not None:
            raise SourceChangedError(
                f"pass {pass_no} of the factory gave another schema: {diff[0]}; "
                "nothing was committed"
            )

    def _first_batch_checked(
        self, batches: Iterable[pa.RecordBatch], pass_no: int
    ) -> Iterator[pa.RecordBatch]:
        for i, batch in enumerate(batches):
            if i == 0 and isinstance(batch, pa.RecordBatch):
                self._check_pass_schema(batch.schema, pass_no)
            yield batch

    async def _afirst_batch_checked(
        self, batches: AsyncIterable[pa.RecordBatch], pass_no: int
    ) -> AsyncIterator[pa.RecordBatch]:
        iterator = batches.__aiter__()
        first = True
        try:
            async for batch in iterator:
                if first and isinstance(batch, pa.RecordBatch):
                    self._check_pass_schema(batch.schema, pass_no)
                first = False
                yield batch
        finally:
            await aclose_shielded(iterator)

    def _wrap_sync(self, made: Any, pass_no: int) -> pa.RecordBatchReader:
        if isinstance(made, pa.RecordBatchReader):
            self._check_pass_schema(made.schema, pass_no)
            items: Iterable[pa.RecordBatch] = made
        elif isinstance(made, pa.Table):
            self._check_pass_schema(made.schema, pass_no)
            items = made.to_batches()
        elif isinstance(made, (AsyncIterable, Awaitable)):
            raise SourceError(
                "the factory returned an async object where a blocking reader was needed; "
                "use `async with source.reader()` or make the factory `async def`"
            )
        elif isinstance(made, Iterable):
            items = self._first_batch_checked(made, pass_no)
        else:
            raise SourceError(
                f"the factory returned {type(made).__name__}; expected a RecordBatchReader, "
                "a Table or an iterable of RecordBatch"
            )
        return pa.RecordBatchReader.from_batches(
            self.schema, _checked(items, self.schema, pass_no, self._sink(pass_no))
        )

    def _call(self) -> Any:
        made, self._made = self._made, None
        return made if made is not None else self._factory()

    def _open_reader(self, pass_no: int) -> pa.RecordBatchReader:
        return self._wrap_sync(self._call(), pass_no)

    @asynccontextmanager
    async def reader_plan(
        self, *, max_batches: int = DEFAULT_BRIDGE_BATCHES, max_bytes: int | None = None
    ) -> AsyncIterator[ReaderPlan]:
        if not self._probed:
            # find out, once, whether this sync factory returns an async iterable
            made = await run_sync(self._factory, limiter=stream_limiter())
            self._probed = True
            self.native = not isinstance(made, (AsyncIterable, Awaitable))
            self._made = made
        async with super().reader_plan(max_batches=max_batches, max_bytes=max_bytes) as plan:
            yield plan

    def _open(self, pass_no: int) -> AsyncIterator[pa.RecordBatch]:
        return self._open_async(pass_no)

    async def _open_async(self, pass_no: int) -> AsyncIterator[pa.RecordBatch]:
        if self._made is not None or self._is_async:
            made: Any = self._call()
        else:  # a sync factory may block: call it on a worker thread
            made = await run_sync(self._factory, limiter=stream_limiter())
        if inspect.isawaitable(made):
            made = await made
        if isinstance(made, AsyncIterable):
            self._probed, self.native = True, False
            inner: AsyncIterator[pa.RecordBatch] = _achecked(
                self._afirst_batch_checked(made, pass_no), self.schema, pass_no
            )
        else:
            reader = self._wrap_sync(made, pass_no)
            inner = AsyncBatchStream(lambda: reader, schema=self.schema)
        try:
            async for batch in inner:
                yield batch
        finally:
            await aclose_shielded(inner)


def replayable(factory: Factory, *, schema: pa.Schema) -> WriteSource:
    """Make a replayable source from a reader factory.

    Parameters
    ----------
    factory : callable
        Called once per pass; must give the same schema, values and row order
        every time. May be a sync callable returning a ``pa.RecordBatchReader``,
        a ``pa.Table`` or an iterable of ``pa.RecordBatch``; or an ``async def``
        returning any of those or an async iterable; or an async generator
        function.
    schema : pa.Schema
        The rows' schema (metadata included). Checked against every pass.

    Returns
    -------
    WriteSource
        Mode REPLAYABLE. A merge_insert retries a conflict by calling the
        factory again instead of buffering or spilling the input.

    Raises
    ------
    TypeError
        ``factory`` is not callable.
    """
    return FactorySource(factory, schema)


# ---------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------


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
        try:
            table = pa.Table.from_pylist(items, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SchemaMismatchError(f"cannot convert the rows: {exc}") from exc
        return MaterializedSource(_table_batches(table), table.schema)
    kinds = sorted({type(i).__name__ for i in items})
    raise UnsupportedSourceError(
        f"a list source must hold only RecordBatch, Table or dict items, got {', '.join(kinds)}"
    )


@coerce_source.register(dict)
def _(obj: dict[str, Any], *, schema: pa.Schema | None = None) -> WriteSource:
    try:
        table = pa.table(obj, schema=schema)
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
    from .files import file_source

    return file_source(obj, schema=schema)


@coerce_source.register(Iterator)
def _(obj: Iterator[Any], *, schema: pa.Schema | None = None) -> WriteSource:
    return IteratorSource(obj, schema)


@coerce_source.register(AsyncIterable)
def _(obj: AsyncIterable[Any], *, schema: pa.Schema | None = None) -> WriteSource:
    return AsyncIteratorSource(obj, schema)


async def resolve_source(obj: Any, *, schema: pa.Schema | None = None) -> WriteSource:
    """Coerce ``obj`` and make sure its schema is known (peeking if needed).

    The async twin of :func:`coerce_source`, used by every lance_async entry
    point: an iterator given without ``schema=`` is advanced by one batch (on
    a worker thread for sync iterators) and that batch is kept for the pass.
    Conversions that touch every row (Python rows, column dicts, DataFrames,
    casts to ``schema=``) run on a worker thread; tables, batches, readers,
    datasets and iterators are wrapped on the loop (O(1)).

    Returns
    -------
    WriteSource
        With :attr:`WriteSource.schema` available.
    """
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
