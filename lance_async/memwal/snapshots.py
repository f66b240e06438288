"""Which MemWAL shards exist and what each has flushed: :func:`shard_snapshots`.

A MemWAL table has three levels: the base table, each shard's flushed
generations (SSTables, immutable Lance datasets under ``_mem_wal/``) and each
live writer's memtable. pylance 14 has no public listing of a shard's flushed
generations, so they are read from the shard manifests (``manifest.py``
documents the layout relied on). Generations already compacted into the base
table and shards retired by a later ``initialize_mem_wal`` (``retired.py``)
are left out, so no read lets an old SSTable shadow newer base rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from lance.mem_wal import ShardSnapshot as LanceShardSnapshot

from .._schema import primary_key
from .._threads import run_sync
from ..errors import InvalidInputError
from . import manifest as _manifest
from .retired import NO_KEY, retired_shards

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = [
    "ShardSnapshot",
    "ShardSnapshots",
    "discover_latest",
    "lance_snapshots",
    "shard_snapshots",
    "with_snapshots",
]

log = logging.getLogger("lance_async")


@dataclass(frozen=True)
class ShardSnapshot:
    """What one MemWAL shard has flushed, as of one read of its manifest.

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
    """

    shard_id: str
    spec_id: int
    current_generation: int
    sstables: tuple[tuple[int, str], ...] = field(default_factory=tuple)
    compacted_generation: int = 0
    manifest_version: int = 0

    @property
    def lance(self) -> LanceShardSnapshot:
        """The equivalent ``lance.mem_wal.ShardSnapshot`` (built fresh)."""
        snap = LanceShardSnapshot(self.shard_id)
        snap.with_spec_id(self.spec_id).with_current_generation(self.current_generation)
        for gen, path in self.sstables:
            snap.with_sstable(gen, path)
        return snap


ShardSnapshots = Sequence[ShardSnapshot]


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
            )
        )
    return out


async def shard_snapshots(
    dataset: AsyncDataset,
    shard_ids: Iterable[str] | None = None,
    *,
    include_compacted: bool = False,
) -> list[ShardSnapshot]:
    """Discover each MemWAL shard's current generation and flushed SSTables.

    Reads the shard manifests (the newest version of each) and the dataset's
    record of compacted generations, on a worker thread. Generations already
    compacted into the base table are left out, so reads never let an old
    SSTable shadow newer base rows, and so are shards retired when the
    MemWAL was initialized again (``lance_async.memwal.retired``). A version
    without a MemWAL (after an overwrite) has no shards.

    Parameters
    ----------
    dataset : AsyncDataset
        Moved to its latest version first.
    shard_ids : iterable of str, optional
        Only these shards.
    include_compacted : bool
        Keep generations already compacted into the base table too (for
        readers whose base table is an older version, such as a shard
        writer's: its base predates the compaction).

    Returns
    -------
    list of ShardSnapshot
        One per shard with a manifest, sorted by shard id.

    Raises
    ------
    ManifestFormatError
        The on-disk layout is not the one pylance 14.0.2 writes.
    """
    ids = list(shard_ids) if shard_ids is not None else None
    options = dataset.storage_options
    newer, snaps = await run_sync(
        partial(discover_latest, dataset.lance, dataset.uri, ids, include_compacted, options)
    )
    if newer is not None:
        dataset._replace(newer)
    return snaps


def discover_latest(
    ds: Any,
    uri: str,
    shard_ids: list[str] | None = None,
    include_compacted: bool = False,
    storage_options: dict[str, str] | None = None,
) -> tuple[Any, list[ShardSnapshot]]:
    """(the latest version of ``ds`` if newer, else None; its shard snapshots) (blocking).

    What :func:`shard_snapshots` does, in one call on one worker thread.
    """
    latest = ds.latest_version
    newer = ds.checkout_version(latest) if latest != ds.version else None
    base = newer if newer is not None else ds
    if base.mem_wal_index_details() is None:
        return newer, []  # no MemWAL at this version: folders are an earlier MemWAL's
    retired = retired_shards(base)
    snaps = _discover(
        uri, int(base.version), shard_ids, include_compacted, retired, storage_options
    )
    return newer, snaps


def lance_snapshots(snapshots: Iterable[Any]) -> list[LanceShardSnapshot]:
    return [s.lance if isinstance(s, ShardSnapshot) else s for s in snapshots]


def _is_not_found(exc: BaseException) -> bool:
    text = str(exc)
    return "Not found" in text or "not found" in text or "NotFound" in text


async def with_snapshots(
    dataset: AsyncDataset,
    snapshots: ShardSnapshots | None,
    work: Callable[[Any, list[Any], list[LanceShardSnapshot]], Any],
) -> Any:
    """Run ``work(lance_dataset, snapshots, engine_snapshots)`` on a worker thread.

    With ``snapshots=None`` they are discovered; if a generation vanished
    meanwhile (compaction and clean-up racing the read), discovery and the
    read are retried a few times.
    """
    if not primary_key(dataset.schema):
        raise InvalidInputError(NO_KEY)
    attempts = 3 if snapshots is None else 1
    for attempt in range(1, attempts + 1):
        snaps = list(snapshots) if snapshots is not None else await shard_snapshots(dataset)
        ds = dataset.lance
        raw = lance_snapshots(snaps)
        try:
            return await run_sync(partial(work, ds, snaps, raw))
        except (OSError, ValueError, RuntimeError) as exc:
            if attempt < attempts and _is_not_found(exc):
                log.debug("lance_async: LSM read raced a flush or compaction; retrying")
                await anyio.sleep(0.01 * attempt)
                continue
            raise
    raise AssertionError("unreachable")  # pragma: no cover
