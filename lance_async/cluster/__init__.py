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
``worker.py``
    :class:`Worker`: owns partitions, one shard writer and one ingest loop
    each; hands them over cleanly; stops acknowledging when fenced.
``repartition.py``
    :class:`RepartitionWriter`: a feed's rows republished to their partitions.

``docs/sharding.md`` is the design: invariants, assignment, hand-over,
fencing, offsets, what to configure and what it costs.
"""

from __future__ import annotations

from .balancer import Coordinator, LeaseBalancer, LeaseCoordinator
from .feeds import (
    KafkaPublisher,
    NatsPartitions,
    NatsPublisher,
    PartitionedFeed,
    Publisher,
    RedisPartitions,
    RedisPublisher,
)
from .kafka import KafkaCoordinator
from .leases import LeaseTable, NatsLeaseTable, RedisLeaseTable
from .partitions import Partitioner
from .worker import Worker, WorkerStats

__all__ = [
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
    "Worker",
    "WorkerStats",
]
