"""How long an ack takes to fail on a failing store, and to succeed once it is back.

Issue 38. ``python -m bench.storage_faults [--runs N] [--storage-timeout S]``,
written to ``bench/results/storage_faults.md`` and
``bench/results/runs/storage_faults-<stamp>.json``.

A moto S3 server behind the fault proxy of ``tests/s3faults.py``; a table
bucket-sharded in 4, written through the routing writer
(``dataset.mem_wal_writer(storage_timeout=S)``). For each fault -- 403
(refused), 503 (throttled, which object_store retries), a black hole (no
answer) -- and each run: one put acknowledged, then the fault, then

* **fail**: seconds from a put of 40 rows (every shard) to its failed ack,
  and that divided by ``storage_timeout`` (the put's deadline plus the probe
  that says why: at most 1.25 by design);
* **refused**: a second put during the fault: seconds to its failed ack
  (the router's probe before reopening, at most a quarter of S);
* **heal**: the store answers again: seconds from the next put to its ack
  (the shards opened again: a probe, a claim, the WAL replayed and flushed).

Every figure of a run is taken in the same process, one fault after the
other, on the same machine; the ratios are what to compare across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from ._common import PK
from .object_storage import Moto

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the fault proxy is the tests' (tests/s3faults.py)

from tests.s3faults import Mode, S3FaultProxy  # noqa: E402

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("value", pa.int64()),
    ]
)
FAULTS = {
    "403": Mode.error(403, "AccessDenied"),
    "503": Mode.error(503, "SlowDown"),
    "black hole": Mode.black_hole(),
}


def _rows(lo: int, n: int) -> pa.Table:
    return pa.table({"id": list(range(lo, lo + n)), "value": [1] * n}, schema=SCHEMA)


async def _timed(call: Any) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        await call
    except Exception as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


async def one_run(moto: Moto, fault: Mode, timeout: float) -> dict[str, Any]:
    """One table, one fault: fail, refused, heal (see the module notes)."""
    import lance_async as la

    with S3FaultProxy(moto.endpoint) as proxy:
        options = dict(moto.options(), aws_endpoint=proxy.url)
        uri = f"s3://{moto.bucket()}/t.lance"
        ds = await la.write_dataset(_rows(0, 10), uri, storage_options=options)
        await ds.initialize_mem_wal()
        async with ds.mem_wal_writer(storage_timeout=timeout) as router:
            await router.put(_rows(100, 40))
            proxy.set(fault)
            fail, error = await _timed(router.put(_rows(200, 40)))
            refused, second = await _timed(router.put(_rows(300, 40)))
            proxy.set(Mode.forward())
            heal, healed = await _timed(router.put(_rows(400, 40)))
            reopens = router.stats().reopens
    return {
        "fail_s": fail,
        "fail_ratio": fail / timeout,
        "fail_error": type(error).__name__,
        "may_have_landed": bool(getattr(error, "may_have_landed", False)),
        "refused_s": refused,
        "refused_error": type(second).__name__,
        "heal_s": heal,
        "healed": healed is None,
        "reopens": reopens,
    }


def _settle() -> None:
    """Wait (120 s at most) for the calls a run abandoned: they return once the
    store answers, and the next run must not share the machine with them."""
    from lance_async._threads import abandoned_calls

    deadline = time.monotonic() + 120
    while abandoned_calls() and time.monotonic() < deadline:
        time.sleep(0.05)


def _cell(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storage_faults")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--storage-timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as work, Moto(Path(work)) as moto:
        for name, fault in FAULTS.items():
            results[name] = []
            for _ in range(args.runs):
                results[name].append(asyncio.run(one_run(moto, fault, args.storage_timeout)))
                print(name, results[name][-1], file=sys.stderr, flush=True)
                _settle()
    timeout = args.storage_timeout
    lines = [
        "# Acks on a failing store, and after it is back",
        "",
        f"`python -m bench.storage_faults --runs {args.runs} --storage-timeout {timeout:g}`, "
        f"started {started} (load average {load}); moto behind `tests/s3faults.py`, "
        "4 shards, the routing writer. Seconds per run; the ratio is the median over "
        f"`storage_timeout` ({timeout:g} s).",
        "",
        "| fault | failed ack (s) | median ÷ storage_timeout | error, may_have_landed "
        "| refused during the fault (s) | first ack once back (s) | healed |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        fails = [r["fail_s"] for r in runs]
        lines.append(
            f"| {name} | {_cell(fails)} | {statistics.median(fails) / timeout:.2f} "
            f"| {runs[0]['fail_error']}, {runs[0]['may_have_landed']} "
            f"| {_cell([r['refused_s'] for r in runs])} "
            f"| {_cell([r['heal_s'] for r in runs])} "
            f"| {sum(r['healed'] for r in runs)} of {len(runs)} |"
        )
    out = ROOT / "bench" / "results"
    (out / "storage_faults.md").write_text("\n".join(lines) + "\n")
    runs_dir = out / "runs"
    runs_dir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (runs_dir / f"storage_faults-{stamp}.json").write_text(
        json.dumps({"started": started, "load": load, "args": vars(args), "results": results})
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
