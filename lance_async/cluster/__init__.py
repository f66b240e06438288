"""Scale-out: many worker processes ingesting one table, coordinated by their broker.

One module per job (imports run down this list):

``partitions.py``
    :class:`Partitioner`: a feed partitioned like the table (partition =
    bucket), for producers and workers.
``leases.py``
    Partition leases and worker liveness kept in Redis or NATS (KV).
``balancer.py``
    :class:`LeaseBalancer`: each live worker takes its fair share of leases.
``feeds.py``
    Partitioned feeds (one stream or subject per partition) and publishers.
``kafka.py``
    :class:`KafkaCoordinator`: a Kafka consumer group assigns the partitions.
``messages.py``
    What a partition's messages become: rows checked against the partition,
    deletes by header, in feed order.
``worker.py``
    :class:`Worker`: owns partitions, one shard writer and one ingest loop
    each; hands them over cleanly; stops acknowledging when fenced.
``repartition.py``
    :class:`RepartitionWriter`: a feed's rows republished to their partitions.
``claim.py``
    :class:`~lance_async.cluster.claim.TableClaim`: one claim per table in the
    broker, so a second ``lance-async ingest`` refuses instead of fencing.

``docs/sharding.md`` is the design: invariants, assignment, hand-over,
fencing, offsets, what to configure and what it costs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .balancer import Coordinator, LeaseBalancer, LeaseCoordinator
from .claim import BrokerUnavailableError, TableClaim, TableClaimedError
from .feeds import (
    KafkaPublisher,
    NatsPartitions,
    NatsPublisher,
    PartitionedFeed,
    Publisher,
    RedisPartitions,
    RedisPublisher,
)
from .leases import LeaseTable, NatsLeaseTable, RedisLeaseTable
from .partitions import Partitioner
from .worker import DELETE, Worker, WorkerStats

if TYPE_CHECKING:
    from .kafka import KafkaCoordinator as KafkaCoordinator

__all__ = [
    "DELETE",
    "BrokerUnavailableError",
    "Coordinator",
    "KafkaCoordinator",
    "KafkaPublisher",
    "LeaseBalancer",
    "LeaseCoordinator",
    "LeaseTable",
    "NatsLeaseTable",
    "NatsPartitions",
    "NatsPublisher",
    "PartitionedFeed",
    "Partitioner",
    "Publisher",
    "RedisLeaseTable",
    "RedisPartitions",
    "RedisPublisher",
    "TableClaim",
    "TableClaimedError",
    "Worker",
    "WorkerStats",
]


def __getattr__(name: str) -> Any:
    """Import :class:`KafkaCoordinator` (and confluent-kafka) on first access (PEP 562)."""
    if name != "KafkaCoordinator":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(".kafka", __name__)
    except ImportError as exc:
        raise ImportError(
            f"lance_async.cluster.KafkaCoordinator needs confluent-kafka: "
            f"pip install 'lance-async[feeds]' ({exc})"
        ) from exc
    value = module.KafkaCoordinator
    globals()[name] = value
    return value
