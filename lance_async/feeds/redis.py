"""Redis Streams as a feed: a consumer group read with XREADGROUP, acked with XACK.

:class:`RedisStreamFeed` is one consumer of a Redis consumer group
(``redis.asyncio``). It acknowledges an entry with ``XACK`` only when
:func:`ingest` acks its :class:`~lance_async.feeds.Message` -- after every
row decoded from it is durable in the MemWAL.

Recovery of unacknowledged entries
----------------------------------
Redis keeps each delivered, unacknowledged entry in the group's pending
entries list (PEL), owned by the consumer it was delivered to. A consumer
that dies between the durable write and the ``XACK`` leaves its entries
there; nothing would deliver them again on its own. The feed therefore reads
in three phases, as the Redis Streams documentation recommends:

1. **its own pending entries** first (``XREADGROUP ... 0``): a consumer that
   restarts under the same name re-reads what it had not acknowledged;
2. **entries of dead consumers** (``XAUTOCLAIM`` with ``min_idle_time``):
   entries idle for longer than that are moved to this consumer and
   delivered again -- on start, and then every ``claim_interval`` seconds;
3. **new entries** (``XREADGROUP ... >`` with ``BLOCK``).

Delivery is at least once; a primary key makes the end state the same
when the copies come in stream order. ``min_idle_time`` must exceed the
longest time a live consumer may hold an entry between delivery and ack (the
writer's ack latency under backpressure): otherwise a live consumer's
entries are claimed and written again *after* newer entries, and an old
version of their keys lands over a newer one (newest-wins is by arrival).

Entries
-------
``offset`` is the entry id (``"<ms>-<seq>"``, a str). ``payload`` is the
value of the ``field`` (default ``b"data"``) as bytes; the other fields go
to ``headers`` (str keys, bytes values). With ``field=None``, or for an
entry that lacks the field, the payload is the whole entry as one JSON
object (field names to UTF-8 strings) -- with the default decoder, an entry
whose fields are the table's columns is a row, and any other entry fails
with :class:`~lance_async.DecodeError` naming its id (or goes to the
dead-letter hook); it is never skipped silently. An entry deleted (``XDEL``,
``XTRIM``) while pending has no data left, nothing to write and nothing to
set aside: the feed acknowledges it itself, logs it, counts it in
``vanished`` and hands it out to nobody. (An entry whose payload field is
empty *is* handed out: an empty message is a bad message, see
:func:`~lance_async.feeds.decode_json`.)

Notes
-----
redis.asyncio runs on asyncio only; so does this feed (on trio,
:meth:`RedisStreamFeed.connect` raises :class:`~lance_async.LanceAsyncError`).
Requires the ``feeds`` extra (``redis``). The client must not decode
responses to str for binary payloads (``decode_responses=False``, the
default); str responses are encoded back to UTF-8.
"""

from __future__ import annotations

import enum
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import redis.asyncio
import redis.exceptions

from .._retry import Backoff
from .base import Message
from .broker import (
    DEFAULT_RETRY_FOR,
    BrokerFeed,
    FeedState,
    check_open,
    check_retry_for,
    require_asyncio,
)

__all__ = ["RedisStreamFeed"]

log = logging.getLogger("lance_async.feeds")


class _Phase(enum.Enum):
    OWN = "own pending entries"
    CLAIM = "claiming idle entries"
    NEW = "new entries"


