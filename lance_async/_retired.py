"""Shards left behind by an earlier MemWAL of the same table.

pylance 14 keeps the ``<table>/_mem_wal/<shard uuid>/`` folders when a table
is overwritten: the overwrite drops the ``__lance_mem_wal`` index, not the
shards. Those shards hold the WAL entries and flushed generations of the
table that was replaced. Read as part of the new table's LSM view they would
bring its rows back, and a writer reopened on one of them replays its WAL
into the new table.

So when :meth:`~lance_async.AsyncDataset.initialize_mem_wal` starts a new
MemWAL on a table that already has shard folders, it records them as
*retired* in the table's config (key :data:`RETIRED_KEY`, comma-separated
shard ids) together with the MemWAL epoch (:data:`EPOCH_KEY`, the table
version the initialization committed). Then:

* shard discovery (:func:`~lance_async.lsm.shard_snapshots`, every LSM read
  and compaction) leaves retired shards out;
* opening an :class:`~lance_async.AsyncShardWriter` on a retired shard is
  refused with :class:`~lance_async.InvalidInputError`;
* :class:`~lance_async.ShardRouter`'s default shard ids mix in the epoch, so
  a sharded table initialized again gets fresh shards.

Later overwrites carry the table's config over, so the record accumulates.
It is lance_async's own: a MemWAL re-initialized through pylance directly is
not covered, and the two commits of a re-initialization are not atomic (a
crash between them leaves the old shards visible, as before).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._manifest import list_shards

__all__ = ["EPOCH_KEY", "RETIRED_KEY", "initialize_mem_wal", "mem_wal_epoch", "retired_shards"]

RETIRED_KEY = "lance_async.mem_wal.retired_shards"
EPOCH_KEY = "lance_async.mem_wal.epoch"


def _config(ds: Any) -> Mapping[str, str]:
    return ds.config() or {}


def retired_shards(ds: Any) -> frozenset[str]:
    """Shard ids retired at or before ``ds``'s version (blocking: reads the
    table's config).

    Parameters
    ----------
    ds : lance.LanceDataset
    """
    value = _config(ds).get(RETIRED_KEY, "")
    return frozenset(s for s in value.split(",") if s)


def mem_wal_epoch(ds: Any) -> str | None:
    """The version at which the current MemWAL was started over retired
    shards, or None when it never was (blocking)."""
    return _config(ds).get(EPOCH_KEY)


def initialize_mem_wal(ds: Any, options: Mapping[str, Any]) -> None:
    """``ds.initialize_mem_wal(**options)``, then retire the shard folders
    that existed before it (blocking; ``ds`` moves to the new version).

    Two commits when there are shards to retire: the engine's initialization,
    then the config update.

    Raises
    ------
    OSError, ValueError
        The engine's errors, unchanged (for example "MemWAL is already
        initialized"); nothing is retired then.
    """
    before = list_shards(ds.uri)
    ds.initialize_mem_wal(**options)
    if before:
        retired = retired_shards(ds) | set(before)
        ds.update_config({RETIRED_KEY: ",".join(sorted(retired)), EPOCH_KEY: str(ds.version)})
