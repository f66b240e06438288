"""Hand-over time of a partition when its worker stops: SIGTERM against kill -9.

Issue 24. ``python -m bench.handover [--runs N] [--ttl S] [--brokers redis,nats]``
(Redis on 127.0.0.1:6379, NATS JetStream on 127.0.0.1:4222), written to
``bench/results/handover.md`` and ``bench/results/runs/handover-<stamp>.json``.

Two ``lance-async worker`` processes (``--lease-ttl`` S, default the
command's 10 s) share a 4-partition feed; a message goes to every partition
every 20 ms. Once each owns two partitions, one of them is stopped -- with
SIGTERM (a clean stop: it leaves the group, drains, releases, and the
release is announced) or with SIGKILL (nothing is announced: its leases
expire after the TTL). Measured: seconds from the signal until the other
worker has acknowledged (after the rows were durable) a message of every
partition the stopped worker owned (its health port's ``owned_messages``,
polled every 20 ms, counts what it acknowledged since it took a partition).
Both kinds of stop run side by side in one run, on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _stats(port: int) -> dict[str, Any]:
    """A worker's stats from its health port."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    await writer.drain()
    body = (await reader.read()).split(b"\r\n\r\n", 1)[1]
    writer.close()
    stats: dict[str, Any] = json.loads(body)
    return stats


class _Broker:
    """Publishing to a partitioned feed."""

    kind: str
    url: str

    async def publish(self, partition: int, payload: bytes) -> Any: ...
    async def aclose(self) -> None: ...


class _Redis(_Broker):
    def __init__(self, key: str, group: str) -> None:
        import redis.asyncio

        self.kind, self.key, self.group = "redis", key, group
        self.url = f"redis://127.0.0.1:6379/{key}"
        self.client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")

    async def publish(self, partition: int, payload: bytes) -> Any:
        return await self.client.xadd(f"{self.key}:{partition}", {"data": payload})

    async def aclose(self) -> None:
        for p in range(PARTITIONS):
            await self.client.delete(f"{self.key}:{p}")
        async for k in self.client.scan_iter(match=f"lance-async:leases:{self.group}:*"):
            await self.client.delete(k)
        await self.client.aclose()


class _Nats(_Broker):
    def __init__(self, name: str, group: str) -> None:
        self.kind, self.name, self.group = "nats", name, group
        self.url = f"nats://127.0.0.1:4222/{name}/{name}"

    async def start(self) -> None:
        import nats

        from lance_async.cluster import NatsPartitions

        self.nc = await nats.connect("nats://127.0.0.1:4222")
        self.js = self.nc.jetstream()
        await NatsPartitions(self.nc, self.name, self.name, self.group, PARTITIONS).ensure_stream()

    async def publish(self, partition: int, payload: bytes) -> Any:
        return await self.js.publish(f"{self.name}.{partition}", payload)

    async def aclose(self) -> None:
        await self.js.delete_stream(self.name)
        try:
            await self.js.delete_key_value(f"lance-async-leases-{self.group}-{self.name}")
        except Exception:  # the bucket may not exist
            pass
        await self.nc.close()


