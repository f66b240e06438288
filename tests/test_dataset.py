"""AsyncDataset reads and mutations against the real engine (asyncio and trio)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TypedDict

import anyio
import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_async as la

from .helpers import KV_SCHEMA, Ticker, kv_table


def wide_table(n: int, cols: int = 10) -> pa.Table:
    rng = np.random.default_rng(0)
    data = {"id": pa.array(np.arange(n), pa.int64())}
    for c in range(cols - 1):
        data[f"c{c}"] = pa.array(rng.random(n))
    return pa.table(data)


@pytest.fixture
def wide(tmp_path: Path) -> str:
    uri = str(tmp_path / "wide.lance")
    lance.write_dataset(wide_table(20_000), uri, max_rows_per_file=5_000)
    return uri


class ScanOptions(TypedDict, total=False):
    """The scanner options the scan cases give, as both pylance and lance_async name them."""

    columns: list[str]
    filter: str
    limit: int
    offset: int
    batch_size: int
    with_row_id: bool


SCANS: list[ScanOptions] = [
    {},
    {"columns": ["id", "c3"]},
    {"filter": "c1 > 0.5"},
    {"filter": "id % 7 = 0", "columns": ["c0", "id"]},
    {"limit": 123},
    {"limit": 50, "offset": 9_000},
    {"offset": 19_990},
    {"batch_size": 777, "columns": ["id"]},
    {"with_row_id": True, "columns": ["id"]},
]


@pytest.mark.asyncio
@pytest.mark.parametrize("options", SCANS, ids=lambda o: ",".join(o) or "all")
async def test_async_scan_equals_sync_to_table(wide: str, options: ScanOptions) -> None:
    ds = await la.open_dataset(wide)
    expected = lance.dataset(wide).to_table(**options)
    stream = ds.scan(**options)
    got = await stream.to_table()
    assert got.equals(expected)
    assert stream.state is la.StreamState.CLOSED
    assert got.schema.equals(stream.schema)
    assert await ds.to_table(**options) == expected


@pytest.mark.asyncio
async def test_100_early_breaks_leave_no_thread(wide: str, no_stream_threads: None) -> None:
    ds = await la.open_dataset(wide)
    for _ in range(100):
        async for batch in ds.scan(batch_size=100):
            assert batch.num_rows == 100
            break


@pytest.mark.asyncio
async def test_leaving_a_scan_context_closes_it(wide: str, no_stream_threads: None) -> None:
    ds = await la.open_dataset(wide)
    async with ds.scan(batch_size=10) as stream:
        await stream.__anext__()
    assert stream.state is la.StreamState.CLOSED
    with pytest.raises(la.ClosedError):
        await stream.__anext__()


@pytest.mark.asyncio
async def test_scan_errors_are_raised_from_the_stream(wide: str) -> None:
    ds = await la.open_dataset(wide)
    with pytest.raises((ValueError, OSError, la.LanceAsyncError)):
        await ds.scan(filter="no_such_column > 1").to_table()


@pytest.mark.asyncio
async def test_reads_and_versions(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(100)), table_uri)
    assert ds.version == 1 and await ds.latest_version() == 1
    assert await ds.count_rows() == 100
    assert await ds.count_rows("id < 10") == 10
    assert (await ds.take([5, 0, 99], columns=["id"])).column("id").to_pylist() == [5, 0, 99]
    assert (await ds.head(3)).num_rows == 3
    assert ds.primary_key == ["id"]
    other = await la.open_dataset(table_uri)
    await other.delete("id >= 90")
    assert other.version == 2 and await ds.latest_version() == 2
    assert ds.version == 1  # a reader is not moved under its feet
    old = await other.checkout(1)
    assert await old.count_rows() == 100
    await ds.refresh()
    assert await ds.count_rows() == 90
    versions = await ds.versions()
    assert [v["version"] for v in versions] == [1, 2]


@pytest.mark.asyncio
async def test_mutations_move_the_dataset(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(50)), table_uri)
    result = await ds.update({"value": "value + 5"}, where="id < 10")
    assert result["num_rows_updated"] == 10
    assert await ds.count_rows("value = 5") == 10
    await ds.delete("id >= 40")
    assert await ds.count_rows() == 40
    await ds.create_scalar_index("id", "BTREE")
    assert [d.field_names for d in ds.lance.describe_indices()] == [["id"]]
    await la.write_dataset(kv_table(range(100, 110)), table_uri, mode="append")
    await ds.refresh()
    metrics = await ds.compact_files()
    assert metrics is not None
    assert await ds.count_rows() == 50
    stats = await ds.cleanup_old_versions(older_than=timedelta(seconds=0))
    assert stats is not None
    assert await ds.count_rows() == 50


@pytest.mark.asyncio
async def test_vector_index_and_nearest_scan(table_uri: str) -> None:
    n, dim = 512, 8
    rng = np.random.default_rng(1)
    vecs = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * dim, dtype=np.float32)), dim)
    ds = await la.write_dataset(pa.table({"id": np.arange(n), "vec": vecs}), table_uri)
    await ds.create_index("vec", "IVF_PQ", num_partitions=2, num_sub_vectors=2)
    query = vecs[17].values.to_numpy()
    got = await ds.scan(nearest={"column": "vec", "q": query, "k": 5}).to_table()
    assert got.num_rows == 5 and "_distance" in got.column_names


@pytest.mark.asyncio
async def test_missing_dataset_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(la.DatasetNotFoundError):
        await la.open_dataset(tmp_path / "nope.lance")


@pytest.mark.asyncio
async def test_write_dataset_modes_and_bad_mode(table_uri: str) -> None:
    await la.write_dataset(kv_table(range(3)), table_uri)
    with pytest.raises(la.InvalidInputError, match="mode='append'"):
        await la.write_dataset(kv_table(range(3)), table_uri)  # already exists
    with pytest.raises(la.SchemaMismatchError, match="appended"):
        await la.write_dataset(pa.table({"id": [1], "other": [2]}), table_uri, mode="append")
    with pytest.raises(la.SchemaMismatchError, match="appended"):
        await la.write_dataset(pa.table({"id": ["x"]}), table_uri, mode="append")
    assert await (await la.open_dataset(table_uri)).count_rows() == 3  # nothing written
    ds = await la.write_dataset(kv_table(range(5)), table_uri, mode="overwrite")
    assert await ds.count_rows() == 5
    with pytest.raises(ValueError, match="mode"):
        await la.write_dataset(kv_table(range(3)), table_uri, mode="upsert")


@pytest.mark.asyncio
async def test_loop_stays_free_during_a_1m_row_scan(tmp_path: Path) -> None:
    uri = str(tmp_path / "big.lance")
    lance.write_dataset(wide_table(1_000_000), uri)
    ds = await la.open_dataset(uri)
    ticker = Ticker()
    rows = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        async for batch in ds.scan():
            rows += batch.num_rows
        ticker.running = False
    assert rows == 1_000_000
    ticker.assert_free()


@pytest.mark.asyncio
async def test_kv_schema_round_trips(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(3)), table_uri)
    assert ds.schema.equals(KV_SCHEMA, check_metadata=True)


@pytest.mark.asyncio
async def test_regression_bad_paths_columns_and_versions_are_typed(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(3)), uri)
    with pytest.raises(la.SchemaMismatchError, match="nocol"):
        ds.scan(columns=["nocol"])
    not_a_table = tmp_path / "file.txt"
    not_a_table.write_text("hello")
    with pytest.raises(la.DatasetNotFoundError):
        await la.open_dataset(not_a_table)
    with pytest.raises(la.DatasetNotFoundError, match="no version 999"):
        await la.open_dataset(uri, version=999)
    with pytest.raises(la.DatasetNotFoundError, match="no version 999"):
        await ds.checkout(999)


@pytest.mark.asyncio
async def test_a_dataset_is_an_async_context_manager_that_releases_nothing(
    tmp_path: Path,
) -> None:
    # issue 26, case 9: `async with ds` was a TypeError
    async with await la.write_dataset(kv_table(range(3)), tmp_path / "t.lance") as ds:
        assert await ds.count_rows() == 3
    assert await ds.count_rows() == 3  # still usable: nothing was closed
