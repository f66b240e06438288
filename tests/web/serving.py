"""``lance-async serve`` in a subprocess, as an operator runs it (settings, keys, TLS).

The server listens on a free port of 127.0.0.1 found just before it starts;
its standard error (uvicorn's log, the audit log) goes to a file the tests
read. ``/health`` is polled until it answers.

:func:`wait_until` is the one start-up wait of the test suite: every test
that starts a server (a ``serve`` process, a uvicorn thread, the test app of
``tests/web/app.py``) waits with it until the server answers, and fails with
the server's log as soon as the server ended instead.
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
from collections.abc import Callable, Iterator, Mapping
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

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_until(
    ready: Callable[[], bool],
    *,
    alive: Callable[[], bool],
    log: Callable[[], str] = str,
    what: str = "the server",
    timeout: float = 90.0,
) -> None:
    """Poll ``ready()`` until it holds; fail with ``log()`` once ``alive()`` does not.

    ``timeout`` (seconds) only stops a hung test: a server that ends fails at
    once, whatever the timeout, and a slow start on a loaded machine is not
    a failure.
    """
    deadline = time.monotonic() + timeout
    while not ready():
        if not alive():
            pytest.fail(f"{what} ended before it was ready:\n{log()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} was not ready within {timeout} s:\n{log()[-3000:]}")
        time.sleep(0.05)


def health_answers(url: str, verify: ssl.SSLContext | bool = True) -> Callable[[], bool]:
    """A check that ``GET {url}/health`` answers 200 (for :func:`wait_until`)."""

    def check() -> bool:
        try:
            with httpx.Client(verify=verify, timeout=2) as client:
                return client.get(f"{url}/health").status_code == 200
        except httpx.HTTPError:
            return False

    return check


def start(
    argv: list[str],
    port: int,
    root: Path,
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    scheme: str = "http",
    verify: ssl.SSLContext | bool = True,
) -> Serve:
    """Run ``argv`` (a server listening on ``port``), its output to ``log``;
    return once ``/health`` answers (see :func:`wait_until`).

    ``env`` is the whole environment (default: this process's).
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
        )
    server = Serve(proc, port, root, log, scheme, verify)
    try:
        wait_until(
            health_answers(server.url, verify),
            alive=lambda: proc.poll() is None,
            log=server.log_text,
        )
    except BaseException:
        server.stop()
        raise
    return server


def serve(
    root: Path,
    log: Path,
    *args: str,
    env: dict[str, str] | None = None,
    scheme: str = "http",
    verify: ssl.SSLContext | bool = True,
) -> Serve:
    """Start ``lance-async serve --root ROOT --port PORT ARGS...``; wait for ``/health``.

    ``env`` is added to this process's environment.
    """
    port = free_port()
    return start(
        [entry_point(), "serve", "--root", str(root), "--port", str(port), *args],
        port,
        root,
        log,
        env={**os.environ, **(env or {})},
        scheme=scheme,
        verify=verify,
    )


@contextlib.contextmanager
def threaded(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a thread of this process; yields its URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, alive=thread.is_alive, what="uvicorn on a thread")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
