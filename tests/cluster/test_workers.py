"""Worker processes sharing one partitioned feed: kills, restarts, pauses (real brokers).

Each test runs ``lance-async worker`` as separate processes against one table
(local, or on a moto S3 server with ``storage_options`` only) and a Redis,
NATS or Kafka feed partitioned like it, publishes versioned updates (each
key's value is an increasing version), and checks at the end that every key
holds its highest version exactly once: in the LSM view, in point lookups,
after ``lance-async check``, and after compaction.
"""

from __future__ import annotations

import json
import os
import random
import re
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
import pytest_asyncio

import lance_async as la
from lance_async.cluster import (
    KafkaPublisher,
    NatsPartitions,
    NatsPublisher,
    Partitioner,
    RedisPublisher,
)

from ..conftest import broker_or_skip
from ..helpers import KV_SCHEMA, eventually
from ..services import FAST_GROUP, GroupOffsets, create_topic

pytestmark = pytest.mark.slow

KEYS = 120
TTL = 2.0


@dataclass
class Feed:
    """A partitioned feed on one broker: the workers' URL, a publisher, a drain check."""

    kind: str
    url: str
    group: str
    publisher: Any
    client: Any
    name: str
    partitions: int
    published: dict[int, int] = field(default_factory=dict)

    async def publish(self, partition: int, payload: bytes) -> None:
        await self.publisher.publish(partition, payload)
        self.published[partition] = self.published.get(partition, 0) + 1

    async def drained(self) -> bool:
        """Every message published so far was acknowledged (committed) by the group."""
        if self.kind == "redis":
            for p in range(self.partitions):
                key = f"{self.name}:{p}"
                last = (await self.client.xinfo_stream(key))["last-generated-id"]
                groups = await self.client.xinfo_groups(key)
                group = next((g for g in groups if g["name"] == self.group.encode()), None)
                if group is None or group["pending"] or group["last-delivered-id"] != last:
                    return False
            return True
        if self.kind == "kafka":  # committed offsets (Tansu's end offsets are unreliable)
            committed = await self.client.committed(self.partitions)
            return all(committed[p] == count for p, count in self.published.items())
        js = self.client.jetstream()
        import nats.js.errors

        for p in range(self.partitions):
            try:
                info = await js.consumer_info(self.name, f"{self.group}-p{p}")
            except nats.js.errors.NotFoundError:
                return False
            except TypeError:  # nats-py cannot parse the reply while a take-over
                return False  # deletes and recreates the durable: not drained yet
            if info.num_pending or info.num_ack_pending:
                return False
        return True


async def open_feed(kind: str, partitions: int, request: pytest.FixtureRequest) -> Feed:
    name = f"lance-async-test-{uuid.uuid4().hex[:10]}"
    group = f"g{uuid.uuid4().hex[:8]}"
    if kind == "redis":
        broker_or_skip("Redis", 6379)
        import redis.asyncio

        client: Any = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
        publisher: Any = RedisPublisher(client, name, partitions)
        url = f"redis://127.0.0.1:6379/{name}"
    elif kind == "nats":
        broker_or_skip("NATS", 4222)
        import nats

        client = await nats.connect("nats://127.0.0.1:4222")
        await NatsPartitions(client, name, name, group, partitions).ensure_stream()
        publisher = NatsPublisher(client, name, partitions)
        url = f"nats://127.0.0.1:4222/{name}/{name}"
    else:
        from lance_async.feeds import KafkaProducer

        bootstrap = request.getfixturevalue("kafka_bootstrap")
        await create_topic(bootstrap, name, partitions)
        producer = KafkaProducer({"bootstrap.servers": bootstrap})
        publisher = KafkaPublisher(producer, name, partitions, owns_producer=True)
        client = GroupOffsets(bootstrap, group, name)  # never joins the group
        fast = "&".join(f"{k}={v}" for k, v in FAST_GROUP.items())
        url = f"kafka://{bootstrap}/{name}?{fast}"
    return Feed(kind, url, group, publisher, client, name, partitions)


async def close_feed(feed: Feed) -> None:
    if feed.kind == "redis":
        for p in range(feed.partitions):
            await feed.client.delete(f"{feed.name}:{p}")
        async for key in feed.client.scan_iter(match=f"lance-async:leases:{feed.group}:*"):
            await feed.client.delete(key)
        await feed.client.aclose()
    elif feed.kind == "nats":
        js = feed.client.jetstream()
        await js.delete_stream(feed.name)
        try:
            await js.delete_key_value(f"lance-async-leases-{feed.group}-{feed.name}")
        except Exception:  # the bucket may not exist
            pass
        await feed.client.close()
    else:
        await feed.publisher.aclose()
        await feed.client.aclose()


