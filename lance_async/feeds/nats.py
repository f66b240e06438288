"""NATS JetStream as a feed: a durable pull consumer with explicit acks.

:class:`JetStreamFeed` pulls messages from a JetStream stream through a
*durable* pull consumer (nats-py's ``JetStreamContext.pull_subscribe``) and
acknowledges each message with ``msg.ack()`` only when :func:`ingest` acks
the :class:`~lance_async.feeds.Message` -- after every row decoded from it
is durable in the MemWAL.

Delivery and redelivery
-----------------------
The consumer uses ``AckPolicy.EXPLICIT``. A message that was delivered but
not acknowledged within ``ack_wait`` seconds is delivered again by the
server, to whichever client of the same durable pulls next (the same
process after a reconnect, or another one): a crash between the durable
write and the ack therefore costs a redelivery, never a loss, and the
primary key's newest-wins makes the table the same. Set ``ack_wait`` above
the longest time a message may spend between fetch and ack (the writer's
ack latency under backpressure); a message that outlives it is delivered
again while the first copy is still in flight. That redelivery is *not*
harmless: it comes after messages delivered since, so writing it again
would put an old version of its keys over newer ones (newest-wins is by
arrival, not by version). A feed that took its durable over (``take_over``:
the only reader) therefore never hands out a stream sequence twice: a
redelivered copy of a message still in flight is held back and
acknowledged with it, one of a message already acknowledged is
acknowledged again at once (its rows are durable: that is what the first
ack said). What such a feed handed out and never acknowledged comes again
when the durable is next taken over (restarted at its ack floor, in stream
order), not after ``ack_wait``. ``max_deliver`` (optional) caps the
deliveries of a poison message.

The design follows JetStream's own pull-consumer guidance (``Fetch`` in
batches, ``AckExplicit``, durable names survive restarts) and nats-py's
``PullSubscription.fetch``.

A server that restarts
----------------------
A feed made by :meth:`JetStreamFeed.connect` reconnects for as long as
``retry_for`` allows (default five minutes, the setting every broker feed
takes: :data:`~lance_async.feeds.broker.DEFAULT_RETRY_FOR`): nats-py
retries the connection every ``reconnect_time_wait`` (0.5 s, with its
jitter) without a cap on attempts, a fetch meanwhile returns no message
after its timeout, and acks are kept in nats-py's buffer and sent once the
connection is back (a lost one costs a redelivery, never a loss). The
durable consumer lives in the server's store, so the reconnected feed
pulls where it stopped; the acks sent just before the connection went down
are sent again once it is back (a server killed a moment after it took
them may have lost them). Once the connection has been down ``retry_for``
seconds, ``fetch`` raises :class:`~lance_async.LanceAsyncError`
(``retryable``); a client given to :meth:`JetStreamFeed.from_client`
reconnects by its own options, and the feed still gives up after
``retry_for``.

Notes
-----
nats-py runs on asyncio only; so does this feed (on trio, :meth:`connect`
raises :class:`~lance_async.LanceAsyncError`). Requires the ``feeds`` extra
(``nats-py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from .._metrics import set_feed_lag
from .._retry import Backoff
from ..errors import LanceAsyncError
from .base import Message
from .broker import (
    DEFAULT_RETRY_FOR,
    BrokerFeed,
    FeedState,
    check_open,
    check_retry_for,
    require_asyncio,
)

__all__ = ["JetStreamFeed"]

log = logging.getLogger("lance_async.feeds")

#: The shortest fetch wait sent to the server (seconds); nats-py needs > 0.
MIN_FETCH_TIMEOUT = 0.01

#: Seconds before a lost connection was noticed whose acks are sent again
#: once it is back (see ``JetStreamFeed._watch_connection``).
REACK_WINDOW = 10.0
#: The most acks kept for that.
REACK_LIMIT = 20_000

#: What nats-py raises while the connection is away (reconnecting, closed
#: under the feed, no server, a full buffer of what waits for it).
_AWAY = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.FlushTimeoutError,
    nats.js.errors.ServiceUnavailableError,
)


class JetStreamFeed(BrokerFeed):
    """A NATS JetStream durable pull consumer as a :class:`~lance_async.feeds.Feed`.

    Create it with :meth:`connect` (which owns its connection) or
    :meth:`from_client` (on a connection you own), and use it as
    ``async with``.

    Parameters
    ----------
    client : nats.aio.client.Client
        A connected NATS client.
    subscription : JetStreamContext.PullSubscription
        The pull subscription bound to the durable consumer.
    stream, subject, durable : str
        What the subscription reads (kept for ``repr`` and errors).
    owns_client : bool
        Close ``client`` in :meth:`aclose` (after flushing the acks).
    ack_sync : bool
        Acknowledge with ``msg.ack_sync()`` (waits for the server's reply,
        one round trip per message) instead of ``msg.ack()`` (published,
        flushed with the connection's next write).
    ack_sync_timeout : float
        Seconds ``ack_sync`` waits for the server (default 5).
    close_timeout : float
        Seconds :meth:`aclose` may spend unsubscribing and flushing (default 5).
    retry_for : float
        Seconds the connection may stay down before :meth:`fetch` raises
        (default five minutes; see the module notes).

    Notes
    -----
    Messages are those of :class:`~lance_async.feeds.Message`: ``offset`` is
    the stream sequence (``msg.metadata.sequence.stream``, an int, unique
    and increasing in the stream), ``payload`` the message data (bytes),
    ``headers`` the NATS headers (``{}`` when none). ``exhausted`` is always
    False: a stream never ends.
    """

    def __init__(
        self,
        client: Client,
        subscription: JetStreamContext.PullSubscription,
        *,
        stream: str,
        subject: str,
        durable: str,
        owns_client: bool = False,
        ack_sync: bool = False,
        ack_sync_timeout: float = 5.0,
        close_timeout: float = 5.0,
        took_over: bool = False,
        retry_for: float = DEFAULT_RETRY_FOR,
    ) -> None:
        self._client = client
        self._sub = subscription
        self.stream = stream
        self.subject = subject
        self.durable = durable
        self._owns_client = owns_client
        self._ack_sync = ack_sync
        self._ack_sync_timeout = ack_sync_timeout
        self.close_timeout = close_timeout
        self._state = FeedState.OPEN
        self.fetched = 0
        """Messages handed out by :meth:`fetch` so far (redeliveries included)."""
        self.acked = 0
        """Messages acknowledged so far."""
        self.held_back = 0
        """Redelivered copies of messages this feed had handed out already,
        not handed out again (only with ``take_over``: see the module notes)."""
        self._took_over = took_over
        self.retry_for = check_retry_for(retry_for)
        self._down_since: float | None = None  # when the connection was first seen down
        # the last acks, with when they were sent: sent again after a reconnect
        self._recent: deque[tuple[float, Msg]] = deque(maxlen=REACK_LIMIT)
        self._highest = 0  # highest stream sequence handed out
        self._in_flight: dict[int, list[Msg]] = {}  # handed out, not acked -> held copies

    # -- construction ---------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        servers: str | Sequence[str] = "nats://127.0.0.1:4222",
        *,
        stream: str,
        subject: str,
        durable: str,
        ack_wait: float = 30.0,
        max_deliver: int | None = None,
        max_ack_pending: int | None = None,
        deliver_policy: DeliverPolicy = DeliverPolicy.ALL,
        create_stream: bool = False,
        take_over: bool = False,
        ack_sync: bool = False,
        close_timeout: float = 5.0,
        retry_for: float = DEFAULT_RETRY_FOR,
        connect_options: Mapping[str, Any] | None = None,
    ) -> JetStreamFeed:
        """Connect to NATS and bind (or create) a durable pull consumer.

        Parameters
        ----------
        servers : str or sequence of str
            NATS server URLs (default ``nats://127.0.0.1:4222``).
        stream : str
            The JetStream stream to read.
        subject : str
            The consumer's filter subject (wildcards allowed).
        durable : str
            The durable consumer name. Restarting with the same name resumes
            where the acknowledgements stopped.
        ack_wait : float
            Seconds the server waits for an ack before redelivering (default
            30). Used only when the consumer is created; an existing durable
            keeps its configuration.
        max_deliver : int, optional
            Deliveries of one message before the server gives up on it.
        max_ack_pending : int, optional
            Messages delivered and not yet acknowledged before the server
            stops delivering (server default 1,000). Keep it at least
            ``ingest``'s ``max_batch``.
        deliver_policy : nats.js.api.DeliverPolicy
            Where a new consumer starts (default ``ALL``: the whole stream).
        create_stream : bool
            Create ``stream`` with ``subjects=[subject]`` when it does not
            exist (default False: it must exist).
        take_over : bool
            This process is the durable's only reader and takes it over
            (default False). An existing durable is restarted at its ack
            floor with this configuration: what a previous, dead reader
            fetched and never acknowledged is delivered again at once, in
            stream order, instead of after ``ack_wait`` (and instead of
            holding ``max_ack_pending`` until then); a stale reader's pull
            subscription ends. Messages above the floor that were acked out
            of order come again too (a primary key makes that harmless).
            ``lance-async ingest`` and the cluster's workers take their
            durables over; readers sharing one durable on purpose must not.
        ack_sync : bool
            Wait for the server to confirm each ack (see the class).
        close_timeout : float
            Seconds :meth:`aclose` may spend unsubscribing and flushing.
        retry_for : float
            Seconds a connection that went away (a server restart) is
            retried before :meth:`fetch` raises (default
            :data:`~lance_async.feeds.broker.DEFAULT_RETRY_FOR`, five
            minutes; ``math.inf``: for ever). The connection retries
            without a cap on attempts (``max_reconnect_attempts=-1``,
            ``reconnect_time_wait=0.5``) unless ``connect_options`` say
            otherwise.
        connect_options : mapping, optional
            Passed to ``nats.connect`` (credentials, TLS, reconnect policy, ...).

        Returns
        -------
        JetStreamFeed
            Owning its connection.

        Raises
        ------
        LanceAsyncError
            Not running on asyncio.
        nats.errors.NoServersError
            No server reachable.
        nats.js.errors.NotFoundError
            The stream does not exist and ``create_stream`` is False.
        nats.js.errors.APIError
            JetStream refused the consumer.

        Notes
        -----
        Blocks (asynchronously) for the connection and two or three
        JetStream API round trips.
        """
        require_asyncio("JetStreamFeed")
        retry_for = check_retry_for(retry_for)
        urls: str | list[str] = servers if isinstance(servers, str) else list(servers)
        options = {"max_reconnect_attempts": -1, "reconnect_time_wait": 0.5}
        options.update(connect_options or {})
        client = await nats.connect(urls, **options)
        try:
            return await cls.from_client(
                client,
                stream=stream,
                subject=subject,
                durable=durable,
                ack_wait=ack_wait,
                max_deliver=max_deliver,
                max_ack_pending=max_ack_pending,
                deliver_policy=deliver_policy,
                create_stream=create_stream,
                take_over=take_over,
                ack_sync=ack_sync,
                close_timeout=close_timeout,
                retry_for=retry_for,
                owns_client=True,
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await client.close()
            raise

    @classmethod
    async def from_client(
        cls,
        client: Client,
        *,
        stream: str,
        subject: str,
        durable: str,
        ack_wait: float = 30.0,
        max_deliver: int | None = None,
        max_ack_pending: int | None = None,
        deliver_policy: DeliverPolicy = DeliverPolicy.ALL,
        create_stream: bool = False,
        take_over: bool = False,
        ack_sync: bool = False,
        close_timeout: float = 5.0,
        retry_for: float = DEFAULT_RETRY_FOR,
        owns_client: bool = False,
    ) -> JetStreamFeed:
        """Bind (or create) a durable pull consumer on a connected client.

        Parameters are those of :meth:`connect`; ``owns_client`` (default
        False) makes :meth:`aclose` close ``client``.

        Returns
        -------
        JetStreamFeed

        Raises
        ------
        LanceAsyncError
            Not running on asyncio.
        nats.js.errors.NotFoundError
            The stream does not exist and ``create_stream`` is False.
        nats.js.errors.APIError
            JetStream refused the consumer.
        """
        require_asyncio("JetStreamFeed")
        if ack_wait <= 0:
            raise ValueError(f"ack_wait must be > 0 seconds, got {ack_wait}")
        js = client.jetstream()
        if create_stream:
            try:
                await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                await js.add_stream(name=stream, subjects=[subject])
        start = await _restart_at_ack_floor(js, stream, durable) if take_over else None
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start else deliver_policy,
            opt_start_seq=start or None,
            filter_subject=subject,
        )
        if take_over and start != 0:
            await js.add_consumer(stream, config=config)
            sub = await js.pull_subscribe_bind(durable, stream)
        else:
            sub = await js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
        return cls(
            client,
            sub,
            stream=stream,
            subject=subject,
            durable=durable,
            owns_client=owns_client,
            ack_sync=ack_sync,
            close_timeout=close_timeout,
            took_over=take_over,
            retry_for=retry_for,
        )

    def __repr__(self) -> str:
        return (
            f"<JetStreamFeed stream={self.stream!r} durable={self.durable!r} "
            f"state={self._state.value}>"
        )

    # -- the Feed protocol --------------------------------------------------------
    def _message(self, msg: Msg) -> Message:
        sequence = msg.metadata.sequence.stream
        set_feed_lag(f"nats:{self.stream}/{self.subject}", 0, msg.metadata.num_pending)

        async def ack() -> None:
            check_open(self._state, repr(self))
            await self._ack_copy(msg)
            self.acked += 1
            for copy in self._in_flight.pop(sequence, ()):
                await self._ack_copy(copy)

        return Message(sequence, msg.data, dict(msg.headers or {}), _ack=ack)

    async def _ack_copy(self, msg: Msg) -> None:
        """Acknowledge a message (or a held-back copy of one whose rows are
        durable); a connection that is away is waited for, up to ``retry_for``."""
        backoff = Backoff(0.05, 2.0)
        while True:
            try:
                if self._ack_sync:
                    await msg.ack_sync(timeout=self._ack_sync_timeout)
                else:
                    await msg.ack()
                self._recent.append((time.monotonic(), msg))
                return
            except _AWAY as exc:
                check_open(self._state, repr(self))
                self._check_down(exc)
                await backoff.sleep()

    async def _watch_connection(self) -> None:
        """Before a fetch: raise past ``retry_for`` of a connection that is
        down; on a connection back up, acknowledge again what was
        acknowledged just before it went down.

        A server killed (or crashed) a moment after it took acks may come
        back without them (nats-server keeps a consumer's ack state in
        memory a little while before its store has it: 100 acks of 100 were
        gone after a SIGKILL right after their flush's PONG). The messages
        would come again after ``ack_wait`` -- held back here, written again
        by the next run. An ack sent twice is harmless (JetStream keeps
        the first), so the acks of the last :data:`REACK_WINDOW` seconds
        before the connection went down are sent again.
        """
        client = self._client
        up = client.is_connected and not client.is_reconnecting
        if not (up and self._down_since is not None):
            self._check_down()
            return
        since = self._down_since - REACK_WINDOW
        self._down_since = None
        again = [m for at, m in self._recent if at >= since]
        self._recent.clear()
        try:
            for m in again:
                await client.publish(m.reply)  # what Msg.ack sends, once more
        except _AWAY as exc:  # down again: the next fetch sees it
            log.debug("%r: acknowledging again after a reconnect: %r", self, exc)
            return
        log.warning(
            "%r: the NATS connection is back; %d acks of the moments before it went down "
            "sent again",
            self,
            len(again),
        )

    def _check_down(self, exc: BaseException | None = None) -> None:
        """Note whether the connection is down; raise once it has been down
        longer than ``retry_for`` (``exc``: the error that showed it)."""
        client = self._client
        down = exc is not None or client.is_reconnecting or not client.is_connected
        if not down:
            self._down_since = None
            return
        if client.is_closed:  # closed for good (its own reconnect options gave up)
            raise LanceAsyncError(
                f"{self!r}: the NATS connection is closed; open a new feed"
            ) from exc
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
            log.warning("%r: the NATS connection is down; retrying for %g s", self, self.retry_for)
        if now - self._down_since > self.retry_for:
            error = LanceAsyncError(
                f"{self!r}: no NATS server answered for {now - self._down_since:.0f} s "
                f"(retry_for={self.retry_for:g}); nothing unacknowledged is lost: the "
                "durable redelivers it to the next reader"
            )
            error.retryable = True
            raise error from exc

    async def _fresh(self, msgs: list[Msg]) -> list[Msg]:
        """The messages this feed has not handed out before (``take_over`` only).

        With the durable taken over, this feed is its only reader and its
        first deliveries come in stream order: a sequence at or below the
        highest one handed out is a redelivery (``ack_wait`` ran out while
        the first copy was in flight, or the server missed its ack). Handing
        it out again would write an old version after newer ones. A copy of
        a message in flight is acknowledged with it; one of a message
        acknowledged already is acknowledged now (its rows are durable).
        """
        out = []
        for m in msgs:
            sequence = m.metadata.sequence.stream
            if sequence > self._highest:
                self._highest = sequence
                self._in_flight[sequence] = []
                out.append(m)
                continue
            self.held_back += 1
            held = self._in_flight.get(sequence)
            if held is not None:
                held.append(m)
                continue
            try:
                await self._ack_copy(m)
            except (nats.errors.Error, asyncio.TimeoutError) as exc:  # delivered again later
                log.debug("%r: acknowledging a redelivered copy of %d: %r", self, sequence, exc)
        return out

    async def backlog(self) -> int:
        """Messages of the subject this durable has not seen acknowledged.

        Returns
        -------
        int
            The consumer's pending messages (not yet delivered) plus those
            delivered and not acknowledged, from one ``consumer_info`` call.
            ``lance-async ingest`` uses it to tell "caught up" from "stopped
            with messages outstanding".

        Raises
        ------
        LanceAsyncError
            The feed is closed.
        nats.js.errors.APIError
            The server refused the request (for example the consumer is gone).
        """
        check_open(self._state, repr(self))
        info = await self._sub.consumer_info()
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def fetch(self, max_messages: int, timeout: float) -> list[Message]:
        """Pull up to ``max_messages`` messages; ``[]`` when none came within ``timeout``.

        Parameters
        ----------
        max_messages : int
            Batch size of the pull request (>= 1).
        timeout : float
            Seconds to wait for the first message (at least 0.01 is sent to
            the server).

        Returns
        -------
        list of Message
            In stream order; redelivered messages keep their sequence.

        Raises
        ------
        ClosedError
            The feed was closed.
        LanceAsyncError
            The connection has been down longer than ``retry_for``
            (``retryable``; until then a fetch returns ``[]``).
        nats.js.errors.APIError
            The server rejected the pull (for example the consumer was deleted).

        Notes
        -----
        Cancellation: messages the server delivered for a cancelled pull stay
        in the subscription's queue and are returned by the next fetch; those
        lost with the process are redelivered after ``ack_wait``.
        """
        check_open(self._state, repr(self))
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        await self._watch_connection()
        try:
            msgs = await self._sub.fetch(max_messages, timeout=max(timeout, MIN_FETCH_TIMEOUT))
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            return []
        except _AWAY as exc:  # the server went away under the pull: wait, then pull again
            self._check_down(exc)
            await anyio.sleep(min(max(timeout, MIN_FETCH_TIMEOUT), 0.5))
            return []
        if self._took_over:
            msgs = await self._fresh(msgs)
        out = [self._message(m) for m in msgs]
        self.fetched += len(out)
        return out

    async def aclose(self) -> None:
        """Stop pulling, flush the acks made so far; close the connection if owned.

        Unacknowledged messages stay pending on the server and are
        redelivered after ``ack_wait``. Safe to call twice. Shielded from
        cancellation; the unsubscribe and flush are bounded by
        ``close_timeout`` seconds.

        Notes
        -----
        nats-py's ``drain()`` waits for every message of the subscription's
        queue to be processed, which a pull subscription never reports, so
        the feed unsubscribes and flushes instead.
        """
        if self._state is FeedState.CLOSED:
            return
        self._state = FeedState.CLOSED
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self.close_timeout):
                try:
                    await self._sub.unsubscribe()
                    await self._client.flush(timeout=max(1, math.ceil(self.close_timeout)))
                except (nats.errors.Error, OSError, asyncio.TimeoutError) as exc:
                    log.debug("%r: closing: %r", self, exc)
            if self._owns_client:
                await self._client.close()


async def _restart_at_ack_floor(js: JetStreamContext, stream: str, durable: str) -> int | None:
    """Delete ``durable`` and return the stream sequence just above its ack
    floor: the caller recreates it there. None when it does not exist; 0
    when its floor cannot be told (it is then left as it is).

    A consumer that never acknowledged anything reports an ack floor of 0
    (nats-server 2.9), whatever sequence it started at: its floor is then
    just below its start -- the last delivered sequence while nothing was
    delivered, else its configured start.
    """
    try:
        info = await js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        return None
    acked, delivered = info.ack_floor, info.delivered
    if acked is not None and (acked.consumer_seq or 0) > 0:
        floor = int(acked.stream_seq or 0)
    elif delivered is None or (delivered.consumer_seq or 0) == 0:
        floor = int(delivered.stream_seq or 0) if delivered is not None else 0
    elif info.config.deliver_policy in (None, DeliverPolicy.ALL):
        floor = 0
    elif info.config.deliver_policy == DeliverPolicy.BY_START_SEQUENCE:
        floor = int(info.config.opt_start_seq or 1) - 1
    else:  # delivered, nothing acked, started at an unknown sequence: keep it
        return 0
    await js.delete_consumer(stream, durable)
    return floor + 1
