"""Metrics (lance_async._metrics): values read back from an OpenTelemetry reader
after a known workload, and hooks that do nothing while metrics are off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import lance_async as la
from lance_async import _metrics

from .helpers import CommitHook, kv_table, upsert_sync


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    la.configure_metrics(MeterProvider(metric_readers=[reader]))
    try:
        yield reader
    finally:
        la.configure_metrics(enabled=False)


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Every data point by instrument name."""
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def total(found: dict[str, list[Any]], name: str, **attrs: str) -> float:
    values: list[float] = [
        p.value
        for p in found.get(name, [])
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    ]
    return sum(values)


@pytest.mark.asyncio
async def test_writer_puts_rows_and_ack_latency_after_a_known_ingest(
    reader: InMemoryMetricReader, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(kv_table(range(5)), uri)
    await ds.initialize_mem_wal(unsharded=True)
    async with ds.mem_wal_writer() as writer:
        for start in range(100, 400, 100):
            await writer.put(kv_table(range(start, start + 100)))  # 3 durable puts, 300 rows
        found = points(reader)
        queued = [
            p.value for p in found["lance_async.writer.queue.rows"] if p.attributes["table"] == uri
        ]
        assert queued == [0]  # every put acked: nothing queued
    found = points(reader)
    assert total(found, "lance_async.writer.rows", table=uri) == 300
    assert total(found, "lance_async.writer.puts", table=uri) == 3
    (latency,) = found["lance_async.writer.ack_latency"]
    assert latency.count == 3 and latency.sum > 0
    assert await ds.lsm.point_lookup(150) is not None
    assert total(points(reader), "lance_async.reads.lookups", table=uri, path="lsm") == 1
    async with ds.lsm.scan(columns=["id"]) as stream:
        assert (await stream.to_table()).num_rows == 305
    assert total(points(reader), "lance_async.reads.scans", table=uri, path="lsm") == 1


@pytest.mark.asyncio
@pytest.mark.commit_lock
async def test_merge_attempts_and_conflicts(reader: InMemoryMetricReader, tmp_path: Path) -> None:
    uri = str(tmp_path / "m.lance")
    await la.write_dataset(kv_table(range(10)), uri)
    hook = CommitHook(lambda: upsert_sync(uri, kv_table([2, 3], value=7)), times=1)
    ds = await la.open_dataset(uri, commit_lock=hook)
    source = la.replayable(lambda: kv_table([1, 2, 20], value=100), schema=ds.schema)
    result = await (
        ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    ).execute(source)
    assert result.num_attempts == 2
    found = points(reader)
    assert total(found, "lance_async.merge.attempts", table=uri) == 2
    assert total(found, "lance_async.merge.conflicts", table=uri) == 1
    assert total(found, "lance_async.merges", table=uri) == 1


def test_hooks_do_nothing_while_metrics_are_off() -> None:
    la.configure_metrics(enabled=False)
    assert not _metrics.metrics_enabled()
    # no instrument is touched (they may not even exist): these must not raise
    _metrics.record_merge("t", 3)
    _metrics.record_lookup("t")
    _metrics.record_scan("t")
    _metrics.record_settled("shard", [])
    _metrics.set_feed_lag("f", 0, 5)
    assert _metrics._S.feed_lag == {} or ("f", "0") not in _metrics._S.feed_lag
