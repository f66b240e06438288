"""Bridges between blocking Arrow readers and async iteration.

Two directions, both bounded, both zero-copy (batches pass by reference):

* :class:`AsyncBatchStream` -- a blocking ``pa.RecordBatchReader`` (or any
  blocking iterator of batches) read by one worker thread with bounded
  prefetch, consumed on the loop with ``async for``.
* :func:`bridge_reader` -- an async iterator of batches, produced on the loop,
  exposed as a ``pa.RecordBatchReader`` that a worker thread (or Rust) drains.

Both work on asyncio and trio (anyio). Loop-bound state is created lazily
inside the running loop; using a stream from another loop raises
:class:`~lance_async.errors.WrongEventLoopError`.
"""

from __future__ import annotations

import enum
import logging
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias

import anyio
import pyarrow as pa

from .._loop import LoopHandle, aclose_shielded, unwrap_groups
from .._schema import conform_batch
from .._threads import reader_limiter, stop_threads_at_loop_end, track_thread, untrack_thread
from ..errors import ClosedError, LanceAsyncError, SourceError

__all__ = [
    "AsyncBatchStream",
    "BridgeStatistics",
    "StreamState",
    "StreamStatistics",
    "bridge_reader",
    "iterate_reader",
]

log = logging.getLogger("lance_async")

ReaderLike: TypeAlias = "pa.RecordBatchReader | Iterable[pa.RecordBatch]"
#: How long aclose() waits for a reader thread stuck in a blocking read.
CLOSE_TIMEOUT = 10.0


class StreamState(enum.Enum):
    """Life cycle of an :class:`AsyncBatchStream`."""

    NEW = "new"
    RUNNING = "running"
    EXHAUSTED = "exhausted"
    CLOSED = "closed"


@dataclass(frozen=True)
class StreamStatistics:
    """A snapshot of an :class:`AsyncBatchStream`'s buffer.

    Attributes
    ----------
    state : StreamState
    buffered_batches, buffered_bytes : int
        Batches read by the thread, not yet taken by the loop, and their size
        in bytes (``RecordBatch.nbytes``).
    max_buffered_batches : int
        The most batches ever buffered at once.
    batches_read, rows_read : int
        Batches and rows handed to the loop so far.
    """

    state: StreamState
    buffered_batches: int
    buffered_bytes: int
    max_buffered_batches: int
    batches_read: int
    rows_read: int


def _has_room(
    buf: deque[Any], buf_bytes: int, nbytes: int, cap: int, max_bytes: int | None
) -> bool:
    """Room for ``nbytes`` more (an empty buffer takes any batch, however large)."""
    if len(buf) >= cap:
        return False
    return not (max_bytes and buf and buf_bytes + nbytes > max_bytes)


