"""The one write rule of a table with a MemWAL, on the real engine: a merge
goes through the MemWAL unless the base table is asked for, and then it is
refused while the MemWAL holds any of its keys; partial rows mean the same
on both paths; a merge cancelled before its commit commits nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import lance
import pyarrow as pa
import pytest

import lance_async as la

from ..helpers import KV_SCHEMA, kv_table, rows_by_key

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # routing is backend-independent; the cancellation test below runs on both


def upsert(ds: la.AsyncDataset) -> la.AsyncMergeInsertBuilder:
    return ds.merge_insert().when_matched_update_all().when_not_matched_insert_all()


async def mem_wal_table(path: Path) -> la.AsyncDataset:
    ds = await la.write_dataset(kv_table(range(5)), path)
    await ds.initialize_mem_wal()
    return ds


async def test_a_merge_into_a_mem_wal_table_goes_through_it_and_survives_compaction(
    tmp_path: Path,
) -> None:
    # issue 26 case 2: ingest "older", merge "newer", compact -> the base held "older"
    ds = await mem_wal_table(tmp_path / "t.lance")
    async with ds.mem_wal_writer() as writer:
        await writer.put(kv_table([3], value=1))  # older
    result = await upsert(ds).execute(kv_table([3], value=2))  # newer, no via_mem_wal()
    assert result.mem_wal is not None and result.mem_wal.rows == 1
    assert result.version == lance.dataset(str(tmp_path / "t.lance")).version  # no new version
    assert (await ds.lsm.point_lookup(3)).column("value").to_pylist() == [2]
    await ds.compact_mem_wal()
    assert rows_by_key(await ds.to_table())[3]["value"] == 2


async def test_a_base_table_merge_is_refused_while_the_mem_wal_holds_its_keys(
    tmp_path: Path,
) -> None:
    ds = await mem_wal_table(tmp_path / "t.lance")
    async with ds.mem_wal_writer() as writer:  # closed: flushed generations
        await writer.put(kv_table([3, 100], value=1))
    version = (await la.open_dataset(tmp_path / "t.lance")).version
    with pytest.raises(la.InvalidInputError, match=r"holds key\(s\) \{'id': 3\}") as info:
        await upsert(ds).via_base_table().execute(kv_table([2, 3], value=9))
    assert "lance-async compact" in str(info.value) and "via_base_table" in str(info.value)
    assert (await la.open_dataset(tmp_path / "t.lance")).version == version  # nothing committed
    other = await upsert(ds).via_base_table().execute(kv_table([2, 7], value=9))  # keys it lacks
    assert other.mem_wal is None and other.num_updated_rows == 1 and other.num_inserted_rows == 1
    await ds.compact_mem_wal()
    again = await upsert(ds).via_base_table().execute(kv_table([3], value=9))
    assert again.num_updated_rows == 1
    assert rows_by_key(await ds.to_table())[3]["value"] == 9


async def test_a_base_table_merge_is_refused_while_a_wal_tail_holds_its_keys(
    tmp_path: Path,
) -> None:
    ds = await mem_wal_table(tmp_path / "t.lance")
    async with ds.mem_wal_writer() as writer:
        await writer.put(kv_table([50], value=1))  # durable, in the WAL, not flushed
        with pytest.raises(la.InvalidInputError, match=r"\{'id': 50\} not compacted yet"):
            await upsert(ds).via_base_table().execute(kv_table([1, 50], value=9))
        done = await upsert(ds).via_base_table().execute(kv_table([1], value=9))
        assert done.num_updated_rows == 1


async def test_shapes_without_a_mem_wal_form_say_how_to_reach_the_base_table(
    tmp_path: Path,
) -> None:
    ds = await mem_wal_table(tmp_path / "t.lance")
    with pytest.raises(la.MergeShapeError, match=r"has a MemWAL.*via_base_table"):
        await ds.merge_insert().when_matched_update_all().execute(kv_table([1], value=3))
    done = (
        await ds.merge_insert()
        .when_matched_update_all()
        .via_base_table()
        .execute(kv_table([1], value=3))
    )
    assert done.num_updated_rows == 1


async def test_partial_rows_keep_stored_values_on_both_paths(tmp_path: Path) -> None:
    # issue 26 case 3: a missing column keeps the stored value on update, null on insert
    partial = pa.table({"id": pa.array([1, 9], pa.int64()), "value": pa.array([7, 8], pa.int64())})
    plain = await la.write_dataset(kv_table(range(5)), tmp_path / "plain.lance")
    await upsert(plain).execute(partial)
    via_wal = await mem_wal_table(tmp_path / "wal.lance")
    await upsert(via_wal).execute(partial)
    expected = {1: {"id": 1, "value": 7, "name": "n1"}, 9: {"id": 9, "value": 8, "name": None}}
    plain_rows = rows_by_key(await plain.to_table())
    assert {k: plain_rows[k] for k in (1, 9)} == expected
    assert rows_by_key(await via_wal.lsm.point_lookups([1, 9])) == expected
    await via_wal.compact_mem_wal()
    assert rows_by_key(await via_wal.to_table()) == plain_rows


async def test_a_new_key_lacking_a_required_column_is_refused(tmp_path: Path) -> None:
    schema = pa.schema([*KV_SCHEMA, pa.field("must", pa.int64(), nullable=False)])
    table = kv_table(range(3)).append_column("must", pa.array([0, 1, 2], pa.int64()))
    ds = await la.write_dataset(table.cast(schema), tmp_path / "t.lance")
    await ds.initialize_mem_wal()
    rows = pa.table({"id": pa.array([1, 60], pa.int64()), "value": pa.array([1, 1], pa.int64())})
    with pytest.raises(la.SchemaMismatchError, match="'must'"):
        await upsert(ds).execute(rows)
    done = await upsert(ds).execute(rows.slice(0, 1))  # a stored key: keeps its value
    assert done.mem_wal is not None
    assert (await ds.lsm.point_lookup(1)).column("must").to_pylist() == [1]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_merge_cancelled_before_its_commit_stops_and_commits_nothing(
    tmp_path: Path,
) -> None:
    ds = await la.write_dataset(kv_table(range(5)), tmp_path / "t.lance")
    started = threading.Event()
    served: list[int] = []

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(100_000):  # far more than the engine reads before the cancel lands
            served.append(i)
            started.set()
            yield kv_table([1_000 + i], value=1).to_batches()[0]

    source = la.replayable(batches, schema=KV_SCHEMA)
    builder = upsert(ds)
    async with anyio.create_task_group() as tg:
        tg.start_soon(builder.execute, source)
        with anyio.fail_after(60):
            while not started.is_set():  # noqa: ASYNC110 - the engine thread sets it
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert builder.last_result is None
    assert lance.dataset(str(tmp_path / "t.lance")).version == 1  # nothing committed
    assert len(served) < 100_000  # the engine stopped reading
