"""The Worker in one process: partitions it owns, misrouted rows, a clean stop (real Redis)."""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import lance
import pyarrow as pa
import pytest
import pytest_asyncio
import redis.asyncio

import lance_async as la
from lance_async.cluster import (
    Partitioner,
    RedisLeaseTable,
    RedisPartitions,
    RedisPublisher,
    Worker,
)

from ..conftest import broker_or_skip
from ..helpers import KV_SCHEMA, eventually

if sys.version_info < (3, 11):  # pragma: no cover - anyio brings the backport
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup

URL = "redis://127.0.0.1:6379"


@pytest_asyncio.fixture
async def client() -> AsyncIterator[Any]:
    broker_or_skip("Redis", 6379)
    c = redis.asyncio.Redis.from_url(URL)
    yield c
    await c.aclose()


@contextlib.asynccontextmanager
async def solo_worker(
    ds: la.AsyncDataset, client: Any, ttl: float, **options: Any
) -> AsyncIterator[tuple[Worker, str]]:
    """A Worker, member "solo", over a fresh 2-partition Redis feed and lease
    table (lease TTL ``ttl`` s); yields it and the feed's key, and deletes
    the feed's and the member's keys afterwards."""
    key = f"w-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        ds,
        RedisPartitions(client, key, "g", 2),
        RedisLeaseTable(client, f"{key}:leases", "solo", ttl),
        **options,
    )
    try:
        yield worker, key
    finally:
        for p in range(2):
            await client.delete(f"{key}:{p}")
        await client.delete(f"{key}:leases:member:solo")


