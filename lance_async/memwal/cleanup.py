"""Storage that stays bounded: the MemWAL's garbage collector (:func:`cleanup_table`).

Neither the engine nor ``LanceDataset.cleanup_old_versions`` removes a
MemWAL's WAL entries, its compacted generation folders or its old shard
manifests, so without this a table under steady ingest grows for ever
(tens of thousands of WAL objects an hour). Lance's MemWAL spec names the
job ("Background Job Expectations": the garbage collector) and leaves it to
the implementation; these are lance_async's rules, the same retention
rules as Lance's version clean-up, extended to the MemWAL's files:

Base versions
    A version is kept while it is the latest, tagged, or was *superseded*
    less than ``retention`` ago (so a reader that opened it inside the
    retention still has it, however old the version itself is). The rest
    go through the engine's own ``cleanup_old_versions(versions=...)``.
Compacted generations
    A generation folder goes once every kept base version has it compacted
    (``compacted_sstables`` in the MemWAL index of each version at or above
    it). A reader of any kept version reads the generations above that
    version's compacted mark, never one at or below every kept mark.
Shard manifests
    A manifest version is kept while it is the newest or was superseded
    less than ``retention`` ago (a reader may have read it then).
WAL entries
    An entry goes once it is at or below the flushed position
    (``replay_after_wal_entry_position``) of every kept manifest: its rows
    are in a generation each of those manifests lists, and no reader or
    writer reads below its manifest's position. **Fence sentinels stay**:
    the engine fences a stalled writer only because its next WAL write
    collides with its successor's sentinel (put-if-absent); with the
    sentinel gone, the stalled writer's next puts would land in the hole
    and be acknowledged, and lost (measured: the spec's warning is real).
    A sentinel is removed only once it is older than ``fence_retention``
    (default one hour: a writer stalled longer than that, then resuming,
    could have puts acknowledged that no reader sees) and a newer one
    exists. Each writer claim of a shard writes one, so a shard keeps
    about one per claim of the last hour.

A read holding a view older than the retention gets correct rows or
:class:`~lance_async.errors.ViewExpiredError`, never missing rows (the LSM
reads check; ``lance_async.lsm.wal`` and ``lance_async.lsm.reader``).

Time is the clock of this process against the store's modification times:
keep the retention well above any clock skew between them.
"""

from __future__ import annotations

import logging
import posixpath
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from .._args import check_timedelta
from .._storage import filesystem
from .._table import Table
from .._threads import run_engine
from ..lsm.manifest import (
    ManifestFile,
    compacted_generations,
    list_shards,
    manifest_files,
    parse_position,
    read_manifest_file,
)
from ..lsm.snapshots import retired_shards
from ..lsm.walfiles import checkpoint_files

__all__ = [
    "DEFAULT_RETENTION",
    "ENGINE_DEFAULT_AGE",
    "FENCE_RETENTION",
    "CleanupPlan",
    "CleanupStats",
    "ShardCleanup",
    "cleanup_table",
    "engine_stats",
    "execute_plan",
    "plan_cleanup",
    "version_seconds",
    "with_engine_counts",
]

log = logging.getLogger("lance_async.memwal")

DEFAULT_RETENTION = timedelta(hours=1)
"""How long a superseded version, shard manifest or WAL entry stays by default."""
FENCE_RETENTION = timedelta(hours=1)
"""How long a fence sentinel stays once a newer one exists (a writer stalled longer
than this is assumed gone)."""

ENGINE_DEFAULT_AGE = timedelta(days=14)
"""pylance's ``cleanup_old_versions`` age without ``older_than`` or ``retain_versions``."""

_GENERATION = re.compile(r"^[0-9a-f]{8}_gen_(\d+)$")
_DELETE_THREADS = 16  # concurrent deletions (object stores: one request each)
_CHUNK = 512  # files deleted per worker-thread call (each call has the storage deadline)


