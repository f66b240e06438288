"""An object store that fails: typed errors, deadlines, nothing acknowledged lost.

Every test puts the fault proxy of ``tests/s3faults.py`` between the engine and
the moto server, then makes the store refuse (403), fail (500, 503), slow
down, swallow requests (black hole) or forget everything (a restarted, empty
moto). pylance 14's ``ShardWriter.put`` retries for ever when every request is
refused or the bucket is gone; the writer's ``storage_timeout`` must end that
with a typed error, and ``aclose()`` must return.

No test bounds a duration: the ``fail_after`` around each is a hang guard
only, far above the deadlines it guards (on a loaded machine too).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

import lance_async as la
from lance_async._threads import abandoned_calls

from .helpers import eventually, kv_table
from .s3faults import Mode, S3FaultProxy
from .services import S3Bucket, _moto_ready, _start_service

pytestmark = pytest.mark.anyio

#: The writers' deadline in these tests: short, so a test that meets it is quick.
STORAGE_TIMEOUT = 2.0
#: A hang guard for one test's waits: far above every deadline it guards.
HANG_GUARD = 120.0
#: The deadline of the healing tests: a reopen claims the shard, replays and
#: flushes the WAL, four shards side by side (over 4 s in a suite run beside
#: other work on 2 cores; the deadline is what a loaded machine needs, not a bound).
HEAL_TIMEOUT = 10.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # trio runs the refusal test below too (its limiter differs)


@dataclass
class FaultyStore:
    """A bucket reached through the fault proxy."""

    proxy: S3FaultProxy
    bucket: S3Bucket
    storage_options: dict[str, str]

    def uri(self, name: str) -> str:
        return self.bucket.uri(f"{name}-{uuid.uuid4().hex[:8]}.lance")

    @property
    def quick_options(self) -> dict[str, str]:
        """The options with object_store's own retries off: a 5xx surfaces
        after the engine's retries alone (seconds sooner; same error)."""
        return dict(self.storage_options, client_max_retries="0")


def flags(options: dict[str, str]) -> list[str]:
    """``options`` as the command line's ``--storage-option`` flags."""
    return [f"--storage-option={k}={v}" for k, v in options.items()]


@pytest.fixture
def store(s3_bucket: S3Bucket) -> Iterator[FaultyStore]:
    with S3FaultProxy(s3_bucket.endpoint) as proxy:
        options = dict(s3_bucket.storage_options, aws_endpoint=proxy.url)
        yield FaultyStore(proxy, s3_bucket, options)
        # Let the calls abandoned by the test finish (the store answers again),
        # so no engine thread keeps retrying for the rest of the session.
        proxy.forward_to(s3_bucket.endpoint)
        proxy.set(Mode.forward())
        guard = time.monotonic() + HANG_GUARD
        while abandoned_calls() and time.monotonic() < guard:
            time.sleep(0.05)


async def _table(store: FaultyStore, name: str) -> la.AsyncDataset:
    ds = await la.write_dataset(
        kv_table(range(10)), store.uri(name), storage_options=store.storage_options
    )
    await ds.initialize_mem_wal(manual_shards=True)
    return ds


