"""The 2026-07-28 era's input rounds the gateway takes part in: a server asks for input in an
`input_required` result (`inputRequests`: elicitations, roots, sampling) instead of a request of
its own mid-call, and the client retries the original request with `inputResponses` and the
`requestState` it was given. What the gateway answers in the client's place (a declined
elicitation, the configured roots) is taken out of the result the client sees and put back into
its retry: the result carries a `requestState` token of the gateway's own instead of the server's,
and this table holds, per token, the server's own state and the gateway's answers.

Tokens are random, bound to the caller that got them (server, uid, grant), taken once, expire
after `ttl` seconds (on the clock given), and the table is bounded."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

PREFIX: Final = "mcpcreds-rs:"  # a requestState of the gateway's own
TTL: Final = 600.0  # seconds a client has to retry
MAX_ROUNDS: Final = 10_000

Holder = tuple[str, int, str | None]  # server, uid, grant id


class InputRounds:
    def __init__(self, clock: Callable[[], float], ttl: float = TTL, limit: int = MAX_ROUNDS) -> None:
        self._clock = clock
        self._ttl = ttl
        self._limit = limit
        # token -> (holder, expires at, the server's own requestState, the gateway's answers)
        self._held: OrderedDict[str, tuple[Holder, float, Any, dict[str, Any]]] = OrderedDict()

    def hold(self, holder: Holder, state: Any, answers: dict[str, Any]) -> str:
        """A token for the result the client gets, standing for `state` and `answers`."""
        now = self._clock()
        while self._held and (len(self._held) >= self._limit or next(iter(self._held.values()))[1] <= now):
            self._held.popitem(last=False)
        token = PREFIX + secrets.token_urlsafe(18)
        self._held[token] = (holder, now + self._ttl, state, answers)
        return token

    def take(self, holder: Holder, token: str) -> tuple[Any, dict[str, Any]] | None:
        """The server's own requestState and the gateway's answers for a retry carrying `token`;
        None when it is unknown, expired, used, or another caller's."""
        held = self._held.get(token)
        if held is None or held[0] != holder:
            return None
        del self._held[token]
        if held[1] <= self._clock():
            return None
        return held[2], held[3]

    def __len__(self) -> int:
        return len(self._held)
