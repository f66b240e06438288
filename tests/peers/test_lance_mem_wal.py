"""Lance's MemWAL tests, by meaning, through lance_async (beside pylance).

Peer: lance-format/lance, ``python/python/tests/test_mem_wal.py``. The peer
stages SSTables by hand and reads them with the engine's planners; here the
rows reach the levels through lance_async's writers (a closed writer flushes
its memtable into a generation), are read with ``ds.lsm`` /
``writer.lsm``, and -- where the engine has the same read -- compared with
pylance's ``LsmPointLookupPlanner`` / ``LsmScanner`` over the same shard
snapshots.
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.mem_wal import (
    CompactedSsTable,
    LsmPointLookupPlanner,
    LsmScanner,
    evaluate_sharding_spec,
)
from lance.schema import LanceSchema

import lance_async as la

from .twins import PK

SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("name", pa.utf8())]
)
NO_KEY = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.utf8())])


def named(ids: Any, prefix: str, schema: pa.Schema = SCHEMA) -> pa.Table:
    """Rows ``id``, ``name = f"{prefix}_{id}"``."""
    ids = list(ids)
    return pa.table({"id": ids, "name": [f"{prefix}_{i}" for i in ids]}, schema=schema)


def by_id(table: pa.Table) -> dict[int, str]:
    return {row["id"]: row["name"] for row in table.to_pylist()}


async def base(tmp_path: Path, name: str = "t", ids: Any = (1, 2, 3)) -> la.AsyncDataset:
    return await la.write_dataset(named(ids, "base"), tmp_path / f"{name}.lance")


async def with_generation(tmp_path: Path) -> tuple[la.AsyncDataset, list[la.ShardSnapshot]]:
    """Base ids 1-3 and one flushed generation holding id 2 (``gen1_2``),
    in one shard: the peer's staged SSTable, made by a writer."""
    ds = await base(tmp_path)
    await ds.initialize_mem_wal(unsharded=True)
    async with ds.mem_wal_writer() as writer:
        await writer.put(named([2], "gen1"))
    snaps = await ds.lsm.snapshots()
    assert [len(s.sstables) for s in snaps] == [1]  # closing flushed the memtable
    return ds, snaps


@pytest.mark.asyncio
async def test_a_merge_marking_sstables_compacted_commits_to_the_base_table(tmp_path: Path) -> None:
    """Mirrors lance test_mem_wal.py ``test_mark_sstables_as_compacted``: on
    a table with a MemWAL, a merge_insert that marks SSTables compacted (how
    compaction commits) merges into the base table in the same commit: ids
    1-3 and an upsert of 2 and 4 leave 4 rows. lance_async sends such a
    merge to the base table, not the MemWAL, as pylance does."""
    shard = str(uuid.uuid4())
    ours = await base(tmp_path)
    await ours.initialize_mem_wal()
    theirs = lance.write_dataset(named([1, 2, 3], "base"), str(tmp_path / "pylance.lance"))
    theirs.initialize_mem_wal()
    incoming = named([2, 4], "compacted")
    result = await (
        ours.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .mark_sstables_as_compacted([CompactedSsTable(shard, 1)])
        .execute(incoming)
    )
    (
        theirs.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .mark_sstables_as_compacted([CompactedSsTable(shard, 1)])
        .execute(incoming)
    )
    assert result.mem_wal is None and (result.num_inserted_rows, result.num_updated_rows) == (1, 1)
    assert await ours.count_rows() == theirs.count_rows() == 4


@pytest.mark.asyncio
async def test_a_point_lookup_takes_the_newest_level(tmp_path: Path) -> None:
    """Mirrors lance ``test_point_lookup_with_memtables``: a key updated in a
    flushed generation is answered from it, not from the base table; a key
    only the base table holds from there; an absent key with no row. The
    engine's point-lookup planner over the same snapshots agrees."""
    ds, snaps = await with_generation(tmp_path)
    assert by_id(await ds.lsm.point_lookup(2)) == {2: "gen1_2"}
    assert by_id(await ds.lsm.point_lookup(1)) == {1: "base_1"}
    assert (await ds.lsm.point_lookup(99)).num_rows == 0
    assert by_id(await ds.lsm.point_lookups([3, 2, 99])) == {3: "base_3", 2: "gen1_2"}

    planner = LsmPointLookupPlanner(lance.dataset(ds.uri), [s.lance for s in snaps])
    for key in (1, 2, 99):
        theirs = planner.plan_lookup(pa.array([key], pa.int64())).to_table()
        assert by_id(theirs) == by_id(await ds.lsm.point_lookup(key))