async def _lsm_ids(ds: la.AsyncDataset) -> set[int]:
    table = await ds.lsm.scan(columns=["id"]).to_table()
    return set(table.column("id").to_pylist())


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_s3_refusing_every_request_fails_the_pending_ack_and_close_returns(
    store: FaultyStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: 403 for ever. The engine's put never returns; the
    ack fails with a typed error, close() returns, acked rows stay safe."""
    ds = await _table(store, "refused")
    shard = str(uuid.uuid4())
    writer = ds.mem_wal_writer(shard, storage_timeout=STORAGE_TIMEOUT)
    with anyio.fail_after(HANG_GUARD), caplog.at_level(logging.WARNING, "lance_async"):
        async with writer:
            await writer.put(kv_table(range(100, 110)))  # acknowledged: durable
            store.proxy.set(Mode.error(403, "AccessDenied"))
            ack = await writer.send(kv_table(range(200, 210)))
            flushed: list[BaseException] = []

            async def flush() -> None:  # queued behind the stuck put: fails with it
                with pytest.raises(la.StorageError) as failed:
                    await writer.flush()
                flushed.append(failed.value)

            async with anyio.create_task_group() as tg:
                tg.start_soon(flush)
                with pytest.raises(la.StorageError) as info:
                    await ack
            # the flush waited behind the stuck put and fails with the writer;
            # the put's own rows may still land (its call was abandoned, not stopped)
            assert flushed == [writer.failure] and writer.failure is not None
            assert not writer.failure.may_have_landed
            assert info.value.may_have_landed and type(info.value) is type(writer.failure)
            assert store.proxy.count("error") > 0  # the engine met the refusal
            # the deadline gave up the put; a quick read of the store says why
            assert isinstance(info.value, la.StoragePermissionError), info.value
            assert "did not return within 2 s" in str(info.value)
            state = writer.state  # not writer.state narrowed: mypy would keep it past close
            assert state is la.WriterState.FAILED
            assert writer.stats().abandoned_calls == 1
            with pytest.raises(la.StoragePermissionError):  # later sends: the same error
                await writer.send(kv_table([300]))
        # close() returned (the hang guard did not fire), without touching the stuck engine
    assert writer.state is la.WriterState.CLOSED
    assert any("did not return within" in r.getMessage() for r in caplog.records)

    store.proxy.set(Mode.forward())
    reopened = await la.open_dataset(ds.uri, storage_options=store.storage_options)
    async with reopened.mem_wal_writer(shard):  # the next writer of the shard replays its WAL
        pass
    assert set(range(100, 110)) <= await _lsm_ids(reopened)  # acknowledged before: safe


async def test_cancelling_a_writer_stuck_on_a_refusing_store_returns(store: FaultyStore) -> None:
    """A task cancelled inside ``async with writer`` while the engine is stuck:
    the block's exit closes the writer within the deadline and the pending
    ack fails typed (the stuck thread is left behind)."""
    ds = await _table(store, "cancelled")
    with anyio.fail_after(HANG_GUARD):
        with anyio.CancelScope() as scope:
            async with ds.mem_wal_writer(str(uuid.uuid4()), storage_timeout=STORAGE_TIMEOUT) as w:
                await w.put(kv_table(range(100, 110)))
                store.proxy.set(Mode.error(403, "AccessDenied"))
                ack = await w.send(kv_table(range(200, 210)))
                await eventually(lambda: store.proxy.count("error") > 0, HANG_GUARD, "a refusal")
                scope.cancel()
                await anyio.sleep_forever()
        assert scope.cancelled_caught
        with pytest.raises(la.StorageError):
            await ack
    assert w.state is la.WriterState.CLOSED and w.stats().abandoned_calls == 1


async def test_a_close_the_store_does_not_answer_raises_storage_timeout(
    store: FaultyStore,
) -> None:
    """A non-durable writer's close writes its WAL; a store that swallows the
    request makes close() raise StorageTimeoutError at the deadline."""
    ds = await _table(store, "close")
    writer = ds.mem_wal_writer(
        str(uuid.uuid4()), durable_write=False, storage_timeout=STORAGE_TIMEOUT
    )
    with anyio.fail_after(HANG_GUARD):
        await writer.__aenter__()
        await writer.put(kv_table(range(100, 110)))  # accepted; durable only after close
        store.proxy.set(Mode.black_hole())
        with pytest.raises(la.StorageTimeoutError, match="closing"):
            await writer.aclose()
    assert writer.state is la.WriterState.CLOSED
    assert writer.stats().abandoned_calls == 1


async def test_a_bucket_that_vanished_fails_the_ack_as_not_found(
    store: FaultyStore, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """moto restarted empty: every request answers NoSuchBucket, which the
    engine's put also retries for ever."""
    ds = await _table(store, "vanished")
    empty = _start_service(
        "moto-empty",
        lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        _moto_ready,
        tmp_path_factory.mktemp("moto-empty"),
    )
    try:
        with anyio.fail_after(HANG_GUARD):
            async with ds.mem_wal_writer(str(uuid.uuid4()), storage_timeout=STORAGE_TIMEOUT) as w:
                await w.put(kv_table(range(100, 105)))
                store.proxy.forward_to(f"http://127.0.0.1:{empty.port}")
                with pytest.raises(la.StorageNotFoundError) as info:
                    await w.put(kv_table(range(200, 205)))
                assert info.value.what == "bucket" and info.value.code == "NoSuchBucket"
            with pytest.raises(la.StorageNotFoundError) as opened:
                await la.open_dataset(ds.uri, storage_options=store.storage_options)
            assert opened.value.what == "bucket"  # the bucket, not "no table there"
            assert not isinstance(opened.value, la.DatasetNotFoundError)
    finally:
        store.proxy.forward_to(store.bucket.endpoint)
        empty.proc.terminate()
        try:
            empty.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            empty.proc.kill()
            empty.proc.wait(timeout=10)


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(Mode.error(503, "SlowDown"), id="503"),
        pytest.param(Mode.error(500, "InternalError"), id="500"),
        pytest.param(Mode.slow(0.5), id="slow"),
        pytest.param(Mode.black_hole(), id="black-hole"),
    ],
)
async def test_a_store_that_fails_for_a_while_loses_nothing(
    store: FaultyStore, fault: Mode
) -> None:
    """Faults shorter than the deadline delay the acks; every row is written once."""
    ds = await _table(store, "flaky")
    acks: list[la.Ack] = []
    with anyio.fail_after(HANG_GUARD):
        async with ds.mem_wal_writer(str(uuid.uuid4()), storage_timeout=60.0) as writer:
            await writer.put(kv_table(range(100, 110)))
            store.proxy.set(fault)
            for i in range(5):
                acks.append(await writer.send(kv_table(range(1000 + 10 * i, 1010 + 10 * i))))
            kind = fault.kind  # the writer met the fault: then the store comes back
            await eventually(lambda: store.proxy.count(kind) >= 1, HANG_GUARD, "the fault")
            store.proxy.set(Mode.forward())
            for ack in acks:
                summary = await ack
                assert summary.rows == 10
            assert writer.stats().abandoned_calls == 0
    ids = await _lsm_ids(ds)
    assert set(range(100, 110)) | set(range(1000, 1050)) <= ids


