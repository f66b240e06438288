"""merge_insert through the MemWAL: which clauses have a MemWAL form, and the put.

``merge_insert(...).via_mem_wal()`` sends an upsert to the table's shard
writers instead of committing it to the base table, as LanceDB routes
``merge_insert`` into Lance's MemWAL when a table has an LSM write spec
(lancedb ``python/python/tests/test_lsm_write_spec.py``: the upsert shape
only, on the primary key, the whole input checked and then put).

A MemWAL put replaces a key's row without reading what the table holds, and
a MemWAL delete removes a key the same way. So exactly two shapes have a
MemWAL form:

``when_matched_update_all().when_not_matched_insert_all()``
    an upsert: every source row is put (newest row per key wins in LSM reads
    and in compaction, as on the base table);
``when_matched_delete()``
    a delete by key: every source key is deleted (a key the table lacks
    stays absent, as on the base table).

Every other clause depends on the row the table holds, and is refused with
:class:`~lance_async.errors.MergeShapeError` saying why (see
:data:`REFUSED`). This module only decides and puts; the builder reads the
source (``builder.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from .._table import Table
from ..errors import InvalidInputError, MergeShapeError
from ..memwal.acks import PutSummary
from ..memwal.router import ShardRouter
from ..memwal.sharding import read_sharding
from ..memwal.writer import AsyncShardWriter

__all__ = [
    "REFUSED",
    "MemWalWriter",
    "check_join",
    "check_step",
    "check_writer",
    "mem_wal_kind",
    "put_via_mem_wal",
]

MemWalWriter = ShardRouter | AsyncShardWriter
"""What ``via_mem_wal(writer=...)`` takes: the routing writer or one shard's writer."""

_BLIND = "a MemWAL put replaces a key's row without reading what the table holds"

#: Builder steps with no MemWAL form, and why.
REFUSED: dict[str, str] = {
    "when_matched_fail": (
        f"failing when a key exists needs to know which keys exist, and {_BLIND}"
    ),
    "when_not_matched_by_source_delete": (
        "deleting the rows the source lacks needs every row of the table, and the MemWAL "
        "only writes the keys it is given"
    ),
    "use_index": "it tunes the join of a base-table merge; the MemWAL path joins nothing",
    "write_mode": "it chooses how a base-table merge rewrites files; the MemWAL writes none",
    "data_storage_version": "it chooses the file format of a base-table merge",
    "mark_sstables_as_compacted": (
        "it records a compaction in a base-table commit; compact_mem_wal() does that"
    ),
}

_ADVICE = (
    "; merge into the base table with via_base_table() (a new version; refused while the "
    "MemWAL holds any of its keys), or upsert through the MemWAL with "
    "when_matched_update_all().when_not_matched_insert_all()"
)


def check_step(name: str, args: Sequence[Any]) -> None:
    """Refuse a builder step that has no MemWAL form (pure; does not block).

    Raises
    ------
    MergeShapeError
        ``name`` is in :data:`REFUSED`, or is ``when_matched_update_all`` with
        a condition.
    """
    if name in REFUSED:
        raise MergeShapeError(
            f"{name}() cannot run through the MemWAL: {REFUSED[name]}{_ADVICE}", clause=name
        )
    if name == "when_matched_update_all" and args and args[0] is not None:
        raise MergeShapeError(
            "when_matched_update_all(condition) cannot run through the MemWAL: the condition "
            f"reads the target row, and {_BLIND}; drop the condition{_ADVICE}",
            clause=name,
        )