@dataclass(frozen=True)
class ShardCleanup:
    """What the clean-up removes from (or keeps in) one shard.

    Attributes
    ----------
    shard_id : str
    wal_entries : tuple of int
        WAL positions removed.
    generations : tuple of str
        Generation folders removed (relative to the shard folder).
    manifests : tuple of int
        Shard manifest versions removed.
    wal_floor : int
        Entries at or below are flushed in every kept manifest.
    generation_floor : int
        Generations at or below are compacted in every kept base version.
    wal_left, generations_left, manifests_left : int
        What stays.
    fences_kept : int
        Fence sentinels at or below the floor that stay (see the module notes).
    checkpoints : int
        lance_async's WAL-tail checkpoints removed (covering only flushed entries).
    bytes : int
        Bytes of the WAL entries and manifests removed (generation folders
        are counted when removed).
    """

    shard_id: str
    wal_entries: tuple[int, ...] = ()
    generations: tuple[str, ...] = ()
    manifests: tuple[int, ...] = ()
    wal_floor: int = 0
    generation_floor: int = 0
    wal_left: int = 0
    generations_left: int = 0
    manifests_left: int = 0
    fences_kept: int = 0
    checkpoints: int = 0
    bytes: int = 0
    _paths: tuple[str, ...] = field(default=(), repr=False, compare=False)
    _manifest_paths: tuple[str, ...] = field(default=(), repr=False, compare=False)
    _folders: tuple[str, ...] = field(default=(), repr=False, compare=False)


@dataclass(frozen=True)
class CleanupPlan:
    """What a clean-up removes, decided before anything is removed.

    Attributes
    ----------
    cutoff : float
        Seconds since the epoch: a view opened after it is protected.
    base_versions : tuple of int
        Base-table versions removed (their files go through the engine).
    retained_versions : tuple of int
        Base-table versions kept.
    shards : tuple of ShardCleanup
    """

    cutoff: float
    base_versions: tuple[int, ...]
    retained_versions: tuple[int, ...]
    shards: tuple[ShardCleanup, ...] = ()

    @property
    def wal_entries(self) -> int:
        """WAL entries removed, over every shard."""
        return sum(len(s.wal_entries) for s in self.shards)

    @property
    def generations(self) -> int:
        """Generation folders removed, over every shard."""
        return sum(len(s.generations) for s in self.shards)

    @property
    def manifests(self) -> int:
        """Shard manifest versions removed, over every shard."""
        return sum(len(s.manifests) for s in self.shards)

    def lines(self) -> list[str]:
        """The plan as lines of text, one per thing removed (for a dry run)."""
        out = [f"base version {v}" for v in self.base_versions]
        for s in self.shards:
            out += [f"{s.shard_id}/{g}/" for g in s.generations]
            out += [f"{s.shard_id}/manifest/version {m}" for m in s.manifests]
            out += [f"{s.shard_id}/wal/{p}" for p in _ranges(s.wal_entries)]
            if s.checkpoints:
                out.append(f"{s.shard_id}/lance_async_tail/ ({s.checkpoints} checkpoint(s))")
        return out


@dataclass(frozen=True)
class CleanupStats:
    """What a clean-up removed (or, with ``dry_run``, would remove).

    The first fields are pylance's ``CleanupStats`` (the base table's); the
    rest are the MemWAL's.

    Attributes
    ----------
    bytes_removed : int
        Bytes of the base table's files removed (the engine's count).
    old_versions : int
        Base versions removed.
    data_files_removed, transaction_files_removed, index_files_removed, deletion_files_removed : int
        The engine's counts.
    failed_deletes : int
        Deletions that failed (base and MemWAL; the next clean-up tries again).
    wal_entries_removed, generations_removed, manifests_removed : int
    mem_wal_bytes_removed : int
    dry_run : bool
        Nothing was removed; the counts say what would be.
    plan : CleanupPlan
    """

    bytes_removed: int = 0
    old_versions: int = 0
    data_files_removed: int = 0
    transaction_files_removed: int = 0
    index_files_removed: int = 0
    deletion_files_removed: int = 0
    failed_deletes: int = 0
    wal_entries_removed: int = 0
    generations_removed: int = 0
    manifests_removed: int = 0
    mem_wal_bytes_removed: int = 0
    dry_run: bool = False
    plan: CleanupPlan | None = None


