"""The order of a bucket's queue (limits/buckets.py `Limiter`): a newcomer goes ahead of the waiters
of askers that had more permits lately, never past a waiter's max_wait; one asker alone is served
first come, first served. On a fake clock: nothing here sleeps."""

from __future__ import annotations

import asyncio
import json
import os
import random
import tomllib
from collections.abc import Awaitable
from typing import cast

import pytest

from mcpcreds.broker.broker import Broker
from mcpcreds.config.load import parse_config
from mcpcreds.core.audit import AuditLog
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.http import Request, Response
from mcpcreds.core.metrics import Metrics
from mcpcreds.core.rates import Rate, parse_rate
from mcpcreds.credentials.sources import EnvSource, SecretResolver
from mcpcreds.errors import RateLimited
from mcpcreds.limits.buckets import EPSILON, MAX_ASKERS, MAX_PASSED, Limiter, TokenBucket
from mcpcreds.sidecar.api import Api
from mcpcreds.state.grants import Grant
from tests.test_buckets import settle

KEY = "service:crm"
PER_SECOND = parse_rate("60/1m")  # 1 permit a second, a burst of 60
STEP = 0.125  # the fake clock moves in steps of this


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def limiter(clock: FakeClock) -> Limiter:
    return Limiter(clock, {KEY: PER_SECOND})


async def step(limiter: Limiter, clock: FakeClock, seconds: float = STEP) -> None:
    clock.advance(seconds)
    limiter.wake(KEY)
    await settle()


def asks(limiter: Limiter, asker: str, max_wait: float = 30.0, cost: int = 1) -> asyncio.Task[float]:
    return asyncio.create_task(limiter.acquire(KEY, PER_SECOND, cost, max_wait, asker))


async def test_a_light_asker_goes_ahead_of_a_heavy_ones_waiters(limiter: Limiter, clock: FakeClock) -> None:
    assert await limiter.acquire(KEY, PER_SECOND, 60, 0, "loops") == 0.0  # the burst, all to one asker
    loops = [asks(limiter, "loops") for _ in range(3)]
    await settle()
    opening = asks(limiter, "opening")
    await settle()
    await step(limiter, clock, 1.0)
    assert opening.done() and opening.result() == 1.0  # the first permit refilled
    assert not any(t.done() for t in loops)
    for waited in (2.0, 3.0, 4.0):  # then the loops, in their order, each a second later than planned
        await step(limiter, clock, 1.0)
        assert sum(t.done() for t in loops) == waited - 1
    assert [t.result() for t in loops] == [2.0, 3.0, 4.0]


async def test_a_newcomer_goes_ahead_only_of_waiters_that_keep_their_max_wait(
        limiter: Limiter, clock: FakeClock) -> None:
    assert await limiter.acquire(KEY, PER_SECOND, 60, 0, "loops") == 0.0
    tight = asks(limiter, "loops", max_wait=1.0)  # due in 1 s, promised 1 s: no slack
    roomy = asks(limiter, "loops", max_wait=3.0)  # due in 2 s, promised 3 s: 1 s of slack
    await settle()
    opening = asks(limiter, "opening")  # passes `roomy` (1 s later is still within 3 s), not `tight`
    await settle()
    await step(limiter, clock, 1.0)
    assert tight.done() and not opening.done() and not roomy.done()
    await step(limiter, clock, 1.0)
    assert opening.done() and not roomy.done()
    await step(limiter, clock, 1.0)
    assert roomy.result() == 3.0  # granted at its deadline, not after


