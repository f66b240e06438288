"""The feeds the commands read and write, from their URLs.

``SOURCE`` of ``ingest`` and ``repartition``: a file, ``-`` (stdin),
``nats://HOST:PORT/STREAM/SUBJECT[?durable=NAME]`` or
``redis://HOST:PORT/STREAM[?group=G&field=F]``. A *partitioned* feed of
``worker`` and ``repartition``: ``redis://HOST:PORT/KEY`` (streams
``KEY:0`` .. ``KEY:N-1``), ``nats://HOST:PORT/STREAM/SUBJECT`` (subjects
``SUBJECT.0`` .. ``SUBJECT.N-1``) or ``kafka://HOST:PORT/TOPIC`` (a topic
of N partitions), N being the table's buckets. A Kafka URL's query holds
librdkafka settings (``session_timeout_ms=3000`` or
``session.timeout.ms=3000``; ``rebalance_timeout_ms`` is
``max.poll.interval.ms``) and ``protocol=classic`` (the default:
``cooperative-sticky`` assignment) or ``protocol=consumer`` (KIP-848).
"""

from __future__ import annotations

import socket
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

import anyio
import typer

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["WORKER_GROUP", "open_feed", "open_partitioned", "open_publisher"]

#: A Kafka worker's group settings unless its URL says otherwise (classic
#: protocol): a dead member's partitions move after 10 s (librdkafka's own
#: default is 45 s), and a rebalance callback (a drain) may take a minute.
WORKER_GROUP = {
    "session.timeout.ms": "10000",
    "heartbeat.interval.ms": "1000",
    "max.poll.interval.ms": "60000",
}


