"""The head timeout on a virtual clock: a head is cut ``head_timeout`` after
the connection was accepted (or, for a later head, after its first byte) and
never before.

:class:`~lance_async.web.headlimits.HeadLimitedProtocol` is driven the way
asyncio drives it (``connection_made``, ``data_received``) on an event loop
whose ``time()`` is the test's, over a transport that records what the server
writes; its timers and the app's tasks run when the test moves the clock, so
the moments below are exact whatever the machine's load. The ``exposed``
server of ``test_exposure`` checks over real sockets that stalled heads get
this 408 (its wording); here is when.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from lance_async.web.headlimits import HeadLimits, head_limited_protocol

HEAD_TIMEOUT = 4.0
#: Less than any step of the clock below, more than the loop's clock resolution.
JUST = 0.001


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on the test's clock: :meth:`advance` moves it and runs
    what is due (timers, tasks) until nothing more is ready."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for _ in range(20):  # every callback due now, and what they schedule at once
            self.run_until_complete(asyncio.sleep(0))


class Recorded(asyncio.Transport):
    """A transport that keeps what the server writes and whether it closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.protocol: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_protocol(self) -> Any:
        return self.protocol

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def statuses(self) -> list[int]:
        """The status of each response written so far."""
        return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", bytes(self.written))]


async def ok(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def loop() -> Iterator[VirtualLoop]:
    loop = VirtualLoop()
    try:
        yield loop
    finally:
        loop.close()


def connect(loop: VirtualLoop) -> Recorded:
    """A connection accepted now."""
    limits = HeadLimits(head_timeout=HEAD_TIMEOUT)
    config = uvicorn.Config(ok, http=head_limited_protocol(limits), log_config=None, lifespan="off")
    protocol = head_limited_protocol(limits)(config, ServerState(), {}, _loop=loop)
    transport = Recorded()
    transport.protocol = protocol
    protocol.connection_made(transport)
    return transport


def test_a_connection_that_sends_nothing_is_a_408_at_the_head_timeout(loop: VirtualLoop) -> None:
    conn = connect(loop)
    loop.advance(HEAD_TIMEOUT - JUST)
    assert conn.written == b"" and not conn.closed
    loop.advance(JUST)
    assert conn.statuses() == [408]
    assert b"not complete within 4 s" in conn.written


def test_half_a_first_head_is_timed_from_the_accept_not_from_its_bytes(loop: VirtualLoop) -> None:
    conn = connect(loop)
    loop.advance(1.0)
    conn.protocol.data_received(b"GET /tables HTTP/1.1\r\nHost: x\r\nX-Pad: abc")
    loop.advance(1.0)
    conn.protocol.data_received(b"d")  # more bytes do not restart the clock
    loop.advance(HEAD_TIMEOUT - 2.0 - JUST)
    assert conn.written == b""
    loop.advance(JUST)
    assert conn.statuses() == [408]


def test_a_second_head_is_timed_from_its_first_byte(loop: VirtualLoop) -> None:
    conn = connect(loop)
    loop.advance(1.0)
    # a first request answered, then half of a second one on the same connection
    conn.protocol.data_received(b"GET /tables HTTP/1.1\r\nHost: x\r\n\r\nGET /tab")
    loop.advance(0.0)
    assert conn.statuses() == [200]
    loop.advance(HEAD_TIMEOUT - JUST)  # 5 s from the accept: past the first head's time
    assert conn.statuses() == [200]
    loop.advance(JUST)
    assert conn.statuses() == [200, 408]


def test_a_complete_head_stops_the_clock(loop: VirtualLoop) -> None:
    conn = connect(loop)
    loop.advance(HEAD_TIMEOUT - JUST)
    conn.protocol.data_received(b"GET /tables HTTP/1.1\r\nHost: x\r\n\r\n")
    loop.advance(HEAD_TIMEOUT * 2)
    assert conn.statuses() == [200]