async def test_one_asker_alone_is_served_exactly_first_come_first_served(
        limiter: Limiter, clock: FakeClock) -> None:
    """Grant times, refusals and retry_after as a plain first-come-first-served queue projects them."""
    rng = random.Random(7)
    rate = Rate(10, 5)  # 2 a second
    tail, tail_at = TokenBucket(rate, clock.monotonic()), clock.monotonic()  # the reference queue's end
    expected: list[tuple[asyncio.Task[float], float]] = []
    order: list[int] = []
    refusals = 0
    for i in range(300):
        now = clock.monotonic()
        cost, max_wait = rng.randint(1, 4), rng.choice([0.0, 0.5, 2.0, 10.0])
        sim, at = tail.copy(), max(now, tail_at)
        at += sim.wait_time(cost, at)
        task = asyncio.create_task(limiter.acquire(KEY, rate, cost, max_wait, "the one"))

        def granted(t: asyncio.Task[float], i: int = i) -> None:
            if t.exception() is None:
                order.append(i)
        task.add_done_callback(granted)
        await settle()
        if at - now > max_wait + EPSILON:
            exc = task.exception()
            assert isinstance(exc, RateLimited) and exc.retry_after == pytest.approx(at - now, abs=1e-9)
            refusals += 1
        else:
            sim.take(cost, at)
            tail, tail_at = sim, at
            # granted at the first step of the clock at or after its projected time
            steps = max(0, -int(-round((at - now) / STEP, 9) // 1))
            expected.append((task, steps * STEP))
        for _ in range(rng.choice([0, 0, 1, 8, 40])):
            await step(limiter, clock)
    while not all(t.done() for t, _ in expected):
        await step(limiter, clock)
    assert [t.result() for t, _ in expected] == pytest.approx([w for _, w in expected], abs=1e-9)
    assert order == sorted(order)
    assert refusals > 20 and len(expected) > 100


async def test_many_askers_never_over_the_bucket_never_past_a_max_wait(
        limiter: Limiter, clock: FakeClock) -> None:
    """Askers of different appetites: every grant within its max_wait, never more granted than the
    bucket allows in any interval, and a refusal's retry_after is exact: asking again at once with
    that max_wait is admitted (and served within it), asking with a little less is refused."""
    rng = random.Random(11)
    rate = Rate(10, 5)  # 2 a second, a burst of 10
    start = clock.monotonic()
    grants: list[tuple[float, int]] = []  # (when, cost)
    admitted: list[tuple[asyncio.Task[float], float, int]] = []
    arrivals: list[int] = []
    served: list[int] = []

    def ask(asker: str, cost: int, max_wait: float) -> asyncio.Task[float]:
        task = asyncio.create_task(limiter.acquire(KEY, rate, cost, max_wait, asker))
        arrivals.append(len(arrivals))
        index = arrivals[-1]

        def done(t: asyncio.Task[float]) -> None:
            if t.exception() is None:
                grants.append((clock.monotonic(), cost))
                served.append(index)
        task.add_done_callback(done)
        return task

    retried = 0
    for _ in range(400):
        asker = rng.choices(["loop-1", "loop-2", "loop-3", "opening"], [4, 4, 4, 1])[0]
        if asker == "opening":
            asker = f"opening-{rng.randint(1, 40)}"
        cost, max_wait = rng.randint(1, 3), rng.choice([0.0, 1.0, 3.0, 10.0, 30.0])
        task = ask(asker, cost, max_wait)
        await settle()
        if task.done() and isinstance(task.exception(), RateLimited):
            retry_after = task.exception().retry_after  # type: ignore[union-attr]
            if retry_after > 0.01:
                again = asyncio.create_task(limiter.acquire(KEY, rate, cost, retry_after - 0.01, asker))
                await settle()
                assert isinstance(again.exception(), RateLimited)
            task = ask(asker, cost, retry_after)
            await settle()
            assert not task.done() or task.exception() is None
            retried += 1
            max_wait = retry_after
        admitted.append((task, max_wait, cost))
        for _ in range(rng.choice([0, 0, 0, 1, 2, 8])):
            await step(limiter, clock)
    while not all(t.done() for t, _, _ in admitted):
        await step(limiter, clock)
    for task, max_wait, _ in admitted:
        assert task.result() <= max_wait + STEP  # granted at the first step at or after its due time
    grants.sort()
    for i, (since, _) in enumerate(grants):
        total = 0
        for until, cost in grants[i:]:
            total += cost
            assert total <= rate.burst + rate.per_second * (until - since) + 1e-6
    assert sum(c for _, c in grants) <= rate.burst + rate.per_second * (clock.monotonic() - start) + 1e-6
    assert served != sorted(served)  # someone went ahead
    assert retried > 10


async def test_the_askers_remembered_are_bounded(clock: FakeClock) -> None:
    rate = Rate(100_000, 1)
    limiter = Limiter(clock, {KEY: rate})
    for pid in range(3 * MAX_ASKERS):
        assert limiter.try_acquire(KEY, rate, 1, (1000, pid))
        clock.advance(0.001)
    assert len(limiter._lanes[KEY].uses) == MAX_ASKERS


CONFIG = """
[[servers]]
name = "mail"
endpoint = "https://mail.example.com/mcp"
headers = { "X-Api-Key" = "{{secret:KEY}}" }
rate = "10/1s"
"""


async def test_the_sidecar_asks_for_permits_as_the_calling_process(clock: FakeClock) -> None:
    """`/call` and `/acquire` pass who asks: a process's first call goes ahead of the calls of
    another process that took the whole burst (the peer's pid, as the socket gives it)."""
    config = parse_config(tomllib.loads(CONFIG))
    audit = AuditLog(None, clock)
    broker = Broker(config, SecretResolver([EnvSource({"KEY": "static-key-value"})]), clock, Metrics(), audit)
    api = Api(broker, Metrics(), audit)

    def ask(route: str, pid: int, cost: int = 1) -> asyncio.Future[Response]:
        body = json.dumps({"cost": cost, "max_wait": 10}).encode()
        answer = api.handle(Request("POST", f"/v1/servers/mail/{route}", "", body, None, os.getuid(), pid))
        if isinstance(answer, Response):
            return _done(answer)
        return asyncio.ensure_future(cast(Awaitable[Response], answer))

    try:
        assert (await ask("acquire", 100, 10)).status == 200  # the burst, to process 100
        loops = [ask(route, 100) for route in ("call", "acquire")]
        await settle()
        starting = ask("call", 200)
        await settle()
        clock.advance(0.1)
        assert isinstance(broker.limiter, Limiter)
        broker.limiter.wake()
        await settle()
        assert starting.done() and starting.result().status == 200
        assert not any(f.done() for f in loops)
    finally:
        await broker.aclose()


def _done(response: Response) -> asyncio.Future[Response]:
    future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
    future.set_result(response)
    return future


def test_who_asks_is_the_process_or_the_grant() -> None:
    def request(pid: int, grant: Grant | None = None) -> Request:
        return Request("POST", "/v1/servers/mail/call", "", b"", None, 1000, pid, grant=grant)

    assert request(42).asker == (1000, 42) != request(43).asker
    grant = Grant("g-1", ("mail",), 0.0)
    assert request(42, grant).asker == request(43, grant).asker == ("grant", "g-1")  # its holder's
    assert request(-1).asker == (1000, -1)  # TCP: no pid, one asker per uid


async def test_a_newcomer_passes_at_most_max_passed_waiters(limiter: Limiter, clock: FakeClock) -> None:
    assert await limiter.acquire(KEY, PER_SECOND, 60, 0, "loops") == 0.0
    loops = [asks(limiter, "loops", max_wait=3600.0) for _ in range(MAX_PASSED + 2)]
    await settle()
    opening = asks(limiter, "opening", max_wait=3600.0)
    await settle()
    await step(limiter, clock, 2.0)  # the two it could not pass
    assert sum(t.done() for t in loops) == 2 and not opening.done()
    await step(limiter, clock, 1.0)
    assert opening.done() and sum(t.done() for t in loops) == 2
    for task in loops:
        task.cancel()
    await settle()
