"""LSM full-text search against the engine's own answer on the same rows.

The levels: a base table with an INVERTED index, flushed generations, a WAL
tail (``ds.lsm``) and an open writer's live memtable (``writer.lsm``). Some
keys are *reworded* by a newer level (their newest text has none of the old
words, and their category flipped), some deleted. The oracle is pylance
itself: every key's newest row written to a fresh table with the same index,
searched with the same query and filter -- the set of rows must be equal,
so a word, a phrase or a boolean query matches in the MemWAL exactly as in
the base table, and an older version never stands in for a newer one.
"""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from typing import Any

import anyio
import lance
import numpy as np
import pyarrow as pa
import pytest
from lance.query import BooleanQuery, FullTextOperator, MatchQuery, Occur, PhraseQuery

import lance_async as la
from lance_async.errors import FilterError, InvalidInputError, SchemaMismatchError

from ..helpers import PK
from .test_wal_tail import Proc

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("cat", pa.utf8(), nullable=False),
        pa.field("text", pa.utf8(), nullable=False),
    ]
)
SHARD = "00000000-0000-4000-8000-0000000000c3"
WORDS = ["quick", "brown", "fox", "foxes", "lazy", "dog", "red", "jumps", "sleeps", "river"]
REWORDED_BY_GENERATIONS = [11, 13, 15]
REWORDED_BY_TAIL = [21, 23, 25]
DELETED = [31, 33, 160]


class Model:
    """Every key's newest (category, text): the rows the oracle indexes."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.rows: dict[int, tuple[str, str]] = {}

    def table(self, ids: list[int], reword: bool = False) -> pa.Table:
        cats, texts = [], []
        for key in ids:
            if reword:  # none of the words the old text may have had
                cats.append("b" if self.rows[key][0] == "a" else "a")
                texts.append("plain words only")
            else:
                cats.append("a" if key % 2 else "b")
                n = int(self.rng.integers(2, 6))
                texts.append(" ".join(self.rng.choice(WORDS, n)))
            self.rows[key] = (cats[-1], texts[-1])
        return pa.table({"id": ids, "cat": cats, "text": texts}, schema=SCHEMA)

    def delete(self, ids: list[int]) -> None:
        for key in ids:
            del self.rows[key]

    def oracle(self, path: Path, **index: Any) -> lance.LanceDataset:
        ids = sorted(self.rows)
        table = pa.table(
            {
                "id": ids,
                "cat": [self.rows[i][0] for i in ids],
                "text": [self.rows[i][1] for i in ids],
            },
            schema=SCHEMA,
        )
        ds = lance.write_dataset(table, str(path))
        ds.create_scalar_index("text", "INVERTED", **index)
        return ds


def truth(oracle: lance.LanceDataset, query: Any, filter: str | None = None) -> set[int]:
    got = oracle.to_table(columns=["id", "_score"], full_text_query=query, filter=filter)
    return set(got.column("id").to_pylist())


async def found(reader: la.LsmReader, query: Any, **opts: Any) -> set[int]:
    got = await reader.full_text_search(query, columns=["id"], limit=None, **opts)
    ids = got.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key came back twice"
    return set(ids)


QUERIES: list[Any] = [
    "fox",
    "quick dog",
    "foxes",  # stemmed: matches "fox" too, in every level alike
    {"query": "river", "columns": ["text"]},
    PhraseQuery("brown fox", "text"),
    MatchQuery("lazy red", "text", operator=FullTextOperator.AND),
    BooleanQuery(
        [(Occur.MUST, MatchQuery("fox", "text")), (Occur.MUST_NOT, MatchQuery("dog", "text"))]
    ),
]


async def levels(tmp_path: Path, model: Model, **index: Any) -> la.AsyncDataset:
    """Base rows 0-199 (indexed), generations, then a writer left to the caller."""
    ds = await la.write_dataset(model.table(list(range(200))), tmp_path / "t.lance")
    await ds.create_scalar_index("text", "INVERTED", **index)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(SHARD, max_memtable_rows=40) as w:
        await w.put(model.table(list(range(150, 190))))
        await w.put(model.table(REWORDED_BY_GENERATIONS, reword=True))
        await w.put(model.table(list(range(200, 240))))
    assert sum(len(s.sstables) for s in await ds.lsm.snapshots()) >= 2
    return ds


async def tail_writes(ds: la.AsyncDataset, w: la.AsyncShardWriter, model: Model) -> None:
    """Rewords, new keys and deletes that stay in the writer's WAL tail."""
    await w.put(model.table(REWORDED_BY_TAIL, reword=True))
    await w.put(model.table(list(range(240, 260))))
    await w.delete({"id": DELETED})
    model.delete(DELETED)
    assert (await ds.lsm.unflushed_rows())[SHARD] >= 3 + 20 + 3


