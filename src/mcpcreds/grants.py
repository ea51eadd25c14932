"""Grants: narrower, expiring credentials for child processes, kept in the sidecar's state."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any, Final, Protocol

from .clock import Clock
from .redis_state import RedisState

TOKEN_PREFIX: Final = "mcg_"
MAX_TTL: Final = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class Grant:
    id: str
    servers: tuple[str, ...]
    expires_at: float
    parent: str | None = None
    ancestors: tuple[str, ...] = ()  # every grant above it: revoking any of them revokes this one

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "servers": list(self.servers), "expires_at": self.expires_at,
                           "parent": self.parent, "ancestors": list(self.ancestors)})

    @classmethod
    def from_json(cls, text: str | bytes) -> Grant:
        data = json.loads(text)
        return cls(str(data["id"]), tuple(data["servers"]), float(data["expires_at"]), data.get("parent"),
                   tuple(data.get("ancestors") or ()))


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """Grants are stored by the hash of their token: the state never holds a usable token."""
    return hashlib.sha256(token.encode()).hexdigest()


class GrantStore(Protocol):
    async def put(self, grant: Grant, hashed: str) -> None: ...

    async def get(self, hashed: str) -> Grant | None: ...

    async def revoke(self, grant_id: str) -> bool: ...


class MemoryGrants:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._by_hash: dict[str, Grant] = {}
        self._hash_of: dict[str, str] = {}
        self._children: dict[str, set[str]] = {}

    async def put(self, grant: Grant, hashed: str) -> None:
        self._expire()
        self._by_hash[hashed] = grant
        self._hash_of[grant.id] = hashed
        if grant.parent:
            self._children.setdefault(grant.parent, set()).add(grant.id)

    async def get(self, hashed: str) -> Grant | None:
        grant = self._by_hash.get(hashed)
        if grant is None or grant.expires_at <= self.clock.time():
            return None
        if not all(a in self._hash_of for a in grant.ancestors):
            return None
        return grant

    async def revoke(self, grant_id: str) -> bool:
        hashed = self._hash_of.pop(grant_id, None)
        if hashed is None:
            return False
        self._by_hash.pop(hashed, None)
        for child in self._children.pop(grant_id, set()):
            await self.revoke(child)
        return True

    def _expire(self) -> None:
        now = self.clock.time()
        for hashed, grant in list(self._by_hash.items()):
            if grant.expires_at <= now:
                del self._by_hash[hashed]
                self._hash_of.pop(grant.id, None)
                self._children.pop(grant.id, None)


class RedisGrants:
    """Grants in the shared state, so a child may use any sidecar that shares it."""

    def __init__(self, state: RedisState, clock: Clock) -> None:
        self.state = state
        self.clock = clock

    async def put(self, grant: Grant, hashed: str) -> None:
        ttl = max(1, int((grant.expires_at - self.clock.time()) * 1000))
        r = self.state.redis
        pipe = r.pipeline(transaction=True)
        pipe.set(f"mcpcreds:grant:{hashed}", grant.to_json(), px=ttl)
        pipe.set(f"mcpcreds:grantid:{grant.id}", hashed, px=ttl)
        if grant.parent:  # for clean-up on revoke; get() checks the ancestors either way
            pipe.sadd(f"mcpcreds:grantkids:{grant.parent}", grant.id)
            pipe.pexpire(f"mcpcreds:grantkids:{grant.parent}", ttl)
        await self.state.call("store grant", pipe.execute())

    async def get(self, hashed: str) -> Grant | None:
        raw = await self.state.call("read grant", self.state.redis.get(f"mcpcreds:grant:{hashed}"))
        if raw is None:
            return None
        grant = Grant.from_json(raw)
        if grant.expires_at <= self.clock.time():
            return None
        if grant.ancestors:  # a revoked (or lapsed) ancestor ends the grant, whatever its own TTL
            alive = await self.state.call("read grant", self.state.redis.exists(
                *(f"mcpcreds:grantid:{a}" for a in grant.ancestors)))
            if int(alive) != len(grant.ancestors):
                return None
        return grant

    async def revoke(self, grant_id: str) -> bool:
        r = self.state.redis
        hashed = await self.state.call("revoke grant", r.get(f"mcpcreds:grantid:{grant_id}"))
        if hashed is None:
            return False
        kids: Any = await self.state.call("revoke grant", r.smembers(f"mcpcreds:grantkids:{grant_id}"))
        await self.state.call("revoke grant", r.delete(
            f"mcpcreds:grant:{hashed.decode()}", f"mcpcreds:grantid:{grant_id}",
            f"mcpcreds:grantkids:{grant_id}"))
        for kid in kids or ():
            await self.revoke(kid.decode() if isinstance(kid, bytes) else str(kid))
        return True
