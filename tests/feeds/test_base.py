"""ingest(): acks in feed order after durable writes, dead letters, failures, cancellation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import lance_async as la
import lance_async.feeds as feeds
from lance_async import Ack
from lance_async.feeds import IterableFeed, Message, ingest

from ..helpers import KV_SCHEMA, Ticker
from .support import (
    batch_of,
    expected_rows,
    lsm_rows,
    mem_wal_table,
    new_shard,
    row_json,
)

pytestmark = pytest.mark.anyio


class CheckingFeed:
    """An IterableFeed whose acks first check that the message's row is readable."""

    def __init__(self, payloads: list[bytes], writer: la.AsyncShardWriter) -> None:
        self.inner = IterableFeed(payloads)
        self.writer = writer
        self.acked: list[int] = []
        self.unreadable_at_ack: list[int] = []

    @property
    def exhausted(self) -> bool:
        return self.inner.exhausted

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        out = []
        for m in await self.inner.fetch(max_messages, timeout):

            async def ack(m: Message = m) -> None:
                found = await self.writer.lsm.point_lookup(m.offset)
                if found.num_rows != 1:
                    self.unreadable_at_ack.append(m.offset)
                await m.ack()
                self.acked.append(m.offset)

            out.append(Message(m.offset, m.payload, _ack=ack))
        return out

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_acks_come_in_feed_order_after_rows_are_written(tmp_path: Path) -> None:
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer:
        feed = CheckingFeed([row_json(i) for i in range(20)], writer)
        stats = await ingest(feed, writer, max_batch=3)
        assert feed.acked == list(range(20))
        assert feed.unreadable_at_ack == []
        assert (stats.messages, stats.rows, stats.sends) == (20, 20, 7)
        assert await lsm_rows(writer) == expected_rows(range(20))


async def test_per_message_feed_objects_ride_the_cheap_path(tmp_path: Path) -> None:
    ds = await mem_wal_table(tmp_path)
    committed: list[int] = []
    # 2,000 messages of one decoded row each (a file feed's shape) and 500 JSON ones
    payloads: list[Any] = [batch_of([i]) for i in range(2_000)]
    payloads += [row_json(i) for i in range(2_000, 2_500)]
    feed = IterableFeed(payloads, on_ack=committed.append)
    async with ds.mem_wal_writer(new_shard()) as writer:
        stats = await ingest(feed, writer, max_batch=500)
        wstats = writer.stats()
        rows = await lsm_rows(writer)
    assert (stats.messages, stats.rows, stats.sends) == (2_500, 2_500, 5)
    # each micro-batch of 500 messages reached the writer as one queue entry
    assert wstats.entries == 5
    assert wstats.rows == 2_500
    assert feed.committed == 2_499 and committed == sorted(committed)
    assert rows == expected_rows(range(2_500))


def test_decode_json_takes_decoded_and_json_payloads_together() -> None:
    messages = [Message(i, batch_of([i])) for i in range(300)]
    messages.append(Message(300, row_json(300)))
    table = feeds.decode_json(messages, KV_SCHEMA)
    assert table.schema.equals(KV_SCHEMA)
    assert table.to_pylist() == expected_rows(range(301))


def test_decode_json_keeps_message_order_across_kinds() -> None:
    """A key sent as JSON, then decoded, then JSON again: the rows come in
    that order, so the last message's value is the one the table keeps."""
    kinds = [row_json(7, 1), batch_of([7]), row_json(7, 3), row_json(8), batch_of([9])]
    table = feeds.decode_json([Message(i, p) for i, p in enumerate(kinds)], KV_SCHEMA)
    assert [(r["id"], r["value"]) for r in table.to_pylist()] == [
        (7, 1),
        (7, 70),
        (7, 3),
        (8, 80),
        (9, 90),
    ]


