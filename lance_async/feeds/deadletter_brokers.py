"""Dead letters kept in a broker: :class:`RedisDeadLetterStream`,
:class:`JetStreamDeadLetters` and :class:`KafkaDeadLetterTopic`.

Each is a :class:`~lance_async.feeds.deadletter.DeadLetterSink`: a bad
message goes to the broker with its raw payload as the body, byte for byte,
and what went wrong beside it, so the dead letters can be read, fixed and
fed again with the tools that read the feed itself (``lance-async ingest``
of the stream or subject, ``XRANGE``, ``nats stream view``,
``kafka-console-consumer``). The layout is Kafka Connect's dead-letter
queue: the record as it came, the error context in headers.

One entry per bad message:

* the body: the message's payload (rows a file feed already decoded go as
  NDJSON);
* the message's own headers (Redis: its other fields), unchanged, so a
  ``lance-op: delete`` is still one when fed again;
* the context, as text headers (Redis: fields): ``dead-letter-offset`` (the
  feed's offset, JSON), ``dead-letter-feed``, ``dead-letter-error``,
  ``dead-letter-error-type``, ``dead-letter-time`` (ISO 8601, UTC).

:meth:`~DeadLetterSink.store` returns once the broker has the entry (Redis:
``XADD`` answered; JetStream: the publish acknowledged by the stream;
Kafka: acknowledged by all in-sync replicas), and only then is the bad
message acknowledged on the feed. Redis keeps it as durably as the server
is configured to (AOF); JetStream and Kafka as their stream or topic is.

The clients are those of the feeds (redis.asyncio, nats-py, and
librdkafka through confluent-kafka: :class:`~lance_async.feeds.kafkaclient.KafkaProducer`),
imported when a sink connects; all three run on asyncio only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import DeadLetterError, InvalidInputError
from .base import Message
from .deadletter import DeadLetterSink

if TYPE_CHECKING:
    import redis.asyncio
    from nats.aio.client import Client as NatsClient

    from .kafkaclient import KafkaProducer

__all__ = [
    "JetStreamDeadLetters",
    "KafkaDeadLetterTopic",
    "RedisDeadLetterStream",
    "dead_letter_body",
    "dead_letter_headers",
]

#: The prefix of the context headers (fields) a dead letter carries.
PREFIX = "dead-letter-"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def dead_letter_body(message: Message) -> bytes:
    """The body of a dead letter: the raw payload, or decoded rows as NDJSON
    (pure; does not block)."""
    payload = message.payload
    if isinstance(payload, pa.RecordBatch):
        return b"".join(
            json.dumps(row, default=str).encode() + b"\n" for row in payload.to_pylist()
        )
    return bytes(payload)


#: Characters of an error's text a dead letter's header keeps (a broker
#: limits a message's headers; the file sink keeps the whole text).
MAX_ERROR_CHARS = 1000


def _context(record: Mapping[str, Any]) -> dict[str, str]:
    """The ``dead-letter-*`` headers of ``record``, as one-line text."""
    out: dict[str, str] = {}
    for key in ("offset", "feed", "error", "error_type", "time"):
        if key in record:
            value = record[key]
            text = value if isinstance(value, str) and key != "offset" else json.dumps(value)
            text = " ".join(text.split())
            if len(text) > MAX_ERROR_CHARS:
                text = text[:MAX_ERROR_CHARS] + "..."
            out[PREFIX + key.replace("_", "-")] = text
    return out


def dead_letter_headers(message: Message, record: Mapping[str, Any]) -> dict[str, str]:
    """The message's own headers and the context of ``record`` (see the module
    notes), as text (pure; does not block). The context's values hold no
    line breaks and at most :data:`MAX_ERROR_CHARS` characters."""
    out = {_text(k): _text(v) for k, v in message.headers.items()}
    out.update(_context(record))
    return out


def _nats_name(name: str) -> str:
    """A header name NATS takes: printable ASCII but ``:``; others %-escaped."""
    if all(33 <= ord(c) <= 126 and c != ":" for c in name) and name:
        return name
    return (
        "".join(
            c if 33 <= ord(c) <= 126 and c not in ":%" else "".join(f"%{b:02X}" for b in c.encode())
            for c in name
        )
        or "%00"
    )


class RedisDeadLetterStream(DeadLetterSink):
    """A dead-letter sink that adds each bad message to a Redis stream (``XADD``).

    Parameters
    ----------
    client : redis.asyncio.Redis
        The client.
    stream : str
        The stream key (created by the first ``XADD``).
    field : str
        The entry field that holds the payload (default ``"data"``, what
        :class:`~lance_async.feeds.RedisStreamFeed` reads).
    max_bad, feed
        See :class:`~lance_async.feeds.deadletter.DeadLetterSink`.
    owns_client : bool
        Close ``client`` in :meth:`aclose` (default False).

    Notes
    -----
    Does not block the loop (redis.asyncio). A stream entry is one flat
    mapping, so the payload field, the message's own fields (their values
    byte for byte) and the context fields share it; a message field named
    like ours is overwritten by the context. Give ``field`` the source's
    payload field, so no field of the message is overwritten by the body.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        stream: str,
        *,
        field: str = "data",
        max_bad: int | None = None,
        feed: str | None = None,
        owns_client: bool = False,
    ) -> None:
        super().__init__(max_bad=max_bad, feed=feed)
        if not stream:
            raise ValueError("stream must be a non-empty key")
        self._client = client
        self.stream = stream
        self.field = field
        self._owns_client = owns_client
        self.where = f"the Redis stream {stream!r}"

    @classmethod
    async def connect(
        cls,
        url: str,
        stream: str,
        *,
        field: str = "data",
        max_bad: int | None = None,
        feed: str | None = None,
    ) -> RedisDeadLetterStream:
        """Connect to Redis at ``url`` and check the key is a stream or free.

        Returns
        -------
        RedisDeadLetterStream
            Owning its client.

        Raises
        ------
        redis.exceptions.ConnectionError
            Redis is not reachable.
        InvalidInputError
            ``stream`` holds something other than a stream.
        """
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url)  # its query (db=, ...) applies
        try:
            kind = _text(await client.type(stream))
            if kind not in ("none", "stream"):
                raise InvalidInputError(
                    f"the dead-letter key {stream!r} holds a Redis {kind}, not a stream: "
                    "name another key"
                )
        except BaseException:
            await client.aclose()
            raise
        return cls(client, stream, field=field, max_bad=max_bad, feed=feed, owns_client=True)

    async def store(self, message: Message, record: dict[str, Any]) -> None:
        """``XADD`` the dead letter; returns once Redis answered.

        Raises
        ------
        redis.exceptions.RedisError
            Redis refused or is not reachable.
        """
        fields: dict[Any, Any] = dict(message.headers)  # as they came, bytes kept
        fields.update(_context(record))
        fields[self.field] = dead_letter_body(message)
        await self._client.xadd(self.stream, fields)

    async def aclose(self) -> None:
        """Close the client if this sink owns it. Idempotent."""
        if self._owns_client:
            self._owns_client = False
            await self._client.aclose()