@pytest.mark.asyncio
async def test_every_query_matches_the_engine_on_the_newest_rows(tmp_path: Path) -> None:
    model = Model(23)
    ds = await levels(tmp_path, model, with_position=True)
    async with ds.mem_wal_writer(SHARD, max_memtable_rows=100_000) as w:
        await tail_writes(ds, w, model)
        oracle = model.oracle(tmp_path / "oracle.lance", with_position=True)
        compared = 0
        for query in QUERIES:
            for filter in (None, "cat = 'a'", "id >= 150"):
                expected = truth(oracle, query, filter)
                for reader in (ds.lsm, w.lsm):
                    got = await found(reader, query, filter=filter)
                    assert got == expected, (query, filter, sorted(got ^ expected))
                compared += 1
        assert compared == len(QUERIES) * 3
        # the reworded and deleted keys' old words never bring back their old rows
        old_words = await found(ds.lsm, " ".join(WORDS))
        assert not old_words & {*REWORDED_BY_GENERATIONS, *REWORDED_BY_TAIL, *DELETED}
        assert await found(ds.lsm, "plain") == {*REWORDED_BY_GENERATIONS, *REWORDED_BY_TAIL}
        # rows of every level come back: base, generations, tail
        every = await found(ds.lsm, " ".join(WORDS))
        for level in (range(150), range(200, 240), range(240, 260)):  # base, generations, tail
            assert every & set(level), level


@pytest.mark.asyncio
async def test_another_process_finds_what_the_writer_wrote(tmp_path: Path) -> None:
    """The writer keeps its shard open with rows in its WAL tail; a reader in
    another process, which has no memtable of it, finds the same rows as the
    engine on every key's newest row (the tail is read from storage)."""
    model = Model(37)
    ds = await levels(tmp_path, model)
    async with ds.mem_wal_writer(SHARD, max_memtable_rows=100_000) as w:
        await tail_writes(ds, w, model)
        oracle = model.oracle(tmp_path / "oracle.lance")
        asked = [[q, f] for q in ("fox", "quick dog", "plain") for f in (None, "cat = 'a'")]
        proc = Proc("search", ds.uri, json.dumps(asked))
        try:
            lines = await anyio.to_thread.run_sync(lambda: list(islice(proc.lines(), len(asked))))
        finally:
            proc.kill()
        for (query, filter), line in zip(asked, lines, strict=True):
            ids = line["ids"]
            assert len(ids) == len(set(ids)), "a key came back twice"
            expected = truth(oracle, query, filter)
            assert set(ids) == expected, (query, filter, sorted(set(ids) ^ expected))
        assert set(lines[4]["ids"]) == {*REWORDED_BY_GENERATIONS, *REWORDED_BY_TAIL}


@pytest.mark.asyncio
async def test_a_query_object_on_an_unindexed_column_searches_it_in_every_level(
    tmp_path: Path,
) -> None:
    """A ``lance.query`` object may name a text column without an index: the
    engine then scans it, on the base as on the unflushed rows, whatever the
    columns asked for; a column the table lacks is a SchemaMismatchError."""
    model = Model(47)
    ds = await levels(tmp_path, model)
    async with ds.mem_wal_writer(SHARD, max_memtable_rows=100_000) as w:
        await w.put(model.table(REWORDED_BY_TAIL, reword=True))  # their category flips
        oracle = model.oracle(tmp_path / "oracle.lance")
        query = MatchQuery("a", "cat")
        expected = truth(oracle, query)
        # base and generation rows match; the flipped keys' old rows must not
        assert expected & set(range(150)) and expected & set(range(200, 240))
        assert not expected & set(REWORDED_BY_TAIL)
        for reader in (ds.lsm, w.lsm):
            assert await found(reader, query) == expected
            got = await reader.full_text_search(query, columns=["text"], limit=None)
            assert got.num_rows == len(expected)
        with pytest.raises(SchemaMismatchError, match="nope"):
            await w.lsm.full_text_search(MatchQuery("a", "nope"))
        # the index was built without positions: a phrase query says which setting
        with pytest.raises(InvalidInputError, match="with_position=True"):
            await w.lsm.full_text_search(PhraseQuery("brown fox", "text"))


