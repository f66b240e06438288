"""The example app with test-only hooks, run by tests/test_fastapi.py in a subprocess.

    python -m tests.web.app --root DIR [--strict] [--spool-dir DIR]
                                [--threads ENGINE,STREAM,READER]
                                [--max-uploads N] [--idle-timeout SECONDS]
                                [--min-body-rate BYTES_PER_S] [--body-rate-grace SECONDS]
                                [--max-body-time SECONDS]

It listens on an ephemeral port of 127.0.0.1 and prints ``PORT <n>`` once the
socket is bound (``GET /health`` answers once startup is done).

Test-only hooks, on top of :func:`lance_async.web.server.create_app`:

* anyio's default thread limiter -- the pool Starlette runs sync endpoints
  in -- is shrunk to 2 threads, and ``GET /sync-probe`` is a sync endpoint
  that needs one of them. If lance_async ran uploads on that pool, slow
  uploads would starve it.
* MemWAL tables get a shard writer whose engine keeps at most 16 MiB of
  rows not yet flushed (``WRITER_OPTIONS``; pylance's default is 1 GB), so
  that the server's memory during a large ingest measures what lance_async
  holds, not the engine's write buffer.
* ``--strict`` sets small body limits (1 MiB bodies, 1,000-row and 256 KiB
  IPC batches, 500-row ingests, a 1 s ``body_start_timeout``), enables raw
  SQL filters, and adds middleware that read the body before the handler,
  as careless logging middleware would:

  - ``x-test-consume-body``: a ``BaseHTTPMiddleware`` reads the whole body
    with ``request.stream()`` (the handler then sees an empty body);
  - ``x-test-consume-plain: all`` / ``first``: a plain ASGI middleware
    (inside the app's body guard) reads every body message, or the first
    one, and passes the server's ``receive`` on unchanged;
  - ``x-test-consume-outside``: the same, wrapped around the whole app
    (outside the guard), where only ``body_start_timeout`` can help.

  The main server goes without them: ``BaseHTTPMiddleware`` costs every
  request extra tasks, which the latency test should not measure.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypedDict

import anyio.to_thread
import uvicorn
from fastapi import FastAPI
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from lance_async import ThreadLimits
from lance_async.fastapi import BodyLimits
from lance_async.web.server import create_app

DEFAULT_POOL_THREADS = 2

STRICT_LIMITS = BodyLimits(
    max_body_bytes=1 << 20,
    max_batch_rows=1000,
    max_batch_bytes=256 << 10,
    drain_bytes=4 << 20,
    drain_timeout=5.0,
    body_start_timeout=1.0,
)
MAIN_LIMITS = BodyLimits(max_body_bytes=256 << 20)
STRICT_INGEST_ROWS = 500
WRITER_OPTIONS = {"max_memtable_size": 4 << 20, "max_unflushed_memtable_bytes": 16 << 20}


class ConsumeBodyMiddleware(BaseHTTPMiddleware):
    """Reads the body itself when asked to (header ``x-test-consume-body``)."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.headers.get("x-test-consume-body"):
            async for _ in request.stream():
                pass
        return await call_next(request)


class PlainConsumeMiddleware:
    """A plain ASGI middleware that reads body messages itself when asked to
    (header ``header``: ``all`` reads to the end, ``first`` one message),
    then calls the app with the server's ``receive`` unchanged."""

    def __init__(self, app: ASGIApp, header: bytes = b"x-test-consume-plain") -> None:
        self.app = app
        self.header = header

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            mode = dict(scope["headers"]).get(self.header)
            while mode in (b"all", b"first"):
                message = await receive()
                if mode == b"first" or not message.get("more_body", False):
                    break
        await self.app(scope, receive, send)


class SlowBody(TypedDict, total=False):
    """The slow-body limits a test sets (the :class:`BodyLimits` fields of these names)."""

    min_body_rate: float
    body_rate_grace: float
    max_body_time: float


def build_app(
    root: str,
    *,
    strict: bool,
    spool_dir: str | None,
    threads: ThreadLimits | None = None,
    max_uploads: int | None = 16,
    idle_timeout: float | None = None,
    slow_body: SlowBody | None = None,
) -> FastAPI:
    limits = STRICT_LIMITS if strict else MAIN_LIMITS
    if idle_timeout is not None:
        limits = dataclasses.replace(limits, body_idle_timeout=idle_timeout)
    if slow_body:
        limits = dataclasses.replace(limits, **slow_body)
    app = create_app(
        root,
        limits=limits,
        max_uploads=max_uploads,
        allow_raw_sql=strict,
        max_ingest_rows=STRICT_INGEST_ROWS if strict else None,
        spool_dir=spool_dir,
        conflict_retries=20,
        writer_options=WRITER_OPTIONS,
        threads=threads,
    )

    @app.get("/sync-probe")
    def sync_probe() -> dict[str, Any]:  # a sync endpoint: runs on anyio's default pool
        return {"ok": True}

    if strict:
        app.add_middleware(ConsumeBodyMiddleware)
        app.add_middleware(PlainConsumeMiddleware)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = DEFAULT_POOL_THREADS
        async with inner(application) as state:
            yield state

    app.router.lifespan_context = lifespan
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--spool-dir", default=None)
    parser.add_argument("--threads", default=None, help="ENGINE,STREAM,READER thread limits")
    parser.add_argument("--max-uploads", type=int, default=16)
    parser.add_argument("--idle-timeout", type=float, default=None)
    parser.add_argument("--min-body-rate", type=float, default=None)
    parser.add_argument("--body-rate-grace", type=float, default=None)
    parser.add_argument("--max-body-time", type=float, default=None)
    args = parser.parse_args(argv)
    slow_body: SlowBody = {}
    if args.min_body_rate is not None:
        slow_body["min_body_rate"] = args.min_body_rate
    if args.body_rate_grace is not None:
        slow_body["body_rate_grace"] = args.body_rate_grace
    if args.max_body_time is not None:
        slow_body["max_body_time"] = args.max_body_time
    threads = None
    if args.threads:
        engine, stream, reader = (int(n) for n in args.threads.split(","))
        threads = ThreadLimits(engine=engine, stream=stream, reader=reader)
    app = build_app(
        args.root,
        strict=args.strict,
        spool_dir=args.spool_dir,
        threads=threads,
        max_uploads=args.max_uploads,
        idle_timeout=args.idle_timeout,
        slow_body=slow_body,
    )
    asgi: ASGIApp = app
    if args.strict:
        asgi = PlainConsumeMiddleware(app, b"x-test-consume-outside")
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only
    # when the listening socket says it is TCP. Without it, keep-alive responses
    # wait ~40 ms for delayed ACKs (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            asgi, log_level="info", access_log=False, lifespan="on", timeout_graceful_shutdown=5
        )
    )
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