@pytest.mark.parametrize("max_batch", [1, 10])
@pytest.mark.parametrize("async_hook", [False, True])
async def test_dead_letters_get_the_offset_and_are_acked_in_order(
    tmp_path: Path, max_batch: int, async_hook: bool
) -> None:
    payloads = [
        row_json(0),
        row_json(1),
        b'{"id": 2, "value": ',  # malformed JSON
        row_json(3),
        b'{"id": 4, "colour": "red"}',  # a field the table does not have
        row_json(5),
    ]
    acked: list[int] = []
    letters: list[tuple[Any, BaseException]] = []

    def sync_hook(message: Message, error: BaseException) -> None:
        # acks of earlier messages may still be waiting for their writes here
        letters.append((message.offset, error))

    async def async_hook_fn(message: Message, error: BaseException) -> None:
        await anyio.lowlevel.checkpoint()
        letters.append((message.offset, error))

    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer:
        feed = IterableFeed(payloads, on_ack=acked.append)
        stats = await ingest(
            feed,
            writer,
            max_batch=max_batch,
            dead_letter=async_hook_fn if async_hook else sync_hook,
        )
        assert acked == [0, 1, 2, 3, 4, 5]
        assert [offset for offset, _ in letters] == [2, 4]
        assert all(isinstance(e, la.DecodeError) for _, e in letters)
        assert (stats.messages, stats.dead_letters, stats.rows) == (6, 2, 4)
        assert await lsm_rows(writer) == expected_rows([0, 1, 3, 5])


@pytest.mark.parametrize("max_batch", [1, 4])
async def test_without_a_hook_a_bad_message_raises_decode_error_naming_its_offset(
    tmp_path: Path, max_batch: int
) -> None:
    payloads = [row_json(0), row_json(1), b"not json", row_json(3)]
    acked: list[int] = []
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer:
        with pytest.raises(la.DecodeError) as info:
            await ingest(IterableFeed(payloads, on_ack=acked.append), writer, max_batch=max_batch)
    assert info.value.offset == 2
    assert "offset 2" in str(info.value)
    # nothing at or after the bad message is acknowledged; before it, a prefix at most
    assert acked == [0, 1][: len(acked)]


@pytest.mark.parametrize("bad", [b"null", b"  null ", b"3", b'"x"', b"[1]", b"true"])
@pytest.mark.parametrize("max_batch", [1, 3])
async def test_regression_a_json_message_that_is_not_an_object_is_dead_lettered(
    tmp_path: Path, bad: bytes, max_batch: int
) -> None:
    # a message that was just `null` crashed the process (pyarrow SIGSEGV)
    letters: list[tuple[Any, BaseException]] = []
    acked: list[int] = []
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer:
        feed = IterableFeed([row_json(1), bad, row_json(2)], on_ack=acked.append)
        stats = await ingest(
            feed,
            writer,
            max_batch=max_batch,
            dead_letter=lambda m, e: letters.append((m.offset, e)),
        )
        assert [offset for offset, _ in letters] == [1]
        assert isinstance(letters[0][1], la.DecodeError)
        assert "expected a JSON object" in str(letters[0][1])
        assert acked == [0, 1, 2]
        assert (stats.messages, stats.dead_letters, stats.rows) == (3, 1, 2)
        assert await lsm_rows(writer) == expected_rows([1, 2])


async def test_regression_isolating_bad_messages_keeps_the_loop_free(tmp_path: Path) -> None:
    # a micro-batch that failed to decode was retried message by message on the
    # event loop (about 0.7 s for 1,000 messages)
    payloads = [row_json(i) for i in range(2_000)]
    payloads[700] = b'{"id": "not a number"}'
    payloads[1_500] = b"null"
    letters: list[Any] = []
    ds = await mem_wal_table(tmp_path)
    ticker = Ticker()
    async with ds.mem_wal_writer(new_shard()) as writer, anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        stats = await ingest(
            IterableFeed(payloads),
            writer,
            max_batch=2_000,
            dead_letter=lambda m, e: letters.append(m.offset),
        )
        ticker.running = False
    assert letters == [700, 1_500]
    assert (stats.messages, stats.rows) == (2_000, 1_998)
    assert len(ticker.lags) > 10
    ticker.assert_free()
    ticker.assert_off_loop()


