"""Lance's merge_insert tests, by meaning, through lance_async (beside pylance).

Peer: lance-format/lance, ``python/python/tests/test_dataset.py``, the
``test_merge_insert*`` tests. Each test here names the one it mirrors and the
behaviour; where pylance has the same call, the same input goes through both
and the answers (row counts and tables sorted by key) must agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lance_async as la

from .twins import PK, assert_same, counts, rows, twins

NROWS = 1000
META_SCHEMA = pa.schema(
    [pa.field("a", pa.int64()), pa.field("b", pa.int64()), pa.field("c", pa.int64())],
    metadata={"foo": "bar"},
)
#: a 0..999, b 1, c alternating 0/1; in files of 100 rows
STORED = pa.table(
    {"a": range(NROWS), "b": [1] * NROWS, "c": [i % 2 for i in range(NROWS)]}, schema=META_SCHEMA
)
#: a 300..1299 (700 stored keys, 300 new), b 2, c 0
INCOMING = pa.table(
    {"a": range(300, 300 + NROWS), "b": [2] * NROWS, "c": [0] * NROWS}, schema=META_SCHEMA
)

Builder = Any
CLAUSES: dict[str, tuple[Callable[[Builder], Builder], tuple[int, int, int], int, int]] = {
    # name: (clauses, (inserted, updated, deleted), rows after, rows with b == 2)
    "insert_if_absent": (lambda b: b.when_not_matched_insert_all(), (300, 0, 0), 1300, 300),
    "update_only": (lambda b: b.when_matched_update_all(), (0, 700, 0), 1000, 700),
    "upsert": (
        lambda b: b.when_not_matched_insert_all().when_matched_update_all(),
        (300, 700, 0),
        1300,
        1000,
    ),
    "upsert_where_c_equal": (
        lambda b: b.when_not_matched_insert_all().when_matched_update_all("target.c == source.c"),
        (300, 350, 0),
        1300,
        650,
    ),
    "delete_absent": (lambda b: b.when_not_matched_by_source_delete(), (0, 0, 300), 700, 0),
    "delete_absent_where_and_insert": (
        lambda b: b.when_not_matched_by_source_delete("a < 100").when_not_matched_insert_all(),
        (300, 0, 100),
        1200,
        300,
    ),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("clause", list(CLAUSES))
async def test_each_clause_counts_and_rows_as_pylance(tmp_path: Path, clause: str) -> None:
    """Mirrors lance test_dataset.py ``test_merge_insert``: over 1,000 rows in
    files of 100 (a schema with metadata, which once broke the comparison of
    schemas), insert-if-absent, update-only, upsert, an upsert with a
    ``target.c == source.c`` condition, delete-absent and delete-absent
    within a filter plus insert each report the row counts the engine made
    and leave the rows pylance leaves; the lance_async builder also takes
    ``retry_timeout`` / ``conflict_retries(0)`` as the peer does."""
    build, expected, total, new = CLAUSES[clause]
    ours, theirs = await twins(tmp_path, STORED, max_rows_per_file=100)
    builder = build(ours.merge_insert("a")).retry_timeout(timedelta(seconds=5)).conflict_retries(0)
    result = await builder.execute(INCOMING)
    theirs_result = build(theirs.merge_insert("a")).execute(INCOMING)
    assert counts(result) == counts(theirs_result) == expected
    table = await assert_same(ours, theirs, "a")
    assert table.num_rows == total
    assert table.filter(pc.field("b") == 2).num_rows == new
    assert result.version == ours.version == theirs.version == 2


@pytest.mark.asyncio
async def test_a_merge_with_no_clause_is_a_value_error_before_any_io(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert`` (its last case): a merge_insert with
    no clause changes nothing and is a ``ValueError``. pylance raises it from
    the engine; lance_async raises :class:`MergeShapeError` (a ValueError)
    before reading the source -- a generator that would fail is never read."""
    ours, theirs = await twins(tmp_path, STORED)
    with pytest.raises(ValueError):
        theirs.merge_insert("a").execute(INCOMING)

    pulled: list[int] = []

    def source() -> Iterator[pa.RecordBatch]:
        pulled.append(1)
        yield from INCOMING.to_batches()

    with pytest.raises(la.MergeShapeError, match="no clause"):
        await ours.merge_insert("a").execute(source())
    assert not pulled  # nothing was read
    with pytest.raises(la.MergeShapeError):
        await ours.merge_insert("a").use_index(False).explain_plan()
    assert await ours.latest_version() == 1