async def test_open_dataset_tells_a_refusing_store_from_a_missing_table(
    store: FaultyStore,
) -> None:
    ds = await _table(store, "open")
    options = store.quick_options
    with anyio.fail_after(HANG_GUARD):
        with pytest.raises(la.DatasetNotFoundError):  # the store answered: nothing there
            await la.open_dataset(store.uri("missing"), storage_options=options)
        store.proxy.set(Mode.error(403, "AccessDenied"))
        with pytest.raises(la.StoragePermissionError) as refused:
            await la.open_dataset(ds.uri, storage_options=options)
        assert refused.value.status == 403 and not refused.value.retryable
        store.proxy.set(Mode.error(503, "SlowDown"))
        with pytest.raises(la.StorageUnavailableError) as unavailable:
            await la.open_dataset(ds.uri, storage_options=options)
        assert unavailable.value.retryable and unavailable.value.status == 503
        store.proxy.set(Mode.black_hole())
        with pytest.raises(la.StorageTimeoutError):
            await la.open_dataset(ds.uri, storage_options=options, storage_timeout=1.0)
        store.proxy.set(Mode.forward())
        assert (await la.open_dataset(ds.uri, storage_options=options)).version == ds.version


async def test_merges_and_compaction_raise_typed_storage_errors(store: FaultyStore) -> None:
    written = await _table(store, "typed")
    async with written.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=10) as writer:
        for i in range(3):
            await writer.put(kv_table(range(100 + 10 * i, 110 + 10 * i)))
    ds = await la.open_dataset(written.uri, storage_options=store.quick_options)
    impatient = await la.open_dataset(
        ds.uri, storage_options=store.quick_options, storage_timeout=STORAGE_TIMEOUT
    )
    with anyio.fail_after(HANG_GUARD):
        store.proxy.set(Mode.error(503, "SlowDown"))
        with pytest.raises(la.StorageUnavailableError):
            await ds.merge_insert("id").when_matched_update_all().execute(kv_table([1], 5))
        with pytest.raises(la.StorageUnavailableError):
            await ds.compact_mem_wal()
        # a store that swallows requests: each engine call of a compaction has
        # the dataset's deadline
        store.proxy.set(Mode.black_hole())
        with pytest.raises(la.StorageTimeoutError):
            await impatient.compact_mem_wal()
        # and so does a pass of a Compactor called directly (no background task)
        compactor = la.Compactor(impatient, la.CompactionPolicy(max_generations=0))
        with pytest.raises(la.StorageTimeoutError):
            await compactor.run_once()
        assert compactor.stats().failures == 1
        store.proxy.set(Mode.forward())
    assert set(range(100, 130)) <= await _lsm_ids(ds)  # nothing lost on the way


