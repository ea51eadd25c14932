"""Grants: narrower, expiring credentials for child processes, kept in the sidecar's state."""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from ..core.clock import Clock
from ..core.logs import get_logger
from ..errors import StateUnavailable, TooManyGrants

if TYPE_CHECKING:  # the Redis state only: a sidecar on the memory state imports no redis
    from .redis_state import RedisState

TOKEN_PREFIX: Final = "mcg_"
MAX_TTL: Final = 7 * 86400.0
MAX_REMEMBERED: Final = 65_536  # revocations a Redis store remembers in memory (see RedisGrants)
MAX_GRANT_ID: Final = 64
_log = get_logger("grants")


@dataclass(frozen=True, slots=True)
class GrantLimits:
    """The most live (unexpired, unrevoked) grants a store holds, and the most live sub-grants
    under one top grant, at any depth (`sidecar.max_grants`, `sidecar.max_subgrants`): counted
    against the top, a holder cannot multiply its place through a tree of sub-grants."""

    max_total: int = 10_000
    max_children: int = 64


DEFAULT_LIMITS: Final = GrantLimits()


def _too_many_total(limits: GrantLimits) -> TooManyGrants:
    return TooManyGrants(f"the sidecar holds its limit of {limits.max_total} live grants "
                         "(sidecar.max_grants); revoke some or let them expire")


def _too_many_children(limits: GrantLimits) -> TooManyGrants:
    return TooManyGrants(f"this grant's tree holds its limit of {limits.max_children} live sub-grants, "
                         "at any depth (sidecar.max_subgrants); revoke some or let them expire")


@dataclass(frozen=True, slots=True)
class Grant:
    id: str
    servers: tuple[str, ...]
    expires_at: float
    parent: str | None = None
    ancestors: tuple[str, ...] = ()  # every grant above it: revoking any of them revokes this one
    # server name -> the only tools the grant allows there (through the gateway); a server not
    # named here is narrowed by its trust policy only
    tools: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def top(self) -> str | None:
        """The grant at the top of this one's tree (minted without a grant), None for a top grant:
        every grant below it counts against its `max_subgrants`."""
        return self.ancestors[0] if self.ancestors else self.parent

    def tools_of(self, server: str) -> frozenset[str] | None:
        """The tools this grant narrows `server` to, or None if it does not narrow them."""
        return self.tools.get(server)

    def tools_json(self) -> dict[str, list[str]]:
        return {server: sorted(names) for server, names in sorted(self.tools.items())}

    def to_json(self) -> str:
        data: dict[str, Any] = {"id": self.id, "servers": list(self.servers), "expires_at": self.expires_at,
                                "parent": self.parent, "ancestors": list(self.ancestors)}
        if self.tools:  # a record without tools reads as before, by old and new sidecars alike
            data["tools"] = self.tools_json()
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> Grant:
        data = json.loads(text)
        tools = data.get("tools") or {}
        lists = tools.values() if isinstance(tools, dict) else [None]
        if not all(isinstance(names, list) and all(isinstance(n, str) for n in names) for names in lists):
            raise ValueError("grant tools must map server names to lists of tool names")
        return cls(str(data["id"]), tuple(data["servers"]), float(data["expires_at"]), data.get("parent"),
                   tuple(data.get("ancestors") or ()),
                   {str(server): frozenset(names) for server, names in tools.items()})


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """Grants are stored by the hash of their token: the state never holds a usable token."""
    return hashlib.sha256(token.encode()).hexdigest()


class GrantStore(Protocol):
    async def put(self, grant: Grant, hashed: str, limits: GrantLimits = DEFAULT_LIMITS) -> None:
        """Store `grant` under the hash of its token; TooManyGrants if the store holds
        `limits.max_total` live grants, or its top grant `limits.max_children` live sub-grants."""
        ...

    async def get(self, hashed: str) -> Grant | None: ...

    async def revoke(self, grant_id: str) -> bool: ...

    async def live(self) -> int:
        """How many grants are live now (unexpired, unrevoked): status shows it."""
        ...


