"""Shared pieces of the feed tests: a MemWAL table, a crash injector, row reads,
Redis replies narrowed to what the tests' clients return."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa

import lance_async as la
from lance_async.feeds import Message

from ..helpers import KV_SCHEMA


async def mem_wal_table(tmp_path: Path) -> la.AsyncDataset:
    """An empty KV_SCHEMA table (primary key ``id``) with the MemWAL enabled,
    manual shards (each feed test writes through one writer of its own)."""
    ds = await la.write_dataset(
        KV_SCHEMA.empty_table(), str(tmp_path / "feed.lance"), schema=KV_SCHEMA
    )
    await ds.initialize_mem_wal(manual_shards=True)
    return ds


def new_shard() -> str:
    return str(uuid.uuid4())


def row_json(i: int, value: int | None = None) -> bytes:
    """One JSON row of KV_SCHEMA: id=i, value=value (default 10*i), name=f"n{i}"."""
    return json.dumps(
        {"id": i, "value": 10 * i if value is None else value, "name": f"n{i}"}
    ).encode()


async def lsm_rows(writer: la.AsyncShardWriter) -> list[dict[str, Any]]:
    """Every row visible through the writer's LSM view (memtable included), by id."""
    table = await writer.lsm.scan().to_table()
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def expected_rows(ids: range | list[int]) -> list[dict[str, Any]]:
    return [{"id": i, "value": 10 * i, "name": f"n{i}"} for i in ids]


class Recording:
    """Passes a feed through, keeping the offsets of every message it handed out."""

    def __init__(self, feed: Any) -> None:
        self.feed = feed
        self.offsets: list[Any] = []

    @property
    def exhausted(self) -> bool:
        return bool(self.feed.exhausted)

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        out: list[Message] = await self.feed.fetch(max_messages, timeout)
        self.offsets.extend(m.offset for m in out)
        return out

    async def aclose(self) -> None:
        await self.feed.aclose()


class Crashed(Exception):
    """Marks the simulated crash."""


class CrashBeforeAck:
    """Wraps a feed; the process "dies" between a durable write and its ack.

    The first ``allow`` acknowledgements go through. The next one -- made by
    :func:`ingest` only after the writer's ack resolved, so its rows are
    durable -- cancels ``scope`` instead of acknowledging: that message and
    everything after it stay unacknowledged, as in a crash.
    """

    def __init__(self, feed: Any, allow: int, scope: anyio.CancelScope) -> None:
        self.feed = feed
        self.allow = allow
        self.scope = scope
        self.acked: list[Any] = []
        self.crashed_at: Any = None

    @property
    def exhausted(self) -> bool:
        return bool(self.feed.exhausted)

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        messages = await self.feed.fetch(max_messages, timeout)
        return [self._wrap(m) for m in messages]

    def _wrap(self, inner: Message) -> Message:
        async def ack() -> None:
            if self.crashed_at is not None or len(self.acked) >= self.allow:
                if self.crashed_at is None:
                    self.crashed_at = inner.offset
                self.scope.cancel()
                await anyio.lowlevel.checkpoint()
                raise Crashed  # not reached: the checkpoint delivers the cancellation
            await inner.ack()
            self.acked.append(inner.offset)

        return Message(inner.offset, inner.payload, inner.headers, _ack=ack)

    async def aclose(self) -> None:
        await self.feed.aclose()


def entry_id(reply: bytes | str) -> str:
    """A Redis stream entry id (an ``XADD`` reply) as text.

    redis-py types replies ``bytes | str`` whatever ``decode_responses`` says;
    the tests' clients keep the default, bytes (a str fails here, as its
    ``.decode()`` would)."""
    assert isinstance(reply, bytes), reply
    return reply.decode()


#: redis-py's type of an ``XRANGE`` reply
XRangeReply = list[tuple[bytes | str | None, dict[bytes | str, bytes | str] | None]] | None


def stream_entries(reply: XRangeReply) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """An ``XRANGE`` reply of a client that keeps bytes: (entry id, fields) of each entry."""
    assert reply is not None
    out: list[tuple[bytes, dict[bytes, bytes]]] = []
    for raw_id, raw_fields in reply:
        assert isinstance(raw_id, bytes) and raw_fields is not None, (raw_id, raw_fields)
        fields: dict[bytes, bytes] = {}
        for k, v in raw_fields.items():
            assert isinstance(k, bytes) and isinstance(v, bytes), (k, v)
            fields[k] = v
        out.append((raw_id, fields))
    return out


def batch_of(ids: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"id": i, "value": 10 * i, "name": f"n{i}"} for i in ids], schema=KV_SCHEMA
    )
