"""Scale-out chaos: three worker processes, 20+ kill -9 and SIGSTOP events, a broker restart.

Issue 24. On a private Redis, NATS or Kafka (Tansu) broker (``brokers.py``:
these tests kill and restart it), three ``lance-async worker`` processes
ingest a 6-partition feed into one table while a producer publishes rounds
of versioned upserts and deletes (the ``lance-op: delete`` header), and a
chaos task kills workers with SIGKILL (restarting them a moment later) or
pauses them with SIGSTOP (for up to 1.5 lease TTLs, so some come back
fenced), and restarts the broker once half-way.

At the end, every key holds its newest version (or is gone, if its last
operation was a delete), nothing is pending, no worker exited by itself
(only the killed ones died; every one left exits 0 on SIGTERM), and the
backlog never stalled for long. A stall is the longest interval during
which messages were pending and the group acknowledged nothing, sampled
from the broker every 100 ms (Kafka: 500 ms, ``SAMPLE``), bounded in lease
TTLs (``STALL_TTLS``): what is checked is that a lost partition is taken over (as a dead holder's
lease runs out, plus a restarted worker's start on a loaded machine when no
other runs); a partition left owned with nothing consuming it, or a worker
that died of a fence, stalls for minutes. The figure itself is printed
(``CHAOS_TRACE=DIR`` also keeps what explains it: ``save_trace``); the
hand-over of one stopped worker is measured by ``bench/handover.py``
(SIGTERM 0.1 s, kill -9 1.1-1.4 TTL).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
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
from lance_async.cluster.worker import DELETE

from ..helpers import KV_SCHEMA
from ..services import GroupOffsets, create_bucket, create_topic
from .brokers import PrivateBroker, nats_server, redis_server, tansu_server

# a hang-stop past both windows (120 s, 240 s) and the chaos itself, beside CPU hogs
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PARTITIONS = 6
KEYS = 180
TTL = {"redis": 4.0, "nats": 5.0, "kafka": 3.0}
"""Lease TTL of the Redis and NATS workers, and the Kafka group's session
and rebalance timeouts (seconds): the unit of the stall bound."""
GAP = {"redis": (0.8, 1.6), "nats": (0.8, 1.6), "kafka": (2.2, 3.0)}
"""Seconds between chaos events."""
STALL_TTLS = {"redis": 4, "nats": 4, "kafka": 5}
"""The stall bound, in TTLs (the issue's target is 2): a guard against a
partition nobody consumes (the bug it catches stalled for minutes), set
from the longest stalls measured on the loaded machine.

The stall is the group's: no partition acknowledged anything. So once any
worker consumes, the backlog is not stalled, and what the longest stall
measures is a window in which no worker consumed at all -- which this chaos
makes: its victims are chosen among the processes alive and not paused,
including restarted ones still starting (killed again before they took
anything), and a paused one comes back only after up to 1.5 TTLs. Such a
window is counted in full (the sampler does not know, and is not told, why
nothing moved). In 17 of 22 runs traced (``CHAOS_TRACE``), over 80 % of the
longest stall (41-99 %) had no worker alive, unpaused and past its
start-up; the longest stretch with one was 0.2-0.6 TTL, once 1.6 (it waits
for a killed worker's leases -- one TTL, then the round that starts as they
run out -- and for its first batches: a worker that had just taken all six
partitions spent 8 s of its share of the CPU on them). What bounds it is
a restarted worker's start on the loaded machine: about 1.1 s of CPU to
its first partition, 0.7-0.95 s of it imports (1.7 s before this round:
now pandas and the OpenTelemetry SDK are skipped and the bytecode cached),
3-10 s at load averages of 13-22 on two cores.

Measured (2026-12-03, load average 13-22, one Redis and one NATS run at a
time side by side): Redis 3.3, 7.3, 7.4, 3.7, 4.2 s in five runs in a row
(0.82-1.84 TTLs; before this round 9.1-32.7 s); NATS 12.7, 14.6, 11.8, 6.9,
6.6 s (1.32-2.92 TTLs; before, 21.0 s), where a start also waits for more
broker round trips (the table claim and the lease bucket in JetStream,
each round's reads) and a round caught by a pause fails on its timeout and
is tried again. Beside ``bench.handover`` as well (load 20-27): Redis 7.6,
13.6, 8.1 s (1.91, 3.39, 2.02 TTLs: the worker that came up took its
partitions one by one, 0.7-2.9 s each, and acknowledged nothing for 6 s
after taking the first), NATS 20.7, 18.6 s (4.13, 3.72 TTLs: 12.5 s to import,
then a first round whose request timed out). So 2 TTLs held five runs in a
row on Redis, but not at the heavier load: the bound stays at 4.

Kafka: the workers run librdkafka with the ``cooperative-sticky`` assignor
(issue 40), so a membership change moves only the partitions that change
hands and the other members go on acknowledging through it; what is left
is a window in which no member consumes (the broker restart, all three
killed or paused) or only the dead ones had a backlog: Tansu notices a dead
member only after 1.5 sessions (it ignores LeaveGroup), and a member
restarted under the same name joins as a new one. Sessions are 3 s and a
rebalance waits 6 s for members to rejoin. Measured (2026-12-06, one run at
a time, load average 2-12 from other sessions): longest stalls 3.85, 4.19,
7.35, 5.29 s (1.28, 1.40, 2.45, 1.76 sessions; the run at 2.45: the two
partitions of w2, killed at 43.5 s, restarted, killed again at 51.3 s and
54.6 s before it acknowledged anything, waited out two session expiries
while the others had drained theirs); with aiokafka's eager protocol, where
every change stopped every member, 2.85-4.31 sessions on an idle machine
and 8.1-10.0 s under load, against a bound of 20. The issue's target is 2
sessions; the bound is 4, as for Redis and NATS, since a restarted member
killed again before it acknowledges costs one more session expiry. On
2026-12-07 (load average 7-10): 3.74, 3.65, 3.36, 12.15, 2.86, 2.34 s
(1.25, 1.22, 1.12, 4.05, 0.95, 0.78 sessions); the 4.05 spans w1 killed
(21.8 s) and, restarted, paused (24.7 s), the broker restart (27.7 s) and
w3 killed (30.3 s) while w2's partitions had drained: each waits out
Tansu's 1.5-session detection of a dead member, so Kafka's bound is 5. A
partition left owned with nothing consuming it stalls to the end of the
test (a commit refused in a rebalance and never sent again did, 230 s:
fixed in the same round)."""
SAMPLE = {"redis": 0.1, "nats": 0.1, "kafka": 0.5}
"""Seconds between two samples of the group's positions. Kafka's is coarser:
each sample is an OffsetFetch per partition, which Tansu answers from moto
(six requests; at 0.1 s they were half of moto's load); its bound, 4
sessions (12 s), is 24 samples."""
EVENTS = 21
"""Chaos events: 20 kills and pauses, and the broker restart."""
MEMBERS = ("w1", "w2", "w3")


@dataclass
class Bus:
    """A partitioned feed on a private broker: publishing, and what the group acknowledged."""

    kind: str
    broker: PrivateBroker
    url: str
    group: str
    name: str
    publisher: Any = None
    client: Any = None
    producer: Any = None  # Kafka: the publisher's producer (a round: a batch per partition)

    async def connect(self) -> None:
        port = self.broker.port
        if self.kind == "redis":
            import redis.asyncio

            self.client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{port}")
            self.publisher = RedisPublisher(self.client, self.name, PARTITIONS)
        elif self.kind == "nats":
            import nats

            self.client = await nats.connect(
                f"nats://127.0.0.1:{port}", max_reconnect_attempts=-1, reconnect_time_wait=0.2
            )
            await NatsPartitions(
                self.client, self.name, self.name, self.group, PARTITIONS
            ).ensure_stream()
            self.publisher = NatsPublisher(self.client, self.name, PARTITIONS)
        else:
            from lance_async.feeds import KafkaProducer

            bootstrap = f"127.0.0.1:{port}"
            await create_topic(bootstrap, self.name, PARTITIONS)
            producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
            self.producer = producer
            self.publisher = KafkaPublisher(producer, self.name, PARTITIONS, owns_producer=True)
            self.client = GroupOffsets(bootstrap, self.group, self.name)  # never joins

    async def publish(self, partition: int, payload: bytes, headers: dict[str, str] | None) -> None:
        """Publish, retrying while the broker is away (never during a restart: see chaos)."""
        for attempt in range(200):
            try:
                with anyio.fail_after(5):
                    await self.publisher.publish(partition, payload, headers)
                return
            except Exception:
                if attempt == 199:
                    raise
                await anyio.sleep(0.1)

    async def publish_round(
        self, messages: list[tuple[int, bytes, dict[str, str] | None]], lock: anyio.Lock
    ) -> None:
        """Publish a round of ``(partition, payload, headers)`` in order.

        Redis and NATS: one message at a time. Kafka: the whole round queued
        at once, so the producer sends one batch per partition (Tansu keeps
        each batch as an object on moto: a batch per message made moto the
        busiest process of the test and of the suite beside it); a failed
        round is sent again whole (the same versions: duplicates change no
        final value), and what was published is the broker's own offsets."""
        if self.kind != "kafka":
            for partition, payload, headers in messages:
                async with lock:
                    await self.publish(partition, payload, headers)
                self.published[partition] += 1
            return
        for attempt in range(200):
            try:
                async with lock:
                    with anyio.fail_after(30):
                        sent = [
                            await self.producer.send(
                                self.name, payload, partition=partition, headers=headers
                            )
                            for partition, payload, headers in messages
                        ]
                        for future in sent:
                            partition, offset = await future
                            self.published[partition] = max(self.published[partition], offset + 1)
                return
            except Exception:
                if attempt == 199:
                    raise
                await anyio.sleep(0.1)

    async def positions(self) -> dict[int, tuple[int, int]]:
        """Per partition: (messages the group acknowledged, messages pending)."""
        out: dict[int, tuple[int, int]] = {}
        if self.kind == "redis":
            for p in range(PARTITIONS):
                groups = await self.client.xinfo_groups(f"{self.name}:{p}")
                g = next((x for x in groups if x["name"] == self.group.encode()), None)
                length = await self.client.xlen(f"{self.name}:{p}")
                if g is None:
                    out[p] = (0, length)
                    continue
                read, pending = g["entries-read"] or 0, g["pending"]
                out[p] = (read - pending, length - (read - pending))
            return out
        if self.kind == "nats":
            import nats.js.errors

            js = self.client.jetstream()
            for p in range(PARTITIONS):
                try:
                    info = await js.consumer_info(self.name, f"{self.group}-p{p}")
                except (nats.js.errors.NotFoundError, TypeError):
                    # TypeError: nats-py cannot parse the reply while a take-over
                    # deletes and recreates the durable (not drained yet)
                    out[p] = (0, 1)
                    continue
                out[p] = (info.ack_floor.stream_seq, info.num_pending + info.num_ack_pending)
            return out
        committed = await self.client.committed(PARTITIONS)
        for p in range(PARTITIONS):
            out[p] = (committed[p], max(0, self.published[p] - committed[p]))
        return out

    published: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(PARTITIONS), 0))

    async def aclose(self) -> None:
        with anyio.move_on_after(10, shield=True):
            if self.kind == "redis":
                await self.client.aclose()
            elif self.kind == "nats":
                await self.client.close()
            else:
                await self.publisher.aclose()
                await self.client.aclose()


@pytest_asyncio.fixture(params=["redis", "nats", "kafka"])
async def bus(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bus]:
    kind = request.param
    name = f"chaos-{uuid.uuid4().hex[:8]}"
    group = f"g{uuid.uuid4().hex[:6]}"
    if kind == "redis":
        broker = redis_server(tmp_path)
        url = f"redis://127.0.0.1:{{port}}/{name}"
    elif kind == "nats":
        broker = nats_server(tmp_path)
        url = f"nats://127.0.0.1:{{port}}/{name}/{name}"
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = f"tansu-{uuid.uuid4().hex[:10]}"
        create_bucket(endpoint, bucket)
        broker = tansu_server(tmp_path, endpoint, bucket)
        ms = int(TTL["kafka"] * 1000)
        # a rebalance waits two sessions for members to rejoin: a member slowed
        # by the load (two cores, four xdist workers) is not dropped mid-rejoin,
        # which kept the group rebalancing for minutes (a 240 s timeout)
        url = (
            f"kafka://127.0.0.1:{{port}}/{name}?session_timeout_ms={ms}"
            f"&heartbeat_interval_ms={ms // 10}&rebalance_timeout_ms={2 * ms}"
        )
    broker.start()
    bus = Bus(kind, broker, url.format(port=broker.port), group, name)
    try:
        await bus.connect()
        yield bus
    finally:
        await bus.aclose()
        broker.stop()


@dataclass
class Workers:
    """The three worker processes, and every exit that was not ours."""

    bus: Bus
    uri: str
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    killed: dict[str, int] = field(default_factory=dict)  # member -> kills
    self_exits: list[tuple[str, int]] = field(default_factory=list)
    started: int = 0
    starts: list[tuple[float, str, str]] = field(default_factory=list)  # (when, member, log)

    def start(self, member: str) -> None:
        self.started += 1
        log = self.logs / f"{member}-{self.started}.log"
        env = {**os.environ, "LANCE_LOG": "critical"}
        # Python's own bytecode cache (__pycache__, ignored by git), as an
        # installed package has it compiled: with PYTHONDONTWRITEBYTECODE (set
        # on the shared machine) every restart compiled lance_async's sources
        # again -- a quarter of a worker's start-up
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.starts.append((time.monotonic(), member, log.name))
        with open(log, "wb") as out:
            self.procs[member] = subprocess.Popen(
                [
                    *(sys.executable, "-m", "lance_async", "worker", self.bus.url, self.uri),
                    *("--group", self.bus.group, "--member", member),
                    *("--lease-ttl", str(TTL[self.bus.kind]), "--ack-wait", "5"),
                    *("--stats-interval", "1"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def kill(self, member: str) -> None:
        proc = self.procs[member]
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self.killed[member] = self.killed.get(member, 0) + 1

    def check_exits(self) -> None:
        """Record a worker that ended without being killed (and start it again)."""
        for member, proc in self.procs.items():
            code = proc.poll()
            if code is not None and (member, id(proc)) not in self._seen:
                self._seen.add((member, id(proc)))
                if not self._ours(member, proc):
                    self.self_exits.append((member, code))

    _seen: set[tuple[str, int]] = field(default_factory=set)
    _killed_procs: set[int] = field(default_factory=set)

    def _ours(self, member: str, proc: subprocess.Popen[bytes]) -> bool:
        return id(proc) in self._killed_procs

    def kill9(self, member: str) -> None:
        self._killed_procs.add(id(self.procs[member]))
        self.kill(member)

    def output(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.logs.glob("w*.log"))
        )

    def kill_everything(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


@dataclass
class Stalls:
    """The longest interval with messages pending and nothing acknowledged."""

    longest: float = 0.0
    window: tuple[float, float] = (0.0, 0.0)
    since: float = field(default_factory=time.monotonic)
    last: dict[int, int] = field(default_factory=dict)
    samples: int = 0
    trace: list[tuple[float, dict[int, tuple[int, int]] | None]] = field(default_factory=list)
    failed: int = 0

    def sample(self, positions: dict[int, tuple[int, int]]) -> None:
        """Progress: a partition's acknowledged position moved since the last
        sample (compared partition by partition: a NATS durable made anew
        by a take-over starts its count again)."""
        now = time.monotonic()
        pending = sum(p for _, p in positions.values())
        self.samples += 1
        self.trace.append((now, positions))
        moved = any(self.last.get(p, -1) != acked for p, (acked, _) in positions.items())
        self.last = {p: acked for p, (acked, _) in positions.items()}
        if moved or pending == 0:
            self.since = now
        self._note(now)

    def missed(self) -> None:
        """A sample the broker did not answer (it is restarting): time goes on."""
        self.failed += 1
        self.trace.append((time.monotonic(), None))
        self._note(time.monotonic())

    def _note(self, now: float) -> None:
        if now - self.since > self.longest:
            self.longest, self.window = now - self.since, (self.since, now)


@pytest.mark.asyncio
async def test_three_workers_under_chaos_stay_live_and_lose_nothing(
    bus: Bus, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(KV_SCHEMA.empty_table(), uri, schema=KV_SCHEMA)
    await ds.initialize_mem_wal(num_buckets=PARTITIONS, bucket_column="id")
    partitioner = await Partitioner.for_dataset(ds)
    part_of = dict(enumerate(partitioner.partition_of_rows([{"id": k} for k in range(KEYS)])))
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(bus, uri, logs)
    rng = random.Random(24)
    ttl, gap = TTL[bus.kind], GAP[bus.kind]
    expected: dict[int, int | None] = {}  # key -> its last version (None: deleted)
    broker_lock = anyio.Lock()  # no publish in flight while the broker restarts
    stalls = Stalls()
    events = {"kill": 0, "pause": 0, "broker": 0}
    timeline: list[tuple[float, str]] = []
    resumed: list[tuple[float, str]] = []  # (when, member) a pause ended
    chaos_done = anyio.Event()

    async def publish_round(version: int) -> None:
        messages: list[tuple[int, bytes, dict[str, str] | None]] = []
        for k in range(KEYS):
            delete = (k + version) % 5 == 0
            payload = {"id": k} if delete else {"id": k, "value": version, "name": f"v{version}"}
            messages.append(
                (part_of[k], json.dumps(payload).encode(), dict([DELETE]) if delete else None)
            )
        await bus.publish_round(messages, broker_lock)
        for k in range(KEYS):
            expected[k] = None if (k + version) % 5 == 0 else version

    async def produce() -> None:
        version = 1  # round 0 went out before the chaos
        while not chaos_done.is_set():
            await publish_round(version)
            version += 1
            await anyio.sleep(0.8)
        await publish_round(version)  # the last round, after the chaos

    async def monitor() -> None:
        while True:
            await anyio.sleep(SAMPLE[bus.kind])
            workers.check_exits()
            try:
                with anyio.fail_after(2):
                    stalls.sample(await bus.positions())
            except Exception:
                stalls.missed()

    async def pause(member: str, seconds: float) -> None:
        proc = workers.procs[member]
        proc.send_signal(signal.SIGSTOP)
        workers.paused.add(member)
        try:
            await anyio.sleep(seconds)
        finally:
            proc.send_signal(signal.SIGCONT)
            workers.paused.discard(member)
            resumed.append((time.monotonic(), member))

    async def chaos() -> None:
        async with anyio.create_task_group() as pauses:
            while sum(events.values()) < EVENTS:
                await anyio.sleep(rng.uniform(*gap))
                if sum(events.values()) == EVENTS // 2 and not events["broker"]:
                    async with broker_lock:
                        timeline.append((time.monotonic(), "broker restart"))
                        await anyio.to_thread.run_sync(bus.broker.restart)
                    events["broker"] += 1
                    continue
                live = [
                    m
                    for m in MEMBERS
                    if workers.procs[m].poll() is None and m not in workers.paused
                ]
                if not live:
                    continue
                victim = rng.choice(live)
                timeline.append((time.monotonic(), victim))
                if rng.random() < 0.5:
                    workers.kill9(victim)
                    events["kill"] += 1
                    timeline[-1] = (timeline[-1][0], f"kill {victim}")
                    await anyio.sleep(rng.uniform(0.1, 0.6))
                    workers.start(victim)
                else:
                    pauses.start_soon(pause, victim, rng.uniform(0.2, 1.5) * ttl)
                    events["pause"] += 1
                    timeline[-1] = (timeline[-1][0], f"pause {victim}")
        chaos_done.set()

    drained = False
    positions: dict[int, tuple[int, int]] = {}
    try:
        for m in MEMBERS:
            workers.start(m)
        # the group is up before the clock starts: a first round, consumed
        # (three processes importing the engine on a loaded machine is not
        # the take-over the stall bound is about)
        await publish_round(0)
        with anyio.fail_after(120):  # only stops a hung test
            while True:  # the broker offers no event for "consumed": poll it
                if not any(pending for _, pending in (await bus.positions()).values()):
                    break
                await anyio.sleep(0.2)
        stalls.since = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(monitor)
            async with anyio.create_task_group() as work:
                work.start_soon(produce)
                work.start_soon(chaos)
            # only stops a hung test (asserted below with the run's detail); the
            # stall bound, sampled meanwhile, is what checks that it kept moving
            with anyio.move_on_after(240):
                while True:
                    positions = await bus.positions()
                    if all(pending == 0 for _, pending in positions.values()):
                        drained = True
                        break
                    await anyio.sleep(0.2)
            tg.cancel_scope.cancel()
        workers.check_exits()
        for proc in workers.procs.values():
            proc.send_signal(signal.SIGTERM)
        codes = {
            m: await anyio.to_thread.run_sync(partial(p.wait, 60)) for m, p in workers.procs.items()
        }
    finally:
        workers.kill_everything()
    t0 = timeline[0][0] if timeline else 0.0
    detail = (
        f"events {events}, longest stall {stalls.longest:.2f} s "
        f"[{stalls.window[0] - t0:.1f}, {stalls.window[1] - t0:.1f}]; "
        + ", ".join(f"{t - t0:.1f} {what}" for t, what in timeline)
        + " "
        f"({stalls.samples} samples, {stalls.failed} unanswered)\n{workers.output()}"
    )
    print(detail[:1500])
    if os.environ.get("CHAOS_TRACE"):  # a directory: the run's events, samples and logs
        save_trace(
            Path(os.environ["CHAOS_TRACE"]), bus.kind, ttl, stalls, workers, timeline, resumed
        )
    assert drained, f"not drained 240 s after the chaos: {positions}\n{detail}"
    assert events["kill"] + events["pause"] >= 20 and events["broker"] == 1, detail
    assert workers.self_exits == [], detail
    assert codes == dict.fromkeys(MEMBERS, 0), detail
    assert stalls.longest <= STALL_TTLS[bus.kind] * ttl, detail
    await assert_final(uri, expected)


async def assert_final(uri: str, expected: dict[int, int | None]) -> None:
    ds = await la.open_dataset(uri)
    rows = (await ds.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "a key appears twice"
    want = {k: v for k, v in expected.items() if v is not None}
    got = {r["id"]: r["value"] for r in rows}
    assert got == want, {k: (got.get(k), want.get(k)) for k in set(got) ^ set(want) or got}
    gone = next(k for k, v in expected.items() if v is None)
    assert (await ds.lsm.point_lookup(gone, columns=["value"])).num_rows == 0
    assert (await ds.check_shards()).ok


def save_trace(
    where: Path,
    kind: str,
    ttl: float,
    stalls: Stalls,
    workers: Workers,
    timeline: list[tuple[float, str]],
    resumed: list[tuple[float, str]],
) -> None:
    """Keep what explains a run's stalls in a new directory under ``where``:
    ``trace.json`` (times on ``time.monotonic()``, the clock every process
    of the machine shares: the chaos events, each pause's end, each worker
    process's start and its log, the broker's positions sampled) and the
    workers' logs."""
    import shutil

    run = where / f"{kind}-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}"
    run.mkdir(parents=True)
    for log in workers.logs.glob("w*.log"):
        shutil.copy(log, run / log.name)
    trace = {
        "kind": kind,
        "ttl": ttl,
        "longest": stalls.longest,
        "window": stalls.window,
        "events": timeline,
        "resumed": resumed,
        "starts": workers.starts,
        "samples": [
            (t, None if p is None else {str(k): v for k, v in p.items()}) for t, p in stalls.trace
        ],
    }
    (run / "trace.json").write_text(json.dumps(trace))