class MemoryGrants:
    """Grants in this sidecar's memory. A heap by expiry sweeps lapsed grants, so a put costs
    O(log n) whatever the store holds, and a lapsed or revoked grant frees its place."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._by_hash: dict[str, Grant] = {}
        self._hash_of: dict[str, str] = {}  # id -> hash, of live grants
        self._children: dict[str, set[str]] = {}  # id -> ids of its live direct sub-grants
        self._tree: dict[str, set[str]] = {}  # top id -> ids of its live sub-grants at any depth
        self._expiry: list[tuple[float, str]] = []  # (expires_at, id), a heap; may hold revoked ids

    async def put(self, grant: Grant, hashed: str, limits: GrantLimits = DEFAULT_LIMITS) -> None:
        self._expire()
        if len(self._hash_of) >= limits.max_total:
            raise _too_many_total(limits)
        top = grant.top
        if top and len(self._tree.get(top, ())) >= limits.max_children:
            raise _too_many_children(limits)
        self._by_hash[hashed] = grant
        self._hash_of[grant.id] = hashed
        if grant.parent:
            self._children.setdefault(grant.parent, set()).add(grant.id)
        if top:
            self._tree.setdefault(top, set()).add(grant.id)
        heapq.heappush(self._expiry, (grant.expires_at, grant.id))
        if len(self._expiry) > 2 * len(self._hash_of) + 64:  # mostly revoked ids: rebuild (amortised O(1))
            self._expiry = [(self._by_hash[h].expires_at, i) for i, h in self._hash_of.items()]
            heapq.heapify(self._expiry)

    async def get(self, hashed: str) -> Grant | None:
        grant = self._by_hash.get(hashed)
        if grant is None or grant.expires_at <= self.clock.time():
            return None
        if not all(a in self._hash_of for a in grant.ancestors):
            return None
        return grant

    async def revoke(self, grant_id: str) -> bool:
        if grant_id not in self._hash_of:
            return False
        todo = [grant_id]
        while todo:  # not recursive: a chain of sub-grants may be deeper than Python's stack
            gid = todo.pop()
            self._remove(gid)
            todo.extend(self._children.pop(gid, ()))
        return True

    async def live(self) -> int:
        self._expire()
        return len(self._hash_of)

    def _remove(self, grant_id: str) -> None:
        hashed = self._hash_of.pop(grant_id, None)
        if hashed is None:
            return
        grant = self._by_hash.pop(hashed)
        for index, owner in ((self._children, grant.parent), (self._tree, grant.top)):
            if owner and (members := index.get(owner)) is not None:
                members.discard(grant_id)
                if not members:
                    del index[owner]

    def _expire(self) -> None:
        now = self.clock.time()
        while self._expiry and self._expiry[0][0] <= now:
            _, gid = heapq.heappop(self._expiry)
            hashed = self._hash_of.get(gid)
            if hashed is not None and self._by_hash[hashed].expires_at <= now:
                self._remove(gid)


_GRANTS: Final = "mcpcreds:{grants}"  # one hash tag: every grant key on one Redis Cluster slot
_LIVE_KIND: Final = "grant-live"  # what a liveness record's MAC is bound to (with its key)

# Store a grant if the limits allow, atomically (two sidecars cannot both take the last place).
# KEYS: record, liveness, live (a sorted set of every grant id by expiry), and for a sub-grant its
# parent's sorted set of direct sub-grant ids (the cascade of a revoke) and its top grant's sorted
# set of every sub-grant id below it (the limit), both by expiry. ARGV: now, max total, max
# children, id, expires_at, sealed record, sealed liveness record, TTL in ms. Returns 0 stored,
# 1 too many in all, 2 too many sub-grants under that top grant.
PUT_SCRIPT: Final = """
local now = ARGV[1]
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[2]) then return 1 end
if #KEYS == 5 then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
  if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[3]) then return 2 end
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
end
local ttl = tonumber(ARGV[8])
redis.call('SET', KEYS[1], ARGV[6], 'PX', ttl)
redis.call('SET', KEYS[2], ARGV[7], 'PX', ttl)
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
for i = 4, #KEYS do
  redis.call('ZADD', KEYS[i], ARGV[5], ARGV[4])
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return 0
"""


def _liveness_fields(payload: bytes) -> tuple[str, str, str, float] | None:
    """(token hash, parent, top, expires_at) of a liveness record's payload, None if malformed."""
    try:
        data = json.loads(payload)
        return str(data["hash"]), str(data["parent"] or ""), str(data["top"] or ""), float(data["expires_at"])
    except (ValueError, KeyError, TypeError):
        return None


