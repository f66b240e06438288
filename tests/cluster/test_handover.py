"""A SIGTERM hands partitions over at once: the next owner does not wait out the lease (issue 24).

Two ``lance-async worker`` processes with leases of two minutes share a
4-partition Redis feed. One is stopped with SIGTERM: it leaves the group
and releases each partition as it is drained, and says so, so the other
takes them over and acknowledges their messages -- which would take the
whole lease TTL if it had to wait for the leaver's keys to expire (the
test's own timeout, 60 s, is half of it). How fast it is: ``python -m
bench.handover``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

import lance_async as la
from lance_async.cluster import Partitioner, RedisPublisher

from ..conftest import broker_or_skip
from ..helpers import KV_SCHEMA, eventually

pytestmark = pytest.mark.broker

TTL = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def stats(port: int) -> dict[str, Any]:
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        await stream.send(b"GET / HTTP/1.0\r\n\r\n")
        data = b""
        try:
            while True:
                data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
    result: dict[str, Any] = json.loads(data.split(b"\r\n\r\n", 1)[1])
    return result


@pytest.mark.asyncio
async def test_a_sigterm_hands_partitions_over_without_waiting_for_the_lease(
    tmp_path: Path,
) -> None:
    broker_or_skip("Redis", 6379)
    import redis.asyncio

    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(KV_SCHEMA.empty_table(), uri, schema=KV_SCHEMA)
    await ds.initialize_mem_wal(num_buckets=4, bucket_column="id")
    partitioner = await Partitioner.for_dataset(ds)
    rows = [{"id": k, "value": 0, "name": "x"} for k in range(40)]
    parts = partitioner.partition_of_rows(rows)
    key, group = f"handover-{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:6]}"
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
    publisher = RedisPublisher(client, key, 4)
    ports = {m: free_port() for m in ("a", "b")}
    env = {**os.environ, "LANCE_LOG": "critical"}
    procs = {
        m: subprocess.Popen(  # noqa: ASYNC220 (stopped below)
            [
                *(sys.executable, "-m", "lance_async", "worker", f"redis://127.0.0.1:6379/{key}"),
                *(uri, "--group", group, "--member", m, "--lease-ttl", str(TTL)),
                *("--stats-interval", "0", "--health-port", str(ports[m])),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for m in ("a", "b")
    }
    version = 0

    async def publish() -> None:
        nonlocal version
        version += 1
        for row, p in zip(rows, parts, strict=True):
            await publisher.publish(p, json.dumps({**row, "value": version}).encode())

    async def split() -> bool:
        await publish()
        try:
            a, b = await stats(ports["a"]), await stats(ports["b"])
        except OSError:
            return False
        return len(a["partitions"]) == len(b["partitions"]) == 2

    try:
        with anyio.fail_after(TTL / 2):  # below the lease: an expiry cannot pass this test
            await eventually(split, TTL, "the workers to share the partitions", 0.2)
            taken = set((await stats(ports["a"]))["partitions"])
            procs["a"].send_signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(procs["a"].wait) == 0

            async def b_took_over() -> bool:
                await publish()
                b = await stats(ports["b"])
                done = b["owned_messages"]
                return all(done.get(str(p), 0) > 0 for p in taken)

            await eventually(b_took_over, TTL, "b to acknowledge a's partitions", 0.2)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        for p in range(4):
            await client.delete(f"{key}:{p}")
        async for k in client.scan_iter(match=f"lance-async:leases:{group}:*"):
            await client.delete(k)
        await client.aclose()
    assert procs["b"].returncode == 0
