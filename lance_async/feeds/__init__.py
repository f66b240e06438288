"""Feeds: Kafka-like message sources streamed into the MemWAL by :func:`ingest`.

Connectors (each imported lazily, from its optional package):

* :mod:`lance_async.feeds.nats` -- NATS JetStream pull consumer (nats-py)
* :mod:`lance_async.feeds.redis` -- Redis Streams consumer group (redis.asyncio)
* :mod:`lance_async.feeds.kafka` -- Kafka consumer (aiokafka)
* :mod:`lance_async.feeds.files` -- NDJSON / CSV / Arrow IPC files (aiofiles)
"""

from .base import DeadLetter, Feed, IngestStats, IterableFeed, Message, decode_json, ingest

__all__ = ["DeadLetter", "Feed", "IngestStats", "IterableFeed", "Message", "decode_json", "ingest"]