@pytest.mark.asyncio
async def test_a_partial_source_keeps_the_columns_it_lacks(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_subcols``: a source with a subset of
    the columns updates only those (an updated row keeps its stored ``c``),
    across two fragments; an upsert of a subset inserts new keys with null
    in the columns the source lacks."""
    stored = pa.table({"a": range(10), "b": range(10), "c": range(10, 20)})
    ours, theirs = await twins(tmp_path, stored, max_rows_per_file=5)
    update = pa.table({"a": range(3, 5), "b": range(20, 22)})
    await ours.merge_insert("a").when_matched_update_all().execute(update)
    theirs.merge_insert("a").when_matched_update_all().execute(update)
    table = await assert_same(ours, theirs, "a")
    assert table["b"].to_pylist() == [0, 1, 2, 20, 21, 5, 6, 7, 8, 9]
    assert table["c"].to_pylist() == list(range(10, 20))

    upsert = pa.table({"a": range(9, 12), "b": range(30, 33)})
    await (
        ours.merge_insert("a")
        .when_not_matched_insert_all()
        .when_matched_update_all()
        .execute(upsert)
    )
    theirs.merge_insert("a").when_not_matched_insert_all().when_matched_update_all().execute(upsert)
    table = await assert_same(ours, theirs, "a")
    assert table["b"].to_pylist() == [0, 1, 2, 20, 21, 5, 6, 7, 8, 30, 31, 32]
    assert table["c"].to_pylist() == [*range(10, 20), None, None]


KEYED = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False, metadata=PK),
        pa.field("value", pa.int32(), nullable=False),
    ]
)


@pytest.mark.asyncio
async def test_no_join_column_means_the_primary_key(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_defaults_to_pk_when_on_omitted``:
    ``merge_insert()`` with no ``on`` joins on the declared primary key (an
    empty list too, as pylance and LanceDB read it)."""
    stored = pa.table({"id": [1, 2, 3], "value": [10, 20, 30]}, schema=KEYED)
    incoming = pa.table({"id": [2, 3, 4], "value": [200, 300, 400]}, schema=KEYED)
    ours, theirs = await twins(tmp_path, stored)
    result = (
        await ours.merge_insert()
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(incoming)
    )
    theirs_result = (
        theirs.merge_insert()
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(incoming)
    )
    assert counts(result) == counts(theirs_result) == (1, 2, 0)
    table = await assert_same(ours, theirs, "id")
    assert table.to_pydict() == {"id": [1, 2, 3, 4], "value": [10, 200, 300, 400]}

    again = pa.table({"id": [4, 5], "value": [4, 5]}, schema=KEYED)
    result = (
        await ours.merge_insert([])
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(again)
    )
    assert counts(result) == (1, 1, 0)


@pytest.mark.asyncio
async def test_no_join_column_and_no_primary_key_is_a_value_error(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_raises_without_pk_and_on_omitted``:
    with no ``on`` and no declared key, ``merge_insert()`` itself raises a
    ValueError that names the primary key. pylance raises it at
    ``execute``; lance_async at the call, before any I/O."""
    ours, theirs = await twins(tmp_path, pa.table({"id": [1, 2, 3], "value": [10, 20, 30]}))
    with pytest.raises(ValueError, match=r"join keys|primary key"):
        theirs.merge_insert().when_matched_update_all().execute(pa.table({"id": [1], "value": [1]}))
    with pytest.raises(ValueError, match="primary key"):
        ours.merge_insert()
    with pytest.raises(ValueError, match="primary key"):
        ours.merge_insert([])


@pytest.mark.asyncio
async def test_a_conditional_update_changes_only_rows_where_it_holds(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_conditional_upsert_example``: an
    update-only merge with ``target.txNumber < source.txNumber`` updates the
    two rows whose stored number is lower (vector column included) and
    counts (0, 2, 0); a source whose numbers are all lower updates none."""
    vec = pa.list_(pa.float32())
    stored = pa.table(
        {
            "id": [1, 2, 3, 4, 5],
            "txNumber": [1, 1, 2, 2, 3],
            "vector": pa.array([[1.0, 1.0]] * 5, vec),
        }
    )
    newer = pa.table(
        {
            "id": [1, 2, 3, 4, 5],
            "txNumber": [1, 2, 1, 2, 5],
            "vector": pa.array([[2.0, 2.0]] * 5, vec),
        }
    )
    older = newer.set_column(1, "txNumber", pa.array([0] * 5))
    ours, theirs = await twins(tmp_path, stored)
    cond = "target.txNumber < source.txNumber"
    result = await ours.merge_insert("id").when_matched_update_all(cond).execute(newer)
    theirs_result = theirs.merge_insert("id").when_matched_update_all(cond).execute(newer)
    assert counts(result) == counts(theirs_result) == (0, 2, 0)
    table = await assert_same(ours, theirs, "id")
    assert table["txNumber"].to_pylist() == [1, 2, 2, 2, 5]
    assert table["vector"].to_pylist() == [
        [1.0, 1.0],
        [2.0, 2.0],
        [1.0, 1.0],
        [1.0, 1.0],
        [2.0, 2.0],
    ]
    result = await ours.merge_insert("id").when_matched_update_all(cond).execute(older)
    assert (
        counts(result)
        == counts(theirs.merge_insert("id").when_matched_update_all(cond).execute(older))
        == (0, 0, 0)
    )
    await assert_same(ours, theirs, "id")


@pytest.mark.asyncio
async def test_a_dataset_or_a_reader_is_a_source(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_source_is_dataset``: the source may
    be another Lance dataset (files of 80 rows against files of 100), or a
    stream of its batches given with ``schema=``; both insert the 300 new
    keys. lance_async also takes an ``AsyncDataset`` as the source."""
    stored = pa.table({"a": range(NROWS), "b": [1] * NROWS})
    incoming = pa.table({"a": range(300, 300 + NROWS), "b": [2] * NROWS})
    source = lance.write_dataset(incoming, str(tmp_path / "source.lance"), max_rows_per_file=80)
    ours, theirs = await twins(tmp_path, stored, max_rows_per_file=100)
    result = await ours.merge_insert("a").when_not_matched_insert_all().execute(source)
    theirs_result = theirs.merge_insert("a").when_not_matched_insert_all().execute(source)
    assert counts(result) == counts(theirs_result) == (300, 0, 0)
    assert result.source_mode is la.SourceMode.REPLAYABLE
    table = await assert_same(ours, theirs, "a")
    assert table.filter(pc.field("b") == 2).num_rows == 300

    for make in (lambda: source.to_batches(), None):
        fresh = await la.write_dataset(
            stored, tmp_path / f"fresh-{make is None}.lance", mode="overwrite"
        )
        if make is None:
            src: Any = await la.open_dataset(tmp_path / "source.lance")
            result = await fresh.merge_insert("a").when_not_matched_insert_all().execute(src)
        else:
            result = (
                await fresh.merge_insert("a")
                .when_not_matched_insert_all()
                .execute(make(), schema=source.schema)
            )
        assert counts(result) == (300, 0, 0)
        assert (await rows(fresh, "a")).equals(table)


@pytest.mark.asyncio
async def test_a_join_on_two_columns_matches_both(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_multiple_keys``: joined on
    ``["a", "c"]``, only the 350 rows whose ``a`` and ``c`` both match are
    updated."""
    stored = pa.table({"a": range(NROWS), "b": [1] * NROWS, "c": [i % 2 for i in range(NROWS)]})
    incoming = pa.table({"a": range(300, 300 + NROWS), "b": [2] * NROWS, "c": [0] * NROWS})
    ours, theirs = await twins(tmp_path, stored, max_rows_per_file=100)
    result = await ours.merge_insert(["a", "c"]).when_matched_update_all().execute(incoming)
    theirs_result = theirs.merge_insert(["a", "c"]).when_matched_update_all().execute(incoming)
    assert counts(result) == counts(theirs_result) == (0, 350, 0)
    table = await assert_same(ours, theirs, ["a", "c"])
    assert table.filter(pc.field("b") == 2).num_rows == 350


@pytest.mark.asyncio
async def test_an_upsert_carries_a_fixed_size_vector_column(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_vector_column``: an upsert on a key
    with a fixed-size-list vector column updates one row's vector and inserts
    another (1, 1, 0)."""
    vec = pa.list_(pa.float32(), 3)
    stored = pa.table({"vec": pa.array([[1, 2, 3], [4, 5, 6]], vec), "key": [1, 2]})
    incoming = pa.table({"vec": pa.array([[7, 8, 9], [10, 11, 12]], vec), "key": [2, 3]})
    ours, theirs = await twins(tmp_path, stored)
    result = (
        await ours.merge_insert(["key"])
        .when_not_matched_insert_all()
        .when_matched_update_all()
        .execute(incoming)
    )
    theirs_result = (
        theirs.merge_insert(["key"])
        .when_not_matched_insert_all()
        .when_matched_update_all()
        .execute(incoming)
    )
    assert counts(result) == counts(theirs_result) == (1, 1, 0)
    table = await assert_same(ours, theirs, "key")
    assert table["vec"].to_pylist() == [[1, 2, 3], [7, 8, 9], [10, 11, 12]]


@pytest.mark.asyncio
async def test_when_matched_fail_refuses_a_stored_key_and_commits_nothing(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_when_matched_fail``: with
    ``when_matched_fail()`` a source of new keys only inserts them; a source
    holding a stored key fails -- ``execute`` and ``execute_uncommitted``
    alike -- and the table is unchanged. pylance raises a bare ``OSError``
    from the engine; lance_async an :class:`InvalidInputError` naming the key."""
    stored = pa.table({"id": [1, 2, 3, 4, 5], "val": [10, 20, 30, 40, 50]})
    ours, theirs = await twins(tmp_path, stored)
    fresh = pa.table({"id": [6, 7, 8], "val": [60, 70, 80]})
    result = (
        await ours.merge_insert("id")
        .when_matched_fail()
        .when_not_matched_insert_all()
        .execute(fresh)
    )
    assert counts(result) == (3, 0, 0)
    ours = await (await ours.checkout(1)).restore()  # as the peer, back to the first rows
    clash = pa.table({"id": [1, 2, 9], "val": [100, 200, 900]})
    with pytest.raises(OSError, match="found matching row"):
        theirs.merge_insert("id").when_matched_fail().when_not_matched_insert_all().execute(clash)
    version = await ours.latest_version()
    with pytest.raises(la.InvalidInputError, match=r"id = 1.*when_matched_fail"):
        await (
            ours.merge_insert("id").when_matched_fail().when_not_matched_insert_all().execute(clash)
        )
    with pytest.raises(la.InvalidInputError, match="when_matched_fail"):
        await (
            ours.merge_insert("id")
            .when_matched_fail()
            .when_not_matched_insert_all()
            .execute_uncommitted(clash)
        )
    assert await ours.latest_version() == version
    await assert_same(ours, theirs, "id")


DELETES: dict[str, tuple[pa.Table, bool, tuple[int, int, int], dict[str, list[int]]]] = {
    # name: (source, also insert, (inserted, updated, deleted), rows left)
    "matched_only": (
        pa.table({"id": [4, 5, 6, 7, 8, 9], "val": [0] * 6}),
        False,
        (0, 0, 3),
        {"id": [1, 2, 3], "val": [10, 20, 30]},
    ),
    "key_column_only": (
        pa.table({"id": [2, 4, 6]}),
        False,
        (0, 0, 3),
        {"id": [1, 3, 5], "val": [10, 30, 50]},
    ),
    "delete_and_insert": (
        pa.table({"id": [4, 5, 6, 7, 8, 9], "val": [400, 500, 600, 700, 800, 900]}),
        True,
        (3, 0, 3),
        {"id": [1, 2, 3, 7, 8, 9], "val": [10, 20, 30, 700, 800, 900]},
    ),
    "no_match": (
        pa.table({"id": [100, 200, 300], "val": [0, 0, 0]}),
        False,
        (0, 0, 0),
        {"id": [1, 2, 3, 4, 5, 6], "val": [10, 20, 30, 40, 50, 60]},
    ),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", list(DELETES))
async def test_when_matched_delete_removes_the_matched_rows(tmp_path: Path, case: str) -> None:
    """Mirrors lance ``test_merge_insert_when_matched_delete``: deletes the
    stored rows a source key matches and ignores the others; a source of the
    key column alone will do; combined with insert-if-absent it deletes the
    matched rows and inserts the rest; with no match it deletes nothing."""
    source, insert, expected, left = DELETES[case]
    stored = pa.table({"id": [1, 2, 3, 4, 5, 6], "val": [10, 20, 30, 40, 50, 60]})
    ours, theirs = await twins(tmp_path, stored)
    builder = ours.merge_insert("id").when_matched_delete()
    their_builder = theirs.merge_insert("id").when_matched_delete()
    if insert:
        builder, their_builder = (
            builder.when_not_matched_insert_all(),
            their_builder.when_not_matched_insert_all(),
        )
    result = await builder.execute(source)
    assert counts(result) == counts(their_builder.execute(source)) == expected
    assert (await assert_same(ours, theirs, "id")).to_pydict() == left


@pytest.mark.asyncio
async def test_a_partial_upsert_large_enough_for_many_join_batches(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_large``: an upsert of 10,000 rows
    carrying only the key and a 32-float vector (a column added as nulls by
    SQL) into 20,000 rows -- enough for the join to emit many batches, which
    once broke partial-column merges -- updates every matched row."""
    dims, nrows = 32, 20_000
    stored = pa.table({"id": range(nrows), "num": [str(i) for i in range(nrows)]})
    ours, theirs = await twins(tmp_path, stored)
    null_vectors = {"vector": f"arrow_cast(NULL, 'FixedSizeList({dims}, Float32)')"}
    await ours.add_columns(null_vectors)
    theirs.add_columns(null_vectors)
    values = pa.array([float(i % 97) for i in range(10_000 * dims)], pa.float32())
    incoming = pa.table(
        {"id": range(10_000), "vector": pa.FixedSizeListArray.from_arrays(values, dims)}
    )
    result = (
        await ours.merge_insert(on="id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(incoming)
    )
    theirs_result = (
        theirs.merge_insert(on="id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(incoming)
    )
    assert counts(result) == counts(theirs_result) == (0, 10_000, 0)
    table = await assert_same(ours, theirs, "id")
    assert table["vector"].null_count == nrows - 10_000
    assert table["num"].to_pylist() == [str(i) for i in range(nrows)]


@pytest.mark.asyncio
async def test_an_insert_into_an_empty_indexed_table(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_empty_index``: insert-if-absent into
    an empty table with a BTREE index on the key inserts every row."""
    empty = pa.table({"id": pa.array([], pa.float64())})
    ours, theirs = await twins(tmp_path, empty)
    await ours.create_scalar_index("id", "BTREE")
    theirs.create_scalar_index("id", "BTREE")
    incoming = pa.table({"id": [1.0, 2.0, 3.0]})
    result = await ours.merge_insert("id").when_not_matched_insert_all().execute(incoming)
    assert (
        counts(result)
        == counts(theirs.merge_insert("id").when_not_matched_insert_all().execute(incoming))
        == (3, 0, 0)
    )
    await assert_same(ours, theirs, "id")


@pytest.mark.asyncio
async def test_explain_and_analyze_plan(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_explain_analyze_plan``: the plan of
    an upsert (default schema, an explicit one, verbose) names
    ``MergeInsert``; the analysed plan of a run adds metrics, the bytes and
    files written among them -- and commits nothing."""
    data = pa.table({"id": pa.array([1, 2, 3, 4]), "value": ["a", "b", "c", "d"]})
    ours, theirs = await twins(tmp_path, data)
    builder = ours.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.string())])
    for plan in (
        await builder.explain_plan(),
        await builder.explain_plan(schema, verbose=False),
        await builder.explain_plan(verbose=True),
    ):
        assert "MergeInsert" in plan
    their_plan = (
        theirs.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .explain_plan()
    )
    assert (await builder.explain_plan()).replace("t-async", "t-pylance") == their_plan
    analysis = await builder.analyze_plan(
        pa.table({"id": pa.array([1, 5]), "value": ["updated_a", "e"]})
    )
    for word in ("MergeInsert", "metrics", "bytes_written", "num_files_written"):
        assert word in analysis
    assert await ours.latest_version() == 1


@pytest.mark.asyncio
async def test_use_index_chooses_the_join(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_use_index``: with a BTREE index on
    the key, ``use_index(False)`` explains a hash join and merges as usual
    (2 updated, 1 inserted); ``use_index(True)`` takes the index path, whose
    plan the engine cannot explain -- a bare ``OSError`` from pylance, a
    :class:`MergeShapeError` (a ValueError) from lance_async."""
    data = pa.table({"id": range(100), "value": [i * 10 for i in range(100)]})
    ours, theirs = await twins(tmp_path, data)
    await ours.create_scalar_index("id", "BTREE")
    theirs.create_scalar_index("id", "BTREE")
    plain = (
        ours.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .use_index(False)
    )
    plan = await plain.explain_plan()
    assert "MergeInsert" in plan and "Join" in plan
    indexed = (
        ours.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .use_index(True)
    )
    with pytest.raises(la.MergeShapeError, match="does not support explain_plan") as info:
        await indexed.explain_plan()
    assert info.value.clause == "use_index"
    with pytest.raises(OSError, match="does not support explain_plan"):
        theirs.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().use_index(
            True
        ).explain_plan()
    source = pa.table({"id": [1, 2, 101], "value": [999, 999, 999]})
    result = await plain.execute(source)
    theirs_result = (
        theirs.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .use_index(False)
        .execute(source)
    )
    assert counts(result) == counts(theirs_result) == (1, 2, 0)
    table = await assert_same(ours, theirs, "id")
    assert table["value"].to_pylist().count(999) == 3


@pytest.mark.asyncio
async def test_a_nullable_source_fits_a_non_nullable_table_without_nulls(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_permissive_nullability``: a source
    whose fields are nullable merges into non-nullable columns as long as it
    holds no null, and the table keeps its non-nullable schema."""
    target = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), pa.field("value", pa.int64(), nullable=False)]
    )
    ours, theirs = await twins(
        tmp_path, pa.table({"id": [1, 2, 3], "value": [10, 20, 30]}, schema=target)
    )
    incoming = pa.table({"id": [2, 4, 5], "value": [200, 400, 500]})  # nullable fields
    result = (
        await ours.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(incoming)
    )
    theirs_result = (
        theirs.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(incoming)
    )
    assert counts(result) == counts(theirs_result) == (2, 1, 0)
    table = await assert_same(ours, theirs, "id")
    assert table.to_pydict() == {"id": [1, 2, 3, 4, 5], "value": [10, 200, 30, 400, 500]}
    assert ours.schema == target


@pytest.mark.asyncio
async def test_an_uncommitted_merge_commits_later(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_with_commit``: ``execute_uncommitted``
    returns an Update transaction and the row counts without a new version;
    committing the transaction applies it."""
    data = pa.table({"id": range(10), "updated": [False] * 10})
    ours = await la.write_dataset(data, tmp_path / "t.lance")
    txn, stats = (
        await ours.merge_insert(on="id")
        .when_matched_update_all()
        .execute_uncommitted(pa.Table.from_pylist([{"id": 1, "updated": True}]))
    )
    assert counts(stats) == (0, 1, 0)
    assert isinstance(txn, lance.Transaction)
    assert isinstance(txn.operation, lance.LanceOperation.Update)
    assert await ours.latest_version() == 1
    await ours.commit(txn)
    assert ours.version == 2
    assert (await rows(ours, "id"))["updated"].to_pylist() == [False, True] + [False] * 8


MiB = 1 << 20
BLOBS = pa.schema(
    [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("blob", pa.large_binary())]
)


def blob_rows(ids: range, version: int) -> pa.Table:
    """One 10 MiB value per id, every byte ``(id + version) % 251`` (a row tells its version)."""
    return pa.table(
        {"id": list(ids), "blob": [bytes([(i + version) % 251]) * (10 * MiB) for i in ids]},
        schema=BLOBS,
    )


def blob_summary(table: pa.Table) -> list[tuple[int, int, int]]:
    """(id, length, first byte) per row, sorted: 600 MiB compared by what tells rows apart."""
    out = []
    for i, blob in zip(table["id"].to_pylist(), table["blob"], strict=True):
        value = blob.as_buffer()
        out.append((i, len(value), value.to_pybytes()[:1][0]))
    return sorted(out)


@pytest.mark.asyncio
async def test_an_upsert_of_a_400_mib_batch_of_large_rows(tmp_path: Path) -> None:
    """Mirrors lance ``test_merge_insert_large_rows``: rows far larger than
    the engine's default batches (10 MiB each), an upsert source of one
    400 MiB batch (40 rows: 10 stored keys, 30 new) -- updated and inserted
    as pylance does it, and every row holds its new value."""
    ours, theirs = await twins(tmp_path, blob_rows(range(20), 0), max_rows_per_file=10)
    incoming = blob_rows(range(10, 50), 1)
    assert incoming.nbytes >= 400 * MiB
    mine = await (
        ours.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    ).execute(incoming)
    pylance = (
        theirs.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    ).execute(incoming)
    assert counts(mine) == counts(pylance) == (30, 10, 0)
    del incoming
    expected = [(i, 10 * MiB, i % 251) for i in range(10)]
    expected += [(i, 10 * MiB, (i + 1) % 251) for i in range(10, 50)]
    assert blob_summary(await ours.to_table()) == expected
    assert blob_summary(lance.dataset(theirs.uri).to_table()) == expected
