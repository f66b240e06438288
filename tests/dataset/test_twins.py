"""The awaitable twins of pylance's LanceDataset methods, on the real engine
(asyncio and trio); docs/parity.md is the table they fill."""

from __future__ import annotations

from pathlib import Path

import lance
import pyarrow as pa
import pytest

import lance_async as la

from ..helpers import KV_SCHEMA, kv_table


@pytest.mark.asyncio
async def test_versions_restore_and_tags(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(3)), table_uri)
    await ds.insert(kv_table(range(3, 5)))
    assert ds.version == 2 and await ds.count_rows() == 5

    await ds.tags.create("first", 1)
    await ds.tags.create("second")  # default: the version the object reads
    assert await ds.tags.get_version("second") == 2
    assert {t: i["version"] for t, i in (await ds.tags.list()).items()} == {
        "first": 1,
        "second": 2,
    }
    await ds.tags.update("second", "first")
    assert [t for t, _ in await ds.tags.list_ordered("asc")] == ["first", "second"]
    assert lance.dataset(table_uri).tags.get_version("second") == 1  # the engine agrees
    with pytest.raises(la.InvalidInputError, match="exists"):
        await ds.tags.create("first", 2)
    with pytest.raises(la.DatasetNotFoundError):
        await ds.tags.create("nope", 9)
    await ds.tags.delete("second")
    with pytest.raises(la.DatasetNotFoundError):
        await ds.tags.delete("second")
    with pytest.raises(la.DatasetNotFoundError):
        await ds.checkout("second")

    old = await ds.checkout("first")
    assert old.version == 1 and ds.version == 2
    restored = await old.restore()
    assert restored is old and old.version == 3 == await ds.latest_version()
    assert await old.count_rows() == 3
    assert lance.dataset(table_uri).count_rows() == 3
    assert [v["version"] for v in await ds.versions()] == [1, 2, 3]
    assert type((await ds.read_transaction(2)).operation).__name__ == "Append"

    shallow = await ds.shallow_clone(Path(table_uri).parent / "shallow.lance", "first")
    deep = await ds.deep_clone(Path(table_uri).parent / "deep.lance", 2)
    assert (await shallow.count_rows(), await deep.count_rows()) == (3, 5)


@pytest.mark.asyncio
async def test_schema_evolution_metadata_and_config(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(4), value=5), table_uri)
    await ds.add_columns({"double": "value * 2"})
    await ds.add_columns(pa.field("note", pa.string()))
    await ds.alter_columns({"path": "double", "name": "twice"}, {"path": "name", "nullable": True})
    await ds.drop_columns(["note"])
    with pytest.raises(la.SchemaMismatchError):
        await ds.drop_columns(["nope"])
    assert ds.schema.names == ["id", "value", "name", "twice"]
    assert (await ds.to_table(columns=["twice"])).column("twice").to_pylist() == [10] * 4

    assert (await ds.update_metadata({"owner": "ops"}))["owner"] == "ops"
    assert (await ds.update_schema_metadata({"k": "v"}))["k"] == "v"
    await ds.update_field_metadata({"value": {"unit": "s"}})
    assert ds.schema.field("value").metadata == {b"unit": b"s"}
    assert (await ds.update_config({"a.b": "1"}))["a.b"] == "1"
    await ds.delete_config_keys(["a.b"])
    assert "a.b" not in await ds.config()

    synced = lance.dataset(table_uri)
    assert synced.version == ds.version
    assert synced.schema.equals(ds.schema, check_metadata=True)
    assert synced.metadata["owner"] == "ops" and synced.schema.metadata[b"k"] == b"v"
    assert ds.primary_key == ["id"]  # the key survives every change


