"""The state behind the broker, memory (one sidecar) or Redis (several), as the same parts:
buckets, grants and login sharing. The broker does not know which it has."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from .buckets import Limiter, check_cost
from .clock import Clock
from .config import Config, Target
from .errors import InvalidRequest, RateLimited, StateUnavailable
from .grants import GrantStore, MemoryGrants, RedisGrants
from .logs import get_logger
from .oauth import Token, refresh_at, usable_until
from .rates import Rate
from .redis_state import RedisState
from .sources import SecretResolver

LOCK_LEASE_EXTRA: Final = 5.0
_log = get_logger("shared")


def _check_wait(max_wait: float) -> float:
    if isinstance(max_wait, bool) or not isinstance(max_wait, int | float) or not math.isfinite(max_wait) \
            or max_wait < 0:
        raise InvalidRequest("max_wait must be a finite number of seconds, at least 0")
    return float(max_wait)


class SharedLimiter:
    """Buckets kept in the shared state. Callers of this sidecar queue first come, first served
    on a local lock per key; the one at the head asks the shared bucket, and when refused waits
    exactly the time the script names before asking again (no tight polling)."""

    def __init__(self, state: RedisState, clock: Clock, degrade: Limiter | None, local_share: float) -> None:
        self.state = state
        self.clock = clock
        self.degrade = degrade  # on_state_loss = "local": a local bucket at a share of the rate
        self.local_share = local_share
        self._locks: dict[str, asyncio.Lock] = {}
        self._counts: dict[str, list[int]] = {}  # key -> [granted permits, refused requests]
        self._waiting: dict[str, int] = {}

    def try_acquire(self, key: str, rate: Rate, cost: int = 1) -> bool:
        return False  # every grant is a round trip to the shared state

    def _local_rate(self, rate: Rate) -> Rate:
        return Rate(max(1, int(rate.burst * self.local_share)), rate.per)

    async def acquire(self, key: str, rate: Rate, cost: int = 1, max_wait: float = 0.0) -> float:
        check_cost(cost, rate)
        max_wait = _check_wait(max_wait)
        start = self.clock.monotonic()
        deadline = start + max_wait
        counts = self._counts.setdefault(key, [0, 0])
        lock = self._locks.setdefault(key, asyncio.Lock())
        if not lock.locked():
            # nobody of ours is waiting: ask at once, concurrently with other such callers
            granted, wait = await self._take(key, rate, cost, deadline)
            if granted:
                counts[0] += cost
                return 0.0
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            try:
                async with asyncio.timeout(max(deadline - self.clock.monotonic(), 0.001)):
                    await lock.acquire()
            except TimeoutError:
                counts[1] += 1
                raise RateLimited(f"{key}: the queue ahead did not clear within max_wait",
                                  retry_after=max(max_wait, 0.001)) from None
            try:
                while True:
                    granted, wait = await self._take(key, rate, cost, deadline)
                    now = self.clock.monotonic()
                    if granted:
                        counts[0] += cost
                        return now - start
                    if now + wait > deadline + 1e-6:
                        counts[1] += 1
                        raise RateLimited(f"{key}: the permits asked for are not available within "
                                          "max_wait", retry_after=wait)
                    await asyncio.sleep(wait)
            finally:
                lock.release()
        finally:
            self._waiting[key] -= 1

    async def _take(self, key: str, rate: Rate, cost: int, deadline: float) -> tuple[bool, float]:
        """One try at the shared bucket (or, degraded, the local one)."""
        try:
            granted, wait, _, _ = await self.state.bucket(key, rate, cost, "take")
            return granted, wait
        except StateUnavailable:
            if self.degrade is None:
                raise
            local = self._local_rate(rate)
            if cost > local.burst:  # the local share could never grant it: wait for the shared bucket
                raise StateUnavailable(f"{key}: the shared state is unreachable and the cost is more "
                                       "than this sidecar's local share of the bucket") from None
            remaining = max(0.0, deadline - self.clock.monotonic())
            await self.degrade.acquire(key, local, cost, remaining)
            return True, 0.0

    async def apause(self, key: str, rate: Rate, seconds: float) -> float | None:
        _, _, _, paused = await self.state.bucket(key, rate, 1, "pause", seconds)
        return time.time() + paused if paused > 0 else None

    async def astatus(self, rates: dict[str, Rate]) -> list[dict[str, Any]]:
        rows = []
        for key, rate in sorted(rates.items()):
            _, _, level, paused = await self.state.bucket(key, rate, 1, "peek")
            granted, refused = self._counts.get(key, [0, 0])
            rows.append({"key": key, "level": round(level, 3), "capacity": rate.burst, "rate": str(rate),
                         "per_second": rate.per_second,
                         "waiting": self._waiting.get(key, 0), "granted": granted, "refused": refused,
                         "paused_until": time.time() + paused if paused > 0 else None,
                         "shared": True})
        return rows

    def reconfigure(self, rates: dict[str, Rate]) -> None:
        """Buckets live in the shared state; a changed rate applies at the next take."""

    def close(self) -> None:
        if self.degrade is not None:
            self.degrade.close()


class LocalLogins:
    """The memory state's side of login sharing: nothing to share, every fetch is local."""

    kind = "memory"

    def __init__(self, fetch: Callable[[Target], Awaitable[Token]]) -> None:
        self.fetch = fetch

    def start(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        """No other sidecar sends events."""

    def notify(self, key: str) -> None:
        """Nobody waits on another sidecar's login."""

    async def drop(self, key: str, fingerprint: str | None) -> bool:
        return False

    async def share(self, key: str, token: Token) -> None:
        """Nobody to share with."""

    async def aclose(self) -> None:
        """Nothing to close."""


class SharedLogins:
    """One login per cache key across sidecars: read the shared one if it is fresh, else take
    the lock and fetch; the others wait for the 'login' event and read it."""

    kind = "shared"

    def __init__(self, state: RedisState, fetch: Callable[[Target], Awaitable[Token]],
                 refresh_ahead: Callable[[], float], lease: float, degrade: bool) -> None:
        self.state = state
        self._fetch = fetch
        self._refresh_ahead = refresh_ahead
        self.lease = lease + LOCK_LEASE_EXTRA
        self.degrade = degrade
        self._events: dict[str, asyncio.Event] = {}

    def notify(self, key: str) -> None:
        event = self._events.get(key)
        if event is not None:
            event.set()

    async def fetch(self, target: Target) -> Token:
        try:
            return await self._shared_fetch(target)
        except StateUnavailable:
            if not self.degrade:
                raise
            _log.warning("shared state unreachable: fetching this login locally", extra={"key": target.key})
            return await self._fetch(target)

    def _fresh(self, token: Token | None, now: float) -> bool:
        if token is None:
            return False
        return now < min(usable_until(token), refresh_at(token, self._refresh_ahead(), 0))

    async def _shared_fetch(self, target: Target) -> Token:
        key = target.key
        deadline = time.monotonic() + self.lease
        delay = 0.02
        while True:
            remote = await self.state.get_login(key)
            if self._fresh(remote, time.time()):
                assert remote is not None
                return remote
            lock = await self.state.lock(key, self.lease)
            if lock is not None:
                try:
                    token = await self._fetch(target)
                    await self.state.put_login(key, token, usable_until(token) - time.time())
                    await self.state.publish("login", key, fingerprint=token.fingerprint)
                    return token
                finally:
                    await self.state.unlock(key, lock)
            if time.monotonic() > deadline:
                raise StateUnavailable(f"{key}: another sidecar holds the login lock and no login came")
            event = self._events.setdefault(key, asyncio.Event())
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), timeout=delay)
            except TimeoutError:
                delay = min(delay * 2, 0.5)

    async def share(self, key: str, token: Token) -> None:
        """Make a login fetched here (a rotation's trial) the shared one."""
        await self.state.put_login(key, token, usable_until(token) - time.time())
        await self.state.publish("login", key, fingerprint=token.fingerprint)

    def start(self, on_event: Callable[[dict[str, Any]], None]) -> None:
        self.state.listen(on_event)

    async def drop(self, key: str, fingerprint: str | None) -> bool:
        """Drop the shared login if it is still that one, and tell the other sidecars."""
        dropped = await self.state.drop_login(key, fingerprint)
        if dropped:
            await self.state.publish("invalidate", key, fingerprint=fingerprint)
        return dropped

    async def aclose(self) -> None:
        await self.state.aclose()


LoginSharing = LocalLogins | SharedLogins


@dataclass(frozen=True, slots=True)
class StateParts:
    """What the broker gets from its state, whichever it is."""

    limiter: Limiter | SharedLimiter
    grants: GrantStore
    logins: LoginSharing


def build_state(config: Config, resolver: SecretResolver, clock: Clock,
                fetch: Callable[[Target], Awaitable[Token]],
                refresh_ahead: Callable[[], float]) -> StateParts:
    """The memory state (one sidecar) or the Redis state (several), behind the same parts."""
    side = config.sidecar
    if side.state == "memory":
        return StateParts(Limiter(clock, config.rates), MemoryGrants(clock), LocalLogins(fetch))
    assert side.state_key is not None  # config validation requires it with a shared state
    state = RedisState(side.state, resolver.render(side.state_key),
                       resolver.render(side.state_password) if side.state_password else None,
                       ca_file=side.state_ca)
    degrade = side.on_state_loss == "local"
    return StateParts(
        SharedLimiter(state, clock, Limiter(clock) if degrade else None, side.local_share),
        RedisGrants(state, clock),
        SharedLogins(state, fetch, refresh_ahead, side.token_timeout, degrade),
    )