def engine_stats(stats: Any) -> CleanupStats:
    """pylance's ``CleanupStats`` as a :class:`CleanupStats` (the MemWAL's counts 0)."""

    def count(name: str) -> int:
        return int(getattr(stats, name, 0) or 0)

    return CleanupStats(
        bytes_removed=count("bytes_removed"),
        old_versions=count("old_versions"),
        data_files_removed=count("data_files_removed"),
        transaction_files_removed=count("transaction_files_removed"),
        index_files_removed=count("index_files_removed"),
        deletion_files_removed=count("deletion_files_removed"),
        failed_deletes=count("failed_deletes"),
    )


def with_engine_counts(gc: CleanupStats, base: CleanupStats) -> CleanupStats:
    """``gc`` (the MemWAL's counts) with ``base``'s engine counts added."""
    return CleanupStats(
        bytes_removed=gc.bytes_removed + base.bytes_removed,
        old_versions=gc.old_versions + base.old_versions,
        data_files_removed=gc.data_files_removed + base.data_files_removed,
        transaction_files_removed=gc.transaction_files_removed + base.transaction_files_removed,
        index_files_removed=gc.index_files_removed + base.index_files_removed,
        deletion_files_removed=gc.deletion_files_removed + base.deletion_files_removed,
        failed_deletes=gc.failed_deletes + base.failed_deletes,
        wal_entries_removed=gc.wal_entries_removed,
        generations_removed=gc.generations_removed,
        manifests_removed=gc.manifests_removed,
        mem_wal_bytes_removed=gc.mem_wal_bytes_removed,
        dry_run=gc.dry_run,
        plan=gc.plan,
    )


def version_seconds(version: Mapping[str, Any]) -> float:
    """A ``versions()`` entry's timestamp (pylance: a naive local datetime) in
    seconds since the epoch."""
    return float(version["timestamp"].timestamp())


def _ranges(positions: Sequence[int]) -> list[str]:
    """``[1, 2, 3, 7]`` as ``["1-3", "7"]``."""
    out: list[str] = []
    start = prev = None
    for p in positions:
        if start is not None and prev is not None and p == prev + 1:
            prev = p
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = p
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return out


# -- the base table ------------------------------------------------------------------


def retained_base(ds: Any, cutoff: float) -> tuple[list[int], list[int]]:
    """(kept, removed) base versions: latest, tagged, or superseded after ``cutoff`` (blocking)."""
    versions = sorted(ds.versions(), key=lambda v: int(v["version"]))
    tagged = {int(t["version"]) for t in ds.tags.list().values() if t.get("version") is not None}
    kept, removed = [], []
    for i, v in enumerate(versions):
        number = int(v["version"])
        superseded = version_seconds(versions[i + 1]) if i + 1 < len(versions) else None
        if superseded is None or number in tagged or superseded >= cutoff:
            kept.append(number)
        else:
            removed.append(number)
    return kept, removed


def _generation_floors(
    uri: str, versions: Iterable[int], options: Mapping[str, str] | None
) -> dict[str, int]:
    """Per shard, the lowest compacted generation over ``versions`` (0: absent from one)."""
    floors: dict[str, int] | None = None
    for v in versions:
        marks = compacted_generations(uri, v, options)
        if floors is None:
            floors = dict(marks)
        else:
            floors = {s: min(g, marks[s]) for s, g in floors.items() if s in marks}
    return floors or {}


# -- one shard ---------------------------------------------------------------------------

_meta_lock = threading.Lock()
_meta: dict[str, tuple[int, bool]] = {}  # WAL entry path -> (epoch, fence sentinel); bounded


def _entry_meta(fs: pafs.FileSystem, path: str) -> tuple[int, bool]:
    """(writer epoch, is a fence sentinel) of a WAL entry: its schema message only."""
    with _meta_lock:
        hit = _meta.get(path)
    if hit is not None:
        return hit
    with fs.open_input_stream(path) as f, pa.ipc.open_stream(f) as reader:
        meta = reader.schema.metadata or {}
    found = (int(meta.get(b"writer_epoch", b"0")), meta.get(b"fence_sentinel") == b"true")
    with _meta_lock:
        if len(_meta) >= 4096:
            _meta.pop(next(iter(_meta)))
        _meta[path] = found
    return found


