"""Async merge_insert: conflict retries by source mode (asyncio and trio)."""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import lance
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

import lance_async as la

from .helpers import (
    KV_SCHEMA,
    CommitHook,
    CompetingSource,
    Ticker,
    apply_upserts,
    kv_table,
    rows_by_key,
    run_in_thread,
    serial_rows,
    upsert_sync,
)

pytestmark = pytest.mark.anyio

ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])
"""For checks that do not depend on the backend (refusals, plans, replay
rules): the bridges, cancellation, concurrency and the loop run on both."""

BASE = kv_table(range(10), value=0)
COMPETITOR = kv_table([2, 3], value=7)
OURS = kv_table([1, 2, 20], value=100)


def upsert(ds: la.AsyncDataset) -> la.AsyncMergeInsertBuilder:
    return ds.merge_insert().when_matched_update_all().when_not_matched_insert_all()


async def contended(table_uri: str, times: int = 1) -> tuple[la.AsyncDataset, CommitHook]:
    """A dataset whose next ``times`` commits each lose to a competing upsert."""
    await la.write_dataset(BASE, table_uri)
    hook = CommitHook(lambda: upsert_sync(table_uri, COMPETITOR), times=times)
    return await la.open_dataset(table_uri, commit_lock=hook), hook


def upsert_on_id(ds: la.AsyncDataset) -> la.AsyncMergeInsertBuilder:
    return ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()


def data_files(uri: str) -> dict[Path, int]:
    """Data files of a table and their sizes in bytes."""
    return {p: p.stat().st_size for p in Path(uri).rglob("*.lance")}


