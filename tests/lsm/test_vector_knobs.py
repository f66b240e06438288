"""LSM vector search's knobs (``distance_range``, ``offset``, ``postfilter``,
``bypass_vector_index``) against brute force across every level, and beside
pylance's scanner on the same base table.

The levels: a base table, three flushed generations, and the rows of an open
writer -- its WAL tail to ``ds.lsm``, its live memtable to ``writer.lsm``.
Some keys are *moved* by a newer level: their newest vector is far from the
old one and their category flipped, and the queries are their old base
vectors, so a stale base version would rank first (distance 0) and pass the
old filter; others are deleted. The model holds each key's newest row and
ranks it exactly (squared L2, float32); range bounds are put half-way
between two neighbouring distances so no rounding sits on a boundary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.errors import FilterError

from ..helpers import PK

DIM = 8
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("cat", pa.utf8(), nullable=False),
        pa.field("vec", pa.list_(pa.float32(), DIM), nullable=False),
    ]
)
SHARD = "00000000-0000-4000-8000-0000000000b2"
MOVED_BY_GENERATIONS = [11, 13, 15]
MOVED_BY_TAIL = [21, 23, 25]
DELETED = [31, 33, 160]


class Model:
    """Every key's newest (vector, category): the ground truth."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.rows: dict[int, tuple[np.ndarray, str]] = {}
        self.first: dict[int, np.ndarray] = {}

    def table(self, ids: list[int], far: bool = False) -> pa.Table:
        vecs = self.rng.random((len(ids), DIM), dtype=np.float32)
        cats = []
        for i, key in enumerate(ids):
            if far:  # a moved key: far from where it was, the other category
                vecs[i] = self.rows[key][0] + np.float32(5.0)
                cats.append("b" if self.rows[key][1] == "a" else "a")
            else:
                cats.append("a" if key % 2 else "b")
            self.first.setdefault(key, vecs[i].copy())
            self.rows[key] = (vecs[i].copy(), cats[-1])
        flat = pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), DIM)
        return pa.table({"id": ids, "cat": cats, "vec": flat}, schema=SCHEMA)

    def delete(self, ids: list[int]) -> None:
        for key in ids:
            del self.rows[key]

    def distances(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids = np.array(sorted(self.rows))
        vecs = np.stack([self.rows[i][0] for i in ids])
        cats = np.array([self.rows[i][1] for i in ids])
        return ids, ((vecs - query) ** 2).sum(axis=1, dtype=np.float32), cats

    def expect(
        self,
        query: np.ndarray,
        k: int,
        *,
        offset: int = 0,
        distance_range: tuple[float | None, float | None] | None = None,
        cat: str | None = None,
        postfilter: bool = False,
    ) -> list[int]:
        ids, dist, cats = self.distances(query)
        keep = np.ones(len(ids), dtype=bool)
        if distance_range is not None:
            lower, upper = distance_range
            keep &= dist >= (-np.inf if lower is None else lower)
            keep &= dist < (np.inf if upper is None else upper)
        if cat is not None and not postfilter:
            keep &= cats == cat
        order = [i for i in np.lexsort((ids, dist)) if keep[i]][: k + offset]
        if cat is not None and postfilter:
            order = [i for i in order if cats[i] == cat]
        return [int(ids[i]) for i in order[offset : offset + k]]

    def bounds(self, query: np.ndarray, lo: int, hi: int) -> tuple[float, float]:
        """A range holding the ``lo``-th to ``hi - 1``-th nearest (0-based)."""
        dist = np.sort(self.distances(query)[1])
        return float(dist[lo - 1] + dist[lo]) / 2, float(dist[hi - 1] + dist[hi]) / 2


async def ids_of(reader: la.LsmReader, query: np.ndarray, **opts: Any) -> list[int]:
    got = await reader.vector_search(query, column="vec", columns=["id"], **opts)
    return [int(i) for i in got.column("id").to_pylist()]


def cases(model: Model, query: np.ndarray) -> list[tuple[dict[str, Any], list[int]]]:
    """(search options, the model's answer) for each knob and their mixes."""
    rng = model.bounds(query, 3, 20)
    low = model.bounds(query, 5, 6)[0]
    out: list[tuple[dict[str, Any], list[int]]] = []
    every: list[dict[str, Any]] = [
        {"k": 10},
        {"k": 10, "distance_range": rng},
        {"k": 10, "distance_range": (low, None)},
        {"k": 10, "distance_range": (None, rng[1])},
        {"k": 5, "offset": 5},
        {"k": 4, "offset": 13},
        {"k": 10, "filter": "cat = 'a'"},
        {"k": 10, "filter": "cat = 'a'", "postfilter": True},
        {"k": 4, "offset": 3, "filter": "cat = 'b'", "postfilter": True},
        {"k": 6, "offset": 2, "distance_range": rng, "filter": "cat = 'a'"},
        {"k": 6, "offset": 2, "distance_range": rng, "filter": "cat = 'b'", "postfilter": True},
    ]
    for opts in every:
        cat = opts["filter"].split("'")[1] if "filter" in opts else None
        expected = model.expect(
            query,
            opts["k"],
            offset=opts.get("offset", 0),
            distance_range=opts.get("distance_range"),
            cat=cat,
            postfilter=opts.get("postfilter", False),
        )
        out.append((opts, expected))
    return out


@pytest.mark.asyncio
@pytest.mark.parametrize("index", [None, "IVF_FLAT"], ids=["no_index", "ivf_flat"])
async def test_every_knob_against_brute_force_across_the_levels(
    tmp_path: Path, index: str | None
) -> None:
    model = Model(11)
    ds = await la.write_dataset(model.table(list(range(200))), tmp_path / "v.lance")
    if index:
        await ds.create_index("vec", index, num_partitions=2)
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(SHARD, max_memtable_rows=40) as w:
        await w.put(model.table(list(range(150, 190))))
        await w.put(model.table(MOVED_BY_GENERATIONS, far=True))
        await w.put(model.table(list(range(200, 240))))
    assert sum(len(s.sstables) for s in await ds.lsm.snapshots()) >= 2
    async with ds.mem_wal_writer(SHARD, max_memtable_rows=100_000) as w:
        await w.put(model.table(MOVED_BY_TAIL, far=True))
        await w.put(model.table(list(range(240, 260))))
        await w.delete({"id": DELETED})
        model.delete(DELETED)
        assert (await ds.lsm.unflushed_rows())[SHARD] >= 3 + 20 + 3  # puts and deletes
        stale = MOVED_BY_GENERATIONS + MOVED_BY_TAIL + DELETED
        checked = 0
        for key in stale:
            query = model.first[key]  # the stale version would be at distance 0
            for opts, expected in cases(model, query):
                base_opts = {"nprobes": 2, **opts}
                for reader in (ds.lsm, w.lsm):
                    got = await ids_of(reader, query, **base_opts)
                    assert got == expected, (key, opts, got, expected)
                    bypass = await ids_of(reader, query, bypass_vector_index=True, **opts)
                    assert bypass == expected, (key, opts, bypass, expected)
                checked += 1
        assert checked == len(stale) * 11
        # the moved keys' newest versions are far and flipped: in no near
        # range, and a filter on their old category never brings back the old row
        for key in MOVED_BY_GENERATIONS + MOVED_BY_TAIL:
            query = model.first[key]
            old_cat = "a" if key % 2 else "b"
            for post in (False, True):
                near = await ids_of(
                    ds.lsm, query, k=10, distance_range=(None, 1.0),
                    filter=f"cat = '{old_cat}'", postfilter=post,
                )  # fmt: skip
                assert key not in near


@pytest.mark.asyncio
async def test_the_knobs_beside_pylance_on_the_base_table(tmp_path: Path) -> None:
    """Every row in the base table (IVF_PQ: approximate, so both must take
    the same path through the same index): lance_async's ``k``/``offset``/
    ``distance_range``/``postfilter``/``bypass_vector_index`` are pylance's
    ``nearest={"k": k + offset, "distance_range": ..., "use_index": ...}``,
    ``offset``, ``prefilter``."""
    model = Model(13)
    ds = await la.write_dataset(model.table(list(range(600))), tmp_path / "v.lance")
    await ds.create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=2, num_bits=4)
    await ds.initialize_mem_wal(manual_shards=True)
    theirs = lance.dataset(ds.uri)
    compared = 0
    for key in (3, 77, 150, 421):
        query = model.first[key]
        for opts, _ in cases(model, query):
            for bypass in (False, True):
                k, skip = opts["k"], opts.get("offset", 0)
                nearest: dict[str, Any] = {
                    "column": "vec", "q": query, "k": k + skip, "nprobes": 2,
                    "use_index": not bypass,
                }  # fmt: skip
                if "distance_range" in opts:
                    nearest["distance_range"] = opts["distance_range"]
                pylance = theirs.to_table(
                    columns=["id", "_distance"], nearest=nearest, offset=skip,
                    filter=opts.get("filter"), prefilter=not opts.get("postfilter", False),
                )  # fmt: skip
                mine = await ids_of(ds.lsm, query, nprobes=2, bypass_vector_index=bypass, **opts)
                assert mine == pylance.column("id").to_pylist(), (key, opts, bypass)
                compared += 1
    assert compared == 4 * 11 * 2


