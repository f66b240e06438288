"""The built-in kinds of write source, one class per kind of object.

==================== ============ =====================================================
class                mode         made from
==================== ============ =====================================================
MaterializedSource   MATERIALIZED tables, batches, lists of dicts, column dicts, frames
LanceDatasetSource   REPLAYABLE   a ``LanceDataset`` pinned to its version (an
                                  ``AsyncDataset`` too: ``lance_async.dataset``
                                  registers it, pinned when it is passed)
ArrowDatasetSource   REPLAYABLE   an unfiltered ``pyarrow.dataset`` dataset (files
                                  fingerprinted by size and mtime); STREAMING when filtered
ReaderSource         STREAMING    a ``pa.RecordBatchReader`` or ``pyarrow.dataset.Scanner``
IteratorSource       STREAMING    a sync iterator or generator of record batches
AsyncIteratorSource  STREAMING    an async iterator or async generator of record batches
==================== ============ =====================================================

``registry.py`` picks the class for an object; ``replay.py`` holds the
reader-factory kind (:func:`~lance_async.replayable`); ``files.py`` the file kind.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterable, AsyncIterator, Iterator, Mapping
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.dataset as pds

from .._loop import aclose_shielded
from .._schema import conform_batch, describe_difference
from .._threads import run_sync, stream_limiter
from ..errors import SchemaMismatchError, SourceChangedError, SourceError
from .base import SourceMode, WriteSource, achecked, checked

__all__ = [
    "ArrowDatasetSource",
    "AsyncIteratorSource",
    "IteratorSource",
    "LanceDatasetSource",
    "MaterializedSource",
    "ReaderSource",
]


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
            self.schema, checked(reader, self.schema, pass_no, self._sink(pass_no))
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
            self.schema, checked(reader, self.schema, pass_no, self._sink(pass_no))
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
            self.schema, checked(items, self.schema, pass_no, self._sink(pass_no))
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
        return achecked(_prepend(peeked, self._iterator), self.schema, pass_no)


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
