"""The lease arithmetic (leases.py) on a fake clock, with exact asserts; and the shared bucket the
Limiter keeps while leases are out (buckets.py)."""

from __future__ import annotations

import random

import pytest

from mcpcreds.core.clock import FakeClock
from mcpcreds.core.rates import Rate
from mcpcreds.limits.buckets import Limiter
from mcpcreds.limits.leases import SHARED, LeaseBook, LeaseRefused, lease_seconds, max_min_fair

RATE = Rate(100, 1.0)
KEY = "mcp:a"


def test_max_min_fair_gives_small_demands_theirs_and_splits_the_rest_evenly() -> None:
    assert max_min_fair(100.0, {"a": 10.0, "b": 50.0, "c": 80.0, SHARED: 1.0}) == \
        {SHARED: 1.0, "a": 10.0, "b": 44.5, "c": 44.5}
    assert max_min_fair(100.0, {"a": 30.0, "b": 20.0}) == {"b": 20.0, "a": 30.0}  # room to spare
    assert max_min_fair(90.0, {"a": 100.0, "b": 100.0, "c": 100.0}) == {"a": 30.0, "b": 30.0, "c": 30.0}
    assert max_min_fair(10.0, {"a": -5.0, "b": 100.0}) == {"a": 0.0, "b": 10.0}


def test_lease_length_is_two_periods_from_2s_to_60s() -> None:
    assert lease_seconds(Rate(100, 1.0)) == 2.0
    assert lease_seconds(Rate(10, 0.1)) == 2.0
    assert lease_seconds(Rate(60, 10.0)) == 20.0
    assert lease_seconds(Rate(600, 60.0)) == 60.0
    assert lease_seconds(Rate(1, 86400.0)) == 60.0


def test_a_lone_holder_gets_all_but_the_shared_callers_floor() -> None:
    clock, book = FakeClock(), LeaseBook()
    terms = book.grant(KEY, RATE, None, 1e9, 1000, None, 0, clock.monotonic())
    # max-min over {holder: 100 (its demand, clipped to the burst), shared callers: 1 (the floor)}
    assert (terms.share, terms.burst, terms.seconds, terms.per) == (99.0, 49, 2.0, 1.0)
    assert terms.until == clock.monotonic() + 2.0 and terms.changed
    # the shared bucket keeps the rest: 1 permit a second, 51 at once
    shared = book.shared_rate(KEY, RATE, clock.monotonic())
    assert (shared.burst, shared.per_second) == (51, 1.0)


def test_a_holder_that_wants_little_leaves_the_rest_to_the_shared_bucket() -> None:
    clock, book = FakeClock(), LeaseBook()
    terms = book.grant(KEY, RATE, None, 20.0, 1000, None, 0, clock.monotonic())
    assert (terms.share, terms.burst) == (20.0, 10)
    shared = book.shared_rate(KEY, RATE, clock.monotonic())
    assert (shared.burst, shared.per_second) == (90, 80.0)


def test_a_holder_that_joins_gets_its_fair_share_within_two_lease_periods() -> None:
    """A takes nearly everything alone; B joins. B is told "not now" (share 0) while A's lease
    reserves it; A's renewal shrinks to half, but its old lease is kept aside until it lapses, so
    B's fair half is there from then: within two lease periods of its first ask."""
    clock, book = FakeClock(), LeaseBook()
    a = book.grant(KEY, RATE, None, 100.0, 1000, None, 0, clock.monotonic())
    clock.advance(0.5)
    joined = clock.monotonic()
    b = book.grant(KEY, RATE, None, 100.0, 1001, None, 0, clock.monotonic())
    assert (b.share, b.burst) == (0.0, 0)
    clock.advance(0.5)  # A renews at half its lease
    a = book.grant(KEY, RATE, a.lease, 100.0, 1000, None, 0, clock.monotonic())
    assert (a.share, a.burst) == (49.5, 24) and a.changed
    clock.advance(0.5)  # B asks again half a lease after its "not now": A's first lease still holds
    b = book.grant(KEY, RATE, b.lease, 100.0, 1001, None, 0, clock.monotonic())
    assert (b.share, b.burst) == (0.0, 0)
    clock.advance(0.5)  # A's first lease lapsed (it was granted 2 s ago)
    b = book.grant(KEY, RATE, b.lease, 100.0, 1001, None, 0, clock.monotonic())
    assert (b.share, b.burst) == (49.5, 24)
    assert clock.monotonic() - joined <= 2 * lease_seconds(RATE)
    shared = book.shared_rate(KEY, RATE, clock.monotonic())
    assert (shared.burst, shared.per_second) == (52, 1.0)


