"""Metrics: OpenTelemetry instruments for the write and read paths (the ``metrics`` extra).

Off by default, and then free: every hook below is a function that returns at
its first line while metrics are off (no meter, no attribute dict, no
OpenTelemetry import). :func:`configure_metrics` turns them on, on a
``MeterProvider`` you give or OpenTelemetry's global one; ``lance-async serve
--metrics`` does it with a Prometheus reader and serves ``GET /metrics``.

Instruments (meter ``lance_async``; attributes in brackets):

=================================  ==================  ==========================================
name                               kind                what
=================================  ==================  ==========================================
``lance_async.writer.queue.rows``  observable gauge    rows queued in a shard writer [table, shard]
``lance_async.writer.queue.bytes`` observable gauge    bytes queued in a shard writer [table, shard]
``lance_async.writer.puts``        counter             engine puts (group commits) [table, shard]
``lance_async.writer.rows``        counter             rows written by those puts [table, shard]
``lance_async.writer.ack_latency`` histogram (s)       send to durable ack, per queued piece [table]
``lance_async.merge.attempts``     counter             merge_insert attempts [table]
``lance_async.merge.conflicts``    counter             attempts that lost to another writer [table]
``lance_async.merges``             counter             merge_insert calls that committed [table]
``lance_async.reads.lookups``      counter             point lookups [table, path: lsm|base]
``lance_async.reads.scans``        counter             scans opened [table, path: lsm|base]
``lance_async.feed.lag``           observable gauge    messages the broker holds beyond the
                                                       consumer's position [feed, partition]
=================================  ==================  ==========================================

Feed lag is reported where the broker tells it without an extra request:
Kafka (the fetched high watermark), NATS JetStream (each message's
``num_pending``).

``configure_metrics(lance=True)`` also turns on pylance's own instruments
(object-store requests, bytes, latency, errors: :func:`lance.otel.instrument_lance_metrics`)
on the same provider.

The attribute ``table`` is the table's URI; ``shard`` a shard id. Their
cardinality is that of your tables and shards.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable
from typing import Any, ClassVar

__all__ = [
    "PrometheusExport",
    "configure_metrics",
    "metrics_enabled",
    "prometheus_export",
    "record_lookup",
    "record_merge",
    "record_scan",
    "record_settled",
    "set_feed_lag",
    "track_queue",
]


ACK_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
"""Bucket bounds of the ack-latency histogram, in seconds (a durable put waits
one WAL flush, at most the engine's flush interval: 100 ms by default)."""


class _State:
    """The live instruments (None while metrics are off)."""

    on = False
    puts: Any = None
    rows: Any = None
    ack_latency: Any = None
    merge_attempts: Any = None
    merge_conflicts: Any = None
    merges: Any = None
    lookups: Any = None
    scans: Any = None
    queues: ClassVar[weakref.WeakValueDictionary[str, Any]] = weakref.WeakValueDictionary()
    shard_tables: ClassVar[dict[str, str]] = {}
    feed_lag: ClassVar[dict[tuple[str, str], int]] = {}
    lance: bool = False


_S = _State


def metrics_enabled() -> bool:
    """Whether :func:`configure_metrics` turned the instruments on."""
    return _S.on


def configure_metrics(
    meter_provider: Any = None, *, enabled: bool = True, lance: bool = False
) -> bool:
    """Turn lance_async's OpenTelemetry instruments on (or off).

    Parameters
    ----------
    meter_provider : opentelemetry.metrics.MeterProvider, optional
        Where the instruments go; default OpenTelemetry's global provider
        (``opentelemetry.metrics.get_meter_provider()``), which is a no-op
        until an SDK provider is set.
    enabled : bool
        False turns every hook back into a no-op.
    lance : bool
        Also register pylance's own instruments (object-store metrics) on
        the same provider (:func:`lance.otel.instrument_lance_metrics`; once
        per process).

    Returns
    -------
    bool
        Whether the instruments are on.

    Raises
    ------
    TypeError
        ``meter_provider`` has no ``get_meter``, or ``enabled`` / ``lance``
        is not a bool (at the call).
    ImportError
        The OpenTelemetry API is not installed: ``pip install 'lance-async[metrics]'``.

    Notes
    -----
    Does not block. Instruments are created once per call; calling it again
    with another provider moves them there. The model is OpenTelemetry's
    library guidance: instruments from the API, the SDK and exporters chosen
    by the application.
    """
    for name, flag in (("enabled", enabled), ("lance", lance)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
        raise TypeError(
            "meter_provider must be an OpenTelemetry MeterProvider, "
            f"got {type(meter_provider).__name__}"
        )
    if not enabled:
        _S.on = False
        return False
    try:
        from opentelemetry import metrics
    except ImportError as exc:
        raise ImportError(
            "metrics need the OpenTelemetry API: pip install 'lance-async[metrics]'"
        ) from exc
    provider = meter_provider or metrics.get_meter_provider()
    meter = provider.get_meter("lance_async")
    _S.puts = meter.create_counter(
        "lance_async.writer.puts", unit="{put}", description="Engine puts (group commits)"
    )
    _S.rows = meter.create_counter(
        "lance_async.writer.rows", unit="{row}", description="Rows written by engine puts"
    )
    _S.ack_latency = meter.create_histogram(
        "lance_async.writer.ack_latency",
        unit="s",
        description="From a send being queued to its durable acknowledgement",
        explicit_bucket_boundaries_advisory=ACK_BUCKETS,
    )
    _S.merge_attempts = meter.create_counter(
        "lance_async.merge.attempts", unit="{attempt}", description="merge_insert attempts"
    )
    _S.merge_conflicts = meter.create_counter(
        "lance_async.merge.conflicts",
        unit="{attempt}",
        description="merge_insert attempts that conflicted with another writer",
    )
    _S.merges = meter.create_counter(
        "lance_async.merges", unit="{merge}", description="merge_insert calls that committed"
    )
    _S.lookups = meter.create_counter(
        "lance_async.reads.lookups", unit="{lookup}", description="Point lookups"
    )
    _S.scans = meter.create_counter(
        "lance_async.reads.scans", unit="{scan}", description="Scans opened"
    )
    meter.create_observable_gauge(
        "lance_async.writer.queue.rows",
        callbacks=[_queue_callback("queue_rows")],
        unit="{row}",
        description="Rows queued in a shard writer, not yet written",
    )
    meter.create_observable_gauge(
        "lance_async.writer.queue.bytes",
        callbacks=[_queue_callback("queue_bytes")],
        unit="By",
        description="Bytes queued in a shard writer, not yet written",
    )
    meter.create_observable_gauge(
        "lance_async.feed.lag",
        callbacks=[_lag_callback],
        unit="{message}",
        description="Messages the broker holds beyond the consumer's position",
    )
    if lance and not _S.lance:
        from lance.otel import instrument_lance_metrics

        _S.lance = bool(instrument_lance_metrics(provider))
    _S.on = True
    return True


def _queue_callback(field: str) -> Any:
    def callback(_options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        return [
            Observation(
                getattr(queue, field), {"table": _S.shard_tables.get(shard, ""), "shard": shard}
            )
            for shard, queue in list(_S.queues.items())
        ]

    return callback


def _lag_callback(_options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    return [
        Observation(lag, {"feed": feed, "partition": partition})
        for (feed, partition), lag in list(_S.feed_lag.items())
    ]


class PrometheusExport:
    """The Prometheus text of every instrument of the process (``GET /metrics``).

    Made by :func:`prometheus_export`; calling it renders the registry.

    Attributes
    ----------
    content_type : str
        The exposition format's media type (``text/plain; version=0.0.4``).
    """

    def __init__(self, registry: Any, content_type: str) -> None:
        self._registry = registry
        self.content_type = content_type

    def __call__(self) -> bytes:
        """The exposition text (blocking, fast: it reads counters in memory)."""
        from prometheus_client import generate_latest

        data: bytes = generate_latest(self._registry)
        return data


_export: PrometheusExport | None = None


def prometheus_export(*, lance: bool = False) -> PrometheusExport:
    """Turn metrics on with a Prometheus reader; return what renders them.

    An OpenTelemetry SDK ``MeterProvider`` with a ``PrometheusMetricReader``
    (opentelemetry-exporter-prometheus) is created once per process and set
    as the global provider (unless one is set already), then
    :func:`configure_metrics` puts lance_async's instruments on it
    (``lance=True``: pylance's too). Used by ``lance-async serve --metrics``
    and ``lance-async worker --metrics``.

    Raises
    ------
    ImportError
        The ``metrics`` extra is not installed: ``pip install 'lance-async[metrics]'``.
    """
    global _export
    if _export is None:
        try:
            from opentelemetry import metrics
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from opentelemetry.sdk.metrics import MeterProvider
            from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY
        except ImportError as exc:
            raise ImportError(
                f"metrics need the 'metrics' extra ({exc.name} is missing): "
                "pip install 'lance-async[metrics]'"
            ) from exc
        provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
        metrics.set_meter_provider(provider)  # a no-op with a warning if one is set
        configure_metrics(provider, lance=lance)
        _export = PrometheusExport(REGISTRY, CONTENT_TYPE_LATEST)
    elif lance and not _S.lance:
        from opentelemetry import metrics

        configure_metrics(metrics.get_meter_provider(), lance=True)
    return _export


# -- hooks (each returns at once while metrics are off) ---------------------------------


def track_queue(shard_id: str, ds_uri: str | None = None, accumulator: Any = None) -> None:
    """A shard writer is opening: note the shard's table (``ds_uri``) for its
    puts, and observe its queue (an ``Accumulator``: ``queue_rows``,
    ``queue_bytes``; the newest of the shard's writers, held weakly)."""
    if not _S.on:
        return
    if ds_uri is not None:
        _S.shard_tables[shard_id] = ds_uri
    if accumulator is not None:
        _S.queues[shard_id] = accumulator


def record_settled(shard_id: str, items: Iterable[Any], now: float | None = None) -> None:
    """One engine call settled ``items`` (the committer's run): a put, its rows,
    and each piece's latency from queueing to its ack."""
    if not _S.on:
        return
    now = time.monotonic() if now is None else now
    table = _S.shard_tables.get(shard_id, "")
    attrs = {"table": table, "shard": shard_id}
    rows = 0
    put = False
    for item in items:
        if item.kind.name != "PUT":
            continue
        put = True
        rows += item.rows
        _S.ack_latency.record(now - item.queued_at, {"table": table})
    if put:
        _S.puts.add(1, attrs)
        _S.rows.add(rows, attrs)


def record_merge(table: str, attempts: int, committed: bool = True) -> None:
    """A merge_insert ended after ``attempts`` attempts (all but the last conflicted)."""
    if not _S.on:
        return
    attrs = {"table": table}
    _S.merge_attempts.add(attempts, attrs)
    if attempts > 1:
        _S.merge_conflicts.add(attempts - 1, attrs)
    if committed:
        _S.merges.add(1, attrs)


def record_lookup(table: str, path: str = "lsm", n: int = 1) -> None:
    """``n`` point lookups on ``table`` (``path``: ``lsm`` or ``base``)."""
    if not _S.on:
        return
    _S.lookups.add(n, {"table": table, "path": path})


def record_scan(table: str, path: str = "base") -> None:
    """A scan of ``table`` was opened (``path``: ``lsm`` or ``base``)."""
    if not _S.on:
        return
    _S.scans.add(1, {"table": table, "path": path})


def set_feed_lag(feed: str, partition: object, lag: int | None) -> None:
    """What the broker says is left to read in one partition of a feed."""
    if not _S.on or lag is None:
        return
    _S.feed_lag[(feed, str(partition))] = max(0, int(lag))
