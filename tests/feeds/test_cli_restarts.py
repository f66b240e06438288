"""``lance-async ingest`` restarted after a crash resumes at once (issue 17, item 9).

A killed run leaves the broker holding what it fetched and never
acknowledged. These tests leave that state behind with a raw client (fetch,
no ack, disconnect: what the server sees of a ``kill -9``), then run the real
command against the real broker and check the table: every message is in it,
and an idle stop that could not reach some messages says so with exit status 3.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import lance
import nats
import pytest
import redis

from ..conftest import broker_or_skip
from ..helpers import kv_table, lsm_ids
from .support import row_json

pytestmark = pytest.mark.broker

ROWS = 60
HELD = 25  # messages the "killed" run fetched and never acknowledged


def table_with_wal(tmp_path: Path) -> str:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table([]), uri).initialize_mem_wal()
    return uri


def ingest(source: str, uri: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lance_async", "ingest", source, uri, "--idle-timeout", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def redis_stream() -> Iterator[tuple[redis.Redis, str]]:
    """A fresh Redis stream key holding ROWS rows (deleted afterwards)."""
    broker_or_skip("Redis", 6379)
    client = redis.Redis(port=6379)
    key = f"la-{uuid.uuid4().hex}"
    for i in range(ROWS):
        client.xadd(key, {"data": row_json(i)})
    try:
        yield client, key
    finally:
        client.delete(key)
        client.close()


def lsm_value(uri: str, key: int) -> int:
    import anyio

    import lance_async as la

    async def read() -> int:
        ds = await la.open_dataset(uri)
        table = await ds.lsm.scan(columns=["id", "value"], filter=f"id = {key}").to_table()
        return int(table.column("value")[0].as_py())

    return anyio.run(read)


def test_nats_restart_redelivers_what_the_killed_run_held_at_once(tmp_path: Path) -> None:
    broker_or_skip("NATS JetStream", 4222)
    stream = f"LA_{uuid.uuid4().hex}"
    uri = table_with_wal(tmp_path)

    async def killed_run() -> None:
        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream}.rows"])
        for i in range(ROWS):
            await js.publish(f"{stream}.rows", row_json(i))
        # the durable the command uses, created as the last run left it: 30 s
        # ack wait, and HELD messages fetched and never acknowledged
        sub = await js.pull_subscribe(
            f"{stream}.rows",
            durable=f"lance-async-{stream}",
            stream=stream,
            config=nats.js.api.ConsumerConfig(ack_wait=30, max_ack_pending=HELD),
        )
        held = await sub.fetch(HELD, timeout=5)
        assert len(held) == HELD
        await nc.close()

    async def drop() -> None:
        nc = await nats.connect("nats://127.0.0.1:4222")
        await nc.jetstream().delete_stream(stream)
        await nc.close()

    asyncio.run(killed_run())
    try:
        run = ingest(f"nats://127.0.0.1:4222/{stream}/{stream}.rows", uri)
        assert run.returncode == 0, run.stderr
        assert lsm_ids(uri) == list(range(ROWS))
        # and restarts with nothing new find nothing to do, however many: a
        # durable that acknowledged nothing since its last take-over still
        # starts where the last one left off (it reports an ack floor of 0)
        for _ in range(3):
            again = ingest(f"nats://127.0.0.1:4222/{stream}/{stream}.rows", uri)
            assert again.returncode == 0, again.stderr
            assert "ingested 0 rows" in again.stdout, again.stdout
        # a newer value written another way is not overwritten by a replay
        newer = tmp_path / "newer.ndjson"
        newer.write_bytes(row_json(5, 999) + b"\n")
        assert ingest(str(newer), uri).returncode == 0
        after = ingest(f"nats://127.0.0.1:4222/{stream}/{stream}.rows", uri)
        assert "ingested 0 rows" in after.stdout, after.stdout
        assert lsm_value(uri, 5) == 999
    finally:
        asyncio.run(drop())


def test_redis_restart_rereads_its_own_pending_entries_first(
    tmp_path: Path, redis_stream: tuple[redis.Redis, str]
) -> None:
    client, key = redis_stream
    uri = table_with_wal(tmp_path)
    client.xgroup_create(key, "lance-async", id="0")
    # the killed run: the same host's consumer read HELD entries, acked none
    held = client.xreadgroup(
        "lance-async", f"lance-async-{socket.gethostname()}", {key: ">"}, count=HELD
    )
    assert isinstance(held, list)  # RESP2's reply: [[stream, entries]]
    assert len(held[0][1]) == HELD
    run = ingest(f"redis://127.0.0.1:6379/{key}", uri)
    assert run.returncode == 0, run.stderr
    assert lsm_ids(uri) == list(range(ROWS))
    assert client.xpending(key, "lance-async")["pending"] == 0


def test_an_idle_stop_with_entries_out_of_reach_exits_3(
    tmp_path: Path, redis_stream: tuple[redis.Redis, str]
) -> None:
    client, key = redis_stream
    uri = table_with_wal(tmp_path)
    client.xgroup_create(key, "lance-async", id="0")
    # another consumer holds HELD entries, not idle long enough to claim
    client.xreadgroup("lance-async", "elsewhere", {key: ">"}, count=HELD)
    run = ingest(f"redis://127.0.0.1:6379/{key}?min_idle=600", uri)
    assert run.returncode == 3, (run.stdout, run.stderr)
    assert f"stopped with {HELD} messages outstanding" in run.stderr
    assert lsm_ids(uri) == list(range(HELD, ROWS))
    assert client.xpending(key, "lance-async")["pending"] == HELD


def test_bad_feed_options_exit_2(tmp_path: Path) -> None:
    uri = table_with_wal(tmp_path)
    for source in (
        "redis://127.0.0.1:6379/k?min_idle=soon",
        "redis://127.0.0.1:6379/k?min_idle=-1",
        "nats://127.0.0.1:4222/S/s?ack_wait=0",
        "nats://127.0.0.1:4222/S/s?max_ack_pending=many",
    ):
        run = ingest(source, uri)
        assert run.returncode == 2, (source, run.stderr)


def _all_acked(client: redis.Redis, key: str, entries: int) -> bool:
    groups = client.xinfo_groups(key)
    return (
        bool(groups)
        and int(groups[0]["entries-read"] or 0) >= entries
        and (int(groups[0]["pending"]) == 0)
    )


def test_a_redis_ingest_paused_past_the_socket_timeout_carries_on(
    tmp_path: Path, redis_stream: tuple[redis.Redis, str]
) -> None:
    """SIGSTOP longer than redis-py's socket timeout (5 s): the blocked read
    times out when the process resumes; the feed reads again instead of
    failing the run."""
    client, key = redis_stream
    uri = table_with_wal(tmp_path)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "lance_async", "ingest"),
            *(f"redis://127.0.0.1:6379/{key}", uri, "--idle-timeout", "4"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _all_acked(client, key, ROWS):
            assert time.monotonic() < deadline, "the first entries were not acknowledged"
            time.sleep(0.1)
        time.sleep(0.5)  # blocked in XREADGROUP, waiting for more
        proc.send_signal(signal.SIGSTOP)
        time.sleep(7)
        for i in range(ROWS, 2 * ROWS):
            client.xadd(key, {"data": row_json(i)})
        proc.send_signal(signal.SIGCONT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert lsm_ids(uri) == list(range(2 * ROWS))


def test_a_missing_nats_stream_says_how_to_create_it(tmp_path: Path) -> None:
    broker_or_skip("NATS JetStream", 4222)
    uri = table_with_wal(tmp_path)
    stream = f"LA_missing_{uuid.uuid4().hex[:8]}"
    run = ingest(f"nats://127.0.0.1:4222/{stream}/{stream}.rows", uri)
    assert run.returncode == 1, run.stderr
    assert f"nats stream add {stream}" in run.stderr
