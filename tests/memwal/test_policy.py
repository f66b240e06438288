"""Commit policies: what each asks of the engine, and how options are checked."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.memwal import policy as policy_module
from lance_async.memwal.policy import (
    COMMIT_POLICIES,
    ENGINE_WAL_BUFFER_SIZE,
    LOAD_SMOOTHING,
    PACE_FACTOR,
    RAMP,
    SATURATED_LOOP,
    LoopLoad,
    WriterConfig,
    commit_policy,
    engine_options,
)

from ..helpers import KV_SCHEMA
from .support import mem_wal_table, sid

TEN_MINUTES_MS = 600_000


def ten_rows(i: int) -> pa.RecordBatch:
    ids = np.arange(i * 10, i * 10 + 10) + 1_000
    return pa.record_batch(
        {"id": ids, "value": np.full(10, i), "name": [f"r{j}" for j in ids]}, schema=KV_SCHEMA
    )


@pytest.mark.asyncio
async def test_adaptive_commit_flushes_an_idle_message_without_the_engine_tick(
    table_uri: str,
) -> None:
    ds = await mem_wal_table(table_uri)
    # A WAL tick of ten minutes: a durable put that waited for it would outlast
    # the test's timeout. Each idle message is one put whose WAL is flushed by
    # the put itself.
    async with ds.mem_wal_writer(sid(), max_wal_flush_interval_ms=TEN_MINUTES_MS) as writer:
        assert writer.commit == "adaptive"
        assert writer.engine_options["max_wal_buffer_size"] == 1
        summaries = [await writer.put(ten_rows(i)) for i in range(3)]
        engine, memtable = await writer.engine_stats()
        assert [(s.rows, s.engine_puts) for s in summaries] == [(10, 1)] * 3
        assert writer.stats().engine_puts == 3
        # every put was durable when it returned (no ten-minute tick waited for);
        # the engine may fold two puts' WAL writes into one flush on a busy machine
        assert engine["put_count"] == 3 and 1 <= engine["wal_flush_count"] <= 3
        assert memtable["durable_batch_count"] == 3


@pytest.mark.asyncio
async def test_throughput_policy_keeps_large_puts_and_adaptive_caps_them(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    puts: dict[str, int] = {}
    for commit in ("throughput", "adaptive"):
        async with ds.mem_wal_writer(sid(), commit=commit) as writer:
            assert writer.max_put_rows == (50_000 if commit == "throughput" else 10_000)
            assert writer.max_queue_rows == 2 * writer.max_put_rows
            assert ("max_wal_buffer_size" in writer.engine_options) is (commit == "adaptive")
            assert writer._committer is not None
            async with writer._committer.gate:  # hold the engine: 15,010 rows queue up
                acks = [await writer.send(ten_rows(i)) for i in range(1_501)]
            summary = await la.Ack.combine(acks)
            assert summary.rows == 15_010
            puts[commit] = summary.engine_puts
    # the first message may go alone; the throughput policy then puts the rest
    # at once, the adaptive one in puts of at most 10,000 rows
    assert puts["throughput"] <= 2
    assert puts["adaptive"] >= 2


@pytest.mark.asyncio
async def test_latency_policy_makes_small_puts(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid(), commit="latency") as writer:
        assert (writer.max_put_rows, writer.max_queue_rows) == (1_000, 1_000)
        assert writer.config.policy.min_put_interval == 0
        assert writer._committer is not None
        async with writer._committer.gate:  # hold the engine: one put's rows queue up
            acks = [await writer.send(ten_rows(i)) for i in range(100)]
            with pytest.raises(la.BackpressureTimeoutError):  # a queue of one put
                await writer.send(ten_rows(100), timeout=0.05)
        acks += [await writer.send(ten_rows(i)) for i in range(100, 200)]
        summary = await la.Ack.combine(acks)
    assert summary.rows == 2_000 and summary.engine_puts >= 2  # puts of 1,000 rows at most


@pytest.mark.asyncio
async def test_explicit_options_and_table_defaults_win_over_the_policy(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(
        sid(), max_wal_buffer_size=4096, max_put_rows=300, max_queue_rows=700
    ) as writer:
        assert writer.engine_options["max_wal_buffer_size"] == 4096
        assert (writer.max_put_rows, writer.max_queue_rows) == (300, 700)
        await writer.put(ten_rows(0))
    async with ds.mem_wal_writer(sid(), durable_write=False) as writer:
        assert "max_wal_buffer_size" not in writer.engine_options  # acks never wait for it
    # a buffer size recorded as the table's writer default is kept ...
    defaults = {"max_wal_buffer_size": "4096", "durable_write": "true"}
    policy = COMMIT_POLICIES["adaptive"]
    assert engine_options(policy, {}, defaults) == {}
    # ... unless it is pylance's own default, recorded with any other setting
    recorded = {"max_wal_buffer_size": str(ENGINE_WAL_BUFFER_SIZE), "max_memtable_rows": "500"}
    assert engine_options(policy, {}, recorded) == {"max_wal_buffer_size": 1}
    assert engine_options(policy, {}, {"durable_write": "false"}) == {}
    assert engine_options(COMMIT_POLICIES["throughput"], {}, {}) == {}


@pytest.mark.asyncio
async def test_a_table_default_buffer_size_is_kept_by_a_real_writer(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri, max_wal_buffer_size=2048, max_memtable_rows=4_000)
    async with ds.mem_wal_writer(sid()) as writer:
        assert "max_wal_buffer_size" not in writer.engine_options
        assert writer.max_put_rows == 4_000  # the policy's 10,000 capped by the memtable
        assert (await writer.put(ten_rows(1))).rows == 10


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"commit": "fast"}, ValueError),
        ({"commit": "Adaptive"}, ValueError),
        ({"commit": 1}, TypeError),
        ({"min_put_interval": -0.001}, ValueError),
        ({"min_put_interval": float("nan")}, ValueError),
        ({"min_put_interval": float("inf")}, ValueError),
        ({"min_put_interval": "5ms"}, TypeError),
        ({"max_put_rows": 0}, ValueError),
        ({"max_put_rows": 2.5}, TypeError),
        ({"max_queue_rows": True}, TypeError),
        ({"max_queue_bytes": -1}, ValueError),
        ({"linger": -1}, ValueError),
        ({"linger": float("inf")}, ValueError),
        ({"close_timeout": float("nan")}, ValueError),
    ],
)
async def test_bad_policy_options_are_refused_where_they_are_given(
    table_uri: str, options: dict[str, Any], error: type[Exception]
) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=2)
    with pytest.raises(error):
        WriterConfig.from_options(**options)
    with pytest.raises(error):
        ds.mem_wal_writer(sid(), **options)
    with pytest.raises(error):
        ds.mem_wal_writer(**options)  # the routing writer: before any shard opens


@pytest.mark.asyncio
async def test_each_policy_writes_every_row(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=2)
    for n, commit in enumerate(COMMIT_POLICIES):
        async with ds.mem_wal_writer(commit=commit, min_put_interval=0.001) as router:
            acks = [await router.send(ten_rows(n * 100 + i)) for i in range(100)]
            assert (await la.Ack.combine(acks)).rows == 1_000
            assert {w.commit for w in router.writers.values()} == {commit}
    table = await ds.lsm.scan(columns=["id"], filter="id >= 1000").to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(1_000, 4_000))


def test_adaptive_pacing_follows_the_last_put_within_its_bounds() -> None:
    adaptive = COMMIT_POLICIES["adaptive"]
    assert adaptive.pace(0.0005) == adaptive.min_put_interval == 0.005  # light load: the floor
    assert adaptive.pace(0.003) == pytest.approx(PACE_FACTOR * 0.003)  # slow puts: spaced out
    assert adaptive.pace(2.0) == adaptive.max_put_interval == 0.02  # never past the ceiling
    # an explicit interval is the floor; a larger one than the ceiling is fixed pacing
    assert commit_policy("adaptive", 0.01).pace(0.0001) == 0.01
    assert commit_policy("adaptive", 0.1).pace(1.0) == 0.1
    assert commit_policy("latency").pace(1.0) == 0.0  # no pacing at all
    assert commit_policy("throughput", 0.05).pace(1.0) == 0.05


def test_a_routed_run_is_paced_as_one_put_until_the_loop_is_saturated() -> None:
    adaptive = COMMIT_POLICIES["adaptive"]
    four = [0.002, 0.003, 0.004, 0.001]
    idle = SATURATED_LOOP - 0.1
    # loop with time to spare: the shards' puts ran side by side, paced by the longest
    assert adaptive.pace_run(four, idle) == pytest.approx(PACE_FACTOR * 0.004)
    assert adaptive.pace_run([2.0] * 4, idle) == adaptive.max_put_interval
    # saturated: their durations add up, and the ceiling is one writer's per shard
    assert adaptive.pace_run(four, SATURATED_LOOP) == pytest.approx(PACE_FACTOR * 0.010)
    assert adaptive.pace_run([2.0] * 4, 1.0) == pytest.approx(4 * adaptive.max_put_interval)
    assert adaptive.pace_run([2.0] * 2, 1.0) == pytest.approx(2 * adaptive.max_put_interval)
    assert adaptive.pace_run([0.0001] * 4, 1.0) == adaptive.min_put_interval  # the floor
    assert adaptive.pace_run([], 1.0) == adaptive.min_put_interval  # no shard written yet
    # no or fixed pacing, whatever the load: back to back with the longest put
    assert commit_policy("latency").pace_run(four, 1.0, 0.0) == 0.004
    assert commit_policy("latency").pace_run(four, 0.0) == 0.004
    assert commit_policy("throughput").pace_run([], 1.0) == 0.0
    assert commit_policy("throughput", 0.05).pace_run(four, 1.0) == 0.05
    assert commit_policy("throughput", 0.05).pace_run([0.06, 0.01], 1.0) == 0.06


def test_loop_load_is_the_smoothed_share_of_wall_time_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = {"cpu": 10.0, "wall": 100.0}
    fake_time = SimpleNamespace(thread_time=lambda: clock["cpu"], monotonic=lambda: clock["wall"])
    monkeypatch.setattr(policy_module, "time", fake_time)  # the clocks LoopLoad reads
    load = LoopLoad()
    assert load.busy == 0.0

    def spend(cpu: float, wall: float) -> float:
        clock["cpu"] += cpu
        clock["wall"] += wall
        return load.sample()

    for _ in range(60):  # always on the CPU: converges to 1
        spend(0.01, 0.01)
    assert load.busy == pytest.approx(1.0, abs=1e-3)
    for _ in range(60):  # a quarter of the time
        spend(0.0025, 0.01)
    assert load.busy == pytest.approx(0.25, abs=1e-3)
    before = load.busy
    assert spend(0.0, 0.0) == before  # no time passed: unchanged
    spend(0.5, 0.01)  # a clock jitter past 100 % counts as 100 %
    assert load.busy == pytest.approx(before + LOAD_SMOOTHING * (1.0 - before))


@pytest.mark.asyncio
async def test_a_writer_paces_its_puts_by_the_last_put(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    async with ds.mem_wal_writer(sid()) as w:
        acc = w._acc
        assert acc is not None
        assert acc.put_interval == 0.005
        await w.put(pa.Table.from_batches([ten_rows(i) for i in range(500)]))
        stats = w.stats()
        assert stats.engine_puts >= 1
        # whatever the put took on this machine, the next interval follows it
        assert 0.005 <= acc.put_interval <= 0.02
        acc.put_took(0.004)
        assert acc.put_interval == pytest.approx(0.016)
        acc.put_took(0.0001)
        assert acc.put_interval == 0.005
        await w.put(ten_rows(900))  # the writer keeps writing under the new pacing
        assert (await w.lsm.point_lookup(10_000)).num_rows == 1


def test_a_saturated_run_interval_ramps_up_from_the_last_one() -> None:
    """One saturated sample (a burst, a full GC) stretches the next run by
    RAMP at most; sustained saturation reaches the summed interval in a few
    runs; below saturation the interval falls back at once."""
    adaptive = COMMIT_POLICIES["adaptive"]
    slow = [0.02] * 4  # the summed interval would be the ceiling: 4 x 20 ms
    last = adaptive.pace_run(slow, 0.0)  # below saturation: one put's, 20 ms
    assert last == adaptive.max_put_interval
    steps = []
    for _ in range(6):
        last = adaptive.pace_run(slow, 1.0, last)
        steps.append(last)
    assert steps[0] == pytest.approx(adaptive.max_put_interval * RAMP)
    assert steps == sorted(steps)  # never shrinks while saturated
    assert steps[-1] == pytest.approx(4 * adaptive.max_put_interval)  # the ceiling, in a few runs
    assert adaptive.pace_run(slow, 0.0, last) == adaptive.max_put_interval  # back at once
    # a previous interval below one put's pacing never holds a run below it
    assert adaptive.pace_run([0.004] * 4, 1.0, 0.0) == pytest.approx(PACE_FACTOR * 0.004)
