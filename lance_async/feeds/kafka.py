"""Kafka as a feed: an aiokafka consumer whose offsets are committed after durable writes.

:class:`KafkaFeed` wraps an ``aiokafka.AIOKafkaConsumer`` that *you* create
(with ``enable_auto_commit=False`` and a ``group_id``) and subscribe with the
feed's :attr:`~KafkaFeed.rebalance_listener`::

    consumer = AIOKafkaConsumer(bootstrap_servers=..., group_id="lance",
                                enable_auto_commit=False)
    feed = KafkaFeed(consumer)
    consumer.subscribe(["events"], listener=feed.rebalance_listener)
    await consumer.start()
    async with feed:
        await ingest(feed, writer)

Commits
-------
A record's :class:`~lance_async.feeds.Message` is acknowledged by
:func:`ingest` once its rows are durable. The feed then commits, per
partition, the offset after the longest *contiguous* run of acknowledged
records (``commit({tp: OffsetAndMetadata(offset + 1, metadata)})``):

* never past a record that is not acknowledged, whatever order acks come in;
* monotonic per partition: an offset at or below the last one this feed
  committed is never sent again;
* one commit per partition per fetch (when the fetch's last record of that
  partition is acknowledged, or its partition has nothing left in flight),
  plus :meth:`KafkaFeed.commit` and :meth:`KafkaFeed.aclose`; commits are
  serialized, so they reach the broker in order;
* only for partitions still assigned (``consumer.assignment()``): a
  partition that moved to another consumer is left to it.

A ``CommitFailedError`` (the group rebalanced under the commit) is logged and
skipped: the records will be delivered again. Other Kafka errors propagate.

Revocation while writes are in flight
-------------------------------------
Policy chosen: **wait, bounded, then fence**. When partitions are revoked,
the listener waits up to ``revoke_timeout`` seconds (default 5) for the
records of those partitions already handed out to be acknowledged, commits
what was acknowledged (the partitions are still assigned during the
callback), then starts a new *epoch* for them: a record fetched before the
revocation and acknowledged after it commits nothing, so the new owner
reads it again from the last committed offset. Waiting spares the new owner
from re-writing what is about to be durable; the bound keeps the consumer
within the group's rebalance timeout (keep ``revoke_timeout`` well below
``rebalance_timeout_ms``).

Caveat: a write still in flight after ``revoke_timeout`` may land *after*
the new owner wrote later records for the same keys, and an older value
could then win. Choose ``revoke_timeout`` above the writer's worst ack
latency.

Notes
-----
The pattern is Kafka's own "commit in ``on_partitions_revoked``" guidance
(aiokafka's ``ConsumerRebalanceListener`` docs) plus a per-partition
contiguous-ack watermark, as aiokafka's producer accumulator resolves one
future per message. aiokafka runs on asyncio only.

This module is tested against a **fake consumer** (``tests/test_feeds_kafka.py``)
implementing exactly the consumer calls used here -- ``getmany(timeout_ms=,
max_records=)``, ``commit(offsets)``, ``assignment()`` and, with
``stop_consumer=True``, ``stop()`` -- and driving the listener as aiokafka's
group coordinator does, because no Kafka broker runs in this project's test
environment. Requires the ``feeds`` extra (``aiokafka``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio
import pyarrow as pa
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from .._metrics import metrics_enabled, set_feed_lag
from ..errors import DecodeError
from .base import Message
from .broker import BrokerFeed, FeedState, call_maybe_async, check_open

__all__ = ["FeedRebalanceListener", "KafkaFeed", "KafkaOffset"]

log = logging.getLogger("lance_async.feeds")


class KafkaOffset(NamedTuple):
    """Where a record sits: the ``offset`` of a :class:`~lance_async.feeds.Message` from Kafka.

    Attributes
    ----------
    topic : str
    partition : int
    offset : int
        The record's offset in its partition (the commit is ``offset + 1``).
    """

    topic: str
    partition: int
    offset: int


@dataclass
class _Partition:
    """Bookkeeping of one assigned partition within one epoch."""

    epoch: int
    # offsets handed out, in fetch order -> acknowledged?
    pending: dict[int, bool] = field(default_factory=dict)
    # the next offset to commit (one past the contiguous acknowledged run)
    watermark: int | None = None
    committed: int | None = None


def _payload(value: Any, where: KafkaOffset) -> bytes | pa.RecordBatch:
    if value is None:
        return b""  # a tombstone: no rows
    if isinstance(value, (bytes, pa.RecordBatch)):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise DecodeError(
        f"the Kafka record {where.topic}[{where.partition}]@{where.offset} has a value of type "
        f"{type(value).__name__}, which cannot be decoded; use no value_deserializer (bytes) "
        "or one returning bytes, str or pa.RecordBatch",
        offset=where,
    )


class FeedRebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """The ``aiokafka.abc.ConsumerRebalanceListener`` of a :class:`KafkaFeed`.

    Pass it to ``consumer.subscribe(topics, listener=...)``; get it from
    :attr:`KafkaFeed.rebalance_listener`.

    Parameters
    ----------
    feed : KafkaFeed
    chained : ConsumerRebalanceListener, optional
        Your own listener, called after the feed's handling (its commits are
        then done).
    """

    def __init__(self, feed: KafkaFeed, chained: Any = None) -> None:
        self._feed = feed
        self._chained = chained

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        """Wait (bounded) for in-flight acks, commit, fence the partitions."""
        revoked = set(revoked)
        await self._feed._on_revoked(revoked)
        if self._chained is not None:
            await call_maybe_async(self._chained.on_partitions_revoked, revoked)

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        """Forget partitions no longer assigned; call the chained listener."""
        assigned = set(assigned)
        self._feed._on_assigned(assigned)
        if self._chained is not None:
            await call_maybe_async(self._chained.on_partitions_assigned, assigned)


class KafkaFeed(BrokerFeed):
    """An aiokafka consumer as a :class:`~lance_async.feeds.Feed`, committing after durability.

    Parameters
    ----------
    consumer : aiokafka.AIOKafkaConsumer
        Created by you with ``enable_auto_commit=False`` and a
        ``group_id``, subscribed with :attr:`rebalance_listener` (or assigned
        partitions manually), started before the first fetch.
    revoke_timeout : float
        Seconds a revocation waits for in-flight records of the revoked
        partitions to be acknowledged (default 5). See the module notes.
    listener : ConsumerRebalanceListener, optional
        Your own rebalance listener, chained after the feed's.
    commit_metadata : str
        Metadata string committed with each offset (default "").
    close_timeout : float
        Seconds :meth:`aclose` may spend on its final commit (default 10).
    stop_consumer : bool
        Also ``await consumer.stop()`` in :meth:`aclose` (default False: the
        consumer is yours).

    Notes
    -----
    Messages: ``offset`` is a :class:`KafkaOffset` ``(topic, partition,
    offset)``; ``payload`` the record value (bytes; a tombstone gives
    ``b""``, which decodes to no rows); ``headers`` the record headers as a
    dict. ``exhausted`` is always False. Records handed out and never
    acknowledged (an ingest that was cancelled) hold back their partition's
    commits for the life of the feed, since commits stay contiguous: after a
    cancelled ingest, close the feed; a new consumer session resumes from
    the committed offsets.
    """

    def __init__(
        self,
        consumer: Any,
        *,
        revoke_timeout: float = 5.0,
        listener: Any = None,
        commit_metadata: str = "",
        close_timeout: float = 10.0,
        stop_consumer: bool = False,
    ) -> None:
        if revoke_timeout < 0:
            raise ValueError(f"revoke_timeout must be >= 0 seconds, got {revoke_timeout}")
        self._consumer = consumer
        self.revoke_timeout = revoke_timeout
        self.close_timeout = close_timeout
        self._metadata = commit_metadata
        self._stop_consumer = stop_consumer
        self._listener = FeedRebalanceListener(self, listener)
        self._state = FeedState.OPEN
        self._parts: dict[TopicPartition, _Partition] = {}
        self._epochs: dict[TopicPartition, int] = {}
        self._lock: anyio.Lock | None = None
        self._changed: anyio.Event | None = None
        self._error: DecodeError | None = None
        self.fetched = 0
        """Records handed out by :meth:`fetch`."""
        self.acked = 0
        """Records acknowledged (fenced ones included)."""
        self.fenced_acks = 0
        """Acks of records fetched before their partition was revoked: not committed."""
        self.skipped_commits = 0
        """Commits left out because their partition was no longer assigned or the
        group rebalanced under them."""

    def __repr__(self) -> str:
        return f"<KafkaFeed state={self._state.value} partitions={len(self._parts)}>"

    # -- properties ---------------------------------------------------------------
    @property
    def rebalance_listener(self) -> FeedRebalanceListener:
        """Pass to ``consumer.subscribe(topics, listener=feed.rebalance_listener)``."""
        return self._listener

    @property
    def committed(self) -> dict[TopicPartition, int]:
        """The offsets this feed committed, per partition of the current assignment epoch."""
        return {tp: p.committed for tp, p in self._parts.items() if p.committed is not None}

    def epoch(self, where: TopicPartition | KafkaOffset) -> int:
        """The assignment epoch of a partition (of a record's partition, given
        its :class:`KafkaOffset`): it changes each time the partition is
        revoked. A record fetched in an earlier epoch is never committed;
        compare before handing it on (does not block)."""
        return self._epochs.get(TopicPartition(where.topic, where.partition), 0)

    def epochs(self) -> dict[TopicPartition, int]:
        """Every partition's assignment epoch now (a copy; see :meth:`epoch`;
        a partition never revoked is at 0 and may be missing). Does not block."""
        return dict(self._epochs)

    def in_flight(self, tp: TopicPartition | None = None) -> int:
        """Records handed out and not yet acknowledged (of one partition, or all)."""
        if tp is not None:
            part = self._parts.get(tp)
            return 0 if part is None else sum(1 for done in part.pending.values() if not done)
        return sum(self.in_flight(t) for t in self._parts)

    # -- internals -----------------------------------------------------------------
    def _lock_(self) -> anyio.Lock:
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait_change(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def _partition(self, tp: TopicPartition) -> _Partition:
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = _Partition(epoch=self._epochs.get(tp, 0))
        return part

    def _acker(self, tp: TopicPartition, offset: int, epoch: int, last_of_fetch: bool) -> Any:
        async def ack() -> None:
            check_open(self._state, repr(self))
            self.acked += 1
            part = self._parts.get(tp)
            if part is None or part.epoch != epoch or offset not in part.pending:
                self.fenced_acks += 1
                log.debug(
                    "%r: %s@%d was fetched before a revocation; not committed",
                    self,
                    tp,
                    offset,
                    extra={"feed": f"kafka:{tp.topic}", "partition": tp.partition},
                )
                return
            part.pending[offset] = True
            while part.pending:
                first = next(iter(part.pending))
                if not part.pending[first]:
                    break
                del part.pending[first]
                part.watermark = first + 1
            self._notify()
            if last_of_fetch or not part.pending:
                await self._commit([tp])

        return ack

    async def _commit(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        async with self._lock_():
            assigned = set(self._consumer.assignment())
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            parts: dict[TopicPartition, _Partition] = {}
            for tp in tps:
                part = self._parts.get(tp)
                if part is None or part.watermark is None:
                    continue
                if part.committed is not None and part.watermark <= part.committed:
                    continue
                if tp not in assigned:
                    self.skipped_commits += 1
                    log.info(
                        "%r: %s is no longer assigned; its offsets are not committed",
                        self,
                        tp,
                        extra={"feed": f"kafka:{tp.topic}", "partition": tp.partition},
                    )
                    continue
                offsets[tp] = OffsetAndMetadata(part.watermark, self._metadata)
                parts[tp] = part
            if not offsets:
                return {}
            try:
                await self._consumer.commit(offsets)
            except (CommitFailedError, IllegalStateError) as exc:
                self.skipped_commits += len(offsets)
                log.warning(
                    "%r: commit of %s skipped (%s); those records will be delivered again",
                    self,
                    sorted(offsets),
                    exc,
                    extra={"feed": "kafka"},
                )
                return {}
            for tp, om in offsets.items():
                parts[tp].committed = om.offset
            return {tp: om.offset for tp, om in offsets.items()}

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        with anyio.move_on_after(self.revoke_timeout):
            while any(self.in_flight(tp) for tp in revoked):
                await self._wait_change()
        await self._commit(revoked)
        for tp in revoked:
            part = self._parts.pop(tp, None)
            self._epochs[tp] = self._epochs.get(tp, 0) + 1
            left = 0 if part is None else sum(1 for d in part.pending.values() if not d)
            if left:
                log.warning(
                    "%r: %d records of revoked %s were not acknowledged within %.1f s; "
                    "their offsets are not committed (the new owner reads them again)",
                    self,
                    left,
                    tp,
                    self.revoke_timeout,
                    extra={"feed": f"kafka:{tp.topic}", "partition": tp.partition},
                )
        self._notify()

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in [t for t in self._parts if t not in assigned]:
            del self._parts[tp]
            self._epochs[tp] = self._epochs.get(tp, 0) + 1

    # -- the Feed protocol --------------------------------------------------------
    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        """Records available now: ``consumer.getmany(timeout_ms=, max_records=)``.

        Parameters
        ----------
        max_messages : int
            ``max_records`` (>= 1).
        timeout : float
            Seconds to wait when nothing is buffered (``timeout_ms``).

        Returns
        -------
        list of Message
            Grouped by partition, in offset order within each; ``[]`` when
            nothing came within ``timeout``.

        Raises
        ------
        ClosedError
            The feed was closed.
        DecodeError
            A record value is not bytes, str or a record batch (a
            ``value_deserializer`` returning something else); ``offset`` is
            its :class:`KafkaOffset`. No record of that fetch is handed out
            and the feed stays failed (every later fetch raises the same
            error), so no commit can pass the records it took from the
            consumer: close the feed, fix the deserializer, and a new
            consumer session reads them again from the committed offsets.
        aiokafka.errors.KafkaError
            Whatever ``getmany`` raises (``ConsumerStoppedError`` once the
            consumer is stopped).
        """
        check_open(self._state, repr(self))
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        if self._error is not None:
            raise self._error
        batches = await self._consumer.getmany(
            timeout_ms=max(0, int(timeout * 1000)), max_records=max_messages
        )
        # every value is checked before any record is registered as handed out
        taken: list[tuple[TopicPartition, list[tuple[KafkaOffset, Any, Any]]]] = []
        try:
            for tp, records in batches.items():
                if records:
                    taken.append((tp, []))
                for record in records:
                    where = KafkaOffset(tp.topic, tp.partition, record.offset)
                    taken[-1][1].append((where, _payload(record.value, where), record.headers))
        except DecodeError as exc:
            self._error = exc
            raise
        out: list[Message] = []
        for tp, items in taken:
            part = self._partition(tp)
            last = items[-1][0].offset
            _feed_lag(self._consumer, tp, last)
            for where, payload, headers in items:
                part.pending[where.offset] = False
                out.append(
                    Message(
                        where,
                        payload,
                        dict(headers or ()),
                        _ack=self._acker(tp, where.offset, part.epoch, where.offset == last),
                    )
                )
        self.fetched += len(out)
        return out

    async def commit(self) -> dict[TopicPartition, int]:
        """Commit what is acknowledged and not yet committed, for assigned partitions.

        Returns
        -------
        dict
            ``{TopicPartition: offset}`` committed by this call (the offset
            of the next record to read).

        Raises
        ------
        ClosedError
            The feed was closed.
        aiokafka.errors.KafkaError
            The broker refused (a ``CommitFailedError`` is logged and skipped).
        """
        check_open(self._state, repr(self))
        return await self._commit(list(self._parts))

    async def aclose(self) -> None:
        """Commit what is acknowledged; stop the consumer if ``stop_consumer``.

        Shielded from cancellation and bounded by ``close_timeout`` seconds.
        Safe to call twice. Records in flight stay uncommitted (delivered
        again to the group).
        """
        if self._state is FeedState.CLOSED:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.close_timeout):
            try:
                await self._commit(list(self._parts))
            finally:
                self._state = FeedState.CLOSED
                if self._stop_consumer:
                    await self._consumer.stop()


def _feed_lag(consumer: Any, tp: Any, last: int) -> None:
    """Report the partition's lag the fetch told (high watermark minus the
    next offset), when metrics are on."""
    if not metrics_enabled():
        return
    highwater = getattr(consumer, "highwater", None)
    end = highwater(tp) if highwater is not None else None
    if end is not None:
        set_feed_lag(f"kafka:{tp.topic}", tp.partition, end - (last + 1))