class Counting:
    """A replayable factory that counts its calls."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.make()


def _lance_source(tmp: Path) -> Any:
    return lance.write_dataset(OURS, str(tmp / "source.lance"))


def _parquet_source(tmp: Path) -> pds.Dataset:
    pq.write_table(OURS, tmp / "source.parquet")
    return pds.dataset(str(tmp / "source.parquet"))


async def _agen() -> AsyncIterator[pa.RecordBatch]:
    for b in OURS.to_batches(max_chunksize=1):
        await anyio.lowlevel.checkpoint()
        yield b


FORMS: dict[str, tuple[Callable[[Path], Any], la.SourceMode]] = {
    "table": (lambda p: OURS, la.SourceMode.MATERIALIZED),
    "list_of_batches": (lambda p: OURS.to_batches(max_chunksize=1), la.SourceMode.MATERIALIZED),
    "lance_dataset": (_lance_source, la.SourceMode.REPLAYABLE),
    "parquet_dataset": (_parquet_source, la.SourceMode.REPLAYABLE),
    "in_memory_dataset": (lambda p: pds.dataset(OURS), la.SourceMode.REPLAYABLE),
    "replayable_sync": (
        lambda p: la.replayable(lambda: OURS.to_batches(max_chunksize=1), schema=KV_SCHEMA),
        la.SourceMode.REPLAYABLE,
    ),
    "replayable_async": (
        lambda p: la.replayable(_agen, schema=KV_SCHEMA),
        la.SourceMode.REPLAYABLE,
    ),
    "async_generator": (lambda p: _agen(), la.SourceMode.STREAMING),
    "record_batch_reader": (
        lambda p: pa.RecordBatchReader.from_batches(KV_SCHEMA, OURS.to_batches(max_chunksize=1)),
        la.SourceMode.STREAMING,
    ),
}


@pytest.mark.commit_lock
@pytest.mark.parametrize("form", sorted(FORMS))
async def test_real_conflict_is_retried_for_every_source_form(
    form: str, table_uri: str, tmp_path: Path
) -> None:
    make, mode = FORMS[form]
    ds, hook = await contended(table_uri)
    result = await upsert(ds).execute(make(tmp_path))
    assert result.source_mode is mode
    assert len(hook.commits) == 2, "our first commit lost to the competitor, the second landed"
    if mode is la.SourceMode.REPLAYABLE:
        assert result.num_attempts == 2
    final = (await la.open_dataset(table_uri)).lance.to_table()
    assert rows_by_key(final) == apply_upserts(BASE, COMPETITOR, OURS)
    assert result.version == ds.version == lance.dataset(table_uri).version
    assert (result.num_inserted_rows, result.num_updated_rows) == (1, 2)


@pytest.mark.commit_lock
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_factory_is_called_exactly_num_attempts_times(kind: str, table_uri: str) -> None:
    ds, _hook = await contended(table_uri, times=3)
    if kind == "sync":
        factory = Counting(lambda: OURS)
        source = la.replayable(factory, schema=KV_SCHEMA)
    else:
        calls = Counting(lambda: None)

        async def afactory() -> pa.Table:
            calls()
            await anyio.lowlevel.checkpoint()
            return OURS

        factory = calls
        source = la.replayable(afactory, schema=KV_SCHEMA)
    result = await upsert(ds).execute(source)
    assert result.num_attempts == 4
    assert factory.calls == result.num_attempts
    assert rows_by_key(lance.dataset(table_uri).to_table()) == apply_upserts(BASE, COMPETITOR, OURS)


@pytest.mark.slow
async def test_replay_writes_no_spill(table_uri: str, tmp_path: Path) -> None:
    """Bytes written stay close to the data files committed: nothing is spilled.

    The same 130 MiB source through pylance's default retries spills it to
    disk first (about twice the bytes), which is what makes this test able to
    fail.
    """
    n = 130 * 1024 * 1024 // 116
    pad = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(100), n, [None, pa.py_buffer(np.random.default_rng(3).bytes(100 * n))]
    )
    big = pa.table({"id": pa.array(np.arange(n), pa.int64()), "pad": pad})
    src = lance.write_dataset(big, str(tmp_path / "source.lance"))
    del big, pad

    def measure(run: Callable[[], object], uri: str) -> tuple[int, int]:
        before = data_files(uri)
        start = psutil.Process().io_counters().write_bytes
        run()
        written = psutil.Process().io_counters().write_bytes - start
        committed = sum(size for p, size in data_files(uri).items() if p not in before)
        return written, committed

    seed = pa.table(
        {"id": pa.array([0], pa.int64()), "pad": pa.array([b"x" * 100], pa.binary(100))}
    )
    plain_uri = str(tmp_path / "plain.lance")
    plain = lance.write_dataset(seed, plain_uri)
    spilled, plain_committed = await anyio.to_thread.run_sync(
        measure,
        lambda: (
            plain.merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(src)
        ),
        plain_uri,
    )
    assert spilled > 1.5 * plain_committed, "pylance's default retries spill a source this big"

    ds = await la.write_dataset(seed, table_uri)
    before = data_files(table_uri)
    start = psutil.Process().io_counters().write_bytes
    result = await upsert_on_id(ds).execute(src)
    written = psutil.Process().io_counters().write_bytes - start
    committed = sum(size for p, size in data_files(table_uri).items() if p not in before)
    assert result.source_mode is la.SourceMode.REPLAYABLE
    assert committed > 100 * 1024 * 1024
    assert written < committed * 1.1 + 1024 * 1024, (written, committed)


async def test_16_concurrent_upserts_end_in_a_serial_order(table_uri: str) -> None:
    base = kv_table(range(40))
    await la.write_dataset(base, table_uri)
    ds = await la.open_dataset(table_uri)
    rng = random.Random(7)
    updates = {i: kv_table(sorted(rng.sample(range(50), 12)), value=i + 1) for i in range(16)}
    results: dict[int, la.MergeResult] = {}

    async def one(i: int) -> None:
        own = await la.open_dataset(table_uri)
        source = la.replayable(lambda: updates[i], schema=KV_SCHEMA)
        results[i] = await (
            upsert(own).conflict_retries(20).retry_timeout(timedelta(seconds=60)).execute(source)
        )

    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(one, i)
    assert len(results) == 16
    # group commit: fewer versions than upserts, each upsert's counts its own
    assert len({r.version for r in results.values()}) < 16
    await ds.refresh()
    assert rows_by_key(await ds.to_table()) == serial_rows(base, updates, results)


@ASYNCIO_ONLY
@pytest.mark.commit_lock
async def test_exhausted_retries_raise_contention_with_num_attempts(table_uri: str) -> None:
    ds, _hook = await contended(table_uri, times=100)
    source = la.replayable(lambda: OURS, schema=KV_SCHEMA)
    with pytest.raises(la.ContentionError) as info:
        await upsert(ds).conflict_retries(2).execute(source)
    assert info.value.num_attempts == 3
    assert info.value.retryable
    # only the competitor's commits landed
    assert rows_by_key(lance.dataset(table_uri).to_table()) == apply_upserts(BASE, COMPETITOR)


@ASYNCIO_ONLY
@pytest.mark.commit_lock
async def test_streaming_source_with_zero_retries_fails_fast(table_uri: str) -> None:
    ds, hook = await contended(table_uri)
    reader = pa.RecordBatchReader.from_batches(KV_SCHEMA, OURS.to_batches())
    with pytest.raises(la.ContentionError) as info:
        await upsert(ds).conflict_retries(0).execute(reader)
    assert info.value.num_attempts == 1
    assert len(hook.commits) == 1


async def test_a_streamed_source_that_conflicts_is_replayed_from_its_spool(
    table_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spools = tmp_path / "spools"
    spools.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spools))
    base = kv_table(range(10))
    await la.write_dataset(base, table_uri)
    ds = await la.open_dataset(table_uri)
    ours = kv_table(range(200_000), value=3)  # past the spool's 4 MiB in memory
    competing = CompetingSource(ours, lambda: upsert_sync(table_uri, COMPETITOR))
    result = await upsert(ds).execute(competing())  # a one-shot reader
    assert competing.calls == 1 and competing.competed == 1
    assert result.source_mode is la.SourceMode.STREAMING
    assert result.num_attempts == 2, "the replay of the spool is counted"
    assert (result.num_inserted_rows, result.num_updated_rows) == (199_990, 10)
    final = lance.dataset(table_uri).to_table()
    assert rows_by_key(final) == apply_upserts(base, COMPETITOR, ours)
    assert list(spools.iterdir()) == [], "the spool file was left behind"


@ASYNCIO_ONLY
@pytest.mark.commit_lock
async def test_non_retryable_conflict_raises_at_once(table_uri: str) -> None:
    await la.write_dataset(BASE, table_uri)
    hook = CommitHook(
        lambda: lance.write_dataset(kv_table([99]), table_uri, mode="overwrite"), times=1
    )
    ds = await la.open_dataset(table_uri, commit_lock=hook)
    source = la.replayable(lambda: OURS, schema=KV_SCHEMA)
    with pytest.raises(la.ConflictError) as info:
        await upsert(ds).execute(source)
    assert not info.value.retryable
    assert not isinstance(info.value, la.ContentionError)
    assert len(hook.commits) == 1  # no retry


async def test_source_failing_mid_attempt_raises_its_own_error_and_commits_nothing(
    table_uri: str,
) -> None:
    class Boom(Exception):
        pass

    ds = await la.write_dataset(BASE, table_uri)
    version = ds.version

    async def failing() -> AsyncIterator[pa.RecordBatch]:
        yield OURS.to_batches()[0]
        raise Boom("feed died")

    with pytest.raises(Boom, match="feed died"):
        await upsert(ds).execute(failing())

    def failing_sync() -> Iterator[pa.RecordBatch]:
        yield OURS.to_batches()[0]
        raise Boom("factory died")

    with pytest.raises(Boom, match="factory died"):
        await upsert(ds).execute(la.replayable(failing_sync, schema=KV_SCHEMA))
    assert lance.dataset(table_uri).version == version


@ASYNCIO_ONLY
@pytest.mark.commit_lock
async def test_schema_change_on_replay_raises_and_commits_nothing(table_uri: str) -> None:
    ds, _hook = await contended(table_uri)
    calls = 0

    def factory() -> pa.RecordBatchReader:
        nonlocal calls
        calls += 1
        table = OURS if calls == 1 else OURS.replace_schema_metadata({"v": str(calls)})
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())

    with pytest.raises(la.SourceChangedError):
        await upsert(ds).execute(la.replayable(factory, schema=KV_SCHEMA))
    # the competitor's commit is the only one
    assert rows_by_key(lance.dataset(table_uri).to_table()) == apply_upserts(BASE, COMPETITOR)


@ASYNCIO_ONLY
async def test_bad_source_schema_is_refused_before_anything_runs(table_uri: str) -> None:
    ds = await la.write_dataset(BASE, table_uri)
    with pytest.raises(la.SchemaMismatchError, match="value"):
        await upsert(ds).execute(pa.table({"id": [1], "value": ["x"], "name": ["a"]}))
    with pytest.raises(la.SchemaMismatchError, match="id"):
        await upsert(ds).execute(pa.table({"value": [1]}))
    with pytest.raises(la.SchemaMismatchError, match="nope"):
        await upsert(ds).execute(pa.table({"id": [1], "nope": [1]}))
    with pytest.raises(la.SchemaMismatchError):
        ds.merge_insert("missing_column")
    assert lance.dataset(table_uri).version == ds.version


@ASYNCIO_ONLY
async def test_null_or_repeated_primary_keys_are_refused_before_anything_runs(
    table_uri: str,
) -> None:
    ds = await la.write_dataset(BASE, table_uri)
    version = ds.version
    nullable = pa.schema([pa.field(f.name, f.type) for f in KV_SCHEMA])
    with pytest.raises(la.SchemaMismatchError, match="null") as err:
        await upsert(ds).execute(
            pa.table({"id": [900, None], "value": [1, 2], "name": ["a", "b"]}, schema=nullable)
        )
    assert err.value.field == "id"
    # a repeated key that matches no row (pylance would insert it twice) ...
    with pytest.raises(la.DuplicateKeyError, match=r"repeats key \{'id': 900\}"):
        await upsert(ds).execute(kv_table([900, 901, 900]))
    # ... and one that matches a row, split across batches
    batches = kv_table([3, 4]).to_batches() + kv_table([3]).to_batches()
    with pytest.raises(la.InvalidInputError, match="'id': 3"):
        await upsert(ds).execute(batches)
    assert lance.dataset(table_uri).version == version
    # joining on another column: the join key and the primary key are both checked
    with pytest.raises(la.DuplicateKeyError, match="n900"):
        await (
            ds.merge_insert("name").when_not_matched_insert_all().execute(kv_table([900, 901, 900]))
        )
    names = kv_table([900, 901, 902]).set_column(2, "name", pa.array(["a", "b", "c"]))
    with pytest.raises(la.DuplicateKeyError, match="'id': 900"):
        await (
            ds.merge_insert("name")
            .when_not_matched_insert_all()
            .execute(
                pa.concat_tables([names, names.slice(0, 1).set_column(2, "name", pa.array(["d"]))])
            )
        )
    assert lance.dataset(table_uri).version == version


@ASYNCIO_ONLY
async def test_on_defaults_to_the_primary_key(table_uri: str) -> None:
    ds = await la.write_dataset(BASE, table_uri)
    result = await upsert(ds).execute(kv_table([3], value=5))
    assert result.num_updated_rows == 1
    plain = await la.write_dataset(pa.table({"id": [1]}), table_uri + "2")
    with pytest.raises(ValueError, match="primary key"):
        plain.merge_insert()


@ASYNCIO_ONLY
async def test_partial_columns_and_delete_clauses(table_uri: str) -> None:
    ds = await la.write_dataset(BASE, table_uri)
    result = await (
        ds.merge_insert("id")
        .when_matched_update_all()
        .when_not_matched_by_source_delete("id >= 8")
        .execute(pa.table({"id": [1, 2], "value": [11, 12]}))
    )
    assert result.num_updated_rows == 2 and result.num_deleted_rows == 2
    rows = rows_by_key(await ds.to_table())
    assert rows[1]["value"] == 11 and rows[1]["name"] == "n1"
    assert 8 not in rows and 9 not in rows


@ASYNCIO_ONLY
async def test_execute_uncommitted_commits_nothing(table_uri: str) -> None:
    ds = await la.write_dataset(BASE, table_uri)
    version = ds.version
    txn, stats = await upsert(ds).execute_uncommitted(OURS)
    assert stats["num_inserted_rows"] == 1 and stats["num_updated_rows"] == 2
    assert lance.dataset(table_uri).version == version
    committed = lance.LanceDataset.commit(table_uri, txn)
    assert committed.version == version + 1


@ASYNCIO_ONLY
async def test_analyze_plan_follows_the_source_and_fails_with_it(table_uri: str) -> None:
    ds = await la.write_dataset(BASE, table_uri)
    plan = await upsert(ds).analyze_plan(OURS)
    assert "MergeInsert" in plan
    assert "MergeInsert" in await upsert(ds).explain_plan()

    class Boom(Exception):
        pass

    async def failing() -> AsyncIterator[pa.RecordBatch]:
        yield OURS.to_batches()[0]
        raise Boom("source broke")

    with pytest.raises(Boom):
        await upsert(ds).analyze_plan(failing())
    assert lance.dataset(table_uri).version == ds.version


@pytest.mark.commit_lock
async def test_cancel_during_an_attempt_leaves_a_committed_version(table_uri: str) -> None:
    await la.write_dataset(BASE, table_uri)
    started = threading.Event()

    def slow_competitor() -> None:
        started.set()
        time.sleep(0.3)
        upsert_sync(table_uri, COMPETITOR)

    hook = CommitHook(slow_competitor, times=1)
    ds = await la.open_dataset(table_uri, commit_lock=hook)
    builder = upsert(ds)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def cancel_once_started() -> None:  # the attempt is in its commit
                await anyio.to_thread.run_sync(started.wait, 30)
                scope.cancel()

            tg.start_soon(cancel_once_started)
            await builder.execute(la.replayable(lambda: OURS, schema=KV_SCHEMA))
    assert scope.cancelled_caught
    assert started.is_set()
    latest = lance.dataset(table_uri)
    # the attempt in flight ran to its end in its thread: it lost to the competitor,
    # so nothing of ours is committed and no retry started after the cancellation
    assert rows_by_key(latest.to_table()) == apply_upserts(BASE, COMPETITOR)
    assert builder.last_result is None


@pytest.mark.commit_lock
async def test_cancel_after_the_commit_landed_reports_the_outcome(table_uri: str) -> None:
    await la.write_dataset(BASE, table_uri)
    committing, release = threading.Event(), threading.Event()

    def hold_the_commit() -> None:  # no conflict: the commit waits until cancelled
        committing.set()
        release.wait(30)

    hook = CommitHook(hold_the_commit, times=1)
    ds = await la.open_dataset(table_uri, commit_lock=hook)
    builder = upsert(ds)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def cancel_once_committing() -> None:
                await anyio.to_thread.run_sync(committing.wait, 30)
                scope.cancel()
                release.set()  # the commit goes on after the cancellation

            tg.start_soon(cancel_once_committing)
            await builder.execute(la.replayable(lambda: OURS, schema=KV_SCHEMA))
    assert scope.cancelled_caught
    assert builder.last_result is not None
    assert builder.last_result.version == lance.dataset(table_uri).version
    assert rows_by_key(lance.dataset(table_uri).to_table()) == apply_upserts(BASE, OURS)


@pytest.mark.commit_lock
async def test_cancel_during_backoff_leaves_a_committed_version(table_uri: str) -> None:
    ds, hook = await contended(table_uri, times=100)
    retried = threading.Event()
    competitor = hook.competitor

    def competing() -> object:
        if len(hook.commits) >= 2:
            retried.set()  # the second attempt is committing: a retry happened
        return competitor()

    hook.competitor = competing
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def cancel_after_a_retry() -> None:
                await anyio.to_thread.run_sync(retried.wait, 30)
                scope.cancel()

            tg.start_soon(cancel_after_a_retry)
            await (
                upsert(ds)
                .conflict_retries(50)
                .execute(la.replayable(lambda: OURS, schema=KV_SCHEMA))
            )
    assert scope.cancelled_caught
    latest = lance.dataset(table_uri)
    assert rows_by_key(latest.to_table()) == apply_upserts(BASE, COMPETITOR)
    assert latest.version == 1 + len(hook.commits)  # one competitor commit per attempt


async def test_loop_stays_free_during_a_large_merge(table_uri: str, tmp_path: Path) -> None:
    n = 500_000
    big = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "value": pa.array(range(n), pa.int64()),
            "name": pa.array(["x"] * n),
        },
        schema=KV_SCHEMA,
    )
    src = lance.write_dataset(big, str(tmp_path / "src.lance"))
    ds = await la.write_dataset(kv_table(range(0, n, 3)), table_uri)
    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        result = await upsert(ds).execute(src)
        ticker.running = False
    assert result.num_inserted_rows + result.num_updated_rows == n
    ticker.assert_free()
    shutil.rmtree(tmp_path / "src.lance")


@pytest.mark.parametrize("delay", [0.001, 0.005, 0.02])
async def test_regression_cancelling_a_merge_of_an_async_source_delivers_the_cancellation(
    table_uri: str, delay: float
) -> None:
    ds = await la.write_dataset(BASE, table_uri)

    async def slow_rows() -> AsyncIterator[pa.RecordBatch]:
        for b in OURS.to_batches(max_chunksize=1):
            await anyio.sleep(0.002)
            yield b

    for source in (slow_rows(), la.replayable(slow_rows, schema=KV_SCHEMA)):
        with anyio.move_on_after(delay):  # must end in the scope, not in an error
            await upsert(ds).execute(source)
    rows = rows_by_key(lance.dataset(table_uri).to_table())
    assert rows in (apply_upserts(BASE), apply_upserts(BASE, OURS))


def test_backoff_is_a_random_slot_of_the_last_attempts_length() -> None:
    rng = random.Random(1)
    from lance_async.merge import backoff_delay

    for attempt in (1, 2, 3):
        for last, slot in ((0.01, 0.05), (0.2, 0.2)):
            delays = [backoff_delay(attempt, last, rng) for _ in range(400)]
            slots = {round(d / slot, 6) for d in delays}
            # every whole slot of [0, 2**(attempt+1)) is drawn, and nothing else
            assert slots == {float(k) for k in range(2 ** (attempt + 1))}, (attempt, last)
    assert backoff_delay(30, 100.0, rng) <= 5.0


# -- issue 17: duplicate keys in one source (item 3), empty sources (item 7) ------


@ASYNCIO_ONLY
async def test_regression_a_streamed_source_repeating_a_new_key_commits_nothing(
    table_uri: str, tmp_path: Path
) -> None:
    ds = await la.write_dataset(BASE, table_uri)
    version = ds.version

    async def stream() -> AsyncIterator[pa.RecordBatch]:
        for ids in ([100, 101], [102], [101, 103]):  # 101 repeats across batches
            yield kv_table(ids, value=1).to_batches()[0]

    with pytest.raises(la.DuplicateKeyError, match=r"repeats key \{'id': 101\}") as err:
        await upsert(ds).execute(stream(), schema=KV_SCHEMA)
    assert err.value.key == {"id": 101}
    assert err.value.count == 2
    # a replayable source (a file), and a repeat inside one batch of a reader
    path = tmp_path / "dup.arrow"
    with pa.ipc.new_file(str(path), KV_SCHEMA) as writer:
        writer.write_table(kv_table([200, 201, 200], value=1))
    with pytest.raises(la.DuplicateKeyError, match="'id': 200"):
        await upsert(ds).execute(la.file_source(path))
    reader = pa.RecordBatchReader.from_batches(KV_SCHEMA, kv_table([5, 5]).to_batches())
    with pytest.raises(la.DuplicateKeyError, match="'id': 5"):
        await upsert(ds).execute(reader)
    assert lance.dataset(table_uri).version == version
    assert lance.dataset(table_uri).count_rows() == BASE.num_rows


@ASYNCIO_ONLY
async def test_duplicate_keys_keep_last_is_an_explicit_opt_in(table_uri: str) -> None:
    ds = await la.write_dataset(BASE, table_uri)
    rows = pa.concat_tables([kv_table([1, 50], value=1), kv_table([50, 1], value=2)])
    result = await upsert(ds).duplicate_keys("keep_last").execute(rows)
    assert (result.num_updated_rows, result.num_inserted_rows) == (1, 1)

    async def stream() -> AsyncIterator[pa.RecordBatch]:
        yield kv_table([60, 61], value=3).to_batches()[0]
        yield kv_table([60], value=4).to_batches()[0]

    result = await upsert(ds).duplicate_keys("keep_last").execute(stream(), schema=KV_SCHEMA)
    assert result.num_inserted_rows == 2
    got = rows_by_key(await ds.to_table())
    assert (got[1]["value"], got[50]["value"], got[60]["value"]) == (2, 2, 4)
    with pytest.raises(ValueError, match="duplicate_keys"):
        upsert(ds).duplicate_keys("keep_first")


@ASYNCIO_ONLY
async def test_regression_an_empty_source_commits_nothing_and_says_so(table_uri: str) -> None:
    ds = await la.write_dataset(BASE, table_uri)
    version = ds.version

    for source in (
        KV_SCHEMA.empty_table(),
        pa.RecordBatchReader.from_batches(KV_SCHEMA, []),
        la.replayable(lambda: KV_SCHEMA.empty_table(), schema=KV_SCHEMA),
    ):
        result = await upsert(ds).execute(source, schema=KV_SCHEMA)
        assert result.committed is False
        assert result.version == version
        assert (result.num_inserted_rows, result.num_updated_rows) == (0, 0)
    assert lance.dataset(table_uri).version == version
    # deleting what the source does not hold still runs on an empty source
    result = (
        await ds.merge_insert()
        .when_not_matched_by_source_delete("id >= 8")
        .execute(KV_SCHEMA.empty_table())
    )
    assert result.committed is True
    assert result.num_deleted_rows == 2
    assert lance.dataset(table_uri).version == version + 1


# -- issue 17, item 4: a replayable source that changes between passes --------------


def _passes(*tables: pa.Table) -> Callable[[], pa.RecordBatchReader]:
    """A factory giving ``tables[k]`` on pass k+1 (the last one from then on)."""
    calls = 0

    def factory() -> pa.RecordBatchReader:
        nonlocal calls
        table = tables[min(calls, len(tables) - 1)]
        calls += 1
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())

    return factory


@ASYNCIO_ONLY
@pytest.mark.parametrize(
    "second",
    [
        pytest.param(kv_table([1, 2, 20], value=101), id="other-values"),
        pytest.param(kv_table([1, 20, 2], value=100), id="other-order"),
        pytest.param(kv_table([1, 2], value=100), id="fewer-rows"),
        pytest.param(kv_table([1, 2, 20, 21], value=100), id="more-rows"),
    ],
)
async def test_regression_a_replay_with_other_rows_raises_and_commits_nothing(
    table_uri: str, second: pa.Table
) -> None:
    await la.write_dataset(BASE, table_uri)
    ds = await la.open_dataset(table_uri)
    passes = _passes(OURS, second)
    # the first pass lets a competitor commit first: the merge must replay
    source = CompetingSource(OURS, lambda: upsert_sync(table_uri, COMPETITOR))

    def factory() -> pa.RecordBatchReader:
        reader = passes()
        if source.calls == 0:
            return source()
        return reader

    with pytest.raises(la.SourceChangedError, match=r"pass 2 of .* than pass 1"):
        await upsert(ds).execute(la.replayable(factory, schema=KV_SCHEMA))
    assert source.competed == 1
    assert rows_by_key(lance.dataset(table_uri).to_table()) == apply_upserts(BASE, COMPETITOR)


@ASYNCIO_ONLY
async def test_replays_cut_into_other_batches_are_the_same_source(table_uri: str) -> None:
    await la.write_dataset(BASE, table_uri)
    ds = await la.open_dataset(table_uri)
    rows = kv_table(range(0, 20), value=3)  # rows 2 and 3 conflict with the competitor
    source = CompetingSource(rows, lambda: upsert_sync(table_uri, COMPETITOR))
    calls = 0

    def factory() -> pa.RecordBatchReader:
        nonlocal calls
        calls += 1
        if calls == 1:
            return source()
        cut = rows.to_batches(max_chunksize=7)  # other batches, same values and order
        return pa.RecordBatchReader.from_batches(KV_SCHEMA, cut)

    result = await upsert(ds).execute(la.replayable(factory, schema=KV_SCHEMA))
    assert result.num_attempts == 2
    assert rows_by_key(await ds.to_table()) == apply_upserts(BASE, COMPETITOR, rows)


@ASYNCIO_ONLY
async def test_a_file_rewritten_with_other_rows_between_passes_is_caught(
    table_uri: str, tmp_path: Path
) -> None:
    """Same size and mtime, other values: only the content digest can tell."""
    import os

    await la.write_dataset(BASE, table_uri)
    ds = await la.open_dataset(table_uri)
    path = tmp_path / "rows.csv"
    path.write_text("id,value,name\n1,100,aa\n2,100,bb\n")
    stat = path.stat()
    source = la.file_source(path, schema=KV_SCHEMA)
    competitor_done = False

    def compete() -> None:
        nonlocal competitor_done
        upsert_sync(table_uri, COMPETITOR)
        path.write_text("id,value,name\n1,100,aa\n2,100,cc\n")  # same size
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime
        competitor_done = True

    original = source._blocking_batches

    def racing() -> Iterator[pa.RecordBatch]:
        yield from original()
        if not competitor_done:
            run_in_thread(compete)

    source._blocking_batches = racing  # type: ignore[method-assign]
    with pytest.raises(la.SourceChangedError, match="other values or order"):
        await upsert(ds).execute(source)
    assert rows_by_key(lance.dataset(table_uri).to_table()) == apply_upserts(BASE, COMPETITOR)


@ASYNCIO_ONLY
async def test_a_conflict_injected_without_a_commit_lock_is_retried(table_uri: str) -> None:
    """The conflict path on every Python, 3.13 included (issue 17, item 12)."""
    await la.write_dataset(BASE, table_uri)
    ds = await la.open_dataset(table_uri)
    replay = CompetingSource(OURS, lambda: upsert_sync(table_uri, COMPETITOR))
    result = await upsert(ds).execute(la.replayable(replay, schema=KV_SCHEMA))
    assert (result.num_attempts, replay.calls, replay.competed) == (2, 2, 1)
    assert rows_by_key(await ds.to_table()) == apply_upserts(BASE, COMPETITOR, OURS)
    # a one-shot reader: Lance's own buffered retry, or none with conflict_retries(0)
    once = CompetingSource(kv_table([2, 30], value=5), lambda: upsert_sync(table_uri, COMPETITOR))
    result = await upsert(ds).execute(once())
    assert (result.source_mode, once.competed) == (la.SourceMode.STREAMING, 1)
    fails = CompetingSource(kv_table([3], value=6), lambda: upsert_sync(table_uri, COMPETITOR))
    with pytest.raises(la.ContentionError):
        await upsert(ds).conflict_retries(0).execute(fails())
    assert rows_by_key(lance.dataset(table_uri).to_table())[3]["value"] == 7


@ASYNCIO_ONLY
async def test_regression_concurrent_inserts_without_a_declared_key_do_not_duplicate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 17, item 11: Lance sees insert-insert conflicts only on declared keys."""
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.int64())])
    uri = str(tmp_path / "plain.lance")
    await la.write_dataset(pa.table({"id": range(100), "value": [0] * 100}, schema=schema), uri)
    new = pa.table({"id": range(100, 150), "value": [1] * 50}, schema=schema)
    a_reading = threading.Event()
    b_done = threading.Event()

    def slow_source() -> Iterator[pa.RecordBatch]:
        yield from new.to_batches()
        a_reading.set()
        b_done.wait(timeout=1.5)  # before the fix, B committed meanwhile

    async def merge_a() -> la.MergeResult:
        ds = await la.open_dataset(uri)
        return await upsert_on_id(ds).execute(la.replayable(slow_source, schema=schema))

    async def merge_b() -> None:
        await anyio.to_thread.run_sync(a_reading.wait)
        ds = await la.open_dataset(uri)
        try:
            await upsert_on_id(ds).execute(new.set_column(1, "value", pa.array([2] * 50)))
        finally:
            b_done.set()

    with caplog.at_level("WARNING", logger="lance_async"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(merge_a)
            tg.start_soon(merge_b)
    final = lance.dataset(uri).to_table()
    assert final.num_rows == 150, "a new key was inserted twice"
    assert sorted(final.column("id").to_pylist()) == list(range(150))
    assert "declares no primary key" in caplog.text
    (record,) = [r for r in caplog.records if "declares no primary key" in r.getMessage()]
    assert record.name == "lance_async.merge" and record.table == uri  # type: ignore[attr-defined]


@pytest.mark.parametrize("form", ["table", "reader"])
async def test_regression_a_source_marking_a_nullable_primary_key_is_a_typed_error(
    form: str, table_uri: str
) -> None:
    # pylance refuses such a source with an untyped OSError ("Primary key
    # column and all its ancestors must not be nullable"), which reached the caller
    ds = await la.write_dataset(BASE, table_uri)
    loose = pa.schema(
        [pa.field("id", pa.int64(), True, KV_SCHEMA.field("id").metadata), *list(KV_SCHEMA)[1:]]
    )
    rows = pa.table({"id": [1], "value": [5], "name": ["x"]}, schema=loose)
    source = (
        rows if form == "table" else pa.RecordBatchReader.from_batches(loose, rows.to_batches())
    )
    with pytest.raises(la.SchemaMismatchError, match="primary key") as caught:
        await upsert(ds).execute(source)
    assert caught.value.field == "id"
    assert lance.dataset(table_uri).version == ds.version
