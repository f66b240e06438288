"""The cost of the replay content digest on the 131 MiB merge (issue 17, item 4).

``python -m bench.digest_cost [--runs N]``: the ``merge_replay`` workload's
large case -- a ``LanceDataset`` source of 1,048,576 rows (about 131 MiB: an
int64 key and 32 random float32 per row) upserted into a 1M-row target, half
updates and half inserts, no conflict -- merged with lance_async with the
digest on (the default for REPLAYABLE sources) and off
(``source.verify_replays = False``), in fresh child processes, alternating,
``N`` runs each (default 5). Prints the median wall time of each and their
ratio, then the time one pass of the source takes to drain with and without
the digesting wrapper (best of 5, in this process): the digest's own cost,
which the merge's wall time, noisy on a shared machine, cannot resolve alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .merge_replay import source_range, write_rows

CHILD = """
import json, sys, time, anyio, lance, lance_async as la
target, source, verify = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
async def run():
    ds = await la.open_dataset(target)
    src = la.coerce_source(lance.dataset(source))
    src.verify_replays = verify
    started = time.perf_counter()
    result = await (
        ds.merge_insert().when_matched_update_all().when_not_matched_insert_all().execute(src)
    )
    return time.perf_counter() - started, result.num_updated_rows + result.num_inserted_rows
wall, rows = anyio.run(run)
print(json.dumps({"wall_s": wall, "rows": rows}))
"""


def drain_times(source: str, repeats: int = 5) -> tuple[float, float]:
    """Seconds (best of ``repeats``) to drain one pass of the source as the engine
    would: the scan's own reader, and the same reader through the digesting
    wrapper every REPLAYABLE pass goes through (Python hop and hashes included)."""
    import lance

    import lance_async as la

    src = la.coerce_source(lance.dataset(source))
    plain: list[float] = []
    digested: list[float] = []
    for i in range(repeats):
        started = time.perf_counter()
        for _ in src._open_reader(0):
            pass
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        for _ in src._verified_reader(src._open_reader(i + 1), i + 1):
            pass
        digested.append(time.perf_counter() - started)
    return min(plain), min(digested)


def merge_wall(target: Path, source: str, verify: bool) -> float:
    """Wall seconds of one lance_async merge in a fresh child process."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(target), source, "1" if verify else "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["wall_s"])


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it."""
    parser = argparse.ArgumentParser(prog="python -m bench.digest_cost", description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="digest_cost_"))
    try:
        template, source = str(work / "template.lance"), str(work / "source.lance")
        write_rows(template, 0, 1_000_000, seed=1)
        lo, hi = source_range(1_000_000, 1 << 20)
        write_rows(source, lo, hi, seed=2)
        size = sum(p.stat().st_size for p in Path(source).rglob("*") if p.is_file()) / 2**20
        walls: dict[str, list[float]] = {"on": [], "off": []}
        for run in range(args.runs):
            for mode in ("on", "off") if run % 2 == 0 else ("off", "on"):
                target = work / f"target_{run}_{mode}.lance"
                shutil.copytree(template, target)
                walls[mode].append(merge_wall(target, source, mode == "on"))
                shutil.rmtree(target)
        on, off = statistics.median(walls["on"]), statistics.median(walls["off"])
        plain, digested = drain_times(source)
        print(f"source: {size:.1f} MiB, {hi - lo:,} rows; {args.runs} runs each, fresh processes")
        for mode, median in (("on", on), ("off", off)):
            runs = sorted(round(w, 3) for w in walls[mode])
            print(f"merge wall, digest {mode:<3}: median {median:.3f} s  {runs}")
        print(f"ratio on/off: {on / off:.3f} ({(on / off - 1) * 100:+.1f} %)")
        extra = digested - plain
        print(
            f"one pass drained alone (best of 5): {plain:.3f} s, through the digest "
            f"{digested:.3f} s: {extra:+.3f} s = {extra / off * 100:+.1f} % of the median "
            "merge without it"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
