"""AsyncShardWriter: group commit, backpressure, acks, failures (asyncio and trio)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
import pytest

import lance_async as la

from ..helpers import KV_SCHEMA, kv_table, rows_by_key
from .support import committer_of, mem_wal_table, sid

pytestmark = pytest.mark.anyio


def ten_rows(i: int) -> pa.RecordBatch:
    ids = np.arange(i * 10, i * 10 + 10) + 1_000
    return pa.record_batch(
        {"id": ids, "value": np.full(10, i), "name": [f"r{j}" for j in ids]}, schema=KV_SCHEMA
    )


class RejectingEngineForFaultInjection:
    """Fault injection only: wraps a real ShardWriter and rejects puts that
    carry id == -1, the way the engine rejects input it cannot take
    (``OSError("Invalid user input: ...")``). The real engine cannot be made
    to reject a batch that passed lance_async's validation."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.rejected = 0

    def put(self, table: pa.Table) -> None:
        if -1 in table.column("id").to_pylist():
            self.rejected += 1
            raise OSError("Invalid user input: injected rejection")
        self.real.put(table)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class BrokenEngineForFaultInjection(RejectingEngineForFaultInjection):
    """Fault injection only: a WAL flush that fails with an I/O error."""

    def put(self, table: pa.Table) -> None:
        raise OSError("LanceError(IO): failed to flush WAL: injected disk failure")


def _on_another_loop(fn: Any) -> BaseException | None:
    errors: list[BaseException] = []

    async def use() -> None:
        try:
            await fn()
        except BaseException as exc:
            errors.append(exc)

    anyio.run(use)
    return errors[0] if errors else None


async def test_10000_sends_of_10_rows_coalesce(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri, rows=0)
    async with ds.mem_wal_writer(sid(), durable_write=True) as writer:
        started = anyio.current_time()
        acks = [await writer.send(ten_rows(i)) for i in range(10_000)]
        summaries = [await ack for ack in acks]
        took = anyio.current_time() - started
        stats = writer.stats()
        table = await writer.lsm.scan(columns=["id"]).to_table()
    assert all(s.rows == 10 for s in summaries)
    assert all(a.done() and a.exception() is None for a in acks)
    ids = table.column("id").to_pylist()
    assert len(ids) == 100_000 and len(set(ids)) == 100_000
    assert stats.rows == 100_000
    # the adaptive policy puts at most once per 5 ms (a slow, loaded producer
    # sees more, smaller puts), and always far fewer than one per message
    assert stats.engine_puts <= took / 0.005 + 10, (stats.engine_puts, took)
    assert stats.engine_puts < 2_000, stats.engine_puts
    assert stats.rows_per_put >= 50


