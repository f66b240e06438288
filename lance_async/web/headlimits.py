"""Limits on the request head, below the ASGI app: its size, its header count, its time.

uvicorn's default HTTP protocol (httptools) bounds none of them: a header of
any size is buffered whole, any number of headers is accepted, and a client
that sends half a request head (or nothing at all) keeps its connection for
ever. Its keep-alive timeout only runs between requests, and h11's
``h11_max_incomplete_event_size`` applies to the h11 protocol only (a 400,
not a 431). :func:`head_limited_protocol` gives uvicorn an httptools protocol
that enforces :class:`HeadLimits`:

* more than ``max_head_bytes`` before the head ends: **431** and close;
* more than ``max_headers`` header lines: **431** and close;
* a head not complete ``head_timeout`` seconds after its first byte (or
  after the connection opened): **408** and close.

A refused connection is closed the way servers close after an error
(Apache's lingering close): the response is written, the sending side shut,
and what the client still sends is read and dropped (at most
``linger_bytes``, for at most ``linger_timeout`` seconds), so that the
client reads the status instead of a reset. Nothing of a refused head stays
buffered: at most ``max_head_bytes`` of it ever reach the parser.

Use it with any app served by uvicorn::

    uvicorn.run(app, http=head_limited_protocol(HeadLimits(head_timeout=5)))

``lance-async serve`` does (``--max-head-bytes``, ``--max-headers``,
``--head-timeout`` and their ``LANCE_ASYNC_SERVE_*`` settings). The limits
are those of the big servers, scaled to an API: nginx reads at most 1 KiB
plus four 8 KiB buffers of head and waits 60 s for it
(``client_header_timeout``), Apache takes 100 header fields
(``LimitRequestFields``), Node 16 KiB of head.

TLS
---
Over TLS the protocol above only sees a connection once its handshake is
done, and uvicorn starts the server without a bound on the handshake
(asyncio's default: 60 s): a client that sends five bytes of a ClientHello
and stops held its connection, and a file descriptor, for a minute.
:func:`handshake_bounded_loop` gives uvicorn an event loop whose servers
bound the handshake (asyncio's and uvloop's ``ssl_handshake_timeout``) by
the head timeout, and the head's own time runs from the moment the
connection was accepted (uvicorn makes the protocol then, before the
handshake): handshake and head together get ``head_timeout``, over http
and https alike. A handshake not done in time is closed without an answer
(there is no TLS session to answer in)::

    uvicorn.run(app, http=head_limited_protocol(limits), ssl_certfile=...,
                ssl_keyfile=..., loop=handshake_bounded_loop(limits.head_timeout))

Bodies are not this module's concern: :class:`~lance_async.web.limits.BodyLimits`
bounds them inside the app.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

__all__ = ["HeadLimitedProtocol", "HeadLimits", "handshake_bounded_loop", "head_limited_protocol"]

log = logging.getLogger("lance_async.web")

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True)
class HeadLimits:
    """How much request head a connection may send, and how slowly.

    Attributes
    ----------
    max_head_bytes : int
        Bytes of one request head (request line, headers, the blank line),
        default 32 KiB. One byte more is a 431.
    max_headers : int
        Header lines in one head, default 100. One more is a 431.
    head_timeout : float
        Seconds from a head's first byte -- or from the connection's
        acceptance, for its first request, the TLS handshake included --
        until the head is complete, default 10 (0: no limit). Past it: a 408
        and the connection closed (a TLS handshake not done by then: closed).
        The keep-alive wait between requests is uvicorn's ``timeout_keep_alive``.
    linger_timeout : float
        Seconds a refused connection is kept to read and drop what the client
        still sends, so that it reads the status rather than a reset
        (default 2).
    linger_bytes : int
        Bytes read and dropped at most while lingering (default 4 MiB).

    Raises
    ------
    ValueError
        A limit below 1 (a timeout below 0), or not finite.
    """

    max_head_bytes: int = 32 * 1024
    max_headers: int = 100
    head_timeout: float = 10.0
    linger_timeout: float = 2.0
    linger_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        for name in ("max_head_bytes", "max_headers", "linger_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("head_timeout", "linger_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number of seconds, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HeadLimits` enforced.

    Make one with :func:`head_limited_protocol` (the limits are a class
    attribute, since uvicorn builds the protocol itself). Everything runs in
    uvicorn's protocol callbacks, on the event loop; nothing blocks.
    """

    head_limits: ClassVar[HeadLimits] = HeadLimits()

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn makes the protocol when the connection is accepted, before a
        # TLS handshake: the first head's time runs from here
        self._accepted: float | None = self.loop.time()
        self._in_head = True  # between a message's end (or the start) and its headers' end
        self._head_bytes = 0
        self._header_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str] | None = None
        self._lingering = False
        self._lingered = 0
        self._linger_timer: asyncio.TimerHandle | None = None

    # -- the connection --------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._linger_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._lingered += len(data)
            if self._lingered > self.head_limits.linger_bytes:
                self.transport.close()
            return
        limits = self.head_limits
        while data and not self._stopped():
            if not self._in_head:
                # a body (and, pipelined behind it, the start of the next head)
                chunk, data = data, b""
                if self.cycle is not None and self.cycle.response_complete:
                    # the rest of a body nobody reads, after its response:
                    # the next head's time runs from now
                    self._arm_head_timer()
            else:
                self._arm_head_timer()
                room = limits.max_head_bytes - self._head_bytes
                if room <= 0:
                    self._refuse(
                        431, f"the request head is larger than {limits.max_head_bytes} bytes"
                    )
                    return
                chunk, data = data[:room], data[room:]
                self._head_bytes += len(chunk)
            super().data_received(chunk)
            if self._refusal is not None:  # refused by a callback
                self._refuse(*self._refusal)
                return
            protocol = self.transport.get_protocol()
            if protocol is not self:  # upgraded (WebSocket): the rest is the new protocol's
                self._cancel_head_timer()
                if data:
                    protocol.data_received(data)  # type: ignore[attr-defined]
                return

    # -- the parser's callbacks --------------------------------------------------
    # Once a head is refused, the rest of the chunk being parsed is ignored.

    def on_message_begin(self) -> None:
        if self._refusal is not None:
            return
        super().on_message_begin()
        self._header_count = 0
        if self._in_head:
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        if self._refusal is None:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refusal is not None:
            return
        self._header_count += 1
        if self._header_count > self.head_limits.max_headers:
            self._refusal = (
                431,
                f"the request has more than {self.head_limits.max_headers} header lines",
            )
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refusal is not None:
            return
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._refusal is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refusal is not None:
            return
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0

    # -- refusing ----------------------------------------------------------------

    def _stopped(self) -> bool:
        return self._lingering or self.parser is None or self.transport.is_closing()

    def _arm_head_timer(self) -> None:
        timeout = self.head_limits.head_timeout
        if self._head_timer is None and timeout > 0:
            accepted, self._accepted = self._accepted, None
            if accepted is not None:  # the first head: what the handshake left of its time
                timeout = max(0.0, accepted + timeout - self.loop.time())
            self._head_timer = self.loop.call_later(timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        answered = self.cycle is not None and self.cycle.response_complete
        if (self._in_head or answered) and not self._stopped():
            self._refuse(
                408,
                f"the request head was not complete within {self.head_limits.head_timeout:g} s",
            )

    def _refuse(self, status: int, detail: str) -> None:
        """Answer ``status`` with a JSON ``detail``, then close (lingering)."""
        if self._stopped():
            return
        self._cancel_head_timer()
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
        log.info("lance_async.serve: %s from %s: %s", status, client, detail)
        self._lingering = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # a response is still being written on this connection (the head
            # refused is pipelined behind it): close once it is complete, and
            # read nothing more meanwhile
            cycle.keep_alive = False
            self.flow.pause_reading()
            return
        body = json.dumps({"detail": detail}).encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])]
        for name, value in self.server_state.default_headers:
            head.append(b"%s: %s\r\n" % (name, value))
        head.append(
            b"content-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % len(body)
        )
        self.transport.write(b"".join(head) + body)
        if not self.transport.can_write_eof():  # TLS: no half-close
            self.transport.close()
            return
        self.transport.write_eof()
        self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(
            self.head_limits.linger_timeout, self.transport.close
        )


