"""Arrow IPC framing: cut a byte stream into messages by reading only their headers.

The one framer of lance_async. The HTTP bodies, the IPC stream decoder and
the file feeds all cut Arrow IPC bytes with it:

* :class:`IpcFramer` takes bytes in chunks of any size and hands out each
  complete message as one Arrow buffer of exactly its size (copied once, as
  the bytes arrive). Only the message prefix and the flatbuffer header are
  parsed (a few bytes each): when a header is in, the message's total size is
  known, so a message past a limit is refused *before* its body is buffered.
* :func:`ipc_message_cut` says how many leading bytes of a buffer are
  complete messages, without copying anything.

Layout relied on (Arrow's encapsulated message format, 1.0 and later, and the
pre-1.0 form without the continuation marker): ``0xFFFFFFFF``, an int32
metadata length (padding included), the flatbuffer ``Message`` (fields
``header_type`` = 1, ``header`` = 2, ``bodyLength`` = 3; a record batch
header's field 0 is its row count), then the body. A metadata length of 0 is
the end-of-stream marker. The IPC *file* format starts with ``ARROW1`` and
two bytes of padding, then the same stream; its footer after the end marker
is ignored.
"""

from __future__ import annotations

import struct

import pyarrow as pa

from ..errors import DecodeError, PayloadTooLargeError

__all__ = ["FILE_MAGIC", "IpcFramer", "ipc_message_cut"]

FILE_MAGIC = b"ARROW1"
_CONTINUATION = 0xFFFFFFFF
_HEADER_RECORD_BATCH = 3


def _u16(buf: bytes | bytearray | memoryview, off: int) -> int:
    return int(struct.unpack_from("<H", buf, off)[0])


def _i32(buf: bytes | bytearray | memoryview, off: int) -> int:
    return int(struct.unpack_from("<i", buf, off)[0])


def _u32(buf: bytes | bytearray | memoryview, off: int) -> int:
    return int(struct.unpack_from("<I", buf, off)[0])


def _i64(buf: bytes | bytearray | memoryview, off: int) -> int:
    return int(struct.unpack_from("<q", buf, off)[0])


def _table_field(buf: bytes | bytearray | memoryview, table: int, index: int) -> int:
    """Offset (from ``table``) of a flatbuffer table's field, or 0 when absent."""
    vtable = table - _i32(buf, table)
    vt_size = _u16(buf, vtable)
    slot = 4 + 2 * index
    return _u16(buf, vtable + slot) if slot + 2 <= vt_size else 0


def message_header(meta: bytes | bytearray | memoryview) -> tuple[int, int, int | None]:
    """(header type, body length in bytes, rows or None) of an IPC ``Message``.

    Raises ``struct.error`` or ``IndexError`` on malformed input.
    """
    root = _u32(meta, 0)
    off = _table_field(meta, root, 1)
    header_type = meta[root + off] if off else 0
    off = _table_field(meta, root, 3)
    body_length = _i64(meta, root + off) if off else 0
    rows: int | None = None
    if header_type == _HEADER_RECORD_BATCH:
        off = _table_field(meta, root, 2)
        if off:
            header = root + off + _u32(meta, root + off)
            off0 = _table_field(meta, header, 0)
            rows = _i64(meta, header + off0) if off0 else 0
    return header_type, body_length, rows


