"""The one write rule of a table with a MemWAL: which path a merge takes, and its checks.

LanceDB routes ``merge_insert`` into Lance's MemWAL once a table has an LSM
write spec (lancedb ``python/python/tests/test_lsm_write_spec.py``);
lance_async does the same once the table's MemWAL is initialized, on every
path (``AsyncDataset.merge_insert``, ``lance-async merge``, the example
server's ``/merge``):

``route="auto"`` (the default)
    A table with a MemWAL takes the merge through it (``via_mem_wal``); a
    table without one, in its base table.
``via_mem_wal()``
    The MemWAL, always (an error when the table has none).
``via_base_table()``
    The base table, explicitly -- and refused while the MemWAL holds any of
    the merge's keys not yet compacted (in a flushed generation, or in WAL
    entries no generation holds yet), since compaction would later write the
    MemWAL's row of such a key over the merge's
    (:func:`check_base_keys`).

Compaction's own merges (those that mark SSTables compacted, or that are
made while the task holds the table's compaction lock,
:func:`lance_async.memwal.compaction.table_lock`) go to the base table
unchecked: they are how the MemWAL's rows get there.

Partial rows follow one rule on both paths: a column the source lacks keeps
the stored value of a row it updates and is null in a row it inserts. The
base table does that itself (pylance's merge of a subset of the columns);
through the MemWAL, whose puts replace whole rows, :func:`whole_rows` fills
the lacking columns from the stored rows first.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import anyio
import pyarrow as pa

from .._table import Table
from .._threads import run_engine
from ..errors import InvalidInputError, SchemaMismatchError
from ..lsm.reader import LsmReader
from ..lsm.snapshots import shard_snapshots
from ..lsm.wal import read_wal_tail
from ..memwal.compaction import table_lock

if TYPE_CHECKING:
    from ..lsm.snapshots import ShardSnapshot

__all__ = ["Route", "check_base_keys", "choose_route", "in_compaction", "whole_rows"]

Route = Literal["mem_wal", "base", "checked_base"]
"""Where a merge goes: through the MemWAL, to the base table, or to the base
table after :func:`check_base_keys`."""

#: Keys named in an error at most (a merge may hold millions).
_SHOWN = 3


def in_compaction(uri: str) -> bool:
    """True while the current task holds the table's compaction lock (does not block)."""
    owner = table_lock(uri).statistics().owner
    return owner is not None and owner == anyio.get_current_task()


async def choose_route(dataset: Table, requested: str, *, marks: bool = False) -> Route:
    """Where a merge asked for ``requested`` (``"auto"``, ``"mem_wal"``, ``"base"``) goes.

    ``marks``: the merge marks SSTables compacted (compaction's). Reads the
    table's MemWAL index at its latest version (an engine call on a worker
    thread).
    """
    if requested == "mem_wal":
        return "mem_wal"
    if marks or in_compaction(dataset.uri) or not dataset.primary_key:
        return "base"  # compaction's own merge; a table without a key has no MemWAL
    ds = dataset.lance

    def has_mem_wal() -> bool:
        latest = ds.checkout_version(ds.latest_version) if ds.latest_version != ds.version else ds
        return latest.mem_wal_index_details() is not None

    if not await run_engine(has_mem_wal):
        return "base"
    return "checked_base" if requested == "base" else "mem_wal"


def _held_keys(
    uri: str,
    generations: Sequence[tuple[str, str]],
    keys: pa.Table,
    storage_options: Mapping[str, str] | None,
) -> pa.Table:
    """The rows of ``keys`` that some flushed generation holds (blocking)."""
    import lance

    names = keys.column_names
    held = []
    for shard_id, path in generations:
        gen = lance.dataset(
            posixpath.join(uri, "_mem_wal", shard_id, path),
            storage_options=dict(storage_options) if storage_options else None,
        )
        stored = gen.to_table(columns=names)
        found = keys.join(stored.group_by(names).aggregate([]), keys=names, join_type="inner")
        if found.num_rows:
            held.append(found)
    return pa.concat_tables(held) if held else keys.schema.empty_table()


