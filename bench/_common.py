"""Plumbing shared by every benchmark: settings, statistics, child processes,
the event-loop ticker, latency histograms, report tables and machine facts.

Units used throughout: seconds for wall time (reported in s or ms), MiB
(2**20 bytes) for memory and bytes written, rows per second for throughput.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parent.parent
MIB = float(1 << 20)

#: The configuration every ratio is taken against.
LANCE_ASYNC = "lance_async"
PK = {"lance-schema:unenforced-primary-key": "true"}
"""Field metadata marking a primary-key column (Lance's unenforced primary key)."""


# ---------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What one invocation of the suite runs with.

    Attributes
    ----------
    quick : bool
        Smoke-run sizes (about a minute in all) instead of the full sizes.
    runs : int
        Repetitions per configuration; every table shows their median, min
        and max.
    out : Path
        Where REPORT.md, the PNG charts and ``runs/`` (raw JSON) go.
    work : Path
        Scratch directory for the datasets (removed at the end).
    lancedb : bool
        Whether LanceDB's async API is measured as an alternative.
    lancedb_note : str
        Why not, when it is not.
    """

    quick: bool
    runs: int
    out: Path
    work: Path
    lancedb: bool
    lancedb_note: str = ""


def lancedb_status() -> tuple[bool, str]:
    """Whether ``lancedb`` is importable (checked in a child: its import is slow)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import lancedb; print(lancedb.__version__)"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    if proc.returncode == 0:
        return True, proc.stdout.strip()
    last = (proc.stderr.strip().splitlines() or ["import failed"])[-1]
    return False, last


# ---------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of the finite values; NaNs when there are none."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, math.nan
    return statistics.median(finite), min(finite), max(finite)


@dataclass
class Series:
    """All runs of one configuration in one case.

    Attributes
    ----------
    case : str
        The input and situation (for example ``"130 MiB, no conflict"``).
    config : str
        The implementation measured (for example ``"lance_async"``).
    samples : list of dict
        One dict of metrics per run.
    """

    case: str
    config: str
    samples: list[dict[str, float]] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        """The metric ``key`` of every run that has it."""
        return [float(s[key]) for s in self.samples if key in s and s[key] is not None]

    def median(self, key: str) -> float:
        """The median of metric ``key`` over the runs (NaN if absent)."""
        return summarize(self.values(key))[0]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"case": self.case, "config": self.config, "samples": self.samples}


def find(series: Iterable[Series], case: str, config: str) -> Series | None:
    """The series of ``config`` in ``case``, if measured."""
    for s in series:
        if s.case == case and s.config == config:
            return s
    return None


@dataclass(frozen=True)
class Metric:
    """A column of a summary table.

    Attributes
    ----------
    key : str
        Key in each run's dict.
    label : str
        Column header, with its unit.
    scale : float
        Multiply the stored value by this for display (1000 for s -> ms).
    digits : int
        Decimals shown.
    """

    key: str
    label: str
    scale: float = 1.0
    digits: int = 2


def fmt_num(value: float, digits: int = 2) -> str:
    """A number for a table cell ("n/a" for NaN); thousands separated."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def fmt_stat(values: Sequence[float], metric: Metric) -> str:
    """``median [min–max]`` of a metric, scaled for display.

    A single number when there was one run, or when every run shows the same
    value at the digits displayed.
    """
    med, lo, hi = summarize([v * metric.scale for v in values])
    if not math.isfinite(med):
        return "n/a"
    d = metric.digits
    if len(values) == 1 or fmt_num(lo, d) == fmt_num(hi, d):
        return fmt_num(med, d)
    return f"{fmt_num(med, d)} [{fmt_num(lo, d)}–{fmt_num(hi, d)}]"


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when undefined."""
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return math.nan
    return a / b


def fmt_ratio(value: float) -> str:
    """A ratio for a table cell (``0.62x``; two significant digits below 0.01: ``0.0043x``)."""
    if not math.isfinite(value):
        return "n/a"
    if 0 < abs(value) < 0.01:
        return f"{value:.2g}x"
    return f"{value:.2f}x"


