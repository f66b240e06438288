"""Commit policies: how a shard writer turns queued rows into engine puts.

A durable ``ShardWriter.put`` in pylance 14 returns once its WAL bytes are
flushed, and the engine flushes them either when the buffered WAL bytes
reach ``max_wal_buffer_size`` (default 10 MiB) or at the next
``max_wal_flush_interval_ms`` tick (default 100 ms). With the defaults a
small put waits for the tick (about 55 ms on average, up to 100 ms), and a
row that arrives while a put is in flight waits for two ticks. With
``max_wal_buffer_size=1`` every put flushes when it is made: its latency is
one WAL write (a few ms on local disk), whatever its size.

Three policies, chosen with ``commit=`` on
:class:`~lance_async.AsyncShardWriter` or :class:`~lance_async.ShardRouter`:

``"adaptive"`` (the default)
    Group commit that adapts to the load, as Kafka's producer does with
    ``linger.ms=0`` and ``batch.size`` (aiokafka's accumulator and sender):
    the engine writer flushes every put (``max_wal_buffer_size=1``); when
    the writer is idle a message is put at once, and under load the next
    put takes everything that queued meanwhile, up to ``max_put_rows``
    (10,000). Puts start at most every ``min_put_interval`` (5 ms), so a
    saturated writer makes puts of thousands of rows rather than hundreds
    of tiny WAL writes. Ack latency is then about one put plus the queue's
    depth in puts; throughput is close to the throughput policy's.
    The pacing adapts too: the interval is four times the last engine put's
    duration, between ``min_put_interval`` and ``max_put_interval`` (20 ms).
    A put slows down when the machine is busy (the engine's WAL write and the
    event loop compete for the cores and the GIL); the pacing then spaces
    puts out so that they take at most about a quarter of the time, and
    each carries more rows -- group commit whose group grows with the load.
    Idle or lightly loaded, puts take a millisecond or two and the interval
    stays at its floor. A routing writer paces its runs the same way, with
    one more step once its event loop is saturated: the shards' puts are
    then paced as the engine's CPU needs, not as one put's wall time,
    stretching run by run (see :meth:`CommitPolicy.pace_run`).
``"latency"``
    The same flush-every-put engine setting with small puts (1,000 rows), no
    pacing and a queue of one put (1,000 rows): the shortest acks under load, at the
    price of more, smaller WAL writes and more CPU per row.
``"throughput"``
    The engine's own WAL settings and puts of up to half a memtable: the
    largest puts and the fewest WAL writes, acks after the engine's tick
    (lance_async's behaviour before the policies existed).

Options given explicitly (``max_put_rows=``, ``max_queue_rows=``,
``linger=``, ``min_put_interval=``, the engine's ``max_wal_buffer_size=``)
override the policy's; so does a ``max_wal_buffer_size`` recorded as the
table's MemWAL writer default (``initialize_mem_wal(max_wal_buffer_size=...)``)
when it differs from pylance's own default.
"""

from __future__ import annotations

import difflib
import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from typing_extensions import TypedDict

from .._args import check_seconds

__all__ = [
    "COMMIT_POLICIES",
    "ENGINE_WAL_BUFFER_SIZE",
    "LOAD_SMOOTHING",
    "PACE_FACTOR",
    "RAMP",
    "SATURATED_LOOP",
    "Commit",
    "CommitPolicy",
    "LoopLoad",
    "WriterConfig",
    "WriterOptions",
    "commit_policy",
    "engine_options",
]

Commit = Literal["adaptive", "latency", "throughput"]
"""The names of the commit policies."""

ENGINE_WAL_BUFFER_SIZE = 10 * 1024 * 1024
"""pylance 14's default ``max_wal_buffer_size`` (bytes)."""


