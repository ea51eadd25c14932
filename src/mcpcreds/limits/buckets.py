"""Rate buckets: a pure token bucket, and an asyncio limiter that queues callers (a lighter user ahead).

aiolimiter was considered (bench/rate_bench.py uses it as the baseline) and does not fit here: its waiters
are a heap ordered by amount, so a later small request overtakes an earlier large one; it reads
`loop.time()` rather than our `Clock`; and it has no exact `retry_after`, no up-front `max_wait`
refusal and no pause for an upstream 429.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..core.clock import Clock
from ..core.rates import Rate
from ..errors import InvalidRequest, RateLimited

# a server without `rate` still gets a bucket, so that an upstream 429 can pause it
UNLIMITED = Rate(1_000_000_000, 1.0)

EPSILON = 1e-9
"""Slack, in permits and in seconds, so that a grant due exactly at `t` is made at `t`."""

USE_HALF_LIFE = 10.0
"""Seconds in which an asker's recent use (the permits granted to it) halves."""

MAX_PASSED = 1024
"""Waiters a newcomer may go ahead of, at most: the work of an arrival stays bounded however long
the queue is."""

MAX_ASKERS = 256
"""Askers whose recent use a key remembers; the one granted least recently is forgotten first
(forgotten, an asker counts as having used nothing lately: it may go ahead, within every max_wait)."""


# Messages never quote what the caller sent (a cost, a wait): masked by the redactor, an echo
# would tell the caller it had guessed a secret.


def check_cost(cost: int, rate: Rate) -> None:
    """Raise InvalidRequest unless `cost` is a whole number from 1 to the burst."""
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise InvalidRequest("cost must be a whole number of at least 1")
    if cost > rate.burst:
        raise _never(rate)


def _never(rate: Rate) -> InvalidRequest:
    return InvalidRequest(f"the cost is more than the burst of the bucket ({rate}): never granted")


def _check_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidRequest(f"{name} must be a finite number of seconds, at least 0")
    return float(value)


class TokenBucket:
    """`burst` permits, starting full, refilled continuously at `burst / per` a second.

    Times are monotonic seconds passed in by the caller; nothing here reads a clock.
    A pause (an upstream 429) grants nothing before its end, but the level keeps refilling
    meanwhile: the pause says when the upstream will listen again, not that we spent anything.
    """

    __slots__ = ("_level", "_paused_until", "_rate", "_updated")

    def __init__(self, rate: Rate, now: float) -> None:
        self._rate = rate
        self._level = float(rate.burst)
        self._updated = now
        self._paused_until: float | None = None

    @property
    def rate(self) -> Rate:
        return self._rate

    @property
    def capacity(self) -> int:
        return self._rate.burst

    @property
    def paused_until(self) -> float | None:
        """The monotonic time before which nothing is granted, if a pause was ever set."""
        return self._paused_until

    def level(self, now: float) -> float:
        elapsed = max(0.0, now - self._updated)
        return min(float(self._rate.burst), self._level + elapsed * self._rate.per_second)

    def wait_time(self, cost: int, now: float) -> float:
        """Seconds from `now` until `cost` permits can be granted (0.0: at once)."""
        check_cost(cost, self._rate)
        missing = cost - self.level(now)
        refill = missing / self._rate.per_second if missing > EPSILON else 0.0
        paused = self._paused_until - now if self._paused_until is not None else 0.0
        wait = max(refill, paused)
        return wait if wait > EPSILON else 0.0

    def try_take(self, cost: int, now: float) -> float:
        """Take `cost` permits and return 0.0, or take nothing and return the exact wait."""
        wait = self.wait_time(cost, now)
        if wait == 0.0:
            self.take(cost, now)
        return wait

    def take(self, cost: int, now: float) -> None:
        """Deduct unconditionally (the caller has checked `wait_time`)."""
        self._level = max(0.0, self.level(now) - cost)
        self._updated = max(self._updated, now)

    def give_back(self, cost: int, now: float) -> None:
        """Return permits that were granted but not used."""
        self._level = min(float(self._rate.burst), self.level(now) + cost)
        self._updated = max(self._updated, now)

    def pause_until(self, until: float) -> None:
        """Grant nothing before `until`; an earlier pause never shortens a later one."""
        if self._paused_until is None or until > self._paused_until:
            self._paused_until = until

    def set_rate(self, rate: Rate, now: float) -> None:
        """Change the rate, keeping the current level (clamped to the new burst)."""
        if rate == self._rate:
            return
        self._level = min(float(rate.burst), self.level(now))
        self._updated = max(self._updated, now)
        self._rate = rate

    def copy(self) -> TokenBucket:
        twin = TokenBucket(self._rate, self._updated)
        twin._level, twin._paused_until = self._level, self._paused_until
        return twin


