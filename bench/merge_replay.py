"""merge_insert with a replayable source: wall time, bytes written, peak RSS.

Issue 3. One upsert of a ``LanceDataset`` source (about 130 MiB and about
1 MiB of incompressible rows: an int64 key and 32 random float32 per row)
into a 1M-row target (same schema), half of the source updating existing
rows and half inserting new ones, side by side:

``pylance_default``
    ``LanceDataset.merge_insert(...).execute(source)``, Lance's default
    conflict retries (10): Lance buffers, and for large inputs spills, the
    stream so that it can replay it.
``pylance_retries0``
    The same with ``conflict_retries(0)`` and a hand-written retry loop that
    reopens the target and re-reads the source on a conflict: the floor.
``pylance_retries0_backoff``
    The floor's loop waiting, before each retry, as long as lance_async's
    backoff (``lance_async.merge.backoff_delay``: about 50 ms with jitter
    before the first). Conflict cases only; informational: it splits
    lance_async's distance to the floor into the backoff the issue asks for
    and everything else.
``pylance_to_thread``
    ``pylance_default`` called through ``asyncio.to_thread`` (what an async
    user writes today).
``lance_async``
    ``await AsyncDataset.merge_insert(...).execute(source)``: the source is
    REPLAYABLE, so Lance runs with retries off and a conflict re-reads it.
``lancedb_async``
    LanceDB's ``AsyncTable.merge_insert(...).execute(source)`` (no-conflict
    cases only: a conflict cannot be injected into LanceDB's own commit path).

Cases: no conflict, and exactly one conflict, made deterministic by a Lance
``commit_lock`` whose first call lets a competing upsert of 16 of the same
rows commit first (on its own thread, as Lance cannot be re-entered from its
runtime thread).

Every run is a fresh child process (peak RSS is that run's own). Metrics:
wall time of the merge (s), bytes the process wrote to storage during it
(``write_bytes``, MiB), peak RSS of the process (MiB, ``ru_maxrss``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._common import (
    LANCE_ASYNC,
    MIB,
    PK,
    Meter,
    Metric,
    Section,
    Series,
    Settings,
    Table,
    Target,
    dir_mib,
    find,
    fmt_num,
    fmt_ratio,
    fmt_vs_limit,
    link_copy,
    log,
    ratio,
    run_child,
    summary_table,
    with_ticker,
)

DIM = 32
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("vec", pa.list_(pa.float32(), DIM)),
    ]
)
BYTES_PER_ROW = 8 + 4 * DIM
COMPETITOR_ROWS = 16
LAG_RUNS = 3

BACKOFF_FLOOR = "pylance_retries0_backoff"
CONFIGS = [
    "pylance_default",
    "pylance_retries0",
    BACKOFF_FLOOR,
    "pylance_to_thread",
    LANCE_ASYNC,
    "lancedb_async",
]
LAG_CONFIGS = ["pylance_in_async_def", "pylance_to_thread", LANCE_ASYNC, "lancedb_async"]

METRICS = [
    Metric("wall_s", "wall (s)", 1.0, 3),
    Metric("write_mib", "written (MiB)", 1.0, 1),
    Metric("peak_rss_mib", "peak RSS (MiB)", 1.0, 0),
]


def sizes(quick: bool) -> dict[str, int]:
    """Row counts: target, the big and small sources, the scaling inputs."""
    if quick:
        return {"target": 40_000, "big": 32_000, "small": 2_000, "x1": 2_000, "x4": 8_000}
    return {"target": 1_000_000, "big": 1 << 20, "small": 8_000, "x1": 1 << 16, "x4": 1 << 18}


def rows(lo: int, hi: int, seed: int) -> pa.Table:
    """Rows ``id`` in ``[lo, hi)`` with random (incompressible) vectors."""
    n = hi - lo
    rng = np.random.default_rng(seed)
    values = pa.array(rng.random(n * DIM, dtype=np.float32))
    vec = pa.FixedSizeListArray.from_arrays(values, DIM)
    return pa.table({"id": pa.array(np.arange(lo, hi, dtype=np.int64)), "vec": vec}, schema=SCHEMA)


def write_rows(uri: str, lo: int, hi: int, seed: int, chunk: int = 250_000) -> None:
    """Write rows ``[lo, hi)`` as a Lance dataset, generated chunk by chunk."""
    import lance

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(lo, hi, chunk):
            yield from rows(start, min(hi, start + chunk), seed + start).to_batches()

    reader = pa.RecordBatchReader.from_batches(SCHEMA, batches())
    lance.write_dataset(reader, uri, schema=SCHEMA, mode="create")


def source_range(target_rows: int, source_rows: int) -> tuple[int, int]:
    """Source ids: half update existing rows, half are new."""
    lo = target_rows - source_rows // 2
    return lo, lo + source_rows


def prepare(settings: Settings) -> dict[str, Any]:
    """Write the target template and the sources once; returns their paths."""
    root = settings.work / "merge"
    root.mkdir(parents=True, exist_ok=True)
    n = sizes(settings.quick)
    paths: dict[str, Any] = {"root": str(root), "sizes": n}
    paths["template"] = str(root / "template.lance")
    write_rows(paths["template"], 0, n["target"], seed=1)
    for name in ("big", "small", "x1", "x4"):
        lo, hi = source_range(n["target"], n[name])
        uri = str(root / f"source_{name}.lance")
        write_rows(uri, lo, hi, seed=1000 + n[name])
        paths[name] = uri
        paths[f"{name}_mib"] = dir_mib(uri)
        paths[f"{name}_lo"] = lo
    return paths


# ---------------------------------------------------------------------------
# the child side: one merge per process
# ---------------------------------------------------------------------------


class CompetingCommit:
    """A Lance ``commit_lock`` under which a competing upsert commits first.

    Lance enters the lock right before committing. On the first entry this
    runs an upsert of ``rows`` into the same table through its own dataset
    object, on a new thread, and waits for it; the commit that follows then
    conflicts on those rows. Later entries do nothing.
    """

    def __init__(self, uri: str, competitor: pa.Table) -> None:
        self.uri = uri
        self.competitor = competitor
        self.entries = 0
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def _compete(self) -> None:
        import lance

        try:
            target = lance.dataset(self.uri)
            (
                target.merge_insert("id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(self.competitor)
            )
        except BaseException as exc:  # reported by __call__
            self.error = exc

    @contextlib.contextmanager
    def __call__(self, version: int) -> Iterator[None]:
        with self._lock:
            self.entries += 1
            first = self.entries == 1
        if first:
            thread = threading.Thread(target=self._compete, name="bench-competitor")
            thread.start()
            thread.join()
            if self.error is not None:
                raise RuntimeError(f"the competing upsert failed: {self.error}")
        yield


def _is_conflict(exc: BaseException) -> bool:
    text = str(exc)
    return "concurrent writers" in text or "onflict" in text


def _upsert(ds: Any) -> Any:
    return ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()


def _counts(stats: Any) -> dict[str, float]:
    def get(key: str) -> Any:
        return stats.get(key) if isinstance(stats, dict) else getattr(stats, key, None)

    out: dict[str, float] = {}
    for key, name in (
        ("num_inserted_rows", "inserted"),
        ("num_updated_rows", "updated"),
        ("num_attempts", "attempts"),
    ):
        value = get(key)
        if value is not None:
            out[name] = float(value)
    return out


def child_merge(
    config: str,
    target: str,
    source: str,
    conflict: bool,
    competitor_lo: int,
    lag: bool = False,
) -> dict[str, float]:
    """One merge_insert of ``source`` into ``target`` by ``config`` (child side).

    Returns wall time (``wall_s``), bytes written (``write_mib``), RSS at the
    start (``base_rss_mib``), row counts and, with ``lag``, the ticker's lag.
    """
    import lance

    from lance_async.merge import backoff_delay

    hook = CompetingCommit(target, rows(competitor_lo, competitor_lo + COMPETITOR_ROWS, 7))
    lock = hook if conflict else None
    meter = Meter()
    out: dict[str, float] = {}

    def open_target() -> Any:
        return lance.dataset(target, commit_lock=lock) if lock else lance.dataset(target)

    if config in ("pylance_default", "pylance_retries0", BACKOFF_FLOOR):
        ds = open_target()
        src = lance.dataset(source)
        with meter:
            if config == "pylance_default":
                stats = _upsert(ds).execute(src)
                out["attempts"] = 1.0
            else:
                attempts = 0
                while True:
                    attempts += 1
                    started = time.monotonic()
                    try:
                        stats = _upsert(ds).conflict_retries(0).execute(src)
                        break
                    except OSError as exc:
                        if not _is_conflict(exc) or attempts > 10:
                            raise
                        if config == BACKOFF_FLOOR:
                            time.sleep(backoff_delay(attempts, time.monotonic() - started))
                        ds, src = open_target(), lance.dataset(source)
                out["attempts"] = float(attempts)
        out.update(_counts(stats))
    elif config in ("pylance_to_thread", "pylance_in_async_def"):

        async def main() -> Any:
            ds = open_target()
            src = lance.dataset(source)

            async def op() -> Any:
                with meter:
                    if config == "pylance_to_thread":
                        return await asyncio.to_thread(lambda: _upsert(ds).execute(src))
                    return _upsert(ds).execute(src)  # blocks the loop: that is the point

            return await with_ticker(op, lag)

        stats, lag_stats = asyncio.run(main())
        out.update(_counts(stats))
        out.update(lag_stats)
    elif config == LANCE_ASYNC:
        import anyio

        import lance_async as la

        async def amain() -> Any:
            ads = await la.open_dataset(target, commit_lock=lock) if lock else None
            if ads is None:
                ads = await la.open_dataset(target)
            src = lance.dataset(source)

            async def op() -> Any:
                with meter:
                    return await _upsert(ads).execute(src)

            return await with_ticker(op, lag)

        result, lag_stats = anyio.run(amain, backend="asyncio")
        out.update(
            {
                "inserted": float(result.num_inserted_rows),
                "updated": float(result.num_updated_rows),
                "attempts": float(result.num_attempts),
            }
        )
        out.update(lag_stats)
    elif config == "lancedb_async":
        import lancedb

        async def lmain() -> Any:
            db = await lancedb.connect_async(str(Path(target).parent))
            tbl = await db.open_table(Path(target).name.removesuffix(".lance"))
            src = lance.dataset(source)

            async def op() -> Any:
                with meter:
                    return await _upsert(tbl).execute(src)

            return await with_ticker(op, lag)

        result, lag_stats = asyncio.run(lmain())
        out.update(_counts(result))
        out.update(lag_stats)
    else:
        raise ValueError(f"unknown config {config!r}")
    out.update(meter.result())
    out["conflicts_injected"] = float(1 if conflict and hook.entries else 0)
    return out


# ---------------------------------------------------------------------------
# the parent side
# ---------------------------------------------------------------------------


def run_merge(
    settings: Settings,
    paths: dict[str, Any],
    source: str,
    case: str,
    config: str,
    conflict: bool,
    lag: bool = False,
) -> dict[str, float]:
    """One measured run in a fresh child, on a fresh (hard-linked) target copy."""
    run_dir = Path(paths["root"]) / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir()
    target = link_copy(paths["template"], run_dir / "target.lance")
    try:
        return run_child(
            "bench.merge_replay:child_merge",
            {
                "config": config,
                "target": target,
                "source": paths[source],
                "conflict": conflict,
                "competitor_lo": paths[f"{source}_lo"],
                "lag": lag,
            },
            flavour="lancedb" if config == "lancedb_async" else "lance",
        )
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def measure(
    settings: Settings,
    paths: dict[str, Any],
    cases: list[tuple[str, str, bool]],
    configs: list[str],
    runs: int,
) -> list[Series]:
    """Run every config ``runs`` times per case, interleaved round by round."""
    out: list[Series] = []
    for case, source, conflict in cases:
        # to_thread runs the very code of pylance_default (on a thread): measured without
        # a conflict only, to keep the suite within its time budget
        wanted = [
            c
            for c in configs
            if not (conflict and c in ("lancedb_async", "pylance_to_thread"))
            and not (not conflict and c == BACKOFF_FLOOR)  # no retry: the same as the floor
        ]
        by_config = {c: Series(case, c) for c in wanted}
        for r in range(runs):
            for config in wanted:
                sample = run_merge(settings, paths, source, case, config, conflict)
                by_config[config].samples.append(sample)
            log(f"merge_replay {case}: round {r + 1}/{runs} done")
        out.extend(by_config.values())
    return out


def case_label(paths: dict[str, Any], name: str, conflict: bool) -> str:
    """A case's name: source size and conflict count."""
    mib = paths[f"{name}_mib"]
    size = f"{mib:.0f}" if mib >= 10 else f"{mib:.2g}"
    return f"{size} MiB source, {'one conflict' if conflict else 'no conflict'}"


