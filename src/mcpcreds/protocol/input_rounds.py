"""The 2026-07-28 era's input rounds the gateway takes part in: a server asks for input in an
`input_required` result (`inputRequests`: elicitations, roots, sampling) instead of a request of
its own mid-call, and the client retries the original request with `inputResponses` and the
`requestState` it was given. What the gateway answers in the client's place (a declined
elicitation, the configured roots) is taken out of the result the client sees and put back into
its retry: the result carries a `requestState` token of the gateway's own instead of the server's,
and this table holds, per token, the server's own state and the gateway's answers. Every
`input_required` result the gateway relays gets a token, whether or not the gateway answered part
of it: the retry that carries it is known for the continuation of a request that took its permit,
and takes none (`put_back` names them).

Tokens are random, bound to the caller that got them (server, uid, grant), taken once, expire
after `ttl` seconds (on the clock given), and the table is bounded (in tokens, and in the bytes
of the states it holds: the oldest go first)."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from . import jsonrpc

PREFIX: Final = "mcpcreds-rs:"  # a requestState of the gateway's own
TTL: Final = 600.0  # seconds a client has to retry
MAX_ROUNDS: Final = 10_000
MAX_HELD_BYTES: Final = 64 * 1024 * 1024  # the servers' requestState strings held, all together

Holder = tuple[str, int, str | None]  # server, uid, grant id


class InputRounds:
    def __init__(self, clock: Callable[[], float], ttl: float = TTL, limit: int = MAX_ROUNDS,
                 max_bytes: int = MAX_HELD_BYTES) -> None:
        self._clock = clock
        self._ttl = ttl
        self._limit = limit
        self._max_bytes = max_bytes
        self._bytes = 0
        # token -> (holder, expires at, the server's own requestState, the gateway's answers)
        self._held: OrderedDict[str, tuple[Holder, float, Any, dict[str, Any]]] = OrderedDict()

    def hold(self, holder: Holder, state: Any, answers: dict[str, Any]) -> str:
        """A token for the result the client gets, standing for `state` and `answers`."""
        now = self._clock()
        size = _size(state)
        while self._held and (len(self._held) >= self._limit or self._bytes + size > self._max_bytes
                              or next(iter(self._held.values()))[1] <= now):
            self._bytes -= _size(self._held.popitem(last=False)[1][2])
        token = PREFIX + secrets.token_urlsafe(18)
        self._held[token] = (holder, now + self._ttl, state, answers)
        self._bytes += size
        return token

    def take(self, holder: Holder, token: str) -> tuple[Any, dict[str, Any]] | None:
        """The server's own requestState and the gateway's answers for a retry carrying `token`;
        None when it is unknown, expired, used, or another caller's."""
        held = self._held.get(token)
        if held is None or held[0] != holder:
            return None
        del self._held[token]
        self._bytes -= _size(held[2])
        if held[1] <= self._clock():
            return None
        return held[2], held[3]

    def __len__(self) -> int:
        return len(self._held)


def _size(state: Any) -> int:
    return len(state) if isinstance(state, str) else 0


MAX_INPUT_REQUESTS: Final = 64  # in one input_required result (past it, left to the client as sent)
# a request of the server's: (the result given in the client's place, or None; the params it sees)
Policy = Callable[[Any, dict[str, Any]], tuple[dict[str, Any] | None, dict[str, Any]]]


def take_out(result: dict[str, Any], rounds: InputRounds, holder: Holder, policy: Policy) -> dict[str, Any]:
    """An `input_required` result as the client sees it: what `policy` answers is taken out and kept
    under a `requestState` token of the gateway's own, to be put back into the client's retry (a
    result the gateway answers nothing of gets a token too: see the module doc)."""
    requests = result.get("inputRequests", {})
    state = result.get("requestState")
    if not isinstance(requests, dict) or len(requests) > MAX_INPUT_REQUESTS or not isinstance(
            state, str | None):
        return result
    answers: dict[str, Any] = {}
    shown: dict[str, Any] = {}
    for key, asked in requests.items():
        params = asked.get("params", {}) if isinstance(asked, dict) else None
        if not isinstance(asked, dict) or not isinstance(params, dict):
            shown[key] = asked
            continue
        answer, relayed = policy(asked.get("method"), params)
        if answer is not None:
            answers[key] = answer
        else:
            shown[key] = asked if relayed is params else {**asked, "params": relayed}
    token = rounds.hold(holder, state, answers)
    out = {k: v for k, v in result.items() if k not in ("inputRequests", "requestState")}
    if shown:
        out["inputRequests"] = shown
    out["requestState"] = token
    return out


def put_back(out: jsonrpc.Outgoing, rounds: InputRounds,
             holder: Holder) -> tuple[jsonrpc.Outgoing, frozenset[jsonrpc.IdKey]]:
    """The client's retries with what was answered in its place put back (and the server's own
    `requestState`), and the ids of those retries; JsonRpcError for a token of the gateway's that
    is not (or no longer) the holder's."""
    def resumed(params: dict[str, Any]) -> dict[str, Any]:
        held = rounds.take(holder, params["requestState"])
        if held is None:
            raise jsonrpc.JsonRpcError(jsonrpc.INVALID_PARAMS, "Invalid params: requestState is unknown, "
                                       "expired or already used: send the request again without it")
        state, answers = held
        given = params.get("inputResponses")
        merged = {**(given if isinstance(given, dict) else {}), **answers}
        params = {k: v for k, v in params.items() if k != "requestState"}
        if state is not None:
            params["requestState"] = state
        return {**params, "inputResponses": merged}

    def ours(params: dict[str, Any]) -> bool:
        return isinstance(params.get("requestState"), str) and params["requestState"].startswith(PREFIX)
    retries = frozenset(jsonrpc.id_key(m.id) for m in out.requests
                        if isinstance(m.raw.get("params"), dict) and ours(m.raw["params"]))
    return jsonrpc.rewrite_params(out, ours, resumed), retries
