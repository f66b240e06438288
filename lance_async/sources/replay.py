"""Replayable sources from reader factories: :func:`replayable`.

A factory called once per pass is how a merge_insert retries a conflict
without buffering or spilling its input: each retry calls the factory again.
Every pass is checked against the declared schema, and later passes against
the first one (metadata included); a difference is a
:class:`~lance_async.errors.SourceChangedError` before a row moves.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pyarrow as pa

from .._loop import aclose_shielded
from .._schema import describe_difference
from .._threads import run_sync, stream_limiter
from ..errors import SchemaMismatchError, SourceChangedError, SourceError
from .base import (
    DEFAULT_BRIDGE_BATCHES,
    ReaderPlan,
    SourceMode,
    WriteSource,
    achecked,
    checked,
)
from .streams import AsyncBatchStream

__all__ = ["Factory", "FactorySource", "replayable"]

Factory = Callable[[], Any]


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

    def _first_batchchecked(
        self, batches: Iterable[pa.RecordBatch], pass_no: int
    ) -> Iterator[pa.RecordBatch]:
        for i, batch in enumerate(batches):
            if i == 0 and isinstance(batch, pa.RecordBatch):
                self._check_pass_schema(batch.schema, pass_no)
            yield batch

    async def _afirst_batchchecked(
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
            items = self._first_batchchecked(made, pass_no)
        else:
            raise SourceError(
                f"the factory returned {type(made).__name__}; expected a RecordBatchReader, "
                "a Table or an iterable of RecordBatch"
            )
        return pa.RecordBatchReader.from_batches(
            self.schema, checked(items, self.schema, pass_no, self._sink(pass_no))
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
            # (abandoned if cancelled while the factory blocks: nothing is written yet)
            made = await run_sync(
                self._factory,
                limiter=stream_limiter(),
                abandon_on_cancel=lambda: True,
                what="a replayable source's factory",
            )
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
            made = await run_sync(
                self._factory,
                limiter=stream_limiter(),
                abandon_on_cancel=lambda: True,
                what="a replayable source's factory",
            )
        if inspect.isawaitable(made):
            made = await made
        if isinstance(made, AsyncIterable):
            self._probed, self.native = True, False
            inner: AsyncIterator[pa.RecordBatch] = achecked(
                self._afirst_batchchecked(made, pass_no), self.schema, pass_no
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
        ``factory`` is not callable, or ``schema`` is not a ``pa.Schema``.
    """
    if not isinstance(schema, pa.Schema):
        raise TypeError(f"replayable() needs schema= as a pyarrow Schema, got {schema!r}")
    return FactorySource(factory, schema)