def _epoch_starts(fs: pafs.FileSystem, paths: list[str]) -> list[int]:
    """Indexes in ``paths`` (WAL entries in position order) where a writer epoch
    begins: epochs never decrease along the WAL, so a binary search reads
    about ``log2(n)`` entries per epoch, not every entry."""
    if not paths:
        return []
    starts = [0]
    epochs: dict[int, int] = {}

    def epoch(i: int) -> int:
        if i not in epochs:
            epochs[i] = _entry_meta(fs, paths[i])[0]
        return epochs[i]

    stack = [(0, len(paths) - 1)]
    while stack:
        lo, hi = stack.pop()
        if lo >= hi or epoch(lo) == epoch(hi):
            continue
        if hi == lo + 1:
            starts.append(hi)
            continue
        mid = (lo + hi) // 2
        stack += [(lo, mid), (mid, hi)]
    return sorted(starts)


def plan_shard(
    uri: str,
    shard_id: str,
    generation_floor: int,
    cutoff: float,
    fence_cutoff: float,
    options: Mapping[str, str] | None = None,
) -> ShardCleanup | None:
    """What to remove from one shard (blocking; reads listings and a few headers).

    Returns None for a shard without a manifest (nothing is decided for it).
    """
    files = manifest_files(uri, shard_id, options)
    if not files:
        return None
    kept: list[ManifestFile] = []
    dropped: list[ManifestFile] = []
    for i, f in enumerate(files):
        newest = i == len(files) - 1
        (kept if newest or files[i + 1].mtime >= cutoff else dropped).append(f)
    manifests = [read_manifest_file(uri, shard_id, f, options) for f in kept]
    wal_floor = min(m.replay_after for m in manifests)
    fs, root = filesystem(uri, options)
    folder = f"{root}/_mem_wal/{shard_id}"
    entries: list[tuple[int, pafs.FileInfo]] = []
    try:
        wal_infos = fs.get_file_info(pafs.FileSelector(f"{folder}/wal", allow_not_found=True))
    except FileNotFoundError:
        wal_infos = []
    for info in wal_infos:
        position = parse_position(info.base_name, ".arrow")
        if position is not None and info.type == pafs.FileType.File:
            entries.append((position, info))
    entries.sort(key=lambda e: e[0])
    below = [e for e in entries if e[0] <= wal_floor]
    keep: set[int] = set()
    starts = _epoch_starts(fs, [info.path for _p, info in below])
    sentinels = [i for i in starts if _entry_meta(fs, below[i][1].path)[1]]
    newest_start = max(sentinels) if sentinels else None
    for i in sentinels:
        mtime = (below[i][1].mtime_ns or 0) / 1e9
        if i == newest_start or mtime >= fence_cutoff:
            keep.add(below[i][0])
    gone = [(p, info) for p, info in below if p not in keep]
    spent = [p for _, last, p in checkpoint_files(fs, folder) if last <= wal_floor]  # flushed
    generations: list[str] = []
    left = 0
    for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
        match = _GENERATION.match(info.base_name)
        if match is None or info.type != pafs.FileType.Directory:
            continue
        if int(match.group(1)) <= generation_floor:
            generations.append(info.base_name)
        else:
            left += 1
    generations.sort(key=lambda name: int(name.rsplit("_", 1)[1]))
    return ShardCleanup(
        shard_id,
        wal_entries=tuple(p for p, _ in gone),
        generations=tuple(generations),
        manifests=tuple(f.version for f in dropped),
        wal_floor=wal_floor,
        generation_floor=generation_floor,
        wal_left=len(entries) - len(gone),
        generations_left=left,
        manifests_left=len(kept),
        fences_kept=len(keep),
        checkpoints=len(spent),
        bytes=sum(info.size or 0 for _, info in gone) + sum(f.size for f in dropped),
        _paths=tuple(info.path for _, info in gone) + tuple(spent),
        _manifest_paths=tuple(f.path for f in dropped),
        _folders=tuple(posixpath.join(folder, g) for g in generations),
    )