def test_shares_and_bursts_never_sum_past_the_rate() -> None:
    """Holders come, renew with any demand, go or lapse, in random order: at every step the
    shared bucket's rate plus every reserved share is at most the configured rate, and so are
    the bursts (the shared bucket keeps at least half of it)."""
    rng = random.Random(7)
    clock, book = FakeClock(), LeaseBook()
    live: dict[str, float] = {}  # lease -> until
    for _ in range(2000):
        now = clock.monotonic()
        action = rng.random()
        if action < 0.5 or not live:
            lease = rng.choice([*live, None]) if live else None
            terms = book.grant(KEY, RATE, lease, rng.uniform(0, 150), 1000, None, rng.randrange(10**6), now)
            if terms.burst:
                live[terms.lease] = terms.until
        elif action < 0.6:
            book.release(live.popitem()[0])
        clock.advance(rng.choice([0.0, 0.01, 0.3, 1.0]))
        now = clock.monotonic()
        live = {k: u for k, u in live.items() if u > now}
        shared = book.shared_rate(KEY, RATE, now)
        leased_share, leased_burst = book.reserved(KEY, now)
        assert shared.per_second + leased_share / RATE.per <= RATE.per_second * (1 + 1e-12)
        assert shared.burst + leased_burst <= RATE.burst
        assert shared.burst >= RATE.burst // 2 and shared.per_second > 0


def test_a_lease_not_renewed_lapses_and_its_share_comes_back() -> None:
    clock, book = FakeClock(), LeaseBook()
    terms = book.grant(KEY, RATE, None, 100.0, 1000, "sub-1", 0, clock.monotonic())
    clock.advance(terms.seconds - 0.001)
    assert book.shared_rate(KEY, RATE, clock.monotonic()).per_second == 1.0
    clock.advance(0.001)
    assert book.shared_rate(KEY, RATE, clock.monotonic()) == RATE
    assert not book.holds(KEY) and book.status(clock.monotonic()) == []
    assert book.release_subscriber("sub-1") == 0  # nothing left to release


def test_a_closed_event_stream_takes_the_share_back_at_once() -> None:
    clock, book = FakeClock(), LeaseBook()
    book.grant(KEY, RATE, None, 30.0, 1000, "sub-1", 0, clock.monotonic())
    other = book.grant(KEY, RATE, None, 30.0, 1000, "sub-2", 0, clock.monotonic())
    assert book.shared_rate(KEY, RATE, clock.monotonic()).per_second == 40.0
    assert book.release_subscriber("sub-1") == 1
    assert book.shared_rate(KEY, RATE, clock.monotonic()).per_second == 70.0
    assert not book.release(other.lease, uid=1001)  # another uid's lease is not given up
    assert book.release(other.lease, uid=1000)
    assert book.shared_rate(KEY, RATE, clock.monotonic()) == RATE


