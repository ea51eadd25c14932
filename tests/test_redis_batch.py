"""Batched takes on the shared bucket (one run of the bucket script for the callers of a key that
are waiting together), against a real redis-server on a private Unix socket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from mcpcreds import RateLimited
from mcpcreds.core.clock import SystemClock
from mcpcreds.core.rates import Rate
from mcpcreds.state.redis_state import RedisState
from mcpcreds.state.shared import SharedLimiter
from tests.peers.redis_peer import RedisPeer, start_redis
from tests.redis_sidecar import STATE_KEY
from tests.windows import overfull_windows

SLOW = Rate(10, 600.0)  # refills one permit a minute: nothing comes back during a test


@pytest.fixture(scope="module")
def server() -> Iterator[RedisPeer]:
    with start_redis() as r:
        yield r


@pytest.fixture
async def state(server: RedisPeer) -> AsyncIterator[RedisState]:
    s = RedisState(server.url, STATE_KEY)
    yield s
    await s.aclose()


async def evalsha_calls(server: RedisPeer) -> int:
    raw = aioredis.Redis(unix_socket_path=str(server.socket))
    try:
        stats = await raw.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    finally:
        await raw.aclose()


async def test_concurrent_takes_are_granted_exactly_what_the_bucket_holds(server: RedisPeer,
                                                                          state: RedisState) -> None:
    limiter = SharedLimiter(state, SystemClock(), None, 0.5)
    before = await evalsha_calls(server)
    answers = await asyncio.gather(*(limiter.acquire("batch-exact", SLOW, 1, 0.0) for _ in range(40)),
                                   return_exceptions=True)
    granted = [a for a in answers if not isinstance(a, BaseException)]
    refused = [a for a in answers if isinstance(a, RateLimited)]
    assert (len(granted), len(refused)) == (10, 30), answers
    assert all(0 < r.retry_after <= 600 for r in refused)
    assert await evalsha_calls(server) - before < 40  # callers waiting together shared a run
    # the bucket is empty for everyone: a caller of another limiter (another sidecar) is refused
    other = SharedLimiter(state, SystemClock(), None, 0.5)
    with pytest.raises(RateLimited):
        await other.acquire("batch-exact", SLOW, 1, 0.0)
    # with a cost of 3, three of ten permits' worth fit, whatever the batching
    answers = await asyncio.gather(*(limiter.acquire("batch-cost", SLOW, 3, 0.0) for _ in range(12)),
                                   return_exceptions=True)
    assert sum(1 for a in answers if not isinstance(a, BaseException)) == 3
    status = (await limiter.astatus({"batch-cost": SLOW}))[0]
    assert status["granted"] == 9 and status["refused"] == 9 and status["level"] == pytest.approx(1, abs=0.01)


async def test_one_run_serves_callers_in_order_and_stops_at_the_first_that_does_not_fit(
        state: RedisState) -> None:
    granted, wait, level, paused = await state.take_batch("batch-order", SLOW, [4, 4, 4, 1])
    assert granted == 2 and level == pytest.approx(2, abs=0.01) and paused == 0
    # the third needs 2 more permits at 1/60 s: its wait is named; the 1 behind it did not jump ahead
    assert wait == pytest.approx(120, abs=1)
    granted, _, level, _ = await state.take_batch("batch-order", SLOW, [1])
    assert granted == 1 and level == pytest.approx(1, abs=0.01)
    await state.bucket("batch-order", SLOW, 1, "pause", 30.0)
    granted, wait, _, paused = await state.take_batch("batch-order", SLOW, [1, 1])
    assert granted == 0 and wait == pytest.approx(30, abs=1) and paused == pytest.approx(30, abs=1)


async def test_queued_callers_are_served_in_order_as_the_bucket_refills_never_over_the_rate(
        state: RedisState) -> None:
    rate = Rate(5, 0.1)  # 50 a second
    limiter = SharedLimiter(state, SystemClock(), None, 0.5)
    order: list[int] = []
    grants: list[tuple[float, float]] = []

    async def caller(i: int) -> None:
        sent = time.monotonic()
        await limiter.acquire("batch-refill", rate, 1, 30.0)
        grants.append((sent, time.monotonic()))
        order.append(i)

    tasks = []
    for i in range(40):  # ten at once, then one every 2 ms: callers arrive while others are asked
        tasks.append(asyncio.create_task(caller(i)))  # for, refused and put back
        if i >= 10:
            await asyncio.sleep(0.002)
    await asyncio.gather(*tasks)
    assert order == list(range(40))  # first come, first served
    assert overfull_windows(grants, rate.burst, rate.per_second) == []


async def queued(limiter: SharedLimiter, key: str, count: int) -> None:
    """Until `count` callers of `limiter` wait in its queue for `key` (a bound: 20 s)."""
    deadline = time.monotonic() + 20.0
    while (limiter.snapshot(key) or {}).get("waiting") != count:
        assert time.monotonic() < deadline, f"never saw {count} queued: {limiter.snapshot(key)}"
        await asyncio.sleep(0.002)


async def test_a_caller_that_leaves_the_queue_gives_up_its_place(state: RedisState) -> None:
    """A permit every 3 s: the leaver queues for the next one (3 s after the drain), the stayer
    behind it for the one after (6 s). The leaver leaves; the stayer's max_wait ends 4.5 s after
    the drain, between the two: it is served only if the leaver's place went to it, however late
    it asked (its max_wait is counted from the drain). The queue is observed, not slept on."""
    rate = Rate(1, 3.0)
    limiter = SharedLimiter(state, SystemClock(), None, 0.5)
    drained = time.monotonic()  # at or before the drain: no permit comes before drained + 3
    await limiter.acquire("batch-leave", rate, 1, 0.0)  # the bucket is empty now
    leaver = asyncio.create_task(limiter.acquire("batch-leave", rate, 1, 30.0))
    await queued(limiter, "batch-leave", 1)
    asked = time.monotonic()  # at or before the stayer's own clock reading: its deadline >= drained + 4.5
    stayer = asyncio.create_task(limiter.acquire("batch-leave", rate, 1, drained + 4.5 - asked))
    await queued(limiter, "batch-leave", 2)
    leaver.cancel()
    left = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await leaver
    # (what the test needs of the machine: these few steps within the 3 s before the next permit)
    assert left < drained + 3.0, f"the leaver left {left - drained:.1f} s after the drain, past its permit"
    assert await stayer >= 0
    status = (await limiter.astatus({"batch-leave": rate}))[0]
    assert (status["granted"], status["waiting"]) == (2, 0)


async def test_a_script_the_server_lost_is_loaded_again(server: RedisPeer, state: RedisState) -> None:
    limiter = SharedLimiter(state, SystemClock(), None, 0.5)
    await limiter.acquire("batch-flush", SLOW, 1, 0.0)
    raw = aioredis.Redis(unix_socket_path=str(server.socket))
    try:
        await raw.script_flush()
    finally:
        await raw.aclose()
    await limiter.acquire("batch-flush", SLOW, 1, 0.0)
    assert (await limiter.astatus({"batch-flush": SLOW}))[0]["granted"] == 2


async def test_a_changed_rate_applies_at_the_next_take_of_a_key_taken_before(state: RedisState) -> None:
    """What a key's takes share is packed once per key and rate: a new rate for the key (a reload
    of the config) must reach the script, or the bucket would keep the old burst."""
    wide, narrow = Rate(20, 600.0), Rate(5, 600.0)
    granted, _, level, _ = await state.take_batch("batch-rate", wide, [1])
    assert granted == 1 and level == pytest.approx(19, abs=0.01)
    granted, _, level, _ = await state.take_batch("batch-rate", narrow, [1, 1])
    assert granted == 2 and level == pytest.approx(3, abs=0.01)  # held to the new burst of 5 first
    granted, _, level, _ = await state.take_batch("batch-rate", wide, [2])
    assert granted == 1 and level == pytest.approx(1, abs=0.01)
