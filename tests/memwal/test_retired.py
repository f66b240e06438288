"""Retired shards: an overwrite, then initialize_mem_wal, never brings old rows back."""

from __future__ import annotations

from pathlib import Path

import anyio
import lance
import pyarrow as pa
import pytest

import lance_async as la

from ..helpers import kv_table
from .support import mem_wal_table, sid


@pytest.mark.asyncio
async def test_an_overwrite_then_initialize_retires_the_old_shards(table_uri: str) -> None:
    """pylance keeps the old table's shard folders through an overwrite; the
    new MemWAL must neither read them nor let a writer replay them."""
    ds = await mem_wal_table(table_uri)
    old_shard = sid()
    async with ds.mem_wal_writer(old_shard) as writer:
        await writer.put(kv_table(range(100, 110), value=1))  # flushed at close

    ds = await la.write_dataset(kv_table(range(1)), table_uri, mode="overwrite")
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(sid()) as writer:
        await writer.put(kv_table(range(200, 205), value=2))
        seen = await writer.lsm.scan(columns=["id"]).to_table()
        assert sorted(seen.column("id").to_pylist()) == [0, *range(200, 205)]

    ds = await la.open_dataset(table_uri)
    assert old_shard not in {s.shard_id for s in await ds.lsm.snapshots()}
    table = await ds.lsm.scan(columns=["id"]).to_table()
    assert sorted(table.column("id").to_pylist()) == [0, *range(200, 205)]
    assert (await ds.lsm.point_lookup(100)).num_rows == 0
    with pytest.raises(la.InvalidInputError, match="replaced"):
        async with ds.mem_wal_writer(old_shard):
            pass
    # compaction takes only the new MemWAL's rows into the base table
    await ds.compact_mem_wal()
    base = await ds.to_table(columns=["id"])
    assert sorted(base.column("id").to_pylist()) == [0, *range(200, 205)]


@pytest.mark.asyncio
async def test_a_mem_wal_needs_a_primary_key(table_uri: str) -> None:
    plain = pa.table({"id": pa.array([1, 2], pa.int64()), "value": [0.5, 1.5]})
    ds = await la.write_dataset(plain, table_uri)
    with pytest.raises(la.InvalidInputError, match="primary key"):
        await ds.initialize_mem_wal()
    assert ds.version == 1 and await ds.mem_wal_index_details() is None
    # a MemWAL initialized through pylance directly: the writer refuses to open
    await anyio.to_thread.run_sync(lambda: lance.dataset(table_uri).initialize_mem_wal())
    ds = await la.open_dataset(table_uri)
    with pytest.raises(la.InvalidInputError, match="primary key"):
        async with ds.mem_wal_writer(sid()):
            pass


@pytest.mark.asyncio
async def test_old_shards_stay_hidden_at_every_step_of_an_overwrite(table_uri: str) -> None:
    """Between the overwrite and initialize_mem_wal, and between its two
    commits, no reader sees the old rows and no writer can reach them."""
    ds = await mem_wal_table(table_uri)
    old_shard = sid()
    async with ds.mem_wal_writer(old_shard) as writer:
        await writer.put(kv_table(range(100, 110), value=1))
    stale = await la.open_dataset(table_uri)  # a handle from before the overwrite

    ds = await la.write_dataset(kv_table(range(1)), table_uri, mode="overwrite")
    # no MemWAL at this version: the old shard folders are not shards of it
    assert await ds.lsm.snapshots() == []
    assert (await ds.lsm.scan(columns=["id"]).to_table()).column("id").to_pylist() == [0]
    assert (await ds.lsm.point_lookup(100)).num_rows == 0

    await ds.initialize_mem_wal(manual_shards=True)
    # the record of retired shards was committed first, then the MemWAL
    between = await anyio.to_thread.run_sync(
        lambda: lance.dataset(table_uri, version=ds.version - 1)
    )
    assert "lance_async.mem_wal.retired_shards" in between.config()
    assert between.mem_wal_index_details() is None
    # a handle from before, or another spelling of the id, cannot reopen the old shard
    for handle, spelling in ((stale, old_shard), (ds, old_shard.upper())):
        with pytest.raises(la.InvalidInputError, match="replaced"):
            async with handle.mem_wal_writer(spelling):
                pass
    table = await ds.lsm.scan(columns=["id"]).to_table()
    assert table.column("id").to_pylist() == [0]