def _plan(
    ds: Any,
    uri: str,
    options: Mapping[str, str] | None,
    cutoff: float,
    fence_cutoff: float,
    retained: list[int] | None,
    removed: list[int] | None,
) -> tuple[list[int], list[int], list[str], dict[str, int]]:
    """The base half of a plan, and the shards to look at (blocking)."""
    if retained is None or removed is None:
        retained, removed = retained_base(ds, cutoff)
    latest = ds.checkout_version(max(retained)) if ds.version != max(retained) else ds
    if latest.mem_wal_index_details() is None:
        return retained, removed, [], {}
    retired = retired_shards(latest)
    floors = _generation_floors(uri, retained, options)
    shards = [s for s in list_shards(uri, options) if s not in retired]
    return retained, removed, shards, floors


def _delete(fs: pafs.FileSystem, paths: Sequence[str], folders: bool) -> tuple[int, int, int]:
    """(removed, bytes, failed): files or folders removed side by side (blocking)."""

    def one(path: str) -> tuple[int, int, int]:
        try:
            if folders:
                infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
                size = sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)
                fs.delete_dir(path)
                return 1, size, 0
            fs.delete_file(path)
            return 1, 0, 0
        except FileNotFoundError:
            return 0, 0, 0  # another clean-up was first
        except OSError as exc:
            log.warning("lance_async: clean-up could not remove %s (%s)", path, exc)
            return 0, 0, 1

    with ThreadPoolExecutor(max_workers=min(_DELETE_THREADS, max(1, len(paths)))) as pool:
        results = list(pool.map(one, paths))
    return (
        sum(r[0] for r in results),
        sum(r[1] for r in results),
        sum(r[2] for r in results),
    )


def _delete_in_order(fs: pafs.FileSystem, paths: Sequence[str]) -> tuple[int, int, int]:
    """(removed, 0, failed): files removed one after another, in order; the
    first failure stops (the rest stay, for the next clean-up) (blocking)."""
    removed = 0
    for path in paths:
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("lance_async: clean-up could not remove %s (%s)", path, exc)
            return removed, 0, 1
        removed += 1
    return removed, 0, 0


def _base_cleanup(ds: Any, versions: list[int]) -> Any:
    return ds.cleanup_old_versions(versions=versions, error_if_tagged_old_versions=False)


async def plan_cleanup(
    table: Table,
    retention: timedelta = DEFAULT_RETENTION,
    *,
    fence_retention: timedelta = FENCE_RETENTION,
    now: float | None = None,
    retained_versions: tuple[list[int], list[int]] | None = None,
    shard_ids: Iterable[str] | None = None,
) -> CleanupPlan:
    """Decide what a clean-up of ``table`` removes, removing nothing.

    Parameters
    ----------
    table : Table
        An :class:`~lance_async.AsyncDataset`.
    retention : timedelta
        How long a superseded base version, shard manifest and WAL entry
        stays (default one hour; see the module notes).
    fence_retention : timedelta
        How long a fence sentinel stays once a newer one exists (default one hour).
    now : float, optional
        Seconds since the epoch (default: this process's clock); tests pass
        their own.
    retained_versions : (kept, removed), optional
        The base versions, decided by the caller (``cleanup_old_versions``
        after the engine's own clean-up); default by ``retention``.
    shard_ids : iterable of str, optional
        Only these shards' MemWAL files (default every shard's); the base
        versions are the table's either way.

    Returns
    -------
    CleanupPlan

    Raises
    ------
    ValueError, TypeError
        A negative or non-timedelta retention.
    ManifestFormatError
        MemWAL files in a layout this version does not know.
    StorageError
        The store failed a listing or a read.

    Notes
    -----
    Runs on worker threads, one shard per call (each with the table's
    ``storage_timeout``); reads listings, the kept manifests and the schema
    message of a few WAL entries per writer epoch.
    """

    check_timedelta("retention", retention)
    check_timedelta("fence_retention", fence_retention)
    clock = time.time() if now is None else float(now)
    cutoff = clock - retention.total_seconds()
    fence_cutoff = clock - fence_retention.total_seconds()
    uri, options = table.uri, table.storage_options
    kept, removed = retained_versions if retained_versions is not None else (None, None)
    retained, gone, shards, floors = await run_engine(
        partial(_plan, table.lance, uri, options, cutoff, fence_cutoff, kept, removed)
    )
    wanted = None if shard_ids is None else set(shard_ids)
    plans = []
    for sid in shards:
        if wanted is not None and sid not in wanted:
            continue
        one = await run_engine(
            partial(plan_shard, uri, sid, floors.get(sid, 0), cutoff, fence_cutoff, options)
        )
        if one is not None:
            plans.append(one)
    return CleanupPlan(cutoff, tuple(gone), tuple(retained), tuple(plans))


