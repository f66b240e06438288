"""Scans and LSM point lookups: sync pylance against async, same data.

Issue 5, two parts.

Scan: read every row of a 1M-row, 10-column table (about 60 MiB on disk),
batch by batch, counting rows:

``pylance_sync``
    ``for batch in ds.to_batches(): ...``
``pylance_to_thread``
    ``await asyncio.to_thread(next, reader)`` per batch (what an async user
    writes today).
``lance_async``
    ``async for batch in AsyncDataset.scan(): ...`` (``AsyncBatchStream``:
    one prefetch thread, 4 batches ahead).
``lancedb_async``
    ``async for batch in await AsyncTable.query().to_batches(): ...``

Metrics: wall seconds per full scan, rows/s; the overhead ratio is
lance_async's time ÷ the sync loop's time. A sweep over ``batch_size`` gives
the throughput chart.

Point lookups: the newest row for one primary key across the base table
(200k rows, BTREE index on the key) and 5 flushed MemWAL generations
(20k rows each):

``pylance_sync``
    one ``LsmPointLookupPlanner`` built once, ``plan_lookup(key).to_table()``
    in a loop.
``pylance_to_thread``
    16 tasks, each ``await asyncio.to_thread(...)`` on that shared planner.
``lance_async``
    16 tasks, each ``await ds.lsm.point_lookup(key)`` (it rediscovers the
    shards' flushed generations on every call, so a lookup sees the latest).
``lance_async_snapshots``
    the same with ``snapshots=`` discovered once (as the sync planner has).
``lancedb_async``
    16 tasks, each ``await tbl.query().where("id = k").use_lsm(True).limit(1)
    .to_arrow()``.

Metric: lookups per second. Everything of one part runs in one child
process, configurations alternating round by round (no RSS is reported here).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._common import (
    LANCE_ASYNC,
    PK,
    Metric,
    Section,
    Series,
    Settings,
    Target,
    dir_mib,
    find,
    fmt_ratio,
    fmt_vs_limit,
    log,
    ratio,
    run_child,
    summary_table,
    with_ticker,
)

SCAN_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("ts", pa.int64()),
        pa.field("a", pa.float64()),
        pa.field("b", pa.float64()),
        pa.field("c", pa.float64()),
        pa.field("d", pa.float64()),
        pa.field("e", pa.float32()),
        pa.field("f", pa.int32()),
        pa.field("g", pa.int32()),
        pa.field("tag", pa.string()),
    ]
)
LOOKUP_TASKS = 16
SCAN_CONFIGS = ["pylance_sync", "pylance_to_thread", LANCE_ASYNC, "lancedb_async"]
LOOKUP_CONFIGS = [
    "pylance_sync",
    "pylance_to_thread",
    LANCE_ASYNC,
    "lance_async_snapshots",
    "lancedb_async",
]
BATCH_SIZES = [1024, 4096, 16384, 65536]
SCAN_OVERHEAD = 1.05
SMALL_BATCHES = [1024, 4096]
SMALL_BATCH_OVERHEAD = 1.1


def sizes(quick: bool) -> dict[str, int]:
    """Row counts for the scan table, the lookup table and its generations."""
    if quick:
        return {
            "scan_rows": 100_000,
            "base_rows": 20_000,
            "gen_rows": 2_000,
            "gens": 3,
            "lookups": 64,
        }
    return {
        "scan_rows": 1_000_000,
        "base_rows": 200_000,
        "gen_rows": 20_000,
        "gens": 5,
        "lookups": 160,
    }


def scan_batches(n: int, chunk: int = 100_000) -> Iterator[pa.RecordBatch]:
    """The scan table's rows, made chunk by chunk (random, so nothing compresses away)."""
    rng = np.random.default_rng(5)
    tags = np.array([f"tag-{i:03d}" for i in range(200)])
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        ids = np.arange(start, start + m, dtype=np.int64)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(ids),
                pa.array(1_700_000_000_000 + ids * 10),
                *[pa.array(rng.random(m)) for _ in range(4)],
                pa.array(rng.random(m, dtype=np.float32)),
                pa.array(rng.integers(0, 1 << 30, m).astype(np.int32)),
                pa.array(rng.integers(0, 100, m).astype(np.int32)),
                pa.array(tags[rng.integers(0, 200, m)]),
            ],
            schema=SCAN_SCHEMA,
        )


