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
    backoff (``lance_async.merge.backoff_delay``: a random slot of the last
    attempt's length). Conflict cases only; informational: it splits
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

Service upserts (issue 41): 16 clients on one event loop, each making 8
upserts of 50 rows one after the other (5 keys shared by all, 45 new ones
each), as pylance calls on ``anyio.to_thread`` and as lance_async's default
(concurrent upserts coalesced into one commit) and ``coalesce(False)``.

Contention: 16 upserters started together on a 100,000-row target, each
upserting 4,000 rows of its own LanceDataset source whose keys overlap its
neighbours' by half: ``pylance_default`` runs them on 16 threads with Lance's
own retries; ``lance_async`` as 16 tasks on one event loop (retries replay
the sources after a backoff). Measured: the time until all are done, and
whether the table equals applying the upserts one after the other in the
order of the versions they committed (a serial order).

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
    percentile,
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
SERVICE_METRICS = [
    Metric("wall_s", "all done (s)", 1.0, 3),
    Metric("p50_ms", "upsert p50 (ms)", 1.0, 1),
    Metric("p99_ms", "upsert p99 (ms)", 1.0, 1),
    Metric("versions", "versions", 1.0, 0),
    Metric("failed", "failed upserts", 1.0, 0),
    Metric("serial", "serial order", 1.0, 0),
]
CONTENTION_METRICS = [
    Metric("wall_s", "all done (s)", 1.0, 3),
    Metric("attempts", "attempts", 1.0, 0),
    Metric("failed", "failed upserts", 1.0, 0),
    Metric("serial", "serial order", 1.0, 0),
    Metric("peak_rss_mib", "peak RSS (MiB)", 1.0, 0),
]


def sizes(quick: bool) -> dict[str, int]:
    """Row counts: target, the big and small sources, the scaling inputs."""
    if quick:
        return {
            "target": 40_000,
            "big": 32_000,
            "small": 2_000,
            "x1": 2_000,
            "x4": 8_000,
            "contention_target": 10_000,
            "contention_source": 400,
        }
    return {
        "target": 1_000_000,
        "big": 1 << 20,
        "small": 8_000,
        "x1": 1 << 16,
        "x4": 1 << 18,
        "contention_target": 100_000,
        "contention_source": 4_000,
    }


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
    paths["contention_template"] = str(root / "contention.lance")
    write_rows(paths["contention_template"], 0, n["contention_target"], seed=2)
    paths["contention_sources"] = []
    for i, (lo, hi) in enumerate(contention_ranges(n["contention_source"])):
        uri = str(root / f"contender_{i}.lance")
        write_rows(uri, lo, hi, seed=5000 + i)
        paths["contention_sources"].append(uri)
    return paths


UPSERTERS = 16


def contention_ranges(rows_each: int) -> list[tuple[int, int]]:
    """Each upserter's key range: ``rows_each`` keys, half shared with the next one's."""
    step = rows_each // 2
    return [(i * step, i * step + rows_each) for i in range(UPSERTERS)]


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


def child_contention(config: str, target: str, sources: list[str]) -> dict[str, float]:
    """The upserters of ``sources`` started together on ``target`` (child side).

    Returns ``wall_s`` until all are done, ``failed`` upserters, ``attempts``
    (lance_async's passes over the sources; pylance's retries are internal)
    and ``serial`` (1.0 when the table equals the upserts applied one by one
    in the order they committed: version, then place in a coalesced group).
    """
    import lance

    n = len(sources)
    versions: list[tuple[int, int] | None] = [None] * n
    attempts = [1] * n
    failed: list[str] = []
    meter = Meter()
    before = lance.dataset(target).version
    if config == "pylance_default":
        start = threading.Barrier(n + 1)

        def one(i: int) -> None:
            ds, src = lance.dataset(target), lance.dataset(sources[i])
            start.wait()
            try:
                _upsert(ds).execute(src)
                versions[i] = (ds.version, 0)  # execute moves ds to the version it committed
            except Exception as exc:
                failed.append(repr(exc)[:300])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        start.wait()
        with meter:
            for t in threads:
                t.join()
    elif config == LANCE_ASYNC:
        import anyio

        import lance_async as la

        async def amain() -> None:
            datasets = [await la.open_dataset(target) for _ in range(n)]
            srcs = [lance.dataset(s) for s in sources]

            async def one(i: int) -> None:
                try:
                    result = await _upsert(datasets[i]).execute(srcs[i])
                    versions[i] = (result.version, result.group_index)
                    attempts[i] = result.num_attempts
                except la.LanceAsyncError as exc:
                    failed.append(repr(exc)[:300])

            with meter:
                async with anyio.create_task_group() as tg:
                    for i in range(n):
                        tg.start_soon(one, i)

        anyio.run(amain, backend="asyncio")
    else:
        raise ValueError(f"unknown config {config!r}")
    out = meter.result()
    out["failed"] = float(len(failed))
    out["attempts"] = float(sum(attempts))
    out["serial"] = float(_serial_order_holds(target, sources, versions, before))
    if failed:
        out["first_error"] = failed[0]  # type: ignore[assignment]
    return out


SERVICE_CLIENTS = 16
SERVICE_UPSERTS = 8
SERVICE_ROWS = 50
SERVICE_SHARED = 5
SERVICE_CONFIGS = ["pylance_to_thread", LANCE_ASYNC, "lance_async_alone"]


def service_rows(client: int, j: int, seed: int = 0) -> pa.Table:
    """Client ``client``'s upsert number ``j``: the 5 keys every client shares,
    then 45 new keys of its own (a service upserting small JSON bodies)."""
    own = SERVICE_ROWS - SERVICE_SHARED
    first = 1_000_000 + (client * SERVICE_UPSERTS + j) * own
    ids = np.concatenate([np.arange(SERVICE_SHARED), np.arange(first, first + own)]).astype(
        np.int64
    )
    rng = np.random.default_rng(seed + client * 1000 + j)
    vec = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.random(len(ids) * DIM, dtype=np.float32)), DIM
    )
    return pa.table({"id": pa.array(ids), "vec": vec}, schema=SCHEMA)


