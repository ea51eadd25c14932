"""Capacity leases (pure: no I/O, no clock reads; times are passed in).

A client that calls a server often takes a *lease*: a share of its bucket's rate (permits per
period) and of its burst, which it spends in its own process until `until`. The shares come out
of the shared bucket: while a lease is held, the bucket that serves everyone else refills at the
rate minus the leased shares and holds the burst minus the leased bursts (`shared_rate`). The sum
of every sub-bucket's rate and burst is the configured one, and a holder's first permits are
taken from the shared bucket's level, so no window ever holds more grants than the whole bucket.

Who gets how much: max-min fairness over recent demand (`max_min_fair`), the callers without a
lease counted as one more participant (their demand measured from the shared bucket's grants).
A share never exceeds what is free now: a holder whose share shrinks keeps its old reservation
until the lease it holds lapses (it may spend it until then), so a newcomer gets its fair share
from the next renewal after that (within two lease periods).

On a shared (Redis) state the same split is made, over every sidecar's holders, by the bucket's
lease script (bucket_scripts.py); this book then only keeps its own holders' ids (`admit`, `note`).

A lease is taken where it pays (the client's `least`: permits per period under which a share is
not worth holding): a holder that holds nothing and whose fair share is under it gets "not now"
and is not kept, so its demand shrinks nobody's share; its calls count with the shared callers'.
`least` gates taking a lease, not keeping one: a holder's renewal is granted its fair share.

A lease lapses at `until` unless renewed; its holder's share is taken back at once when the
holder's event stream closes (`release_subscriber`) or it gives it up (`release`).

Nobody waits for a renewal to get what fairness gives it (`on_nudge`: the sidecar sends a `lease`
event to the holders named, who renew at once): a grant names the other holders whose share is
well over their fair one while someone is short of theirs (they renew, then say they spend the
smaller share, which frees the larger one), and those well under theirs who could get more now.
A caller without a lease asking while the shared bucket's share is well under what it would get
wanting everything names the holders over their fair part (at most once per `RECALL_EVERY` of a
lease): their renewal sees the shared callers waiting. Each holder is named once until it renews.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..core.rates import MAX_SECONDS, Rate

SHARED: Final = ""  # the participant that stands for the callers without a lease
MIN_SHARED_DEMAND: Final = 1.0  # permits per period always kept for callers without a lease
SHARED_BURST_FLOOR: Final = 0.5  # the part of the burst that stays with the shared bucket
DEMAND_SMOOTHING: Final = 0.5  # weight of the newest sample of the shared callers' demand
MAX_HOLDERS_PER_KEY: Final = 256
MAX_HOLDERS_PER_UID: Final = 64  # of a key: one uid cannot take every holder's place
MAX_LEASE_ID: Final = 64  # characters: what the API takes as a lease or subscriber id
NUDGE_MARGIN: Final = 0.1  # a share this far (of the fair one, at least 1 permit) from fair is nudged
RECALL_EVERY: Final = 0.125  # of a lease: the least time between two recalls for the shared callers


def lease_seconds(rate: Rate) -> float:
    """How long a lease lasts: two periods of the rate, from 2 s to 60 s (renewed at half)."""
    return min(max(2.0 * rate.per, 2.0), 60.0)


def max_min_fair(capacity: float, demands: Mapping[str, float]) -> dict[str, float]:
    """Water-filling: each participant gets its demand or an equal part of what is left,
    whichever is less, smallest demands first. The parts sum to at most `capacity`."""
    out: dict[str, float] = {}
    left = max(0.0, capacity)
    order = sorted(demands.items(), key=lambda item: (item[1], item[0]))
    for i, (name, demand) in enumerate(order):
        part = min(max(0.0, demand), left / (len(order) - i))
        out[name] = part
        left -= part
    return out


@dataclass(frozen=True, slots=True)
class Terms:
    """A lease as granted: `share` permits per `per` seconds, `burst` permits at most at once,
    until the monotonic time `until` (`seconds` from the grant). `changed`: the share or burst
    differs from the holder's previous lease (the holder starts a new in-process bucket, whose
    first permits are taken from the shared one)."""

    lease: str
    share: float
    burst: int
    per: float
    until: float
    seconds: float
    changed: bool


@dataclass(slots=True)
class _Grant:
    share: float
    burst: int
    until: float


@dataclass(slots=True)
class _Holder:
    uid: int
    subscriber: str | None
    demand: float
    until: float
    grants: list[_Grant] = field(default_factory=list)
    terms: tuple[float, int] | None = None
    nudged: bool = False  # told to renew now, and has not yet

    def prune(self, now: float) -> None:
        self.grants = [g for g in self.grants if g.until > now]

    def reserved(self) -> tuple[float, int]:
        """What the sidecar keeps aside for this holder: the most any live lease of it allows."""
        return (max((g.share for g in self.grants), default=0.0),
                max((g.burst for g in self.grants), default=0))


@dataclass(slots=True)
class _Key:
    holders: dict[str, _Holder] = field(default_factory=dict)
    shared_demand: float = 0.0
    granted_total: int | None = None
    sampled_at: float = 0.0
    recall_below: float = -math.inf  # a shared share under this recalls holders (see shared_rate)
    fair_all: dict[str, float] = field(default_factory=dict)  # the split if the shared callers want all
    recalled_at: float = -math.inf
    shared_state: bool = False  # the shares are decided and kept aside in the shared state


class LeaseRefused(Exception):
    """The bucket cannot take another holder."""


class LeaseBook:
    """The leases of one sidecar, per bucket key."""

    def __init__(self, on_nudge: Callable[[str, list[str]], None] | None = None) -> None:
        self._keys: dict[str, _Key] = {}
        self._where: dict[str, str] = {}  # lease id -> key
        self.on_nudge = on_nudge  # (key, subscribers): tell these holders to renew now

    def holds(self, key: str) -> bool:
        entry = self._keys.get(key)
        return entry is not None and bool(entry.holders)

    def reserved(self, key: str, now: float) -> tuple[float, int]:
        """The shares and bursts leased out on `key` now (live leases, the ones a renewal shrank
        until they lapse)."""
        entry = self._keys.get(key)
        return self._reserved(key, entry, now) if entry is not None else (0.0, 0)

    def shared_rate(self, key: str, rate: Rate, now: float, asking: bool = True) -> Rate:
        """The rate of the bucket that serves the callers without a lease (the hot path: a dict
        miss when nothing is leased on `key`). `asking`: a caller without a lease asks for
        permits now (not the sidecar applying new terms): holders over their fair part are
        recalled if the shared share is well under what the shared callers would get."""
        entry = self._keys.get(key)
        if entry is None or entry.shared_state:
            return rate
        share, burst = self._reserved(key, entry, now)
        if share <= 0.0 and burst <= 0:
            return rate
        if asking and rate.burst - share < entry.recall_below \
                and now >= entry.recalled_at + RECALL_EVERY * lease_seconds(rate):
            entry.recalled_at = now
            self._tell(key, [h for name, h in entry.holders.items()
                             if _over(h.reserved()[0], entry.fair_all.get(name, 0.0))])
        left_burst = rate.burst - burst
        left_share = rate.burst - share
        if left_burst < 1 or left_share <= 0.0:  # the rate was lowered under live leases
            return Rate(1, MAX_SECONDS)
        return Rate(left_burst, rate.per * left_burst / left_share)

    def grant(self, key: str, rate: Rate, lease: str | None, demand: float, uid: int,
              subscriber: str | None, shared_granted: int, now: float, shared_waiting: int = 0,
              holding: tuple[float, int] | None = None, least: float = 0.0) -> Terms:
        """A new lease for a new holder (`lease` None) or a renewal; `demand` in permits per
        period, `shared_granted` the shared bucket's grant counter (for its callers' demand),
        `shared_waiting` how many of its callers wait in its queue (unmet demand: then they
        count as wanting the whole rate, and get at least an equal part of it). `holding`: the
        share and burst the holder spends now (it has the answer that gave them): its older
        leases with other terms are no longer kept aside, so a share that shrank frees its part
        at once rather than when the lease that gave the larger one lapses. `least` (permits per
        period): a holder that holds nothing now is not given a share under this ("not now": it
        asks per request, its calls counted with the shared callers', and it is not kept)."""
        entry = self._keys.setdefault(key, _Key())
        self._sample(entry, rate, shared_granted, now)
        self._reserved(key, entry, now)  # prunes lapsed leases
        holder = entry.holders.get(lease) if lease is not None else None
        if holder is None or holder.uid != uid:
            _check_room(entry, uid)
            lease = secrets.token_urlsafe(12)
            holder = entry.holders[lease] = _Holder(uid, subscriber, demand, now)
            self._where[lease] = key
        assert lease is not None
        holder.nudged = False
        holder.demand = max(0.0, min(demand, float(rate.burst)))
        spent = [g for g in holder.grants if holding is not None and g.burst == holding[1]
                 and abs(g.share - holding[0]) <= 1e-6 * max(1.0, g.share)]  # (the answer rounds it)
        if spent:
            holder.grants = [max(spent, key=lambda g: g.until)]
        if subscriber is not None:
            holder.subscriber = subscriber
        demands = {name: h.demand for name, h in entry.holders.items()}
        demands[SHARED] = float(rate.burst) if shared_waiting > 0 else max(entry.shared_demand,
                                                                            MIN_SHARED_DEMAND)
        fair = max_min_fair(float(rate.burst), demands)
        seconds = lease_seconds(rate)
        if fair[lease] < least and holder.reserved() == (0.0, 0):  # not worth holding now
            self.release(lease)
            return Terms(lease, 0.0, 0, rate.per, now + seconds, seconds, holder.terms != (0.0, 0))
        others = [h.reserved() for name, h in entry.holders.items() if name != lease]
        free_share = rate.burst - fair[SHARED] - sum(s for s, _ in others)
        free_burst = math.floor(rate.burst * (1 - SHARED_BURST_FLOOR)) - sum(b for _, b in others)
        share = max(0.0, min(fair[lease], free_share))
        burst = min(max(1, math.floor(share * (1 - SHARED_BURST_FLOOR))), free_burst)
        if burst < 1 or share <= 0.0:
            share, burst = 0.0, 0
        until = holder.until = now + seconds
        if burst:
            holder.grants.append(_Grant(share, burst, until))
        changed = holder.terms != (share, burst)
        holder.terms = (share, burst)
        self._rebalance(key, entry, rate, fair, demands, lease)
        return Terms(lease, share, burst, rate.per, until, seconds, changed)

    def admit(self, key: str, lease: str | None, uid: int, subscriber: str | None, now: float,
              seconds: float) -> str:
        """A shared state's holder (its share is decided in the shared state, bucket_scripts.py):
        its lease id, a new one unless `lease` is this uid's. Noted here for its release when its
        event stream closes, and for the status; a new one is kept for `seconds` (the lease it
        asks for) while the shared state answers, so that no other grant meanwhile prunes it."""
        entry = self._keys.setdefault(key, _Key(shared_state=True))
        self._reserved(key, entry, now)  # prunes lapsed leases
        holder = entry.holders.get(lease) if lease is not None else None
        if holder is None or holder.uid != uid:
            _check_room(entry, uid)
            lease = secrets.token_urlsafe(12)
            holder = entry.holders[lease] = _Holder(uid, subscriber, 0.0, now + seconds)
            self._where[lease] = key
        if subscriber is not None:
            holder.subscriber = subscriber
        assert lease is not None
        return lease

    def note(self, lease: str, share: float, burst: int, per: float, seconds: float,
             now: float) -> Terms | None:
        """What the shared state granted `lease` (admitted just before); None if it was released
        meanwhile (its holder's event stream closed)."""
        key = self._where.get(lease)
        holder = self._keys[key].holders.get(lease) if key is not None else None
        if holder is None:
            return None
        until = holder.until = now + seconds
        if burst:
            holder.grants.append(_Grant(share, burst, until))
        changed = holder.terms != (share, burst)
        holder.terms = (share, burst)
        return Terms(lease, share, burst, per, until, seconds, changed)

    def key_of(self, lease: str) -> str | None:
        return self._where.get(lease)

    def subscriber_of(self, lease: str) -> str | None:
        """The event stream of this sidecar's holder of `lease`, if it has one."""
        key = self._where.get(lease)
        holder = self._keys[key].holders.get(lease) if key is not None else None
        return holder.subscriber if holder is not None else None

    def all_leases(self) -> list[tuple[str, str]]:
        """(key, lease) of every lease held."""
        return [(key, lease) for key, entry in self._keys.items() for lease in entry.holders]

    def leases_of(self, subscriber: str) -> list[tuple[str, str]]:
        """(key, lease) of the leases held through this event stream."""
        return [(key, lease) for key, entry in self._keys.items() for lease, h in entry.holders.items()
                if h.subscriber == subscriber]

    def fair_burst(self, key: str, lease: str) -> int:
        """The burst `lease` would get if the callers without a lease wanted everything: what its
        holder's bucket is filled to from the shared one (a newcomer's first share is often cut
        soon after, by those joining behind it, and a bucket cut to a smaller burst loses the rest)."""
        entry = self._keys.get(key)
        share = entry.fair_all.get(lease, 0.0) if entry is not None else 0.0
        return max(1, math.floor(share * (1 - SHARED_BURST_FLOOR)))

    def _rebalance(self, key: str, entry: _Key, rate: Rate, fair: dict[str, float],
                   demands: dict[str, float], lease: str) -> None:
        """After a grant to `lease`: nudge the other holders far from their fair share (those over
        it only if someone is short), and note what the shared callers would get wanting all."""
        reserved = {name: h.reserved()[0] for name, h in entry.holders.items()}
        total = sum(reserved.values())
        short = _under(rate.burst - total, fair[SHARED])  # the shared callers', or a holder's
        told: list[_Holder] = []
        for name, h in entry.holders.items():
            held = h.terms[0] if h.terms is not None else 0.0
            short = short or _under(held, fair[name])
            reachable = min(fair[name], rate.burst - fair[SHARED] - (total - reserved[name]))
            if name != lease and _under(held, reachable):
                told.append(h)  # more is free for it now
        if short:
            told += [h for name, h in entry.holders.items()
                     if name != lease and _over(reserved[name], fair[name])]
        self._tell(key, told)
        demands[SHARED] = float(rate.burst)
        entry.fair_all = max_min_fair(float(rate.burst), demands)
        entry.recall_below = entry.fair_all[SHARED] - _margin(entry.fair_all[SHARED])

    def _tell(self, key: str, holders: list[_Holder]) -> None:
        """Ask these holders to renew now (each once until it has)."""
        subscribers = []
        for h in holders:
            if not h.nudged and h.subscriber is not None:
                h.nudged = True
                subscribers.append(h.subscriber)
        if subscribers and self.on_nudge is not None:
            self.on_nudge(key, subscribers)

    def release(self, lease: str, uid: int | None = None) -> bool:
        """The holder gives its lease up (it has stopped spending it); `uid`, if given, must hold it."""
        key = self._where.get(lease)
        if key is None:
            return False
        entry = self._keys[key]
        holder = entry.holders.get(lease)
        if uid is not None and holder is not None and holder.uid != uid:
            return False
        del self._where[lease]
        entry.holders.pop(lease, None)
        return True

    def release_subscriber(self, subscriber: str) -> int:
        """The holder's event stream closed (its process is gone): take its shares back now."""
        leases = self.leases_of(subscriber)
        for _, lease in leases:
            self.release(lease)
        return len(leases)

    def forget(self, keys: set[str]) -> None:
        """Keys whose rate changed or went away on a reload: their leases end (holders renew)."""
        for key in keys:
            entry = self._keys.pop(key, None)
            for lease in entry.holders if entry else ():
                self._where.pop(lease, None)

    def status(self, now: float) -> list[dict[str, Any]]:
        rows = []
        for key in sorted(self._keys):
            entry = self._keys[key]
            share, burst = self._reserved(key, entry, now)
            if not entry.holders:
                continue
            rows.append({"key": key, "holders": len(entry.holders), "leased_share": round(share, 3),
                         "leased_burst": burst, "shared_demand": round(entry.shared_demand, 3)})
        return rows

    def _reserved(self, key: str, entry: _Key, now: float) -> tuple[float, int]:
        share, burst = 0.0, 0
        for lease in list(entry.holders):
            holder = entry.holders[lease]
            holder.prune(now)
            if holder.until <= now:  # lapsed: not renewed in time
                del entry.holders[lease]
                self._where.pop(lease, None)
                continue
            s, b = holder.reserved()
            share += s
            burst += b
        return share, burst

    @staticmethod
    def _sample(entry: _Key, rate: Rate, granted: int, now: float) -> None:
        """The shared callers' demand in permits per period: what the shared bucket granted since
        the last sample, smoothed."""
        if entry.granted_total is not None and now > entry.sampled_at:
            sample = max(0, granted - entry.granted_total) / (now - entry.sampled_at) * rate.per
            entry.shared_demand += DEMAND_SMOOTHING * (sample - entry.shared_demand)
        entry.granted_total, entry.sampled_at = granted, now


def _check_room(entry: _Key, uid: int) -> None:
    if len(entry.holders) >= MAX_HOLDERS_PER_KEY:
        raise LeaseRefused("this bucket has as many lease holders as it may")
    if sum(1 for h in entry.holders.values() if h.uid == uid) >= MAX_HOLDERS_PER_UID:
        raise LeaseRefused("this uid holds as many leases of this bucket as it may")


def _margin(fair: float) -> float:
    return max(1.0, NUDGE_MARGIN * fair)


def _under(held: float, fair: float) -> bool:
    return held < fair - _margin(fair)


def _over(held: float, fair: float) -> bool:
    return held > fair + _margin(fair)
