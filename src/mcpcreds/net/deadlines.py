"""Waits that end in TimeoutError at a deadline, all kept by one loop timer (`Deadlines`).

A relayed call waits several times for the upstream (its answer's head, each piece of its body,
the end of its stream), each bounded. A loop timer per wait costs its setting and its cancelling
(about 2 µs together on uvloop, more than the rest of a short wait's work); here a wait is an
entry in a heap, and the one timer is set for the earliest deadline, again only when a wait
comes with an earlier one. A wait that ended before its deadline is left in the heap (nothing to
cancel) and dropped when it reaches the top, or when the heap is compacted (it never grows past
twice the waits still pending, plus `SLACK`). So the timer may still fire once for waits that all
ended (at the earliest of their deadlines, at most the longest timeout away); it is then not set
again.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Final

SLACK: Final = 1024  # ended waits the heap may hold beyond the pending ones before it is compacted
# a loop timer is set to the millisecond: a wait this close to its deadline when the timer fires
# has its TimeoutError then, not after a timer set again for the rest (which could fire at once)
RESOLUTION: Final = 0.001


class Deadlines:
    """TimeoutError for each future still pending at its deadline (the loop's clock)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties: first come, first timed out (futures do not compare)
        self._timer: asyncio.TimerHandle | None = None
        self._armed = 0.0  # when the timer fires (while there is one)
        self._compact_at = SLACK

    def bound(self, future: asyncio.Future[None], deadline: float) -> None:
        """`future` gets TimeoutError at `deadline` unless it is done by then."""
        heap = self._heap
        heapq.heappush(heap, (deadline, next(self._order), future))
        if self._timer is None or deadline < self._armed:
            self._arm(deadline)
        if len(heap) > self._compact_at:
            self._compact()

    def pending(self) -> int:
        """The waits not ended yet (for tests and status)."""
        return sum(1 for _, _, future in self._heap if not future.done())

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = when
        self._timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        heap = self._heap
        now = self.loop.time() + RESOLUTION
        while heap and (heap[0][0] <= now or heap[0][2].done()):
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_exception(TimeoutError())
        if heap:
            self._arm(heap[0][0])

    def _compact(self) -> None:
        self._heap = [entry for entry in self._heap if not entry[2].done()]
        heapq.heapify(self._heap)
        self._compact_at = 2 * len(self._heap) + SLACK
        if not self._heap and self._timer is not None:
            self._timer.cancel()
            self._timer = None
