"""The MCP sessions seen through the gateway (`LiveSessions`): for status, and to hold each session
to the caller that opened it."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from ..core.http import Request

SESSION_LIMIT: Final = 10_000  # MCP sessions tracked for status (past it, the least recently seen go)
SESSION_IDLE: Final = 3600.0  # seconds without traffic after which a session is no longer counted

Owner = tuple[int, "str | None"]  # the uid and the grant id of a caller


def owner_of(request: Request) -> Owner:
    return request.peer_uid, request.grant.id if request.grant is not None else None


class LiveSessions:
    """The MCP sessions seen through the gateway, per server: bounded (`limit` entries, the least
    recently seen dropped first) and expiring (`idle` seconds without traffic). An id is bearer-ish:
    only a digest of it is kept, and only counts and ages are shown. Each session belongs to the
    caller whose request opened it (its uid and grant): no other caller may use it."""

    def __init__(self, clock: Callable[[], float], limit: int = SESSION_LIMIT,
                 idle: float = SESSION_IDLE) -> None:
        self.clock = clock
        self.limit = limit
        self.idle = idle
        # (server, digest) -> (first seen, last seen, owner), least recently seen first
        self._seen: OrderedDict[tuple[str, bytes], tuple[float, float, Owner]] = OrderedDict()
        # (server, digest) -> the roots the gateway last answered that session with (when it answers)
        self._roots: dict[tuple[str, bytes], tuple[str, ...] | None] = {}

    @staticmethod
    def _key(server: str, session_id: bytes) -> tuple[str, bytes]:
        return server, hashlib.blake2b(session_id, digest_size=16).digest()

    def seen(self, server: str, session_id: bytes, owner: Owner,
             roots: tuple[str, ...] | None = None) -> None:
        """An answer to `owner` carried this id: the session is live, and theirs (and its server
        answered with `roots`, when the gateway answers `roots/list`)."""
        now = self.clock()
        key = self._key(server, session_id)
        if key not in self._seen:
            self._roots[key] = roots
        first = self._seen.pop(key, (now, now, owner))[0]
        self._seen[key] = (first, now, owner)
        self._expire(now)
        while len(self._seen) > self.limit:
            self._roots.pop(self._seen.popitem(last=False)[0], None)

    def used(self, server: str, session_id: bytes, owner: Owner) -> None:
        """A request of a known session was answered: it is still live (an unknown id adds nothing)."""
        key = self._key(server, session_id)
        found = self._seen.pop(key, None)
        if found is not None:
            self._seen[key] = (found[0], self.clock(), found[2])

    def belongs(self, server: str, session_id: bytes, owner: Owner) -> bool:
        """False when the session is known and was opened by another caller."""
        found = self._seen.get(self._key(server, session_id))
        return found is None or found[2] == owner

    def ended(self, server: str, session_id: bytes) -> None:
        key = self._key(server, session_id)
        self._seen.pop(key, None)
        self._roots.pop(key, None)

    def roots_changed(self, server: str, session_id: bytes, roots: tuple[str, ...] | None) -> bool:
        """True when a known session was last told other roots than `roots` (a reload changed them):
        the server is to hear `notifications/roots/list_changed`. Notes `roots` as told."""
        key = self._key(server, session_id)
        if key not in self._seen:
            return False
        told = self._roots.get(key)
        self._roots[key] = roots
        return told != roots

    def _expire(self, now: float) -> None:
        while self._seen:
            key, (_, last, _) = next(iter(self._seen.items()))
            if now - last < self.idle:
                return
            del self._seen[key]
            self._roots.pop(key, None)

    def by_server(self) -> dict[str, tuple[int, float]]:
        """server -> (sessions, age in seconds of the oldest)."""
        now = self.clock()
        self._expire(now)
        out: dict[str, tuple[int, float]] = {}
        for (server, _), (first, _, _) in self._seen.items():
            count, oldest = out.get(server, (0, 0.0))
            out[server] = (count + 1, max(oldest, now - first))
        return out
