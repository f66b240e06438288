"""Background compaction: :class:`CompactionPolicy` and the :class:`Compactor` that runs it.

LSM reads slow down with every flushed generation they must consult; after a
sustained ingest a shard can hold dozens. A :class:`Compactor` watches the
shards of one table and compacts a shard as soon as it holds more than
``policy.max_generations`` flushed generations (or more than
``policy.max_bytes`` of them on disk), so reads stay bounded while ingest
runs. It is the job a Paimon or RocksDB writer hands to its background
compaction thread, done here from a task in the caller's task group:

* one compaction per table at a time (shared with :func:`compact_mem_wal`);
* a commit lost to a concurrent writer is retried with backoff
  (merge_insert replays the immutable SSTables: nothing is buffered);
* ingestion is never blocked: puts go to the MemWAL, the compaction commits
  to the base table, and the two meet only in the engine's thread pool;
* nothing is lost or resurrected, whoever else compacts (``compaction.py``: one
  commit per shard, refused by the engine when another compaction was first);
* :meth:`Compactor.stats` tells what it did.

Run it standalone (``async with Compactor(dataset, policy):``), from a task
group you own (``await compactor.start(task_group)``), or let the routing
writer run it (``dataset.mem_wal_writer(compaction=CompactionPolicy())``).
"""

from __future__ import annotations

import logging
import math
import posixpath
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import timedelta

import anyio
import pyarrow.fs as pafs
from anyio.abc import TaskGroup

from .._args import check_timedelta
from .._loop import unwrap_groups
from .._memory import memory_freed
from .._retry import Backoff
from .._storage import filesystem
from .._table import Table
from .._threads import call_timeouts, run_sync
from ..errors import ClosedError, ConflictError, LanceAsyncError
from ..lsm.snapshots import ShardSnapshot, shard_snapshots
from .cleanup import DEFAULT_RETENTION, CleanupStats, cleanup_table
from .compaction import CompactionResult, compact_shard, optimize_after, table_lock
from .stats import WriterState

__all__ = ["CompactionPolicy", "Compactor", "CompactorStats"]

log = logging.getLogger("lance_async.memwal")
_sizes: dict[str, int] = {}  # generation folder -> bytes (folders never change); bounded
_SIZES = 4096


@dataclass(frozen=True)
class CompactionPolicy:
    """When a shard's flushed generations are compacted into the base table.

    Attributes
    ----------
    max_generations : int
        Compact a shard once it holds more than this many flushed
        generations (default 8). 0 compacts every generation at once.
    max_bytes : int, optional
        Or once its flushed generations take more than this many bytes on
        disk (default None: generations only).
    interval : float
        Seconds between two looks at the shard manifests (default 1.0).
    max_backoff : float
        Longest wait after failed attempts, in seconds (doubling from
        ``interval``; default 30).
    optimize_indices : bool
        Bring the table's indexes up to date after each compaction (default
        True; one more commit).
    chunk_rows : int
        Rows per batch read from an SSTable (default 65,536).
    retention : timedelta or None
        Clean up what no reader inside this window needs (default one
        hour: :func:`~lance_async.memwal.cleanup.cleanup_table` -- superseded
        base versions, compacted generation folders, flushed WAL entries, old
        shard manifests). None: never clean up (the table grows).
    cleanup_interval : float
        Seconds between two clean-ups (default 60; the first one this long
        after the start).

    Raises
    ------
    ValueError
        A negative count, a non-positive interval.
    TypeError
        A retention that is not a timedelta.
    """

    max_generations: int = 8
    max_bytes: int | None = None
    interval: float = 1.0
    max_backoff: float = 30.0
    optimize_indices: bool = True
    chunk_rows: int = 65_536
    retention: timedelta | None = DEFAULT_RETENTION
    cleanup_interval: float = 60.0

    def __post_init__(self) -> None:
        if self.max_generations < 0:
            raise ValueError("max_generations must be >= 0")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if not (self.interval > 0 and math.isfinite(self.interval)):
            raise ValueError("interval must be a positive number of seconds")
        if self.max_backoff < self.interval:
            raise ValueError("max_backoff must be >= interval")
        if self.chunk_rows < 1:
            raise ValueError("chunk_rows must be >= 1")
        if self.retention is not None:
            check_timedelta("retention", self.retention)
        if not (self.cleanup_interval > 0 and math.isfinite(self.cleanup_interval)):
            raise ValueError("cleanup_interval must be a positive number of seconds")


