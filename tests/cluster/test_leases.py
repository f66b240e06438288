"""Leases in Redis and in NATS KV, and the fair-share balancer, against the real brokers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from lance_async.cluster import LeaseBalancer, NatsLeaseTable, RedisLeaseTable

from ..conftest import broker_or_skip
from ..helpers import eventually

pytestmark = pytest.mark.anyio

TTL = 0.6


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis.asyncio and nats-py run on asyncio only


Factory = Callable[[str], Any]


@pytest.fixture(params=["redis", "nats"])
async def leases(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    """A factory of lease tables (one per member) over one fresh group."""
    group = uuid.uuid4().hex[:12]
    if request.param == "redis":
        broker_or_skip("Redis", 6379)
        import redis.asyncio

        client = redis.asyncio.Redis.from_url("redis://127.0.0.1:6379")
        prefix = f"lance_async:test:leases:{group}"
        yield lambda member: RedisLeaseTable(client, prefix, member, TTL)
        async for key in client.scan_iter(match=f"{prefix}:*"):
            await client.delete(key)
        await client.aclose()
    else:
        broker_or_skip("NATS", 4222)
        import nats

        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        bucket = await NatsLeaseTable.bucket(js, f"lance-async-test-{group}", TTL)
        yield lambda member: NatsLeaseTable(bucket, member, TTL)
        await js.delete_key_value(f"lance-async-test-{group}")
        await nc.close()


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


async def test_members_are_the_live_heartbeats(leases: Factory) -> None:
    a, b = leases("a"), leases("b")
    await a.heartbeat()
    await b.heartbeat()
    assert await a.members() >= {"a", "b"}

    async def b_gone() -> bool:  # b stopped beating
        await a.heartbeat()
        return "b" not in await a.members()

    await eventually(b_gone, 10, "b to drop out")


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