@pytest.mark.asyncio
async def test_initialize_mem_wal_reads_the_latest_schema_and_state(table_uri: str) -> None:
    keyed = await la.write_dataset(kv_table(range(2)), table_uri)
    plain = pa.table({"id": pa.array([1], pa.int64()), "value": [0.5]})
    await anyio.to_thread.run_sync(lambda: lance.write_dataset(plain, table_uri, mode="overwrite"))
    with pytest.raises(la.InvalidInputError, match="primary key"):
        await keyed.initialize_mem_wal()  # the handle is stale; the table has no key now
    assert lance.dataset(table_uri).mem_wal_index_details() is None

    uri = table_uri + "2"
    first = await la.write_dataset(kv_table(range(2)), uri)
    second = await la.open_dataset(uri)
    outcomes: list[BaseException | None] = []

    async def init(handle: la.AsyncDataset) -> None:
        try:
            await handle.initialize_mem_wal()
            outcomes.append(None)
        except Exception as exc:  # the test checks its type below
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(init, first)
        tg.start_soon(init, second)
    assert outcomes.count(None) == 1, outcomes
    (lost,) = [o for o in outcomes if o is not None]
    assert isinstance(lost, la.InvalidInputError), repr(lost)


@pytest.mark.asyncio
async def test_the_example_server_derives_a_fresh_shard_after_an_overwrite(
    tmp_path: Path,
) -> None:
    from lance_async.web.server import discover_tables

    uri = str(tmp_path / "events.lance")
    ds = await mem_wal_table(uri)
    first = (await discover_tables(tmp_path))["events"].shard_id
    assert first is not None
    async with ds.mem_wal_writer(first) as writer:
        await writer.put(kv_table(range(100, 105)))
    ds = await la.write_dataset(kv_table(range(1)), uri, mode="overwrite")
    await ds.initialize_mem_wal(manual_shards=True)
    second = (await discover_tables(tmp_path))["events"].shard_id
    assert second is not None and second != first
    async with ds.mem_wal_writer(second) as writer:  # opens: not a retired shard
        await writer.put(kv_table(range(200, 202)))
    table = await ds.lsm.scan(columns=["id"]).to_table()
    assert sorted(table.column("id").to_pylist()) == [0, 200, 201]


@pytest.mark.asyncio
async def test_the_routing_writer_gets_fresh_shards_after_an_overwrite(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=2)
    async with ds.mem_wal_writer() as router:
        await router.put(kv_table(range(100, 140), value=1))
        first = set(router.writers)
    ds = await la.write_dataset(kv_table(range(1)), table_uri, mode="overwrite")
    await ds.initialize_mem_wal(bucket_column="id", num_buckets=2)
    async with ds.mem_wal_writer() as router:
        await router.put(kv_table(range(500, 540), value=2))
        second = set(router.writers)
    assert len(first) == len(second) == 2 and not first & second
    table = await ds.lsm.scan(columns=["id"]).to_table()
    assert sorted(table.column("id").to_pylist()) == [0, *range(500, 540)]


@pytest.mark.asyncio
async def test_mem_wal_index_details_and_initialize_arguments(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(3)), table_uri)
    assert await ds.mem_wal_index_details() is None
    await ds.initialize_mem_wal(durable_write=False, max_memtable_rows=5_000)
    details = await ds.mem_wal_index_details()
    assert details is not None
    assert details["writer_config_defaults"]["max_memtable_rows"] == "5000"
    # no sharding option: bucket sharding on the primary key, lance_async's default
    sharding = await ds.sharding()
    assert (sharding.kind, sharding.column, sharding.num_buckets) == ("bucket", "id", 4)
    async with ds.mem_wal_writer(sharding.shard_ids()[0]) as writer:
        assert writer.max_put_rows <= 5_000
    assert lance.dataset(table_uri).mem_wal_index_details() is not None