@dataclass
class Setup:
    """A feed, and a table partitioned like it (local, or on the moto S3 server)."""

    feed: Feed
    uri: str
    storage_options: dict[str, str] | None

    @property
    def flags(self) -> list[str]:
        return [f"--storage-option={k}={v}" for k, v in (self.storage_options or {}).items()]

    async def table(self) -> Partitioner:
        ds = await la.write_dataset(
            KV_SCHEMA.empty_table(),
            self.uri,
            schema=KV_SCHEMA,
            storage_options=self.storage_options,
        )
        await ds.initialize_mem_wal(num_buckets=self.feed.partitions, bucket_column="id")
        return await Partitioner.for_dataset(ds)

    async def open(self) -> la.AsyncDataset:
        return await la.open_dataset(self.uri, storage_options=self.storage_options)


CASES = {
    "redis-local": ("redis", "local", 4),
    "nats-s3": ("nats", "s3", 4),
    "kafka-s3": ("kafka", "s3", 6),
}


async def make_setup(
    case: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Setup]:
    kind, storage, partitions = CASES[case]
    feed = await open_feed(kind, partitions, request)
    try:
        if storage == "s3":
            bucket = request.getfixturevalue("s3_bucket")
            yield Setup(feed, bucket.uri("t.lance"), bucket.storage_options)
        else:
            yield Setup(feed, str(tmp_path / "t.lance"), None)
    finally:
        await close_feed(feed)


# redis on local disk: tests/cluster/test_chaos.py
@pytest_asyncio.fixture(params=["nats-s3", "kafka-s3"])
async def chaos_setup(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Setup]:
    async for setup in make_setup(request.param, request, tmp_path):
        yield setup


@pytest_asyncio.fixture(params=["redis-local", "nats-s3"])
async def pause_setup(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Setup]:
    async for setup in make_setup(request.param, request, tmp_path):
        yield setup


