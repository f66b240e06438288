"""Leases held in the broker: who owns which partition, and who is alive.

Workers that read a NATS JetStream or Redis Streams feed have no consumer
group to assign them partitions (Kafka has). They divide the partitions with
*leases* kept in the broker they already use, as Amazon KCL divides a
stream's shards with a lease table:

* a lease on partition ``p`` names its holder; only a free or expired lease
  can be taken, and only its holder can renew or release it (compare and
  set);
* a lease expires when its holder has not renewed it for ``ttl`` seconds;
* live workers heartbeat a member key, so each can count the others and
  take its fair share (:mod:`lance_async.cluster.balancer`).

A holder must stop acknowledging messages of a partition before anyone else
can take its lease: :meth:`LeaseTable.valid` is true only until ``safety``
(0.6) of the ttl has passed since the last successful renewal was *sent*, a
margin below the ``ttl`` after which others may take it.

A worker that stops cleanly says so: :meth:`LeaseTable.leave` removes its
member key and every release announces itself, so the others, which
:meth:`LeaseTable.watch` for such notices, balance at once instead of
waiting for the leaver's keys to expire (a lease ``ttl``); a new member's
first heartbeat is announced the same way, so the others hand it its share
at once.

Two implementations:

:class:`RedisLeaseTable`
    Lua scripts: a compare-and-``SET ... PX ttl`` to take, a
    compare-and-``PEXPIRE`` to renew, a compare-and-``DEL`` to release;
    Redis's own clock expires keys. Each take also records which process
    took the lease, so a holder paused past the ttl renews (takes again) a
    lease that expired only if nobody took it meanwhile. Members are keys
    with a TTL. Releases and departures are published on the channel
    ``<prefix>:changes`` (pub/sub).
:class:`NatsLeaseTable`
    A JetStream key-value bucket. Taking is ``create`` (or a revision-checked
    ``update`` of an expired lease); renewing is a revision-checked
    ``update``. There is no per-key TTL in NATS 2.9, so expiry is observed
    as KCL does it: a lease (or member) whose revision has not changed for
    ``ttl`` seconds of the observer's own clock is expired -- or, sooner for
    an observer that just started, for ``ttl`` seconds of the server's clock
    (the time it stored the revision, and its latest time, both from the
    bucket's watch). No two clocks need to agree. A release empties the
    lease and a departure deletes the member key; watchers see both in the
    bucket's own change feed (a KV watch).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

__all__ = ["LeaseTable", "NatsLeaseTable", "RedisLeaseTable"]

log = logging.getLogger("lance_async.cluster")

SAFETY = 0.6
"""Fraction of the ttl, since a renewal was sent, during which the holder
still counts its lease as valid."""


class LeaseTable(Protocol):
    """Partition leases and worker liveness kept in a broker.

    Attributes
    ----------
    member : str
        This worker's name (unique in its group).
    ttl : float
        Seconds after the last renewal when a lease (or a member) expires.
    """

    member: str
    ttl: float

    async def heartbeat(self) -> None:
        """Say this member is alive (one broker round trip)."""
        ...

    async def members(self) -> set[str]:
        """Live members, this one included once it has heartbeated."""
        ...

    async def holders(self, partitions: Iterable[int]) -> dict[int, str | None]:
        """The live holder of each partition's lease (None: free or expired)."""
        ...

    async def acquire(self, partition: int) -> bool:
        """Take a free or expired lease; False when another member holds it."""
        ...

    async def renew(self, partition: int) -> bool:
        """Extend this member's lease; False when it was lost (expired and taken)."""
        ...

    async def release(self, partition: int) -> None:
        """Give the lease up (only if this member holds it)."""
        ...

    def valid(self, partition: int) -> bool:
        """Whether this member may still act as the partition's owner (local)."""
        ...

    async def leave(self) -> None:
        """Stop counting as a live member now (a clean stop), and tell the others."""
        ...

    async def watch(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` whenever a member joined or left, or a lease was
        released; run until cancelled (broker errors are retried, never raised)."""
        ...

    async def aclose(self) -> None:
        """Close the broker connection the table owns, if any."""
        ...


@dataclass
class _Held:
    renewed_at: float  # monotonic time the last successful renewal was sent
    revision: int = 0  # NATS: the lease entry's revision


class _LocalLeases:
    """What both tables keep locally: leases held and when they were renewed."""

    def __init__(self, member: str, ttl: float) -> None:
        if not member or any(c in member for c in " .*>:"):
            raise ValueError(f"a member name must be non-empty without ' .*>:', got {member!r}")
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl}")
        self.member = member
        self.ttl = ttl
        self._held: dict[int, _Held] = {}

    def valid(self, partition: int) -> bool:
        held = self._held.get(partition)
        return held is not None and time.monotonic() < held.renewed_at + SAFETY * self.ttl


# -- Redis ---------------------------------------------------------------------------

# KEYS: the lease, its taker; ARGV: member, ttl (ms), this life's token, the
# taker's lifetime (ms). The taker key names the life that last took the
# lease, so a renewal can tell "expired, nobody took it since" from "taken
# by another and given up again" (both leave no lease key).
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return 1
"""
_RENEW = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if (not held) and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisLeaseTable(_LocalLeases):
    """Leases as Redis keys with a TTL (``SET NX PX``, Lua compare-and-set).

    Parameters
    ----------
    client : redis.asyncio.Redis
        A client (``decode_responses=False``).
    prefix : str
        Key prefix of this group's leases, e.g. ``lance-async:leases:<group>``.
    member : str
        This worker's name.
    ttl : float
        Lease and member lifetime in seconds (default 10).
    owns_client : bool
        Close ``client`` in :meth:`aclose`.
    """

    def __init__(
        self, client: Any, prefix: str, member: str, ttl: float = 10.0, *, owns_client: bool = False
    ) -> None:
        super().__init__(member, ttl)
        self._client = client
        self._prefix = prefix
        self._owns = owns_client
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._life = f"{member}/{uuid.uuid4().hex}"  # this process's leases, told apart

    def _lease(self, partition: int) -> str:
        return f"{self._prefix}:lease:{partition}"

    def _keys(self, partition: int) -> list[str]:
        """The lease's key and its taker's."""
        return [self._lease(partition), f"{self._prefix}:taker:{partition}"]

    def _args(self) -> list[Any]:
        return [self.member, self._ttl_ms, self._life, 20 * self._ttl_ms]

    @property
    def channel(self) -> str:
        """The pub/sub channel on which releases and departures are announced."""
        return f"{self._prefix}:changes"

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl * 1000))

    async def heartbeat(self) -> None:
        key = f"{self._prefix}:member:{self.member}"
        if await self._client.set(key, b"1", px=self._ttl_ms, get=True) is None:
            # a new member (or one back after its key expired): the others rebalance now
            await self._client.publish(self.channel, f"join {self.member}".encode())

    async def members(self) -> set[str]:
        out: set[str] = set()
        cut = len(f"{self._prefix}:member:")
        async for key in self._client.scan_iter(match=f"{self._prefix}:member:*", count=100):
            name = key.decode() if isinstance(key, bytes) else str(key)
            out.add(name[cut:])
        return out

    async def holders(self, partitions: Iterable[int]) -> dict[int, str | None]:
        parts = list(partitions)
        if not parts:
            return {}
        values = await self._client.mget([self._lease(p) for p in parts])
        return {
            p: (v.decode() if isinstance(v, bytes) else v) if v is not None else None
            for p, v in zip(parts, values, strict=True)
        }

    async def acquire(self, partition: int) -> bool:
        # free, or held under our own name (a restart finds its earlier life's lease)
        sent = time.monotonic()
        if await self._acquire(keys=self._keys(partition), args=self._args()):
            self._held[partition] = _Held(sent)
            return True
        return False

    async def renew(self, partition: int) -> bool:
        """Extend this member's lease -- or take it again when it expired
        (a pause longer than the ttl) and nobody took it since."""
        sent = time.monotonic()
        if await self._renew(keys=self._keys(partition), args=self._args()):
            self._held[partition] = _Held(sent)
            return True
        self._held.pop(partition, None)
        return False

    async def expires_in(self, partitions: Iterable[int]) -> float | None:
        """Seconds until the first of these leases expires by Redis's clock
        (None: none of them is held)."""
        async with self._client.pipeline(transaction=False) as pipe:
            for p in partitions:
                pipe.pttl(self._lease(p))
            left = [ms for ms in await pipe.execute() if ms is not None and ms >= 0]
        return min(left) / 1000 if left else None

    async def release(self, partition: int) -> None:
        self._held.pop(partition, None)
        if await self._release(keys=self._keys(partition), args=[self.member]):
            await self._client.publish(self.channel, f"release {partition}".encode())

    async def leave(self) -> None:
        await self._client.delete(f"{self._prefix}:member:{self.member}")
        await self._client.publish(self.channel, f"leave {self.member}".encode())

    async def watch(self, wake: Callable[[], None]) -> None:
        from ..feeds.broker import broker_errors

        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                async for _message in pubsub.listen():
                    wake()
            except broker_errors() as exc:  # a restarted server: subscribe again
                log.debug("lance_async: watching %s: %r", self.channel, exc)
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await pubsub.aclose()
                    except broker_errors():
                        pass
            await anyio.sleep(self.ttl / 3)

    async def aclose(self) -> None:
        if self._owns:
            await self._client.aclose()


# -- NATS JetStream key-value -------------------------------------------------------------


@dataclass
class _Seen:
    revision: int
    since: float  # monotonic time this revision was first observed


class NatsLeaseTable(_LocalLeases):
    """Leases in a JetStream key-value bucket, expiry observed per revision (as KCL does).

    Parameters
    ----------
    kv : nats.js.kv.KeyValue
        The bucket (create it with :meth:`bucket`).
    member : str
        This worker's name.
    ttl : float
        Seconds without a change after which a lease or member counts as
        expired (default 10).
    """

    def __init__(self, kv: Any, member: str, ttl: float = 10.0) -> None:
        super().__init__(member, ttl)
        self._kv = kv
        self._seen: dict[str, _Seen] = {}
        self._beats = 0
        # from the watch: each key's revision and the server's time it was
        # stored at, and the server's latest time seen (with our clock then)
        self._stored: dict[str, tuple[int, float]] = {}
        self._server: tuple[float, float] | None = None

    @staticmethod
    async def bucket(js: Any, name: str, ttl: float) -> Any:
        """The key-value bucket ``name`` (created when missing, history 1;
        entries older than ``20 * ttl`` are dropped by the server)."""
        import nats.js.api
        import nats.js.errors

        try:
            return await js.key_value(name)
        except nats.js.errors.BucketNotFoundError:
            config = nats.js.api.KeyValueConfig(bucket=name, history=1, ttl=20 * ttl)
            return await js.create_key_value(config=config)

    def _observe(self, key: str, revision: int) -> bool:
        """True when ``key`` has not changed for ``ttl`` seconds: of our clock
        since we first saw this revision, or of the server's clock since it
        stored it (known from the watch)."""
        now = time.monotonic()
        if self._stored_for(key, revision, now) >= self.ttl:
            return True
        seen = self._seen.get(key)
        if seen is None or seen.revision != revision:
            self._seen[key] = _Seen(revision, now)
            return False
        return now - seen.since >= self.ttl

    def _stored_for(self, key: str, revision: int, now: float) -> float:
        """Seconds of the server's clock since it stored ``key`` at
        ``revision``, as far as the watch tells (0.0: unknown).

        The server's time now is taken as the latest time it stamped on an
        entry we were sent (our own heartbeats, every third of the ttl)
        plus the seconds our clock counted since we received that entry: at
        most the server's real time now, so a lease counts as expired no
        sooner than ``ttl`` after the server stored its last renewal (which
        its holder sent earlier still). Only one clock's readings are
        compared with each other; a fresh observer (a restarted worker)
        needs no ``ttl`` of watching first."""
        stored = self._stored.get(key)
        if stored is None or stored[0] != revision or self._server is None:
            return 0.0
        latest, received = self._server
        return latest + (now - received) - stored[1]

    async def expires_in(self, partitions: Iterable[int]) -> float | None:
        """Seconds until the first of these leases counts as expired here (by
        either clock of :meth:`_observe`), for the revisions last seen by
        :meth:`holders` (None: none of them was seen). Asks nothing of the server."""
        now = time.monotonic()
        left = []
        for p in partitions:
            key = f"lease.{p}"
            seen = self._seen.get(key)
            if seen is None:
                continue
            waited = max(now - seen.since, self._stored_for(key, seen.revision, now))
            left.append(max(0.0, self.ttl - waited))
        await anyio.lowlevel.checkpoint()
        return min(left) if left else None

    def _note(self, entry: Any) -> None:
        """Record an entry the watch delivered: its revision and server time."""
        created = getattr(entry, "created", None)
        if created is None or entry.revision is None:
            return
        stamp = created.timestamp() if hasattr(created, "timestamp") else float(created)
        self._stored[entry.key] = (entry.revision, stamp)
        if self._server is None or stamp > self._server[0]:
            self._server = (stamp, time.monotonic())

    async def _entry(self, key: str) -> Any:
        import nats.js.errors

        try:
            return await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None

    async def heartbeat(self) -> None:
        self._beats += 1
        await self._kv.put(f"member.{self.member}", str(self._beats).encode())

    async def members(self) -> set[str]:
        import nats.js.errors

        try:
            keys = await self._kv.keys()
        except nats.js.errors.NoKeysError:
            return set()
        out = set()
        for key in keys:
            if not key.startswith("member."):
                continue
            name = key[len("member.") :]
            entry = await self._entry(key)
            if entry is None:
                continue
            if name == self.member or not self._observe(key, entry.revision):
                out.add(name)
        return out

    async def holders(self, partitions: Iterable[int]) -> dict[int, str | None]:
        out: dict[int, str | None] = {}
        for p in partitions:
            key = f"lease.{p}"
            entry = await self._entry(key)
            if entry is None or not entry.value:
                out[p] = None
                continue
            holder = entry.value.decode().split("/", 1)[0]
            expired = holder != self.member and self._observe(key, entry.revision)
            out[p] = None if expired else holder
        return out

    def _value(self) -> bytes:
        return f"{self.member}/{time.time_ns()}".encode()

    async def acquire(self, partition: int) -> bool:
        import nats.js.errors

        key = f"lease.{partition}"
        sent = time.monotonic()
        entry = await self._entry(key)
        try:
            if entry is None:
                revision = await self._kv.create(key, self._value())
            else:
                holder = entry.value.decode().split("/", 1)[0] if entry.value else ""
                if holder and holder != self.member and not self._observe(key, entry.revision):
                    return False
                revision = await self._kv.update(key, self._value(), last=entry.revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError):
            return False
        self._held[partition] = _Held(sent, revision)
        return True

    async def renew(self, partition: int) -> bool:
        import nats.js.errors

        held = self._held.get(partition)
        if held is None:
            return False
        sent = time.monotonic()
        try:
            revision = await self._kv.update(
                f"lease.{partition}", self._value(), last=held.revision
            )
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError):
            self._held.pop(partition, None)
            return False
        self._held[partition] = _Held(sent, revision)
        return True

    async def release(self, partition: int) -> None:
        import nats.js.errors

        held = self._held.pop(partition, None)
        if held is None:
            return
        try:
            await self._kv.update(f"lease.{partition}", b"", last=held.revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError):
            log.debug("lance_async: the lease on partition %d was lost already", partition)

    async def leave(self) -> None:
        await self._kv.delete(f"member.{self.member}")

    async def watch(self, wake: Callable[[], None]) -> None:
        """Watch the bucket: a lease emptied, a member deleted or a new member
        wakes, and so does the end of the current values (each key's server
        time is known from then on: see :meth:`_observe`). Our own
        heartbeats flow through the same watch, so a watch that saw nothing
        for three heartbeat periods is dead (a restarted server) and is made
        again."""
        import nats.errors

        from ..feeds.broker import broker_errors

        quiet = self.ttl  # three heartbeats at the default interval (ttl / 3)
        members: set[str] = set()
        errors: tuple[type[BaseException], ...] = (*broker_errors(), nats.errors.Error)
        while True:
            watcher = None
            try:
                watcher = await self._kv.watchall()
                while True:
                    try:
                        entry = await watcher.updates(timeout=quiet)
                    except nats.errors.TimeoutError:
                        break  # nothing, not even our heartbeat: watch again
                    if entry is None:
                        # the marker after the current values: their server
                        # times are known now (a fresh observer may find
                        # leases expired at once)
                        wake()
                        continue
                    self._note(entry)
                    gone = entry.operation in ("DEL", "PURGE")
                    member = entry.key.startswith("member.")
                    if (member and (gone or entry.key not in members)) or (
                        entry.key.startswith("lease.") and (gone or not entry.value)
                    ):
                        wake()  # a member left or came, or a lease was given up
                    if member:
                        (members.discard if gone else members.add)(entry.key)
            except errors as exc:
                log.debug("lance_async: watching the lease bucket: %r", exc)
                await anyio.sleep(self.ttl / 3)
            finally:
                if watcher is not None:
                    with anyio.CancelScope(shield=True):
                        try:
                            await watcher.stop()
                        except errors:
                            pass

    async def aclose(self) -> None:
        await anyio.lowlevel.checkpoint()