async def handover_once(kind: str, how: int, ttl: float, work: Path) -> float:
    """Stop one of two workers with signal ``how``; seconds until the other
    acknowledged a message published after the signal on each partition the
    stopped one owned."""
    import pyarrow as pa

    import lance_async as la
    from lance_async.cluster import Partitioner

    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("ts", pa.int64())]
    )
    uri = str(work / f"h-{uuid.uuid4().hex[:6]}.lance")
    ds = await la.write_dataset(schema.empty_table(), uri, schema=schema)
    await ds.initialize_mem_wal(bucket_column="id", num_buckets=PARTITIONS)
    partitioner = await Partitioner.for_dataset(ds)
    key_of: dict[int, int] = {}
    rows = [{"id": i} for i in range(64)]
    for row, p in zip(rows, partitioner.partition_of_rows(rows), strict=True):
        key_of.setdefault(p, row["id"])
    name = f"bench-handover-{uuid.uuid4().hex[:8]}"
    group = f"g{uuid.uuid4().hex[:6]}"
    broker: _Broker
    if kind == "redis":
        broker = _Redis(name, group)
    else:
        broker = _Nats(name, group)
        await broker.start()
    env = {**os.environ, "LANCE_LOG": "critical"}
    ports = {m: _free_port() for m in ("a", "b")}
    procs = {
        m: subprocess.Popen(  # noqa: ASYNC220 (a benchmark's own children)
            [
                *(sys.executable, "-m", "lance_async", "worker", broker.url, uri),
                *("--group", group, "--member", m, "--lease-ttl", str(ttl)),
                *("--stats-interval", "0", "--health-port", str(ports[m])),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
        )
        for m in ("a", "b")
    }
    ts = 0
    try:

        async def publish_round() -> None:
            nonlocal ts
            for p in range(PARTITIONS):
                await broker.publish(p, json.dumps({"id": key_of[p], "ts": ts}).encode())
            ts += 1

        deadline = time.monotonic() + 120
        a_parts: list[int] = []
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError("the workers did not share the partitions within 120 s")
            await publish_round()
            await asyncio.sleep(0.02)
            try:
                a, b = await _stats(ports["a"]), await _stats(ports["b"])
            except OSError:
                continue
            a_parts = a["partitions"]
            if a_parts and b["partitions"] and len(a_parts) + len(b["partitions"]) == PARTITIONS:
                break
        procs["a"].send_signal(how)
        stopped = time.monotonic()
        while True:
            if time.monotonic() > stopped + 120:
                raise TimeoutError("no hand-over within 120 s")
            await publish_round()
            await asyncio.sleep(0.02)
            b = await _stats(ports["b"])
            if all(b["owned_messages"].get(str(p), 0) > 0 for p in a_parts):
                return time.monotonic() - stopped
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        await broker.aclose()


def main(argv: list[str] | None = None) -> int:
    """Measure and write the report; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.handover", description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="stops of each kind per broker")
    parser.add_argument("--ttl", type=float, default=10.0, help="--lease-ttl of the workers")
    parser.add_argument("--brokers", default="redis,nats")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="lance_async_handover-"))
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    results: dict[str, dict[str, list[float]]] = {}
    for kind in args.brokers.split(","):
        results[kind] = {"SIGTERM": [], "SIGKILL": []}
        for _ in range(args.runs):  # the two kinds alternate: same machine state for both
            for how in (signal.SIGTERM, signal.SIGKILL):
                seconds = asyncio.run(handover_once(kind, how, args.ttl, work))
                results[kind][how.name].append(seconds)
                print(f"{kind} {how.name}: {seconds:.2f} s", file=sys.stderr, flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    command = "python -m bench.handover " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    raw: dict[str, Any] = {"command": command.strip(), "started": started, "load": load}
    raw["ttl"] = args.ttl
    raw["seconds"] = results
    (args.out / "runs" / f"handover-{stamp}.json").write_text(json.dumps(raw, indent=1))
    lines = [
        "# Hand-over after a worker stops",
        "",
        f"`{command.strip()}`, started {started} (load average {load}), "
        f"`--lease-ttl {args.ttl:g}`, {PARTITIONS} partitions, two workers, "
        f"{args.runs} stops of each kind per broker. Seconds from the signal to the first "
        "ack by the other worker on every partition the stopped one owned.",
        "",
        "| broker | stop | each (s) | median (s) | median ÷ TTL |",
        "|---|---|---|---|---|",
    ]
    for kind, by in results.items():
        for stop, times in by.items():
            median = statistics.median(times)
            each = ", ".join(f"{t:.2f}" for t in times)
            lines.append(f"| {kind} | {stop} | {each} | {median:.2f} | {median / args.ttl:.2f} |")
    lines.append("")
    (args.out / "handover.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