def prepare(settings: Settings) -> dict[str, Any]:
    """Write the scan table and the MemWAL lookup table."""
    import lance

    n = sizes(settings.quick)
    root = settings.work / "scan"
    root.mkdir(parents=True, exist_ok=True)
    scan_uri = str(root / "scan.lance")
    reader = pa.RecordBatchReader.from_batches(SCAN_SCHEMA, scan_batches(n["scan_rows"]))
    lance.write_dataset(reader, scan_uri, schema=SCAN_SCHEMA)

    lookup_uri = str(root / "lookup.lance")
    base = pa.Table.from_batches(list(scan_batches(n["base_rows"])))
    ds = lance.write_dataset(base, lookup_uri, schema=SCAN_SCHEMA)
    ds.create_scalar_index("id", "BTREE")
    ds = lance.dataset(lookup_uri)
    ds.initialize_mem_wal()
    ds = lance.dataset(lookup_uri)
    writer = ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=n["gen_rows"])
    first = n["base_rows"] * 3 // 4  # a quarter of the updates shadow base rows
    written = 0
    for batch in scan_batches(n["gen_rows"] * n["gens"], chunk=1_000):
        ids = pa.array(np.arange(first + written, first + written + batch.num_rows))
        writer.put(batch.set_column(0, SCAN_SCHEMA.field("id"), ids))
        written += batch.num_rows
    writer.close()
    key_space = first + written + n["base_rows"] // 50  # about 2% of lookups miss
    keys = random.Random(11).sample(range(key_space), n["lookups"])
    return {
        "scan": scan_uri,
        "scan_mib": dir_mib(scan_uri),
        "lookup": lookup_uri,
        "lookup_mib": dir_mib(lookup_uri),
        "keys": keys,
        "sizes": n,
    }


# ---------------------------------------------------------------------------
# the child side
# ---------------------------------------------------------------------------


def _scan_once(
    config: str, uri: str, batch_size: int | None, lag: bool = False
) -> tuple[float, int, dict[str, float]]:
    """One full scan; returns (seconds, rows, lag stats)."""
    import anyio
    import lance

    options: dict[str, Any] = {} if batch_size is None else {"batch_size": batch_size}
    if config == "pylance_sync":
        ds = lance.dataset(uri)
        t0 = time.perf_counter()
        rows = sum(b.num_rows for b in ds.to_batches(**options))
        return time.perf_counter() - t0, rows, {}

    async def body() -> tuple[float, int, dict[str, float]]:
        if config in ("pylance_to_thread", "pylance_in_async_def"):
            ds = lance.dataset(uri)

            async def op() -> int:
                rows = 0
                reader = ds.scanner(**options).to_reader()
                if config == "pylance_in_async_def":
                    for b in reader:  # blocks the loop between awaits: that is the point
                        rows += b.num_rows
                        await asyncio.sleep(0)
                    return rows
                while True:
                    b = await asyncio.to_thread(next, reader, None)
                    if b is None:
                        return rows
                    rows += b.num_rows

        elif config == LANCE_ASYNC:
            import lance_async as la

            ads = await la.open_dataset(uri)

            async def op() -> int:
                rows = 0
                async with ads.scan(batch_size=batch_size) as stream:
                    async for b in stream:
                        rows += b.num_rows
                return rows

        elif config == "lancedb_async":
            import lancedb

            db = await lancedb.connect_async(str(Path(uri).parent))
            tbl = await db.open_table(Path(uri).name.removesuffix(".lance"))

            async def op() -> int:
                rows = 0
                query = tbl.query()
                reader = await query.to_batches(**({} if batch_size is None else options))
                async for b in reader:
                    rows += b.num_rows
                return rows

        else:
            raise ValueError(f"unknown config {config!r}")
        t0 = time.perf_counter()
        rows, lag_stats = await with_ticker(op, lag)
        return time.perf_counter() - t0, rows, lag_stats

    result: tuple[float, int, dict[str, float]] = anyio.run(body, backend="asyncio")
    return result


