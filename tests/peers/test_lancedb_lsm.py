"""LanceDB's MemWAL merge and read tests, by meaning, through lance_async.

Peer: lancedb/lancedb ``python/python/tests/test_merge_insert_lsm.py``:
merge_insert is routed into the MemWAL once a table has an LSM write spec,
and reads of such a table go through the LSM levels. lance_async routes
merges the same way once the table's MemWAL is initialized; its plain reads
answer from the base table, and ``use_lsm=True`` / ``ds.lsm`` read every
level (the differences are pinned in each test's docstring and listed in
``docs/parity.md``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.errors import FilterError, InvalidInputError

from .twins import PK, counts

KEYED = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("value", pa.int64(), nullable=False),
    ]
)
REGION = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("region", pa.utf8(), nullable=False),
    ]
)


def values(ids: list[int]) -> pa.Table:
    """Rows ``id`` with ``value`` 0, 1, 2... in order."""
    return pa.table({"id": ids, "value": list(range(len(ids)))}, schema=KEYED)


def upsert(ds: la.AsyncDataset, on: Any = None) -> la.AsyncMergeInsertBuilder:
    return ds.merge_insert(on).when_matched_update_all().when_not_matched_insert_all()


async def keyed(tmp_path: Path, **sharding: Any) -> la.AsyncDataset:
    """ids 1, 2, 3 with a declared key; a MemWAL when ``sharding`` is given."""
    ds = await la.write_dataset(values([1, 2, 3]), tmp_path / "keyed.lance")
    if sharding:
        await ds.initialize_mem_wal(**sharding)
    return ds


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "sharding",
    [{"num_buckets": 1}, {"unsharded": True}, {"num_buckets": 4}],
    ids=["one_bucket", "unsharded", "four_buckets"],
)
async def test_an_upsert_on_a_mem_wal_table_goes_through_the_mem_wal(
    tmp_path: Path, sharding: dict[str, Any]
) -> None:
    """Mirrors lancedb test_merge_insert_lsm.py ``test_lsm_merge_insert_bucket``,
    ``..._unsharded``, ``..._validate_single_shard_off`` and
    ``test_async_lsm_merge_insert``: on a table with a MemWAL an upsert with
    an empty ``on`` (the primary key) puts its rows into the MemWAL: the
    rows put are counted, the insert / update counts are 0 (which keys were
    new is known at compaction) and no version is committed. LanceDB
    reports version 0 and, by default, wants every row in one shard;
    lance_async reports the version read and splits the rows by shard."""
    ds = await keyed(tmp_path, **sharding)
    version = ds.version
    result = await upsert(ds, []).execute(values([3, 4, 5, 6, 7, 8]))
    assert result.mem_wal is not None and result.mem_wal.rows == 6
    assert counts(result) == (0, 0, 0) and result.version == version
    assert await ds.latest_version() == version
    assert await ds.count_rows() == 3  # the base table is unchanged until compaction


@pytest.mark.asyncio
async def test_an_identity_sharded_upsert(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_merge_insert_identity``: with identity
    sharding on a region column, an upsert whose rows share one region goes
    into that region's one shard."""
    table = pa.table({"id": [1, 2], "region": ["us", "us"]}, schema=REGION)
    ds = await la.write_dataset(table, tmp_path / "regions.lance")
    await ds.initialize_mem_wal(identity_column="region")
    result = await upsert(ds).execute(
        pa.table({"id": [3, 4], "region": ["us", "us"]}, schema=REGION)
    )
    assert result.mem_wal is not None and result.mem_wal.rows == 2
    assert len(await ds.lsm.snapshots()) == 1


