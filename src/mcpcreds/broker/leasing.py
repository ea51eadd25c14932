"""Capacity leases, as `POST /v1/servers/{name}/lease` answers them: the route (in the API)
resolves the server and reads the body; this service decides, from the limiter, the lease book,
the event hub and the clock the broker hands it.

A lease answer is the `headers` answer (headers, key, expires_at, fingerprint) with the lease's
terms: `lease` (its id, for renewals), `share` permits per `per` seconds, `burst`, `initial`
(permits moved from the shared bucket to the holder now: its in-process bucket starts with
these), `lease_until` (wall clock) and `lease_seconds`. A holder spends its share in its own
process until `lease_seconds` after it sent the request, and renews at half of that; a share of
0 means "not now": ask per request and try again later. The arithmetic is in leases.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from ..config.model import is_aws
from ..core.http import Response, json_response
from ..errors import InvalidRequest, LeasesRefused, RateLimited
from ..limits.buckets import UNLIMITED, Limiter
from ..limits.leases import MAX_LEASE_ID, LeaseRefused, Terms, lease_seconds
from ..state.lease_asks import LeaseAsk
from ..state.shared import SharedLimiter

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from ..config.model import Target
    from ..core.clock import Clock
    from ..core.rates import Rate
    from ..limits.leases import LeaseBook
    from .events import EventHub
    from .headers import HeadersResult

MAX_DEMAND: Final = 1_000_000_000.0
MAX_ID: Final = MAX_LEASE_ID
UNLIMITED_LEASE: Final = 60.0  # seconds: the length of a lease on a server without `rate`


def _id(body: dict[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is not None and (not isinstance(value, str) or not 0 < len(value) <= MAX_ID
                              or not value.isascii() or not value.isprintable()):
        raise InvalidRequest(f"{field} must be an id this sidecar gave out")
    return value


class LeaseService:
    """Grants, renews and releases leases. `rates` and `headers` are the broker's: the rates of
    the config in force, and the headers answer a lease carries."""

    def __init__(self, limiter: Limiter | SharedLimiter, book: LeaseBook, events: EventHub, clock: Clock,
                 rates: Callable[[], Mapping[str, Rate]],
                 headers: Callable[[Target], Awaitable[HeadersResult]]) -> None:
        self.limiter = limiter
        self.book = book
        self.events = events
        self.clock = clock
        self.rates = rates
        self.headers = headers

    def check_leasable(self, target: Target) -> None:
        """Refuse, before the body is read, a server whose buckets cannot be leased."""
        if target.gateway.leases is False:
            raise LeasesRefused(f"server {target.name!r} has leases = false: ask per request")
        if target.aauth or is_aws(target):
            raise LeasesRefused(f"server {target.name!r} signs each request in the sidecar: ask per request")
        if not isinstance(self.limiter, Limiter | SharedLimiter):
            raise LeasesRefused("this sidecar's buckets cannot be leased: ask per request")

    async def lease(self, target: Target, body: dict[str, Any], uid: int) -> Response:
        """A grant, a renewal (`lease`), or a release (`release: true`) for the holder `uid`."""
        self.check_leasable(target)
        book, clock = self.book, self.clock
        lease_id = _id(body, "lease")
        subscriber = _id(body, "subscriber")
        if body.get("release") is True:
            if lease_id is None:
                return json_response({"released": False})
            key_of = book.key_of(lease_id)
            released = book.release(lease_id, uid)
            if released and key_of is not None and isinstance(self.limiter, SharedLimiter):
                await release_shared(self.limiter, self.rates(), [(key_of, lease_id)])
            return json_response({"released": released})
        holding = body.get("holding")
        if holding is not None and not (isinstance(holding, list) and len(holding) == 2
                                        and all(isinstance(v, int | float) and not isinstance(v, bool)
                                                and 0 <= v <= MAX_DEMAND for v in holding)):
            raise InvalidRequest("holding must be [share, burst]: the terms of the lease being spent")
        spare = body.get("spare", 0)
        if isinstance(spare, bool) or not isinstance(spare, int) or not 0 <= spare <= MAX_DEMAND:
            raise InvalidRequest("spare must be the whole permits left in the holder's bucket, at least 0")
        demand = body.get("demand", MAX_DEMAND)
        if isinstance(demand, bool) or not isinstance(demand, int | float) or not 0 <= demand <= MAX_DEMAND:
            raise InvalidRequest("demand must be a number of permits per period, at least 0")
        least = body.get("least", 0)
        if isinstance(least, bool) or not isinstance(least, int | float) or not 0 <= least <= MAX_DEMAND:
            raise InvalidRequest("least must be a number of permits per second, at least 0")
        if subscriber is not None and self.events.owner(subscriber) != uid:
            raise InvalidRequest("subscriber must name an open event stream of this uid")
        key = target.key
        snapshot = self.limiter.snapshot(key)
        if snapshot is not None and snapshot["paused_until"] is not None:
            raise RateLimited(f"{key}: paused after an upstream 429",
                              max(0.0, snapshot["paused_until"] - clock.time()))
        result = await self.headers(target)  # first: a failing login leases nothing
        if target.rate is None:  # no limit to share: the whole of it, nothing kept aside
            return _unlimited(clock.time(), lease_id, result.body)
        rate = target.rate
        if isinstance(self.limiter, SharedLimiter):
            return await self._lease_shared(self.limiter, uid, key, rate, lease_id, subscriber,
                                            float(demand), spare, holding, result.body,
                                            float(least) * rate.per)
        granted = self.limiter.snapshot(key)
        if book.on_nudge is None:  # holders hear "renew now" on their event stream
            book.on_nudge = partial(_nudge, self.events)
        limiter = self.limiter
        before = book.shared_rate(key, rate, clock.monotonic(), asking=False)
        try:
            terms = book.grant(key, rate, lease_id, float(demand), uid, subscriber,
                               granted["granted"] if granted else 0, clock.monotonic(),
                               granted["waiting"] if granted else 0,
                               (float(holding[0]), int(holding[1])) if holding else None,
                               float(least) * rate.per)
        except LeaseRefused as exc:
            raise LeasesRefused(str(exc)) from None
        assert isinstance(limiter, Limiter)
        # the holder's bucket is filled up to its burst (it has `spare`) from the shared one, at the
        # shared one's old rate (its refill until now, and its old burst: the new, smaller one would
        # clip what it holds first), above a reserve for the callers without a lease: the shared
        # share of one period. Then the new rate applies from now.
        after = book.shared_rate(key, rate, clock.monotonic(), asking=False)
        reserve = min(after.burst, max(1, math.ceil(after.per_second * rate.per)))
        snapshot = limiter.snapshot(key)
        level = snapshot["level"] if snapshot is not None else float(rate.burst)
        most = min(terms.burst, book.fair_burst(key, terms.lease)) - spare
        initial = limiter.take_up_to(key, before, max(0, min(most, math.floor(level) - reserve)))
        self._apply_shared_rate(key, rate)
        # when this lease lapses unrenewed, the shared bucket's waiters get its share back at once
        asyncio.get_running_loop().call_later(terms.seconds, self._apply_shared_rate, key, rate)
        return _answer(clock.time(), terms, initial, result.body)

    async def _lease_shared(self, limiter: SharedLimiter, uid: int, key: str, rate: Rate,
                            lease_id: str | None, subscriber: str | None, demand: float, spare: int,
                            holding: list[float] | None, headers_body: bytes, least: float = 0.0) -> Response:
        """A shared state: the share is decided, and kept aside from the bucket every sidecar takes
        from, by the bucket's lease script (bucket_scripts.py), over the holders of every sidecar."""
        book = self.book
        seconds = lease_seconds(rate)
        try:
            lease_id = book.admit(key, lease_id, uid, subscriber, self.clock.monotonic(), seconds)
        except LeaseRefused as exc:
            raise LeasesRefused(str(exc)) from None
        ask = LeaseAsk(lease_id, min(demand, float(rate.burst)), seconds, min(spare, rate.burst),
                       (float(holding[0]), int(holding[1])) if holding else None, least=least)
        reply = await limiter.lease(key, rate, ask)
        terms = book.note(lease_id, reply.share, reply.burst, rate.per, seconds, self.clock.monotonic())
        if terms is None:  # released while the shared state answered: give its share back there too
            await release_shared(limiter, self.rates(), [(key, lease_id)])
            raise LeasesRefused("the lease was released while it was granted: ask again")
        if reply.paused > 0.0:
            raise RateLimited(f"{key}: paused after an upstream 429", reply.paused)
        if reply.dropped:  # not worth holding, and not kept in the shared state: nor here
            book.release(lease_id)
        return _answer(self.clock.time(), terms, reply.initial, headers_body)

    def _apply_shared_rate(self, key: str, rate: Rate) -> None:
        """Give the shared bucket of `key` its rate less what is leased now (not a caller's ask)."""
        if isinstance(self.limiter, Limiter) and self.rates().get(key) == rate:
            now = self.clock.monotonic()
            self.limiter.take_up_to(key, self.book.shared_rate(key, rate, now, asking=False), 0)


