"""An S3 fault proxy: a small HTTP proxy in front of moto that can be told to fail.

The engine talks to the proxy as if it were the store (``aws_endpoint`` is the
proxy's URL); the proxy forwards each request to a moto server, or, by its
current :class:`Mode`, answers it itself:

``forward``
    pass every request to the store (the default).
``error``
    answer every request with an S3 error document: ``status`` and ``code``
    (503 ``SlowDown``, 500 ``InternalError``, 403 ``AccessDenied``, ...).
``slow``
    forward, each request after ``delay`` seconds.
``black_hole``
    read the request and never answer (the connection stays open until the
    mode changes or the proxy stops; then it is closed without a reply).

:meth:`S3FaultProxy.forward_to` points it at another store, for example a
moto server restarted empty (the bucket is gone). The proxy counts what it
answered per mode, so a test can wait until the engine has met the fault.

The proxy runs the standard library's threading HTTP server on its own
threads: it needs no event loop, so asyncio and trio tests share it, and the
engine's requests never wait on the test's loop.
"""

from __future__ import annotations

import http.client
import http.server
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = ["Mode", "S3FaultProxy"]

#: Headers that belong to one hop and are never forwarded.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
}


@dataclass(frozen=True)
class Mode:
    """What the proxy does with the next requests (see the module notes)."""

    kind: str = "forward"
    status: int = 0
    code: str = ""
    delay: float = 0.0

    @classmethod
    def forward(cls) -> Mode:
        return cls("forward")

    @classmethod
    def error(cls, status: int, code: str) -> Mode:
        return cls("error", status=status, code=code)

    @classmethod
    def slow(cls, delay: float) -> Mode:
        return cls("slow", delay=delay)

    @classmethod
    def black_hole(cls) -> Mode:
        return cls("black_hole")


class S3FaultProxy:
    """The proxy; start it with ``with S3FaultProxy(moto_url) as proxy``.

    Parameters
    ----------
    upstream : str
        The store's URL, ``http://127.0.0.1:PORT``.

    Attributes
    ----------
    url : str
        The proxy's URL (what ``aws_endpoint`` should be), once started.
    answered : collections.Counter
        Requests answered, by mode kind (``"forward"``, ``"error"``, ...).
    """

    def __init__(self, upstream: str) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._mode = Mode.forward()
        self._upstream = urllib.parse.urlsplit(upstream).netloc
        self.answered: Counter[str] = Counter()
        self._stopping = False
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                mode = proxy.mode
                if mode.kind == "black_hole":
                    proxy._count("black_hole")
                    proxy._wait_for_change(mode)
                    self.close_connection = True
                    return
                if mode.kind == "error":
                    proxy._count("error")
                    self._error(mode.status, mode.code)
                    return
                if mode.kind == "slow":
                    time.sleep(mode.delay)
                proxy._count(mode.kind)
                self._forward(body)

            def _error(self, status: int, code: str) -> None:
                payload = (
                    '<?xml version="1.0" encoding="UTF-8"?>\n'
                    f"<Error><Code>{code}</Code><Message>injected by the test proxy</Message>"
                    "<RequestId>0</RequestId></Error>"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            def _forward(self, body: bytes) -> None:
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    reply = conn.getresponse()
                    data = reply.read()
                except OSError:
                    self._error(503, "ServiceUnavailable")  # the store is down: a 503
                    return
                finally:
                    conn.close()
                self.send_response(reply.status, reply.reason)
                for key, value in reply.getheaders():
                    if key.lower() not in _HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                # a HEAD's length is the object's, not the (empty) body's
                length = reply.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="s3-fault-proxy", daemon=True
        )

    # -- control ----------------------------------------------------------------
    @property
    def mode(self) -> Mode:
        with self._lock:
            return self._mode

    @property
    def upstream(self) -> str:
        with self._lock:
            return self._upstream

    def set(self, mode: Mode) -> None:
        """Switch to ``mode`` for every request from now on (a held black-hole
        request is then closed without a reply)."""
        with self._changed:
            self._mode = mode
            self._changed.notify_all()

    def forward_to(self, upstream: str) -> None:
        """Forward to another store from now on (``http://127.0.0.1:PORT``)."""
        with self._lock:
            self._upstream = urllib.parse.urlsplit(upstream).netloc

    def count(self, kind: str) -> int:
        """Requests answered so far in mode ``kind``."""
        with self._lock:
            return self.answered[kind]

    def _count(self, kind: str) -> None:
        with self._lock:
            self.answered[kind] += 1

    def _wait_for_change(self, mode: Mode) -> None:
        with self._changed:
            while self._mode is mode and not self._stopping:
                self._changed.wait(0.5)

    # -- life cycle ---------------------------------------------------------------
    def __enter__(self) -> S3FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
