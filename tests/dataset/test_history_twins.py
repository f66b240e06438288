"""The awaitable twins of sql, the blob reads, fragments, history, branches and merge,
each against pylance's own call on the same table (side by side)."""

from __future__ import annotations

import shutil
from pathlib import Path

import lance
import pyarrow as pa
import pytest

import lance_async as la

from ..helpers import kv_table

BLOBS = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("blob", pa.large_binary(), metadata={"lance-encoding:blob": "true"}),
    ]
)


@pytest.mark.anyio
async def test_sql_is_pylances_query(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(10), value=3), table_uri)
    await ds.insert(kv_table(range(10, 14), value=4))
    query = "SELECT id, value * 2 AS twice FROM dataset WHERE id >= 8 ORDER BY id"
    theirs = pa.Table.from_batches(lance.dataset(table_uri).sql(query).build().to_batch_records())
    mine = await ds.sql(query).to_table()
    assert mine.equals(theirs) and mine.num_rows == 6
    assert pa.Table.from_batches(await ds.sql(query).to_batch_records()).equals(theirs)
    streamed = [b async for b in ds.sql(query).batch_size(2).to_batches()]
    assert pa.Table.from_batches(streamed).equals(theirs)
    named = ds.sql("SELECT count(*) AS n FROM t").table_name("t")
    assert (await named.to_table()).column("n").to_pylist() == [14]
    with_ids = await ds.sql("SELECT _rowid, id FROM dataset WHERE id = 0").with_row_id().to_table()
    assert with_ids.column_names == ["_rowid", "id"]
    with pytest.raises(la.LanceAsyncError):
        await ds.sql("SELECT nope FROM dataset").to_table()
    with pytest.raises(TypeError):
        ds.sql("")
    with pytest.raises(ValueError):
        ds.sql(query).batch_size(0)


@pytest.mark.asyncio
async def test_blobs_read_as_pylance_reads_them(table_uri: str) -> None:
    data = [b"a" * 10, b"", None, b"xyz" * 1000]
    ds = await la.write_dataset(
        pa.table({"id": range(4), "blob": pa.array(data, pa.large_binary())}, schema=BLOBS),
        table_uri,
    )
    pylance = lance.dataset(table_uri)
    theirs = pylance.take_blobs("blob", indices=[0, 1, 2, 3])
    mine = await ds.take_blobs("blob", indices=[0, 1, 2, 3])
    assert [b is None for b in mine] == [b is None for b in theirs] == [False, False, True, False]
    for blob, expected, other in zip(mine, data, theirs, strict=True):
        if blob is None:
            continue
        assert other is not None
        assert blob.size() == other.size() == len(expected or b"")
        async with blob:
            assert await blob.read(3) == other.read(3) == (expected or b"")[:3]
            assert blob.tell() == other.tell()
            assert await blob.readall() == other.readall()
            await blob.seek(0)
            assert await blob.readall() == expected
            if expected:
                assert await blob.read_range(1, 2) == expected[1:3]
                assert await blob.read_ranges([(0, 1), (2, 2)]) == [expected[:1], expected[2:4]]
        with pytest.raises(la.ClosedError):
            await blob.read()
    assert await ds.read_blobs("blob", indices=[0, 2, 3]) == pylance.read_blobs(
        "blob", indices=[0, 2, 3]
    )
    ranges = [(0, 2, 3), (3, 100, 5)]
    assert await ds.read_blob_ranges("blob", ranges, selector="indices") == (
        pylance.read_blob_ranges("blob", ranges, selector="indices")
    )
    with pytest.raises(ValueError, match="exactly one"):
        await ds.take_blobs("blob", ids=[0], indices=[0])
    with pytest.raises(la.SchemaMismatchError):
        await ds.read_blobs("nope", indices=[0])