def mem_wal_kind(steps: Sequence[tuple[str, tuple[Any, ...]]]) -> str:
    """``"upsert"`` or ``"delete"``: the MemWAL form of a complete builder.

    Raises
    ------
    MergeShapeError
        A step without a MemWAL form, or a combination of steps that has none
        (insert only, update only, delete matched and insert the rest, nothing).
    """
    for name, args in steps:
        check_step(name, args)
    names = {name for name, _ in steps}
    update = "when_matched_update_all" in names
    insert = "when_not_matched_insert_all" in names
    delete = "when_matched_delete" in names
    if update and insert and not delete:
        return "upsert"
    if delete and not (update or insert):
        return "delete"
    if insert and not update:
        clause = "when_not_matched_insert_all"
        why = (
            "insert-only must leave existing keys as they are, but "
            f"{_BLIND} (an existing key would be overwritten)"
        )
        if delete:
            clause = "when_matched_delete"
            why = (
                "deleting matched keys and inserting the others needs to know which exist; "
                + _BLIND
            )
    elif update and not insert:
        clause = "when_matched_update_all"
        why = f"update-only must not insert new keys, but {_BLIND} (a new key would be inserted)"
    elif delete:
        clause = "when_matched_delete"
        why = "a delete and an update of the same matched key contradict each other"
    else:
        clause = None
        why = "the builder says nothing to do (no when_... clause)"
    raise MergeShapeError(
        f"this merge_insert cannot run through the MemWAL: {why}{_ADVICE}", clause=clause
    )


def check_join(on: Sequence[str], primary_key: Sequence[str]) -> None:
    """The MemWAL resolves rows by primary key: the join must be on it.

    Raises
    ------
    InvalidInputError
        The table declares no primary key (it can have no MemWAL).
    MergeShapeError
        ``on`` is not the primary key.
    """
    if not primary_key:
        raise InvalidInputError(
            "the table declares no primary key, so it has no MemWAL; merge into the base table"
        )
    if sorted(on) != sorted(primary_key):
        raise MergeShapeError(
            f"through the MemWAL a merge joins on the primary key {list(primary_key)}, "
            f"not {list(on)}: the MemWAL keeps the newest row per primary key",
            clause="on",
        )


def check_writer(writer: object, schema: pa.Schema) -> MemWalWriter | None:
    """``writer`` if it can carry this table's rows (pure; does not block).

    Raises
    ------
    TypeError
        Not a :class:`~lance_async.ShardRouter` or :class:`~lance_async.AsyncShardWriter`.
    ValueError
        A writer of a table with another schema.
    """
    if writer is None:
        return None
    if not isinstance(writer, (ShardRouter, AsyncShardWriter)):
        raise TypeError(
            "via_mem_wal(writer=...) takes a ShardRouter or an AsyncShardWriter of this table, "
            f"got {type(writer).__name__}"
        )
    if not writer.schema.equals(schema):
        raise ValueError("via_mem_wal(writer=...) got a writer of a table with another schema")
    return writer


async def put_via_mem_wal(
    dataset: Table, writer: MemWalWriter | None, kind: str, rows: pa.Table
) -> PutSummary:
    """Put (``kind="upsert"``) or delete by key (``"delete"``) ``rows`` through
    ``writer``, or through a routing writer opened for this call; resolves
    when the writer acknowledged them (durable with ``durable_write``, the
    default).

    Raises
    ------
    InvalidInputError
        (no writer given) the table has no MemWAL. A table with manual
        shards is written through lance_async's default shard (as ``ingest``).
    WrongShardError
        A row of another shard sent to one shard's writer (nothing queued).
    ClosedError, WriterFailedError, FencedError, BackpressureTimeoutError
        As the writer's ``put`` / ``delete``.
    """
    if writer is not None:
        return await _put(writer, kind, rows, dataset.primary_key)
    try:
        sharding = await read_sharding(dataset)
        # a table with manual shards: lance_async's one default shard (as ingest writes it)
        opened: MemWalWriter = (
            ShardRouter(dataset)
            if sharding.sharded
            else AsyncShardWriter(dataset, sharding.default_shard())
        )
        router = await opened.__aenter__()
    except InvalidInputError as exc:
        raise InvalidInputError(
            f"merge_insert(...).via_mem_wal() cannot route these rows: {exc} "
            "(or pass an open writer: via_mem_wal(writer=...))"
        ) from exc
    try:
        return await _put(router, kind, rows, dataset.primary_key)
    finally:
        await router.aclose()


async def _put(writer: MemWalWriter, kind: str, rows: pa.Table, keys: Sequence[str]) -> PutSummary:
    if kind == "delete":
        return await writer.delete(rows.select(list(keys)))
    return await writer.put(rows)