class _ReaderThread:
    """State shared between a stream's reader thread and the loop.

    Kept apart from the stream object so the thread holds no reference to the
    stream: dropping the stream (``break`` out of ``async for``) lets
    ``__del__`` stop the thread.
    """

    def __init__(
        self,
        opener: Callable[[], ReaderLike],
        prefetch: int,
        max_bytes: int | None,
        loop: LoopHandle,
        on_finish: Callable[[], None],
    ) -> None:
        self.opener = opener
        self.prefetch = prefetch
        self.max_bytes = max_bytes
        self.loop = loop
        self.on_finish = on_finish
        self.cond = threading.Condition()
        self.buf: deque[tuple[pa.RecordBatch, int]] = deque()  # (batch, its nbytes)
        self.buf_bytes = 0
        self.max_buffered = 0
        self.schema: pa.Schema | None = None
        self.done = False
        self.error: BaseException | None = None
        self.stop = False
        self.waiter: anyio.Event | None = None
        self.finished = anyio.Event()

    def _wake(self, ev: anyio.Event | None) -> None:
        if ev is not None:
            self.loop.call_soon(ev.set)

    def _full(self, nbytes: int) -> bool:
        return not _has_room(self.buf, self.buf_bytes, nbytes, self.prefetch, self.max_bytes)

    def run(self) -> None:
        source: Any = None
        try:
            source = self.opener()
            if isinstance(source, pa.RecordBatchReader):
                with self.cond:
                    self.schema = source.schema
                    ev, self.waiter = self.waiter, None
                self._wake(ev)
            for batch in source:
                nbytes = batch.nbytes
                with self.cond:
                    while not self.stop and self._full(nbytes):
                        self.cond.wait()
                    if self.stop:
                        break
                    if self.schema is None:
                        self.schema = batch.schema
                    self.buf.append((batch, nbytes))
                    self.buf_bytes += nbytes
                    self.max_buffered = max(self.max_buffered, len(self.buf))
                    ev, self.waiter = self.waiter, None
                self._wake(ev)
        except BaseException as exc:  # handed to the consumer, never lost
            with self.cond:
                self.error = exc
        finally:
            close = getattr(source, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # pragma: no cover - closing must not mask results
                    log.debug("lance_async: closing a reader failed", exc_info=True)
            with self.cond:
                self.done = True
                ev, self.waiter = self.waiter, None
            self._wake(ev)
            self.loop.call_soon(self.on_finish)  # the slot is free before aclose() returns
            self.loop.call_soon(self.finished.set)

    def request_stop(self) -> None:
        with self.cond:
            self.stop = True
            self.buf.clear()
            self.buf_bytes = 0
            self.cond.notify_all()


class AsyncBatchStream:
    """An ``async for`` stream of record batches read on a worker thread.

    One worker thread reads the underlying blocking reader ahead of the
    consumer, keeping at most ``prefetch`` batches (and ``max_bytes`` bytes)
    buffered, so a slow consumer holds the reader back and a fast one never
    waits longer than one batch read. The loop only moves batch references.

    Parameters
    ----------
    opener : callable or None
        Blocking callable returning a ``pa.RecordBatchReader`` or an iterable
        of ``pa.RecordBatch``. Called once, on the worker thread, at the first
        ``__anext__`` (or :meth:`open`).
    prepare : async callable, optional
        Instead of ``opener``: awaited on the loop at the first ``__anext__``
        to obtain the opener (for readers that need async set-up).
    schema : pa.Schema, optional
        The schema, when known before opening.
    prefetch : int
        Maximum batches buffered ahead of the consumer (default 4, >= 1).
    max_bytes : int, optional
        Maximum bytes buffered ahead (a single larger batch still passes).
    max_rows : int, optional
        Slice larger batches on the loop (zero-copy) to at most this many rows.

    Notes
    -----
    * The thread counts against the library's ``reader`` limiter
      (:func:`lance_async.configure_threads`) for as long as the stream is
      open: when the limit is reached the first ``__anext__`` waits for a
      free slot.
    * Leaving ``async with`` or :meth:`aclose` stops the thread after at
      most the batch it is reading and closes the reader; :meth:`aclose`
      waits for that (up to ``CLOSE_TIMEOUT`` seconds). A stream nobody
      holds any more (``async for b in ds.scan(): break``) is stopped the
      same way when it is collected, at once on CPython. A stream you still
      hold after a ``break`` keeps its thread parked at the prefetch bound
      (it reads no further) until you close it.
    * Bound to the event loop of its first use; another loop raises
      :class:`~lance_async.errors.WrongEventLoopError`.
    * Errors raised by the reader are raised by ``__anext__`` unchanged.
    * A stream still open when its event loop ends (``asyncio.run`` or
      ``trio.run`` returns) is stopped then: its thread is asked to stop and
      joined, and its reader closed, so no engine reader outlives the loop
      (pylance aborts the process when one is still running as the
      interpreter finalizes).
    """

    def __init__(
        self,
        opener: Callable[[], ReaderLike] | None,
        *,
        schema: pa.Schema | None = None,
        prefetch: int = 4,
        max_bytes: int | None = None,
        prepare: Callable[[], Awaitable[Callable[[], ReaderLike]]] | None = None,
        max_rows: int | None = None,
    ) -> None:
        if prefetch < 1 or (max_rows is not None and max_rows < 1):
            raise ValueError(f"prefetch and max_rows must be >= 1, got {prefetch}, {max_rows}")
        self._max_rows = max_rows
        self._slices: deque[pa.RecordBatch] = deque()
        if (opener is None) == (prepare is None):
            raise ValueError("pass exactly one of opener and prepare")
        self._opener = opener
        self._prepare = prepare
        self._schema = schema
        self._prefetch = prefetch
        self._max_bytes = max_bytes
        self._state = StreamState.NEW
        self._loop: LoopHandle | None = None
        self._shared: _ReaderThread | None = None
        self._batches = 0
        self._rows = 0

    # -- life cycle -----------------------------------------------------
    @property
    def state(self) -> StreamState:
        """Where the stream is in its life cycle."""
        return self._state

    @property
    def schema(self) -> pa.Schema:
        """The stream's schema.

        Raises
        ------
        LanceAsyncError
            When the schema was not given and the stream is not open yet;
            ``await stream.open()`` first.
        """
        if self._schema is None and self._shared is not None:
            self._schema = self._shared.schema
        if self._schema is None:
            raise LanceAsyncError(
                "the schema is known once the stream is open: await stream.open()"
            )
        return self._schema

    async def open(self) -> AsyncBatchStream:
        """Start the reader thread and wait until the schema is known.

        Returns
        -------
        AsyncBatchStream
            ``self``, for chaining.

        Raises
        ------
        ClosedError
            The stream was closed.
        BaseException
            Whatever opening the reader raised.
        """
        await self._start()
        shared = self._shared
        assert shared is not None
        while True:
            with shared.cond:
                if shared.schema is not None or shared.done:
                    break
                ev = shared.waiter = shared.waiter or anyio.Event()
            await ev.wait()
        if shared.schema is not None:
            self._schema = self._schema or shared.schema
        elif shared.error is not None:
            raise shared.error
        return self

    async def _start(self) -> None:
        if self._state is StreamState.CLOSED:
            raise ClosedError("the stream is closed")
        if self._loop is None:
            self._loop = LoopHandle()
        else:
            self._loop.check("this AsyncBatchStream")
        if self._state is not StreamState.NEW:
            return
        if self._opener is None:
            assert self._prepare is not None
            self._opener = await self._prepare()
        limiter = reader_limiter()
        holder = object()
        key = self._loop.key
        await stop_threads_at_loop_end(key)
        await limiter.acquire_on_behalf_of(holder)
        try:
            shared = _ReaderThread(
                self._opener,
                self._prefetch,
                self._max_bytes,
                self._loop,
                lambda: limiter.release_on_behalf_of(holder),
            )

            def run() -> None:
                try:
                    shared.run()
                finally:
                    untrack_thread(key, thread)

            thread = threading.Thread(target=run, name="lance_async-stream", daemon=True)
            track_thread(key, thread, shared.request_stop)
            thread.start()
        except BaseException:
            limiter.release_on_behalf_of(holder)
            raise
        self._shared = shared
        self._state = StreamState.RUNNING
        weakref.finalize(self, shared.request_stop)

    def __aiter__(self) -> AsyncBatchStream:
        return self

    async def __anext__(self) -> pa.RecordBatch:
        if self._slices and self._state is not StreamState.CLOSED:  # rest of a sliced batch
            batch = self._slices.popleft()
            self._batches, self._rows = self._batches + 1, self._rows + batch.num_rows
            return batch
        if self._state is StreamState.EXHAUSTED:
            raise StopAsyncIteration
        await self._start()
        shared = self._shared
        assert shared is not None
        while True:
            with shared.cond:
                if shared.buf:
                    batch, nbytes = shared.buf.popleft()
                    shared.buf_bytes -= nbytes
                    shared.cond.notify()
                    break
                if shared.done:
                    self._state = StreamState.EXHAUSTED
                    if shared.error is not None:
                        raise shared.error
                    raise StopAsyncIteration
                ev = shared.waiter = anyio.Event()
            await ev.wait()
        if self._schema is None:
            self._schema = batch.schema
        step = self._max_rows
        if step is not None and batch.num_rows > step:
            self._slices.extend(batch.slice(i, step) for i in range(step, batch.num_rows, step))
            batch = batch.slice(0, step)
        self._batches, self._rows = self._batches + 1, self._rows + batch.num_rows
        return batch

    async def aclose(self) -> None:
        """Stop the reader thread, close the reader and drop buffered batches.

        Safe to call more than once. Waits (shielded from cancellation, at most
        ``CLOSE_TIMEOUT`` seconds) for the thread to finish its current read.
        """
        if self._state is StreamState.CLOSED:
            return
        self._state = StreamState.CLOSED
        shared = self._shared
        if shared is None:
            return
        shared.request_stop()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT) as scope:
            await shared.finished.wait()
        if scope.cancelled_caught:
            log.warning("lance_async: a stream's reader thread is still in a blocking read")

    async def __aenter__(self) -> AsyncBatchStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def to_table(self) -> pa.Table:
        """Read the rest of the stream into one table, then close it.

        Returns
        -------
        pa.Table
            All remaining batches (an empty table with the stream's schema when
            there are none).
        """
        batches: list[pa.RecordBatch] = []
        try:
            async for batch in self:
                batches.append(batch)
        finally:
            await self.aclose()
        if batches:
            return pa.Table.from_batches(batches)
        return pa.Table.from_batches([], schema=self.schema)

    def statistics(self) -> StreamStatistics:
        """The buffer's current size and the stream's totals (does not block)."""
        shared = self._shared
        if shared is None:
            return StreamStatistics(self._state, 0, 0, 0, self._batches, self._rows)
        with shared.cond:
            return StreamStatistics(
                self._state,
                len(shared.buf),
                shared.buf_bytes,
                shared.max_buffered,
                self._batches,
                self._rows,
            )


