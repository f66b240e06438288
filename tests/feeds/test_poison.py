"""Poison messages: a hostile JSON payload goes to the dead-letter path, the feed moves on.

Issue 17, item 1, against the real Redis server (asyncio only).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio

import lance_async as la
from lance_async.feeds import RedisStreamFeed, ingest

from ..conftest import broker_or_skip
from .support import entry_id, expected_rows, lsm_rows, mem_wal_table, new_shard, row_json

pytestmark = pytest.mark.broker

URL = "redis://127.0.0.1:6379"


@pytest_asyncio.fixture
async def stream_key() -> AsyncIterator[str]:
    broker_or_skip("Redis", 6379)
    client = redis.asyncio.Redis.from_url(URL)
    key = f"lance_async:test:{uuid.uuid4().hex}"
    try:
        yield key
    finally:
        await client.delete(key)
        await client.aclose()


@pytest.mark.asyncio
async def test_regression_deeply_nested_message_is_dead_lettered_and_the_feed_moves_on(
    stream_key: str, tmp_path: Path
) -> None:
    # 3,000 levels: an untyped RecursionError that ingest() could not dead-letter
    poison = b'{"id": 1, "value": ' + b"[" * 3000 + b"]" * 3000 + b', "name": "x"}'
    client = redis.asyncio.Redis.from_url(URL)
    try:
        ids = [
            entry_id(await client.xadd(stream_key, {"data": payload}))
            for payload in (row_json(0), poison, row_json(2))
        ]
    finally:
        await client.aclose()
    letters: list[tuple[Any, BaseException]] = []
    ds = await mem_wal_table(tmp_path)
    async with (
        ds.mem_wal_writer(new_shard()) as writer,
        await RedisStreamFeed.connect(URL, stream=stream_key, group="g", consumer="c") as feed,
    ):
        stats = await ingest(
            feed,
            writer,
            dead_letter=lambda m, e: letters.append((m.offset, e)),
            fetch_timeout=0.1,
            idle_timeout=0.3,
        )
        assert await lsm_rows(writer) == expected_rows([0, 2])
    assert [offset for offset, _ in letters] == [ids[1]]
    assert isinstance(letters[0][1], la.DecodeError)
    assert "line 1: JSON nested deeper than 64 levels" in str(letters[0][1])
    assert (stats.messages, stats.rows, stats.dead_letters) == (3, 2, 1)


@pytest.mark.asyncio
@pytest.mark.parametrize("empty", [b"", b"  \n", b"[]"], ids=["nothing", "blank", "no-rows"])
async def test_regression_an_empty_message_is_a_bad_message_not_zero_rows(
    stream_key: str, tmp_path: Path, empty: bytes
) -> None:
    """Issue 38: an empty feed message was acknowledged as 0 rows; it is a bad
    message (dead-lettered, or it stops the ingest), never acked as written."""
    client = redis.asyncio.Redis.from_url(URL)
    try:
        ids = [
            entry_id(await client.xadd(stream_key, {"data": payload}))
            for payload in (row_json(0), empty, row_json(2))
        ]
    finally:
        await client.aclose()
    letters: list[tuple[Any, BaseException]] = []
    ds = await mem_wal_table(tmp_path)
    async with (
        ds.mem_wal_writer(new_shard()) as writer,
        await RedisStreamFeed.connect(URL, stream=stream_key, group="g", consumer="c") as feed,
    ):
        stats = await ingest(
            feed,
            writer,
            dead_letter=lambda m, e: letters.append((m.offset, e)),
            fetch_timeout=0.1,
            idle_timeout=0.3,
        )
        assert await lsm_rows(writer) == expected_rows([0, 2])
    assert [offset for offset, _ in letters] == [ids[1]]
    assert isinstance(letters[0][1], la.DecodeError) and "is empty" in str(letters[0][1])
    assert (stats.messages, stats.rows, stats.dead_letters) == (3, 2, 1)
    # without a dead-letter hook it stops the ingest, the message before it written
    async with (
        ds.mem_wal_writer(new_shard()) as writer,
        await RedisStreamFeed.connect(URL, stream=stream_key, group="g2", consumer="c") as feed,
    ):
        with pytest.raises(la.DecodeError) as stopped:
            await ingest(feed, writer, fetch_timeout=0.1, idle_timeout=0.3)
        assert stopped.value.offset == ids[1]
