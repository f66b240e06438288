"""LanceDB's merge tests, by meaning, through lance_async.

Peers: lancedb/lancedb ``python/python/tests/test_table.py`` (the
``test_merge_insert*`` tests, sync and async) and
``tests/docs/test_merge_insert.py`` (the documented upsert,
insert-if-not-exists and replace-range); its MemWAL merges are
``test_lancedb_lsm.py``'s. Where pylance has the same call, the same input
goes through it too and the rows must agree.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import lance
import pandas as pd
import pyarrow as pa
import pytest

import lance_async as la

from .twins import assert_same, counts, rows, twins

AB = pa.table({"a": [1, 2, 3], "b": ["a", "b", "c"]})


async def back_to(ds: la.AsyncDataset, version: int) -> la.AsyncDataset:
    """LanceDB's ``table.restore(version)``: that version's rows, as a new one."""
    return await (await ds.checkout(version)).restore()


def their_back_to(ds: lance.LanceDataset, version: int) -> lance.LanceDataset:
    old = ds.checkout_version(version)
    old.restore()  # type: ignore[no-untyped-call]
    return lance.dataset(ds.uri)


SHAPES: list[tuple[str, Any, pa.Table, tuple[int, int, int], dict[str, list[Any]]]] = [
    # (name, clauses, source, (inserted, updated, deleted), rows after)
    (
        "upsert",
        lambda b: b.when_matched_update_all().when_not_matched_insert_all(),
        pa.table({"a": [2, 3, 4], "b": ["x", "y", "z"]}),
        (1, 2, 0),
        {"a": [1, 2, 3, 4], "b": ["a", "x", "y", "z"]},
    ),
    (
        "conditional update",
        lambda b: b.when_matched_update_all("target.b = 'b'"),
        pa.table({"a": [2, 3, 4], "b": ["x", "y", "z"]}),
        (0, 1, 0),
        {"a": [1, 2, 3], "b": ["a", "x", "c"]},
    ),
    (
        "insert if not exists",
        lambda b: b.when_not_matched_insert_all(),
        pa.table({"a": [2, 3, 4], "b": ["x", "y", "z"]}),
        (1, 0, 0),
        {"a": [1, 2, 3, 4], "b": ["a", "b", "c", "z"]},
    ),
    (
        "replace range",
        lambda b: (
            b.when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete("a > 2")
        ),
        pa.table({"a": [2, 4], "b": ["x", "z"]}),
        (1, 1, 1),
        {"a": [1, 2, 4], "b": ["a", "x", "z"]},
    ),
    (
        "replace range, no condition",
        lambda b: (
            b.when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete()
        ),
        pa.table({"a": [2, 4], "b": ["x", "z"]}),
        (1, 1, 2),
        {"a": [2, 4], "b": ["x", "z"]},
    ),
]


@pytest.mark.asyncio
async def test_the_five_merge_shapes_with_restores_between(tmp_path: Path) -> None:
    """Mirrors lancedb test_table.py ``test_merge_insert`` and
    ``test_merge_insert_async``: from the same three rows (the first version
    restored between cases, each restore a version of its own), an upsert,
    an update with a ``target.b = 'b'`` condition, insert-if-not-exists, a
    replace-range deleting the rows the source lacks where ``a > 2``, and one
    deleting every such row report their counts, commit versions 2, 4, 6, 8
    and 10, and leave the rows pylance leaves."""
    ours, theirs = await twins(tmp_path, AB)
    assert await ours.count_rows() == 3
    for step, (name, build, source, expected, after) in enumerate(SHAPES):
        if step:
            ours = await back_to(ours, 1)
            theirs = their_back_to(theirs, 1)
        result = await build(ours.merge_insert("a")).execute(source)
        assert (
            counts(result) == counts(build(theirs.merge_insert("a")).execute(source)) == expected
        ), name
        assert result.version == ours.version == 2 * (step + 1), name
        assert (await assert_same(ours, lance.dataset(theirs.uri), "a")).to_pydict() == after, name


@pytest.mark.asyncio
async def test_a_timeout_bounds_the_wait_and_commits_nothing(tmp_path: Path) -> None:
    """Mirrors the timeout case of lancedb ``test_merge_insert``, which
    differs: LanceDB's ``execute(timeout=...)`` fails a merge that runs out
    of time ("merge insert timed out"). lance_async's ``retry_timeout``
    bounds only the retries -- the first attempt always runs, so a zero
    budget still commits -- and the caller's own cancel scope is the
    timeout: ``anyio.fail_after`` that expires first commits nothing."""
    ds = await la.write_dataset(AB, tmp_path / "t.lance")
    source = pa.table({"a": [2, 4], "b": ["x", "z"]})
    builder = ds.merge_insert("a").when_matched_update_all()
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0):
            await builder.execute(source)
    assert builder.last_result is None
    assert await ds.latest_version() == 1
    result = await builder.retry_timeout(timedelta(0)).execute(source)
    assert result.committed and result.num_attempts == 1 and counts(result) == (0, 1, 0)


@pytest.mark.asyncio
async def test_a_pandas_frame_in_another_column_order_fits_non_nullable_columns(
    tmp_path: Path,
) -> None:
    """Mirrors lancedb ``test_merge_insert_nullable_pandas_into_pydantic_schema``
    (lancedb issue 2366): a pandas frame -- nullable Arrow fields, columns in
    another order than the table's non-nullable schema -- upserts as long as
    it holds no null, and the table keeps its schema."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("title", pa.string(), nullable=False),
            pa.field("content", pa.string(), nullable=False),
        ]
    )
    ds = await la.write_dataset(schema.empty_table(), tmp_path / "docs.lance")
    await ds.insert(
        pd.DataFrame(
            {"title": ["Old title", "Unchanged"], "id": [2, 3], "content": ["Old", "Keep"]}
        )
    )
    frame = pd.DataFrame(
        {"title": ["Inserted", "Updated"], "id": [1, 2], "content": ["New row", "New"]}
    )
    result = (
        await ds.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(frame)
    )
    assert counts(result) == (1, 1, 0)
    expected = pa.Table.from_pylist(
        [
            {"id": 1, "title": "Inserted", "content": "New row"},
            {"id": 2, "title": "Updated", "content": "New"},
            {"id": 3, "title": "Unchanged", "content": "Keep"},
        ],
        schema=schema,
    )
    assert (await rows(ds, "id")).equals(expected)