def child_service(config: str, target: str) -> dict[str, float]:
    """16 clients, each making 8 upserts of 50 rows one after the other (child side).

    ``pylance_to_thread``: each upsert is ``LanceDataset.merge_insert(...)
    .execute(table)`` (Lance's own retries) on ``anyio.to_thread``, a dataset
    object per client. ``lance_async``: ``await ds.merge_insert(...).execute
    (table)`` with the defaults (group commit on); ``lance_async_alone`` the
    same with ``coalesce(False)``. Returns ``wall_s``, each upsert's latency
    percentiles, the versions committed, failed upserts and ``serial`` (1.0
    when the table is the upserts applied one by one in their order).
    """
    import anyio
    import lance

    import lance_async as la

    before = lance.dataset(target).version
    latencies: list[float] = []
    order: dict[tuple[int, int], tuple[int, int]] = {}
    failed: list[str] = []
    meter = Meter()

    async def main() -> None:
        datasets: list[Any] = []
        for _ in range(SERVICE_CLIENTS):
            if config == "pylance_to_thread":
                datasets.append(await anyio.to_thread.run_sync(lance.dataset, target))
            else:
                datasets.append(await la.open_dataset(target))

        async def client(c: int) -> None:
            for j in range(SERVICE_UPSERTS):
                table = service_rows(c, j)
                t0 = time.perf_counter()
                try:
                    if config == "pylance_to_thread":
                        ds = datasets[c]

                        def call(ds: Any = ds, table: pa.Table = table) -> int:
                            _upsert(ds).execute(table)
                            return int(ds.version)

                        order[(c, j)] = (await anyio.to_thread.run_sync(call), 0)
                    else:
                        builder = _upsert(datasets[c])
                        if config == "lance_async_alone":
                            builder = builder.coalesce(False)
                        result = await builder.execute(table)
                        order[(c, j)] = (result.version, result.group_index)
                except Exception as exc:
                    failed.append(repr(exc)[:300])
                latencies.append(time.perf_counter() - t0)

        with meter:
            async with anyio.create_task_group() as tg:
                for c in range(SERVICE_CLIENTS):
                    tg.start_soon(client, c)

    anyio.run(main)
    out = meter.result()
    ordered = sorted(latencies)
    out["p50_ms"] = percentile(ordered, 0.50) * 1000
    out["p99_ms"] = percentile(ordered, 0.99) * 1000
    out["upserts"] = float(len(latencies))
    out["versions"] = float(lance.dataset(target).version - before)
    out["failed"] = float(len(failed))
    out["serial"] = float(_service_serial(target, before, order))
    if failed:
        out["first_error"] = failed[0]  # type: ignore[assignment]
    return out