@pytest.mark.asyncio
async def test_a_scan_keeps_each_key_once_from_its_newest_level(tmp_path: Path) -> None:
    """Mirrors lance ``test_lsm_scanner_with_memtables``: a full LSM scan
    holds each key once, from its newest level (id 2 from the generation, 1
    and 3 from the base), as the engine's ``LsmScanner`` over the same
    snapshots does; an offset with no limit skips rows and needs no limit."""
    ds, snaps = await with_generation(tmp_path)
    table = await ds.lsm.scan().to_table()
    assert by_id(table) == {1: "base_1", 2: "gen1_2", 3: "base_3"}
    assert table.num_rows == 3
    theirs = LsmScanner.from_snapshots(lance.dataset(ds.uri), [s.lance for s in snaps]).to_table()
    assert by_id(theirs) == by_id(table)
    assert (await ds.lsm.scan(offset=1).to_table()).num_rows == 2
    assert (await ds.lsm.scan(limit=None, offset=1).to_table()).num_rows == 2


@pytest.mark.asyncio
async def test_a_writer_reads_its_own_flushed_generations(tmp_path: Path) -> None:
    """Mirrors lance ``test_shard_writer_lsm_scanner_includes_own_sstables``:
    rows a shard writer put and then flushed to a generation (a memtable
    sealed after every batch) are in that writer's own LSM scan. The peer
    polls until they show; here ``wait_flushed`` says when they are
    flushed, and they must show then."""
    ds = await base(tmp_path, ids=[0])
    await ds.initialize_mem_wal(manual_shards=True)
    shard = str(uuid.uuid4())
    async with ds.mem_wal_writer(shard, max_memtable_batches=1) as writer:
        await writer.put(named([1, 2], "writer"))
        await writer.wait_flushed()
        snaps = await writer.lsm.snapshots()
        assert sum(len(s.sstables) for s in snaps) >= 1
        assert by_id(await writer.lsm.scan().to_table()) == {
            0: "base_0",
            1: "writer_1",
            2: "writer_2",
        }


@pytest.mark.asyncio
async def test_a_row_is_readable_once_its_put_returns(tmp_path: Path) -> None:
    """Mirrors lance ``test_shard_writer_lsm_scanner_reads_frozen_memtables``:
    with a memtable sealed at every put, each row spends a while sealed and
    not yet flushed; the writer's scan must see every row from the moment
    its put returned, whatever level holds it."""
    ds = await base(tmp_path, ids=[0])
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_batches=1) as writer:
        for row in range(1, 9):
            await writer.put(named([row], "writer"))
            ids = (await writer.lsm.scan(columns=["id"]).to_table())["id"].to_pylist()
            assert sorted(ids) == list(range(row + 1))


@pytest.mark.asyncio
async def test_a_delete_hides_the_base_row(tmp_path: Path) -> None:
    """Mirrors lance ``test_shard_writer_delete_binding_masks_base_row``: a
    writer's delete of a key the base table holds hides that row from the
    writer's LSM scan (a tombstone), beside the rows it put; the base rows
    it did not delete stay."""
    ds = await base(tmp_path)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(str(uuid.uuid4())) as writer:
        await writer.put(named([4], "writer"))
        await writer.delete({"id": [2]})
        seen = by_id(await writer.lsm.scan().to_table())
    assert seen == {1: "base_1", 3: "base_3", 4: "writer_4"}
    assert by_id(await ds.lsm.scan().to_table()) == seen  # durable: every reader sees it


VDIM = 4
VECTORS = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False, metadata=PK),
        pa.field("vector", pa.list_(pa.float32(), VDIM)),
    ]
)


def vector_rows(ids: range) -> pa.Table:
    """id N has the vector [N/10, N/10 + 0.1, N/10 + 0.2, N/10 + 0.3]."""
    flat = [i * 0.1 + d * 0.1 for i in ids for d in range(VDIM)]
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), VDIM)
    return pa.table({"id": pa.array(list(ids), pa.int32()), "vector": vectors}, schema=VECTORS)


