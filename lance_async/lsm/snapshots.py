"""Which MemWAL shards exist and what each holds: :func:`shard_snapshots`.

A MemWAL table has four levels: the base table; each shard's flushed
generations (SSTables, immutable Lance datasets under ``_mem_wal/``); each
shard's WAL tail, durable rows no generation holds yet (``wal.py``); and a
live writer's memtable in this process (``memtable.py``). The engine has no
public listing of a shard's generations, so they are read from the shard
manifests (``manifest.py`` documents the layout relied on). One manifest
read gives both the generations and where the WAL tail starts, so a read
sees every durable row exactly once, whatever a writer flushes meanwhile.

Generations already compacted into the base table are left out, so no read
lets an old SSTable shadow newer base rows. So are shards *retired* by a
later ``initialize_mem_wal`` (the record is lance_async's own, kept in the
table's config; ``memwal/retired.py`` writes it): their folders hold a
replaced table's rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from lance.mem_wal import ShardSnapshot as LanceShardSnapshot

from .._table import Table
from .._threads import run_engine
from . import manifest as _manifest
from .memtable import MemPart

__all__ = [
    "EPOCH_KEY",
    "RETIRED_KEY",
    "LsmSnapshot",
    "ShardSnapshot",
    "ShardSnapshots",
    "discover_latest",
    "mem_wal_epoch",
    "retired_shards",
    "shard_snapshots",
]

RETIRED_KEY = "lance_async.mem_wal.retired_shards"
"""Table config key: shard ids of replaced MemWALs, comma-separated."""
EPOCH_KEY = "lance_async.mem_wal.epoch"
"""Table config key: the MemWAL epoch, a token mixed into derived shard ids."""


def _config(ds: Any) -> Mapping[str, str]:
    return ds.config() or {}


def retired_shards(ds: Any) -> frozenset[str]:
    """Shard ids retired at ``ds``'s version (blocking: reads its config).

    Parameters
    ----------
    ds : lance.LanceDataset
    """
    value = _config(ds).get(RETIRED_KEY, "")
    return frozenset(s for s in value.split(",") if s)


def mem_wal_epoch(ds: Any) -> str | None:
    """The MemWAL epoch at ``ds``'s version: None until a MemWAL was
    initialized over retired shards (blocking)."""
    return _config(ds).get(EPOCH_KEY)


@dataclass(frozen=True)
class ShardSnapshot:
    """What one MemWAL shard holds, as of one read of its manifest.

    Attributes
    ----------
    shard_id : str
    spec_id : int
        The sharding spec the shard was written under.
    current_generation : int
        The generation its writer fills now (not flushed).
    sstables : tuple of (generation, path)
        Flushed generations not yet compacted into the base table, oldest
        first; ``path`` is relative to ``<table>/_mem_wal/<shard_id>/``.
    compacted_generation : int
        Highest generation already merged into the base table (0 if none).
    manifest_version : int
        The shard manifest version read.
    replay_after : int
        The last WAL position the flushed generations cover: the WAL entries
        after it are the shard's durable, unflushed rows (its WAL tail).
    writer_epoch : int
        The epoch of the shard's newest writer (a writer of a lower epoch is
        fenced).
    wal_end : int, optional
        One past the last WAL entry the snapshot pins: a read given it reads
        the entries ``replay_after + 1 .. wal_end - 1`` exactly. None (what
        :func:`shard_snapshots` gives): the tail up to the newest entry
        when the read runs. The shards of an :class:`LsmSnapshot` pin one.
    """

    shard_id: str
    spec_id: int
    current_generation: int
    sstables: tuple[tuple[int, str], ...] = field(default_factory=tuple)
    compacted_generation: int = 0
    manifest_version: int = 0
    replay_after: int = 0
    writer_epoch: int = 0
    wal_end: int | None = None

    @property
    def lance(self) -> LanceShardSnapshot:
        """The equivalent ``lance.mem_wal.ShardSnapshot`` (built fresh; the engine's
        snapshot has no WAL tail: its planners see the flushed generations)."""
        snap = LanceShardSnapshot(self.shard_id)
        snap.with_spec_id(self.spec_id).with_current_generation(self.current_generation)
        for gen, path in self.sstables:
            snap.with_sstable(gen, path)
        return snap


ShardSnapshots = Sequence[ShardSnapshot]


@dataclass(frozen=True)
class LsmSnapshot:
    """A point-in-time LSM view of one table: what every read given it sees.

    Take one with ``await dataset.lsm.snapshot()`` (or a writer's or router's
    ``lsm.snapshot()``, which also holds the rows of its live memtables) and
    pass it to any LSM read as ``snapshot=``. It pins the shard set, each
    shard's flushed generations and its WAL position, and the base table's
    version, so every read given it returns exactly what the first did,
    however long it is held and whatever is written, flushed or compacted
    meanwhile, in any process -- until a clean-up deletes a file it pins
    (the MemWAL's storage retention, ``cleanup_old_versions`` of the pinned
    version): then a read fails with
    :class:`~lance_async.errors.ViewExpiredError`, never returns other rows.

    It holds no resource (no thread, no file handle) and is immutable; one
    without ``unflushed`` rows pickles, so another process can read the same
    view. The idea is a storage engine's read snapshot (RocksDB's
    ``GetSnapshot()`` given to ``ReadOptions``, LevelDB's), with files kept
    by retention rather than by reference counts.

    Attributes
    ----------
    uri : str
        The table.
    version : int
        The base table's version.
    shards : tuple of ShardSnapshot
        The live shards then, each with its generations and ``wal_end``.
    unflushed : tuple of MemPart
        Rows of this process's live writers that no generation held then
        (durable or not), for the shards in ``mirrored``; empty for a
        dataset's snapshot.
    mirrored : frozenset of str
        Shards read from ``unflushed`` instead of their WAL tail.
    taken_at : float
        When it was taken (``time.time()``, seconds).
    """

    uri: str
    version: int
    shards: tuple[ShardSnapshot, ...]
    unflushed: tuple[MemPart, ...] = ()
    mirrored: frozenset[str] = frozenset()
    taken_at: float = 0.0

    def __repr__(self) -> str:
        return (
            f"<LsmSnapshot {self.uri!r} version={self.version} shards={len(self.shards)} "
            f"generations={sum(len(s.sstables) for s in self.shards)}>"
        )


def _discover(
    uri: str,
    version: int,
    shard_ids: Iterable[str] | None = None,
    include_compacted: bool = False,
    retired: frozenset[str] = frozenset(),
    storage_options: dict[str, str] | None = None,
) -> list[ShardSnapshot]:
    compacted = (
        {} if include_compacted else _manifest.compacted_generations(uri, version, storage_options)
    )
    wanted = set(shard_ids) if shard_ids is not None else None
    out: list[ShardSnapshot] = []
    for sid in _manifest.list_shards(uri, storage_options):
        if sid in retired or (wanted is not None and sid not in wanted):
            continue
        manifest = _manifest.read_shard_manifest(uri, sid, storage_options)
        if manifest is None:
            continue
        done = compacted.get(sid, 0)
        out.append(
            ShardSnapshot(
                shard_id=sid,
                spec_id=manifest.spec_id,
                current_generation=manifest.current_generation,
                sstables=tuple(
                    (s.generation, s.path) for s in manifest.sstables if s.generation > done
                ),
                compacted_generation=done,
                manifest_version=manifest.version,
                replay_after=manifest.replay_after,
                writer_epoch=manifest.writer_epoch,
            )
        )
    return out


def discover_latest(
    ds: Any,
    uri: str,
    shard_ids: list[str] | None = None,
    include_compacted: bool = False,
    storage_options: dict[str, str] | None = None,
) -> tuple[Any, list[ShardSnapshot]]:
    """(the latest version of ``ds`` if newer, else None; its shard snapshots) (blocking).

    A version without a MemWAL index (after an overwrite) has no shards,
    whatever folders exist: they are an earlier MemWAL's.
    """
    latest = ds.latest_version
    newer = ds.checkout_version(latest) if latest != ds.version else None
    base = newer if newer is not None else ds
    if base.mem_wal_index_details() is None:
        return newer, []
    retired = retired_shards(base)
    snaps = _discover(
        uri, int(base.version), shard_ids, include_compacted, retired, storage_options
    )
    return newer, snaps


async def shard_snapshots(
    table: Table,
    shard_ids: Iterable[str] | None = None,
    *,
    include_compacted: bool = False,
) -> list[ShardSnapshot]:
    """Discover each MemWAL shard's generations and where its WAL tail starts.

    Reads the shard manifests (the newest version of each) and the table's
    record of compacted generations, on a worker thread, after moving
    ``table`` to its latest version.

    Parameters
    ----------
    table : Table
        An :class:`~lance_async.AsyncDataset` (moved to its latest version).
    shard_ids : iterable of str, optional
        Only these shards.
    include_compacted : bool
        Keep generations already compacted into the base table too (for
        readers whose base table is an older version).

    Returns
    -------
    list of ShardSnapshot
        One per live shard with a manifest, sorted by shard id.

    Raises
    ------
    ManifestFormatError
        The on-disk layout is not the one the pinned pylance writes.
    """
    ids = list(shard_ids) if shard_ids is not None else None
    options = table.storage_options
    newer, snaps = await run_engine(
        partial(discover_latest, table.lance, table.uri, ids, include_compacted, options)
    )
    if newer is not None:
        table._advance(newer)
    return snaps