def _tail_keys(
    uri: str,
    snaps: Sequence[ShardSnapshot],
    schema: pa.Schema,
    keys: pa.Table,
    storage_options: Mapping[str, str] | None,
) -> pa.Table:
    """The rows of ``keys`` that some shard's WAL tail (durable, not flushed) holds (blocking)."""
    names = keys.column_names
    held = []
    for snap in snaps:
        tail = read_wal_tail(uri, snap.shard_id, snap.replay_after, schema, storage_options).rows
        if tail.num_rows:
            stored = tail.select(names).group_by(names).aggregate([])
            found = keys.join(stored, keys=names, join_type="inner")
            if found.num_rows:
                held.append(found)
    return pa.concat_tables(held) if held else keys.schema.empty_table()


_WHAT_TO_DO = (
    "merge through the MemWAL instead (leave out via_base_table() / --base-table), or compact "
    "the MemWAL first (compact_mem_wal(), lance-async compact) and merge into the base table then"
)


async def check_base_keys(dataset: Table, keys: pa.Table) -> None:
    """Refuse a base-table merge of ``keys`` while the MemWAL holds any of them.

    A key in a flushed generation not yet compacted, or in a shard's WAL
    tail (durable, not flushed yet), would be written over the merge's row by
    the next compaction. The shards are found by their snapshots
    (:func:`~lance_async.lsm.snapshots.shard_snapshots`), the generations'
    keys and the WAL tails read on worker threads. A live writer's rows that
    are not durable yet (``durable_write=False``) cannot be seen.

    Raises
    ------
    InvalidInputError
        Naming a few of the keys and what to do.
    """
    if not keys.num_rows:
        return
    snaps = await shard_snapshots(dataset)
    options = dataset.storage_options
    generations = [(s.shard_id, path) for s in snaps for _, path in s.sstables]

    def held() -> pa.Table:
        flushed = _held_keys(dataset.uri, generations, keys, options)
        waiting = _tail_keys(dataset.uri, snaps, dataset.schema, keys, options)
        both = pa.concat_tables(
            [t.select(keys.column_names).cast(keys.schema) for t in (flushed, waiting)]
        )
        return both.group_by(keys.column_names).aggregate([])

    found = await run_engine(held)
    if found.num_rows:
        shown = ", ".join(str(row) for row in found.slice(0, _SHOWN).to_pylist())
        more = f" and {found.num_rows - _SHOWN:,} more" if found.num_rows > _SHOWN else ""
        raise InvalidInputError(
            f"a base-table merge into {dataset.uri} is refused: the MemWAL holds key(s) "
            f"{shown}{more} not compacted yet (in flushed generations or the WAL), and "
            f"compaction would write its rows over this merge's; {_WHAT_TO_DO}"
        )


async def whole_rows(dataset: Table, rows: pa.Table) -> pa.Table:
    """``rows`` with every table column: those it lacks filled from the stored
    row of its key (an LSM point lookup), or null for a key the table lacks.

    A MemWAL put replaces a key's whole row; this makes a put of partial rows
    mean what a base-table merge of them means. The stored values are read
    just before the put: a write of the same key by another writer in between
    is overwritten, as whole rows are (newest wins per key).

    Raises
    ------
    SchemaMismatchError
        A new key (one the table lacks) without a value for a non-nullable column.
    """
    schema = dataset.schema
    missing = [f.name for f in schema if f.name not in rows.column_names]
    if not missing or not rows.num_rows:
        return rows.select([n for n in schema.names if n in rows.column_names])
    key = list(dataset.primary_key)
    stored = await LsmReader(dataset).point_lookups(rows.select(key), [*key, *missing])

    def join() -> pa.Table:
        import numpy as np
        import pyarrow.compute as pc

        # positions only through the hash join: it takes no nested payload (vectors)
        left = rows.select(key).append_column("__row", pa.array(np.arange(rows.num_rows)))
        right = stored.select(key).append_column("__stored", pa.array(np.arange(stored.num_rows)))
        matched = left.join(right, keys=key, join_type="left outer")
        positions = matched["__stored"].take(pc.sort_indices(matched["__row"]))
        columns = [
            rows.column(f.name) if f.name in rows.column_names else stored[f.name].take(positions)
            for f in schema
        ]
        return pa.Table.from_arrays(columns, names=schema.names)

    table = await run_engine(join)
    for name in missing:
        if not schema.field(name).nullable and table.column(name).null_count:
            raise SchemaMismatchError(
                f"the source lacks column {name!r}, which is not nullable: a row of a key the "
                "table does not hold yet needs it (give the column, at least for new keys)",
                field=name,
            )
    return table.cast(schema)
