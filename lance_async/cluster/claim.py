"""Who writes a table from a broker: one ``ingest``, or one group of workers (:class:`TableClaim`).

``lance-async ingest`` reads a feed that is not partitioned like the table:
any message may carry keys of any shard, so it writes every shard. Two of
them on one table (two replicas of a deployment, one consumer group) would
each claim every shard in turn and fence the other, for ever under an
orchestrator that restarts what failed. They cannot share the work without
routing each message to the owner of its keys' shard -- which is what a
partitioned feed and ``lance-async worker`` do. So an ingest *refuses*
instead: before it opens anything, it takes the table's claim in the broker
it reads, and a second one finds the claim held by a live process and
stops with :class:`TableClaimedError` (the command exits 2, naming
``lance-async worker``), having fenced nothing and written nothing.

The claim is one key per table in the broker (Redis ``SET NX PX`` renewed by
a compare-and-set script; a NATS key-value entry renewed by a
revision-checked update), holding who writes the table: ``ingest <member>``
(exclusive) or ``worker <group>`` (shared by the workers of one group, which
divide the shards among themselves with leases). It is renewed every
``ttl / 3`` seconds while held and expires ``ttl`` seconds after its holder
died. A claim held by someone else is watched before a refusal: if it is
renewed within ``ttl`` its holder is alive (refused at once); if it expires
(a holder killed a moment ago) it is taken.

The claim lives in the broker: processes that read the same table from
different brokers do not see each other's claims (the engine's writer epoch
still keeps the data right: the loser is fenced).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlparse

import anyio

from .._retry import Backoff
from ..errors import LanceAsyncError

__all__ = [
    "BrokerUnavailableError",
    "TableClaim",
    "TableClaimedError",
    "broker_down",
    "table_identity",
]

log = logging.getLogger("lance_async.cluster")

#: Seconds a claim outlives its holder's last renewal (renewed every third of it).
CLAIM_TTL = 6.0
#: Seconds before a worker tries again a broker that did not answer at start,
#: doubled per failure in a row up to :data:`MAX_WAIT_BACKOFF`.
WAIT_BACKOFF = 0.2
MAX_WAIT_BACKOFF = 5.0


class BrokerUnavailableError(LanceAsyncError):
    """No broker answers at the feed's address (refused, unreachable); retryable."""

    retryable = True


def broker_down(exc: BaseException) -> bool:
    """Whether ``exc`` says the broker did not answer (refused, reset, timed
    out), as opposed to an answer (pure; does not block)."""
    if isinstance(exc, BrokerUnavailableError):
        return True
    return isinstance(exc, (OSError, TimeoutError)) or type(exc).__name__ in (
        "ConnectionError",
        "TimeoutError",
        "NoServersError",
        "ConnectionClosedError",
    )


