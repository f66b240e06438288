"""Helpers shared by the MemWAL tests: tables, shard ids, the LSM model."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

import lance_async as la
from lance_async.memwal.committer import Committer

from ..helpers import PK, kv_table, rows_by_key

SHARDING = ("bucket_column", "identity_column", "unsharded")


async def mem_wal_table(uri: str, rows: int = 1, **init: Any) -> la.AsyncDataset:
    """A KV table with a MemWAL: manual shards (writer mechanics, any shard id)
    unless a sharding option is given."""
    ds = await la.write_dataset(kv_table(range(rows)), uri)
    if not any(k in init for k in SHARDING):
        init.setdefault("manual_shards", True)
    return await ds.initialize_mem_wal(**init)


def sid() -> str:
    return str(uuid.uuid4())


def committer_of(writer: la.AsyncShardWriter) -> Committer:
    """The committer of an open writer: its engine writer and the gate held
    around each engine call (a test holds the gate to keep puts from draining)."""
    committer = writer._committer
    assert committer is not None, f"{writer!r} is not open"
    return committer


DIM = 8


SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("value", pa.int64()),
        pa.field("vec", pa.list_(pa.float32(), DIM)),
    ]
)


def vec_for(i: int, value: int) -> list[float]:
    return [float(i) + value / 10.0] * DIM


def rows(ids: Iterable[int], value: int) -> pa.Table:
    ids = list(ids)
    flat = np.array([vec_for(i, value) for i in ids], dtype=np.float32).reshape(-1)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "value": pa.array([value] * len(ids), pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), DIM),
        },
        schema=SCHEMA,
    )


class Model:
    """Newest state of each key."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}

    def put(self, table: pa.Table) -> None:
        for r in table.to_pylist():
            self.rows[r["id"]] = r

    def delete(self, ids: Iterable[int]) -> None:
        for i in ids:
            self.rows.pop(i, None)

    def knn(self, query: list[float], k: int, keep: Any = None) -> list[int]:
        """Ids of the ``k`` nearest rows (only ids ``keep(id)`` accepts, if given)."""
        q = np.array(query, dtype=np.float32)
        dist = sorted(
            (float(((np.array(r["vec"], dtype=np.float32) - q) ** 2).sum()), i)
            for i, r in self.rows.items()
            if keep is None or keep(i)
        )
        return [i for _, i in dist[:k]]

    def subset(self, keep: Iterable[int]) -> dict[int, dict[str, Any]]:
        wanted = set(keep)
        return {i: r for i, r in self.rows.items() if i in wanted}


def plain(table: pa.Table) -> dict[Any, dict[str, Any]]:
    out = rows_by_key(table)
    for r in out.values():
        if r.get("vec") is not None:
            r["vec"] = [float(x) for x in r["vec"]]
    return out


def model_plain(model_rows: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {
        i: {**r, "vec": [float(np.float32(x)) for x in r["vec"]]} for i, r in model_rows.items()
    }


async def setup(uri: str) -> tuple[la.AsyncDataset, Model]:
    base = rows(range(200), 0)
    ds = await la.write_dataset(base, uri)
    await ds.create_index("vec", "IVF_FLAT", num_partitions=2)
    await ds.initialize_mem_wal(manual_shards=True)  # two shards of disjoint keys (even / odd)
    model = Model()
    model.put(base)
    return ds, model


async def check_dataset_reads(ds: la.AsyncDataset, expected: dict[int, dict[str, Any]]) -> None:
    """Base + flushed SSTables through the dataset-level reads."""
    scanned = plain(await ds.lsm.scan().to_table())
    assert scanned == model_plain(expected)
    for key in (0, 1, 2, 51, 150, 201, 203, 999):
        got = await ds.lsm.point_lookup(key)
        if key in expected:
            assert plain(got) == model_plain({key: expected[key]}), key
        else:
            assert got.num_rows == 0, key