def iterate_reader(
    reader: ReaderLike | Callable[[], ReaderLike],
    *,
    prefetch: int = 4,
    max_bytes: int | None = None,
) -> AsyncBatchStream:
    """Iterate a blocking reader asynchronously with bounded prefetch.

    Parameters
    ----------
    reader : pa.RecordBatchReader, iterable of pa.RecordBatch, or callable
        The reader, or a blocking callable that opens it on the worker thread.
    prefetch, max_bytes : int
        Batches read ahead (default 4), and bytes at most (optional).

    Returns
    -------
    AsyncBatchStream
        Use with ``async for`` (and ``async with`` for prompt clean-up).
    """
    schema = reader.schema if isinstance(reader, pa.RecordBatchReader) else None
    if callable(reader) and not isinstance(reader, pa.RecordBatchReader):
        opener = reader
    else:
        fixed = reader

        def opener() -> ReaderLike:
            return fixed

    return AsyncBatchStream(opener, schema=schema, prefetch=prefetch, max_bytes=max_bytes)


# ---------------------------------------------------------------------------
# async iterator -> RecordBatchReader
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BridgeStatistics:
    """A snapshot of a :func:`bridge_reader` buffer.

    Attributes
    ----------
    buffered_batches, buffered_bytes, max_buffered_batches : int
        What the producer queued and the reader has not taken yet; the most
        batches ever queued at once.
    batches_produced, batches_consumed : int
        Totals on each side.
    """

    buffered_batches: int
    buffered_bytes: int
    max_buffered_batches: int
    batches_produced: int
    batches_consumed: int