@dataclass(frozen=True)
class CommitPolicy:
    """How a shard writer groups rows into engine puts (see the module notes).

    Attributes
    ----------
    name : str
        ``"adaptive"``, ``"latency"`` or ``"throughput"``.
    wal_buffer_size : int or None
        The engine's ``max_wal_buffer_size`` (bytes) the writer opens with,
        unless the caller or the table's defaults set one; None keeps the
        engine's. Applied to durable writers only.
    max_put_rows : int or None
        Rows per engine put by default (never above the memtable's row
        limit); None: half the memtable. The queue holds twice this.
    min_put_interval : float
        Seconds between the starts of two engine puts (0: none). A put
        after an idle spell starts at once.
    max_put_interval : float
        The most the pacing may stretch that interval to (seconds): it is
        ``PACE_FACTOR`` times the last put's duration, kept within
        ``[min_put_interval, max_put_interval]``. Equal to
        ``min_put_interval``: fixed pacing.
    queue_puts : int
        The queue holds this many puts' rows by default (``max_queue_rows``).
    """

    name: str
    wal_buffer_size: int | None
    max_put_rows: int | None
    min_put_interval: float
    max_put_interval: float = 0.0
    queue_puts: int = 2

    def pace(self, put_seconds: float) -> float:
        """The interval to keep before the next put, after one that took
        ``put_seconds`` (does not block)."""
        if self.max_put_interval <= self.min_put_interval:
            return self.min_put_interval
        return min(self.max_put_interval, max(self.min_put_interval, PACE_FACTOR * put_seconds))

    def pace_run(
        self, put_seconds: Sequence[float], loop_busy: float, previous: float = math.inf
    ) -> float:
        """The interval to keep before a routing writer's next run, after one
        whose shard puts took ``put_seconds`` (one per shard written), with
        the event loop's thread on the CPU ``loop_busy`` of the time (0..1,
        :class:`LoopLoad`) and ``previous`` seconds kept before this run
        (default: no limit). Returns seconds; does not block.

        The shards' puts run side by side, so while the loop has time to
        spare the run is paced as one put: by the longest. Once the loop is
        saturated (``loop_busy`` at least :data:`SATURATED_LOOP`), CPU is
        what limits the rows per second, and each put costs the engine a
        fixed share of it (pylance 14.0.2 on 2 cores: about 0.9 ms of CPU
        per durable put plus 0.3 us per row, so a 1,000-row put costs 1.4 ms
        and a 10,000-row one 4.1 ms); cut into a part per shard, a run makes
        ``len(put_seconds)`` times the puts one writer would. So the
        durations are summed instead and the ceiling is ``max_put_interval``
        per shard written: each shard puts about as many rows at once as one
        writer would at the same load -- at the price of longer acks, under
        saturation only. The stretch ramps up: at most :data:`RAMP` times
        ``previous`` (and never below one put's pacing), so a moment of
        saturation -- a burst, a full garbage collection -- stretches a run a
        little rather than to the ceiling, while sustained saturation reaches
        it in a few runs (issue 25: offered 10,000 10-row messages/s, the
        routing writer's loop sits near :data:`SATURATED_LOOP`; without the
        ramp its ack p99 went past 50 ms in 4 of 9 runs, up to 71 ms, with
        it in none, 34-47 ms; saturated throughput the same, medians of
        4 runs 279,000 rows/s either way).

        Without adaptive pacing (``"latency"``, ``"throughput"``, or a fixed
        interval) the next run waits at least for the longest put, as one
        writer's next put waits for its last: runs go back to back with the
        shards' puts. Routed each millisecond instead, a run of a few sends
        cost the loop more to cut than its rows were worth, and its puts
        carried a few dozen rows each (issue 25: the latency policy routed
        about 10,000 rows/s at 26 rows per put).
        """
        if not put_seconds:
            return self.min_put_interval
        if self.max_put_interval <= self.min_put_interval:
            return max(self.min_put_interval, max(put_seconds))
        if loop_busy < SATURATED_LOOP:
            return self.pace(max(put_seconds))
        cap = self.max_put_interval * len(put_seconds)
        stretched = min(cap, max(self.min_put_interval, PACE_FACTOR * sum(put_seconds)))
        # grow at most RAMP times a run: a moment of saturation (a burst, a
        # full garbage collection) stretches one run's acks a little, not to
        # the ceiling; sustained saturation reaches the ceiling in a few runs
        ceiling = max(self.pace(max(put_seconds)), previous * RAMP)
        return min(stretched, ceiling)


