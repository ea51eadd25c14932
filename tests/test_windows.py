"""The windows check (tests/windows.py) against its definition, and its cost on a big run."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.windows import SLACK, overfull_windows

Grants = list[tuple[float, float]]


def overfull_windows_by_definition(grants: Sequence[tuple[float, float]], burst: int, per_second: float
                                   ) -> list[tuple[float, int]]:
    """The check as it was written first, in O(n³): every window [start, end] from a sent time to
    an answered time, closed at both ends, and the grants whose (sent, answered) is inside it."""
    found = set()
    for start, _ in grants:
        for _, end in grants:
            inside = sum(1 for sent, answered in grants if start <= sent and answered <= end)
            if end >= start and inside > burst + per_second * (end - start) + SLACK:
                found.add((round(end - start, 3), inside))
    return sorted(found)


def test_a_grant_counts_only_where_its_whole_request_is_inside() -> None:
    assert overfull_windows([(0.0, 0.01)] * 3, burst=2, per_second=1.0) == [(0.01, 3)]
    assert overfull_windows([(0.0, 0.01)] * 2 + [(1.0, 1.01)], burst=2, per_second=1.0) == []
    # three grants whose requests were in flight from 0 to 0.5 s each: 3 > 2 + 0.5, in that window
    assert overfull_windows([(0.0, 0.5)] * 3, burst=2, per_second=1.0) == [(0.5, 3)]
    # the same grants, each in flight for 2 s: they may have been made a second apart
    assert overfull_windows([(0.0, 2.0)] * 3, burst=2, per_second=1.0) == []
    assert overfull_windows([], burst=0, per_second=1.0) == []


def test_a_window_is_closed_at_both_ends() -> None:
    # a grant sent at the window's start and one answered at its end are inside it
    assert overfull_windows([(0.0, 0.0), (0.0, 1.0), (1.0, 1.0)], burst=2, per_second=0.0) == [(1.0, 3)]
    # exactly what the bucket allows in [0, 1] (2 + 1 x 1 s) is not over; one more is
    assert overfull_windows([(0.0, 1.0)] * 3, burst=2, per_second=1.0) == []
    assert overfull_windows([(0.0, 1.0)] * 4, burst=2, per_second=1.0) == [(1.0, 4)]


# times on a grid of quarter seconds make ties and windows exactly at the bucket's bound; a large
# offset (the monotonic clock of a machine up for days) puts the rounding of the floats to test
quarters = st.integers(0, 12).map(lambda k: k / 4)
durations = st.one_of(st.integers(-1, 6).map(lambda k: k / 4),  # answered before sent: still defined
                      st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False))
starts = st.one_of(quarters, st.floats(0.0, 3.0, allow_nan=False, allow_infinity=False))


@st.composite
def runs(draw: Callable[..., Any]) -> tuple[Grants, int, float]:
    offset = draw(st.sampled_from([0.0, 0.125, 86_400.0 * 30 + 0.3]))
    grants = []
    for _ in range(draw(st.integers(0, 14))):
        sent = offset + draw(starts)
        grants.append((sent, sent + draw(durations)))
        if draw(st.booleans()):
            grants.append(grants[-1])  # the same interval twice: a tie in both times
    rate = draw(st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0, 100.0]),
                          st.floats(0.0, 20.0, allow_nan=False, allow_infinity=False)))
    return grants, draw(st.integers(0, 8)), rate


@settings(max_examples=400, deadline=None, database=None)
@given(runs())
@example(([(0.0, 1.0)] * 4, 2, 1.0))  # one over the bound, at a window's edge
@example(([(0.0, 1.0)] * 3, 2, 1.0))  # at the bound exactly: not over
@example(([(0.0, 0.0), (0.0, 1.0), (1.0, 1.0)], 2, 0.0))
@example(([(1.0, 0.5), (0.0, 0.25), (0.0, 0.25)], 1, 0.0))  # a grant answered before it was sent
def test_the_check_agrees_with_its_definition(run: tuple[Grants, int, float]) -> None:
    grants, burst, per_second = run
    assert overfull_windows(grants, burst, per_second) == overfull_windows_by_definition(grants, burst, per_second)


def traced_lines(call: Callable[[], object]) -> int:
    """The Python lines `call` runs (every iteration of every loop and comprehension is some)."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(previous)
    return count


def bucket_run(count: int, burst: int, per_second: float, flight: float = 0.004) -> Grants:
    """`count` grants exactly as a bucket starting full makes them, the first at 10⁶ s, each
    request in flight `flight` s either side of its grant: no window is over, some are at the
    bound but for the 2 x `flight` the requests took."""
    grants = []
    for i in range(count):
        at = 1e6 + max(0, i - burst + 1) / per_second
        grants.append((at - flight, at + flight))
    return grants


def test_five_thousand_grants_take_n_log_n_steps_not_n_squared() -> None:
    """A 50 s run at 100/s: checked in some n log n steps (about 17 lines per n log₂ n). The
    definition takes n³ (1.25 x 10¹¹ here; 10⁹ for the 1,100 grants of a 10 s run, longer than the
    test timeout on a busy machine), anything quadratic n² = 2.5 x 10⁷: both far over the bound."""
    n = 5000
    grants = bucket_run(n, burst=100, per_second=100.0)
    budget = 40 * n * math.log2(n)  # 2.5 x 10⁶ lines
    assert traced_lines(lambda: overfull_windows(grants, 100, 100.0)) < budget < n * n / 10
    assert overfull_windows(grants, 100, 100.0) == []
    # one grant too many at 4,850: each window from the start to an end at or after it is over
    extra = grants[4850]
    over = [*grants, extra]
    found: list[tuple[float, int]] = []
    assert traced_lines(lambda: found.extend(overfull_windows(over, 100, 100.0))) < budget
    first = grants[0][0]
    assert found == sorted((round(answered - first, 3), i + 2) for i, (_, answered) in enumerate(grants) if i >= 4850)
    # and the definition's own cost, on a run small enough for it: n³
    small = bucket_run(40, burst=10, per_second=10.0)
    assert traced_lines(lambda: overfull_windows_by_definition(small, 10, 10.0)) > 40 ** 3
