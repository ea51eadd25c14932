"""The state behind the broker, memory (one sidecar) or Redis (several), as the same parts:
buckets, grants and login sharing. The broker does not know which it has."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ..config.load import default_socket_path
from ..config.model import Config, Target
from ..core.clock import Clock
from ..core.logs import get_logger
from ..core.rates import Rate
from ..core.tasks import spawn
from ..credentials.sources import SecretResolver
from ..credentials.tokens import Token, refresh_at, usable_until
from ..errors import InvalidRequest, RateLimited, StateUnavailable
from ..limits.buckets import Limiter, check_cost
from .grants import GrantStore, MemoryGrants, RedisGrants
from .lease_asks import MAX_BATCH, LeaseAsk, LeaseReply
from .pins import MemoryPins, PinStore, RedisPins, pins_path
from .reserve import Reserves

if TYPE_CHECKING:  # imported by build_state for a Redis state only (redis, cryptography)
    from .redis_state import RedisState

LOCK_LEASE_EXTRA: Final = 5.0
_log = get_logger("shared")


def _check_wait(max_wait: float) -> float:
    if isinstance(max_wait, bool) or not isinstance(max_wait, int | float) or not math.isfinite(max_wait) \
            or max_wait < 0:
        raise InvalidRequest("max_wait must be a finite number of seconds, at least 0")
    return float(max_wait)


@dataclass(eq=False, slots=True)
class _Waiter:
    """A caller queued for permits of a shared bucket."""

    cost: int
    rate: Rate
    deadline: float  # clock.monotonic()
    max_wait: float
    future: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # the future's result: True granted, False ask the local bucket (degraded)
    sent: bool = False  # in the batch the script is running now: its answer decides
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False, slots=True)
class _Queue:
    """A key's callers of this sidecar: `pending` in arrival order; `busy` while a run of the
    bucket script for the key is under way or the queue waits (only one at a time, so the next
    batch forms); `blocked` while the head was refused and the queue waits for the bucket."""

    pending: deque[_Waiter] = field(default_factory=deque)
    busy: bool = False
    blocked: bool = False


class SharedLimiter:
    """Buckets kept in the shared state. Callers of a key queue first come, first served; one run
    of the bucket script serves every caller that is waiting when it is sent (a batch, so a burst
    of concurrent callers costs one round trip, not one each), and while it runs the next batch
    forms. When the head of the queue is refused, the queue waits exactly the time the script
    names before asking again (no tight polling); a caller whose max_wait would pass first is
    refused at once."""

    def __init__(self, state: RedisState, clock: Clock, degrade: Limiter | None, local_share: float) -> None:
        self.state = state
        self.clock = clock
        self.degrade = degrade  # on_state_loss = "local": a local bucket at a share of the rate
        self.local_share = local_share
        self._queues: dict[str, _Queue] = {}
        self._counts: dict[str, list[int]] = {}  # key -> [granted permits, refused requests]
        self._pumps: set[asyncio.Task[None]] = set()
        self.reserves = Reserves(clock, self.lease)  # this sidecar's own leases of busy keys
        self.on_told: Callable[[str, tuple[str, ...]], None] | None = None  # (key, lease ids)

    def try_acquire(self, key: str, rate: Rate, cost: int = 1, asker: Hashable = None) -> bool:
        """Permits from this sidecar's own lease of `key`, if it holds them (no round trip);
        else the caller goes on to `acquire`. `asker` is not read (see `acquire`)."""
        queue = self._queues.get(key)
        if not self.reserves.take(key, rate, cost, queue is not None and (queue.busy or bool(queue.pending)),
                                  count=False):
            return False
        self._counts_of(key)[0] += cost
        return True

    def _counts_of(self, key: str) -> list[int]:
        """[granted permits, refused requests] of `key` (a dict hit on the hot path)."""
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [0, 0]
        return counts

    def _local_rate(self, rate: Rate) -> Rate:
        return Rate(max(1, int(rate.burst * self.local_share)), rate.per)

    async def acquire(self, key: str, rate: Rate, cost: int = 1, max_wait: float = 0.0,
                      asker: Hashable = None) -> float:
        """`Limiter.acquire` on the shared bucket. `asker` is not read: the callers of a key queue
        here first come, first served (a batch per run of the bucket script, and the script serves
        the sidecars' batches as they come), not lightest user first as in `Limiter`."""
        check_cost(cost, rate)
        max_wait = _check_wait(max_wait)
        start = self.clock.monotonic()
        counts = self._counts_of(key)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _Queue()
        if self.reserves.take(key, rate, cost, queue.busy or bool(queue.pending)):
            counts[0] += cost
            return 0.0
        if queue.busy or queue.pending:
            waiter = _Waiter(cost, rate, start + max_wait, max_wait)
            queue.pending.append(waiter)  # behind the callers of ours already asking
            if queue.blocked:  # a caller ahead was refused: max_wait runs out while it waits
                self._arm(key, queue, waiter)
            self._resume(key, queue, 0.0)
        else:
            # nobody of ours is asking: ask at once, in this task (the common case: one round trip)
            queue.busy = True
            try:
                granted, wait, _, _ = await self.state.take_batch(key, rate, (cost,))
            except StateUnavailable:
                queue.busy = False
                self._resume(key, queue, 0.0)
                if self.degrade is None:
                    raise
                await self._degraded(key, rate, cost, start + max_wait)
                counts[0] += cost
                return self.clock.monotonic() - start
            except BaseException:
                queue.busy = False
                self._resume(key, queue, 0.0)
                raise
            queue.busy = False
            if granted or wait > max_wait + 1e-6:
                self._resume(key, queue, 0.0)
                if granted:
                    counts[0] += cost
                    return 0.0
                counts[1] += 1
                raise RateLimited(f"{key}: the permits asked for are not available within max_wait",
                                  retry_after=wait)
            waiter = _Waiter(cost, rate, start + max_wait, max_wait)
            queue.pending.appendleft(waiter)  # refused for now: first in the queue, which waits
            self._arm(key, queue, waiter)
            self._resume(key, queue, min(wait, self.reserves.wait(key, cost)))
        try:
            local = not await waiter.future
        except RateLimited:
            counts[1] += 1
            raise
        except asyncio.CancelledError:  # the caller left: its place goes to the next
            self._leave(queue, waiter)
            raise
        if local:
            await self._degraded(key, rate, cost, waiter.deadline)
        counts[0] += cost
        return self.clock.monotonic() - start

    def _arm(self, key: str, queue: _Queue, waiter: _Waiter) -> None:
        """Refuse the caller when its max_wait passes while it is queued."""
        if waiter.timer is not None:
            waiter.timer.cancel()
        waiter.timer = asyncio.get_running_loop().call_later(
            max(waiter.deadline - self.clock.monotonic(), 0.001), self._expire, key, queue, waiter)

    def _resume(self, key: str, queue: _Queue, delay: float) -> None:
        """Serve the queue in a task of its own, if it has callers and nobody serves it."""
        if queue.pending and not queue.busy:
            queue.busy = True
            spawn(self._pumps, self._pump(key, queue, delay))

    def _expire(self, key: str, queue: _Queue, waiter: _Waiter) -> None:
        """max_wait passed while the caller was still queued (not in a batch under way)."""
        if waiter.sent or waiter.future.done():
            return
        self._leave(queue, waiter)
        waiter.future.set_exception(RateLimited(f"{key}: the queue ahead did not clear within max_wait",
                                                retry_after=max(waiter.max_wait, 0.001)))

    @staticmethod
    def _leave(queue: _Queue, waiter: _Waiter) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
        if not waiter.sent:
            with contextlib.suppress(ValueError):
                queue.pending.remove(waiter)

    async def _pump(self, key: str, queue: _Queue, delay: float) -> None:
        """Serve the key's queue in batches (after `delay`, the wait the script named) until it is
        empty. Only one runs per key (`queue.busy`)."""
        batch: list[_Waiter] = []
        try:
            if delay > 0:
                queue.blocked = True
                await asyncio.sleep(delay)
            while queue.pending:
                queue.blocked = False
                self._serve_from_reserve(key, queue)
                if not queue.pending:
                    break
                batch = [queue.pending.popleft() for _ in range(min(len(queue.pending), MAX_BATCH))]
                for waiter in batch:
                    waiter.sent = True
                rate = batch[-1].rate  # the newest caller's: a changed rate applies at once
                try:
                    costs = [w.cost for w in batch]
                    granted, _, level, paused = await self.state.take_batch(key, rate, costs)
                except StateUnavailable as exc:
                    for waiter in batch:  # degraded: each asks the local bucket itself
                        self._settle(waiter, False if self.degrade is not None else exc)
                    batch = []
                    continue
                for waiter in batch[:granted]:
                    self._settle(waiter, True)
                refused, batch = batch[granted:], []
                head_wait = self._requeue(key, queue, refused, level, paused)
                if head_wait > 0 and queue.pending:  # the sidecar's own lease may refill sooner
                    head_wait = min(head_wait, self.reserves.wait(key, queue.pending[0].cost))
                if head_wait > 0:
                    queue.blocked = True
                    await asyncio.sleep(head_wait)
        except BaseException as exc:  # cancelled (the sidecar stops), or a bug: nobody is left waiting
            for waiter in [*batch, *queue.pending]:
                self._leave(queue, waiter)
                self._settle(waiter, StateUnavailable(f"{key}: the permits could not be asked for"))
            if not isinstance(exc, Exception):
                raise
            _log.exception("shared bucket queue failed", extra={"key": key})
        finally:
            queue.busy = queue.blocked = False

    def _serve_from_reserve(self, key: str, queue: _Queue) -> None:
        """Settle the callers at the head of the queue that this sidecar's own lease has permits for."""
        while queue.pending and self.reserves.take(key, queue.pending[0].rate, queue.pending[0].cost):
            waiter = queue.pending.popleft()
            waiter.sent = True
            self._settle(waiter, True)

    def _requeue(self, key: str, queue: _Queue, refused: list[_Waiter], level: float, paused: float) -> float:
        """Put the refused callers back at the head, in order, refusing at once each one whose
        permits (after those of the callers kept ahead of it) cannot come within its max_wait, and
        arm the max_wait of every caller queued. Returns the wait of the new head."""
        now = self.clock.monotonic()
        ahead = 0
        kept: list[_Waiter] = []
        for waiter in refused:
            wait = max(paused, (ahead + waiter.cost - level) / waiter.rate.per_second, 0.0)
            if now + wait > waiter.deadline + 1e-6:
                self._settle(waiter, RateLimited(
                    f"{key}: the permits asked for are not available within max_wait", retry_after=wait))
            else:
                ahead += waiter.cost
                waiter.sent = False
                self._arm(key, queue, waiter)
                kept.append(waiter)
        queue.pending.extendleft(reversed(kept))
        if not kept:
            return 0.0
        for waiter in queue.pending:
            if waiter.timer is None or waiter.timer.cancelled():
                self._arm(key, queue, waiter)
        return max(paused, (kept[0].cost - level) / kept[0].rate.per_second, 0.0)

    @staticmethod
    def _settle(waiter: _Waiter, outcome: bool | BaseException) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
        if waiter.future.done():
            return
        if isinstance(outcome, BaseException):
            waiter.future.set_exception(outcome)
        else:
            waiter.future.set_result(outcome)

    async def _degraded(self, key: str, rate: Rate, cost: int, deadline: float) -> None:
        """The shared state is unreachable: the local bucket at its share of the rate, if configured."""
        if self.degrade is None:
            raise StateUnavailable(f"{key}: the shared state is unreachable")
        local = self._local_rate(rate)
        if cost > local.burst:  # the local share could never grant it: wait for the shared bucket
            raise StateUnavailable(f"{key}: the shared state is unreachable and the cost is more "
                                   "than this sidecar's local share of the bucket")
        remaining = max(0.0, deadline - self.clock.monotonic())
        await self.degrade.acquire(key, local, cost, remaining)

    def snapshot(self, key: str) -> dict[str, Any] | None:
        """What a lease grant reads of this sidecar's callers of `key` (leases.py): the permits
        granted to them and how many wait (the level and a pause are in the shared state)."""
        counts = self._counts.get(key)
        queue = self._queues.get(key)
        return {"granted": counts[0] if counts else 0, "waiting": len(queue.pending) if queue else 0,
                "paused_until": None}

    async def lease(self, key: str, rate: Rate, ask: LeaseAsk) -> LeaseReply:
        """A holder's lease of the shared bucket, or its release (bucket_scripts.py); the holders
        the answer says to tell to renew now go to `on_told`."""
        reply = await self.state.lease(key, rate, ask)
        if reply.told and self.on_told is not None:
            self.on_told(key, reply.told)
        return reply

    async def apause(self, key: str, rate: Rate, seconds: float) -> float | None:
        self.reserves.drop(key)
        _, _, _, paused = await self.state.bucket(key, rate, 1, "pause", seconds)
        return time.time() + paused if paused > 0 else None

    async def astatus(self, rates: dict[str, Rate]) -> list[dict[str, Any]]:
        rows = []
        for key, rate in sorted(rates.items()):
            _, _, level, paused = await self.state.bucket(key, rate, 1, "peek")
            granted, refused = self._counts.get(key, [0, 0])
            rows.append({"key": key, "level": round(level, 3), "capacity": rate.burst, "rate": str(rate),
                         "per_second": rate.per_second,
                         "waiting": len(queue.pending) if (queue := self._queues.get(key)) else 0,
                         "granted": granted, "refused": refused,
                         "paused_until": time.time() + paused if paused > 0 else None,
                         "shared": True, "own_lease": _own_lease(self.reserves.held(key))})
        return rows

    def reconfigure(self, rates: dict[str, Rate]) -> None:
        """Buckets live in the shared state; a changed rate applies at the next take, and a lease
        of this sidecar's on the old rate is given back now."""
        self.reserves.reconfigure(rates)

    def close(self) -> None:
        if self.degrade is not None:
            self.degrade.close()

    async def aclose(self) -> None:
        """Give this sidecar's own leases back before the state closes."""
        await self.reserves.aclose()


def _own_lease(held: tuple[float, int] | None) -> dict[str, Any] | None:
    return {"share": round(held[0], 3), "burst": held[1]} if held is not None else None


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

    async def _shared_if_fresh(self, key: str) -> Token | None:
        remote = await self.state.get_login(key)
        return remote if self._fresh(remote, time.time()) else None

    async def _shared_fetch(self, target: Target) -> Token:
        key = target.key
        deadline = time.monotonic() + self.lease
        delay = 0.02
        while True:
            remote = await self._shared_if_fresh(key)
            if remote is not None:
                return remote
            lock = await self.state.lock(key, self.lease)
            if lock is not None:
                try:
                    # read again under the lock: another sidecar may have fetched, shared and let
                    # the lock go since the read above
                    remote = await self._shared_if_fresh(key)
                    if remote is not None:
                        return remote
                    token = await self._fetch(target)
                    await self.share(key, token)
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
    pins: PinStore  # tool pins (protocol/pins.py): memory's in a file of the state folder


def build_state(config: Config, resolver: SecretResolver, clock: Clock,
                fetch: Callable[[Target], Awaitable[Token]],
                refresh_ahead: Callable[[], float]) -> StateParts:
    """The memory state (one sidecar) or the Redis state (several), behind the same parts."""
    side = config.sidecar
    if side.state == "memory":
        return StateParts(Limiter(clock, config.rates), MemoryGrants(clock), LocalLogins(fetch),
                          MemoryPins(pins_path(default_socket_path(side.socket).parent)))
    assert side.state_key is not None  # config validation requires it with a shared state
    from .redis_state import RedisState

    state = RedisState(side.state, resolver.render(side.state_key),
                       resolver.render(side.state_password) if side.state_password else None,
                       ca_file=side.state_ca)
    degrade = side.on_state_loss == "local"
    return StateParts(
        SharedLimiter(state, clock, Limiter(clock) if degrade else None, side.local_share),
        RedisGrants(state, clock),
        SharedLogins(state, fetch, refresh_ahead, side.token_timeout, degrade),
        RedisPins(state),
    )
