"""LSM reads that stay fast (issue 18): scans, lookups, cancel, NDJSON, first call, vectors.

One child process measures, on one MemWAL table:

* a sustained ingest through the routing writer with a background
  :class:`~lance_async.memwal.Compactor` (``CompactionPolicy(max_generations=8)``)
  that flushes 40+ generations of 20,000 rows over a 1M-row base (10 columns,
  BTREE index on the key); then an LSM scan of all columns by ``lance_async``
  against ``LsmScanner.from_snapshots`` over the same snapshots, and against a
  plain scan of the base table holding the same rows (after a last
  compaction);
* point lookups: one caller's p50 latency (``lance_async`` against the sync
  planner), and 16 concurrent tasks' lookups/s: ``lance_async`` (coalesced),
  ``lance_async_previous`` (the code path before issue 18: discover the
  shards, then ``LsmPointLookupPlanner`` on a worker thread per lookup) and
  LanceDB's async query with ``use_lsm(True)``; event-loop lag meanwhile;
* ``lsm_scan`` cancel: time from the cancel to the end of the task and to the
  stream's thread being free;
* the NDJSON encoding of 100,000 rows: Arrow's kernels against the previous
  ``json.dumps`` per ``to_pylist()`` row;
* the first engine call in a fresh process: loop lag max with
  ``import lance_async`` at the top against pylance imported on the loop
  (what a lazy import did);
* LSM vector search (no target): 16 tasks, k=10, 128-dimension vectors with an
  IVF_PQ index, flushed generations and a live memtable: queries/s, p50/p99
  latency and recall@10 against exact search, for ``lance_async`` (the
  writer's search, memtable included), the sync planner
  (``LsmVectorSearchPlanner``, flushed levels only) and LanceDB;
* LSM full-text search (no target; ``text_search.py``).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from . import text_search
from ._common import (
    LANCE_ASYNC,
    PK,
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
    percentile,
    query_pool,
    ratio,
    run_child,
    summary_table,
    with_ticker,
)
from .scan import SCAN_SCHEMA, scan_batches

TASKS = 16


def sizes(quick: bool) -> dict[str, int]:
    """Rows of the base, rows per memtable, generations, lookups, vector rows."""
    if quick:
        return {"base": 20_000, "gen": 1_000, "gens": 10, "lookups": 200, "vec": 2_000}
    return {"base": 1_000_000, "gen": 20_000, "gens": 42, "lookups": 2_000, "vec": 200_000}


# ---------------------------------------------------------------------------
# the child side
# ---------------------------------------------------------------------------


def _ingest(uri: str, n: dict[str, int]) -> dict[str, Any]:
    """Base table, then a sustained ingest with background compaction."""
    import anyio
    import lance

    import lance_async as la
    from lance_async.memwal import CompactionPolicy

    reader = pa.RecordBatchReader.from_batches(SCAN_SCHEMA, scan_batches(n["base"]))
    ds = lance.write_dataset(reader, uri, schema=SCAN_SCHEMA)
    ds.create_scalar_index("id", "BTREE")
    rng = np.random.default_rng(3)

    async def run() -> dict[str, Any]:
        ads = await la.open_dataset(uri)
        await ads.initialize_mem_wal(unsharded=True)
        policy = CompactionPolicy(max_generations=8, interval=0.05)
        total = n["gen"] * n["gens"]
        next_new = n["base"]
        t0 = time.perf_counter()
        async with ads.mem_wal_writer(
            compaction=policy,
            max_memtable_rows=n["gen"],
            max_put_rows=1000,
            max_wal_flush_interval_ms=5,  # durable puts, about 5-10 ms each
        ) as router:
            for batch in scan_batches(total, chunk=1000):
                m = batch.num_rows
                old = rng.integers(0, next_new, m // 2)
                new = np.arange(next_new, next_new + m - m // 2)
                next_new += len(new)
                ids = pa.array(np.concatenate([old, new]))
                await router.put(batch.set_column(0, SCAN_SCHEMA.field("id"), ids))
                await router.delete({"id": rng.integers(0, next_new, 20)})
            compactor = router.compactor
        assert compactor is not None
        stats = compactor.stats()
        snaps = await ads.lsm.snapshots()
        return {
            "ingest_s": time.perf_counter() - t0,
            "rows_put": total,
            "compactions": stats.compactions,
            "generations_compacted": stats.generations,
            "generations_left": sum(len(s.sstables) for s in snaps),
            "key_space": next_new,
        }

    result: dict[str, Any] = anyio.run(run)
    return result


def _scan_lance_async(uri: str) -> tuple[float, int]:
    import anyio

    import lance_async as la

    async def run() -> tuple[float, int]:
        ads = await la.open_dataset(uri)
        t0 = time.perf_counter()
        rows = 0
        async with ads.lsm.scan() as stream:
            async for batch in stream:
                rows += batch.num_rows
        return time.perf_counter() - t0, rows

    result: tuple[float, int] = anyio.run(run)
    return result


def _scan_lsm_scanner(uri: str) -> tuple[float, int]:
    import anyio
    import lance
    from lance.mem_wal import LsmScanner

    import lance_async as la

    async def snaps() -> Any:
        return await (await la.open_dataset(uri)).lsm.snapshots()

    raw = [s.lance for s in anyio.run(snaps)]
    ds = lance.dataset(uri)
    t0 = time.perf_counter()
    rows = LsmScanner.from_snapshots(ds, raw).to_table().num_rows
    return time.perf_counter() - t0, rows


def _scan_base(uri: str) -> tuple[float, int]:
    import lance

    ds = lance.dataset(uri)
    t0 = time.perf_counter()
    rows = sum(b.num_rows for b in ds.to_batches())
    return time.perf_counter() - t0, rows


def _lookups(uri: str, config: str, keys: list[int], lag: bool) -> dict[str, float]:
    """16 tasks looking up ``keys``; lookups/s and loop lag."""
    import anyio
    import lance
    from lance.mem_wal import LsmPointLookupPlanner

    import lance_async as la

    async def body() -> dict[str, float]:
        ads = await la.open_dataset(uri)
        if config == LANCE_ASYNC:

            async def one(key: int) -> int:
                return int((await ads.lsm.point_lookup(key)).num_rows)

        elif config == "lance_async_previous":
            base = lance.dataset(uri)

            async def one(key: int) -> int:
                snaps = await ads.lsm.snapshots()
                raw = [s.lance for s in snaps]

                def plan() -> int:
                    planner = LsmPointLookupPlanner(base, raw, ["id"])
                    return int(planner.plan_lookup(pa.array([key], pa.int64())).to_table().num_rows)

                return await anyio.to_thread.run_sync(plan)

        else:  # lancedb_async
            import lancedb

            db = await lancedb.connect_async(str(Path(uri).parent))
            tbl = await db.open_table(Path(uri).name.removesuffix(".lance"))

            async def one(key: int) -> int:
                query = tbl.query().where(f"id = {key}").use_lsm(True).limit(1)
                return int((await query.to_arrow()).num_rows)

        pending = list(keys)
        found = 0

        async def op() -> int:
            nonlocal found

            async def worker() -> None:
                nonlocal found
                while pending:
                    rows = await one(pending.pop())
                    found += rows

            async with anyio.create_task_group() as tg:
                for _ in range(TASKS):
                    tg.start_soon(worker)
            return found

        t0 = time.perf_counter()
        _, stats = await with_ticker(op, lag)
        return {"lookups_per_s": len(keys) / (time.perf_counter() - t0), "found": found, **stats}

    result: dict[str, float] = anyio.run(body, backend="asyncio")
    return result


def _lookup_latency(uri: str, keys: list[int]) -> dict[str, float]:
    """One caller: p50 latency of lance_async and of the sync planner (ms)."""
    import anyio
    import lance
    from lance.mem_wal import LsmPointLookupPlanner

    import lance_async as la

    async def body() -> list[float]:
        ads = await la.open_dataset(uri)
        out = []
        for key in keys:
            t0 = time.perf_counter()
            await ads.lsm.point_lookup(key)
            out.append(time.perf_counter() - t0)
        return out

    mine = anyio.run(body)

    async def snaps() -> Any:
        return await (await la.open_dataset(uri)).lsm.snapshots()

    planner = LsmPointLookupPlanner(lance.dataset(uri), [s.lance for s in anyio.run(snaps)], ["id"])
    theirs = []
    for key in keys:
        t0 = time.perf_counter()
        planner.plan_lookup(pa.array([key], pa.int64())).to_table()
        theirs.append(time.perf_counter() - t0)
    return {
        "lance_async_p50_ms": statistics.median(mine) * 1000,
        "pylance_sync_p50_ms": statistics.median(theirs) * 1000,
    }


def _cancel(uri: str) -> dict[str, float]:
    """Cancel an lsm_scan after its first batch: ms to the task's end and to a free thread."""
    import anyio

    import lance_async as la
    from lance_async._threads import reader_limiter

    async def body() -> dict[str, float]:
        ads = await la.open_dataset(uri)
        marks: dict[str, float] = {}
        with anyio.CancelScope() as scope:
            async with ads.lsm.scan(batch_size=1024) as stream:
                async for _b in stream:
                    marks["cancel"] = time.perf_counter()
                    scope.cancel()
                    await anyio.sleep(10)
        marks["ended"] = time.perf_counter()
        while reader_limiter().borrowed_tokens:  # noqa: ASYNC110
            await anyio.sleep(0.001)
        marks["free"] = time.perf_counter()
        return {
            "task_end_ms": (marks["ended"] - marks["cancel"]) * 1000,
            "thread_free_ms": (marks["free"] - marks["cancel"]) * 1000,
        }

    result: dict[str, float] = anyio.run(body)
    return result


