"""Worker processes sharing one partitioned feed: kills, restarts, pauses (real brokers).

Each test runs ``lance-async worker`` as separate processes against one table
and a NATS or Redis feed of 4 partitions, publishes versioned updates (each
key's value is an increasing version), and checks at the end that every key
holds its highest version exactly once: in the LSM view, in point lookups,
after ``lance-async check``, and after compaction.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

import lance_async as la
from lance_async.cluster import NatsPartitions, NatsPublisher, Partitioner, RedisPublisher

from ..conftest import broker_or_skip
from ..helpers import KV_SCHEMA, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PARTITIONS = 4
KEYS = 120
TTL = 2.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the brokers' clients run on asyncio only


@dataclass
class Feed:
    """A partitioned feed on one broker: the workers' URL, a publisher, a drain check."""

    kind: str
    url: str
    group: str
    publisher: Any
    client: Any
    name: str

    async def drained(self) -> bool:
        """Every message published so far was acknowledged by the group."""
        if self.kind == "redis":
            for p in range(PARTITIONS):
                key = f"{self.name}:{p}"
                last = (await self.client.xinfo_stream(key))["last-generated-id"]
                groups = await self.client.xinfo_groups(key)
                group = next((g for g in groups if g["name"] == self.group.encode()), None)
                if group is None or group["pending"] or group["last-delivered-id"] != last:
                    return False
            return True
        js = self.client.jetstream()
        import nats.js.errors

        for p in range(PARTITIONS):
            try:
                info = await js.consumer_info(self.name, f"{self.group}-p{p}")
            except nats.js.errors.NotFoundError:
                return False
            if info.num_pending or info.num_ack_pending:
                return False
        return True


@pytest.fixture(params=["redis", "nats"])
async def feed(request: pytest.FixtureRequest) -> AsyncIterator[Feed]:
    name = f"lance-async-test-{uuid.uuid4().hex[:10]}"
    group = f"g{uuid.uuid4().hex[:8]}"
    if request.param == "redis":
        broker_or_skip("Redis", 6379)
        import redis.asyncio

        client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
        yield Feed(
            "redis",
            f"redis://127.0.0.1:6379/{name}",
            group,
            RedisPublisher(client, name, PARTITIONS),
            client,
            name,
        )
        for p in range(PARTITIONS):
            await client.delete(f"{name}:{p}")
        async for key in client.scan_iter(match=f"lance-async:leases:{group}:*"):
            await client.delete(key)
        await client.aclose()
    else:
        broker_or_skip("NATS", 4222)
        import nats

        nc = await nats.connect("nats://127.0.0.1:4222")
        await NatsPartitions(nc, name, name, group, PARTITIONS).ensure_stream()
        yield Feed(
            "nats",
            f"nats://127.0.0.1:4222/{name}/{name}",
            group,
            NatsPublisher(nc, name, PARTITIONS),
            nc,
            name,
        )
        js = nc.jetstream()
        await js.delete_stream(name)
        try:
            await js.delete_key_value(f"lance-async-leases-{group}-{name}")
        except Exception:  # the bucket may not exist
            pass
        await nc.close()