@pytest.mark.asyncio
async def test_via_base_table_opts_out_and_via_mem_wal_needs_one(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_merge_insert_use_lsm_false``,
    ``..._use_lsm_true_without_spec_errors`` and
    ``..._no_spec_uses_standard_path``: ``via_base_table()`` (LanceDB's
    ``use_lsm(False)``) commits an insert-only merge to the base table of a
    MemWAL table (2 inserted, 5 rows); without a MemWAL a plain upsert
    commits to the base table; ``via_mem_wal()`` (``use_lsm(True)``) on such
    a table is an error naming the MemWAL, nothing written."""
    wal = await keyed(tmp_path, num_buckets=1)
    result = (
        await wal.merge_insert("id")
        .when_not_matched_insert_all()
        .via_base_table()
        .execute(values([3, 4, 5]))
    )
    assert result.mem_wal is None and counts(result) == (2, 0, 0)
    assert await wal.count_rows() == 5

    plain = await la.write_dataset(values([1, 2, 3]), tmp_path / "plain.lance")
    result = await upsert(plain, "id").execute(values([3, 4, 5]))
    assert result.mem_wal is None and counts(result) == (2, 1, 0)
    assert await plain.count_rows() == 5
    with pytest.raises(la.InvalidInputError, match="no MemWAL"):
        await upsert(plain, "id").via_mem_wal().execute(values([9]))
    assert await plain.count_rows() == 5


@pytest.mark.asyncio
async def test_what_the_mem_wal_cannot_express_is_refused(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_merge_insert_rejects_on_not_primary_key``
    and ``..._rejects_non_upsert``: through the MemWAL a merge joins on the
    primary key only, and an insert-only merge is not an upsert; both are
    :class:`MergeShapeError` (a ValueError), nothing written."""
    ds = await keyed(tmp_path, num_buckets=1)
    with pytest.raises(la.MergeShapeError, match="primary key"):
        await upsert(ds, "value").execute(values([1]))
    with pytest.raises(la.MergeShapeError, match="upsert"):
        await ds.merge_insert([]).when_not_matched_insert_all().execute(values([4]))
    assert await ds.lsm.unflushed_rows() == {}
    assert (await ds.lsm.scan().to_table()).num_rows == 3


@pytest.mark.asyncio
async def test_each_merge_opens_its_writer_or_shares_an_open_one(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_close_writers``: LanceDB keeps its MemWAL
    writers in the table (``close_lsm_writers()`` closes them; the next
    merge reopens one). lance_async opens a writer for a merge given none
    and closes it after, so consecutive merges just work; a merge given an
    open writer shares it."""
    ds = await keyed(tmp_path, unsharded=True)
    first = await upsert(ds).execute(values([7, 8]))
    second = await upsert(ds).execute(values([9]))
    assert first.mem_wal is not None and second.mem_wal is not None
    assert (first.mem_wal.rows, second.mem_wal.rows) == (2, 1)
    async with ds.mem_wal_writer() as writer:
        shared = await upsert(ds).via_mem_wal(writer).execute(values([10]))
        assert shared.mem_wal is not None and shared.mem_wal.rows == 1
        assert (await writer.lsm.point_lookup(10)).num_rows == 1
    ids = (await ds.lsm.scan(columns=["id"]).to_table())["id"].to_pylist()
    assert sorted(ids) == [1, 2, 3, 7, 8, 9, 10]


@pytest.mark.asyncio
async def test_reads_with_and_without_the_mem_wal(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_sees_active_memtable``,
    ``test_lsm_read_dedup_newest_wins``, ``test_lsm_read_without_spec_reads_base``
    and ``test_async_lsm_read``, which differ in the default: a LanceDB read
    of a table with a write spec goes through the LSM levels unless
    ``use_lsm(False)``; a lance_async plain read answers from the base table
    and ``use_lsm=True`` (or ``ds.lsm``) reads every level. The LSM read
    holds each key once with its newest value (ids 2-4 from the MemWAL, 1
    from the base); a table without a MemWAL reads the same either way."""
    ds = await keyed(tmp_path, unsharded=True)
    await upsert(ds).execute(values([2, 3, 4]))  # 2, 3, 4 -> values 0, 1, 2
    lsm = await ds.to_table(use_lsm=True)
    assert sorted(lsm.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "value": 0},
        {"id": 2, "value": 0},
        {"id": 3, "value": 1},
        {"id": 4, "value": 2},
    ]
    assert sorted((await ds.to_table())["id"].to_pylist()) == [1, 2, 3]
    assert (await ds.lsm.scan().to_table()).sort_by("id").equals(lsm.sort_by("id"))

    plain = await la.write_dataset(values([1, 2, 3]), tmp_path / "plain.lance")
    assert sorted((await plain.to_table(use_lsm=True))["id"].to_pylist()) == [1, 2, 3]
    assert sorted((await plain.to_table())["id"].to_pylist()) == [1, 2, 3]


@pytest.mark.asyncio
async def test_an_lsm_read_with_row_ids(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_unsupported_shape_errors_without_use_lsm_false``,
    which differs: LanceDB refuses a row-id read of a table with a write
    spec unless it reads the base table only. lance_async's LSM scan takes
    ``with_row_id``: a base row has its row id, a row of a newer level a null
    one (it has none until compacted); the base-only read has every id."""
    ds = await keyed(tmp_path, unsharded=True)
    await upsert(ds).execute(values([4]))
    table = await ds.lsm.scan(with_row_id=True).to_table()
    ids = {row["id"]: row["_rowid"] for row in table.to_pylist()}
    assert set(ids) == {1, 2, 3, 4}
    assert ids[4] is None and all(ids[k] is not None for k in (1, 2, 3))
    base = await ds.to_table(with_row_id=True)
    assert sorted(base["id"].to_pylist()) == [1, 2, 3] and base["_rowid"].null_count == 0


VDIM = 8
VECTORS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("category", pa.utf8(), nullable=False),
        pa.field("vector", pa.list_(pa.float32(), VDIM), nullable=False),
    ]
)
ONES = [1.0] * VDIM


def vector_rows(rows: list[tuple[int, str, list[float]]]) -> pa.Table:
    return pa.table(
        {
            "id": [r[0] for r in rows],
            "category": [r[1] for r in rows],
            "vector": pa.array([r[2] for r in rows], pa.list_(pa.float32(), VDIM)),
        },
        schema=VECTORS,
    )


async def vector_table(tmp_path: Path, maintained: bool = True) -> la.AsyncDataset:
    """ids 1-60 (1 and 2 category ``a``, 3 ``b``, the rest ``c``) with an
    IVF_PQ index, an unsharded MemWAL maintaining it (or none), and an
    upsert of 1000 (``a``) and 1001 (``b``) through the MemWAL, not compacted."""
    rows = [
        (
            i,
            "a" if i in (1, 2) else "b" if i == 3 else "c",
            [float((i * 7 + j) % 13) for j in range(VDIM)],
        )
        for i in range(1, 61)
    ]
    ds = await la.write_dataset(vector_rows(rows), tmp_path / "vectors.lance")
    await ds.create_index(
        "vector", index_type="IVF_PQ", name="vidx", num_partitions=1, num_sub_vectors=2, num_bits=4
    )
    await ds.initialize_mem_wal(unsharded=True, maintained_indexes=["vidx"] if maintained else [])
    result = await upsert(ds).execute(vector_rows([(1000, "a", ONES), (1001, "b", ONES)]))
    assert result.mem_wal is not None and result.mem_wal.rows == 2
    return ds


@pytest.mark.asyncio
async def test_a_vector_search_and_a_scan_filter_across_the_levels(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_vector_sees_memtable``,
    ``test_lsm_read_vector_prefilter`` and ``test_lsm_read_plain_prefilter``:
    an LSM vector search finds the indexed base rows and the rows upserted
    through the MemWAL; its filter applies before ranking across both (only
    ``a`` rows: 1, 2 and 1000), and without it other categories come back;
    an LSM scan with the same filter finds the same three rows."""
    ds = await vector_table(tmp_path)
    ids = set((await ds.lsm.vector_search(ONES, column="vector", k=100))["id"].to_pylist())
    assert {1, 2, 3, 1000, 1001} <= ids
    filtered = await ds.lsm.vector_search(ONES, column="vector", k=100, filter="category = 'a'")
    assert set(filtered["id"].to_pylist()) == {1, 2, 1000}
    assert set(filtered["category"].to_pylist()) == {"a"}
    scanned = await ds.lsm.scan(filter="category = 'a'").to_table()
    assert set(scanned["id"].to_pylist()) == {1, 2, 1000}


@pytest.mark.asyncio
async def test_an_lsm_scan_returns_only_the_columns_asked_for(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_projection_excludes_pk``: an LSM scan
    of one column does not leak the primary key it resolves the levels by."""
    ds = await vector_table(tmp_path)
    table = await ds.lsm.scan(columns=["category"], filter="category = 'a'").to_table()
    assert table.column_names == ["category"] and table.num_rows == 3


@pytest.mark.asyncio
async def test_a_vector_search_needs_no_maintained_index(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_vector_unmaintained_index_errors``,
    which differs: LanceDB refuses an LSM vector search when the MemWAL
    maintains no vector index (the base index's catch-up is untracked).
    lance_async searches the levels above the base table exactly and leaves
    out base rows a newer level hides, so the search runs and finds the
    MemWAL's rows."""
    ds = await vector_table(tmp_path, maintained=False)
    ids = set((await ds.lsm.vector_search(ONES, column="vector", k=100))["id"].to_pylist())
    assert {1000, 1001} <= ids and len(ids) == 62


@pytest.mark.asyncio
async def test_an_lsm_read_of_an_old_version_is_refused(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_time_travel_errors``: an LSM read of a
    table checked out at an older version is refused (the MemWAL is live
    state, not versioned with the base table), and the checked-out object's
    plain reads still read its version. lance_async raises
    ``InvalidInputError`` before any I/O and leaves the object where it was
    (it used to move it to the latest version); ``refresh()`` ends the time
    travel, after which LSM reads show the live state."""
    ds = await keyed(tmp_path, unsharded=True)
    pinned = ds.version
    await (
        ds.merge_insert("id").when_not_matched_insert_all().via_base_table().execute(values([4, 5]))
    )
    old = await ds.checkout(pinned)
    pinned_now = old.checked_out  # not old.checked_out narrowed: mypy would keep it past refresh
    assert pinned_now and not ds.checked_out
    for read in (
        lambda: old.lsm.scan(columns=["id"]).to_table(),
        lambda: old.lsm.point_lookup(1),
        lambda: old.lsm.point_lookups([1, 2]),
        old.lsm.snapshot,
        old.lsm.snapshots,
        old.lsm.unflushed_rows,
        lambda: old.to_table(use_lsm=True),
    ):
        with pytest.raises(la.InvalidInputError, match="checked out at version"):
            await read()
    assert old.version == pinned
    assert sorted((await old.to_table())["id"].to_pylist()) == [1, 2, 3]
    # snapshots given by hand are read over the version the object reads
    given = await ds.lsm.snapshots()
    assert sorted(
        (await old.lsm.scan(columns=["id"], snapshots=given).to_table())["id"].to_pylist()
    ) == [1, 2, 3]
    await old.refresh()
    assert not old.checked_out and old.version == ds.version
    live = (await old.lsm.scan(columns=["id"]).to_table())["id"].to_pylist()
    assert sorted(live) == [1, 2, 3, 4, 5]


def exact_nearest(table: pa.Table, query: list[float], k: int) -> list[int]:
    """The ``k`` ids of ``table`` nearest ``query`` by squared L2 (ties by id)."""
    vecs = np.asarray(table["vector"].to_pylist(), dtype=np.float32)
    dist = ((vecs - np.asarray(query, dtype=np.float32)) ** 2).sum(axis=1)
    ids = np.asarray(table["id"].to_pylist())
    return [int(i) for i in ids[np.lexsort((ids, dist))][:k]]


@pytest.mark.asyncio
async def test_a_distance_range_and_an_exact_search_across_the_levels(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_vector_unsupported_knobs_error``, which
    differs: LanceDB refuses ``distance_range`` and ``bypass_vector_index``
    over the LSM and honours them only on the base table. lance_async's LSM
    search takes both: the range ``[0, 0.5)`` holds just the two MemWAL rows
    at distance 0; an exact search ranks as brute force over every live row;
    the base-only read (pylance's ``nearest``) honours the range and does not
    see the MemWAL's row 1000."""
    ds = await vector_table(tmp_path)
    near = await ds.lsm.vector_search(ONES, column="vector", k=100, distance_range=(0.0, 0.5))
    assert sorted(near["id"].to_pylist()) == [1000, 1001]
    assert all(0.0 <= d < 0.5 for d in near["_distance"].to_pylist())
    wide = await ds.lsm.vector_search(ONES, column="vector", k=100, distance_range=(0.0, 100.0))
    assert 1000 in wide["id"].to_pylist()
    live = await ds.lsm.scan(columns=["id", "vector"]).to_table()
    exact = await ds.lsm.vector_search(ONES, column="vector", k=8, bypass_vector_index=True)
    assert exact["id"].to_pylist() == exact_nearest(live, ONES, 8)
    nearest = {"column": "vector", "q": ONES, "k": 100, "distance_range": (0.0, 100.0)}
    base = await ds.to_table(nearest=nearest, columns=["id", "_distance"])
    assert base.num_rows and 1000 not in base["id"].to_pylist()


@pytest.mark.asyncio
async def test_pages_of_an_lsm_vector_search(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_vector_limit_offset``: the second page
    (``offset=3``) of three rows is full and disjoint from the first, because
    each level gives ``k + offset`` rows before the merge skips ``offset``;
    the two pages are the first six rows of one search."""
    ds = await vector_table(tmp_path)
    pages = [
        (await ds.lsm.vector_search(ONES, column="vector", k=3, offset=o))["id"].to_pylist()
        for o in (0, 3)
    ]
    assert [len(p) for p in pages] == [3, 3] and not set(pages[0]) & set(pages[1])
    six = await ds.lsm.vector_search(ONES, column="vector", k=6)
    assert pages[0] + pages[1] == six["id"].to_pylist()


@pytest.mark.asyncio
async def test_a_postfilter_ranks_first_across_the_levels(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_vector_postfilter_errors``, which
    differs: LanceDB's LSM search always prefilters and refuses
    ``postfilter()``. lance_async's ``postfilter=True`` ranks the ``k``
    nearest live rows first and then drops those outside the filter: of the
    three nearest (1000 and 1001 from the MemWAL, then a base row) only the
    ``a`` rows are left, where the prefilter fills all three slots with
    ``a`` rows."""
    ds = await vector_table(tmp_path)
    top = await ds.lsm.vector_search(ONES, column="vector", k=3)
    wanted = [r["id"] for r in top.to_pylist() if r["category"] == "a"]
    post = await ds.lsm.vector_search(
        ONES, column="vector", k=3, filter="category = 'a'", postfilter=True
    )
    assert post["id"].to_pylist() == wanted and 1000 in wanted and len(wanted) < 3
    pre = await ds.lsm.vector_search(ONES, column="vector", k=3, filter="category = 'a'")
    assert sorted(pre["id"].to_pylist()) == [1, 2, 1000]


@pytest.mark.asyncio
async def test_a_read_by_row_id_goes_to_the_base_table(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_take_row_ids_errors``: rows of the
    newer levels have no row id in the table (each generation numbers its
    own rows from 0), so an LSM read by row id is refused with an error
    naming row ids -- lance_async's form is a filter on ``_rowid``, refused
    at the call by every LSM read -- and the base-table read by row id
    returns the two rows."""
    ds = await keyed(tmp_path, unsharded=True)
    await upsert(ds).execute(values([4]))
    with pytest.raises(FilterError, match="row id"):
        ds.lsm.scan(filter="_rowid IN (0, 1)")
    with pytest.raises(FilterError, match="row id"):
        await ds.to_table(use_lsm=True, filter="_rowid IN (0, 1)")
    base = await ds.to_table(filter="_rowid IN (0, 1)")
    assert base.num_rows == 2 and sorted(base["id"].to_pylist()) == [1, 2]


TEXTS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("text", pa.utf8(), nullable=False),
    ]
)


def text_rows(rows: list[tuple[int, str]]) -> pa.Table:
    return pa.table({"id": [r[0] for r in rows], "text": [r[1] for r in rows]}, schema=TEXTS)


async def text_table(
    tmp_path: Path, rows: list[tuple[int, str]], *, maintained: bool = True
) -> la.AsyncDataset:
    """``rows`` with an INVERTED index on ``text`` and an unsharded MemWAL
    maintaining it (or none)."""
    ds = await la.write_dataset(text_rows(rows), tmp_path / "texts.lance")
    await ds.create_scalar_index("text", "INVERTED", name="text_idx")
    await ds.initialize_mem_wal(
        unsharded=True, maintained_indexes=["text_idx"] if maintained else []
    )
    return ds


def fts_ids(table: pa.Table) -> set[int]:
    return set(table["id"].to_pylist())


@pytest.mark.asyncio
async def test_a_full_text_search_sees_the_mem_wal(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_fts_sees_memtable``: doc 4, upserted
    through the MemWAL and not compacted, is found beside the base table's
    matches, and a filter restricts the matches of every level. pylance on
    the same base table (which does not read the MemWAL) finds 1 and 3."""
    ds = await text_table(
        tmp_path, [(1, "the quick brown fox"), (2, "lazy dog sleeps"), (3, "quick red fox")]
    )
    await upsert(ds).execute(text_rows([(4, "brown fox jumps")]))
    hits = await ds.to_table(use_lsm=True, full_text_query="fox", limit=10)
    assert fts_ids(hits) == {1, 3, 4}
    assert fts_ids(await ds.lsm.full_text_search("fox", fts_columns="text", limit=10)) == {1, 3, 4}
    filtered = await ds.to_table(use_lsm=True, full_text_query="fox", filter="id > 1", limit=10)
    assert fts_ids(filtered) == {3, 4}
    base = lance.dataset(ds.uri).to_table(columns=["id", "_score"], full_text_query="fox")
    assert fts_ids(base) == {1, 3}


@pytest.mark.asyncio
async def test_a_full_text_search_needs_no_maintained_index(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_fts_unmaintained_index_errors``, which
    differs: LanceDB refuses an LSM full-text search when the MemWAL
    maintains no FTS index (its memtable could not serve the unflushed
    docs). lance_async indexes the unflushed rows for the read itself with
    the base index's settings, so the search runs and finds them."""
    ds = await text_table(tmp_path, [(1, "quick fox"), (2, "lazy dog")], maintained=False)
    await upsert(ds).execute(text_rows([(3, "red fox"), (2, "lazy fox")]))
    assert fts_ids(await ds.lsm.full_text_search("fox")) == {1, 2, 3}
    assert fts_ids(await ds.lsm.full_text_search("dog")) == set()  # 2's newest text has no dog


@pytest.mark.asyncio
async def test_a_full_text_postfilter_is_refused(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_fts_postfilter_errors``: the LSM
    full-text search always filters first, so asking for a postfilter
    (pylance's ``prefilter=False``) is an error naming it, before any read."""
    ds = await text_table(tmp_path, [(1, "quick fox"), (2, "lazy dog")])
    with pytest.raises(InvalidInputError, match="postfilter"):
        await ds.to_table(use_lsm=True, full_text_query="fox", filter="id > 0", prefilter=False)


@pytest.mark.asyncio
async def test_two_full_text_indexes_on_one_column_are_refused(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_fts_multiple_same_type_indexes_errors``:
    with two INVERTED indexes on the column, which one ranks is not defined
    (nor which settings tokenize the unflushed rows), so the search is
    refused with an error naming them."""
    ds = await la.write_dataset(text_rows([(1, "quick fox"), (2, "lazy dog")]), tmp_path / "t")
    await ds.create_scalar_index("text", "INVERTED", name="fts_a")
    await ds.create_scalar_index("text", "INVERTED", name="fts_b", replace=False)
    await ds.initialize_mem_wal(unsharded=True, maintained_indexes=["fts_a"])
    with pytest.raises(InvalidInputError, match="multiple INVERTED indexes on 'text'"):
        await ds.to_table(use_lsm=True, full_text_query="fox")


@pytest.mark.asyncio
async def test_an_optimized_full_text_index_is_one_index(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_lsm_read_fts_optimized_index_not_rejected``:
    rows added after the index, then ``optimize_indices`` (which may leave
    the index in several segments): one logical index, not "multiple", and
    every row matches -- as pylance finds on the same table."""
    ds = await la.write_dataset(
        text_rows([(i, "quick fox") for i in range(1, 6)]), tmp_path / "t.lance"
    )
    await ds.create_scalar_index("text", "INVERTED")
    await ds.insert(text_rows([(i, "lazy fox") for i in range(6, 11)]))
    await ds.optimize_indices()
    name = (await ds.describe_indices())[0].name
    await ds.initialize_mem_wal(unsharded=True, maintained_indexes=[name])
    hits = await ds.lsm.full_text_search("fox", limit=20)
    assert fts_ids(hits) == set(range(1, 11))
    theirs = lance.dataset(ds.uri).to_table(columns=["id", "_score"], full_text_query="fox")
    assert fts_ids(theirs) == fts_ids(hits)