def test_the_shared_callers_demand_is_measured_from_their_grants() -> None:
    """Callers without a lease took 60 permits a second: a greedy holder gets the rest."""
    clock, book = FakeClock(), LeaseBook()
    book.grant(KEY, RATE, None, 0.0, 1000, None, 0, clock.monotonic())
    for granted in (60, 120, 180, 240, 300, 360, 420, 480, 540, 600):
        clock.advance(1.0)
        terms = book.grant(KEY, RATE, None, 100.0, 1001, None, granted, clock.monotonic())
        book.release(terms.lease)
    # smoothed demand after ten samples of 60/s: 60 * (1 - 0.5**10)
    entry = book._keys[KEY]
    assert entry.shared_demand == pytest.approx(60 * (1 - 0.5 ** 10), rel=1e-12)
    terms = book.grant(KEY, RATE, None, 100.0, 1001, None, 600, clock.monotonic() + 1.0)
    # the shared demand sample of 0 (no grants in the last second) halves it: 30
    assert terms.share == pytest.approx(100 - 60 * (1 - 0.5 ** 10) / 2, abs=1e-3)


def test_callers_waiting_in_the_shared_queue_count_as_wanting_the_whole_rate() -> None:
    """Queued callers are unmet demand, which grants alone do not show: they get an equal part."""
    clock, book = FakeClock(), LeaseBook()
    terms = book.grant(KEY, RATE, None, 100.0, 1000, None, 0, clock.monotonic(), shared_waiting=3)
    assert (terms.share, terms.burst) == (50.0, 25)
    assert book.shared_rate(KEY, RATE, clock.monotonic()).per_second == 50.0


def test_a_renewal_with_the_same_terms_is_unchanged_and_moves_no_permits() -> None:
    clock, book = FakeClock(), LeaseBook()
    first = book.grant(KEY, RATE, None, 40.0, 1000, None, 0, clock.monotonic())
    clock.advance(1.0)
    again = book.grant(KEY, RATE, first.lease, 40.0, 1000, None, 0, clock.monotonic())
    assert again.lease == first.lease and (again.share, again.burst) == (40.0, 20) and not again.changed
    stranger = book.grant(KEY, RATE, first.lease, 40.0, 1001, None, 0, clock.monotonic())
    assert stranger.lease != first.lease  # another uid cannot renew (nor shrink) someone's lease


def test_the_shared_bucket_gives_a_new_holder_its_first_permits_and_refills_slower() -> None:
    """What is leased leaves the shared bucket: its level pays the holder's first permits, and it
    refills at the rate less the leased share."""
    clock = FakeClock()
    limiter, book = Limiter(clock, {KEY: RATE}), LeaseBook()
    assert limiter.try_acquire(KEY, RATE, 60)  # 40 left
    terms = book.grant(KEY, RATE, None, 100.0, 1000, None, 60, clock.monotonic())
    shared = book.shared_rate(KEY, RATE, clock.monotonic())
    assert limiter.take_up_to(KEY, shared, terms.burst) == 40  # all there was (the burst is 49)
    assert limiter.take_up_to(KEY, shared, terms.burst) == 0
    clock.advance(3.0)
    limiter.wake(KEY)
    snapshot = limiter.snapshot(KEY)
    assert snapshot is not None and snapshot["level"] == 3.0 and snapshot["capacity"] == 51
    assert not limiter.try_acquire(KEY, shared, 4) and limiter.try_acquire(KEY, shared, 3)


def test_a_holder_spending_a_smaller_share_frees_the_larger_one_at_once() -> None:
    """A's share shrinks when B joins; once A says it spends the smaller one (`holding`), its
    first lease is no longer kept aside, and B gets its fair share before that lease lapses."""
    clock, book = FakeClock(), LeaseBook()
    a = book.grant(KEY, RATE, None, 100.0, 1000, None, 0, clock.monotonic())
    b = book.grant(KEY, RATE, None, 100.0, 1001, None, 0, clock.monotonic())
    assert b.share == 0.0
    clock.advance(0.1)
    a = book.grant(KEY, RATE, a.lease, 100.0, 1000, None, 0, clock.monotonic(), holding=(99.0, 49))
    assert (a.share, a.burst) == (49.5, 24)
    assert book.reserved(KEY, clock.monotonic()) == (99.0, 49)  # A may still spend 99 until it has this
    clock.advance(0.1)
    a = book.grant(KEY, RATE, a.lease, 100.0, 1000, None, 0, clock.monotonic(), holding=(49.5, 24))
    assert book.reserved(KEY, clock.monotonic()) == (49.5, 24)
    b = book.grant(KEY, RATE, b.lease, 100.0, 1001, None, 0, clock.monotonic())
    assert (b.share, b.burst) == (49.5, 24)
    # a `holding` that matches none of its leases keeps them all (the sidecar cannot tell)
    a = book.grant(KEY, RATE, a.lease, 10.0, 1000, None, 0, clock.monotonic(), holding=(1.0, 1))
    assert book.reserved(KEY, clock.monotonic()) == (99.0, 48)


