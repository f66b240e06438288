"""Feeds: Kafka-like message sources streamed into the MemWAL by :func:`ingest`.

:func:`ingest` pulls micro-batches from a :class:`Feed`, writes their rows
through a MemWAL writer and acknowledges each message only once its rows
are durable, in feed order (see :mod:`lance_async.feeds.base`).

Connectors (the broker ones imported lazily, from their optional packages --
``pip install lance-async[feeds]``):

* :class:`FileFeed` (:mod:`lance_async.feeds.files`) -- NDJSON / CSV / Arrow
  IPC files read in chunks (aiofiles on asyncio, anyio on trio), optionally
  followed as they grow, resumable from a stored byte offset;
* :class:`DeadLetterFile` (:mod:`lance_async.feeds.deadletter`) -- a
  dead-letter hook that records bad messages as NDJSON, up to a limit; its
  base :class:`DeadLetterSink`, and the sinks that keep bad messages in a
  broker instead (:mod:`lance_async.feeds.deadletter_brokers`):
  :class:`RedisDeadLetterStream`, :class:`JetStreamDeadLetters`,
  :class:`KafkaDeadLetterTopic`;
* :class:`PipeFeed` (:mod:`lance_async.feeds.pipe`) -- a pipe that stays
  open (standard input): rows handed out as they arrive;
* :class:`JetStreamFeed` (:mod:`lance_async.feeds.nats`) -- a NATS JetStream
  durable pull consumer with explicit acks (nats-py; asyncio only);
* :class:`RedisStreamFeed` (:mod:`lance_async.feeds.redis`) -- a Redis
  Streams consumer group, re-reading its own pending entries and claiming
  those of dead consumers (redis.asyncio; asyncio only);
* :class:`KafkaFeed` (:mod:`lance_async.feeds.kafka`) -- a librdkafka
  consumer group member (confluent-kafka's ``AIOConsumer``, cooperative
  rebalancing) whose offsets are committed per partition after durable
  writes; :class:`KafkaProducer` (:mod:`lance_async.feeds.kafkaclient`),
  records with awaitable delivery reports (asyncio only).

``from lance_async.feeds import JetStreamFeed`` imports nats-py at that
moment, not before; a missing package raises ``ImportError`` naming the
extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import DeadLetter, Feed, IngestStats, IterableFeed, Message, decode_json, ingest
from .broker import FeedState
from .deadletter import DeadLetterFile, DeadLetterSink
from .deadletter_brokers import JetStreamDeadLetters, KafkaDeadLetterTopic, RedisDeadLetterStream
from .files import FileFeed
from .pipe import PipeFeed

if TYPE_CHECKING:
    from .kafka import KafkaFeed as KafkaFeed
    from .kafka import KafkaOffset as KafkaOffset
    from .kafkaclient import KafkaProducer as KafkaProducer
    from .nats import JetStreamFeed as JetStreamFeed
    from .redis import RedisStreamFeed as RedisStreamFeed

__all__ = [
    "DeadLetter",
    "DeadLetterFile",
    "DeadLetterSink",
    "Feed",
    "FeedState",
    "FileFeed",
    "IngestStats",
    "IterableFeed",
    "JetStreamDeadLetters",
    "KafkaDeadLetterTopic",
    "Message",
    "PipeFeed",
    "RedisDeadLetterStream",
    "decode_json",
    "ingest",
]

# name -> (module, the pip package it needs)
_LAZY = {
    "JetStreamFeed": (".nats", "nats-py"),
    "RedisStreamFeed": (".redis", "redis"),
    "KafkaFeed": (".kafka", "confluent-kafka"),
    "KafkaOffset": (".kafka", "confluent-kafka"),
    "KafkaProducer": (".kafkaclient", "confluent-kafka"),
}


def __getattr__(name: str) -> Any:
    """Import a broker connector on first access (PEP 562)."""
    try:
        module_name, package = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    try:
        module = importlib.import_module(module_name, __name__)
    except ImportError as exc:
        raise ImportError(
            f"lance_async.feeds.{name} needs the {package!r} package: "
            f"pip install 'lance-async[feeds]' ({exc})"
        ) from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
