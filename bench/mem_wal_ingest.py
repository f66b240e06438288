"""MemWAL ingestion of a feed of small messages: rows/s, ack latency, peak RSS.

Issues 4, 16 and 25. A Kafka-like feed of 10-row messages (an int64 key, a
timestamp, a sensor id, a float and a short string per row), produced
incrementally by a generator (never materialized), written durably. The
lance_async rows use what a user gets by default -- ``ds.mem_wal_writer()``
on a table whose MemWAL came from ``initialize_mem_wal()`` (the routing
writer, 4 bucket shards on the key) -- and the ``*_one_shard`` rows the old
default beside them: one manual shard, named. The pylance rows write one
manual shard:

``naive_durable``
    ``ShardWriter.put`` per message with ``durable_write=True`` (each put
    waits for a WAL flush). Measured on a small number of messages.
``naive_nondurable``
    The same with ``durable_write=False``; rows are durable only at
    ``close()``, which is inside the timing.
``pylance_to_thread``
    ``await asyncio.to_thread(writer.put, message)`` per message, durable
    (what an async user writes today). Small number of messages.
``floor``
    One thread putting pre-batched 10,000-row batches, durable: the engine's
    own throughput, the floor to reach.
``lance_async``
    The default routing writer (durable, ``commit="adaptive"``) fed 10-row
    messages with ``send``; a committer task takes the acks in order (as a
    feed would commit offsets).
``lance_async_one_shard``, ``lance_async_send_many_one_shard``, ``lance_async_ingest_one_shard``
    The same three ways of handing messages over, to one manual shard's
    ``AsyncShardWriter``.
``lance_async_10k_msgs_per_s``
    The default writer offered 10,000 messages/s (ack latency and loop lag
    below saturation).
``lance_async_throughput``
    The same with ``commit="throughput"``: the engine's WAL tick and puts
    of up to half a memtable -- the writer's behaviour before the commit
    policies, kept as the row today's default is compared with.
``lance_async_latency``
    The same with ``commit="latency"`` (small puts back to back, each
    flushed at once).
``lance_async_send_many``
    The default writer handed the messages 100 at a time with
    ``send_many`` (one ack per group; the latency is the group's).
``lance_async_ingest``
    The default writer fed by ``feeds.ingest`` from an ``IterableFeed`` of
    the messages (1,000 per micro-batch, decoded payloads); the latency runs
    from a micro-batch's fetch to its acknowledgement.
``lancedb_async``
    LanceDB's ``AsyncTable.merge_insert`` per message on a table with an
    unsharded LSM write spec (LanceDB's MemWAL path), 64 messages in flight.

Metrics: rows per second (rows acknowledged durable / wall seconds from the
first message to the last ack), ack latency (ms from handing a message over
to its durable ack: the ``Ack``'s creation to its resolution for lance_async,
the call's duration for the others), peak RSS (MiB, fresh child per run),
full garbage collections during the run (``gc.callbacks``, generation 2).
Plus a sweep of rows per message (1, 10, 100, 1000) for the throughput chart
and the ack latency histogram of lance_async.

Targets (issue 16): each measures lance_async's own cost -- ack p99 of the
default policy, its rows/s against the old behaviour measured in the same
run, the low-latency policy's p99, 500,000 rows/s, event-loop lag, and
peak RSS growth against the engine floor's own growth on the same feeds.
Issue 25: the default routed writer against the manual single shard (send,
send_many, ingest), against the floor and the harness's ceiling, and its
ack p99 and loop lag when offered 10,000 messages/s.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._common import (
    LANCE_ASYNC,
    PK,
    LatencyHistogram,
    Meter,
    Metric,
    Section,
    Series,
    Settings,
    Table,
    Target,
    find,
    fmt_ratio,
    fmt_vs_limit,
    log,
    ratio,
    run_child,
    summary_table,
    with_ticker,
)

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("ts", pa.int64()),
        pa.field("sensor", pa.int32()),
        pa.field("value", pa.float64()),
        pa.field("tag", pa.string()),
    ]
)
FLOOR_BATCH = 10_000
LANCEDB_IN_FLIGHT = 64
LAG_RUNS = 3
WAL_FLUSH_INTERVAL_MS = 100  # pylance 14's default max_wal_flush_interval_ms
THROUGHPUT = "lance_async_throughput"
LATENCY = "lance_async_latency"
SEND_MANY = "lance_async_send_many"
INGEST = "lance_async_ingest"
ONE_SHARD = "lance_async_one_shard"
SEND_MANY_ONE = "lance_async_send_many_one_shard"
INGEST_ONE = "lance_async_ingest_one_shard"
PACED = "lance_async_10k_msgs_per_s"
PACED_ONE = "lance_async_10k_msgs_per_s_one_shard"
PACED_RATE = 10_000
"""Messages per second the paced run offers the default writer."""
HARNESS = "harness_only"
"""The bench's own per-message cost, no writer: making each message, one
checkpoint per message (what a send costs the loop at least), handing a
pre-resolved ack to the same consumer task: the ceiling of one-send-per-
message rows/s on this machine (informational)."""
#: lance_async configurations: (writer options, how messages are handed over,
#: routed). Routed: the default -- ``ds.mem_wal_writer()`` on a table whose
#: MemWAL came from ``initialize_mem_wal()`` (bucket sharding on the key, 4
#: shards). Not routed: a manual single shard (``initialize_mem_wal(
#: manual_shards=True)``, ``ds.mem_wal_writer(shard_id)``), the old default.
LANCE_ASYNC_CONFIGS: dict[str, tuple[dict[str, Any], str, bool]] = {
    LANCE_ASYNC: ({}, "send", True),
    THROUGHPUT: ({"commit": "throughput"}, "send", True),
    LATENCY: ({"commit": "latency"}, "send", True),
    SEND_MANY: ({}, "send_many", True),
    INGEST: ({}, "ingest", True),
    PACED: ({}, "paced", True),
    PACED_ONE: ({}, "paced", False),
    ONE_SHARD: ({}, "send", False),
    SEND_MANY_ONE: ({}, "send_many", False),
    INGEST_ONE: ({}, "ingest", False),
}
SEND_MANY_GROUP = 100
INGEST_MICRO_BATCH = 1_000

METRICS = [
    Metric("rows_per_s", "rows/s", 1.0, 0),
    Metric("ack_p50_ms", "ack p50 (ms)", 1.0, 1),
    Metric("ack_p99_ms", "ack p99 (ms)", 1.0, 1),
    Metric("peak_rss_mib", "peak RSS (MiB)", 1.0, 0),
    Metric("rows_per_put", "rows per engine put", 1.0, 0),
    Metric("full_gcs", "full GCs", 1.0, 0),
]


SWEEP_METRICS = [
    Metric("messages", "messages", 1.0, 0),
    Metric("rows_per_s", "rows/s", 1.0, 0),
    Metric("ack_p99_ms", "ack p99 (ms)", 1.0, 1),
    Metric("rows_per_put", "rows per engine put", 1.0, 0),
]


def _lancedb_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lancedb")
    except PackageNotFoundError:
        return "(not installed)"


def sizes(quick: bool) -> dict[str, int]:
    """Message counts: N, the naive and LanceDB counts, and the sweep's limits."""
    if quick:
        return {"N": 500, "naive": 5, "nondurable": 500, "lancedb": 100, "sweep_rows": 2_000}
    return {"N": 12_000, "naive": 30, "nondurable": 5_000, "lancedb": 600, "sweep_rows": 100_000}