class FailingWriter:
    """Fault injection: the real writer, except that send number ``fail_at``
    returns an Ack that fails (after ``delay`` seconds) with WriterFailedError
    -- a failed WAL flush, which the real engine cannot be made to show."""

    def __init__(self, writer: la.AsyncShardWriter, fail_at: int, delay: float, tg: Any) -> None:
        self.writer = writer
        self.schema = writer.schema
        self.fail_at = fail_at
        self.delay = delay
        self.tg = tg
        self.sends = 0

    async def send(self, data: Any, *, timeout: float | None = None) -> Ack:
        self.sends += 1
        if self.sends != self.fail_at:
            return await self.writer.send(data, timeout=timeout)
        ack = Ack()
        ack.add_part()
        ack.seal()

        async def fail_later() -> None:
            await anyio.sleep(self.delay)
            ack.part_failed(la.WriterFailedError("injected: the WAL flush failed"))

        self.tg.start_soon(fail_later)
        return ack


async def test_a_failed_write_leaves_it_and_everything_after_unacked(tmp_path: Path) -> None:
    acked: list[int] = []
    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer, anyio.create_task_group() as tg:
        failing = FailingWriter(writer, fail_at=3, delay=0.5, tg=tg)
        feed = IterableFeed([row_json(i) for i in range(10)], on_ack=acked.append)
        with pytest.raises(la.WriterFailedError):
            await ingest(feed, failing, max_batch=2)
        # micro-batches 1-2 acked; the failed 3rd (messages 4, 5) and all after it are not
        assert acked == [0, 1, 2, 3]
        # ... although the later micro-batches' rows were written meanwhile
        assert failing.sends == 5
        assert [r["id"] for r in await lsm_rows(writer)] == [0, 1, 2, 3, 6, 7, 8, 9]


async def test_cancellation_acknowledges_nothing_afterwards(tmp_path: Path) -> None:
    acked: list[int] = []
    enough = anyio.Event()

    async def endless() -> Any:
        i = 0
        while True:
            yield row_json(i)
            i += 1
            await anyio.sleep(0.002)

    def on_ack(offset: int) -> None:
        acked.append(offset)
        if len(acked) >= 10:
            enough.set()

    ds = await mem_wal_table(tmp_path)
    async with ds.mem_wal_writer(new_shard()) as writer:
        feed = IterableFeed(endless(), on_ack=on_ack)
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_when_enough() -> None:
                    await enough.wait()
                    scope.cancel()

                tg.start_soon(cancel_when_enough)
                await ingest(feed, writer, max_batch=4, fetch_timeout=0.05)
        assert scope.cancelled_caught
        at_cancel = list(acked)
        await writer.flush()  # every queued write completes...
        await anyio.sleep(0.2)
        assert acked == at_cancel  # ...and still nothing more is acknowledged
        assert at_cancel == list(range(len(at_cancel)))
        written = {r["id"] for r in await lsm_rows(writer)}
        assert set(at_cancel) <= written
        await feed.aclose()


def test_broker_connectors_are_imported_lazily() -> None:
    code = (
        "import sys, lance_async.feeds as f\n"
        "assert not {'nats', 'redis', 'confluent_kafka'} & set(sys.modules), sorted(sys.modules)\n"
        "assert {'JetStreamFeed', 'RedisStreamFeed', 'KafkaFeed'} <= set(dir(f))\n"
        "f.KafkaFeed\n"
        "assert 'confluent_kafka' in sys.modules and 'nats' not in sys.modules\n"
        "from lance_async.feeds import JetStreamFeed, RedisStreamFeed\n"
        "from lance_async.feeds.nats import JetStreamFeed as J\n"
        "assert JetStreamFeed is J\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with pytest.raises(AttributeError):
        feeds.NoSuchFeed  # noqa: B018


def test_a_delete_message_decodes_to_keys_or_is_a_bad_message_without_a_key() -> None:
    from lance_async.feeds.ops import OP_COLUMN, decode_ops

    from ..helpers import KV_SCHEMA

    put = feeds.Message(0, b'{"id": 1, "value": 10, "name": "a"}')
    gone = feeds.Message(1, b'{"id": 1}', {"lance-op": b"delete"})
    table = decode_ops([put, gone], KV_SCHEMA, ["id"])
    assert table.column(OP_COLUMN).to_pylist() == [False, True]
    assert table.column("id").to_pylist() == [1, 1]
    assert decode_ops([put], KV_SCHEMA, ["id"]).column_names == KV_SCHEMA.names  # no op column
    with pytest.raises(la.DecodeError, match="without a primary key"):
        decode_ops([put, gone], KV_SCHEMA, [])
