"""The caching hints of MCP 2026-07-28 honoured for every caller they allow, apart from any I/O.

A server marks the results of `server/discover`, the four lists and `resources/read` with `ttlMs`
(how long the result stays fresh) and `cacheScope` (`public`: the same for every caller;
`private`: for the authorization context that asked). The gateway is a shared cache as the spec
means one: it keeps a fresh result and answers the same request from it, sending nothing upstream
and taking no permit.

- The same request: the server, its endpoint, the method, the `MCP-Protocol-Version` header and
  the params as they go upstream (their `_meta` less what is per request: a progress token, trace
  context). A retry of an input round (`inputResponses`, `requestState`) is never kept nor served:
  its result depends on inputs outside that key.
- A `public` result serves any caller of the server; a `private` one only the caller (uid and
  grant) whose request fetched it, while the sidecar sends the server the same credential (a
  digest of it, `context`): a new token, or another person's login, is another authorization
  context, as the spec has it.
- Kept: a complete result (`resultType` absent or `complete`) with a positive integer `ttlMs`,
  at most MAX_TTL_MS, at most MAX_RESULT bytes of JSON; MAX_SERVER_BYTES per server and
  MAX_SERVERS servers, the least recently used going first. A result served from the cache says
  how long it stays fresh: its `ttlMs` less its age.
- A list_changed notification from the server drops its kept results of that list (and
  `notifications/resources/updated` its reads): the spec's immediate invalidation.
- A request that finds the same request on its way upstream waits for that answer (single
  flight), unless that request's last answer was not cacheable: a burst of new sessions asks the
  server once.

The cache holds the result as the server sent it, credentials masked (before the trust policy,
the grant and the pins): every result served from it is judged again as an upstream answer is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cachetools import LRUCache, TLRUCache, TTLCache

from .jsonrpc import Message

CACHEABLE: Final = frozenset({"server/discover", "tools/list", "prompts/list", "resources/list",
                              "resources/templates/list", "resources/read"})
# what each notification makes stale at once
INVALIDATES: Final = {
    "notifications/tools/list_changed": frozenset({"tools/list"}),
    "notifications/prompts/list_changed": frozenset({"prompts/list"}),
    "notifications/resources/list_changed": frozenset({"resources/list", "resources/templates/list"}),
    "notifications/resources/updated": frozenset({"resources/read"}),
}
PER_REQUEST_META: Final = frozenset({"progressToken", "traceparent", "tracestate", "baggage"})
ROUND_RETRY: Final = ("inputResponses", "requestState")  # an input round's retry: never cached
MAX_TTL_MS: Final = 24 * 3600 * 1000
MAX_RESULT: Final = 1024 * 1024  # bytes of JSON of one kept result
MAX_SERVER_BYTES: Final = 8 * 1024 * 1024
ENTRY_OVERHEAD: Final = 512  # bytes counted for an entry besides its JSON (key, bookkeeping)
MAX_SERVERS: Final = 256
PLAIN_FOR: Final = 60.0  # seconds a request whose answer was not cacheable is not waited on
MAX_PLAIN: Final = 1024

Owner = tuple[int, "str | None"]  # the uid and the grant id of a caller (gateway/sessions.py)


@dataclass(frozen=True, slots=True)
class Ask:
    """A cacheable request: `key` names it for every caller, `owner` is who asks."""

    server: str
    key: tuple[str, str, str, str]  # endpoint, method, protocol version, params as canonical JSON
    owner: Owner

    @property
    def method(self) -> str:
        return self.key[1]


@dataclass(frozen=True, slots=True)
class _Kept:
    result: dict[str, Any]
    size: int
    expires: float


def _expiry(_key: Any, kept: _Kept, _now: float) -> float:
    return kept.expires


def _size(kept: _Kept) -> int:
    return kept.size


def ask_of(server: str, endpoint: str, message: Message, version: str | None, owner: Owner) -> Ask | None:
    """The request as the cache knows it, or None if its result is never cached."""
    method = message.method
    if method not in CACHEABLE or message.kind != "request":
        return None
    params = message.raw.get("params", {})
    if not isinstance(params, dict) or any(k in params for k in ROUND_RETRY):
        return None
    meta = params.get("_meta")
    if isinstance(meta, dict) and PER_REQUEST_META.intersection(meta):
        params = {**params, "_meta": {k: v for k, v in meta.items() if k not in PER_REQUEST_META}}
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return Ask(server, (endpoint, method, version or "", canonical), owner)


def _cacheable(result: Any) -> tuple[int, bool] | None:
    """(ttlMs, public) of a result the hints let a shared cache keep, or None."""
    if not isinstance(result, dict) or result.get("resultType", "complete") != "complete":
        return None
    ttl = result.get("ttlMs")
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
        return None
    return min(ttl, MAX_TTL_MS), result.get("cacheScope") == "public"


class ResultCache:
    """Results kept as their hints allow (see the module doc); `clock` is monotonic seconds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._servers: LRUCache[str, TLRUCache[tuple[Any, ...], _Kept]] = LRUCache(MAX_SERVERS)
        self._flights: dict[tuple[str, tuple[str, str, str, str]], asyncio.Event] = {}
        self._plain: TTLCache[tuple[str, tuple[str, str, str, str]], bool] = TTLCache(
            MAX_PLAIN, PLAIN_FOR, timer=clock)

    def _of(self, server: str) -> TLRUCache[tuple[Any, ...], _Kept]:
        kept = self._servers.get(server)
        if kept is None:
            kept = self._servers[server] = TLRUCache(MAX_SERVER_BYTES, _expiry, timer=self._clock,
                                                     getsizeof=_size)
        return kept

    def fresh(self, ask: Ask, context: bytes | None) -> dict[str, Any] | None:
        """The kept result that answers `ask` now, its `ttlMs` what is left of it; None if none.
        `context`: the credential the server would get now (None: none at hand, so no private
        result serves)."""
        kept_of = self._servers.get(ask.server)
        if kept_of is None:
            return None
        now = self._clock()
        keys: tuple[tuple[Any, ...], ...] = ((ask.key, None),) if context is None else (
            (ask.key, None), (ask.key, (ask.owner, context)))
        for key in keys:
            kept = kept_of.get(key)
            if kept is not None and now < kept.expires:
                left = int((kept.expires - now) * 1000)
                if left > 0:
                    return {**kept.result, "ttlMs": left}
        return None

    def in_flight(self, ask: Ask) -> asyncio.Event | None:
        """What to wait on when the same request is on its way upstream and worth waiting for."""
        flight = (ask.server, ask.key)
        if flight in self._plain:
            return None
        return self._flights.get(flight)

    def lead(self, ask: Ask) -> bool:
        """Whether this request leads a flight (none was on its way): it must `land` it."""
        flight = (ask.server, ask.key)
        if flight in self._flights:
            return False
        self._flights[flight] = asyncio.Event()
        return True

    def land(self, ask: Ask) -> None:
        """The leading request ended (answered, failed or cancelled): its followers go on."""
        event = self._flights.pop((ask.server, ask.key), None)
        if event is not None:
            event.set()

    def keep(self, ask: Ask, result: Any, context: bytes, mask: Callable[[Any], Any]) -> bool:
        """The server's result for `ask`, fetched with the credential `context` names: kept, its
        credentials masked (`mask`), if its hints allow."""
        hints = _cacheable(result)
        flight = (ask.server, ask.key)
        if hints is None:
            self._plain[flight] = True
            return False
        ttl, public = hints
        size = len(json.dumps(result, separators=(",", ":"))) + ENTRY_OVERHEAD
        if size > MAX_RESULT:
            self._plain[flight] = True
            return False
        self._plain.pop(flight, None)
        result = mask(result)
        now = self._clock()
        owner = None if public else (ask.owner, context)
        self._of(ask.server)[(ask.key, owner)] = _Kept(result, size, now + ttl / 1000)
        return True

    def notified(self, server: str, method: str) -> int:
        """A notification from the server: the kept results it makes stale dropped (how many)."""
        stale = INVALIDATES.get(method)
        kept_of = self._servers.get(server)
        if stale is None or kept_of is None:
            return 0
        dropped = [key for key in kept_of if key[0][1] in stale]
        for key in dropped:
            kept_of.pop(key, None)
        return len(dropped)

    def forget(self, server: str) -> None:
        """Every result of `server` dropped (its config changed)."""
        self._servers.pop(server, None)

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._servers.values())