@pytest.mark.asyncio
async def test_a_vector_search_applies_its_filter_and_checks_its_numbers(tmp_path: Path) -> None:
    """Mirrors lance ``test_lsm_vector_search_filter_binding``: over 400 rows
    with an IVF_PQ index the MemWAL maintains, a search filtered to
    ``id >= 200`` returns only such rows and finds the row nearest the query;
    ``k`` and ``nprobes`` must be positive and ``overfetch_factor`` finite,
    each a ValueError at the call."""
    ds = await la.write_dataset(vector_rows(range(400)), tmp_path / "vec.lance")
    await ds.create_index(
        "vector", index_type="IVF_PQ", name="vector_idx", num_partitions=2, num_sub_vectors=2
    )
    await ds.initialize_mem_wal(maintained_indexes=["vector_idx"])
    query = [25.0, 25.1, 25.2, 25.3]
    found = await ds.lsm.vector_search(
        query, column="vector", k=20, nprobes=2, filter="id >= 200", columns=["id"]
    )
    ids = found["id"].to_pylist()
    assert ids and min(ids) >= 200 and 250 in ids
    bads: tuple[tuple[dict[str, Any], str], ...] = (
        ({"k": 0}, "k must be"),
        ({"nprobes": 0}, "nprobes must be"),
        ({"overfetch_factor": math.inf}, "overfetch_factor must be a finite"),
    )
    for bad, match in bads:
        with pytest.raises(ValueError, match=match):
            await ds.lsm.vector_search(query, column="vector", **{"k": 20, "nprobes": 2, **bad})


E2E_DIM = 32
E2E = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("vector", pa.list_(pa.float32(), E2E_DIM)),
        pa.field("text", pa.utf8()),
    ]
)


def e2e_rows(start: int, n: int) -> pa.Table:
    flat = [math.sin((start + i) * 0.1 + d * 0.01) for i in range(n) for d in range(E2E_DIM)]
    return pa.table(
        {
            "id": range(start, start + n),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), E2E_DIM),
            "text": [f"row {start + i}" for i in range(n)],
        },
        schema=E2E,
    )


@pytest.mark.asyncio
async def test_a_writer_end_to_end(tmp_path: Path) -> None:
    """Mirrors lance ``test_shard_writer_e2e_correctness``: over 500 rows with
    a maintained BTREE index, a durable shard writer with small WAL and
    memtable limits takes three rounds of three 50-row puts: the engine
    counts 9 puts and at least one WAL flush; closing it flushes every
    memtable (every row in a flushed generation); the shard's folder
    holds ``wal/*.arrow`` entries and ``manifest/`` files; every row is in
    the LSM scan; and a second, non-durable writer of another shard opened
    afterwards reads its own rows at once."""
    uri = tmp_path / "e2e.lance"
    ds = await la.write_dataset(e2e_rows(0, 500), uri)
    await ds.create_scalar_index("id", "BTREE", name="id_btree")
    await ds.initialize_mem_wal(manual_shards=True, maintained_indexes=["id_btree"])
    shard = str(uuid.uuid4())
    options: Any = {
        "max_wal_buffer_size": 10 * 1024,
        "max_wal_flush_interval_ms": 50,
        "max_memtable_size": 80,
    }
    async with ds.mem_wal_writer(shard, durable_write=True, **options) as writer:
        for round_ in range(3):
            for batch in range(3):
                await writer.put(e2e_rows(500 + round_ * 150 + batch * 50, 50))
        engine, _ = await writer.engine_stats()
        assert engine["put_count"] == 9 and engine["wal_flush_count"] >= 1
    assert writer.stats().rows == 450
    (snap,) = await ds.lsm.snapshots()
    assert snap.current_generation >= 2 and snap.sstables
    # every row is in a flushed generation: the engine's scanner, which reads
    # the generations and not the WAL, finds them all (pylance 14 may still
    # list the last WAL entry as unflushed: its replay position can lag one
    # entry behind the last flush, so ``unflushed_rows`` is not asserted)
    engine_scan = LsmScanner.from_snapshots(lance.dataset(ds.uri), [snap.lance])
    assert engine_scan.to_table().num_rows == 950

    folder = Path(uri) / "_mem_wal" / shard
    wal = os.listdir(folder / "wal")
    assert wal and all(name.endswith(".arrow") for name in wal)
    assert os.listdir(folder / "manifest")
    ids = (await ds.lsm.scan(columns=["id"]).to_table())["id"].to_pylist()
    assert sorted(ids) == list(range(950))

    again = await la.open_dataset(uri)
    async with again.mem_wal_writer(str(uuid.uuid4()), durable_write=False) as second:
        await second.put(e2e_rows(10_000, 10))
        seen = set((await second.lsm.scan(columns=["id"]).to_table())["id"].to_pylist())
    assert {10_000, 10_009} <= seen and len(seen) == 960


