"""Fair-share lease balancing: :class:`LeaseBalancer` gives each live worker its share.

Each worker runs one balancer over a :class:`~lance_async.cluster.leases.LeaseTable`.
Every ``interval`` seconds it

1. heartbeats its member key,
2. renews the leases it holds -- a lease it fails to renew was lost (it
   expired and was taken): the partition is revoked at once, ``lost=True``;
3. counts the live members and computes the fair share ``ceil(N / members)``;
4. over its share, hands one partition back: revokes it (the worker drains
   and closes what it runs for it) and only then releases the lease (and
   starts the next round at once while still over); under it, takes free
   or expired leases (in random order) up to the share, and assigns each
   once taken; still under it, with leases held by others, it starts the
   next round as the first of those runs out (when the table can tell:
   ``expires_in``) rather than up to an interval later;
5. releases (announced) every lease still held under its own name by an
   earlier life -- a worker killed and restarted under the same name --
   that it did not take back, so a member under its share takes it at
   once instead of after the dead life's lease ran out.

Amazon KCL balances a stream's shards over its workers the same way (a lease
table, fair shares, taking expired leases). Take-over after a worker dies
takes at most ``ttl + interval`` seconds (about ``ttl`` when a member under
its share waits for the dead one's leases). ``on_assign`` and ``on_revoke``
run in the balancer's task, one at a time, so a partition is never assigned
and revoked at once.

The owned set is exactly what is consumed:

* a partition whose work ended (fenced, failed, or returned) is given up
  with :meth:`LeaseBalancer.drop`; the drop wakes the balancer, which
  revokes and releases it in a round that starts at once (and may take it
  again in the same round, when it is free and under the share). A drop
  stays recorded until a round has handled it, whatever that round awaits
  meanwhile;
* a round does not wait for the next tick when something changed
  elsewhere: :meth:`LeaseTable.watch` wakes it when another member left or
  released a lease, so a clean stop of one worker is a hand-over at once
  (the leaver leaves the member set first, then releases each partition as
  soon as it is drained), not after the leaver's keys expire.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import anyio
from anyio.abc import TaskStatus

from .._loop import unwrap_groups
from .._retry import exponential
from ..feeds.base import Feed
from ..feeds.broker import broker_errors
from .feeds import PartitionedFeed
from .leases import LeaseTable

__all__ = ["Coordinator", "LeaseBalancer", "LeaseCoordinator"]

log = logging.getLogger("lance_async.cluster")

EXPIRY_MARGIN = 0.05
"""Seconds after a lease's expected expiry at which the round that takes it starts."""

RETRY = 0.1
"""Seconds before a round that failed (the broker unreachable) is tried
again, doubled per failure in a row, never more than the interval."""

Assign = Callable[[int], Awaitable[None]]
Revoke = Callable[[int, bool], Awaitable[None]]