def _prefix(head: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(metadata length, prefix length) of the message starting ``head``, or
    None when ``head`` is too short to tell (it needs 4 or 8 bytes)."""
    if len(head) < 4:
        return None
    if _u32(head, 0) == _CONTINUATION:
        if len(head) < 8:
            return None
        return _i32(head, 4), 8
    return _i32(head, 0), 4  # the pre-1.0 format: no continuation marker


class IpcFramer:
    """Cuts an Arrow IPC stream (or file) into messages, each copied once into an Arrow buffer.

    Parameters
    ----------
    max_message_bytes : int, optional
        A message (prefix, metadata and body) larger than this is refused
        from its header, before its body is buffered.
    max_message_rows : int, optional
        A record batch message with more rows is refused from its header.

    Notes
    -----
    Cheap enough for the event loop: per chunk, a few slices and one memcpy.
    Not thread-safe; one caller at a time. The limits are named
    ``max_batch_bytes`` / ``max_batch_rows`` in the errors, as the HTTP body
    limits that set them.
    """

    def __init__(
        self, *, max_message_bytes: int | None = None, max_message_rows: int | None = None
    ) -> None:
        self._max_bytes = max_message_bytes
        self._max_rows = max_message_rows
        self._head = bytearray()  # the current message's prefix and metadata
        self._want = 8  # bytes of head needed before the next decision
        self._started = False
        self._buffer: pa.Buffer | None = None
        self._view: memoryview | None = None
        self._filled = 0
        self._ready: list[pa.Buffer] = []
        self.ended = False
        """True once the end-of-stream marker was read."""
        self.messages = 0
        """Complete messages so far."""
        self.ready_bytes = 0
        """Bytes of the complete messages not yet taken."""
        self.trailing = 0
        """Bytes fed after the end-of-stream marker (an IPC file's footer): ignored."""

    @property
    def pending(self) -> int:
        """Bytes fed that are not part of a complete message (an incomplete
        message, the file magic, or what follows the end marker)."""
        return len(self._head) + self._filled + self.trailing

    def _too_large(self, what: str, limit: str, maximum: int, actual: int) -> PayloadTooLargeError:
        return PayloadTooLargeError(
            f"IPC message {self.messages} {what} ({actual:,}); the limit {limit} is {maximum:,}",
            limit=limit,
            maximum=maximum,
            actual=actual,
        )

    def _decide(self) -> None:
        """Act on a complete ``_want``-byte head: wait for more, end, or allocate."""
        head = self._head
        if not self._started:
            self._started = True
            if bytes(head[:6]) == FILE_MAGIC:
                head.clear()  # the IPC file format: magic and padding, then a stream
                return
        prefix = _prefix(head)
        if prefix is None:
            self._want = 8
            return
        meta_len, size = prefix
        if meta_len == 0:
            self.ended = True
            self.trailing += len(head) - size
            head.clear()
            return
        if meta_len < 0:
            raise DecodeError(f"IPC message {self.messages} has a negative metadata length")
        if self._max_bytes is not None and size + meta_len > self._max_bytes:
            raise self._too_large(
                "has more metadata than allowed",
                "max_batch_bytes",
                self._max_bytes,
                size + meta_len,
            )
        if len(head) < size + meta_len:
            self._want = size + meta_len
            return
        try:
            _kind, body_length, rows = message_header(bytes(head[size:]))
        except (struct.error, IndexError):
            raise DecodeError(f"IPC message {self.messages} has a malformed header") from None
        if body_length < 0:
            raise DecodeError(f"IPC message {self.messages} has a negative body length")
        total = size + meta_len + body_length
        if self._max_bytes is not None and total > self._max_bytes:
            raise self._too_large(
                "is larger than allowed", "max_batch_bytes", self._max_bytes, total
            )
        if self._max_rows is not None and rows is not None and rows > self._max_rows:
            raise self._too_large(
                "holds more rows than allowed", "max_batch_rows", self._max_rows, rows
            )
        self._buffer = pa.allocate_buffer(total)
        self._view = memoryview(self._buffer).cast("B")
        self._view[: len(head)] = head
        self._filled = len(head)
        head.clear()
        self._complete_if_full()

    def _complete_if_full(self) -> None:
        if self._buffer is not None and self._filled == self._buffer.size:
            self._ready.append(self._buffer)
            self.ready_bytes += self._buffer.size
            self.messages += 1
            if self._view is not None:
                self._view.release()
            self._buffer = self._view = None
            self._filled = 0
            self._want = 4

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Take more bytes (the messages they complete are kept for :meth:`take`).

        Raises
        ------
        PayloadTooLargeError
            A message passes ``max_message_bytes`` or ``max_message_rows``.
        DecodeError
            A malformed message header.
        """
        data = memoryview(chunk)
        pos = 0
        while pos < len(data) and not self.ended:
            if self._view is not None:
                n = min(len(self._view) - self._filled, len(data) - pos)
                self._view[self._filled : self._filled + n] = data[pos : pos + n]
                self._filled += n
                pos += n
                self._complete_if_full()
                continue
            n = min(self._want - len(self._head), len(data) - pos)
            self._head += data[pos : pos + n]
            pos += n
            if len(self._head) >= self._want:
                self._decide()
        self.trailing += len(data) - pos  # after the end-of-stream marker: ignored

    def take(self) -> list[pa.Buffer]:
        """The complete messages since the last call, in order."""
        ready, self._ready = self._ready, []
        self.ready_bytes = 0
        return ready

    def finish(self) -> None:
        """End of input.

        Raises
        ------
        DecodeError
            The stream ended in the middle of a message.
        """
        if not self.ended and (self._head or self._buffer is not None):
            raise DecodeError("the IPC stream ended in the middle of a message")


def ipc_message_cut(
    buf: bytes | bytearray, at_stream_start: bool, limit: int | None = None
) -> tuple[int, bool, int]:
    """How many leading bytes of ``buf`` are complete Arrow IPC messages.

    Parameters
    ----------
    buf : bytes or bytearray
        Bytes of an IPC stream (or file) starting at a message boundary.
    at_stream_start : bool
        ``buf`` starts at the beginning of the input: an IPC file's 8-byte
        magic is skipped (and counted in the cut).
    limit : int, optional
        Take at most this many messages.

    Returns
    -------
    tuple of (cut, ended, messages)
        The end of the last complete message (bytes), whether the
        end-of-stream marker was reached (it is included in ``cut``), and how
        many messages ``cut`` holds. Reads only message prefixes and headers
        and never copies ``buf``.

    Raises
    ------
    DecodeError
        A malformed message header.
    """
    view = memoryview(buf)
    pos = 0
    if at_stream_start and len(buf) >= 8 and bytes(view[:6]) == FILE_MAGIC:
        pos = 8
    count = 0
    while limit is None or count < limit:
        prefix = _prefix(view[pos : pos + 8])
        if prefix is None:
            break
        meta_len, size = prefix
        if meta_len == 0:
            return pos + size, True, count
        if meta_len < 0:
            raise DecodeError(f"IPC message {count} has a negative metadata length")
        if len(buf) - pos < size + meta_len:
            break
        try:
            _kind, body_length, _rows = message_header(view[pos + size : pos + size + meta_len])
        except (struct.error, IndexError):
            raise DecodeError(f"IPC message {count} has a malformed header") from None
        total = size + meta_len + body_length
        if body_length < 0 or len(buf) - pos < total:
            break
        pos += total
        count += 1
    return pos, False, count
