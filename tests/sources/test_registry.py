"""WriteSource registry: modes, replays, schema checks.

On asyncio only: coercing an object into a source does not depend on the
backend; the bridges that read sources run on both (tests/sources/test_streams.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import lance
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

import lance_async as la
from lance_async.sources import WriteSource, resolve_source

from ..helpers import KV_SCHEMA, Ticker, kv_table

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def read_all(source: WriteSource) -> pa.Table:
    batches = [b async for b in source.open()]
    return pa.Table.from_batches(batches, schema=source.schema)


async def read_reader(source: WriteSource) -> pa.Table:
    async with source.reader() as reader:
        return await anyio.to_thread.run_sync(reader.read_all)


def gen_batches(n: int = 3) -> Iterator[pa.RecordBatch]:
    for i in range(n):
        yield kv_table([i]).to_batches()[0]


async def agen_batches(n: int = 3) -> AsyncIterator[pa.RecordBatch]:
    for i in range(n):
        await anyio.lowlevel.checkpoint()
        yield kv_table([i]).to_batches()[0]


def _lance(tmp_path: Path) -> Any:
    return lance.write_dataset(kv_table(range(5)), str(tmp_path / "src.lance"))


def _parquet_ds(tmp_path: Path) -> pds.Dataset:
    path = tmp_path / "src.parquet"
    pq.write_table(kv_table(range(5)), path)
    return pds.dataset(str(path))


#: case -> (what makes the object, given a temporary directory; its source's mode)
CASES: dict[str, tuple[Callable[[Path], object], la.SourceMode]] = {
    "table": (lambda p: kv_table(range(3)), la.SourceMode.MATERIALIZED),
    "record_batch": (lambda p: kv_table(range(3)).to_batches()[0], la.SourceMode.MATERIALIZED),
    "list_of_batches": (
        lambda p: kv_table(range(3)).to_batches(max_chunksize=1),
        la.SourceMode.MATERIALIZED,
    ),
    "tuple_of_batches": (
        lambda p: tuple(kv_table(range(3)).to_batches(max_chunksize=1)),
        la.SourceMode.MATERIALIZED,
    ),
    "pandas": (lambda p: pd.DataFrame({"id": [1, 2], "value": [3, 4]}), la.SourceMode.MATERIALIZED),
    "polars": (lambda p: pl.DataFrame({"id": [1, 2], "value": [3, 4]}), la.SourceMode.MATERIALIZED),
    "dict_of_columns": (lambda p: {"id": [1, 2], "value": [3, 4]}, la.SourceMode.MATERIALIZED),
    "list_of_dicts": (
        lambda p: [{"id": 1, "value": 3}, {"id": 2, "value": 4}],
        la.SourceMode.MATERIALIZED,
    ),
    "lance_dataset": (_lance, la.SourceMode.REPLAYABLE),
    "in_memory_dataset": (lambda p: pds.dataset(kv_table(range(3))), la.SourceMode.REPLAYABLE),
    "filesystem_dataset": (_parquet_ds, la.SourceMode.REPLAYABLE),
    "union_dataset": (
        lambda p: pds.dataset(
            [pds.dataset(kv_table(range(2))), pds.dataset(kv_table(range(2, 4)))]
        ),
        la.SourceMode.REPLAYABLE,
    ),
    "replayable_sync": (
        lambda p: la.replayable(lambda: kv_table(range(3)).to_batches(), schema=KV_SCHEMA),
        la.SourceMode.REPLAYABLE,
    ),
    "replayable_async": (
        lambda p: la.replayable(agen_batches, schema=KV_SCHEMA),
        la.SourceMode.REPLAYABLE,
    ),
    "record_batch_reader": (
        lambda p: pa.RecordBatchReader.from_batches(KV_SCHEMA, kv_table(range(3)).to_batches()),
        la.SourceMode.STREAMING,
    ),
    "scanner": (lambda p: pds.dataset(kv_table(range(3))).scanner(), la.SourceMode.STREAMING),
    "filtered_dataset": (
        lambda p: pds.dataset(kv_table(range(3))).filter(pds.field("id") > 0),
        la.SourceMode.STREAMING,
    ),
    "generator": (lambda p: gen_batches(), la.SourceMode.STREAMING),
    "async_generator": (lambda p: agen_batches(), la.SourceMode.STREAMING),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_each_adapter_has_its_mode_and_reads(case: str, tmp_path: Path) -> None:
    make, mode = CASES[case]
    source = await la.resolve_source(make(tmp_path))
    assert source.mode is mode
    assert isinstance(source.schema, pa.Schema)
    table = await read_all(source)
    assert table.num_rows >= 2
    assert "id" in table.column_names


async def test_file_sources_are_replayable(tmp_path: Path) -> None:
    table = kv_table(range(10))
    paths = {
        "ipc": tmp_path / "a.arrow",
        "ndjson": tmp_path / "a.ndjson",
        "csv": tmp_path / "a.csv",
    }
    with pa.OSFile(str(paths["ipc"]), "wb") as f, pa.ipc.new_file(f, KV_SCHEMA) as w:
        w.write_table(table)
    paths["ndjson"].write_text(
        "".join(f'{{"id": {i}, "value": 0, "name": "n{i}"}}\n' for i in range(10))
    )
    paths["csv"].write_text("name,id,value\n" + "".join(f"n{i},{i},0\n" for i in range(10)))
    for fmt, path in paths.items():
        source = la.file_source(path, schema=KV_SCHEMA)
        assert source.mode is la.SourceMode.REPLAYABLE, fmt
        assert (await read_all(source)).equals(table), fmt
        assert (await read_reader(source)).equals(table), fmt
    # a Path is coerced through the same registry
    assert la.coerce_source(paths["ipc"]).mode is la.SourceMode.REPLAYABLE


REPLAYABLE = [
    "lance_dataset",
    "in_memory_dataset",
    "filesystem_dataset",
    "union_dataset",
    "replayable_sync",
    "replayable_async",
    "table",
]


@pytest.mark.parametrize("case", REPLAYABLE)
async def test_replayable_source_opened_three_times_gives_equal_tables(
    case: str, tmp_path: Path
) -> None:
    make, _ = CASES[case]
    source = await la.resolve_source(make(tmp_path))
    first = await read_all(source)
    assert (await read_reader(source)).equals(first)
    assert (await read_all(source)).equals(first)
    assert source.passes == 3


@pytest.mark.parametrize("case", ["record_batch_reader", "generator", "async_generator", "scanner"])
async def test_streaming_source_refuses_a_second_pass(case: str, tmp_path: Path) -> None:
    make, _ = CASES[case]
    source = await la.resolve_source(make(tmp_path))
    await read_all(source)
    with pytest.raises(la.SourceConsumedError):
        source.open()
    with pytest.raises(la.SourceConsumedError):
        async with source.reader():
            pass


async def test_factory_schema_change_on_replay_is_caught() -> None:
    calls = 0

    def factory() -> pa.RecordBatchReader:
        nonlocal calls
        calls += 1
        table = kv_table(range(3))
        if calls > 1:  # same names and types, different metadata
            table = table.replace_schema_metadata({"changed": "yes"})
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())

    source = la.replayable(factory, schema=KV_SCHEMA)
    await read_reader(source)
    with pytest.raises(la.SourceChangedError):
        await read_reader(source)


async def test_factory_type_change_on_replay_is_caught_before_rows_move() -> None:
    calls = 0

    def factory() -> list[pa.RecordBatch]:
        nonlocal calls
        calls += 1
        if calls == 1:
            first: list[pa.RecordBatch] = kv_table(range(3)).to_batches()
            return first
        retyped = KV_SCHEMA.set(1, pa.field("value", pa.string()))
        return [pa.record_batch({"id": [1], "value": ["text"], "name": ["x"]}, schema=retyped)]

    source = la.replayable(factory, schema=KV_SCHEMA)
    await read_all(source)
    with pytest.raises(la.SourceChangedError, match="value"):
        await read_all(source)


async def test_changed_file_is_caught_on_replay(tmp_path: Path) -> None:
    path = tmp_path / "rows.ndjson"
    path.write_text('{"id": 1, "value": 1, "name": "a"}\n')
    source = la.file_source(path, schema=KV_SCHEMA)
    await read_all(source)
    path.write_text('{"id": 1, "value": 1, "name": "a"}\n{"id": 2, "value": 2, "name": "b"}\n')
    os.utime(path, ns=(1, 1))
    with pytest.raises(la.SourceChangedError):
        await read_all(source)


async def test_changed_parquet_dataset_is_caught_on_replay(tmp_path: Path) -> None:
    ds = _parquet_ds(tmp_path)
    source = la.coerce_source(ds)
    await read_reader(source)
    pq.write_table(kv_table(range(9)), tmp_path / "src.parquet")
    with pytest.raises(la.SourceChangedError):
        await read_reader(source)


async def test_drifting_batch_names_batch_index_and_field() -> None:
    def drifting() -> Iterator[pa.RecordBatch]:
        yield kv_table([1]).to_batches()[0]
        yield kv_table([2]).to_batches()[0]
        yield kv_table([3]).to_batches()[0]
        yield pa.record_batch({"id": [4], "value": [1.5], "name": ["x"]})

    source = la.coerce_source(drifting(), schema=KV_SCHEMA)
    with pytest.raises(la.SchemaMismatchError) as info:
        await read_reader(source)
    assert info.value.batch_index == 3
    assert info.value.field == "value"


async def test_drifting_batch_never_reaches_rust_as_a_panic(tmp_path: Path) -> None:
    async def drifting() -> AsyncIterator[pa.RecordBatch]:
        yield kv_table([1]).to_batches()[0]
        yield pa.record_batch({"id": [2], "value": ["two"], "name": ["x"]})

    with pytest.raises(la.SchemaMismatchError) as info:
        await la.write_dataset(drifting(), tmp_path / "t.lance", schema=KV_SCHEMA)
    assert info.value.batch_index == 1
    assert not (tmp_path / "t.lance" / "_versions").exists() or not list(
        (tmp_path / "t.lance" / "_versions").glob("*.manifest")
    )


async def test_empty_sources_still_have_a_schema() -> None:
    assert la.coerce_source([], schema=KV_SCHEMA).schema == KV_SCHEMA
    empty_reader = pa.RecordBatchReader.from_batches(KV_SCHEMA, [])
    source = la.coerce_source(empty_reader)
    assert source.schema == KV_SCHEMA
    assert (await read_all(source)).num_rows == 0

    async def nothing() -> AsyncIterator[pa.RecordBatch]:
        return
        yield  # pragma: no cover

    source = await la.resolve_source(nothing(), schema=KV_SCHEMA)
    assert (await read_all(source)).num_rows == 0
    with pytest.raises(la.SourceError, match="empty"):
        await la.resolve_source(nothing())
    with pytest.raises(la.SchemaMismatchError, match="schema="):
        la.coerce_source([])


async def test_unknown_type_names_it_and_says_how_to_register() -> None:
    class Custom:
        def __init__(self, table: pa.Table) -> None:
            self.table = table

    with pytest.raises(TypeError) as info:
        la.coerce_source(Custom(kv_table([1])))
    assert "Custom" in str(info.value)
    assert "coerce_source.register" in str(info.value)

    @la.coerce_source.register(Custom)
    def _(obj: Custom, *, schema: pa.Schema | None = None) -> WriteSource:
        return la.coerce_source(obj.table, schema=schema)

    source = la.coerce_source(Custom(kv_table([1, 2])))
    assert source.mode is la.SourceMode.MATERIALIZED
    assert (await read_all(source)).num_rows == 2


async def test_strings_are_not_sources() -> None:
    with pytest.raises(TypeError, match="file_source"):
        la.coerce_source("rows.csv")


async def test_materialized_schema_casts_only_losslessly() -> None:
    source = la.coerce_source({"id": [1, 2], "value": [3, 4], "name": ["a", "b"]}, schema=KV_SCHEMA)
    assert source.schema.equals(KV_SCHEMA, check_metadata=True)
    with pytest.raises(la.SchemaMismatchError):
        la.coerce_source(pa.table({"id": [1.5], "value": [1], "name": ["a"]}), schema=KV_SCHEMA)
    with pytest.raises(la.SchemaMismatchError, match="missing"):
        la.coerce_source(pa.table({"id": [1]}), schema=KV_SCHEMA)


async def test_non_nullable_nulls_are_rejected() -> None:
    batch = pa.record_batch({"id": [1, None], "value": [1, 2], "name": ["a", "b"]})
    source = la.coerce_source(
        [batch.cast(pa.schema([("id", pa.int64()), ("value", pa.int64()), ("name", pa.string())]))]
    )
    assert source.schema.field("id").nullable
    with pytest.raises(la.SchemaMismatchError, match="null"):
        la.coerce_source(la.replayable(lambda: [batch], schema=KV_SCHEMA)).open_reader().read_all()


async def test_async_sources_need_the_bridge_for_a_blocking_reader() -> None:
    source = await la.resolve_source(agen_batches())
    assert not source.native
    with pytest.raises(la.SourceError, match="reader"):
        source.open_reader()
    assert (await read_reader(source)).num_rows == 3


async def test_source_error_is_raised_as_itself_by_write_dataset(tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    async def fails_after_three() -> AsyncIterator[pa.RecordBatch]:
        for i in range(3):
            yield kv_table([i]).to_batches()[0]
        raise Boom("producer failed")

    with pytest.raises(Boom, match="producer failed"):
        await la.write_dataset(fails_after_three(), tmp_path / "t.lance", schema=KV_SCHEMA)
    with pytest.raises(la.DatasetNotFoundError):
        await la.open_dataset(tmp_path / "t.lance")


async def test_regression_frames_with_large_strings_fit_string_tables(table_uri: str) -> None:
    frame = pd.DataFrame({"id": [1, 2], "value": [3, 4], "name": ["a", "b"]})
    source = la.coerce_source(frame)
    assert source.schema.field("name").type == pa.string()
    ds = await la.write_dataset(kv_table(range(3)), table_uri)
    result = await ds.merge_insert("id").when_matched_update_all().execute(frame)
    assert result.num_updated_rows == 2
    polars_source = la.coerce_source(pl.DataFrame({"id": [1], "name": ["x"]}))
    assert polars_source.schema.field("name").type == pa.string()


def test_regression_unsupported_sources_are_typed_and_type_errors() -> None:
    for bad in (None, 42, object(), "rows.csv"):
        with pytest.raises(la.UnsupportedSourceError) as info:
            la.coerce_source(bad)
        assert isinstance(info.value, TypeError)
        assert isinstance(info.value, la.LanceAsyncError)


async def test_converting_python_rows_leaves_the_loop_free(tmp_path: Path) -> None:
    rows = [{"id": i, "value": i, "name": f"n{i}"} for i in range(400_000)]
    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        await anyio.sleep(0.01)
        source = await resolve_source(rows, schema=KV_SCHEMA)
        ticker.running = False
    assert source.num_rows == 400_000
    # converted in slices: the loop waits for one slice, never for the whole
    # conversion (a loaded machine stretches both, so the bound follows it)
    ticker.assert_free(min_ticks=3)


async def test_a_sync_factory_may_return_an_async_iterable(table_uri: str) -> None:
    source = la.replayable(lambda: agen_batches(3), schema=KV_SCHEMA)
    assert (await read_all(source)).num_rows == 3  # loop pass
    assert (await read_reader(source)).num_rows == 3  # engine pass, bridged after a probe
    assert not source.native
    ds = await la.write_dataset(source, table_uri)
    assert await ds.count_rows() == 3
    assert source.passes == 3


@pytest.mark.parametrize("kind", ["iterable", "async"])
async def test_metadata_change_on_replay_is_caught_for_every_factory(kind: str) -> None:
    calls = 0

    def table() -> pa.Table:
        nonlocal calls
        calls += 1
        t = kv_table(range(3))
        return t if calls == 1 else t.replace_schema_metadata({"pass": str(calls)})

    if kind == "iterable":
        source = la.replayable(lambda: table().to_batches(), schema=KV_SCHEMA)
    else:

        async def factory() -> AsyncIterator[pa.RecordBatch]:
            for b in table().to_batches():
                yield b

        source = la.replayable(factory, schema=KV_SCHEMA)
    await read_all(source)
    with pytest.raises(la.SourceChangedError, match="pass 2"):
        await read_all(source)


async def test_a_file_path_reads_without_a_schema(tmp_path: Path) -> None:
    table = kv_table(range(4))
    stream_path, ndjson = tmp_path / "rows.arrows", tmp_path / "rows.ndjson"
    with pa.OSFile(str(stream_path), "wb") as f, pa.ipc.new_stream(f, KV_SCHEMA) as w:
        w.write_table(table)
    ndjson.write_text("".join(f'{{"id": {i}, "value": 0, "name": "n{i}"}}\n' for i in range(4)))
    ipc_source = la.file_source(stream_path, format="ipc")
    assert (await read_all(ipc_source)).equals(table)  # open() reads the file's schema
    assert ipc_source.schema.equals(KV_SCHEMA, check_metadata=True)
    assert (await read_all(la.coerce_source(ndjson))).column("id").to_pylist() == [0, 1, 2, 3]


async def test_an_unpinned_lance_dataset_is_pinned_when_coerced(tmp_path: Path) -> None:
    ds = _lance(tmp_path)
    source = la.coerce_source(ds)
    lance.write_dataset(kv_table(range(100, 110)), ds.uri, mode="append")
    assert (await read_all(source)).num_rows == 5
    assert (await read_reader(source)).num_rows == 5


async def test_a_json_file_starting_with_null_is_a_decode_error(tmp_path: Path) -> None:
    path = tmp_path / "nulls.ndjson"
    path.write_text('null\n{"id": 1, "value": 1, "name": "a"}\n')
    with pytest.raises(la.DecodeError, match="line 1"):
        await la.resolve_source(la.file_source(path))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("wide.ndjson", '{"id": 1, "x": 18446744073709551615}\n{"id": 2, "x": 1}\n'),
        ("wide.csv", "id,x\n1,18446744073709551615\n2,1\n"),
    ],
)
async def test_regression_inferred_wide_unsigned_integers_keep_their_digits(
    tmp_path: Path, name: str, text: str
) -> None:
    # pyarrow infers float64 for an integer past int64: 18446744073709551615 was
    # written as 1.8446744073709552e19, silently
    path = tmp_path / name
    path.write_text(text)
    ds = await la.write_dataset(la.file_source(path), tmp_path / "t.lance")
    assert ds.schema.field("x").type == pa.uint64()
    assert (await ds.to_table()).column("x").to_pylist() == [2**64 - 1, 1]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("neg.ndjson", '{"id": 1, "x": -9223372036854775809}\n'),
        ("mixed.ndjson", '{"id": 1, "x": 9007199254740993}\n{"id": 2, "x": 1.5}\n'),
        ("neg.csv", "id,x\n1,-18446744073709551615\n"),
    ],
)
async def test_regression_inference_refuses_integers_a_float64_would_round(
    tmp_path: Path, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(la.DecodeError, match=r"column 'x'.*pass schema=") as caught:
        await la.write_dataset(la.file_source(path), tmp_path / "t.lance")
    assert caught.value.field == "x"
    assert not (tmp_path / "t.lance").exists()