async def execute_plan(table: Table, plan: CleanupPlan, *, base: bool = True) -> CleanupStats:
    """Remove what ``plan`` lists (base versions through the engine, then each
    shard's generation folders, WAL entries and manifests).

    Raises
    ------
    StorageError
        The engine's clean-up of the base versions failed (the MemWAL's own
        failed deletions are counted in ``failed_deletes`` and logged).
    """
    engine = CleanupStats()
    if base and plan.base_versions:
        engine = engine_stats(
            await run_engine(partial(_base_cleanup, table.lance, list(plan.base_versions)))
        )
    fs, _root = filesystem(table.uri, table.storage_options)
    gens = wal = manifests = nbytes = failed = 0
    for shard in plan.shards:
        folders = list(shard._folders)
        for start in range(0, len(folders), _CHUNK):
            n, b, f = await run_engine(partial(_delete, fs, folders[start : start + _CHUNK], True))
            gens, nbytes, failed = gens + n, nbytes + b, failed + f
        paths = list(shard._paths)
        for start in range(0, len(paths), _CHUNK):
            n, _b, f = await run_engine(partial(_delete, fs, paths[start : start + _CHUNK], False))
            wal, failed = wal + n, failed + f
        # manifests one at a time, oldest first: a reader that finds a
        # manifest still there knows every later one is too (lsm/wal.py)
        n, _b, f = await run_engine(partial(_delete_in_order, fs, list(shard._manifest_paths)))
        manifests, failed = manifests + n, failed + f
        nbytes += shard.bytes
    gc = CleanupStats(
        failed_deletes=failed,
        wal_entries_removed=wal,
        generations_removed=gens,
        manifests_removed=manifests,
        mem_wal_bytes_removed=nbytes,
        plan=plan,
    )
    return with_engine_counts(gc, engine)


def _dry_stats(plan: CleanupPlan) -> CleanupStats:
    return CleanupStats(
        old_versions=len(plan.base_versions),
        wal_entries_removed=plan.wal_entries,
        generations_removed=plan.generations,
        manifests_removed=plan.manifests,
        mem_wal_bytes_removed=sum(s.bytes for s in plan.shards),
        dry_run=True,
        plan=plan,
    )


async def cleanup_table(
    table: Table,
    retention: timedelta = DEFAULT_RETENTION,
    *,
    dry_run: bool = False,
    fence_retention: timedelta = FENCE_RETENTION,
    now: float | None = None,
    shard_ids: Iterable[str] | None = None,
) -> CleanupStats:
    """Remove what no retained version and no reader inside ``retention`` needs:
    old base versions (through the engine), compacted generation folders, WAL
    entries every kept manifest has flushed, superseded shard manifests.

    The rules are in the module notes. Safe beside writers, readers and
    compactors in any process; two clean-ups at once only repeat each
    other's deletions.

    Parameters
    ----------
    table : Table
        An :class:`~lance_async.AsyncDataset`.
    retention : timedelta
        Default one hour. ``timedelta(0)`` keeps only what the latest
        version and the newest manifests need (a reader holding an older
        view gets :class:`~lance_async.errors.ViewExpiredError`).
    dry_run : bool
        Decide and report, remove nothing (``stats.plan.lines()`` lists it).
    fence_retention : timedelta
        How long a superseded fence sentinel stays (default one hour).
    now : float, optional
        Seconds since the epoch (default this process's clock).
    shard_ids : iterable of str, optional
        Only these shards' MemWAL files (a cluster worker: the shards it owns).

    Returns
    -------
    CleanupStats

    Raises
    ------
    ValueError, TypeError
        A negative or non-timedelta retention.
    ManifestFormatError, StorageError
        As :func:`plan_cleanup`; the engine's clean-up of base versions.
    """
    plan = await plan_cleanup(
        table, retention, fence_retention=fence_retention, now=now, shard_ids=shard_ids
    )
    if dry_run:
        return _dry_stats(plan)
    return await execute_plan(table, plan)
