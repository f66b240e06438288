"""ShardRouter: rows split by shard, one writer per shard."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pyarrow as pa
import pytest

import lance_async as la
from lance_async.memwal.policy import RAMP
from lance_async.memwal.writer import AsyncShardWriter

from ..helpers import KV_SCHEMA, kv_table
from .support import mem_wal_table

pytestmark = pytest.mark.anyio


async def test_the_routing_writer_splits_rows_by_bucket(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    async with ds.mem_wal_writer() as router:
        summary = await router.put(kv_table(range(100, 1_100), value=3))
        assert summary.rows == 1_000
        writers = router.writers
        assert len(writers) == 4
        assert summary.engine_puts == sum(w.stats().engine_puts for w in writers.values())
        per_shard = {s: w.stats().rows for s, w in writers.items()}
        assert sum(per_shard.values()) == 1_000 and min(per_shard.values()) > 100
    snaps = await ds.lsm.snapshots()
    assert {s.shard_id for s in snaps} == set(writers)
    table = await ds.lsm.scan(filter="id >= 100").to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(100, 1_100))
    # the same value always routes to the same shard id
    assert la.memwal.router.default_shard_id(1, 3) == la.memwal.router.default_shard_id(1, 3)


async def test_the_routing_writer_queues_nothing_of_an_in_memory_send_with_a_bad_row(
    table_uri: str,
) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    good = kv_table(range(100, 10_100)).to_batches()[0]  # routed on a worker thread
    bad = kv_table(range(20_000, 20_040)).to_batches()[0]
    ids = bad.column(0).to_pylist()
    ids[21] = None
    bad = pa.record_batch(
        [pa.array(ids, pa.int64()), bad.column(1), bad.column(2)], schema=KV_SCHEMA
    )
    async with ds.mem_wal_writer() as router:
        with pytest.raises(la.SchemaMismatchError, match="batch 1"):
            await router.send([good, bad])
        assert all(w.stats().rows == 0 for w in router.writers.values())
        summary = await router.put(good)  # the router stays usable
        assert summary.rows == 10_000
    table = await ds.lsm.scan(columns=["id"], filter="id >= 100").to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(100, 10_100))


async def test_the_routing_writer_needs_a_sharded_table(table_uri: str) -> None:
    ds = await mem_wal_table(table_uri)
    with pytest.raises(la.InvalidInputError, match="sharding"):
        async with ds.mem_wal_writer():
            pass


async def test_the_routing_writer_send_many_gives_one_ack_and_one_entry_per_shard(
    table_uri: str,
) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    batches = [
        b
        for start in range(100, 1_100, 100)
        for b in kv_table(range(start, start + 100), value=5).to_batches()
    ]
    async with ds.mem_wal_writer(commit="throughput") as router:
        ack = await router.send_many(batches)
        summary = await ack
        assert summary.rows == 1_000
        writers = router.writers
        assert len(writers) == 4
        # each shard got the rows of all ten batches as one send: one entry each
        assert {w.stats().entries for w in writers.values()} == {1}
        assert summary.engine_puts == 4
        assert (await (await router.send_many([]))).rows == 0
    table = await ds.lsm.scan(filter="id >= 100").to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(100, 1_100))
    assert set(table.column("value").to_pylist()) == {5}


@pytest.mark.parametrize("used", [False, True], ids=["no-writers", "with-writers"])
async def test_a_closed_or_unopened_router_refuses_every_call_with_closed_error(
    table_uri: str, used: bool
) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    router = ds.mem_wal_writer()
    with pytest.raises(la.ClosedError, match="not open"):
        await router.flush()
    async with router:
        if used:
            await router.put(kv_table(range(100, 200)))
    shard = (await ds.sharding()).shard_id(0)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "flush": lambda: router.flush(),
        "put": lambda: router.put(kv_table([1])),
        "send": lambda: router.send(kv_table([1])),
        "delete": lambda: router.delete(kv_table([1])),
        "writer": lambda: router.writer(shard),
        "lsm.point_lookup": lambda: router.lsm.point_lookup(1),
    }
    for call in calls.values():
        with anyio.fail_after(10), pytest.raises(la.ClosedError, match="not open"):
            await call()
    with pytest.raises(la.ClosedError):
        router.lsm.scan()
    await router.aclose()  # still safe to call twice


class _Load:
    """A LoopLoad stand-in whose loop is as busy as the test says."""

    def __init__(self, busy: float) -> None:
        self.busy = busy

    def sample(self) -> float:
        return self.busy


async def test_a_router_paces_its_runs_for_throughput_only_once_its_loop_is_saturated(
    table_uri: str,
) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    async with ds.mem_wal_writer() as router:
        await router.put(kv_table(range(0, 400)))
        writers = router.writers
        assert len(writers) == 4 and all(w.last_put_seconds > 0 for w in writers.values())
        for w in writers.values():
            runs = w._runs
            assert runs is not None
            runs.put_took(0.004)  # each shard's put took 4 ms
        acc = router._acc
        assert acc is not None
        router._load = _Load(0.2)  # type: ignore[assignment]
        router._pace(set(writers))
        assert acc.put_interval == pytest.approx(0.016)  # side by side: paced as one put
        router._load = _Load(0.95)  # type: ignore[assignment]
        router._pace(set(writers))
        assert acc.put_interval == pytest.approx(0.016 * RAMP)  # saturated: it ramps up
        for _ in range(3):
            router._pace(set(writers))
        assert acc.put_interval == pytest.approx(0.064)  # to the four summed
        router._pace(set(list(writers)[:1]))
        assert acc.put_interval == pytest.approx(0.016)  # a run that wrote one shard
        # the router keeps routing under the stretched pacing
        assert (await router.put(kv_table(range(400, 800)))).rows == 400
    table = await ds.lsm.scan(columns=["id"]).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(800))


async def test_a_run_opens_the_writers_of_its_shards_side_by_side(
    table_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh router's first run opens its four shards at once: each open
    is storage round trips, and one after another a first ack waited for
    their sum (four shards behind 20 ms of store latency: 1.7 s against
    0.6 s)."""
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    in_flight = most = opened = 0
    real_open = AsyncShardWriter.open

    async def counted_open(self: AsyncShardWriter, tg: Any) -> None:
        nonlocal in_flight, most, opened
        in_flight += 1
        most = max(most, in_flight)
        try:
            for _ in range(3):  # let any other open that is due start too
                await anyio.lowlevel.checkpoint()
            await real_open(self, tg)
        finally:
            in_flight -= 1
            opened += 1

    monkeypatch.setattr(AsyncShardWriter, "open", counted_open)
    async with ds.mem_wal_writer() as router:
        assert (await router.put(kv_table(range(400)))).rows == 400
        assert opened == 4 and len(router.writers) == 4
        assert most >= 2  # one after another, never more than one at a time
    table = await ds.lsm.scan(columns=["id"]).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(400))