class LeaseBalancer:
    """Divide ``num_partitions`` partitions among live workers with leases.

    Parameters
    ----------
    table : LeaseTable
        The leases (and liveness) of the worker group.
    num_partitions : int
        Partitions to divide.
    on_assign : async callable ``(partition) -> None``
        Called once this worker holds a partition's lease; start work on it
        (open the shard writer: that fences any stale writer).
    on_revoke : async callable ``(partition, lost) -> None``
        Called before a lease is released (``lost=False``: drain, ack what
        is durable, close), or after it was found lost (``lost=True``: stop
        at once; acks are refused already, see ``LeaseTable.valid``).
    interval : float, optional
        Seconds between rounds (default ``ttl / 3``).
    """

    def __init__(
        self,
        table: LeaseTable,
        num_partitions: int,
        *,
        on_assign: Assign,
        on_revoke: Revoke,
        interval: float | None = None,
    ) -> None:
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        self.table = table
        self.num_partitions = num_partitions
        self.interval = interval if interval is not None else table.ttl / 3
        self._assign = on_assign
        self._revoke = on_revoke
        self.owned: set[int] = set()
        self.members = 1
        self.rounds = 0
        self.lost = 0
        self._stopping = False
        self._dropped: set[int] = set()
        self._cooldown: dict[int, float] = {}
        self._wake: anyio.Event | None = None  # made in run(): an event belongs to a loop
        self._round_done: anyio.Event | None = None  # set as each round ends (made in run())
        self._next_expiry: float | None = None  # when a lease we may take runs out

    def valid(self, partition: int) -> bool:
        """Whether this worker may still act as ``partition``'s owner."""
        return partition in self.owned and self.table.valid(partition)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Balance until cancelled or :meth:`stop` is called; then leave the
        group and revoke and release every partition held (shielded).

        Reports started (``task_status``) after the first round, so a worker
        started with ``tg.start`` owns its first partitions when it returns.
        Rounds run every ``interval`` seconds (with 20 % jitter), and at once
        after a :meth:`drop`, a :meth:`stop`, or a notice that another member
        left or released a lease (:meth:`LeaseTable.watch`). A round that
        failed because the broker did not answer is tried again after
        :data:`RETRY` seconds, doubled per failure in a row up to the
        interval, so a restarted broker finds the leases renewed at once.
        """
        started = False
        failed = 0  # rounds failed in a row
        self._wake = anyio.Event()
        self._round_done = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.table.watch, self._wake_up)
                while not self._stopping:
                    try:
                        await self.round()
                        failed = 0
                    except broker_errors() as exc:
                        # the broker is unreachable: leases we hold run out by themselves
                        # (acks are refused once they may have), and the next round retries
                        failed += 1
                        log.log(
                            logging.ERROR if failed == 1 else logging.DEBUG,
                            "lance_async: a balancing round failed (%d in a row): %r; retrying",
                            failed,
                            exc,
                        )
                    finally:  # whoever waits in revalidate() looks again
                        done, self._round_done = self._round_done, anyio.Event()
                        if done is not None:
                            done.set()
                    if not started:
                        task_status.started()
                        started = True
                    pause = self.interval * random.uniform(0.8, 1.2)
                    if self._next_expiry is not None:  # a lease others hold runs out
                        pause = min(pause, max(0.0, self._next_expiry - time.monotonic()))
                        self._next_expiry = None
                    if failed:
                        # a broker restarting: the next round comes as soon as it answers,
                        # so the leases held are renewed before they run out (a whole
                        # interval later, a restart lost every one of them)
                        pause = min(pause, exponential(failed, RETRY, RETRY * 2**8))
                    await self._pause(pause)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.release_all()

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when woken (a drop, a stop, a notice)."""
        wake = self._wake
        assert wake is not None
        if not wake.is_set():
            with anyio.move_on_after(seconds):
                await wake.wait()
        self._wake = anyio.Event()

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def revalidate(self, partition: int) -> bool:
        """Whether this worker may still act as ``partition``'s owner, renewing
        the lease first if it ran past its safety margin.

        A worker paused (SIGSTOP, a stalled VM) past ``SAFETY * ttl`` finds
        its leases no longer valid when it resumes, although nobody may have
        taken them: rather than giving the partition up (its writer closed,
        its feed and writer opened again), the partition's work asks here.
        The next round starts at once and renews every lease held; this
        waits for it (two rounds at most: one in progress may have renewed
        before the pause) and answers :meth:`valid` -- true when the renewal
        found the lease still this worker's (NATS: unchanged since; Redis:
        still there, or expired without anyone having taken it since). A
        lease another member took is lost, as in any round.
        """
        deadline = time.monotonic() + 2 * self.interval
        while not self.valid(partition):
            done = self._round_done
            left = deadline - time.monotonic()
            if partition not in self.owned or done is None or self._stopping or left <= 0:
                return False
            self._wake_up()
            with anyio.move_on_after(left):
                await done.wait()
        return True

    def stop(self) -> None:
        """End :meth:`run` at once (after the round in progress, if any): it
        then leaves the group and hands every partition back."""
        self._stopping = True
        self._wake_up()

    async def round(self) -> None:
        """One balancing round (see the module notes)."""
        self.rounds += 1
        table = self.table
        await table.heartbeat()
        # each drop is forgotten only as it is handled: one arriving while a
        # revoke below is awaited stays for the next round (which it wakes)
        for p in sorted(self._dropped):
            self._dropped.discard(p)
            if p not in self.owned:
                continue  # revoked meanwhile (lost, or handed back)
            self.owned.discard(p)
            try:
                await self._revoke(p, True)
            finally:
                await table.release(p)
        for p in sorted(self.owned):
            if not await table.renew(p):
                log.warning(
                    "lance_async: lost the lease on partition %d; stopping it",
                    p,
                    extra={"partition": p},
                )
                self.owned.discard(p)
                self.lost += 1
                await self._revoke(p, True)
        members = await table.members()
        members.add(table.member)
        self.members = len(members)
        share = self._share()
        # read every round, not only under the share: a table that observes
        # expiry on its own clock (NATS) then starts the clock of a dead
        # holder's leases while the holder still counts as a member
        holders = await table.holders(range(self.num_partitions))
        if len(self.owned) > share:
            await self._disown(holders)
            p = max(self.owned)
            log.info(
                "lance_async: handing partition %d back (share %d)",
                p,
                share,
                extra={"partition": p},
            )
            async with self._keeping_alive():  # its drain and the others' acks go on
                await self._revoke(p, False)
            self.owned.discard(p)
            await table.release(p)  # announced: the member under its share takes it now
            if len(self.owned) > share:
                self._wake_up()  # the next one at once, not a whole interval later
            return
        if len(self.owned) < share:
            now = time.monotonic()
            # a lease held under our own name that we do not own is an earlier
            # life's (killed, restarted under the same name): ours to take back
            free = [
                p
                for p, holder in holders.items()
                if holder in (None, table.member)
                and p not in self.owned
                and self._cooldown.get(p, 0.0) <= now
            ]
            random.shuffle(free)
            taken: list[int] = []
            for p in free:
                if len(self.owned) >= share or self._stopping:
                    break
                if await table.acquire(p):
                    self.owned.add(p)
                    taken.append(p)
            if taken:  # started together: their waits on the store overlap
                with unwrap_groups():
                    async with anyio.create_task_group() as starting:
                        for p in taken:
                            starting.start_soon(self._start, p)
            await self._watch_expiry(holders)
        await self._disown(holders)

    async def _start(self, p: int) -> None:
        """Start partition ``p``, whose lease was just acquired; if it cannot
        start, release the lease and leave ``p`` alone for an interval."""
        try:
            await self._assign(p)
        except Exception as exc:
            log.error(
                "lance_async: starting partition %d failed: %r",
                p,
                exc,
                extra={"partition": p},
            )
            self.owned.discard(p)
            self._cooldown[p] = time.monotonic() + self.interval
            await self.table.release(p)
        except BaseException:
            self.owned.discard(p)
            with anyio.CancelScope(shield=True):
                await self.table.release(p)
            raise

    async def _watch_expiry(self, holders: dict[int, str | None]) -> None:
        """Under the share, with leases held by others: start the next round
        as the first of them runs out, instead of up to an interval later
        (the take-over after a worker was killed). Uses the table's
        ``expires_in(partitions)`` -- seconds until the first of those
        leases expires, None if unknown -- when it has one."""
        expires_in = getattr(self.table, "expires_in", None)
        if expires_in is None or len(self.owned) >= self._share():
            return
        others = [p for p, holder in holders.items() if holder not in (None, self.table.member)]
        if not others:
            return
        seconds = await expires_in(others)
        if seconds is not None:
            self._next_expiry = time.monotonic() + seconds + EXPIRY_MARGIN

    def _share(self) -> int:
        return math.ceil(self.num_partitions / self.members)

    async def _disown(self, holders: dict[int, str | None]) -> None:
        """Release the leases still held under this member's name by an earlier
        life (a worker killed and restarted under the same name) that this
        round did not take back: nothing consumes those partitions, and
        their leases would otherwise stay live for up to a ``ttl`` (Redis)
        or until a fresh observer has watched them for one (NATS). Taken
        (renewed under this life) and released at once, the release
        announced: a member under its share takes them now."""
        table = self.table
        for p, holder in sorted(holders.items()):
            if holder != table.member or p in self.owned or self._stopping:
                continue
            log.info(
                "lance_async: releasing partition %d, held under this name by an earlier life",
                p,
                extra={"partition": p},
            )
            if await table.acquire(p):
                await table.release(p)

    async def release_all(self) -> None:
        """Leave the group, then revoke and release every partition held (a
        clean shutdown).

        Leaving first lets the others count one member fewer at once (they
        take each partition as soon as it is released, told by the release
        itself). The partitions drain together, each released as soon as it
        is drained, and their leases are renewed while they do, so a drain
        never outlives the right to acknowledge it. Broker errors are logged,
        not raised: leases not released expire by themselves.
        """
        try:
            await self.table.leave()
        except broker_errors() as exc:
            log.warning("lance_async: leaving the group: %r (the member key expires)", exc)

        async def release(p: int) -> None:
            try:
                await self._revoke(p, False)
            finally:
                self.owned.discard(p)
                try:
                    await self.table.release(p)
                except broker_errors() as exc:
                    log.warning(
                        "lance_async: releasing partition %d: %r (its lease expires)",
                        p,
                        exc,
                        extra={"partition": p},
                    )

        async with self._keeping_alive(), anyio.create_task_group() as tg:
            for p in sorted(self.owned):
                tg.start_soon(release, p)

    @contextlib.asynccontextmanager
    async def _keeping_alive(self) -> AsyncIterator[None]:
        """Renew the owned leases every ``interval`` while the body runs: a
        drain blocks the rounds that would renew them."""

        async def renew() -> None:
            while True:
                await anyio.sleep(self.interval)
                for p in sorted(self.owned):
                    try:
                        await self.table.renew(p)  # a lost lease: valid() says so
                    except broker_errors() as exc:
                        log.debug("lance_async: renewing partition %d: %r", p, exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(renew)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    def drop(self, partition: int, *, fenced: bool = False, retry_after: float = 0.0) -> None:
        """Give up ``partition`` now (its work failed, was fenced, or ended).

        A round starts at once (or right after the one in progress): the
        partition is revoked (``lost=True``) and its lease released, so
        another worker -- or this one, in the same round when it is still
        free -- takes it over. This worker does not take it again for
        ``retry_after`` seconds (a partition that keeps failing is not
        restarted in a loop), nor for one ``interval`` after a fence (the
        fencer holds the lease, or is about to). Does not block.
        """
        self._dropped.add(partition)
        if fenced:
            retry_after = max(retry_after, self.interval)
        if retry_after > 0:
            self._cooldown[partition] = time.monotonic() + retry_after
        else:
            self._cooldown.pop(partition, None)
        self._wake_up()


class Coordinator(Protocol):
    """Who owns which partition: what a :class:`~lance_async.cluster.Worker` runs under.

    :class:`LeaseCoordinator` (leases in Redis or NATS) and
    :class:`~lance_async.cluster.kafka.KafkaCoordinator` (a Kafka consumer
    group) are the two.
    """

    member: str
    num_partitions: int

    async def run(self, on_assign: Assign, on_revoke: Revoke) -> None:
        """Assign and revoke partitions until :meth:`stop`; then revoke all."""
        ...

    async def open_partition(self, partition: int) -> Feed:
        """The feed of an assigned partition, resuming at its last acknowledged message."""
        ...

    def valid(self, partition: int) -> bool:
        """Whether this member may still acknowledge ``partition``'s messages."""
        ...

    def drop(self, partition: int, *, fenced: bool = False, retry_after: float = 0.0) -> None:
        """Give up ``partition`` at once (its work failed, was ``fenced`` or
        ended); take it again no sooner than ``retry_after`` seconds from now."""
        ...

    def stop(self) -> None:
        """End :meth:`run` cleanly."""
        ...


class LeaseCoordinator:
    """Partitions of a :class:`PartitionedFeed` divided with a :class:`LeaseTable`.

    Parameters
    ----------
    feeds : PartitionedFeed
        The partitions (Redis streams or NATS subjects).
    leases : LeaseTable
        The group's leases; its ``member`` names this worker.
    """

    def __init__(self, feeds: PartitionedFeed, leases: LeaseTable) -> None:
        self._feeds = feeds
        self._leases = leases
        self.member = leases.member
        self.num_partitions = feeds.num_partitions
        self._balancer: LeaseBalancer | None = None
        self._stopping = False

    @property
    def balancer(self) -> LeaseBalancer | None:
        """The balancer, while :meth:`run` runs."""
        return self._balancer

    async def run(self, on_assign: Assign, on_revoke: Revoke) -> None:
        """Balance leases until :meth:`stop` (see :class:`LeaseBalancer`)."""
        self._balancer = LeaseBalancer(
            self._leases, self.num_partitions, on_assign=on_assign, on_revoke=on_revoke
        )
        if self._stopping:
            self._balancer.stop()
        await self._balancer.run()

    async def open_partition(self, partition: int) -> Feed:
        """The partition's feed, for this member."""
        return await self._feeds.open_partition(partition, self.member)

    def valid(self, partition: int) -> bool:
        """True while the lease is held and not near its end."""
        return self._balancer is not None and self._balancer.valid(partition)

    async def revalidate(self, partition: int) -> bool:
        """:meth:`valid`, once a lease past its margin had a chance to be
        renewed (see :meth:`LeaseBalancer.revalidate`)."""
        return self._balancer is not None and await self._balancer.revalidate(partition)

    def drop(self, partition: int, *, fenced: bool = False, retry_after: float = 0.0) -> None:
        """Revoke and release the partition at once (see :meth:`LeaseBalancer.drop`)."""
        if self._balancer is not None:
            self._balancer.drop(partition, fenced=fenced, retry_after=retry_after)

    def stop(self) -> None:
        """Hand every partition back, then end :meth:`run`."""
        self._stopping = True
        if self._balancer is not None:
            self._balancer.stop()
