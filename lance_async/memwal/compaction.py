"""Compaction of flushed MemWAL generations into the base table: :func:`compact_mem_wal`.

A shard's flushed generations are resolved together (the newest version of
each key among them: ``lance_async.lsm.levels``) and merged in **one**
commit, however many generations there are: a merge_insert that upserts the
newest live rows (``when_matched_update_all`` / ``when_not_matched_insert_all``),
deletes the keys whose newest state is a delete
(``when_not_matched_by_source_delete`` with the dead keys as its filter), and
carries ``mark_sstables_as_compacted`` for the highest generation merged
(the engine takes one entry per shard per commit; it covers every lower
generation).

That commit is the proof the MemWAL needs against any other compactor, in
any process: the engine refuses to record a generation at or below the one
recorded already, so a compaction that read its generations before another
one merged them commits nothing -- no delete, no upsert
(:class:`~lance_async.errors.StaleCompactionError`, counted as a lost race,
not an error, by :func:`compact_mem_wal`). Readers see the generations until
the commit and the base table after it, never a half. Every read of an
SSTable goes through a :func:`~lance_async.replayable` source: a conflict
re-reads it, nothing is buffered. In one event loop, compactions of one
table also wait for each other (:func:`table_lock`), so they do not race
only to lose.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
from anyio.lowlevel import RunVar
from lance.mem_wal import CompactedSsTable

from .._schema import primary_key
from .._table import Table
from .._threads import run_sync
from ..errors import InvalidInputError, StaleCompactionError
from ..lsm.keyvalues import keys_filter
from ..lsm.levels import load_generation, resolve_shard
from ..lsm.snapshots import ShardSnapshot, shard_snapshots
from ..sources import replayable

__all__ = ["CompactionResult", "ShardCompaction", "compact_mem_wal", "compact_shard", "table_lock"]

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
    stale : list of str
        Shards whose compaction lost the race to another compaction (any
        process) that merged their generations first: nothing was committed
        for them, and nothing needs to be.
    """

    generations: dict[str, list[int]]
    rows_upserted: int
    rows_deleted: int
    commits: int
    num_attempts: int
    version: int
    stale: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ShardCompaction:
    """What compacting one shard did (:func:`compact_shard`).

    Attributes
    ----------
    generations : list of int
        The generations merged (empty when none, or when the race was lost).
    rows_upserted, rows_deleted : int
    commits, attempts : int
    stale : bool
        Another compaction merged these generations first; nothing committed.
    """

    generations: list[int]
    rows_upserted: int = 0
    rows_deleted: int = 0
    commits: int = 0
    attempts: int = 0
    stale: bool = False


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
    table: Table,
    snapshot: ShardSnapshot,
    *,
    chunk_rows: int = 65_536,
    max_generations: int | None = None,
) -> ShardCompaction:
    """Merge one shard's flushed generations (the oldest ``max_generations``) in one commit.

    Returns what was done; a compaction that lost the race to another one
    (any process) commits nothing and says ``stale``.

    Raises
    ------
    ContentionError
        Concurrent writers won every attempt.
    """
    keys = primary_key(table.schema)
    chosen = snapshot.sstables if max_generations is None else snapshot.sstables[:max_generations]
    if not chosen:
        return ShardCompaction([])
    part = ShardSnapshot(
        snapshot.shard_id, snapshot.spec_id, snapshot.current_generation, tuple(chosen)
    )
    uri = table.uri
    options = table.storage_options
    gens = [
        await run_sync(partial(load_generation, uri, part.shard_id, g, path, keys, options))
        for g, path in chosen
    ]
    levels = await run_sync(partial(resolve_shard, uri, part, keys, gens))
    schema = table.schema
    key_schema = pa.schema([schema.field(k) for k in keys])
    dead = [
        pa.Table.from_arrays(
            [k.take(pa.array(np.flatnonzero(w & g.tomb))) for k in g.keys], schema=key_schema
        )
        for g, w in zip(levels.generations, levels.winners, strict=True)
        if (w & g.tomb).any()
    ]
    highest = max(g for g, _ in chosen)
    builder = (
        table.merge_insert(keys)
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .mark_sstables_as_compacted([CompactedSsTable(part.shard_id, highest)])
    )
    if dead:
        deletes = pa.concat_tables(dead).combine_chunks()
        columns = [deletes.column(k) for k in keys]
        expr = await run_sync(partial(keys_filter, schema, keys, columns))
        builder = builder.when_not_matched_by_source_delete(expr)
    factory = partial(_live_rows, levels.generations, levels.winners, schema, chunk_rows)
    try:
        res = await builder.execute(replayable(factory, schema=schema))
    except StaleCompactionError:
        return ShardCompaction([], stale=True)
    return ShardCompaction(
        [g for g, _ in chosen],
        res.num_inserted_rows + res.num_updated_rows,
        res.num_deleted_rows,
        1,
        res.num_attempts,
    )


async def optimize_after(dataset: Table) -> bool:
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
    dataset: Table,
    shard_ids: Iterable[str] | None = None,
    *,
    chunk_rows: int = 65_536,
    optimize_indices: bool = True,
    max_generations: int | None = None,
) -> CompactionResult:
    """Merge every flushed, not yet compacted generation into the base table.

    Each shard's generations are merged in one commit that also marks them
    compacted, so a compaction that lost the race to another one (in any
    process) commits nothing for that shard (see the module notes). Waits
    while another compaction of the table runs in this event loop.

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
    stale: list[str] = []
    upserted = deleted = commits = attempts = 0
    async with table_lock(dataset.uri):
        for snap in await shard_snapshots(dataset, shard_ids):
            one = await compact_shard(
                dataset, snap, chunk_rows=chunk_rows, max_generations=max_generations
            )
            if one.generations:
                done[snap.shard_id] = one.generations
            if one.stale:
                stale.append(snap.shard_id)
            upserted, deleted = upserted + one.rows_upserted, deleted + one.rows_deleted
            commits, attempts = commits + one.commits, attempts + one.attempts
        if commits and optimize_indices and await optimize_after(dataset):
            commits += 1
    if not commits:
        await anyio.lowlevel.checkpoint()
    return CompactionResult(done, upserted, deleted, commits, attempts, dataset.version, stale)
