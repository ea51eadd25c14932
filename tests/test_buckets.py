"""Token bucket arithmetic and the waiting limiter, on a fake clock: nothing here sleeps."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpcreds.core.clock import FakeClock, SystemClock
from mcpcreds.core.rates import Rate, parse_rate
from mcpcreds.errors import InvalidRequest, RateLimited
from mcpcreds.limits.buckets import Limiter, TokenBucket

T0 = 1000.0
PER_MINUTE = parse_rate("60/1m")  # 1 permit a second
KEY = "service:crm"


def drained(rate: Rate = PER_MINUTE, now: float = T0) -> TokenBucket:
    bucket = TokenBucket(rate, now)
    assert bucket.try_take(rate.burst, now) == 0.0
    return bucket


# --- the pure bucket ---------------------------------------------------------------------------


def test_starts_full_and_takes_cost() -> None:
    bucket = TokenBucket(PER_MINUTE, T0)
    assert bucket.level(T0) == 60.0
    assert bucket.capacity == 60
    assert bucket.try_take(3, T0) == 0.0
    assert bucket.level(T0) == 57.0


def test_refills_continuously_and_caps_at_burst() -> None:
    bucket = drained()
    assert bucket.level(T0 + 0.5) == 0.5
    assert bucket.level(T0 + 30) == 30.0
    assert bucket.level(T0 + 3600) == 60.0


def test_retry_after_is_exact_and_refusal_takes_nothing() -> None:
    bucket = drained()
    assert bucket.try_take(1, T0) == 1.0
    assert bucket.try_take(3, T0 + 0.5) == 2.5
    assert bucket.level(T0 + 0.5) == 0.5
    assert bucket.try_take(3, T0 + 3) == 0.0
    assert bucket.level(T0 + 3) == 0.0


@given(
    burst=st.integers(1, 1000),
    per=st.floats(0.001, 86400, allow_nan=False, allow_infinity=False),
    data=st.data(),
)
def test_a_grant_due_at_t_is_granted_at_t(burst: int, per: float, data: st.DataObject) -> None:
    rate = Rate(burst, per)
    cost = data.draw(st.integers(1, burst))
    now = T0 + data.draw(st.floats(0, 1e6, allow_nan=False, allow_infinity=False))
    bucket = drained(rate, now)
    wait = bucket.try_take(cost, now)
    assert wait > 0.0
    assert bucket.try_take(cost, now + wait) == 0.0


def test_pause_grants_nothing_before_its_end_but_the_level_refills() -> None:
    bucket = TokenBucket(PER_MINUTE, T0)
    bucket.pause_until(T0 + 10)
    assert bucket.paused_until == T0 + 10
    assert bucket.try_take(1, T0) == 10.0
    assert bucket.level(T0) == 60.0

    bucket = drained()
    bucket.pause_until(T0 + 0.5)
    assert bucket.try_take(1, T0) == 1.0  # the refill is the longer wait
    bucket.pause_until(T0 + 5)
    bucket.pause_until(T0 + 2)  # never shortens
    assert bucket.paused_until == T0 + 5
    assert bucket.try_take(3, T0) == 5.0  # refilled to 5 meanwhile
    assert bucket.try_take(5, T0 + 5) == 0.0


def test_set_rate_keeps_the_level_and_clamps_it_to_the_new_burst() -> None:
    bucket = TokenBucket(PER_MINUTE, T0)
    bucket.try_take(20, T0)
    bucket.set_rate(PER_MINUTE, T0 + 1)
    assert bucket.level(T0 + 1) == 41.0
    bucket.set_rate(Rate(100, 10), T0 + 1)
    assert bucket.level(T0 + 1) == 41.0
    assert bucket.level(T0 + 2) == 51.0  # 10 a second now
    bucket.set_rate(Rate(5, 1), T0 + 2)
    assert bucket.level(T0 + 2) == 5.0
    assert bucket.rate == Rate(5, 1)


@pytest.mark.parametrize("cost", [0, -1, 61, 1.5, True, "1"])
def test_a_cost_that_could_never_be_granted_is_an_invalid_request(cost: object) -> None:
    bucket = TokenBucket(PER_MINUTE, T0)
    with pytest.raises(InvalidRequest):
        bucket.try_take(cost, T0)  # type: ignore[arg-type]


# --- the limiter -------------------------------------------------------------------------------


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def limiter(clock: FakeClock) -> Limiter:
    return Limiter(clock, {KEY: PER_MINUTE})


async def drain(limiter: Limiter, rate: Rate = PER_MINUTE, key: str = KEY) -> None:
    assert await limiter.acquire(key, rate, rate.burst) == 0.0


async def test_grants_at_once_when_permits_are_there(limiter: Limiter) -> None:
    assert await limiter.acquire(KEY, PER_MINUTE, 5, max_wait=0) == 0.0
    assert await limiter.acquire("mcp:docs", Rate(5, 1)) == 0.0  # an unknown key gets a bucket
    snap = limiter.snapshot(KEY)
    assert snap is not None
    assert (snap["level"], snap["granted"]) == (55.0, 5)


async def test_first_come_first_served(limiter: Limiter, clock: FakeClock) -> None:
    await limiter.acquire(KEY, PER_MINUTE, 57)  # level 3
    big = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 5, max_wait=10))
    await settle()
    small = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 1, max_wait=10))
    await settle()
    assert not small.done()  # 3 permits are there, but the big request came first

    clock.advance(1.999)
    limiter.wake(KEY)
    await settle()
    assert not big.done()
    clock.advance(0.001)
    limiter.wake(KEY)
    await settle()
    assert big.result() == 2.0
    assert not small.done()
    clock.advance(1)
    limiter.wake(KEY)
    assert await small == 3.0


async def test_refuses_up_front_with_the_projected_wait(limiter: Limiter, clock: FakeClock) -> None:
    await drain(limiter)
    ahead = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 2, max_wait=5))
    await settle()
    with pytest.raises(RateLimited) as info:
        await limiter.acquire(KEY, PER_MINUTE, 3, max_wait=4.999)
    assert info.value.retry_after == 5.0  # 2 s for the one ahead, then 3 s
    behind = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 3, max_wait=5))
    await settle()
    clock.advance(5)
    limiter.wake(KEY)
    assert (await ahead, await behind) == (5.0, 5.0)
    snap = limiter.snapshot(KEY)
    assert snap is not None
    assert (snap["refused"], snap["granted"], snap["level"]) == (1, 65, 0.0)


async def test_max_wait_zero_never_waits(limiter: Limiter, clock: FakeClock) -> None:
    await limiter.acquire(KEY, PER_MINUTE, 59, max_wait=0)
    assert await limiter.acquire(KEY, PER_MINUTE, 1, max_wait=0) == 0.0
    with pytest.raises(RateLimited) as info:
        await limiter.acquire(KEY, PER_MINUTE, 1, max_wait=0)
    assert info.value.retry_after == 1.0
    clock.advance(1)
    assert await limiter.acquire(KEY, PER_MINUTE, 1, max_wait=0) == 0.0


async def test_bad_requests_are_invalid_not_refused(limiter: Limiter) -> None:
    for cost, max_wait in [(61, 5.0), (0, 5.0), (1, -1.0), (1, float("nan")), (1, float("inf"))]:
        with pytest.raises(InvalidRequest):
            await limiter.acquire(KEY, PER_MINUTE, cost, max_wait)
    snap = limiter.snapshot(KEY)
    assert snap is not None
    assert (snap["refused"], snap["granted"]) == (0, 0)


async def test_a_cancelled_waiter_gives_up_its_place(limiter: Limiter, clock: FakeClock) -> None:
    await drain(limiter)
    first = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 3, max_wait=10))
    await settle()
    second = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 1, max_wait=10))
    await settle()
    first.cancel()
    await settle()
    assert first.cancelled()
    assert limiter.snapshot(KEY)["waiting"] == 1  # type: ignore[index]
    clock.advance(1)
    limiter.wake(KEY)
    assert await second == 1.0
    snap = limiter.snapshot(KEY)
    assert snap is not None
    assert (snap["granted"], snap["level"], snap["waiting"]) == (61, 0.0, 0)


async def test_a_waiter_cancelled_as_it_is_granted_gives_the_permits_back(
    limiter: Limiter, clock: FakeClock
) -> None:
    await drain(limiter)
    waiter = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 2, max_wait=10))
    await settle()
    clock.advance(2)
    limiter.wake(KEY)  # grants: the task has not run yet
    waiter.cancel()
    await settle()
    assert waiter.cancelled()
    snap = limiter.snapshot(KEY)
    assert snap is not None
    # the permits are back in the bucket, and counted as returned: `granted` never goes down
    assert (snap["granted"], snap["returned"], snap["level"]) == (62, 2, 2.0)


async def test_the_counters_never_go_down_across_returns_and_reloads(
    limiter: Limiter, clock: FakeClock
) -> None:
    """They are Prometheus counters: a scrape that saw a higher value than the next one reads as
    a restart of the process, and rate() over it counts everything again."""
    def counts() -> tuple[int, int, int]:
        snap = limiter.snapshot(KEY)
        assert snap is not None
        return snap["granted"], snap["returned"], snap["refused"]

    await drain(limiter)
    with pytest.raises(RateLimited):
        await limiter.acquire(KEY, PER_MINUTE, 1)
    assert counts() == (60, 0, 1)
    waiter = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 2, max_wait=10))
    await settle()
    clock.advance(2)
    limiter.wake(KEY)  # granted, and the caller goes away before it runs
    waiter.cancel()
    await settle()
    assert counts() == (62, 2, 1)
    limiter.reconfigure({})  # a SIGHUP whose config has no rate for the key: its bucket goes
    assert limiter.snapshot(KEY) is None
    limiter.reconfigure({KEY: PER_MINUTE})  # and the next one brings it back, full
    assert counts() == (62, 2, 1)
    assert limiter.snapshot(KEY)["level"] == 60.0  # type: ignore[index]
    assert await limiter.acquire(KEY, PER_MINUTE, 5) == 0.0
    assert counts() == (67, 2, 1)


async def test_a_pause_delays_every_waiter(limiter: Limiter, clock: FakeClock) -> None:
    await drain(limiter)
    waiter = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 1, max_wait=10))
    await settle()
    assert limiter.pause(KEY, 5) == clock.time() + 5
    assert limiter.snapshot(KEY)["paused_until"] == clock.time() + 5  # type: ignore[index]
    clock.advance(1)
    limiter.wake(KEY)
    await settle()
    assert not waiter.done()
    clock.advance(4)
    limiter.wake(KEY)
    assert await waiter == 5.0
    snap = limiter.snapshot(KEY)
    assert snap is not None
    assert snap["paused_until"] is None
    assert snap["level"] == 4.0  # refilled during the pause, less the one granted


async def test_a_pause_refuses_waiters_it_pushes_past_their_max_wait(
    limiter: Limiter, clock: FakeClock
) -> None:
    await drain(limiter)
    short = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 1, max_wait=2))
    long = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 1, max_wait=10))
    await settle()
    limiter.pause(KEY, 5)
    with pytest.raises(RateLimited) as info:
        await short
    assert info.value.retry_after == 5.0
    clock.advance(5)
    limiter.wake(KEY)
    assert await long == 5.0
    assert limiter.snapshot(KEY)["refused"] == 1  # type: ignore[index]


async def test_a_crowd_is_served_in_order_within_each_max_wait(limiter: Limiter, clock: FakeClock) -> None:
    rng = random.Random(5)
    rate = Rate(10, 5)  # 2 a second
    await limiter.acquire(KEY, rate, 10)
    admitted: list[tuple[int, float, asyncio.Task[float]]] = []
    refused = 0
    done_order: list[int] = []

    async def step() -> None:
        clock.advance(0.125)
        limiter.wake(KEY)
        await settle()

    for i in range(200):
        max_wait = rng.choice([0.0, 1.0, 5.0, 30.0])
        task = asyncio.create_task(limiter.acquire(KEY, rate, rng.randint(1, 10), max_wait))

        def done(t: asyncio.Task[float], i: int = i) -> None:
            done_order.append(i)

        task.add_done_callback(done)
        await settle()
        if task.done() and task.exception() is not None:
            refused += 1
        else:
            admitted.append((i, max_wait, task))
        for _ in range(rng.choice([0, 0, 4, 32])):  # bursts, then lulls
            await step()
    while not all(t.done() for _, _, t in admitted):
        await step()
    for _, max_wait, task in admitted:
        assert task.result() <= max_wait + 0.125  # the clock moves in steps of 0.125
    admitted_ids = {j for j, _, _ in admitted}
    served = [i for i in done_order if i in admitted_ids]
    assert served == sorted(served)
    assert limiter.snapshot(KEY)["refused"] == refused > 0  # type: ignore[index]


async def test_pause_on_a_key_without_a_bucket(limiter: Limiter) -> None:
    assert limiter.pause("mcp:unlimited", 5) is None
    with pytest.raises(InvalidRequest):
        limiter.pause(KEY, -1)


async def test_snapshot_and_status(limiter: Limiter, clock: FakeClock) -> None:
    await limiter.acquire(KEY, PER_MINUTE, 60)
    with pytest.raises(RateLimited):
        await limiter.acquire(KEY, PER_MINUTE, 1)
    waiter = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 2, max_wait=30))
    await settle()
    limiter.pause(KEY, 10)
    clock.advance(0.5)
    expected = {
        "key": KEY, "level": 0.5, "capacity": 60, "rate": "60/1m", "per_second": 1.0, "waiting": 1,
        "granted": 60, "returned": 0, "refused": 1, "paused_until": clock.time() + 9.5,
    }
    assert limiter.snapshot(KEY) == expected
    await limiter.acquire("mcp:docs", Rate(5, 1))
    assert [s["key"] for s in limiter.status()] == ["mcp:docs", KEY]
    assert limiter.snapshot("mcp:nothing") is None
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_reconfigure_keeps_changes_and_drops(limiter: Limiter, clock: FakeClock) -> None:
    other = Rate(5, 1)
    await limiter.acquire(KEY, PER_MINUTE, 50)
    await limiter.acquire("mcp:docs", other, 5)
    limiter.reconfigure({KEY: PER_MINUTE, "mcp:docs": other})
    assert limiter.snapshot(KEY)["level"] == 10.0  # type: ignore[index]
    waiter = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 20, max_wait=60))
    await settle()
    limiter.reconfigure({KEY: Rate(120, 60), "mcp:docs": other})  # 2 a second, level kept
    snap = limiter.snapshot(KEY)
    assert snap is not None
    assert (snap["level"], snap["capacity"], snap["rate"]) == (10.0, 120, "120/1m")
    clock.advance(5)
    limiter.wake(KEY)
    assert await waiter == 5.0
    limiter.reconfigure({KEY: Rate(120, 60)})
    assert limiter.snapshot("mcp:docs") is None


async def test_lowering_the_burst_under_a_waiter_makes_its_cost_invalid(limiter: Limiter) -> None:
    await drain(limiter)
    big = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 30, max_wait=60))
    small = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 2, max_wait=60))
    await settle()
    limiter.reconfigure({KEY: Rate(10, 10)})
    with pytest.raises(InvalidRequest):
        await big
    assert limiter.snapshot(KEY)["waiting"] == 1  # type: ignore[index]
    small.cancel()
    with pytest.raises(asyncio.CancelledError):
        await small


async def test_dropping_a_key_releases_its_waiters(limiter: Limiter) -> None:
    await drain(limiter)
    waiter = asyncio.create_task(limiter.acquire(KEY, PER_MINUTE, 1, max_wait=10))
    await settle()
    limiter.reconfigure({})
    assert await waiter == 0.0


async def test_the_event_loop_timer_wakes_waiters_on_a_real_clock() -> None:
    rate = Rate(1, 0.02)  # one permit every 20 ms
    limiter = Limiter(SystemClock())
    await limiter.acquire(KEY, rate)
    waited = await asyncio.wait_for(limiter.acquire(KEY, rate, max_wait=1), timeout=5)
    assert 0.01 < waited < 1
    limiter.close()
