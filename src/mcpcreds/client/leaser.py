"""The client's side of capacity leases (see leases.py for the sidecar's): permits and headers
inside the process, with no round trip, for an `auth=creds.auth(name)` that calls often.

Where a lease pays (lease_terms.py `Trigger`: by default after `AUTO_CALLS` calls within
`AUTO_SECONDS`, for a share of at least `AUTO_LEAST` a second; with `lease=True` after
`TRIGGER_CALLS` within `TRIGGER_SECONDS`, for any share), the auth opens the event stream
(`GET /v1/events`) and asks for a lease tied to it. Its share is spent through an
`aiolimiter.AsyncLimiter` (capacity = the burst share, refilled at the rate share), which starts
with the `initial` permits the sidecar moved to it; the leased headers are used until the lease
ends (`lease_seconds` after the request was *sent*: never past the sidecar's end of it), an event
drops them (invalidate, rotation, a new login, a pause), or the stream ends (then everything
leased is dropped: without events a credential could outlive its invalidation). The lease is
renewed in the background at half its length, asking for what was used (with room to grow).
A refusal (`leases = false`, a signed server, a grant holder) turns leasing off for this auth;
a share of 0 ("not now") is asked again half a lease later. A holder whose share is spent asks the
shared bucket for a permit without waiting (`_borrow`: its stock would stand idle meanwhile) and,
refused, waits for its share and asks the shared bucket again only when it said it would have one.
Every failure falls back to the per-request `call`.

The sync `Client` leases through leaser_sync.py: `AsyncLimiter` is bound to an event loop (it
reads `loop.time()` and wakes waiters with loop futures) and is not thread-safe, so the sync
holder spends its share through a `buckets.TokenBucket` under a lock and reads the event stream
on a thread of its own. The rules both follow (what an event means, when to renew now, what
demand to ask for, what a lease answer makes of the lease held) are the pure functions of
lease_terms.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from aiolimiter import AsyncLimiter

from ..core.socket_check import check_folder, check_peer
from ..errors import LeasesRefused, McpcredsError, RateLimited
from .calls import Calls
from .lease_terms import (
    ALWAYS,
    MAX_EVENT_LINE,
    RETRY_AFTER_FAILURE,
    Trigger,
    available,
    borrow_again_at,
    called_often,
    event_effect,
    lease_answer,
    lease_demand,
    renew_now,
)

if TYPE_CHECKING:
    from .calls import AsyncSidecarClient


class EventStream:
    """`GET /v1/events` on its own connection to the sidecar (checked like every connection)."""

    def __init__(self, socket_path: str, sidecar_uid: int, head: bytes) -> None:
        self.socket_path = socket_path
        self.sidecar_uid = sidecar_uid
        self.head = head
        self.writer: asyncio.StreamWriter | None = None
        self.reader: asyncio.StreamReader | None = None

    async def open(self) -> str:
        """Connect and read the hello line: the subscriber id."""
        check_folder(self.socket_path, self.sidecar_uid)
        self.reader, self.writer = await asyncio.open_unix_connection(self.socket_path)
        check_peer(self.writer.get_extra_info("socket"), self.socket_path, self.sidecar_uid)
        self.writer.write(b"GET /v1/events HTTP/1.1\r\nHost: mcpcreds\r\n" + self.head + b"\r\n")
        head = await self.reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 429 "):  # as many streams as it may: maybe later
            raise McpcredsError("the sidecar has no room for another event stream")
        if not head.startswith(b"HTTP/1.1 200 ") or b"chunked" not in head.lower():
            raise LeasesRefused("the sidecar refused the event stream (a grant holder, an old sidecar)")
        hello = await self.next_event()
        subscriber = hello.get("subscriber") if hello is not None else None
        if not isinstance(subscriber, str):
            raise McpcredsError("the sidecar's event stream did not start with its hello")
        return subscriber

    async def next_event(self) -> dict[str, Any] | None:
        """The next event; None when the stream ended."""
        assert self.reader is not None
        size_line = await self.reader.readline()
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return None
        if size > MAX_EVENT_LINE:
            raise McpcredsError("an event line is too long")
        data = await self.reader.readexactly(size + 2)
        event = json.loads(data[:-2])
        return event if isinstance(event, dict) else {}

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class AsyncLeaser:
    """One `auth`'s lease on one server, on the event loop it was first used on."""

    def __init__(self, client: AsyncSidecarClient, name: str, clock: Any = time.monotonic,
                 trigger: Trigger = ALWAYS) -> None:
        self.client = client
        self.trigger = trigger
        self.name = name
        self.clock = clock
        self.loop = asyncio.get_running_loop()
        self.recent: deque[float] = deque(maxlen=trigger.calls)
        self.disabled = False  # the sidecar refused leases for this server
        self.retry_at = 0.0  # no lease asked for before this (monotonic)
        self.answer: dict[str, Any] | None = None  # headers and fingerprint, while usable
        self.key: str | None = None
        self.lease: str | None = None
        self.terms: tuple[float, int] = (0.0, 0)
        self.burst = 0  # terms[1], read on the hot path
        self.limiter: AsyncLimiter | None = None
        self.deadline = 0.0
        self.renew_at = 0.0
        self.used = 0
        self.since = 0.0
        self.generation = 0  # bumped whenever what is leased is dropped
        self.subscriber: str | None = None
        self.stream: EventStream | None = None
        self.listener: asyncio.Task[None] | None = None
        self.obtaining: asyncio.Task[bool] | None = None
        self.terms_per = 1.0  # the period of the rate, from the last lease
        self.served = 0  # requests served from the lease
        self.borrowed = 0  # requests served from the shared bucket's stock while the share was spent
        self.borrow_at = 0.0  # the shared bucket is not asked for such a permit before this
        self.saturated = False  # a request waited for the share since the last lease
        self.asked_all = True  # the last lease asked for all it could get (no demand named)
        self.asked: float | None = None  # the demand the last lease asked for
        self.min_window = 0.0  # a quarter of the lease: less use than that measures nothing
        self.changed: asyncio.Future[None] | None = None  # set when terms or headers change
        self.lease_end = 0.0  # the end of the last lease obtained (drop() does not move it)
        self.nudged = False  # told to renew while a renewal was under way: renew again after it
        self.shrunk = False  # the last lease gave a smaller share: the sidecar waits to hear we spend it

    # -- the hot path

    async def take(self, cost: int) -> dict[str, Any] | None:
        """Leased headers with `cost` permits spent in-process, or None: ask per request."""
        answer, limiter = self.answer, self.limiter
        now = self.clock()
        if answer is not None and limiter is not None and now < self.deadline and cost <= self.burst:
            if now >= self.renew_at and self.obtaining is None:
                self._start_obtaining()
            if limiter.has_capacity(cost):
                await limiter.acquire(cost)  # at once: nothing can change in between
                self.used += cost
                self.served += 1
                return answer
            if now >= self.borrow_at and (borrowed := await self._borrow(cost)) is not None:
                return borrowed
            return await self._wait(limiter, cost, self.clock())
        if self.disabled or now < self.retry_at or (answer is not None and now < self.deadline):
            return None  # (a live lease whose burst is less than `cost`: per request)
        if self.lease is None and not called_often(self.recent, now, self.trigger.seconds):
            return None
        obtaining = self.obtaining or self._start_obtaining()
        if answer is None and limiter is not None and now < self.lease_end and cost <= self.burst:
            # the headers were dropped (a new login, an invalidation) while the share is still
            # ours: wait for the renewal that brings the new ones, rather than ask per request
            # from the shared bucket, which refills at the rate less every share (a wait there
            # while this share goes unspent)
            for _ in range(2):  # (one more when the first answer came as the headers were dropped)
                await asyncio.wait((obtaining,), timeout=max(0.0, self.lease_end - self.clock()))
                if self.answer is not None:
                    return await self.take(cost)
                if self.obtaining is None:
                    break
                obtaining = self.obtaining
        return None  # per request until the lease is there (buying it may wait for permits)

    async def _borrow(self, cost: int) -> dict[str, Any] | None:
        """The share is spent: a permit and headers from the shared bucket if it has one now (no
        wait: it is refused at once otherwise, and asked again when it said it would have one);
        one such ask at a time. None: wait for the share."""
        self.saturated = True  # (the share held requests back: the renewal asks for all it can get)
        self.borrow_at = math.inf
        try:
            got = await self.client.run(Calls.call(self.name, cost, 0.0))
        except RateLimited as exc:
            self.borrow_at = borrow_again_at(self.clock(), exc.retry_after, self.terms_per)
            return None
        except (McpcredsError, OSError, ValueError, asyncio.IncompleteReadError):
            self.borrow_at = borrow_again_at(self.clock(), None, self.terms_per)
            return None
        self.borrow_at = 0.0
        self.borrowed += 1
        return got

    async def _wait(self, limiter: AsyncLimiter, cost: int, now: float) -> dict[str, Any] | None:
        """The share has no room now: wait for it, unless the lease changes first (new terms, or
        dropped headers), then take anew from what replaced it. A share smaller than what is
        used is asked to grow at once (the renewal asks for all it can get)."""
        self.saturated = True
        if not self.asked_all and self.obtaining is None:
            self._start_obtaining()
        changed = self.changed
        if changed is None or changed.done():
            changed = self.changed = asyncio.get_running_loop().create_future()
        acquiring = asyncio.ensure_future(limiter.acquire(cost))
        try:
            await asyncio.wait((acquiring, changed), timeout=max(0.0, self.deadline - now),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not acquiring.done():
                acquiring.cancel()  # aiolimiter drops a cancelled waiter
        if acquiring.done() and not acquiring.cancelled() and limiter is self.limiter \
                and self.answer is not None and self.clock() < self.deadline:
            self.used += cost
            self.served += 1
            return self.answer
        if changed.done() or limiter is not self.limiter:
            return await self.take(cost)  # a permit of old terms is void: take one anew
        return None

    def _changed(self) -> None:
        """Wake the requests waiting for the old terms or headers."""
        changed, self.changed = self.changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    # -- leasing

    def _start_obtaining(self) -> asyncio.Task[bool]:
        task = self.obtaining = asyncio.ensure_future(self._obtain())
        task.add_done_callback(self._obtained)
        return task

    def _obtained(self, task: asyncio.Task[bool]) -> None:
        if self.obtaining is task:
            self.obtaining = None
        ok = not task.cancelled() and task.exception() is None
        # say at once that we spend a smaller share (not at a take), or renew as told meanwhile
        again = ok and (self.nudged or (task.result() and self.shrunk))
        self.nudged = False
        if again and not self.disabled and self.obtaining is None:
            self._start_obtaining()

    def _demand(self, now: float, per: float) -> float | None:
        """Permits per period to ask for: None (as many as the sidecar gives) without a share or
        when the share was what held requests back; else twice what was used."""
        return lease_demand(self.limiter is not None, self.saturated, now, self.since, self.min_window,
                            self.asked, self.used, per)

    async def _obtain(self) -> bool:
        try:
            if self.subscriber is None:
                await self._listen()
            sent, generation = self.clock(), self.generation
            demand = self._demand(sent, self.terms_per)
            holding = self.terms if self.limiter is not None else None
            self.asked_all, self.asked = demand is None, demand
            call = Calls.lease(self.name, self.lease, self.subscriber, demand, holding,
                self.trigger.least)
            if self.limiter is not None and sent < self.lease_end and call.body is not None:
                # what our bucket has left, bought under a lease still live: topped up to the burst
                call.body["spare"] = available(self.limiter)
            got = await self.client.run(call)
        except LeasesRefused:
            self.disabled = True
            self.drop()
            return False
        except RateLimited as exc:
            self.retry_at = self.clock() + min(exc.retry_after, 60.0)
            self.drop()
            return False
        except (McpcredsError, OSError, ValueError, asyncio.IncompleteReadError):
            self.retry_at = self.renew_at = self.clock() + RETRY_AFTER_FAILURE
            return False
        new = lease_answer(got, sent, self.clock(), since=self.since, min_window=self.min_window,
                           terms=self.terms, held=self.limiter is not None, lease_end=self.lease_end)
        self.lease, self.key, self.terms_per = new.lease, new.key, new.per
        if new.new_window:  # the use was measured: a new window from now
            self.used, self.since = 0, sent
        self.saturated, self.min_window = False, new.min_window
        if new.not_now:  # not now: per request, and ask again half a lease later
            self.terms, self.limiter, self.answer = new.terms, None, None
            self._changed()
            self.retry_at = new.retry_at
            self.recent.clear()
            return False
        self.shrunk = new.shrunk
        if new.rebuild:
            limiter = AsyncLimiter(new.burst, new.refill_period)
            start = new.start(available(self.limiter) if new.carry and self.limiter is not None else 0)
            if new.burst - start > 0:
                await limiter.acquire(new.burst - start)
            self.limiter, self.terms, self.burst = limiter, new.terms, new.burst
            self._changed()
        if self.subscriber is None:  # the stream ended meanwhile: nothing leased is usable
            return False
        if self.generation != generation:  # dropped while this answer came: its headers may be
            self.lease_end, self.nudged = new.lease_end, True  # the dropped ones; ask again
            return False
        self.answer = new.answer
        self.lease_end = new.lease_end
        self.deadline, self.renew_at = new.usable_until()
        return True

    async def _listen(self) -> None:
        head = "".join(f"{k}: {v}\r\n" for k, v in self.client._headers.items()).encode("latin-1")
        stream = EventStream(str(self.client.socket_path), self.client.sidecar_uid, head)
        try:
            self.subscriber = await stream.open()
        except BaseException:
            stream.close()
            raise
        self.stream = stream
        self.listener = asyncio.ensure_future(self._read(stream))

    async def _read(self, stream: EventStream) -> None:
        try:
            while (event := await stream.next_event()) is not None:
                self.on_event(event)
        except (OSError, ValueError, McpcredsError, asyncio.IncompleteReadError):
            pass
        finally:
            stream.close()
            if self.stream is stream:  # the sidecar is gone, or cut us off: drop everything
                self.stream, self.subscriber, self.lease = None, None, None
                self.terms, self.limiter = (0.0, 0), None
                self.drop()

    def on_event(self, event: dict[str, Any]) -> None:
        """Drop the leased headers when the sidecar says they may no longer be used; renew at once
        when it says so (a `lease` event: fairness has changed our share)."""
        if renew_now(event, self.key, self.lease, self.disabled):
            self.retry_at = 0.0
            if self.obtaining is None:
                self._start_obtaining()
            else:  # the renewal under way may have been answered before the sidecar said so
                self.nudged = True
            return
        drop, pause = event_effect(event, self.key, self.answer)
        if pause:
            self.retry_at = max(self.retry_at, self.clock() + pause)
        if drop:
            self.drop()

    def drop(self) -> None:
        """Stop using the leased headers now; the share (if any) stays until renewed."""
        self.answer = None
        self.deadline = 0.0
        self.generation += 1
        self._changed()

    async def aclose(self) -> None:
        """Give everything up: closing the stream hands the shares back at once."""
        self.disabled = True
        self.drop()
        for task in (self.obtaining, self.listener):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self.stream is not None:
            self.stream.close()
            self.stream = None
