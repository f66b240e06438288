"""LSM vector search beside pylance 14's ``LsmVectorSearchPlanner``, and against brute force.

The planner is no ground truth: with no vector index on the base it returns
no row, and with an IVF index on the base it misses every row held in a
flushed generation (docs/lsm-reads.md). The first test pins that gap, so a
pylance that closes it fails here and the docs get updated; lance_async's
search is checked against an exact ranking of every level's newest rows.
Where the planner is right (every row in the base table) both agree,
``overfetch_factor`` included.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import lance
import numpy as np
import pyarrow as pa
import pytest
from lance.mem_wal import LsmVectorSearchPlanner
from typing_extensions import Unpack

import lance_async as la

from ..helpers import PK

DIM = 8
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("vec", pa.list_(pa.float32(), DIM)),
    ]
)
SHARD = "00000000-0000-4000-8000-0000000000a1"


class Rows:
    """Every key's newest vector (the model) and the tables that wrote them."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.vectors: dict[int, np.ndarray] = {}

    def table(self, ids: range | list[int]) -> pa.Table:
        vecs = self.rng.random((len(ids), DIM), dtype=np.float32)
        self.vectors.update(zip(ids, vecs, strict=True))
        flat = pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), DIM)
        return pa.table({"id": pa.array(list(ids), pa.int64()), "vec": flat}, schema=SCHEMA)

    def nearest(self, query: np.ndarray, k: int) -> list[int]:
        ids = np.array(sorted(self.vectors))
        dist = ((np.stack([self.vectors[i] for i in ids]) - query) ** 2).sum(axis=1)
        return [int(i) for i in ids[np.lexsort((ids, dist))][:k]]


class PlanOptions(TypedDict, total=False):
    """The ``LsmVectorSearchPlanner.plan_search`` options the cases give (else pylance's)."""

    nprobes: int
    overfetch_factor: float


def planner_ids(
    uri: str, snaps: list[la.ShardSnapshot], query: np.ndarray, **opts: Unpack[PlanOptions]
) -> list[int]:
    planner = LsmVectorSearchPlanner(
        lance.dataset(uri), [s.lance for s in snaps], "vec", pk_columns=["id"]
    )
    found = planner.plan_search(pa.array(query), k=10, columns=["id", "_distance"], **opts)
    return [int(i) for i in found.to_table().column("id").to_pylist()]


async def table_with_generations(tmp_path: Path) -> tuple[la.AsyncDataset, Rows, set[int]]:
    """200 base rows; then 120 rows (60 of them new keys) flushed into three generations."""
    rows = Rows(3)
    ds = await la.write_dataset(rows.table(range(200)), tmp_path / "v.lance")
    await ds.initialize_mem_wal(manual_shards=True)
    held: set[int] = set()
    async with ds.mem_wal_writer(SHARD, max_memtable_rows=40) as w:
        for i in range(3):
            ids = list(range(170 + i * 30, 210 + i * 30))
            await w.put(rows.table(ids))
            held.update(ids)
    return ds, rows, held


@pytest.mark.asyncio
async def test_pylances_planner_misses_what_generations_hold(tmp_path: Path) -> None:
    ds, rows, held = await table_with_generations(tmp_path)
    snaps = await ds.lsm.snapshots()
    assert sum(len(s.sstables) for s in snaps) == 3
    queries = [rows.rng.random(DIM, dtype=np.float32) for _ in range(8)]
    for q in queries:  # no index on the base: the planner returns nothing
        assert planner_ids(ds.uri, snaps, q) == []
        got = await ds.lsm.vector_search(q, column="vec", k=10, columns=["id"])
        assert got.column("id").to_pylist() == rows.nearest(q, 10)
    await ds.create_index("vec", "IVF_FLAT", num_partitions=2)
    missed = 0
    for q in queries:  # an exact index (IVF_FLAT, every partition probed)
        theirs = planner_ids(ds.uri, snaps, q, nprobes=2)
        truth = rows.nearest(q, 10)
        assert not set(theirs) & held  # no row of a generation, ever
        missed += len(set(truth) & held)
        got = await ds.lsm.vector_search(q, column="vec", k=10, nprobes=2, columns=["id"])
        assert got.column("id").to_pylist() == truth
    assert missed > 0, "the truth must hold rows of generations, or the test proves nothing"


@pytest.mark.asyncio
async def test_overfetch_factor_beside_pylance_where_the_planner_is_right(tmp_path: Path) -> None:
    rows = Rows(5)
    ds = await la.write_dataset(rows.table(range(300)), tmp_path / "v.lance")
    await ds.create_index("vec", "IVF_FLAT", num_partitions=4)
    await ds.initialize_mem_wal(manual_shards=True)
    snaps = await ds.lsm.snapshots()
    assert snaps == []  # every row in the base: the planner sees them all
    for q in (rows.rng.random(DIM, dtype=np.float32) for _ in range(5)):
        truth = rows.nearest(q, 10)
        for over in (1.0, 2.5):
            theirs = planner_ids(ds.uri, snaps, q, nprobes=4, overfetch_factor=over)
            got = await ds.lsm.vector_search(
                q, column="vec", k=10, nprobes=4, columns=["id"], overfetch_factor=over
            )
            assert got.column("id").to_pylist() == theirs == truth
    with pytest.raises(ValueError, match="overfetch_factor"):  # as the planner refuses it
        await ds.lsm.vector_search(q, column="vec", overfetch_factor=0.5)
    with pytest.raises(ValueError, match="overfetch_factor"):
        planner_ids(ds.uri, snaps, q, overfetch_factor=0.5)


@pytest.mark.asyncio
async def test_overfetch_widens_an_approximate_base_search(tmp_path: Path) -> None:
    """Quantized (IVF_PQ) base distances, re-ranked exactly (``refine_factor``):
    a pool of ``ceil(k * overfetch_factor)`` candidates finds more of the
    true neighbours than ``k`` (the planner's meaning of the factor)."""
    rows = Rows(7)
    ds = await la.write_dataset(rows.table(range(1_000)), tmp_path / "v.lance")
    await ds.create_index("vec", "IVF_PQ", num_partitions=2, num_sub_vectors=2)
    await ds.initialize_mem_wal(manual_shards=True)
    hits = {1.0: 0, 4.0: 0}
    for q in (rows.rng.random(DIM, dtype=np.float32) for _ in range(10)):
        truth = set(rows.nearest(q, 10))
        for over in hits:
            got = await ds.lsm.vector_search(
                q, column="vec", k=10, nprobes=2, refine_factor=1, columns=["id"],
                overfetch_factor=over,
            )  # fmt: skip
            assert got.num_rows == 10
            hits[over] += len(truth & set(got.column("id").to_pylist()))
    assert hits[4.0] > hits[1.0], hits
