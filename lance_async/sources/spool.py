"""A replay spool for a one-shot stream: memory up to a bound, then a temporary file.

A one-shot stream (a request body, a reader, a generator) cannot be read
twice; to retry a merge conflict without reading it again, its batches are
copied into a :class:`Spool` as they pass (Arrow IPC messages as they
arrived, or decoded batches), which then serves any number of replays as a
:func:`~lance_async.replayable` source: a request body's
(:class:`~lance_async.web.bodies.BodyBatches`), or a streamed merge source's
(:meth:`Spool.tee`, ``merge/attempt.py``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from .._schema import conform_batch

__all__ = ["SPOOL_MEMORY_BYTES", "Spool", "reshaped"]

#: A spool keeps this many bytes of batches in memory before it moves to a file.
SPOOL_MEMORY_BYTES = 4 << 20

_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def reshaped(
    batches: Iterator[pa.RecordBatch], schema: pa.Schema, slice_rows: int
) -> Iterator[pa.RecordBatch]:
    """Batches in ``schema``'s column order and labels, sliced to ``slice_rows``."""
    names = schema.names
    for batch in batches:
        shaped = batch if batch.schema.names == names else batch.select(names)
        shaped = conform_batch(shaped, schema)
        for start in range(0, shaped.num_rows, slice_rows):
            yield shaped.slice(start, slice_rows)


class Spool:
    """A copy of a stream for replays: in memory, then in an Arrow IPC stream file.

    An Arrow IPC body is spooled as the very messages that arrived (raw
    bytes, written without re-encoding, which keeps the worker threads off the
    GIL); other streams as their decoded batches. Blocking: every method runs
    on a worker thread.

    Parameters
    ----------
    directory : str, optional
        Where the spool file goes (default: the system's temporary directory).
    slice_rows : int
        Rows per batch of a replay at most (longer batches are sliced, zero-copy).
    memory_bytes : int
        Bytes kept in memory before the spool moves to a file (default 4 MiB).
    """

    def __init__(
        self, directory: str | None, slice_rows: int, memory_bytes: int = SPOOL_MEMORY_BYTES
    ) -> None:
        self._directory = directory
        self._slice_rows = slice_rows
        self._memory_bytes = memory_bytes
        self._messages: list[pa.Buffer] = []
        self._batches: list[pa.RecordBatch] = []
        self._held = 0
        self._path: str | None = None
        self._raw: Any = None  # a binary file taking raw IPC messages
        self._file: Any = None  # an Arrow file taking decoded batches
        self._writer: Any = None
        self._sealed = False
        self.nbytes = 0

    def _create(self) -> str:
        fd, path = tempfile.mkstemp(
            prefix="lance_async-body-", suffix=".arrows", dir=self._directory
        )
        os.close(fd)
        self._path = path
        return path

    def add_messages(self, messages: Sequence[pa.Buffer]) -> None:
        """Keep raw IPC messages (the schema message first)."""
        self.nbytes += sum(m.size for m in messages)
        if self._raw is None:
            self._messages.extend(messages)
            self._held += sum(m.size for m in messages)
            if self._held <= self._memory_bytes:
                return
            self._raw = open(self._create(), "wb", buffering=0)  # noqa: SIM115 - kept open
            messages, self._messages, self._held = self._messages, [], 0
        for message in messages:
            self._raw.write(memoryview(message))

    def add_batches(self, schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> None:
        """Keep decoded batches (text bodies)."""
        self.nbytes += sum(b.nbytes for b in batches)
        if self._writer is None:
            self._batches.extend(batches)
            self._held += sum(b.nbytes for b in batches)
            if self._held <= self._memory_bytes:
                return
            self._file = pa.OSFile(self._create(), "wb")
            self._writer = pa.ipc.new_stream(self._file, schema)
            batches, self._batches, self._held = self._batches, [], 0
        for batch in batches:
            self._writer.write_batch(batch)

    @property
    def sealed(self) -> bool:
        """True once :meth:`seal` ran: the spool holds the whole stream."""
        return self._sealed

    def tee(self, reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
        """``reader`` again, every batch copied here as it is read; sealed at its end.

        The copy happens on the thread that reads (the engine's), batch by
        batch, so the stream is never held whole in memory beyond the
        spool's in-memory bound.
        """
        schema = reader.schema

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in reader:
                self.add_batches(schema, [batch])
                yield batch
            self.seal()

        return pa.RecordBatchReader.from_batches(schema, batches())

    def seal(self) -> None:
        """The stream ended: close the spool file (replays may start)."""
        self._sealed = True
        if self._raw is not None:
            self._raw.write(_EOS)
            self._raw.close()
            self._raw = None
        if self._writer is not None:
            self._writer.close()
            self._file.close()
            self._writer = None

    def factory(self, schema: pa.Schema) -> Callable[[], Iterator[pa.RecordBatch]]:
        """A replay: every batch again, shaped like the body's batches."""
        path, rows = self._path, self._slice_rows
        messages, batches = list(self._messages), list(self._batches)

        def read() -> Iterator[pa.RecordBatch]:
            if path is not None:
                with pa.OSFile(path, "rb") as f:
                    yield from reshaped(iter(pa.ipc.open_stream(f)), schema, rows)
            elif messages:
                stream = pa.BufferReader(pa.py_buffer(b"".join(map(memoryview, messages))))
                yield from reshaped(iter(pa.ipc.open_stream(stream)), schema, rows)
            else:
                yield from batches

        return read

    def discard(self) -> None:
        try:
            self.seal()
        finally:
            self._messages = []
            self._batches = []
            if self._path is not None:
                try:
                    os.unlink(self._path)
                except FileNotFoundError:
                    pass
                self._path = None