class RedisGrants:
    """Grants in the shared state, so a child may use any sidecar that shares it. A grant record
    carries an HMAC bound to its Redis key: one written by hand, or moved from another token's
    key, is not honoured.

    A grant is live while its own liveness record (`id:`, sealed too, naming the token hash) and
    those of all its ancestors are: a revoke deletes them, so a grant record written back into
    Redis afterwards is not honoured, nor is a liveness record made up for a revoked ancestor.
    Someone who kept copies of both sealed records can write both back: no record in Redis tells
    that from the original, so each sidecar also remembers (in memory, for the grant's remaining
    life) the grants revoked through it or announced by the sealed `revoke` event of another."""

    def __init__(self, state: RedisState, clock: Clock) -> None:
        self.state = state
        self.clock = clock
        self._put = state.redis.register_script(PUT_SCRIPT)
        self._revoked: dict[str, float] = {}  # grant id -> its expires_at, insertion ordered
        state.taps["revoke"] = self._heard

    @staticmethod
    def _record(hashed: str) -> str:
        return f"{_GRANTS}:rec:{hashed}"

    @staticmethod
    def _id(grant_id: str) -> str:
        return f"{_GRANTS}:id:{grant_id}"

    @staticmethod
    def _kids(grant_id: str) -> str:
        return f"{_GRANTS}:kids:{grant_id}"

    @staticmethod
    def _tree(grant_id: str) -> str:
        return f"{_GRANTS}:tree:{grant_id}"

    async def put(self, grant: Grant, hashed: str, limits: GrantLimits = DEFAULT_LIMITS) -> None:
        now = self.clock.time()
        ttl = max(1, int((grant.expires_at - now) * 1000))
        name, live_name = self._record(hashed), self._id(grant.id)
        sealed = await self.state.seal("grant", name, grant.to_json().encode())
        liveness = json.dumps({"hash": hashed, "parent": grant.parent, "top": grant.top,
                               "expires_at": grant.expires_at}).encode()
        sealed_live = await self.state.seal(_LIVE_KIND, live_name, liveness)
        keys = [name, live_name, f"{_GRANTS}:live"]
        if grant.parent and grant.top:
            keys += [self._kids(grant.parent), self._tree(grant.top)]
        verdict = await self.state.call("store grant", self._put(keys=keys, args=[
            now, limits.max_total, limits.max_children, grant.id, grant.expires_at, sealed, sealed_live,
            ttl]))
        if int(verdict) == 1:
            raise _too_many_total(limits)
        if int(verdict) == 2:
            raise _too_many_children(limits)

    async def get(self, hashed: str) -> Grant | None:
        name = self._record(hashed)
        raw = await self.state.call("read grant", self.state.redis.get(name))
        if raw is None:
            return None
        payload = await self.state.unseal("grant", name, raw)
        if payload is None:
            return None
        try:
            grant = Grant.from_json(payload)
        except (ValueError, KeyError, TypeError):
            self.state.refuse("grant", name)
            return None
        if grant.expires_at <= self.clock.time():
            return None
        chain = (grant.id, *grant.ancestors)
        if any(gid in self._revoked for gid in chain):
            return None
        # the grant's own liveness and its ancestors': a revoked (or lapsed) one ends it
        names = [self._id(g) for g in chain]
        lives = await self.state.call("read grant", self.state.redis.mget(names))
        for gid, live_name, sealed_live in zip(chain, names, lives, strict=True):
            if sealed_live is None:
                return None
            opened = await self.state.unseal(_LIVE_KIND, live_name, sealed_live)
            fields = _liveness_fields(opened) if opened is not None else None
            if fields is None or (gid == grant.id and fields[0] != hashed):
                if opened is not None:
                    self.state.refuse(_LIVE_KIND, live_name)
                return None
        return grant

    async def live(self) -> int:
        """The grants of every sidecar on this Redis, by the live set the limit is counted on."""
        count = self.state.redis.zcount(f"{_GRANTS}:live", f"({self.clock.time()}", "+inf")
        return int(await self.state.call("count grants", count))

    async def revoke(self, grant_id: str) -> bool:
        """Revoke the grant and every grant below it; each frees its place in the limits."""
        r = self.state.redis
        todo, expires_at = [grant_id], None
        while todo:
            gid = todo.pop()
            entry = await self.state.call("revoke grant", r.get(self._id(gid)))
            if entry is None:
                continue
            # revoking does not need the MAC: deleting what a forger wrote only ends more grants
            fields = _liveness_fields(bytes(entry).partition(b".")[2])
            hashed, parent, top, until = fields or ("", "", "", 0.0)
            if gid == grant_id:
                expires_at = until
            kids: Any = await self.state.call("revoke grant", r.zrange(self._kids(gid), 0, -1))
            pipe = r.pipeline(transaction=True)
            pipe.delete(self._id(gid), self._kids(gid), self._tree(gid),
                        *([self._record(hashed)] if hashed else []))
            pipe.zrem(f"{_GRANTS}:live", gid)
            if parent:
                pipe.zrem(self._kids(parent), gid)
            if top:
                pipe.zrem(self._tree(top), gid)
            await self.state.call("revoke grant", pipe.execute())
            todo.extend(k.decode() if isinstance(k, bytes) else str(k) for k in kids or ())
        if expires_at is None:
            return False
        until = expires_at if math.isfinite(expires_at) and expires_at > 0 else self.clock.time() + MAX_TTL
        self._remember(grant_id, until)
        with contextlib.suppress(StateUnavailable):  # revoked in Redis already; the event is a second line
            await self.state.publish("revoke", "grants", grant=grant_id, expires_at=until)
        return True

    def _heard(self, event: dict[str, Any]) -> None:
        """Another sidecar revoked a grant (a sealed event): remember it for its remaining life."""
        gid, until = event.get("grant"), event.get("expires_at")
        if isinstance(gid, str) and 0 < len(gid) <= MAX_GRANT_ID and isinstance(until, int | float) \
                and not isinstance(until, bool) and math.isfinite(until):
            self._remember(gid, min(float(until), self.clock.time() + MAX_TTL))

    def _remember(self, grant_id: str, until: float) -> None:
        """Every grant below `grant_id` names it among its ancestors, so its id alone is enough."""
        if len(self._revoked) >= MAX_REMEMBERED:
            now = self.clock.time()
            self._revoked = {g: t for g, t in self._revoked.items() if t > now}
            if len(self._revoked) >= MAX_REMEMBERED:  # all still running: forget the oldest half
                _log.warning("too many revoked grants to remember; the oldest rely on Redis alone")
                self._revoked = dict(list(self._revoked.items())[MAX_REMEMBERED // 2:])
        self._revoked[grant_id] = until
