"""The event stream (`GET /v1/events`): what leased clients must hear at once.

Each event is one JSON line: `{"kind": ..., "key": ..., ...}` with kind `invalidate` (a login or
cached headers dropped), `rotation` (a secret changed), `login` (a new login: its fingerprint
changed), `pause` (an upstream 429: `seconds` to wait) or, to one holder only, `lease` (renew
your lease of `key` now: fairness gives you more, or someone else your surplus; leases.py). The
first line of a stream is `{"kind": "hello", "subscriber": ID}`: a lease request that names the ID
is tied to the stream, and its share is taken back as soon as the stream closes.

Subscribers are bounded per uid and overall; a subscriber that does not read its events (its queue
full) is cut off: its stream ends, and a client whose stream ends drops what it leased. Nothing a
caller sent is ever in an event: keys, fingerprints and numbers from the sidecar only.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from ..errors import TooManySubscribers

MAX_SUBSCRIBERS: Final = 1024
MAX_SUBSCRIBERS_PER_UID: Final = 64
MAX_QUEUED: Final = 256  # events waiting for one subscriber before it is cut off
KINDS: Final = frozenset({"invalidate", "rotation", "login", "pause", "lease"})


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


class Subscription:
    """One stream's queue: a `wire.ResponseBody` (chunks as events come)."""

    def __init__(self, hub: EventHub, uid: int) -> None:
        self.hub = hub
        self.uid = uid
        self.id = secrets.token_urlsafe(12)
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.cut_off = False  # ended by the sidecar (queue full): its leases lapse, not released
        self.closed = False

    def hello(self) -> bytes:
        return encode({"kind": "hello", "subscriber": self.id})

    def put(self, line: bytes) -> None:
        if self.cut_off:
            return
        if self.queue.qsize() >= MAX_QUEUED:
            self.cut_off = True
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(line)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes]:
        while True:
            line = await self.queue.get()
            if line is None:
                return
            yield line

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self.hub.unsubscribe(self)


class EventHub:
    """Subscribers and the events published to them (from the event loop's thread)."""

    def __init__(self, on_close: Callable[[Subscription], None] | None = None,
                 max_total: int = MAX_SUBSCRIBERS, max_per_uid: int = MAX_SUBSCRIBERS_PER_UID) -> None:
        self.subscribers: dict[str, Subscription] = {}
        self._per_uid: dict[int, int] = {}
        self.on_close = on_close
        self.max_total = max_total
        self.max_per_uid = max_per_uid
        self.published = 0

    def subscribe(self, uid: int) -> Subscription:
        if len(self.subscribers) >= self.max_total:
            raise TooManySubscribers("the sidecar has as many event subscribers as it may")
        if self._per_uid.get(uid, 0) >= self.max_per_uid:
            raise TooManySubscribers("this uid has as many event subscribers as it may")
        sub = Subscription(self, uid)
        self.subscribers[sub.id] = sub
        self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if self.subscribers.pop(sub.id, None) is None:
            return
        left = self._per_uid.get(sub.uid, 1) - 1
        if left:
            self._per_uid[sub.uid] = left
        else:
            self._per_uid.pop(sub.uid, None)
        if self.on_close is not None:
            self.on_close(sub)

    def owner(self, subscriber: str) -> int | None:
        sub = self.subscribers.get(subscriber)
        return sub.uid if sub is not None and not sub.cut_off else None

    def publish(self, kind: str, key: str, **fields: Any) -> None:
        """Queue the event for every subscriber now (before the route that caused it answers)."""
        if not self.subscribers:
            return
        self.published += 1
        line = encode({"kind": kind, "key": key, **fields})
        for sub in list(self.subscribers.values()):
            sub.put(line)

    def send(self, subscribers: list[str], kind: str, key: str) -> None:
        """Queue the event for the subscribers named only (those still open)."""
        line = encode({"kind": kind, "key": key})
        for subscriber in subscribers:
            sub = self.subscribers.get(subscriber)
            if sub is not None:
                self.published += 1
                sub.put(line)

    def close(self) -> None:
        """Shutdown: every stream ends."""
        for sub in list(self.subscribers.values()):
            sub.cut_off = True
            sub.queue.put_nowait(None)
