"""Kafka as a feed: a librdkafka consumer whose offsets are committed after durable writes.

:class:`KafkaFeed` wraps a ``confluent_kafka.aio.AIOConsumer`` (librdkafka,
through confluent-kafka's asyncio consumer), a member of a consumer group.
:meth:`KafkaFeed.connect` makes one (``cooperative-sticky``, offsets
committed only by the feed: :func:`~lance_async.feeds.kafkaclient.consumer_config`)
and subscribes it; a consumer of your own is subscribed with
:meth:`KafkaFeed.subscribe`::

    async with await KafkaFeed.connect("broker:9092", ["events"], "lance") as feed:
        await ingest(feed, writer)

Commits. A record is acknowledged by :func:`ingest` once its rows are
durable; the feed commits, per partition, the offset after the longest
*contiguous* run of acknowledged records -- never past an unacknowledged
one, never an offset at or below one already sent, only for partitions
still assigned. It commits from the task that fetches, before each fetch
(asynchronously: no wait for the broker), and synchronously when partitions
are revoked, in :meth:`~KafkaFeed.commit` and in :meth:`~KafkaFeed.aclose`.
An acknowledgement never calls the consumer: confluent-kafka serializes the
calls of one consumer, and a revocation runs *inside* a fetch. A commit the
group refuses (it rebalanced, the member was dropped) is logged and skipped:
the records come again.

Rebalances are incremental (``cooperative-sticky``, or KIP-848): only the
partitions that change hands are revoked or assigned, and librdkafka runs
the callbacks inside a fetch. A **revoked** partition's callback waits up to
``revoke_timeout`` seconds for its records in flight to be acknowledged,
commits them (the partition is still assigned during the callback, as
Kafka's guidance asks), and starts a new *epoch*: a record fetched before
and acknowledged after commits nothing, and the next owner reads it again.
A **lost** partition (this member's session expired) commits nothing. An
**assigned** one is fetched from its committed offset. A fetch returns only
records of their partition's current epoch (a partition revoked and
assigned again within one fetch is read again from its last acknowledged
record). As for any consumer, a write still in flight after
``revoke_timeout`` may land after the next owner's newer writes of the same
keys: keep it above the writer's worst ack latency, and below
``max.poll.interval.ms`` (the group's rebalance timeout).

Brokers that go away: librdkafka reconnects by itself (at most
``reconnect.backoff.max.ms`` between attempts: 1 s). A feed made by
:meth:`KafkaFeed.connect` notes when no broker answers and, past
``retry_for`` seconds (default 300, the setting every broker feed takes;
``math.inf``: for ever), :meth:`~KafkaFeed.fetch`
raises the last ``confluent_kafka.KafkaException``.

The pattern is Kafka's "commit in the revoke callback" guidance plus a
per-partition contiguous-ack watermark, as a producer's accumulator resolves
one future per message. asyncio only; the ``feeds`` extra (``confluent-kafka``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import anyio
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from typing_extensions import Self

from .._metrics import metrics_enabled, set_feed_lag
from ..errors import DecodeError
from .base import Message
from .broker import (
    DEFAULT_RETRY_FOR,
    BrokerFeed,
    FeedState,
    call_maybe_async,
    check_open,
    check_retry_for,
    require_asyncio,
)
from .kafkaclient import BrokerWatch, consumer_config
from .kafkaoffsets import TP, KafkaOffset, PartitionOffsets

__all__ = ["KafkaFeed", "KafkaOffset"]

log = logging.getLogger("lance_async.feeds")

#: Seconds one ``consume`` call waits at most: a fetch's wait is cut in such
#: slices, so a cancellation (each call is shielded: a consumer call left
#: running in its thread would hold the consumer) lands within one.
CONSUME_SLICE = 0.05

#: Commit errors that mean "the group moved on" (or is out of reach): the records come again.
_GROUP_MOVED = {
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError.STALE_MEMBER_EPOCH,
    KafkaError._ASSIGNMENT_LOST,
    KafkaError._STATE,
    KafkaError._NO_OFFSET,
    KafkaError._DESTROY,
    KafkaError._MAX_POLL_EXCEEDED,
    # no broker to commit to (it went away): as refused, the records come again
    KafkaError._WAIT_COORD,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
}

Partitions = Sequence[TopicPartition]
Callback = Callable[[Any, Partitions], Awaitable[None] | None]


def _payload(value: Any, where: KafkaOffset) -> bytes | pa.RecordBatch:
    if value is None:
        return b""  # a tombstone: a message with no rows, a bad one
    if isinstance(value, (bytes, pa.RecordBatch)):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise DecodeError(
        f"the Kafka record {where.topic}[{where.partition}]@{where.offset} has a value of type "
        f"{type(value).__name__}, which cannot be decoded; use a consumer whose values are "
        "bytes (no value deserializer) or a deserializer returning bytes, str or pa.RecordBatch",
        offset=where,
    )


class KafkaFeed(BrokerFeed):
    """A librdkafka consumer as a :class:`~lance_async.feeds.Feed`, committing after durability.

    Parameters
    ----------
    consumer : confluent_kafka.aio.AIOConsumer
        A group member that commits nothing by itself
        (:func:`~lance_async.feeds.kafkaclient.consumer_config`), subscribed
        with :meth:`subscribe` (the feed's rebalance callbacks).
    revoke_timeout : float
        Seconds a revocation waits for the revoked partitions' records in
        flight to be acknowledged (default 5; see the module notes).
    on_assign, on_revoke, on_lost : callable, optional
        Your own rebalance callbacks ``(consumer, partitions)``, sync or
        async, called after the feed's (a revocation's commit is done);
        ``on_lost`` defaults to ``on_revoke``.
    commit_metadata : str
        Metadata string committed with each offset (default "").
    close_timeout : float
        Seconds :meth:`aclose` may spend on its final commit (default 10).
    close_consumer : bool
        Also close the consumer in :meth:`aclose` (default False: the
        consumer is yours; :meth:`connect` makes one the feed owns).
    retry_for : float
        Seconds without any broker answering (told by ``watch``) after which
        :meth:`fetch` raises (default 300, as every broker feed's
        ``retry_for``; ``math.inf``: wait for ever).
    watch : BrokerWatch, optional
        The consumer's ``error_cb`` (:meth:`connect` sets one).

    Notes
    -----
    Messages: ``offset`` is a :class:`KafkaOffset` ``(topic, partition,
    offset)``; ``payload`` the record value (bytes; a tombstone gives
    ``b""``, a bad message: dead-lettered, or it stops the ingest; delete a
    key with the ``lance-op: delete`` header instead); ``headers`` the record headers as a
    dict (a repeated key keeps its last value). Records handed out and never
    acknowledged (a cancelled ingest) hold back their partition's commits
    while it stays assigned: close the feed; a new member resumes from the
    committed offsets. Partitions are ``(topic, partition)`` tuples.
    """

    def __init__(
        self,
        consumer: Any,
        *,
        revoke_timeout: float = 5.0,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        on_lost: Callback | None = None,
        commit_metadata: str = "",
        close_timeout: float = 10.0,
        close_consumer: bool = False,
        retry_for: float = DEFAULT_RETRY_FOR,
        watch: BrokerWatch | None = None,
    ) -> None:
        if revoke_timeout < 0:
            raise ValueError(f"revoke_timeout must be >= 0 seconds, got {revoke_timeout}")
        retry_for = check_retry_for(retry_for)
        self._consumer = consumer
        self.revoke_timeout = revoke_timeout
        self.close_timeout = close_timeout
        self.retry_for = retry_for
        self._watch = watch
        self._probed = 0.0
        self._metadata = commit_metadata
        self._owns_client = close_consumer
        self._chained = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost or on_revoke}
        self._state = FeedState.OPEN
        self._assigned: set[TP] = set()
        self._parts: dict[TP, PartitionOffsets] = {}
        self._epochs: dict[TP, int] = {}
        self._revoked_now: set[TP] = set()  # revoked or lost during the current consume
        self._lock: anyio.Lock | None = None
        self._changed: anyio.Event | None = None
        self._error: DecodeError | None = None
        self.fetched = 0
        """Records handed out by :meth:`fetch`."""
        self.acked = 0
        """Records acknowledged (fenced ones included)."""
        self.fenced_acks = 0
        """Acks of records fetched before their partition was revoked: not committed."""
        self.dropped = 0
        """Records fetched and not handed out: their partition was revoked meanwhile."""
        self.skipped_commits = 0
        """Commits left out because their partition was no longer assigned or the
        group rebalanced under them."""

    def __repr__(self) -> str:
        return f"<KafkaFeed state={self._state.value} partitions={len(self._assigned)}>"

    @classmethod
    async def connect(
        cls,
        bootstrap_servers: str,
        topics: Iterable[str],
        group_id: str,
        *,
        protocol: str = "classic",
        options: Mapping[str, Any] | None = None,
        client_id: str | None = None,
        **feed_options: Any,
    ) -> Self:
        """Make a group member (:func:`~lance_async.feeds.kafkaclient.consumer_config`:
        ``bootstrap_servers``, ``group_id``, ``protocol="consumer"`` for KIP-848,
        more librdkafka ``options``), subscribe it to ``topics``, and feed from it.

        ``feed_options`` are :class:`KafkaFeed`'s keywords. The feed owns the
        consumer (closed by :meth:`aclose`). Does not wait for a broker:
        librdkafka connects in the background, and fetches return nothing
        until the group assigned partitions.

        Raises
        ------
        ValueError
            A setting :func:`consumer_config` refuses.
        confluent_kafka.KafkaException
            librdkafka refused the settings.
        """
        require_asyncio("KafkaFeed")
        from confluent_kafka.aio import AIOConsumer

        config = consumer_config(
            bootstrap_servers, group_id, client_id=client_id, protocol=protocol, options=options
        )
        watch = BrokerWatch(f"Kafka feed of group {group_id!r}")
        made: list[KafkaFeed] = []

        async def on_commit(error: KafkaError | None, partitions: Partitions) -> None:
            if made:
                await made[0].on_commit(error, partitions)

        config.update(error_cb=watch, on_commit=on_commit)
        consumer = AIOConsumer(config, max_workers=4)
        feed = cls(consumer, close_consumer=True, watch=watch, **feed_options)
        made.append(feed)
        try:
            await feed.subscribe(list(topics))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await consumer.close()
            feed._state = FeedState.CLOSED
            raise
        return feed

    # -- properties ---------------------------------------------------------------
    @property
    def consumer(self) -> Any:
        """The ``AIOConsumer``."""
        return self._consumer

    @property
    def assigned(self) -> set[TP]:
        """The partitions assigned now, as ``(topic, partition)`` (a copy)."""
        return set(self._assigned)

    @property
    def committed(self) -> dict[TP, int]:
        """The offsets the broker confirmed to this feed, per partition assigned now."""
        return {tp: p.committed for tp, p in self._parts.items() if p.committed is not None}

    def epochs(self) -> dict[TP, int]:
        """Every partition's assignment epoch (a copy): it changes each time the
        partition is revoked or lost, and a record fetched in an earlier epoch
        is never committed. Never revoked: 0, or missing. Does not block."""
        return dict(self._epochs)

    def in_flight(self, tp: TP | None = None) -> int:
        """Records handed out and not yet acknowledged (of one partition, or all)."""
        if tp is not None:
            part = self._parts.get(tp)
            return 0 if part is None else part.in_flight()
        return sum(self.in_flight(t) for t in self._parts)

    # -- rebalance callbacks (librdkafka runs them inside a fetch) ---------------------
    async def subscribe(self, topics: Sequence[str]) -> None:
        """Subscribe the consumer to ``topics`` with this feed's rebalance callbacks."""
        await self._consumer.subscribe(
            list(topics), on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_lost
        )

    async def on_assign(self, consumer: Any, partitions: Partitions) -> None:
        """Partitions assigned: fetched from their committed offsets (a new epoch)."""
        self.assign([(tp.topic, tp.partition) for tp in partitions])
        await self._chain("assign", consumer, partitions)

    async def on_revoke(self, consumer: Any, partitions: Partitions) -> None:
        """Wait (bounded) for in-flight acks, commit, fence the partitions."""
        await self.revoke([(tp.topic, tp.partition) for tp in partitions])
        await self._chain("revoke", consumer, partitions)

    async def on_lost(self, consumer: Any, partitions: Partitions) -> None:
        """Partitions lost (this member was dropped): fenced at once, nothing committed."""
        await self.revoke([(tp.topic, tp.partition) for tp in partitions], lost=True)
        await self._chain("lost", consumer, partitions)

    def assign(self, partitions: Iterable[TP]) -> None:
        """Note partitions as assigned (what :meth:`on_assign` does; does not block)."""
        for tp in partitions:
            self._assigned.add(tp)
            self._parts.pop(tp, None)

    async def revoke(self, partitions: Iterable[TP], *, lost: bool = False) -> None:
        """What :meth:`on_revoke` (or, ``lost``, :meth:`on_lost`) does: wait up to
        ``revoke_timeout`` for the partitions' records in flight, commit them
        (not when ``lost``), and start a new epoch for each.

        Call it only from a rebalance callback or the task that fetches (it
        commits through the consumer)."""
        tps = [tp for tp in partitions if tp in self._assigned]
        if not lost:
            # a closed feed takes no more acks: nothing to wait for (a consumer's close
            # revokes what it still has)
            wait = self.revoke_timeout if self._state is FeedState.OPEN else 0.0
            with anyio.move_on_after(wait):
                while any(self.in_flight(tp) for tp in tps):
                    await self._wait_change()
            await self._commit_sync(tps)
        for tp in tps:
            self._assigned.discard(tp)
            self._revoked_now.add(tp)
            part = self._parts.pop(tp, None)
            self._epochs[tp] = self._epochs.get(tp, 0) + 1
            left = 0 if part is None else part.in_flight()
            if left:
                log.warning(
                    "%r: %d records of %s %s were not acknowledged; their offsets are not "
                    "committed (the next owner reads them again)",
                    self,
                    left,
                    "lost" if lost else "revoked",
                    tp,
                    extra={"feed": f"kafka:{tp[0]}", "partition": tp[1]},
                )
        self._notify()

    async def _chain(self, which: str, consumer: Any, partitions: Partitions) -> None:
        fn = self._chained[which]
        if fn is not None:
            await call_maybe_async(fn, consumer, partitions)

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

    def _partition(self, tp: TP) -> PartitionOffsets:
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = PartitionOffsets(tp, self._epochs.get(tp, 0), self)
        return part

    def _offsets(self, parts: Iterable[PartitionOffsets], above: str) -> list[TopicPartition]:
        """The commit of ``parts`` whose watermark passed their ``above`` offset."""
        out, now = [], time.monotonic()
        for part in parts:
            if not part.due(above, now) or part.watermark is None:
                continue
            if part.tp not in self._assigned or self._parts.get(part.tp) is not part:
                self.skipped_commits += 1
                continue
            out.append(TopicPartition(*part.tp, part.watermark, metadata=self._metadata))
        return out

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A consumer call, shielded: cancelled, it would go on in its thread
        and hold the consumer (confluent-kafka serializes its calls, and a
        rebalance callback may run inside). A cancellation lands right after."""
        with anyio.CancelScope(shield=True):
            result = await getattr(self._consumer, method)(*args, **kwargs)
        await anyio.lowlevel.checkpoint_if_cancelled()
        return result

    async def _commit_async(self) -> None:
        """Send (without waiting) what passed the last offset sent, and again what
        the broker did not confirm in time (``kafkaoffsets.CONFIRM``)."""
        offsets = self._offsets(self._parts.values(), "sent")
        if not offsets:
            return
        try:
            await self._call("commit", offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            self._refused(offsets, exc)
            return
        now = time.monotonic()
        for tp in offsets:
            self._parts[(tp.topic, tp.partition)].was_sent(tp.offset, now)

    async def on_commit(self, error: KafkaError | None, partitions: Partitions) -> None:
        """An asynchronous commit's result (the consumer's ``on_commit``
        setting; :meth:`connect` sets it): what the broker confirmed, or, if it
        refused, sent again by the next fetch. Does not block."""
        for tp in partitions:
            part = self._parts.get((tp.topic, tp.partition))
            if part is not None and tp.offset >= 0:
                if error is None and not tp.error:
                    part.confirmed(tp.offset)
                else:
                    part.refused()

    async def _commit_sync(self, tps: Iterable[TP]) -> dict[TP, int]:
        async with self._lock_():
            parts = [self._parts[tp] for tp in tps if tp in self._parts]
            offsets = self._offsets(parts, "committed")
            if not offsets:
                return {}
            try:
                result = await self._call("commit", offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                self._refused(offsets, exc)
                return {}
            done: dict[TP, int] = {}
            for tp in result or offsets:
                if getattr(tp, "error", None):
                    self._refused([tp], KafkaException(tp.error))
                    continue
                part = self._parts.get((tp.topic, tp.partition))
                if part is not None:
                    part.confirmed(tp.offset)
                done[(tp.topic, tp.partition)] = tp.offset
            return done

    def _refused(self, offsets: Sequence[TopicPartition], exc: KafkaException) -> None:
        error = exc.args[0] if exc.args else None
        code = error.code() if isinstance(error, KafkaError) else None
        if code not in _GROUP_MOVED and not (isinstance(error, KafkaError) and error.retriable()):
            raise exc
        self.skipped_commits += len(offsets)
        log.warning(
            "%r: commit of %s skipped (%s); those records will be delivered again",
            self,
            sorted((tp.topic, tp.partition, tp.offset) for tp in offsets),
            error,
            extra={"feed": "kafka"},
        )

    async def _probe(self) -> None:
        """While no broker answers: ask for metadata (at most once a second) to
        notice one that is back; raise past ``retry_for``."""
        watch = self._watch
        if watch is None or watch.down_since is None:
            return
        now = time.monotonic()
        if now - self._probed >= 1.0:
            self._probed = now
            with contextlib.suppress(KafkaException):
                await self._call("list_topics", timeout=1.0)
                return watch.up()
        if now - watch.down_since > self.retry_for:
            raise KafkaException(watch.last or KafkaError(KafkaError._ALL_BROKERS_DOWN))

    async def _consume(self, max_messages: int, timeout: float) -> list[Any]:
        """What librdkafka has now, or the first records within ``timeout``."""
        records: list[Any] = await self._call("consume", max_messages, 0)
        deadline = anyio.current_time() + timeout
        while not records:
            left = deadline - anyio.current_time()
            if left <= 0:
                break
            records = await self._call("consume", max_messages, min(left, CONSUME_SLICE))
        return records

    async def rewind(self, tp: TP) -> None:
        """Read partition ``tp`` again from its last acknowledged record.

        What was acknowledged is committed first; records handed out and not
        acknowledged are fenced (a new epoch) and fetched again. Call it
        only from the task that fetches. Does nothing to a partition not
        assigned here.
        """
        if tp not in self._assigned:
            return
        await self._commit_sync([tp])
        part = self._parts.pop(tp, None)
        offset = None if part is None else part.watermark
        self._epochs[tp] = self._epochs.get(tp, 0) + 1
        if offset is None:
            found = await self._call("committed", [TopicPartition(*tp)], timeout=10.0)
            offset = found[0].offset if found and found[0].offset >= 0 else OFFSET_BEGINNING
        try:
            await self._call("seek", TopicPartition(*tp, offset))
        except KafkaException:  # not fetching yet: assigning it afresh starts at the commit
            await self._call("incremental_unassign", [TopicPartition(*tp)])
            await self._call("incremental_assign", [TopicPartition(*tp, offset)])
        self._notify()

    # -- the Feed protocol --------------------------------------------------------
    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        """Commit what is acknowledged (without waiting), then the records available now.

        Parameters
        ----------
        max_messages : int
            At most this many records (>= 1).
        timeout : float
            Seconds to wait when nothing is buffered.

        Returns
        -------
        list of Message
            In offset order within each partition, of their partition's
            current epoch (rebalance callbacks run inside); ``[]`` when
            nothing came within ``timeout``.

        Raises
        ------
        ClosedError
            The feed was closed.
        DecodeError
            A record value is not bytes, str or a record batch (a value
            deserializer returning something else); ``offset`` is its
            :class:`KafkaOffset`. Nothing of that fetch is handed out and the
            feed stays failed: close it; a new member reads them again.
        confluent_kafka.KafkaException
            A fatal consumer error; no broker for ``retry_for`` seconds.
        """
        check_open(self._state, repr(self))
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        if self._error is not None:
            raise self._error
        await self._probe()
        await self._commit_async()
        assigned_before = set(self._assigned)
        self._revoked_now = set()
        records = await self._consume(max_messages, timeout)
        if records and self._watch is not None:
            self._watch.up()
        again = {tp for tp in self._revoked_now & self._assigned if tp in assigned_before}
        # every value is checked before any record is registered as handed out
        taken: list[tuple[TP, KafkaOffset, bytes | pa.RecordBatch, Any]] = []
        try:
            for record in records:
                error = record.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    log.warning("%r: %s", self, error, extra={"feed": "kafka"})
                    continue
                tp = (record.topic(), record.partition())
                if tp not in self._assigned or tp in again:
                    self.dropped += 1  # fetched before its revocation: never handed out
                    continue
                where = KafkaOffset(tp[0], tp[1], record.offset())
                taken.append((tp, where, _payload(record.value(), where), record.headers()))
        except DecodeError as exc:
            self._error = exc
            raise
        for tp in sorted(again):  # revoked and assigned again in this fetch: read it again
            await self.rewind(tp)
        out: list[Message] = []
        last: dict[TP, int] = {}
        for tp, where, payload, headers in taken:
            part = self._partition(tp)
            part.hand_out(where.offset)
            last[tp] = where.offset
            if headers:
                out.append(Message(where, payload, dict(headers), _owner=part))
            else:
                out.append(Message(where, payload, _owner=part))
        self.fetched += len(out)
        if last and metrics_enabled():
            await self._report_lag(last)
        return out

    async def ack_batch(self, messages: Sequence[Message]) -> None:
        """Acknowledge ``messages`` (durable): each partition's watermark moves on.

        Nothing is sent here: the next fetch commits (see the module notes).
        An acknowledgement of a record fetched before its partition was
        revoked commits nothing (:attr:`fenced_acks`). Does not block.

        Raises
        ------
        ClosedError
            The feed was closed.
        """
        check_open(self._state, repr(self))
        touched: set[PartitionOffsets] = set()
        for m in messages:
            if m.acked:
                continue
            m.acked = True
            self.acked += 1
            part: PartitionOffsets = m._owner
            offset = m.offset.offset
            if self._parts.get(part.tp) is not part or not part.ack(offset):
                self.fenced_acks += 1
                log.debug(
                    "%r: %s@%d was fetched before a revocation; not committed",
                    self,
                    part.tp,
                    offset,
                    extra={"feed": f"kafka:{part.tp[0]}", "partition": part.tp[1]},
                )
                continue
            touched.add(part)
        for part in touched:
            part.advance()
        if touched:
            self._notify()
        await anyio.lowlevel.checkpoint()

    async def commit(self) -> dict[TP, int]:
        """Commit what is acknowledged and not yet confirmed, and await the broker.

        Call it from the task that fetches (or when nothing fetches).

        Returns ``{(topic, partition): offset}`` the broker confirmed (the
        offset of the next record to read).

        Raises
        ------
        ClosedError
            The feed was closed.
        confluent_kafka.KafkaException
            The broker refused, and not because of a rebalance (logged, skipped).
        """
        check_open(self._state, repr(self))
        return await self._commit_sync(list(self._parts))

    async def aclose(self) -> None:
        """Commit what is acknowledged; close the consumer if the feed owns it.

        Shielded from cancellation and bounded by ``close_timeout`` seconds.
        Safe to call twice. Records in flight stay uncommitted (delivered
        again to the group).
        """
        if self._state is FeedState.CLOSED:
            return
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(self.close_timeout):
                    await self._commit_sync(list(self._parts))
            except KafkaException as exc:  # the records come again to the group
                log.warning("%r: final commit failed: %s", self, exc, extra={"feed": "kafka"})
            finally:
                self._state = FeedState.CLOSED
                if self._owns_client:
                    # librdkafka's close waits on the group (a leave, a rebalance's
                    # callbacks): bounded too, its thread left to finish (seen: one
                    # that never returned beside a busy core hung the close for good)
                    with anyio.move_on_after(self.close_timeout) as bounded:
                        await self._consumer.close()
                    if bounded.cancelled_caught:
                        log.warning(
                            "%r: the consumer's close did not return within %.1f s; left to finish",
                            self,
                            self.close_timeout,
                            extra={"feed": "kafka"},
                        )

    async def _report_lag(self, last: dict[TP, int]) -> None:
        """Each partition's lag as the fetch tells it (high watermark minus the next offset)."""
        for tp, offset in last.items():
            with contextlib.suppress(KafkaException):
                marks = await self._call("get_watermark_offsets", TopicPartition(*tp), cached=True)
                if marks is not None:
                    set_feed_lag(f"kafka:{tp[0]}", tp[1], marks[1] - (offset + 1))
