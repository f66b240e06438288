"""Plain reads with LanceDB's ``use_lsm=`` switch, and the hint a plain read gives once."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest

import lance_async as la

from ..helpers import kv_table

pytestmark = pytest.mark.anyio

HINT = "sees the base table only"


async def mem_wal_table(uri: str) -> la.AsyncDataset:
    """Base rows 0..9; rows 100..104 durable in the MemWAL only; key 3 deleted there."""
    ds = await la.write_dataset(kv_table(range(10)), uri)
    await ds.initialize_mem_wal()
    async with ds.mem_wal_writer() as writer:
        await writer.put(kv_table(range(100, 105), value=7))
        await writer.delete(pa.table({"id": pa.array([3], pa.int64())}))
    return await la.open_dataset(uri)


async def test_use_lsm_reads_every_durable_row_where_a_plain_read_sees_the_base(
    table_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    ds = await mem_wal_table(table_uri)
    with caplog.at_level(logging.WARNING, logger="lance_async"):
        assert (await ds.to_table(filter="id = 102")).num_rows == 0
        assert await ds.count_rows() == 10
        assert [b.num_rows async for b in ds.scan(filter="id >= 100")] == []
    hints = [r for r in caplog.records if HINT in r.getMessage()]
    assert len(hints) == 1, "said once per table and process"
    assert "use_lsm=True" in hints[0].getMessage()
    got = await ds.to_table(use_lsm=True, filter="id = 102")
    assert got.to_pylist() == [{"id": 102, "value": 7, "name": "n102"}]
    assert await ds.count_rows(use_lsm=True) == 14  # 0..9 without 3, and 100..104
    assert await ds.count_rows("id >= 100", use_lsm=True) == 5
    ids = [
        i
        async for batch in ds.scan(["id"], use_lsm=True, batch_size=2)
        for i in batch.column("id").to_pylist()
    ]
    assert sorted(ids) == [0, 1, 2, 4, 5, 6, 7, 8, 9, 100, 101, 102, 103, 104]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_plain_read_of_a_table_without_a_mem_wal_says_nothing(
    table_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    ds = await la.write_dataset(kv_table(range(5)), table_uri)
    with caplog.at_level(logging.DEBUG, logger="lance_async"):
        assert await ds.count_rows() == 5
    assert not [r for r in caplog.records if HINT in r.getMessage()]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_use_lsm_refuses_what_the_lsm_reads_do_not_take(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    with pytest.raises(TypeError, match="fragments"):
        await ds.to_table(use_lsm=True, fragments=[])
    with pytest.raises(TypeError, match="prefetch"):
        ds.scan(use_lsm=True, prefetch=2)
    with pytest.raises(TypeError, match="nearest"):
        ds.scan(use_lsm=True, nearest={"column": "v", "q": [0.0]})


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_use_lsm_nearest_is_the_lsm_vector_search(table_uri: str) -> None:
    pk = {"lance-schema:unenforced-primary-key": "true"}
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=pk),
            pa.field("v", pa.list_(pa.float32(), 2)),
        ]
    )

    def rows(ids: list[int], x: float) -> pa.Table:
        vec = pa.array([[x, float(i)] for i in ids], pa.list_(pa.float32(), 2))
        return pa.table({"id": ids, "v": vec}, schema=schema)

    ds = await la.write_dataset(rows([1, 2, 3], 10.0), table_uri)
    await ds.initialize_mem_wal()
    async with ds.mem_wal_writer() as writer:
        await writer.put(rows([2], 0.0))  # key 2 moves next to the query
    got = await ds.to_table(
        use_lsm=True, nearest={"column": "v", "q": np.array([0.0, 2.0]), "k": 2}, columns=["id"]
    )
    assert got.column("id").to_pylist()[0] == 2
    assert got.column("_distance").to_pylist()[0] == pytest.approx(0.0)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_use_lsm_nearest_takes_pylances_range_index_and_prefilter(table_uri: str) -> None:
    """``nearest``'s ``distance_range`` and ``use_index`` and the scanner's
    ``prefilter`` keep pylance's names through ``use_lsm=True``: the same
    search as ``ds.lsm.vector_search``'s ``distance_range``,
    ``bypass_vector_index`` and ``postfilter``."""
    pk = {"lance-schema:unenforced-primary-key": "true"}
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=pk),
            pa.field("v", pa.list_(pa.float32(), 2)),
        ]
    )
    vec = pa.array([[float(i), 0.0] for i in range(10)], pa.list_(pa.float32(), 2))
    ds = await la.write_dataset(pa.table({"id": range(10), "v": vec}, schema=schema), table_uri)
    await ds.initialize_mem_wal()
    q = [0.0, 0.0]
    nearest = {"column": "v", "q": q, "k": 4, "distance_range": (1.0, 50.0), "use_index": False}
    got = await ds.to_table(use_lsm=True, nearest=nearest, filter="id % 2 = 1", prefilter=False)
    same = await ds.lsm.vector_search(
        q, column="v", k=4, distance_range=(1.0, 50.0), bypass_vector_index=True,
        filter="id % 2 = 1", postfilter=True,
    )  # fmt: skip
    assert got.equals(same) and got["id"].to_pylist() == [1, 3]  # of 1, 2, 3, 4
    pre = await ds.to_table(use_lsm=True, nearest=nearest, filter="id % 2 = 1")
    assert pre["id"].to_pylist() == [1, 3, 5, 7]
    with pytest.raises(TypeError, match="use_index"):
        await ds.to_table(use_lsm=True, nearest={**nearest, "use_index": "no"})