class _Bridge:
    def __init__(
        self, schema: pa.Schema, max_batches: int, max_bytes: int | None, loop: LoopHandle
    ) -> None:
        self.schema = schema
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.loop = loop
        self.cond = threading.Condition()
        self.buf: deque[tuple[pa.RecordBatch, int]] = deque()  # (batch, its nbytes)
        self.buf_bytes = 0
        self.max_buffered = 0
        self.produced = 0
        self.consumed = 0
        self.done = False
        self.error: BaseException | None = None
        self.consumer_closed = False
        self.space: anyio.Event | None = None
        self.closed_event = anyio.Event()

    def has_room(self, nbytes: int) -> bool:
        return _has_room(self.buf, self.buf_bytes, nbytes, self.max_batches, self.max_bytes)

    def batches(self) -> Iterable[pa.RecordBatch]:
        """The consumer side; runs on whatever thread drains the reader."""
        try:
            while True:
                with self.cond:
                    while not self.buf and not self.done:
                        self.cond.wait()
                    if self.buf:
                        batch, nbytes = self.buf.popleft()
                        self.buf_bytes -= nbytes
                        self.consumed += 1
                        ev, self.space = self.space, None
                    elif self.error is not None:
                        raise self.error
                    else:
                        return
                if ev is not None:
                    self.loop.call_soon(ev.set)
                yield batch
        finally:
            with self.cond:
                self.consumer_closed = True
                ev, self.space = self.space, None
            if ev is not None:
                self.loop.call_soon(ev.set)
            self.loop.call_soon(self.closed_event.set)

    async def produce(self, source: AsyncIterable[pa.RecordBatch], check: bool) -> None:
        index = 0
        iterator = source.__aiter__()
        try:
            while True:
                try:
                    batch = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                if check:
                    batch = conform_batch(batch, self.schema, index)
                index += 1
                nbytes = batch.nbytes
                while True:
                    with self.cond:
                        if self.consumer_closed:
                            return
                        if self.has_room(nbytes):
                            self.buf.append((batch, nbytes))
                            self.buf_bytes += nbytes
                            self.produced += 1
                            self.max_buffered = max(self.max_buffered, len(self.buf))
                            self.cond.notify()
                            break
                        ev = self.space = anyio.Event()
                    await ev.wait()
        except anyio.get_cancelled_exc_class():
            # Never let a cancelled producer look like a clean end of stream:
            # the engine would commit a truncated input.
            with self.cond:
                if self.error is None:
                    self.error = SourceError(
                        "the async source was cancelled before its end; nothing was committed"
                    )
            raise
        except BaseException as exc:
            with self.cond:
                self.error = exc
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()
            try:
                await aclose_shielded(iterator)
            except Exception:  # pragma: no cover - the outcome is already recorded
                log.debug("lance_async: closing a producer failed", exc_info=True)

    def close_consumer_side(self) -> None:
        with self.cond:
            if not self.done and self.error is None:
                self.error = SourceError("the reader bridge was closed before its source ended")
            self.consumer_closed = True
            self.done = True
            self.buf.clear()
            self.buf_bytes = 0
            self.cond.notify_all()

    def statistics(self) -> BridgeStatistics:
        with self.cond:
            return BridgeStatistics(
                len(self.buf), self.buf_bytes, self.max_buffered, self.produced, self.consumed
            )


