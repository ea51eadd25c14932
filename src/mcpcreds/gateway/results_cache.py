"""The caching hints of MCP 2026-07-28 honoured for every caller they allow, apart from any I/O.

A server marks the results of `server/discover`, the four lists and `resources/read` with `ttlMs`
(how long the result stays fresh) and `cacheScope` (`public`: the same for every caller;
`private`: for the authorization context that asked). The gateway is a shared cache as the spec
means one: it keeps a fresh result and answers the same request from it, sending nothing upstream
and taking no permit.

- The same request: the server, its endpoint, the method and the params as they go upstream
  (their `_meta` less what is per request: a progress token, trace context), by a digest. Only a
  request of 2026-07-28 or later (its `_meta` names the version) is cached: the 2025 revisions
  have no hints, and their sessions hold state the key does not. A retry of an input round
  (`inputResponses`, `requestState`) is never kept nor served: its result depends on inputs
  outside that key.
- A `public` result serves any caller of the server; a `private` one only the caller (uid and
  grant) whose request fetched it, while the sidecar sends the server the same credential (a
  digest of it, `context`): a new token, or another person's login, is another authorization
  context, as the spec has it. A server whose requests are signed (no credential header to
  digest) has no private result kept.
- Kept: a complete result (`resultType` absent or `complete`) with a positive integer `ttlMs`,
  at most MAX_TTL_MS, kept as its JSON text of at most MAX_RESULT bytes, MAX_BYTES in all, the
  least recently used going first. A result served from the cache says how long it stays fresh:
  its `ttlMs` less its age.
- A tool whose definition the pins find changed makes the server's kept listings stale: a copy
  from before would show the old definition, which matches its pin and would clear the change
  before anyone approved it.
- A list_changed notification from the server makes its kept results of that list stale (and
  `notifications/resources/updated` its reads): the spec's immediate invalidation. So does it
  for an answer on its way: a result asked for before the notice is not kept. An error for a
  page of a list (a request with a `cursor`) makes every kept page of that list stale: the
  server no longer takes a cursor they hold, and a client would be sent it again.
- A request that finds the same request on its way upstream waits for that answer (single
  flight), unless that request's last answer was not cacheable, or was private and another
  caller's request is the one on its way: a burst of new sessions asks the server once.

The cache holds the result as the server sent it, credentials masked (before the trust policy,
the grant and the pins): every result served from it is judged again as an upstream answer is.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cachetools import TLRUCache, TTLCache

from ..protocol.jsonrpc import Message
from ..protocol.strict_json import dumps, loads
from .sessions import Owner

CACHEABLE: Final = frozenset({"server/discover", "tools/list", "prompts/list", "resources/list",
                              "resources/templates/list", "resources/read"})
# what each notification makes stale at once
INVALIDATES: Final = {
    "notifications/tools/list_changed": ("tools/list",),
    "notifications/prompts/list_changed": ("prompts/list",),
    "notifications/resources/list_changed": ("resources/list", "resources/templates/list"),
    "notifications/resources/updated": ("resources/read",),
}
FIRST_VERSION: Final = "2026-07-28"  # the first revision with caching hints
VERSION_META: Final = "io.modelcontextprotocol/protocolVersion"
PER_REQUEST_META: Final = frozenset({"progressToken", "traceparent", "tracestate", "baggage"})
ROUND_RETRY: Final = ("inputResponses", "requestState")  # an input round's retry: never cached
MAX_TTL_MS: Final = 24 * 3600 * 1000
MAX_RESULT: Final = 1024 * 1024  # bytes of JSON of one kept result
MAX_BYTES: Final = 32 * 1024 * 1024  # of every kept result
ENTRY_OVERHEAD: Final = 512  # bytes counted for an entry besides its JSON (key, bookkeeping)
PLAIN_FOR: Final = 60.0  # seconds a request whose answer was not cacheable is not waited on
MAX_PLAIN: Final = 4096
MAX_STALE_MARKS: Final = 4096  # (server, method) pairs with a notice: past it, everything is dropped

Key = tuple[str, str, bytes]  # server, method, digest of (endpoint, params)


@dataclass(frozen=True, slots=True)
class Ask:
    """A cacheable request: `key` names it for every caller, `owner` is who asks, `epoch` when
    (a notice of a change after it makes its answer stale)."""

    key: Key
    owner: Owner
    epoch: int = 0
    paged: bool = False  # a page after the first (its params name a `cursor`)

    @property
    def server(self) -> str:
        return self.key[0]

    @property
    def method(self) -> str:
        return self.key[1]


@dataclass(frozen=True, slots=True)
class _Kept:
    text: bytes  # the result's JSON, credentials masked
    expires: float
    epoch: int


def _expiry(_key: Any, kept: _Kept, _now: float) -> float:
    return kept.expires


def _size(kept: _Kept) -> int:
    return len(kept.text) + ENTRY_OVERHEAD


def ask_of(server: str, endpoint: str, message: Message, owner: Owner) -> Ask | None:
    """The request as the cache knows it, or None if its result is never cached."""
    method = message.method
    if method not in CACHEABLE or message.kind != "request":
        return None
    params = message.raw.get("params")
    if not isinstance(params, dict) or any(k in params for k in ROUND_RETRY):
        return None
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        return None
    version = meta.get(VERSION_META)
    if not isinstance(version, str) or version < FIRST_VERSION:
        return None
    if PER_REQUEST_META.intersection(meta):
        params = {**params, "_meta": {k: v for k, v in meta.items() if k not in PER_REQUEST_META}}
    canonical = json.dumps([endpoint, params], sort_keys=True, separators=(",", ":")).encode()
    return Ask((server, method, hashlib.blake2b(canonical, digest_size=32).digest()), owner,
               paged="cursor" in params)


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
        self._kept: TLRUCache[tuple[Key, Any], _Kept] = TLRUCache(MAX_BYTES, _expiry, timer=clock,
                                                                 getsizeof=_size)
        self._flights: dict[Key, tuple[asyncio.Event, Owner]] = {}  # key -> its flight, and who leads it
        self._plain: TTLCache[Key, bool] = TTLCache(MAX_PLAIN, PLAIN_FOR, timer=clock)
        self._private: TTLCache[Key, bool] = TTLCache(MAX_PLAIN, PLAIN_FOR, timer=clock)  # last kept: private
        self._epoch = 0  # counts the notices of a change
        self._stale_before: dict[tuple[str, str], int] = {}  # (server, method) -> its last notice's epoch
        self._floor = 0  # the epoch of the last `clear`: whatever was asked before it is stale

    def asked(self, ask: Ask) -> Ask:
        """`ask` as sent now: an answer to it is stale if a notice of a change comes after."""
        return Ask(ask.key, ask.owner, self._epoch, ask.paged)

    def fresh(self, ask: Ask, context: bytes | None) -> dict[str, Any] | None:
        """The kept result that answers `ask` now, its `ttlMs` what is left of it; None if none.
        `context`: the credential the server would get now (None: none at hand, so no private
        result serves)."""
        now = self._clock()
        stale_before = self._stale_before_of(ask)
        for owner in (None,) if context is None else (None, (ask.owner, context)):
            kept = self._kept.get((ask.key, owner))
            if kept is not None and kept.epoch >= stale_before:
                left = int((kept.expires - now) * 1000)
                if left > 0:
                    result: dict[str, Any] = loads(kept.text)
                    result["ttlMs"] = left
                    return result
        return None

    def _stale_before_of(self, ask: Ask) -> int:
        """The epoch before which what was asked like `ask` is stale."""
        return self._stale_before.get((ask.server, ask.method), self._floor)

    def in_flight(self, ask: Ask) -> asyncio.Event | None:
        """What to wait on when the same request is on its way upstream and worth waiting for: not
        when its last answer was not cacheable, nor when it was private and another caller leads."""
        flight = self._flights.get(ask.key)
        if flight is None or ask.key in self._plain or (ask.key in self._private and flight[1] != ask.owner):
            return None
        return flight[0]

    def lead(self, ask: Ask) -> asyncio.Event | None:
        """The flight this request leads (none was on its way), to `land`; None if it follows."""
        if ask.key in self._flights:
            return None
        flight = asyncio.Event()
        self._flights[ask.key] = (flight, ask.owner)
        return flight

    def land(self, ask: Ask, flight: asyncio.Event) -> None:
        """The request leading `flight` is answered, or failed: its followers go on."""
        leading = self._flights.get(ask.key)
        if leading is not None and leading[0] is flight:
            del self._flights[ask.key]
        flight.set()

    def keep(self, ask: Ask, result: Any, context: bytes | None, mask: Callable[[Any], Any]) -> bool:
        """The server's result for `ask` (as `asked`), fetched with the credential `context` names
        (None: not one the cache can tell apart): kept, its credentials masked (`mask`), if its
        hints allow and no notice of a change came since it was asked."""
        hints = _cacheable(result)
        if hints is None:
            self._plain[ask.key] = True
            return False
        ttl, public = hints
        if ask.epoch < self._stale_before_of(ask):
            return False
        if not (public or context):  # a private result with no credential to tell it by: none kept
            self._plain[ask.key] = True
            return False
        text = dumps(mask(result))
        if len(text) > MAX_RESULT:
            self._plain[ask.key] = True
            return False
        self._plain.pop(ask.key, None)
        if public:
            self._private.pop(ask.key, None)
        else:
            self._private[ask.key] = True
        owner = None if public else (ask.owner, context)
        self._kept[(ask.key, owner)] = _Kept(text, self._clock() + ttl / 1000, ask.epoch)
        return True

    def notified(self, server: str, method: str) -> None:
        """A notification from the server: what it makes stale is stale, at once."""
        stale = INVALIDATES.get(method)
        if stale is not None:
            self.stale(server, stale)

    def tool_changed(self, server: str) -> None:
        """The pins found a tool of `server` changed: its kept listings are stale."""
        self.stale(server, ("tools/list",))

    def failed(self, ask: Ask) -> None:
        """The server answered `ask` with an error: for a page of a list, every page is stale."""
        if ask.paged:
            self.stale(ask.server, (ask.method,))

    def stale(self, server: str, methods: tuple[str, ...]) -> None:
        """What `server` answered to `methods` is stale, and so is every answer on its way."""
        if len(self._stale_before) >= MAX_STALE_MARKS:
            self.clear()
        self._epoch += 1
        for each in methods:
            self._stale_before[(server, each)] = self._epoch

    def clear(self) -> None:
        """Every kept result dropped, and every answer on its way made stale (the config changed)."""
        self._kept.clear()
        self._stale_before.clear()
        self._plain.clear()
        self._private.clear()
        self._epoch += 1
        self._floor = self._epoch

    def __len__(self) -> int:
        return len(self._kept)