async def test_fast_producer_is_held_within_the_queue_limits(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(
        sid(), max_queue_rows=2_000, max_put_rows=500, max_queue_bytes=10_000_000
    ) as writer:
        acks = [await writer.send(ten_rows(i)) for i in range(3_000)]
        for ack in acks:
            await ack
        stats = writer.stats()
    assert stats.max_queue_rows_seen <= 2_000
    assert stats.max_queue_bytes_seen <= 10_000_000
    assert stats.rows == 30_000
    assert stats.rows_per_put <= 500


async def test_backpressure_timeout_is_typed_and_queues_nothing(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid(), max_queue_rows=10, max_put_rows=10) as writer:
        gate = committer_of(writer).gate
        assert gate is not None
        async with gate:  # hold the engine: nothing drains
            first = await writer.send(ten_rows(0))
            with pytest.raises(la.BackpressureTimeoutError):
                await writer.send(ten_rows(1), timeout=0.05)
            assert writer.stats().queue_rows == 10
        await first
    assert (await ds.lsm.scan(filter="id >= 1000").to_table()).num_rows == 10


async def test_bad_batch_fails_its_own_sender_only(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid()) as writer:
        good = await writer.send(ten_rows(0))
        for bad in (
            pa.record_batch({"id": [1], "value": ["x"], "name": ["a"]}),  # wrong type
            pa.record_batch(
                {"id": [None], "value": [1], "name": ["a"]}, schema=KV_SCHEMA.remove_metadata()
            ),
            pa.record_batch({"id": [1], "value": [1]}),  # missing column
            pa.record_batch({"id": [1], "value": [1], "name": ["a"], "extra": [1]}),
        ):
            with pytest.raises(la.SchemaMismatchError):
                await writer.send(bad)
        after = await writer.put(ten_rows(1))
        await good
        assert after.rows == 10
        assert writer.stats().queue_rows == 0
        assert (await writer.lsm.scan(filter="id >= 1000").to_table()).num_rows == 20


async def test_a_table_with_one_bad_batch_queues_none_of_its_rows(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    nullable = KV_SCHEMA.remove_metadata()
    good = pa.record_batch({"id": [1001, 1002], "value": [1, 2], "name": ["a", "b"]}, nullable)
    bad = pa.record_batch({"id": [1003, None], "value": [3, 4], "name": ["c", "d"]}, nullable)
    async with ds.mem_wal_writer(sid()) as writer:
        with pytest.raises(la.SchemaMismatchError, match="batch 1"):
            await writer.send(pa.Table.from_batches([good, bad]))
        assert writer.stats().queue_rows == 0
        await writer.put(ten_rows(0))
        ids = (await writer.lsm.scan(columns=["id"], filter="id >= 1000").to_table())["id"]
        assert sorted(ids.to_pylist()) == list(range(1000, 1010))


async def test_bad_delete_keys_are_refused_and_the_writer_stays_usable(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid()) as writer:
        await writer.put(ten_rows(0))
        for bad in (
            {"id": pa.array([1000, None], pa.int64())},  # a null key
            {"value": [1]},  # no key column
            {"id": ["1000"]},  # a string key
            {"id": pa.array([1000], pa.int32())},  # another integer type
        ):
            with pytest.raises(la.SchemaMismatchError):
                await writer.delete(bad)
        with pytest.raises(la.UnsupportedSourceError):
            await writer.delete(object())
        assert (await writer.lsm.scan(filter="id >= 1000").to_table()).num_rows == 10
        summary = await writer.delete({"id": [1000, 1001]})
        assert summary.deletes == 2
        assert (await writer.lsm.scan(filter="id >= 1000").to_table()).num_rows == 8


async def test_columns_in_another_order_are_accepted(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid()) as writer:
        await writer.put({"name": ["z"], "id": [77], "value": [7]})
        row = await writer.lsm.point_lookup(77)
    assert row.to_pylist() == [{"id": 77, "value": 7, "name": "z"}]


async def test_engine_rejection_fails_exactly_the_acks_of_bad_data(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid(), linger=0.05) as writer:
        committer = committer_of(writer)
        fake = RejectingEngineForFaultInjection(committer.engine)
        committer.engine = fake
        acks = [await writer.send(ten_rows(i)) for i in range(5)]
        bad = await writer.send(kv_table([-1]))
        acks += [await writer.send(ten_rows(i)) for i in range(5, 10)]
        for ack in acks:
            assert (await ack).rows == 10
        with pytest.raises(la.InvalidInputError, match="injected"):
            await bad
        assert fake.rejected >= 2  # the coalesced put, then the bad item alone
        assert writer.state is la.WriterState.OPEN
        assert (await writer.put(ten_rows(20))).rows == 10
        assert (await writer.lsm.scan(filter="id >= 1000").to_table()).num_rows == 110


async def test_fatal_engine_error_fails_everything_promptly(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    writer = ds.mem_wal_writer(sid())
    async with writer:
        committer = committer_of(writer)
        committer.engine = BrokenEngineForFaultInjection(committer.engine)
        acks = [await writer.send(ten_rows(0))]
        with pytest.raises(la.WriterFailedError):  # later sends see the failure at once
            for i in range(1, 1_000):
                acks.append(await writer.send(ten_rows(i)))
                await anyio.sleep(0.001)
        with anyio.fail_after(5):
            for ack in acks:
                with pytest.raises(la.WriterFailedError) as info:
                    await ack
        assert "injected disk failure" in str(info.value.__cause__)
        state = writer.state  # a local: mypy would keep writer.state narrowed past aclose
        assert state is la.WriterState.FAILED
        with pytest.raises(la.WriterFailedError):
            await writer.send(ten_rows(99))
        with pytest.raises(la.WriterFailedError):
            await writer.flush()
    await writer.aclose()  # idempotent
    assert writer.state is la.WriterState.CLOSED
    with pytest.raises(la.ClosedError):
        await writer.send(ten_rows(1))


async def test_delete_after_put_hides_the_row_with_coalescing(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri, rows=10)
    async with ds.mem_wal_writer(sid(), linger=0.05) as writer:
        put = await writer.send(kv_table([5, 6, 7], value=1))
        delete = await writer.send(kv_table([2]))  # an upsert of a base row ...
        await writer.delete({"id": [6, 2]})  # ... then deletes, in order
        reput = await writer.send(kv_table([6], value=2))
        for ack in (put, delete, reput):
            await ack
        rows = rows_by_key(await writer.lsm.scan().to_table())
        assert 2 not in rows and 5 in rows and rows[6]["value"] == 2
        assert (await writer.lsm.point_lookup(2)).num_rows == 0
    rows = rows_by_key(await ds.lsm.scan().to_table())
    assert 2 not in rows and rows[6]["value"] == 2 and rows[7]["value"] == 1


async def test_cancelling_a_put_never_drops_or_duplicates_queued_rows(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid()) as writer:
        ack = await writer.send(kv_table(range(100, 600)))
        with anyio.move_on_after(0.001):
            await ack  # the wait is cancelled; the rows stay queued
        batches = [kv_table(range(b * 100, b * 100 + 100)).to_batches()[0] for b in range(10, 20)]
        for delay in (0.0, 0.002, 0.01):
            with anyio.move_on_after(delay):
                await writer.put(batches)  # cancelled somewhere in the middle
        await writer.flush()
        assert (await ack).rows == 500
        table = await writer.lsm.scan(filter="id >= 100").to_table()
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "no row twice"
    assert set(range(100, 600)) <= set(ids)
    for b in range(10, 20):  # each batch is queued whole or not at all
        present = {i for i in ids if b * 100 <= i < b * 100 + 100}
        assert len(present) in (0, 100)


async def test_read_your_writes_across_a_memtable_seal(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid(), max_memtable_rows=1_000, max_put_rows=1_000) as writer:
        for start in range(0, 5_000, 1_000):
            await writer.put(kv_table(range(10_000 + start, 11_000 + start)))
            # the put may have sealed a memtable whose SSTable is not written yet
            count = (await writer.lsm.scan(columns=["id"]).to_table()).num_rows
            assert count == 1 + start + 1_000
            assert (await writer.lsm.point_lookup(10_000 + start)).num_rows == 1


async def test_flush_and_close_are_idempotent_and_typed(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    writer = ds.mem_wal_writer(sid())
    with pytest.raises(la.ClosedError):
        await writer.send(ten_rows(0))
    async with writer:
        await writer.send(ten_rows(0))
        summary = await writer.flush()
        assert summary.rows == 0
    await writer.aclose()
    with pytest.raises(la.ClosedError):
        await writer.put(ten_rows(1))
    with pytest.raises(la.ClosedError):
        await writer.open(None)  # type: ignore[arg-type]  # refused before the group is used
    assert (await ds.lsm.scan(filter="id >= 1000").to_table()).num_rows == 10


async def test_bad_options_are_refused(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    with pytest.raises(ValueError, match="UUID"):
        ds.mem_wal_writer("not-a-uuid")
    with pytest.raises(ValueError):
        ds.mem_wal_writer(sid(), max_queue_rows=0)
    with pytest.raises(ValueError):
        ds.mem_wal_writer(sid(), linger=-1)


async def test_writer_without_mem_wal_is_refused(table_uri: str) -> None:
    ds = await la.write_dataset(kv_table(range(3)), table_uri)
    with pytest.raises((OSError, ValueError, la.LanceAsyncError)):
        async with ds.mem_wal_writer(sid()):
            pass


async def test_writer_from_another_loop_is_refused(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid()) as writer:
        errors: list[BaseException] = []

        def other() -> None:
            async def use() -> None:
                try:
                    await writer.send(ten_rows(1))
                except BaseException as exc:
                    errors.append(exc)

            anyio.run(use)

        await anyio.to_thread.run_sync(other)
        assert errors and isinstance(errors[0], la.WrongEventLoopError)


async def test_unclosed_writer_warns(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    writer = ds.mem_wal_writer(sid())
    async with anyio.create_task_group() as tg:
        await writer.open(tg)
        with pytest.warns(ResourceWarning, match="never closed"):
            writer.__del__()  # what the garbage collector would call
        await writer.aclose()
    writer.__del__()  # closed: silent (warnings are errors in this suite)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_acked_rows_survive_a_hard_kill(table_uri: str, tmp_path: Path) -> None:
    ds = await mem_wal_table(table_uri)
    shard = sid()
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys, anyio, pyarrow as pa
            import lance_async as la
            sys.path.insert(0, {str(Path(__file__).parents[2])!r})
            from tests.helpers import kv_table

            async def main():
                ds = await la.open_dataset({table_uri!r})
                writer = ds.mem_wal_writer({shard!r}, durable_write=True)
                async with anyio.create_task_group() as tg:
                    await writer.open(tg)
                    acks = [await writer.send(kv_table(range(i * 100, i * 100 + 100), value=i))
                            for i in range(1, 51)]
                    for ack in acks:
                        await ack
                    print("ACKED", sum(a.result().rows for a in acks), flush=True)
                    os._exit(0)  # no close, no flush: a hard kill

            anyio.run(main)
            """
        )
    )
    with anyio.fail_after(120):
        out = await anyio.run_process([sys.executable, str(script)], check=False)
    assert "ACKED 5000" in out.stdout.decode(), out.stderr.decode()[-2000:]
    async with ds.mem_wal_writer(shard) as reopened:  # replays the WAL
        table = await reopened.lsm.scan(filter="id >= 100").to_table()
    ids = table.column("id").to_pylist()
    assert sorted(ids) == list(range(100, 5_100))


async def test_regression_aclose_and_acks_from_another_loop_are_refused(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid()) as writer:
        gate = committer_of(writer).gate
        assert gate is not None
        async with gate:  # keep the ack pending
            ack = await writer.send(ten_rows(1))
            with anyio.fail_after(10):
                err = await anyio.to_thread.run_sync(_on_another_loop, writer.aclose)
                assert isinstance(err, la.WrongEventLoopError)
                err = await anyio.to_thread.run_sync(_on_another_loop, ack.wait)
                assert isinstance(err, la.WrongEventLoopError)
        assert (await ack).rows == 10
        state = writer.state  # a local: mypy would keep writer.state narrowed past the close
        assert state is la.WriterState.OPEN
    assert writer.state is la.WriterState.CLOSED


async def test_regression_a_cancelled_send_of_a_big_batch_queues_all_or_nothing(
    table_uri: str,
) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid(), max_put_rows=10, max_queue_rows=20) as writer:
        gate = committer_of(writer).gate
        assert gate is not None
        async with gate:
            first = await writer.send(kv_table(range(1000, 1015)))  # the queue is now busy
            with anyio.move_on_after(0.05) as scope:
                await writer.send(kv_table(range(2000, 2100)))  # 100 rows, 10 pieces
            assert scope.cancelled_caught
            with pytest.raises(la.BackpressureTimeoutError, match="not queued"):
                await writer.send(kv_table(range(3000, 3100)), timeout=0.05)
        await first
        await writer.flush()
        ids = (await writer.lsm.scan(columns=["id"], filter="id >= 1000").to_table())["id"]
    assert sorted(ids.to_pylist()) == list(range(1000, 1015))
    with pytest.raises(ValueError):
        async with ds.mem_wal_writer(sid()) as w2:
            await w2.send(ten_rows(0), timeout=float("nan"))


async def test_send_nowait_queues_or_refuses_at_once(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid(), max_queue_rows=20, max_put_rows=10) as writer:
        gate = committer_of(writer).gate
        assert gate is not None
        async with gate:  # nothing drains meanwhile
            first = writer.send_nowait(ten_rows(0))
            second = writer.send_nowait(
                ten_rows(1).to_pydict() and pa.Table.from_batches([ten_rows(1)])
            )
            with pytest.raises(anyio.WouldBlock):
                writer.send_nowait(ten_rows(2))
            with pytest.raises(la.SchemaMismatchError):
                writer.send_nowait(pa.record_batch({"id": [1]}))
            with pytest.raises(TypeError):
                writer.send_nowait({"id": [1]})
            assert writer.stats().queue_rows == 20
        assert (await first).rows == 10 and (await second).rows == 10
        ids = (await writer.lsm.scan(columns=["id"], filter="id >= 1000").to_table())["id"]
    assert sorted(ids.to_pylist()) == list(range(1000, 1020))


async def test_combined_acks_count_a_shared_put_once(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid()) as writer:
        gate = committer_of(writer).gate
        assert gate is not None
        async with gate:  # everything below coalesces into one put
            acks = [await writer.send(ten_rows(i)) for i in range(50)]
        summary = await la.Ack.combine(acks)
        assert summary.rows == 500 and summary.batches == 50
        puts = writer.stats().engine_puts
        assert summary.engine_puts == puts <= 2  # the first send may go alone


async def test_send_many_gives_one_ack_and_one_entry_per_group(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid(), max_put_rows=1_000) as writer:
        assert writer._committer is not None
        async with writer._committer.gate:  # nothing drains: count the entries
            groups = [[ten_rows(g * 10 + i) for i in range(10)] for g in range(5)]
            acks = [await writer.send_many(group) for group in groups]
            assert writer.stats().entries == 5  # one per group, not one per batch
            assert writer.stats().queue_rows == 500
        summaries = [await ack for ack in acks]
        assert [(s.rows, s.batches) for s in summaries] == [(100, 10)] * 5
        # a group larger than one put is cut, still under one ack
        big = await writer.send_many([ten_rows(100 + i) for i in range(150)])
        assert (await big).rows == 1_500 and (await big).engine_puts >= 2
        assert (await (await writer.send_many([]))).rows == 0
        ids = (await writer.lsm.scan(columns=["id"], filter="id >= 1000").to_table())["id"]
    assert sorted(ids.to_pylist()) == list(range(1_000, 1_500)) + list(range(2_000, 3_500))


async def test_send_many_queues_nothing_of_a_group_with_a_bad_batch(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    bad = pa.record_batch({"id": [1], "value": ["x"], "name": ["a"]})
    async with ds.mem_wal_writer(sid()) as writer:
        with pytest.raises(la.SchemaMismatchError, match="batch 2"):
            await writer.send_many([ten_rows(0), ten_rows(1), bad])
        assert writer.stats().queue_rows == 0 and writer.stats().entries == 0
        assert (await writer.put(ten_rows(2))).rows == 10


async def test_one_batch_sends_are_one_entry_each_and_settle_like_any_ack(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid()) as writer:
        assert writer._committer is not None
        async with writer._committer.gate:
            acks = [await writer.send(ten_rows(i)) for i in range(20)]
            acks.append(writer.send_nowait(ten_rows(20)))
            assert writer.stats().entries == 21
            assert not any(a.done() for a in acks[1:])
        summaries = [await a for a in acks]
        assert all(s == la.PutSummary(10, 1, 1) for s in summaries)
        assert all(a.resolved_at is not None and a.resolved_at >= a.created for a in acks)
        stats = writer.stats()
        assert stats.rows == 210 and stats.queue_rows == 0 and stats.engine_puts <= 3


class _SealedForever:
    """Fault injection: the engine writer, but its sealed memtable never flushes
    (what a writer fenced by a newer one shows: its flush is refused)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.polls = 0

    def memtable_stats(self) -> dict[str, Any]:
        self.polls += 1
        return {**self._engine.memtable_stats(), "frozen_count": 1}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@pytest.mark.anyio
async def test_wait_flushed_on_a_fenced_writer_raises_fenced_at_once(tmp_path: Path) -> None:
    ds = await mem_wal_table(str(tmp_path / "t.lance"))
    shard = sid()
    async with ds.mem_wal_writer(shard) as old:  # a failed writer closes quietly
        await old.put(kv_table(range(5)))
        committer = old._committer  # fault injection: a seal that never flushes
        assert committer is not None
        sealed = committer.engine = _SealedForever(committer.engine)
        other = await la.open_dataset(ds.uri)
        async with other.mem_wal_writer(shard):  # a newer writer claims the shard
            pass
        with pytest.raises(la.FencedError):
            await old.wait_flushed(timeout=30)
        assert sealed.polls == 1  # it looked once, then read the shard's epoch
        with pytest.raises(la.FencedError):  # and again, at once, without polling
            await old.wait_flushed(timeout=30)
        assert sealed.polls == 1


@pytest.mark.anyio
async def test_wait_flushed_on_a_failed_writer_raises_its_failure_at_once(tmp_path: Path) -> None:
    ds = await mem_wal_table(str(tmp_path / "t.lance"))
    shard = sid()
    async with ds.mem_wal_writer(shard) as old:  # a failed writer closes quietly
        other = await la.open_dataset(ds.uri)
        async with other.mem_wal_writer(shard):
            pass
        with pytest.raises(la.FencedError):
            await old.put(kv_table(range(5)))  # the engine says so: the writer fails
        assert old.state is la.WriterState.FAILED
        with pytest.raises(la.FencedError):
            await old.wait_flushed(timeout=30)