# ---------------------------------------------------------------------------
# the feed
# ---------------------------------------------------------------------------


def feed(messages: int, rows_per_msg: int, first_id: int = 0) -> Iterator[pa.RecordBatch]:
    """``messages`` record batches of ``rows_per_msg`` rows, made one at a time.

    Keys are consecutive from ``first_id``; the other columns cycle through
    64 pre-built random column sets, so making a message costs about what
    decoding a small one would (a new key array and a batch).
    """
    rng = np.random.default_rng(rows_per_msg)
    pool = [
        (
            pa.array(rng.integers(0, 2**40, rows_per_msg)),
            pa.array(rng.integers(0, 1000, rows_per_msg).astype(np.int32)),
            pa.array(rng.random(rows_per_msg)),
            pa.array(rng.choice(["alpha", "beta", "gamma", "delta"], rows_per_msg)),
        )
        for _ in range(64)
    ]
    for m in range(messages):
        start = first_id + m * rows_per_msg
        ts, sensor, value, tag = pool[m % 64]
        key = pa.array(np.arange(start, start + rows_per_msg, dtype=np.int64))
        yield pa.RecordBatch.from_arrays([key, ts, sensor, value, tag], schema=SCHEMA)


def new_table(uri: str, mem_wal: bool = True, routed: bool = False) -> None:
    """A one-row table, with the MemWAL initialized if asked: manual shards,
    or with ``routed`` lance_async's default (bucket sharding on the key)."""
    import lance

    from lance_async.memwal.sharding import sharding_options

    first = pa.RecordBatch.from_arrays(
        [
            pa.array([-1], pa.int64()),
            pa.array([0]),
            pa.array([0], pa.int32()),
            pa.array([0.0]),
            pa.array(["seed"]),
        ],
        schema=SCHEMA,
    )
    ds = lance.write_dataset(pa.Table.from_batches([first]), uri, schema=SCHEMA, mode="create")
    if mem_wal:
        ds.initialize_mem_wal(**sharding_options(SCHEMA, {}, manual_shards=not routed))


# ---------------------------------------------------------------------------
# the child side
# ---------------------------------------------------------------------------


def _shard() -> str:
    return str(uuid.uuid4())


