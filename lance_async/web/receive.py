"""Receiving request bodies: :func:`request_batches` and the body guard.

:func:`request_batches` gives a handler its request body as a one-shot
stream of checked record batches (:class:`~lance_async.web.bodies.BodyBatches`),
read from the ASGI ``receive`` with the limits of
:class:`~lance_async.web.limits.BodyLimits`. :class:`BodyDrainMiddleware`
(installed outermost by :func:`install_body_guard`) notes what the server
delivered, so a body that a middleware read first is a 400
:class:`~lance_async.web.errors.BodyConsumedError`, never a hang or an empty
write, and lets error responses reach clients that are still uploading.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import pyarrow as pa
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .bodies import BodyBatches
from .errors import BodyConsumedError, BodyTimeoutError, ClientDisconnectedError
from .limits import SLICE_ROWS, BodyLimits, body_format

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["BODY_LEDGER_SCOPE_KEY", "BodyDrainMiddleware", "install_body_guard", "request_batches"]


def _content_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        return None
    return length if length >= 0 else None


class _BodyLedger:
    """What the outermost :class:`BodyDrainMiddleware` saw of one request body.

    Kept in the ASGI scope under :data:`BODY_LEDGER_SCOPE_KEY`, so that a
    handler reading the body deeper in the stack can tell that someone else
    read it first.
    """

    __slots__ = ("ended", "gone", "readers", "received", "refused", "stalled")

    def __init__(self) -> None:
        self.received = 0  # body bytes the server delivered
        self.ended = False  # the last body message was delivered
        self.gone = False  # the client disconnected
        self.readers = 0  # request_batches readers waiting for a body message now
        self.refused = False  # a reader asked for more of a body delivered whole
        self.stalled = False  # a reader gave up waiting for the first body bytes


#: The ASGI scope key under which :class:`BodyDrainMiddleware` keeps its ledger.
BODY_LEDGER_SCOPE_KEY = "lance_async.body"


def _consumed_error(detail: str) -> BodyConsumedError:
    return BodyConsumedError(
        f"{detail}: a middleware (or an earlier reader) consumed the request body; "
        "nothing was written. Middleware must not read bodies that handlers stream."
    )


async def _receive_chunks(request: Request, limits: BodyLimits) -> AsyncIterator[bytes]:
    """``request.stream()`` with its failures turned into lance_async errors.

    With a :class:`BodyDrainMiddleware` ledger in the scope: a body already
    delivered to someone else is a :class:`BodyConsumedError` at once (the
    middleware refuses to wait for a body message that will never come), and
    so is a body of which fewer bytes reached us than the server delivered.
    Without one (or when the body was consumed outside the middleware), the
    wait for the first bytes is bounded by ``limits.body_start_timeout``;
    every later wait by ``limits.body_idle_timeout``, and the whole body by
    ``limits.max_body_time`` and ``limits.min_body_rate``
    (:class:`BodyTimeoutError`).
    """
    ledger = request.scope.get(BODY_LEDGER_SCOPE_KEY)
    if not isinstance(ledger, _BodyLedger):
        ledger = None
    received = 0
    first = True
    started = 0.0  # the loop time the first body bytes arrived
    try:
        async with aclosing(request.stream()) as stream:
            iterator = aiter(stream)
            while True:
                if ledger is not None:
                    ledger.readers += 1
                try:
                    if first and limits.body_start_timeout > 0:
                        with anyio.move_on_after(limits.body_start_timeout) as waited:
                            chunk = await anext(iterator)
                        if waited.cancelled_caught:
                            if ledger is not None:
                                ledger.stalled = True
                            raise _consumed_error(
                                f"no body bytes arrived within {limits.body_start_timeout:g} s "
                                "(body_start_timeout); either the client stalled, or a "
                                "middleware outside BodyDrainMiddleware read the body"
                            )
                    elif not first:
                        wait, limit = _next_wait(limits, started, received)
                        with anyio.move_on_after(wait) as waited:
                            chunk = await anext(iterator)
                        if waited.cancelled_caught:
                            if ledger is not None:
                                ledger.stalled = True
                            raise _slow_body_error(limits, limit, started, received)
                    else:
                        chunk = await anext(iterator)
                except StopAsyncIteration:
                    break
                finally:
                    if ledger is not None:
                        ledger.readers -= 1
                if first:
                    started = anyio.current_time()
                first = False
                if chunk:
                    received += len(chunk)
                    yield chunk
    except ClientDisconnect as exc:
        raise ClientDisconnectedError(
            "the client disconnected before the body ended; nothing was written"
        ) from exc
    except RuntimeError as exc:
        if str(exc) == "Stream consumed":  # Starlette raises no dedicated type
            raise _consumed_error("the request body was already read") from exc
        raise
    if ledger is not None and ledger.refused:
        raise _consumed_error(
            f"the whole body ({ledger.received:,} bytes) was delivered before this handler "
            f"read {'it' if not received else 'its end'}"
        )
    if ledger is not None and ledger.received > received:
        raise _consumed_error(
            f"the server delivered {ledger.received:,} body bytes but {received:,} reached "
            "this handler"
        )


def _next_wait(limits: BodyLimits, started: float, received: int) -> tuple[float, str]:
    """How long to wait for the next body chunk, and the limit that ends the wait.

    The nearest of: the idle timeout from now, the body's total time from
    ``started``, and the moment the average rate since ``started`` falls
    below ``min_body_rate`` if nothing more arrives (never before the grace).
    """
    now = anyio.current_time()
    waits = [(math.inf, "")]
    if limits.body_idle_timeout > 0:
        waits.append((limits.body_idle_timeout, "body_idle_timeout"))
    if limits.max_body_time > 0:
        waits.append((started + limits.max_body_time - now, "max_body_time"))
    if limits.min_body_rate > 0:
        behind = started + max(limits.body_rate_grace, received / limits.min_body_rate)
        waits.append((behind - now, "min_body_rate"))
    wait, limit = min(waits)
    return max(wait, 0.0), limit


def _slow_body_error(
    limits: BodyLimits, limit: str, started: float, received: int
) -> BodyTimeoutError:
    elapsed = anyio.current_time() - started
    if limit == "max_body_time":
        why = f"the body took longer than {limits.max_body_time:g} s (max_body_time)"
    elif limit == "min_body_rate":
        why = (
            f"the body arrived at {received / max(elapsed, 1e-9):,.0f} bytes/s on average, "
            f"below {limits.min_body_rate:,.0f} bytes/s (min_body_rate, after "
            f"{limits.body_rate_grace:g} s)"
        )
    else:
        why = f"no body bytes arrived for {limits.body_idle_timeout:g} s (body_idle_timeout)"
    return BodyTimeoutError(
        f"{why}, after {received:,} bytes in {elapsed:.1f} s; nothing was written. "
        "Send the body again, faster"
    )


@asynccontextmanager
async def request_batches(
    request: Request,
    table_schema: pa.Schema,
    *,
    limits: BodyLimits | None = None,
    required_columns: Sequence[str] = (),
    all_columns: bool = False,
    spool: bool = False,
    spool_dir: str | None = None,
    slice_rows: int = SLICE_ROWS,
) -> AsyncIterator[BodyBatches]:
    """The request body as a one-shot stream of batches checked against a table.

    Use it as ``async with request_batches(request, ds.schema, ...) as body:``
    and hand ``body`` to :func:`merge_body`, :func:`ingest_body` or any
    lance_async write (it is a STREAMING source).

    Parameters
    ----------
    request : starlette.requests.Request
        Its body must not have been read yet.
    table_schema : pa.Schema
        The target table's schema.
    limits : BodyLimits, optional
    required_columns : sequence of str
        Columns the body must hold (merge keys, non-nullable columns ...).
    all_columns : bool
        The body must hold every table column (MemWAL ingest).
    spool : bool
        Keep a replay spool (needed by ``merge_body(replay="spool")``).
    spool_dir : str, optional
        Where spool files go (default: the system's temporary directory).
    slice_rows : int
        Rows per batch handed on (larger ones are sliced, zero-copy; default
        8,192, where Lance's merge keeps its smallest working set).

    Yields
    ------
    BodyBatches
        Already started: the format, the limits known up front, the schema
        and the first rows were checked before the ``async with`` body runs.

    Raises
    ------
    UnsupportedMediaTypeError
        No decoder for the ``Content-Type`` (HTTP 415).
    PayloadTooLargeError
        ``Content-Length`` or the first message passes a limit (HTTP 413).
    SchemaMismatchError, DecodeError
        The body does not fit the table or its format (HTTP 422).
    EmptyBodyError, BodyConsumedError
        No bytes, no rows, or the body was consumed earlier (HTTP 400): see
        :class:`BodyDrainMiddleware` for what can be detected, at once or
        after ``limits.body_start_timeout``. Raised by iteration too (a
        body of which a middleware read only the first chunks).
    ClientDisconnectedError
        The client left (HTTP 499).

    Notes
    -----
    Leaving the block closes the body and deletes its spool (shielded).
    Reading never blocks the loop: chunks are collected on the loop and
    decoded on the library's ``stream`` threads.
    """
    limits = limits or BodyLimits()
    body = BodyBatches(
        _receive_chunks(request, limits),
        format=body_format(request.headers.get("content-type")),
        table_schema=table_schema,
        limits=limits,
        required_columns=required_columns,
        all_columns=all_columns,
        content_length=_content_length(request),
        spool=spool,
        spool_dir=spool_dir,
        slice_rows=slice_rows,
    )
    try:
        await body.start()
        yield body
    finally:
        await body.aclose()
        await body.discard_spool()


class BodyDrainMiddleware:
    """Guard request bodies: detect bodies read twice, and let early error
    responses reach clients that are still uploading.

    Consumed bodies
        The middleware counts the body messages the server delivers, in a
        ledger kept in the ASGI scope. When a handler reading through
        :func:`request_batches` asks for more of a body that was already
        delivered whole (a middleware inside this one read it and passed the
        original ``receive`` on), the request fails at once with
        :class:`BodyConsumedError` (HTTP 400) instead of waiting for a body
        message that the server will never send; a body of which fewer bytes
        reached the handler than the server delivered (a middleware read the
        first chunks) fails the same way when it ends.
    Early errors
        When a handler answers with a status >= 400 before the body has ended
        (a 413 at the first oversized message, a 422 at the schema check),
        closing the connection with unread bytes makes the kernel reset it,
        and the client never sees the response. The middleware reads and
        discards up to ``drain_bytes`` more of the body (within
        ``drain_timeout`` seconds) before the response starts; past that the
        response is sent with ``Connection: close``.

    Parameters
    ----------
    app : ASGI app
    drain_bytes : int
        Default 8 MiB.
    drain_timeout : float
        Default 5 seconds.

    Notes
    -----
    It sees only what passes through it, so it must be the outermost layer:
    use :func:`install_body_guard` (which keeps it outermost whatever
    middleware is added later), or wrap the ASGI app handed to the server.
    A body read by a middleware *outside* it cannot be told from a stalled
    client; ``BodyLimits.body_start_timeout`` bounds that wait (400 after 10
    s by default). A middleware that rewrites bodies (decompression) must not
    sit inside it: the byte counts would not match. A nested instance passes
    through untouched, as do requests without a body (no ``Content-Length``
    > 0, no ``Transfer-Encoding``) and responses below 400.
    """

    def __init__(
        self, app: ASGIApp, *, drain_bytes: int = 8 << 20, drain_timeout: float = 5.0
    ) -> None:
        self.app = app
        self.drain_bytes = drain_bytes
        self.drain_timeout = drain_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or BODY_LEDGER_SCOPE_KEY in scope:
            await self.app(scope, receive, send)
            return
        length: int | None = None
        chunked = False
        for key, value in scope.get("headers", []):
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
            elif key == b"transfer-encoding":
                chunked = True
        if not chunked and not length:
            await self.app(scope, receive, send)
            return
        ledger = _BodyLedger()
        scope[BODY_LEDGER_SCOPE_KEY] = ledger

        async def tracked_receive() -> Message:
            if ledger.ended and ledger.readers and not ledger.gone:
                # A body reader asks for more of a body delivered whole before:
                # someone else read it, and the server would answer only when
                # the client leaves. End the body here; the reader raises (an
                # error raised here could reach the handler wrapped in the
                # exception group of a middleware's task group).
                ledger.refused = True
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                ledger.received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    ledger.ended = True
            elif message["type"] == "http.disconnect":
                ledger.gone = True
            return message

        async def drain() -> bool:
            if length is not None and length - ledger.received > self.drain_bytes:
                return False
            budget = ledger.received + self.drain_bytes
            with anyio.move_on_after(self.drain_timeout):
                while not ledger.ended and not ledger.gone:
                    await tracked_receive()
                    if ledger.received > budget:
                        break
            return ledger.ended

        async def guarded_send(message: Message) -> None:
            if (
                message["type"] == "http.response.start"
                and int(message.get("status", 200)) >= 400
                and not ledger.ended
                and not ledger.gone
                and (ledger.stalled or not await drain())
            ):
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, tracked_receive, guarded_send)


def install_body_guard(
    app: Starlette, *, drain_bytes: int = 8 << 20, drain_timeout: float = 5.0
) -> None:
    """Make :class:`BodyDrainMiddleware` the outermost layer of ``app``.

    ``app.add_middleware`` puts the middleware added last outermost, so a
    :class:`BodyDrainMiddleware` added early would not see what a later one
    does to the body. This wraps the whole middleware stack that the app
    builds at its first request instead, outside every middleware added
    before or after (and outside Starlette's ``ServerErrorMiddleware``).

    Parameters
    ----------
    app : Starlette or FastAPI
        Not started yet.
    drain_bytes, drain_timeout
        As :class:`BodyDrainMiddleware`.

    Raises
    ------
    RuntimeError
        The app has already built its middleware stack (it has served).
    """
    if getattr(app, "middleware_stack", None) is not None:
        raise RuntimeError("install_body_guard must be called before the app starts")
    build = app.build_middleware_stack

    def build_guarded() -> ASGIApp:
        return BodyDrainMiddleware(build(), drain_bytes=drain_bytes, drain_timeout=drain_timeout)

    app.build_middleware_stack = build_guarded  # type: ignore[method-assign]
