"""``python -m bench.soak``: a long ingest with the default compaction plus clean-up (issue 37).

Not part of ``python -m bench`` (it runs for minutes by design). One process
ingests small durable messages over ``--keys`` keys through the routing
writer with the default :class:`~lance_async.CompactionPolicy` (its
clean-up at ``--retention``); another process reads (batched LSM point
lookups, one scan a minute) and reports its RSS; this process samples the
table's folder every ``--sample`` seconds: WAL files, generation folders,
shard manifests, versions, bytes. At the end every key is checked against
the last value the writer acknowledged for it.

Prints one JSON line per sample and a summary (also written to
``--out``): the bounds asked for are WAL files and generation folders that
stop growing with time, a table under 3x the live data plus the
retention's worth, no lost or stale row, and reader RSS growing at most
10 % from minute 5 of the run to its end (the writer's RSS is sampled too).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = pa.schema(
    [
        pa.field(
            "id",
            pa.int64(),
            nullable=False,
            metadata={"lance-schema:unenforced-primary-key": "true"},
        ),
        pa.field("value", pa.int64()),
        pa.field("payload", pa.string()),
    ]
)


def rss_mb(pid: int | None = None) -> float:
    """Resident set size in MB (Linux /proc)."""
    path = f"/proc/{pid or os.getpid()}/status"
    for line in Path(path).read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def folder(uri: str) -> dict[str, Any]:
    root = Path(uri)
    wal = gens = manifests = 0
    for shard in (root / "_mem_wal").glob("*"):
        if not shard.is_dir():
            continue
        wal += sum(1 for _ in (shard / "wal").glob("*.arrow"))
        manifests += sum(1 for _ in (shard / "manifest").glob("*.binpb"))
        gens += sum(1 for p in shard.iterdir() if "_gen_" in p.name)
    size = 0
    for f in root.rglob("*"):
        try:
            size += f.stat().st_size if f.is_file() else 0
        except FileNotFoundError:  # removed by a clean-up meanwhile
            continue
    versions = sum(1 for _ in (root / "_versions").glob("*.manifest"))
    return {
        "wal_files": wal,
        "generations": gens,
        "manifests": manifests,
        "versions": versions,
        "mb": round(size / 1e6, 2),
    }


async def writer(
    uri: str, seconds: float, rate: float, keys: int, retention: float, log: str
) -> None:
    import lance_async as la

    ds = await la.open_dataset(uri)
    policy = la.CompactionPolicy(
        retention=timedelta(seconds=retention), cleanup_interval=min(60.0, max(5.0, retention / 2))
    )
    rng = random.Random(1)
    last: dict[int, int] = {}
    sent = 0
    start = time.monotonic()
    async with ds.mem_wal_writer(compaction=policy) as router:
        while time.monotonic() - start < seconds:
            batch = [rng.randrange(keys) for _ in range(1)]
            sent += 1
            table = pa.table(
                {"id": batch, "value": [sent] * len(batch), "payload": ["x" * 64] * len(batch)},
                schema=SCHEMA,
            )
            await router.send(table)
            for k in batch:
                last[k] = sent
            due = start + sent / rate
            delay = due - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
        await router.flush()
        stats = router.compactor.stats() if router.compactor else None
    await anyio.Path(log).write_text(
        json.dumps(
            {
                "sent": sent,
                "last": last,
                "compactor": None
                if stats is None
                else {
                    "compactions": stats.compactions,
                    "cleanups": stats.cleanups,
                    "wal_entries_removed": stats.wal_entries_removed,
                    "generations_removed": stats.generations_removed,
                    "versions_removed": stats.versions_removed,
                    "failures": stats.failures + stats.cleanup_failures,
                },
            }
        )
    )


async def reader(uri: str, seconds: float, keys: int, log: str) -> None:
    import lance_async as la

    ds = await la.open_dataset(uri)
    rng = random.Random(2)
    start = time.monotonic()
    samples = []
    lookups = expired = 0
    next_scan = start
    while time.monotonic() - start < seconds:
        try:
            await ds.lsm.point_lookups(
                [rng.randrange(keys) for _ in range(100)], columns=["id", "value"]
            )
            lookups += 1
            if time.monotonic() >= next_scan:
                await ds.lsm.scan(columns=["id", "value"]).to_table()
                next_scan += 60
        except la.ViewExpiredError:
            expired += 1
        samples.append((round(time.monotonic() - start, 1), round(rss_mb(), 1)))
        await anyio.sleep(0.2)
    await anyio.Path(log).write_text(
        json.dumps(
            {
                "rss": samples[:: max(1, len(samples) // 200)] + samples[-1:],
                "lookups": lookups,
                "expired": expired,
            }
        )
    )


async def check(uri: str, last: dict[str, int]) -> dict[str, int]:
    import lance_async as la

    ds = await la.open_dataset(uri)
    got = await ds.lsm.point_lookups(sorted(int(k) for k in last), columns=["id", "value"])
    seen = dict(zip(got.column("id").to_pylist(), got.column("value").to_pylist(), strict=True))
    lost = sum(1 for k in last if int(k) not in seen)
    stale = sum(1 for k, v in last.items() if int(k) in seen and seen[int(k)] != v)
    live = await ds.to_table()
    return {"keys": len(last), "lost": lost, "stale": stale, "live_mb": round(live.nbytes / 1e6, 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--rate", type=float, default=386.0, help="messages per second")
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument(
        "--retention", type=float, default=120.0, help="clean-up retention, seconds"
    )
    parser.add_argument("--sample", type=float, default=30.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak.json"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    uri = str(work / "t.lance")

    async def make() -> None:
        import lance_async as la

        ds = await la.write_dataset(
            pa.table({"id": [0], "value": [0], "payload": [""]}, schema=SCHEMA), uri
        )
        await ds.initialize_mem_wal()

    anyio.run(make)
    seconds = args.minutes * 60
    env = {**os.environ, "LANCE_LOG": "critical"}
    wlog, rlog = str(work / "writer.json"), str(work / "reader.json")
    w = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.soak_proc",
            "writer",
            uri,
            str(seconds),
            str(args.rate),
            str(args.keys),
            str(args.retention),
            wlog,
        ],
        cwd=ROOT,
        env=env,
    )
    r = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.soak_proc",
            "reader",
            uri,
            str(seconds),
            str(args.rate),
            str(args.keys),
            str(args.retention),
            rlog,
        ],
        cwd=ROOT,
        env=env,
    )
    samples = []
    start = time.monotonic()
    while w.poll() is None:
        time.sleep(min(args.sample, max(0.5, seconds + 5 - (time.monotonic() - start))))
        one = {
            "t": round(time.monotonic() - start),
            **folder(uri),
            "reader_rss_mb": round(rss_mb(r.pid), 1) if r.poll() is None else None,
            "writer_rss_mb": round(rss_mb(w.pid), 1) if w.poll() is None else None,
        }
        samples.append(one)
        print(json.dumps(one), flush=True)
    r.wait()
    wrote = json.loads(Path(wlog).read_text())
    read = json.loads(Path(rlog).read_text())
    result = anyio.run(check, uri, wrote["last"])
    rss = read["rss"]
    third = [mb for t, mb in rss if t >= seconds / 3]
    minute5 = [mb for t, mb in rss if t >= 300]
    writer_rss = [(x["t"], x["writer_rss_mb"]) for x in samples if x["writer_rss_mb"] is not None]
    writer5 = [mb for t, mb in writer_rss if t >= 300]
    summary = {
        "minutes": args.minutes,
        "rate": args.rate,
        "keys": args.keys,
        "retention_s": args.retention,
        "sent": wrote["sent"],
        "compactor": wrote["compactor"],
        **result,
        "reader": {
            "lookup_batches": read["lookups"],
            "expired": read["expired"],
            "rss_start_mb": rss[0][1],
            "rss_third_mb": third[0] if third else None,
            "rss_end_mb": rss[-1][1],
            "growth_third_to_end": round(rss[-1][1] / third[0] - 1, 3) if third else None,
            "rss_minute5_mb": minute5[0] if minute5 else None,
            "growth_minute5_to_end": round(rss[-1][1] / minute5[0] - 1, 3) if minute5 else None,
        },
        "writer": {
            "rss_start_mb": writer_rss[0][1] if writer_rss else None,
            "rss_minute5_mb": writer5[0] if writer5 else None,
            "rss_end_mb": writer_rss[-1][1] if writer_rss else None,
            "growth_minute5_to_end": round(writer_rss[-1][1] / writer5[0] - 1, 3)
            if writer5
            else None,
        },
        "max": {
            k: max(s[k] for s in samples)
            for k in ("wal_files", "generations", "manifests", "versions", "mb")
        },
        "last": samples[-1] if samples else None,
        "samples": samples,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}), flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