@pytest.mark.asyncio
async def test_a_replace_range_takes_its_condition_as_sql(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_merge_insert_by_source_delete_expr`` and its
    async twin, which differ in the spelling: LanceDB takes an expression
    object (``col("a") > lit(2)``) as the condition; pylance and lance_async
    take SQL, and anything else is a TypeError at the call, before anything
    runs. The SQL condition limits the delete as the expression does."""
    ours, theirs = await twins(tmp_path, AB)
    with pytest.raises(TypeError, match="string of SQL"):
        ours.merge_insert("a").when_not_matched_by_source_delete(pa.scalar(2))
    source = pa.table({"a": [2, 4], "b": ["x", "z"]})
    result = await (
        ours.merge_insert("a")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete("a > 2")
        .execute(source)
    )
    theirs.merge_insert(
        "a"
    ).when_matched_update_all().when_not_matched_insert_all().when_not_matched_by_source_delete(
        "a > 2"
    ).execute(source)
    assert counts(result) == (1, 1, 1)
    assert (await assert_same(ours, theirs, "a")).to_pydict() == {
        "a": [1, 2, 4],
        "b": ["a", "x", "z"],
    }


@pytest.mark.asyncio
async def test_the_last_replace_range_condition_holds(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_merge_insert_by_source_delete_reconfigure``:
    ``when_not_matched_by_source_delete("a > 2")`` called again with no
    condition widens the delete to every row the source lacks (2 deleted),
    as in pylance."""
    ours, theirs = await twins(tmp_path, AB)
    source = pa.table({"a": [2, 4], "b": ["x", "z"]})

    def build(b: Any) -> Any:
        return (
            b.when_matched_update_all()
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete("a > 2")
            .when_not_matched_by_source_delete()
        )

    result = await build(ours.merge_insert("a")).execute(source)
    assert counts(result) == counts(build(theirs.merge_insert("a")).execute(source)) == (1, 1, 2)
    assert (await assert_same(ours, theirs, "a")).to_pydict() == {"a": [2, 4], "b": ["x", "z"]}


SUBSET = pa.table({"id": [2, 3], "c": ["y", "y"]})
FORMS: dict[str, Any] = {
    "pa.Table": SUBSET,
    "pd.DataFrame": SUBSET.to_pandas(),
    "rows": SUBSET.to_pylist(),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("form", list(FORMS))
async def test_an_upsert_of_some_columns_in_each_source_form(tmp_path: Path, form: str) -> None:
    """Mirrors lancedb ``test_merge_insert_subschema`` (a pyarrow table, a
    pandas frame, a list of row dicts): an upsert carrying only ``id`` and
    ``c`` updates ``c`` of the stored row, keeps its ``a``, and inserts the
    new key with ``a`` null. The frame is where pylance differs: pandas 3
    hands its string columns over as ``large_string``, which pylance refuses
    for a ``string`` column ("Append with different schema"); lance_async
    casts a source's columns to the table's types first."""
    stored = pa.table({"id": range(3), "a": [1.0, 2.0, 3.0], "c": ["x", "x", "x"]})
    ds = await la.write_dataset(stored, tmp_path / "t.lance")
    result = (
        await ds.merge_insert(on="id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(FORMS[form])
    )
    assert counts(result) == (1, 1, 0)
    expected = pa.table({"id": [0, 1, 2, 3], "a": [1.0, 2.0, 3.0, None], "c": ["x", "x", "y", "y"]})
    assert (await rows(ds, "id")).equals(expected)
    if form == "pa.Table":  # pylance takes no list of dicts; see the docstring for frames
        theirs = lance.write_dataset(stored, str(tmp_path / "pylance.lance"))
        theirs.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
            FORMS[form]
        )
        await assert_same(ds, theirs, "id")


def batch_of(start: int) -> pa.Table:
    return pa.table(
        {
            "id": [f"id-{i:04}" for i in range(start, start + 100)],
            "category": ["A"] * 100,
            "value_a": [float(i) for i in range(start, start + 100)],
            "value_b": [i / 10 for i in range(100)],
        }
    )


@pytest.mark.asyncio
async def test_repeated_partial_updates_through_a_scalar_index(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_repeated_partial_merge_insert_with_scalar_index``:
    300 rows in three appends with a BTREE index on the string key; two
    update-only merges of one column of the middle 100 keys each update 100
    rows, and the second's values are the ones left."""
    ours, theirs = await twins(tmp_path, batch_of(0))
    for start in (100, 200):
        await ours.insert(batch_of(start))
        theirs.insert(batch_of(start))
    await ours.create_scalar_index("id", "BTREE")
    theirs.create_scalar_index("id", "BTREE")
    ids = [f"id-{i:04}" for i in range(100, 200)]
    for value in (999.0, 888.0):
        update = pa.table({"id": ids, "value_a": [value] * 100})
        result = await ours.merge_insert("id").when_matched_update_all().execute(update)
        assert counts(result) == counts(
            theirs.merge_insert("id").when_matched_update_all().execute(update)
        )
        assert result.num_updated_rows == 100
    table = await assert_same(ours, theirs, "id")
    assert table.num_rows == 300
    assert table["value_a"].to_pylist()[100:200] == [888.0] * 100


@pytest.mark.asyncio
async def test_json_values_merge_and_filter(tmp_path: Path) -> None:
    """Mirrors lancedb ``test_merge_insert_encodes_json``: an update of a row
    holding Arrow's JSON extension type stores the new document (in its
    compact form), leaves the other row, and a ``json_extract`` filter finds
    the updated row -- the same rows pylance stores."""
    jtype = pa.json_()
    schema = pa.schema([pa.field("id", pa.string()), pa.field("j", jtype)])

    def docs(pairs: list[tuple[str, str]]) -> pa.Table:
        values = pa.ExtensionArray.from_storage(
            jtype, pa.array([v for _, v in pairs], jtype.storage_type)
        )
        return pa.Table.from_arrays([pa.array([k for k, _ in pairs]), values], schema=schema)

    ours, theirs = await twins(tmp_path, schema.empty_table())
    await ours.insert(docs([("a", '{"k": 1}'), ("b", '{"k": 9}')]))
    theirs.insert(docs([("a", '{"k": 1}'), ("b", '{"k": 9}')]))
    change = docs([("a", '{"k": 2}')])
    result = await ours.merge_insert("id").when_matched_update_all().execute(change)
    theirs.merge_insert("id").when_matched_update_all().execute(change)
    assert counts(result) == (0, 1, 0)
    stored = await assert_same(ours, theirs, "id")
    assert stored.to_pylist() == [{"id": "a", "j": '{"k":2}'}, {"id": "b", "j": '{"k":9}'}]
    found = await ours.to_table(filter="json_extract(j, '$.k') = '2'")
    assert found.to_pylist() == [{"id": "a", "j": '{"k":2}'}]


@pytest.mark.asyncio
async def test_the_documented_upsert_insert_and_replace_range(tmp_path: Path) -> None:
    """Mirrors lancedb tests/docs/test_merge_insert.py ``test_upsert``,
    ``test_insert_if_not_exists`` and ``test_replace_range`` (and their async
    twins): rows given as a list of dicts; an upsert of one stored and one
    new user (1, 1, 0) leaves 3 rows at version 2; an insert-if-not-exists
    on a string key inserts only the new domain; a replace-range on a
    two-column key within ``doc_id = 1`` updates one chunk and deletes the
    other, leaving one chunk of that document."""
    users = await la.write_dataset(
        pa.Table.from_pylist([{"id": 0, "name": "Alice"}, {"id": 1, "name": "Bob"}]),
        tmp_path / "users.lance",
    )
    result = await (
        users.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute([{"id": 1, "name": "Bobby"}, {"id": 2, "name": "Charlie"}])
    )
    assert counts(result) == (1, 1, 0) and result.version == 2
    assert await users.count_rows() == 3

    domains = await la.write_dataset(
        pa.Table.from_pylist(
            [{"domain": "google.com", "name": "Google"}, {"domain": "github.com", "name": "GitHub"}]
        ),
        tmp_path / "domains.lance",
    )
    result = await (
        domains.merge_insert("domain")
        .when_not_matched_insert_all()
        .execute(
            [
                {"domain": "google.com", "name": "Google"},
                {"domain": "facebook.com", "name": "Facebook"},
            ]
        )
    )
    assert counts(result) == (1, 0, 0) and result.version == 2
    assert await domains.count_rows() == 3

    chunks = await la.write_dataset(
        pa.Table.from_pylist(
            [
                {"doc_id": 0, "chunk_id": 0, "text": "Hello"},
                {"doc_id": 0, "chunk_id": 1, "text": "World"},
                {"doc_id": 1, "chunk_id": 0, "text": "Foo"},
                {"doc_id": 1, "chunk_id": 1, "text": "Bar"},
            ]
        ),
        tmp_path / "chunks.lance",
    )
    result = await (
        chunks.merge_insert(["doc_id", "chunk_id"])
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete("doc_id = 1")
        .execute([{"doc_id": 1, "chunk_id": 0, "text": "Baz"}])
    )
    assert counts(result) == (0, 1, 1) and result.version == 2
    assert await chunks.count_rows("doc_id = 1") == 1
    assert await chunks.count_rows() == 3