def _answer(wall: float, terms: Terms, initial: int, headers_body: bytes) -> Response:
    # the share rounded down: the holder never refills faster than granted (nor than bought)
    fields = json.dumps({"lease": terms.lease, "share": math.floor(terms.share * 1e6) / 1e6,
                         "burst": terms.burst, "per": terms.per, "initial": initial,
                         "lease_until": wall + terms.seconds,
                         "lease_seconds": terms.seconds}, separators=(",", ":")).encode()
    return Response(200, fields[:-1] + b"," + headers_body[1:])


async def release_shared(limiter: SharedLimiter, rates: Mapping[str, Rate],
                         leases: list[tuple[str, str]]) -> None:
    """Give these leases' shares back to the shared bucket now (their holders stopped spending)."""
    for key, lease_id in leases:
        rate = rates.get(key)
        if rate is not None:
            await limiter.lease(key, rate, LeaseAsk.release_of(lease_id))


def _nudge(events: EventHub, key: str, subscribers: list[str]) -> None:
    events.send(subscribers, "lease", key)


def _unlimited(now: float, lease_id: str | None, headers_body: bytes) -> Response:
    """A lease on a server without `rate`: permits without limit (its holders still hear of
    invalidations and pauses), nothing taken from anyone."""
    seconds = UNLIMITED_LEASE
    fields = json.dumps({"lease": lease_id or secrets.token_urlsafe(12), "share": float(UNLIMITED.burst),
                         "burst": UNLIMITED.burst, "per": UNLIMITED.per, "initial": UNLIMITED.burst,
                         "lease_until": now + seconds, "lease_seconds": seconds},
                        separators=(",", ":")).encode()
    return Response(200, fields[:-1] + b"," + headers_body[1:])
