"""The Kafka client the feed, the workers, the dead letters and the publisher share:
librdkafka through confluent-kafka.

* :func:`consumer_config` -- a consumer group member's settings:
  ``cooperative-sticky`` assignment by default (KIP-429: a member joining
  or leaving moves only the partitions that change hands; the others keep
  being consumed), or the KIP-848 consumer protocol (``protocol="consumer"``)
  where the broker speaks it; offsets committed by lance_async only, never
  automatically; a new group starting from the earliest record.
* :func:`setting_name` -- URL query keys (``session_timeout_ms``) as
  librdkafka's names (``session.timeout.ms``).
* :class:`KafkaProducer` -- produce with one awaitable delivery report per
  record (``acks=all`` by default), headers included.

Why not ``confluent_kafka.aio.AIOProducer``: in 2.16 its ``produce`` refuses
headers (``NotImplementedError``: its batch mode cannot carry them), and the
``lance-op: delete`` header and the dead letters' context headers are part of
what lance_async sends. :class:`KafkaProducer` is the plain
``confluent_kafka.Producer`` (``produce`` only enqueues, in C, without
blocking), with one thread that serves delivery reports (``poll``) and hands
each to the event loop (``call_soon_threadsafe``). The consumer side is
confluent-kafka's own asyncio consumer, ``confluent_kafka.aio.AIOConsumer``.

librdkafka reconnects to a broker that went away by itself, with a backoff
(``reconnect.backoff.ms`` up to ``reconnect.backoff.max.ms``); nothing here
reconnects. Requires the ``feeds`` extra (``confluent-kafka``); asyncio only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import confluent_kafka

from .broker import require_asyncio

__all__ = [
    "PROTOCOLS",
    "BrokerWatch",
    "KafkaProducer",
    "consumer_config",
    "setting_name",
]

log = logging.getLogger("lance_async.feeds")

#: The group protocols :func:`consumer_config` takes: ``classic`` (JoinGroup /
#: SyncGroup, with the client-side ``cooperative-sticky`` assignor) and
#: ``consumer`` (KIP-848: the broker assigns, incrementally; Kafka 4.0+).
PROTOCOLS = ("classic", "consumer")

#: URL query keys that are not librdkafka's name with ``_`` for ``.``: the
#: rebalance timeout of a JoinGroup is librdkafka's ``max.poll.interval.ms``.
ALIASES = {"rebalance_timeout_ms": "max.poll.interval.ms"}

#: Settings the KIP-848 protocol takes from the broker, which librdkafka
#: refuses beside ``group.protocol=consumer``.
CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")

#: librdkafka's longest wait between two connection attempts to a broker
#: (its default is 10 s): a restarted broker is found again within a second.
RECONNECT_MAX_MS = 1000

#: Settings lance_async owns: offsets are committed only after rows are
#: durable, so nothing may commit or store them behind its back.
OWNED = {"enable.auto.commit": False, "enable.auto.offset.store": False}


def setting_name(key: str) -> str:
    """librdkafka's name of a setting given as ``a_b_c`` or ``a.b.c`` (pure).

    ``rebalance_timeout_ms`` (aiokafka's name) is ``max.poll.interval.ms``:
    what a JoinGroup sends as the rebalance timeout.
    """
    return ALIASES.get(key, key.replace("_", "."))


def consumer_config(
    bootstrap_servers: str,
    group_id: str,
    *,
    client_id: str | None = None,
    protocol: str = "classic",
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A consumer group member's librdkafka settings (pure; does not block).

    Parameters
    ----------
    bootstrap_servers : str
        ``host:port[,host:port...]``.
    group_id : str
        The consumer group.
    client_id : str, optional
        Shown in the broker's logs (a worker's member name).
    protocol : {"classic", "consumer"}
        ``classic`` (default): JoinGroup/SyncGroup with the
        ``cooperative-sticky`` assignor (KIP-429, client side: any broker);
        ``consumer``: KIP-848, where the broker assigns (it must support it).
    options : mapping, optional
        More librdkafka settings (``session.timeout.ms``, ...; names as
        :func:`setting_name` gives them), applied last.

    Returns
    -------
    dict
        For ``confluent_kafka.aio.AIOConsumer``.

    Raises
    ------
    ValueError
        An unknown ``protocol``; a setting lance_async owns
        (``enable.auto.commit``, ``enable.auto.offset.store``) set to commit
        behind its back; with ``protocol="consumer"``, a setting the broker
        owns then (session and heartbeat times, the assignor).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id,
        "auto.offset.reset": "earliest",
        "reconnect.backoff.max.ms": RECONNECT_MAX_MS,
        **OWNED,
    }
    if client_id:
        config["client.id"] = client_id
    if protocol == "consumer":
        config["group.protocol"] = "consumer"
    else:
        config["partition.assignment.strategy"] = "cooperative-sticky"
    for key, value in (options or {}).items():
        name = setting_name(key)
        if name in OWNED and str(value).lower() not in ("false", "0"):
            raise ValueError(
                f"{name} is lance_async's: offsets are committed only after the rows are "
                "durable, never automatically"
            )
        if protocol == "consumer" and name in CLASSIC_ONLY:
            raise ValueError(
                f"{name} is set by the broker under the consumer group protocol (KIP-848); "
                "leave it out, or use protocol='classic'"
            )
        config[name] = value
    return config


#: Errors that say no broker answers (librdkafka's ``error_cb``).
_DOWN = {
    confluent_kafka.KafkaError._ALL_BROKERS_DOWN,
    confluent_kafka.KafkaError._TRANSPORT,
    confluent_kafka.KafkaError._RESOLVE,
}


class BrokerWatch:
    """Whether a broker answers, from librdkafka's ``error_cb`` (asyncio).

    Give it as ``error_cb`` in a consumer's settings; it logs the first
    error of each spell without a broker (a warning: ``no Kafka broker
    answers``), and :attr:`down_since` says since when (``time.monotonic()``;
    None while a broker answers). Does not block.
    """

    def __init__(self, who: str) -> None:
        self.who = who
        self.down_since: float | None = None
        self.last: confluent_kafka.KafkaError | None = None

    async def __call__(self, error: confluent_kafka.KafkaError) -> None:
        if error.code() not in _DOWN:
            log.warning("%s: Kafka: %s", self.who, error, extra={"feed": "kafka"})
            return
        self.last = error
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning(
                "%s: no Kafka broker answers (%s); librdkafka tries again",
                self.who,
                error.str(),
                extra={"feed": "kafka"},
            )

    def up(self) -> None:
        """A broker answered."""
        if self.down_since is not None:
            log.info("%s: a Kafka broker answers again", self.who, extra={"feed": "kafka"})
        self.down_since = None


class _Delivery:
    """One record's delivery report, settled from the poll thread on the loop."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[tuple[int, int]] = loop.create_future()

    def report(self, error: Any, message: Any) -> None:  # on the poll thread
        self.loop.call_soon_threadsafe(self._settle, error, message)

    def _settle(self, error: Any, message: Any) -> None:
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(confluent_kafka.KafkaException(error))
        else:
            self.future.set_result((message.partition(), message.offset()))


class KafkaProducer:
    """Produce records and await each one's delivery report (librdkafka).

    Parameters
    ----------
    config : mapping
        librdkafka producer settings (``bootstrap.servers`` at least);
        ``acks`` defaults to ``all`` (every in-sync replica has the record).

    Notes
    -----
    Create and use it on one asyncio event loop. :meth:`send` does not
    block the loop: ``produce`` only enqueues the record in librdkafka (a
    full local queue is waited out on the loop, with ``await``); one daemon
    thread serves the delivery reports. Close it with :meth:`aclose` (or
    ``async with``). The idea is aiokafka's ``send`` / ``send_and_wait``: a
    future per record, resolved when the broker acknowledges it.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        require_asyncio("KafkaProducer")
        self._loop = asyncio.get_running_loop()
        self._producer = confluent_kafka.Producer(
            {"acks": "all", "reconnect.backoff.max.ms": RECONNECT_MAX_MS, **config}
        )
        self._closed = threading.Event()
        self._poller = threading.Thread(
            target=self._poll, name="lance-async-kafka-producer", daemon=True
        )
        self._poller.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.1)

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        partition: int | None = None,
        key: bytes | None = None,
        headers: Mapping[str, str | bytes] | Sequence[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[tuple[int, int]]:
        """Enqueue a record; the future it returns resolves on delivery.

        Returns
        -------
        asyncio.Future of (int, int)
            ``(partition, offset)`` once the broker acknowledged the record;
            ``confluent_kafka.KafkaException`` if it could not be delivered
            (within ``message.timeout.ms``, 300 s by default).

        Raises
        ------
        RuntimeError
            The producer was closed.
        """
        if self._closed.is_set():
            raise RuntimeError("the Kafka producer is closed")
        delivery = _Delivery(self._loop)
        extra: dict[str, Any] = {}
        if partition is not None:
            extra["partition"] = partition
        if headers:
            items = headers.items() if isinstance(headers, Mapping) else headers
            extra["headers"] = [(k, v.encode() if isinstance(v, str) else v) for k, v in items]
        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=delivery.report, **extra)
                return delivery.future
            except BufferError:  # librdkafka's local queue is full: let deliveries drain
                await asyncio.sleep(0.01)

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None,
        *,
        partition: int | None = None,
        key: bytes | None = None,
        headers: Mapping[str, str | bytes] | Sequence[tuple[str, bytes]] | None = None,
    ) -> tuple[int, int]:
        """:meth:`send`, then await the delivery: ``(partition, offset)``.

        Raises
        ------
        confluent_kafka.KafkaException
            The record was not delivered.
        """
        future = await self.send(topic, value, partition=partition, key=key, headers=headers)
        return await future

    async def flush(self, timeout: float = 30.0) -> int:
        """Wait (on a thread) until every record is delivered, at most ``timeout`` seconds.

        Returns the records still undelivered (0 when all were)."""
        return await asyncio.to_thread(self._producer.flush, timeout)

    async def aclose(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (at most ``timeout`` seconds), then stop. Idempotent."""
        if self._closed.is_set():
            return
        try:
            left = await self.flush(timeout)
            if left:
                log.warning("Kafka producer closed with %d records undelivered", left)
        finally:
            self._closed.set()
            await asyncio.to_thread(self._poller.join)

    async def __aenter__(self) -> KafkaProducer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
