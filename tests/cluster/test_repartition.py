"""Repartitioning through the broker: an unaligned feed republished by bucket, then ingested."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anyio
import pytest
import redis.asyncio
from typer.testing import CliRunner

import lance_async as la
from lance_async.cli import app
from lance_async.cluster import Partitioner, RedisLeaseTable, RedisPartitions, Worker

from ..conftest import broker_or_skip
from ..feeds.support import stream_entries
from ..helpers import KV_SCHEMA, eventually

runner = CliRunner()
URL = "redis://127.0.0.1:6379"


def test_an_unaligned_stream_is_repartitioned_then_ingested_by_a_worker(tmp_path: Path) -> None:
    broker_or_skip("Redis", 6379)
    uri = str(tmp_path / "t.lance")
    source, target = f"src-{uuid.uuid4().hex[:8]}", f"dst-{uuid.uuid4().hex[:8]}"
    keys, versions = 50, 3

    async def setup() -> None:
        ds = await la.write_dataset(KV_SCHEMA.empty_table(), uri, schema=KV_SCHEMA)
        await ds.initialize_mem_wal(num_buckets=3, bucket_column="id")
        client = redis.asyncio.Redis.from_url(URL)
        for v in range(versions):  # one stream of every key: not partitioned like the table
            for k in range(keys):
                await client.xadd(source, {"data": json.dumps({"id": k, "value": v, "name": "x"})})
        await client.aclose()

    async def work() -> None:
        client = redis.asyncio.Redis.from_url(URL)
        ds = await la.open_dataset(uri)
        partitioner = await Partitioner.for_dataset(ds)
        for p in range(3):  # every row of target partition p is of bucket p
            entries = stream_entries(await client.xrange(f"{target}:{p}"))
            ids = [json.loads(line)["id"] for _, e in entries for line in e[b"data"].splitlines()]
            assert set(partitioner.partition_of_rows([{"id": i} for i in ids])) <= {p}
        worker = Worker(
            ds, RedisPartitions(client, target, "g", 3), RedisLeaseTable(client, target, "w1", 2.0)
        )

        async def done() -> bool:
            for p in range(3):
                groups = await client.xinfo_groups(f"{target}:{p}")
                last = (await client.xinfo_stream(f"{target}:{p}"))["last-generated-id"]
                if not groups or groups[0]["pending"] or groups[0]["last-delivered-id"] != last:
                    return False
            return True

        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await eventually(done, 30, "the worker to consume the target")
            worker.stop()
        table = (await ds.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
        assert sorted(r["id"] for r in table) == list(range(keys))
        assert {r["value"] for r in table} == {versions - 1}
        for key in [source, *(f"{target}:{p}" for p in range(3))]:
            await client.delete(key)
        async for key in client.scan_iter(match=f"{target}:lease*"):
            await client.delete(key)
        await client.aclose()

    anyio.run(setup)
    result = runner.invoke(
        app,
        ["repartition", f"{URL}/{source}?group=rp", f"{URL}/{target}", uri, "--idle-timeout", "1"],
    )
    assert (result.exit_code == 1 and "not json" not in result.output) or result.exit_code == 0
    if result.exit_code:  # no dead-letter hook on the command: the bad message stops it
        assert "bad input" in result.output, result.output
    anyio.run(work)


@pytest.mark.asyncio
async def test_a_target_with_other_partitions_is_refused(table_uri: str) -> None:
    from lance_async.cluster import RedisPublisher
    from lance_async.cluster.repartition import RepartitionWriter

    ds = await la.write_dataset(KV_SCHEMA.empty_table(), table_uri, schema=KV_SCHEMA)
    await ds.initialize_mem_wal()  # 4 buckets
    partitioner = await Partitioner.for_dataset(ds)
    with pytest.raises(ValueError, match="4 buckets"):
        RepartitionWriter(RedisPublisher(None, "k", 3), partitioner)
