"""The login cache on a fake clock: single flight, refresh ahead, stale-if-error, backoff."""

from __future__ import annotations

import asyncio
import random
import tomllib
from collections.abc import Iterator

import pytest

from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Target
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.secret import fingerprint
from mcpcreds.credentials.logins import LoginCache
from mcpcreds.credentials.tokens import Token
from mcpcreds.errors import TokenEndpointError

TARGET: Target = parse_config(tomllib.loads("""
[[servers]]
name = "crm"
endpoint = "https://crm.example.com/mcp"
oauth = { client_id = "c", client_secret = "{{secret:S}}", token_url = "https://a.example/token" }
""")).servers["crm"]


class FakeIdp:
    def __init__(self, clock: FakeClock, lifetime: float = 100.0) -> None:
        self.clock = clock
        self.lifetime = lifetime
        self.calls = 0
        self.fail: TokenEndpointError | None = None
        self.gate: asyncio.Event | None = None

    async def fetch(self, target: Target) -> Token:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        value = f"token-{self.calls}"
        now = self.clock.time()
        return Token(value, "Bearer", now, now + self.lifetime, None, fingerprint(value))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def idp(clock: FakeClock) -> FakeIdp:
    return FakeIdp(clock)


@pytest.fixture
def cache(idp: FakeIdp, clock: FakeClock) -> Iterator[LoginCache]:
    c = LoginCache(idp.fetch, clock, refresh_ahead=20, rng=random.Random(0))
    yield c
    c.close()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_single_flight_for_many_concurrent_cold_requests(cache: LoginCache, idp: FakeIdp) -> None:
    idp.gate = asyncio.Event()
    waiters = [asyncio.create_task(cache.get(TARGET)) for _ in range(200)]
    await settle()
    idp.gate.set()
    tokens = await asyncio.gather(*waiters)
    assert idp.calls == 1
    assert {t.access_token for t in tokens} == {"token-1"}
    assert cache.status()[0]["shared_fetches"] == 199


async def test_refresh_ahead_in_the_background_while_serving_the_current_login(
        cache: LoginCache, idp: FakeIdp, clock: FakeClock) -> None:
    first = await cache.get(TARGET)
    clock.advance(70)  # before refresh_at (>= 78 with jitter): no renewal
    assert (await cache.get(TARGET)) is first and idp.calls == 1
    assert cache.current(TARGET.key) is first
    clock.advance(10)  # past refresh_at (80 minus up to 10% jitter of 20 s)
    assert cache.current(TARGET.key) is None  # the hot path steps aside
    assert (await cache.get(TARGET)) is first  # still valid: served without waiting
    await settle()
    assert idp.calls == 2
    renewed = await cache.get(TARGET)
    assert renewed.access_token == "token-2"
    assert cache.status()[0]["renewals"] == 1


async def test_stale_if_error_then_failing_with_backoff(cache: LoginCache, idp: FakeIdp,
                                                         clock: FakeClock) -> None:
    first = await cache.get(TARGET)
    idp.fail = TokenEndpointError("down", "temporarily_unavailable")
    clock.advance(85)
    assert (await cache.get(TARGET)) is first
    await settle()
    assert idp.calls == 2
    row = cache.status()[0]
    assert row["state"] == "stale" and row["last_error"] == "temporarily_unavailable"
    # backing off: more requests do not start more fetches
    for _ in range(10):
        assert (await cache.get(TARGET)) is first
    await settle()
    assert idp.calls == 2
    clock.advance(15)  # past expiry and the first backoff: one more try, which fails
    with pytest.raises(TokenEndpointError):
        await cache.get(TARGET)
    assert idp.calls == 3
    for _ in range(10):  # backing off: answered with the last error, the IdP left alone
        with pytest.raises(TokenEndpointError):
            await cache.get(TARGET)
    assert idp.calls == 3
    assert cache.status()[0]["state"] == "failing"
    clock.advance(60)  # past any backoff
    idp.fail = None
    assert (await cache.get(TARGET)).access_token == "token-4"
    assert cache.status()[0]["state"] == "valid"


async def test_failures_back_off_exponentially_up_to_the_cap(cache: LoginCache, idp: FakeIdp,
                                                             clock: FakeClock) -> None:
    """After failure k the next try waits uniform(c/2, c) with c = min(60, 2**(k-1)) (jittered,
    drawn from the cache's seeded rng): no try a moment before that, one try right at it."""
    idp.fail = TokenEndpointError("bad", "invalid_client")
    draws = random.Random(0)  # the same seed as the cache's rng, drawn by hand
    delays = []
    for failures in range(1, 10):
        ceiling = min(60.0, 2.0 ** (failures - 1))
        delays.append(ceiling / 2 + ceiling / 2 * draws.random())
    with pytest.raises(TokenEndpointError):
        await cache.get(TARGET)
    assert idp.calls == 1
    for attempt, delay in enumerate(delays, start=2):
        clock.advance(delay - 0.001)
        for _ in range(3):  # still backing off: answered with the last error, the IdP left alone
            with pytest.raises(TokenEndpointError):
                await cache.get(TARGET)
        assert idp.calls == attempt - 1
        clock.advance(0.002)
        with pytest.raises(TokenEndpointError):
            await cache.get(TARGET)
        assert idp.calls == attempt


async def test_invalidate_only_the_token_the_caller_was_refused_with(cache: LoginCache,
                                                                      idp: FakeIdp) -> None:
    first = await cache.get(TARGET)
    assert not cache.invalidate(TARGET.key, "ffffffff")
    assert cache.invalidate(TARGET.key, first.fingerprint)
    # fifty more clients refused with the same token: no more drops
    assert not any(cache.invalidate(TARGET.key, first.fingerprint) for _ in range(50))
    second = await cache.get(TARGET)
    assert second.access_token == "token-2" and idp.calls == 2
    assert not cache.invalidate(TARGET.key, first.fingerprint)


async def test_no_expired_token_is_ever_handed_out(cache: LoginCache, idp: FakeIdp,
                                                    clock: FakeClock) -> None:
    idp.lifetime = 10
    for _ in range(400):
        token = await cache.get(TARGET)
        assert token.expires_at > clock.time()
        await settle()
        clock.advance(0.25)
    assert idp.calls <= 400 * 0.25 / 5 + 1  # renewed at half-life, not per request


async def test_renew_forces_a_fetch(cache: LoginCache, idp: FakeIdp) -> None:
    await cache.get(TARGET)
    renewed = await cache.renew(TARGET)
    assert renewed.access_token == "token-2" and (await cache.get(TARGET)) is renewed


async def test_a_fetch_that_outlives_a_reload_is_not_kept(cache: LoginCache, idp: FakeIdp) -> None:
    idp.gate = asyncio.Event()
    waiter = asyncio.create_task(cache.get(TARGET))
    await settle()
    cache.forget({TARGET.key})  # the config changed how this login is obtained
    idp.gate.set()
    assert (await waiter).access_token == "token-1"  # its caller still gets an answer
    assert cache.peek(TARGET.key) is None  # but the new config's callers do not reuse it
    assert (await cache.get(TARGET)).access_token == "token-2"
