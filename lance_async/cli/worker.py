"""The ``worker`` command: one of N replicas ingesting a partitioned feed into one table."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from typing import Any
from urllib.parse import parse_qs, urlparse

import anyio
import typer

from .. import errors
from ..cluster import (
    NatsLeaseTable,
    NatsPartitions,
    RedisLeaseTable,
    RedisPartitions,
    Worker,
    WorkerStats,
)
from ..cluster.partitions import Partitioner
from ..dataset import open_dataset
from .common import app, err, out, run_command

__all__ = ["worker"]


def _line(stats: WorkerStats) -> str:
    return (
        f"worker {stats.member}: partitions {stats.partitions}; {stats.rows:,} rows "
        f"({stats.rows_per_second:,.0f}/s), {stats.messages:,} messages, "
        f"{stats.dead_letters:,} dead letters; taken {stats.assigned}, handed back "
        f"{stats.revoked}, lost {stats.lost}"
    )


async def _health(port: int, worker: Worker) -> None:
    """Answer every HTTP request on ``port`` with the worker's stats as JSON."""

    async def handle(stream: Any) -> None:
        async with stream:
            try:
                with anyio.fail_after(5):
                    await stream.receive(4096)
                stats = worker.stats()
                body = json.dumps({"status": "ok", **stats.__dict__}).encode()
                head = (
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode()
                await stream.send(head + body)
            except (anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError, OSError):
                return

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    await listener.serve(handle)


async def _open_feed(
    url: str, group: str, member: str, partitions: int, ttl: float, ack_wait: float
) -> tuple[Any, Any, Any]:
    """(partitioned feed, lease table, closer) for a ``redis://`` or ``nats://`` URL."""
    parsed = urlparse(url)
    path = [p for p in parsed.path.split("/") if p]
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    if parsed.scheme in ("redis", "rediss"):
        import redis.asyncio

        if len(path) != 1:
            raise typer.BadParameter("a Redis feed is redis://HOST:PORT/KEY (streams KEY:0..N-1)")
        client = redis.asyncio.Redis.from_url(f"{parsed.scheme}://{parsed.netloc}")
        key = path[0]
        feeds = RedisPartitions(client, key, group, partitions, field=query.get("field", "data"))
        leases = RedisLeaseTable(client, f"lance-async:leases:{group}:{key}", member, ttl)
        return feeds, leases, client.aclose
    if parsed.scheme == "nats":
        import nats

        if len(path) != 2:
            raise typer.BadParameter(
                "a NATS feed is nats://HOST:PORT/STREAM/SUBJECT (subjects SUBJECT.0..N-1)"
            )
        nc = await nats.connect(f"nats://{parsed.netloc}", connect_timeout=3)
        stream, subject = path
        subjects = NatsPartitions(nc, stream, subject, group, partitions, ack_wait=ack_wait)
        await subjects.ensure_stream()
        bucket = await NatsLeaseTable.bucket(
            nc.jetstream(), f"lance-async-leases-{group}-{stream}", ttl
        )
        return subjects, NatsLeaseTable(bucket, member, ttl), nc.close
    raise typer.BadParameter(
        f"unsupported feed {url!r}: use redis://HOST:PORT/KEY or nats://HOST:PORT/STREAM/SUBJECT"
    )


@app.command()
def worker(
    feed: str = typer.Argument(
        ...,
        help="The partitioned feed: redis://HOST:PORT/KEY (streams KEY:0..N-1) or "
        "nats://HOST:PORT/STREAM/SUBJECT (subjects SUBJECT.0..N-1); N = the table's buckets.",
    ),
    table_uri: str = typer.Argument(..., help="The Lance table (MemWAL bucket-sharded)."),
    group: str = typer.Option("lance-async", "--group", help="The worker group's name."),
    member: str | None = typer.Option(
        None, "--member", help="This worker's name in the group (default: HOST-PID)."
    ),
    lease_ttl: float = typer.Option(
        10.0,
        "--lease-ttl",
        help="Seconds without a renewal before a dead worker's partitions are taken over.",
    ),
    ack_wait: float = typer.Option(
        30.0, "--ack-wait", help="NATS: seconds before an unacknowledged message comes again."
    ),
    stats_interval: float = typer.Option(
        5.0, "--stats-interval", help="Seconds between stats lines on stderr (0: none)."
    ),
    health_port: int | None = typer.Option(
        None, "--health-port", help="Serve the stats as JSON over HTTP on 127.0.0.1:PORT."
    ),
) -> None:
    """Ingest the partitions of FEED this worker is given into TABLE_URI.

    Run it as N replicas with the same --group: each owns a fair share of
    the partitions (leases in the broker), writes their shards with
    ack-after-durable, hands them over on rebalance, and stops cleanly on
    SIGTERM (exit 0).
    """
    if lease_ttl <= 0 or ack_wait <= 0:
        raise typer.BadParameter("--lease-ttl and --ack-wait must be > 0")
    name = member or f"{socket.gethostname()}-{os.getpid()}".replace(".", "-")

    async def run() -> WorkerStats:
        ds = await open_dataset(table_uri)
        if await ds.mem_wal_index_details() is None:
            raise errors.InvalidInputError(
                f"{table_uri} has no MemWAL; initialize it first: "
                f"lance-async init-wal {table_uri} --num-buckets N"
            )
        partitions = (await Partitioner.for_dataset(ds)).num_partitions
        feeds, leases, close = await _open_feed(feed, group, name, partitions, lease_ttl, ack_wait)
        w = Worker(ds, feeds, leases)
        try:
            async with anyio.create_task_group() as tg:

                async def signals() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
                        async for _ in received:
                            err.print(f"worker {name}: stopping (handing partitions back)")
                            w.stop()

                async def report() -> None:
                    while True:
                        await anyio.sleep(stats_interval)
                        print(_line(w.stats()), file=sys.stderr, flush=True)

                tg.start_soon(signals)
                if stats_interval > 0:
                    tg.start_soon(report)
                if health_port is not None:
                    tg.start_soon(_health, health_port, w)
                err.print(f"worker {name}: {partitions} partitions in group {group!r}")
                stats = await w.run()
                tg.cancel_scope.cancel()
            return stats
        finally:
            with anyio.CancelScope(shield=True):
                await close()

    stats = run_command(run)
    out.print(_line(stats))
