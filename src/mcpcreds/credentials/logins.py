"""The login cache: one login per cache key, single flight, refresh ahead, stale-if-error."""

from __future__ import annotations

import asyncio
import os
import random
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from cachetools import TLRUCache

from ..config.model import Target
from ..core.clock import Clock
from ..core.logs import get_logger
from ..errors import McpcredsError, TokenEndpointError
from ..telemetry import switch as traces
from .tokens import Token, backoff_delay, refresh_at, usable_until

MAX_LOGINS: Final = 10_000
_log = get_logger("logins")

Fetch = Callable[[Target], Awaitable[Token]]


@dataclass
class _KeyState:
    fetch: asyncio.Task[Token] | None = None
    failures: int = 0
    retry_not_before: float = 0.0
    last_error: McpcredsError | None = None
    token_requests: int = 0
    renewals: int = 0
    shared_fetches: int = 0
    last_used: float = 0.0
    jitter: float = 0.0
    timer: asyncio.TimerHandle | None = None


class LoginCache:
    def __init__(self, fetch: Fetch, clock: Clock, refresh_ahead: float,
                 rng: random.Random | None = None) -> None:
        self._fetch = fetch
        self.clock = clock
        self.refresh_ahead = refresh_ahead
        self.rng = rng or random.Random()
        # a login leaves the cache by itself once it is no longer safe to hand out
        self._tokens: TLRUCache[str, Token] = TLRUCache(
            MAX_LOGINS, ttu=lambda _key, token, _now: usable_until(token), timer=clock.time)
        self._states: dict[str, _KeyState] = {}
        # the counters of forgotten keys: Prometheus counters never go down while the process runs
        self._counted: dict[str, tuple[int, int, int]] = {}

    def _state(self, key: str) -> _KeyState:
        state = self._states.get(key)
        if state is None:
            requests, renewals, shared = self._counted.pop(key, (0, 0, 0))
            state = self._states[key] = _KeyState(token_requests=requests, renewals=renewals,
                                                  shared_fetches=shared)
        return state

    # -- reading

    def current(self, key: str) -> Token | None:
        """The login to hand out now without any I/O, if it is not due for renewal."""
        token = self._tokens.get(key)
        if token is None:
            return None
        now = self.clock.time()
        if now >= self.refresh_time(key, token):
            return None
        self._state(key).last_used = now
        return token

    def refresh_time(self, key: str, token: Token) -> float:
        return refresh_at(token, self.refresh_ahead, self._state(key).jitter)

    async def get(self, target: Target) -> Token:
        key = target.key
        state = self._state(key)
        token = self._tokens.get(key)
        now = self.clock.time()
        state.last_used = now
        if token is not None:
            if now >= self.refresh_time(key, token):
                self._start(target, background=True)
            return token
        if state.fetch is None and state.last_error is not None and now < state.retry_not_before:
            # backing off: no herd of retries against a failing IdP (a fresh traceback each time)
            raise state.last_error.with_traceback(None)
        task = state.fetch
        if task is None:
            task = self._start(target, background=False)
        else:
            state.shared_fetches += 1
        assert task is not None
        return await asyncio.shield(task)

    # -- fetching

    def _start(self, target: Target, background: bool) -> asyncio.Task[Token] | None:
        state = self._state(target.key)
        if state.fetch is not None:
            return state.fetch
        if background and self.clock.time() < state.retry_not_before:
            return None
        task = asyncio.ensure_future(self._run_fetch(target, state))
        task.add_done_callback(_consume_exception)
        state.fetch = task
        return task

    async def _run_fetch(self, target: Target, state: _KeyState) -> Token:
        key = target.key
        state.token_requests += 1
        previous = self._tokens.get(key)
        unexpected: TokenEndpointError | None = None
        try:
            fetching = self._fetch(target)
            token = await (fetching if traces.tracer is None
                           else traces.tracer.login(target, fetching, renewal=previous is not None))
        except McpcredsError as exc:
            self._failed(key, state, exc)
            raise
        except Exception as exc:  # a bug or a hostile answer: still an error answer, with backoff
            unexpected = TokenEndpointError(f"{key}: the login failed unexpectedly ({type(exc).__name__})",
                                            "unexpected_error")
            self._failed(key, state, unexpected, exc)
        finally:
            state.fetch = None
        if unexpected is not None:
            raise unexpected  # raised out here, so never chained to `exc`, whose text may quote a key
        if self._states.get(key) is not state:
            return token  # forgotten (a reload) under this fetch: its callers get it, nobody else
        self._keep(target, state, token, renewal=previous is not None)
        _log.info("login renewed" if previous else "login fetched",
                  extra={"key": key, "fingerprint": token.fingerprint,
                         "expires_in": round(token.expires_at - token.obtained_at, 1)})
        return token

    def _failed(self, key: str, state: _KeyState, error: McpcredsError,
                unexpected: Exception | None = None) -> None:
        """Count a failed fetch, back off, and log it once (an unexpected one by its type and
        where it was raised, never its text)."""
        state.failures += 1
        delay = backoff_delay(state.failures, self.rng)
        state.retry_not_before = self.clock.time() + delay
        state.last_error = error
        extra: dict[str, Any] = {"key": key, "error": error.code, "retry_in": round(delay, 2)}
        if unexpected is not None:
            extra["exception"] = type(unexpected).__name__
            frames = traceback.extract_tb(unexpected.__traceback__)
            if frames:
                extra["where"] = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}"
        _log.warning("login failed; %s", "serving the current login (stale)" if self._tokens.get(key)
                     else "no valid login", extra=extra)

    def _keep(self, target: Target, state: _KeyState, token: Token, renewal: bool) -> None:
        """Make `token` the key's login: clear the failures, count a renewal, set its timer."""
        state.failures = 0
        state.last_error = None
        state.retry_not_before = 0.0
        state.jitter = self.rng.random()
        if renewal:
            state.renewals += 1
        self._tokens[target.key] = token
        self._schedule(target, state, token)

    def _schedule(self, target: Target, state: _KeyState, token: Token) -> None:
        """Renew ahead of expiry without waiting for a request, if the key is in use."""
        if state.timer is not None:
            state.timer.cancel()
        delay = max(0.0, self.refresh_time(target.key, token) - self.clock.time())
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        state.timer = loop.call_later(delay, self._on_timer, target)

    def _on_timer(self, target: Target) -> None:
        """Renew a login that was used within its lifetime; let an idle one lapse."""
        state = self._state(target.key)
        state.timer = None
        token = self._tokens.get(target.key)
        lifetime = token.lifetime if token else 0.0
        if self.clock.time() - state.last_used <= lifetime:
            self._start(target, background=True)

    # -- changing

    def invalidate(self, key: str, fingerprint: str | None) -> bool:
        """Drop the login if it is still the one with `fingerprint` (any login without one)."""
        token = self._tokens.get(key)
        if token is None or (fingerprint is not None and fingerprint != token.fingerprint):
            return False
        del self._tokens[key]
        state = self._state(key)
        state.retry_not_before = 0.0  # a rejected token is a reason to ask again now
        return True

    async def renew(self, target: Target) -> Token:
        """Fetch a new login now (after a rotation), sharing a fetch already under way."""
        state = self._state(target.key)
        state.retry_not_before = 0.0
        task = self._start(target, background=False)
        assert task is not None
        return await asyncio.shield(task)

    def note_shared(self, key: str) -> None:
        """A request that waited on a resolution another request started."""
        self._state(key).shared_fetches += 1

    def peek(self, key: str) -> Token | None:
        """The cached login, due for renewal or not."""
        return self._tokens.get(key)

    def drop(self, key: str) -> None:
        """Forget the cached login (another sidecar has a newer one); its counters stay."""
        self._tokens.pop(key, None)

    def install(self, target: Target, token: Token) -> None:
        """Make `token` the login of `target`'s key (fetched by a rotation's trial)."""
        state = self._state(target.key)
        state.token_requests += 1
        self._keep(target, state, token, renewal=self._tokens.get(target.key) is not None)

    def forget(self, keys: set[str]) -> None:
        for key in keys:
            self._tokens.pop(key, None)
            state = self._states.pop(key, None)
            if state is not None:
                self._counted[key] = (state.token_requests, state.renewals, state.shared_fetches)
                if state.timer is not None:
                    state.timer.cancel()

    def close(self) -> None:
        for state in self._states.values():
            if state.timer is not None:
                state.timer.cancel()
            if state.fetch is not None:
                state.fetch.cancel()

    # -- status

    def status(self) -> list[dict[str, Any]]:
        now = self.clock.time()
        rows = []
        for key, state in sorted(self._states.items()):
            token = self._tokens.get(key)
            if state.fetch is not None:
                name = "renewing"
            elif token is None:
                name = "failing" if state.last_error else "none"
            elif state.last_error is not None or now >= self.refresh_time(key, token):
                name = "stale"
            else:
                name = "valid"
            rows.append({
                "key": key,
                "state": name,
                "expires_at": token.expires_at if token else None,
                "renew_at": self.refresh_time(key, token) if token else None,
                "fingerprint": token.fingerprint if token else None,
                "last_error": (state.last_error.details.get("error") or state.last_error.code)
                if state.last_error else None,
                "renewals": state.renewals,
                "token_requests": state.token_requests,
                "shared_fetches": state.shared_fetches,
            })
        return rows


def _consume_exception(task: asyncio.Task[Token]) -> None:
    if not task.cancelled():
        task.exception()