def test_a_joining_holder_gets_its_fair_share_at_once_through_nudges() -> None:
    """A holds nearly everything; B joins and is told "not now", and A is told to renew. A's
    renewal halves its share (its old lease still kept aside: it may spend it until it hears),
    and its next renewal says it spends the half: that frees the rest, and B is told to renew.
    All at the same instant: nobody waits for a renewal period."""
    clock, told = FakeClock(), []
    book = LeaseBook(on_nudge=lambda key, subs: told.append((key, subs)))
    now = clock.monotonic()
    a = book.grant(KEY, RATE, None, 1e9, 1000, "sub-a", 0, now)
    assert (a.share, a.burst) == (99.0, 49) and told == []
    b = book.grant(KEY, RATE, None, 1e9, 1001, "sub-b", 0, now)
    assert (b.share, b.burst) == (0.0, 0) and told == [(KEY, ["sub-a"])]
    a = book.grant(KEY, RATE, a.lease, 1e9, 1000, "sub-a", 0, now, holding=(99.0, 49))
    assert (a.share, a.burst) == (49.5, 24) and book.reserved(KEY, now) == (99.0, 49)
    assert told == [(KEY, ["sub-a"])]  # B could get nothing more yet: not told
    a = book.grant(KEY, RATE, a.lease, 1e9, 1000, "sub-a", 0, now, holding=(49.5, 24))
    assert book.reserved(KEY, now) == (49.5, 24) and told[1:] == [(KEY, ["sub-b"])]
    b = book.grant(KEY, RATE, b.lease, 1e9, 1001, "sub-b", 0, now)
    assert (b.share, b.burst) == (49.5, 24) and len(told) == 2


def test_a_holder_is_told_once_until_it_renews() -> None:
    clock, told = FakeClock(), []
    book = LeaseBook(on_nudge=lambda key, subs: told.append(subs))
    now = clock.monotonic()
    a = book.grant(KEY, RATE, None, 1e9, 1000, "sub-a", 0, now)
    book.grant(KEY, RATE, None, 1e9, 1001, "sub-b", 0, now)
    book.grant(KEY, RATE, None, 1e9, 1002, "sub-c", 0, now)  # A is still over its share, told already
    assert told == [["sub-a"]]
    book.grant(KEY, RATE, a.lease, 1e9, 1000, "sub-a", 0, now)  # A renewed (still holding its 99)
    book.grant(KEY, RATE, None, 1e9, 1003, "sub-d", 0, now)
    assert told == [["sub-a"], ["sub-a"]]


