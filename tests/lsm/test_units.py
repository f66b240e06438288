"""Unit tests of the read side's pure parts: KeyIndex against a model, the
memtable mirror against a scripted engine, the WAL tail's rows.

No table here: these are the parts whose every case a real engine cannot be
steered into (a memtable sealed by exactly this put), checked fast and
exhaustively; the real engine's tests are beside them in this package.
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from lance_async.errors import LanceAsyncError
from lance_async.lsm.keyindex import KeyIndex
from lance_async.lsm.memtable import MemtableMirror

from ..helpers import KV_SCHEMA, kv_table

# -- KeyIndex against a dict ------------------------------------------------------


def _values(kind: str, rng: np.random.Generator, n: int) -> list[Any]:
    if kind == "compact-int":
        return [int(x) for x in rng.integers(-50, 200, n)]
    if kind == "sparse-int":
        return [int(x) for x in rng.integers(-(2**62), 2**62, n // 2)] + [0, -1, 2**63 - 1] * (
            n // 6
        )
    if kind == "string":
        return ["k" + str(x) * int(x % 4) for x in rng.integers(0, n, n)]
    if kind == "float":
        return [float(x) / 7 for x in rng.integers(-n, n, n)] + [-0.0, 0.0]
    if kind == "date":
        return [
            datetime.date(2020, 1, 1) + datetime.timedelta(days=int(x))
            for x in rng.integers(0, 90, n)
        ]
    if kind == "binary":
        return [bytes([int(x) % 7]) * int(x % 5) for x in rng.integers(0, 1000, n)]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["compact-int", "sparse-int", "string", "float", "date", "binary"])
@pytest.mark.parametrize("seed", [1, 2])
def test_key_index_finds_the_first_position_of_every_key(kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    keys = _values(kind, rng, 600)
    probe = _values(kind, np.random.default_rng(seed + 100), 300) + keys[:50]
    index = KeyIndex([pa.array(keys)])
    first: dict[Any, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    got = index.find([pa.array(probe)])
    want = [first.get(k, -1) for k in probe]
    assert got.tolist() == want
    assert index.contains([pa.array(probe)]).tolist() == [w >= 0 for w in want]


def test_key_index_of_a_composite_key_and_of_nothing() -> None:
    a = pa.array([1, 1, 2, 2, 1], pa.int64())
    b = pa.array(["x", "y", "x", "x", "x"])
    index = KeyIndex([a, b])
    got = index.find([pa.array([2, 1, 1, 3], pa.int64()), pa.array(["x", "y", "x", "x"])])
    assert got.tolist() == [2, 1, 0, -1]
    empty = KeyIndex([pa.array([], pa.int64())])
    assert empty.find([pa.array([1, 2], pa.int64())]).tolist() == [-1, -1]
    assert empty.contains([pa.array([], pa.int64())]).tolist() == []


# -- the memtable mirror against a scripted engine ---------------------------------------


class FakeShardWriter:
    """Stands in for ``lance.mem_wal.ShardWriter``: ``memtable_stats()`` follows
    a script, so a memtable can be sealed at exactly the put a test chooses
    (the real engine seals by size, which a test cannot place). Named fake:
    only the mirror's bookkeeping is under test here."""

    def __init__(self, stats: list[tuple[int, int]]) -> None:
        self._stats = iter(stats)  # (generation, row_count) after each call
        self.calls: list[str] = []

    def memtable_stats(self) -> dict[str, Any]:
        generation, rows = next(self._stats)
        return {"generation": generation, "row_count": rows, "frozen_count": 0}

    def put(self, table: pa.Table) -> None:
        self.calls.append(f"put {table.num_rows}")

    def delete(self, keys: pa.Table) -> None:
        self.calls.append(f"delete {keys.num_rows}")


def mirror(tmp_path: Any) -> MemtableMirror:
    return MemtableMirror(str(tmp_path / "none.lance"), "shard", KV_SCHEMA, ["id"])


def test_the_mirror_places_each_put_in_its_memtable_generation(tmp_path: Any) -> None:
    engine = FakeShardWriter(
        [
            (1, 0),  # before the first put
            (1, 2),  # put of 2 rows: same generation
            (2, 3),  # put of 3 rows, memtable sealed before it: generation 2 holds them
            (3, 0),  # put of 1 row filled generation 2, then sealed
            (3, 1),  # a delete of 1 key in generation 3
        ]
    )
    m = mirror(tmp_path)
    m.put(engine, kv_table([1, 2], value=1))
    m.put(engine, kv_table([3, 4, 5], value=2))
    m.put(engine, kv_table([1], value=3))
    m.delete(engine, pa.table({"id": pa.array([2], pa.int64())}))
    assert engine.calls == ["put 2", "put 3", "put 1", "delete 1"]
    _, parts = m.parts()
    by_gen = {p.generation: p.table for p in parts}
    assert by_gen[1].column("id").to_pylist() == [1, 2]
    assert by_gen[2].column("id").to_pylist() == [3, 4, 5, 1]
    assert by_gen[3].column("id").to_pylist() == [2]
    assert by_gen[3].column("_tombstone").to_pylist() == [True]
    assert by_gen[3].column("value").to_pylist() == [None]
    assert m.rows() == 7
    m.forget({1, 2})
    assert [p.generation for p in m.parts()[1]] == [3]


def test_a_put_the_mirror_cannot_place_breaks_its_reads(tmp_path: Any) -> None:
    # generation advanced, and the memtable holds neither 0 rows nor exactly the put's
    engine = FakeShardWriter([(1, 0), (2, 7)])
    m = mirror(tmp_path)
    with pytest.raises(LanceAsyncError, match="cannot tell which memtable"):
        m.put(engine, kv_table([1, 2], value=1))
    with pytest.raises(LanceAsyncError, match="cannot be read"):
        m.parts()


def test_a_reopened_engine_writer_is_read_fresh(tmp_path: Any) -> None:
    m = mirror(tmp_path)
    m.put(FakeShardWriter([(1, 0), (1, 2)]), kv_table([1, 2]))
    m.reopened(epoch=5)  # closed (flushing generation 1) and opened again
    fresh = FakeShardWriter([(2, 0), (2, 1)])  # its stats are read, not the old writer's
    m.put(fresh, kv_table([3]))
    assert m.epoch == 5
    assert {p.generation: p.table.num_rows for p in m.parts()[1]} == {1: 2, 2: 1}
