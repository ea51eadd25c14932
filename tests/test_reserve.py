"""The sidecar's own lease of a busy key on a shared state (reserve.py): on a fake clock with a
scripted lease call (exact), then on a real redis-server (the bucket's total holds exactly, no
round trip while the lease has permits, and a stopped Redis ends the grants with the lease)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from mcpcreds import RateLimited, StateUnavailable
from mcpcreds.core.clock import FakeClock, SystemClock
from mcpcreds.core.rates import Rate
from mcpcreds.state import reserve
from mcpcreds.state.lease_asks import LeaseAsk, LeaseReply
from mcpcreds.state.redis_state import RedisState
from mcpcreds.state.reserve import RESERVE_AFTER, RESERVE_LEAST, RETRY_NOT_WORTH, Reserves
from mcpcreds.state.shared import SharedLimiter
from tests.peers.redis_peer import RedisPeer
from tests.redis_sidecar import LIVENESS, STATE_KEY

RATE = Rate(100, 1.0)
KEY = "svc:api"


class ScriptedLease:
    """The lease call: records each ask and answers the next scripted reply (or raises it)."""

    def __init__(self, *replies: LeaseReply | Exception) -> None:
        self.replies = list(replies)
        self.asks: list[LeaseAsk] = []

    async def __call__(self, key: str, rate: Rate, ask: LeaseAsk) -> LeaseReply:
        self.asks.append(ask)
        if ask.release:
            return LeaseReply(0.0, 0, 0, 0.0)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


async def settle() -> None:
    """Let the background lease task run (it awaits only the scripted call)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def leased(clock: FakeClock, lease: ScriptedLease) -> Reserves:
    reserves = Reserves(clock, lease)
    for _ in range(RESERVE_AFTER):
        assert not reserves.take(KEY, RATE, 1)
    await settle()
    return reserves


def takes(reserves: Reserves, most: int = 10_000) -> int:
    """How many single permits the lease gives now."""
    n = 0
    while n < most and reserves.take(KEY, RATE, 1):
        n += 1
    return n


async def test_a_key_called_often_is_leased_and_its_permits_are_taken_locally() -> None:
    clock, lease = FakeClock(), ScriptedLease(LeaseReply(99.0, 49, 49, 0.0))
    reserves = Reserves(clock, lease)
    for _ in range(RESERVE_AFTER - 1):
        assert not reserves.take(KEY, RATE, 1)
    await settle()
    assert lease.asks == []  # not yet busy
    assert not reserves.take(KEY, RATE, 1)
    await settle()
    assert [(a.lease != "", a.demand, a.spare, a.holding) for a in lease.asks] == [(True, 100.0, 0, None)]
    assert takes(reserves) == 49  # what the lease moved to it, no more
    clock.advance(0.1)
    assert takes(reserves) == 9  # refilled at its share: 9.9 in 0.1 s
    assert reserves.held(KEY) == (99.0, 49)


async def test_a_share_not_worth_holding_leaves_the_key_per_grant_and_is_asked_again_much_later() -> None:
    """The sidecar asks for a share of at least RESERVE_LEAST a second; the lease script drops an
    ask under it ("not now", not kept). Its callers then go to Redis per grant, and the key is not
    asked again before RETRY_NOT_WORTH, however busy (a lease script run per key per second
    otherwise, for nothing)."""
    clock, lease = FakeClock(), ScriptedLease(LeaseReply(0.0, 0, 0, 0.0, dropped=True),
                                              LeaseReply(99.0, 49, 49, 0.0))
    reserves = await leased(clock, lease)
    assert [a.least for a in lease.asks] == [RESERVE_LEAST * RATE.per]
    for _ in range(5):
        clock.advance(RETRY_NOT_WORTH / 5 - 0.01)
        for _ in range(RESERVE_AFTER):
            assert not reserves.take(KEY, RATE, 1)  # per grant
        await settle()
    assert len(lease.asks) == 1 and reserves.held(KEY) is None
    clock.advance(0.1)  # past RETRY_NOT_WORTH: the empty lease is given up, and the key counted anew
    reserves.take(KEY, RATE, 1)
    await settle()
    for _ in range(RESERVE_AFTER):
        reserves.take(KEY, RATE, 1)
    await settle()
    assert len([a for a in lease.asks if not a.release]) == 2 and reserves.held(KEY) == (99.0, 49)


