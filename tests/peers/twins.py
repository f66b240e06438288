"""Helpers of the peer suites: one table written twice, as an ``AsyncDataset``
and as a pylance ``LanceDataset``, and the comparisons of their answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import pyarrow as pa

import lance_async as la

PK = {"lance-schema:unenforced-primary-key": "true"}


async def twins(
    tmp_path: Path, data: pa.Table, name: str = "t", **write: Any
) -> tuple[la.AsyncDataset, lance.LanceDataset]:
    """``data`` written to two tables: one for lance_async, one for pylance."""
    ours = await la.write_dataset(data, tmp_path / f"{name}-async.lance", **write)
    theirs = lance.write_dataset(data, str(tmp_path / f"{name}-pylance.lance"), **write)
    return ours, theirs


def counts(result: la.MergeResult | dict[str, Any]) -> tuple[int, int, int]:
    """(inserted, updated, deleted) of a lance_async result or a pylance dict."""
    if isinstance(result, dict):
        return (
            result["num_inserted_rows"],
            result["num_updated_rows"],
            result["num_deleted_rows"],
        )
    return (result.num_inserted_rows, result.num_updated_rows, result.num_deleted_rows)


async def rows(ds: la.AsyncDataset, key: str | list[str]) -> pa.Table:
    """Every row of the base table, sorted by ``key``."""
    return (await ds.to_table()).sort_by(
        key if isinstance(key, str) else [(k, "ascending") for k in key]
    )


def their_rows(ds: lance.LanceDataset, key: str | list[str]) -> pa.Table:
    """Every row of a pylance table, sorted by ``key``."""
    return ds.to_table().sort_by(key if isinstance(key, str) else [(k, "ascending") for k in key])


async def assert_same(
    ours: la.AsyncDataset, theirs: lance.LanceDataset, key: str | list[str]
) -> pa.Table:
    """Both tables hold the same rows (compared sorted by ``key``); returns ours."""
    mine = await rows(ours, key)
    assert mine.equals(their_rows(theirs, key)), (
        mine.to_pylist(),
        their_rows(theirs, key).to_pylist(),
    )
    return mine
