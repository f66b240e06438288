"""Two ``lance-async ingest`` replicas on one feed and group: one runs, one refuses (issue 29).

Both start at the same moment, as two replicas of a deployment would, on
one Redis stream (one consumer group) or one NATS subject (one durable) of
20,000 messages. One ingests everything and exits 0; the other stops with
exit status 2 and one line naming ``lance-async worker``, without having
fenced its twin (which would then fail) or written anything. A worker of a
group on the same table is refused the same way while the ingest runs, and
an ingest that was killed leaves a claim that the next one takes once it
expires.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio

import lance_async as la
from lance_async.cluster.claim import table_identity

from ..conftest import broker_or_skip
from ..helpers import KV_SCHEMA, eventually

# several processes one after another: minutes on a loaded machine (hang-stop only)
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(300)]

KEYS = 5_000
VERSIONS = 4  # 20,000 messages: every key four times, the last one newest


@dataclass
class Feed:
    kind: str
    url: str
    client: Any
    name: str

    async def publish_all(self) -> None:
        payloads = [
            json.dumps({"id": k, "value": v, "name": f"v{v}"}).encode()
            for v in range(VERSIONS)
            for k in range(KEYS)
        ]
        if self.kind == "redis":
            for start in range(0, len(payloads), 1000):
                async with self.client.pipeline(transaction=False) as pipe:
                    for p in payloads[start : start + 1000]:
                        pipe.xadd(self.name, {"data": p})
                    await pipe.execute()
            return
        js = self.client.jetstream()
        for start in range(0, len(payloads), 500):  # 500 publishes in flight at a time
            async with anyio.create_task_group() as tg:
                for p in payloads[start : start + 500]:
                    tg.start_soon(js.publish, f"{self.name}.rows", p)

    async def drained(self) -> bool:
        """Every message was delivered and acknowledged in the group."""
        if self.kind == "redis":
            last = (await self.client.xinfo_stream(self.name))["last-generated-id"]
            groups = await self.client.xinfo_groups(self.name)
            return bool(groups) and all(
                g["last-delivered-id"] == last and not g["pending"] for g in groups
            )
        info = await self.client.jetstream().consumer_info(self.name, "g")
        return not info.num_pending and not info.num_ack_pending

    async def claim_holder(self, uri: str) -> str | None:
        """Who holds the table's claim in the broker (None: nobody)."""
        key = f"table-{table_identity(uri)}"
        if self.kind == "redis":
            value = await self.client.get(f"lance-async:{key}")
            return None if value is None else str(value.decode())
        import nats.js.errors

        try:
            entry = await (await self.client.jetstream().key_value("lance-async-tables")).get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.BucketNotFoundError):
            return None
        return (entry.value or b"").decode() or None


@pytest_asyncio.fixture(params=["redis", "nats"])
async def feed(request: pytest.FixtureRequest) -> AsyncIterator[Feed]:
    name = f"lance-async-replicas-{uuid.uuid4().hex[:10]}"
    if request.param == "redis":
        broker_or_skip("Redis", 6379)
        import redis.asyncio

        client: Any = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
        yield Feed("redis", f"redis://127.0.0.1:6379/{name}?group=g", client, name)
        await client.delete(name)
        await client.aclose()
    else:
        broker_or_skip("NATS", 4222)
        import nats

        client = await nats.connect("nats://127.0.0.1:4222")
        await client.jetstream().add_stream(name=name, subjects=[f"{name}.rows"])
        yield Feed("nats", f"nats://127.0.0.1:4222/{name}/{name}.rows?durable=g", client, name)
        await client.jetstream().delete_stream(name)
        await client.close()


async def make_table(tmp_path: Path) -> str:
    uri = str(tmp_path / "t.lance")
    ds = await la.write_dataset(KV_SCHEMA.empty_table(), uri, schema=KV_SCHEMA)
    await ds.initialize_mem_wal()  # 4 buckets on the key
    return uri


