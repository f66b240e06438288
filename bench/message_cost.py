"""A large message's peak cost in ``lance-async ingest`` (issue 37).

``python -m bench.message_cost [--mb 50] [--runs 3] [--redis URL]``: one
message of ``--mb`` megabytes is added to a Redis stream and ingested by
``lance-async ingest redis://... TABLE --idle-timeout 1`` into a fresh table
(the default MemWAL: four buckets), in a fresh process each run; the
process's peak RSS (``ru_maxrss`` of the child) is compared with the same
command ingesting a message of two rows. Shapes: NDJSON rows of 1,000 and of
60 characters, and the same rows as one JSON array. The cost is
``(peak - idle peak) / message size``: what the message adds, its own bytes
included; the target is about 4x.

Writes ``bench/results/message_cost.md`` and
``bench/results/runs/message_cost-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

MAKE = """
import sys, anyio, pyarrow as pa, lance_async as la
PK = {"lance-schema:unenforced-primary-key": "true"}
S = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK),
               pa.field("value", pa.int64()), pa.field("payload", pa.string())])
async def make():
    ds = await la.write_dataset(pa.table({"id": [0], "value": [0], "payload": [""]}, schema=S),
                                sys.argv[1])
    await ds.initialize_mem_wal()
anyio.run(make)
"""

SHAPES = [("ndjson, 1,000-char rows", 1000, False), ("ndjson, 60-char rows", 60, False)]
SHAPES += [("JSON array, 60-char rows", 60, True)]


def message(mb: float, width: int, array: bool) -> bytes:
    """``mb`` megabytes of rows ``{"id", "value", "payload"}``, NDJSON or one array."""
    n = max(1, int(mb * 1e6 / (width + 40)))
    line = '{"id": %d, "value": %d, "payload": "' + "x" * width + '"}'
    rows = [line % (i, i) for i in range(n)]
    return (("[" + ",\n".join(rows) + "]") if array else "\n".join(rows) + "\n").encode()


def run_once(redis_url: str, payload: bytes) -> float:
    """Peak RSS (MiB) of one ``lance-async ingest`` of ``payload`` from a fresh stream."""
    import redis

    work = Path(tempfile.mkdtemp(prefix="msgcost-"))
    uri = str(work / "t.lance")
    stream = f"bench-msgcost-{os.getpid()}-{time.monotonic_ns()}"
    client = redis.Redis.from_url(redis_url)
    try:
        subprocess.run([sys.executable, "-c", MAKE, uri], check=True, cwd=ROOT)
        client.xadd(stream, {"data": payload})
        env = {**os.environ, "LANCE_LOG": "critical"}
        command = [sys.executable, "-c", "from lance_async.cli import main; main()", "ingest"]
        command += [f"{redis_url.rstrip('/')}/{stream}", uri, "--idle-timeout", "1"]
        child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"ingest failed: {status}")
        return float(usage.ru_maxrss) / 1024  # KiB on Linux
    finally:
        client.delete(stream)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.message_cost", description=__doc__)
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    tiny = message(0.0001, 10, False)
    idle = [run_once(args.redis, tiny) for _ in range(args.runs)]
    rows: list[dict[str, Any]] = []
    for name, width, array in SHAPES:
        payload = message(args.mb, width, array)
        peaks = [run_once(args.redis, payload) for _ in range(args.runs)]
        mib = len(payload) / 2**20
        cost = [(p - statistics.median(idle)) / mib for p in peaks]
        rows.append({"shape": name, "mib": mib, "peaks_mib": peaks, "cost": cost})
        print(json.dumps(rows[-1]), flush=True)
    raw = {"started": started, "load": load, "mb": args.mb, "idle_mib": idle, "rows": rows}
    runs = args.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    stamp = started.replace(" ", "-").replace(":", "")
    (runs / f"message_cost-{stamp}.json").write_text(json.dumps(raw, indent=1))
    lines = [
        "# A large message's peak cost in `lance-async ingest`",
        "",
        f"`python -m bench.message_cost --mb {args.mb:g} --runs {args.runs}`, started {started} "
        f"(load average {load}). One message from a Redis stream into a fresh table (four "
        "buckets), a fresh process per run; peak RSS is the child's `ru_maxrss`. Cost = "
        "(peak - the idle peak, a two-row message) / message size; target about 4x.",
        "",
        f"Idle peak: {', '.join(f'{x:.0f}' for x in idle)} MiB.",
        "",
        "| message | size (MiB) | peak RSS (MiB) | cost, each | cost, median | target |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        median = statistics.median(row["cost"])
        verdict = "PASS" if median <= 4.0 else "MISS"
        lines.append(
            f"| {row['shape']} | {row['mib']:.1f} | "
            f"{', '.join(f'{p:.0f}' for p in row['peaks_mib'])} | "
            f"{', '.join(f'{c:.2f}x' for c in row['cost'])} | {median:.2f}x | "
            f"{verdict} (<= 4x) |"
        )
    (args.out / "message_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
