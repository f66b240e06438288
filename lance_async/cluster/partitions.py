"""Partitions that are shards: a feed partitioned like the table (:class:`Partitioner`).

Workers scale out by dividing a table's shards among themselves, and their
broker divides the feed's partitions among them. The two line up when the
feed is *co-partitioned* with the table: as many partitions as the table has
buckets, and partition ``p`` carrying only rows of bucket ``p`` (Fluss's
client-side bucketing; Kafka Streams calls such topics co-partitioned).
Whoever owns partition ``p`` then owns shard ``shard_ids()[p]``, and every
key stays in one shard whichever worker writes it (``docs/sharding.md``).

:class:`Partitioner` is the producers' half: the partition of each row, by
the table's own bucket function (the engine's ``evaluate_sharding_spec``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidInputError
from ..memwal.sharding import Sharding, read_sharding

if TYPE_CHECKING:
    from ..dataset import AsyncDataset

__all__ = ["Partitioner"]


@dataclass(frozen=True)
class Partitioner:
    """Partitions of a feed co-partitioned with a MemWAL table.

    Obtain it with :meth:`Partitioner.for_dataset` (or
    :meth:`Partitioner.open`). Partition ``p`` is bucket ``p`` of a
    bucket-sharded table; an unsharded table has one partition.

    Attributes
    ----------
    sharding : Sharding
        The table's sharding.
    schema : pa.Schema
        The table's schema (rows are checked against its sharded column).

    Raises
    ------
    InvalidInputError
        On creation: identity sharding (one shard per value: no fixed number
        of partitions) or manual shards.
    """

    sharding: Sharding
    schema: pa.Schema

    def __post_init__(self) -> None:
        if self.sharding.kind not in ("bucket", "unsharded"):
            raise InvalidInputError(
                f"a table with {self.sharding.kind} sharding cannot be co-partitioned with a "
                "feed: initialize its MemWAL with bucket sharding (lance-async init-wal T "
                "--num-buckets N)"
            )

    @classmethod
    async def for_dataset(cls, dataset: AsyncDataset) -> Partitioner:
        """The partitioner of ``dataset``'s MemWAL (reads its sharding on a worker thread)."""
        return cls(await read_sharding(dataset), dataset.schema)

    @classmethod
    async def open(
        cls, uri: str, *, storage_options: Mapping[str, str] | None = None
    ) -> Partitioner:
        """The partitioner of the table at ``uri``."""
        from ..dataset import open_dataset

        return await cls.for_dataset(await open_dataset(uri, storage_options=storage_options))

    @property
    def num_partitions(self) -> int:
        """Partitions the feed must have (the table's buckets)."""
        if self.sharding.kind == "unsharded":
            return 1
        assert self.sharding.num_buckets is not None
        return self.sharding.num_buckets

    def shard_of(self, partition: int) -> str:
        """The shard id that partition ``partition`` feeds.

        Raises
        ------
        ValueError
            No such partition.
        """
        if not 0 <= partition < self.num_partitions:
            raise ValueError(f"partition {partition} is not in 0..{self.num_partitions - 1}")
        return self.sharding.shard_ids()[partition]

    def partitions(self, batch: pa.RecordBatch) -> pa.Array:
        """Each row's partition (int32; blocking: the engine evaluates the spec)."""
        if self.sharding.kind == "unsharded":
            return pa.array([0] * batch.num_rows, pa.int32())
        return self.sharding.values(batch)

    def split(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        """The batch's rows grouped by partition, in row order within each (blocking)."""
        if batch.num_rows == 0:
            return []
        values = self.partitions(batch)
        uniques = pc.unique(values)
        if len(uniques) == 1:
            return [(int(uniques[0].as_py()), batch)]
        return [(int(v.as_py()), batch.filter(pc.equal(values, v))) for v in uniques]

    def partition_of_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """The partition of each row given as a dict (blocking).

        Raises
        ------
        InvalidInputError
            A row lacks the sharded column, or its value does not fit its type.
        """
        if not rows:
            return []
        if self.sharding.column is None:
            return [0] * len(rows)
        column = self.sharding.column
        field = self.schema.field(column)
        try:
            values = pa.array([row[column] for row in rows], type=field.type)
        except KeyError:
            raise InvalidInputError(f"a row lacks the sharded column {column!r}") from None
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise InvalidInputError(f"a {column!r} value does not fit {field.type}: {exc}") from exc
        batch = pa.RecordBatch.from_arrays([values], schema=pa.schema([field]))
        return [int(v) for v in self.partitions(batch).to_pylist()]