def test_a_caller_without_a_lease_recalls_the_holders_over_their_part() -> None:
    """A holds 99 of 100. A caller without a lease asks: A is told to renew (once per eighth of a
    lease, however often callers ask); the sidecar's own reading of the rate recalls nobody. A's
    renewal sees the caller waiting: the shared callers get an equal part."""
    clock, told = FakeClock(), []
    book = LeaseBook(on_nudge=lambda key, subs: told.append(subs))
    a = book.grant(KEY, RATE, None, 1e9, 1000, "sub-a", 0, clock.monotonic())
    assert book.shared_rate(KEY, RATE, clock.monotonic(), asking=False).per_second == 1.0 and told == []
    assert book.shared_rate(KEY, RATE, clock.monotonic()).per_second == 1.0
    assert told == [["sub-a"]]
    book.shared_rate(KEY, RATE, clock.monotonic())
    a = book.grant(KEY, RATE, a.lease, 1e9, 1000, "sub-a", 0, clock.monotonic(), shared_waiting=1,
                   holding=(99.0, 49))
    assert (a.share, a.burst) == (50.0, 25) and told == [["sub-a"]]
    book.grant(KEY, RATE, a.lease, 1e9, 1000, "sub-a", 0, clock.monotonic(), shared_waiting=1,
               holding=(50.0, 25))
    assert book.shared_rate(KEY, RATE, clock.monotonic()).per_second == 50.0
    assert told == [["sub-a"]]  # the shared part is what it would get wanting all: nobody recalled
    # later the shared callers' demand fell (no waiters, no grants): A grows back; a new ask
    # recalls it again, but only an eighth of a lease after the last recall
    clock.advance(0.2)
    a = book.grant(KEY, RATE, a.lease, 1e9, 1000, "sub-a", 0, clock.monotonic(), holding=(50.0, 25))
    assert a.share == 99.0
    book.grant(KEY, RATE, a.lease, 1e9, 1000, "sub-a", 0, clock.monotonic(), holding=(99.0, 49))
    book.shared_rate(KEY, RATE, clock.monotonic())
    assert told == [["sub-a"]]
    clock.advance(0.05)
    book.shared_rate(KEY, RATE, clock.monotonic())
    assert told == [["sub-a"], ["sub-a"]]


def test_a_holder_saying_it_spends_the_rounded_share_frees_the_larger_one() -> None:
    """The answer gives the share to 6 decimals (rounded down): a renewal holding that rounded
    share is the lease it was given, and frees the larger one before it."""
    clock, book = FakeClock(), LeaseBook()
    now = clock.monotonic()
    a = book.grant(KEY, RATE, None, 1e9, 1000, None, 0, now)
    for uid in range(1001, 1007):
        book.grant(KEY, RATE, None, 1e9, uid, None, 0, now)
    a = book.grant(KEY, RATE, a.lease, 1e9, 1000, None, 0, now, holding=(99.0, 49))
    assert (round(a.share, 9), a.burst) == (14.142857143, 7) and book.reserved(KEY, now) == (99.0, 49)
    book.grant(KEY, RATE, a.lease, 1e9, 1000, None, 0, now, holding=(14.142857, 7))
    assert book.reserved(KEY, now) == (a.share, 7)  # the six others got nothing yet: only A's


def test_a_holders_bucket_is_filled_to_the_burst_it_would_have_were_the_shared_callers_to_want_all() -> None:
    """A lone holder gets 99 of 100 (burst 49), but its bucket is filled from the shared one only
    to 25 (half of 50, its part against shared callers wanting everything): the others who join
    cut it soon, and what a bucket holds above its new burst is lost."""
    clock, book = FakeClock(), LeaseBook()
    a = book.grant(KEY, RATE, None, 1e9, 1000, None, 0, clock.monotonic())
    assert (a.share, a.burst, book.fair_burst(KEY, a.lease)) == (99.0, 49, 25)
    b = book.grant(KEY, RATE, None, 20.0, 1001, None, 0, clock.monotonic())
    assert book.fair_burst(KEY, b.lease) == 10 and book.fair_burst(KEY, a.lease) == 20  # 40 of 100 - 20


def test_a_shared_state_holder_is_kept_while_the_shared_state_answers() -> None:
    """On a shared state a holder is admitted, the lease script runs (an await), then its grant is
    noted: another lease granted meanwhile must not prune the one admitted (which left a share
    kept aside in Redis for nobody, and a 500 for its holder)."""
    clock, book = FakeClock(), LeaseBook()
    a = book.admit(KEY, None, 1000, "sub-a", clock.monotonic(), 2.0)
    clock.advance(0.01)
    book.admit(KEY, None, 1001, "sub-b", clock.monotonic(), 2.0)
    terms = book.note(a, 50.0, 25, 1.0, 2.0, clock.monotonic())
    assert terms is not None and (terms.lease, terms.share, terms.burst) == (a, 50.0, 25)
    assert book.release_subscriber("sub-a") == 1
    assert book.note(a, 50.0, 25, 1.0, 2.0, clock.monotonic()) is None  # released meanwhile