def _replay_table(series: list[Series]) -> Table:
    rows_: list[list[str]] = []
    for s in series:
        floor = find(series, s.case, "pylance_retries0")
        replay = s.median("write_mib") - (floor.median("write_mib") if floor else float("nan"))
        rows_.append(
            [
                s.case,
                s.config,
                fmt_num(s.median("write_mib"), 1),
                fmt_num(replay, 1),
                fmt_num(s.median("attempts"), 0),
                f"{fmt_num(s.median('inserted'), 0)} / {fmt_num(s.median('updated'), 0)}",
            ]
        )
    return Table(
        "Bytes written beyond the conflict_retries(0) floor (replay buffers and spills)",
        [
            "case",
            "configuration",
            "written (MiB, median)",
            "beyond floor (MiB)",
            "attempts",
            "inserted / updated",
        ],
        rows_,
        "Attempts: merge passes over the source; pylance_default retries inside one call "
        "(reported as 1). The competing upsert's own small write is in every one-conflict row.",
    )


def _ratio_table(series: list[Series]) -> Table:
    rows_: list[list[str]] = []
    for s in series:
        if s.config != LANCE_ASYNC:
            continue
        row = [s.case]
        for other in (
            "pylance_default",
            "pylance_retries0",
            BACKOFF_FLOOR,
            "pylance_to_thread",
            "lancedb_async",
        ):
            o = find(series, s.case, other)
            row.append(
                "not measured"
                if o is None
                else " / ".join(fmt_ratio(ratio(s.median(m.key), o.median(m.key))) for m in METRICS)
            )
        rows_.append(row)
    return Table(
        "lance_async ÷ each alternative (wall / written / peak RSS; below 1 is better)",
        [
            "case",
            "÷ pylance_default",
            "÷ pylance_retries0",
            f"÷ {BACKOFF_FLOOR}",
            "÷ pylance_to_thread",
            "÷ lancedb",
        ],
        rows_,
    )