async def test_the_sidecars_lease_is_short_whatever_the_period() -> None:
    """A sidecar that dies holding its lease keeps its share aside in Redis for 2 s at most (a
    client's lease on 100 a minute lasts 60 s)."""
    clock, lease = FakeClock(), ScriptedLease(LeaseReply(99.0, 49, 49, 0.0))
    reserves = Reserves(clock, lease)
    for _ in range(RESERVE_AFTER):
        reserves.take(KEY, Rate(100, 60.0), 1)
    await settle()
    assert lease.asks[0].seconds == 2.0


async def test_calls_spread_out_do_not_lease() -> None:
    clock, lease = FakeClock(), ScriptedLease()
    reserves = Reserves(clock, lease)
    for _ in range(3):
        for _ in range(RESERVE_AFTER - 1):
            reserves.take(KEY, RATE, 1)
        clock.advance(1.01)
    await settle()
    assert lease.asks == []


async def test_the_renewal_at_half_asks_twice_what_was_used_and_carries_what_is_left() -> None:
    clock, lease = FakeClock(), ScriptedLease(LeaseReply(99.0, 49, 49, 0.0), LeaseReply(40.0, 20, 0, 0.0))
    reserves = await leased(clock, lease)
    assert takes(reserves, 20) == 20
    clock.advance(1.0)  # half of a 2 s lease
    assert reserves.take(KEY, RATE, 1)  # served from the old terms while the renewal is under way
    await settle()
    renewal = lease.asks[1]
    assert (renewal.lease, renewal.demand, renewal.spare, renewal.holding) == (lease.asks[0].lease, 42.0, 48, (99.0, 49))
    assert takes(reserves) == 20  # the new bucket: what the old one had left, up to the new burst


async def test_a_lease_found_empty_asks_for_twice_as_much_at_once_until_it_asked_for_all() -> None:
    """Twice the use measured may be too little when the load grows: the first caller it cannot
    serve has the lease renewed at once, asking twice what it asked before (or twice the use, if
    more); one that asked for all of the rate waits for its renewal at half."""
    clock = FakeClock()
    lease = ScriptedLease(LeaseReply(99.0, 49, 49, 0.0), LeaseReply(10.0, 5, 0, 0.0),
                          LeaseReply(4.0, 2, 0, 0.0), LeaseReply(8.0, 4, 2, 0.0))
    reserves = await leased(clock, lease)
    assert takes(reserves) == 49
    await settle()
    assert len(lease.asks) == 1  # short, but it asked for all (the first lease does)
    clock.advance(1.0)
    reserves.take(KEY, RATE, 1)  # renews at half: 50 used in 1 s, asks for all
    await settle()
    assert lease.asks[1].demand == 100.0
    clock.advance(0.5)
    assert takes(reserves, 1) == 1
    clock.advance(0.5)
    reserves.take(KEY, RATE, 1)  # renews at half: 2 used in 1 s, asks 4
    await settle()
    assert lease.asks[2].demand == 4.0
    clock.advance(0.9)
    assert takes(reserves) == 2  # the new burst; then empty: 2 used in 0.9 s
    await settle()
    assert len(lease.asks) == 4 and lease.asks[3].demand == 8.0  # twice 4, at once