def _ndjson(uri: str) -> dict[str, float]:
    import lance

    from lance_async.web.responses import _dumps, ndjson_bytes

    table = lance.dataset(uri).to_table(limit=100_000)
    t0 = time.perf_counter()
    ndjson_bytes(table)
    t1 = time.perf_counter()
    ("\n".join(_dumps(r) for r in table.to_pylist()) + "\n").encode()
    t2 = time.perf_counter()
    return {"arrow_s": t1 - t0, "previous_s": t2 - t1, "rows": float(table.num_rows)}


FIRST_CALL = """
import sys, time
{prelude}
import anyio

async def main():
    lags, stop = [], False
    async def ticker():
        while not stop:
            a = time.perf_counter(); await anyio.sleep(0.001)
            lags.append(time.perf_counter() - a - 0.001)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.02)
        {call}
        await anyio.sleep(0.02)
        stop = True
    print(max(lags) * 1000)

anyio.run(main)
"""


def _first_call(uri: str) -> dict[str, float]:
    cases = {
        LANCE_ASYNC: (
            "import lance_async as la",
            f"await (await la.open_dataset({uri!r})).count_rows()",
        ),
        "pylance_imported_on_the_loop": (
            "",
            f"import lance; lance.dataset({uri!r}).count_rows()",
        ),
    }
    out: dict[str, float] = {}
    for name, (prelude, call) in cases.items():
        code = FIRST_CALL.format(prelude=prelude, call=call)
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        out[name] = float(proc.stdout.strip().splitlines()[-1])
    return out