REPLAY_ALLOWANCE_SHARE = 0.02
REPLAY_ALLOWANCE_MIN_MIB = 0.1
WALL_VS_DEFAULT = 0.75
WALL_VS_FLOOR = 1.10


def replay_allowance(floor_mib: float) -> float:
    """Noise allowed on bytes written beyond the floor: 2% of it, at least 0.1 MiB."""
    return max(REPLAY_ALLOWANCE_MIN_MIB, REPLAY_ALLOWANCE_SHARE * floor_mib)


def targets(series: list[Series], cases: list[str]) -> list[Target]:
    """Issue 3's targets, checked on every case (both sizes, with and without a conflict)."""
    out: list[Target] = []
    for case in cases:
        la_ = find(series, case, LANCE_ASYNC)
        default = find(series, case, "pylance_default")
        floor = find(series, case, "pylance_retries0")
        if la_ is None or default is None or floor is None:
            continue
        extra = la_.median("write_mib") - floor.median("write_mib")
        allowance = replay_allowance(floor.median("write_mib"))
        out.append(
            Target(
                f"merge_replay [{case}] lance_async writes no replay bytes",
                f"{fmt_vs_limit(extra, allowance, 2, ' MiB', signed=True)} beyond the "
                f"retries(0) floor ({la_.median('write_mib'):.2f} vs "
                f"{floor.median('write_mib'):.2f} MiB)",
                f"≤ +{allowance:.2f} MiB (2% of the floor, at least 0.1 MiB: write_bytes noise)",
                extra <= allowance,
            )
        )
        r_default = ratio(la_.median("wall_s"), default.median("wall_s"))
        out.append(
            Target(
                f"merge_replay [{case}] wall vs pylance default retries",
                f"{fmt_vs_limit(r_default, WALL_VS_DEFAULT)} ({la_.median('wall_s'):.3f} vs "
                f"{default.median('wall_s'):.3f} s)",
                f"≤ {WALL_VS_DEFAULT:.2f}x",
                r_default <= WALL_VS_DEFAULT,
            )
        )
        r_floor = ratio(la_.median("wall_s"), floor.median("wall_s"))
        out.append(
            Target(
                f"merge_replay [{case}] wall vs the conflict_retries(0) floor",
                f"{fmt_vs_limit(r_floor, WALL_VS_FLOOR)} ({la_.median('wall_s'):.3f} vs "
                f"{floor.median('wall_s'):.3f} s)",
                f"≤ {WALL_VS_FLOOR:.2f}x",
                r_floor <= WALL_VS_FLOOR,
            )
        )
    return out