def _service_serial(
    target: str, before: int, order: dict[tuple[int, int], tuple[int, int]]
) -> bool:
    """Whether the table is its first version with the upserts applied one by
    one in the order ``order`` gives them (version, then place in the group)."""
    import lance

    ds = lance.dataset(target)
    places = list(order.values())
    if len(set(places)) != len(places):
        return False
    ids, vecs = _vectors(ds.checkout_version(before).to_table())
    state: dict[int, np.ndarray] = dict(zip(ids.tolist(), vecs, strict=True))
    for key in sorted(order, key=lambda k: order[k]):
        src_ids, src_vecs = _vectors(service_rows(*key))
        state.update(zip(src_ids.tolist(), src_vecs, strict=True))
    got_ids, got_vecs = _vectors(ds.to_table())
    if len(got_ids) != len(state) or set(got_ids.tolist()) != set(state):
        return False
    return all(np.array_equal(state[k], v) for k, v in zip(got_ids.tolist(), got_vecs, strict=True))


def _vectors(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    ids = table.column("id").to_numpy()
    flat = table.column("vec").combine_chunks().flatten().to_numpy()
    return ids, flat.reshape(-1, DIM)


def _serial_order_holds(
    target: str, sources: list[str], versions: list[tuple[int, int] | None], before: int
) -> bool:
    """Whether the table equals its first version with the committed upserts
    applied one by one, in the order of their commits: the version, then the
    place in the group (upserts coalesced into one commit share its version
    and apply in their group order, ``MergeResult.group_index``)."""
    import lance

    ds = lance.dataset(target)
    committed = sorted((v, i) for i, v in enumerate(versions) if v is not None)
    if len({v for v, _ in committed}) != len(committed):
        return False  # two upserts cannot hold one place
    ids, vecs = _vectors(ds.checkout_version(before).to_table())
    state = dict(zip(ids.tolist(), range(len(ids)), strict=True))
    rows_: list[np.ndarray] = list(vecs)
    for _, i in committed:
        src_ids, src_vecs = _vectors(lance.dataset(sources[i]).to_table())
        for key, vec in zip(src_ids.tolist(), src_vecs, strict=True):
            if key in state:
                rows_[state[key]] = vec
            else:
                state[key] = len(rows_)
                rows_.append(vec)
    got_ids, got_vecs = _vectors(ds.to_table())
    if len(got_ids) != len(state) or set(got_ids.tolist()) != set(state):
        return False
    expected = np.stack([rows_[state[k]] for k in got_ids.tolist()])
    return bool(np.array_equal(expected, got_vecs))


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


CONTENTION_CONFIGS = ["pylance_default", LANCE_ASYNC]


def run_contention(settings: Settings, paths: dict[str, Any], config: str) -> dict[str, float]:
    """One contention run in a fresh child, on a fresh copy of its target."""
    run_dir = Path(paths["root"]) / "contention_run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir()
    target = link_copy(paths["contention_template"], run_dir / "target.lance")
    try:
        return run_child(
            "bench.merge_replay:child_contention",
            {"config": config, "target": target, "sources": paths["contention_sources"]},
        )
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def run_service(paths: dict[str, Any], config: str) -> dict[str, float]:
    """One service run in a fresh child, on a fresh copy of the contention target."""
    run_dir = Path(paths["root"]) / "service_run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir()
    target = link_copy(paths["contention_template"], run_dir / "target.lance")
    try:
        return run_child("bench.merge_replay:child_service", {"config": config, "target": target})
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def service_label(paths: dict[str, Any]) -> str:
    """The service case's name."""
    return (
        f"{SERVICE_CLIENTS} clients x {SERVICE_UPSERTS} upserts of {SERVICE_ROWS} rows "
        f"({SERVICE_SHARED} keys shared by all) into {paths['sizes']['contention_target']:,} rows"
    )


def measure_service(settings: Settings, paths: dict[str, Any]) -> list[Series]:
    """Every service configuration ``settings.runs`` times, alternating."""
    case = service_label(paths)
    by_config = {c: Series(case, c) for c in SERVICE_CONFIGS}
    for r in range(settings.runs):
        for config in SERVICE_CONFIGS:
            by_config[config].samples.append(run_service(paths, config))
        log(f"merge_replay service upserts: round {r + 1}/{settings.runs} done")
    return list(by_config.values())


def contention_label(paths: dict[str, Any]) -> str:
    """The contention case's name."""
    n = paths["sizes"]
    return (
        f"{UPSERTERS} concurrent upserters of {n['contention_source']:,} rows "
        f"(half shared with a neighbour) into {n['contention_target']:,} rows"
    )


def measure_contention(settings: Settings, paths: dict[str, Any]) -> list[Series]:
    """Both configurations ``settings.runs`` times, alternating."""
    case = contention_label(paths)
    by_config = {c: Series(case, c) for c in CONTENTION_CONFIGS}
    for r in range(settings.runs):
        for config in CONTENTION_CONFIGS:
            by_config[config].samples.append(run_contention(settings, paths, config))
        log(f"merge_replay contention: round {r + 1}/{settings.runs} done")
    return list(by_config.values())


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
CONFLICT_VS_BACKOFF_FLOOR = 1.10
BIG_BYTES_VS_DEFAULT = 0.55
BIG_WALL_VS_DEFAULT = 0.90
CONTENTION_VS_DEFAULT = 0.60
SERVICE_P99_VS_THREAD = 0.5
SERVICE_WALL_VS_THREAD = 0.33
SERVICE_VERSIONS_SHARE = 0.25


def replay_allowance(floor_mib: float) -> float:
    """Noise allowed on bytes written beyond the floor: 2% of it, at least 0.1 MiB."""
    return max(REPLAY_ALLOWANCE_MIN_MIB, REPLAY_ALLOWANCE_SHARE * floor_mib)


def service_targets(service: list[Series]) -> list[Target]:
    """Issue 41's targets: the default lance_async against pylance on anyio.to_thread."""
    la_ = next((s for s in service if s.config == LANCE_ASYNC), None)
    th = next((s for s in service if s.config == "pylance_to_thread"), None)
    if la_ is None or th is None:
        return []
    serial = la_.values("serial")
    ok = bool(serial) and all(v == 1.0 for v in serial) and sum(la_.values("failed")) == 0
    upserts = SERVICE_CLIENTS * SERVICE_UPSERTS
    share = la_.median("versions") / upserts
    p99 = ratio(la_.median("p99_ms"), th.median("p99_ms"))
    wall = ratio(la_.median("wall_s"), th.median("wall_s"))
    return [
        Target(
            f"merge_replay [{la_.case}] upsert p99 vs pylance on anyio.to_thread",
            f"{fmt_vs_limit(p99, SERVICE_P99_VS_THREAD)} ({la_.median('p99_ms'):.1f} vs "
            f"{th.median('p99_ms'):.1f} ms)",
            f"≤ {SERVICE_P99_VS_THREAD:.2f}x",
            p99 <= SERVICE_P99_VS_THREAD,
        ),
        Target(
            f"merge_replay [{la_.case}] all done vs pylance on anyio.to_thread, a serial order",
            f"{fmt_vs_limit(wall, SERVICE_WALL_VS_THREAD)} ({la_.median('wall_s'):.3f} vs "
            f"{th.median('wall_s'):.3f} s); serial order in {int(sum(serial))} of "
            f"{len(serial)} runs, {sum(la_.values('failed')):.0f} upserts failed (pylance: "
            f"serial in {int(sum(th.values('serial')))} of {len(th.values('serial'))}, "
            f"{sum(th.values('failed')):.0f} failed)",
            f"≤ {SERVICE_WALL_VS_THREAD:.2f}x, every run a serial order",
            wall <= SERVICE_WALL_VS_THREAD and ok,
        ),
        Target(
            f"merge_replay [{la_.case}] versions per upsert",
            f"{fmt_vs_limit(share, SERVICE_VERSIONS_SHARE)} ({la_.median('versions'):.0f} "
            f"versions for {upserts} upserts; pylance {th.median('versions'):.0f})",
            f"≤ {SERVICE_VERSIONS_SHARE:.2f}",
            share <= SERVICE_VERSIONS_SHARE,
        ),
    ]


def targets(
    series: list[Series], cases: list[tuple[str, str, bool]], contention: list[Series]
) -> list[Target]:
    """Issue 3's replay-bytes target on every case and issue 16's targets.

    Each compares lance_async with what does the same work: a conflict case
    with the hand-written loop that waits the same backoff; the no-conflict
    wall time only where pylance's default spills (the big source), with
    bytes written as the main figure; contention against pylance's own
    retries.
    """
    out: list[Target] = []
    for case, source, conflict in cases:
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
        backoff = find(series, case, BACKOFF_FLOOR)
        if conflict and backoff is not None:
            r = ratio(la_.median("wall_s"), backoff.median("wall_s"))
            out.append(
                Target(
                    f"merge_replay [{case}] wall vs the hand-written loop with the same backoff",
                    f"{fmt_vs_limit(r, CONFLICT_VS_BACKOFF_FLOOR)} ({la_.median('wall_s'):.3f} "
                    f"vs {backoff.median('wall_s'):.3f} s)",
                    f"≤ {CONFLICT_VS_BACKOFF_FLOOR:.2f}x",
                    r <= CONFLICT_VS_BACKOFF_FLOOR,
                )
            )
        if source == "big" and not conflict:
            r_bytes = ratio(la_.median("write_mib"), default.median("write_mib"))
            out.append(
                Target(
                    f"merge_replay [{case}] bytes written vs pylance default retries",
                    f"{fmt_vs_limit(r_bytes, BIG_BYTES_VS_DEFAULT)} "
                    f"({la_.median('write_mib'):.1f} vs {default.median('write_mib'):.1f} MiB)",
                    f"≤ {BIG_BYTES_VS_DEFAULT:.2f}x (no replay spill)",
                    r_bytes <= BIG_BYTES_VS_DEFAULT,
                )
            )
            r_wall = ratio(la_.median("wall_s"), default.median("wall_s"))
            out.append(
                Target(
                    f"merge_replay [{case}] wall vs pylance default retries",
                    f"{fmt_vs_limit(r_wall, BIG_WALL_VS_DEFAULT)} ({la_.median('wall_s'):.3f} "
                    f"vs {default.median('wall_s'):.3f} s)",
                    f"≤ {BIG_WALL_VS_DEFAULT:.2f}x",
                    r_wall <= BIG_WALL_VS_DEFAULT,
                )
            )
    la_c = next((s for s in contention if s.config == LANCE_ASYNC), None)
    pl_c = next((s for s in contention if s.config == "pylance_default"), None)
    if la_c is not None and pl_c is not None:
        r = ratio(la_c.median("wall_s"), pl_c.median("wall_s"))
        serial = la_c.values("serial")
        failed = sum(la_c.values("failed"))
        ok = bool(serial) and all(v == 1.0 for v in serial) and failed == 0
        out.append(
            Target(
                f"merge_replay [{la_c.case}] all done vs pylance's own retries, result a "
                "serial order",
                f"{fmt_vs_limit(r, CONTENTION_VS_DEFAULT)} ({la_c.median('wall_s'):.3f} vs "
                f"{pl_c.median('wall_s'):.3f} s); serial order in {int(sum(serial))} of "
                f"{len(serial)} runs, {failed:.0f} upserts failed (pylance: serial in "
                f"{int(sum(pl_c.values('serial')))} of {len(pl_c.values('serial'))}, "
                f"{sum(pl_c.values('failed')):.0f} failed)",
                f"≤ {CONTENTION_VS_DEFAULT:.2f}x, every run a serial order",
                r <= CONTENTION_VS_DEFAULT and ok,
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
    contention = measure_contention(settings, paths)
    service = measure_service(settings, paths)
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
        "before each retry (a random whole number of slots, each the last attempt's length "
        "and at least 50 ms: 0-3 slots before the first retry, as Lance's own SlotBackoff). "
        "The conflict targets compare "
        "with it: against the loop that retries at once they would measure the backoff, not "
        "lance_async.",
        "Targets (issue 16): the no-conflict wall time is compared with pylance's default "
        "only on the big source, where the default spills its replay buffer; below about "
        "100 MB it buffers in memory and every configuration does the same work.",
        "Contention: the 16 upserters of each run start together (a thread barrier for "
        "pylance, one task group for lance_async); 'all done' is the time until the last "
        "one returned.",
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
        title="merge_insert with a replayable source (issues 3 and 16)",
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
            summary_table(
                "Contention: medians [min–max]",
                contention,
                CONTENTION_METRICS,
                CONTENTION_METRICS[0],
                "lance_async ÷ config (wall)",
                note="serial: 1 when the table equals the upserts applied one by one in the "
                "order of their committed versions; attempts: passes over the sources "
                "(lance_async's replays; pylance retries inside one call, counted as 1).",
            ),
            summary_table(
                "Service upserts (group commit): medians [min–max]",
                service,
                SERVICE_METRICS,
                SERVICE_METRICS[0],
                "lance_async ÷ config (all done)",
                note="Each client makes its 8 upserts one after the other, all 16 at once "
                "on one event loop; pylance_to_thread: each a pylance merge_insert (default "
                "retries) on anyio.to_thread, a dataset per client; lance_async: the "
                "defaults (concurrent upserts share one commit); lance_async_alone: "
                "coalesce(False), one commit per upsert. serial: 1 when the table is the "
                "upserts applied one by one in their order (version, then place in the "
                "group).",
            ),
        ],
        targets=service_targets(service) + targets(series, cases, contention),
        notes=notes,
        series=series + contention + service,
        raw={"paths": {k: v for k, v in paths.items() if k != "root"}, "MIB": MIB},
    )
    return section
