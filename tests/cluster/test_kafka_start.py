"""A Kafka worker waits for its broker: started while no broker answers, it does not exit.

The chaos test (``test_chaos.py``) restarts its broker while a worker killed
a moment before is starting again: a worker whose consumer bootstrapped in
that window once exited 1 (``Unable to bootstrap``). librdkafka reconnects
by itself: the worker says ``no Kafka broker answers`` once, joins the group
when the broker answers and ingests, or, stopped first, returns at once,
owning nothing (the command exits 0).
"""

from __future__ import annotations

import json
import signal
import sys
import uuid
from pathlib import Path

import anyio
import pytest

import lance_async as la
from lance_async.cluster import KafkaCoordinator, KafkaPublisher, Partitioner, Worker, WorkerStats
from lance_async.feeds import KafkaProducer
from lance_async.feeds.kafkaclient import consumer_config

from ..helpers import KV_SCHEMA, eventually, stderr_until
from ..services import create_bucket, create_topic, free_port
from .brokers import tansu_server

PARTITIONS = 2
FAST = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 200, "max.poll.interval.ms": 6000}


async def table(tmp_path: Path) -> la.AsyncDataset:
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(num_buckets=PARTITIONS, bucket_column="id")
    return ds


async def found_no_broker(coordinator: KafkaCoordinator) -> None:
    """Until the coordinator's consumer reported that no broker answers."""
    with anyio.fail_after(60):  # only stops a hung test
        while coordinator.watch.down_since is None:  # noqa: ASYNC110 - librdkafka's
            await anyio.sleep(0.05)  # error callback sets it: no event to wait on


@pytest.mark.asyncio
async def test_a_worker_started_before_its_broker_joins_once_it_answers(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"tansu-{uuid.uuid4().hex[:10]}"
    create_bucket(endpoint, bucket)
    broker = tansu_server(tmp_path, endpoint, bucket)  # not started: its port refuses
    bootstrap = f"127.0.0.1:{broker.port}"
    topic, group = f"start-{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:6]}"
    ds = await table(tmp_path)
    partitioner = await Partitioner.for_dataset(ds)
    config = consumer_config(bootstrap, group, options=FAST)
    coordinator = KafkaCoordinator(config, topic, PARTITIONS, "solo")
    worker = Worker(ds, coordinator=coordinator)
    result: list[WorkerStats] = []
    rows = [{"id": i, "value": i, "name": f"n{i}"} for i in range(20)]

    async def run() -> None:
        result.append(await worker.run())

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await found_no_broker(coordinator)  # the worker found no broker, and goes on
            await anyio.to_thread.run_sync(broker.start)
            await create_topic(bootstrap, topic, PARTITIONS)
            producer = KafkaProducer({"bootstrap.servers": bootstrap})
            publisher = KafkaPublisher(producer, topic, PARTITIONS, owns_producer=True)
            try:
                for row, p in zip(rows, partitioner.partition_of_rows(rows), strict=True):
                    await publisher.publish(p, json.dumps(row).encode())
            finally:
                await publisher.aclose()
            await eventually(
                lambda: worker.stats().messages >= len(rows), 60, "every message acknowledged"
            )
            worker.stop()
    finally:
        broker.stop()
    assert result and result[0].messages >= len(rows)
    scanned = await (await la.open_dataset(ds.uri)).lsm.scan(columns=["id"]).to_table()
    assert sorted(scanned.column("id").to_pylist()) == list(range(len(rows)))


@pytest.mark.asyncio
async def test_a_worker_waiting_for_its_broker_stops_at_once(tmp_path: Path) -> None:
    config = consumer_config(f"127.0.0.1:{free_port()}", "g", options=FAST)
    coordinator = KafkaCoordinator(config, "t", 2, "solo")
    worker = Worker(await table(tmp_path), coordinator=coordinator)
    result: list[WorkerStats] = []

    async def run() -> None:
        result.append(await worker.run())

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await found_no_broker(coordinator)
        worker.stop()
    assert result and result[0].assigned == 0


@pytest.mark.asyncio
async def test_the_command_waits_for_its_broker_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    """``lance-async worker`` with no broker yet: no exit by itself; SIGTERM: exit 0."""
    uri = (await table(tmp_path)).uri
    command = [sys.executable, "-m", "lance_async", "worker"]
    command += [f"kafka://127.0.0.1:{free_port()}/t", uri, "--group", "g", "--member", "m"]
    async with await anyio.open_process(command) as proc:
        # until the worker says it will try again
        err = await stderr_until(proc, "no Kafka broker answers")
        with anyio.fail_after(60):  # only stops a hung test
            assert "no Kafka broker answers" in err, err  # (not an exit)
            proc.send_signal(signal.SIGTERM)
            code = await proc.wait()
        assert proc.stderr is not None
        async for chunk in proc.stderr:
            err += chunk.decode()
    assert code == 0, err
    assert "error:" not in err, err


@pytest.mark.asyncio
async def test_a_kafka_setting_the_worker_refuses_is_a_one_line_usage_error(
    tmp_path: Path,
) -> None:
    uri = (await table(tmp_path)).uri
    for query, words in [
        ("protocol=eager", "protocol must be one of"),
        ("enable_auto_commit=true", "never automatically"),
        ("protocol=consumer&session_timeout_ms=3000", "set by the broker"),
    ]:
        command = [sys.executable, "-m", "lance_async", "worker"]
        command += [f"kafka://127.0.0.1:{free_port()}/t?{query}", uri]
        done = await anyio.run_process(command, check=False)
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert words in err and "Traceback" not in err, err