@dataclass(eq=False)
class _Waiter:
    cost: int
    deadline: float
    future: asyncio.Future[None]
    asker: Hashable
    grant_at: float  # projected: when its permits are due
    after: TokenBucket  # the bucket as projected right after its grant


@dataclass(eq=False)
class _Counts:
    """A key's counters (Prometheus counters): they only go up for the life of the process, so
    they are kept apart from the lane, which a reload that drops the key's rate throws away."""

    granted: int = 0
    returned: int = 0  # granted, then given back: the caller went away before it ran
    refused: int = 0


@dataclass(eq=False)
class _Lane:
    """One key's bucket, its queue of waiters (see `Limiter`), its askers' recent use and its counters."""

    bucket: TokenBucket
    counts: _Counts
    queue: deque[_Waiter] = field(default_factory=deque)
    # asker -> [permits granted, decayed to `at`; at]: the least recently granted first
    uses: OrderedDict[Hashable, list[float]] = field(default_factory=OrderedDict)
    timer: asyncio.TimerHandle | None = None

    def use(self, asker: Hashable, now: float) -> float:
        """The permits granted to `asker` lately: each counts half after USE_HALF_LIFE seconds."""
        use = self.uses.get(asker)
        return 0.0 if use is None else use[0] * 0.5 ** ((now - use[1]) / USE_HALF_LIFE)

    def count_use(self, asker: Hashable, cost: int, now: float) -> None:
        use = self.uses.get(asker)
        if use is None:
            if len(self.uses) >= MAX_ASKERS:
                self.uses.popitem(last=False)
            self.uses[asker] = [float(cost), now]
        else:
            use[0] = use[0] * 0.5 ** ((now - use[1]) / USE_HALF_LIFE) + cost
            use[1] = now
            self.uses.move_to_end(asker)


