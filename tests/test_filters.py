"""Filters: one expression, the same validation on every read path (issue 17, item 6)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import lance
import pytest
from typer.testing import CliRunner

import lance_async as la
from lance_async._filters import check_filter, check_lsm_filter
from lance_async.cli import app
from lance_async.errors import FilterError

from .helpers import kv_table

TRAILING = [
    "id < 3; DROP TABLE x",
    "id < 3;",
    "id < 3 -- and the rest",
    "id < 3 /* c */",
    "id < 3) OR (1 = 1",
    "id < 3 foo",
    "id < 3, id > 1",
    "id < 3 ORDER BY id",
]


def test_check_filter_wraps_one_expression_and_refuses_separators() -> None:
    assert check_filter("id < 3") == "(id < 3)"
    assert check_filter("name = 'a;b' AND name != 'it''s (' AND `we;ird` > 1") is not None
    assert check_filter(None) is None
    for bad in ("id < 3; x", "id < 3 -- c", "id < 3 /* c */", "id < 3)", "(id < 3", "'a", ""):
        with pytest.raises(FilterError):
            check_filter(bad)


@pytest.mark.asyncio
@pytest.mark.parametrize("text", TRAILING)
async def test_regression_text_after_the_expression_is_refused_on_every_read_path(
    table_uri: str, text: str
) -> None:
    # Before: scan and count_rows ignored it (reading id < 3), lsm_scan refused it
    ds = await la.write_dataset(kv_table(range(10)), table_uri)
    await ds.initialize_mem_wal()
    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "scan": lambda: ds.scan(filter=text).to_table(),
        "count_rows": lambda: ds.count_rows(text),
        "to_table": lambda: ds.to_table(filter=text),
        "lsm_scan": lambda: ds.lsm.scan(filter=text).to_table(),
        "delete": lambda: ds.delete(text),
    }
    for name, attempt in attempts.items():
        with pytest.raises(la.InvalidInputError):
            await attempt()
            pytest.fail(f"{name} accepted {text!r}")
    assert lance.dataset(table_uri).count_rows() == 10


def test_regression_the_scan_command_refuses_text_after_the_expression(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table(range(5)), uri)
    result = CliRunner().invoke(app, ["scan", uri, "--filter", "id < 3; DROP TABLE x"])
    assert result.exit_code != 0, result.output
    assert "one expression" in result.output


@pytest.mark.asyncio
async def test_a_query_string_filter_on_the_smallest_int64_finds_its_row(tmp_path: Path) -> None:
    """``-9223372036854775808`` in Lance SQL is a float64; the compiled filter
    must still compare equal to the int64 key."""
    from lance_async.web.filters import compile_filter

    ds = await la.write_dataset(kv_table([-(2**63), 0, 2**63 - 1]), tmp_path / "t.lance")
    for raw, expected in [
        ("id = -9223372036854775808", [-(2**63)]),
        ("id <= -9223372036854775808", [-(2**63)]),
        ("id > -9223372036854775808", [0, 2**63 - 1]),
        ("id = 9223372036854775807", [2**63 - 1]),
    ]:
        sql = compile_filter(raw, ds.schema)
        assert (await ds.to_table(filter=sql)).column("id").to_pylist() == expected, raw


def test_regression_query_string_numbers_are_ascii_decimals() -> None:
    """``\\d`` and ``int()`` take other scripts' digits and ``float()`` takes
    ``1_000``: ``id=٣`` compiled to ``id = 3``."""
    import pyarrow as pa

    from lance_async.web.filters import compile_filter

    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    for bad in ("id=٣", "id=１", "x=١.٥", "x=1_000", "x=0x10", "id=0x10"):
        with pytest.raises(FilterError, match="is not"):
            compile_filter(bad, schema)
    assert compile_filter(["id=-5", "x=-2.5E-3", "x=.5"], schema) == (
        "`id` = -5 AND `x` = -0.0025 AND `x` = 0.5"
    )


@pytest.mark.parametrize(
    "text",
    ["_rowid < 2", "`_rowaddr` > 0", '"_ROWID" = 1', "id = 1 OR _row_created_at_version = 1"],
)
def test_an_lsm_filter_may_not_name_a_row_id(text: str) -> None:
    """Each LSM level numbers its own rows: a row id names no row of the table."""
    with pytest.raises(FilterError, match="row id"):
        check_lsm_filter(text)


@pytest.mark.parametrize("text", ["my_rowid = 1", "_rowidx > 0", "name = '_rowid'", "id < 3"])
def test_an_lsm_filter_may_name_columns_that_only_look_alike(text: str) -> None:
    assert check_lsm_filter(text) == f"({text})"
