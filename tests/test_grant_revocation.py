"""Issue #28, grants: a revoked grant stays revoked when someone who can write to Redis puts its
records back (7), and `max_subgrants` counts every sub-grant under a top grant, at any depth (10)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from mcpcreds.core.clock import FakeClock
from mcpcreds.errors import TooManyGrants
from mcpcreds.state.grants import Grant, GrantLimits, GrantStore, MemoryGrants, RedisGrants
from mcpcreds.state.redis_state import EVENTS, RedisState
from tests.peers.redis_peer import RedisPeer
from tests.redis_sidecar import STATE_KEY


@pytest.fixture
async def raw(redis: RedisPeer) -> AsyncIterator[aioredis.Redis]:
    """A plain client, as someone who can write to Redis but holds no state_key."""
    client = aioredis.Redis(unix_socket_path=str(redis.socket))
    try:
        yield client
    finally:
        await client.aclose()


async def snapshot(raw: aioredis.Redis) -> dict[bytes, tuple[bytes, int]]:
    """Every key's DUMP and remaining life: what a writer to Redis may have kept a copy of."""
    kept = {}
    async for key in raw.scan_iter():
        kept[bytes(key)] = (cast(bytes, await raw.dump(key)), max(1, int(await raw.pttl(key))))
    return kept


async def restore(raw: aioredis.Redis, kept: dict[bytes, tuple[bytes, int]], only: bytes = b"") -> None:
    """Write the copies back (those whose key contains `only`), as they were."""
    for key, (dumped, ttl) in kept.items():
        if only in key:
            await raw.restore(key, ttl, dumped, replace=True)


def chain(now: float, *ids: str) -> list[Grant]:
    """Grants each a sub-grant of the one before."""
    grants: list[Grant] = []
    for gid in ids:
        above = grants[-1] if grants else None
        grants.append(Grant(gid, ("crm",), now + 3600, above.id if above else None,
                            (*above.ancestors, above.id) if above else ()))
    return grants


# -- 7: revocation survives records written back

async def test_a_revoked_grant_written_back_into_redis_is_not_honoured(redis: RedisPeer,
                                                                      raw: aioredis.Redis) -> None:
    clock = FakeClock(time.time())
    state, later = RedisState(redis.url, STATE_KEY), RedisState(redis.url, STATE_KEY)
    store = RedisGrants(state, clock)
    try:
        await store.put(Grant("g1", ("crm",), clock.time() + 3600), "hash-1")
        kept = await snapshot(raw)
        assert await store.revoke("g1")
        await restore(raw, kept, only=b":rec:")  # the sealed grant record, as it was
        assert await store.get("hash-1") is None
        # a sidecar started after the revocation (it remembers nothing) refuses it too
        assert await RedisGrants(later, clock).get("hash-1") is None
    finally:
        await state.aclose()
        await later.aclose()


async def test_a_sub_grant_of_a_revoked_grant_is_not_brought_back_by_a_made_up_liveness_record(
        redis: RedisPeer, raw: aioredis.Redis) -> None:
    clock = FakeClock(time.time())
    state, later = RedisState(redis.url, STATE_KEY), RedisState(redis.url, STATE_KEY)
    store = RedisGrants(state, clock)
    try:
        top, kid = chain(clock.time(), "top", "kid")
        await store.put(top, "hash-top")
        await store.put(kid, "hash-kid")
        kept = await snapshot(raw)
        assert await store.revoke("top")
        assert await store.get("hash-kid") is None
        await restore(raw, kept, only=b"kid")  # the sub-grant's own records, as they were
        for key in kept:  # and for the revoked top grant, a liveness record made up
            if b":id:top" in key:
                await raw.set(key, b"hash-top ", px=3_600_000)
        fresh = RedisGrants(later, clock)
        assert await fresh.get("hash-kid") is None and await store.get("hash-kid") is None
        assert state.refusals + later.refusals >= 1
    finally:
        await state.aclose()
        await later.aclose()


async def test_every_sidecar_running_at_a_revocation_refuses_the_grant_put_back_whole(
        redis: RedisPeer, raw: aioredis.Redis) -> None:
    clock = FakeClock(time.time())
    mine, other = RedisState(redis.url, STATE_KEY), RedisState(redis.url, STATE_KEY)
    store, theirs = RedisGrants(mine, clock), RedisGrants(other, clock)
    marker = asyncio.Event()

    def handler(event: dict[str, Any]) -> None:
        if event.get("key") == "service:marker":
            marker.set()

    other.listen(handler)
    try:
        deadline = time.monotonic() + 10
        while dict(await raw.pubsub_numsub(EVENTS)).get(EVENTS.encode(), 0) < 1:
            assert time.monotonic() < deadline, "the listener never subscribed"
            await asyncio.sleep(0.01)
        top, kid = chain(clock.time(), "top", "kid")
        await store.put(top, "hash-top")
        await store.put(kid, "hash-kid")
        kept = await snapshot(raw)
        assert await store.revoke("top")
        await mine.publish("login", "service:marker")  # after the revoke event, on the same channel
        await asyncio.wait_for(marker.wait(), 30)
        await restore(raw, kept)  # every record as it was before the revocation
        for hashed in ("hash-top", "hash-kid"):
            assert await store.get(hashed) is None  # the sidecar it was revoked through
            assert await theirs.get(hashed) is None  # another that heard the revocation
    finally:
        await mine.aclose()
        await other.aclose()


# -- 10: sub-grants count against the top grant, at any depth

async def fill_a_tree(store: GrantStore, now: float) -> None:
    """A top grant `t` whose holder spreads 64 sub-grants over a tree: 8 children, each with a
    chain of 7 below it. The 65th anywhere under `t` is refused; another top grant keeps its own."""
    limits = GrantLimits(max_total=1000, max_children=64)
    await store.put(Grant("t", ("crm",), now + 3600), "h-t", limits)
    await store.put(Grant("u", ("crm",), now + 3600), "h-u", limits)
    for branch in range(8):
        for grant in chain(now, "t", *(f"b{branch}-{depth}" for depth in range(8)))[1:]:
            await store.put(grant, f"h-{grant.id}", limits)
    deepest = chain(now, "t", *(f"b0-{depth}" for depth in range(9)))[-1]
    for refused in (Grant("x", ("crm",), now + 3600, "t", ("t",)), deepest):
        with pytest.raises(TooManyGrants) as info:
            await store.put(refused, f"h-{refused.id}", limits)
        assert info.value.status == 429 and info.value.code == "too_many_grants"
    await store.put(Grant("u1", ("crm",), now + 3600, "u", ("u",)), "h-u1", limits)
    assert await store.revoke("b3-4")  # it and the three below it free four places
    for i in range(4):
        await store.put(Grant(f"y{i}", ("crm",), now + 3600, "b0-7", deepest.ancestors), f"h-y{i}", limits)
    with pytest.raises(TooManyGrants):
        await store.put(Grant("z", ("crm",), now + 3600, "t", ("t",)), "h-z", limits)
    assert await store.get("h-y3") is not None


async def test_memory_sub_grants_count_against_the_top_grant_at_any_depth() -> None:
    clock = FakeClock()
    await fill_a_tree(MemoryGrants(clock), clock.time())


async def test_redis_sub_grants_count_against_the_top_grant_at_any_depth(redis: RedisPeer) -> None:
    clock = FakeClock(time.time())
    state = RedisState(redis.url, STATE_KEY)
    try:
        await fill_a_tree(RedisGrants(state, clock), clock.time())
    finally:
        await state.aclose()
