"""One key, one shard; one shard, one writer (issue 13's stories, real engine and brokers).

Each story ends in one row per key with the newest value in the LSM scan, in
point lookups and after compaction.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import lance
import pyarrow as pa
import pytest
import redis.asyncio
from typer.testing import CliRunner

import lance_async as la
from lance_async.cli import app
from lance_async.feeds import IterableFeed, RedisStreamFeed, ingest
from lance_async.feeds.kafkaclient import setting_name

from ..conftest import broker_or_skip
from ..feeds.support import CrashBeforeAck, row_json
from ..helpers import KV_SCHEMA, kv_table
from ..services import FAST_GROUP, create_topic, unique_name

runner = CliRunner()


async def keyed_table(uri: str, rows: int = 0, **init: Any) -> la.AsyncDataset:
    """A KV table with lance_async's default MemWAL (bucket sharding on ``id``)."""
    ds = await la.write_dataset(kv_table(range(rows)), uri, schema=KV_SCHEMA)
    return await ds.initialize_mem_wal(**init)


async def assert_newest_once(uri: str, expected: dict[int, int]) -> None:
    """``expected`` is id -> value: the LSM scan, lookups, and compaction agree."""
    ds = await la.open_dataset(uri)
    scanned = (await ds.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
    ids = [r["id"] for r in scanned]
    assert len(ids) == len(set(ids)), "a key appears twice in the LSM view"
    assert {r["id"]: r["value"] for r in scanned} == expected
    for key in list(expected)[:: max(1, len(expected) // 10)]:
        got = await ds.lsm.point_lookup(key, columns=["value"])
        assert got.column("value").to_pylist() == [expected[key]]
    assert (await ds.check_shards()).ok
    await ds.compact_mem_wal()
    base = (await ds.to_table(columns=["id", "value"])).to_pylist()
    assert sorted(r["id"] for r in base) == sorted(expected)
    assert {r["id"]: r["value"] for r in base} == expected


# -- the sharding spec decides the shard ------------------------------------------


@pytest.mark.asyncio
async def test_the_default_mem_wal_is_bucket_sharded_on_the_key(table_uri: str) -> None:
    ds = await keyed_table(table_uri)
    sharding = await ds.sharding()
    assert (sharding.kind, sharding.column, sharding.num_buckets) == ("bucket", "id", 4)
    ids = sharding.shard_ids()
    assert len(set(ids)) == 4
    assert ids == (await (await la.open_dataset(table_uri)).sharding()).shard_ids()  # stable
    with pytest.raises(ValueError, match="manual_shards"):
        await ds.initialize_mem_wal(manual_shards=True, unsharded=True)


@pytest.mark.asyncio
async def test_split_and_check_agree_with_the_engine_row_by_row(table_uri: str) -> None:
    """split() groups rows by the engine's shard value, keeps row order inside
    each part and loses none; check() passes each part and refuses the rest."""
    ds = await keyed_table(table_uri)
    sharding = await ds.sharding()
    ids = [37, 2, 99, 2, 14, 5, 61, 8, 0, 73, 21, 5]  # repeats, unsorted
    batch = kv_table(ids).to_batches()[0]
    owner = [sharding.shard_id(v) for v in sharding.values(batch).to_pylist()]
    parts = sharding.split(batch)
    assert {shard for shard, _ in parts} == set(owner)
    for shard, part in parts:
        expected = [i for i, o in zip(ids, owner, strict=True) if o == shard]
        assert part.column("id").to_pylist() == expected  # row order kept
        sharding.check(part, shard)
        for other in set(owner) - {shard}:
            with pytest.raises(la.errors.WrongShardError):
                sharding.check(part, other)
    with pytest.raises(la.errors.WrongShardError):
        sharding.check(batch, owner[0])
    assert sharding.value_of(owner[0]) == sharding.values(batch)[0].as_py()
    assert sharding.value_of("not-a-uuid") is None


@pytest.mark.asyncio
async def test_a_row_for_a_foreign_shard_is_refused_with_nothing_queued(table_uri: str) -> None:
    ds = await keyed_table(table_uri)
    sharding = await ds.sharding()
    rows = kv_table(range(40), value=1)
    parts = sharding.split(rows.combine_chunks().to_batches()[0])
    (mine, own_rows), (other, _) = parts[0], parts[1]
    async with ds.mem_wal_writer(mine) as writer:
        with pytest.raises(la.errors.WrongShardError) as caught:
            await writer.send(rows)  # in memory: all or nothing
        assert caught.value.shard_id != mine
        stats = writer.stats()
        assert (stats.queue_rows, stats.engine_puts) == (0, 0)
        with pytest.raises(la.errors.WrongShardError):
            writer.send_nowait(rows)
        with pytest.raises(la.errors.WrongShardError):
            await writer.delete({"id": rows.column("id").to_pylist()})
        # the writer stays usable, and its own rows go through
        assert (await writer.put(own_rows)).rows == own_rows.num_rows
    assert other != mine
    with pytest.raises(la.InvalidInputError, match="not a shard of this table"):
        async with ds.mem_wal_writer(str(uuid.uuid4())):
            pass
    # nothing was claimed for the refused id
    assert len(await (await la.open_dataset(table_uri)).lsm.snapshots()) == 1


@pytest.mark.asyncio
async def test_the_routing_writer_puts_every_row_in_its_shard(table_uri: str) -> None:
    ds = await keyed_table(table_uri, rows=20)
    async with ds.mem_wal_writer() as router:
        assert (await router.put(kv_table(range(10, 60), value=2))).rows == 50
        await router.delete({"id": [11, 12]})
        assert (await router.lsm.point_lookup(11)).num_rows == 0
        assert (await router.lsm.point_lookup(13)).column("value").to_pylist() == [2]
        assert (await router.lsm.point_lookup(5)).column("value").to_pylist() == [0]
        seen = (await router.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
        assert sorted(r["id"] for r in seen) == [i for i in range(60) if i not in (11, 12)]
        stats = router.stats()
        assert stats.rows == 50 and set(stats.writers) <= set((await ds.sharding()).shard_ids())
    expected = {i: 0 for i in range(10)} | {i: 2 for i in range(10, 60) if i not in (11, 12)}
    await assert_newest_once(table_uri, expected)


@pytest.mark.asyncio
async def test_two_writers_opened_on_two_shards_cannot_split_a_key(table_uri: str) -> None:
    ds = await keyed_table(table_uri)
    sharding = await ds.sharding()
    owner = sharding.split(kv_table([7]).to_batches()[0])[0][0]
    stranger = next(s for s in sharding.shard_ids() if s != owner)
    async with ds.mem_wal_writer(owner) as first:
        await first.put(kv_table([7], value=1))
    async with ds.mem_wal_writer(stranger) as second:
        with pytest.raises(la.errors.WrongShardError, match=owner):
            await second.put(kv_table([7], value=2))
    await assert_newest_once(table_uri, {7: 1})


# -- the four stories ----------------------------------------------------------------


def test_two_cli_ingests_with_overlapping_keys_keep_the_newest(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(KV_SCHEMA.empty_table(), uri, schema=KV_SCHEMA)
    assert runner.invoke(app, ["init-wal", uri]).exit_code == 0
    rows = tmp_path / "rows.ndjson"
    rows.write_text("".join(row_json(i, 1).decode() + "\n" for i in range(100)))
    fixes = "".join(row_json(i, 2).decode() + "\n" for i in range(0, 100, 10))
    first = runner.invoke(app, ["ingest", str(rows), uri])
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, ["ingest", "-", uri], input=fixes)
    assert second.exit_code == 0, second.output
    assert "every shard by key" in second.output
    checked = runner.invoke(app, ["check", uri])
    assert checked.exit_code == 0, checked.output
    assert "0 key(s) in more than one shard" in checked.output
    expected = {i: 2 if i % 10 == 0 else 1 for i in range(100)}
    anyio.run(assert_newest_once, uri, expected)


@pytest.mark.asyncio
async def test_a_redis_consumer_dies_before_its_acks_and_another_claims_them(
    table_uri: str,
) -> None:
    broker_or_skip("Redis", 6379)
    ds = await keyed_table(table_uri)
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
    key = f"lance_async:test:{uuid.uuid4().hex}"
    try:
        for i in range(60):
            await client.xadd(key, {"data": row_json(i, 1)})
        # consumer A writes everything durably, acks 20 entries, then dies
        with anyio.CancelScope() as scope:
            feed_a = await RedisStreamFeed.connect(stream=key, group="g", consumer="a")
            crashing = CrashBeforeAck(feed_a, allow=20, scope=scope)
            async with ds.mem_wal_writer() as router_a:
                await ingest(crashing, router_a, max_batch=10)
        await feed_a.aclose()
        assert len(crashing.acked) == 20
        for i in range(0, 60, 3):  # newer values arrive meanwhile
            await client.xadd(key, {"data": row_json(i, 2)})
        # consumer B (another process would do the same) claims A's entries
        ds_b = await la.open_dataset(table_uri)
        feed_b = await RedisStreamFeed.connect(
            stream=key, group="g", consumer="b", min_idle_time=0.05
        )
        await anyio.sleep(0.1)
        async with feed_b, ds_b.mem_wal_writer() as router_b:
            stats = await ingest(feed_b, router_b, max_batch=10, idle_timeout=1.0)
        assert stats.messages == 40 + 20  # A's unacked entries, then the newer ones
    finally:
        await client.delete(key)
        await client.aclose()
    await assert_newest_once(table_uri, {i: 2 if i % 3 == 0 else 1 for i in range(60)})


@pytest.mark.asyncio
async def test_a_kafka_partition_moves_and_its_records_land_in_the_same_shards(
    table_uri: str, kafka_bootstrap: str
) -> None:
    from lance_async.feeds import KafkaFeed, KafkaProducer

    ds = await keyed_table(table_uri)
    topic, group = unique_name("moves"), unique_name("g")
    await create_topic(kafka_bootstrap, topic, partitions=2)
    async with KafkaProducer({"bootstrap.servers": kafka_bootstrap}) as producer:
        for i in range(40):
            await producer.send_and_wait(topic, row_json(i, 1), partition=i % 2)
        for i in range(0, 40, 4):
            await producer.send_and_wait(topic, row_json(i, 2), partition=i % 2)
    fast = {setting_name(k): v for k, v in FAST_GROUP.items()}

    # the first member writes every record durably and commits nothing: it dies
    feed = await KafkaFeed.connect(kafka_bootstrap, [topic], group, options=fast)
    try:
        async with ds.mem_wal_writer() as router:
            got = 0
            with anyio.fail_after(30):
                while got < 50:
                    for message in await feed.fetch(100, 0.5):
                        await router.put([json.loads(message.payload)], schema=KV_SCHEMA)
                        got += 1
    finally:
        await feed.aclose()  # nothing acked, no commit: its partitions are redelivered
    # the partitions move to a second member, in another writer session
    feed2 = await KafkaFeed.connect(kafka_bootstrap, [topic], group, options=fast)
    async with feed2:
        ds2 = await la.open_dataset(table_uri)
        async with ds2.mem_wal_writer() as router2:
            stop = anyio.Event()
            stats = await ingest(
                feed2,
                router2,
                max_batch=100,
                stop=stop,
                on_progress=lambda s: stop.set() if s.messages >= 50 else None,
            )
        assert stats.messages == 50
    await assert_newest_once(table_uri, {i: 2 if i % 4 == 0 else 1 for i in range(40)})


# -- one shard, one writer --------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_newer_writer_fences_the_older_one(table_uri: str) -> None:
    ds = await keyed_table(table_uri)
    sharding = await ds.sharding()
    shard, rows = sharding.split(kv_table(range(50), value=1).to_batches()[0])[0]
    committed: list[int] = []
    async with ds.mem_wal_writer(shard) as old:
        acked = await old.put(rows.slice(0, 5))
        assert acked.rows == 5
        other = await la.open_dataset(table_uri)
        async with other.mem_wal_writer(shard) as new:  # claims the next epoch
            with pytest.raises(la.errors.FencedError) as caught:
                await old.put(rows.slice(5, 5))
            assert caught.value.shard_id == shard
            assert old.state is la.WriterState.FAILED
            with pytest.raises(la.errors.FencedError):
                await old.send(rows.slice(10, 5))
            # a feed on the fenced writer stops: nothing more is acknowledged
            feed = IterableFeed(
                [row_json(i) for i in rows.column("id").to_pylist()[10:]],
                on_ack=committed.append,
            )
            with pytest.raises(la.errors.FencedError):
                await ingest(feed, old, max_batch=5)
            assert committed == []
            # the new owner has every row acked before the fence, nothing after it
            seen = await new.lsm.scan(columns=["id"]).to_table()
            assert sorted(seen.column("id").to_pylist()) == rows.column("id").to_pylist()[:5]
        assert issubclass(la.errors.FencedError, la.WriterFailedError)


@pytest.mark.asyncio
async def test_check_finds_keys_split_across_manual_shards(table_uri: str) -> None:
    ds = await keyed_table(table_uri, manual_shards=True)
    for value in (1, 2):
        async with ds.mem_wal_writer(str(uuid.uuid4())) as writer:  # two shards, key 3 in both
            await writer.put(kv_table([3, 4 + value], value=value))
    report = await ds.check_shards()
    assert (report.split_keys, report.misplaced_keys, report.sharding) == (1, 0, "manual")
    assert report.examples[0]["key"] == 3 and len(report.examples[0]["shards"]) == 2
    assert not report.ok


@pytest.mark.asyncio
async def test_check_finds_rows_written_past_lance_async_into_the_wrong_shard(
    table_uri: str,
) -> None:
    ds = await keyed_table(table_uri)
    sharding = await ds.sharding()
    owner = sharding.split(kv_table([9]).to_batches()[0])[0][0]
    stranger = next(s for s in sharding.shard_ids() if s != owner)

    def put_directly() -> None:  # pylance itself checks nothing
        with lance.dataset(table_uri).mem_wal_writer(stranger) as writer:
            writer.put(pa.table(kv_table([9], value=5)))

    await anyio.to_thread.run_sync(put_directly)
    report = await ds.check_shards()
    assert (report.split_keys, report.misplaced_keys) == (0, 1)
    assert report.examples[0]["expected"] == owner
    result = await anyio.to_thread.run_sync(lambda: runner.invoke(app, ["check", table_uri]))
    assert result.exit_code == 1 and "1 in the wrong shard" in result.output