class JetStreamDeadLetters(DeadLetterSink):
    """A dead-letter sink that publishes each bad message to a NATS JetStream subject.

    Parameters
    ----------
    client : nats.aio.client.Client
        A connected client.
    subject : str
        The subject; a JetStream stream must capture it (see :meth:`connect`).
    max_bad, feed
        See :class:`~lance_async.feeds.deadletter.DeadLetterSink`.
    owns_client : bool
        Close ``client`` in :meth:`aclose` (default False).
    timeout : float
        Seconds a publish waits for the stream's acknowledgement (default 5).

    Notes
    -----
    Does not block the loop (nats-py). The stream acknowledges a publish
    once stored, so a dead letter is as durable as its stream.
    """

    def __init__(
        self,
        client: NatsClient,
        subject: str,
        *,
        max_bad: int | None = None,
        feed: str | None = None,
        owns_client: bool = False,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(max_bad=max_bad, feed=feed)
        if not subject:
            raise ValueError("subject must be non-empty")
        self._client = client
        self._js = client.jetstream(timeout=timeout)
        self.subject = subject
        self.stream: str | None = None
        """The JetStream stream that keeps the dead letters, when
        :meth:`connect` found or made it."""
        self._owns_client = owns_client
        self.where = f"the NATS subject {subject!r}"

    @classmethod
    async def connect(
        cls,
        url: str,
        stream: str,
        subject: str,
        *,
        max_bad: int | None = None,
        feed: str | None = None,
    ) -> JetStreamDeadLetters:
        """Connect to NATS and make sure a stream captures ``subject``.

        A stream that captures ``subject`` already is used as it is;
        otherwise the stream ``stream`` is created on it (file storage).

        Returns
        -------
        JetStreamDeadLetters
            Owning its client.

        Raises
        ------
        nats.errors.NoServersError
            NATS is not reachable.
        InvalidInputError
            ``stream`` exists and does not capture ``subject``.
        """
        import nats
        import nats.js.errors

        async def quiet(_error: Exception) -> None:  # the connect's own error says it
            return None

        nc = await nats.connect(url, connect_timeout=3, max_reconnect_attempts=2, error_cb=quiet)
        try:
            js = nc.jetstream()
            try:
                stream = await js.find_stream_name_by_subject(subject)
            except nats.js.errors.NotFoundError:
                try:
                    await js.add_stream(name=stream, subjects=[subject])
                except nats.js.errors.BadRequestError as exc:
                    raise InvalidInputError(
                        f"the JetStream stream {stream!r} exists and does not capture "
                        f"{subject!r}: add the subject to it, or name another stream ({exc})"
                    ) from None
        except BaseException:
            await nc.close()
            raise
        sink = cls(nc, subject, max_bad=max_bad, feed=feed, owns_client=True)
        sink.stream = stream
        return sink

    async def store(self, message: Message, record: dict[str, Any]) -> None:
        """Publish the dead letter; returns once the stream acknowledged it.

        Raises
        ------
        DeadLetterError
            The dead letter is larger than the server's ``max_payload``
            (not retryable: set such messages aside in a file or a Redis
            stream).
        nats.errors.Error
            No stream answered (``NoRespondersError``), a timeout, or the
            connection closed.
        """
        body = dead_letter_body(message)
        headers = {_nats_name(k): v for k, v in dead_letter_headers(message, record).items()}
        size = len(body) + sum(len(k) + len(v.encode()) + 4 for k, v in headers.items()) + 12
        limit = self._client.max_payload
        if limit and size > limit:
            raise DeadLetterError(
                f"the bad message at offset {message.offset!r} is {size:,} bytes as a dead "
                f"letter, more than the NATS server's max_payload ({limit:,}): it cannot go to "
                f"{self.where}; set bad messages aside in a file or a Redis stream",
                destination=self.where,
                offset=message.offset,
            )
        await self._js.publish(self.subject, body, headers=headers)

    async def aclose(self) -> None:
        """Close the client if this sink owns it (draining nothing). Idempotent."""
        if self._owns_client:
            self._owns_client = False
            await self._client.close()


class KafkaDeadLetterTopic(DeadLetterSink):
    """A dead-letter sink that sends each bad message to a Kafka topic.

    Parameters
    ----------
    producer : lance_async.feeds.kafkaclient.KafkaProducer
        A producer (``acks=all``, its default, for a dead letter that
        survives a broker).
    topic : str
        The topic.
    max_bad, feed
        See :class:`~lance_async.feeds.deadletter.DeadLetterSink`.
    owns_producer : bool
        Stop ``producer`` in :meth:`aclose` (default False).

    Notes
    -----
    Does not block the loop (librdkafka enqueues; a thread serves the
    delivery reports). The records have no key (the topic's partitioner
    spreads them).
    """

    def __init__(
        self,
        producer: KafkaProducer,
        topic: str,
        *,
        max_bad: int | None = None,
        feed: str | None = None,
        owns_producer: bool = False,
    ) -> None:
        super().__init__(max_bad=max_bad, feed=feed)
        if not topic:
            raise ValueError("topic must be non-empty")
        self._producer = producer
        self.topic = topic
        self._owns_producer = owns_producer
        self.where = f"the Kafka topic {topic!r}"

    @classmethod
    async def connect(
        cls,
        bootstrap_servers: str,
        topic: str,
        *,
        max_bad: int | None = None,
        feed: str | None = None,
    ) -> KafkaDeadLetterTopic:
        """Make a producer (``acks=all``) for ``bootstrap_servers``.

        Returns
        -------
        KafkaDeadLetterTopic
            Owning its producer. Does not wait for a broker: librdkafka
            connects in the background, and a dead letter waits for one
            (up to ``message.timeout.ms``, 300 s by default).
        """
        from .kafkaclient import KafkaProducer

        producer = KafkaProducer({"bootstrap.servers": bootstrap_servers})
        return cls(producer, topic, max_bad=max_bad, feed=feed, owns_producer=True)

    async def store(self, message: Message, record: dict[str, Any]) -> None:
        """Send the dead letter; returns once the brokers acknowledged it.

        Raises
        ------
        confluent_kafka.KafkaException
            The record was not delivered.
        """
        headers = dead_letter_headers(message, record)
        await self._producer.send_and_wait(self.topic, dead_letter_body(message), headers=headers)

    async def aclose(self) -> None:
        """Close the producer if this sink owns it (what is queued is delivered). Idempotent."""
        if self._owns_producer:
            self._owns_producer = False
            await self._producer.aclose()
