"""A rotated refresh token whose write to the shared state fails is tried again for about 2 s
(refresh.py `keep_rotated`): the renewal holds the login lock meanwhile, so no other sidecar
redeems the spent token, and a blip of Redis loses nothing. On a fake sleep (the tries, exact),
then on a real redis-server stopped at the first try and started again while it waits."""

from __future__ import annotations

import asyncio

import pytest

from mcpcreds.broker.refresh import ROTATED_WRITE_RETRIES, keep_rotated
from mcpcreds.credentials.login_store import StoredLogin
from mcpcreds.errors import SecretUnavailable, StateUnavailable
from mcpcreds.state import login_share
from mcpcreds.state.redis_state import RedisState
from mcpcreds.state.shared import LOCK_LEASE_EXTRA
from tests.peers.redis_peer import RedisPeer
from tests.redis_sidecar import STATE_KEY

ROTATED = StoredLogin("rotated-refresh-token-0123456789", "client-a")


class Writes:
    """A store that fails its first `failures` writes with `error`."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error = failures, error
        self.calls = 0
        self.kept: list[StoredLogin] = []

    async def __call__(self, login: StoredLogin) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        self.kept.append(login)


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


async def test_an_unreachable_shared_state_is_tried_again_until_the_write_lands() -> None:
    writes, sleeps = Writes(2, StateUnavailable("shared state unreachable")), Sleeps()
    await keep_rotated(writes, ROTATED, sleeps)
    assert (writes.calls, writes.kept, sleeps.delays) == (3, [ROTATED], [0.3, 0.6])


async def test_a_shared_state_that_stays_away_fails_after_about_2_s_within_the_lock() -> None:
    writes, sleeps = Writes(10, StateUnavailable("shared state unreachable")), Sleeps()
    with pytest.raises(StateUnavailable):
        await keep_rotated(writes, ROTATED, sleeps)
    assert writes.calls == 4 and sleeps.delays == list(ROTATED_WRITE_RETRIES)
    # the login lock (the renewal's lease and LOCK_LEASE_EXTRA more) outlives every try
    assert sum(ROTATED_WRITE_RETRIES) < LOCK_LEASE_EXTRA


async def test_a_keyring_that_fails_is_not_tried_again_here() -> None:
    """(The next renewal writes the login kept in memory: tests/test_login_e2e.py.)"""
    writes, sleeps = Writes(1, SecretUnavailable("keyring locked")), Sleeps()
    with pytest.raises(SecretUnavailable):
        await keep_rotated(writes, ROTATED, sleeps)
    assert (writes.calls, sleeps.delays) == (1, [])


async def test_a_redis_back_while_the_write_waits_gets_the_rotated_login(redis: RedisPeer) -> None:
    state = RedisState(redis.url, STATE_KEY)
    sleeps: list[float] = []

    async def keep(login: StoredLogin) -> None:
        await login_share.write(state, "mcp:person", login_share.SharedLogin(login, ("seed",)))

    async def sleep(seconds: float) -> None:
        redis.start()  # Redis is back while the write waits
        sleeps.append(seconds)
        await asyncio.sleep(seconds)  # (past RedisState's fail-fast spell, as in the sidecar)

    try:
        await state.keys()  # the salt, from before the outage
        redis.stop()
        await keep_rotated(keep, ROTATED, sleep)
        shared = await login_share.read(state, "mcp:person")
        assert shared is not None and shared.login == ROTATED and sleeps == [0.3]
    finally:
        await state.aclose()
