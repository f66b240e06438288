"""What a partition's messages become: rows to put, keys to delete, in feed order.

A worker's partition is co-partitioned with the table (``partitions.py``),
so every row of its messages must belong to it: one that does not is
refused, never written to the wrong shard. A message with the header
``lance-op: delete`` deletes its rows by key instead, by the rule every
ingest follows (:mod:`lance_async.feeds.ops`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DecodeError
from ..feeds.base import Message
from ..feeds.ops import DELETE, OpWriter, decode_ops
from ..memwal.writer import AsyncShardWriter
from .partitions import Partitioner

__all__ = ["DELETE", "PartitionWriter", "partition_decoder"]


class PartitionWriter(OpWriter):
    """A partition's shard writer as :func:`~lance_async.feeds.ingest` sees it:
    an :class:`~lance_async.feeds.ops.OpWriter` on the partition's shard."""

    def __init__(self, writer: AsyncShardWriter, keys: list[str]) -> None:
        super().__init__(writer, keys)


def partition_decoder(
    partitioner: Partitioner, keys: list[str], partition: int
) -> Callable[[Sequence[Message], pa.Schema], pa.Table]:
    """The ``decode`` of partition ``partition``'s ingest loop (it runs on a worker thread).

    :func:`~lance_async.feeds.ops.decode_ops` (JSON rows, deletes by key)
    that also refuses a row of another partition with a
    :class:`~lance_async.DecodeError` (the message goes to the dead-letter
    hook, never to the wrong shard).
    """
    column = partitioner.sharding.column
    key_schema = pa.schema([f for f in partitioner.schema if f.name in keys or f.name == column])

    def check(table: pa.Table) -> None:
        for batch in table.to_batches():
            values = partitioner.partitions(batch)
            foreign = pc.not_equal(values, partition)
            if pc.any(foreign).as_py():
                other = pc.filter(values, foreign)[0].as_py()
                raise DecodeError(
                    f"a row of partition {other} came on partition {partition}: the "
                    "producer did not partition rows by the table's buckets "
                    "(lance_async.cluster.Partitioner); not written"
                )

    def decode(messages: Sequence[Message], schema: pa.Schema) -> pa.Table:
        return decode_ops(messages, schema, keys, check=check, key_schema=key_schema)

    return decode
