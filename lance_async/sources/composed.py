"""Streams of batches composed on the loop from other streams: :class:`ComposedBatchStream`.

:class:`~lance_async.AsyncBatchStream` reads one blocking reader on a worker
thread. Some reads are several sources one after the other, each filtered on
the way (a routing writer's LSM scan: each shard's writer, then the
dataset); :class:`ComposedBatchStream` gives such an async generator of
batches the same surface -- ``async for``, ``async with``, ``open()``,
``aclose()``, ``to_table()``, ``schema``, ``state`` -- and closes the
generator (and so the streams it holds) when it is closed or left early.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol, runtime_checkable

import anyio
import pyarrow as pa

from .._loop import LoopHandle
from ..errors import ClosedError
from .streams import StreamState

__all__ = ["BatchStream", "ComposedBatchStream"]


@runtime_checkable
class BatchStream(Protocol):
    """What every stream of record batches in lance_async offers (a protocol).

    :class:`~lance_async.AsyncBatchStream` and :class:`ComposedBatchStream`
    both are one; code that only reads a stream should take this type.
    """

    @property
    def schema(self) -> pa.Schema:
        """The batches' schema."""
        ...

    async def open(self) -> Any:
        """Start the stream; raises what opening the source raises."""
        ...

    def __aiter__(self) -> Any: ...

    async def __anext__(self) -> pa.RecordBatch: ...

    async def aclose(self) -> None:
        """Stop the stream and release its source."""
        ...

    async def to_table(self) -> pa.Table:
        """Read the rest of the stream into one table."""
        ...


class ComposedBatchStream:
    """An async generator of record batches as a closable stream.

    Parameters
    ----------
    batches : async generator of pa.RecordBatch
        Produces the batches, on the loop; it should do blocking work on
        worker threads.
    schema : pa.Schema
        The batches' schema (known before the first batch).

    Notes
    -----
    Leaving ``async with``, ``aclose()`` or ``break`` followed by the
    stream's garbage collection closes the generator (its ``finally``
    blocks run, shielded from cancellation). One consumer at a time, on the
    loop that first iterated it.
    """

    def __init__(self, batches: AsyncGenerator[pa.RecordBatch, None], schema: pa.Schema) -> None:
        self._gen = batches
        self._schema = schema
        self._state = StreamState.NEW
        self._loop: LoopHandle | None = None

    def __repr__(self) -> str:
        return f"<ComposedBatchStream state={self._state.value} columns={self._schema.names}>"

    @property
    def state(self) -> StreamState:
        """NEW, RUNNING, EXHAUSTED or CLOSED."""
        return self._state

    @property
    def schema(self) -> pa.Schema:
        """The batches' schema."""
        return self._schema

    async def open(self) -> ComposedBatchStream:
        """Start the stream (nothing is read until the first ``__anext__``)."""
        if self._state is StreamState.CLOSED:
            raise ClosedError(f"{self!r} is closed")
        if self._state is StreamState.NEW:
            self._loop = LoopHandle()
            self._state = StreamState.RUNNING
        await anyio.lowlevel.checkpoint()
        return self

    def __aiter__(self) -> ComposedBatchStream:
        return self

    async def __anext__(self) -> pa.RecordBatch:
        if self._state is StreamState.CLOSED:
            raise ClosedError(f"{self!r} is closed")
        if self._state is StreamState.EXHAUSTED:
            raise StopAsyncIteration
        if self._state is StreamState.NEW:
            await self.open()
        if self._loop is not None:
            self._loop.check(repr(self))
        try:
            return await self._gen.__anext__()
        except StopAsyncIteration:
            self._state = StreamState.EXHAUSTED
            raise

    async def aclose(self) -> None:
        """Close the generator and the streams it holds (safe to call twice)."""
        if self._state is StreamState.CLOSED:
            return
        self._state = StreamState.CLOSED
        with anyio.CancelScope(shield=True):
            await self._gen.aclose()

    async def __aenter__(self) -> ComposedBatchStream:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def to_table(self) -> pa.Table:
        """Read the rest of the stream into one table, then close it."""
        batches = []
        try:
            async for batch in self:
                batches.append(batch)
        finally:
            await self.aclose()
        return pa.Table.from_batches(batches, schema=self._schema)
