"""A sidecar's own lease of a busy key's bucket in the shared state, for its callers without a
lease.

A key this sidecar grants often (`RESERVE_AFTER` calls within `RESERVE_WINDOW`) gets a lease
held by the sidecar itself, as a library client holds one, where it pays: when its share would be
at least `RESERVE_LEAST` permits a second (the lease script answers "not now" otherwise, and the
key is asked again `RETRY_NOT_WORTH` later); under that, a round trip to Redis per grant costs
little, and a lease would cost the other sidecars' callers its part of the burst. Held, the
bucket in Redis keeps its share and burst aside (bucket_scripts.py), so the limit holds exactly
across every sidecar, and a permit it holds is a local take instead of a round trip to Redis. It
is renewed in the background at half its length, asking for twice what was used (all of the rate
at first; at once, for twice what it asked before, when a caller finds it empty); one not used
since its last renewal is given back, and all of them when the sidecar stops; one whose
sidecar died lapses after `RESERVE_SECONDS` at most. A pause drops it at once. While Redis is
unreachable it is spent until its end, like a client's, and not renewed: after that, callers get
the shared state's error again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

from ..core.clock import Clock
from ..core.logs import get_logger
from ..core.rates import MAX_SECONDS, Rate
from ..core.tasks import spawn
from ..errors import McpcredsError
from ..limits.buckets import TokenBucket
from ..limits.leases import lease_seconds
from .lease_asks import LeaseAsk, LeaseReply

RESERVE_AFTER: Final = 16  # calls of a key within RESERVE_WINDOW before the sidecar leases for them
RESERVE_WINDOW: Final = 1.0
DEMAND_HEADROOM: Final = 2.0
RETRY_AFTER_FAILURE: Final = 1.0
# at most this long (renewed at half): a sidecar that dies holding its lease keeps its share aside
# in Redis no longer than this, whatever the rate's period
RESERVE_SECONDS: Final = 2.0
SHARE_MARGIN: Final = 1e-9  # the local bucket refills a hair slower than granted (float rounding)
RESERVE_LEAST: Final = 100.0  # permits per second: a smaller share is not worth holding
RETRY_NOT_WORTH: Final = 10.0  # seconds before a key whose share was not worth holding is asked again
_log = get_logger("reserve")

LeaseCall = Callable[[str, Rate, LeaseAsk], Awaitable[LeaseReply]]


@dataclass(eq=False, slots=True)
class _Reserve:
    lease: str
    rate: Rate
    since: float  # monotonic: the start of the use measured for the next demand
    bucket: TokenBucket | None = None
    terms: tuple[float, int] | None = None  # (share per period, burst) last granted
    until: float = 0.0  # monotonic: its end, counted from when the request was sent
    renew_at: float = 0.0
    used: int = 0
    renewing: bool = False
    asked: float = 0.0  # the demand of the last lease asked for (permits per period)
    again: bool = False  # told to renew while a renewal was under way: once more after it
    short: bool = False  # a caller found it empty since: the next lease asks for twice as much


class Reserves:
    """The sidecar's own leases, per key (see the module's docstring)."""

    def __init__(self, clock: Clock, lease: LeaseCall) -> None:
        self.clock = clock
        self._lease = lease
        self._reserves: dict[str, _Reserve] = {}
        self._calls: dict[str, tuple[float, int]] = {}  # key -> (window start, calls in it)
        self._tasks: set[asyncio.Task[None]] = set()

    def take(self, key: str, rate: Rate, cost: int, queued: bool = False, count: bool = True) -> bool:
        """Take `cost` permits from this sidecar's lease of `key` if it holds them now (the hot
        path; not while `queued`: callers are waiting for the key, and nobody jumps the queue);
        `count`s the call towards a lease where there is none."""
        now = self.clock.monotonic()
        reserve = self._reserves.get(key)
        if reserve is None:
            if count:
                self._count(key, rate, now)
            return False
        if queued:
            return False
        if reserve.rate != rate:  # the rate changed on a reload: a lease on the new one
            self.drop(key)
            return False
        if now >= reserve.renew_at and not reserve.renewing:
            self._renew(key, reserve, due=True)
        bucket = reserve.bucket
        if bucket is None or now >= reserve.until or cost > bucket.capacity:
            return False
        if bucket.try_take(cost, now) > 0.0:
            reserve.short = True  # what it asked for held callers back: ask for more, now
            if reserve.asked < rate.burst and not reserve.renewing:
                self._renew(key, reserve, due=False)
            return False
        reserve.used += cost
        return True

    def wait(self, key: str, cost: int) -> float:
        """Seconds until this sidecar's lease of `key` holds `cost` permits (inf: it never will)."""
        reserve = self._reserves.get(key)
        if reserve is None or reserve.bucket is None or cost > reserve.bucket.capacity:
            return math.inf
        now = self.clock.monotonic()
        wait = reserve.bucket.wait_time(cost, now)
        return wait if now + wait < reserve.until else math.inf

    def held(self, key: str) -> tuple[float, int] | None:
        """The share and burst this sidecar leases for its callers of `key` (for the status)."""
        reserve = self._reserves.get(key)
        if reserve is None or reserve.bucket is None or self.clock.monotonic() >= reserve.until:
            return None
        return reserve.terms

    def nudge(self, lease: str) -> bool:
        """The shared state says: renew the lease `lease` now (if it is one of ours)."""
        for key, reserve in self._reserves.items():
            if reserve.lease == lease:
                if reserve.renewing:
                    reserve.again = True
                else:
                    self._renew(key, reserve, due=False)
                return True
        return False

    def reconfigure(self, rates: Mapping[str, Rate]) -> None:
        """A reload: the leases on a rate that changed or went away are given back."""
        for key, reserve in list(self._reserves.items()):
            if rates.get(key) != reserve.rate:
                self.drop(key)

    def drop(self, key: str) -> None:
        """Stop spending the lease of `key` now (a pause, a new rate) and give it back."""
        reserve = self._reserves.pop(key, None)
        if reserve is not None and reserve.terms is not None:
            spawn(self._tasks, self._release(key, reserve))

    async def aclose(self) -> None:
        """Give every lease back (the sidecar stops), so the others need not wait for their end."""
        held, self._reserves = self._reserves, {}
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for key, reserve in held.items():  # a first lease cancelled may have been granted already
            await self._release(key, reserve)

    def _count(self, key: str, rate: Rate, now: float) -> None:
        start, calls = self._calls.get(key, (now, 0))
        if now - start > RESERVE_WINDOW:
            start, calls = now, 0
        if calls + 1 < RESERVE_AFTER:
            self._calls[key] = (start, calls + 1)
            return
        self._calls.pop(key, None)
        reserve = self._reserves[key] = _Reserve(secrets.token_urlsafe(12), rate, now)
        self._renew(key, reserve, due=False)

    def _due(self, key: str, reserve: _Reserve) -> None:
        if self._reserves.get(key) is reserve and not reserve.renewing \
                and self.clock.monotonic() >= reserve.renew_at:
            self._renew(key, reserve, due=True)

    def _renew(self, key: str, reserve: _Reserve, due: bool) -> None:
        """Renew now; `due`: at half the lease (not told to, nor found empty), when one not used
        since its last renewal is given back instead."""
        reserve.renewing = True
        spawn(self._tasks, self._obtain(key, reserve, due))

    async def _release(self, key: str, reserve: _Reserve) -> None:
        with contextlib.suppress(McpcredsError):  # the shared state is away: it lapses there instead
            await self._lease(key, reserve.rate, LeaseAsk.release_of(reserve.lease))

    async def _obtain(self, key: str, reserve: _Reserve, due: bool) -> None:
        rate = reserve.rate
        sent = self.clock.monotonic()
        elapsed, used = sent - reserve.since, reserve.used
        try:
            if due and reserve.terms is not None and used == 0 and not reserve.short:  # unused since
                if self._reserves.get(key) is reserve:
                    del self._reserves[key]
                await self._release(key, reserve)
                return
            demand = float(rate.burst) if reserve.terms is None or elapsed <= 0 \
                else max(1.0, used / elapsed * rate.per * DEMAND_HEADROOM)
            if reserve.short:  # callers found it empty: twice what it asked for, at least
                demand = max(demand, reserve.asked * DEMAND_HEADROOM)
            reserve.asked, reserve.short = min(demand, float(rate.burst)), False
            live = reserve.bucket is not None and sent < reserve.until
            spare = int(reserve.bucket.level(sent)) if live and reserve.bucket is not None else 0
            seconds = min(lease_seconds(rate), RESERVE_SECONDS)
            ask = LeaseAsk(reserve.lease, reserve.asked, seconds, spare, reserve.terms if live else None,
                           least=RESERVE_LEAST * rate.per)
            reply = await self._lease(key, rate, ask)
        except McpcredsError as exc:  # kept until its end; asked again a moment later
            reserve.renew_at = self.clock.monotonic() + RETRY_AFTER_FAILURE
            _log.debug("the sidecar's lease was not renewed", extra={"key": key, "error": exc.code})
            return
        finally:
            reserve.renewing = False
        if self._reserves.get(key) is not reserve:  # dropped meanwhile (a pause, a reload)
            await self._release(key, reserve)
            return
        reserve.used, reserve.since = reserve.used - used, sent  # the takes since it was sent count next
        # (not worth holding: per grant from Redis meanwhile, and asked again much later)
        reserve.renew_at = sent + (RETRY_NOT_WORTH if reply.dropped else seconds / 2)
        if reserve.again and not reply.dropped:  # told to renew while this renewal was under way
            reserve.again = False
            self._renew(key, reserve, due=False)
        # renewed (or, unused, given back) at half even if no caller comes to renew it
        asyncio.get_running_loop().call_later(max(0.0, reserve.renew_at - self.clock.monotonic()),
                                              self._due, key, reserve)
        period = rate.per * reply.burst / reply.share if reply.share > 0 else math.inf
        if reply.paused > 0.0 or reply.burst < 1 or period > MAX_SECONDS:
            reserve.bucket, reserve.terms, reserve.until = None, (0.0, 0), sent
            return
        now = self.clock.monotonic()
        bucket = TokenBucket(Rate(reply.burst, period * (1 + SHARE_MARGIN)), now)
        # it starts with the permits moved to it and those the old bucket has left (taken
        # from the shared bucket already: spent under the new terms, not lost)
        # (refilled no further than the old lease's end, if the answer came after it)
        old = reserve.bucket if live else None
        carried = int(old.level(min(now, reserve.until))) if old is not None else 0
        bucket.take(reply.burst - min(reply.initial + carried, reply.burst), now)
        reserve.bucket, reserve.terms, reserve.until = bucket, (reply.share, reply.burst), sent + seconds
