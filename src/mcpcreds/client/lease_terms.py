"""The lease arithmetic both lease holders share (leaser.py, async; leaser_sync.py, sync): pure
functions of what a holder knows and what the sidecar said, with no I/O, no clock and no lock.

What an event means (`event_effect`, `renew_now`), when a lease is worth asking for
(`called_often`, `Trigger`), what demand a renewal names (`lease_demand`), when a holder whose
share is spent asks the shared bucket again (`borrow_again_at`) and what a lease answer makes of
the lease held (`lease_answer`). Each holder applies that to its own bucket (an
`aiolimiter.AsyncLimiter`, a `buckets.TokenBucket`) on its own terms (the event loop, a lock).

When a lease pays (`lease="auto"`, the default): a lease saves the socket round trip of a `call`
(a fraction of a millisecond) and costs the holder its part of the shared burst, so it is asked
for only by a process whose own calls come fast, and keep coming (`AUTO_CALLS` within
`AUTO_SECONDS`, not a burst at the start), and only
taken when its share would give at least `AUTO_LEAST` permits a second (the sidecar answers "not
now" otherwise: per request, where the whole shared burst serves its first calls). `lease=True`
asks after `TRIGGER_CALLS` calls, for whatever share there is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections import deque

    from aiolimiter import AsyncLimiter

TRIGGER_CALLS: Final = 3  # lease=True: this many calls within TRIGGER_SECONDS ask for a lease
TRIGGER_SECONDS: Final = 1.0
AUTO_CALLS: Final = 64  # lease="auto": this many within AUTO_SECONDS (a pace at which round trips add up)
AUTO_SECONDS: Final = 2.0
AUTO_LEAST: Final = 32.0  # lease="auto": permits per second, the least share worth holding
BORROW_SPACING: Final = 0.05  # s: the least time between a holder's refused asks of the shared bucket
RETRY_AFTER_FAILURE: Final = 1.0
DEMAND_HEADROOM: Final = 2.0  # ask for twice what was used: a growing client can double per renewal
MAX_EVENT_LINE: Final = 64 * 1024
DROP_KINDS: Final = frozenset({"invalidate", "rotation", "pause"})
MAX_EVENT_PAUSE: Final = 3600.0


def event_effect(event: dict[str, Any], key: str | None, answer: dict[str, Any] | None) -> tuple[bool, float]:
    """What an event of the stream means for the leased headers of `key`: (drop them, pause
    seconds). A pause drops them and holds requests; a login with another fingerprint than the
    held answer's drops them. Shared by the async and the sync lease holders."""
    if key is None or event.get("key") != key:
        return False, 0.0
    kind = event.get("kind")
    if kind == "pause":
        seconds = event.get("seconds")
        pause = min(float(seconds), MAX_EVENT_PAUSE) if isinstance(seconds, int | float) else 0.0
        return True, pause
    changed = kind == "login" and answer is not None and event.get("fingerprint") != answer.get("fingerprint")
    return kind in DROP_KINDS or changed, 0.0


@dataclass(frozen=True, slots=True)
class Trigger:
    """When a holder asks for a lease: after `calls` calls within `seconds`, for a share of at least
    `least` permits per second (0: whatever share there is)."""

    calls: int
    seconds: float
    least: float

    @classmethod
    def of(cls, lease: bool | str) -> Trigger:
        """`lease=True`: as soon as it is called often, whatever the share; "auto": where it pays."""
        return ALWAYS if lease is True else AUTO


ALWAYS: Final = Trigger(TRIGGER_CALLS, TRIGGER_SECONDS, 0.0)  # lease=True
AUTO: Final = Trigger(AUTO_CALLS, AUTO_SECONDS, AUTO_LEAST)  # lease="auto"


def called_often(recent: deque[float], now: float, within: float = TRIGGER_SECONDS) -> bool:
    """Note a call at `now` in `recent` (the last `recent.maxlen` calls, a `Trigger`'s `calls`):
    whether they all came `within` seconds (its `seconds`), when a lease is worth asking for.
    Shared by the async and the sync holders."""
    recent.append(now)
    return len(recent) == recent.maxlen and now - recent[0] <= within


def borrow_again_at(now: float, retry_after: float | None, per: float) -> float:
    """When a holder whose share is spent may next ask the shared bucket for a permit without
    waiting (a lease holder borrows what the callers without a lease leave in its stock, rather
    than wait for its own share while that stock stands idle): when the shared bucket said it would
    have one (`retry_after` of its refusal; None: a failure, RETRY_AFTER_FAILURE), within
    BORROW_SPACING and one period of the rate. Shared by the async and the sync holders."""
    if retry_after is None:
        return now + RETRY_AFTER_FAILURE
    return now + min(max(retry_after, BORROW_SPACING), max(per, BORROW_SPACING))


