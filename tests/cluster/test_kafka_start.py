"""A Kafka worker waits for its broker: started while no broker answers, it does not exit.

The chaos test (``test_chaos.py``) restarts its broker while a worker killed
a moment before is starting again: a worker whose consumer bootstrapped in
that window exited 1 (``KafkaConnectionError: Unable to bootstrap from
...``). Now it tries again until the broker answers (then joins the group
and ingests), or until it is stopped (then it returns at once, owning
nothing; the command exits 0).
"""

from __future__ import annotations

import json
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

import lance_async as la
from lance_async.cluster import KafkaCoordinator, KafkaPublisher, Partitioner, Worker, WorkerStats

from ..helpers import KV_SCHEMA, eventually, stderr_until
from ..services import create_bucket, create_topic, free_port
from .brokers import tansu_server

PARTITIONS = 2


async def table(tmp_path: Path) -> la.AsyncDataset:
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(num_buckets=PARTITIONS, bucket_column="id")
    return ds


def failing_start(consumer: Any, up: anyio.Event | None = None) -> anyio.Event:
    """Wrap ``consumer.start``: the event returned is set once a start found
    no broker; a later start waits for ``up`` first (the broker and its topic
    are ready), so the test decides when the worker may get in."""
    failed = anyio.Event()
    start = consumer.start

    async def wrapped() -> None:
        if failed.is_set() and up is not None:
            await up.wait()
        try:
            await start()
        except KafkaConnectionError:
            failed.set()
            raise

    consumer.start = wrapped
    return failed


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
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    up = anyio.Event()
    failed = failing_start(consumer, up)
    worker = Worker(ds, coordinator=KafkaCoordinator(consumer, topic, PARTITIONS, "solo"))
    result: list[WorkerStats] = []
    rows = [{"id": i, "value": i, "name": f"n{i}"} for i in range(20)]

    async def run() -> None:
        result.append(await worker.run())

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(60):  # only stops a hung test
                await failed.wait()  # the worker found no broker, and goes on
            await anyio.to_thread.run_sync(broker.start)
            await create_topic(bootstrap, topic, PARTITIONS)
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
            await producer.start()
            publisher = KafkaPublisher(producer, topic, PARTITIONS, owns_producer=True)
            try:
                for row, p in zip(rows, partitioner.partition_of_rows(rows), strict=True):
                    await publisher.publish(p, json.dumps(row).encode())
            finally:
                await publisher.aclose()
            up.set()
            await eventually(
                lambda: worker.stats().messages >= len(rows), 60, "every message acknowledged"
            )
            worker.stop()
    finally:
        broker.stop()
    assert result and result[0].messages >= len(rows)
    scanned = await (await la.open_dataset(ds.uri)).lsm_scan(columns=["id"]).to_table()
    assert sorted(scanned.column("id").to_pylist()) == list(range(len(rows)))


@pytest.mark.asyncio
async def test_a_worker_waiting_for_its_broker_stops_at_once(tmp_path: Path) -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{free_port()}", group_id="g", enable_auto_commit=False
    )
    failed = failing_start(consumer)
    worker = Worker(await table(tmp_path), coordinator=KafkaCoordinator(consumer, "t", 2, "solo"))
    result: list[WorkerStats] = []

    async def run() -> None:
        result.append(await worker.run())

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(60):  # only stops a hung test
            await failed.wait()
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
