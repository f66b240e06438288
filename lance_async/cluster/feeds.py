"""Partitioned feeds and their publishers: one stream (or subject) per partition.

A worker reads the partitions it owns; a producer (or ``lance-async
repartition``) publishes each row to its partition (see ``partitions.py``).

=======================  ==================================  ================================
broker                   partition ``p`` is                  the consumer of ``p``
=======================  ==================================  ================================
Redis Streams            stream ``<key>:<p>``                group ``<group>``, consumer =
                                                             the worker's member name
NATS JetStream           subject ``<subject>.<p>`` of one    durable ``<group>-p<p>``
                         stream
=======================  ==================================  ================================

Taking a partition over (:meth:`PartitionedFeed.open_partition`) resumes at
the last acknowledged message at once, not after a timeout: Redis claims the
previous owner's pending entries (``XAUTOCLAIM``, no idle time: the lease
says this worker owns them now); NATS restarts the partition's durable
consumer at its ack floor (the previous owner's fetched, unacknowledged
messages are delivered again at once, and a stale owner's pull subscription
ends). Kafka partitions are assigned by the consumer group instead (see
``kafka.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from ..feeds.base import Feed

__all__ = [
    "KafkaPublisher",
    "NatsPartitions",
    "NatsPublisher",
    "PartitionedFeed",
    "Publisher",
    "RedisPartitions",
    "RedisPublisher",
]

log = logging.getLogger("lance_async.cluster")


class PartitionedFeed(Protocol):
    """A feed of ``num_partitions`` partitions, one :class:`Feed` each."""

    num_partitions: int

    async def open_partition(self, partition: int, member: str) -> Feed:
        """A feed over ``partition`` for ``member``, resuming at its last
        acknowledged message (the caller holds the partition's lease)."""
        ...

    async def aclose(self) -> None:
        """Close the connection shared by the partitions' feeds."""
        ...


class Publisher(Protocol):
    """Publishes payloads to partitions; each call resolves once the broker
    acknowledged (stored) the payload.

    ``headers`` travel with the payload (Redis: fields of the entry beside
    ``data``; NATS and Kafka: message headers). A worker reads one:
    ``{"lance-op": "delete"}`` (:data:`~lance_async.cluster.worker.DELETE`)
    makes the message's rows deletes by key.
    """

    num_partitions: int

    def publish(
        self, partition: int, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> Awaitable[Any]:
        """Publish ``payload`` to ``partition``; await the result for the broker's ack."""
        ...

    async def aclose(self) -> None:
        """Close the connection."""
        ...


# -- Redis Streams --------------------------------------------------------------------


class RedisPartitions:
    """Partition ``p`` of a Redis feed is the stream ``<key>:<p>``.

    Parameters
    ----------
    client : redis.asyncio.Redis
        Shared by every partition's feed.
    key : str
        The streams' common prefix.
    group : str
        The consumer group (on every partition's stream).
    num_partitions : int
    field : bytes or str or None
        The entry field holding the payload (default ``b"data"``).
    owns_client : bool
        Close ``client`` in :meth:`aclose`.
    """

    def __init__(
        self,
        client: Any,
        key: str,
        group: str,
        num_partitions: int,
        *,
        field: bytes | str | None = b"data",
        owns_client: bool = False,
    ) -> None:
        self._client = client
        self.key = key
        self.group = group
        self.num_partitions = num_partitions
        self._field = field
        self._owns = owns_client

    def stream(self, partition: int) -> str:
        """The stream key of ``partition``."""
        return f"{self.key}:{partition}"

    async def open_partition(self, partition: int, member: str) -> Feed:
        from ..feeds.redis import RedisStreamFeed

        feed = RedisStreamFeed(
            self._client,
            self.stream(partition),
            self.group,
            member,
            field=self._field,
            min_idle_time=0.0,  # the lease says every pending entry is ours now
            claim_interval=None,
        )
        await feed.ensure_group()
        return feed

    async def aclose(self) -> None:
        if self._owns:
            await self._client.aclose()


class RedisPublisher:
    """``XADD`` to partition ``p``'s stream (``<key>:<p>``, field ``data``)."""

    def __init__(
        self, client: Any, key: str, num_partitions: int, *, owns_client: bool = False
    ) -> None:
        self._client = client
        self.key = key
        self.num_partitions = num_partitions
        self._owns = owns_client

    def publish(
        self, partition: int, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> Awaitable[Any]:
        if not 0 <= partition < self.num_partitions:
            raise ValueError(f"partition {partition} is not in 0..{self.num_partitions - 1}")
        fields: dict[str, Any] = {"data": payload, **(headers or {})}
        result: Awaitable[Any] = self._client.xadd(f"{self.key}:{partition}", fields)
        return result

    async def aclose(self) -> None:
        if self._owns:
            await self._client.aclose()


# -- NATS JetStream ---------------------------------------------------------------------


class NatsPartitions:
    """Partition ``p`` of a NATS feed is the subject ``<subject>.<p>`` of one stream.

    Parameters
    ----------
    client : nats.aio.client.Client
        A connected client, shared by every partition's feed.
    stream : str
        The JetStream stream (it must hold subjects ``<subject>.*``; created
        with :meth:`ensure_stream` when missing).
    subject : str
        The subjects' common prefix.
    group : str
        Durable consumer names are ``<group>-p<p>``.
    num_partitions : int
    ack_wait : float
        Seconds a fetched message may stay unacknowledged before JetStream
        delivers it again (default 30).
    owns_client : bool
        Close ``client`` in :meth:`aclose`.
    """

    def __init__(
        self,
        client: Any,
        stream: str,
        subject: str,
        group: str,
        num_partitions: int,
        *,
        ack_wait: float = 30.0,
        owns_client: bool = False,
    ) -> None:
        self._client = client
        self.stream = stream
        self.subject = subject
        self.group = group
        self.num_partitions = num_partitions
        self.ack_wait = ack_wait
        self._owns = owns_client

    def subject_of(self, partition: int) -> str:
        """The subject of ``partition``."""
        return f"{self.subject}.{partition}"

    async def ensure_stream(self) -> None:
        """Create the stream (subjects ``<subject>.*``) when it does not exist."""
        import nats.js.errors

        js = self._client.jetstream()
        try:
            await js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            await js.add_stream(name=self.stream, subjects=[f"{self.subject}.*"])

    async def open_partition(self, partition: int, member: str) -> Feed:
        from ..feeds.nats import JetStreamFeed

        # the durable restarts at its ack floor: what the previous owner
        # fetched and did not acknowledge comes again now, and a stale
        # owner's subscription ends
        return await JetStreamFeed.from_client(
            self._client,
            stream=self.stream,
            subject=self.subject_of(partition),
            durable=f"{self.group}-p{partition}",
            ack_wait=self.ack_wait,
            take_over=True,
        )

    async def aclose(self) -> None:
        if self._owns:
            await self._client.close()


class NatsPublisher:
    """JetStream publish to partition ``p``'s subject (``<subject>.<p>``)."""

    def __init__(
        self, client: Any, subject: str, num_partitions: int, *, owns_client: bool = False
    ) -> None:
        self._client = client
        self._js = client.jetstream()
        self.subject = subject
        self.num_partitions = num_partitions
        self._owns = owns_client

    def publish(
        self, partition: int, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> Awaitable[Any]:
        if not 0 <= partition < self.num_partitions:
            raise ValueError(f"partition {partition} is not in 0..{self.num_partitions - 1}")
        result: Awaitable[Any] = self._js.publish(
            f"{self.subject}.{partition}", payload, headers=dict(headers) if headers else None
        )
        return result

    async def aclose(self) -> None:
        if self._owns:
            await self._client.close()


# -- Kafka -----------------------------------------------------------------------------


class KafkaPublisher:
    """Produce to partition ``p`` of one topic, acknowledged by the broker (librdkafka).

    Parameters
    ----------
    producer : lance_async.feeds.kafkaclient.KafkaProducer
        Made by the caller (``acks=all`` by default).
    topic : str
    num_partitions : int
    owns_producer : bool
        Close ``producer`` in :meth:`aclose`.

    Notes
    -----
    ``publish`` returns an awaitable of ``(partition, offset)``: the record
    is enqueued at the call (records published one after another keep their
    order in the partition) and the awaitable resolves once the broker
    acknowledged it.
    """

    def __init__(
        self, producer: Any, topic: str, num_partitions: int, *, owns_producer: bool = False
    ) -> None:
        self._producer = producer
        self.topic = topic
        self.num_partitions = num_partitions
        self._owns = owns_producer

    def publish(
        self, partition: int, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> Awaitable[Any]:
        if not 0 <= partition < self.num_partitions:
            raise ValueError(f"partition {partition} is not in 0..{self.num_partitions - 1}")
        result: Awaitable[Any] = self._producer.send_and_wait(
            self.topic, payload, partition=partition, headers=headers
        )
        return result

    async def aclose(self) -> None:
        if self._owns:
            await self._producer.aclose()
