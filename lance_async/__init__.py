"""lance_async: Lance (pylance) as a first-class citizen of async Python.

Awaitable merge_insert whose conflict retries replay the source, MemWAL
ingestion with a bounded queue, group commit and durable acks, and LSM reads
that see every durable row from any process -- all without blocking the event
loop (asyncio or trio, through anyio).

Every public name is listed once, below, as a re-export from the module that
defines it (anyio's pattern; the modules are the place to read their
documentation). ``__all__`` and the lazy loading of each name (PEP 562) are
derived from that one list.

``import lance_async`` also loads pyarrow, pylance and the modules that call
them, so that the first engine call made on an event loop does not stall it
importing them; the optional parts (feeds, web, the command) load on first
use. The ``lance-async`` command is the exception: it must set ``LANCE_LOG``
before pylance loads, so when this process is the command nothing is loaded
ahead (see :func:`_is_the_command`).
"""

from __future__ import annotations

import ast as _ast
import importlib as _importlib
import os as _os
import sys as _sys
from pathlib import Path as _Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the public names, once each
    from ._memory import MemoryLimits as MemoryLimits
    from ._memory import MemoryStats as MemoryStats
    from ._memory import configure_memory as configure_memory
    from ._memory import memory_limits as memory_limits
    from ._memory import memory_stats as memory_stats
    from ._memory import release_memory as release_memory
    from ._metrics import configure_metrics as configure_metrics
    from ._threads import ThreadLimits as ThreadLimits
    from ._threads import configure_threads as configure_threads
    from .dataset import AsyncBlobFile as AsyncBlobFile
    from .dataset import AsyncBranches as AsyncBranches
    from .dataset import AsyncDataset as AsyncDataset
    from .dataset import AsyncDelta as AsyncDelta
    from .dataset import AsyncFragment as AsyncFragment
    from .dataset import AsyncSqlQuery as AsyncSqlQuery
    from .dataset import AsyncTags as AsyncTags
    from .dataset import CommitBatchResult as CommitBatchResult
    from .dataset import open_dataset as open_dataset
    from .dataset import write_dataset as write_dataset
    from .errors import BackpressureTimeoutError as BackpressureTimeoutError
    from .errors import ClosedError as ClosedError
    from .errors import ConflictError as ConflictError
    from .errors import ContentionError as ContentionError
    from .errors import DatasetNotFoundError as DatasetNotFoundError
    from .errors import DeadLetterError as DeadLetterError
    from .errors import DecodeError as DecodeError
    from .errors import DuplicateKeyError as DuplicateKeyError
    from .errors import FencedError as FencedError
    from .errors import InvalidInputError as InvalidInputError
    from .errors import LanceAsyncError as LanceAsyncError
    from .errors import ManifestFormatError as ManifestFormatError
    from .errors import MergeShapeError as MergeShapeError
    from .errors import ResourceExhaustedError as ResourceExhaustedError
    from .errors import SchemaMismatchError as SchemaMismatchError
    from .errors import SourceChangedError as SourceChangedError
    from .errors import SourceConsumedError as SourceConsumedError
    from .errors import SourceError as SourceError
    from .errors import StaleCompactionError as StaleCompactionError
    from .errors import StorageError as StorageError
    from .errors import StorageFullError as StorageFullError
    from .errors import StorageNotFoundError as StorageNotFoundError
    from .errors import StoragePermissionError as StoragePermissionError
    from .errors import StorageTimeoutError as StorageTimeoutError
    from .errors import StorageUnavailableError as StorageUnavailableError
    from .errors import UnsupportedSourceError as UnsupportedSourceError
    from .errors import ViewExpiredError as ViewExpiredError
    from .errors import WriterFailedError as WriterFailedError
    from .errors import WrongEventLoopError as WrongEventLoopError
    from .errors import WrongShardError as WrongShardError
    from .feeds import Feed as Feed
    from .feeds import FileFeed as FileFeed
    from .feeds import IngestStats as IngestStats
    from .feeds import IterableFeed as IterableFeed
    from .feeds import Message as Message
    from .feeds import ingest as ingest
    from .lsm import CoalescerStats as CoalescerStats
    from .lsm import LevelCacheStats as LevelCacheStats
    from .lsm import LsmReader as LsmReader
    from .lsm import LsmSnapshot as LsmSnapshot
    from .lsm import ShardSnapshot as ShardSnapshot
    from .memwal import Ack as Ack
    from .memwal import AsyncShardWriter as AsyncShardWriter
    from .memwal import CleanupPlan as CleanupPlan
    from .memwal import CleanupStats as CleanupStats
    from .memwal import CompactionPolicy as CompactionPolicy
    from .memwal import CompactionResult as CompactionResult
    from .memwal import Compactor as Compactor
    from .memwal import CompactorStats as CompactorStats
    from .memwal import PutSummary as PutSummary
    from .memwal import ShardCheck as ShardCheck
    from .memwal import ShardRouter as ShardRouter
    from .memwal import WriterOptions as WriterOptions
    from .memwal import WriterState as WriterState
    from .memwal import WriterStats as WriterStats
    from .memwal import cleanup_table as cleanup_table
    from .merge import AsyncMergeInsertBuilder as AsyncMergeInsertBuilder
    from .merge import MergeResult as MergeResult
    from .merge import MergeStatistics as MergeStatistics
    from .sources import AsyncBatchStream as AsyncBatchStream
    from .sources import FileSource as FileSource
    from .sources import SourceMode as SourceMode
    from .sources import StreamState as StreamState
    from .sources import WriteSource as WriteSource
    from .sources import bridge_reader as bridge_reader
    from .sources import coerce_source as coerce_source
    from .sources import file_source as file_source
    from .sources import iterate_reader as iterate_reader
    from .sources import replayable as replayable
    from .sources import resolve_source as resolve_source


def _exports() -> dict[str, str]:
    """Each public name and its module, read from the re-exports above."""
    tree = _ast.parse(_Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, _ast.If))
    return {
        alias.asname or alias.name: "." + (node.module or "")
        for node in block.body
        if isinstance(node, _ast.ImportFrom)
        for alias in node.names
    }


_LOCATIONS: dict[str, str] = _exports()
__all__ = sorted(_LOCATIONS)  # derived from the one list above


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
    """True when this process is the ``lance-async`` command, which sets
    ``LANCE_LOG`` before it imports pylance itself (the console script
    imports this package first, so it is told apart by its argv)."""
    if _sys.argv and _os.path.basename(_sys.argv[0]).startswith("lance-async"):
        return True
    argv = list(getattr(_sys, "orig_argv", []))
    return any(
        arg == "-m" and i + 1 < len(argv) and argv[i + 1].startswith("lance_async")
        for i, arg in enumerate(argv)
    )


if not _is_the_command():
    from ._enginelog import quiet_engine_log as _quiet_engine_log

    _quiet_engine_log()  # before pylance reads LANCE_LOG (see _enginelog.py)
    _importlib.import_module(".dataset", __name__)  # pyarrow, pylance, lsm, memwal, merge