class TableClaimedError(LanceAsyncError):
    """Another live process writes this table from the same broker.

    Attributes
    ----------
    holder : str
        The claim's holder: ``ingest <member>`` or ``worker <group>``.
    """

    def __init__(self, message: str, *, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


def table_identity(table_uri: str) -> str:
    """A short name of the table at ``table_uri``, the same for every
    spelling of a local path (made absolute, links resolved)."""
    if "://" not in table_uri:
        table_uri = os.path.realpath(table_uri)
    return hashlib.sha1(table_uri.rstrip("/").encode()).hexdigest()[:20]


_CLAIM = """
local held = redis.call('GET', KEYS[1])
if (not held) or held == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class TableClaim:
    """The claim of one table in one broker (see the module notes).

    Use it as ``async with TableClaim.open(url, table_uri, holder):``; the
    claim is taken on entry (or :class:`TableClaimedError` raised), renewed
    in the background, and given back on exit (an ``ingest`` claim; a
    workers' claim is left to expire: another worker of the group may still
    run).

    Parameters
    ----------
    store : _RedisStore or _NatsStore
        Where the claim is kept (made by :meth:`open`).
    table_uri : str
        The table.
    holder : str
        ``ingest <member>`` or ``worker <group>``.
    ttl : float
        Seconds the claim outlives its holder (default :data:`CLAIM_TTL`).
    """

    def __init__(self, store: Any, table_uri: str, holder: str, ttl: float = CLAIM_TTL) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl}")
        self._store = store
        self.table_uri = table_uri
        self.holder = holder
        self.ttl = ttl
        self.key = f"table-{table_identity(table_uri)}"

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, url: str, table_uri: str, holder: str, ttl: float = CLAIM_TTL, *, wait: bool = False
    ) -> AsyncIterator[TableClaim]:
        """Connect to the broker of ``url`` (``redis://``, ``rediss://`` or
        ``nats://``), take the claim, hold it for the body, give it back.

        Parameters
        ----------
        url, table_uri, holder, ttl
            See the class.
        wait : bool
            A broker that does not answer is tried again after a back-off
            (:data:`WAIT_BACKOFF` doubling to :data:`MAX_WAIT_BACKOFF`, a
            warning each time) until it answers or the caller is cancelled:
            a worker started while its broker restarts waits for it, as a
            Kafka worker does. Default False: the error is raised (a
            one-shot command says so at once).

        Raises
        ------
        TableClaimedError
            Another live process holds the claim (found within ``ttl``
            seconds: one renewal of the holder's).
        ValueError
            ``url`` is not a Redis or NATS URL.
        Exception
            Without ``wait``, the broker's error when it does not answer.
        """
        parsed = urlparse(url)
        if parsed.scheme not in ("redis", "rediss", "nats"):
            raise ValueError(f"a table claim needs a redis:// or nats:// URL, got {url!r}")

        async def take() -> tuple[TableClaim, Callable[[], Awaitable[Any]]]:
            close: Callable[[], Awaitable[Any]]
            if parsed.scheme == "nats":
                import nats

                # nats-py's first connect either fails after all its reconnect
                # attempts or, allowed to retry for ever, waits in silence: ask
                # the port first (refused: the error at once, or the wait's
                # back-off), then connect to reconnect for ever after -- the
                # claim is renewed across a server's restart, as the feed reads
                host, port = parsed.hostname or "127.0.0.1", parsed.port or 4222
                try:
                    probe = await anyio.connect_tcp(host, port)
                except OSError as exc:
                    raise BrokerUnavailableError(
                        f"no NATS server answers at {host}:{port} ({exc})"
                    ) from exc
                await probe.aclose()
                nc = await nats.connect(
                    f"nats://{parsed.netloc}",
                    connect_timeout=3,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    error_cb=_quiet,
                )
                close = nc.close
            else:
                import redis.asyncio

                client = redis.asyncio.Redis.from_url(f"{parsed.scheme}://{parsed.netloc}")
                close = client.aclose
            try:
                store: Any = (
                    await _NatsStore.open(nc, ttl)
                    if parsed.scheme == "nats"
                    else _RedisStore(client)
                )
                claim = cls(store, table_uri, holder, ttl)
                await claim.acquire()
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await close()
                raise
            return claim, close

        claim, close = await (_waiting(take, url) if wait else take())
        try:
            async with claim.held(taken=True):
                yield claim
        finally:
            with anyio.CancelScope(shield=True):
                await close()

    @contextlib.asynccontextmanager
    async def held(self, *, taken: bool = False) -> AsyncIterator[None]:
        """Take the claim (unless ``taken``: :meth:`acquire` was awaited
        already), renew it while the body runs, give it back after."""
        if not taken:
            await self.acquire()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._renew)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            if self.holder.startswith("ingest "):
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    try:
                        await self._store.drop(self.key, self.holder)
                    except Exception as exc:  # the claim expires by itself
                        log.debug("lance_async: giving the table claim back: %r", exc)

    async def acquire(self) -> None:
        """Take the claim, or raise :class:`TableClaimedError` once its holder
        renewed it (waits at most ``ttl`` seconds for a dead holder's claim
        to expire)."""
        deadline = time.monotonic() + self.ttl + 1.0
        first: Any = None
        while True:
            held, mark = await self._store.take(self.key, self.holder, self.ttl)
            if held is None:
                return
            if first is None:
                first = (held, mark)
            elif held != first[0] or self._store.renewed(first[1], mark):
                raise TableClaimedError(self._refusal(held), holder=held)
            if time.monotonic() > deadline:  # never renewed, never expired: a stuck holder
                raise TableClaimedError(self._refusal(held), holder=held)
            await anyio.sleep(min(0.1, self.ttl / 20))

    def _refusal(self, held: str) -> str:
        kind, _, who = held.partition(" ")
        if kind == "ingest":
            return (
                f"another lance-async ingest ({who}) is writing {self.table_uri} from this "
                "broker, and two ingests of one table fence each other's shards: stopped "
                "before writing anything. For replicas, partition the feed and run "
                "lance-async worker (docs/scale-out.md)"
            )
        return (
            f"the lance-async worker group {who!r} is writing {self.table_uri} from this "
            "broker: stopped before writing anything. Publish to their partitioned feed "
            "instead, or stop them first"
        )

    async def _renew(self) -> None:
        while True:
            await anyio.sleep(self.ttl / 3)
            try:
                held, _ = await self._store.take(self.key, self.holder, self.ttl)
            except Exception as exc:  # the broker is away: retried at the next period
                log.warning("lance_async: renewing the table claim: %r", exc)
                continue
            if held is not None:
                log.error(
                    "lance_async: the claim of %s was taken by %s (this process was paused "
                    "past its ttl?); the engine's writer epoch fences whichever is stale",
                    self.table_uri,
                    held,
                )


async def _quiet(_error: Exception) -> None:
    """nats-py's error callback, silenced: the connect's own error says it."""
    return None


async def _waiting(attempt: Callable[[], Awaitable[Any]], url: str) -> Any:
    """``await attempt()`` until the broker answers (see ``TableClaim.open``'s ``wait``)."""
    backoff = Backoff(WAIT_BACKOFF, MAX_WAIT_BACKOFF)
    where = urlparse(url)
    shown = f"{where.scheme}://{where.hostname}:{where.port}" if where.port else where.scheme
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not broker_down(exc):
                raise
            log.warning(
                "lance_async: no broker answers at %s (%s); trying again in %.1f s",
                shown,
                " ".join(str(exc).split())[:200] or type(exc).__name__,
                backoff.wait,
            )
        await backoff.sleep()


class _RedisStore:
    """The claim as a Redis key with a TTL."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._claim = client.register_script(_CLAIM)
        self._drop = client.register_script(_DROP)

    @staticmethod
    def _key(key: str) -> str:
        return f"lance-async:{key}"

    async def take(self, key: str, holder: str, ttl: float) -> tuple[str | None, Any]:
        """``(None, None)`` when taken or renewed; else ``(holder, its ttl left in ms)``."""
        k = self._key(key)
        if await self._claim(keys=[k], args=[holder, max(1, int(ttl * 1000))]):
            return None, None
        async with self._client.pipeline(transaction=True) as pipe:
            value, left = await pipe.get(k).pttl(k).execute()
        if value is None:
            return await self.take(key, holder, ttl)  # expired in between
        return value.decode() if isinstance(value, bytes) else str(value), int(left)

    @staticmethod
    def renewed(before: Any, now: Any) -> bool:
        """The ttl left went up: the holder renewed it."""
        return bool(now > before + 50)

    async def drop(self, key: str, holder: str) -> None:
        await self._drop(keys=[self._key(key)], args=[holder])


class _NatsStore:
    """The claim as an entry of the ``lance-async-tables`` key-value bucket."""

    BUCKET = "lance-async-tables"

    def __init__(self, kv: Any, ttl: float) -> None:
        self._kv = kv
        self._ttl = ttl
        self._seen: dict[str, tuple[int, float]] = {}

    @classmethod
    async def open(cls, nc: Any, ttl: float) -> _NatsStore:
        import nats.js.api
        import nats.js.errors

        js = nc.jetstream()
        try:
            kv = await js.key_value(cls.BUCKET)
        except nats.js.errors.BucketNotFoundError:
            config = nats.js.api.KeyValueConfig(bucket=cls.BUCKET, history=1)
            try:
                kv = await js.create_key_value(config=config)
            except nats.js.errors.BadRequestError:  # made by another process meanwhile
                kv = await js.key_value(cls.BUCKET)
        return cls(kv, ttl)

    async def take(self, key: str, holder: str, ttl: float) -> tuple[str | None, Any]:
        """``(None, None)`` when taken or renewed; else ``(holder, its revision)``.

        An entry unchanged for ``ttl`` seconds of this process's clock is
        expired (as the lease table observes expiry)."""
        import nats.js.errors

        try:
            entry = await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            entry = None
        try:
            if entry is None:
                await self._kv.create(key, holder.encode())
                return None, None
            held = entry.value.decode() if entry.value else ""
            now = time.monotonic()
            seen = self._seen.get(key)
            if seen is None or seen[0] != entry.revision:
                self._seen[key] = (entry.revision, now)
                seen = self._seen[key]
            if held and held != holder and now - seen[1] < ttl:
                return held, entry.revision
            await self._kv.update(key, holder.encode(), last=entry.revision)
            return None, None
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError):
            return await self.take(key, holder, ttl)  # changed under us: look again

    @staticmethod
    def renewed(before: Any, now: Any) -> bool:
        """A new revision: the holder renewed it."""
        return bool(now != before)

    async def drop(self, key: str, holder: str) -> None:
        import nats.js.errors

        try:
            entry = await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return
        if entry.value and entry.value.decode() == holder:
            try:
                await self._kv.update(key, b"", last=entry.revision)
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError):
                pass