async def test_a_lease_found_empty_or_told_to_renew_right_after_a_renewal_is_kept() -> None:
    """Only a renewal due at half gives back a lease unused since the last one: one found empty
    just after its renewal answered (nothing carried, nothing moved), or told to renew by the
    shared state, asks again instead."""
    clock = FakeClock()
    lease = ScriptedLease(LeaseReply(10.0, 5, 5, 0.0), LeaseReply(20.0, 10, 0, 0.0),
                          LeaseReply(40.0, 20, 20, 0.0), LeaseReply(40.0, 20, 0, 0.0))
    reserves = await leased(clock, lease)
    assert takes(reserves, 5) == 5
    clock.advance(1.0)
    assert takes(reserves, 5) == 5  # the first of them renews (due): 10 used in 1 s
    await settle()
    assert lease.asks[1].demand == 20.0
    assert not reserves.take(KEY, RATE, 1)  # the new bucket is empty: found empty, asks at once
    await settle()
    assert not lease.asks[2].release and lease.asks[2].demand >= 40.0
    assert takes(reserves) == 20
    assert reserves.nudge(lease.asks[0].lease)  # told to renew: renews, does not give it back
    await settle()
    assert not lease.asks[3].release and reserves.held(KEY) == (40.0, 20)


async def test_a_lease_not_used_since_its_renewal_is_given_back() -> None:
    clock, lease = FakeClock(), ScriptedLease(LeaseReply(99.0, 49, 49, 0.0), LeaseReply(99.0, 49, 0, 0.0))
    reserves = await leased(clock, lease)
    assert takes(reserves, 1) == 1
    clock.advance(1.0)
    reserves.take(KEY, RATE, 1)  # renews (used: 1)
    await settle()
    clock.advance(1.0)
    assert not reserves.take(KEY, RATE, 50)  # more than its burst: not served, and it renews (unused)
    await settle()
    assert lease.asks[-1].release and reserves.held(KEY) is None
    assert not reserves.take(KEY, RATE, 1)  # per call again (counting towards a new lease)


async def test_a_pause_drops_the_lease_at_once_and_gives_it_back() -> None:
    clock, lease = FakeClock(), ScriptedLease(LeaseReply(99.0, 49, 49, 0.0))
    reserves = await leased(clock, lease)
    reserves.drop(KEY)
    assert not reserves.take(KEY, RATE, 1)
    await settle()
    assert lease.asks[-1].release and lease.asks[-1].lease == lease.asks[0].lease


async def test_a_failed_renewal_keeps_the_lease_until_its_end_and_no_longer() -> None:
    clock = FakeClock()
    lease = ScriptedLease(LeaseReply(99.0, 49, 49, 0.0), StateUnavailable("down"), StateUnavailable("down"))
    reserves = await leased(clock, lease)
    clock.advance(1.0)
    assert reserves.take(KEY, RATE, 1)
    await settle()  # the renewal failed: asked again a second later
    clock.advance(0.999)
    assert reserves.take(KEY, RATE, 1)  # bought until 2 s after it was asked for
    clock.advance(0.001)
    assert not reserves.take(KEY, RATE, 1)
    assert reserves.wait(KEY, 1) == float("inf")


@pytest.mark.parametrize("reply", [LeaseReply(0.0, 0, 0, 0.0), LeaseReply(0.0, 0, 0, 30.0)])
async def test_a_lease_of_nothing_or_a_pause_serves_nothing(reply: LeaseReply) -> None:
    reserves = await leased(FakeClock(), ScriptedLease(reply))
    assert not reserves.take(KEY, RATE, 1) and reserves.held(KEY) is None


# -- on a real redis-server

HOUR = Rate(100, 3600.0)  # 0.03 permits a second: nothing whole refills during a test


@pytest.fixture
async def state(redis: RedisPeer) -> AsyncIterator[RedisState]:
    s = RedisState(redis.url, STATE_KEY)
    yield s
    await s.aclose()


async def evalsha_calls(redis: RedisPeer) -> int:
    raw = aioredis.Redis(unix_socket_path=str(redis.socket))
    try:
        stats = await raw.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    finally:
        await raw.aclose()


async def until_leased(limiter: SharedLimiter) -> None:
    """Wait for the lease call's answer (a bound: 10 s)."""
    deadline = time.monotonic() + 10.0
    while limiter.reserves.held(KEY) is None:
        assert time.monotonic() < deadline, "the sidecar did not lease for its busy key"
        await asyncio.sleep(0.005)


async def grants_until_refused(limiter: SharedLimiter, rate: Rate) -> int:
    n = 0
    while True:
        try:
            await limiter.acquire(KEY, rate, 1, 0.0)
        except RateLimited:
            return n
        n += 1