@dataclass
class Workers:
    """``lance-async worker`` processes of one group."""

    setup: Setup
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    current: dict[str, Path] = field(default_factory=dict)
    started: int = 0
    extra: list[str] = field(default_factory=list)

    def start(self, member: str) -> None:
        self.started += 1
        env = {**os.environ, "LANCE_LOG": "critical"}
        self.current[member] = self.logs / f"{member}-{self.started}.log"
        with open(self.current[member], "wb") as log:
            self.procs[member] = self._spawn(member, log, env)

    def _spawn(self, member: str, log: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lance_async",
                "worker",
                self.setup.feed.url,
                self.setup.uri,
                *self.setup.flags,
                "--group",
                self.setup.feed.group,
                "--member",
                member,
                "--lease-ttl",
                str(TTL),
                "--ack-wait",
                "5",
                "--stats-interval",
                "1",
                *self.extra,
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
        """SIGTERM to every live worker once it is up (past the interpreter's start)."""

        def up() -> bool:
            return all(
                b"partitions in group" in self.current[m].read_bytes()
                for m, proc in self.procs.items()
                if proc.poll() is None
            )

        await eventually(up, 60, "every live worker to have started")
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {}
        for member, proc in self.procs.items():
            codes[member] = await anyio.to_thread.run_sync(proc.wait, 60)
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


async def publish_version(feed: Feed, partitioner: Partitioner, version: int) -> None:
    rows = [{"id": k, "value": version, "name": f"v{version}"} for k in range(KEYS)]
    for row, p in zip(rows, partitioner.partition_of_rows(rows), strict=True):
        await feed.publish(p, json.dumps(row).encode())


async def assert_final(setup: Setup, version: int) -> None:
    ds = await setup.open()
    table = (await ds.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
    ids = [r["id"] for r in table]
    assert len(ids) == len(set(ids)), "a key appears twice"
    assert sorted(ids) == list(range(KEYS))
    behind = {r["id"]: r["value"] for r in table if r["value"] != version}
    assert not behind, f"keys not at version {version}: {dict(list(behind.items())[:10])}"
    for k in (0, KEYS // 2, KEYS - 1):
        got = await ds.lsm.point_lookup(k, columns=["value"])
        assert got.column("value").to_pylist() == [version]
    assert (await ds.check_shards()).ok
    await ds.compact_mem_wal()
    base = (await ds.to_table(columns=["id", "value"])).to_pylist()
    assert sorted(r["id"] for r in base) == list(range(KEYS))
    assert {r["value"] for r in base} == {version}


@pytest.mark.asyncio
async def test_three_workers_killed_and_restarted_lose_nothing(
    chaos_setup: Setup, tmp_path: Path
) -> None:
    setup, feed = chaos_setup, chaos_setup.feed
    partitioner = await setup.table()
    workers = Workers(setup, tmp_path)
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
        codes = await workers.stop_all()  # SIGTERM: drained, committed, exit 0
        assert codes["w1"] == codes["w2"] == 0, workers.output("w1")[-2000:]
    finally:
        workers.kill_everything()
    await assert_final(setup, versions - 1)


@pytest.mark.asyncio
async def test_a_paused_worker_is_fenced_and_acknowledges_nothing_after(
    pause_setup: Setup, tmp_path: Path
) -> None:
    setup, feed = pause_setup, pause_setup.feed
    partitioner = await setup.table()
    workers = Workers(setup, tmp_path)
    try:
        workers.start("a")
        await publish_version(feed, partitioner, 0)
        await eventually(feed.drained, 60, "a to consume version 0")
        await anyio.sleep(1.2)  # a stats line after the last ack
        before = _last_messages(workers.output("a"))
        assert before == KEYS
        # leases a loaded machine let lapse before the pause count apart: what
        # a held at its last stats line must each be lost after the pause
        _, taken_before, lost_before = _stats_lines(workers.output("a"))[-1]
        held = _held_partitions(workers.output("a"))
        workers.kill("a", signal.SIGSTOP)  # paused past its leases
        await publish_version(feed, partitioner, 1)
        workers.start("b")
        await eventually(feed.drained, 60, "b to take over and consume version 1")
        workers.kill("a", signal.SIGCONT)
        # a must not ack anything on the leases it held: its next acks come
        # only after it saw every partition lost and took some back afresh
        # (the group's fair share gives a rejoining member its part again)
        await publish_version(feed, partitioner, 2)

        def lost_all() -> bool:  # "lost N" counts up; a later loss may skip a line
            counts = [int(n) for n in re.findall(r"lost (\d+)", workers.output("a"))]
            return max(counts, default=0) - lost_before >= held

        await eventually(lost_all, 60, "a to see it lost all")
        await eventually(feed.drained, 60, "version 2 to be consumed")
        codes = await workers.stop_all()
        assert codes == {"a": 0, "b": 0}
        out_a = workers.output("a")
        for messages, taken, gone in _stats_lines(out_a):
            if messages > before:  # acked after the pause: only on partitions taken again
                assert gone - lost_before >= held, out_a[-2000:]
                assert taken > taken_before, out_a[-2000:]
        acked_after = _last_messages(out_a) - before + _last_messages(workers.output("b"))
        assert acked_after >= 2 * KEYS
    finally:
        workers.kill_everything()
    await assert_final(setup, 2)


@pytest_asyncio.fixture
async def redis_setup(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Setup]:
    async for setup in make_setup("redis-local", request, tmp_path):
        yield setup


@pytest.mark.asyncio
async def test_a_worker_sets_bad_messages_aside_in_a_redis_stream_and_goes_on(
    redis_setup: Setup, tmp_path: Path
) -> None:
    setup, feed = redis_setup, redis_setup.feed
    partitioner = await setup.table()
    dead = f"{feed.name}:dead"
    workers = Workers(setup, tmp_path)
    workers.extra = ["--dead-letter", f"redis://127.0.0.1:6379/{dead}", "--max-bad", "2"]
    bad = b'{"id": 3, "nme": "typo"}'
    try:
        workers.start("a")
        await feed.publish(1, bad)
        await publish_version(feed, partitioner, 0)
        await eventually(feed.drained, 60, "the worker to consume everything")
        assert await workers.stop_all() == {"a": 0}
        letters = [fields for _, fields in await feed.client.xrange(dead)]
        # at least once: a lease that lapsed on a loaded machine between the
        # record and the ack sets the same entry aside again (same offset)
        assert letters and {fields[b"data"] for fields in letters} == {bad}
        assert len({fields[b"dead-letter-offset"] for fields in letters}) == 1
        fields = letters[0]
        assert b"nme" in fields[b"dead-letter-error"]
        assert json.loads(fields[b"dead-letter-offset"])  # the entry id it had
    finally:
        workers.kill_everything()
        await feed.client.delete(dead)
    await assert_final(setup, 0)


def _held_partitions(output: str) -> int:
    """How many partitions a worker's last stats line says it holds."""
    held = re.findall(r"partitions \[([^\]]*)\]", output)
    assert held, output[-2000:]
    return len([p for p in held[-1].split(",") if p.strip()])


def _stats_lines(output: str) -> list[tuple[int, int, int]]:
    """(messages, taken, lost) of each of a worker's stats lines."""
    out = []
    for line in output.splitlines():
        if " messages, " not in line or "; taken " not in line:
            continue
        messages = int(line.split(" messages, ")[0].rsplit(" ", 1)[-1].replace(",", ""))
        tail = line.split("; taken ", 1)[1]
        taken = int(tail.split(",")[0])
        lost = int(tail.rsplit("lost ", 1)[1].split()[0].rstrip(","))
        out.append((messages, taken, lost))
    return out


def _last_messages(output: str) -> int:
    """The ``messages`` figure of a worker's last stats line."""
    lines = [line for line in output.splitlines() if " messages, " in line]
    assert lines, output[-2000:]
    figure = lines[-1].split(" messages, ")[0].rsplit(" ", 1)[-1]
    return int(figure.replace(",", ""))
