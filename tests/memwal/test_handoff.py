"""One queue on the routed write path: a send's room is the router's until its put is written."""

from __future__ import annotations

import contextlib

import anyio
import pytest

import lance_async as la

from ..helpers import eventually, kv_table
from .support import mem_wal_table

pytestmark = pytest.mark.anyio


async def _routed_rows(router: la.ShardRouter, rows: int) -> None:
    """Wait until ``rows`` rows were handed to the router's shard writers
    (the routing task gives no event to wait on)."""
    await eventually(
        lambda: sum(w.stats().queue_rows for w in router.writers.values()) >= rows,
        30,
        f"{rows} rows handed to the shard writers",
        interval=0.002,
    )


async def test_a_routed_send_keeps_its_room_in_the_router_queue_until_its_put_is_written(
    table_uri: str,
) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    async with ds.mem_wal_writer(max_queue_rows=10, max_put_rows=10) as router:
        await router.put(kv_table(range(100, 140)))  # every shard's writer is open
        writers = router.writers
        assert len(writers) == 4
        async with contextlib.AsyncExitStack() as held:
            for w in writers.values():  # fault injection: no engine call can start
                assert w._committer is not None
                await held.enter_async_context(w._committer.gate)
            ack = router.send_nowait(kv_table(range(10)))
            await _routed_rows(router, 10)  # routed and handed over, not written
            assert not ack.done()
            stats = router.stats()
            assert stats.queue_rows == 10 and stats.queue_bytes > 0
            assert sum(s.queue_rows for s in stats.writers.values()) == 10
            with pytest.raises(anyio.WouldBlock):  # routing gave no room back
                router.send_nowait(kv_table([50]))
        assert (await ack).rows == 10
        stats = router.stats()
        assert (stats.queue_rows, stats.queue_bytes) == (0, 0)
        assert (await router.put(kv_table([50]))).rows == 1
    table = await ds.lsm.scan(columns=["id"]).to_table()
    assert sorted(table.column("id").to_pylist()) == [*range(10), 50, *range(100, 140)]


async def test_every_byte_of_room_comes_back_after_puts_deletes_and_cut_parts(
    table_uri: str,
) -> None:
    """Each part holds a share of its run's room by rows; pieces cut at the
    put limit, deletes, sends that reach one shard or all of them: the
    router's queue is empty again once every ack resolved."""
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    async with ds.mem_wal_writer(max_put_rows=7) as router:
        acks = [await router.send(kv_table(range(i * 30, i * 30 + 30))) for i in range(20)]
        acks += [await router.send(kv_table([i])) for i in range(1_000, 1_050)]
        summaries = [await a for a in acks]
        assert sum(s.rows for s in summaries) == 650
        assert (await router.delete(kv_table(range(0, 600, 3)))).deletes == 200
        await router.flush()
        stats = router.stats()
        assert (stats.queue_rows, stats.queue_bytes) == (0, 0)
        assert all((s.queue_rows, s.queue_bytes) == (0, 0) for s in stats.writers.values())
    table = await ds.lsm.scan(columns=["id"]).to_table()
    expected = [k for k in range(600) if k % 3] + list(range(1_000, 1_050))
    assert sorted(table.column("id").to_pylist()) == expected


async def test_rows_sent_to_a_router_writer_queue_in_the_router_queue_in_order(
    table_uri: str,
) -> None:
    ds = await mem_wal_table(table_uri, bucket_column="id", num_buckets=4)
    sharding = await ds.sharding()
    parts = dict(sharding.split(kv_table(range(100, 200)).to_batches()[0]))
    shard, mine = next(iter(parts.items()))
    own = mine.column("id").to_pylist()
    other = next(k for k in range(100, 200) if k not in own)
    async with ds.mem_wal_writer() as router:
        writer = await router.writer(shard)
        first = await router.send(kv_table(own, value=1))
        second = await writer.send(kv_table(own, value=2))  # behind the router's send
        ack = writer.send_nowait(kv_table(own[:1], value=3))
        with pytest.raises(la.WrongShardError):  # still this shard's writer
            await writer.send(kv_table([other]))
        await writer.flush()
        assert first.done() and second.done() and ack.done()
        assert (await second).rows == len(own)
        assert (await writer.delete(kv_table(own[1:2]))).deletes == 1
        assert router.stats().queue_rows == 0
        assert writer.stats().rows == 2 * len(own) + 1
    table = await ds.lsm.scan(filter="id >= 100").to_table()
    values = {r["id"]: r["value"] for r in table.to_pylist()}
    assert values == {k: 3 if k == own[0] else 2 for k in own if k != own[1]}