async def test_two_sidecars_leasing_for_their_callers_grant_exactly_the_burst(
        redis: RedisPeer, state: RedisState, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sidecar leases for its busy key; with what they lease and what stays shared, the two
    grant exactly the bucket's 100 permits, and permits from a lease cost no round trip (a share
    of 100 an hour is worth holding here: the accounting is what is tested)."""
    monkeypatch.setattr(reserve, "RESERVE_LEAST", 0.0)
    other_state = RedisState(redis.url, STATE_KEY)
    try:
        first = SharedLimiter(state, SystemClock(), None, 0.5)
        second = SharedLimiter(other_state, SystemClock(), None, 0.5)
        for _ in range(RESERVE_AFTER):
            await first.acquire(KEY, HOUR, 1, 0.0)
        await until_leased(first)
        (row,) = await first.astatus({KEY: HOUR})
        assert row["own_lease"] == {"share": 99.0, "burst": 49}  # what the status shows
        before = await evalsha_calls(redis)
        served = 0
        while first.try_acquire(KEY, HOUR, 1):
            served += 1
        assert served > 0 and await evalsha_calls(redis) == before  # local: no script run
        total = RESERVE_AFTER + served + await grants_until_refused(second, HOUR) \
            + await grants_until_refused(first, HOUR)
        assert total == 100
        assert await state.redis.hlen("mcpcreds:{svc:api}:leases") >= 1
        await first.aclose()  # the sidecars stop: their leases are given back in Redis
        await second.aclose()
        assert await state.redis.hlen("mcpcreds:{svc:api}:leases") == 0
    finally:
        await other_state.aclose()


async def test_with_redis_stopped_a_sidecar_grants_from_its_lease_only_until_the_lease_ends(
        redis: RedisPeer, state: RedisState) -> None:
    """Its share is kept aside in Redis until the lease's end: spending it meanwhile keeps the
    limit; after that, callers get the shared state's error (a bound: 2 s, the lease's length,
    asked for before Redis stopped). Callers keep asking until a second past that bound and until
    one got the error, however slowly the machine lets them ask (LIVENESS: a bound, not a window)."""
    fast = Rate(1000, 1.0)
    limiter = SharedLimiter(state, SystemClock(), None, 0.5)
    for _ in range(RESERVE_AFTER):
        await limiter.acquire(KEY, fast, 1, 0.0)
    await until_leased(limiter)
    redis.stop()
    stopped = time.monotonic()
    last, outages = stopped, 0
    while time.monotonic() - stopped < 3.0 or not outages:  # a second past the longest the lease may last
        assert time.monotonic() - stopped < LIVENESS, "callers never got the shared state's error"
        started = time.monotonic()  # (a grant is decided after this: a bound a late grant crosses)
        try:
            await limiter.acquire(KEY, fast, 1, 0.0)
            last = started
        except (RateLimited, StateUnavailable) as exc:
            outages += isinstance(exc, StateUnavailable)
            await asyncio.sleep(0.002)
    assert last - stopped <= 2.0, f"granted from the lease {last - stopped:.2f} s after Redis stopped"


async def test_a_lease_nobody_uses_is_given_back_at_half_without_a_caller(redis: RedisPeer,
                                                                          state: RedisState) -> None:
    """Its callers went away (leased themselves, or stopped): the sidecar gives its lease back at
    half its length rather than leave the share aside in Redis until it ends (nothing in Redis
    removes a lapsed entry until the bucket is used again, so an entry gone is one given back)."""
    fast = Rate(1000, 1.0)
    limiter = SharedLimiter(state, SystemClock(), None, 0.5)
    for _ in range(RESERVE_AFTER):
        await limiter.acquire(KEY, fast, 1, 0.0)
    await until_leased(limiter)
    deadline = time.monotonic() + 10.0
    while await state.redis.hlen("mcpcreds:{svc:api}:leases") > 0:
        assert time.monotonic() < deadline, "the unused lease was not given back"
        await asyncio.sleep(0.05)
    assert limiter.reserves.held(KEY) is None
