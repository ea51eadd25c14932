"""The elicitations the gateway relayed to a client, each with the time the client has to answer
(`elicitation_timeout_secs`): past it the gateway answers the server in the client's place
(cancel) and the request is void, so a late answer of the client's is dropped, not relayed. The
timer is scheduled through the function given (the event loop's `call_later`; a fake one in tests)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

MAX_PENDING: Final = 10_000  # elicitations awaiting an answer (past it, the oldest is voided at once)
MAX_VOIDED: Final = 10_000  # voided ones remembered, so that a late answer is recognised

Key = tuple[str, bytes | None, tuple[str, Any]]  # server, MCP session id, JSON-RPC id


class Handle(Protocol):
    def cancel(self) -> None: ...


Schedule = Callable[[float, Callable[[], None]], Handle]


class PendingElicitations:
    def __init__(self, schedule: Schedule, limit: int = MAX_PENDING, voided_limit: int = MAX_VOIDED) -> None:
        self._schedule = schedule
        self._limit = limit
        self._voided_limit = voided_limit
        self._pending: OrderedDict[Key, tuple[Handle, Callable[[], None]]] = OrderedDict()
        self._voided: OrderedDict[Key, None] = OrderedDict()

    def relayed(self, key: Key, seconds: float, void: Callable[[], None]) -> None:
        """An elicitation went to the client: unless it answers within `seconds`, `void()` runs."""
        self._voided.pop(key, None)
        old = self._pending.pop(key, None)
        if old is not None:
            old[0].cancel()
        self._pending[key] = (self._schedule(seconds, lambda: self._expire(key)), void)
        while len(self._pending) > self._limit:
            self._expire(next(iter(self._pending)))

    def answered(self, key: Key) -> bool:
        """The client answered: True to relay its answer, False when the request is void (its
        time ran out and the server has its answer already)."""
        pending = self._pending.pop(key, None)
        if pending is not None:
            pending[0].cancel()
            return True
        if key in self._voided:
            del self._voided[key]
            return False
        return True

    def _expire(self, key: Key) -> None:
        pending = self._pending.pop(key, None)
        if pending is None:
            return
        pending[0].cancel()
        self._voided[key] = None
        while len(self._voided) > self._voided_limit:
            self._voided.popitem(last=False)
        pending[1]()

    @property
    def waiting(self) -> int:
        return len(self._pending)