async def run(command: list[str]) -> tuple[int, str]:
    """Run ``lance-async COMMAND`` to its end: (exit status, standard error)."""
    env = {**os.environ, "LANCE_LOG": "critical"}
    argv = [sys.executable, "-m", "lance_async", *command]
    result = await anyio.run_process(argv, check=False, env=env, stdin=subprocess.DEVNULL)
    return result.returncode, result.stderr.decode(errors="replace")


async def assert_ingested_once(uri: str) -> None:
    ds = await la.open_dataset(uri)
    rows = (await ds.lsm.scan(columns=["id", "value"]).to_table()).to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == KEYS, "a key is missing or twice"
    behind = [r for r in rows if r["value"] != VERSIONS - 1]
    assert not behind, behind[:10]
    assert (await ds.check_shards()).ok


@pytest.mark.asyncio
async def test_two_ingest_replicas_one_runs_the_other_refuses(feed: Feed, tmp_path: Path) -> None:
    uri = await make_table(tmp_path)
    await feed.publish_all()
    # the one that runs holds the table for 8 s after the last message: the
    # other one, started with it, is surely up by then
    command = ["ingest", feed.url, uri, "--idle-timeout", "8"]
    results: list[tuple[int, str]] = []

    async def replica() -> None:
        results.append(await run(command))

    with anyio.fail_after(240):  # only stops a hung test
        async with anyio.create_task_group() as tg:
            tg.start_soon(replica)
            tg.start_soon(replica)  # both at once, as two replicas start
    codes = sorted(code for code, _ in results)
    ran = next(stderr for code, stderr in results if code == 0) if 0 in codes else ""
    refused = next((stderr for code, stderr in results if code == 2), "")
    assert codes == [0, 2], results
    lines = [line for line in refused.splitlines() if line.strip()]
    assert len(lines) == 1 and "lance-async worker" in lines[0], refused
    assert "fenced" not in ran.lower(), ran[-2000:]
    assert await feed.drained(), "messages left pending"
    assert await feed.claim_holder(uri) is None  # the one that ran gave its claim back
    await assert_ingested_once(uri)


@pytest.mark.asyncio
async def test_a_worker_group_is_refused_while_an_ingest_writes_and_a_killed_ingest_is_followed(
    feed: Feed, tmp_path: Path
) -> None:
    """A worker of the same broker sees the ingest's claim and stops (exit 2)
    before it opens any shard; an ingest killed with SIGKILL leaves a claim
    nobody renews, which the next ingest takes once it expired."""
    uri = await make_table(tmp_path)
    env = {**os.environ, "LANCE_LOG": "critical"}
    first = subprocess.Popen(  # noqa: ASYNC220 (killed with SIGKILL below)
        [sys.executable, "-m", "lance_async", "ingest", feed.url, uri],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        async def claimed() -> bool:
            return await feed.claim_holder(uri) is not None

        await eventually(claimed, 60, "the ingest to claim the table")
        holder = await feed.claim_holder(uri)
        assert holder is not None and holder.startswith("ingest ")
        worker_feed = feed.url.split("?")[0]  # the same broker, a partitioned feed
        if feed.kind == "nats":
            worker_feed = f"{worker_feed.rsplit('/', 1)[0]}/{feed.name}-parts"
        code, stderr = await run(["worker", worker_feed, uri, "--group", "w", "--member", "m"])
        assert code == 2, stderr
        assert "lance-async ingest" in stderr and "Traceback" not in stderr, stderr
        first.send_signal(signal.SIGKILL)  # its claim stays until it expires
        await anyio.to_thread.run_sync(first.wait)
        assert await feed.claim_holder(uri) == holder
        await feed.publish_all()
        code, stderr = await run(["ingest", feed.url, uri, "--idle-timeout", "3"])
        assert code == 0, stderr
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert await feed.drained()
    await assert_ingested_once(uri)