def child_scan(
    uri: str, configs: list[str], runs: int, batch_sizes: list[int], lag_configs: list[str]
) -> dict[str, Any]:
    """Every scan measurement, in one process (child side).

    Returns ``{"main": {config: [seconds...]}, "sweep": {config: {bs: [rows/s]}},
    "rows": n, "lag": {config: stats}}``.
    """
    main: dict[str, list[float]] = {c: [] for c in configs}
    rows_seen: set[int] = set()
    for config in configs:  # warm-up: page cache and lazily built state
        _scan_once(config, uri, None)
    for _ in range(runs):
        for config in configs:
            seconds, rows, _ = _scan_once(config, uri, None)
            main[config].append(seconds)
            rows_seen.add(rows)
    sweep: dict[str, dict[str, list[float]]] = {}
    swept = [c for c in ("pylance_sync", LANCE_ASYNC, "pylance_to_thread") if c in configs]
    for _ in range(min(runs, 3)):
        for bs in batch_sizes:
            for config in swept:
                seconds, rows, _ = _scan_once(config, uri, bs)
                sweep.setdefault(config, {}).setdefault(str(bs), []).append(rows / seconds)
    lag: dict[str, dict[str, float]] = {}
    t_lag = time.perf_counter()
    for config in lag_configs:
        seconds, rows, stats = _scan_once(config, uri, None, lag=True)
        stats["wall_s"] = seconds
        lag[config] = stats
    import lance

    default_batch = next(iter(lance.dataset(uri).to_batches())).num_rows
    return {
        "main": main,
        "sweep": sweep,
        "rows": sorted(rows_seen),
        "lag": lag,
        "lag_seconds": time.perf_counter() - t_lag,
        "default_batch_rows": default_batch,
    }


def _lookup_run(
    config: str, uri: str, keys: list[int], lag: bool = False
) -> tuple[float, int, dict[str, float]]:
    """All ``keys`` looked up once; returns (seconds, rows found, lag stats)."""
    import anyio
    import lance
    from lance.mem_wal import LsmPointLookupPlanner

    import lance_async as la

    async def snapshots() -> Any:
        ads = await la.open_dataset(uri)
        return await ads.lsm.snapshots()

    if config in ("pylance_sync", "pylance_to_thread", "pylance_in_async_def"):
        snaps = anyio.run(snapshots, backend="asyncio")
        planner = LsmPointLookupPlanner(lance.dataset(uri), [s.lance for s in snaps], ["id"])

        def lookup(key: int) -> int:
            return int(planner.plan_lookup(pa.array([key], pa.int64())).to_table().num_rows)

        if config == "pylance_sync":
            t0 = time.perf_counter()
            found = sum(lookup(k) for k in keys)
            return time.perf_counter() - t0, found, {}

    async def body() -> tuple[float, int, dict[str, float]]:
        one: Callable[[int], Awaitable[int]]
        if config == "pylance_to_thread":

            async def one(key: int) -> int:
                return await asyncio.to_thread(lookup, key)

        elif config == "pylance_in_async_def":

            async def one(key: int) -> int:
                await asyncio.sleep(0)
                return lookup(key)  # blocks the loop: that is the point

        elif config in (LANCE_ASYNC, "lance_async_snapshots"):
            ads = await la.open_dataset(uri)
            snaps = await ads.lsm.snapshots() if config == "lance_async_snapshots" else None

            async def one(key: int) -> int:
                return int((await ads.lsm.point_lookup(key, snapshots=snaps)).num_rows)

        elif config == "lancedb_async":
            import lancedb

            db = await lancedb.connect_async(str(Path(uri).parent))
            tbl = await db.open_table(Path(uri).name.removesuffix(".lance"))

            async def one(key: int) -> int:
                query = tbl.query().where(f"id = {key}").use_lsm(True).limit(1)
                return int((await query.to_arrow()).num_rows)

        else:
            raise ValueError(f"unknown config {config!r}")

        async def op() -> int:
            pending = list(keys)
            found = 0

            async def worker() -> None:
                nonlocal found
                while pending:
                    rows = await one(pending.pop())
                    found += rows

            async with anyio.create_task_group() as tg:
                for _ in range(LOOKUP_TASKS):
                    tg.start_soon(worker)
            return found

        t0 = time.perf_counter()
        found, stats = await with_ticker(op, lag)
        return time.perf_counter() - t0, found, stats

    result: tuple[float, int, dict[str, float]] = anyio.run(body, backend="asyncio")
    return result


