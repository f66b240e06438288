"""A pipe (standard input, a socket's file) as a feed: :class:`PipeFeed`.

A pipe has no end until its writer closes it, and a read blocks until bytes
come. So a thread of the feed's own reads it (``read1``: whatever the pipe
holds, up to ``chunk_size``) and hands each chunk to the event loop through
a small memory object stream; :meth:`PipeFeed.fetch` waits for chunks at
most ``timeout`` seconds, decodes what came (on the library's ``stream``
worker threads, the incremental decoders of :mod:`lance_async.sources.decoders`)
and hands it out as one message. Rows become durable as lines arrive, in
the same micro-batches as a followed file (:class:`~lance_async.feeds.FileFeed`),
and an idle pipe lets :func:`~lance_async.feeds.ingest`'s ``idle_timeout`` fire.

Offsets are byte positions just past a message's last record, as for files;
a pipe cannot be read again, so acknowledging only records
:attr:`PipeFeed.committed`. Bytes that cannot be decoded raise
:class:`~lance_async.DecodeError` (``offset``: where they start) after the
messages decoded before them were handed out.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial
from typing import IO, Any

import anyio
import pyarrow as pa
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._args import check_fetch
from .._threads import run_sync, stream_limiter
from ..errors import DecodeError
from ..sources.decoders import make_decoder
from .base import Message
from .broker import FeedState, check_open

__all__ = ["PipeFeed"]


class PipeFeed:
    """A byte stream that stays open (standard input) as a :class:`~lance_async.feeds.Feed`.

    Parameters
    ----------
    stream : binary file object
        Read on the feed's reader thread, never on the event loop: its file
        descriptor with ``os.read`` when it has one (nothing may have been
        read from its buffer before), else ``read1``; not closed by the feed.
    format : {"ndjson", "json", "csv", "ipc"}
        How the bytes are decoded.
    schema : pa.Schema
        The rows' schema (usually the table's).
    chunk_size : int
        Bytes one read takes at most (default 1 MiB).
    max_fetch_bytes : int
        Bytes one :meth:`fetch` decodes at most once it has some (default 8 MiB).

    Notes
    -----
    Use it as ``async with`` (or call :meth:`aclose`). The reader thread is a
    daemon: a pipe whose writer never closes it does not keep the process
    alive. One task at a time may fetch. Works on asyncio and trio.
    """

    def __init__(
        self,
        stream: IO[bytes],
        *,
        format: str = "ndjson",
        schema: pa.Schema,
        chunk_size: int = 1 << 20,
        max_fetch_bytes: int = 8 << 20,
    ) -> None:
        if chunk_size < 1 or max_fetch_bytes < 1:
            raise ValueError("chunk_size and max_fetch_bytes must be >= 1 byte")
        self._stream = stream
        self._decoder = make_decoder(format, schema)
        self.chunk_size = chunk_size
        self.max_fetch_bytes = max_fetch_bytes
        self._state = FeedState.NEW
        self._chunks: MemoryObjectReceiveStream[bytes] | None = None
        self._ended = False  # the pipe was closed and every byte decoded
        self._position = 0  # bytes read and handed to the decoder
        self._error: BaseException | None = None
        self.committed: int | None = None
        """The last acknowledged offset (None before the first ack)."""

    def __repr__(self) -> str:
        return f"<PipeFeed state={self._state.value}>"

    @property
    def state(self) -> FeedState:
        """Where the feed is in its life cycle."""
        return self._state

    @property
    def exhausted(self) -> bool:
        """True once the pipe was closed by its writer and every row handed out."""
        return self._ended

    def _reader(self) -> Callable[[int], bytes]:
        """Reads of the file descriptor itself when there is one: a daemon thread
        blocked in a buffered file's read holds its lock, and the interpreter
        aborts when it finds it held at exit."""
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):  # not a real file (BytesIO)
            return getattr(self._stream, "read1", self._stream.read)
        return partial(os.read, fd)

    def _start(self) -> None:
        send: MemoryObjectSendStream[bytes]
        send, self._chunks = anyio.create_memory_object_stream[bytes](16)
        token = anyio.lowlevel.current_token()
        read = self._reader()

        def pump() -> None:
            try:
                try:
                    while chunk := read(self.chunk_size):
                        anyio.from_thread.run(send.send, chunk, token=token)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
                    return  # the feed was closed, or its event loop ended
                except (OSError, ValueError):
                    pass  # the pipe broke, or its file was closed under the read: its end
                try:
                    anyio.from_thread.run(send.aclose, token=token)
                except RuntimeError:
                    return
            finally:
                # closed by now, or nobody is left to receive (the feed closed, the
                # loop ended): close it here, not in a warning when it is collected
                send.close()

        threading.Thread(target=pump, name="lance_async-pipe", daemon=True).start()
        self._state = FeedState.OPEN

    async def __aenter__(self) -> PipeFeed:
        check_open(self._state, repr(self))
        if self._state is FeedState.NEW:
            self._start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop taking chunks (the reader thread ends at its next chunk). Safe twice."""
        if self._state is FeedState.CLOSED:
            return
        self._state = FeedState.CLOSED
        if self._chunks is not None:
            await self._chunks.aclose()

    def _ack(self, end: int) -> Any:
        async def ack() -> None:
            self.committed = end
            await anyio.lowlevel.checkpoint()

        return ack

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        """The rows that came since the last fetch, as one message ([] when none
        came within ``timeout`` seconds, or once :attr:`exhausted`).

        Raises
        ------
        ClosedError
            The feed was closed.
        DecodeError
            Bytes that cannot be decoded (``offset``: where they start); raised
            again by every later fetch.
        ValueError, TypeError
            ``max_messages`` below 1, or a negative ``timeout`` (at the call).
        """
        check_open(self._state, repr(self))
        check_fetch(max_messages, timeout)
        if self._state is FeedState.NEW:
            self._start()
        if self._error is not None:
            raise self._error
        if self._ended:
            return []
        assert self._chunks is not None
        data = bytearray()
        final = False
        with anyio.move_on_after(timeout):
            try:
                data += await self._chunks.receive()
            except anyio.EndOfStream:
                final = True
        while data and len(data) < self.max_fetch_bytes:
            try:
                data += self._chunks.receive_nowait()
            except anyio.WouldBlock:
                break
            except anyio.EndOfStream:
                final = True
                break
        if not data and not final:
            return []
        start = self._position - self._decoder.pending
        self._position += len(data)
        decoder, chunk = self._decoder, bytes(data)

        def decode() -> list[pa.RecordBatch]:
            batches = decoder.feed(chunk) if chunk else []
            if final:
                batches += decoder.finish()
            return [b for b in batches if b.num_rows]

        try:
            batches = await run_sync(decode, limiter=stream_limiter())
        except (DecodeError, pa.ArrowException, ValueError) as exc:
            error = DecodeError(
                f"standard input, bytes {start}-{self._position}: {exc}", offset=start
            )
            error.__cause__ = exc
            self._error = error
            raise error from exc
        self._ended = final
        if not batches:
            return []
        end = self._position - self._decoder.pending
        rows = pa.Table.from_batches(batches).combine_chunks().to_batches()  # one, as a rule
        return [Message(end, batch, {"start": start}, _ack=self._ack(end)) for batch in rows]