def child_ingest(
    config: str,
    uri: str,
    messages: int,
    rows_per_msg: int = 10,
    lag: bool = False,
    histogram: bool = False,
) -> dict[str, Any]:
    """Feed ``messages`` messages into a fresh MemWAL table by ``config`` (child side).

    Returns ``rows_per_s``, ``wall_s``, ack latency percentiles (ms),
    ``rows_per_put`` where known, the histogram when asked, and with ``lag``
    the ticker's lag.
    """
    import lance

    routed = config in LANCE_ASYNC_CONFIGS and LANCE_ASYNC_CONFIGS[config][2]
    new_table(uri, mem_wal=config != "lancedb_async", routed=routed)  # LanceDB: its own
    hist = LatencyHistogram()
    meter = Meter()
    total_rows = messages * rows_per_msg
    out: dict[str, Any] = {}
    full_gcs = _count_full_gcs()

    if config in ("naive_durable", "naive_nondurable", "floor"):
        ds = lance.dataset(uri)
        writer = ds.mem_wal_writer(_shard(), durable_write=config != "naive_nondurable")
        if config == "floor":
            batches = max(1, total_rows // FLOOR_BATCH)
            source = feed(batches, FLOOR_BATCH)
            total_rows = batches * FLOOR_BATCH
        else:
            source = feed(messages, rows_per_msg)
        puts = 0
        with meter:
            for batch in source:
                t0 = time.perf_counter()
                writer.put(batch)
                hist.add(time.perf_counter() - t0)
                puts += 1
            if config == "naive_nondurable":
                writer.close()  # only now are the rows durable
        if config != "naive_nondurable":
            writer.close()
        out["rows_per_put"] = total_rows / puts
    elif config in ("pylance_to_thread", "pylance_in_async_def"):

        async def main() -> dict[str, float]:
            ds = lance.dataset(uri)
            writer = ds.mem_wal_writer(_shard(), durable_write=True)

            async def messages_() -> Any:
                for batch in feed(messages, rows_per_msg):
                    await asyncio.sleep(0)  # a feed consumer awaits between messages
                    yield batch

            async def op() -> None:
                with meter:
                    async for batch in messages_():
                        t0 = time.perf_counter()
                        if config == "pylance_to_thread":
                            await asyncio.to_thread(writer.put, batch)
                        else:
                            writer.put(batch)  # blocks the loop: that is the point
                        hist.add(time.perf_counter() - t0)

            try:
                return (await with_ticker(op, lag))[1]
            finally:
                writer.close()

        out.update(asyncio.run(main()))
        out["rows_per_put"] = float(rows_per_msg)
    elif config in LANCE_ASYNC_CONFIGS:
        options, mode, routed = LANCE_ASYNC_CONFIGS[config]
        out.update(
            _lance_async_ingest(
                uri, messages, rows_per_msg, lag, hist, meter, options, mode, routed
            )
        )
    elif config == HARNESS:
        out.update(_harness_only(messages, rows_per_msg, hist, meter))
    elif config == "lancedb_async":
        out.update(_lancedb_ingest(uri, messages, rows_per_msg, lag, hist, meter))
    else:
        raise ValueError(f"unknown config {config!r}")
    out.update(meter.result())
    out["full_gcs"] = float(full_gcs())
    out["rows"] = float(total_rows)
    out["messages"] = float(messages if config != "floor" else total_rows / FLOOR_BATCH)
    out["rows_per_s"] = total_rows / meter.seconds
    out.update(hist.metrics("ack"))
    if histogram:
        out["histogram"] = hist.to_json()
    return out


class _Resolved:
    """A stand-in for an ack that is already resolved (the harness-only run)."""

    __slots__ = ("created", "resolved_at")

    def __init__(self, now: float) -> None:
        self.created = self.resolved_at = now

    def done(self) -> bool:
        return True

    def result(self) -> None:
        return None


def _harness_only(
    messages: int, rows_per_msg: int, hist: LatencyHistogram, meter: Meter
) -> dict[str, float]:
    """What the send-mode run costs without a writer: the feed, one checkpoint per
    message and the same ack consumer, fed acks that are already resolved."""
    import anyio
    import anyio.lowlevel

    async def main() -> dict[str, float]:
        async def committer(acks: Any) -> None:
            async with acks:
                async for ack in acks:
                    if not ack.done():
                        await ack
                    else:
                        ack.result()
                    hist.add(ack.resolved_at - ack.created)

        with meter:
            send, receive = anyio.create_memory_object_stream[_Resolved](math.inf)
            async with anyio.create_task_group() as tg:
                tg.start_soon(committer, receive)
                async with send:
                    for _ in feed(messages, rows_per_msg):
                        await anyio.lowlevel.checkpoint()
                        send.send_nowait(_Resolved(time.monotonic()))
        return {"rows_per_put": math.nan}

    result: dict[str, float] = anyio.run(main, backend="asyncio")
    return result


def _count_full_gcs() -> Callable[[], int]:
    """Start counting full (generation 2) garbage collections; returns the reader."""
    import gc

    count = [0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info.get("generation") == 2:
            count[0] += 1

    gc.callbacks.append(on_gc)
    return lambda: count[0]


def _lance_async_ingest(
    uri: str,
    messages: int,
    rows_per_msg: int,
    lag: bool,
    hist: LatencyHistogram,
    meter: Meter,
    options: dict[str, Any],
    mode: str,
    routed: bool,
) -> dict[str, float]:
    """Feed the messages to the default routing writer (``routed``) or a
    manual shard's ``AsyncShardWriter`` by ``mode``: ``send`` (one per
    message), ``paced`` (one per message at :data:`PACED_RATE` messages/s),
    ``send_many`` (groups) or ``ingest`` (``feeds.ingest``)."""
    import anyio
    from anyio.streams.memory import MemoryObjectReceiveStream

    import lance_async as la

    async def main() -> dict[str, float]:
        ads = await la.open_dataset(uri)
        opened = (
            ads.mem_wal_writer(durable_write=True, **options)
            if routed
            else ads.mem_wal_writer(_shard(), durable_write=True, **options)
        )
        async with opened as writer:

            async def committer(acks: MemoryObjectReceiveStream[la.Ack]) -> None:
                async with acks:
                    async for ack in acks:
                        if not ack.done():
                            await ack  # raises if the rows failed
                        else:
                            ack.result()
                        assert ack.resolved_at is not None
                        hist.add(ack.resolved_at - ack.created)

            async def op() -> None:
                if mode == "ingest":
                    with meter:
                        await _feed_ingest(writer, messages, rows_per_msg, hist)
                    return
                with meter:
                    send, receive = anyio.create_memory_object_stream[la.Ack](math.inf)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(committer, receive)
                        async with send:
                            if mode == "send":
                                for batch in feed(messages, rows_per_msg):
                                    send.send_nowait(await writer.send(batch))
                            elif mode == "paced":
                                start = time.monotonic()
                                for i, batch in enumerate(feed(messages, rows_per_msg)):
                                    ahead = start + i / PACED_RATE - time.monotonic()
                                    if ahead > 0.001:
                                        await anyio.sleep(ahead)
                                    send.send_nowait(await writer.send(batch))
                            else:
                                group: list[pa.RecordBatch] = []
                                for batch in feed(messages, rows_per_msg):
                                    group.append(batch)
                                    if len(group) == SEND_MANY_GROUP:
                                        send.send_nowait(await writer.send_many(group))
                                        group = []
                                if group:
                                    send.send_nowait(await writer.send_many(group))

            out = (await with_ticker(op, lag))[1]
            stats = writer.stats()
            out["engine_puts"] = float(stats.engine_puts)
            out["rows_per_put"] = stats.rows / max(1, stats.engine_puts)
            out["writer_ack_p50_ms"] = stats.ack_latency_p50 * 1000
            out["writer_ack_p99_ms"] = stats.ack_latency_p99 * 1000
        return out

    result: dict[str, float] = anyio.run(main, backend="asyncio")
    return result


async def _feed_ingest(
    writer: Any, messages: int, rows_per_msg: int, hist: LatencyHistogram
) -> None:
    """``feeds.ingest`` over the messages; each message's latency runs from
    its micro-batch's fetch to the feed's acknowledgement of it."""
    from lance_async.feeds import IterableFeed, Message, ingest

    class TimedFeed(IterableFeed):
        def __init__(self) -> None:
            super().__init__(feed(messages, rows_per_msg))
            self.fetched: dict[Any, float] = {}

        async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
            out = await super().fetch(max_messages, timeout)
            if out:
                self.fetched[out[-1].offset] = time.monotonic()
            return out

        async def ack_batch(self, batch: Sequence[Message]) -> None:
            await super().ack_batch(batch)
            now = time.monotonic()
            started = self.fetched.pop(batch[-1].offset, None)
            if started is not None:
                for _ in batch:
                    hist.add(now - started)

    await ingest(TimedFeed(), writer, max_batch=INGEST_MICRO_BATCH)


def _lancedb_ingest(
    uri: str, messages: int, rows_per_msg: int, lag: bool, hist: LatencyHistogram, meter: Meter
) -> dict[str, float]:
    import anyio
    import lancedb

    async def main() -> dict[str, float]:
        db = await lancedb.connect_async(str(Path(uri).parent))
        table = await db.open_table(Path(uri).name.removesuffix(".lance"))
        await table.set_lsm_write_spec(lancedb.LsmWriteSpec.unsharded())
        gate = asyncio.Semaphore(LANCEDB_IN_FLIGHT)

        async def one(batch: pa.RecordBatch) -> None:
            try:
                t0 = time.perf_counter()
                await (
                    table.merge_insert("id")
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute(batch)
                )
                hist.add(time.perf_counter() - t0)
            finally:
                gate.release()

        async def op() -> None:
            with meter:
                async with anyio.create_task_group() as tg:
                    for batch in feed(messages, rows_per_msg):
                        await gate.acquire()
                        tg.start_soon(one, batch)

        out = (await with_ticker(op, lag))[1]
        out["rows_per_put"] = float(rows_per_msg)
        return out

    return asyncio.run(main())


# ---------------------------------------------------------------------------
# the parent side
# ---------------------------------------------------------------------------


def ingest_once(
    settings: Settings,
    config: str,
    messages: int,
    rows_per_msg: int = 10,
    lag: bool = False,
    histogram: bool = False,
) -> dict[str, Any]:
    """One measured run in a fresh child on a fresh table."""
    import shutil

    root = settings.work / "ingest"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    try:
        return run_child(
            "bench.mem_wal_ingest:child_ingest",
            {
                "config": config,
                "uri": str(root / "feed.lance"),
                "messages": messages,
                "rows_per_msg": rows_per_msg,
                "lag": lag,
                "histogram": histogram,
            },
            flavour="lancedb" if config == "lancedb_async" else "lance",
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def plan(settings: Settings) -> list[tuple[str, str, int]]:
    """(case, config, messages) of the main table, in run order."""
    n = sizes(settings.quick)
    N = n["N"]
    small = f"{n['naive']:,} messages"
    cases: list[tuple[str, str, int]] = [
        (small, "naive_durable", n["naive"]),
        (small, "pylance_to_thread", n["naive"]),
        (f"{n['nondurable']:,} messages", "naive_nondurable", n["nondurable"]),
    ]
    if settings.lancedb:
        cases.append((f"{n['lancedb']:,} messages", "lancedb_async", n["lancedb"]))
    for mult in (1, 10):
        label = case_label(N, mult)
        cases.append((label, "floor", mult * N))
        cases.append((label, LANCE_ASYNC, mult * N))
    for config in (ONE_SHARD, THROUGHPUT, LATENCY, SEND_MANY, SEND_MANY_ONE, INGEST, INGEST_ONE):
        cases.append((case_label(N, 10), config, 10 * N))
    cases.append((case_label(N, 10), HARNESS, 10 * N))
    cases.append((case_label(N, 1), PACED, N))
    cases.append((case_label(N, 1), PACED_ONE, N))
    return cases


def case_label(n: int, mult: int) -> str:
    """The name of the N or 10xN case."""
    return f"{'N' if mult == 1 else '10xN'} = {mult * n:,} messages"


def sweep(settings: Settings) -> list[Series]:
    """Throughput against rows per message (chart data); 3 runs per point."""
    n = sizes(settings.quick)
    out: list[Series] = []
    runs = 1 if settings.quick else min(settings.runs, 3)
    for rows_per_msg in (1, 10, 100, 1000):
        lance_msgs = max(
            20 if settings.quick else 200, min(20_000, n["sweep_rows"] // rows_per_msg)
        )
        points = [
            (LANCE_ASYNC, lance_msgs),
            ("naive_nondurable", min(lance_msgs, 2_000 if not settings.quick else 200)),
            ("naive_durable", 20 if not settings.quick else 5),
        ]
        for config, msgs in points:
            series = Series(f"{rows_per_msg} rows/message", config)
            for _ in range(runs):
                series.samples.append(ingest_once(settings, config, msgs, rows_per_msg))
            out.append(series)
        log(f"mem_wal_ingest sweep: {rows_per_msg} rows/message done")
    return out


NAIVE_FACTOR = 100.0
FLOOR_SHARE = 1.5  # issue 25: the default routed writer vs the engine floor
VS_ONE_SHARD = 0.8  # issue 25: the default routed writer vs a manual single shard
VS_ONE_SHARD_MOONSHOT = 1.0
VS_HARNESS = 0.5  # issue 25's moonshot: one send per message vs the harness's ceiling
ACK_P99_MS = 50.0
LATENCY_P99_MS = 20.0
VS_OLD_DEFAULT = 0.95
ROWS_PER_S = 500_000.0
LAG_MAX_MS = 20.0
RSS_GROWTH_MARGIN = 0.05


def targets(series: list[Series], lag: list[Series], settings: Settings) -> list[Target]:
    """Issue 4's throughput targets and issue 16's (each against lance_async's own cost)."""
    n = sizes(settings.quick)
    N = n["N"]
    big, one = case_label(N, 10), case_label(N, 1)
    out: list[Target] = []
    naive = next((s for s in series if s.config == "naive_durable"), None)
    la_big, la_one = find(series, big, LANCE_ASYNC), find(series, one, LANCE_ASYNC)
    floor_big, floor_one = find(series, big, "floor"), find(series, one, "floor")
    if naive and la_big:
        r = ratio(la_big.median("rows_per_s"), naive.median("rows_per_s"))
        out.append(
            Target(
                f"mem_wal_ingest rows/s, lance_async over 10xN ({10 * N:,} messages) vs naive "
                f"durable per-message puts over {naive.case}",
                f"{fmt_vs_limit(r, NAIVE_FACTOR, 0, at_most=False)} "
                f"({la_big.median('rows_per_s'):,.0f} vs {naive.median('rows_per_s'):,.0f} rows/s)",
                f"≥ {NAIVE_FACTOR:.0f}x",
                r >= NAIVE_FACTOR,
            )
        )
    if floor_big and la_big:
        r = ratio(la_big.median("rows_per_s"), floor_big.median("rows_per_s"))
        out.append(
            Target(
                "mem_wal_ingest rows/s vs the pre-batched engine floor (both over 10xN)",
                f"{fmt_vs_limit(r, FLOOR_SHARE, at_most=False)} "
                f"({la_big.median('rows_per_s'):,.0f} vs "
                f"{floor_big.median('rows_per_s'):,.0f} rows/s)",
                f"≥ {FLOOR_SHARE:.2f}x",
                r >= FLOOR_SHARE,
            )
        )
    for label, s in (("N", la_one), ("10xN", la_big)):
        if s is None:
            continue
        p99 = s.median("ack_p99_ms")
        out.append(
            Target(
                f"mem_wal_ingest ack latency p99, default policy ({label})",
                f"{fmt_vs_limit(p99, ACK_P99_MS, 1, ' ms')} (median over runs; "
                f"p50 {s.median('ack_p50_ms'):.1f} ms)",
                f"≤ {ACK_P99_MS:.0f} ms",
                p99 <= ACK_P99_MS,
            )
        )
    old = find(series, big, THROUGHPUT)
    if la_big and old:
        r = ratio(la_big.median("rows_per_s"), old.median("rows_per_s"))
        out.append(
            Target(
                f"mem_wal_ingest rows/s, default policy vs {THROUGHPUT} (the old default, same "
                "run, 10xN)",
                f"{fmt_vs_limit(r, VS_OLD_DEFAULT, at_most=False)} "
                f"({la_big.median('rows_per_s'):,.0f} vs {old.median('rows_per_s'):,.0f} rows/s)",
                f"≥ {VS_OLD_DEFAULT:.2f}x",
                r >= VS_OLD_DEFAULT,
            )
        )
    low = find(series, big, LATENCY)
    if low:
        p99 = low.median("ack_p99_ms")
        out.append(
            Target(
                f"mem_wal_ingest ack latency p99, {LATENCY} (10xN)",
                f"{fmt_vs_limit(p99, LATENCY_P99_MS, 1, ' ms')} (median over runs; "
                f"{low.median('rows_per_s'):,.0f} rows/s)",
                f"≤ {LATENCY_P99_MS:.0f} ms",
                p99 <= LATENCY_P99_MS,
            )
        )
    if la_big:
        rate = la_big.median("rows_per_s")
        extra = [
            f"{c}: {x.median('rows_per_s'):,.0f}"
            for c in (SEND_MANY, INGEST, HARNESS)
            if (x := find(series, big, c)) is not None
        ]
        out.append(
            Target(
                "mem_wal_ingest rows/s, 10-row durable messages sent one by one (default "
                "policy, 10xN)",
                f"{fmt_vs_limit(rate, ROWS_PER_S, 0, ' rows/s', at_most=False)}"
                + (f" (informational: {'; '.join(extra)} rows/s)" if extra else ""),
                f"≥ {ROWS_PER_S:,.0f} rows/s",
                rate >= ROWS_PER_S,
            )
        )
    out.extend(routing_targets(series, lag, big))
    lag_default = next((s for s in lag if s.config == LANCE_ASYNC), None)
    if lag_default:
        worst = lag_default.median("lag_max_ms")
        out.append(
            Target(
                f"mem_wal_ingest event-loop lag max, default policy ({lag_default.case})",
                f"{fmt_vs_limit(worst, LAG_MAX_MS, 1, ' ms')} (median over runs of each "
                f"run's max; p99 {lag_default.median('lag_p99_ms'):.1f} ms)",
                f"≤ {LAG_MAX_MS:.0f} ms",
                worst <= LAG_MAX_MS,
            )
        )
    if la_one and la_big and floor_one and floor_big:
        growth = ratio(la_big.median("peak_rss_mib"), la_one.median("peak_rss_mib"))
        floor_growth = ratio(floor_big.median("peak_rss_mib"), floor_one.median("peak_rss_mib"))
        limit = floor_growth + RSS_GROWTH_MARGIN
        out.append(
            Target(
                "mem_wal_ingest peak RSS growth N to 10xN vs the engine floor's growth",
                f"{fmt_vs_limit(growth, limit, 3)} ({la_big.median('peak_rss_mib'):.0f} vs "
                f"{la_one.median('peak_rss_mib'):.0f} MiB; floor {floor_growth:.3f}x: "
                f"{floor_big.median('peak_rss_mib'):.0f} vs "
                f"{floor_one.median('peak_rss_mib'):.0f} MiB)",
                f"≤ the floor's growth + {RSS_GROWTH_MARGIN:.2f} = {limit:.3f}x",
                growth <= limit,
            )
        )
    return out


def routing_targets(series: list[Series], lag: list[Series], big: str) -> list[Target]:
    """Issue 25's targets: the default routed writer against a manual single
    shard (send, send_many, ingest), the harness's ceiling, and a paced feed."""
    out: list[Target] = []
    for routed, one, what, limit in (
        (LANCE_ASYNC, ONE_SHARD, "one send per 10-row message", VS_ONE_SHARD),
        (SEND_MANY, SEND_MANY_ONE, f"send_many of {SEND_MANY_GROUP} messages", VS_ONE_SHARD),
        (INGEST, INGEST_ONE, "feeds.ingest", VS_ONE_SHARD),
    ):
        a, b = find(series, big, routed), find(series, big, one)
        if a is None or b is None:
            continue
        r = ratio(a.median("rows_per_s"), b.median("rows_per_s"))
        per_run = ", ".join(
            fmt_ratio(ratio(x["rows_per_s"], y["rows_per_s"]))
            for x, y in zip(a.samples, b.samples, strict=False)
        )
        out.append(
            Target(
                f"mem_wal_ingest rows/s, default routed writer vs a manual single shard, {what} "
                "(10xN)",
                f"{fmt_vs_limit(r, limit, at_most=False)} ({a.median('rows_per_s'):,.0f} vs "
                f"{b.median('rows_per_s'):,.0f} rows/s; per run {per_run})",
                f"≥ {limit:.2f}x"
                + (f" (moonshot {VS_ONE_SHARD_MOONSHOT:.1f}x)" if routed == LANCE_ASYNC else ""),
                r >= limit,
            )
        )
    default, harness = find(series, big, LANCE_ASYNC), find(series, big, HARNESS)
    if default and harness:
        r = ratio(default.median("rows_per_s"), harness.median("rows_per_s"))
        out.append(
            Target(
                "mem_wal_ingest moonshot: one send per 10-row message (default writer) vs the "
                f"{HARNESS} ceiling (10xN)",
                f"{fmt_vs_limit(r, VS_HARNESS, at_most=False)} "
                f"({default.median('rows_per_s'):,.0f} vs "
                f"{harness.median('rows_per_s'):,.0f} rows/s)",
                f"≥ {VS_HARNESS:.1f}x",
                r >= VS_HARNESS,
            )
        )
    paced = next((s for s in series if s.config == PACED), None)
    paced_one = next((s for s in series if s.config == PACED_ONE), None)
    paced_lag = next((s for s in lag if s.config == PACED), None)
    if paced:
        p99 = paced.median("ack_p99_ms")
        out.append(
            Target(
                f"mem_wal_ingest ack p99, default routed writer offered {PACED_RATE:,} messages/s",
                f"{fmt_vs_limit(p99, ACK_P99_MS, 1, ' ms')} (p50 "
                f"{paced.median('ack_p50_ms'):.1f} ms; {paced.median('rows_per_s'):,.0f} rows/s"
                + (
                    f"; a manual single shard offered the same: p99 "
                    f"{paced_one.median('ack_p99_ms'):.1f} ms, p50 "
                    f"{paced_one.median('ack_p50_ms'):.1f} ms"
                    if paced_one
                    else ""
                )
                + ")",
                f"≤ {ACK_P99_MS:.0f} ms",
                p99 <= ACK_P99_MS,
            )
        )
    if paced_lag:
        worst = paced_lag.median("lag_max_ms")
        out.append(
            Target(
                f"mem_wal_ingest event-loop lag max, default routed writer offered "
                f"{PACED_RATE:,} messages/s",
                f"{fmt_vs_limit(worst, LAG_MAX_MS, 1, ' ms')} (median over runs of each run's "
                f"max; p99 {paced_lag.median('lag_p99_ms'):.1f} ms)",
                f"≤ {LAG_MAX_MS:.0f} ms",
                worst <= LAG_MAX_MS,
            )
        )
    return out


def run(settings: Settings, shared: dict[str, Any]) -> Section:
    """Measure issue 4's comparison, issue 16's policies and the message-size sweep."""
    n = sizes(settings.quick)
    cases = plan(settings)
    by_key: dict[tuple[str, str], Series] = {}
    for case, config, _ in cases:
        by_key[(case, config)] = Series(case, config)
    for r in range(settings.runs):
        for case, config, messages in cases:
            sample = ingest_once(settings, config, messages, histogram=config == LANCE_ASYNC)
            hist = sample.pop("histogram", None)
            if hist is not None and case.startswith("10xN"):
                shared.setdefault("ack_histograms", []).append(hist)
            by_key[(case, config)].samples.append(sample)
        log(f"mem_wal_ingest: round {r + 1}/{settings.runs} done")
    series = list(by_key.values())
    shared["ingest_series"] = series
    lag_plan = [
        (LANCE_ASYNC, n["N"]),
        (PACED, n["N"]),
        (THROUGHPUT, n["N"]),
        (INGEST, n["N"]),
        ("pylance_in_async_def", n["naive"]),
        ("pylance_to_thread", n["naive"]),
    ] + ([("lancedb_async", n["lancedb"])] if settings.lancedb else [])
    lag = {c: Series(f"{m:,} messages", c) for c, m in lag_plan}
    t_lag = time.perf_counter()
    for _ in range(1 if settings.quick else LAG_RUNS):
        for config, messages in lag_plan:
            lag[config].samples.append(ingest_once(settings, config, messages, lag=True))
    shared["lag_ingest"] = list(lag.values())
    shared["lag_seconds"] = shared.get("lag_seconds", 0.0) + time.perf_counter() - t_lag
    sweep_series = sweep(settings)
    shared["ingest_sweep"] = sweep_series
    intro = (
        f"A feed of 10-row messages (N = {n['N']:,} messages, {10 * n['N']:,} rows; 10xN = "
        f"{10 * n['N']:,} messages) generated one message at a time, written durably into "
        "the MemWAL of a fresh table: by default (lance_async, its policies, send_many, "
        "ingest, the paced run) through the routing writer, ds.mem_wal_writer(), on a table "
        "whose MemWAL came from initialize_mem_wal() (bucket sharding on the key, 4 "
        "shards; consecutive ids, so every message's rows span the shards); the *_one_shard "
        "rows and the pylance ones into one manual shard (pylance defaults: "
        "max_wal_flush_interval_ms=100, "
        "max_memtable_rows=100,000). rows/s = rows acknowledged durable ÷ seconds from the "
        "first message to the last ack. Ack latency = from handing a message over to its "
        "durable acknowledgement (lance_async: Ack creation to resolution, so waiting for "
        "queue room counts; the others: the call's duration). Per-message puts take about "
        "55-100 ms each when durable, so those configurations run on fewer messages "
        f"(naive durable and to_thread: {n['naive']:,}; naive non-durable: "
        f"{n['nondurable']:,}; LanceDB: {n['lancedb']:,}). "
        + (
            f"N is chosen so that even N fills a memtable ({10 * n['N']:,} rows > 100,000): "
            "the engine's memtable and flush buffers are then part of both peak RSS figures. "
            if 10 * n["N"] > 100_000
            else ""
        )
        + "Every run is a fresh child process."
    )
    notes = [
        "naive_nondurable: the ack latency is the put's duration, but the rows are durable "
        "only when close() returns (inside the timing); a crash before that loses them.",
        "lance_async's committer awaits each ack in order, suspending only on acks not yet "
        "resolved (as a feed consumer committing offsets would).",
        "Commit policies (lance_async/memwal/policy.py). pylance 14 flushes a durable put's "
        "WAL when the buffered WAL bytes reach max_wal_buffer_size (default 10 MB), else at "
        "the next max_wal_flush_interval_ms tick; back-to-back puts each wait for a tick "
        f"(about 100 ms). {LANCE_ASYNC} (commit='adaptive', the default) opens the engine "
        "writer with max_wal_buffer_size=1, so every put flushes when it is made; an idle "
        "writer puts a message at once, a busy one puts what queued meanwhile, up to 10,000 "
        f"rows, one put every 5 to 20 ms at most (four times the last put's duration). "
        f"{THROUGHPUT} (commit='throughput') is the "
        "writer's behaviour before the policies (engine defaults, puts of up to 50,000 "
        "rows) on today's cheaper per-message path, so the ratio to it is stricter than to "
        f"the old code. {LATENCY} (commit='latency'): 1,000-row puts back to back, a "
        "1,000-row queue.",
        "The senders never wait for acks, so under this saturating feed ack latency is "
        "mostly time spent in the queue: about max_queue_rows ÷ rows/s plus one put. The "
        "p99 target of the low-latency setting therefore measures its queue bound as much "
        "as its puts.",
        f"{ONE_SHARD}, {SEND_MANY_ONE}, {INGEST_ONE}: the same on a table with manual "
        "shards, through one named shard's AsyncShardWriter -- the old default, beside the "
        "routed default it is compared with (issue 25).",
        f"{PACED}, {PACED_ONE}: the default writer and a manual single shard offered "
        f"{PACED_RATE:,} messages/s (a sleep whenever "
        "the feed runs a millisecond ahead of schedule); its lag is measured in the lag "
        "runs.",
        f"{SEND_MANY}: groups of {SEND_MANY_GROUP} messages, one ack each (its latency counts "
        f"from the group's hand-over). {INGEST}: feeds.ingest with micro-batches of "
        f"{INGEST_MICRO_BATCH:,} messages; latency from a micro-batch's fetch to its "
        "acknowledgement.",
        f"{HARNESS}: no writer at all -- the feed making each message, one checkpoint per "
        "message (the least a send costs the loop under trio's rule) and the same ack "
        "consumer, fed acks already resolved: the most rows/s any one-send-per-message "
        "writer can reach in this harness on this machine.",
        "full GCs: generation-2 collections in the child during the run (none of these "
        "children calls gc.freeze(); the CLI's long-running commands do).",
        "lancedb_async: merge_insert routed through LanceDB's MemWAL path (unsharded LSM "
        f"write spec), {LANCEDB_IN_FLIGHT} calls in flight.",
        "LanceDB's AsyncTable.add is not measured: in lancedb "
        f"{_lancedb_version()} the LSM write spec routes only merge_insert through the "
        "MemWAL, so add appends to the base table instead (a fragment and a new table "
        "version per call, nothing on the WAL) -- a different job from a durable MemWAL put "
        "of one message.",
        "The ratio table compares rows/s measured on different feed lengths: the naive "
        "durable and to_thread configurations are timed over "
        f"{n['naive']:,} messages, naive_nondurable over {n['nondurable']:,}, "
        f"lancedb_async over {n['lancedb']:,} (rows/s of a per-message call does not depend "
        "on the feed length; lance_async and the floor are timed over N and 10xN).",
    ]
    if not settings.lancedb:
        notes.append(f"LanceDB not measured: {settings.lancedb_note}")
    return Section(
        key="mem_wal_ingest",
        title="MemWAL ingestion of small messages (issues 4, 16 and 25)",
        intro=intro,
        tables=[
            summary_table(
                "Medians [min–max] per configuration",
                series,
                METRICS,
                None,
            ),
            _ratios(series),
            summary_table(
                "lance_async's configurations over 10xN: medians [min–max]",
                [
                    x
                    for x in series
                    if x.case.startswith("10xN")
                    and (x.config in LANCE_ASYNC_CONFIGS or x.config == "floor")
                ],
                METRICS,
                METRICS[0],
                "default ÷ config (rows/s; above 1: the default is faster)",
            ),
            summary_table(
                "Throughput against rows per message: medians [min–max] (chart below)",
                sweep_series,
                SWEEP_METRICS,
                METRICS[0],
                "lance_async ÷ config (rows/s; above 1 = faster)",
                note="Message counts are capped per configuration so a point takes seconds "
                "(the messages column); rows/s of a per-message call does not depend on it.",
            ),
        ],
        targets=targets(series, shared["lag_ingest"], settings),
        notes=notes,
        series=series + sweep_series,
    )


def _ratios(series: list[Series]) -> Table:
    others = ("naive_durable", "pylance_to_thread", "naive_nondurable", "lancedb_async")
    first = {o: next((x for x in series if x.config == o), None) for o in others}
    rows_: list[list[str]] = []
    for s in series:
        if s.config != LANCE_ASYNC:
            continue
        row = [s.case]
        for other in others:
            o = first[other]
            row.append(
                "not measured"
                if o is None
                else fmt_ratio(ratio(s.median("rows_per_s"), o.median("rows_per_s")))
            )
        f = find(series, s.case, "floor")
        row.append(
            "n/a" if f is None else fmt_ratio(ratio(s.median("rows_per_s"), f.median("rows_per_s")))
        )
        rows_.append(row)
    header = ["lance_async case"]
    for other in others:
        o = first[other]
        header.append(f"÷ {other}" + (f" ({o.case})" if o is not None else ""))
    header.append("÷ floor (same case)")
    return Table(
        "lance_async rows/s ÷ each alternative's rows/s (above 1: lance_async is faster)",
        header,
        rows_,
    )