class Limiter:
    """Token buckets keyed by cache key, with callers waiting in a queue for their permits.

    The queue is first come, first served, but for one rule: a newcomer goes ahead of the
    waiters at the end of the queue whose asker (a process, a grant) had more permits lately
    than its own asker (`USE_HALF_LIFE`), as long as each waiter it passes is still granted
    within its max_wait. So a process that has just started (a session's opening) is not
    held behind other processes' loops, no waiter is made to wait past the wait it was
    promised, and the callers of one asker are served in their order. Nothing is granted
    out of the bucket's order: the head is granted first, when its permits are there.

    Time comes from `clock`; timers run on the event loop and only call `wake`, which
    re-reads the clock. A test on a FakeClock advances it and calls `wake(key)` itself.
    """

    def __init__(self, clock: Clock, rates: Mapping[str, Rate] | None = None) -> None:
        self._clock = clock
        self._lanes: dict[str, _Lane] = {}
        self._counts: dict[str, _Counts] = {}  # outlive their lanes (one per key ever configured)
        if rates:
            self.reconfigure(rates)

    async def acquire(self, key: str, rate: Rate, cost: int = 1, max_wait: float = 0.0,
                      asker: Hashable = None) -> float:
        """Take `cost` permits from `key`'s bucket, waiting up to `max_wait`; return seconds waited.

        Raises InvalidRequest for a bad cost or max_wait, and RateLimited (with the projected
        wait as retry_after) at once when the permits cannot be had within `max_wait`.
        `asker` is who asks (see the class): callers that give none are one asker.
        """
        max_wait = _check_seconds("max_wait", max_wait)
        if self.try_acquire(key, rate, cost, asker):
            return 0.0
        lane = self._lanes[key]
        now = self._clock.monotonic()
        place, grant_at, after = self._place(lane, cost, asker, now)
        if grant_at - now > max_wait + EPSILON:
            lane.counts.refused += 1
            raise RateLimited(_refusal(key), retry_after=grant_at - now)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(cost, now + max_wait, future, asker, grant_at, after)
        self._insert(lane, place, waiter)
        if place == 0:
            self._arm(key, lane, now)
        try:
            await waiter.future
        except asyncio.CancelledError:
            self._abandon(key, lane, waiter)
            raise
        return self._clock.monotonic() - now

    def try_acquire(self, key: str, rate: Rate, cost: int = 1, asker: Hashable = None) -> bool:
        """Take `cost` permits if nobody is queued and they are there now (no waiting, no refusal
        counted): the synchronous hot path."""
        check_cost(cost, rate)
        now = self._clock.monotonic()
        lane = self._lane(key, rate, now)
        self._grant_due(lane, now)
        if not lane.queue and lane.bucket.try_take(cost, now) == 0.0:
            lane.counts.granted += cost
            lane.count_use(asker, cost, now)
            return True
        return False

    def take_up_to(self, key: str, rate: Rate, most: int) -> int:
        """Take up to `most` whole permits that are there now, if nobody is queued (a lease's
        first permits, moved from this bucket to its holder's); not counted as granted."""
        lane = self._lane(key, rate)
        now = self._clock.monotonic()
        self._grant_due(lane, now)
        if lane.queue or lane.bucket.wait_time(1, now) > 0.0:
            return 0
        taken = min(most, math.floor(lane.bucket.level(now) + EPSILON))
        if taken > 0:
            lane.bucket.take(taken, now)
        return max(0, taken)

    def pause(self, key: str, retry_after: float) -> float | None:
        """An upstream 429: grant nothing on `key` for `retry_after` seconds.

        Returns the wall-clock end of the pause, or None when `key` has no bucket. Waiters
        whose grant would now fall past their `max_wait` are refused with RateLimited.
        """
        retry_after = _check_seconds("retry_after", retry_after)
        lane = self._lanes.get(key)
        if lane is None:
            return None
        now = self._clock.monotonic()
        lane.bucket.pause_until(now + retry_after)
        self._replan(key, lane, now)
        return self._wall(lane.bucket.paused_until, now)

    async def apause(self, key: str, rate: Rate, retry_after: float) -> float | None:
        """`pause`, making the bucket first if the key has none yet (the shared-state API)."""
        self._lane(key, rate)
        return self.pause(key, retry_after)

    async def astatus(self, rates: Mapping[str, Rate]) -> list[dict[str, Any]]:
        return [s for key in sorted(self._lanes) if key in rates and (s := self.snapshot(key)) is not None]

    def reconfigure(self, rates: Mapping[str, Rate]) -> None:
        """Keep unchanged buckets, change the rate of others (keeping their level), drop the rest.

        Waiters of a dropped key are granted at once: a key without a rate has no limit.
        """
        now = self._clock.monotonic()
        for key in [k for k in self._lanes if k not in rates]:
            lane = self._lanes.pop(key)
            if lane.timer is not None:
                lane.timer.cancel()
            for waiter in lane.queue:
                if not waiter.future.done():
                    waiter.future.set_result(None)
        for key, rate in rates.items():
            self._lane(key, rate, now)

    def wake(self, key: str | None = None) -> None:
        """Grant what is due now on `key` (every key if None) and re-arm its timer."""
        now = self._clock.monotonic()
        for k in [key] if key is not None else list(self._lanes):
            lane = self._lanes.get(k)
            if lane is not None:
                self._grant_due(lane, now)
                self._arm(k, lane, now)

    def snapshot(self, key: str) -> dict[str, Any] | None:
        lane = self._lanes.get(key)
        if lane is None:
            return None
        now = self._clock.monotonic()
        bucket = lane.bucket
        return {
            "key": key,
            "level": round(bucket.level(now), 3),
            "capacity": bucket.capacity,
            "rate": str(bucket.rate),
            "per_second": bucket.rate.per_second,
            "waiting": len(lane.queue),
            "granted": lane.counts.granted,
            "returned": lane.counts.returned,
            "refused": lane.counts.refused,
            "paused_until": self._wall(bucket.paused_until, now),
        }

    def status(self) -> list[dict[str, Any]]:
        return [s for key in sorted(self._lanes) if (s := self.snapshot(key)) is not None]

    def close(self) -> None:
        """Cancel the timers (on shutdown); waiters are left to their tasks' cancellation."""
        for lane in self._lanes.values():
            if lane.timer is not None:
                lane.timer.cancel()
                lane.timer = None

    def _lane(self, key: str, rate: Rate, now: float | None = None) -> _Lane:
        now = self._clock.monotonic() if now is None else now
        lane = self._lanes.get(key)
        if lane is None:
            counts = self._counts.setdefault(key, _Counts())
            lane = self._lanes[key] = _Lane(TokenBucket(rate, now), counts)
        elif lane.bucket.rate is not rate and lane.bucket.rate != rate:  # (a dataclass's == is Python)
            lane.bucket.set_rate(rate, now)
            self._replan(key, lane, now)
        return lane

    def _place(self, lane: _Lane, cost: int, asker: Hashable, now: float) -> tuple[int, float, TokenBucket]:
        """Where a newcomer queues, when it would be granted there, and the bucket right after.

        From the end of the queue, it passes each waiter whose asker had more permits lately
        than its own and has the slack to be granted `cost / rate` seconds later (the most a
        grant of `cost` ahead of it can delay it) within its max_wait; it stops at the first
        it may not pass, or after MAX_PASSED. One asker alone never passes itself: first come,
        first served.
        """
        queue = lane.queue
        place = len(queue)
        use = lane.use(asker, now)
        delay = cost / lane.bucket.rate.per_second
        while place > 0 and len(queue) - place < MAX_PASSED:
            ahead = queue[place - 1]
            if lane.use(ahead.asker, now) <= use or ahead.deadline - ahead.grant_at < delay:
                break
            place -= 1
        if place:
            before = queue[place - 1]
            sim, at = before.after.copy(), max(now, before.grant_at)
        else:
            sim, at = lane.bucket.copy(), now
        at += sim.wait_time(cost, at)
        sim.take(cost, at)
        return place, at, sim

    @staticmethod
    def _insert(lane: _Lane, place: int, waiter: _Waiter) -> None:
        """Queue `waiter` at `place` and re-project the waiters it passed."""
        lane.queue.insert(place, waiter)
        sim, at = waiter.after.copy(), waiter.grant_at
        for passed in islice(lane.queue, place + 1, None):
            at += sim.wait_time(passed.cost, at)
            sim.take(passed.cost, at)
            passed.grant_at, passed.after = at, sim.copy()

    def _replan(self, key: str, lane: _Lane, now: float) -> None:
        """Re-project the whole queue (after a pause, a rate change or a departure).

        Refuses the waiters that would now be granted past their deadline (or never); those
        behind them move up.
        """
        sim, at = lane.bucket.copy(), now
        kept: deque[_Waiter] = deque()
        for waiter in lane.queue:
            if waiter.future.done():  # cancelled, its task not yet told
                continue
            if waiter.cost > sim.capacity:  # the rate was lowered under it
                waiter.future.set_exception(_never(sim.rate))
                continue
            grant_at = at + sim.wait_time(waiter.cost, at)
            if grant_at > waiter.deadline + EPSILON:
                lane.counts.refused += 1
                waiter.future.set_exception(
                    RateLimited(_refusal(key), retry_after=grant_at - now)
                )
                continue
            sim.take(waiter.cost, grant_at)
            at = waiter.grant_at = grant_at
            waiter.after = sim.copy()
            kept.append(waiter)
        lane.queue = kept
        self._grant_due(lane, now)
        self._arm(key, lane, now)

    def _grant_due(self, lane: _Lane, now: float) -> None:
        while lane.queue:
            head = lane.queue[0]
            if head.future.done():  # cancelled, its task not yet told
                lane.queue.popleft()
                continue
            if lane.bucket.try_take(head.cost, now) > 0.0:
                return
            lane.queue.popleft()
            lane.counts.granted += head.cost
            lane.count_use(head.asker, head.cost, now)
            head.future.set_result(None)

    def _arm(self, key: str, lane: _Lane, now: float) -> None:
        """Set the one timer of `key` for when its head waiter's permits are due."""
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        if lane.queue:
            delay = lane.bucket.wait_time(lane.queue[0].cost, now)
            lane.timer = asyncio.get_running_loop().call_later(delay, self.wake, key)

    def _abandon(self, key: str, lane: _Lane, waiter: _Waiter) -> None:
        """The caller went away: give up its place, or give back permits it was just granted."""
        if self._lanes.get(key) is not lane:
            return
        now = self._clock.monotonic()
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            lane.bucket.give_back(waiter.cost, now)
            lane.counts.returned += waiter.cost
        elif waiter in lane.queue:
            lane.queue.remove(waiter)
        self._replan(key, lane, now)

    def _wall(self, mono: float | None, now: float) -> float | None:
        """A future monotonic time as wall-clock time; None if it is not in the future."""
        if mono is None or mono <= now:
            return None
        return self._clock.time() + (mono - now)


def _refusal(key: str) -> str:
    return f"{key}: the permits asked for are not available within max_wait"
