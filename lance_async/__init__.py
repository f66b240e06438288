"""lance_async: Lance (pylance) as a first-class citizen of async Python.

Awaitable merge_insert whose conflict retries replay the source, MemWAL
ingestion with a bounded queue, group commit and durable acks, and LSM reads
-- all without blocking the event loop (asyncio or trio, through anyio).
Every public name is re-exported here, one line per name; the modules that
define them are the place to read their documentation.

``import lance_async`` loads pyarrow, pylance and the modules that call them
(about 0.3 s), so that the first engine call made on an event loop does not
stall it importing them (0.4 s measured, issue 18); the optional parts
(feeds, web, the command) still load on first use of a name (PEP 562). The
``lance-async`` command skips this: it sets ``LANCE_LOG`` before pylance loads.
"""

from __future__ import annotations

import importlib as _importlib
import os as _os
import sys as _sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._memory import MemoryLimits, configure_memory, memory_limits
    from ._metrics import configure_metrics
    from ._threads import ThreadLimits, configure_threads
    from .dataset import AsyncDataset, AsyncTags, CommitBatchResult, open_dataset, write_dataset
    from .errors import (
        BackpressureTimeoutError,
        ClosedError,
        ConflictError,
        ContentionError,
        DatasetNotFoundError,
        DecodeError,
        DuplicateKeyError,
        InvalidInputError,
        LanceAsyncError,
        MergeShapeError,
        ResourceExhaustedError,
        SchemaMismatchError,
        SourceChangedError,
        SourceConsumedError,
        SourceError,
        StorageError,
        StorageFullError,
        StorageNotFoundError,
        StoragePermissionError,
        StorageTimeoutError,
        StorageUnavailableError,
        UnsupportedSourceError,
        WriterFailedError,
        WrongEventLoopError,
    )
    from .feeds import Feed, FileFeed, IngestStats, IterableFeed, Message, ingest
    from .memwal import (
        Ack,
        AsyncShardWriter,
        CoalescerStats,
        CompactionPolicy,
        CompactionResult,
        Compactor,
        CompactorStats,
        PutSummary,
        ShardRouter,
        ShardSnapshot,
        WriterState,
        WriterStats,
    )
    from .merge import AsyncMergeInsertBuilder, MergeResult
    from .sources import (
        AsyncBatchStream,
        FileSource,
        SourceMode,
        StreamState,
        WriteSource,
        bridge_reader,
        coerce_source,
        file_source,
        iterate_reader,
        replayable,
        resolve_source,
    )

_LOCATIONS: dict[str, str] = {
    "Ack": ".memwal",
    "AsyncBatchStream": ".sources",
    "AsyncDataset": ".dataset",
    "AsyncMergeInsertBuilder": ".merge",
    "AsyncShardWriter": ".memwal",
    "AsyncTags": ".dataset",
    "CommitBatchResult": ".dataset",
    "MergeShapeError": ".errors",
    "BackpressureTimeoutError": ".errors",
    "bridge_reader": ".sources",
    "ClosedError": ".errors",
    "CoalescerStats": ".memwal",
    "coerce_source": ".sources",
    "CompactionPolicy": ".memwal",
    "CompactionResult": ".memwal",
    "Compactor": ".memwal",
    "CompactorStats": ".memwal",
    "configure_memory": "._memory",
    "configure_metrics": "._metrics",
    "configure_threads": "._threads",
    "memory_limits": "._memory",
    "MemoryLimits": "._memory",
    "ResourceExhaustedError": ".errors",
    "ConflictError": ".errors",
    "ContentionError": ".errors",
    "DatasetNotFoundError": ".errors",
    "DecodeError": ".errors",
    "DuplicateKeyError": ".errors",
    "Feed": ".feeds",
    "file_source": ".sources",
    "FileFeed": ".feeds",
    "FileSource": ".sources",
    "ingest": ".feeds",
    "IngestStats": ".feeds",
    "InvalidInputError": ".errors",
    "IterableFeed": ".feeds",
    "iterate_reader": ".sources",
    "LanceAsyncError": ".errors",
    "MergeResult": ".merge",
    "Message": ".feeds",
    "open_dataset": ".dataset",
    "PutSummary": ".memwal",
    "replayable": ".sources",
    "resolve_source": ".sources",
    "SchemaMismatchError": ".errors",
    "ShardRouter": ".memwal",
    "ShardSnapshot": ".memwal",
    "SourceChangedError": ".errors",
    "SourceConsumedError": ".errors",
    "SourceError": ".errors",
    "SourceMode": ".sources",
    "StorageError": ".errors",
    "StorageFullError": ".errors",
    "StorageNotFoundError": ".errors",
    "StoragePermissionError": ".errors",
    "StorageTimeoutError": ".errors",
    "StorageUnavailableError": ".errors",
    "StreamState": ".sources",
    "ThreadLimits": "._threads",
    "UnsupportedSourceError": ".errors",
    "write_dataset": ".dataset",
    "WriterFailedError": ".errors",
    "WriterState": ".memwal",
    "WriterStats": ".memwal",
    "WriteSource": ".sources",
    "WrongEventLoopError": ".errors",
}

__all__ = [
    "Ack",
    "AsyncBatchStream",
    "AsyncDataset",
    "AsyncMergeInsertBuilder",
    "AsyncShardWriter",
    "AsyncTags",
    "BackpressureTimeoutError",
    "ClosedError",
    "CoalescerStats",
    "CommitBatchResult",
    "CompactionPolicy",
    "CompactionResult",
    "Compactor",
    "CompactorStats",
    "ConflictError",
    "ContentionError",
    "DatasetNotFoundError",
    "DecodeError",
    "DuplicateKeyError",
    "Feed",
    "FileFeed",
    "FileSource",
    "IngestStats",
    "InvalidInputError",
    "IterableFeed",
    "LanceAsyncError",
    "MemoryLimits",
    "MergeResult",
    "MergeShapeError",
    "Message",
    "PutSummary",
    "ResourceExhaustedError",
    "SchemaMismatchError",
    "ShardRouter",
    "ShardSnapshot",
    "SourceChangedError",
    "SourceConsumedError",
    "SourceError",
    "SourceMode",
    "StorageError",
    "StorageFullError",
    "StorageNotFoundError",
    "StoragePermissionError",
    "StorageTimeoutError",
    "StorageUnavailableError",
    "StreamState",
    "ThreadLimits",
    "UnsupportedSourceError",
    "WriteSource",
    "WriterFailedError",
    "WriterState",
    "WriterStats",
    "WrongEventLoopError",
    "bridge_reader",
    "coerce_source",
    "configure_memory",
    "configure_metrics",
    "configure_threads",
    "file_source",
    "ingest",
    "iterate_reader",
    "memory_limits",
    "open_dataset",
    "replayable",
    "resolve_source",
    "write_dataset",
]


def __getattr__(name: str) -> Any:
    module = _LOCATIONS.get(name)
    if module is None:
        raise AttributeError(f"module 'lance_async' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def _is_the_command() -> bool:
    """True when this process is the ``lance-async`` command (it imports pylance itself)."""
    if _sys.argv and _os.path.basename(_sys.argv[0]).startswith("lance-async"):
        return True
    argv = list(getattr(_sys, "orig_argv", []))
    return any(
        arg == "-m" and i + 1 < len(argv) and argv[i + 1].startswith("lance_async")
        for i, arg in enumerate(argv)
    )


if not _is_the_command():
    _importlib.import_module(".dataset", __name__)  # pyarrow, pylance, memwal, merge, sources
