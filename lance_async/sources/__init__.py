"""Write sources: anything that can feed rows to an upsert or a MemWAL put.

A :class:`WriteSource` is a schema, a :class:`SourceMode` and a way to make a
fresh pass over the rows on every call -- as an async iterator for the loop
(:meth:`WriteSource.open`) or as a blocking ``pa.RecordBatchReader`` for a
worker thread (:meth:`WriteSource.open_reader`). The idea follows LanceDB's
``scannable.py``: a reader factory plus a flag saying whether it can be
scanned again, made by a :func:`functools.singledispatch` function with one
registration per type.

============  ================================================  =======================
mode          examples                                          what a retry does
============  ================================================  =======================
MATERIALIZED  pa.Table, pa.RecordBatch, lists of batches,       Lance's in-memory
              dicts of columns, lists of dicts, pandas /        retries
              polars frames
REPLAYABLE    LanceDataset (pinned to a version), unfiltered    call the factory again
              pyarrow.dataset datasets, :func:`replayable`
              factories, :func:`lance_async.file_source`
              files, WriteSource objects
STREAMING     pa.RecordBatchReader, pyarrow.dataset.Scanner,    one pass only
              generators, iterators, async generators, async
              iterators
============  ================================================  =======================

Every pass of a replayable source is checked: a reader whose schema differs
from the first pass (metadata included) raises
:class:`~lance_async.errors.SourceChangedError` before a row moves. Every
batch that crosses into the engine is checked against the declared schema; a
drifting batch raises :class:`~lance_async.errors.SchemaMismatchError` naming
the batch and the field (never a Rust panic, never a lossy cast).

The package, one module per job (imports run down this list, never up):

``streams.py``
    Bridges between blocking Arrow readers and async iteration
    (:class:`AsyncBatchStream`, :func:`bridge_reader`, :func:`iterate_reader`).
``base.py``
    The contract: :class:`SourceMode`, :class:`WriteSource`, per-pass checks.
``kinds.py``
    The built-in kinds (tables, Lance and Arrow datasets, readers, iterators).
``replay.py``
    Reader factories: :func:`replayable`.
``ipc.py``, ``jsondepth.py``, ``jsonrows.py``, ``decoders.py``
    Arrow IPC framing, JSON nesting limits, JSON rows, incremental NDJSON /
    CSV / IPC decoders.
``files.py``
    Files read in chunks (aiofiles on asyncio): :func:`file_source`.
``registry.py``
    :func:`coerce_source` / :func:`resolve_source`: which kind an object is.
"""

from __future__ import annotations

from .base import ReaderPlan, SourceMode, WriteSource
from .files import FileSource, file_source, guess_format
from .jsonrows import rows_schema
from .registry import coerce_source, resolve_source
from .replay import replayable
from .streams import (
    AsyncBatchStream,
    BridgeStatistics,
    StreamState,
    StreamStatistics,
    bridge_reader,
    iterate_reader,
)

__all__ = [
    "AsyncBatchStream",
    "BridgeStatistics",
    "FileSource",
    "ReaderPlan",
    "SourceMode",
    "StreamState",
    "StreamStatistics",
    "WriteSource",
    "bridge_reader",
    "coerce_source",
    "file_source",
    "guess_format",
    "iterate_reader",
    "replayable",
    "resolve_source",
    "rows_schema",
]