@pytest.mark.asyncio
async def test_a_misrouted_row_is_dead_lettered_never_written(tmp_path: Path, client: Any) -> None:
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    partitioner = await Partitioner.for_dataset(ds)
    key = f"w-{uuid.uuid4().hex[:8]}"
    rows = [{"id": i, "value": 1, "name": "x"} for i in range(20)]
    parts = partitioner.partition_of_rows(rows)
    stray = next(r for r, p in zip(rows, parts, strict=True) if p == 1)
    publisher = RedisPublisher(client, key, 2)
    for row, p in zip(rows, parts, strict=True):
        await publisher.publish(p, json.dumps(row).encode())
    await publisher.publish(0, json.dumps({**stray, "value": 99}).encode())  # wrong partition
    letters: list[Any] = []
    worker = Worker(
        ds,
        RedisPartitions(client, key, "g", 2),
        RedisLeaseTable(client, f"{key}:leases", "solo", 2.0),
        dead_letter=lambda m, e: letters.append((m.offset, str(e))),
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await eventually(lambda: worker.stats().messages == 21, 30, "every message acked")
            assert worker.stats().partitions == [0, 1]
            worker.stop()
        stats = worker.stats()
        assert (stats.dead_letters, stats.rows, stats.partitions) == (1, 20, [])
        assert "came on partition 0" in letters[0][1]
        assert await client.mget([f"{key}:leases:lease:0", f"{key}:leases:lease:1"]) == [
            None,
            None,
        ]  # a clean stop released the leases
        table = (await ds.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
        assert sorted(r["id"] for r in table) == list(range(20))
        assert {r["value"] for r in table} == {1}
    finally:
        for p in range(2):
            await client.delete(f"{key}:{p}")
        await client.delete(f"{key}:leases:member:solo")


@pytest.mark.asyncio
async def test_a_feed_with_other_partitions_than_the_table_is_refused(
    tmp_path: Path, client: Any
) -> None:
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal()  # 4 buckets
    worker = Worker(ds, RedisPartitions(client, "k", "g", 3), RedisLeaseTable(client, "k", "m"))
    with pytest.raises(la.InvalidInputError, match="partitioned like the table"):
        await worker.run()


@pytest.mark.asyncio
async def test_a_worker_compacts_the_shards_it_owns(tmp_path: Path, client: Any) -> None:
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    partitioner = await Partitioner.for_dataset(ds)
    key = f"w-{uuid.uuid4().hex[:8]}"
    rows = [{"id": i, "value": 2, "name": "x"} for i in range(60)]
    publisher = RedisPublisher(client, key, 2)
    for row, p in zip(rows, partitioner.partition_of_rows(rows), strict=True):
        await publisher.publish(p, json.dumps(row).encode())
    worker = Worker(
        ds,
        RedisPartitions(client, key, "g", 2),
        RedisLeaseTable(client, f"{key}:leases", "solo", 2.0),
        writer_options={"max_memtable_rows": 5},
        compaction=la.CompactionPolicy(max_generations=1, interval=0.05, optimize_indices=False),
    )

    async def base_ids() -> list[int]:
        fresh = await la.open_dataset(ds.uri)
        return sorted((await fresh.to_table(columns=["id"])).column("id").to_pylist())

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await eventually(lambda: worker.stats().messages == 60, 30, "every message acked")
            for _ in range(300):  # the memtables flush and the compactor merges them
                if len(await base_ids()) >= 40:
                    break
                await anyio.sleep(0.1)
            worker.stop()
        merged = await base_ids()
        assert len(merged) >= 40 and set(merged) <= set(range(60))  # compacted into the base
        table = (await ds.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
        assert sorted(r["id"] for r in table) == list(range(60))
        assert {r["value"] for r in table} == {2}
    finally:
        for p in range(2):
            await client.delete(f"{key}:{p}")
        await client.delete(f"{key}:leases:member:solo")


@pytest.mark.asyncio
async def test_a_clean_stop_drains_every_partition_under_its_lease(
    tmp_path: Path, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Six partitions stop together while rows keep coming: every drained ack
    is made under a lease renewed meanwhile (none reported fenced or lost),
    and the figures never go backwards while partitions are handed back."""
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(num_buckets=6, bucket_column="id")
    partitioner = await Partitioner.for_dataset(ds)
    key = f"w-{uuid.uuid4().hex[:8]}"
    publisher = RedisPublisher(client, key, 6)
    worker = Worker(
        ds,
        RedisPartitions(client, key, "g", 6),
        # a TTL far past a loaded machine's late renewals (3 s lost leases at
        # load 19): a clean stop hands the leases back at once, never waits it
        RedisLeaseTable(client, f"{key}:leases", "solo", 20.0),
    )
    seen: list[int] = []
    publishing = True

    async def publish() -> None:
        i = 0
        while publishing:
            row = {"id": i, "value": 1, "name": "x"}
            await publisher.publish(
                partitioner.partition_of_rows([row])[0], json.dumps(row).encode()
            )
            i += 1
            await anyio.sleep(0.002)

    async def watch() -> None:
        while True:
            seen.append(worker.stats().messages)
            await anyio.sleep(0.001)

    try:
        with caplog.at_level("INFO", logger="lance_async"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                tg.start_soon(publish)
                await eventually(lambda: len(worker.stats().partitions) == 6, 30, "six partitions")
                await eventually(lambda: worker.stats().messages > 200, 30, "rows flowing")
                tg.start_soon(watch)
                worker.stop()
                await eventually(lambda: worker.stats().partitions == [], 60, "all handed back")
                await anyio.sleep(0.2)
                publishing = False
                tg.cancel_scope.cancel()
        stats = worker.stats()
        assert (stats.lost, stats.revoked) == (0, 6), stats
        assert "fenced" not in caplog.text
        assert seen == sorted(seen), "the acknowledged count went backwards"
        assert stats.messages >= seen[-1]
    finally:
        for p in range(6):
            await client.delete(f"{key}:{p}")
        await client.delete(f"{key}:leases:member:solo")


@pytest.mark.asyncio
async def test_a_sigterm_during_start_up_stops_the_worker_cleanly(tmp_path: Path) -> None:
    """SIGTERM while the worker still connects to its broker: exit 0, owning nothing.

    (The default action would end the process with -15 and no word.)
    """
    import signal
    import socket
    import sys

    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(KV_SCHEMA.empty_table(), uri, schema=KV_SCHEMA)
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        port = server.getsockname()[1]
        # a "NATS server" that accepts and never sends its INFO: the worker waits
        command = [sys.executable, "-m", "lance_async", "worker"]
        command += [f"nats://127.0.0.1:{port}/S/s", uri, "--group", "g", "--member", "m"]
        async with await anyio.open_process(command) as proc:
            conn, _ = await anyio.to_thread.run_sync(server.accept)
            with conn:
                proc.send_signal(signal.SIGTERM)
                with anyio.fail_after(60):
                    code = await proc.wait()
            assert proc.stderr is not None
            err = (await proc.stderr.receive()).decode()
    assert code == 0, err
    assert "stopped during start-up" in err


def test_partition_outcome_reads_exception_groups() -> None:
    """ingest() raises a group when its sender and acker both see a fence."""
    from lance_async.cluster.worker import partition_outcome
    from lance_async.errors import FencedError

    fenced = FencedError("fenced", shard_id="s")
    assert partition_outcome(fenced) == "fenced"
    assert partition_outcome(ExceptionGroup("x", [fenced, FencedError("again")])) == "fenced"
    nested = ExceptionGroup("x", [ExceptionGroup("y", [fenced]), fenced])
    assert partition_outcome(nested) == "fenced"
    assert partition_outcome(ExceptionGroup("x", [fenced, OSError("io")])) == "failed"
    assert partition_outcome(OSError("io")) == "failed"
    assert partition_outcome(BaseExceptionGroup("x", [fenced, KeyboardInterrupt()])) is None
    assert partition_outcome(KeyboardInterrupt()) is None


def python_says(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (which must exit 0)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_worker_starts_without_pandas_yet_can_import_it_after() -> None:
    """A command's start-up (``LeanStart``, used by every command through
    ``import_engine`` and by a worker until it has started) loads the engine
    without pandas -- pyarrow.dataset imports it, no command has a use for
    it, and it is a third of the engine's import -- and gives imports back
    as usual afterwards. In a fresh interpreter: pandas is loaded here already."""
    code = (
        "import sys\n"
        "sys.argv = ['lance-async']  # the command: lance_async loads nothing ahead\n"
        "from lance_async.cli.start import LeanStart, import_engine\n"
        "lean = LeanStart()\n"
        "lean.begin()\n"
        "import lance, pyarrow as pa\n"
        "assert 'pandas' not in sys.modules, 'pandas imported at start'\n"
        "assert pa.scalar(1).as_py() == 1\n"
        "lean.end()\n"
        "import gc; assert gc.isenabled()\n"
        "import_engine()  # imported already: nothing to do\n"
        "import pandas\n"
        "df = pandas.DataFrame({'a': [1, 2]})\n"
        "print(pa.table(df).num_rows, pa.table({'a': [1]}).to_pandas().a.sum())\n"
    )
    assert python_says(code) == "2 1"


def test_a_command_imports_the_engine_without_pandas(tmp_path: Path) -> None:
    """``lance-async info`` (any command) imports the engine through
    ``import_engine``: no pandas in the process, and the answer is right."""
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"id": [1, 2, 3]}), uri)
    code = (
        "import sys\n"
        f"sys.argv = ['lance-async', 'info', {uri!r}]\n"
        "from lance_async.cli import run\n"
        "code = run()\n"
        "print('pandas' in sys.modules, code)\n"
    )
    said = python_says(code)
    assert said.splitlines()[-1] == "False 0", said
    assert "rows: 3" in said, said


@pytest.mark.asyncio
async def test_a_fenced_partition_is_released_and_the_worker_goes_on(
    tmp_path: Path, client: Any
) -> None:
    """Another writer claims the shard of partition 0 while rows flow: that
    partition is fenced (one FencedError or a group of them), given up and
    taken again; partition 1 never stops, and run() does not fail."""
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    partitioner = await Partitioner.for_dataset(ds)
    publishing = True

    async def publish() -> None:
        i = 0
        while publishing:
            row = {"id": i % 500, "value": i, "name": "x"}
            await publisher.publish(
                partitioner.partition_of_rows([row])[0], json.dumps(row).encode()
            )
            i += 1
            await anyio.sleep(0.002)

    async with solo_worker(ds, client, 2.0) as (worker, key):
        publisher = RedisPublisher(client, key, 2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            tg.start_soon(publish)
            await eventually(lambda: worker.stats().partitions == [0, 1], 30, "both partitions")
            await eventually(lambda: worker.stats().messages > 100, 30, "rows flowing")
            # a newer writer of partition 0's shard fences the worker's
            async with ds.mem_wal_writer(partitioner.shard_of(0)):
                await eventually(lambda: worker.stats().lost >= 1, 30, "partition 0 fenced")
            before = worker.stats().messages
            await eventually(
                lambda: (
                    worker.stats().partitions == [0, 1] and worker.stats().messages > before + 100
                ),
                30,
                "partition 0 taken again, rows flowing",
            )
            publishing = False
            worker.stop()
        stats = worker.stats()
        assert stats.partitions == [] and stats.lost >= 1 and stats.assigned >= 3


@pytest.mark.asyncio
async def test_a_shard_held_by_another_writer_is_no_failure_of_the_worker(
    tmp_path: Path, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening partition 0's shard writer is fenced six times (another
    process still holds the shard while the partition moves): the worker
    leaves it and takes it again later, and never gives up, although nothing
    is acknowledged meanwhile and max_failures is 2."""
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    partitioner = await Partitioner.for_dataset(ds)
    held = partitioner.shard_of(0)
    fences = 0
    real_open = la.AsyncShardWriter.open

    async def open_unless_held(self: la.AsyncShardWriter, *args: Any, **kwargs: Any) -> Any:
        nonlocal fences
        if self.shard_id == held and fences < 6:
            fences += 1
            raise la.FencedError("another writer claimed the shard", shard_id=held)
        return await real_open(self, *args, **kwargs)

    monkeypatch.setattr(la.AsyncShardWriter, "open", open_unless_held)
    async with solo_worker(ds, client, 1.0, max_failures=2) as (worker, _):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await eventually(lambda: worker.stats().partitions == [0, 1], 60, "partition 0 taken")
            assert fences == 6
            worker.stop()
        assert worker.stats().partitions == []


@pytest.mark.asyncio
async def test_a_worker_gives_up_only_when_no_partition_can_work(
    tmp_path: Path, client: Any
) -> None:
    """Both partitions' streams are not streams (a Redis string): starting
    either fails every time. After max_failures failures in a row, with no
    message acknowledged in between, run() raises the last one."""
    import redis.exceptions

    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "t.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(num_buckets=2, bucket_column="id")
    async with solo_worker(ds, client, 1.0, max_failures=4) as (worker, key):
        for p in range(2):
            await client.set(f"{key}:{p}", b"not a stream")
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            with anyio.fail_after(60):  # only stops a hung test
                await worker.run()
        assert await client.mget([f"{key}:leases:lease:0", f"{key}:leases:lease:1"]) == [
            None,
            None,
        ]  # nothing left held