@pytest.mark.asyncio
async def test_the_base_index_settings_hold_in_every_level(tmp_path: Path) -> None:
    """An index without stemming: "fox" does not match "foxes" in the base
    table, and so not in the MemWAL either (the unflushed rows are indexed
    with the base index's settings, not the defaults)."""
    model = Model(29)
    ds = await levels(tmp_path, model, stem=False)
    oracle = model.oracle(tmp_path / "oracle.lance", stem=False)
    stemmed = model.oracle(tmp_path / "stemmed.lance")
    assert truth(oracle, "fox") != truth(stemmed, "fox"), "the settings must make a difference"
    for query in ("fox", "foxes", "quick foxes"):
        assert await found(ds.lsm, query) == truth(oracle, query), query


@pytest.mark.asyncio
async def test_ranking_pages_and_scores(tmp_path: Path) -> None:
    """On a base-only table the ranking is the engine's (BM25, best first);
    with rows in the MemWAL, pages of ``limit``/``offset`` are disjoint and
    together the whole ranking."""
    model = Model(31)
    ds = await la.write_dataset(model.table(list(range(120))), tmp_path / "t.lance")
    await ds.create_scalar_index("text", "INVERTED")
    await ds.initialize_mem_wal(manual_shards=True)
    theirs = lance.dataset(ds.uri).to_table(columns=["id", "_score"], full_text_query="fox dog")
    mine = await ds.lsm.full_text_search("fox dog", columns=["id"], limit=None)
    assert (
        mine.schema.names == ["id", "_score"] and mine.schema.field("_score").type == pa.float32()
    )

    def ranked(t: pa.Table) -> list[tuple[float, int]]:
        pairs = zip(t.column("_score").to_pylist(), t.column("id").to_pylist(), strict=True)
        return sorted(((-round(s, 4), i) for s, i in pairs))

    assert ranked(mine) == ranked(theirs)
    scores = mine.column("_score").to_pylist()
    assert scores == sorted(scores, reverse=True)

    # pages: rows whose scores differ within each part (one length per row:
    # which of several tied rows fills a page's edge is the engine's choice)
    def padded(ids: range, extra: int) -> pa.Table:
        texts = ["fox" + " pad" * (i + extra) for i in ids]
        return pa.table({"id": list(ids), "cat": ["a"] * len(ids), "text": texts}, schema=SCHEMA)

    paged = await la.write_dataset(padded(range(60), 1), tmp_path / "pages.lance")
    await paged.create_scalar_index("text", "INVERTED")
    await paged.initialize_mem_wal(manual_shards=True)
    async with paged.mem_wal_writer(SHARD) as w:
        await w.put(padded(range(40, 100), 2))  # 40-59 reworded, 60-99 new
        whole = (await w.lsm.full_text_search("fox", columns=["id"], limit=None))["id"]
        assert sorted(whole.to_pylist()) == list(range(100))
        pages = []
        for start in range(0, 100, 7):
            page = await w.lsm.full_text_search("fox", columns=["id"], limit=7, offset=start)
            pages.extend(page["id"].to_pylist())
        assert pages == whole.to_pylist()
        default = await w.lsm.full_text_search("fox")
        assert default.num_rows == 10 and default.schema.names == [*SCHEMA.names, "_score"]


@pytest.mark.asyncio
async def test_a_snapshot_keeps_its_matches(tmp_path: Path) -> None:
    model = Model(37)
    ds = await levels(tmp_path, model)
    view = await ds.lsm.snapshot()
    before = await found(ds.lsm, "fox", snapshot=view)
    async with ds.mem_wal_writer(SHARD, max_memtable_rows=30) as w:
        await w.put(
            pa.table({"id": [500, 501], "cat": ["a", "a"], "text": ["fox", "fox"]}, schema=SCHEMA)
        )
        await w.put(model.table(list(range(300, 400))))
    assert await found(ds.lsm, "fox", snapshot=view) == before
    assert {500, 501} <= await found(ds.lsm, "fox")