@dataclass(frozen=True)
class CompactorStats:
    """What a :class:`Compactor` has done.

    Attributes
    ----------
    state : WriterState
    passes : int
        Looks at the shard manifests.
    compactions : int
        Shards compacted (each: one commit, plus an index update).
    generations : int
        Flushed generations merged into the base table.
    rows_upserted, rows_deleted : int
    commits : int
    conflicts : int
        Compactions lost to a concurrent writer, retried later.
    stale : int
        Compactions that another compactor (any process) beat to the same
        generations: nothing committed, nothing to retry.
    failures : int
        Other failed attempts (logged; retried with backoff).
    last_error : BaseException or None
    busy_seconds : float
        Time spent compacting.
    last_version : int
        The dataset version of the last compaction (0 before any).
    cleanups : int
        Clean-ups run (``policy.retention``).
    versions_removed, generations_removed, wal_entries_removed, manifests_removed : int
        What they removed, in total.
    cleanup_failures : int
        Clean-ups that failed (logged; tried again at the next interval).
    """

    state: WriterState
    passes: int = 0
    compactions: int = 0
    generations: int = 0
    rows_upserted: int = 0
    rows_deleted: int = 0
    commits: int = 0
    conflicts: int = 0
    stale: int = 0
    failures: int = 0
    last_error: BaseException | None = None
    busy_seconds: float = 0.0
    last_version: int = 0
    cleanups: int = 0
    versions_removed: int = 0
    generations_removed: int = 0
    wal_entries_removed: int = 0
    manifests_removed: int = 0
    cleanup_failures: int = 0


def _folder_bytes(
    uri: str, shard_id: str, path: str, storage_options: dict[str, str] | None = None
) -> int:
    """Bytes on disk of one generation folder (blocking; cached, folders never change)."""
    fs, root = filesystem(uri, storage_options)
    folder = posixpath.join(root, "_mem_wal", shard_id, path)
    if folder not in _sizes:
        infos = fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
        if len(_sizes) >= _SIZES:  # a clean-up removes folders: forget the oldest
            _sizes.pop(next(iter(_sizes)))
        _sizes[folder] = sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)
    return _sizes[folder]