def fmt_vs_limit(
    value: float,
    limit: float,
    digits: int = 2,
    suffix: str = "x",
    at_most: bool = True,
    signed: bool = False,
) -> str:
    """``value`` printed so that its rounding never crosses ``limit``.

    ``digits`` decimals normally, at least 3 when the value is within 1% of
    the limit, and more while the printed value would land on the other side
    of the limit than the value itself (1.1004 against ``≤ 1.10`` prints as
    ``1.1004x``, never ``1.10x``). ``at_most``: the target is ``value ≤
    limit`` (else ``value ≥ limit``).
    """
    if not (math.isfinite(value) and math.isfinite(limit)):
        return "n/a"

    def ok(v: float) -> bool:
        return v <= limit if at_most else v >= limit

    d = digits
    if limit != 0 and abs(value - limit) <= 0.01 * abs(limit):
        d = max(d, 3)
    while d < 8 and ok(round(value, d)) != ok(value):
        d += 1
    sign = "+" if signed else ""
    return f"{value:{sign},.{d}f}{suffix}"


# ---------------------------------------------------------------------------
# report building blocks
# ---------------------------------------------------------------------------


@dataclass
class Table:
    """A Markdown table of the report."""

    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Target:
    """A goal from an issue, checked against a measured value."""

    name: str
    measured: str
    goal: str
    passed: bool

    def line(self) -> str:
        """The report line: ``PASS``/``MISS``, what, measured, goal."""
        verdict = "PASS" if self.passed else "MISS"
        return f"**{verdict}** {self.name}: measured {self.measured} (target {self.goal})"


@dataclass
class Section:
    """What one benchmark module contributes to REPORT.md."""

    key: str
    title: str
    intro: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    seconds_note: str = ""


def summary_table(
    title: str,
    series: Sequence[Series],
    metrics: Sequence[Metric],
    ratio_metric: Metric | None,
    ratio_label: str = "",
    baseline: str = LANCE_ASYNC,
    note: str = "",
    group: Callable[[Series], str] | None = None,
) -> Table:
    """Medians [min–max] per configuration, with a ratio column against ``baseline``.

    The ratio is ``median(baseline) / median(config)`` of ``ratio_metric``
    within the same case (or the same ``group(series)`` when given), so for
    a time below 1 means lance_async is faster and for a throughput above 1
    means lance_async is faster.
    """
    key = group or (lambda s: s.case)
    header = ["case", "configuration", "runs", *[m.label for m in metrics]]
    if ratio_metric is not None:
        header.append(ratio_label or f"lance_async ÷ config ({ratio_metric.label})")
    rows: list[list[str]] = []
    for s in series:
        row = [s.case, s.config, str(len(s.samples))]
        row += [fmt_stat(s.values(m.key), m) for m in metrics]
        if ratio_metric is not None:
            base = next((b for b in series if key(b) == key(s) and b.config == baseline), None)
            value = (
                ratio(base.median(ratio_metric.key), s.median(ratio_metric.key))
                if base is not None
                else math.nan
            )
            row.append("—" if s.config == baseline else fmt_ratio(value))
        rows.append(row)
    return Table(title, header, rows, note)


# ---------------------------------------------------------------------------
# child processes (fresh process per run, so peak RSS is that run's own)
# ---------------------------------------------------------------------------


class ChildError(RuntimeError):
    """A benchmark child process failed; the message carries its traceback."""


#: lance_async's modules that the measured workloads use. ``import lance_async``
#: loads them lazily (PEP 562), while ``import lance`` loads all of pylance at
#: once; importing them in the zygote keeps a first call's one-time import
#: (and, under PYTHONDONTWRITEBYTECODE, its compile) out of every timing, as a
#: service that imports at start-up would.
LANCE_ASYNC_MODULES = [
    "lance_async",
    "lance_async.dataset",
    "lance_async.merge",
    "lance_async.sources",
    "lance_async.memwal",
]

#: Modules each zygote imports before forking children ("lancedb" adds LanceDB).
FLAVOURS: dict[str, list[str]] = {
    "lance": [
        "numpy",
        "pyarrow",
        "lance",
        "anyio",
        *LANCE_ASYNC_MODULES,
        "psutil",
        "bench._common",
    ],
    "lancedb": [
        "numpy",
        "pyarrow",
        "lance",
        "anyio",
        *LANCE_ASYNC_MODULES,
        "psutil",
        "lancedb",
        "bench._common",
    ],
}


