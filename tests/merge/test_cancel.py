"""Cancelling merges whose sources misbehave: nothing hangs, nothing half-commits.

A replayable factory or a generator runs the user's code on the merge's
worker thread. When that code blocks (a socket read that never returns, a
lock never released), cancelling the merge must still return at once, and
the thread, once the code lets it go, must commit nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import lance
import pyarrow as pa
import pytest

import lance_async as la
from lance_async._threads import abandoned_calls

from ..helpers import KV_SCHEMA, CommitHook, eventually, kv_table, rows_by_key, upsert_sync
from .test_coalesce import _into, hold_lane, until, upsert

pytestmark = pytest.mark.anyio


class Blocking:
    """A source that blocks its thread until :meth:`release`: in the factory's
    call (``where="call"``) or between its first and second batch."""

    def __init__(self, table: pa.Table, where: str) -> None:
        self.table = table
        self.where = where
        self.entered = threading.Event()
        self._go = threading.Event()

    def release(self) -> None:
        self._go.set()

    def _wait(self) -> None:
        self.entered.set()
        if not self._go.wait(120):
            raise RuntimeError("never released")

    def batches(self) -> Iterator[pa.RecordBatch]:
        first, *rest = self.table.to_batches(max_chunksize=1)
        yield first
        self._wait()
        yield from rest

    def __call__(self) -> Any:
        if self.where == "call":
            self._wait()
            return self.table.to_batches()
        return self.batches()


def source_of(blocking: Blocking, kind: str) -> Any:
    if kind == "generator":  # a one-shot stream
        return blocking.batches()
    return la.replayable(blocking, schema=KV_SCHEMA)


@pytest.mark.parametrize(
    ("kind", "where", "grouped"),
    [
        ("replayable", "call", False),
        ("replayable", "batches", False),
        ("replayable", "call", True),
        ("replayable", "batches", True),
        ("generator", "batches", False),
    ],
)
async def test_regression_a_merge_whose_source_blocks_for_ever_can_be_cancelled(
    kind: str, where: str, grouped: bool, table_uri: str
) -> None:
    # a sync factory blocked in its thread made the merge uncancellable: the
    # cancellation waited for the thread, for ever
    ds = await la.write_dataset(kv_table([0]), table_uri)
    blocking = Blocking(kv_table([1, 2, 3], value=9), where)
    scope = anyio.CancelScope()
    results: dict[Any, Any] = {}

    async def victim() -> None:
        with scope:
            await upsert(ds).execute(source_of(blocking, kind))

    async with anyio.create_task_group() as tg:
        held = await hold_lane(tg, ds, results, "first") if grouped else None
        tg.start_soon(victim)
        await anyio.to_thread.run_sync(blocking.entered.wait)
        scope.cancel()
        # the task group cannot end while the victim waits for its thread: it returns now
        if held is not None:
            held.release()
    assert scope.cancelled_caught
    before = lance.dataset(table_uri).version
    blocking.release()  # the source lets its thread go: it must stop, not commit
    await eventually(lambda: not abandoned_calls(), 60, "the abandoned thread to end")
    table = lance.dataset(table_uri)
    assert table.version == before
    assert sorted(table.to_table().column("id").to_pylist()) == ([0, 100] if grouped else [0])


class CancelOnBackoff(logging.Handler):
    """Cancels ``scope`` when a merge logs that it backs off before a replay
    (the record is emitted on the loop, in the merging task, right before
    the backoff's sleep)."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        super().__init__(logging.DEBUG)
        self.scope = scope
        self.fired = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "replaying in" in record.getMessage():
            self.fired += 1
            self.scope.cancel()


@pytest.mark.commit_lock
async def test_regression_a_groups_leader_cancelled_in_backoff_leaves_at_once(
    table_uri: str,
) -> None:
    # the leader ran its group shielded: cancelled during the group's first
    # backoff, it went on through every retry (1.97 s after 3 injected
    # conflicts, 4.83 s after 6; up to retry_timeout) and its rows committed
    base = kv_table(range(10))
    ds = await la.write_dataset(base, table_uri)
    hook = CommitHook(lambda: upsert_sync(table_uri, kv_table([1], value=-7)), times=1)
    contended = await la.open_dataset(table_uri, commit_lock=hook)
    scope = anyio.CancelScope()
    handler = CancelOnBackoff(scope)
    logger = logging.getLogger("lance_async.merge")
    results: dict[Any, Any] = {}
    leader = upsert(contended)

    async def lead() -> None:
        with scope:
            await leader.execute(kv_table([1, 50], value=5))

    level = logger.level
    try:
        async with anyio.create_task_group() as tg:
            held = await hold_lane(tg, ds, results, "first")
            tg.start_soon(lead)
            await until(lambda: ds.merge_statistics().pending_upserts == 1)
            tg.start_soon(_into, results, "other", upsert(ds).execute(kv_table([1, 60], value=6)))
            await until(lambda: ds.merge_statistics().pending_upserts == 2)
            logger.addHandler(handler)
            logger.setLevel(logging.DEBUG)
            held.release()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert handler.fired == 1 and scope.cancelled_caught
    assert len(hook.commits) == 1, "no attempt of the leader's group after its cancellation"
    assert leader.last_result is None
    rows = rows_by_key(lance.dataset(table_uri).to_table())
    assert 50 not in rows, "the cancelled leader's rows are withdrawn"
    other = results["other"]
    assert (other.group_size, other.group_index) == (1, 0), "the other upsert led the next group"
    assert rows[60]["value"] == 6 and rows[1]["value"] == 6
    assert (other.num_inserted_rows, other.num_updated_rows) == (1, 1)


async def test_regression_a_merge_abandoned_in_its_stream_lets_the_tables_other_merges_run(
    table_uri: str,
) -> None:
    # the merge lock (plain upserts share it, other merges hold it alone) was
    # held by the abandoned thread for as long as its source blocked: an
    # update-only merge of the table then waited for ever
    ds = await la.write_dataset(kv_table([0, 1]), table_uri)
    blocking = Blocking(kv_table([1, 2, 3], value=9), "batches")
    scope = anyio.CancelScope()
    results: dict[Any, Any] = {}

    async def victim() -> None:
        with scope:  # a streamed upsert: the engine holds the lock while it reads
            await upsert(ds).execute(blocking.batches())

    async with anyio.create_task_group() as tg:
        tg.start_soon(victim)
        await anyio.to_thread.run_sync(blocking.entered.wait)
        scope.cancel()
    assert scope.cancelled_caught
    update = ds.merge_insert("id").when_matched_update_all()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_into, results, "update", update.execute(kv_table([1], value=4)))
        await until(lambda: "update" in results)
    assert results["update"].num_updated_rows == 1
    blocking.release()
    await eventually(lambda: not abandoned_calls(), 60, "the abandoned thread to end")
    rows = rows_by_key(lance.dataset(table_uri).to_table())
    assert sorted(rows) == [0, 1] and rows[1]["value"] == 4, "the abandoned upsert wrote nothing"
