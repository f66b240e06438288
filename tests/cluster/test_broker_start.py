"""A Redis or NATS worker started before its broker waits for it, then ingests.

A worker takes the table's claim in its broker before anything else
(``cluster/claim.py``). Started while the broker restarts (the chaos tests
kill and restart brokers and workers), the claim's first request found
nobody and the command exited 1; it now tries again with a back-off, as a
Kafka worker does (``test_kafka_start.py``), and SIGTERM still stops it at
once. Real private brokers (``brokers.py``), started only after the worker.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import lance_async as la
from lance_async.cluster import NatsPartitions, NatsPublisher, Partitioner, RedisPublisher

from ..helpers import KV_SCHEMA, eventually, stderr_until
from .brokers import PrivateBroker, nats_server, redis_server

pytestmark = [pytest.mark.broker, pytest.mark.asyncio]

PARTITIONS = 2
KEYS = 20


async def _publisher(kind: str, broker: PrivateBroker) -> tuple[Any, Any]:
    if kind == "redis":
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{broker.port}")
        return RedisPublisher(client, "feed", PARTITIONS), client.aclose
    import nats

    nc = await nats.connect(f"nats://127.0.0.1:{broker.port}")
    await NatsPartitions(nc, "FEED", "feed", "g", PARTITIONS).ensure_stream()
    return NatsPublisher(nc, "feed", PARTITIONS), nc.close


@pytest.mark.parametrize("kind", ["redis", "nats"])
async def test_a_worker_started_before_its_broker_waits_then_ingests(
    kind: str, tmp_path: Path
) -> None:
    broker = (redis_server if kind == "redis" else nats_server)(tmp_path)
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(num_buckets=PARTITIONS, bucket_column="id")
    partitioner = await Partitioner.for_dataset(ds)
    path = "feed" if kind == "redis" else "FEED/feed"
    command = [sys.executable, "-m", "lance_async", "worker"]
    command += [f"{kind}://127.0.0.1:{broker.port}/{path}", ds.uri]
    command += ["--group", "g", "--member", "m", "--lease-ttl", "2", "--stats-interval", "0"]
    try:
        async with await anyio.open_process(command) as proc:
            # until the worker says it will try again
            err = await stderr_until(proc, "no broker answers")
            assert "no broker answers" in err and proc.returncode is None, err
            await anyio.to_thread.run_sync(broker.start)
            publisher, close = await _publisher(kind, broker)
            try:
                rows = [{"id": k, "value": 1, "name": "v1"} for k in range(KEYS)]
                for row, p in zip(rows, partitioner.partition_of_rows(rows), strict=True):
                    await publisher.publish(p, json.dumps(row).encode())
            finally:
                await close()

            async def ingested() -> bool:
                table = await (await la.open_dataset(ds.uri)).lsm.scan(columns=["id"]).to_table()
                return sorted(table.column("id").to_pylist()) == list(range(KEYS))

            await eventually(ingested, 120, "the worker to ingest every row once its broker is up")
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(60):
                code = await proc.wait()
            assert proc.stderr is not None  # open_process pipes it by default
            async for chunk in proc.stderr:
                err += chunk.decode()
        assert code == 0, err
        assert "error:" not in err, err
    finally:
        broker.stop()