class Zygote:
    """A ``bench._zygote`` server: forks one fresh child per :meth:`run`."""

    def __init__(self, flavour: str, stderr_path: Path | None = None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        self._stderr = open(stderr_path, "ab") if stderr_path else None  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench._zygote", json.dumps(FLAVOURS[flavour])],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )

    def run(self, target: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Run ``target(**params)`` in a forked child; blocking."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"target": target, "params": params, "timeout": timeout}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise ChildError(f"the zygote died running {target}({params})")
        response = json.loads(line)
        if not response.get("ok"):
            raise ChildError(f"{target}({params}) failed:\n{response.get('error')}")
        result: dict[str, Any] = response["result"]
        return result

    def close(self) -> None:
        """Stop the server."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._stderr is not None:
            self._stderr.close()


_zygotes: dict[str, Zygote] = {}
_child_log: list[Path] = []


def set_child_log(path: Path) -> None:
    """Send the children's stderr to ``path`` (zygotes started afterwards)."""
    _child_log[:] = [path]


def close_zygotes() -> None:
    """Stop every zygote started by :func:`run_child`."""
    while _zygotes:
        _, zygote = _zygotes.popitem()
        zygote.close()


def run_child(
    target: str, params: dict[str, Any], timeout: float = 600.0, flavour: str = "lance"
) -> dict[str, Any]:
    """Run ``module:function(**params)`` in a fresh child process.

    The child is forked from a pre-imported zygote (see ``bench/_zygote.py``)
    and runs nothing else; the function returns a dict of metrics and the
    child adds ``peak_rss_mib`` (its own ``ru_maxrss``). Blocking.

    Parameters
    ----------
    flavour : {"lance", "lancedb"}
        Which zygote: "lancedb" has LanceDB imported too.

    Raises
    ------
    ChildError
        The child raised, died or timed out.
    """
    zygote = _zygotes.get(flavour)
    if zygote is None or zygote.proc.poll() is not None:
        zygote = _zygotes[flavour] = Zygote(flavour, _child_log[0] if _child_log else None)
    return zygote.run(target, params, timeout)


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB (``ru_maxrss``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MIB


def current_rss_mib() -> float:
    """This process's resident set size now, in MiB."""
    import psutil

    return float(psutil.Process().memory_info().rss) / MIB


def write_bytes() -> int:
    """Bytes this process caused to be written to storage (Linux ``write_bytes``)."""
    import psutil

    return int(psutil.Process().io_counters().write_bytes)


def cpu_times() -> tuple[int, int] | None:
    """The machine's CPU time stolen by the hypervisor and its total CPU time
    so far, in clock ticks over all cores (Linux ``/proc/stat``); None
    elsewhere. Two readings give the steal share between them
    (:func:`steal_share`)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guests
    # are counted in user already
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    """The share (0..1) of the cores' time the hypervisor gave to other guests
    between two :func:`cpu_times` readings (NaN when unknown). A few percent
    or more makes throughput figures of that span unreliable."""
    if before is None or after is None or after[1] <= before[1]:
        return math.nan
    return (after[0] - before[0]) / (after[1] - before[1])


class Meter:
    """Time, bytes written and RSS around one operation, in the current process.

    Use as ``with Meter() as m: ...``; then ``m.result()`` gives ``wall_s``,
    ``write_mib`` (write_bytes delta), ``base_rss_mib`` (RSS at entry) and
    ``steal_pct`` (the machine's CPU steal meanwhile, :func:`steal_share`).
    """

    def __init__(self) -> None:
        self.start = 0.0
        self.end = 0.0
        self.written = 0
        self.base_rss = 0.0
        self.steal = math.nan
        self._w0 = 0
        self._cpu0: tuple[int, int] | None = None

    def __enter__(self) -> Meter:
        self.base_rss = current_rss_mib()
        self._w0 = write_bytes()
        self._cpu0 = cpu_times()
        self.start = time.perf_counter()
        return self

    def stop(self) -> None:
        """Stop the clock now (before clean-up that should not count)."""
        if not self.end:
            self.end = time.perf_counter()
            self.written = write_bytes() - self._w0
            self.steal = steal_share(self._cpu0, cpu_times())

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def seconds(self) -> float:
        """Wall time in seconds."""
        return self.end - self.start

    def result(self) -> dict[str, float]:
        """The metrics measured."""
        return {
            "wall_s": self.seconds,
            "write_mib": self.written / MIB,
            "base_rss_mib": self.base_rss,
            "steal_pct": self.steal * 100,
        }


# ---------------------------------------------------------------------------
# event-loop lag
# ---------------------------------------------------------------------------


class Ticker:
    """A task that sleeps 1 ms in a loop and records how late it wakes.

    Lag of one tick = time asleep - 1 ms. Start it with
    ``tg.start_soon(ticker.run)`` right before the operation and call
    :meth:`stop` right after; ticks that began before the stop count.
    """

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self._running = True
        self._stopped_at = math.inf

    async def run(self) -> None:
        """The ticking loop (ends after :meth:`stop`)."""
        import anyio

        while self._running:
            start = time.perf_counter()
            await anyio.sleep(self.interval)
            if start < self._stopped_at:
                self.lags.append(max(0.0, time.perf_counter() - start - self.interval))

    def stop(self) -> None:
        """Stop ticking; ticks started after this moment are not counted."""
        self._stopped_at = time.perf_counter()
        self._running = False

    def stats(self) -> dict[str, float]:
        """``lag_p50_ms``, ``lag_p99_ms``, ``lag_max_ms`` and ``ticks``."""
        if not self.lags:
            return {"lag_p50_ms": math.nan, "lag_p99_ms": math.nan, "lag_max_ms": math.nan}
        ordered = sorted(self.lags)
        return {
            "lag_p50_ms": percentile(ordered, 0.50) * 1000,
            "lag_p99_ms": percentile(ordered, 0.99) * 1000,
            "lag_max_ms": ordered[-1] * 1000,
            "ticks": float(len(ordered)),
        }


async def with_ticker(op: Callable[[], Awaitable[T]], lag: bool) -> tuple[T, dict[str, float]]:
    """Await ``op()``; with ``lag``, a :class:`Ticker` runs beside it.

    Returns ``op``'s result and the ticker's :meth:`Ticker.stats` (empty
    without ``lag``).
    """
    import anyio
    import anyio.lowlevel

    if not lag:
        return await op(), {}
    ticker = Ticker()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        await anyio.lowlevel.checkpoint()  # the ticker starts its first sleep
        try:
            result = await op()
        finally:
            ticker.stop()
    return result, ticker.stats()


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of an already sorted sequence."""
    if not ordered:
        return math.nan
    idx = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return float(ordered[idx])


async def query_pool(
    count: int,
    search: Callable[[int], Awaitable[Sequence[int]]],
    tasks: int,
    right: Sequence[set[int]],
) -> dict[str, float]:
    """Run queries ``0..count-1`` through ``search`` from ``tasks`` tasks at once.

    ``search(i)`` answers query ``i`` with the ids it found; ``right[i]`` is
    the set its answers count as hits in. Returns queries/s over the wall
    time, latency p50 / p99 (ms) and ``hits``, the answers found in their
    ``right`` sets (the caller divides it by what a right answer holds).
    Needs a running event loop (anyio).
    """
    import anyio

    lat: list[float] = []
    hits = 0
    pending = list(range(count))

    async def worker() -> None:
        nonlocal hits
        while pending:
            i = pending.pop()
            t0 = time.perf_counter()
            got = await search(i)
            lat.append(time.perf_counter() - t0)
            hits += len(set(got) & right[i])

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(tasks):
            tg.start_soon(worker)
    wall = time.perf_counter() - t0
    ordered = sorted(lat)
    return {
        "qps": count / wall,
        "p50_ms": percentile(ordered, 0.5) * 1000,
        "p99_ms": percentile(ordered, 0.99) * 1000,
        "hits": float(hits),
    }


class LatencyHistogram:
    """Latencies in fixed log-spaced bins: constant memory, whatever the count.

    Bins run from 10 µs to 100 s, 40 per decade (a bin is 6% wide), so
    percentiles are exact to within 6%. Kept this way so that recording
    latencies does not grow the process's memory with the feed length.
    """

    LOW = 1e-5
    PER_DECADE = 40
    DECADES = 7

    def __init__(self) -> None:
        self.counts = [0] * (self.PER_DECADE * self.DECADES + 2)
        self.n = 0
        self.max = 0.0
        self.total = 0.0

    def add(self, seconds: float) -> None:
        """Record one latency (seconds)."""
        self.n += 1
        self.total += seconds
        if seconds > self.max:
            self.max = seconds
        if seconds <= self.LOW:
            self.counts[0] += 1
            return
        idx = 1 + int(math.log10(seconds / self.LOW) * self.PER_DECADE)
        self.counts[min(idx, len(self.counts) - 1)] += 1

    def edge(self, i: int) -> float:
        """Upper edge of bin ``i`` in seconds."""
        return float(self.LOW * 10 ** (i / self.PER_DECADE))

    def quantile(self, q: float) -> float:
        """The ``q`` quantile in seconds (bin's upper edge, capped at the max)."""
        if not self.n:
            return math.nan
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return min(self.edge(i), self.max)
        return self.max

    def to_json(self) -> dict[str, Any]:
        """Non-empty bins as ``[[upper_edge_s, count], ...]`` plus totals."""
        return {
            "bins": [[self.edge(i), c] for i, c in enumerate(self.counts) if c],
            "n": self.n,
            "max": self.max,
        }

    def metrics(self, prefix: str = "ack") -> dict[str, float]:
        """p50 / p99 / max in ms under keys ``{prefix}_p50_ms`` and so on."""
        return {
            f"{prefix}_p50_ms": self.quantile(0.50) * 1000,
            f"{prefix}_p99_ms": self.quantile(0.99) * 1000,
            f"{prefix}_max_ms": self.max * 1000,
        }


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------


def link_copy(src: str | Path, dst: str | Path) -> str:
    """Copy a Lance dataset directory by hard-linking its files.

    Lance never modifies a file in place (new versions are new files), so a
    linked copy behaves as a real copy and costs no I/O.
    """
    dst = Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, copy_function=os.link)
    return str(dst)


def dir_mib(path: str | Path) -> float:
    """Size of a directory tree in MiB."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) / MIB


# ---------------------------------------------------------------------------
# machine facts
# ---------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return ""


@dataclass(frozen=True)
class CodeState:
    """The commit the suite ran on and the paths that differed from it.

    Attributes
    ----------
    commit : str
        ``git rev-parse --short HEAD`` ("unknown" outside a checkout).
    changed : list of str
        Paths ``git status --porcelain`` listed (modified, staged or
        untracked), except the suite's own output under bench/results/.
    """

    commit: str
    changed: list[str]

    @property
    def dirty(self) -> bool:
        """Whether the measured code may differ from ``commit``."""
        return bool(self.changed)

    def describe(self) -> str:
        """One line for the report."""
        if not self.dirty:
            return f"{self.commit} (working tree clean)"
        shown = ", ".join(self.changed[:6]) + (", ..." if len(self.changed) > 6 else "")
        return (
            f"{self.commit} + uncommitted changes to {len(self.changed)} path(s) "
            f"({shown}): the code measured is not exactly that commit"
        )


def code_state() -> CodeState:
    """The repository's HEAD and its uncommitted changes (call before measuring)."""
    commit = _git("rev-parse", "--short", "HEAD").strip() or "unknown"
    changed = []
    for line in _git("status", "--porcelain").splitlines():
        path = line[3:].strip().strip('"')
        if path and not path.startswith("bench/results/"):
            changed.append(path)
    return CodeState(commit, changed)


def machine_facts() -> dict[str, str]:
    """CPU model and count, RAM, platform, Python and library versions, load."""
    from importlib.metadata import PackageNotFoundError, version

    import psutil

    facts = {
        "cpu_model": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "ram_gib": f"{psutil.virtual_memory().total / (1 << 30):.1f}",
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    for dist in ("pylance", "pyarrow", "lancedb", "anyio", "numpy", "matplotlib"):
        try:
            facts[dist] = version(dist)
        except PackageNotFoundError:
            facts[dist] = "not installed"
    load = os.getloadavg()
    facts["load average (1, 5, 15 min) at report time"] = ", ".join(f"{x:.2f}" for x in load)
    return facts


def log(message: str) -> None:
    """Progress on stderr (the report is the output that counts)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def timed(label: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` and log how long it took."""
    t0 = time.perf_counter()
    out = fn()
    log(f"{label}: {time.perf_counter() - t0:.1f} s")
    return out