class BridgedReader:
    """What :func:`bridge_reader` yields: a reader plus the producer's fate.

    Attributes
    ----------
    reader : pa.RecordBatchReader
        Drain it on a worker thread (or hand it to Rust). Each batch it yields
        was produced on the loop and checked against ``schema``.
    schema : pa.Schema
    """

    def __init__(self, bridge: _Bridge) -> None:
        self._bridge = bridge
        self.schema = bridge.schema
        self.reader = pa.RecordBatchReader.from_batches(bridge.schema, bridge.batches())

    @property
    def error(self) -> BaseException | None:
        """The exception the producer raised, if any (the reader raised it too)."""
        return self._bridge.error

    def statistics(self) -> BridgeStatistics:
        """Buffer depth and totals (does not block)."""
        return self._bridge.statistics()


@asynccontextmanager
async def bridge_reader(
    source: AsyncIterable[pa.RecordBatch],
    schema: pa.Schema,
    *,
    max_batches: int = 4,
    max_bytes: int | None = 64 * 1024 * 1024,
    check: bool = True,
) -> AsyncIterator[BridgedReader]:
    """Expose an async iterator of batches as a blocking ``pa.RecordBatchReader``.

    A producer task (inside this context's task group) pulls from ``source``
    on the loop and queues batches for the reader; the reader blocks (without
    the GIL) until a batch or the end arrives.

    Parameters
    ----------
    source : async iterable of pa.RecordBatch
        The producer. Closed (``aclose``) when the context exits.
    schema : pa.Schema
        The reader's schema; every batch is checked against it before it is
        queued (``check=False`` skips this when the caller already did).
    max_batches : int
        Queue limit in batches (default 4). The producer waits when full.
    max_bytes : int, optional
        Queue limit in bytes (default 64 MiB; a single larger batch passes).
    check : bool
        Check each batch with :func:`~lance_async._schema.conform_batch`.

    Yields
    ------
    BridgedReader
        ``.reader`` to drain on a worker thread; ``.error`` the producer's
        exception afterwards.

    Notes
    -----
    * An exception in the producer is raised by the reader as the same
      exception object; engines that turn it into text (Rust) lose it, so read
      ``.error`` and raise that (``lance_async`` does this everywhere).
    * Leaving the context (normally, by error, or by cancellation) cancels the
      producer, ends the reader and closes ``source``. A consumer that stops
      early makes the producer stop at its next batch.
    * No deadlock with a single worker thread: the producer runs on the loop.
    """
    if max_batches < 1:
        raise ValueError(f"max_batches must be >= 1, got {max_batches}")
    bridge = _Bridge(schema, max_batches, max_bytes, LoopHandle())
    with unwrap_groups():
        async with anyio.create_task_group() as tg:
            tg.start_soon(bridge.produce, source, check)
            try:
                yield BridgedReader(bridge)
            finally:
                bridge.close_consumer_side()
                tg.cancel_scope.cancel()
