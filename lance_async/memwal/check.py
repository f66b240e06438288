"""Checking a table for keys that broke "one key, one shard": :func:`check_shards`.

Tables written before lance_async routed rows by their sharding spec (or
written through pylance directly, or with manual shard ids) may hold a key in
more than one shard. LSM reads and compaction then pick a version by how the
shard ids sort, not by write time. :func:`check_shards` reads the key
columns of every flushed, not yet compacted generation (SSTable) of every
live shard and reports

* keys present in more than one shard (*split* keys), and
* on a table with a sharding spec, keys in a shard their key does not map to
  (*misplaced* keys).

Durable rows still in a shard's WAL (its tail) are read too; rows a live
writer holds in memory but has not made durable are not. Generations already
compacted into the base table are history: their rows were merged in the
order compaction applied them, which this check cannot undo; it says how many
shards have compacted generations.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .._schema import NO_KEY, primary_key
from .._table import Table
from .._threads import run_sync
from ..errors import InvalidInputError
from ..lsm.snapshots import shard_snapshots
from ..lsm.wal import read_wal_tail
from .sharding import Sharding, read_sharding

__all__ = ["ShardCheck", "check_shards"]

EXAMPLES = 20


@dataclass(frozen=True)
class ShardCheck:
    """What :func:`check_shards` found.

    Attributes
    ----------
    shards : int
        Live shards read.
    generations : int
        Flushed, not yet compacted generations read.
    rows : int
        Rows read from them and from the shards' WAL tails.
    split_keys : int
        Keys present in more than one shard.
    misplaced_keys : int
        Keys in a shard their key does not map to (0 on manual shards).
    examples : list of dict
        Up to 20 offending keys: ``{"key": ..., "shards": [...], "expected": ...}``.
    compacted_shards : int
        Shards with generations compacted already (not checkable).
    sharding : str
        The table's sharding kind.
    """

    shards: int
    generations: int
    rows: int
    split_keys: int
    misplaced_keys: int
    examples: list[dict[str, Any]] = field(default_factory=list)
    compacted_shards: int = 0
    sharding: str = "manual"

    @property
    def ok(self) -> bool:
        """True when no key is split or misplaced."""
        return self.split_keys == 0 and self.misplaced_keys == 0


def _read_keys(uri: str, columns: list[str], storage_options: dict[str, str] | None) -> pa.Table:
    import lance

    gen = lance.dataset(uri, storage_options=storage_options)
    return gen.to_table(columns=columns)


def _analyse(
    parts: list[pa.Table], keys: list[str], sharding: Sharding, schema: pa.Schema
) -> tuple[int, int, list[dict[str, Any]]]:
    if not parts:
        return 0, 0, []
    table = pa.concat_tables(parts)
    per_key = (
        table.group_by(keys, use_threads=False)
        .aggregate([("__shard", "count_distinct"), ("__shard", "distinct")])
        .rename_columns([*keys, "shards", "shard_ids"])
    )
    split = per_key.filter(pc.greater(per_key["shards"], 1))
    examples: list[dict[str, Any]] = []
    for row in split.slice(0, EXAMPLES).to_pylist():
        key = row[keys[0]] if len(keys) == 1 else {k: row[k] for k in keys}
        examples.append({"key": key, "shards": sorted(row["shard_ids"]), "expected": None})
    misplaced = 0
    if sharding.sharded:
        columns = [sharding.column] if sharding.column else []
        expected: list[str] = []
        for b in table.select(columns).combine_chunks().to_batches():
            if columns:
                b = pa.RecordBatch.from_arrays(
                    list(b.columns), schema=pa.schema([schema.field(c) for c in columns])
                )
            expected.extend(sharding.shard_id(v) for v in sharding.values(b).to_pylist())
        wrong = pc.not_equal(table["__shard"], pa.array(expected, pa.string()))
        bad = table.filter(wrong)
        bad_keys = bad.group_by(keys, use_threads=False).aggregate([])
        misplaced = bad_keys.num_rows
        if len(examples) < EXAMPLES:
            exp = pa.array(expected, pa.string()).filter(wrong)
            for row, owner in zip(
                bad.slice(0, EXAMPLES).to_pylist(), exp.to_pylist(), strict=False
            ):
                key = row[keys[0]] if len(keys) == 1 else {k: row[k] for k in keys}
                examples.append({"key": key, "shards": [row["__shard"]], "expected": owner})
                if len(examples) >= EXAMPLES:
                    break
    return split.num_rows, misplaced, examples


async def check_shards(dataset: Table) -> ShardCheck:
    """Find keys in more than one shard, and keys in the wrong shard.

    Parameters
    ----------
    dataset : AsyncDataset
        A MemWAL table (moved to its latest version).

    Returns
    -------
    ShardCheck

    Raises
    ------
    InvalidInputError
        The table has no MemWAL, or no primary key.

    Notes
    -----
    Reads only the key columns of the flushed generations and the WAL tails,
    on worker threads; memory grows with the number of rows in uncompacted
    generations (compact first to keep it small).
    """
    keys = primary_key(dataset.schema)
    if not keys:
        raise InvalidInputError(NO_KEY)
    sharding = await read_sharding(dataset)
    snaps = await shard_snapshots(dataset)
    options = dataset.storage_options
    columns = list(dict.fromkeys([*keys, *([sharding.column] if sharding.column else [])]))
    parts: list[pa.Table] = []
    generations = rows = 0
    schema = dataset.schema
    for snap in snaps:
        tail = await run_sync(
            partial(read_wal_tail, dataset.uri, snap.shard_id, snap.replay_after, schema, options)
        )
        found = [tail.rows.select(columns)] if tail.rows.num_rows else []
        for _gen, path in snap.sstables:
            uri = posixpath.join(dataset.uri, "_mem_wal", snap.shard_id, path)
            found.append(await run_sync(partial(_read_keys, uri, columns, options)))
            generations += 1
        for got in found:
            rows += got.num_rows
            labels = pa.array([snap.shard_id] * got.num_rows, pa.string())
            parts.append(pa.Table.from_arrays([*got.columns, labels], [*columns, "__shard"]))
    split, misplaced, examples = await run_sync(lambda: _analyse(parts, keys, sharding, schema))
    return ShardCheck(
        shards=len(snaps),
        generations=generations,
        rows=rows,
        split_keys=split,
        misplaced_keys=misplaced,
        examples=examples,
        compacted_shards=sum(1 for s in snaps if s.compacted_generation > 0),
        sharding=sharding.kind,
    )