class Compactor:
    """Compacts a table's flushed MemWAL generations in the background.

    Parameters
    ----------
    dataset : AsyncDataset
        The table (moved to each version a compaction commits).
    policy : CompactionPolicy, optional
        Default ``CompactionPolicy()``.
    shard_ids : iterable of str, or a callable returning them, optional
        Only these shards (default every shard). A callable is asked at
        every pass: a cluster worker passes the shards it owns now.

    Notes
    -----
    Use it as ``async with`` (it owns its task) or call :meth:`start` with a
    task group and :meth:`aclose` before the group ends. Closing cancels the
    task; a compaction in flight stops after its current engine call, and its
    commits (each atomic) are either in or out. Failures are logged, counted
    in :meth:`stats` and retried with backoff; an error that is not about
    the engine, storage or data (a bug) ends the task and reaches the task
    group.
    """

    def __init__(
        self,
        dataset: Table,
        policy: CompactionPolicy | None = None,
        *,
        shard_ids: Iterable[str] | Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self._dataset = dataset
        self.policy = policy or CompactionPolicy()
        self._shard_ids: list[str] | Callable[[], Iterable[str]] | None = (
            shard_ids if shard_ids is None or callable(shard_ids) else list(shard_ids)
        )
        self._stats = CompactorStats(WriterState.NEW)
        self._scope = anyio.CancelScope()
        self._done: anyio.Event | None = None
        self._tg: TaskGroup | None = None
        self._wake: anyio.Event | None = None

    def __repr__(self) -> str:
        return f"<Compactor {self._dataset.uri!r} state={self._stats.state.value}>"

    def stats(self) -> CompactorStats:
        """What it has done so far (does not block)."""
        return self._stats

    # -- life cycle ---------------------------------------------------------------
    async def __aenter__(self) -> Compactor:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            await self.start(tg)
        except BaseException:
            self._tg = None
            await tg.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self, task_group: TaskGroup) -> Compactor:
        """Start the compaction task in ``task_group``; :meth:`aclose` it before the group ends.

        Raises
        ------
        ClosedError
            Started before.
        """
        if self._stats.state is not WriterState.NEW:
            raise ClosedError(f"{self!r} was already started")
        self._done = anyio.Event()
        self._wake = anyio.Event()
        self._stats = replace(self._stats, state=WriterState.OPEN)
        task_group.start_soon(self._run, name=f"lance_async compactor {self._dataset.uri}")
        return self

    async def aclose(self) -> None:
        """Stop the task (safe to call twice); waits for it, shielded from cancellation."""
        if self._stats.state in (WriterState.CLOSED, WriterState.NEW):
            self._stats = replace(self._stats, state=WriterState.CLOSED)
            return
        self._stats = replace(self._stats, state=WriterState.CLOSING)
        self._scope.cancel()
        try:
            with anyio.CancelScope(shield=True):
                assert self._done is not None
                await self._done.wait()
        finally:
            self._stats = replace(self._stats, state=WriterState.CLOSED)
            if self._tg is not None:
                tg, self._tg = self._tg, None
                with unwrap_groups():
                    await tg.__aexit__(None, None, None)

    def wake(self) -> None:
        """Look at the shards now instead of at the end of the interval (does not block)."""
        if self._wake is not None:
            self._wake.set()

    # -- the task -------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._done is not None
        try:
            with self._scope:
                wait = self.policy.interval
                backoff = Backoff(2 * self.policy.interval, self.policy.max_backoff)
                cleanup_at = anyio.current_time() + self.policy.cleanup_interval
                while True:
                    try:
                        await self.run_once()
                        backoff.reset()
                        wait = self.policy.interval
                    except (LanceAsyncError, OSError) as exc:
                        wait = backoff.failed()
                        log.warning("lance_async: %r: compaction failed (%s); retrying", self, exc)
                    if self.policy.retention is not None and anyio.current_time() >= cleanup_at:
                        await self._cleanup_logged()
                        cleanup_at = anyio.current_time() + self.policy.cleanup_interval
                    with anyio.move_on_after(wait):
                        assert self._wake is not None
                        await self._wake.wait()
                    self._wake = anyio.Event()
        finally:
            self._done.set()

    async def _cleanup_logged(self) -> None:
        try:
            await self.cleanup_once()
        except (LanceAsyncError, OSError) as exc:
            log.warning("lance_async: %r: clean-up failed (%s); trying again later", self, exc)

    async def cleanup_once(self) -> CleanupStats:
        """Clean up once now with ``policy.retention`` (default one hour when None).

        Returns
        -------
        CleanupStats
            What was removed (counted in :meth:`stats` too).

        Raises
        ------
        LanceAsyncError, OSError
            The clean-up failed (counted); what it removed before stays removed.
        """
        retention = self.policy.retention
        wanted = self._shard_ids() if callable(self._shard_ids) else self._shard_ids
        try:
            with call_timeouts(self._dataset.storage_timeout):
                done = await cleanup_table(
                    self._dataset,
                    DEFAULT_RETENTION if retention is None else retention,
                    shard_ids=None if wanted is None else list(wanted),
                )
        except (LanceAsyncError, OSError) as exc:
            self._count(cleanup_failures=1, last_error=exc)
            raise
        self._count(
            cleanups=1,
            versions_removed=done.old_versions,
            generations_removed=done.generations_removed,
            wal_entries_removed=done.wal_entries_removed,
            manifests_removed=done.manifests_removed,
        )
        return done

    async def _due(self, snap: ShardSnapshot) -> bool:
        policy = self.policy
        if not snap.sstables:
            return False
        if len(snap.sstables) > policy.max_generations:
            return True
        if policy.max_bytes is None:
            return False
        uri, sid, options = self._dataset.uri, snap.shard_id, self._dataset.storage_options

        def size() -> int:
            return sum(_folder_bytes(uri, sid, path, options) for _g, path in snap.sstables)

        return await run_sync(size) > policy.max_bytes

    async def run_once(self) -> CompactionResult:
        """Look at the shards once and compact those the policy says are due.

        Returns
        -------
        CompactionResult
            What this pass did (counted in :meth:`stats` too).

        Raises
        ------
        LanceAsyncError, OSError
            A failed compaction (counted; what committed before stays);
            :class:`~lance_async.StorageTimeoutError` when an engine call
            waits on the store past the dataset's ``storage_timeout`` (each
            call has that deadline).
        """
        with call_timeouts(self._dataset.storage_timeout):  # each engine call
            return await self._pass()

    async def _pass(self) -> CompactionResult:
        ds = self._dataset
        done: dict[str, list[int]] = {}
        stale: list[str] = []
        upserted = deleted = commits = attempts = 0
        self._count(passes=1)
        wanted = self._shard_ids() if callable(self._shard_ids) else self._shard_ids
        if wanted is not None:
            wanted = list(wanted)
            if not wanted:
                return CompactionResult({}, 0, 0, 0, 0, ds.version)
        async with table_lock(ds.uri):
            try:
                snapshots = await shard_snapshots(ds, wanted)
            except (LanceAsyncError, OSError) as exc:
                self._count(failures=1, last_error=exc)
                raise
            for snap in snapshots:
                started = time.monotonic()
                try:
                    if not await self._due(snap):
                        continue
                    one = await compact_shard(ds, snap, chunk_rows=self.policy.chunk_rows)
                    optimized = (
                        one.commits > 0
                        and self.policy.optimize_indices
                        and await optimize_after(ds)
                    )
                except ConflictError as exc:
                    self._count(conflicts=1, last_error=exc)
                    raise
                except (LanceAsyncError, OSError) as exc:
                    self._count(failures=1, last_error=exc)
                    raise
                finally:
                    self._count(busy_seconds=time.monotonic() - started)
                if one.stale:
                    stale.append(snap.shard_id)
                    self._count(stale=1)
                    continue
                cm = one.commits + int(optimized)
                done[snap.shard_id] = one.generations
                upserted, deleted = upserted + one.rows_upserted, deleted + one.rows_deleted
                commits, attempts = commits + cm, attempts + one.attempts
                self._count(
                    compactions=1,
                    generations=len(one.generations),
                    rows_upserted=one.rows_upserted,
                    rows_deleted=one.rows_deleted,
                    commits=cm,
                    last_version=ds.version,
                )
        if done:
            memory_freed()  # the merges' working memory, the generations read
        return CompactionResult(done, upserted, deleted, commits, attempts, ds.version, stale)

    def _count(self, **changes: object) -> None:
        s = self._stats
        values = {
            name: (value if name in ("last_error", "last_version") else getattr(s, name) + value)
            for name, value in changes.items()
        }
        self._stats = replace(s, **values)  # type: ignore[arg-type]
