"""Lookup keys: one strict conversion rule on every path (issue 17, item 5)."""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.lsm.keyvalues import key_value

from ..memwal.support import mem_wal_table, sid

ID = pa.field("id", pa.int64())


@pytest.mark.parametrize(
    ("value", "field", "expected"),
    [
        (5, ID, 5),
        (2.0, ID, 2),
        (np.int32(7), ID, 7),
        (255, pa.field("u", pa.uint8()), 255),
        (1.5, pa.field("f", pa.float32()), 1.5),
        (3, pa.field("f", pa.float64()), 3.0),
        ("x", pa.field("s", pa.string()), "x"),
        (True, pa.field("b", pa.bool_()), True),
        (datetime.date(2013, 1, 2), pa.field("d", pa.date32()), datetime.date(2013, 1, 2)),
    ],
)
def test_key_value_accepts_values_that_fit_exactly(
    value: object, field: pa.Field, expected: object
) -> None:
    assert key_value(value, field) == expected


@pytest.mark.parametrize(
    ("value", "field", "why"),
    [
        (True, ID, "a boolean is not an integer"),
        (1.5, ID, "not an integer"),
        (float("nan"), ID, "not an integer"),
        (2**70, ID, "out of range"),
        (256, pa.field("u", pa.uint8()), "out of range"),
        (-1, pa.field("u", pa.uint32()), "out of range"),
        ("7", ID, "expected an integer"),
        (True, pa.field("f", pa.float64()), "expected a number"),
        (float("inf"), pa.field("f", pa.float64()), "finite"),
        (5, pa.field("s", pa.string()), "expected a string"),
        (1, pa.field("b", pa.bool_()), "expected a boolean"),
        (None, ID, "cannot be null"),
    ],
)
def test_key_value_refuses_loose_values(value: object, field: pa.Field, why: str) -> None:
    with pytest.raises(la.InvalidInputError, match=why):
        key_value(value, field)


@pytest.mark.asyncio
async def test_regression_dataset_and_writer_lookups_share_one_key_rule(table_uri: str) -> None:
    # Before: 1.5 was truncated to 1 on the dataset path and refused on the
    # writer's; 2**70 was an error on one and an empty result on the other.
    ds = await mem_wal_table(table_uri, rows=5)
    async with ds.mem_wal_writer(sid()) as writer:
        for lookup in (ds.lsm.point_lookup, writer.lsm.point_lookup):
            assert (await lookup(2.0)).column("id").to_pylist() == [2]
            for bad, why in ((1.5, "not an integer"), (2**70, "out of range"), (True, "boolean")):
                with pytest.raises(la.InvalidInputError, match=why):
                    await lookup(bad)