@pytest.mark.parametrize("durable", [True, False])
async def test_a_fenced_writers_close_raises_fenced_error_durable_or_not(
    tmp_path: Path, durable: bool
) -> None:
    """The engine's fence text at close differs with durable writes
    ("LanceError(IO): Writer fenced ..."); the error type does not."""
    ds = await la.write_dataset(kv_table(range(3)), str(tmp_path / "t.lance"))
    await ds.initialize_mem_wal(manual_shards=True)
    shard = str(uuid.uuid4())
    async with anyio.create_task_group() as tg:
        first = await ds.mem_wal_writer(shard, durable_write=durable).open(tg)
        await first.put(kv_table([10]))
        second = await ds.mem_wal_writer(shard, durable_write=durable).open(tg)
        await second.put(kv_table([20]))
        with pytest.raises(la.errors.FencedError) as info:
            await first.aclose()
        assert info.value.shard_id == shard
        assert first.state is la.WriterState.CLOSED
        await second.aclose()


def test_the_command_exits_with_the_storage_errors_code(store: FaultyStore) -> None:
    """A real command on a refusing store exits with the code docs/cli.md lists."""
    from typer.testing import CliRunner

    from lance_async.cli import app

    uri = store.uri("cli")
    anyio.run(
        lambda: la.write_dataset(kv_table(range(3)), uri, storage_options=store.storage_options)
    )
    options = flags(store.quick_options)
    runner = CliRunner()
    assert runner.invoke(app, ["scan", uri, *options]).exit_code == 0
    store.proxy.set(Mode.error(403, "AccessDenied"))
    result = runner.invoke(app, ["scan", uri, *options])
    assert result.exit_code == 77, result.output
    assert "Traceback" not in result.output and "LanceError(IO)" not in result.output
    assert len(result.output.strip().splitlines()) == 1  # one line, as every error