def head_limited_protocol(limits: HeadLimits | None = None) -> type[HeadLimitedProtocol]:
    """An httptools protocol class for uvicorn that enforces ``limits``.

    Parameters
    ----------
    limits : HeadLimits, optional
        The limits (default :class:`HeadLimits`: 32 KiB, 100 headers, 10 s).

    Returns
    -------
    type
        A subclass of :class:`HeadLimitedProtocol`, for ``uvicorn.run(...,
        http=...)`` or ``uvicorn.Config(..., http=...)``.

    Raises
    ------
    TypeError
        ``limits`` is not a :class:`HeadLimits`.
    """
    if limits is None:
        limits = HeadLimits()
    if not isinstance(limits, HeadLimits):
        raise TypeError(f"limits must be a HeadLimits, got {type(limits).__name__}")
    return type("HeadLimitedProtocol", (HeadLimitedProtocol,), {"head_limits": limits})


def handshake_bounded_loop(timeout: float) -> Callable[[], asyncio.AbstractEventLoop]:
    """An event loop class for uvicorn whose TLS servers bound the handshake.

    uvicorn's ``Config(loop=...)`` takes it as a custom loop factory. The
    loop is uvloop's when it is installed (what uvicorn's ``"auto"`` picks),
    else asyncio's selector loop; its ``create_server`` passes
    ``ssl_handshake_timeout=timeout`` to every server started with ``ssl=``
    and no handshake timeout of its own. A handshake not done in time is
    aborted by the loop: the connection closed, its file descriptor freed.

    Parameters
    ----------
    timeout : float
        Seconds a TLS handshake may take (> 0; the head timeout of
        :class:`HeadLimits` in ``lance-async serve``). 0 leaves the loop's
        default (60 s).

    Returns
    -------
    callable
        A loop class: calling it makes a new event loop (does not block).

    Raises
    ------
    ValueError
        ``timeout`` is negative or not finite.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ValueError(f"timeout must be a number of seconds, got {timeout!r}")
    if not math.isfinite(timeout) or timeout < 0:
        raise ValueError(f"timeout must be finite and >= 0, got {timeout!r}")
    base: type[asyncio.AbstractEventLoop]
    try:
        import uvloop
    except ImportError:  # uvicorn's "auto" falls back the same way
        base = asyncio.SelectorEventLoop
    else:
        base = uvloop.Loop
    bound = float(timeout)

    class HandshakeBoundedLoop(base):  # type: ignore[misc,valid-type]
        """uvicorn's loop, with ``ssl_handshake_timeout`` on its TLS servers."""

        async def create_server(self, *args: Any, **kwargs: Any) -> Any:
            tls = kwargs.get("ssl") is not None
            if bound > 0 and tls and kwargs.get("ssl_handshake_timeout") is None:
                kwargs["ssl_handshake_timeout"] = bound
            return await super().create_server(*args, **kwargs)

    return HandshakeBoundedLoop