# -- initialize_mem_wal: sharding, maintained indexes, writer defaults --------

SAME: dict[str, dict[str, Any]] = {
    # pylance's arguments and lance_async's are the same for these
    "unsharded": {"unsharded": True},
    "bucket_on_name": {"bucket_column": "name", "num_buckets": 8},
    "identity_on_name": {"identity_column": "name"},
    "writer_defaults": {
        "bucket_column": "id",
        "num_buckets": 4,
        "durable_write": False,
        "max_memtable_size": 8 << 20,
        "max_wal_flush_interval_ms": 250,
    },
    "bucket_without_defaults": {"bucket_column": "id", "num_buckets": 4},
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", list(SAME))
async def test_initialize_mem_wal_records_what_pylance_records(tmp_path: Path, case: str) -> None:
    """Mirrors lance ``test_initialize_mem_wal_unsharded``,
    ``..._bucket_sharding``, ``..._identity_sharding``,
    ``..._writer_config_defaults`` and
    ``..._no_writer_config_defaults_when_unset``: the MemWAL index details
    name the shards (1 unsharded, 8 buckets, open-ended 0 by identity), the
    sharding spec's transform, parameters and result type, and the writer
    defaults recorded as strings (every tunable once one is given, none
    otherwise) -- the same details pylance records for the same arguments."""
    options = SAME[case]
    ours = await base(tmp_path)
    await ours.initialize_mem_wal(**options)
    theirs = lance.write_dataset(named([1, 2, 3], "base"), str(tmp_path / "pylance.lance"))
    theirs.initialize_mem_wal(**options)
    details = await ours.mem_wal_index_details()
    assert details == theirs.mem_wal_index_details()
    assert details is not None
    field = details["sharding_specs"][0]["fields"][0]
    defaults = details["writer_config_defaults"]
    if case == "unsharded":
        assert details["num_shards"] == 1 and field["transform"] == "unsharded"
    elif case == "bucket_on_name":
        assert details["num_shards"] == 8 and field["transform"] == "bucket"
        assert field["parameters"]["num_buckets"] == "8" and len(field["source_ids"]) == 1
    elif case == "identity_on_name":
        assert details["num_shards"] == 0 and field["transform"] == "identity"
        assert field["result_type"] == "utf8"
    elif case == "writer_defaults":
        assert defaults["durable_write"] == "false"
        assert defaults["max_memtable_size"] == str(8 << 20)
        assert defaults["max_wal_flush_interval_ms"] == "250"
        assert "enable_memtable" in defaults
    else:
        assert defaults == {}


@pytest.mark.asyncio
async def test_manual_shards_and_the_default_sharding(tmp_path: Path) -> None:
    """Mirrors lance ``test_initialize_mem_wal_manual``: pylance's
    ``initialize_mem_wal()`` with no argument records no sharding spec, no
    shards, every index maintained, no writer defaults; lance_async records
    that for ``manual_shards=True``. Its no-argument call differs on
    purpose: every key must have one shard, so it buckets on the primary
    key into 4 buckets (``docs/sharding.md``)."""
    ours = await base(tmp_path)
    await ours.initialize_mem_wal(manual_shards=True)
    theirs = lance.write_dataset(named([1, 2, 3], "base"), str(tmp_path / "pylance.lance"))
    theirs.initialize_mem_wal()
    details = await ours.mem_wal_index_details()
    assert details == theirs.mem_wal_index_details()
    assert details == {
        "num_shards": 0,
        "sharding_specs": [],
        "maintained_indexes": [],
        "maintain_all_indexes": True,
        "writer_config_defaults": {},
    }
    default = await base(tmp_path, "default")
    await default.initialize_mem_wal()
    chosen = await default.mem_wal_index_details()
    assert chosen is not None and chosen["num_shards"] == 4
    assert chosen["sharding_specs"][0]["fields"][0]["parameters"] == {"num_buckets": "4"}


@pytest.mark.asyncio
async def test_maintained_indexes_none_and_all_differ(tmp_path: Path) -> None:
    """Mirrors lance ``test_initialize_mem_wal_maintained_indexes`` and
    ``..._maintains_none_and_all_differently``: naming an index records it
    and clears "maintain all"; an empty list records no index and clears it
    too; leaving the argument out records no index with "maintain all" set
    -- the flag alone tells "none" from "all"."""
    seen = []
    for name, maintained in (("named", ["id_btree"]), ("none", []), ("all", None)):
        ds = await base(tmp_path, name)
        await ds.create_scalar_index("id", "BTREE", name="id_btree")
        options: dict[str, Any] = {} if maintained is None else {"maintained_indexes": maintained}
        await ds.initialize_mem_wal(**options)
        details = await ds.mem_wal_index_details()
        assert details is not None
        seen.append((details["maintained_indexes"], details["maintain_all_indexes"]))
    assert seen == [(["id_btree"], False), ([], False), ([], True)]


@pytest.mark.asyncio
async def test_sharding_options_refused_as_pylance_refuses_them(tmp_path: Path) -> None:
    """Mirrors lance ``test_initialize_mem_wal_rejects_conflicting_sharding``
    and ``..._rejects_partial_bucket``: two sharding schemes at once, or a
    bucket column without a bucket count, are ValueErrors and commit
    nothing."""
    ds = await base(tmp_path)
    with pytest.raises(ValueError, match="at most one"):
        await ds.initialize_mem_wal(unsharded=True, bucket_column="id", num_buckets=8)
    with pytest.raises(ValueError, match="num_buckets"):
        await ds.initialize_mem_wal(bucket_column="id")
    assert await ds.mem_wal_index_details() is None
    assert await ds.latest_version() == 1


@pytest.mark.asyncio
async def test_a_table_without_a_primary_key_gets_no_mem_wal(tmp_path: Path) -> None:
    """Mirrors lance ``test_initialize_mem_wal_bucket_sharding_without_primary_key``,
    which differs on purpose: pylance buckets a keyless table into 8 shards;
    lance_async refuses it (:class:`InvalidInputError`, nothing committed),
    since LSM reads and compaction keep the newest row per primary key and
    could never read such rows back."""
    rows = named([1, 2, 3], "base", NO_KEY)
    theirs = lance.write_dataset(rows, str(tmp_path / "pylance.lance"))
    theirs.initialize_mem_wal(bucket_column="id", num_buckets=8)
    details = theirs.mem_wal_index_details()
    assert details is not None and details["num_shards"] == 8
    ours = await la.write_dataset(rows, tmp_path / "ours.lance")
    with pytest.raises(la.InvalidInputError, match="primary key"):
        await ours.initialize_mem_wal(bucket_column="id", num_buckets=8)
    assert await ours.mem_wal_index_details() is None


@pytest.mark.asyncio
async def test_the_sharding_evaluates_rows_as_the_engine(tmp_path: Path) -> None:
    """Mirrors lance ``test_initialize_mem_wal_bucket_sharding`` (its
    evaluation) and ``test_evaluate_sharding_spec_python_binding*``: the
    table's bucket spec evaluated over a batch gives one bucket per row,
    and lance_async's sharding (``ds.sharding()``, which routes every row)
    gives the same buckets as ``lance.mem_wal.evaluate_sharding_spec``,
    for an integer and for a string column."""
    for column in ("id", "name"):
        ds = await base(tmp_path, column, ids=range(40))
        await ds.initialize_mem_wal(bucket_column=column, num_buckets=8)
        sharding = await ds.sharding()
        assert sharding.kind == "bucket" and sharding.num_buckets == 8
        assert sharding.spec is not None
        batch = named(range(40), "base").to_batches()[0]
        theirs = evaluate_sharding_spec(
            batch, sharding.spec, LanceSchema.from_pyarrow(batch.schema)
        )
        assert theirs.num_rows == 40
        ours = sharding.values(batch)
        assert ours.to_pylist() == theirs.column(0).to_pylist()
        assert len(set(ours.to_pylist())) > 1


@pytest.mark.asyncio
async def test_no_details_before_the_mem_wal_is_initialized(tmp_path: Path) -> None:
    """Mirrors lance ``test_mem_wal_index_details_none_before_init``: a table
    whose MemWAL was never initialized has no MemWAL index details."""
    ds = await base(tmp_path)
    assert await ds.mem_wal_index_details() is None
    assert lance.dataset(ds.uri).mem_wal_index_details() is None
