"""The replay spool of a request body: memory up to a bound, then a temporary file.

A request body is a one-shot stream; to retry a merge conflict without
reading the client twice, :class:`~lance_async.web.bodies.BodyBatches`
copies what it decodes into a :class:`Spool` (Arrow IPC messages as they
arrived, or the decoded batches of text bodies), which then serves any
number of replays as a :func:`~lance_async.replayable` source.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from .._schema import conform_batch
from .limits import SPOOL_MEMORY_BYTES

__all__ = ["Spool", "reshaped"]

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
    """A copy of a body for replays: in memory, then in an Arrow IPC stream file.

    An Arrow IPC body is spooled as the very messages that arrived (raw
    bytes, written without re-encoding, which keeps the worker threads off the
    GIL); a text body as its decoded batches. Blocking: every method runs on a
    worker thread.
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

    def seal(self) -> None:
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
