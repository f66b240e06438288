"""Compaction of flushed MemWAL generations into the base table: :func:`compact_mem_wal`.

Each generation is merged with merge_insert and ``mark_sstables_as_compacted``
in the same commit. SSTables never change, so each generation is a
*replayable* source: a conflict re-reads it, nothing is buffered.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import CompactedSsTable

from .._schema import primary_key
from .._threads import run_sync
from ..errors import InvalidInputError
from ..sources import replayable
from .snapshots import shard_snapshots

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = ["TOMBSTONE", "CompactionResult", "compact_mem_wal"]

TOMBSTONE = "_tombstone"
"""The column flagging a deleted key in a flushed generation."""


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


def _generation_plan(
    gen_uri: str,
    keys: list[str],
    key_schema: pa.Schema,
    storage_options: dict[str, str] | None = None,
) -> tuple[pa.Array, pa.Table | None]:
    """Rows of a generation to upsert (indices) and keys to delete.

    A generation holds the newest state of each key it saw (the engine
    dedups when it flushes); the last occurrence wins if a key repeats.
    """
    import lance

    gen = lance.dataset(gen_uri, storage_options=storage_options)
    meta = gen.to_table(columns=[*keys, TOMBSTONE])
    n = meta.num_rows
    idx = pa.array(np.arange(n, dtype=np.int64))
    meta = meta.append_column("__row", idx)
    last = meta.group_by(keys, use_threads=False).aggregate([("__row", "max")])
    keep = pc.sort_indices(last["__row_max"])
    last_rows = pc.take(last["__row_max"], keep)
    tomb = pc.take(meta[TOMBSTONE], last_rows)
    live = pc.filter(last_rows, pc.invert(tomb))
    dead_rows = pc.filter(last_rows, tomb)
    deletes = meta.select(keys).take(dead_rows).cast(key_schema) if len(dead_rows) else None
    return live.combine_chunks() if isinstance(live, pa.ChunkedArray) else live, deletes


async def compact_mem_wal(
    dataset: AsyncDataset,
    shard_ids: Iterable[str] | None = None,
    *,
    chunk_rows: int = 65_536,
    optimize_indices: bool = True,
) -> CompactionResult:
    """Merge every flushed, not yet compacted generation into the base table.

    For each shard, oldest generation first: keys whose newest state in the
    generation is a delete are removed with a merge_insert (``when_matched_delete``);
    then the generation's live rows are upserted with a merge_insert that
    also records ``mark_sstables_as_compacted`` for that generation, in the
    same commit (so a crash between the two passes leaves the generation
    uncompacted, and running again converges). Each pass reads the immutable
    SSTable through a :func:`~lance_async.replayable` source: a conflict
    re-reads it in chunks of ``chunk_rows``, nothing is buffered.

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
        (``optimize.optimize_indices``, one more commit) so indexed reads and
        the LSM vector planner cover the compacted rows (default True).

    Returns
    -------
    CompactionResult

    Raises
    ------
    InvalidInputError
        The table has no primary key.
    ContentionError
        Concurrent writers won every attempt of a pass.
    """
    keys = primary_key(dataset.schema)
    if not keys:
        raise InvalidInputError("compacting a MemWAL needs a primary key")
    table_cols = dataset.schema.names
    key_schema = pa.schema([dataset.schema.field(k) for k in keys])
    snaps = await shard_snapshots(dataset, shard_ids)
    options = dataset.storage_options
    done: dict[str, list[int]] = {}
    upserted = deleted = commits = attempts = 0
    for snap in snaps:
        for gen, path in snap.sstables:
            gen_uri = posixpath.join(dataset.uri, "_mem_wal", snap.shard_id, path)
            live, deletes = await run_sync(
                partial(_generation_plan, gen_uri, keys, key_schema, options)
            )
            if deletes is not None and deletes.num_rows:
                res = await (
                    dataset.merge_insert(keys)
                    .when_matched_delete()
                    .execute(replayable(partial(_identity, deletes), schema=key_schema))
                )
                deleted += res.num_deleted_rows
                commits += 1
                attempts += res.num_attempts

            def factory(u: str = gen_uri, rows: pa.Array = live) -> Iterable[pa.RecordBatch]:
                import lance

                gen_ds = lance.dataset(u, storage_options=options)
                for start in range(0, len(rows), chunk_rows):
                    part = gen_ds.take(rows.slice(start, chunk_rows), columns=table_cols)
                    yield from part.combine_chunks().to_batches()

            schema = dataset.schema
            res = await (
                dataset.merge_insert(keys)
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .mark_sstables_as_compacted([CompactedSsTable(snap.shard_id, gen)])
                .execute(replayable(factory, schema=schema))
            )
            upserted += res.num_inserted_rows + res.num_updated_rows
            commits += 1
            attempts += res.num_attempts
            done.setdefault(snap.shard_id, []).append(gen)
    if commits and optimize_indices:

        def optimize(d: Any) -> bool:
            if len(d.describe_indices()) <= 1:  # only the MemWAL's own index
                return False
            d.optimize.optimize_indices()
            return True

        if await dataset._mutate(optimize):
            commits += 1
    if not commits:
        await anyio.lowlevel.checkpoint()
    return CompactionResult(done, upserted, deleted, commits, attempts, dataset.version)
