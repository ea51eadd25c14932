"""Leases for the sync `Client` (see leaser.py for the async one and what a lease is).

`aiolimiter.AsyncLimiter` cannot serve a sync driver: it belongs to an event loop (it reads
`loop.time()` and wakes its waiters with that loop's futures) and is not thread-safe, while a sync
`Client` is used from any thread, with no loop. The share is spent here through the sidecar's own
pure `buckets.TokenBucket` under a lock, the event stream is read by a daemon thread on a blocking
socket, and leases (the first one too) are obtained on a short-lived thread while requests go per
request, so no request waits for one. A request waiting for its share is woken when the terms or
the headers change (a `threading.Condition` on the lock), as the async holder's `changed` future
does. Otherwise the rules are the async holder's, line for line, and the pure ones are shared
(lease_terms.py: `event_effect`, `renew_now`, `lease_demand`, `lease_answer`).
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
import time
from collections import deque
from functools import partial
from typing import TYPE_CHECKING, Any

from ..core.rates import Rate
from ..core.socket_check import check_folder, check_peer
from ..errors import LeasesRefused, McpcredsError, RateLimited
from ..limits.buckets import TokenBucket
from .calls import Calls
from .lease_terms import (
    ALWAYS,
    MAX_EVENT_LINE,
    RETRY_AFTER_FAILURE,
    Trigger,
    borrow_again_at,
    called_often,
    event_effect,
    lease_answer,
    lease_demand,
    renew_now,
)

if TYPE_CHECKING:
    from .calls import SidecarClient

OPEN_TIMEOUT = 10.0


class Borrow:
    """What `_take` answers when the share is spent: ask the shared bucket without waiting."""


BORROW = Borrow()


class SyncEventStream:
    """`GET /v1/events` on a blocking socket of its own."""

    def __init__(self, socket_path: str, sidecar_uid: int, head: bytes) -> None:
        self.socket_path = socket_path
        self.sidecar_uid = sidecar_uid
        self.head = head
        self.sock: socket.socket | None = None
        self.file: Any = None

    def open(self) -> str:
        check_folder(self.socket_path, self.sidecar_uid)
        sock = self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(OPEN_TIMEOUT)
        sock.connect(self.socket_path)
        check_peer(sock, self.socket_path, self.sidecar_uid)
        sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: mcpcreds\r\n" + self.head + b"\r\n")
        self.file = sock.makefile("rb")
        status = self.file.readline(1024)
        headers = []
        while (line := self.file.readline(8192)) not in (b"\r\n", b""):
            headers.append(line.lower())
        if status.startswith(b"HTTP/1.1 429 "):
            raise McpcredsError("the sidecar has no room for another event stream")
        if not status.startswith(b"HTTP/1.1 200 ") or not any(b"chunked" in h for h in headers):
            raise LeasesRefused("the sidecar refused the event stream (a grant holder, an old sidecar)")
        hello = self.next_event()
        subscriber = hello.get("subscriber") if hello is not None else None
        if not isinstance(subscriber, str):
            raise McpcredsError("the sidecar's event stream did not start with its hello")
        sock.settimeout(None)  # from now on it waits for events as long as it takes
        return subscriber

    def next_event(self) -> dict[str, Any] | None:
        size = int(self.file.readline(64).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return None
        if size > MAX_EVENT_LINE:
            raise McpcredsError("an event line is too long")
        data = self.file.read(size + 2)
        if len(data) != size + 2:
            return None
        event = json.loads(data[:-2])
        return event if isinstance(event, dict) else {}

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread
            sock.close()


class SyncLeaser:
    """One sync `auth`'s lease on one server; every method is thread-safe."""

    def __init__(self, client: SidecarClient, name: str, clock: Any = time.monotonic,
                 trigger: Trigger = ALWAYS) -> None:
        self.client = client
        self.trigger = trigger
        self.name = name
        self.clock = clock
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # notified when terms or headers change
        self.recent: deque[float] = deque(maxlen=trigger.calls)
        self.disabled = False  # the sidecar refused leases for this server, or closed
        self.retry_at = 0.0  # no lease asked for before this (monotonic)
        self.answer: dict[str, Any] | None = None  # headers and fingerprint, while usable
        self.key: str | None = None
        self.lease: str | None = None
        self.terms: tuple[float, int] = (0.0, 0)
        self.terms_per = 1.0  # the period of the rate, from the last lease
        self.bucket: TokenBucket | None = None
        self.deadline = 0.0
        self.renew_at = 0.0
        self.used = 0
        self.since = 0.0
        self.saturated = False  # a request waited for the share since the last lease
        self.asked_all = True  # the last lease asked for all it could get (no demand named)
        self.served = 0  # requests served from the lease
        self.borrowed = 0  # requests served from the shared bucket's stock while the share was spent
        self.borrow_at = 0.0  # the shared bucket is not asked for such a permit before this
        self.generation = 0  # bumped whenever what is leased is dropped
        self.subscriber: str | None = None
        self.stream: SyncEventStream | None = None
        self.obtaining: threading.Event | None = None  # set when the obtain under way ends
        self.lease_end = 0.0  # the end of the last lease obtained (drop() does not move it)
        self.nudged = False  # told to renew while a renewal was under way: renew again after it
        self.shrunk = False  # the last lease gave a smaller share: the sidecar waits to hear we spend it
        self.asked: float | None = None  # the demand the last lease asked for
        self.min_window = 0.0  # a quarter of the lease: less use than that measures nothing

    # -- the hot path

    def take(self, cost: int) -> dict[str, Any] | None:
        """Leased headers with `cost` permits spent in-process, or None: ask per request."""
        while True:
            got = self._take(cost)
            if not isinstance(got, Borrow):
                return got
            borrowed = self._borrow(cost)  # (the lock is not held across the round trip)
            if borrowed is not None:
                return borrowed

    def _borrow(self, cost: int) -> dict[str, Any] | None:
        """The share is spent: a permit and headers from the shared bucket if it has one now (no
        wait: refused at once otherwise, and asked again when it said it would have one); one such
        ask at a time (`_take` set `borrow_at` to inf). None: wait for the share."""
        try:
            got = self.client.run(Calls.call(self.name, cost, 0.0))
        except RateLimited as exc:
            with self.lock:
                self.borrow_at = borrow_again_at(self.clock(), exc.retry_after, self.terms_per)
            return None
        except (McpcredsError, OSError, ValueError):
            with self.lock:
                self.borrow_at = borrow_again_at(self.clock(), None, self.terms_per)
            return None
        with self.lock:
            self.borrow_at = 0.0
            self.borrowed += 1
        return got

    def _take(self, cost: int) -> dict[str, Any] | Borrow | None:
        """`take` under the lock; BORROW: ask the shared bucket (`_borrow`), then take again."""
        with self.lock:
            renewal_awaited = False
            while True:
                now = self.clock()
                bucket, answer = self.bucket, self.answer
                live = answer is not None and now < self.deadline
                if not (live and bucket is not None and cost <= self.terms[1]):
                    if self.disabled or now < self.retry_at or live:
                        return None  # (a live lease whose burst is less than `cost`: per request)
                    if self.lease is None and not called_often(self.recent, now, self.trigger.seconds):
                        return None
                    obtaining = self.obtaining or self._start_obtaining()
                    if renewal_awaited or answer is not None or bucket is None or now >= self.lease_end \
                            or cost > self.terms[1]:
                        return None  # per request until the lease is there (buying it may wait for permits)
                    # the headers were dropped (a new login, an invalidation) while the share is
                    # still ours: wait for the renewal that brings the new ones, rather than ask
                    # per request from the shared bucket, which refills at the rate less every share
                    renewal_awaited = True
                    self.changed.wait_for(partial(self._renewed, obtaining), self.lease_end - now)
                    continue
                if now >= self.renew_at and self.obtaining is None:
                    self._start_obtaining()
                wait = bucket.wait_time(cost, now)
                if wait == 0.0:
                    bucket.take(cost, now)
                    self.used += cost
                    self.served += 1
                    return answer
                # the share has no room now: wait for it, unless the lease changes first (new
                # terms, dropped headers), then take anew from what replaced it. A share smaller
                # than what is used is asked to grow at once (the renewal asks for all it can get)
                self.saturated = True
                if not self.asked_all and self.obtaining is None:
                    self._start_obtaining()
                if now >= self.borrow_at:
                    self.borrow_at = math.inf
                    return BORROW
                self.changed.wait(min(wait, self.deadline - now))

    def _renewed(self, renewal: threading.Event) -> bool:
        """New headers came, or `renewal` ended without them (the lock is held)."""
        return self.answer is not None or self.obtaining is not renewal

    def _changed(self) -> None:
        """Wake the requests waiting for the old terms or headers (the lock is held)."""
        self.changed.notify_all()

    # -- leasing

    def _start_obtaining(self) -> threading.Event:
        """Obtain a lease on a thread (the lock is held); the event is set when it is done."""
        done = self.obtaining = threading.Event()
        threading.Thread(target=self._obtain, args=(done,), name="mcpcreds-lease", daemon=True).start()
        return done

    def _obtain(self, done: threading.Event) -> None:
        try:
            while True:
                ok = self._obtain_once()
                with self.lock:
                    # say at once that we spend a smaller share, or renew as told meanwhile
                    again = (self.nudged or (ok and self.shrunk)) and not self.disabled
                    self.nudged = False
                    if not again:  # (in the same hold of the lock as the check: no nudge is lost)
                        if self.obtaining is done:
                            self.obtaining = None
                        break
        finally:
            with self.lock:
                if self.obtaining is done:
                    self.obtaining = None
                self._changed()  # (requests waiting for this renewal: it has ended)
            done.set()

    def _obtain_once(self) -> bool:
        """Ask for a lease or its renewal and apply the answer: True when leased headers came."""
        try:
            if self.subscriber is None and not self._listen():
                return False
            with self.lock:
                if self.disabled:
                    return False
                sent, generation = self.clock(), self.generation
                demand = lease_demand(self.bucket is not None, self.saturated, sent, self.since,
                                      self.min_window, self.asked, self.used, self.terms_per)
                self.asked_all, self.asked = demand is None, demand
                holding = self.terms if self.bucket is not None else None
                call = Calls.lease(self.name, self.lease, self.subscriber, demand, holding,
                    self.trigger.least)
                if self.bucket is not None and sent < self.lease_end and call.body is not None:
                    # what our bucket has left, bought under a lease still live: topped up to the burst
                    call.body["spare"] = int(self.bucket.level(sent))
            got = self.client.run(call)
        except LeasesRefused:
            with self.lock:
                self.disabled = True
                self._drop()
            return False
        except RateLimited as exc:
            with self.lock:
                self.retry_at = self.clock() + min(exc.retry_after, 60.0)
                self._drop()
            return False
        except (McpcredsError, OSError, ValueError):
            with self.lock:
                self.retry_at = self.renew_at = self.clock() + RETRY_AFTER_FAILURE
            return False
        with self.lock:
            return self._apply(got, sent, generation)

    def _apply(self, got: dict[str, Any], sent: float, generation: int) -> bool:
        if self.disabled:  # closed while the answer was on its way: nothing of it is used
            return False
        new = lease_answer(got, sent, self.clock(), since=self.since, min_window=self.min_window,
                           terms=self.terms, held=self.bucket is not None, lease_end=self.lease_end)
        self.lease, self.key, self.terms_per = new.lease, new.key, new.per
        if new.new_window:  # the use was measured: a new window from now
            self.used, self.since = 0, sent
        self.saturated, self.min_window = False, new.min_window
        if new.not_now:  # not now: per request, and ask again half a lease later
            self.terms, self.bucket, self.answer = new.terms, None, None
            self._changed()
            self.retry_at = new.retry_at
            self.recent.clear()
            return False
        self.shrunk = new.shrunk
        if new.rebuild:
            now = self.clock()
            bucket = TokenBucket(Rate(new.burst, new.refill_period), now)
            carried = int(self.bucket.level(now)) if new.carry and self.bucket is not None else 0
            bucket.take(new.burst - new.start(carried), now)
            self.bucket, self.terms = bucket, new.terms
            self._changed()
        if self.subscriber is None:  # the stream ended meanwhile: nothing leased is usable
            return False
        if self.generation != generation:  # dropped while this answer came: its headers may be
            self.lease_end, self.nudged = new.lease_end, True  # the dropped ones; ask again
            return False
        self.answer = new.answer
        self._changed()  # (requests waiting for new headers: here they are)
        self.lease_end = new.lease_end
        self.deadline, self.renew_at = new.usable_until()
        return True

    def _listen(self) -> bool:
        """Open the event stream and start its reader: False when closed meanwhile."""
        head = "".join(f"{k}: {v}\r\n" for k, v in self.client._headers.items()).encode("latin-1")
        stream = SyncEventStream(str(self.client.socket_path), self.client.sidecar_uid, head)
        try:
            subscriber = stream.open()
        except BaseException:
            stream.close()
            raise
        with self.lock:
            if self.disabled:  # closed while it opened: no stream (nor reader) is left behind
                stream.close()
                return False
            self.stream, self.subscriber = stream, subscriber
        threading.Thread(target=self._read, args=(stream,), name="mcpcreds-events", daemon=True).start()
        return True

    def _read(self, stream: SyncEventStream) -> None:
        try:
            while (event := stream.next_event()) is not None:
                self.on_event(event)
        except (OSError, ValueError, McpcredsError):
            pass
        finally:
            stream.close()
            with self.lock:
                if self.stream is stream:  # the sidecar is gone, or cut us off: drop everything
                    self.stream, self.subscriber, self.lease = None, None, None
                    self.terms, self.bucket = (0.0, 0), None
                    self._drop()

    def on_event(self, event: dict[str, Any]) -> None:
        """Drop the leased headers when the sidecar says they may no longer be used; renew at once
        when it says so (a `lease` event: fairness has changed our share)."""
        with self.lock:
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
                self._drop()

    def drop(self) -> None:
        """Stop using the leased headers now; the share (if any) stays until renewed."""
        with self.lock:
            self._drop()

    def _drop(self) -> None:
        self.answer = None
        self.deadline = 0.0
        self.generation += 1
        self._changed()

    def close(self) -> None:
        """Give everything up: closing the stream hands the shares back at once; a lease still on
        its way is not used (nor is a stream opened for it)."""
        with self.lock:
            self.disabled = True
            self._drop()
            stream, self.stream = self.stream, None
            self.subscriber, self.lease = None, None
            self.terms, self.bucket = (0.0, 0), None
        if stream is not None:
            stream.close()
