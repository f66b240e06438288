"""Dead letters kept in a broker: a Redis stream, a JetStream subject, a Kafka topic.

Each sink is driven by :func:`ingest` from a real feed (or called as the
hook with a real message, for Kafka) and read back from the real broker:
the raw payload as the body, the feed's own headers kept, the error beside
it; the bad message acknowledged on its feed, the good ones around it
written.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from pathlib import Path

import anyio
import nats
import pytest
import redis.asyncio

import lance_async as la
from lance_async.feeds import (
    JetStreamDeadLetters,
    JetStreamFeed,
    KafkaDeadLetterTopic,
    KafkaFeed,
    Message,
    RedisDeadLetterStream,
    RedisStreamFeed,
    ingest,
)

from ..conftest import broker_or_skip
from ..services import create_topic, unique_name
from .support import (
    entry_id,
    expected_rows,
    lsm_rows,
    mem_wal_table,
    new_shard,
    row_json,
    stream_entries,
)

pytestmark = pytest.mark.broker

REDIS = "redis://127.0.0.1:6379"
NATS = "nats://127.0.0.1:4222"
BAD = b'{"id": 7, "nme": "x"}'


@pytest.mark.asyncio
async def test_a_redis_dead_letter_keeps_the_raw_message_and_its_fields(tmp_path: Path) -> None:
    broker_or_skip("Redis", 6379)
    client = redis.asyncio.Redis.from_url(REDIS)
    source, aside = f"la:dl:{uuid.uuid4().hex}", f"la:dl:{uuid.uuid4().hex}:dead"
    try:
        ids = [
            entry_id(await client.xadd(source, {"data": p, "tenant": b"t1"}))
            for p in (row_json(1), BAD, row_json(3))
        ]
        ds = await mem_wal_table(tmp_path)
        async with (
            ds.mem_wal_writer(new_shard()) as writer,
            await RedisStreamFeed.connect(REDIS, stream=source, group="g") as feed,
            await RedisDeadLetterStream.connect(
                REDIS, aside, max_bad=5, feed=f"{REDIS}/{source}"
            ) as sink,
        ):
            stats = await ingest(
                feed, writer, dead_letter=sink, fetch_timeout=0.2, idle_timeout=0.5
            )
            assert (stats.messages, stats.dead_letters, stats.rows) == (3, 1, 2)
            assert await lsm_rows(writer) == expected_rows([1, 3])
        assert sink.count == 1
        ((_, fields),) = stream_entries(await client.xrange(aside))
        got = {k.decode(): v for k, v in fields.items()}
        assert got["data"] == BAD  # byte for byte
        assert got["tenant"] == b"t1"  # the entry's own fields kept
        assert json.loads(got["dead-letter-offset"]) == ids[1]
        assert b"nme" in got["dead-letter-error"]
        assert got["dead-letter-error-type"] == b"DecodeError"
        assert got["dead-letter-feed"] == f"{REDIS}/{source}".encode()
        assert (await client.xpending(source, "g"))["pending"] == 0
    finally:
        await client.delete(source, aside)
        await client.aclose()


@pytest.mark.asyncio
async def test_a_redis_key_that_is_not_a_stream_is_refused_before_anything() -> None:
    broker_or_skip("Redis", 6379)
    client = redis.asyncio.Redis.from_url(REDIS)
    key = f"la:dl:{uuid.uuid4().hex}"
    try:
        await client.set(key, b"x")
        with pytest.raises(la.InvalidInputError, match="holds a Redis string"):
            await RedisDeadLetterStream.connect(REDIS, key)
    finally:
        await client.delete(key)
        await client.aclose()


@pytest.mark.asyncio
async def test_a_jetstream_dead_letter_is_published_to_a_stream_it_creates(
    tmp_path: Path,
) -> None:
    broker_or_skip("NATS", 4222)
    name = f"LADL{uuid.uuid4().hex[:10]}"
    dead = f"{name}DEAD"
    nc = await nats.connect(NATS)
    js = nc.jetstream()
    try:
        await js.add_stream(name=name, subjects=[f"{name}.rows"])
        for payload in (row_json(1), BAD, row_json(3)):
            await js.publish(f"{name}.rows", payload, headers={"tenant": "t1"})
        ds = await mem_wal_table(tmp_path)
        async with (
            ds.mem_wal_writer(new_shard()) as writer,
            await JetStreamFeed.connect(
                NATS, stream=name, subject=f"{name}.rows", durable="d", ack_wait=5.0
            ) as feed,
            await JetStreamDeadLetters.connect(NATS, dead, f"{dead}.letters", max_bad=1) as sink,
        ):
            stats = await ingest(
                feed, writer, dead_letter=sink, fetch_timeout=0.2, idle_timeout=0.5
            )
            assert (stats.messages, stats.dead_letters, stats.rows) == (3, 1, 2)
            assert await lsm_rows(writer) == expected_rows([1, 3])
        stored = await js.get_msg(dead, 1)
        assert stored.data == BAD and stored.headers is not None
        assert stored.headers["tenant"] == "t1"
        assert json.loads(stored.headers["dead-letter-offset"]) == 2  # its stream sequence
        assert "nme" in stored.headers["dead-letter-error"]
        consumer = await js.consumer_info(name, "d")
        assert (consumer.num_ack_pending, consumer.num_pending) == (0, 0)
    finally:
        for stream in (name, dead):
            try:
                await js.delete_stream(stream)
            except nats.js.errors.NotFoundError:
                pass
        await nc.close()


@pytest.mark.asyncio
async def test_a_jetstream_stream_that_does_not_capture_the_subject_is_refused() -> None:
    broker_or_skip("NATS", 4222)
    name = f"LADL{uuid.uuid4().hex[:10]}"
    nc = await nats.connect(NATS)
    js = nc.jetstream()
    try:
        await js.add_stream(name=name, subjects=[f"{name}.other"])
        with pytest.raises(la.InvalidInputError, match="does not capture"):
            await JetStreamDeadLetters.connect(NATS, name, f"{name}.letters")
    finally:
        await js.delete_stream(name)
        await nc.close()


@pytest.mark.asyncio
async def test_a_kafka_dead_letter_is_acknowledged_by_the_brokers(kafka_bootstrap: str) -> None:
    topic = f"la-dl-{uuid.uuid4().hex[:10]}"
    await create_topic(kafka_bootstrap, topic)
    message = Message((2, 41), b"\xff not json", {"tenant": b"t1"})
    async with await KafkaDeadLetterTopic.connect(
        kafka_bootstrap, topic, max_bad=1, feed="kafka://broker/orders"
    ) as sink:
        await sink(message, la.DecodeError("line 1: not JSON", offset=(2, 41)))
        with pytest.raises(la.DecodeError, match="the Kafka topic"):  # past max_bad
            await sink(message, la.DecodeError("again", offset=(2, 42)))
    feed = await KafkaFeed.connect(kafka_bootstrap, [topic], unique_name("g"))
    async with feed:
        with anyio.fail_after(60):  # only tells an answer from a hang
            records: list[Message] = []
            while not records:
                records = await feed.fetch(10, 0.2)
    (record,) = records
    headers = {k: v.decode() for k, v in record.headers.items()}
    assert record.payload == b"\xff not json"
    assert headers["tenant"] == "t1"
    assert json.loads(headers["dead-letter-offset"]) == [2, 41]
    assert headers["dead-letter-feed"] == "kafka://broker/orders"
    assert headers["dead-letter-error"] == "line 1: not JSON"


@pytest.mark.asyncio
async def test_a_dead_letter_too_large_for_nats_is_refused_by_name_and_never_acked() -> None:
    broker_or_skip("NATS", 4222)
    name = f"LADL{uuid.uuid4().hex[:10]}"
    client = await nats.connect(NATS)  # the test's own look at the server and the stream
    js = client.jetstream()
    try:
        async with await JetStreamDeadLetters.connect(NATS, name, f"{name}.letters") as sink:
            huge = Message(9, b"x" * (client.max_payload + 1))
            with pytest.raises(la.DeadLetterError, match="max_payload") as info:
                await sink(huge, la.DecodeError("bad", offset=9))
            assert not info.value.retryable and info.value.offset == 9
            assert sink.count == 0
            # a header name NATS would refuse is escaped, its value kept
            odd = Message(10, b"{", {"odd name": b"v", "k:1": "w"})
            await sink(odd, la.DecodeError("bad", offset=10))
        stored = await js.get_msg(name, 1)
        assert stored.headers is not None
        assert (stored.headers["odd%20name"], stored.headers["k%3A1"]) == ("v", "w")
    finally:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(name)
        await client.close()


@pytest.mark.asyncio
async def test_a_redis_dead_letter_keeps_binary_fields_and_names_its_failures() -> None:
    broker_or_skip("Redis", 6379)
    client = redis.asyncio.Redis.from_url(REDIS)
    key = f"la:dl:{uuid.uuid4().hex}"
    try:
        sink = await RedisDeadLetterStream.connect(REDIS, key, field="payload", max_bad=5)
        async with sink:
            message = Message("1-1", b"\xff\x00", {"data": b"meta", "sig": b"\xff\x00\x80"})
            await sink(message, la.DecodeError("bad", offset="1-1"))
            ((_, fields),) = stream_entries(await client.xrange(key))
            assert fields[b"payload"] == b"\xff\x00"  # the body under the source's field
            assert (fields[b"data"], fields[b"sig"]) == (b"meta", b"\xff\x00\x80")
            await client.delete(key)
            await client.set(key, b"not a stream any more")
            with pytest.raises(la.DeadLetterError, match="could not be set aside") as info:
                await sink(message, la.DecodeError("bad", offset="1-2"))
            assert key in info.value.destination and sink.count == 1
    finally:
        await client.delete(key)
        await client.aclose()


def test_dead_letter_destinations_that_cannot_work_are_refused_before_any_io(
    tmp_path: Path,
) -> None:
    import anyio
    import typer

    from lance_async.cli.deadletters import check_dead_letter, open_dead_letter

    for bad, said in [
        ("redis://[::1/x", "Invalid IPv6 URL"),
        ("redis://127.0.0.1:99999/x", "out of range"),
        ("nats://127.0.0.1:4222/S/a.*", "without wildcards"),
        ("redis://user:secretpw@127.0.0.1:6379/a/b", "***"),
        (str(tmp_path), "cannot append"),
        (str(tmp_path / "missing" / "x.ndjson"), "cannot append"),
    ]:
        with pytest.raises(typer.BadParameter, match=re.escape(said)) as info:
            check_dead_letter(bad)
        assert "secretpw" not in str(info.value)
    source = "redis://127.0.0.1:6379/orders?group=g"
    for loop in ("redis://127.0.0.1:6379/orders", "redis://localhost:6379/orders:3"):
        if "localhost" in loop:
            source = "redis://localhost:6379/orders"
        with pytest.raises(typer.BadParameter, match="come back"):
            anyio.run(open_dead_letter, loop, 1, source)
