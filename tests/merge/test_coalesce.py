"""Concurrent upserts on one table: one row per key, a serial order, one commit per group.

Every test races real merges on the real engine. The serial order is
checked the strong way: the upserts are applied one after another in the
order their results name (``version``, then ``group_index``), and both the
table's final rows and every upsert's own insert/update counts must be what
that order gives.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import lance
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

import lance_async as la

from ..helpers import KV_SCHEMA, eventually, kv_table, rows_by_key, serial_rows

pytestmark = pytest.mark.anyio

ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])


async def _agen(table: pa.Table) -> AsyncIterator[pa.RecordBatch]:
    for b in table.to_batches(max_chunksize=1):
        await anyio.lowlevel.checkpoint()
        yield b


def _lance_dataset(table: pa.Table, where: Path) -> Any:
    return lance.write_dataset(table, str(where / "src.lance"))


def _parquet(table: pa.Table, where: Path) -> Any:
    pq.write_table(table, where / "src.parquet")
    return pds.dataset(str(where / "src.parquet"))


#: Each form makes a source of ``table`` (files under a folder of its own).
FORMS: dict[str, Callable[[pa.Table, Path], Any]] = {
    "table": lambda t, p: t,
    "replayable_sync": lambda t, p: la.replayable(lambda: t.to_batches(1), schema=KV_SCHEMA),
    "replayable_async": lambda t, p: la.replayable(lambda: _agen(t), schema=KV_SCHEMA),
    "lance_dataset": _lance_dataset,
    "parquet_dataset": _parquet,
    "in_memory_dataset": lambda t, p: pds.dataset(t),
    "record_batch_reader": lambda t, p: pa.RecordBatchReader.from_batches(
        KV_SCHEMA, t.to_batches(1)
    ),
    "async_generator": lambda t, p: _agen(t),
}


def upsert(ds: la.AsyncDataset) -> la.AsyncMergeInsertBuilder:
    return ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()


@ASYNCIO_ONLY
@pytest.mark.parametrize("coalesce", [True, False], ids=["coalesced", "alone"])
@pytest.mark.parametrize("form", sorted(FORMS))
async def test_regression_eight_upserts_of_the_same_new_keys_leave_one_row_per_key(
    form: str, coalesce: bool, table_uri: str, tmp_path: Path
) -> None:
    # issue 41: through a replayable source every copy committed (24 rows for 3 keys)
    base = kv_table([0, 1])
    ds = await la.write_dataset(base, table_uri)
    upserts = {i: kv_table([1, 2, 3], value=i + 1) for i in range(8)}
    results: dict[int, la.MergeResult] = {}

    async def one(i: int) -> None:
        folder = tmp_path / f"src{i}"
        folder.mkdir()
        source = FORMS[form](upserts[i], folder)
        results[i] = await upsert(ds).coalesce(coalesce).execute(source)

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
    final = lance.dataset(table_uri).to_table()
    assert final.num_rows == 4
    assert rows_by_key(final) == serial_rows(base, upserts, results)


async def test_regression_a_seeded_table_raced_by_replayable_upserts_keeps_one_row_per_key(
    table_uri: str,
) -> None:
    base = kv_table([7])
    ds = await la.write_dataset(base, table_uri)
    upserts = {i: kv_table([1, 2, 3], value=i) for i in range(8)}
    results: dict[int, la.MergeResult] = {}

    async def one(i: int) -> None:
        own = await la.open_dataset(table_uri)  # one dataset object per task, as a server has
        source = la.replayable(lambda: upserts[i], schema=KV_SCHEMA)
        results[i] = await upsert(own).execute(source)

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
    assert rows_by_key(lance.dataset(table_uri).to_table()) == serial_rows(base, upserts, results)
    await ds.refresh()
    assert ds.version == max(r.version for r in results.values())


class Held:
    """A replayable factory whose first pass waits until :meth:`release`."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.entered = threading.Event()
        self._go = threading.Event()

    def release(self) -> None:
        self._go.set()

    def __call__(self) -> Iterator[pa.RecordBatch]:
        self.entered.set()
        if not self._go.wait(120):
            raise RuntimeError("never released")
        yield from self.table.to_batches()


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (kept by other tasks; a hang fails after 120 s)."""
    await eventually(condition, 120, "the group commit's state", interval=0.005)


async def hold_lane(
    tg: anyio.abc.TaskGroup,
    ds: la.AsyncDataset,
    results: dict[Any, Any],
    key: Any,
    builder: Callable[[la.AsyncDataset], la.AsyncMergeInsertBuilder] | None = None,
) -> Held:
    """Start an upsert (or ``builder``'s merge) that stays in flight until
    released; wait until it is."""
    held = Held(kv_table([100], value=-1))
    make = builder or upsert

    async def first() -> None:
        results[key] = await make(ds).execute(la.replayable(held, schema=KV_SCHEMA))

    tg.start_soon(first)
    await anyio.to_thread.run_sync(held.entered.wait)
    assert ds.merge_statistics().in_flight == 1
    return held


async def test_upserts_arriving_while_one_is_in_flight_share_one_commit(table_uri: str) -> None:
    base = kv_table(range(10))
    ds = await la.write_dataset(base, table_uri)
    before = ds.version
    upserts: dict[Any, pa.Table] = {
        i: kv_table([i % 12, 20 + i % 3, 30 + i], value=i) for i in range(15)
    }
    results: dict[Any, la.MergeResult] = {}
    async with anyio.create_task_group() as tg:
        held = await hold_lane(tg, ds, results, "first")
        upserts["first"] = held.table
        for i in range(15):
            tg.start_soon(_into, results, i, upsert(ds).execute(upserts[i]))
        await until(lambda: ds.merge_statistics().pending_upserts == 15)
        stats = ds.merge_statistics()
        assert stats.pending_rows == 45
        assert stats.pending_bytes > 0
        held.release()
    assert results["first"].version == before + 1
    assert results["first"].group_size == 1
    grouped = [results[i] for i in range(15)]
    assert {r.version for r in grouped} == {before + 2}, "the 15 made one commit"
    assert {r.group_size for r in grouped} == {15}
    assert sorted(r.group_index for r in grouped) == list(range(15))
    assert lance.dataset(table_uri).version == before + 2
    assert rows_by_key(lance.dataset(table_uri).to_table()) == serial_rows(base, upserts, results)
    assert ds.merge_statistics() == la.MergeStatistics(0, 0, 0, 0)


async def _into(results: dict[Any, Any], key: Any, work: Any) -> None:
    results[key] = await work


@ASYNCIO_ONLY
async def test_insert_only_upserts_in_a_group_keep_the_first_row_of_a_key(table_uri: str) -> None:
    base = kv_table([0])
    ds = await la.write_dataset(base, table_uri)
    results: dict[Any, la.MergeResult] = {}
    inserts = {i: kv_table([0, 1, 2 + i], value=i + 1) for i in range(4)}

    def insert(d: la.AsyncDataset) -> la.AsyncMergeInsertBuilder:
        return d.merge_insert("id").when_not_matched_insert_all()

    async with anyio.create_task_group() as tg:
        held = await hold_lane(tg, ds, results, "first", insert)
        for i in range(4):
            tg.start_soon(_into, results, i, insert(ds).execute(inserts[i]))
        await until(lambda: ds.merge_statistics().pending_upserts == 4)
        held.release()
    grouped = sorted(range(4), key=lambda i: results[i].group_index)
    assert {results[i].group_size for i in range(4)} == {4}
    rows = rows_by_key(lance.dataset(table_uri).to_table())
    assert rows[0]["value"] == 0, "an insert-only merge never touches a stored key"
    assert rows[1]["value"] == grouped[0] + 1, "the group's first insert of key 1 wins"
    counts = [(results[i].num_inserted_rows, results[i].num_updated_rows) for i in grouped]
    assert counts == [(2, 0), (1, 0), (1, 0), (1, 0)]
    assert sorted(rows) == [0, 1, 2, 3, 4, 5, 100]
    assert {results[i].version for i in range(4)} == {results["first"].version + 1}


@ASYNCIO_ONLY
async def test_update_only_upserts_in_a_group_insert_nothing(table_uri: str) -> None:
    base = kv_table([0, 1])
    ds = await la.write_dataset(base, table_uri)
    results: dict[Any, la.MergeResult] = {}
    updates = {i: kv_table([1, 5 + i], value=i + 1) for i in range(3)}

    def update(d: la.AsyncDataset) -> la.AsyncMergeInsertBuilder:
        return d.merge_insert("id").when_matched_update_all()

    async with anyio.create_task_group() as tg:
        held = await hold_lane(tg, ds, results, "first", update)
        for i in range(3):
            tg.start_soon(_into, results, i, update(ds).execute(updates[i]))
        await until(lambda: ds.merge_statistics().pending_upserts == 3)
        held.release()
    last = max(range(3), key=lambda i: results[i].group_index)
    rows = rows_by_key(lance.dataset(table_uri).to_table())
    assert sorted(rows) == [0, 1], "an update-only merge inserts nothing"
    assert rows[1]["value"] == last + 1
    assert [(results[i].num_inserted_rows, results[i].num_updated_rows) for i in range(3)] == [
        (0, 1)
    ] * 3


async def test_a_pending_upsert_cancelled_commits_nothing(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table([0]), table_uri)
    results: dict[Any, la.MergeResult] = {}
    scope = anyio.CancelScope()

    async def cancellable() -> None:
        with scope:
            await upsert(ds).execute(kv_table([50], value=5))

    async with anyio.create_task_group() as tg:
        held = await hold_lane(tg, ds, results, "first")
        tg.start_soon(cancellable)
        tg.start_soon(_into, results, "kept", upsert(ds).execute(kv_table([51], value=6)))
        await until(lambda: ds.merge_statistics().pending_upserts == 2)
        scope.cancel()
        await until(lambda: ds.merge_statistics().pending_upserts == 1)
        held.release()
    assert scope.cancelled_caught
    rows = rows_by_key(lance.dataset(table_uri).to_table())
    assert sorted(rows) == [0, 51, 100]
    assert results["kept"].group_size == 1


@ASYNCIO_ONLY
async def test_a_bad_upsert_fails_alone_and_the_group_commits(table_uri: str) -> None:
    schema = pa.schema(
        [KV_SCHEMA.field("id"), pa.field("value", pa.int64(), nullable=False)],
    )
    ds = await la.write_dataset(pa.table({"id": [0], "value": [0]}, schema=schema), table_uri)
    loose = pa.schema([KV_SCHEMA.field("id"), pa.field("value", pa.int64())])
    good = {i: pa.table({"id": [i + 1], "value": [i]}, schema=loose) for i in range(3)}
    bad = pa.table({"id": [9, 10], "value": [1, None]}, schema=loose)
    results: dict[Any, Any] = {}
    errors: list[BaseException] = []

    async def bad_one() -> None:
        try:
            await upsert(ds).execute(bad)
        except la.SchemaMismatchError as exc:
            errors.append(exc)

    first = pa.table({"id": [100], "value": [-1]}, schema=loose)
    held = Held(first)
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            _into, results, "first", upsert(ds).execute(la.replayable(held, schema=loose))
        )
        await anyio.to_thread.run_sync(held.entered.wait)
        tg.start_soon(bad_one)
        for i in range(3):
            tg.start_soon(_into, results, i, upsert(ds).execute(good[i]))
        await until(lambda: ds.merge_statistics().pending_upserts == 3 and errors != [])
        held.release()
    assert "value" in str(errors[0])
    assert {results[i].group_size for i in range(3)} == {3}
    rows = rows_by_key(lance.dataset(table_uri).to_table())
    assert sorted(rows) == [0, 1, 2, 3, 100]


@ASYNCIO_ONLY
async def test_a_full_pending_group_makes_later_upserts_wait_for_the_next(
    table_uri: str,
) -> None:
    base = kv_table([0])
    ds = await la.write_dataset(base, table_uri)
    results: dict[Any, la.MergeResult] = {}
    upserts: dict[Any, pa.Table] = {i: kv_table([i, 50 + i], value=i) for i in range(9)}
    seen: list[int] = []
    async with anyio.create_task_group() as tg:
        held = await hold_lane(tg, ds, results, "first")
        upserts["first"] = held.table
        for i in range(9):
            builder = upsert(ds).coalesce(max_rows=6)
            tg.start_soon(_into, results, i, builder.execute(upserts[i]))
        await until(lambda: ds.merge_statistics().pending_upserts == 3)
        for _ in range(20):  # the others wait for room, and stay out of the group
            await anyio.lowlevel.checkpoint()
            seen.append(ds.merge_statistics().pending_rows)
        held.release()
    assert max(seen) == 6
    assert max(results[i].group_size for i in range(9)) == 3
    assert len({results[i].version for i in range(9)}) == 3
    assert rows_by_key(lance.dataset(table_uri).to_table()) == serial_rows(base, upserts, results)


@pytest.mark.parametrize("form", ["table", "replayable_sync"])
async def test_regression_an_upsert_over_the_bytes_bound_runs_alone_at_once(
    form: str, table_uri: str, tmp_path: Path
) -> None:
    # an in-memory source larger than max_bytes joined the pending group and
    # waited for the merge in flight (pending_bytes 125,000 against a bound of
    # 10,000), and kept smaller upserts out of that group
    base = kv_table([0])
    ds = await la.write_dataset(base, table_uri)
    results: dict[Any, la.MergeResult] = {}
    big = kv_table(range(1000, 3000), value=1)
    assert big.nbytes > 10_000
    async with anyio.create_task_group() as tg:
        held = await hold_lane(tg, ds, results, "first")
        source = FORMS[form](big, tmp_path)
        tg.start_soon(_into, results, "big", upsert(ds).coalesce(max_bytes=10_000).execute(source))
        await until(lambda: "big" in results or ds.merge_statistics().pending_upserts > 0)
        assert "big" in results, "the large upsert waits in the pending group"
        small = upsert(ds).coalesce(max_bytes=10_000).execute(kv_table([7], value=2))
        tg.start_soon(_into, results, "small", small)
        await until(lambda: ds.merge_statistics().pending_upserts == 1)
        held.release()
    assert results["big"].group_size == 1
    assert results["big"].version < results["first"].version
    rows = rows_by_key(lance.dataset(table_uri).to_table())
    assert sorted(rows) == [0, 7, 100, *range(1000, 3000)]


@ASYNCIO_ONLY
async def test_regression_group_counts_with_a_binary_key_follow_the_serial_order(
    table_uri: str,
) -> None:
    # the keys held at the version read were looked up with an IN filter, which
    # cannot spell binary values: the counts fell back to "every key is new"
    # (first upsert: 2 inserted, 0 updated, where the serial order gives 1 and 1)
    schema = pa.schema(
        [pa.field("id", pa.binary(), False, KV_SCHEMA.field("id").metadata), ("value", pa.int64())]
    )

    def rows(keys: list[bytes], value: int) -> pa.Table:
        return pa.table({"id": keys, "value": [value] * len(keys)}, schema=schema)

    base = rows([b"a"], 0)
    ds = await la.write_dataset(base, table_uri)
    held = Held(rows([b"z"], -1))
    results: dict[Any, la.MergeResult] = {}
    upserts = {0: rows([b"a", b"b"], 1), 1: rows([b"b", b"c"], 2), "first": held.table}
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            _into, results, "first", upsert(ds).execute(la.replayable(held, schema=schema))
        )
        await anyio.to_thread.run_sync(held.entered.wait)
        tg.start_soon(_into, results, 0, upsert(ds).execute(upserts[0]))
        await until(lambda: ds.merge_statistics().pending_upserts == 1)
        tg.start_soon(_into, results, 1, upsert(ds).execute(upserts[1]))
        await until(lambda: ds.merge_statistics().pending_upserts == 2)
        held.release()
    assert results[0].group_size == results[1].group_size == 2
    assert rows_by_key(lance.dataset(table_uri).to_table()) == serial_rows(base, upserts, results)


@ASYNCIO_ONLY
async def test_coalesce_false_makes_one_commit_per_upsert(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table([0]), table_uri)
    results: dict[Any, la.MergeResult] = {}
    async with anyio.create_task_group() as tg:
        for i in range(6):
            builder = upsert(ds).coalesce(False)
            tg.start_soon(_into, results, i, builder.execute(kv_table([i], value=i)))
    assert len({r.version for r in results.values()}) == 6
    assert {r.group_size for r in results.values()} == {1}


@ASYNCIO_ONLY
async def test_coalesce_arguments_are_checked() -> None:
    ds = await la.write_dataset(kv_table([0]), "memory://coalesce-args")
    with pytest.raises(ValueError):
        upsert(ds).coalesce(max_rows=0)
    with pytest.raises(TypeError):
        upsert(ds).coalesce(max_bytes="1")  # type: ignore[arg-type]


# -- across processes ----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json, sys
import anyio, pyarrow as pa
import lance_async as la
from tests.helpers import KV_SCHEMA, kv_table

uri, who, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

async def main() -> None:
    ds = await la.open_dataset(uri)
    results = {}
    ready = sys.stdin.readline()  # both processes start together

    async def one(i: int) -> None:
        rows = kv_table([1, 2, 3, 10 * who + i], value=100 * who + i)
        builder = ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
        r = await builder.execute(la.replayable(lambda: rows, schema=KV_SCHEMA))
        results[i] = [r.version, r.group_index, r.num_inserted_rows, r.num_updated_rows]

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    print(json.dumps(results), flush=True)

anyio.run(main)
"""


@ASYNCIO_ONLY
@pytest.mark.parametrize("processes", [2, 3])
async def test_upserts_from_several_processes_end_in_one_serial_order(
    processes: int, table_uri: str
) -> None:
    base = kv_table([0])
    await la.write_dataset(base, table_uri)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        await anyio.open_process(
            [sys.executable, "-c", CHILD, table_uri, str(who), "6"], cwd=ROOT, env=env
        )
        for who in range(1, processes + 1)
    ]
    for p in procs:  # both (all three) set up: start together
        assert p.stdin is not None
        await p.stdin.send(b"go\n")
    outs: list[str] = []
    for p in procs:
        assert p.stdout is not None
        out = b"".join([chunk async for chunk in p.stdout])
        assert await p.wait() == 0, out
        outs.append(out.decode())
    upserts: dict[Any, pa.Table] = {}
    results: dict[Any, la.MergeResult] = {}
    for who, text in enumerate(outs, start=1):
        for i, (version, index, ins, upd) in json.loads(text).items():
            key = (who, int(i))
            upserts[key] = kv_table([1, 2, 3, 10 * who + int(i)], value=100 * who + int(i))
            results[key] = la.MergeResult(
                ins, upd, 0, 1, la.SourceMode.REPLAYABLE, version, group_index=index
            )
    final = lance.dataset(table_uri).to_table()
    assert final.num_rows == 4 + 6 * processes
    assert rows_by_key(final) == serial_rows(base, upserts, results)