def test_one_uid_cannot_take_every_holders_place() -> None:
    """A bucket has room for 256 holders; one uid may hold 64 of them, so other uids (on this
    sidecar or, on a shared state, any) still get theirs."""
    clock, book = FakeClock(), LeaseBook()
    for _ in range(64):
        book.admit(KEY, None, 1000, None, clock.monotonic(), 2.0)
    with pytest.raises(LeaseRefused):
        book.admit(KEY, None, 1000, None, clock.monotonic(), 2.0)
    for _ in range(64):  # the memory state's grants alike
        book.grant("other-key", RATE, None, 1e9, 1000, None, 0, clock.monotonic())
    with pytest.raises(LeaseRefused):
        book.grant("other-key", RATE, None, 1e9, 1000, None, 0, clock.monotonic())
    book.admit(KEY, None, 1001, None, clock.monotonic(), 2.0)  # another uid still can


def test_a_share_under_the_least_worth_holding_is_not_granted_and_the_asker_is_not_kept() -> None:
    """`least` (what `lease="auto"` asks for): a holder whose fair part is under it gets "not now",
    is not kept (its demand does not shrink anyone's part) and moves nothing from the shared
    bucket; one whose fair part covers it gets its share as before."""
    clock, book = FakeClock(), LeaseBook()
    rate = Rate(20, 1.0)
    terms = book.grant(KEY, rate, None, 1e9, 1000, None, 0, clock.monotonic(), least=32.0)
    assert (terms.share, terms.burst) == (0.0, 0)
    assert not book.holds(KEY) and book.key_of(terms.lease) is None
    assert book.shared_rate(KEY, rate, clock.monotonic()) == rate  # the whole rate and burst, shared
    big = book.grant(KEY, Rate(1000, 1.0), None, 1e9, 1000, None, 0, clock.monotonic(), least=32.0)
    assert (big.share, big.burst) == (999.0, 499)


def test_a_holder_that_holds_a_share_is_renewed_whatever_the_least() -> None:
    """`least` gates taking a lease, not keeping one: a holder whose fair part fell under it (others
    joined) is renewed with that part, so what it holds is never dropped mid-lease."""
    clock, book = FakeClock(), LeaseBook()
    a = book.grant(KEY, RATE, None, 1e9, 1000, None, 0, clock.monotonic(), least=32.0)
    assert a.share == 99.0
    b = book.grant(KEY, RATE, None, 1e9, 1001, None, 0, clock.monotonic(), least=0.0)
    c = book.grant(KEY, RATE, None, 1e9, 1002, None, 0, clock.monotonic(), least=0.0)
    assert b.lease != c.lease
    clock.advance(1.0)
    renewed = book.grant(KEY, RATE, a.lease, 1e9, 1000, None, 0, clock.monotonic(), least=40.0,
                         holding=(a.share, a.burst))
    assert renewed.lease == a.lease and 0.0 < renewed.share < 40.0  # its fair third, under `least`


def test_a_holder_refused_by_the_shared_bucket_asks_it_again_when_it_said_and_within_a_period() -> None:
    from mcpcreds.client.lease_terms import BORROW_SPACING, RETRY_AFTER_FAILURE, borrow_again_at

    assert borrow_again_at(10.0, 0.3, 1.0) == 10.3  # when the shared bucket said it would have one
    assert borrow_again_at(10.0, 0.0, 1.0) == 10.0 + BORROW_SPACING  # never a refused ask per request
    assert borrow_again_at(10.0, 45.0, 1.0) == 11.0  # within a period: its stock may come back sooner
    assert borrow_again_at(10.0, None, 1.0) == 10.0 + RETRY_AFTER_FAILURE  # the sidecar failed
