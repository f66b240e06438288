"""``lance-async serve`` in a subprocess, as an operator runs it (settings, keys, TLS).

The server listens on a free port of 127.0.0.1 found just before it starts;
its standard error (uvicorn's log, the audit log) goes to a file the tests
read. ``/health`` is polled until it answers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest


def entry_point() -> str:
    """The installed ``lance-async`` script (next to this interpreter)."""
    script = Path(sys.executable).with_name("lance-async")
    found = str(script) if script.exists() else shutil.which("lance-async")
    assert found, "lance-async is not installed"
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Serve:
    proc: subprocess.Popen[bytes]
    port: int
    root: Path
    log: Path
    scheme: str = "http"
    verify: ssl.SSLContext | bool = True

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=self.url, timeout=60, headers=headers, verify=self.verify, **kwargs
        )

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def connections(self) -> int:
        """TCP connections the server process holds (its listening socket included)."""
        return len(psutil.Process(self.proc.pid).net_connections(kind="tcp"))

    def table(self, name: str) -> Path:
        return self.root / f"{name}.lance"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve(
    root: Path,
    log: Path,
    *args: str,
    env: dict[str, str] | None = None,
    scheme: str = "http",
    verify: ssl.SSLContext | bool = True,
) -> Serve:
    """Start ``lance-async serve --root ROOT --port PORT ARGS...``; wait for ``/health``."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [entry_point(), "serve", "--root", str(root), "--port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    server = Serve(proc, port, root, log, scheme, verify)
    deadline = time.monotonic() + 90
    while True:
        try:
            with httpx.Client(verify=verify, timeout=2) as client:
                if client.get(f"{server.url}/health").status_code == 200:
                    return server
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            pytest.fail(f"the server did not start:\n{server.log_text()[-3000:]}")
        time.sleep(0.1)


@contextlib.contextmanager
def threaded(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a thread of this process; yields its URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