@pytest.mark.asyncio
async def test_the_unflushed_part_is_built_once_per_set_of_levels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Searches of unchanged levels reuse the indexed unflushed part; every
    write (a put, a delete, a flush) makes another set of levels, whose
    first search builds its own and sees the write."""
    from lance_async.lsm import text

    builds: list[int] = []
    build = text._build_scratch

    def counted(*args: Any) -> Any:
        builds.append(1)
        return build(*args)

    monkeypatch.setattr(text, "_build_scratch", counted)
    model = Model(43)
    ds = await levels(tmp_path, model)
    async with ds.mem_wal_writer(SHARD, max_memtable_rows=100_000) as w:
        first = await found(ds.lsm, "fox")
        for query in ("fox", "quick", "plain"):
            await found(ds.lsm, query)
            await found(ds.lsm, query)
        assert len(builds) == 1  # one filter, one set of columns, the same levels
        await found(ds.lsm, "fox", filter="cat = 'a'")
        assert len(builds) == 2  # another filter: its own part
        new = pa.table({"id": [700], "cat": ["a"], "text": ["fox"]}, schema=SCHEMA)
        await w.put(new)
        builds.clear()
        for _ in range(3):  # the stored tail and the live memtable, in turn
            for reader in (ds.lsm, w.lsm):
                assert await found(reader, "fox") == first | {700}
        assert len(builds) == 2  # one each: the writer's unchanged memtable is one level
        in_base = min(k for k in first if k < 150)  # a base row that matches, reworded now
        await w.put(model.table([in_base], reword=True))
        first.discard(in_base)
        for reader in (ds.lsm, w.lsm):  # its base row is hidden by the newer level
            assert await found(reader, "fox") == first | {700}
        builds.clear()
        await w.delete({"id": [700]})
        assert await found(ds.lsm, "fox") == first
        assert await found(ds.lsm, "fox") == first
        assert len(builds) == 1
    assert await found(ds.lsm, "fox") == first  # flushed at close: a generation now


@pytest.mark.asyncio
async def test_to_table_use_lsm_routes_a_full_text_query(tmp_path: Path) -> None:
    model = Model(41)
    ds = await levels(tmp_path, model)
    oracle = model.oracle(tmp_path / "oracle.lance")
    got = await ds.to_table(use_lsm=True, full_text_query="lazy", columns=["id"], filter="id > 9")
    assert set(got["id"].to_pylist()) == truth(oracle, "lazy", "id > 9")
    assert got.schema.names == ["id", "_score"]
    limited = await ds.to_table(use_lsm=True, full_text_query="lazy", limit=3, offset=1)
    assert limited.num_rows == 3
    with pytest.raises(InvalidInputError, match="postfilter"):
        await ds.to_table(use_lsm=True, full_text_query="lazy", filter="id > 0", prefilter=False)
    with pytest.raises(TypeError, match="does not take"):
        await ds.to_table(
            use_lsm=True, full_text_query="lazy", nearest={"column": "text", "q": [1.0]}
        )


@pytest.mark.asyncio
async def test_bad_arguments_are_typed_errors_before_any_read(tmp_path: Path) -> None:
    model = Model(43)
    ds = await la.write_dataset(model.table([1, 2, 3]), tmp_path / "t.lance")
    await ds.initialize_mem_wal(manual_shards=True)
    with pytest.raises(InvalidInputError, match="INVERTED"):
        await ds.lsm.full_text_search("fox")  # no index on the base table
    await ds.create_scalar_index("text", "INVERTED")
    bad: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"query": ""}, ValueError),
        ({"query": "   "}, ValueError),
        ({"query": 7}, TypeError),
        ({"query": None}, TypeError),
        ({"query": {"q": "fox"}}, TypeError),
        ({"query": {"query": "fox", "columns": ["text"]}, "fts_columns": "text"}, TypeError),
        ({"query": MatchQuery("fox", "text"), "fts_columns": "text"}, TypeError),
        ({"query": "fox", "fts_columns": []}, TypeError),
        ({"query": "fox", "fts_columns": [3]}, TypeError),
        ({"query": "fox", "fts_columns": "nope"}, SchemaMismatchError),
        ({"query": "fox", "fts_columns": "cat"}, InvalidInputError),  # no index on it
        ({"query": "fox", "limit": 0}, ValueError),
        ({"query": "fox", "limit": 2**40}, ValueError),
        ({"query": "fox", "limit": True}, TypeError),
        ({"query": "fox", "offset": -1}, ValueError),
        ({"query": "fox", "columns": "id"}, TypeError),
        ({"query": "fox", "columns": ["nope"]}, SchemaMismatchError),
        ({"query": "fox", "filter": "id > 1; drop"}, FilterError),
        ({"query": "fox", "filter": "_rowid < 3"}, FilterError),
    ]
    for opts, error in bad:
        with pytest.raises(error):
            await ds.lsm.full_text_search(**opts)
    assert await found(ds.lsm, "plain") == set()  # still usable, nothing matched


@pytest.mark.asyncio
async def test_two_indexes_on_a_column_are_refused(tmp_path: Path) -> None:
    model = Model(47)
    ds = await la.write_dataset(model.table(list(range(10))), tmp_path / "t.lance")
    await ds.create_scalar_index("text", "INVERTED", name="a")
    await ds.create_scalar_index("text", "INVERTED", name="b", replace=False)
    await ds.initialize_mem_wal(manual_shards=True)
    with pytest.raises(InvalidInputError, match="multiple INVERTED indexes on 'text'"):
        await ds.lsm.full_text_search("fox")