@dataclass
class Workers:
    """``lance-async worker`` processes of one group."""

    feed: Feed
    table: str
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: int = 0

    def start(self, member: str) -> None:
        self.started += 1
        env = {**os.environ, "LANCE_LOG": "critical"}
        with open(self.logs / f"{member}-{self.started}.log", "wb") as log:
            self.procs[member] = self._spawn(member, log, env)

    def _spawn(self, member: str, log: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lance_async",
                "worker",
                self.feed.url,
                self.table,
                "--group",
                self.feed.group,
                "--member",
                member,
                "--lease-ttl",
                str(TTL),
                "--ack-wait",
                "5",
                "--stats-interval",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def kill(self, member: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[member]
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait()

    async def stop_all(self) -> dict[str, int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {}
        for member, proc in self.procs.items():
            codes[member] = await anyio.to_thread.run_sync(lambda p=proc: p.wait(60))
        return codes

    def output(self, member: str) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.logs.glob(f"{member}-*.log"))
        )

    def kill_everything(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def make_table(uri: str) -> Partitioner:
    ds = await la.write_dataset(KV_SCHEMA.empty_table(), uri, schema=KV_SCHEMA)
    await ds.initialize_mem_wal(num_buckets=PARTITIONS, bucket_column="id")
    return await Partitioner.for_dataset(ds)


async def publish_version(feed: Feed, partitioner: Partitioner, version: int) -> None:
    rows = [{"id": k, "value": version, "name": f"v{version}"} for k in range(KEYS)]
    for row, p in zip(rows, partitioner.partition_of_rows(rows), strict=True):
        await feed.publisher.publish(p, json.dumps(row).encode())


async def assert_final(uri: str, version: int) -> None:
    ds = await la.open_dataset(uri)
    table = (await ds.lsm_scan(columns=["id", "value"]).to_table()).to_pylist()
    ids = [r["id"] for r in table]
    assert len(ids) == len(set(ids)), "a key appears twice"
    assert sorted(ids) == list(range(KEYS))
    behind = {r["id"]: r["value"] for r in table if r["value"] != version}
    assert not behind, f"keys not at version {version}: {dict(list(behind.items())[:10])}"
    for k in (0, KEYS // 2, KEYS - 1):
        got = await ds.lsm_point_lookup(k, columns=["value"])
        assert got.column("value").to_pylist() == [version]
    assert (await ds.check_shards()).ok
    await ds.compact_mem_wal()
    base = (await ds.to_table(columns=["id", "value"])).to_pylist()
    assert sorted(r["id"] for r in base) == list(range(KEYS))
    assert {r["value"] for r in base} == {version}


async def test_three_workers_killed_and_restarted_lose_nothing(feed: Feed, tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    partitioner = await make_table(uri)
    workers = Workers(feed, uri, tmp_path)
    members = ["w1", "w2", "w3"]
    versions = 8
    rng = random.Random(13)
    kills = 0
    try:
        for m in members:
            workers.start(m)
        async with anyio.create_task_group() as tg:

            async def chaos() -> None:
                nonlocal kills
                while True:
                    await anyio.sleep(rng.uniform(0.8, 2.0))
                    victim = rng.choice(members)
                    workers.kill(victim)  # kill -9 at a random point
                    kills += 1
                    await anyio.sleep(rng.uniform(0.1, 0.6))
                    workers.start(victim)

            tg.start_soon(chaos)
            for v in range(versions - 1):
                await publish_version(feed, partitioner, v)
                await anyio.sleep(1.5)
            await eventually(lambda: kills >= 10, 60, "ten kills")
            tg.cancel_scope.cancel()
        for m in members:  # a victim killed as the chaos ended comes back
            if workers.procs[m].poll() is not None:
                workers.start(m)
        # the last victim stays dead: the two survivors take its partitions over
        workers.kill("w3")
        await publish_version(feed, partitioner, versions - 1)
        await eventually(feed.drained, 90, "the feed to be consumed and acknowledged")
        codes = await workers.stop_all()
        assert codes["w1"] == codes["w2"] == 0, workers.output("w1")[-2000:]
    finally:
        workers.kill_everything()
    await assert_final(uri, versions - 1)


async def test_a_paused_worker_is_fenced_and_acknowledges_nothing_after(
    feed: Feed, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t.lance")
    partitioner = await make_table(uri)
    workers = Workers(feed, uri, tmp_path)
    try:
        workers.start("a")
        await publish_version(feed, partitioner, 0)
        await eventually(feed.drained, 60, "a to consume version 0")
        await anyio.sleep(1.2)  # a stats line after the last ack
        before = _last_messages(workers.output("a"))
        assert before == KEYS
        workers.kill("a", signal.SIGSTOP)  # paused past its leases
        await publish_version(feed, partitioner, 1)
        workers.start("b")
        await eventually(feed.drained, 60, "b to take over and consume version 1")
        workers.kill("a", signal.SIGCONT)
        await publish_version(feed, partitioner, 2)  # a must not fetch nor ack any of it
        await eventually(lambda: "lost 4" in workers.output("a"), 30, "a to see it lost all")
        await eventually(feed.drained, 60, "b to consume version 2")
        codes = await workers.stop_all()
        assert codes == {"a": 0, "b": 0}
        out_a = workers.output("a")
        assert _last_messages(out_a) == before, out_a[-2000:]  # nothing acked after the fence
        assert _last_messages(workers.output("b")) == 2 * KEYS
    finally:
        workers.kill_everything()
    await assert_final(uri, 2)


def _last_messages(output: str) -> int:
    """The ``messages`` figure of a worker's last stats line."""
    lines = [line for line in output.splitlines() if " messages, " in line]
    assert lines, output[-2000:]
    figure = lines[-1].split(" messages, ")[0].rsplit(" ", 1)[-1]
    return int(figure.replace(",", ""))
