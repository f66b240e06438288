"""The scale-out commands: ``worker`` (one of N replicas ingesting a partitioned feed) and
``repartition`` (a feed's rows republished to their partitions); and the table claim
that keeps a second ``ingest`` (or an ingest and workers) from fencing each other
(:func:`exclusive_ingest`, ``lance_async.cluster.claim``)."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import typer

from .common import (
    COMMIT,
    MIN_PUT_INTERVAL,
    STORAGE_OPTION,
    app,
    err,
    fail,
    number,
    open_table,
    out,
    require_mem_wal,
    run_command,
    writer_options,
)
from .deadletters import DEAD_LETTER, check_dead_letter, open_dead_letter
from .inputs import check_source
from .start import LeanStart

if TYPE_CHECKING:
    from ..cluster import Worker, WorkerStats

__all__ = ["exclusive_ingest", "repartition", "worker"]

log = logging.getLogger("lance_async.cli")

T = TypeVar("T")


def exclusive_ingest(
    source: str, table_uri: str, run: Callable[[], Coroutine[Any, Any, T]]
) -> Callable[[], Coroutine[Any, Any, T]]:
    """``run`` wrapped in the table's claim in the broker of ``source``.

    For ``lance-async ingest`` of a Redis or NATS feed: the claim is taken
    before anything is opened (a NATS durable taken over, a shard claimed);
    held by another live ingest or by workers, the command stops at once
    with one line naming ``lance-async worker``, exit 2, having fenced and
    written nothing. A file or standard input needs no claim: ``run`` is
    returned as it is.
    """
    if not source.startswith(("redis://", "rediss://", "nats://")):
        return run

    async def claimed() -> T:
        import socket

        from ..cluster.claim import TableClaim, TableClaimedError

        holder = f"ingest {socket.gethostname()}-{os.getpid()}"
        try:
            async with TableClaim.open(source, table_uri, holder):
                return await run()
        except TableClaimedError as exc:
            fail(str(exc), 2)

    return claimed


def _line(stats: WorkerStats, recent: float | None = None) -> str:
    """A stats line: UTC time, then the figures; ``recent`` is the rows/s of
    the last interval (default: the average since the start)."""
    rate = (
        f"{stats.rows_per_second:,.0f}/s overall"
        if recent is None
        else f"{recent:,.0f}/s now, {stats.rows_per_second:,.0f}/s overall"
    )
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    return (
        f"{stamp} worker {stats.member}: partitions {stats.partitions}; {stats.rows:,} rows "
        f"({rate}), {stats.messages:,} messages, "
        f"{stats.dead_letters:,} dead letters; taken {stats.assigned}, handed back "
        f"{stats.revoked}, lost {stats.lost}"
    )


async def _health(port: int, worker: Worker, export: Any = None) -> None:
    """Answer HTTP requests on ``port``: ``GET /metrics`` with the Prometheus
    text when ``export`` is given, anything else with the worker's stats as JSON."""

    async def handle(stream: Any) -> None:
        async with stream:
            try:
                with anyio.fail_after(5):
                    request = await stream.receive(4096)
                if export is not None and request.startswith(b"GET /metrics"):
                    body, media = export(), export.content_type
                else:
                    stats = worker.stats()
                    body = json.dumps({"status": "ok", **stats.__dict__}).encode()
                    media = "application/json"
                head = (
                    f"HTTP/1.1 200 OK\r\nContent-Type: {media}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode()
                await stream.send(head + body)
            except (anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError, OSError):
                return

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    await listener.serve(handle)


@app.command()
def worker(
    feed: str = typer.Argument(
        ...,
        metavar="FEED",
        help="The partitioned feed: redis://HOST:PORT/KEY (streams KEY:0..N-1), "
        "nats://HOST:PORT/STREAM/SUBJECT (subjects SUBJECT.0..N-1) or "
        "kafka://HOST:PORT/TOPIC[?session_timeout_ms=...] (N partitions); N = the table's buckets.",
    ),
    table_uri: str = typer.Argument(
        ..., metavar="TABLE_URI", help="The Lance table (MemWAL bucket-sharded)."
    ),
    group: str = typer.Option(
        "lance-async", "--group", metavar="NAME", help="The worker group's name."
    ),
    member: str | None = typer.Option(
        None,
        "--member",
        metavar="NAME",
        help="This worker's name in the group (default: HOST-PID).",
    ),
    lease_ttl: float = typer.Option(
        10.0,
        "--lease-ttl",
        metavar="SECONDS",
        help="Seconds without a renewal before a dead worker's partitions are taken over.",
        callback=number("--lease-ttl", above=True, maximum=86_400),
    ),
    ack_wait: float = typer.Option(
        30.0,
        "--ack-wait",
        metavar="SECONDS",
        help="NATS: seconds before an unacknowledged message comes again.",
        callback=number("--ack-wait", above=True, maximum=86_400),
    ),
    stats_interval: float = typer.Option(
        5.0,
        "--stats-interval",
        metavar="SECONDS",
        help="Seconds between stats lines on stderr (0: none).",
        callback=number("--stats-interval", maximum=86_400),
    ),
    health_port: int | None = typer.Option(
        None,
        "--health-port",
        metavar="PORT",
        help="Serve the stats as JSON over HTTP on 127.0.0.1:PORT.",
        callback=number("--health-port", maximum=65_535),
    ),
    metrics: bool = typer.Option(
        False,
        "--metrics",
        help="Serve GET /metrics for Prometheus on --health-port (the 'metrics' extra).",
    ),
    dead_letter: str | None = DEAD_LETTER,
    max_bad: int | None = typer.Option(
        None,
        "--max-bad",
        metavar="N",
        help="With --dead-letter: bad messages set aside before the next one stops the worker "
        "(default: no limit; without --dead-letter bad messages are logged and acknowledged).",
        callback=number("--max-bad"),
    ),
    storage_option: list[str] | None = STORAGE_OPTION,
    commit: str | None = COMMIT,
    min_put_interval: float | None = MIN_PUT_INTERVAL,
) -> None:
    """Ingest the partitions of FEED this worker is given into TABLE_URI.

    Run it as N replicas with the same --group: each owns a fair share of
    the partitions (leases in the broker), writes their shards with
    ack-after-durable, hands them over on rebalance, and stops cleanly on
    SIGTERM (exit 0).
    """
    options = writer_options(commit, min_put_interval)
    if lease_ttl <= 0 or ack_wait <= 0:
        raise typer.BadParameter("--lease-ttl and --ack-wait must be > 0")
    if max_bad is not None and dead_letter is None:
        raise typer.BadParameter(
            "give --dead-letter FILE|URL too: where the bad messages go", param_hint="'--max-bad'"
        )
    check_dead_letter(dead_letter)
    if metrics and health_port is None:
        raise typer.BadParameter("--metrics needs --health-port", param_hint="'--metrics'")
    export = None
    if metrics:
        from .._metrics import prometheus_export

        try:
            export = prometheus_export()
        except ImportError as exc:
            raise typer.BadParameter(str(exc), param_hint="'--metrics'") from None
    name = member or f"{socket.gethostname()}-{os.getpid()}".replace(".", "-")
    lean = LeanStart()
    lean.begin()
    # A SIGTERM during start-up (imports, opening the table and the feed) is
    # not fatal: the worker stops at once, cleanly (exit 0), owning nothing.
    early: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: early.append(signum))

    async def run() -> WorkerStats | None:
        from ..cluster import Worker
        from ..cluster.partitions import Partitioner
        from ..memwal.compactor import CompactionPolicy
        from .feeds import open_partitioned

        running: list[Worker] = []
        async with anyio.create_task_group() as tg:

            def stop() -> None:
                if running:
                    err.print(f"worker {name}: stopping (handing partitions back)", markup=False)
                    running[0].stop()
                else:
                    err.print(
                        f"worker {name}: stopped during start-up (owned nothing)", markup=False
                    )
                    tg.cancel_scope.cancel()

            async def signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
                    if early:
                        stop()
                    async for _ in received:
                        stop()

            async def report(w: Worker) -> None:
                rows, since = 0, time.monotonic()
                while True:
                    await anyio.sleep(stats_interval)
                    stats, now = w.stats(), time.monotonic()
                    recent = (stats.rows - rows) / max(now - since, 1e-9)
                    rows, since = stats.rows, now
                    print(_line(stats, recent), file=sys.stderr, flush=True)

            tg.start_soon(signals)
            began = time.monotonic()
            ds = await open_table(table_uri, storage_option)
            await require_mem_wal(ds, table_uri, " --num-buckets N")
            partitions = (await Partitioner.for_dataset(ds)).num_partitions
            log.debug("worker %s: table open in %.2f s", name, time.monotonic() - began)
            async with contextlib.AsyncExitStack() as stack:
                if feed.startswith(("redis://", "rediss://", "nats://")):
                    # one group of workers per table and broker; an ingest there refuses
                    from ..cluster.claim import TableClaim, TableClaimedError

                    try:
                        await stack.enter_async_context(
                            TableClaim.open(feed, table_uri, f"worker {group}", wait=True)
                        )
                    except TableClaimedError as exc:
                        fail(str(exc), 2)
                    log.debug("worker %s: claim held at %.2f s", name, time.monotonic() - began)
                hook = await open_dead_letter(dead_letter, max_bad, feed)
                if hook is not None:
                    await stack.enter_async_context(hook)
                coordinator, close = await open_partitioned(
                    feed, group, name, partitions, lease_ttl, ack_wait
                )
                log.debug("worker %s: feed open at %.2f s", name, time.monotonic() - began)
                try:
                    w = Worker(
                        ds,
                        coordinator=coordinator,
                        writer_options=options,
                        compaction=CompactionPolicy(),
                        dead_letter=hook,
                    )
                    gc.freeze()  # start-up objects out of the collector's way (docs/memwal.md)
                    lean.end()
                    running.append(w)
                    if stats_interval > 0:
                        tg.start_soon(report, w)
                    if health_port is not None:
                        tg.start_soon(_health, health_port, w, export)
                    err.print(
                        f"worker {name}: {partitions} partitions in group {group!r}",
                        markup=False,
                    )
                    stats = await w.run()
                    tg.cancel_scope.cancel()
                    return stats
                finally:
                    with anyio.CancelScope(shield=True):
                        await close()
        return None  # stopped during start-up

    try:
        stats = run_command(run)
    finally:
        lean.end()
    if stats is not None:
        out.print(_line(stats), markup=False)


