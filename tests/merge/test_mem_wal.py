"""merge_insert through the MemWAL (``via_mem_wal``), on the real engine
(asyncio and trio): the same table as the base-table path once compacted,
and every shape the MemWAL cannot express refused with a reason."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

import lance_async as la

from ..helpers import KV_SCHEMA, kv_table, rows_by_key


def upsert(ds: la.AsyncDataset) -> la.AsyncMergeInsertBuilder:
    return ds.merge_insert().when_matched_update_all().when_not_matched_insert_all()


async def sorted_rows(ds: la.AsyncDataset) -> list[dict[str, object]]:
    return sorted((await ds.to_table()).to_pylist(), key=lambda r: r["id"])


@pytest.mark.asyncio
async def test_upserts_through_the_mem_wal_end_as_the_base_table_path(tmp_path: Path) -> None:
    base = kv_table(range(20))
    wal = await la.write_dataset(base, tmp_path / "wal.lance")
    await wal.initialize_mem_wal()  # bucket sharding on id, 4 buckets
    table = await la.write_dataset(base, tmp_path / "table.lance")

    first = kv_table(range(15, 30), value=1)  # updates 15-19, inserts 20-29
    deletes = kv_table([3, 4, 99])  # 99 is no key of the table
    repeated = pa.concat_tables([kv_table([5, 40], value=2), kv_table([5], value=3)])

    result = await upsert(wal).via_mem_wal().execute(first)  # a router for this call
    assert result.mem_wal is not None and result.mem_wal.rows == 15 and result.committed
    assert (result.num_inserted_rows, result.version) == (0, wal.version)
    assert await wal.count_rows() == 20  # nothing committed to the base table
    assert (await wal.lsm.point_lookup(25)).column("value").to_pylist() == [1]

    async with wal.mem_wal_writer() as router:  # an app's open writer, shared
        deleted = (
            await wal.merge_insert().when_matched_delete().via_mem_wal(router).execute(deletes)
        )
        assert deleted.mem_wal is not None and deleted.mem_wal.deletes == 3
        last = await upsert(wal).duplicate_keys("keep_last").via_mem_wal(router).execute(repeated)
        assert last.mem_wal is not None and last.mem_wal.rows == 2
        assert (await router.lsm.point_lookup(5)).column("value").to_pylist() == [3]
        assert (await router.lsm.point_lookup(3)).num_rows == 0

    await upsert(table).execute(first)
    await table.merge_insert().when_matched_delete().execute(deletes)
    await upsert(table).duplicate_keys("keep_last").execute(repeated)

    lsm = await wal.lsm.scan().to_table()
    assert rows_by_key(lsm) == rows_by_key(await table.to_table())
    compaction = await wal.compact_mem_wal()
    assert compaction.rows_deleted == 2  # 3 and 4; 99 never existed
    assert await sorted_rows(wal) == await sorted_rows(table)


SHAPES: dict[str, Callable[[la.AsyncMergeInsertBuilder], object]] = {
    "when_matched_update_all": lambda b: b.when_matched_update_all("target.value < source.value"),
    "when_matched_fail": lambda b: b.when_matched_fail(),
    "when_not_matched_by_source_delete": lambda b: b.when_not_matched_by_source_delete(),
    "use_index": lambda b: b.use_index(False),
    "write_mode": lambda b: b.write_mode("rewrite_rows"),
}

INCOMPLETE: dict[str, Callable[[la.AsyncMergeInsertBuilder], object]] = {
    "when_not_matched_insert_all": lambda b: b.when_not_matched_insert_all(),
    "when_matched_update_all": lambda b: b.when_matched_update_all(),
    "when_matched_delete": lambda b: b.when_matched_delete().when_not_matched_insert_all(),
}


@pytest.mark.asyncio
async def test_shapes_the_mem_wal_cannot_express_are_refused_with_the_reason(
    table_uri: str,
) -> None:
    ds = await la.write_dataset(kv_table(range(3)), table_uri)
    await ds.initialize_mem_wal()
    for clause, add in SHAPES.items():
        with pytest.raises(la.MergeShapeError) as before:  # a clause, then via_mem_wal
            add(ds.merge_insert()).via_mem_wal()  # type: ignore[attr-defined]
        with pytest.raises(la.MergeShapeError) as after:  # via_mem_wal, then the clause
            add(ds.merge_insert().via_mem_wal())
        assert before.value.clause == after.value.clause == clause
        assert isinstance(before.value, ValueError) and "MemWAL" in str(before.value)
    for clause, add in INCOMPLETE.items():
        builder = ds.merge_insert().via_mem_wal()
        add(builder)
        with pytest.raises(la.MergeShapeError, match="through the MemWAL") as info:
            await builder.execute(kv_table([7]))
        assert info.value.clause == clause
    with pytest.raises(la.MergeShapeError, match="primary key"):
        ds.merge_insert("value").via_mem_wal()
    with pytest.raises(la.MergeShapeError):
        await upsert(ds).via_mem_wal().execute_uncommitted(kv_table([7]))
    with pytest.raises(TypeError):
        upsert(ds).via_mem_wal(writer=ds)  # type: ignore[arg-type]
    with pytest.raises(la.DuplicateKeyError):
        await upsert(ds).via_mem_wal().execute(kv_table([7, 7]))
    assert (await ds.lsm.snapshots()) == [] or all(
        not s.sstables for s in await ds.lsm.snapshots()
    )  # nothing of the refused merges was written
    empty = await upsert(ds).via_mem_wal().execute([], schema=KV_SCHEMA)
    assert not empty.committed and empty.mem_wal == la.PutSummary(0, 0, 0)


@pytest.mark.asyncio
async def test_tables_the_mem_wal_path_cannot_route(tmp_path: Path) -> None:
    plain = await la.write_dataset(kv_table(range(3)), tmp_path / "plain.lance")
    with pytest.raises(la.InvalidInputError, match="via_mem_wal"):
        await upsert(plain).via_mem_wal().execute(kv_table([1], value=5))

    manual = await la.write_dataset(kv_table(range(3)), tmp_path / "manual.lance")
    await manual.initialize_mem_wal(manual_shards=True)
    # manual shards: lance_async's default shard, the one `lance-async ingest` writes
    done = await upsert(manual).via_mem_wal().execute(kv_table([2], value=6))
    assert done.mem_wal is not None and done.mem_wal.rows == 1
    assert (await manual.lsm.point_lookup(2)).column("value").to_pylist() == [6]
    async with manual.mem_wal_writer(str(uuid.uuid4())) as writer:  # one shard, named
        result = await upsert(manual).via_mem_wal(writer).execute(kv_table([1], value=5))
        assert result.mem_wal is not None and result.mem_wal.rows == 1
        assert (await writer.lsm.point_lookup(1)).column("value").to_pylist() == [5]
