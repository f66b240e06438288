"""Compaction of flushed MemWAL generations into the base table: :func:`compact_mem_wal`.

A shard's flushed generations are resolved together (``levels.py``: the
newest version of each key among them) and merged in two commits, however
many generations there are:

1. keys whose newest state is a delete are removed from the base table
   (merge_insert ``when_matched_delete``);
2. the newest live rows are upserted, with ``mark_sstables_as_compacted``
   for the highest generation merged in the same commit (pylance takes one
   entry per shard per commit; it covers every lower generation).

A reader between the two commits sees the generations still uncompacted, so
the deleted keys stay hidden by their tombstones; a crash between them
leaves the generations uncompacted and running again converges. Every read
of an SSTable goes through a :func:`~lance_async.replayable` source: a
conflict re-reads it, nothing is buffered. At most one compaction per table
runs at a time in an event loop (:func:`table_lock`), whether started here
or by a :class:`~lance_async.memwal.compactor.Compactor`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import pyarrow as pa
from anyio.lowlevel import RunVar
from lance.mem_wal import CompactedSsTable

from .._schema import primary_key
from .._threads import run_sync
from ..errors import InvalidInputError
from ..sources import replayable
from .levels import load_generation, resolve_shard
from .mirror import TOMBSTONE
from .snapshots import ShardSnapshot, shard_snapshots

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = ["TOMBSTONE", "CompactionResult", "compact_mem_wal", "compact_shard", "table_lock"]

_locks: RunVar[dict[str, anyio.Lock]] = RunVar("lance_async.compaction_locks")


def table_lock(uri: str) -> anyio.Lock:
    """The lock that lets one compaction of table ``uri`` run at a time (per event loop)."""
    try:
        locks = _locks.get()
    except LookupError:
        locks = {}
        _locks.set(locks)
    lock = locks.get(uri)
    if lock is None:
        lock = locks[uri] = anyio.Lock()
    return lock


@dataclass(frozen=True)
class CompactionResult:
    """What :func:`compact_mem_wal` did.

    Attributes
    ----------
    generations : dict of str to list of int
        Generations compacted, per shard id.
    rows_upserted, rows_deleted : int
        Rows merged into / removed from the base table.
    commits : int
        Dataset versions committed.
    num_attempts : int
        merge_insert attempts in total (more than commits after conflicts).
    version : int
        The dataset version after compaction.
    """

    generations: dict[str, list[int]]
    rows_upserted: int
    rows_deleted: int
    commits: int
    num_attempts: int
    version: int


def _identity(value: Any) -> Any:
    return value


def _live_rows(
    gens: list[Any], winners: list[np.ndarray], schema: pa.Schema, chunk_rows: int
) -> Iterator[pa.RecordBatch]:
    """The newest live rows of the merged generations, chunk by chunk (blocking)."""
    for gen, win in zip(gens, winners, strict=True):
        rows = np.flatnonzero(win & ~gen.tomb)
        for start in range(0, len(rows), chunk_rows):
            part = gen.dataset.take(rows[start : start + chunk_rows], columns=schema.names)
            for batch in part.combine_chunks().to_batches():
                yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)


async def compact_shard(
    dataset: AsyncDataset,
    snapshot: ShardSnapshot,
    *,
    chunk_rows: int = 65_536,
    max_generations: int | None = None,
) -> tuple[list[int], int, int, int, int]:
    """Merge one shard's flushed generations (the oldest ``max_generations``).

    The caller holds :func:`table_lock`. Returns (generations, rows upserted,
    rows deleted, commits, attempts).

    Raises
    ------
    ContentionError
        Concurrent writers won every attempt of a pass.
    """
    keys = primary_key(dataset.schema)
    chosen = snapshot.sstables if max_generations is None else snapshot.sstables[:max_generations]
    if not chosen:
        return [], 0, 0, 0, 0
    part = ShardSnapshot(
        snapshot.shard_id, snapshot.spec_id, snapshot.current_generation, tuple(chosen)
    )
    uri = dataset.uri
    options = dataset.storage_options
    gens = [
        await run_sync(partial(load_generation, uri, part.shard_id, g, path, keys, options))
        for g, path in chosen
    ]
    levels = await run_sync(partial(resolve_shard, uri, part, keys, gens))
    key_schema = pa.schema([dataset.schema.field(k) for k in keys])
    dead = [
        pa.Table.from_arrays(
            [k.take(pa.array(np.flatnonzero(w & g.tomb))) for k in g.keys], schema=key_schema
        )
        for g, w in zip(levels.generations, levels.winners, strict=True)
        if (w & g.tomb).any()
    ]
    deleted = commits = attempts = 0
    if dead:
        deletes = pa.concat_tables(dead).combine_chunks()
        res = await (
            dataset.merge_insert(keys)
            .when_matched_delete()
            .execute(replayable(partial(_identity, deletes), schema=key_schema))
        )
        deleted, commits, attempts = res.num_deleted_rows, 1, res.num_attempts
    schema = dataset.schema
    factory = partial(_live_rows, levels.generations, levels.winners, schema, chunk_rows)
    highest = max(g for g, _ in chosen)
    res = await (
        dataset.merge_insert(keys)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .mark_sstables_as_compacted([CompactedSsTable(part.shard_id, highest)])
        .execute(replayable(factory, schema=schema))
    )
    upserted = res.num_inserted_rows + res.num_updated_rows
    return [g for g, _ in chosen], upserted, deleted, commits + 1, attempts + res.num_attempts


async def optimize_after(dataset: AsyncDataset) -> bool:
    """Bring the table's indexes up to date after a compaction (one more commit).

    Returns False when the table has no index of its own (nothing done).
    """

    def optimize(d: Any) -> bool:
        if len(d.describe_indices()) <= 1:  # only the MemWAL's own index
            return False
        d.optimize.optimize_indices()
        return True

    done: bool = await dataset._mutate(optimize)
    return done


async def compact_mem_wal(
    dataset: AsyncDataset,
    shard_ids: Iterable[str] | None = None,
    *,
    chunk_rows: int = 65_536,
    optimize_indices: bool = True,
    max_generations: int | None = None,
) -> CompactionResult:
    """Merge every flushed, not yet compacted generation into the base table.

    Each shard's generations are merged in two commits (deletes, then the
    upsert that marks them compacted; see the module notes). Waits while
    another compaction of the table runs in this event loop.

    Parameters
    ----------
    dataset : AsyncDataset
        Moved to the version the compaction commits.
    shard_ids : iterable of str, optional
        Only these shards (default all).
    chunk_rows : int
        Rows per batch read from an SSTable (default 65,536).
    optimize_indices : bool
        After compacting, bring the table's indexes up to date
        (``optimize.optimize_indices``, one more commit) so indexed reads
        cover the compacted rows (default True).
    max_generations : int, optional
        Per shard, merge only the oldest this many generations.

    Returns
    -------
    CompactionResult

    Raises
    ------
    InvalidInputError
        The table has no primary key.
    ContentionError
        Concurrent writers won every attempt of a pass (what was committed
        before stays committed and consistent).
    """
    if not primary_key(dataset.schema):
        raise InvalidInputError("compacting a MemWAL needs a primary key")
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be >= 1")
    done: dict[str, list[int]] = {}
    upserted = deleted = commits = attempts = 0
    async with table_lock(dataset.uri):
        for snap in await shard_snapshots(dataset, shard_ids):
            gens, up, dl, cm, at = await compact_shard(
                dataset, snap, chunk_rows=chunk_rows, max_generations=max_generations
            )
            if gens:
                done[snap.shard_id] = gens
            upserted, deleted = upserted + up, deleted + dl
            commits, attempts = commits + cm, attempts + at
        if commits and optimize_indices and await optimize_after(dataset):
            commits += 1
    if not commits:
        await anyio.lowlevel.checkpoint()
    return CompactionResult(done, upserted, deleted, commits, attempts, dataset.version)