class LoopLoad:
    """How busy the event loop's thread is: the share of wall time it spent on
    the CPU between two samples, smoothed (an exponential moving average).

    Create it and call :meth:`sample` on the loop's thread (a task's code
    runs there); each sample costs two clock reads. A loop near 1.0 is
    saturated: its callbacks are what limit throughput.
    """

    __slots__ = ("_cpu", "_wall", "busy")

    def __init__(self) -> None:
        self._cpu = time.thread_time()
        self._wall = time.monotonic()
        self.busy = 0.0
        """The smoothed share (0..1)."""

    def sample(self) -> float:
        """Fold in the time since the last sample; returns :attr:`busy`."""
        cpu, wall = time.thread_time(), time.monotonic()
        span = wall - self._wall
        if span > 0:
            share = min(1.0, max(0.0, (cpu - self._cpu) / span))
            self.busy += LOAD_SMOOTHING * (share - self.busy)
        self._cpu, self._wall = cpu, wall
        return self.busy


PACE_FACTOR = 4.0
"""Adaptive pacing: the interval between puts, in durations of the last put
(engine puts then take about a quarter of the time at most)."""

RAMP = 1.5
"""A saturated routing writer's interval grows at most this many times per run."""

SATURATED_LOOP = 0.75
"""A routing writer's event loop busy this share of the time (or more) is
saturated: its runs are then paced for throughput (:meth:`CommitPolicy.pace_run`)."""

LOAD_SMOOTHING = 0.2
"""The weight of each new sample in :class:`LoopLoad`'s moving average."""


COMMIT_POLICIES: dict[str, CommitPolicy] = {
    "adaptive": CommitPolicy("adaptive", 1, 10_000, 0.005, 0.02),
    "latency": CommitPolicy("latency", 1, 1_000, 0.0, queue_puts=1),
    "throughput": CommitPolicy("throughput", None, None, 0.0),
}
"""The policies by name."""


def commit_policy(commit: str, min_put_interval: float | None = None) -> CommitPolicy:
    """The policy named ``commit``, with ``min_put_interval`` overridden if given.

    Does not block.

    Raises
    ------
    TypeError
        ``commit`` is not a string, or ``min_put_interval`` not a number.
    ValueError
        ``commit`` names no policy, or ``min_put_interval`` is negative or
        not finite.
    """
    if not isinstance(commit, str):
        raise TypeError(f"commit must be a str, one of {sorted(COMMIT_POLICIES)}, got {commit!r}")
    policy = COMMIT_POLICIES.get(commit)
    if policy is None:
        raise ValueError(
            f"commit must be one of {', '.join(repr(p) for p in COMMIT_POLICIES)}, got {commit!r}"
        )
    if min_put_interval is None:
        return policy
    if isinstance(min_put_interval, bool) or not isinstance(min_put_interval, (int, float)):
        raise TypeError(f"min_put_interval must be a number of seconds, got {min_put_interval!r}")
    if not (math.isfinite(min_put_interval) and min_put_interval >= 0):
        raise ValueError(
            f"min_put_interval must be a finite number of seconds >= 0, got {min_put_interval}"
        )
    interval = float(min_put_interval)
    return CommitPolicy(
        policy.name,
        policy.wal_buffer_size,
        policy.max_put_rows,
        interval,
        max(interval, policy.max_put_interval) if policy.max_put_interval else interval,
        policy.queue_puts,
    )


def _table_flag(value: Any) -> bool | None:
    if value is None:
        return None
    return str(value).lower() != "false"