@pytest.mark.asyncio
async def test_fragments_are_pylances(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(6), value=1), table_uri)
    await ds.insert(kv_table(range(6, 9), value=2))
    await ds.delete("id = 1")
    pylance = lance.dataset(table_uri)
    theirs = pylance.get_fragments()
    mine = await ds.get_fragments()
    assert [f.fragment_id for f in mine] == [f.fragment_id for f in theirs] == [0, 1]
    assert list(await ds.fragment_ids()) == list(pylance.fragment_ids())
    for a, b in zip(mine, theirs, strict=True):
        assert await a.count_rows() == b.count_rows()
        assert await a.count_rows("value = 2") == b.count_rows("value = 2")
        assert await a.physical_rows() == b.physical_rows
        assert (await a.to_table(columns=["id"])).equals(b.to_table(columns=["id"]))
        assert (await a.take([0], columns=["id"])).equals(b.take([0], columns=["id"]))
        assert (await a.head(1)).equals(b.head(1))
        assert a.deletion_file() == b.deletion_file()
        assert [d.path for d in a.data_files()] == [d.path for d in b.data_files()]
        rows = [batch async for batch in a.scan(columns=["id"])]
        assert pa.Table.from_batches(rows).equals(b.scanner(columns=["id"]).to_table())
    one, pylance_one = await ds.get_fragment(1), pylance.get_fragment(1)
    assert one is not None and pylance_one is not None and one.metadata == pylance_one.metadata
    assert await ds.get_fragment(7) is None


@pytest.mark.anyio
async def test_history_is_pylances(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(3)), table_uri, enable_stable_row_ids=True)
    await ds.insert(kv_table(range(3, 5)))
    await ds.update({"value": "7"}, where="id = 0")
    await ds.delete("id = 4")
    pylance = lance.dataset(table_uri)
    assert await ds.version_refs() == pylance.version_refs()
    mine = await ds.get_transactions(3)
    theirs = pylance.get_transactions(3)
    assert [t.uuid for t in mine] == [t.uuid if t is not None else None for t in theirs]
    assert [type(t.operation).__name__ for t in mine] == ["Delete", "Update", "Append"]
    delta = await ds.delta(1)
    other = pylance.delta(1)
    assert [t.uuid for t in await delta.list_transactions()] == [
        t.uuid for t in other.list_transactions()
    ]
    for mine_rows, their_rows in (
        (delta.get_inserted_rows(), other.get_inserted_rows()),
        (delta.get_updated_rows(), other.get_updated_rows()),
        (delta.get_deleted_row_ids(), other.get_deleted_row_ids()),
    ):
        assert (await mine_rows.to_table()).equals(their_rows.read_all())
    ranged = await ds.delta(begin_version=2, end_version=3)
    assert len(await ranged.list_transactions()) == 1
    with pytest.raises(ValueError):
        await ds.delta(1, begin_version=1, end_version=2)
    with pytest.raises(ValueError):
        await ds.delta(begin_version=1)


@pytest.mark.asyncio
async def test_branches_are_pylances(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(3)), table_uri)
    await ds.insert(kv_table(range(3, 5)))
    branch = await ds.create_branch("exp", 1)
    assert isinstance(branch, la.AsyncDataset) and await branch.count_rows() == 3
    await branch.insert(kv_table([9]))
    assert await ds.count_rows() == 5  # the main branch is untouched
    pylance = lance.dataset(table_uri)
    assert set(await ds.branches.list()) == set(pylance.branches.list()) == {"exp"}
    assert [n for n, _ in await ds.branches.list_ordered("asc")] == ["exp"]
    assert (await ds.branches.list())["exp"]["parent_version"] == 1
    with pytest.raises(la.LanceAsyncError):
        await ds.create_branch("exp")
    await ds.branches.delete("exp")
    assert lance.dataset(table_uri).branches.list() == {}


@pytest.mark.asyncio
async def test_merge_is_pylances(tmp_path: Path) -> None:
    mine_uri, their_uri = str(tmp_path / "mine.lance"), str(tmp_path / "theirs.lance")
    ds = await la.write_dataset(kv_table(range(5)), mine_uri)
    shutil.copytree(mine_uri, their_uri)
    extra = pa.table({"key": [1, 3, 9], "extra": ["x", "y", "z"]})
    with pytest.raises(la.SchemaMismatchError):
        await ds.merge(extra, "nope", right_on="key")
    with pytest.raises(la.SchemaMismatchError):
        await ds.merge(extra, "id")  # no "id" in the data
    assert ds.version == 1  # nothing was committed
    await ds.merge(extra, "id", right_on="key")
    pylance = lance.dataset(their_uri)
    pylance.merge(extra, "id", right_on="key")
    assert ds.version == pylance.version == 2
    assert ds.schema.equals(pylance.schema, check_metadata=True)
    assert (await ds.to_table()).sort_by("id").equals(pylance.to_table().sort_by("id"))
    assert (await ds.to_table(columns=["extra"])).column("extra").to_pylist() == [
        None, "x", None, "y", None,
    ]  # fmt: skip
