"""Object storage and scale-out: durable ingestion on S3 (moto) vs local disk; 1-3 workers.

Issue 14. Two measurements, side by side in one run:

durable ingestion
    First 30 small puts of one shard awaited one at a time by a shard writer
    with the latency policy (one WAL write each, no pacing: the durable put
    latency), then 10-row messages sent one by one
    through the routing writer (``dataset.mem_wal_writer()``) of a 4-bucket
    table, durable: rows/s, ack p50/p99, and the object-store requests moto
    served while sending (its request recorder), per second and per shard,
    and rows per PUT. On local disk and on a moto S3 server (started here on
    a free port, configured by ``storage_options`` only) with the default
    commit policy, with puts paced 100 ms apart (``min_put_interval=0.1``)
    and with the throughput policy. Then the compaction of what was
    ingested: seconds and requests. moto answers on loopback in about a
    millisecond; real S3 takes tens (see docs/scale-out.md).

workers
    1, 2 and 3 ``lance-async worker`` processes on one local table of 6
    buckets, fed by a 6-partition Redis feed pre-loaded with 10-row JSON
    messages: rows/s in total from the first worker's start to the last
    message's ack. The machine has 2 cores: beyond 2 workers the CPU, not
    the design, is the limit (the report gives the load average).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa

from ._common import PK, Metric, Section, Series, Settings, Table, fmt_num, log, run_child

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("ts", pa.int64()),
        pa.field("value", pa.float64()),
    ]
)
BUCKETS = 4
METRICS = [
    Metric("rows_per_s", "rows/s", 1.0, 0),
    Metric("ack_p50_ms", "ack p50 (ms)", 1.0, 1),
    Metric("ack_p99_ms", "ack p99 (ms)", 1.0, 1),
    Metric("put_p50_ms", "one put p50 (ms)", 1.0, 1),
    Metric("put_p99_ms", "one put p99 (ms)", 1.0, 1),
    Metric("rows_per_put", "rows per PUT", 1.0, 0),
    Metric("requests_per_s_per_shard", "object-store requests/s per shard", 1.0, 1),
    Metric("puts_per_s_per_shard", "PUTs/s per shard", 1.0, 1),
    Metric("compact_seconds", "compaction (s)", 1.0, 2),
    Metric("compact_requests", "compaction requests", 1.0, 0),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Moto:
    """A moto S3 server on a free port, for the duration of a ``with`` block."""

    def __init__(self, work: Path) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.recording = work / f"moto-recording-{self.port}"

    def __enter__(self) -> Moto:
        env = {**os.environ, "MOTO_RECORDER_FILEPATH": str(self.recording)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1)
                return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("moto did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def bucket(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:10]}"
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        urllib.request.urlopen(req, timeout=10)
        return name

    def options(self) -> dict[str, str]:
        return {
            "aws_access_key_id": "bench",
            "aws_secret_access_key": "bench",
            "aws_region": "us-east-1",
            "aws_endpoint": self.endpoint,
            "allow_http": "true",
        }

    def recorder(self, action: str) -> bytes:
        """Drive moto's request recorder (``reset-``, ``start-``, ``stop-recording``);
        ``download-recording`` returns the requests recorded, one JSON per line."""
        return _recorder(self.endpoint, action)


def _recorder(endpoint: str | None, action: str) -> bytes:
    """Drive moto's request recorder at ``endpoint`` (no-op without one)."""
    if endpoint is None:
        return b""
    method = "GET" if action == "download-recording" else "POST"
    req = urllib.request.Request(
        f"{endpoint}/moto-api/recorder/{action}",
        method=method,
        data=b"" if method == "POST" else None,
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return bytes(r.read())


def child_ingest(
    uri: str,
    storage_options: dict[str, str] | None,
    messages: int,
    rows: int,
    writer_options: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Durable put latency, then ``messages`` durable 10-row messages sent
    through the routing writer (blocking). On moto, the object-store
    requests of the sending phase alone are counted (its recorder)."""
    import anyio

    import lance_async as la

    endpoint = (storage_options or {}).get("aws_endpoint")

    async def main() -> dict[str, float]:
        base = pa.table({"id": [-1], "ts": [0], "value": [0.0]}, schema=SCHEMA)
        ds = await la.write_dataset(base, uri, storage_options=storage_options)
        await ds.initialize_mem_wal(bucket_column="id", num_buckets=BUCKETS)
        sharding = await ds.sharding()
        ids = np.random.default_rng(3).permutation(messages * rows).astype(np.int64)
        batches = [
            pa.record_batch(
                {
                    "id": ids[i : i + rows],
                    "ts": np.full(rows, i, dtype=np.int64),
                    "value": np.ones(rows),
                },
                schema=SCHEMA,
            )
            for i in range(0, messages * rows, rows)
        ]
        # a put of a few rows of one shard, awaited one at a time: one WAL write
        probe = pa.record_batch(
            {"id": np.arange(-40, -1), "ts": np.zeros(39, np.int64), "value": np.ones(39)},
            schema=SCHEMA,
        )
        shard, part = sharding.split(probe)[0]
        one_shard = part.slice(0, 5)
        put_ms: list[float] = []
        latencies: list[float] = []
        # the latency policy: no pacing between puts, so a put is its WAL write
        async with ds.mem_wal_writer(shard, commit="latency") as single:
            await single.put(one_shard)
            for _ in range(30):
                t0 = time.perf_counter()
                await single.put(one_shard)
                put_ms.append((time.perf_counter() - t0) * 1000)
        async with ds.mem_wal_writer(**(writer_options or {})) as writer:
            await anyio.to_thread.run_sync(_recorder, endpoint, "reset-recording")
            await anyio.to_thread.run_sync(_recorder, endpoint, "start-recording")
            start = time.perf_counter()
            pending = []
            for b in batches:
                pending.append(await writer.send(b))
            for ack in pending:
                await ack
                assert ack.resolved_at is not None
                latencies.append(max(0.0, ack.resolved_at - ack.created))
            seconds = time.perf_counter() - start
            await anyio.to_thread.run_sync(_recorder, endpoint, "stop-recording")
        lat = np.array(latencies) * 1000
        out = {
            "rows_per_s": len(batches) * rows / seconds,
            "ack_p50_ms": float(np.percentile(lat, 50)),
            "ack_p99_ms": float(np.percentile(lat, 99)),
            "put_p50_ms": float(np.percentile(put_ms, 50)),
            "put_p99_ms": float(np.percentile(put_ms, 99)),
            "seconds": seconds,
        }
        if endpoint is not None:
            recording = await anyio.to_thread.run_sync(_recorder, endpoint, "download-recording")
            requests, puts = _count_requests(recording)
            out["requests_per_s_per_shard"] = requests / seconds / BUCKETS
            out["puts_per_s_per_shard"] = puts / seconds / BUCKETS
            out["rows_per_put"] = len(batches) * rows / max(puts, 1)
        return out

    return anyio.run(main)


def child_compact(uri: str, storage_options: dict[str, str] | None) -> dict[str, float]:
    """Flush every shard and compact the MemWAL into the base table (blocking)."""
    import anyio

    import lance_async as la

    async def main() -> dict[str, float]:
        ds = await la.open_dataset(uri, storage_options=storage_options)
        start = time.perf_counter()
        result = await ds.compact_mem_wal()
        seconds = time.perf_counter() - start
        merged = result.rows_upserted
        return {
            "compact_seconds": seconds,
            "compact_generations": float(sum(len(g) for g in result.generations.values())),
            "compact_rows": float(merged),
        }

    return anyio.run(main)


def _count_requests(recording: bytes) -> tuple[int, int]:
    """(requests, PUTs) in a moto recording (one JSON object per line)."""
    total = puts = 0
    for line in recording.splitlines():
        if not line.strip():
            continue
        total += 1
        try:
            if json.loads(line).get("method") == "PUT":
                puts += 1
        except ValueError:
            continue
    return total, puts


#: The durable-ingestion configurations: (name, on S3?, writer options).
INGEST_CONFIGS: list[tuple[str, bool, dict[str, Any]]] = [
    ("local disk", False, {}),
    ("S3 (moto)", True, {}),
    ("S3, puts >= 100 ms apart", True, {"min_put_interval": 0.1}),
    ("S3, throughput policy", True, {"commit": "throughput"}),
]


def ingestion(settings: Settings) -> list[Series]:
    """Durable ingestion in every configuration, alternating, ``settings.runs`` each."""
    messages = 300 if settings.quick else 6_000
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in INGEST_CONFIGS}
    with Moto(settings.work) as moto:
        for i in range(settings.runs):
            for name, on_s3, options in INGEST_CONFIGS:
                if on_s3:
                    uri, storage = f"s3://{moto.bucket()}/t.lance", moto.options()
                else:
                    uri, storage = str(settings.work / f"ingest-{i}-{uuid.uuid4().hex[:6]}"), None
                sample = run_child(
                    "bench.object_storage:child_ingest",
                    {
                        "uri": uri,
                        "storage_options": storage,
                        "messages": messages,
                        "rows": 10,
                        "writer_options": options,
                    },
                )
                if name in ("local disk", "S3 (moto)"):  # compaction of what was ingested
                    moto.recorder("reset-recording")
                    moto.recorder("start-recording")
                    sample.update(
                        run_child(
                            "bench.object_storage:child_compact",
                            {"uri": uri, "storage_options": storage},
                        )
                    )
                    moto.recorder("stop-recording")
                    if on_s3:
                        recording = moto.recorder("download-recording")
                        sample["compact_requests"], _ = _count_requests(recording)
                samples[name].append(sample)
            log(
                "object_storage: run {}: {}".format(
                    i,
                    ", ".join(f"{n} {samples[n][-1]['rows_per_s']:,.0f} rows/s" for n in samples),
                )
            )
    case = f"{messages:,} durable 10-row messages, {BUCKETS} shards"
    return [Series(case, name, runs) for name, runs in samples.items()]


def _cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """User + system CPU seconds the processes have used so far."""
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(proc.pid).cpu_times()
            total += times.user + times.system
    return total


async def _owned(ports: list[int]) -> list[int]:
    """How many partitions each worker owns, from its health endpoint (-1: not up)."""
    owned = []
    for port in ports:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            await writer.drain()
            reply = await reader.read()
            writer.close()
            owned.append(len(json.loads(reply.split(b"\r\n\r\n", 1)[1])["partitions"]))
        except (OSError, ValueError, KeyError, IndexError):
            owned.append(-1)
    return owned


async def _workers_once(
    work: Path, workers: int, messages: int, partitions: int = 6
) -> dict[str, float]:
    """``workers`` worker processes, started and balanced first; then the
    messages are published (pipelined) and the clock runs from the first
    publish to the last acknowledgement."""
    import redis.asyncio

    import lance_async as la
    from lance_async.cluster import Partitioner

    uri = str(work / f"w{workers}-{uuid.uuid4().hex[:6]}.lance")
    ds = await la.write_dataset(SCHEMA.empty_table(), uri, schema=SCHEMA)
    await ds.initialize_mem_wal(bucket_column="id", num_buckets=partitions)
    partitioner = await Partitioner.for_dataset(ds)
    key, group = f"bench-{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:6]}"
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
    rows_per = 10
    ids = np.arange(messages * rows_per, dtype=np.int64)
    payloads: list[tuple[int, bytes]] = []
    for m in range(messages):
        part = [
            {"id": int(i), "ts": m, "value": 1.0} for i in ids[m * rows_per : (m + 1) * rows_per]
        ]
        by_partition: dict[int, list[dict[str, Any]]] = {}
        for row, p in zip(part, partitioner.partition_of_rows(part), strict=True):
            by_partition.setdefault(p, []).append(row)
        for p, rows in by_partition.items():
            payloads.append((p, "\n".join(json.dumps(r) for r in rows).encode()))
    env = {**os.environ, "LANCE_LOG": "critical"}
    ports = [_free_port() for _ in range(workers)]
    procs = [
        subprocess.Popen(  # noqa: ASYNC220 (a benchmark's own children)
            [
                *(sys.executable, "-m", "lance_async", "worker", f"redis://127.0.0.1:6379/{key}"),
                *(uri, "--group", group, "--member", f"m{n}", "--stats-interval", "0"),
                *("--health-port", str(ports[n])),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        for n in range(workers)
    ]
    try:
        deadline = time.monotonic() + 120
        while True:  # every worker up, every partition owned, shares within one
            owned = await _owned(ports)
            if min(owned) >= 0 and sum(owned) == partitions and max(owned) - min(owned) <= 1:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not balance: {owned}")
            await asyncio.sleep(0.2)
        idle_cpu = _cpu_seconds(procs)  # start-up and balancing, not ingestion
        start = time.perf_counter()
        for n in range(0, len(payloads), 500):
            async with client.pipeline(transaction=False) as pipe:
                for p, payload in payloads[n : n + 500]:
                    pipe.xadd(f"{key}:{p}", {"data": payload})
                await pipe.execute()
        published = time.perf_counter() - start
        while True:
            await asyncio.sleep(0.1)
            done = 0
            for p in range(partitions):
                for g in await client.xinfo_groups(f"{key}:{p}"):
                    if g["name"] == group.encode():
                        done += int(g["entries-read"] or 0) - int(g["pending"])
            if done >= len(payloads):
                break
            if time.perf_counter() - start > 600:
                raise TimeoutError("the workers did not finish")
        seconds = time.perf_counter() - start
        cpu = _cpu_seconds(procs) - idle_cpu
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        for p in range(partitions):
            await client.delete(f"{key}:{p}")
        await client.aclose()
    return {
        "rows_per_s": messages * rows_per / seconds,
        "seconds": seconds,
        "publish_seconds": published,
        "rows_per_cpu_s": messages * rows_per / cpu if cpu else math.nan,
    }


def workers(settings: Settings) -> list[Series]:
    """1, 2 and 3 workers on one table (needs Redis on 127.0.0.1:6379)."""
    messages = 1_000 if settings.quick else 20_000
    out = []
    for n in (1,) if settings.quick else (1, 2, 3):
        samples = [
            asyncio.run(_workers_once(settings.work, n, messages))
            for _ in range(1 if settings.quick else 2)
        ]
        out.append(Series(f"{messages:,} 10-row messages, 6 partitions", f"{n} worker(s)", samples))
        log(f"object_storage: {n} worker(s): {out[-1].median('rows_per_s'):,.0f} rows/s")
    return out


def run(settings: Settings, shared: dict[str, Any]) -> Section:
    """Both measurements; the report section."""
    from ._common import summary_table

    series = ingestion(settings)
    tables = [
        summary_table(
            "Durable ingestion, local disk vs S3 (moto on loopback)",
            series,
            METRICS,
            METRICS[0],
            "local ÷ config (rows/s)",
            baseline="local disk",
        )
    ]
    section = Section(
        "object_storage",
        "Object storage and scale-out",
        __doc__.split("\n\n", 1)[1] if __doc__ else "",
        tables=tables,
        series=series,
    )
    try:
        scale = workers(settings)
        section.series.extend(scale)
        rows = [
            [s.config, str(len(s.samples)), fmt_num(s.median("rows_per_s"), 0),
             fmt_num(s.median("rows_per_s") / scale[0].median("rows_per_s")),
             fmt_num(s.median("rows_per_cpu_s"), 0)]
            for s in scale
        ]  # fmt: skip
        section.tables.append(
            Table(
                "Workers on one table (local disk, Redis feed); load average "
                + ", ".join(f"{x:.2f}" for x in os.getloadavg()),
                [
                    "workers",
                    "runs",
                    "rows/s in total",
                    "vs 1 worker",
                    "rows per worker CPU-second (ingesting)",
                ],
                rows,
            )
        )
    except (OSError, TimeoutError) as exc:
        section.notes.append(f"Workers not measured: {exc!r} (needs Redis on 127.0.0.1:6379).")
    return section
