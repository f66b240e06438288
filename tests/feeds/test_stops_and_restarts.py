"""``lance-async ingest`` over a long run (issue 38): SIGTERM stops it cleanly, and a
broker that restarts under it is waited for.

Real processes: the command, a private nats-server or redis-server that the
test kills (SIGKILL) and starts again on the same port and data
(``tests/cluster/brokers.py``), and the table read back from another
process. No test bounds a duration; the waits are hang guards.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from queue import Empty, Queue

import lance
import pytest

from ..cluster.brokers import PrivateBroker, nats_server, redis_server
from ..helpers import kv_table, lsm_ids
from .support import row_json

ROOT = Path(__file__).resolve().parents[2]
GUARD = 120.0  # a hang guard, never a bound


def table_with_wal(tmp_path: Path) -> str:
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(kv_table([]), uri).initialize_mem_wal()
    return uri


class Command:
    """``python -m lance_async ARGS`` with its standard error read line by line."""

    def __init__(self, *args: str, stdin: int | None = subprocess.DEVNULL) -> None:
        env = {
            **os.environ,
            "LANCE_ASYNC_PROGRESS_INTERVAL": "0",  # a progress line per acknowledged batch
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lance_async", *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: Queue[str | None] = Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: str) -> str:
        """The next line of standard error matching ``pattern``."""
        deadline = time.monotonic() + GUARD
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except Empty:
                raise AssertionError(f"no line matching {pattern!r}: {self.seen[-20:]}") from None
            if line is None:
                raise AssertionError(f"it ended before {pattern!r}: {self.seen[-20:]}")
            self.seen.append(line)
            if re.search(pattern, line):
                return line

    def wait_for_rows(self, rows: int) -> None:
        """Until a progress line says ``rows`` rows are acknowledged."""
        while True:
            line = self.wait_for(r"^ingest: [\d,]+ rows")
            if int(line.split()[1].replace(",", "")) >= rows:
                return

    def finish(self) -> tuple[int, str, str]:
        """Wait for the end: (exit code, standard output, the rest of standard error)."""
        assert self.proc.stdout is not None
        try:
            out = self.proc.stdout.read()  # standard error is the reader thread's
            self.proc.wait(timeout=GUARD)
        finally:
            self.proc.kill()
        rest = []
        while (line := self.lines.get(timeout=GUARD)) is not None:
            rest.append(line)
        self.seen.extend(rest)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return self.proc.returncode, out, "".join(self.seen)


# -- SIGTERM ---------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_regression_sigterm_stops_ingest_from_stdin_cleanly(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """The issue's case: SIGTERM ended ``ingest -`` at once (143 from a
    shell, no summary). Now it stops as on SIGINT: no more reads, what is in
    flight written, the summary printed, exit 0."""
    uri = table_with_wal(tmp_path)
    cmd = Command("ingest", "-", uri, stdin=subprocess.PIPE)
    assert cmd.proc.stdin is not None
    for i in range(50):
        cmd.proc.stdin.write(json.dumps({"id": i, "value": i, "name": f"s{i}"}) + "\n")
    cmd.proc.stdin.flush()  # and the pipe stays open: the ingest would go on for ever
    cmd.wait_for_rows(50)
    cmd.proc.send_signal(signum)
    code, out, err = cmd.finish()
    assert code == 0, err
    assert "ingested 50 rows" in out, (out, err)
    assert f"stopped by {signum.name}" in err and "Traceback" not in err
    assert lsm_ids(uri) == list(range(50))


# -- brokers that restart -------------------------------------------------------------


class Broker:
    """A private broker and a way to publish rows to it."""

    def __init__(self, kind: str, work: Path) -> None:
        self.kind = kind
        self.server: PrivateBroker = nats_server(work) if kind == "nats" else redis_server(work)
        self.server.start()
        self.name = f"LA_{uuid.uuid4().hex[:12]}"

    @property
    def source(self) -> str:
        port = self.server.port
        if self.kind == "nats":
            return f"nats://127.0.0.1:{port}/{self.name}/{self.name}.rows"
        return f"redis://127.0.0.1:{port}/{self.name}"

    def publish(self, ids: range) -> None:
        if self.kind == "redis":
            import redis

            client = redis.Redis(port=self.server.port)
            try:
                for i in ids:
                    client.xadd(self.name, {"data": row_json(i)})
            finally:
                client.close()
            return

        async def publish() -> None:
            import nats

            nc = await nats.connect(f"nats://127.0.0.1:{self.server.port}")
            js = nc.jetstream()
            try:
                await js.stream_info(self.name)
            except nats.js.errors.NotFoundError:
                await js.add_stream(name=self.name, subjects=[f"{self.name}.rows"])
            for i in ids:
                await js.publish(f"{self.name}.rows", row_json(i))
            await nc.close()

        asyncio.run(publish())

    def outstanding(self) -> int:
        """Messages of the feed not acknowledged by the ingest's consumer."""
        if self.kind == "redis":
            import redis

            client = redis.Redis(port=self.server.port)
            try:
                groups = client.xinfo_groups(self.name)
                group = next(g for g in groups if g["name"] in (b"lance-async", "lance-async"))
                return int(group["lag"] or 0) + int(group["pending"] or 0)
            finally:
                client.close()

        async def info() -> int:
            import nats

            nc = await nats.connect(f"nats://127.0.0.1:{self.server.port}")
            found = await nc.jetstream().consumer_info(self.name, f"lance-async-{self.name}")
            await nc.close()
            return int(found.num_pending or 0) + int(found.num_ack_pending or 0)

        return asyncio.run(info())


@pytest.fixture(params=["nats", "redis"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    b = Broker(str(request.param), tmp_path)
    try:
        yield b
    finally:
        b.server.stop()


def test_regression_a_broker_restart_under_ingest_is_waited_for(
    broker: Broker, tmp_path: Path
) -> None:
    """The issue's case: a NATS restart of 3 s ended ``ingest`` with exit 1
    and ``ConnectionClosedError`` (reconnects capped at 2). Now the feed
    waits for the broker (``retry_for``, default 5 minutes), carries on where
    it stopped, and SIGTERM then ends the run with every message
    acknowledged exactly for the rows that are durable."""
    uri = table_with_wal(tmp_path)
    broker.publish(range(100))
    cmd = Command("ingest", broker.source, uri)
    cmd.wait_for_rows(100)
    broker.server.stop()  # SIGKILL: the broker crashes under the ingest
    cmd.wait_for(r"NATS connection is down|Error|error")  # the feed noticed
    assert cmd.proc.poll() is None  # and waits for it
    broker.server.start()  # on the same port and data
    broker.publish(range(100, 200))
    cmd.wait_for_rows(200)
    cmd.proc.send_signal(signal.SIGTERM)
    code, out, err = cmd.finish()
    assert code == 0, err
    assert "ingested 200 rows" in out, (out, err)
    assert lsm_ids(uri) == list(range(200))
    assert broker.outstanding() == 0  # acknowledged: a next run finds nothing to do
