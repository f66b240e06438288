"""Shards left behind by an earlier MemWAL of the same table.

pylance keeps the ``<table>/_mem_wal/<shard uuid>/`` folders when a table
is overwritten: the overwrite drops the ``__lance_mem_wal`` index, not the
shards. Those shards hold the WAL entries and flushed generations of the
table that was replaced. Read as part of the new table's LSM view they would
bring its rows back, and a writer reopened on one of them replays its WAL
into the new table.

lance_async keeps them out in two ways:

* A version without a MemWAL index has no live shards: shard discovery
  (:func:`~lance_async.memwal.snapshots.shard_snapshots`, so every LSM read and
  compaction) returns none there, whatever folders exist.
* :meth:`~lance_async.AsyncDataset.initialize_mem_wal` on a table that
  already has shard folders first records them as *retired* in the table's
  config (key :data:`RETIRED_KEY`, comma-separated shard ids) with a new
  MemWAL epoch (:data:`EPOCH_KEY`, a random token), and only then
  initializes the MemWAL. Discovery leaves retired shards out; opening an
  :class:`~lance_async.AsyncShardWriter` on one is refused; shard ids that
  lance_async derives (:class:`~lance_async.ShardRouter`, the ``lance-async``
  command, the example server) mix in the epoch, so a table initialized
  again gets fresh shards.

Order matters: the shards are listed, then the table is checked to have no
MemWAL index, then the record is committed, then the MemWAL. A shard listed
while no MemWAL existed cannot be live, and between the two commits there is
no MemWAL for a writer or compaction to use. A crash between them leaves a
record of retired shards and no MemWAL (initialize again).

Later overwrites carry the table's config over, so the record accumulates.
It is lance_async's own: a MemWAL initialized through pylance directly does
not retire anything. Writers still open on the replaced table when it is
overwritten write into the old MemWAL; their rows are lost with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from .._schema import NO_KEY, primary_key
from .._table import Table
from .._threads import run_sync
from ..errors import InvalidInputError
from ..lsm.manifest import list_shards
from ..lsm.snapshots import EPOCH_KEY, RETIRED_KEY, mem_wal_epoch, retired_shards

__all__ = [
    "EPOCH_KEY",
    "NO_KEY",
    "RETIRED_KEY",
    "current_epoch",
    "derived_shard_id",
    "initialize_mem_wal",
    "mem_wal_epoch",
    "retired_shards",
]


async def current_epoch(dataset: Table) -> str | None:
    """:func:`mem_wal_epoch` of ``dataset``'s current version, read on a
    worker thread (for the callers that derive shard ids)."""
    ds = dataset.lance
    return await run_sync(lambda: mem_wal_epoch(ds))


def derived_shard_id(namespace: uuid.UUID, name: str, epoch: str | None) -> str:
    """A deterministic shard UUID for ``name``, fresh for each MemWAL epoch.

    ``uuid5(namespace, name)`` for a table's first MemWAL (the ids lance_async
    has always derived), ``uuid5(namespace, f"{epoch}/{name}")`` after a
    re-initialization.
    """
    return str(uuid.uuid5(namespace, name if epoch is None else f"{epoch}/{name}"))


def initialize_mem_wal(
    ds: Any, options: Mapping[str, Any], storage_options: Mapping[str, str] | None = None
) -> None:
    """Retire the shard folders an earlier MemWAL left, then
    ``ds.initialize_mem_wal(**options)`` (blocking; ``ds`` moves to the
    versions committed: one, or two when there are shards to retire).

    Raises
    ------
    InvalidInputError
        The table (at its latest version) has no primary key, or already has
        a MemWAL. Nothing is committed.
    OSError, ValueError
        The engine's errors, unchanged.
    """
    before = list_shards(ds.uri, storage_options)  # first: see the module notes on order
    latest = ds.checkout_version(ds.latest_version)  # as of after the listing
    if not primary_key(latest.schema):
        raise InvalidInputError(NO_KEY)
    if latest.mem_wal_index_details() is not None:
        raise InvalidInputError("the MemWAL is already initialized on this table")
    if before:
        retired = retired_shards(ds) | set(before)
        ds.update_config({RETIRED_KEY: ",".join(sorted(retired)), EPOCH_KEY: uuid.uuid4().hex[:16]})
    try:
        ds.initialize_mem_wal(**options)
    except OSError as exc:
        now = ds.checkout_version(ds.latest_version)
        if "onflict" in str(exc) and now.mem_wal_index_details() is not None:
            raise InvalidInputError(
                "the MemWAL was initialized by a concurrent initialize_mem_wal"
            ) from exc
        raise