def _default_replay_notes(series: list[Series], cases: list[str]) -> list[str]:
    """Where pylance's default writes no replay bytes either (the target holds trivially)."""
    quiet = []
    for case in cases:
        default = find(series, case, "pylance_default")
        floor = find(series, case, "pylance_retries0")
        if default is None or floor is None:
            continue
        floor_mib = floor.median("write_mib")
        if default.median("write_mib") - floor_mib <= replay_allowance(floor_mib):
            quiet.append(case)
    if not quiet:
        return []
    return [
        "Cases where pylance's default retries write no replay bytes either (below about "
        "100 MB Lance buffers the source in memory instead of spilling it): "
        + "; ".join(quiet)
        + ". There the no-replay-bytes target holds for every configuration, and the wall "
        "targets compare runs that write the same bytes."
    ]


def run(settings: Settings, shared: dict[str, Any]) -> Section:
    """Measure issue 3's comparison; returns the report section.

    ``shared`` receives the prepared paths and series (reused by scaling and
    the loop-lag measurement).
    """
    paths = prepare(settings)
    shared["merge_paths"] = paths
    configs = [c for c in CONFIGS if settings.lancedb or c != "lancedb_async"]
    cases = [
        (case_label(paths, "big", False), "big", False),
        (case_label(paths, "big", True), "big", True),
        (case_label(paths, "small", False), "small", False),
        (case_label(paths, "small", True), "small", True),
    ]
    series = measure(settings, paths, cases, configs, settings.runs)
    shared["merge_series"] = series
    lag_configs = [c for c in LAG_CONFIGS if settings.lancedb or c != "lancedb_async"]
    lag: list[Series] = [Series(cases[0][0], c) for c in lag_configs]
    t_lag = time.perf_counter()
    for _ in range(1 if settings.quick else LAG_RUNS):
        for s in lag:
            s.samples.append(run_merge(settings, paths, "big", s.case, s.config, False, lag=True))
    shared["lag_merge"] = lag
    shared["lag_seconds"] = shared.get("lag_seconds", 0.0) + time.perf_counter() - t_lag
    n = paths["sizes"]
    intro = (
        f"One upsert of a LanceDataset source into a {n['target']:,}-row target "
        f"({dir_mib(paths['template']):.0f} MiB on disk); the big source has {n['big']:,} rows "
        f"({paths['big_mib']:.1f} MiB on disk), the small one {n['small']:,} rows "
        f"({paths['small_mib']:.2f} MiB); half of each updates existing rows, half inserts. "
        "Rows hold 32 random float32, so nothing compresses. Each run is a fresh child "
        "process on a fresh copy of the target; configurations alternate within each round. "
        "Wall time covers the merge call only; 'written' is the process's write_bytes "
        "during the call; peak RSS is the child's ru_maxrss (interpreter and imports "
        "included). One conflict = a competing 16-row upsert of the same rows commits "
        "just before our first commit (a Lance commit_lock hook)."
    )
    notes = [
        "pylance_retries0 with a conflict is the floor a user can reach by hand: catch the "
        "'Too many concurrent writers' error, reopen the target, execute again from the "
        "LanceDataset (a fresh scan).",
        f"{BACKOFF_FLOOR} (conflict cases only) is that loop with lance_async's backoff "
        "before each retry (about 50 ms with jitter before the first, as issue 3 asks); the "
        "targets still compare with the floor that retries at once.",
        "pylance_to_thread is measured without a conflict only: with one it runs exactly "
        "pylance_default's code (Lance's own retries), on a worker thread.",
    ]
    if not settings.lancedb:
        notes.append(f"LanceDB not measured: {settings.lancedb_note}")
    else:
        notes.append(
            "lancedb_async is measured without conflicts only: its commits go through "
            "LanceDB's own Rust runtime, where a Lance commit_lock cannot be injected."
        )
    case_names = [c[0] for c in cases]
    notes += _default_replay_notes(series, case_names)
    section = Section(
        key="merge_replay",
        title="merge_insert with a replayable source (issue 3)",
        intro=intro,
        tables=[
            summary_table(
                "Medians [min–max] per configuration",
                series,
                METRICS,
                METRICS[0],
                "lance_async ÷ config (wall)",
            ),
            _ratio_table(series),
            _replay_table(series),
        ],
        targets=targets(series, case_names),
        notes=notes,
        series=series,
        raw={"paths": {k: v for k, v in paths.items() if k != "root"}, "MIB": MIB},
    )
    return section
