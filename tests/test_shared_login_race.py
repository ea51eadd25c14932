"""One login per key across sidecars on a real redis-server, whatever the interleaving: a sidecar
that found no fresh login, then took the lock after another sidecar had fetched, shared it and let
the lock go, uses that login; it does not fetch a second one (seen as two token requests for a
cold service across three sidecars under load)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from mcpcreds.credentials.tokens import Token
from mcpcreds.state.redis_state import RedisState
from mcpcreds.state.shared import SharedLogins
from tests.peers.redis_peer import RedisPeer
from tests.redis_sidecar import STATE_KEY


async def test_the_lock_taken_after_another_sidecar_shared_the_login_fetches_nothing(redis: RedisPeer) -> None:
    fetched: list[str] = []

    async def fetch(target: Any) -> Token:
        now = time.time()
        token = Token(f"token-{len(fetched)}", "Bearer", now, now + 3600, None, f"fp-{len(fetched)}")
        fetched.append(token.fingerprint)
        return token

    target: Any = SimpleNamespace(key=f"service:race-{time.monotonic_ns()}")
    first_state, late_state = RedisState(redis.url, STATE_KEY), RedisState(redis.url, STATE_KEY)
    first = SharedLogins(first_state, fetch, lambda: 60.0, 5.0, degrade=False)
    late = SharedLogins(late_state, fetch, lambda: 60.0, 5.0, degrade=False)
    read = late_state.get_login
    reads = 0

    async def read_then_let_the_other_finish(key: str) -> Any:
        nonlocal reads
        reads += 1
        found = await read(key)
        if reads == 1:  # nothing shared yet: meanwhile the first sidecar fetches, shares and unlocks
            assert found is None
            assert (await first.fetch(target)).fingerprint == "fp-0"
        return found

    late_state.get_login = read_then_let_the_other_finish  # type: ignore[method-assign]
    try:
        token = await late.fetch(target)
    finally:
        await first.aclose()
        await late.aclose()
    assert token.fingerprint == "fp-0" and fetched == ["fp-0"]
