"""A digest of the values of one pass of a source, to tell a changed replay.

A replayable source promises the same values in the same order on every
pass. :class:`PassDigest` summarises a pass as its row count and a hash of
its values, computed batch by batch as the pass streams, so the engine never
waits for it and nothing is buffered: two passes that give the same values
in the same order have the same digest however their batches are cut, and
a pass that gives other values, rows or order has another (up to hash
collisions: xxHash's 128-bit XXH3 per stream of bytes).

What is hashed, per column (nested columns recursively): the positions of
the nulls, then the values of the other rows -- fixed-width values as their
bytes, variable-width ones as their lengths and their bytes, lists as their
lengths and their items, structs field by field. Bytes under null slots and
padding never count, nor do buffer offsets: only values do. Each of these
byte streams has its own hasher, which is what makes the digest independent
of batch boundaries.

Cost: xxHash (XXH3) runs at about 20 GB/s and releases the GIL; the per-batch
work in Python is O(columns). Idea: content-addressed replays of Spark's and
Flink's sources, which check a replayed split against its first read.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

__all__ = ["PassDigest"]

Path = tuple[Hashable, ...]


def _fixed_width(dtype: pa.DataType) -> int | None:
    """Bytes per value of a fixed-width type stored as one values buffer."""
    if (
        pa.types.is_integer(dtype)
        or pa.types.is_floating(dtype)
        or pa.types.is_temporal(dtype)
        or pa.types.is_decimal(dtype)
        or pa.types.is_fixed_size_binary(dtype)
    ):
        width = int(dtype.bit_width)
        if width % 8 == 0:
            return width // 8
    return None


class PassDigest:
    """The row count and value hash of one pass, updated batch by batch.

    Notes
    -----
    :meth:`update` is blocking CPU work (hashing runs without the GIL);
    lance_async calls it on the worker thread that drains the pass. Not
    thread-safe: one pass, one digest.
    """

    def __init__(self) -> None:
        self.rows = 0
        self._hashers: dict[tuple[Path, str], Any] = {}
        self._seen: dict[Path, int] = {}

    def _hasher(self, path: Path, kind: str) -> Any:
        key = (path, kind)
        hasher = self._hashers.get(key)
        if hasher is None:
            hasher = self._hashers[key] = xxhash.xxh3_128()
        return hasher

    def update(self, batch: pa.RecordBatch) -> None:
        """Add one batch of the pass (in pass order)."""
        self.rows += batch.num_rows
        for index, column in enumerate(batch.columns):
            self._feed((index,), column)

    def result(self) -> tuple[int, tuple[tuple[str, str], ...]]:
        """The digest so far: ``(rows, ((stream, hex digest), ...))``; compare with ``==``."""
        streams = tuple(
            sorted((f"{path}:{kind}", h.hexdigest()) for (path, kind), h in self._hashers.items())
        )
        return self.rows, streams

    def _feed(self, path: Path, array: pa.Array) -> None:
        n = len(array)
        if not n:
            return
        seen = self._seen.get(path, 0)
        self._seen[path] = seen + n
        if array.null_count:
            nulls = np.flatnonzero(~array.is_valid().to_numpy(zero_copy_only=False))
            self._hasher(path, "nulls").update((nulls.astype(np.int64) + seen).tobytes())
            array = pc.drop_null(array)
            if not len(array):
                return
        dtype = array.type
        if isinstance(dtype, pa.ExtensionType):
            self._feed((*path, "storage"), array.storage)
            return
        if pa.types.is_dictionary(dtype):
            self._feed((*path, "decoded"), array.dictionary_decode())
            return
        width = _fixed_width(dtype)
        if width is not None:
            buffer = array.buffers()[1]
            start = array.offset * width
            with memoryview(buffer) as view:
                self._hasher(path, "values").update(view[start : start + len(array) * width])
        elif pa.types.is_boolean(dtype):
            self._hasher(path, "values").update(array.to_numpy(zero_copy_only=False).tobytes())
        elif pa.types.is_string(dtype) or pa.types.is_binary(dtype):
            self._variable(path, array, np.int32)
        elif pa.types.is_large_string(dtype) or pa.types.is_large_binary(dtype):
            self._variable(path, array, np.int64)
        elif pa.types.is_string_view(dtype) or pa.types.is_binary_view(dtype):
            wide = pa.large_string() if pa.types.is_string_view(dtype) else pa.large_binary()
            self._variable(path, array.cast(wide), np.int64)
        elif pa.types.is_fixed_size_list(dtype):
            self._feed((*path, "item"), array.flatten())
        elif pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_map(dtype):
            lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
            self._hasher(path, "lengths").update(lengths.astype(np.int64).tobytes())
            self._feed((*path, "item"), array.flatten())
        elif pa.types.is_struct(dtype):
            for index, child in enumerate(array.flatten()):
                self._feed((*path, index), child)
        else:  # unions, run-end encoded ...: rare; hash the values themselves
            self._hasher(path, "python").update(repr(array.to_pylist()).encode())

    def _variable(self, path: Path, array: pa.Array, offset_type: type[np.generic]) -> None:
        buffers = array.buffers()
        offsets = np.frombuffer(buffers[1], dtype=offset_type)[
            array.offset : array.offset + len(array) + 1
        ]
        self._hasher(path, "lengths").update(np.diff(offsets).astype(np.int64).tobytes())
        data = buffers[2]
        if data is not None and offsets[-1] > offsets[0]:
            with memoryview(data) as view:
                self._hasher(path, "values").update(view[int(offsets[0]) : int(offsets[-1])])
