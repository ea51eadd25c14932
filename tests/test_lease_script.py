"""The shared bucket's lease script (bucket_scripts.py) on a real redis-server, through RedisState.

Rates here are slow (100 permits an hour: 0.03 permits in a second), so what refills while a test
runs is under one whole permit and the asserts on whole permits are exact. A lease's share is
kept aside from the bucket (it refills at the rate less the shares and holds the burst less the
bursts) and its holder's first permits come out of the bucket's level, so the bucket and the
holders' buckets together never hold more than the burst."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import cast

import pytest

from mcpcreds.core.clock import SystemClock
from mcpcreds.core.rates import Rate
from mcpcreds.errors import RateLimited
from mcpcreds.state.lease_asks import LeaseAsk, LeaseReply
from mcpcreds.state.redis_state import RedisState
from mcpcreds.state.shared import SharedLimiter
from tests.peers.redis_peer import RedisPeer

HOUR = Rate(100, 3600.0)
KEY = "svc:api"


@pytest.fixture
async def state(redis: RedisPeer) -> AsyncIterator[RedisState]:
    state = RedisState(redis.url, "k" * 32)
    yield state
    await state.aclose()


async def lease(state: RedisState, ask: LeaseAsk, rate: Rate = HOUR) -> LeaseReply:
    return await state.lease(KEY, rate, ask)


async def take(state: RedisState, cost: int, rate: Rate = HOUR) -> bool:
    granted, _, _, _ = await state.bucket(KEY, rate, cost, "take")
    return granted


async def level(state: RedisState, rate: Rate = HOUR) -> float:
    return (await state.bucket(KEY, rate, 1, "peek"))[2]


async def test_a_lone_holder_gets_the_rate_but_the_shared_floor_and_its_first_permits_from_the_level(
        state: RedisState) -> None:
    got = await lease(state, LeaseAsk("a", 1e9, 60.0))
    assert math.isclose(got.share, 99.0, rel_tol=1e-9)  # 1 permit a period stays with the shared callers
    assert got.burst == 49  # floor(99 x 0.5): half the burst stays shared
    # its first permits: the level above one period of the shared share (1 permit)
    assert got.initial == 49
    assert 51 <= await level(state) < 51.01  # 100 - 49 (and the cap is 100 - 49)
    assert await take(state, 51) and not await take(state, 1)  # no more than the burst in all: 49 + 51


async def test_while_a_lease_is_live_the_bucket_holds_the_burst_less_its_burst_and_refills_slower(
        state: RedisState) -> None:
    """100 a second, a holder of 99 a second and a burst of 49: the bucket holds at most 51 however
    long it waits, and refills at 1 a second (bounds from the elapsed time, which a bucket that
    refills at the whole rate, or to the whole burst, crosses by far)."""
    fast = Rate(100, 1.0)
    got = await lease(state, LeaseAsk("a", 1e9, 60.0), fast)
    assert (got.burst, got.initial) == (49, 49)
    await asyncio.sleep(0.3)
    assert await level(state, fast) <= 51 + 1e-9  # full at the burst less the leased burst
    start = time.monotonic()
    assert await take(state, 51, fast)
    await asyncio.sleep(0.5)
    lvl = await level(state, fast)
    assert lvl <= (time.monotonic() - start) * (100 - got.share) + 1e-6


async def test_what_is_leased_comes_back_when_the_holder_releases(state: RedisState) -> None:
    await lease(state, LeaseAsk("a", 1e9, 60.0))
    assert await take(state, 51) and not await take(state, 1)
    await lease(state, LeaseAsk("a", 0.0, 0.001, release=True))
    # the cap is the whole burst again, but what the holder took is spent: nothing refills at once
    assert not await take(state, 1)
    assert await state.redis.hget("mcpcreds:{svc:api}:leases", "a") is None


async def test_shares_of_every_holder_never_sum_past_the_rate(state: RedisState) -> None:
    replies = [await lease(state, LeaseAsk(f"h{i}", 1e9, 60.0)) for i in range(8)]
    assert sum(r.share for r in replies) <= 99.0 + 1e-6
    assert sum(r.burst for r in replies) <= 50
    assert sum(r.initial for r in replies) + await level(state) <= 100 + 0.1  # all there is, counted once


async def test_a_newcomer_gets_its_fair_share_when_the_first_holder_renews(state: RedisState) -> None:
    """Max-min fair over every holder of the shared state: the first holder had everything; the
    second gets what is free now (nothing), and once the first renews (with the demands of both
    known), each gets half, whichever sidecar they lease from."""
    a = await lease(state, LeaseAsk("a", 1e9, 60.0))
    b = await lease(state, LeaseAsk("b", 1e9, 60.0))
    assert b.share == 0.0 and b.burst == 0  # not now: nothing is free
    a = await lease(state, LeaseAsk("a", 1e9, 60.0, spare=0, holding=(a.share, a.burst)))
    assert math.isclose(a.share, 49.5, rel_tol=1e-9)
    b = await lease(state, LeaseAsk("b", 1e9, 60.0))
    # a's old, larger grant stays kept aside until a says it spends the new one
    assert b.share == 0.0
    a = await lease(state, LeaseAsk("a", 1e9, 60.0, holding=(a.share, a.burst)))
    b = await lease(state, LeaseAsk("b", 1e9, 60.0))
    assert math.isclose(a.share, 49.5, rel_tol=1e-9) and math.isclose(b.share, 49.5, rel_tol=1e-9)


async def test_a_holder_that_wants_little_leaves_the_rest(state: RedisState) -> None:
    a = await lease(state, LeaseAsk("a", 10.0, 60.0))
    assert math.isclose(a.share, 10.0, rel_tol=1e-9) and a.burst == 5
    b = await lease(state, LeaseAsk("b", 1e9, 60.0))
    assert math.isclose(b.share, 89.0, rel_tol=1e-9)


async def test_a_lease_lapses_at_its_end_and_its_share_comes_back(state: RedisState) -> None:
    """The bucket refills at the rate less the shares while they are live, and at the whole rate
    after their end: 100 a second, with a holder of 99 until its lease ends after 0.3 s."""
    fast = Rate(100, 1.0)
    got = await lease(state, LeaseAsk("a", 1e9, 0.3), fast)
    assert got.share > 98 and got.initial == 49
    assert await take(state, 51, fast)
    await asyncio.sleep(0.6)  # well past the lease's end (a bound, not a race)
    # in the 0.6 s the bucket refilled at 1 a second during the lease and 100 a second after it:
    # at least 0.3 s x 100, at most 0.3 x 1 + (0.6 + slack) x 100, never past the burst
    lvl = await level(state, fast)
    assert lvl >= 25
    assert await state.redis.hget("mcpcreds:{svc:api}:leases", "a") is None


async def test_a_pause_leases_nothing(state: RedisState) -> None:
    await state.bucket(KEY, HOUR, 1, "pause", 30.0)
    got = await lease(state, LeaseAsk("a", 1e9, 60.0))
    assert (got.share, got.burst, got.initial) == (0.0, 0, 0) and got.paused > 29


async def test_a_forged_lease_record_is_held_to_what_the_script_could_write(state: RedisState) -> None:
    """Someone who can write to Redis cannot make a lease give more than the rate or the burst."""
    await state.redis.hset("mcpcreds:{svc:api}:leases", "x", "1e300 1e300 1e300 nan nan nan 1e300")
    await lease(state, LeaseAsk("a", 1e9, 60.0))  # reads the forged one: held within the rate and burst
    assert await take(state, 1) in (True, False)
    assert await level(state) <= 100


async def test_the_shared_limiter_refuses_a_caller_while_the_leased_cap_is_spent(state: RedisState) -> None:
    limiter = SharedLimiter(state, SystemClock(), None, 0.5)

    await limiter.lease(KEY, HOUR, LeaseAsk("a", 1e9, 60.0))
    await limiter.acquire(KEY, HOUR, 51, 0.0)
    with pytest.raises(RateLimited):
        await limiter.acquire(KEY, HOUR, 1, 0.0)


async def test_a_grant_names_the_holders_of_any_sidecar_to_tell_to_renew_now(state: RedisState) -> None:
    """The split changed: the holders over their fair part while someone is short (here the
    newcomer), then those under what they could have now, each named once until it renews (the
    sidecar tells its own on their event stream, the others' through pub/sub)."""
    a = await lease(state, LeaseAsk("a", 1e9, 60.0))
    b = await lease(state, LeaseAsk("b", 1e9, 60.0))
    assert b.share == 0.0 and b.told == ("a",)
    a = await lease(state, LeaseAsk("a", 1e9, 60.0, holding=(a.share, a.burst)))
    assert math.isclose(a.share, 49.5, rel_tol=1e-9) and a.told == ()  # its 99 is still kept aside
    a = await lease(state, LeaseAsk("a", 1e9, 60.0, holding=(a.share, a.burst)))
    assert a.told == ("b",)  # a spends its 49.5: b could have 49.5 now
    a = await lease(state, LeaseAsk("a", 1e9, 60.0, holding=(a.share, a.burst)))
    assert a.told == ()  # told once until it renews
    b = await lease(state, LeaseAsk("b", 1e9, 60.0))
    assert math.isclose(b.share, 49.5, rel_tol=1e-9)


async def test_a_grant_is_kept_aside_a_little_longer_than_its_holder_may_spend_it(state: RedisState) -> None:
    """The holder stops `seconds` after it sent its request, on its own clock; Redis keeps the
    share aside 1000 ppm + 10 ms longer, so a holder's clock that runs slow never spends past it."""
    seconds, before = 60.0, await state.redis.time()
    await lease(state, LeaseAsk("a", 1e9, seconds))
    until = float(cast(bytes, await state.redis.hget("mcpcreds:{svc:api}:leases", "a")).split()[2])
    assert until - (before[0] + before[1] / 1e6) >= seconds * 1.001 + 0.01


async def test_a_share_under_the_least_worth_holding_is_not_granted_and_the_asker_is_not_kept(
        state: RedisState, redis: RedisPeer) -> None:
    """`least` (per period, as LeaseAsk takes it): an asker whose fair part is under it gets
    nothing, is not kept in the leases' hash (its demand shrinks nobody's part) and takes nothing
    from the level; the next asker, with no such floor, gets the whole split as if it had not asked."""
    import redis as redis_client

    got = await lease(state, LeaseAsk("a", 1e9, 60.0, least=150.0))
    assert (got.share, got.burst, got.initial, got.dropped) == (0.0, 0, 0, True)
    raw = redis_client.Redis(unix_socket_path=str(redis.socket))
    try:
        assert raw.hlen(f"mcpcreds:{{{KEY}}}:leases") == 0
    finally:
        raw.close()
    assert 99.99 <= await level(state) <= 100.0
    other = await lease(state, LeaseAsk("b", 1e9, 60.0, least=50.0))
    assert math.isclose(other.share, 99.0, rel_tol=1e-9) and other.burst == 49 and not other.dropped