@app.command()
def repartition(
    source: str = typer.Argument(
        ...,
        metavar="SOURCE",
        help="The feed to read: a file, '-', nats://HOST:PORT/STREAM/SUBJECT or "
        "redis://HOST:PORT/STREAM[?group=G].",
    ),
    target: str = typer.Argument(
        ...,
        metavar="TARGET",
        help="The partitioned feed to publish to: redis://HOST:PORT/KEY or "
        "nats://HOST:PORT/STREAM/SUBJECT.",
    ),
    table_uri: str = typer.Argument(
        ..., metavar="TABLE_URI", help="The table whose buckets are the partitions."
    ),
    format: str | None = typer.Option(
        None, "--format", "-f", metavar="FORMAT", help="ndjson, json, csv or ipc."
    ),
    idle_timeout: float | None = typer.Option(
        None,
        "--idle-timeout",
        metavar="SECONDS",
        help="Stop after this many seconds without a message.",
        callback=number("--idle-timeout", maximum=1e9),
    ),
    storage_option: list[str] | None = STORAGE_OPTION,
) -> None:
    """Republish SOURCE's rows to their partitions of TARGET (partition = the table's bucket).

    Each source message is acknowledged once the broker stored its rows in
    the target, so workers reading TARGET own disjoint keys.
    """
    if "://" not in source:
        check_source(source)

    async def run() -> tuple[int, int]:
        from ..cluster.partitions import Partitioner
        from ..cluster.repartition import RepartitionWriter
        from ..feeds import ingest
        from .feeds import open_feed, open_publisher

        ds = await open_table(table_uri, storage_option)
        partitioner = await Partitioner.for_dataset(ds)
        publisher, close = await open_publisher(target, partitioner.num_partitions)
        try:
            feed_or_cm = open_feed(source, format, ds.schema, False)
            if hasattr(feed_or_cm, "__await__"):
                feed_or_cm = await feed_or_cm
            feed = feed_or_cm
            try:
                async with RepartitionWriter(publisher, partitioner) as writer:
                    stats = await ingest(feed, writer, idle_timeout=idle_timeout)
                return stats.messages, writer.published
            finally:
                with anyio.CancelScope(shield=True):
                    await feed.aclose()
        finally:
            with anyio.CancelScope(shield=True):
                await close()

    messages, published = run_command(run)
    out.print(f"republished {messages:,} messages as {published:,} partition messages")
