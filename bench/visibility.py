"""Durable is visible, across processes (issue 23): visibility lag and WAL-tail read cost.

Two measurements, side by side in one run:

visibility lag
    A writer process sends 10-row durable messages of new keys through the
    table's routing writer (default sharding: 4 buckets), one every 20 ms,
    and writes each message's ack time (``time.time()``) to a file; the
    bench process looks the acknowledged keys up with
    ``lsm_point_lookups`` in a loop and records, per message, the time from
    its ack to the first read that saw all its rows. Nobody flushes or
    reopens the writer's shards: the rows are read from the WAL tails. The
    engine-level floor without them is a memtable flush (at most
    ``max_memtable_age``, 60 s, later); LanceDB's OSS reads see only their
    own process's writer, so they have no figure to compare.

WAL-tail read cost
    One table (200,000 base rows, 4 shards) with 50,000 rows in its shards'
    WAL tails (a killed writer's acknowledged rows), read with
    ``lsm_point_lookup`` (one caller, p50), ``lsm_point_lookups`` of 1,000
    keys and a full ``lsm_scan`` of two columns; then the same rows flushed
    into generations (each shard's writer opened and closed) and the same
    reads again. The ratio is tail ÷ flushed (time).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._common import PK, Section, Settings, Table, Target, fmt_num, log, percentile

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("value", pa.float64()),
        pa.field("name", pa.string()),
    ]
)
LAG_P99_S = 1.0
TAIL_RATIO = 1.3


def _rows(ids: np.ndarray, value: float) -> pa.Table:
    return pa.table(
        {"id": ids, "value": np.full(len(ids), value), "name": [f"r{i}" for i in ids]},
        schema=SCHEMA,
    )


# -- the writer process -----------------------------------------------------------


def writer_main(uri: str, log_path: str, messages: int, rows: int, pace: float, start: int) -> None:
    """Send ``messages`` messages of new keys; append ``first_id ack_time`` per ack."""
    import anyio

    import lance_async as la

    async def run() -> None:
        ds = await la.open_dataset(uri)
        async with ds.mem_wal_writer() as w:
            with open(log_path, "a", buffering=1) as out:  # noqa: ASYNC230 (one line per ack)
                print("ready", file=out)
                for m in range(messages):
                    ids = np.arange(start + m * rows, start + (m + 1) * rows, dtype=np.int64)
                    await w.put(_rows(ids, float(m)))
                    print(f"{ids[0]} {time.time()!r}", file=out)
                    await anyio.sleep(pace)
            await anyio.sleep_forever()

    anyio.run(run)


def _spawn_writer(
    uri: str, log_path: Path, messages: int, rows: int, pace: float, start: int
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.visibility",
            "writer",
            uri,
            str(log_path),
            str(messages),
            str(rows),
            str(pace),
            str(start),
        ],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "LANCE_LOG": "critical"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _acks(log_path: Path) -> list[tuple[int, float]]:
    if not log_path.exists():
        return []
    out = []
    for line in log_path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), float(parts[1])))
    return out


def _table(uri: str, base: int) -> None:
    import lance

    ds = lance.write_dataset(_rows(np.arange(base, dtype=np.int64), -1.0), uri, mode="overwrite")
    ds.initialize_mem_wal(bucket_column="id", num_buckets=4)


def measure_lag(work: Path, messages: int, rows: int = 10, pace: float = 0.02) -> dict[str, Any]:
    """Seconds from each message's ack (in the writer's process) to its rows
    being seen by an LSM read in this process."""
    import anyio

    import lance_async as la

    uri = str(work / "visibility.lance")
    _table(uri, 1_000)
    log_path = work / "acks.txt"
    log_path.unlink(missing_ok=True)
    proc = _spawn_writer(uri, log_path, messages, rows, pace, 1_000_000)
    lags: list[float] = []
    reads = 0

    async def follow() -> None:
        nonlocal reads
        ds = await la.open_dataset(uri)
        seen: set[int] = set()
        with anyio.fail_after(120 + messages * pace * 4):
            while len(seen) < messages:
                pending = [(k, t) for k, t in _acks(log_path) if k not in seen]
                if not pending:
                    await anyio.sleep(0.001)
                    continue
                keys = [k + j for k, _ in pending for j in range(rows)]
                found = await ds.lsm.point_lookups(keys, columns=["id"])
                now = time.time()
                reads += 1
                got = set(found.column("id").to_pylist())
                for k, t in pending:
                    if all(k + j in got for j in range(rows)):
                        seen.add(k)
                        lags.append(max(0.0, now - t))

    try:
        anyio.run(follow)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    ordered = sorted(lags)
    return {
        "messages": len(lags),
        "reads": reads,
        "p50_s": percentile(ordered, 0.50),
        "p99_s": percentile(ordered, 0.99),
        "max_s": ordered[-1],
    }


def measure_tail_cost(work: Path, base: int, tail: int, lookups: int) -> dict[str, Any]:
    """Reads of a table whose ``tail`` newest rows are in WAL tails, then flushed."""
    import anyio
    import lance

    import lance_async as la

    uri = str(work / "tail.lance")
    _table(uri, base)
    log_path = work / "tail-acks.txt"
    log_path.unlink(missing_ok=True)
    messages = tail // 1_000
    proc = _spawn_writer(uri, log_path, messages, 1_000, 0.0, base - tail // 2)  # half new
    try:
        deadline = time.monotonic() + 600
        while len(_acks(log_path)) < messages:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the tail writer did not finish")
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rng = np.random.default_rng(5)
    keys = [int(k) for k in rng.integers(0, base + tail // 2, lookups)]

    async def reads() -> dict[str, float]:
        ds = await la.open_dataset(uri)
        await ds.lsm.point_lookups(keys[:10])  # warm: caches of both layouts
        one = []
        for k in keys:
            t0 = time.perf_counter()
            await ds.lsm.point_lookup(k)
            one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(5):
            await ds.lsm.point_lookups(keys[:1000])
        batch = (time.perf_counter() - t0) / 5
        scans = []
        for _ in range(3):
            t0 = time.perf_counter()
            n = 0
            async with ds.lsm.scan(columns=["id", "value"]) as stream:
                async for b in stream:
                    n += b.num_rows
            scans.append(time.perf_counter() - t0)
        return {
            "lookup_p50_ms": statistics.median(one) * 1e3,
            "lookups_1000_ms": batch * 1e3,
            "scan_ms": statistics.median(scans) * 1e3,
            "unflushed": float(sum((await ds.lsm.unflushed_rows()).values())),
            "rows": float(n),
        }

    as_tail = anyio.run(reads)
    ds = lance.dataset(uri)
    for shard in os.listdir(f"{uri}/_mem_wal"):
        if len(shard) == 36:
            ds.mem_wal_writer(shard).close()  # replays the tail and flushes it
    as_flushed = anyio.run(reads)
    return {"tail": as_tail, "flushed": as_flushed}


def run(settings: Settings, shared: dict[str, Any]) -> Section:
    """The workload: both measurements, ``settings.runs`` times (lag) and once (cost)."""
    del shared
    work = settings.work / "visibility"
    work.mkdir(parents=True, exist_ok=True)
    messages = 100 if settings.quick else 500
    lag_runs = []
    for r in range(settings.runs if not settings.quick else 1):
        log(f"visibility: lag run {r + 1}")
        lag_runs.append(measure_lag(work, messages))
    base, tail = (20_000, 5_000) if settings.quick else (200_000, 50_000)
    log("visibility: WAL-tail read cost")
    cost = measure_tail_cost(work, base, tail, 100 if settings.quick else 500)
    section = Section(
        "visibility",
        "Durable is visible across processes (issue 23)",
        __doc__.split("\n\n", 1)[1] if __doc__ else "",
    )
    section.tables.append(
        Table(
            "Visibility lag: a writer process's acked 10-row messages seen by an LSM "
            "point lookup in another process",
            ["run", "messages", "reads", "p50 (ms)", "p99 (ms)", "max (ms)"],
            [
                [
                    str(i + 1),
                    str(x["messages"]),
                    str(x["reads"]),
                    fmt_num(x["p50_s"] * 1e3, 1),
                    fmt_num(x["p99_s"] * 1e3, 1),
                    fmt_num(x["max_s"] * 1e3, 1),
                ]
                for i, x in enumerate(lag_runs)
            ],
        )
    )
    t, f = cost["tail"], cost["flushed"]
    rows = []
    ratios = []
    for key, label in (
        ("lookup_p50_ms", "lsm_point_lookup, one caller, p50 (ms)"),
        ("lookups_1000_ms", "lsm_point_lookups of 1,000 keys (ms)"),
        ("scan_ms", "lsm_scan of 2 columns (ms)"),
    ):
        ratio_value = t[key] / f[key] if f[key] else float("nan")
        ratios.append(ratio_value)
        rows.append([label, fmt_num(t[key], 2), fmt_num(f[key], 2), fmt_num(ratio_value, 2)])
    section.tables.append(
        Table(
            f"Read cost with {int(t['unflushed']):,} rows in WAL tails vs the same rows flushed "
            f"({int(t['rows']):,} rows in the LSM view)",
            ["read", "WAL tail", "flushed", "tail ÷ flushed"],
            rows,
        )
    )
    worst_p99 = max(x["p99_s"] for x in lag_runs)
    section.targets.append(
        Target(
            "visibility lag p99 (worst run)",
            f"{worst_p99 * 1e3:.0f} ms",
            f"at most {LAG_P99_S * 1e3:.0f} ms",
            worst_p99 <= LAG_P99_S,
        )
    )
    section.targets.append(
        Target(
            "LSM read cost with a 50,000-row WAL tail ÷ flushed (worst read)",
            f"{max(ratios):.2f}x",
            f"at most {TAIL_RATIO}x",
            max(ratios) <= TAIL_RATIO,
        )
    )
    section.raw = {"lag": lag_runs, "cost": cost}
    return section


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        a = sys.argv[2:]
        writer_main(a[0], a[1], int(a[2]), int(a[3]), float(a[4]), int(a[5]))
    elif sys.argv[1] == "try":  # python -m bench.visibility try: both, printed
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(measure_lag(Path(d), 200), indent=1))
            print(json.dumps(measure_tail_cost(Path(d), 200_000, 50_000, 300), indent=1))
