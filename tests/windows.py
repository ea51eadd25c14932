"""The windows check of the rate and lease tests: did any window of time hold more grants than a
bucket allows? Each grant is known only by the (sent, answered) times of its request; the bucket
made it somewhere in between.

`overfull_windows` is O((n + k) log n) for n grants and k overfull windows (k is 0 when a test
passes). It gives the same answer as the definition, which tries every window [start, end] with
`start` a sent time and `end` an answered time and counts the grants whose whole interval is
inside, O(n³): about 10⁹ steps for the 1,100 grants of a 10 s run at 100/s, which took more than
the 120 s test timeout on a busy machine. tests/test_windows.py keeps that definition and checks
that both agree.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

SLACK = 1e-6  # float rounding in the sidecar's arithmetic (its own grant slack is 1e-9 s)


def overfull_windows(grants: Sequence[tuple[float, float]], burst: int, per_second: float
                     ) -> list[tuple[float, int]]:
    """Windows that held more grants than a bucket starting full may make: `burst` plus what it
    refills in the window. Each grant is known by the (sent, answered) times of its request, the
    sidecar made it in between; a grant counts in a window only if that whole interval is inside
    it, so the count never exceeds the true one. Returns (window length, grants) of each.

    A window is closed, [start, end]: `start` one of the sent times, `end` one of the answered
    times, end >= start; it is overfull if inside > burst + per_second * (end - start) + SLACK,
    with `inside` the number of grants with start <= sent and answered <= end. (Times are finite.)

    How: the starts are swept from the latest down, and each grant is added as its sent time is
    reached: it then counts in every window ending at or after its answered time, a +1 on a suffix
    of the sorted answered times. A segment tree over the answered times e keeps
    count(e) - per_second * e and its maximum per subtree, so the windows from a start that may be
    overfull are found by going down only into subtrees whose maximum is above the start's
    threshold: O(log n) per start and per window found. That search is done in floats with a
    margin far above their rounding and without SLACK, so it finds a superset of the overfull
    windows; each window it finds is then decided by the definition's own expression on its exact
    (integer) count, so the answer is the definition's to the last float."""
    if not grants:
        return []
    ends = sorted({answered for _, answered in grants})
    size = 1
    while size < len(ends):
        size *= 2
    times = [t for grant in grants for t in grant]
    origin = min(times)  # times from the earliest: the search's floats stay small
    margin = 1e-9 * (1.0 + abs(burst) + abs(per_second) * (max(times) - origin) + len(grants))
    # leaf j: the window ending at ends[j]; padding leaves can never be overfull
    weight = [-per_second * (end - origin) for end in ends] + [-float("inf")] * (size - len(ends))
    tag = [0] * (2 * size)  # grants added to every leaf under the node (exact: ints)
    best = [0.0] * size + weight  # max over the node's leaves of count - per_second * (end - origin)
    for node in range(size - 1, 0, -1):
        best[node] = max(best[2 * node], best[2 * node + 1])

    def add_from(first: int) -> None:
        """+1 to the leaves first.. (a grant answered at ends[first] counts in windows ending there on)."""
        low, high = first + size, 2 * size
        while low < high:  # the canonical nodes covering [low, high): high is a power of 2, never odd
            if low & 1:
                tag[low] += 1
                best[low] = tag[low] + (weight[low - size] if low >= size else
                                        max(best[2 * low], best[2 * low + 1]))
                low += 1
            low //= 2
            high //= 2
        node = (first + size) // 2
        while node:
            best[node] = tag[node] + max(best[2 * node], best[2 * node + 1])
            node //= 2

    found: set[tuple[float, int]] = set()
    by_sent = sorted(grants, key=lambda grant: grant[0], reverse=True)
    i = 0
    while i < len(by_sent):
        start = by_sent[i][0]
        while i < len(by_sent) and by_sent[i][0] == start:  # every grant sent at or after `start`
            add_from(bisect_left(ends, by_sent[i][1]))
            i += 1
        low = bisect_left(ends, start)  # the windows from `start`: end >= start
        threshold = burst - per_second * (start - origin) - margin
        stack = [(1, 0, size, 0)]  # node, its leaves [left, right), the grants its ancestors add
        while stack:
            node, left, right, above = stack.pop()
            if right <= low or above + best[node] <= threshold:
                continue
            if node >= size:  # a window that may be overfull: the definition decides
                end, inside = ends[left], above + tag[node]
                if end >= start and inside > burst + per_second * (end - start) + SLACK:
                    found.add((round(end - start, 3), inside))
                continue
            middle = (left + right) // 2
            stack.append((2 * node, left, middle, above + tag[node]))
            stack.append((2 * node + 1, middle, right, above + tag[node]))
    return sorted(found)