def engine_options(
    policy: CommitPolicy, options: Mapping[str, Any], table_defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """The keywords to open the engine's ``ShardWriter`` with under ``policy``.

    ``options`` are the caller's engine keywords; ``table_defaults`` the
    MemWAL's recorded ``writer_config_defaults`` (pylance records every
    setting, its own defaults included, once any is given). The policy's
    ``max_wal_buffer_size`` is added only to a durable writer whose caller
    did not set one and whose table records none other than pylance's
    default. Does not block.
    """
    out = dict(options)
    if policy.wal_buffer_size is None or "max_wal_buffer_size" in out:
        return out
    durable = out.get("durable_write")
    if durable is None:
        durable = _table_flag(table_defaults.get("durable_write"))
    if durable is False:
        return out
    recorded = table_defaults.get("max_wal_buffer_size")
    if recorded is not None and int(recorded) != ENGINE_WAL_BUFFER_SIZE:
        return out
    out["max_wal_buffer_size"] = policy.wal_buffer_size
    return out


@dataclass(frozen=True)
class WriterConfig:
    """A shard writer's options, checked (see :class:`~lance_async.AsyncShardWriter`).

    Built by :meth:`from_options`, which both the writer and the routing
    writer call, so a bad option fails where it is given, not when a shard
    first receives rows.

    Attributes
    ----------
    policy : CommitPolicy
    max_queue_rows, max_put_rows : int or None
        As given (None: from the policy and the memtable, see :meth:`limits`).
    max_queue_bytes, max_put_bytes : int
    linger : float
    close_timeout : float
    max_memtable_age : float or None
        Seconds after which a memtable holding rows is flushed to a
        generation even if it is not full (None: only when full or closed).
    storage_timeout : float or None
        Seconds an engine call may wait on the store (None: the dataset's).
    engine : dict
        Keywords for the engine's ``mem_wal_writer``, as given.
    """

    policy: CommitPolicy
    max_queue_rows: int | None
    max_put_rows: int | None
    max_queue_bytes: int
    max_put_bytes: int
    linger: float
    close_timeout: float
    max_memtable_age: float | None
    engine: Mapping[str, Any]
    storage_timeout: float | None = None

    @classmethod
    def from_options(
        cls,
        *,
        commit: str = "adaptive",
        min_put_interval: float | None = None,
        max_queue_rows: int | None = None,
        max_queue_bytes: int = 256 * 1024 * 1024,
        max_put_rows: int | None = None,
        max_put_bytes: int = 64 * 1024 * 1024,
        linger: float = 0.0,
        close_timeout: float = 60.0,
        max_memtable_age: float | None = 60.0,
        storage_timeout: float | None = None,
        **engine: Any,
    ) -> WriterConfig:
        """Check a writer's keyword arguments (does not block).

        Raises
        ------
        TypeError
            An option of the wrong type.
        ValueError
            An unknown policy, a limit below 1, a negative or infinite wait.
        """
        policy = commit_policy(commit, min_put_interval)
        for name, value in (
            ("max_queue_rows", max_queue_rows),
            ("max_put_rows", max_put_rows),
            ("max_queue_bytes", max_queue_bytes),
            ("max_put_bytes", max_put_bytes),
        ):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, seconds in (("linger", linger), ("close_timeout", close_timeout)):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                raise TypeError(f"{name} must be a number of seconds, got {seconds!r}")
            if not seconds >= 0 or (name == "linger" and not math.isfinite(seconds)):
                raise ValueError(f"{name} must be a number of seconds >= 0, got {seconds}")
        if max_memtable_age is not None:
            age = max_memtable_age
            if isinstance(age, bool) or not isinstance(age, (int, float)):
                raise TypeError(f"max_memtable_age must be seconds or None, got {age!r}")
            if not (max_memtable_age > 0 and math.isfinite(max_memtable_age)):
                raise ValueError(
                    f"max_memtable_age must be a finite number of seconds > 0, got "
                    f"{max_memtable_age}"
                )
        if storage_timeout is not None:
            storage_timeout = check_seconds("storage_timeout", storage_timeout, positive=True)
        _check_engine_options(engine)
        return cls(
            policy,
            max_queue_rows,
            max_put_rows,
            max_queue_bytes,
            max_put_bytes,
            float(linger),
            float(close_timeout),
            None if max_memtable_age is None else float(max_memtable_age),
            dict(engine),
            storage_timeout,
        )

    def limits(self, memtable_rows: int) -> tuple[int, int]:
        """``(max_put_rows, max_queue_rows)`` for a memtable of ``memtable_rows`` rows.

        Put rows: as given, else the policy's, else half the memtable; never
        above the memtable (one put never spans memtables). Queue rows: as
        given, else the policy's number of puts (two; the latency policy's
        one: a row then waits for at most the put in flight and its own).
        """
        put = self.max_put_rows or self.policy.max_put_rows or max(1, memtable_rows // 2)
        put = min(put, memtable_rows)
        return put, self.max_queue_rows or self.policy.queue_puts * put


WRITER_OPTIONS = (
    "commit",
    "min_put_interval",
    "max_queue_rows",
    "max_queue_bytes",
    "max_put_rows",
    "max_put_bytes",
    "linger",
    "close_timeout",
    "max_memtable_age",
    "storage_timeout",
)
"""lance_async's own writer options (the rest go to the engine's writer)."""


class WriterOptions(TypedDict, total=False):
    """The keywords of a MemWAL writer (``ds.mem_wal_writer(...)``), each named.

    lance_async's own (checked by :meth:`WriterConfig.from_options`):
    ``commit`` (``"adaptive"``, ``"latency"``, ``"throughput"``),
    ``min_put_interval`` (seconds), ``max_queue_rows``, ``max_queue_bytes``,
    ``max_put_rows``, ``max_put_bytes`` (limits of the queue and of one engine
    put), ``linger`` (seconds to wait for a whole put), ``close_timeout``,
    ``max_memtable_age``, ``storage_timeout`` (seconds; ``None``: never /
    the dataset's). The engine writer's (``LanceDataset.mem_wal_writer``,
    passed as given): ``durable_write``, ``max_wal_buffer_size``,
    ``max_wal_flush_interval_ms``, ``max_memtable_size``, ``max_memtable_rows``,
    ``max_memtable_batches``, ``max_unflushed_memtable_bytes``,
    ``manifest_scan_batch_size``, ``backpressure_log_interval_ms``,
    ``stats_log_interval_ms``, ``hnsw_params``. A name that is neither is a
    TypeError naming the closest one (and, to a type checker, an error).
    """

    commit: str
    min_put_interval: float | None
    max_queue_rows: int | None
    max_queue_bytes: int
    max_put_rows: int | None
    max_put_bytes: int
    linger: float
    close_timeout: float
    max_memtable_age: float | None
    storage_timeout: float | None
    durable_write: bool
    max_wal_buffer_size: int
    max_wal_flush_interval_ms: int
    max_memtable_size: int
    max_memtable_rows: int
    max_memtable_batches: int
    max_unflushed_memtable_bytes: int
    manifest_scan_batch_size: int
    backpressure_log_interval_ms: int
    stats_log_interval_ms: int
    hnsw_params: dict[str, dict[str, int]]


@functools.lru_cache(maxsize=1)
def engine_option_names() -> frozenset[str]:
    """The keywords pylance's ``LanceDataset.mem_wal_writer`` takes (besides
    the shard id), read from its signature once."""
    import inspect

    import lance

    params = inspect.signature(lance.LanceDataset.mem_wal_writer).parameters
    return frozenset(name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _check_engine_options(engine: Mapping[str, Any]) -> None:
    """Refuse a keyword that is neither lance_async's nor the engine's.

    Raises
    ------
    TypeError
        Naming the unknown option and the closest known one.
    """
    known = engine_option_names()
    for name in engine:
        if name in known:
            continue
        close = difflib.get_close_matches(name, [*WRITER_OPTIONS, *sorted(known)], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(
            f"unknown MemWAL writer option {name!r}{hint}: lance_async's options are "
            f"{', '.join(WRITER_OPTIONS)}; the engine's are {', '.join(sorted(known))}"
        )
