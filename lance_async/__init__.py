"""lance_async: Lance (pylance) as a first-class citizen of async Python.

Awaitable merge_insert whose conflict retries replay the source, MemWAL
ingestion with a bounded queue, group commit and durable acks, and LSM reads
-- all without blocking the event loop (asyncio or trio, through anyio).
Every public name is re-exported here; the modules that define them are the
place to read their documentation.
"""

from ._threads import ThreadLimits, configure_threads
from .acks import Ack, PutSummary
from .dataset import AsyncDataset, open_dataset, write_dataset
from .errors import (
    BackpressureTimeoutError,
    ClosedError,
    ConflictError,
    ContentionError,
    DatasetNotFoundError,
    DecodeError,
    InvalidInputError,
    LanceAsyncError,
    SchemaMismatchError,
    SourceChangedError,
    SourceConsumedError,
    SourceError,
    UnsupportedSourceError,
    WriterFailedError,
    WrongEventLoopError,
)
from .feeds import Feed, FileFeed, IngestStats, IterableFeed, Message, ingest
from .files import FileSource, file_source
from .lsm import CompactionResult, ShardSnapshot
from .mem_wal import AsyncShardWriter, WriterState, WriterStats
from .merge import AsyncMergeInsertBuilder, MergeResult
from .router import ShardRouter
from .sources import SourceMode, WriteSource, coerce_source, replayable, resolve_source
from .streams import AsyncBatchStream, StreamState, bridge_reader, iterate_reader

__all__ = [
    "Ack",
    "AsyncBatchStream",
    "AsyncDataset",
    "AsyncMergeInsertBuilder",
    "AsyncShardWriter",
    "BackpressureTimeoutError",
    "ClosedError",
    "CompactionResult",
    "ConflictError",
    "ContentionError",
    "DatasetNotFoundError",
    "DecodeError",
    "Feed",
    "FileFeed",
    "FileSource",
    "IngestStats",
    "InvalidInputError",
    "IterableFeed",
    "LanceAsyncError",
    "MergeResult",
    "Message",
    "PutSummary",
    "SchemaMismatchError",
    "ShardRouter",
    "ShardSnapshot",
    "SourceChangedError",
    "SourceConsumedError",
    "SourceError",
    "SourceMode",
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
    "configure_threads",
    "file_source",
    "ingest",
    "iterate_reader",
    "open_dataset",
    "replayable",
    "resolve_source",
    "write_dataset",
]