@pytest.mark.asyncio
async def test_bypass_vector_index_is_exact_where_the_index_is_not(tmp_path: Path) -> None:
    """An IVF_PQ base probed in one partition of four misses true neighbours;
    ``bypass_vector_index=True`` ranks every base row exactly."""
    model = Model(17)
    ds = await la.write_dataset(model.table(list(range(1_000))), tmp_path / "v.lance")
    await ds.create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=2, num_bits=4)
    await ds.initialize_mem_wal(manual_shards=True)
    differs = 0
    for _ in range(8):
        query = model.rng.random(DIM, dtype=np.float32)
        truth = model.expect(query, 10)
        assert await ids_of(ds.lsm, query, k=10, bypass_vector_index=True) == truth
        differs += await ids_of(ds.lsm, query, k=10, nprobes=1) != truth
    assert differs > 0, "the index must be approximate here, or bypassing it proves nothing"


@pytest.mark.asyncio
async def test_a_filter_on_row_ids_is_refused_by_lsm_reads(tmp_path: Path) -> None:
    """Each generation numbers its rows from 0, so ``_rowid < 2`` over the
    levels kept a generation's row 0 (a row that has no row id in the table)
    beside base rows 0 and 1. Every LSM read refuses such a filter at the
    call; the plain read of the base table takes it."""
    model = Model(19)
    ds = await la.write_dataset(model.table([1, 2, 3]), tmp_path / "v.lance")
    await ds.initialize_mem_wal(manual_shards=True)
    async with ds.mem_wal_writer(SHARD) as w:
        await w.put(model.table([4]))
    for text in ("_rowid < 2", '"_rowaddr" IN (0, 1)', "id > 0 AND _ROWID = 0"):
        with pytest.raises(FilterError, match="row id"):
            ds.lsm.scan(filter=text)
        with pytest.raises(FilterError, match="row id"):
            await ds.lsm.vector_search(model.first[1], column="vec", filter=text)
        with pytest.raises(FilterError, match="row id"):
            await ds.count_rows(text, use_lsm=True)
    # names that only look alike, and the text of a literal, are no row id
    scanned = await ds.lsm.scan(filter="cat != '_rowid'").to_table()
    assert sorted(scanned["id"].to_pylist()) == [1, 2, 3, 4]
    base = await ds.to_table(filter="_rowid < 2", columns=["id"])
    assert sorted(base["id"].to_pylist()) == [1, 2]