def _seconds(query: dict[str, str], name: str, default: float) -> float:
    try:
        value = float(query.get(name, default))
    except ValueError:
        raise typer.BadParameter(f"{name} must be a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise typer.BadParameter(f"{name} must be > 0 seconds, got {query[name]}")
    return value


def _count(query: dict[str, str], name: str, default: int) -> int:
    try:
        value = int(query.get(name, default))
    except ValueError:
        raise typer.BadParameter(f"{name} must be an integer") from None
    if value < 1:
        raise typer.BadParameter(f"{name} must be >= 1, got {value}")
    return value


async def _nats_feed(stream: str, subject: str, *args: Any, **options: Any) -> Any:
    """``JetStreamFeed.connect``; a missing stream says what to do."""
    import nats.js.errors

    from .. import errors
    from ..feeds.nats import JetStreamFeed

    try:
        return await JetStreamFeed.connect(*args, stream=stream, subject=subject, **options)
    except nats.js.errors.NotFoundError:
        raise errors.InvalidInputError(
            f"the JetStream stream {stream!r} does not exist: create it first "
            f"(nats stream add {stream} --subjects '{subject}', or js.add_stream in Python)"
        ) from None


def open_feed(source: str, fmt: str | None, schema: pa.Schema, follow: bool) -> Any:
    """An async context manager (or plain feed) for SOURCE.

    A broker feed restarts where the last run stopped, at once: NATS takes
    its durable over (restarted at its ack floor, so what a killed run
    fetched and never acknowledged comes again now, not after ``ack_wait``);
    Redis reads as a consumer named after the host, so a restart re-reads
    its own pending entries first. A broker that restarts under a running
    feed is waited for, with back-off, for ``retry_for`` seconds (both
    brokers; default 300). Query options: NATS ``durable``,
    ``ack_wait`` (seconds, default 30), ``max_ack_pending`` (default
    10,000); Redis ``group``, ``field``, ``consumer`` (default
    ``lance-async-<hostname>``), ``min_idle`` (seconds before another
    consumer's pending entries are claimed, default 30); both
    ``retry_for``.
    """
    from ..feeds.broker import DEFAULT_RETRY_FOR

    if source == "-":
        from ..feeds.pipe import PipeFeed

        return PipeFeed(sys.stdin.buffer, format=fmt or "ndjson", schema=schema)
    url = urlparse(source)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if url.scheme == "nats":
        parts = [p for p in url.path.split("/") if p]
        if len(parts) != 2:
            raise typer.BadParameter("nats source: nats://host:port/STREAM/SUBJECT")
        stream, subject = parts

        async def quiet(_error: Exception) -> None:
            return None

        return _nats_feed(
            stream,
            subject,
            f"nats://{url.netloc}",
            durable=query.get("durable", f"lance-async-{stream}"),
            ack_wait=_seconds(query, "ack_wait", 30.0),
            max_ack_pending=_count(query, "max_ack_pending", 10_000),
            take_over=True,
            # a server that restarts is waited for (reconnecting every 0.5 s)
            # for retry_for seconds, not two attempts
            retry_for=_seconds(query, "retry_for", DEFAULT_RETRY_FOR),
            connect_options={
                "connect_timeout": 3,
                "max_reconnect_attempts": -1,
                "reconnect_time_wait": 0.5,
                "error_cb": quiet,
            },
        )
    if url.scheme in ("redis", "rediss"):
        from ..feeds.redis import RedisStreamFeed

        stream = url.path.strip("/")
        if not stream:
            raise typer.BadParameter("redis source: redis://host:port/STREAM[?group=G&field=F]")
        return RedisStreamFeed.connect(
            f"{url.scheme}://{url.netloc}",
            stream=stream,
            group=query.get("group", "lance-async"),
            consumer=query.get("consumer", f"lance-async-{socket.gethostname()}"),
            field=query.get("field", "data"),
            min_idle_time=_seconds(query, "min_idle", 30.0),
            retry_for=_seconds(query, "retry_for", DEFAULT_RETRY_FOR),
        )
    from ..feeds.files import FileFeed

    if url.scheme:
        raise typer.BadParameter(
            f"unsupported source {source!r}: use a file, '-', nats://host:port/STREAM/SUBJECT "
            "or redis://host:port/STREAM (for Kafka, use lance_async.feeds.KafkaFeed in Python)"
        )
    return FileFeed(source, format=fmt, schema=schema, follow=follow)


async def open_partitioned(
    url: str, group: str, member: str, partitions: int, ttl: float, ack_wait: float
) -> tuple[Any, Any]:
    """(coordinator, closer) for a ``redis://``, ``nats://`` or ``kafka://`` URL."""
    from ..cluster import NatsLeaseTable, NatsPartitions, RedisLeaseTable, RedisPartitions
    from ..cluster.balancer import LeaseCoordinator

    parsed = urlparse(url)
    path = [p for p in parsed.path.split("/") if p]
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    if parsed.scheme in ("redis", "rediss"):
        import redis.asyncio

        if len(path) != 1:
            raise typer.BadParameter("a Redis feed is redis://HOST:PORT/KEY (streams KEY:0..N-1)")
        client = redis.asyncio.Redis.from_url(f"{parsed.scheme}://{parsed.netloc}")
        key = path[0]
        feeds = RedisPartitions(client, key, group, partitions, field=query.get("field", "data"))
        leases = RedisLeaseTable(client, f"lance-async:leases:{group}:{key}", member, ttl)
        return LeaseCoordinator(feeds, leases), client.aclose
    if parsed.scheme == "nats":
        import nats

        if len(path) != 2:
            raise typer.BadParameter(
                "a NATS feed is nats://HOST:PORT/STREAM/SUBJECT (subjects SUBJECT.0..N-1)"
            )
        # a worker waits for its broker as long as it takes: reconnect for ever, soon
        nc = await nats.connect(
            f"nats://{parsed.netloc}",
            connect_timeout=3,
            reconnect_time_wait=0.5,
            max_reconnect_attempts=-1,
        )
        stream, subject = path
        subjects = NatsPartitions(nc, stream, subject, group, partitions, ack_wait=ack_wait)
        await subjects.ensure_stream()
        # lease requests time out within a balancing interval: a server that
        # restarts does not hold a round for the default 5 s per request
        bucket = await NatsLeaseTable.bucket(
            nc.jetstream(timeout=min(5.0, max(0.5, ttl / 4))),
            f"lance-async-leases-{group}-{stream}",
            ttl,
        )
        return LeaseCoordinator(subjects, NatsLeaseTable(bucket, member, ttl)), nc.close
    if parsed.scheme == "kafka":
        from ..cluster.kafka import KafkaCoordinator
        from ..feeds.kafkaclient import consumer_config

        if len(path) != 1:
            raise typer.BadParameter(
                "a Kafka feed is kafka://HOST:PORT/TOPIC[?session_timeout_ms=...&protocol=...] "
                "(a topic of N partitions)"
            )
        protocol = query.pop("protocol", "classic")
        options = dict(WORKER_GROUP) if protocol == "classic" else {}
        options.update(query)
        try:
            config = consumer_config(
                parsed.netloc, group, client_id=member, protocol=protocol, options=options
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None

        async def nothing() -> None:
            await anyio.lowlevel.checkpoint()

        return KafkaCoordinator(config, path[0], partitions, member), nothing
    raise typer.BadParameter(
        f"unsupported feed {url!r}: use redis://HOST:PORT/KEY, nats://HOST:PORT/STREAM/SUBJECT "
        "or kafka://HOST:PORT/TOPIC"
    )


async def open_publisher(url: str, partitions: int) -> tuple[Any, Any]:
    """(publisher, closer) of a partitioned feed's URL (see the module notes)."""
    from ..cluster import KafkaPublisher, NatsPartitions, NatsPublisher, RedisPublisher

    parsed = urlparse(url)
    path = [p for p in parsed.path.split("/") if p]
    if parsed.scheme in ("redis", "rediss"):
        import redis.asyncio

        if len(path) != 1:
            raise typer.BadParameter("a Redis target is redis://HOST:PORT/KEY (streams KEY:0..N-1)")
        client = redis.asyncio.Redis.from_url(f"{parsed.scheme}://{parsed.netloc}")
        return RedisPublisher(client, path[0], partitions), client.aclose
    if parsed.scheme == "nats":
        import nats

        if len(path) != 2:
            raise typer.BadParameter(
                "a NATS target is nats://HOST:PORT/STREAM/SUBJECT (subjects SUBJECT.0..N-1)"
            )
        nc = await nats.connect(f"nats://{parsed.netloc}", connect_timeout=3)
        stream, subject = path
        await NatsPartitions(nc, stream, subject, "lance-async", partitions).ensure_stream()
        return NatsPublisher(nc, subject, partitions), nc.close
    if parsed.scheme == "kafka":
        from ..feeds.kafkaclient import KafkaProducer

        if len(path) != 1:
            raise typer.BadParameter("a Kafka target is kafka://HOST:PORT/TOPIC (N partitions)")
        producer = KafkaProducer({"bootstrap.servers": parsed.netloc})
        return KafkaPublisher(producer, path[0], partitions), producer.aclose
    raise typer.BadParameter(
        f"unsupported target {url!r}: use redis://HOST:PORT/KEY, nats://HOST:PORT/STREAM/SUBJECT "
        "or kafka://HOST:PORT/TOPIC"
    )
