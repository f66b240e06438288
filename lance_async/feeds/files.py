"""Files as a feed: NDJSON, CSV and Arrow IPC read in chunks, optionally followed as they grow.

:class:`FileFeed` reads a file in ``chunk_size`` pieces with
:func:`~lance_async.files.open_async_file` (aiofiles on asyncio, anyio's file
API on trio), never whole, and hands out one
:class:`~lance_async.feeds.Message` per chunk whose ``payload`` is the
decoded :class:`pyarrow.RecordBatch`. Everything done with the bytes --
finding record boundaries (a newline outside quotes, the end of an IPC
message), parsing, combining a chunk's batches -- runs on a worker thread
in the incremental decoders of :mod:`lance_async.formats`; the event loop
only awaits reads and hands messages out.

Offsets and resuming
--------------------
A message's ``offset`` is the byte position just past its last record (an
int): everything before it has been handed out, and reading can restart
there. ``headers["start"]`` is where its bytes began. When :func:`ingest`
acknowledges a message (its rows are durable), the feed records that offset
as :attr:`FileFeed.committed` and, with ``offset_store``, persists it: a path
(a small JSON file replaced atomically) or a callable ``(offset) -> None``
(sync or async). A new feed on the same store resumes at the stored offset
(``start_offset=`` overrides); for CSV the header, and for Arrow IPC the
schema message, are read again from the start of the file first.

Following a growing file
------------------------
With ``follow=True`` the end of the file is not the end of the feed:
``fetch`` polls every ``poll_interval`` seconds for new bytes until its
``timeout``, a trailing partial record waits for the rest of its bytes, and
the feed runs until cancelled or closed (like ``tail -f``). An Arrow IPC
stream still ends at its end-of-stream marker. A file that shrinks
(truncated or replaced) raises :class:`~lance_async.SourceChangedError`.
Without ``follow``, ``exhausted`` turns True once the end of the file was
decoded and handed out.

The design is that of log shippers (Filebeat's registry, Fluent Bit's tail
input): a persisted byte offset per file, advanced only after delivery is
confirmed, and a poll for growth at the end of the file.

Errors
------
Bytes that cannot be decoded raise :class:`~lance_async.DecodeError` from
:meth:`FileFeed.fetch`, with ``offset`` = the byte position where the bad
chunk starts (chunks are decoded whole, so there is no per-record
dead-lettering for files; fix the file, or resume past the bad bytes with
``start_offset``). The chunks decoded before the bad one are handed out
first: a fetch that meets the bad chunk returns them, and the next fetch
raises. The error is raised again by every later fetch.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa

from .._args import check_fetch
from .._threads import run_sync, stream_limiter
from ..errors import DecodeError, SourceChangedError, SourceError
from ..sources.decoders import make_decoder
from ..sources.files import DEFAULT_CHUNK, guess_format, open_async_file
from ..sources.ipc import ipc_message_cut
from .base import Message
from .broker import FeedState, call_maybe_async, check_open

__all__ = ["FileFeed", "OffsetStore"]

#: A path to a JSON offset file, or a callable receiving each acknowledged offset.
OffsetStore = str | os.PathLike[str] | Callable[[int], Awaitable[None] | None]


def _one_batch(batches: list[pa.RecordBatch]) -> pa.RecordBatch | None:
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return None
    if len(batches) == 1:
        return batches[0]
    combined = pa.Table.from_batches(batches).combine_chunks().to_batches()
    return combined[0] if len(combined) == 1 else pa.Table.from_batches(combined).to_batches()[0]


class FileFeed:
    """An NDJSON, CSV or Arrow IPC file as a :class:`~lance_async.feeds.Feed`.

    Parameters
    ----------
    path : str or PathLike
        The file.
    format : {"ndjson", "json", "csv", "ipc"}, optional
        Default: from the extension (see :func:`lance_async.files.guess_format`).
        "ipc" reads both the Arrow IPC stream and file formats.
    schema : pa.Schema, optional
        The rows' schema (usually ``writer.schema``). Required for NDJSON and
        CSV: JSON values are coerced to it, CSV columns parsed as its types
        (matched by header name). For IPC the stream's own schema must match
        it when given.
    chunk_size : int
        Bytes per read (default 1 MiB); one message per chunk that completes
        at least one record.
    max_fetch_bytes : int
        Bytes one :meth:`fetch` reads at most once it has a message
        (default 8 MiB), which bounds a micro-batch's memory.
    follow : bool
        Keep reading as the file grows (default False; see the module notes).
    poll_interval : float
        Seconds between size checks at the end of a followed file (default 0.2).
    offset_store : str, PathLike or callable, optional
        Where acknowledged offsets go (see the module notes).
    start_offset : int, optional
        Byte offset to start at (a record boundary: an offset this feed
        handed out). Default: the stored offset of a path ``offset_store``,
        else the start of the file.
    **options
        ``extra_fields="error"|"ignore"`` (NDJSON), ``delimiter`` (CSV).

    Raises
    ------
    ValueError
        Unknown format, a negative size, or NDJSON / CSV without a schema.

    Notes
    -----
    The file is opened by :meth:`open` (``async with`` does it) or the first
    :meth:`fetch`. Decoding runs on the library's ``stream`` worker threads;
    file reads on aiofiles' (asyncio) or anyio's (trio) threads. One task at
    a time may fetch.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        format: str | None = None,
        schema: pa.Schema | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        max_fetch_bytes: int = 8 * 1024 * 1024,
        follow: bool = False,
        poll_interval: float = 0.2,
        offset_store: OffsetStore | None = None,
        start_offset: int | None = None,
        **options: Any,
    ) -> None:
        if chunk_size < 1 or max_fetch_bytes < 1:
            raise ValueError("chunk_size and max_fetch_bytes must be >= 1 byte")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval}")
        if start_offset is not None and start_offset < 0:
            raise ValueError(f"start_offset must be >= 0, got {start_offset}")
        self.path = os.fspath(path)
        self.format = format or guess_format(self.path)
        self.schema = schema
        self._options = options
        self._decoder = make_decoder(self.format, schema, **options)
        self.chunk_size = chunk_size
        self.max_fetch_bytes = max_fetch_bytes
        self.follow = follow
        self.poll_interval = poll_interval
        self._store_path: str | None = None
        self._store_fn: Callable[[int], Awaitable[None] | None] | None = None
        if isinstance(offset_store, (str, os.PathLike)):
            self._store_path = os.fspath(offset_store)
        elif offset_store is not None:
            self._store_fn = offset_store
        self._start_offset = start_offset
        self._state = FeedState.NEW
        self._stack = AsyncExitStack()
        self._file: Any = None
        self._buf = bytearray()
        self._read_pos = 0  # file position just past the last byte read
        self._need_seek = False
        self._ready: deque[Message] = deque()
        self._at_end = False
        self._error: BaseException | None = None
        self._lock: anyio.Lock | None = None
        self.start = 0
        """The byte offset this feed started reading records at."""
        self.committed: int | None = None
        """The last acknowledged offset (None before the first ack)."""

    def __repr__(self) -> str:
        return f"<FileFeed {self.format} {self.path!r} state={self._state.value}>"

    # -- properties ---------------------------------------------------------------
    @property
    def state(self) -> FeedState:
        """Where the feed is in its life cycle."""
        return self._state

    @property
    def exhausted(self) -> bool:
        """True once the end of an unfollowed file (or of an IPC stream) was handed out."""
        return self._at_end and not self._ready

    @property
    def position(self) -> int:
        """The byte offset just past the last record decoded so far."""
        return self._read_pos - len(self._buf) - self._decoder.pending

    # -- offsets -------------------------------------------------------------------
    def load_offset(self) -> int | None:
        """The offset saved in a path ``offset_store``, or None (blocking: a tiny read).

        Raises
        ------
        SourceError
            The offset file is not what this feed writes.
        """
        if self._store_path is None or not os.path.exists(self._store_path):
            return None
        try:
            data = json.loads(Path(self._store_path).read_text())
            return int(data["offset"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"{self._store_path!r} is not a FileFeed offset file: {exc}") from exc

    def _save_offset_blocking(self, offset: int) -> None:
        assert self._store_path is not None
        tmp = f"{self._store_path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"path": os.path.abspath(self.path), "offset": offset}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._store_path)

    def _acker(self, end: int) -> Callable[[], Awaitable[None]]:
        async def ack() -> None:
            check_open(self._state, repr(self))
            if self._store_path is not None:
                await run_sync(lambda: self._save_offset_blocking(end), limiter=stream_limiter())
            elif self._store_fn is not None:
                await call_maybe_async(self._store_fn, end)
            self.committed = end

        return ack

    # -- life cycle ---------------------------------------------------------------
    async def open(self) -> FileFeed:
        """Open the file and, when resuming, re-read its header / schema.

        Returns
        -------
        FileFeed
            ``self``.

        Raises
        ------
        ClosedError
            The feed was closed.
        SourceError
            No such file, or a bad offset file.
        SourceChangedError
            The resume offset lies past the end of the file, or the file
            ends inside its header.
        DecodeError
            The header or schema cannot be decoded.
        """
        check_open(self._state, repr(self))
        if self._state is FeedState.OPEN:
            return self
        start = self._start_offset
        if start is None:
            start = await run_sync(self.load_offset, limiter=stream_limiter())
        try:
            self._file = await self._stack.enter_async_context(open_async_file(self.path))
        except FileNotFoundError:
            raise SourceError(f"no such file: {self.path!r}") from None
        try:
            if start:
                await self._resume(start)
        except BaseException:
            # start again from scratch next time (the decoder may have seen the header)
            with anyio.CancelScope(shield=True):
                await self._stack.aclose()
            self._stack = AsyncExitStack()
            self._decoder = make_decoder(self.format, self.schema, **self._options)
            self._buf.clear()
            self._read_pos, self._need_seek = 0, False
            raise
        self._state = FeedState.OPEN
        return self

    async def _resume(self, start: int) -> None:
        size = (await anyio.Path(self.path).stat()).st_size
        if start > size:
            raise SourceChangedError(
                f"cannot resume {self.path!r} at byte {start}: the file has {size} bytes "
                "(it was truncated or replaced)"
            )
        prologue = 0
        if self.format == "json" and start > 0:
            raise ValueError(
                "a JSON array cannot be resumed at an offset (its elements are read from the "
                "opening bracket); write NDJSON (.ndjson) to follow or resume a file"
            )
        if self.format not in ("ndjson", "json"):
            # CSV: the header line; IPC: the file magic and the schema message.
            while True:
                if self.format == "csv":
                    nl = self._buf.find(b"\n")
                    prologue = nl + 1 if nl >= 0 else 0
                else:
                    cut, _, messages = ipc_message_cut(self._buf, True, limit=1)
                    prologue = cut if messages == 1 else 0  # the magic alone is not enough
                if prologue or not await self._read_chunk():
                    break
            if not prologue:
                raise SourceChangedError(f"{self.path!r} ends inside its header")
            if start < prologue:
                raise ValueError(
                    f"start_offset {start} lies inside the header (it ends at byte {prologue})"
                )
            head = bytes(self._buf[:prologue])
            decoder = self._decoder
            await run_sync(lambda: decoder.feed(head), limiter=stream_limiter())
        self._buf.clear()
        self._read_pos = start
        self._need_seek = True
        self.start = start

    async def aclose(self) -> None:
        """Close the file. Safe to call twice; shielded from cancellation.

        Messages handed out and not acknowledged are not recorded: a feed
        resuming from the same ``offset_store`` reads them again.
        """
        if self._state is FeedState.CLOSED:
            return
        self._state = FeedState.CLOSED
        with anyio.CancelScope(shield=True):
            await self._stack.aclose()

    async def __aenter__(self) -> FileFeed:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- reading -------------------------------------------------------------------
    async def _read_chunk(self) -> bytes:
        if self._need_seek:
            await self._file.seek(self._read_pos)
            self._need_seek = False
        # If this read is cancelled its bytes are lost: seek back next time.
        self._need_seek = True
        chunk: bytes = await self._file.read(self.chunk_size)
        self._buf += chunk
        self._read_pos += len(chunk)
        self._need_seek = False
        return chunk

    def _deliver(self, batch: pa.RecordBatch | None, start: int, end: int) -> None:
        if batch is not None:
            self._ready.append(Message(end, batch, {"start": start}, _ack=self._acker(end)))

    async def _decode(self, *, final: bool) -> None:
        """Hand the bytes read so far to the decoder, on a worker thread.

        The decoder finds the record boundaries (keeping an incomplete last
        record for later), parses, and the chunk's batches are combined into
        one -- all off the event loop. The bytes leave ``_buf`` once the
        decoder has taken them, also when this task was cancelled meanwhile
        (the batch is then kept for the next fetch). Cancelled before the
        thread started, nothing changes and the same bytes are decoded next
        time. ``final``: the end of an unfollowed file.
        """
        size = len(self._buf)
        if not size and not final:
            return
        decoder = self._decoder
        buf = self._buf  # not resized while the thread runs: fetch holds the lock
        start = self.position
        end = self._read_pos

        def work() -> pa.RecordBatch | None:
            out = decoder.feed(bytes(buf)) if size else []
            if final:
                out.extend(decoder.finish())
            return _one_batch(out)

        def consumed() -> int:
            del self._buf[:size]
            if final or decoder.ended:
                self._at_end = True
            return self.position

        def wrap(exc: BaseException) -> BaseException:
            if isinstance(exc, DecodeError):
                error = DecodeError(f"{self.path!r}, bytes {start}-{end}: {exc}", offset=start)
                error.__cause__ = exc
                return error
            return exc

        def on_cancel(result: pa.RecordBatch | None, error: BaseException | None) -> None:
            position = consumed()
            if error is not None:
                self._error = wrap(error)
            else:
                self._deliver(result, start, position)

        try:
            batch = await run_sync(work, limiter=stream_limiter(), on_cancel_result=on_cancel)
        except (DecodeError, pa.ArrowException, ValueError) as exc:
            consumed()
            self._error = wrap(exc)
            raise self._error from exc
        self._deliver(batch, start, consumed())

    async def _check_not_shrunk(self) -> None:
        size = (await anyio.Path(self.path).stat()).st_size
        if size < self._read_pos:
            raise SourceChangedError(
                f"{self.path!r} shrank to {size} bytes while followed at byte {self._read_pos} "
                "(truncated or replaced)"
            )

    async def _fill(self, max_messages: int, timeout: float) -> None:
        deadline = anyio.current_time() + max(timeout, 0.0)
        read = 0
        while len(self._ready) < max_messages and not self._at_end and self._error is None:
            if self._ready and read >= self.max_fetch_bytes:
                break
            chunk = await self._read_chunk()
            if chunk:
                read += len(chunk)
                await self._decode(final=False)
                continue
            if not self.follow:
                await self._decode(final=True)  # sets _at_end once decoded
                break
            if self._ready:
                break
            await self._check_not_shrunk()
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                break
            await anyio.sleep(min(self.poll_interval, remaining))

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        """The next decoded chunks, one message each (at most ``max_messages``).

        Parameters
        ----------
        max_messages : int
            Messages to return at most (>= 1).
        timeout : float
            Seconds to wait for new bytes at the end of a followed file (>= 0);
            an unfollowed file never waits.

        Returns
        -------
        list of Message
            ``offset`` = byte position after the message's last record,
            ``payload`` = a record batch; ``[]`` when a followed file did not
            grow within ``timeout``, or once :attr:`exhausted`.

        Raises
        ------
        ClosedError
            The feed was closed.
        DecodeError
            Bytes that cannot be decoded (``offset`` = where they start), once
            every message decoded before them was handed out.
        SourceChangedError
            A followed file shrank.
        SourceError
            No such file.

        Notes
        -----
        Cancellation loses nothing: a cancelled read is re-read, a chunk
        decoded while the fetch was cancelled is kept for the next fetch.
        """
        check_open(self._state, repr(self))
        check_fetch(max_messages, timeout)
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._state is FeedState.NEW:
                await self.open()
            if self._error is not None and not self._ready:
                raise self._error
            try:
                await self._fill(max_messages, timeout)
            except DecodeError as exc:
                # the messages decoded before the bad chunk go out first; the
                # (sticky) error is raised by the next fetch
                if exc is not self._error or not self._ready:
                    raise
            # (taking the lock was the checkpoint) no await from here on: messages
            # taken off the queue must reach the caller, even under cancellation
            count = min(max_messages, len(self._ready))
            return [self._ready.popleft() for _ in range(count)]