@pytest.mark.asyncio
async def test_indexes_and_maintenance(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(100)), table_uri)
    await ds.create_scalar_index("id", "BTREE", name="by_id")
    await ds.insert(kv_table(range(100, 150)))
    assert (await ds.index_statistics("by_id"))["num_unindexed_rows"] == 50
    await ds.optimize_indices()
    assert (await ds.index_statistics("by_id"))["num_unindexed_rows"] == 0
    assert [d.name for d in await ds.describe_indices()] == ["by_id"]
    await ds.prewarm_index("by_id")
    await ds.validate()
    assert await ds.data_stats() is not None
    await ds.drop_index("by_id")
    assert await ds.describe_indices() == []

    assert (await ds.slice(10, 13, columns=["id"])).column("id").to_pylist() == [10, 11, 12]
    frame = await ds.to_pandas(columns=["id"], filter="id < 3")
    assert list(frame["id"]) == [0, 1, 2]
    assert (await ds.explain_cleanup_old_versions(retain_versions=1)) is not None

    sample = await ds.sample(10, columns=["id"])
    assert sample.num_rows == 10 and len(set(sample.column("id").to_pylist())) == 10
    with pytest.raises(la.InvalidInputError):
        await ds.sample(1_000)
    await ds.truncate_table()
    assert await ds.count_rows() == 0 and ds.schema.equals(KV_SCHEMA, check_metadata=True)


@pytest.mark.asyncio
async def test_commit_what_execute_uncommitted_built(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(3)), table_uri)
    first, stats = (
        await ds.merge_insert()
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute_uncommitted(kv_table([2, 3], value=7))
    )
    second, _ = (
        await ds.merge_insert()
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute_uncommitted(kv_table([2, 3], value=8))
    )
    assert stats["num_inserted_rows"] == 1 and ds.version == 1
    assert await ds.commit(first) is ds and ds.version == 2
    with pytest.raises(la.ConflictError) as info:
        await ds.commit(second)  # built on version 1, against the same keys
    assert info.value.retryable and isinstance(info.value.__cause__, OSError)
    assert ds.version == 2 and lance.dataset(table_uri).version == 2
    assert sorted((await ds.to_table(columns=["value"])).column("value").to_pylist()) == [
        0,
        0,
        7,
        7,
    ]

    appends = [
        lance.fragment.write_fragments(kv_table([10 + i]), table_uri, return_transaction=True)
        for i in range(2)
    ]
    batch = await ds.commit_batch(appends)
    assert batch.dataset is ds and ds.version == 3 and await ds.count_rows() == 6
    with pytest.raises(ValueError, match="append"):
        await ds.commit_batch([first])

    txn, _ = (
        await ds.merge_insert()
        .when_matched_update_all()
        .execute_uncommitted(kv_table([0], value=9))
    )
    detached = await ds.commit(txn, detached=True)
    assert detached is not ds and ds.version == 3
    assert (await detached.to_table(filter="id = 0")).column("value").to_pylist() == [9]
    assert await ds.latest_version() == 3


@pytest.mark.asyncio
async def test_an_async_dataset_is_a_pinned_replayable_source(tmp_path: Path) -> None:
    src = await la.write_dataset(kv_table(range(5), value=1), tmp_path / "src.lance")
    pinned = la.coerce_source(src)
    assert pinned.mode is la.SourceMode.REPLAYABLE
    await src.insert(kv_table(range(5, 8), value=1))  # the source moves on; the pin does not

    copy = await la.write_dataset(pinned, tmp_path / "copy.lance")
    assert await copy.count_rows() == 5
    whole = await la.write_dataset(src, tmp_path / "whole.lance")  # passed now: version 2
    assert await whole.count_rows() == 8

    target = await la.write_dataset(kv_table(range(3), value=0), tmp_path / "target.lance")
    result = (
        await target.merge_insert()
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(src)
    )
    assert result.source_mode is la.SourceMode.REPLAYABLE
    assert (result.num_updated_rows, result.num_inserted_rows) == (3, 5)
    await target.insert(await src.checkout(1), mode="overwrite")
    assert await target.count_rows() == 5
    with pytest.raises(la.SchemaMismatchError):
        la.coerce_source(src, schema=pa.schema([("id", pa.int64())]))
