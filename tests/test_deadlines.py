"""net.deadlines: the waits of a relayed call bounded on one loop timer, on a real event loop
(deadlines a few tens of milliseconds out; asserted only in the order they come due, and bounds)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from mcpcreds.net.deadlines import SLACK, Deadlines


async def test_each_wait_times_out_at_its_own_deadline_in_order_and_an_ended_one_never() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    start = loop.time()
    ended: list[str] = []
    due = {"late": 0.5, "first": 0.02, "ends in time": 0.04, "last": 0.6}
    futures = {name: loop.create_future() for name in due}
    def note(name: str) -> Callable[[object], None]:
        return lambda _: ended.append(name)

    for name, future in futures.items():  # a later one first, then earlier ones: the timer is set again
        deadlines.bound(future, start + due[name])
        future.add_done_callback(note(name))
    futures["ends in time"].set_result(None)  # no TimeoutError for it, ever
    with pytest.raises(TimeoutError):
        await futures["first"]
    assert not futures["late"].done()  # timed out on its own: not when a later deadline came due
    with pytest.raises(TimeoutError):
        await futures["late"]
    assert loop.time() - start >= 0.5 - 0.002  # not before its deadline (a timer's millisecond aside)
    assert ended == ["ends in time", "first", "late"] and not futures["last"].done()
    with pytest.raises(TimeoutError):
        await futures["last"]
    assert futures["ends in time"].exception() is None
    assert deadlines.pending() == 0 and deadlines._timer is None  # nothing waits: no timer is left


async def test_waits_that_end_in_time_leave_a_bounded_heap_and_no_timer() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    far = loop.time() + 3600.0
    for _ in range(20 * SLACK):  # each ends at once, the way a relayed call's waits mostly do
        future = loop.create_future()
        deadlines.bound(future, far)
        future.set_result(None)
    assert len(deadlines._heap) <= SLACK + 1  # compacted: not one entry per wait ever made
    waiting = loop.create_future()
    deadlines.bound(waiting, loop.time() + 0.01)  # earlier than the hour: the timer is set again
    with pytest.raises(TimeoutError):
        await waiting
