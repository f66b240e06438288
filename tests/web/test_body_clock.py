"""The slow-body limits on a mock clock: each one ends a body at the moment it
names, never before.

:func:`~lance_async.fastapi.request_batches` reads a Starlette request whose
``receive`` is a client trickling its body in virtual time (trio's
``MockClock``, jumping whenever every task waits), so the moments below are
exact, whatever the machine's load. The servers of ``test_hardening`` and
``test_fastapi`` check over real sockets which limit answers (its name in the
response); here is when.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import trio.testing
from starlette.requests import Request

from lance_async.fastapi import (
    NDJSON,
    BodyConsumedError,
    BodyLimits,
    BodyTimeoutError,
    request_batches,
)

from ..helpers import KV_SCHEMA

pytestmark = pytest.mark.anyio

#: Limits of the ``paced`` server of test_hardening (bytes/s, seconds).
LIMITS = BodyLimits(body_idle_timeout=3, min_body_rate=200, body_rate_grace=1, max_body_time=4)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}


def ndjson(ids: range) -> bytes:
    return b"".join(json.dumps({"id": i, "value": 7, "name": "t"}).encode() + b"\n" for i in ids)


class Client:
    """Sends ``body`` ``step`` bytes at a time, ``pause`` virtual seconds apart
    (the first chunk at once)."""

    def __init__(self, body: bytes, step: int, pause: float) -> None:
        self.chunks = [body[i : i + step] for i in range(0, len(body), step)]
        self.pause = pause
        self.sent = 0
        self.first_at: float | None = None

    async def receive(self) -> dict[str, Any]:
        if self.sent:
            await anyio.sleep(self.pause)
        else:
            self.first_at = anyio.current_time()
        i, self.sent = self.sent, self.sent + 1
        return {
            "type": "http.request",
            "body": self.chunks[i],
            "more_body": i < len(self.chunks) - 1,
        }

    def request(self, receive: Callable[[], Awaitable[dict[str, Any]]] | None = None) -> Request:
        length = sum(len(c) for c in self.chunks)
        headers = [(b"content-type", NDJSON.encode()), (b"content-length", str(length).encode())]
        scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
        return Request(scope, receive or self.receive)


async def read(request: Request, limits: BodyLimits = LIMITS) -> int:
    """Rows of the whole body."""
    rows = 0
    async with request_batches(request, KV_SCHEMA, limits=limits, all_columns=True) as body:
        async for batch in body:
            rows += batch.num_rows
    return rows


async def test_a_trickle_below_the_rate_ends_when_the_grace_ends() -> None:
    # a byte every 0.3 s: 4 bytes/s against 200, but nothing is cut before the grace
    client = Client(ndjson(range(100)), step=1, pause=0.3)
    with pytest.raises(BodyTimeoutError, match="min_body_rate") as info:
        await read(client.request())
    assert client.first_at is not None
    assert anyio.current_time() - client.first_at == pytest.approx(LIMITS.body_rate_grace)
    assert client.sent == 4  # at 0, 0.3, 0.6 and 0.9 s
    assert "after 4 bytes in 1.0 s" in str(info.value)


async def test_a_steady_body_longer_than_the_maximum_time_ends_at_that_time() -> None:
    # 400 bytes/s passes the rate; the whole body would take about 15 s
    body = ndjson(range(2000, 2200))
    assert len(body) > 15 * 400
    client = Client(body, step=100, pause=0.25)
    with pytest.raises(BodyTimeoutError, match="max_body_time"):
        await read(client.request())
    assert client.first_at is not None
    took = anyio.current_time() - client.first_at
    assert LIMITS.max_body_time <= took < LIMITS.max_body_time + client.pause


async def test_a_body_above_the_rate_and_within_the_time_is_read_whole() -> None:
    client = Client(ndjson(range(3000, 3040)), step=400, pause=0.25)
    assert await read(client.request()) == 40
    assert client.sent == len(client.chunks)


async def test_a_pause_longer_than_the_idle_timeout_ends_the_body_at_it() -> None:
    # fast enough on average, then silent: the idle timeout, from the last chunk
    client = Client(ndjson(range(10)), step=100, pause=0.0)
    chunks = len(client.chunks)

    async def receive() -> dict[str, Any]:
        if client.sent == chunks - 1:  # the last chunk never comes
            client.first_at = anyio.current_time()  # here: the moment of the last one sent
            await anyio.sleep_forever()
        return await client.receive()

    limits = BodyLimits(body_idle_timeout=3, min_body_rate=0, max_body_time=0)
    with pytest.raises(BodyTimeoutError, match="body_idle_timeout"):
        await read(client.request(receive), limits)
    assert client.first_at is not None
    assert anyio.current_time() - client.first_at == pytest.approx(limits.body_idle_timeout)


async def test_no_first_bytes_is_a_consumed_body_at_the_start_timeout() -> None:
    client = Client(ndjson(range(3)), step=100, pause=0.0)
    asked: list[float] = []

    async def receive() -> dict[str, Any]:
        asked.append(anyio.current_time())
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    limits = BodyLimits(body_start_timeout=1)
    with pytest.raises(BodyConsumedError, match="body_start_timeout"):
        await read(client.request(receive), limits)
    assert len(asked) == 1
    assert anyio.current_time() - asked[0] == pytest.approx(limits.body_start_timeout)