async def test_a_shard_that_cannot_open_fails_only_the_sends_with_rows_in_it(
    table_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    real_open = AsyncShardWriter.open
    async with ds.mem_wal_writer() as router:
        rows = kv_table(range(40)).to_batches()[0]
        bad_shard, bad_rows = router.sharding.split(rows)[0]
        bad_keys = set(bad_rows.column("id").to_pylist())
        assert 0 < len(bad_keys) < 40

        async def refuse_one_shard(self: AsyncShardWriter, tg: Any) -> None:
            if self.shard_id == bad_shard:
                raise la.StorageError("the store refused to open this shard")
            await real_open(self, tg)

        monkeypatch.setattr(AsyncShardWriter, "open", refuse_one_shard)
        acks = [await router.send(kv_table([k])) for k in range(40)]
        for key, ack in enumerate(acks):
            if key in bad_keys:
                with pytest.raises(la.StorageError, match="refused to open"):
                    await ack
            else:
                assert (await ack).rows == 1
        assert bad_shard not in router.writers and len(router.writers) == 3
    table = await ds.lsm.scan(columns=["id"]).to_table()
    # the rows of the other shards, and the table's own first row (id 0)
    assert sorted(table.column("id").to_pylist()) == sorted((set(range(40)) - bad_keys) | {0})
