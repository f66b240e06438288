"""The engine's memory pool: sized from lance_async, a typed error with advice (item 8)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

import lance_async as la

from .helpers import PK

SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("v", pa.float64())]
)


@pytest.fixture
def restore_memory() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("LANCE_MEM_POOL_SIZE", "LANCE_MAX_TEMP_DIRECTORY_SIZE")}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def rows(lo: int, hi: int, v: float) -> pa.Table:
    return pa.table({"id": np.arange(lo, hi), "v": np.full(hi - lo, v)}, schema=SCHEMA)


def test_configure_memory_sets_restores_and_checks(restore_memory: None) -> None:
    limits = la.configure_memory(pool_bytes=256 << 20, max_temp_directory_bytes=1 << 30)
    assert limits == la.MemoryLimits(256 << 20, 1 << 30)
    assert la.configure_memory(pool_bytes=None) == la.MemoryLimits(None, 1 << 30)  # the other kept
    assert la.memory_limits().pool_bytes is None
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="pool_bytes"):
            la.configure_memory(pool_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_regression_an_exhausted_memory_pool_is_a_typed_error_with_advice(
    table_uri: str, restore_memory: None
) -> None:
    # Before: a bare OSError("Resources exhausted ...") and no way to size the pool
    ds = await la.write_dataset(rows(0, 50_000, 0.0), table_uri)
    await ds.create_scalar_index("id", "BTREE")
    version = ds.version
    upsert = rows(25_000, 75_000, 1.0)
    la.configure_memory(pool_bytes=4096)
    with pytest.raises(la.ResourceExhaustedError, match="configure_memory") as err:
        await (
            ds.merge_insert()
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(upsert)
        )
    assert err.value.pool_bytes == 4096
    assert "4,096 bytes" in str(err.value)
    assert (await la.open_dataset(table_uri)).version == version
    la.configure_memory(pool_bytes=None)  # the engine's default again, from the next call
    result = (
        await ds.merge_insert()
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute(upsert)
    )
    assert (result.num_updated_rows, result.num_inserted_rows) == (25_000, 25_000)