def _vectors(root: str, n_rows: int, lancedb: bool) -> dict[str, Any]:
    """LSM vector search: 16 tasks, k=10, 128 dims, IVF_PQ, gens + a live memtable."""
    import anyio
    import lance
    from lance.mem_wal import LsmVectorSearchPlanner

    import lance_async as la

    dim, k = 128, 10
    rng = np.random.default_rng(9)
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK),
            pa.field("v", pa.list_(pa.float32(), dim)),
        ]
    )

    def table(ids: np.ndarray) -> pa.Table:
        vecs = rng.random((len(ids), dim), dtype=np.float32)
        flat = pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), dim)
        return pa.table({"id": pa.array(ids), "v": flat}, schema=schema)

    uri = f"{root}/vectors.lance"
    truth: dict[int, np.ndarray] = {}
    base = table(np.arange(n_rows))
    ds = lance.write_dataset(base, uri)
    parts = max(4, int(math.sqrt(n_rows) / 4))
    ds.create_index("v", "IVF_PQ", num_partitions=parts, num_sub_vectors=16)
    for i, v in zip(base["id"].to_pylist(), base["v"].to_numpy(zero_copy_only=False), strict=True):
        truth[i] = v
    queries = rng.random((64, dim), dtype=np.float32)
    out: dict[str, Any] = {}

    async def run() -> None:
        ads = await la.open_dataset(uri)
        await ads.initialize_mem_wal(manual_shards=True)
        gen = max(500, n_rows // 50)
        async with ads.mem_wal_writer(
            "6b9c3c0e-5a51-4b5e-9a3f-4a1d5d2b7f10", max_memtable_rows=gen, durable_write=False
        ) as w:
            for _ in range(3):  # three flushed generations of updates, then a live memtable
                upd = table(rng.choice(n_rows, gen, replace=False))
                await w.put(upd)
                truth.update(
                    zip(upd["id"].to_pylist(), upd["v"].to_numpy(zero_copy_only=False), strict=True)
                )
            live = table(rng.choice(n_rows, gen // 2, replace=False))
            await w.put(live)
            truth.update(
                zip(live["id"].to_pylist(), live["v"].to_numpy(zero_copy_only=False), strict=True)
            )
            await w.wait_flushed()
            ids = np.array(list(truth))
            mat = np.stack([truth[i] for i in ids])
            exact = [set(ids[np.argsort(((mat - q) ** 2).sum(1))[:k]].tolist()) for q in queries]

            async def measure(search: Any) -> dict[str, float]:
                async def one(i: int) -> list[int]:
                    found: list[int] = await search(queries[i])
                    return found

                out = await query_pool(len(queries), one, TASKS, exact)
                out["recall_at_10"] = out.pop("hits") / (k * len(queries))
                return out

            async def mine(q: np.ndarray) -> list[int]:
                res = await w.lsm.vector_search(
                    q, column="v", k=k, columns=["id"], nprobes=20, refine_factor=5
                )
                return [int(x) for x in res.column("id").to_pylist()]

            out[LANCE_ASYNC] = await measure(mine)
            snaps = [s.lance for s in await ads.lsm.snapshots()]
            planner = LsmVectorSearchPlanner(lance.dataset(uri), snaps, "v", pk_columns=["id"])

            async def sync_planner(q: np.ndarray) -> list[int]:
                def go() -> list[int]:
                    plan = planner.plan_search(
                        pa.array(q), k=k, nprobes=20, columns=["id", "_distance"]
                    )
                    return [int(x) for x in plan.to_table().column("id").to_pylist()]

                return await anyio.to_thread.run_sync(go)

            out["pylance_planner_to_thread"] = await measure(sync_planner)
            if lancedb:
                try:
                    import lancedb as ldb

                    db = await ldb.connect_async(root)
                    tbl = await db.open_table("vectors")

                    async def theirs(q: np.ndarray) -> list[int]:
                        query = tbl.query().nearest_to(q).column("v").limit(k).use_lsm(True)
                        return [int(x) for x in (await query.to_arrow()).column("id").to_pylist()]

                    out["lancedb_async"] = await measure(theirs)
                except Exception as exc:
                    out["lancedb_note"] = f"LanceDB vector query failed: {exc!r}"[:300]

    anyio.run(run, backend="asyncio")
    out["rows"] = n_rows
    return out


def child_lsm(root: str, quick: bool, runs: int, lancedb: bool) -> dict[str, Any]:
    """Every measurement of this workload, in one process (child side)."""
    n = sizes(quick)
    uri = f"{root}/lsm.lance"
    out: dict[str, Any] = {"sizes": n, "ingest": _ingest(uri, n)}
    scans: dict[str, list[float]] = {LANCE_ASYNC: [], "pylance_lsm_scanner": []}
    rows: dict[str, set[int]] = {
        LANCE_ASYNC: set(),
        "pylance_lsm_scanner": set(),
        "base_scan": set(),
    }
    _scan_lance_async(uri)  # warm-up: generation keys read once
    for _ in range(runs):
        for name, fn in (
            (LANCE_ASYNC, _scan_lance_async),
            ("pylance_lsm_scanner", _scan_lsm_scanner),
        ):
            seconds, count = fn(uri)
            scans[name].append(seconds)
            rows[name].add(count)
    rng = random.Random(11)
    keys = [rng.randrange(out["ingest"]["key_space"] + 1000) for _ in range(n["lookups"])]
    out["latency"] = _lookup_latency(uri, keys[: min(300, len(keys))])
    configs = [LANCE_ASYNC, "lance_async_previous"] + (["lancedb_async"] if lancedb else [])
    lookups: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    for _ in range(runs):
        for c in configs:
            few = keys if c == LANCE_ASYNC else keys[: max(64, len(keys) // 8)]
            lookups[c].append(_lookups(uri, c, few, lag=c == LANCE_ASYNC))
    out["cancel"] = [_cancel(uri) for _ in range(3)]
    out["first_call"] = [_first_call(uri) for _ in range(2 if quick else 3)]
    out["ndjson"] = [_ndjson(uri) for _ in range(runs)]
    # the same rows in the base table alone: compact what is left, then scan the base
    import anyio

    import lance_async as la

    async def compact() -> None:
        await (await la.open_dataset(uri)).compact_mem_wal(optimize_indices=False)

    anyio.run(compact)
    scans["base_scan"] = []
    for _ in range(runs):
        seconds, count = _scan_base(uri)
        scans["base_scan"].append(seconds)
        rows["base_scan"].add(count)
    out["scans"] = scans
    out["scan_rows"] = {k: sorted(v) for k, v in rows.items()}
    out["lookups"] = lookups
    log_line = f"lsm child: vectors ({n['vec']:,} rows)"
    print(log_line, file=sys.stderr, flush=True)
    out["vectors"] = _vectors(root, n["vec"], lancedb)
    print("lsm child: full-text search", file=sys.stderr, flush=True)
    out["text"] = text_search.measure(root, quick)
    return out


# ---------------------------------------------------------------------------
# round three (issue 39): WAL-tail reads beside flushed ones, many generations
# ---------------------------------------------------------------------------

TAIL_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("value", pa.float64()),
        pa.field("name", pa.string()),
    ]
)


def round3_sizes(quick: bool) -> dict[str, int]:
    """Base rows and tail rows of the WAL-tail table; rows and rows per
    generation of the many-generations table; lookups per run."""
    if quick:
        return {"base": 20_000, "tail": 2_000, "rows": 60_000, "gen": 1_000, "lookups": 100}
    return {"base": 200_000, "tail": 20_000, "rows": 1_200_000, "gen": 20_000, "lookups": 300}


def _tail_rows(ids: np.ndarray, value: float) -> pa.Table:
    return pa.table(
        {"id": ids, "value": np.full(len(ids), value), "name": [f"r{i}" for i in ids]},
        schema=TAIL_SCHEMA,
    )


def tail_writer_main(uri: str, rows: int, per: int, key_space: int) -> None:
    """Put ``rows`` rows in durable puts of ``per`` keys (8 tasks, a WAL flush
    every millisecond: about one WAL entry per put), print ``done``, hang."""
    import anyio

    import lance_async as la

    async def run() -> None:
        ds = await la.open_dataset(uri)
        rng = np.random.default_rng(1)
        sent = 0
        async with ds.mem_wal_writer(max_wal_flush_interval_ms=1, min_put_interval=0.0) as w:

            async def task() -> None:
                nonlocal sent
                while sent < rows:
                    sent += per
                    ids = np.unique(rng.integers(0, key_space, per))
                    await w.put(_tail_rows(ids, 1.0))

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(task)
            print("done", flush=True)
            await anyio.sleep_forever()

    anyio.run(run)


TAIL_READS = """
import json, statistics, sys, time
import anyio, numpy as np
import lance_async as la

async def main(uri, lookups):
    ds = await la.open_dataset(uri)
    t0 = time.perf_counter()
    await ds.lsm.point_lookup(5)
    first = time.perf_counter() - t0
    keys = np.random.default_rng(7).integers(0, {key_space}, lookups)
    lat = []
    for k in keys:
        t0 = time.perf_counter()
        await ds.lsm.point_lookup(int(k))
        lat.append(time.perf_counter() - t0)
    lat.sort()
    scans = []
    for _ in range(20):
        t0 = time.perf_counter()
        await ds.lsm.scan(filter="id < 500").to_table()
        scans.append(time.perf_counter() - t0)
    print(json.dumps({{
        "first_ms": first * 1e3,
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3,
        "scan_p50_ms": statistics.median(scans) * 1e3,
        "unflushed": sum((await ds.lsm.unflushed_rows()).values()),
    }}))

anyio.run(main, sys.argv[1], int(sys.argv[2]))
"""


def _tail_tables(root: str, n: dict[str, int]) -> dict[str, Any]:
    """A table whose newest rows sit in WAL tails (the writer killed), and a
    copy of it with those rows flushed (each shard's writer opened and closed)."""
    import os
    import shutil
    import signal

    import lance

    tail = f"{root}/tail.lance"
    flushed = f"{root}/flushed.lance"
    shutil.rmtree(tail, ignore_errors=True)
    shutil.rmtree(flushed, ignore_errors=True)
    ds = lance.write_dataset(_tail_rows(np.arange(n["base"]), -1.0), tail)
    ds.create_scalar_index("id", "BTREE")
    ds.initialize_mem_wal(bucket_column="id", num_buckets=4)
    key_space = n["base"] + n["tail"] // 2
    t0 = time.perf_counter()
    args = ["tail-writer", tail, str(n["tail"]), "2", str(key_space)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.lsm", *args],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "LANCE_LOG": "critical"},
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "done":
            raise RuntimeError("the tail writer did not finish")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    written = time.perf_counter() - t0
    shards = [s for s in os.listdir(f"{tail}/_mem_wal") if len(s) == 36]
    entries = sum(len(os.listdir(f"{tail}/_mem_wal/{s}/wal")) for s in shards)
    shutil.copytree(tail, flushed)
    copy = lance.dataset(flushed)
    for shard in shards:
        copy.mem_wal_writer(shard).close()  # replays the tail and flushes it
    return {
        "tail": tail,
        "flushed": flushed,
        "entries": entries,
        "shards": len(shards),
        "write_s": written,
        "key_space": key_space,
    }


def _generations(root: str, n: dict[str, int], runs: int) -> dict[str, Any]:
    """``n["rows"]`` rows ingested into generations of ``n["gen"]`` rows (4
    shards), nothing compacted; a copy compacted; LSM scans of the table and
    base scans of the copy, alternating; then LSM lookups."""
    import shutil

    import anyio
    import lance

    import lance_async as la

    uri = f"{root}/gens.lance"
    shutil.rmtree(uri, ignore_errors=True)
    cols: dict[str, Callable[[np.ndarray], object]] = {
        "value": lambda ids: ids * 0.5,
        "name": lambda ids: [f"n{i}" for i in ids],
    }

    def rows(lo: int, hi: int) -> pa.Table:
        ids = np.arange(lo, hi, dtype=np.int64)
        return pa.table({"id": ids, **{k: f(ids) for k, f in cols.items()}}, schema=TAIL_SCHEMA)

    async def ingest() -> int:
        ds = await la.write_dataset(rows(0, 0), uri)
        await ds.create_scalar_index("id", "BTREE")
        await ds.initialize_mem_wal()
        async with ds.mem_wal_writer(max_memtable_rows=n["gen"]) as w:
            step = max(1, n["gen"] // 2)
            for lo in range(0, n["rows"], step):
                await w.put(rows(lo, min(lo + step, n["rows"])))
        return sum(len(s.sstables) for s in await ds.lsm.snapshots())

    generations = anyio.run(ingest)
    rng = np.random.default_rng(11)
    keys = [int(k) for k in rng.integers(0, n["rows"] + n["rows"] // 10, n["lookups"])]

    compacted = f"{root}/gens-compacted.lance"
    shutil.rmtree(compacted, ignore_errors=True)
    shutil.copytree(uri, compacted)

    async def compact() -> None:
        await (await la.open_dataset(compacted)).compact_mem_wal(optimize_indices=False)

    anyio.run(compact)
    base = lance.dataset(compacted)

    async def reads() -> dict[str, Any]:
        """The LSM scan and the base scans alternating, round by round (the
        machine's load then weighs on both alike); then the lookups."""
        ds = await la.open_dataset(uri)
        plain = await la.open_dataset(compacted)
        out: dict[str, Any] = {"scan_s": [], "base_scan_s": [], "base_async_scan_s": []}
        for i in range(2 * runs + 1):
            t0 = time.perf_counter()
            count = 0
            async with ds.lsm.scan() as stream:
                async for batch in stream:
                    count += batch.num_rows
            if i == 0:
                out["first_scan_s"] = time.perf_counter() - t0  # generations' keys read
                continue
            out["scan_s"].append(time.perf_counter() - t0)
            out["rows"] = count
            t0 = time.perf_counter()
            out["base_rows"] = sum(b.num_rows for b in base.to_batches())
            out["base_scan_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            async with plain.scan() as stream:
                async for _batch in stream:
                    pass
            out["base_async_scan_s"].append(time.perf_counter() - t0)
        lat = []
        for k in keys:
            t0 = time.perf_counter()
            await ds.lsm.point_lookup(k)
            lat.append(time.perf_counter() - t0)
        out["lookup_p50_ms"] = statistics.median(lat) * 1e3
        out["lookup_p99_ms"] = percentile(sorted(lat), 0.99) * 1e3
        return out

    result: dict[str, Any] = anyio.run(reads)
    result["generations"] = generations
    return result


def child_round3(root: str, quick: bool, runs: int) -> dict[str, Any]:
    """Issue 39's measurements, side by side in one run (child side)."""
    n = round3_sizes(quick)
    made = _tail_tables(root, n)
    import os

    tables = {"wal_tail": made["tail"], "flushed": made["flushed"]}
    reads: dict[str, list[dict[str, float]]] = {label: [] for label in tables}
    code = TAIL_READS.format(key_space=made["key_space"])
    for _ in range(runs):  # alternating, each a fresh process
        for label, uri in tables.items():
            proc = subprocess.run(
                [sys.executable, "-c", code, uri, str(n["lookups"])],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "LANCE_LOG": "critical"},
            )
            reads[label].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {
        "sizes": n,
        "tail": {k: v for k, v in made.items() if k not in ("tail", "flushed")},
        "reads": reads,
        "generations": _generations(root, n, runs),
    }


# ---------------------------------------------------------------------------
# the parent side
# ---------------------------------------------------------------------------

SCAN_VS_BASE = 3.0
SCAN_VS_LSMSCANNER = 5.0
LOOKUP_P50_MS = 5.0
VS_LANCEDB = 2.0
VS_PREVIOUS = 5.0
LAG_P99_MS = 5.0
NDJSON_SPEEDUP = 5.0
FIRST_CALL_LAG_MS = 20.0
CANCEL_MS = 100.0


TAIL_P50_RATIO = 1.3
TAIL_FIRST_RATIO = 3.0
TAIL_SCAN_RATIO = 1.5
GENS_SCAN_VS_BASE = 3.0
GENS_LOOKUP_P50_MS = 6.0


def round3_parts(res: dict[str, Any]) -> tuple[list[Table], list[Target], list[str]]:
    """Issue 39's tables, targets and notes from :func:`child_round3`'s result."""
    n, tail, reads, gens = res["sizes"], res["tail"], res["reads"], res["generations"]

    def med(label: str, key: str) -> float:
        values: list[float] = [r[key] for r in reads[label]]
        return statistics.median(values)

    def span(label: str, key: str) -> str:
        values = [r[key] for r in reads[label]]
        return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"

    rows = []
    targets = []
    for key, label, limit in (
        ("first_ms", "first lsm_point_lookup in a fresh process (ms)", TAIL_FIRST_RATIO),
        ("p50_ms", f"lsm_point_lookup x{n['lookups']}, p50 (ms)", TAIL_P50_RATIO),
        ("p99_ms", f"lsm_point_lookup x{n['lookups']}, p99 (ms)", None),
        ("scan_p50_ms", "lsm_scan(filter='id < 500'), p50 of 20 (ms)", TAIL_SCAN_RATIO),
    ):
        r = ratio(med("wal_tail", key), med("flushed", key))
        rows.append([label, span("wal_tail", key), span("flushed", key), fmt_ratio(r)])
        if limit is not None:
            targets.append(
                Target(
                    f"{n['tail']:,} rows in WAL tails ({tail['entries']:,} entries, "
                    f"{tail['shards']} shards): {label} ÷ the same rows flushed",
                    f"{fmt_vs_limit(r, limit)} ({med('wal_tail', key):.2f} vs "
                    f"{med('flushed', key):.2f} ms)",
                    f"≤ {limit}x",
                    r <= limit,
                )
            )
    tables = [
        Table(
            f"WAL tail vs flushed, medians [min–max] of {len(reads['wal_tail'])} fresh "
            "processes each (alternating)",
            ["read", "WAL tail", "flushed", "tail ÷ flushed"],
            rows,
        )
    ]
    scan, base = statistics.median(gens["scan_s"]), statistics.median(gens["base_scan_s"])
    base_async = statistics.median(gens["base_async_scan_s"])
    r_base = ratio(scan, base)
    tables.append(
        Table(
            f"{n['rows']:,} rows in {gens['generations']} generations "
            f"(max_memtable_rows={n['gen']:,}, 4 shards), all columns",
            ["read", "median (ms)", "min–max (ms)"],
            [
                [
                    "lsm_scan (warm)",
                    f"{scan * 1e3:.1f}",
                    f"{min(gens['scan_s']) * 1e3:.1f}–{max(gens['scan_s']) * 1e3:.1f}",
                ],
                ["lsm_scan, first of the process", f"{gens['first_scan_s'] * 1e3:.1f}", ""],
                [
                    "base scan after compaction, pylance to_batches",
                    f"{base * 1e3:.1f}",
                    f"{min(gens['base_scan_s']) * 1e3:.1f}–{max(gens['base_scan_s']) * 1e3:.1f}",
                ],
                ["base scan after compaction, lance_async scan()", f"{base_async * 1e3:.1f}", ""],
                [
                    f"lsm_point_lookup x{n['lookups']}, p50 / p99",
                    f"{gens['lookup_p50_ms']:.2f} / {gens['lookup_p99_ms']:.2f}",
                    "",
                ],
            ],
        )
    )
    targets.append(
        Target(
            f"full lsm_scan over {gens['generations']} generations ÷ base scan of the same "
            "rows after compaction",
            f"{fmt_vs_limit(r_base, GENS_SCAN_VS_BASE)} ({scan * 1e3:.0f} vs {base * 1e3:.0f} ms;"
            f" vs lance_async's base scan {ratio(scan, base_async):.2f}x)",
            f"≤ {GENS_SCAN_VS_BASE:.0f}x",
            r_base <= GENS_SCAN_VS_BASE,
        )
    )
    targets.append(
        Target(
            f"lsm_point_lookup p50 over {gens['generations']} generations",
            f"{gens['lookup_p50_ms']:.2f} ms",
            f"≤ {GENS_LOOKUP_P50_MS:.0f} ms",
            gens["lookup_p50_ms"] <= GENS_LOOKUP_P50_MS,
        )
    )
    notes = [
        f"WAL tails: {n['tail']:,} rows put through the routing writer in durable puts of 2 "
        f"keys from 8 tasks ({tail['entries']:,} WAL entries in {tail['write_s']:.0f} s), "
        "the writer then killed; the flushed copy had each shard's writer opened and closed. "
        "Every read row is a fresh process (the first lookup includes opening no writer and "
        "reading the tails' checkpoints, which the writer and earlier readers wrote).",
        f"Rows seen by the scans (must agree): LSM {gens['rows']:,}, base {gens['base_rows']:,}.",
    ]
    return tables, targets, notes


def run(settings: Settings, shared: dict[str, Any]) -> Section:
    """Measure issue 18's LSM read targets."""
    root = settings.work / "lsm"
    root.mkdir(parents=True, exist_ok=True)
    flavour = "lancedb" if settings.lancedb else "lance"
    res = run_child(
        "bench.lsm:child_lsm",
        {
            "root": str(root),
            "quick": settings.quick,
            "runs": min(settings.runs, 3),
            "lancedb": settings.lancedb,
        },
        timeout=1800.0,
        flavour=flavour,
    )
    log("lsm: round three (WAL tails, many generations)")
    round3 = run_child(
        "bench.lsm:child_round3",
        {"root": str(root), "quick": settings.quick, "runs": min(settings.runs, 3)},
        timeout=1800.0,
    )
    log("lsm: done")
    n, ing = res["sizes"], res["ingest"]
    case = f"{n['base']:,} base rows + {ing['rows_put']:,} rows ingested"
    scan_series = [
        Series(case, c, [{"wall_s": s} for s in secs]) for c, secs in res["scans"].items()
    ]
    lookup_series = [Series(f"{TASKS} tasks", c, runs) for c, runs in res["lookups"].items()]
    targets: list[Target] = []
    mine = find(scan_series, case, LANCE_ASYNC)
    base = find(scan_series, case, "base_scan")
    theirs = find(scan_series, case, "pylance_lsm_scanner")
    if mine and base and theirs:
        r_base = ratio(mine.median("wall_s"), base.median("wall_s"))
        r_lsm = ratio(theirs.median("wall_s"), mine.median("wall_s"))
        targets.append(
            Target(
                "LSM scan, all columns, after a sustained ingest with background compaction: "
                "lance_async time ÷ base-table scan of the same rows",
                f"{fmt_vs_limit(r_base, SCAN_VS_BASE)} ({mine.median('wall_s') * 1000:.0f} vs "
                f"{base.median('wall_s') * 1000:.0f} ms)",
                f"≤ {SCAN_VS_BASE:.0f}x",
                r_base <= SCAN_VS_BASE,
            )
        )
        targets.append(
            Target(
                "LSM scan: LsmScanner time ÷ lance_async time, same snapshots",
                f"{fmt_vs_limit(r_lsm, SCAN_VS_LSMSCANNER, at_most=False)} "
                f"({theirs.median('wall_s') * 1000:.0f} vs {mine.median('wall_s') * 1000:.0f} ms)",
                f"≥ {SCAN_VS_LSMSCANNER:.0f}x",
                r_lsm >= SCAN_VS_LSMSCANNER,
            )
        )
    p50 = res["latency"]["lance_async_p50_ms"]
    targets.append(
        Target(
            "point lookup p50, one caller, BTREE index on the key",
            f"{p50:.2f} ms (sync planner {res['latency']['pylance_sync_p50_ms']:.2f} ms)",
            f"≤ {LOOKUP_P50_MS:.0f} ms",
            p50 <= LOOKUP_P50_MS,
        )
    )
    la_l = find(lookup_series, f"{TASKS} tasks", LANCE_ASYNC)
    for other, limit in (("lancedb_async", VS_LANCEDB), ("lance_async_previous", VS_PREVIOUS)):
        them = find(lookup_series, f"{TASKS} tasks", other)
        if la_l and them:
            r = ratio(la_l.median("lookups_per_s"), them.median("lookups_per_s"))
            targets.append(
                Target(
                    f"{TASKS} concurrent lookups: lance_async lookups/s ÷ {other}'s",
                    fmt_vs_limit(r, limit, at_most=False),
                    f"≥ {limit:.0f}x",
                    r >= limit,
                )
            )
    if la_l:
        lag = la_l.median("lag_p99_ms")
        targets.append(
            Target(
                f"event-loop lag p99 during {TASKS} concurrent lookups",
                f"{lag:.2f} ms",
                f"≤ {LAG_P99_MS:.0f} ms",
                lag <= LAG_P99_MS,
            )
        )
    nd = statistics.median(r["previous_s"] / r["arrow_s"] for r in res["ndjson"])
    targets.append(
        Target(
            "NDJSON response body of 100,000 rows: previous encoding time ÷ Arrow's",
            fmt_vs_limit(nd, NDJSON_SPEEDUP, at_most=False),
            f"≥ {NDJSON_SPEEDUP:.0f}x",
            nd >= NDJSON_SPEEDUP,
        )
    )
    first = max(r[LANCE_ASYNC] for r in res["first_call"])
    before = statistics.median(r["pylance_imported_on_the_loop"] for r in res["first_call"])
    targets.append(
        Target(
            "first engine call in a fresh process: loop lag max (worst of the runs)",
            f"{first:.1f} ms (pylance imported on the loop: {before:.0f} ms)",
            f"< {FIRST_CALL_LAG_MS:.0f} ms",
            first < FIRST_CALL_LAG_MS,
        )
    )
    cancel = max(r["task_end_ms"] for r in res["cancel"])
    free = max(r["thread_free_ms"] for r in res["cancel"])
    targets.append(
        Target(
            "lsm_scan cancel: the task ends (worst of the runs)",
            f"{cancel:.1f} ms (its thread free after {free:.1f} ms)",
            f"≤ {CANCEL_MS:.0f} ms",
            cancel <= CANCEL_MS and free <= CANCEL_MS,
        )
    )
    vec = res["vectors"]
    vec_series = [
        Series(f"{vec['rows']:,} x 128-d, IVF_PQ, 3 generations + memtable", c, [m])
        for c, m in vec.items()
        if isinstance(m, dict)
    ]
    notes = [
        f"Ingest: {ing['rows_put']:,} rows in 1,000-row puts plus 20 deletes each, "
        f"max_memtable_rows={n['gen']:,} ({n['gens']} generations flushed) in "
        f"{ing['ingest_s']:.1f} s; the compactor merged {ing['generations_compacted']} "
        f"generations in {ing['compactions']} compactions; {ing['generations_left']} were "
        "left for the scans.",
        "Rows per scan (must agree): "
        + ", ".join(f"{c}: {v}" for c, v in res["scan_rows"].items()),
        "Lookups: lance_async_previous and LanceDB ran on an eighth of the keys (they are "
        "slow); the ratios compare lookups/s.",
        "Vector search has no target yet; recall is against exact search over every "
        "level's newest rows. The sync planner does not see the live memtable.",
    ]
    if "lancedb_note" in vec:
        notes.append(vec["lancedb_note"])
    if not settings.lancedb:
        notes.append(f"LanceDB not measured: {settings.lancedb_note}")
    text_table, text_series = text_search.table(res["text"])
    r3_tables, r3_targets, r3_notes = round3_parts(round3)
    targets += r3_targets
    notes += r3_notes
    return Section(
        key="lsm",
        title="LSM reads that stay fast (issues 18 and 39)",
        intro=(
            "A 1M-row, 10-column base with a BTREE key index, a sustained MemWAL ingest of "
            "42 generations through the routing writer with background compaction, then "
            "scans, lookups, cancels; plus NDJSON encoding, the first engine call and LSM "
            "vector search. One child process; the first-call runs are fresh processes."
            if not settings.quick
            else "Quick sizes: a 20k-row base and 10 generations of 1,000 rows (a smoke run)."
        ),
        tables=[
            summary_table(
                "LSM scan, all columns: medians [min–max]",
                scan_series,
                [Metric("wall_s", "wall (ms)", 1000.0, 1)],
                Metric("wall_s", "wall"),
                "lance_async ÷ config (wall; above 1 = slower)",
            ),
            summary_table(
                f"{TASKS} concurrent point lookups: medians [min–max]",
                lookup_series,
                [
                    Metric("lookups_per_s", "lookups/s", 1, 1),
                    Metric("lag_p99_ms", "loop lag p99 (ms)", 1, 2),
                ],
                Metric("lookups_per_s", "lookups/s"),
                "lance_async ÷ config (lookups/s; above 1 = faster)",
            ),
            summary_table(
                f"LSM vector search, {TASKS} tasks, k=10 (no target)",
                vec_series,
                [
                    Metric("qps", "queries/s", 1, 1),
                    Metric("p50_ms", "p50 (ms)", 1, 1),
                    Metric("p99_ms", "p99 (ms)", 1, 1),
                    Metric("recall_at_10", "recall@10", 1, 2),
                ],
                Metric("qps", "queries/s"),
                "lance_async ÷ config (queries/s; above 1 = faster)",
            ),
            text_table,
            *r3_tables,
        ],
        targets=targets,
        notes=notes,
        series=scan_series + lookup_series + vec_series + text_series,
        raw={
            **{
                k: res[k]
                for k in ("ingest", "latency", "cancel", "first_call", "ndjson", "scan_rows")
            },
            "round3": round3,
        },
    )


if __name__ == "__main__":
    if sys.argv[1] == "tail-writer":  # the killed writer of child_round3
        tail_writer_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "round3":  # python -m bench.lsm round3 [--quick]: issue 39 alone
        import tempfile

        with tempfile.TemporaryDirectory() as work:
            quick = "--quick" in sys.argv
            result = child_round3(work, quick, 3)
            for table in round3_parts(result)[0]:
                print(f"\n{table.title}")
                for row in table.rows:
                    print("  " + " | ".join(row))
            for target in round3_parts(result)[1]:
                print(target.line())
            print(json.dumps(result, indent=1, default=str))
