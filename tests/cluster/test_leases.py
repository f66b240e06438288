"""Leases in Redis and in NATS KV, and the fair-share balancer, against the real brokers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import pytest_asyncio

from lance_async.cluster import LeaseBalancer, NatsLeaseTable, RedisLeaseTable

from ..conftest import broker_or_skip
from ..helpers import eventually

TTL = 0.6


Factory = Callable[..., Any]
"""``factory(member, ttl=TTL)``: a lease table of the group for ``member``."""


@pytest_asyncio.fixture(params=["redis", "nats"])
async def leases(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    """A factory of lease tables (one per member) over one fresh group."""
    group = uuid.uuid4().hex[:12]
    if request.param == "redis":
        broker_or_skip("Redis", 6379)
        import redis.asyncio

        client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
        prefix = f"lance_async:test:leases:{group}"

        def redis_table(member: str, ttl: float = TTL) -> RedisLeaseTable:
            return RedisLeaseTable(client, prefix, member, ttl)

        yield redis_table
        async for key in client.scan_iter(match=f"{prefix}:*"):
            await client.delete(key)
        await client.aclose()
    else:
        broker_or_skip("NATS", 4222)
        import nats

        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        bucket = await NatsLeaseTable.bucket(js, f"lance-async-test-{group}", TTL)

        def nats_table(member: str, ttl: float = TTL) -> NatsLeaseTable:
            return NatsLeaseTable(bucket, member, ttl)

        yield nats_table
        await js.delete_key_value(f"lance-async-test-{group}")
        await nc.close()


@pytest.mark.asyncio
async def test_a_lease_has_one_holder_until_it_expires(leases: Factory) -> None:
    a, b = leases("a"), leases("b")
    assert await a.acquire(0)
    assert a.valid(0) and not b.valid(0)
    assert not await b.acquire(0)
    assert (await b.holders([0, 1])) == {0: "a", 1: None}
    assert await a.renew(0)
    assert not await b.renew(0)
    # a stops renewing: once the ttl has passed (observed by b), b takes it
    await eventually(lambda: b.acquire(0), 10, "b to take the expired lease")
    assert not a.valid(0)  # a counts its lease as gone before anyone could take it
    assert not await a.renew(0)
    await b.release(0)
    assert (await a.holders([0]))[0] is None
    assert await a.acquire(0)


@pytest.mark.asyncio
async def test_members_are_the_live_heartbeats(leases: Factory) -> None:
    a, b = leases("a"), leases("b")
    await a.heartbeat()
    await b.heartbeat()
    assert await a.members() >= {"a", "b"}

    async def b_gone() -> bool:  # b stopped beating
        await a.heartbeat()
        return "b" not in await a.members()

    await eventually(b_gone, 10, "b to drop out")


@pytest.mark.asyncio
async def test_balancers_divide_the_partitions_and_take_over_a_dead_one(leases: Factory) -> None:
    owners: dict[int, str] = {}
    events: list[tuple[str, str, int]] = []

    def balancer(member: str) -> LeaseBalancer:
        async def assign(p: int) -> None:
            assert p not in owners, f"{member} got {p} while {owners.get(p)} held it"
            owners[p] = member
            events.append(("assign", member, p))

        async def revoke(p: int, lost: bool) -> None:
            if owners.get(p) == member:
                del owners[p]
            events.append(("lost" if lost else "revoke", member, p))

        return LeaseBalancer(leases(member), 4, on_assign=assign, on_revoke=revoke)

    a, b = balancer("a"), balancer("b")
    async with anyio.create_task_group() as tg:
        await tg.start(a.run)
        assert a.owned == {0, 1, 2, 3}  # alone: everything
        await tg.start(b.run)
        await eventually(lambda: len(a.owned) == len(b.owned) == 2, 15, "a 2/2 split")
        assert a.owned.isdisjoint(b.owned)
        a.stop()  # a clean stop hands its partitions back at once
        await eventually(lambda: b.owned == {0, 1, 2, 3}, 15, "b to take everything")
        b.stop()
    assert owners == {}
    assert ("revoke", "a", 0) in events or ("revoke", "a", 1) in events


@pytest.mark.asyncio
async def test_a_round_starts_the_partitions_it_takes_together(leases: Factory) -> None:
    """Each start opens a shard writer and a feed (waits on the store and the
    broker): a round that takes four partitions starts them side by side.
    Here each start waits until all four have begun, which a round starting
    them one by one never reaches; one start fails and is released."""
    begun: set[int] = set()
    all_begun = anyio.Event()

    async def assign(p: int) -> None:
        begun.add(p)
        if len(begun) == 4:
            all_begun.set()
        await all_begun.wait()
        if p == 3:
            raise RuntimeError("the shard would not open")

    async def revoke(p: int, lost: bool) -> None:
        pass

    a = LeaseBalancer(leases("a"), 4, on_assign=assign, on_revoke=revoke)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(60):  # only tells a round that never ends from one that did
            await tg.start(a.run)
        assert begun == {0, 1, 2, 3}
        assert a.owned == {0, 1, 2}  # the failed one was released
        assert (await leases("b").holders([3]))[3] is None
        a.stop()


@pytest.mark.asyncio
async def test_regression_a_drop_that_arrives_while_a_revoke_drains_is_kept(
    leases: Factory,
) -> None:
    """A drop made while the round awaits another partition's revoke is
    handled by the next round, which it starts at once (rounds are otherwise
    ten minutes apart here: only the drop can start one)."""
    revoked: list[tuple[int, bool]] = []

    async def assign(p: int) -> None:
        await anyio.lowlevel.checkpoint()

    async def revoke(p: int, lost: bool) -> None:
        revoked.append((p, lost))
        if p == 0:
            balancer.drop(1)  # partition 1's work ended while 0 drains
        await anyio.sleep(0.05)

    balancer = LeaseBalancer(
        leases("solo", 60.0), 4, on_assign=assign, on_revoke=revoke, interval=600.0
    )
    async with anyio.create_task_group() as tg:
        await tg.start(balancer.run)
        assert balancer.owned == {0, 1, 2, 3}
        balancer.drop(0)
        await eventually(lambda: (1, True) in revoked, 30, "partition 1 to be revoked")
        # both were free again at once, and taken again (no failure, no back-off)
        await eventually(lambda: balancer.owned == {0, 1, 2, 3}, 30, "both taken again")
        balancer.stop()
    assert revoked[:2] == [(0, True), (1, True)]


@pytest.mark.asyncio
async def test_a_clean_stop_hands_over_without_waiting_for_the_ttl(leases: Factory) -> None:
    """Leases of a minute, and b balancing only when told (its rounds are ten
    minutes apart): a's hand-backs, its departure and its releases are
    announced, so b takes a's share, then everything, long before a's keys
    could expire."""
    owners: dict[int, str] = {}

    def balancer(member: str, interval: float) -> LeaseBalancer:
        async def assign(p: int) -> None:
            assert p not in owners, f"{member} got {p} while {owners.get(p)} held it"
            owners[p] = member

        async def revoke(p: int, lost: bool) -> None:
            assert not lost
            if owners.get(p) == member:
                del owners[p]
            await anyio.lowlevel.checkpoint()

        return LeaseBalancer(
            leases(member, 60.0), 4, on_assign=assign, on_revoke=revoke, interval=interval
        )

    a, b = balancer("a", 0.2), balancer("b", 600.0)
    async with anyio.create_task_group() as tg:
        await tg.start(a.run)
        await tg.start(b.run)
        await eventually(lambda: len(a.owned) == len(b.owned) == 2, 30, "a 2/2 split")
        a.stop()
        await eventually(lambda: b.owned == {0, 1, 2, 3}, 30, "b to take everything")
        assert a.members == 2 and b.members == 1
        b.stop()
    assert owners == {}


@pytest.mark.asyncio
async def test_regression_a_worker_restarted_under_its_name_takes_its_leases_back(
    leases: Factory,
) -> None:
    """A worker killed and started again under the same name finds leases
    held in its name that it does not own: it takes them back in its first
    round, instead of taking them for someone else's (on NATS, where no
    server expires a key, they stayed unconsumed for as long as it lived)."""
    earlier = leases("w", 60.0)
    assert await earlier.acquire(0) and await earlier.acquire(1)

    async def assign(p: int) -> None:
        await anyio.lowlevel.checkpoint()

    async def revoke(p: int, lost: bool) -> None:
        await anyio.lowlevel.checkpoint()

    again = LeaseBalancer(leases("w", 60.0), 2, on_assign=assign, on_revoke=revoke)
    async with anyio.create_task_group() as tg:
        await tg.start(again.run)  # after its first round
        assert again.owned == {0, 1}
        again.stop()


@pytest.mark.asyncio
async def test_regression_an_earlier_lifes_leases_beyond_the_share_are_released_at_once(
    leases: Factory,
) -> None:
    """A worker killed while it held three of four partitions comes back under
    its name, now one of two members: it takes two of its earlier life's
    leases back and releases the third in its first round (announced), so
    the other member, balancing only when told, takes it long before the
    lease (a minute) could run out -- in the chaos test the partition went
    unconsumed for 24 s (NATS: a fresh observer waits a whole ttl)."""
    earlier = leases("w", 60.0)
    for p in (0, 1, 2):
        assert await earlier.acquire(p)

    async def assign(p: int) -> None:
        await anyio.lowlevel.checkpoint()

    async def revoke(p: int, lost: bool) -> None:
        await anyio.lowlevel.checkpoint()

    def balancer(member: str, interval: float) -> LeaseBalancer:
        return LeaseBalancer(
            leases(member, 60.0), 4, on_assign=assign, on_revoke=revoke, interval=interval
        )

    other = balancer("o", 600.0)
    async with anyio.create_task_group() as tg:
        await tg.start(other.run)  # takes the free one, then waits for a notice
        assert other.owned == {3}
        again = balancer("w", 600.0)
        await tg.start(again.run)  # its first round, with two members
        assert len(again.owned) == 2 and again.owned < {0, 1, 2}
        await eventually(lambda: len(other.owned) == 2, 30, "the third taken by the other")
        assert again.owned.isdisjoint(other.owned)
        other.stop()
        again.stop()


class RefusingLeaseTable:
    """Fault injection: a real lease table whose broker refuses the first
    ``refusals`` heartbeats (a broker restarting), as a real one cannot be
    made to do on cue without restarting the broker every test shares."""

    def __init__(self, table: Any, refusals: int) -> None:
        self._table = table
        self.refusals = refusals

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)

    async def heartbeat(self) -> None:
        if self.refusals > 0:
            self.refusals -= 1
            raise ConnectionError("refused (fault injection)")
        await self._table.heartbeat()


@pytest.mark.asyncio
async def test_regression_a_round_the_broker_refused_is_tried_again_soon(
    leases: Factory,
) -> None:
    """Rounds ten minutes apart: after three refused rounds (a broker
    restarting), the fourth comes at once and takes the partitions -- a
    whole interval later, a restarted broker found every lease run out."""

    async def assign(p: int) -> None:
        await anyio.lowlevel.checkpoint()

    async def revoke(p: int, lost: bool) -> None:
        await anyio.lowlevel.checkpoint()

    table = RefusingLeaseTable(leases("r", 60.0), refusals=3)
    balancer = LeaseBalancer(table, 2, on_assign=assign, on_revoke=revoke, interval=600.0)
    async with anyio.create_task_group() as tg:
        await tg.start(balancer.run)  # after its first (refused) round
        assert balancer.owned == set()
        await eventually(lambda: balancer.owned == {0, 1}, 30, "the partitions taken")
        assert table.refusals == 0
        balancer.stop()


@pytest.mark.asyncio
async def test_a_holder_back_from_a_pause_keeps_a_lease_nobody_took(leases: Factory) -> None:
    """A holder that could not renew past its lease's ttl (paused) renews it
    -- keeping its writer and feed -- when nobody took the lease meanwhile
    (Redis: the key expired; NATS: the revision is unchanged), and not when
    another took it and gave it up again (its writer is fenced by then)."""
    a, b = leases("a"), leases("b")
    assert await a.acquire(0) and await a.acquire(1)
    await eventually(lambda: b.acquire(1), 10, "b to take the expired lease 1")
    await b.release(1)  # taken and given up while a was away

    async def ran_out() -> bool:  # lease 0: nobody takes it
        held: dict[int, str | None] = await b.holders([0])
        return held == {0: None}

    await eventually(ran_out, 10, "lease 0 to run out")
    assert not a.valid(0)
    assert await a.renew(0)
    assert a.valid(0)
    assert (await b.holders([0])) == {0: "a"} and not await b.acquire(0)
    assert not await a.renew(1)
    assert not a.valid(1)


@pytest.mark.asyncio
@pytest.mark.parametrize("leases", ["nats"], indirect=True)  # Redis expires keys itself
async def test_a_fresh_nats_observer_counts_an_expired_lease_at_once(leases: Factory) -> None:
    """An observer that just started (a worker restarted) learns from the
    bucket's watch when the server stored each lease and what time the
    server has now (its own heartbeat): a lease not renewed for a ttl of
    the server's clock is expired at its first look, not after a ttl of
    its own watching (the take-over waited that long in NATS chaos)."""
    a = leases("a")
    assert isinstance(a, NatsLeaseTable)
    assert await a.acquire(0)
    await anyio.sleep(TTL * 1.5)  # a never renews: expired by the server's clock
    fresh = leases("fresh")
    await fresh.heartbeat()  # an entry stamped now: the server's time
    watched = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(fresh.watch, watched.set)  # set after the current values
        await watched.wait()
        assert (await fresh.holders([0])) == {0: None}  # its first look
        assert await fresh.acquire(0)
        tg.cancel_scope.cancel()


@pytest.mark.asyncio
async def test_a_member_under_its_share_takes_a_dead_holders_lease_as_it_runs_out(
    leases: Factory,
) -> None:
    """Rounds ten minutes apart: a lease held by a worker killed a moment ago
    (it never renews) is taken by the round that starts as the lease runs
    out, not a whole interval later (the take-over after a kill -9 costs
    the ttl, not the ttl and an interval)."""
    dead = leases("dead")
    assert await dead.acquire(0)

    async def assign(p: int) -> None:
        await anyio.lowlevel.checkpoint()

    async def revoke(p: int, lost: bool) -> None:
        await anyio.lowlevel.checkpoint()

    balancer = LeaseBalancer(leases("b"), 1, on_assign=assign, on_revoke=revoke, interval=600.0)
    async with anyio.create_task_group() as tg:
        await tg.start(balancer.run)  # after its first round: the lease is the dead one's
        assert balancer.owned == set()
        await eventually(lambda: balancer.owned == {0}, 30, "the dead holder's lease taken")
        balancer.stop()
