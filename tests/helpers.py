"""Test helpers shared by several test modules."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import pyarrow as pa

PK = {"lance-schema:unenforced-primary-key": "true"}

#: id (primary key, int64) + value (int64) + name (string)
KV_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("value", pa.int64()),
        pa.field("name", pa.string()),
    ]
)


def kv_table(ids: list[int] | range, value: int = 0) -> pa.Table:
    """Rows id=i, value=value, name=f"n{i}" with KV_SCHEMA."""
    ids = list(ids)
    return pa.table(
        {"id": ids, "value": [value] * len(ids), "name": [f"n{i}" for i in ids]}, schema=KV_SCHEMA
    )


LAG_LIMIT = 0.2
"""CPU seconds the loop's thread may spend between two ticks of a
:class:`Ticker`: far below what any of the loop-lag tests' workloads would
take if it ran on the loop (0.5 s and more), and far above one slice of
their work done there. Latency targets themselves are measured in bench/."""


@dataclass
class Ticker:
    """Watches the event loop with a task that sleeps 1 ms in a loop.

    Each tick records its lag (wall seconds past the sleep, for reports) and
    the CPU seconds the loop's thread spent meanwhile (what the assertions
    use: a loaded machine delays wake-ups, it does not add CPU seconds to a
    thread).
    """

    interval: float = 0.001
    lags: list[float] = field(default_factory=list)
    slices: list[float] = field(default_factory=list)
    running: bool = True

    loop_cpu: float = 0.0
    process_cpu: float = 0.0

    async def run(self) -> None:
        # The objects earlier tests left in this (xdist worker) process are
        # moved out of the collector's reach first: a full collection of them
        # runs on whichever thread allocates, and one took 0.25 CPU s of the
        # loop's thread in a CI run (alone the test's largest slice is 0.03 s).
        gc.collect()
        gc.freeze()
        try:
            loop0, process0 = time.thread_time(), time.process_time()
            while self.running:
                start, cpu = time.perf_counter(), time.thread_time()
                await anyio.sleep(self.interval)
                self.lags.append(time.perf_counter() - start - self.interval)
                self.slices.append(time.thread_time() - cpu)
            self.loop_cpu = time.thread_time() - loop0
            self.process_cpu = time.process_time() - process0
        finally:
            gc.unfreeze()

    def assert_off_loop(self, share: float = 0.5) -> None:
        """The loop's thread used less than ``share`` of the process's CPU
        while the ticker ran: the work ran on worker threads.

        CPU time, not wall time: a loaded machine delays the loop's wake-ups
        and stretches the work, but it does not move CPU seconds from one
        thread to another, so the share holds at any load. Work run on the
        loop puts its whole cost on the loop's thread (the ticker's own
        wake-ups cost a few percent).
        """
        assert self.process_cpu > 0, "the ticker did not run"
        used = self.loop_cpu / self.process_cpu
        assert used < share, (
            f"the loop's thread used {self.loop_cpu:.2f} s of {self.process_cpu:.2f} s of CPU"
        )

    def assert_free(self, min_ticks: int = 10) -> None:
        """The loop kept running while the ticker ran: it ticked at least
        ``min_ticks`` times, and no work between two ticks took
        :data:`LAG_LIMIT` CPU seconds of the loop's thread.

        Work run on the loop shows as one slice of the loop thread's CPU as
        long as the work itself; a loaded machine stretches the wall time
        between ticks, not the CPU seconds in them, so the bound holds at
        any load (the latency figures themselves are bench/'s).
        """
        assert len(self.lags) >= min_ticks, f"the loop ticked {len(self.lags)} times"
        assert self.max_slice < LAG_LIMIT, (
            f"the loop's thread spent {self.max_slice:.3f} CPU s between two ticks"
        )

    @property
    def max_slice(self) -> float:
        """The most CPU seconds the loop's thread spent between two ticks."""
        return max(self.slices) if self.slices else 0.0


def run_in_thread(competitor: Callable[[], object]) -> None:
    """Run ``competitor()`` on a thread of its own and wait for it (Lance
    cannot be called from inside its own runtime threads); re-raise its error."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            competitor()
        except BaseException as exc:  # pragma: no cover - shown by the raise
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


class CompetingSource:
    """A replayable factory whose first ``times`` passes let a competitor commit.

    Each call returns a fresh reader over ``table``; on the first ``times``
    passes, once the engine has read the last batch (and before it can
    commit), ``competitor()`` -- a real write to the same table -- runs on a
    thread of its own and commits. The merge reading the pass then conflicts,
    deterministically. Unlike :class:`CommitHook` it needs no ``commit_lock``
    (whose conflicting commits panic pylance 14.0.2 on Python 3.13), so it
    works on every Python; use it as ``la.replayable(src, schema=...)`` or
    hand ``src()`` over as a one-shot reader.
    """

    def __init__(self, table: pa.Table, competitor: Callable[[], object], times: int = 1) -> None:
        self.table = table
        self.competitor = competitor
        self.times = times
        self.calls = 0
        self.competed = 0

    def __call__(self) -> pa.RecordBatchReader:
        self.calls += 1
        fire = self.calls <= self.times

        def batches() -> Iterator[pa.RecordBatch]:
            yield from self.table.to_batches()
            if fire:
                run_in_thread(self.competitor)
                self.competed += 1

        return pa.RecordBatchReader.from_batches(self.table.schema, batches())


class CommitHook:
    """A Lance ``commit_lock`` that lets a competitor commit first.

    Python 3.13: pylance 14.0.2 panics when a commit made through a
    ``commit_lock`` conflicts, so tests using it are marked
    ``@pytest.mark.commit_lock`` and skipped there (``CompetingSource``
    injects conflicts on every Python).

    Lance calls the commit lock right before it commits. For the first
    ``times`` commits this hook runs ``competitor()`` -- a real write to the
    same table through its own dataset object -- on a separate thread and
    waits for it, so the commit that follows conflicts deterministically.
    (Lance cannot be called from inside its own runtime thread, hence the
    thread.)
    """

    def __init__(self, competitor: Callable[[], object], times: int = 1) -> None:
        self.competitor = competitor
        self.times = times
        self.commits: list[int] = []
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, version: int) -> Iterator[None]:
        with self.lock:
            self.commits.append(version)
            run = len(self.commits) <= self.times
        if run:
            errors: list[BaseException] = []

            def target() -> None:
                try:
                    self.competitor()
                except BaseException as exc:  # pragma: no cover - shown by the assert
                    errors.append(exc)

            thread = threading.Thread(target=target)
            thread.start()
            thread.join()
            assert not errors, errors
        yield


def upsert_sync(uri: str, table: pa.Table, on: str = "id") -> None:
    """A plain pylance upsert (the competitor in conflict tests)."""
    import lance

    ds = lance.dataset(uri)
    ds.merge_insert(on).when_matched_update_all().when_not_matched_insert_all().execute(table)


def apply_upserts(
    base: pa.Table, *updates: pa.Table, key: str = "id"
) -> dict[object, dict[str, object]]:
    """Rows by key after applying upserts one after the other."""
    rows = {r[key]: r for r in base.to_pylist()}
    for update in updates:
        for r in update.to_pylist():
            rows[r[key]] = r
    return rows


def serial_rows(
    base: pa.Table, upserts: Mapping[Any, pa.Table], results: Mapping[Any, Any]
) -> dict[object, dict[str, object]]:
    """The rows after applying ``upserts`` one by one in their results' order;
    asserts each result's counts are the ones that order gives it."""
    order = sorted(results, key=lambda i: (results[i].version, results[i].group_index))
    places = [(results[i].version, results[i].group_index) for i in order]
    assert len(set(places)) == len(places), "two upserts claim one place in the order"
    rows = {r["id"]: r for r in base.to_pylist()}
    for i in order:
        inserted = updated = 0
        for r in upserts[i].to_pylist():
            if r["id"] in rows:
                updated += 1
            else:
                inserted += 1
            rows[r["id"]] = r
        got = (results[i].num_inserted_rows, results[i].num_updated_rows)
        assert got == (inserted, updated), (i, results[i])
    return rows


def rows_by_key(table: pa.Table, key: str = "id") -> dict[Any, dict[str, Any]]:
    """Rows by key (Arrow's Python values); fails on a duplicate key."""
    out: dict[Any, dict[str, Any]] = {}
    for r in table.to_pylist():
        assert r[key] not in out, f"duplicate key {r[key]!r}"
        out[r[key]] = r
    return out


async def eventually(
    predicate: Callable[[], Awaitable[bool] | bool],
    timeout: float,
    what: str,
    interval: float = 0.05,
) -> None:
    """Poll ``predicate`` (sync or async) until it holds; fail after ``timeout`` s.

    For conditions kept by other processes or brokers, which no event can
    signal to the test.
    """
    with anyio.fail_after(timeout):
        while True:
            result = predicate()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await anyio.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")  # pragma: no cover


def lsm_ids(uri: str) -> list[int]:
    """The sorted ids an LSM scan of the table at ``uri`` sees (blocking:
    for tests of the command line, outside any event loop)."""
    import lance_async as la

    async def read() -> list[int]:
        ds = await la.open_dataset(uri)
        table = await ds.lsm.scan(columns=["id"]).to_table()
        return sorted(table.column("id").to_pylist())

    return anyio.run(read)


async def stderr_until(proc: Any, text: str, timeout: float = 60) -> str:
    """A process's standard error read until it holds ``text`` (or ends);
    ``timeout`` only stops a hung test."""
    assert proc.stderr is not None
    err = ""
    with anyio.fail_after(timeout):
        async for chunk in proc.stderr:
            err += chunk.decode()
            if text in err:
                break
    return err