def test_storage_timeout_given_to_the_command_bounds_a_silent_store(
    store: FaultyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lance-async --storage-timeout S`` (or ``LANCE_ASYNC_STORAGE_TIMEOUT``):
    a store that never answers fails the command with exit 75 once S seconds
    passed, not the default minute; the datasets it opens carry S."""
    from typer.testing import CliRunner

    from lance_async._threads import STORAGE_TIMEOUT_ENV
    from lance_async.cli import app

    uri = store.uri("cli-timeout")
    anyio.run(
        lambda: la.write_dataset(kv_table(range(3)), uri, storage_options=store.storage_options)
    )
    monkeypatch.setenv(STORAGE_TIMEOUT_ENV, "4.5")  # restored after the test
    opened = anyio.run(lambda: la.open_dataset(uri, storage_options=store.storage_options))
    assert opened.storage_timeout == 4.5  # the environment's default
    options = flags(store.quick_options)
    store.proxy.set(Mode.black_hole())
    before = store.proxy.count("black_hole")
    result = CliRunner().invoke(app, ["--storage-timeout", "1.5", "info", uri, *options])
    assert result.exit_code == 75, result.output
    assert "within 1.5 s" in result.output and "Traceback" not in result.output
    assert store.proxy.count("black_hole") > before  # it did reach the silent store
    store.proxy.set(Mode.forward())
    again = anyio.run(lambda: la.open_dataset(uri, storage_options=store.storage_options))
    assert again.storage_timeout == 1.5  # the command's, for the process


def test_a_command_that_abandoned_a_call_exits_with_its_code_not_an_abort(
    store: FaultyStore,
) -> None:
    """The thread a command gave up on must not meet the interpreter's
    finalization (pylance aborted the process there: exit 134 in 2 of 6
    runs before the command ended with ``os._exit``). The store swallows
    every request, so each run's open is still inside the engine when the
    command gives up on it and exits (a local table at a 1 us deadline was
    a race: 1 run in 6 beside other work opened it in time and exited 0)."""
    uri = store.uri("abandoned")
    anyio.run(
        lambda: la.write_dataset(kv_table(range(3)), uri, storage_options=store.storage_options)
    )
    options = flags(store.quick_options)
    command = [sys.executable, "-m", "lance_async", "--storage-timeout", "0.5", "info", uri]
    store.proxy.set(Mode.black_hole())
    before = store.proxy.count("black_hole")
    runs = [
        subprocess.run([*command, *options], capture_output=True, timeout=HANG_GUARD, check=False)
        for _ in range(6)
    ]
    assert [run.returncode for run in runs] == [75] * 6, [run.stderr[-400:] for run in runs]
    assert store.proxy.count("black_hole") >= before + 6  # every run reached the silent store


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (la.StoragePermissionError("refused"), 77),
        (la.StorageNotFoundError("no bucket"), 66),
        (la.StorageUnavailableError("503"), 75),
        (la.StorageTimeoutError("silent"), 75),
        (la.StorageFullError("full"), 74),
        (la.StorageError("other"), 74),
        (la.errors.FencedError("fenced"), 1),
        # an engine error no layer typed is typed by the command itself
        (OSError("Generic S3 error: ... Server returned non-2xx status code: 403 Forbidden"), 77),
    ],
)
def test_every_storage_error_has_its_exit_code(error: BaseException, code: int) -> None:
    from lance_async.cli.common import exit_code

    assert exit_code(error) == code


# -- writers that heal (issue 38) ------------------------------------------------------


def _lsm_ids_elsewhere(store: FaultyStore, uri: str) -> list[int]:
    """Every id an LSM scan sees, read by another process (the command)."""
    import json

    options = flags(store.storage_options)
    command = [sys.executable, "-m", "lance_async", "scan", uri, "--lsm", "--columns", "id"]
    done = subprocess.run(
        [*command, "--format", "ndjson", *options],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["id"] for line in done.stdout.splitlines()]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_regression_the_routing_writers_next_send_after_a_403_outage_acks(
    store: FaultyStore,
) -> None:
    """The issue's case: S3 answering 403 for a few seconds failed that send
    (right), and every later send of the same writer failed although the
    store answered again. The router (the default writer) reopens the shard
    on the next send: the send acks, no reopen by hand, and no acked row is
    lost or doubled (read by another process). A send whose engine call was
    abandoned says its rows may still be written. (The deadline leaves a
    reopen -- a claim, the WAL replayed and flushed, four shards side by
    side -- room on a loaded machine.)"""
    ds = await la.write_dataset(
        kv_table(range(10)), store.uri("heal"), storage_options=store.storage_options
    )
    await ds.initialize_mem_wal()  # bucket-sharded on the key: the routing writer
    acked: set[int] = set(range(10))
    failed: set[int] = set()
    with anyio.fail_after(HANG_GUARD):
        async with ds.mem_wal_writer(storage_timeout=HEAL_TIMEOUT) as router:
            await router.put(kv_table(range(100, 140)))
            acked |= set(range(100, 140))
            store.proxy.set(Mode.error(403, "AccessDenied"))
            with pytest.raises(la.StoragePermissionError) as stuck:
                await router.put(kv_table(range(200, 240)))
            failed |= set(range(200, 240))
            assert stuck.value.may_have_landed  # its put was abandoned, not stopped
            assert "may still be written" in str(stuck.value)
            # during the outage: refused at once by the probe, nothing left running
            with pytest.raises(la.StoragePermissionError) as refused:
                await router.put(kv_table(range(300, 340)))
            failed |= set(range(300, 340))
            assert not refused.value.may_have_landed and "not reopened yet" in str(refused.value)
            store.proxy.set(Mode.forward())
            # the store is back: the next send acks, through writers opened again
            summary = await router.put(kv_table(range(400, 440)))
            acked |= set(range(400, 440))
            assert summary.rows == 40
            assert router.stats().reopens >= 1
            assert all(w.state is la.WriterState.OPEN for w in router.writers.values())
            assert (await router.put(kv_table(range(500, 540)))).rows == 40
            acked |= set(range(500, 540))
    ids = await anyio.to_thread.run_sync(_lsm_ids_elsewhere, store, ds.uri)
    assert len(ids) == len(set(ids))  # no key twice
    assert acked <= set(ids)  # nothing acknowledged lost
    assert set(ids) <= acked | failed  # nothing else: failed rows landed or not
    assert not set(ids) & set(range(300, 340))  # refused before any engine call


async def test_a_store_that_does_not_answer_fails_the_ack_within_its_deadline_and_heals(
    store: FaultyStore,
) -> None:
    """A black hole: the put is abandoned at ``storage_timeout``, the probe
    that says why gets a quarter of it (it had the whole of it: acks failed
    after twice the deadline); the router heals once the store answers."""
    ds = await la.write_dataset(
        kv_table(range(10)), store.uri("hole"), storage_options=store.storage_options
    )
    await ds.initialize_mem_wal()
    with anyio.fail_after(HANG_GUARD):
        async with ds.mem_wal_writer(storage_timeout=HEAL_TIMEOUT) as router:
            await router.put(kv_table(range(100, 140)))
            store.proxy.set(Mode.black_hole())
            with pytest.raises(la.StorageTimeoutError) as stuck:
                await router.put(kv_table(range(200, 240)))
            assert stuck.value.may_have_landed
            probes = [c for c in abandoned_calls() if c.what.startswith("a probe")]
            assert probes and all(c.timeout == HEAL_TIMEOUT / 4 for c in probes)
            store.proxy.set(Mode.forward())
            assert (await router.put(kv_table(range(400, 440)))).rows == 40
    ids = await _lsm_ids(ds)
    assert set(range(100, 140)) | set(range(400, 440)) <= ids


async def test_an_open_abandoned_only_because_the_store_was_slow_is_not_wasted(
    store: FaultyStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that answers, slowly: the open of a shard outlives its
    deadline (the send fails, within it) but returns; the router keeps what
    it opened, and the next send takes it instead of opening the shard again
    -- which, the store as slow, would outlive its deadline again, and so on
    for ever (an open is a dozen requests, a put one)."""
    from lance_async.memwal.abandoned import late_opens

    ds = await la.write_dataset(
        kv_table(range(10)), store.uri("slow-open"), storage_options=store.storage_options
    )
    await ds.initialize_mem_wal(unsharded=True)  # one shard
    with anyio.fail_after(HANG_GUARD), caplog.at_level(logging.INFO, "lance_async"):
        # 2 s: the close at the end, at full speed again, on a loaded machine
        # once took more than 1 s; the slow store is as slow for that deadline
        async with ds.mem_wal_writer(storage_timeout=2.0) as router:
            store.proxy.set(Mode.slow(0.6))
            with pytest.raises(la.StorageTimeoutError, match="opening"):
                await router.put(kv_table(range(100, 110)))
            shard = (await ds.sharding()).shard_ids()[0]
            await eventually(lambda: late_opens(ds.uri, shard) == 0, HANG_GUARD, "the late open")
            assert any("kept for its next use" in r.getMessage() for r in caplog.records)
            # still slow: another open would outlive its deadline again, for ever;
            # the one that returned is taken, and the put is quick enough
            assert (await router.put(kv_table(range(200, 210)))).rows == 10
            store.proxy.set(Mode.forward())
            abandoned_opens = [
                r
                for r in caplog.records
                if r.getMessage().startswith("lance_async: opening") and "did not" in r.getMessage()
            ]
            assert len(abandoned_opens) == 1  # the first; the second send opened nothing
    assert set(range(200, 210)) <= await _lsm_ids(ds)
