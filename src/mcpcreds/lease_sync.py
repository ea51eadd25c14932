"""Leases for the sync `Client` (see lease_client.py for the async one and what a lease is).

`aiolimiter.AsyncLimiter` cannot serve a sync driver: it belongs to an event loop (it reads
`loop.time()` and wakes its waiters with that loop's futures) and is not thread-safe, while a sync
`Client` is used from any thread, with no loop. The share is spent here through the sidecar's own
pure `buckets.TokenBucket` under a lock, the event stream is read by a daemon thread on a blocking
socket, and renewals run on a short-lived thread, so no request waits for one.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from .buckets import TokenBucket
from .calls import Calls
from .errors import LeasesRefused, McpcredsError, RateLimited
from .lease_client import (
    MAX_EVENT_LINE,
    RETRY_AFTER_FAILURE,
    TRIGGER_CALLS,
    TRIGGER_SECONDS,
    event_effect,
    renew_now,
)
from .rates import Rate
from .socket_check import check_folder, check_peer

if TYPE_CHECKING:
    from .client import Client

OPEN_TIMEOUT = 10.0


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

    def __init__(self, client: Client, name: str, clock: Any = time.monotonic) -> None:
        self.client = client
        self.name = name
        self.clock = clock
        self.lock = threading.Lock()
        self.recent: deque[float] = deque(maxlen=TRIGGER_CALLS)
        self.disabled = False
        self.retry_at = 0.0
        self.answer: dict[str, Any] | None = None
        self.key: str | None = None
        self.lease: str | None = None
        self.terms: tuple[float, int] = (0.0, 0)
        self.terms_per = 1.0
        self.bucket: TokenBucket | None = None
        self.deadline = 0.0
        self.renew_at = 0.0
        self.used = 0
        self.since = 0.0
        self.saturated = False
        self.served = 0
        self.generation = 0
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
            with self.lock:
                now = self.clock()
                bucket, answer = self.bucket, self.answer
                live = answer is not None and now < self.deadline
                if live and bucket is not None and cost <= self.terms[1]:
                    if now >= self.renew_at and self.obtaining is None:
                        self._start_obtaining()
                    wait = bucket.wait_time(cost, now)
                    if wait == 0.0:
                        bucket.take(cost, now)
                        self.used += cost
                        self.served += 1
                        return answer
                    self.saturated = True
                    wait = min(wait, self.deadline - now)
                    waiter = None
                else:
                    if self.disabled or now < self.retry_at or live:
                        return None  # (a live lease whose burst is less than `cost`: per request)
                    self.recent.append(now)
                    often = len(self.recent) == TRIGGER_CALLS and now - self.recent[0] <= TRIGGER_SECONDS
                    if self.lease is None and not often:
                        return None
                    waiter = self.obtaining or self._start_obtaining()
            if waiter is None:
                time.sleep(wait)  # the share refills; then look again (the lease may have changed)
                continue
            waiter.wait(self.client.timeout + 1.0)
            with self.lock:
                if self.answer is None or self.bucket is None or self.clock() >= self.deadline:
                    return None

    # -- leasing

    def _start_obtaining(self) -> threading.Event:
        done = self.obtaining = threading.Event()
        threading.Thread(target=self._obtain, args=(done,), name="mcpcreds-lease", daemon=True).start()
        return done

    def _obtain(self, done: threading.Event) -> None:
        try:
            self._obtain_once()
            for _ in range(3):  # a shrunk share: say at once that we spend the smaller one; or told
                with self.lock:  # to renew while this renewal was under way
                    again, self.nudged = (self.shrunk or self.nudged) and not self.disabled, False
                if not again:
                    break
                self._obtain_once()
        finally:
            with self.lock:
                if self.obtaining is done:
                    self.obtaining = None
            done.set()

    def _obtain_once(self) -> None:
        try:
            if self.subscriber is None:
                self._listen()
            with self.lock:
                sent = self.clock()
                early = sent - self.since < self.min_window  # a nudge, a shrink: as before
                demand = None if self.bucket is None or self.saturated or sent <= self.since else \
                    self.asked if early else max(1.0, self.used / (sent - self.since) * self.terms_per * 2.0)
                self.asked = demand
                holding = self.terms if self.bucket is not None else None
                lease, subscriber = self.lease, self.subscriber
                call = Calls.lease(self.name, lease, subscriber, demand, holding)
                if self.bucket is not None and sent < self.lease_end and call.body is not None:
                    call.body["spare"] = int(self.bucket.level(sent))  # bought, live: topped up
            got = self.client.run(call)
        except LeasesRefused:
            with self.lock:
                self.disabled = True
                self._drop()
            return
        except RateLimited as exc:
            with self.lock:
                self.retry_at = self.clock() + min(exc.retry_after, 60.0)
                self._drop()
            return
        except (McpcredsError, OSError, ValueError):
            with self.lock:
                self.retry_at = self.renew_at = self.clock() + RETRY_AFTER_FAILURE
            return
        with self.lock:
            self._apply(got, sent)

    def _apply(self, got: dict[str, Any], sent: float) -> None:
        share, burst, per = float(got["share"]), int(got["burst"]), float(got["per"])
        seconds, initial = float(got["lease_seconds"]), int(got["initial"])
        self.lease, self.key, self.terms_per = str(got["lease"]), str(got["key"]), per
        if sent - self.since >= self.min_window:  # the use was measured: a new window from now
            self.used, self.since = 0, sent
        self.saturated, self.shrunk, self.min_window = False, False, seconds / 4
        if burst < 1 or share <= 0.0:
            self.terms, self.bucket, self.answer = (0.0, 0), None, None
            self.retry_at = sent + seconds / 2
            self.recent.clear()
            return
        shrunk = self.shrunk = self.bucket is not None and share < self.terms[0]
        # a bucket kept past its lease's end refilled meanwhile with nothing bought: not carried
        live = self.bucket is not None and sent < self.lease_end
        if (share, burst) != self.terms or not live or initial > 0:
            now = self.clock()
            bucket = TokenBucket(Rate(burst, per * burst / share), now)
            # what the sidecar moved to it and what the old one had left (taken from the shared bucket)
            carried = int(self.bucket.level(now)) if live and self.bucket is not None else 0
            bucket.take(burst - min(max(0, initial) + carried, burst), now)
            self.bucket, self.terms = bucket, (share, burst)
        if self.subscriber is None:
            return
        self.answer = {"headers": got["headers"], "fingerprint": got.get("fingerprint")}
        self.lease_end = sent + seconds
        self.deadline, self.renew_at = sent + seconds, sent if shrunk else sent + seconds / 2
        expires_at = got.get("expires_at")
        if isinstance(expires_at, int | float):
            left = expires_at - (float(got["lease_until"]) - seconds)
            self.deadline = min(self.deadline, sent + left)
            self.renew_at = min(self.renew_at, sent + left / 2)

    def _listen(self) -> None:
        head = "".join(f"{k}: {v}\r\n" for k, v in self.client._headers.items()).encode("latin-1")
        stream = SyncEventStream(str(self.client.socket_path), self.client.sidecar_uid, head)
        try:
            subscriber = stream.open()
        except BaseException:
            stream.close()
            raise
        with self.lock:
            self.stream, self.subscriber = stream, subscriber
        threading.Thread(target=self._read, args=(stream,), name="mcpcreds-events", daemon=True).start()

    def _read(self, stream: SyncEventStream) -> None:
        try:
            while (event := stream.next_event()) is not None:
                self.on_event(event)
        except (OSError, ValueError, McpcredsError):
            pass
        finally:
            stream.close()
            with self.lock:
                if self.stream is stream:
                    self.stream, self.subscriber, self.lease = None, None, None
                    self.terms, self.bucket = (0.0, 0), None
                    self._drop()

    def on_event(self, event: dict[str, Any]) -> None:
        with self.lock:
            if renew_now(event, self.key, self.lease, self.disabled):  # fairness changed our share
                self.retry_at = 0.0
                if self.obtaining is None:
                    self._start_obtaining()
                else:
                    self.nudged = True
                return
            drop, pause = event_effect(event, self.key, self.answer)
            if pause:
                self.retry_at = max(self.retry_at, self.clock() + pause)
            if drop:
                self._drop()

    def drop(self) -> None:
        with self.lock:
            self._drop()

    def _drop(self) -> None:
        self.answer = None
        self.deadline = 0.0
        self.generation += 1

    def close(self) -> None:
        with self.lock:
            self.disabled = True
            self._drop()
            stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()
