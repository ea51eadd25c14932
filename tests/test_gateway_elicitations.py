"""The table of elicitations relayed to clients (mcpcreds.protocol.elicitations), on a fake timer:
an answer in time is relayed, one past its time is dropped (the server had `cancel`), bounded."""

from __future__ import annotations

from collections.abc import Callable

from mcpcreds.protocol.elicitations import PendingElicitations


class FakeTimers:
    def __init__(self) -> None:
        self.due: list[tuple[float, Callable[[], None], list[bool]]] = []

    def schedule(self, delay: float, fire: Callable[[], None]) -> FakeTimers.Handle:
        cancelled = [False]
        self.due.append((delay, fire, cancelled))
        return FakeTimers.Handle(cancelled)

    def run(self) -> None:
        for _, fire, cancelled in list(self.due):
            if not cancelled[0]:
                fire()

    class Handle:
        def __init__(self, cancelled: list[bool]) -> None:
            self.cancelled = cancelled

        def cancel(self) -> None:
            self.cancelled[0] = True


KEY = ("crm", b"session-1", ("n", 7))


def test_an_answer_in_time_is_relayed_and_its_timer_stopped() -> None:
    timers, voided = FakeTimers(), []
    table = PendingElicitations(timers.schedule)
    table.relayed(KEY, 120, lambda: voided.append(KEY))
    assert timers.due[0][0] == 120 and table.waiting == 1
    assert table.answered(KEY) is True
    timers.run()
    assert voided == [] and table.waiting == 0


def test_past_its_time_the_request_is_void_and_a_late_answer_dropped_once() -> None:
    timers, voided = FakeTimers(), []
    table = PendingElicitations(timers.schedule)
    table.relayed(KEY, 1, lambda: voided.append(KEY))
    timers.run()
    assert voided == [KEY]
    assert table.answered(KEY) is False  # the server was told cancel: not relayed
    assert table.answered(KEY) is True  # an answer no elicitation is waiting for is the client's own business
    assert table.answered(("crm", b"session-2", ("n", 7))) is True  # another session's id 7


def test_the_table_is_bounded_the_oldest_voided_first() -> None:
    timers, voided = FakeTimers(), []
    table = PendingElicitations(timers.schedule, limit=2, voided_limit=1)
    for n in range(4):
        table.relayed(("crm", None, ("n", n)), 60, lambda n=n: voided.append(n))  # type: ignore[misc]
    assert voided == [0, 1] and table.waiting == 2
    assert table.answered(("crm", None, ("n", 0))) is True  # forgotten: the voided table holds one
    assert table.answered(("crm", None, ("n", 1))) is False
