"""Shard affinity and scale-out: the cost of routing, and take-over after a worker dies.

Issue 13. Two measurements:

routing
    10-row durable messages sent one by one, into a table bucket-sharded
    into 4 shards, side by side in one run:

    ``known_shard``
        ``AsyncShardWriter.send`` on one known shard, every message's keys in
        that shard: the writer checks each message's shard (the engine's
        ``evaluate_sharding_spec``).
    ``routed_one_shard``
        The routing writer (``dataset.mem_wal_writer()``) with the same
        messages: the router queues them, evaluates the spec once per run
        of queued messages on a worker thread, and hands the one shard
        writer it opened one part per run (no second check).
    ``routed_all_shards``
        The routing writer with messages of random keys: each run is cut
        across the 4 shards (one part per shard per run, 4 writers).
    ``manual_unchecked``
        A table with manual shards (no spec, nothing to check): the cost of
        a message before shard affinity existed.

    rows/s from the first send to the last ack; the ratio column is
    ``known_shard`` ÷ config.

takeover
    Two ``lance-async worker`` processes on a 4-partition Redis feed
    (``--lease-ttl 3``), a message published every 20 ms to every
    partition; one worker is killed with SIGKILL. Measured: seconds from the
    kill to the first durable ack, by the surviving worker, of a message of a
    partition the dead worker owned (the pending entry count of that
    partition's stream drops to 0 and its last delivered id passes the last
    id published before the kill), over 3 kills.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._common import (
    PK,
    Metric,
    Section,
    Series,
    Settings,
    Table,
    fmt_num,
    log,
    run_child,
    summary_table,
)

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("ts", pa.int64()),
        pa.field("value", pa.float64()),
    ]
)
BUCKETS = 4
CONFIGS = ["known_shard", "routed_one_shard", "routed_all_shards", "manual_unchecked"]
METRICS = [
    Metric("rows_per_s", "rows/s", 1.0, 0),
    Metric("us_per_message", "us per message (wall)", 1.0, 1),
]


def _messages(ids: np.ndarray, rows: int) -> list[pa.RecordBatch]:
    out = []
    for start in range(0, len(ids) - rows + 1, rows):
        part = ids[start : start + rows]
        out.append(
            pa.record_batch(
                {
                    "id": part,
                    "ts": np.arange(len(part), dtype=np.int64),
                    "value": np.ones(len(part)),
                },
                schema=SCHEMA,
            )
        )
    return out


def child_routing(uri: str, config: str, messages: int, rows: int) -> dict[str, float]:
    """One routing run in a fresh process (blocking)."""
    import anyio
    import lance

    import lance_async as la

    base = pa.table({"id": [-1], "ts": [0], "value": [0.0]}, schema=SCHEMA)
    ds = lance.write_dataset(base, uri)
    if config == "manual_unchecked":
        ds.initialize_mem_wal()
    else:
        ds.initialize_mem_wal(bucket_column="id", num_buckets=BUCKETS)

    async def main() -> dict[str, float]:
        ads = await la.open_dataset(uri)
        candidates = np.arange(messages * rows * BUCKETS * 2, dtype=np.int64)
        if config == "routed_all_shards":
            ids = np.random.default_rng(7).permutation(candidates)[: messages * rows]
            writer: Any = ads.mem_wal_writer()
        elif config == "manual_unchecked":
            ids = candidates[: messages * rows]
            writer = ads.mem_wal_writer(str(uuid.uuid4()))
        else:
            sharding = await ads.sharding()
            batch = pa.record_batch({"id": candidates}, schema=pa.schema([SCHEMA.field("id")]))
            values = sharding.values(batch).to_numpy()
            ids = candidates[values == 0][: messages * rows]
            shard = sharding.shard_id(0)
            writer = (
                ads.mem_wal_writer() if config == "routed_one_shard" else ads.mem_wal_writer(shard)
            )
        batches = _messages(ids, rows)
        async with writer:
            await writer.send(batches[0])
            await writer.flush()  # writers open, warm
            acks = []
            start = time.perf_counter()
            for b in batches[1:]:
                acks.append(await writer.send(b))
            for ack in acks:
                await ack
            seconds = time.perf_counter() - start
        sent = len(batches) - 1
        return {
            "rows_per_s": sent * rows / seconds,
            "us_per_message": seconds / sent * 1e6,
        }

    return anyio.run(main)


async def _takeover_once(work: Path, redis_url: str, ttl: float) -> float:
    """Kill one of two workers; seconds to the first ack of its partitions by the other."""
    import redis.asyncio

    import lance_async as la
    from lance_async.cluster import Partitioner, RedisPublisher

    uri = str(work / f"t-{uuid.uuid4().hex[:6]}.lance")
    ds = await la.write_dataset(SCHEMA.empty_table(), uri, schema=SCHEMA)
    await ds.initialize_mem_wal(bucket_column="id", num_buckets=BUCKETS)
    partitioner = await Partitioner.for_dataset(ds)
    candidates = [{"id": i} for i in range(64)]
    key_of: dict[int, int] = {}  # one key of each bucket
    for row, p in zip(candidates, partitioner.partition_of_rows(candidates), strict=True):
        key_of.setdefault(p, row["id"])
    key = f"bench-{uuid.uuid4().hex[:8]}"
    group = f"g{uuid.uuid4().hex[:6]}"
    client = redis.asyncio.Redis.from_url(redis_url)
    publisher = RedisPublisher(client, key, BUCKETS)
    env = {**os.environ, "LANCE_LOG": "critical"}
    procs = {}
    health = {}
    for member in ("a", "b"):
        port = random.randint(20000, 40000)
        health[member] = port
        command = [
            *(sys.executable, "-m", "lance_async", "worker", f"{redis_url}/{key}", uri),
            *("--group", group, "--member", member, "--lease-ttl", str(ttl)),
            *("--stats-interval", "0", "--health-port", str(port)),
        ]
        procs[member] = subprocess.Popen(  # noqa: ASYNC220 (a benchmark's own children)
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
    next_id = 0
    try:

        async def owned(member: str) -> list[int]:
            reader, writer = await asyncio.open_connection("127.0.0.1", health[member])
            writer.write(b"GET / HTTP/1.0\r\n\r\n")
            await writer.drain()
            body = (await reader.read()).split(b"\r\n\r\n", 1)[1]
            writer.close()
            return list(json.loads(body)["partitions"])

        async def publish_round() -> None:
            nonlocal next_id
            for p in range(BUCKETS):
                row = {"id": key_of[p], "ts": next_id, "value": 1.0}
                await publisher.publish(p, json.dumps(row).encode())
            next_id += 1

        deadline = time.monotonic() + 60
        a_parts: list[int] = []
        while time.monotonic() < deadline:
            await publish_round()
            await asyncio.sleep(0.02)
            try:
                a_parts, b_parts = await owned("a"), await owned("b")
            except OSError:
                continue
            if a_parts and b_parts and len(a_parts) + len(b_parts) == BUCKETS:
                break
        procs["a"].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        procs["a"].wait()
        last_before = {}
        for p in a_parts:
            last_before[p] = (await client.xinfo_stream(f"{key}:{p}"))["last-generated-id"]
        while time.monotonic() < killed + 120:
            await publish_round()
            await asyncio.sleep(0.02)
            for p in a_parts:
                groups = await client.xinfo_groups(f"{key}:{p}")
                g = next((x for x in groups if x["name"] == group.encode()), None)
                if g is not None and g["last-delivered-id"] > last_before[p] and not g["pending"]:
                    return time.monotonic() - killed
        raise TimeoutError("no take-over within 120 s")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for p in range(BUCKETS):
            await client.delete(f"{key}:{p}")
        await client.aclose()


def takeover(settings: Settings) -> list[float]:
    """Take-over seconds over a few kills (needs Redis on 127.0.0.1:6379)."""
    ttl = 3.0
    out = []
    for _ in range(1 if settings.quick else 3):
        out.append(asyncio.run(_takeover_once(settings.work, "redis://127.0.0.1:6379", ttl)))
    return out


def run(settings: Settings, shared: dict[str, Any]) -> Section:
    """Measure routing and take-over; the report section."""
    messages = 500 if settings.quick else 20_000
    rows = 10
    series: list[Series] = []
    for config in CONFIGS:
        samples = []
        for i in range(settings.runs):
            uri = str(settings.work / f"shard-{config}-{i}.lance")
            samples.append(
                run_child(
                    "bench.sharding:child_routing",
                    {"uri": uri, "config": config, "messages": messages, "rows": rows},
                )
            )
        series.append(Series("10-row durable messages", config, samples))
        log(f"sharding: {config}: {series[-1].median('rows_per_s'):,.0f} rows/s")
    table = summary_table(
        f"Routing cost ({messages:,} messages of {rows} rows, {BUCKETS} buckets)",
        series,
        METRICS,
        METRICS[0],
        "known_shard ÷ config (rows/s)",
        baseline="known_shard",
    )
    section = Section(
        "sharding",
        "Shard affinity: routing cost and take-over",
        __doc__.split("\n\n", 1)[1] if __doc__ else "",
        tables=[table],
        series=series,
    )
    try:
        seconds = takeover(settings)
        section.tables.append(
            Table(
                "Take-over after a worker is killed (lease ttl 3 s)",
                ["kills", "seconds to the first ack by the new owner (each)", "median"],
                [
                    [
                        str(len(seconds)),
                        ", ".join(fmt_num(s) for s in seconds),
                        fmt_num(float(np.median(seconds))),
                    ]
                ],
            )
        )
        section.raw["takeover_seconds"] = seconds
    except (OSError, TimeoutError) as exc:
        section.notes.append(f"Take-over not measured: {exc!r} (needs Redis on 127.0.0.1:6379).")
    return section


if __name__ == "__main__":  # pragma: no cover
    tmp = Path(tempfile.mkdtemp())
    print(asyncio.run(_takeover_once(tmp, "redis://127.0.0.1:6379", 3.0)))