def renew_now(event: dict[str, Any], key: str | None, lease: str | None, disabled: bool) -> bool:
    """A `lease` event for the key of the lease we hold: renew it now."""
    return event.get("kind") == "lease" and key is not None and event.get("key") == key \
        and lease is not None and not disabled


def lease_demand(has_share: bool, saturated: bool, now: float, since: float, min_window: float,
                 asked: float | None, used: int, per: float) -> float | None:
    """Permits per period a renewal asks for: None (as many as the sidecar gives) without a share
    or when the share was what held requests back (`saturated`); the last demand (`asked`) again
    when less than `min_window` has passed since the use was last measured (`since`: an early
    renewal, a nudge or a shrink, measures nothing); else twice the `used` permits' rate.
    Shared by the async and the sync lease holders."""
    if not has_share or saturated or now <= since:
        return None
    if now - since < min_window:
        return asked
    return max(1.0, used / (now - since) * per * DEMAND_HEADROOM)


def available(limiter: AsyncLimiter) -> int:
    """The whole permits `limiter` could grant now (aiolimiter says only yes or no)."""
    low, high = 0, int(limiter.max_rate)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if limiter.has_capacity(mid) else (low, mid - 1)
    return low


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    """What a lease answer makes of the lease held (`lease_answer`), for the holder to apply."""

    got: dict[str, Any]  # the answer itself
    sent: float  # when the lease call was sent (the holder's clock)
    lease: str
    key: str
    per: float  # the period of the rate
    seconds: float  # the lease's length
    new_window: bool  # the use was measured: a new window from `sent` (nothing used since)
    min_window: float  # a quarter of the lease: less use than that measures nothing
    not_now: bool  # a share of 0: per request, and ask again at `retry_at` (half a lease later)
    retry_at: float
    terms: tuple[float, int]  # (share, burst); (0.0, 0) when not now
    shrunk: bool  # a smaller share than the one held: say so at once (the next renewal holds it)
    rebuild: bool  # a new bucket: other terms, the old one's lease ended, or permits moved to it
    carry: bool  # the old bucket's lease is still live: what it has left goes into the new one
    refill_period: float  # the new bucket's period for its `burst` permits (0.0 when not now)
    initial: int  # the permits the sidecar moved to the new bucket
    answer: dict[str, Any]  # the leased headers and their fingerprint
    lease_end: float  # the end of the lease (the sidecar's end of it is later: it counts from receipt)

    @property
    def burst(self) -> int:
        return self.terms[1]

    def start(self, carried: int) -> int:
        """The permits a new bucket starts with: those the sidecar moved to it and those the old
        one had left (`carried`, already taken from the shared bucket: spent under the new terms,
        not lost), at most its burst."""
        return min(self.burst, max(0, self.initial) + carried)

    def usable_until(self) -> tuple[float, float]:
        """(deadline, renew at) of the leased headers: the lease's end, renewed at its half (at
        once when the share shrank); never past the login's expiry, as without a lease."""
        deadline, renew_at = self.lease_end, self.sent if self.shrunk else self.sent + self.seconds / 2
        expires_at = self.got.get("expires_at")
        if isinstance(expires_at, int | float):
            left = expires_at - (float(self.got["lease_until"]) - self.seconds)  # from the sidecar's now
            deadline = min(deadline, self.sent + left)
            renew_at = min(renew_at, self.sent + left / 2)
        return deadline, renew_at


def lease_answer(got: dict[str, Any], sent: float, now: float, *, since: float, min_window: float,
                 terms: tuple[float, int], held: bool, lease_end: float) -> LeaseAnswer:
    """What the lease answer `got` (to a call sent at `sent`, read at `now`) makes of the lease
    held: `since` and `min_window` of its use window, its `terms`, whether it has a bucket
    (`held`) and the end of its last lease. Shared by the async and the sync lease holders."""
    share, burst, per = float(got["share"]), int(got["burst"]), float(got["per"])
    seconds, initial = float(got["lease_seconds"]), int(got["initial"])
    not_now = burst < 1 or share <= 0.0
    # a bucket kept past its lease's end refilled meanwhile with nothing bought: not carried
    live = held and now < lease_end  # (an answer after its end: not)
    new_terms = (0.0, 0) if not_now else (share, burst)
    return LeaseAnswer(
        got=got, sent=sent, lease=str(got["lease"]), key=str(got["key"]), per=per, seconds=seconds,
        new_window=sent - since >= min_window, min_window=seconds / 4,
        not_now=not_now, retry_at=sent + seconds / 2, terms=new_terms,
        shrunk=not not_now and held and share < terms[0],
        rebuild=not not_now and (new_terms != terms or not live or initial > 0),
        carry=live, refill_period=0.0 if not_now else per * burst / share, initial=initial,
        answer={"headers": got["headers"], "fingerprint": got.get("fingerprint")},
        lease_end=sent + seconds)