def child_lookup(
    uri: str, configs: list[str], runs: int, keys: list[int], lag_configs: list[str]
) -> dict[str, Any]:
    """Every lookup measurement, in one process (child side).

    Returns ``{"main": {config: [lookups/s...]}, "found": {config: n},
    "lag": {config: stats}}``.
    """
    main: dict[str, list[float]] = {c: [] for c in configs}
    found: dict[str, list[int]] = {c: [] for c in configs}
    for config in configs:  # warm-up
        _lookup_run(config, uri, keys[: LOOKUP_TASKS * 2])
    for _ in range(runs):
        for config in configs:
            seconds, n, _ = _lookup_run(config, uri, keys)
            main[config].append(len(keys) / seconds)
            found[config].append(n)
    lag: dict[str, dict[str, float]] = {}
    t_lag = time.perf_counter()
    for config in lag_configs:
        seconds, n, stats = _lookup_run(config, uri, keys[: len(keys) // 2], lag=True)
        stats["wall_s"] = seconds
        lag[config] = stats
    return {"main": main, "found": found, "lag": lag, "lag_seconds": time.perf_counter() - t_lag}


# ---------------------------------------------------------------------------
# the parent side
# ---------------------------------------------------------------------------


def run(settings: Settings, shared: dict[str, Any]) -> Section:
    """Measure issue 5's scan and lookup comparisons."""
    paths = prepare(settings)
    n = paths["sizes"]
    flavour = "lancedb" if settings.lancedb else "lance"
    scan_configs = [c for c in SCAN_CONFIGS if settings.lancedb or c != "lancedb_async"]
    lookup_configs = [c for c in LOOKUP_CONFIGS if settings.lancedb or c != "lancedb_async"]
    lag_configs = ["pylance_in_async_def", "pylance_to_thread", LANCE_ASYNC] + (
        ["lancedb_async"] if settings.lancedb else []
    )
    scan = run_child(
        "bench.scan:child_scan",
        {
            "uri": paths["scan"],
            "configs": scan_configs,
            "runs": settings.runs,
            "batch_sizes": BATCH_SIZES,
            "lag_configs": lag_configs,
        },
        flavour=flavour,
    )
    log("scan: scans done")
    lookups = run_child(
        "bench.scan:child_lookup",
        {
            "uri": paths["lookup"],
            "configs": lookup_configs,
            "runs": settings.runs,
            "keys": paths["keys"],
            "lag_configs": lag_configs,
        },
        flavour=flavour,
    )
    log("scan: lookups done")
    rows = scan["rows"][0] if scan["rows"] else 0
    scan_case = f"{rows:,} rows x 10 columns"
    scan_series = [
        Series(scan_case, c, [{"wall_s": s, "rows_per_s": rows / s} for s in secs])
        for c, secs in scan["main"].items()
    ]
    lookup_case = f"{len(paths['keys'])} keys, {LOOKUP_TASKS} tasks"
    lookup_series = [
        Series(lookup_case, c, [{"lookups_per_s": v} for v in vals])
        for c, vals in lookups["main"].items()
    ]
    order = {c: i for i, c in enumerate(SCAN_CONFIGS)}
    sweep_series = sorted(
        (
            Series(f"batch_size {bs}", c, [{"rows_per_s": v, "wall_s": rows / v} for v in vals])
            for c, by_bs in scan["sweep"].items()
            for bs, vals in by_bs.items()
        ),
        key=lambda x: (int(x.case.split()[-1]), order.get(x.config, 99)),
    )
    shared["scan_sweep"] = sweep_series
    shared["lag_scan"] = scan["lag"]
    shared["lag_lookup"] = lookups["lag"]
    shared["lag_seconds"] = (
        shared.get("lag_seconds", 0.0) + scan["lag_seconds"] + lookups["lag_seconds"]
    )
    default_batch = int(scan["default_batch_rows"])
    out_targets: list[Target] = []
    la_ = find(scan_series, scan_case, LANCE_ASYNC)
    sync = find(scan_series, scan_case, "pylance_sync")
    if la_ and sync:
        r = ratio(la_.median("wall_s"), sync.median("wall_s"))
        out_targets.append(
            Target(
                "scan overhead: AsyncBatchStream time ÷ sync to_batches time, default batch "
                f"size ({default_batch:,} rows)",
                f"{fmt_vs_limit(r, SCAN_OVERHEAD)} ({la_.median('wall_s') * 1000:.1f} vs "
                f"{sync.median('wall_s') * 1000:.1f} ms)",
                f"≤ {SCAN_OVERHEAD:.2f}x",
                r <= SCAN_OVERHEAD,
            )
        )
    la_l = find(lookup_series, lookup_case, LANCE_ASYNC)
    sync_l = find(lookup_series, lookup_case, "pylance_sync")
    notes = [
        f"Scan table: {paths['scan_mib']:.0f} MiB on disk. Lookup table: "
        f"{n['base_rows']:,} base rows with a BTREE index on id, {n['gens']} flushed "
        f"generations of {n['gen_rows']:,} rows ({paths['lookup_mib']:.0f} MiB in all); "
        "keys drawn at random over base-only, generation-only, shadowed and missing ids.",
        "Found rows per configuration (must agree): "
        + ", ".join(f"{c}: {sorted(set(v))}" for c, v in lookups["found"].items()),
        "Scan rows per pass (must be one number): " + ", ".join(str(r) for r in scan["rows"]),
    ]
    if la_l and sync_l:
        notes.append(
            "lance_async lookups/s ÷ the sync planner's: "
            + fmt_ratio(ratio(la_l.median("lookups_per_s"), sync_l.median("lookups_per_s")))
            + " (informational; the issue sets no target)."
        )
    for bs in SMALL_BATCHES:
        la_bs = find(sweep_series, f"batch_size {bs}", LANCE_ASYNC)
        sync_bs = find(sweep_series, f"batch_size {bs}", "pylance_sync")
        if la_bs and sync_bs:
            r = ratio(la_bs.median("wall_s"), sync_bs.median("wall_s"))
            out_targets.append(
                Target(
                    f"scan overhead at {bs:,}-row batches: AsyncBatchStream time ÷ sync "
                    "to_batches time (issue 18)",
                    fmt_vs_limit(r, SMALL_BATCH_OVERHEAD),
                    f"≤ {SMALL_BATCH_OVERHEAD:.2f}x",
                    r <= SMALL_BATCH_OVERHEAD,
                )
            )
    per_bs = []
    for bs in BATCH_SIZES:
        la_bs = find(sweep_series, f"batch_size {bs}", LANCE_ASYNC)
        sync_bs = find(sweep_series, f"batch_size {bs}", "pylance_sync")
        if la_bs and sync_bs:
            per_bs.append(
                f"{bs:,} rows: {fmt_ratio(ratio(la_bs.median('wall_s'), sync_bs.median('wall_s')))}"
            )
    if per_bs:
        notes.append(
            "Scan overhead (lance_async time ÷ sync to_batches time) per batch size in the "
            "sweep: "
            + "; ".join(per_bs)
            + f" (informational: the issue's ≤ {SCAN_OVERHEAD:.2f}x target is checked at "
            f"Lance's default batch size, {default_batch:,} rows)."
        )
    if not settings.lancedb:
        notes.append(f"LanceDB not measured: {settings.lancedb_note}")
    return Section(
        key="scan",
        title="Scans and LSM point lookups (issue 5)",
        intro=(
            "A full scan of a 1M-row, 10-column table, counting rows batch by batch (Lance's "
            "default batch size), and primary-key point lookups over a MemWAL table, "
            f"{LOOKUP_TASKS} concurrent tasks for the async forms. One child process per "
            "part; a warm-up pass first; configurations alternate within each round."
            if not settings.quick
            else "Quick sizes: a smaller scan table and lookup table."
        ),
        tables=[
            summary_table(
                "Full scan: medians [min–max]",
                scan_series,
                [Metric("wall_s", "wall (ms)", 1000.0, 1), Metric("rows_per_s", "rows/s", 1, 0)],
                Metric("wall_s", "wall"),
                "lance_async ÷ config (wall; above 1 = slower)",
            ),
            summary_table(
                "Scan throughput against batch_size: medians [min–max] (chart below)",
                sweep_series,
                [Metric("wall_s", "wall (ms)", 1000.0, 1), Metric("rows_per_s", "rows/s", 1, 0)],
                Metric("wall_s", "wall"),
                "lance_async ÷ config (wall; above 1 = slower)",
            ),
            summary_table(
                "Point lookups: medians [min–max]",
                lookup_series,
                [Metric("lookups_per_s", "lookups/s", 1, 1)],
                Metric("lookups_per_s", "lookups/s"),
                "lance_async ÷ config (lookups/s; above 1 = faster)",
            ),
        ],
        targets=out_targets,
        notes=notes,
        series=scan_series + lookup_series + sweep_series,
        raw={"scan_rows": scan["rows"], "found": lookups["found"]},
    )