#: Errors after which a command is tried again: the connection timed out or
#: broke (a paused process, a restarted server); redis-py reconnects.
TRANSIENT = (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class RedisStreamFeed(BrokerFeed):
    """One consumer of a Redis Streams consumer group, as a :class:`~lance_async.feeds.Feed`.

    Create it with :meth:`connect` (owning its client) or directly on a
    client you own, then ``await feed.ensure_group()`` (``connect`` does it),
    and use it as ``async with``.

    Parameters
    ----------
    client : redis.asyncio.Redis
        The client (``decode_responses=False`` recommended).
    stream : str
        The stream key.
    group : str
        The consumer group.
    consumer : str, optional
        This consumer's name in the group. Give a stable name (a host or pod
        name) so a restart re-reads its own pending entries at once; the
        default, a random name, relies on ``XAUTOCLAIM`` after
        ``min_idle_time``.
    field : bytes or str or None
        The entry field holding the payload (default ``b"data"``); None:
        the whole entry as a JSON object (see the module notes).
    min_idle_time : float
        Seconds an entry must have been pending before it is claimed from
        another consumer (default 30).
    claim_interval : float or None
        Seconds between claim passes after the first one (default 60); None
        claims only when the feed starts.
    owns_client : bool
        Close ``client`` in :meth:`aclose` (default False).
    retry_for : float
        Seconds a read, claim or ack keeps retrying (with back-off: 0.05 s
        doubling to 2 s) after the connection timed out or broke -- a
        process paused longer than redis-py's socket timeout, a Redis
        restart -- before the error reaches the caller (default
        :data:`~lance_async.feeds.broker.DEFAULT_RETRY_FOR`, five minutes,
        the setting every broker feed takes; 0: no retry; ``math.inf``: for
        ever). A read interrupted this way is redone from this consumer's
        pending list, so nothing it took is lost.

    Notes
    -----
    ``exhausted`` is always False: a stream has no end.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        stream: str,
        group: str,
        consumer: str | None = None,
        *,
        field: bytes | str | None = b"data",
        min_idle_time: float = 30.0,
        claim_interval: float | None = 60.0,
        owns_client: bool = False,
        retry_for: float = DEFAULT_RETRY_FOR,
    ) -> None:
        retry_for = check_retry_for(retry_for)
        if min_idle_time < 0:
            raise ValueError(f"min_idle_time must be >= 0 seconds, got {min_idle_time}")
        if claim_interval is not None and claim_interval <= 0:
            raise ValueError(f"claim_interval must be > 0 seconds or None, got {claim_interval}")
        self._client = client
        self.stream = stream
        self.group = group
        self.consumer = consumer or f"lance_async-{uuid.uuid4().hex[:12]}"
        self._field = None if field is None else _bytes(field)
        self.min_idle_time = min_idle_time
        self.claim_interval = claim_interval
        self._owns_client = owns_client
        self.retry_for = retry_for
        self._state = FeedState.OPEN
        self._phase = _Phase.OWN
        self._own_cursor = "0-0"
        self._claim_cursor = "0-0"
        self._last_claim = float("-inf")
        self._interrupted = False
        self._inflight: set[str] = set()
        self.fetched = 0
        """Entries handed out by :meth:`fetch` so far (re-deliveries included)."""
        self.claimed = 0
        """Entries taken over from other consumers with ``XAUTOCLAIM``."""
        self.acked = 0
        """Entries acknowledged so far."""
        self.vanished = 0
        """Pending entries found deleted from the stream (acknowledged by the feed)."""
        self._gone: list[str] = []

    @classmethod
    async def connect(
        cls,
        url: str = "redis://127.0.0.1:6379",
        *,
        stream: str,
        group: str,
        consumer: str | None = None,
        field: bytes | str | None = b"data",
        min_idle_time: float = 30.0,
        claim_interval: float | None = 60.0,
        retry_for: float = DEFAULT_RETRY_FOR,
        start_id: str = "0",
        client_options: Mapping[str, Any] | None = None,
    ) -> RedisStreamFeed:
        """Connect to Redis and join (creating if needed) a consumer group.

        Parameters
        ----------
        url : str
            A Redis URL (default ``redis://127.0.0.1:6379``).
        stream, group, consumer, field, min_idle_time, claim_interval, retry_for
            See the class.
        start_id : str
            Where a *new* group starts: ``"0"`` (default) the whole stream,
            ``"$"`` only entries added from now on.
        client_options : mapping, optional
            Passed to ``redis.asyncio.Redis.from_url``.

        Returns
        -------
        RedisStreamFeed
            Owning its client.

        Raises
        ------
        LanceAsyncError
            Not running on asyncio.
        redis.exceptions.ConnectionError
            Redis is not reachable.
        redis.exceptions.ResponseError
            The key exists and is not a stream.
        """
        require_asyncio("RedisStreamFeed")
        client = redis.asyncio.Redis.from_url(url, **dict(client_options or {}))
        feed = cls(
            client,
            stream,
            group,
            consumer,
            field=field,
            min_idle_time=min_idle_time,
            claim_interval=claim_interval,
            owns_client=True,
            retry_for=retry_for,
        )
        try:
            await feed.ensure_group(start_id)
        except BaseException:
            await feed.aclose()
            raise
        return feed

    async def ensure_group(self, start_id: str = "0") -> bool:
        """Create the consumer group (and the stream, ``MKSTREAM``) if missing.

        Parameters
        ----------
        start_id : str
            The new group's last-delivered id: ``"0"`` reads the whole
            stream, ``"$"`` only new entries.

        Returns
        -------
        bool
            True when the group was created, False when it existed.

        Raises
        ------
        redis.exceptions.ResponseError
            Anything but "the group exists" (``BUSYGROUP``).
        """
        require_asyncio("RedisStreamFeed")
        try:
            await self._client.xgroup_create(self.stream, self.group, id=start_id, mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False
        return True

    def __repr__(self) -> str:
        return (
            f"<RedisStreamFeed stream={self.stream!r} group={self.group!r} "
            f"consumer={self.consumer!r} state={self._state.value}>"
        )

    # -- the Feed protocol --------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Entries handed out and not yet acknowledged."""
        return len(self._inflight)

    def _payload(self, fields: Mapping[Any, Any]) -> tuple[bytes, dict[str, Any]]:
        raw = {_bytes(k): _bytes(v) for k, v in fields.items()}
        if not raw:
            return b"", {}
        if self._field is not None and self._field in raw:
            payload = raw.pop(self._field)
            # a field name need not be UTF-8: never let one stop the stream
            return payload, {k.decode("utf-8", "backslashreplace"): v for k, v in raw.items()}
        row = {
            k.decode("utf-8", "backslashreplace"): v.decode("utf-8", "backslashreplace")
            for k, v in raw.items()
        }
        return json.dumps(row).encode(), {}

    def _messages(self, entries: list[Any]) -> list[Message]:
        out: list[Message] = []
        for entry_id, fields in entries:
            offset = _text(entry_id)
            if offset in self._inflight:
                continue  # ours, still being written: never hand it out twice
            if not fields:  # deleted from the stream while pending: nothing left
                self._gone.append(offset)
                continue
            payload, headers = self._payload(fields)
            self._inflight.add(offset)
            out.append(Message(offset, payload, headers, _ack=self._acker(offset)))
        self.fetched += len(out)
        return out

    async def ack_batch(self, messages: Sequence[Message]) -> None:
        """Acknowledge ``messages`` with one ``XACK`` per 1,000 ids.

        What :func:`~lance_async.feeds.ingest` calls for a micro-batch whose
        rows are durable: one round trip instead of one per entry. Messages
        acknowledged before are skipped.

        Raises
        ------
        LanceAsyncError
            The feed is closed.
        redis.exceptions.RedisError
            The server refused the request (nothing of that chunk is acked).
        """
        check_open(self._state, repr(self))
        offsets = [str(m.offset) for m in messages if not m.acked]
        for start in range(0, len(offsets), 1000):
            chunk = offsets[start : start + 1000]
            await self._retrying(self._client.xack, self.stream, self.group, *chunk)
            self._inflight.difference_update(chunk)
            self.acked += len(chunk)
        for m in messages:
            m.acked = True

    def _acker(self, offset: str) -> Any:
        async def ack() -> None:
            check_open(self._state, repr(self))
            await self._retrying(self._client.xack, self.stream, self.group, offset)
            self._inflight.discard(offset)
            self.acked += 1

        return ack

    async def _read(self, entry_id: str, count: int, block_ms: int | None) -> list[Any]:
        response: Any = await self._client.xreadgroup(
            self.group, self.consumer, {self.stream: entry_id}, count=count, block=block_ms
        )
        if not response:
            return []
        if isinstance(response, dict):  # RESP3 ({stream: [entries]}) or unified ({stream: entries})
            value: list[Any] = list(next(iter(response.values()), []))
            if len(value) == 1 and isinstance(value[0], list):
                value = value[0]
            return value
        return list(response[0][1])

    async def _claim(self, count: int) -> list[Any]:
        reply: Any = await self._client.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            min_idle_time=int(self.min_idle_time * 1000),
            start_id=self._claim_cursor,
            count=count,
        )
        self._claim_cursor = _text(reply[0])
        entries = list(reply[1])
        if self._claim_cursor in ("0-0", "0"):
            self._phase = _Phase.NEW
            self._last_claim = time.monotonic()
        fresh = [e for e in entries if _text(e[0]) not in self._inflight]
        if fresh:
            log.info(
                "%r: claimed %d idle entries from other consumers",
                self,
                len(fresh),
                extra={"feed": f"redis:{self.stream}"},
            )
            self.claimed += len(fresh)
        return entries

    async def backlog(self) -> int | None:
        """Entries of the stream the group has not seen acknowledged.

        Returns
        -------
        int or None
            The group's lag (entries not yet delivered to any consumer) plus
            its pending entries (delivered, not acknowledged), from one
            ``XINFO GROUPS``; None when Redis cannot say (the lag is unknown
            after entries were deleted from the middle of the stream, or a
            Redis before 7.0). ``lance-async ingest`` uses it to tell
            "caught up" from "stopped with entries outstanding".

        Raises
        ------
        LanceAsyncError
            The feed is closed.
        redis.exceptions.RedisError
            The server refused the request.
        """
        check_open(self._state, repr(self))
        groups: Any = await self._client.xinfo_groups(self.stream)
        for info in groups:
            fields = {_text(k): v for k, v in info.items()}
            if _text(fields.get("name", b"")) != self.group:
                continue
            lag = fields.get("lag")
            if lag is None:
                return None
            return int(lag) + int(fields.get("pending") or 0)
        return None

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` entries: own pending, then claimed, then new ones.

        Parameters
        ----------
        max_messages : int
            ``COUNT`` of each read (>= 1).
        timeout : float
            Seconds to block for new entries (``BLOCK``); 0 does not block.

        Returns
        -------
        list of Message
            ``[]`` when nothing arrived within ``timeout``. Never an entry
            this feed handed out and has not acknowledged yet.

        Raises
        ------
        ClosedError
            The feed was closed.
        redis.exceptions.RedisError
            The server or the connection failed; the group was deleted
            (``NOGROUP``).

        Notes
        -----
        Cancellation: entries Redis delivered to a cancelled read stay in
        this consumer's pending list; the next fetch re-reads that list
        before new entries, so none is lost.
        """
        check_open(self._state, repr(self))
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        if self._interrupted:
            # A read was cancelled or failed: what it took is in our pending list.
            self._phase, self._own_cursor = _Phase.OWN, "0-0"
        self._interrupted = True
        deadline = time.monotonic() + max(timeout, 0.0)
        backoff = Backoff(0.05, 2.0, give_up_after=self.retry_for)
        while True:
            try:
                out = await self._fetch(max_messages, deadline)
                break
            except TRANSIENT as exc:
                if backoff.exhausted():
                    raise
                log.warning("%r: %s; reading again in %.2f s", self, exc, backoff.wait)
                # the lost reply may have delivered entries: they are ours now
                self._phase, self._own_cursor = _Phase.OWN, "0-0"
                await backoff.sleep()
        self._interrupted = False
        if self._gone:
            gone, self._gone = self._gone, []
            await self._retrying(self._client.xack, self.stream, self.group, *gone)
            self.vanished += len(gone)
            log.info(
                "%r: %d pending entries were deleted from the stream (XDEL, XTRIM) before "
                "they were written; acknowledged without rows: %s",
                self,
                len(gone),
                ", ".join(gone[:10]) + (" ..." if len(gone) > 10 else ""),
            )
        return out

    async def _retrying(self, call: Any, *args: Any) -> Any:
        """``await call(*args)``, again after a transient error, for up to
        ``retry_for`` seconds (for idempotent commands: ``XACK``)."""
        backoff = Backoff(0.05, 2.0, give_up_after=self.retry_for)
        while True:
            try:
                return await call(*args)
            except TRANSIENT as exc:
                if backoff.exhausted():
                    raise
                log.warning("%r: %s; trying again in %.2f s", self, exc, backoff.wait)
                await backoff.sleep()

    async def _fetch(self, count: int, deadline: float) -> list[Message]:
        while True:
            if self._phase is _Phase.OWN:
                entries = await self._read(self._own_cursor, count, None)
                if not entries:
                    self._phase, self._claim_cursor = _Phase.CLAIM, "0-0"
                    continue
                self._own_cursor = _text(entries[-1][0])
                messages = self._messages(entries)
                if messages:
                    return messages
                continue
            if self._phase is _Phase.CLAIM:
                messages = self._messages(await self._claim(count))
                if messages:
                    return messages
                if self._phase is _Phase.CLAIM and time.monotonic() >= deadline:
                    return []
                continue
            now = time.monotonic()
            if self.claim_interval is not None and now - self._last_claim >= self.claim_interval:
                self._phase, self._claim_cursor = _Phase.CLAIM, "0-0"
                continue
            block_ms = int((deadline - now) * 1000)
            entries = await self._read(">", count, block_ms if block_ms >= 1 else None)
            return self._messages(entries)

    async def aclose(self) -> None:
        """Stop reading; close the client when the feed owns it.

        Unacknowledged entries stay in this consumer's pending list: a
        restart under the same name re-reads them, another consumer claims
        them after ``min_idle_time``. Safe to call twice; shielded from
        cancellation.
        """
        if self._state is FeedState.CLOSED:
            return
        self._state = FeedState.CLOSED
        if self._owns_client:
            with anyio.CancelScope(shield=True):
                await self._client.aclose()
