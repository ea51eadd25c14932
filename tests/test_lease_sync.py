"""The sync lease holder (lease_sync.py) against the real sidecar (`mcpcreds serve`), on a fake
clock: what it asks for and when, with exact asserts on the lease requests it sends.

Each test has its own server (600/1m: leases of 60 s, far longer than a test, so the sidecar's own
clock never ends one). The holder's clock is a `FakeClock` that moves only when a test moves it,
and by 1 ms per lease call (its round trip). `LeaseCalls` is the real `Client` whose lease calls
are recorded and may be held before they are sent or before their answer is handed back, so a
test decides what is under way when. Nothing here waits on a duration for an outcome: a bound
(`BOUND`) is only crossed by a broken holder (one that blocks, or sleeps through a change).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpcreds import Client
from mcpcreds.client.calls import Call
from mcpcreds.client.leaser_sync import SyncLeaser
from tests.sidecar_proc import SidecarProcess, run_sidecar

BOUND = 20.0  # seconds; a share of 1 a minute refills in 60: a waiter that is not woken crosses it
GATE = 10.0  # seconds a held lease call waits for its gate before it fails (a test that forgot it)
SERVERS = ("first", "renew", "grow", "closed", "nudged", "failed", "stale", "borrow")

CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["dir:{secrets}"]
"""
SERVER = """
[services.NAME]
endpoint = "http://127.0.0.1:9/mcp"
headers = { "Authorization" = "Bearer {{secret:TOKEN}}" }
rate = "600/1m"
[[servers]]
name = "NAME"
service = "NAME"
"""


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


class LeaseCalls(Client):
    """The real `Client`; its lease calls are recorded (`bodies`), held while `send` (before the
    request) or `hand` (before the answer is handed back) is clear, and take 1 ms of `clock`."""

    def __init__(self, socket: Path, clock: FakeClock) -> None:
        super().__init__(socket)
        self.clock = clock
        self.bodies: list[dict[str, Any]] = []
        self.send, self.hand = threading.Event(), threading.Event()
        self.send.set()
        self.hand.set()
        self.answered = threading.Condition()  # notified when a call is sent or answered
        self.held = 0  # answers waiting at `hand`
        self.fail: set[int] = set()  # the lease calls (1, 2, ...) that fail, as a lost sidecar would

    def run(self, call: Call[Any]) -> Any:
        if not call.path.endswith("/lease"):
            return super().run(call)
        with self.answered:
            self.bodies.append(dict(call.body or {}))
            self.answered.notify_all()
        assert self.send.wait(GATE), "a lease call held before its request was never let go"
        if len(self.bodies) in self.fail:
            raise OSError("the test's sidecar connection failed")
        got = super().run(call)
        self.clock.advance(0.001)
        with self.answered:
            self.held += 1
            self.answered.notify_all()
        try:
            assert self.hand.wait(GATE), "a lease answer held was never let go"
        finally:
            with self.answered:
                self.held -= 1
        return got


@pytest.fixture(scope="module")
def socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("lease-sync")
    secrets = tmp / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "TOKEN").write_text("sync-lease-token-0123456789")
    (secrets / "TOKEN").chmod(0o600)
    (tmp / "run").mkdir(mode=0o700)
    config = tmp / "config.toml"
    servers = "".join(SERVER.replace("NAME", name) for name in SERVERS)
    config.write_text(CONFIG.format(socket=tmp / "run" / "s.sock", secrets=secrets) + servers)
    sidecar: SidecarProcess
    with run_sidecar(config, tmp / "run" / "s.sock") as sidecar:
        yield sidecar.socket


def leased(leaser: SyncLeaser, client: LeaseCalls) -> None:
    """Three calls at one instant: the third asks for a lease (in the background); wait for it."""
    assert [leaser.take(1) for _ in range(3)] == [None, None, None]
    done = leaser.obtaining
    assert done is not None and done.wait(BOUND) and leaser.answer is not None


def test_no_request_waits_for_the_first_lease(socket: Path) -> None:
    """The third call within a second starts the lease and is answered None (per request) while
    the lease call is still held, as are the calls after it; once the lease is there, a call is
    served from it. The first lease asks for all it can get: no demand, nothing held, no spare."""
    clock = FakeClock()
    with LeaseCalls(socket, clock) as client:
        leaser = SyncLeaser(client, "first", clock=clock)
        client.send.clear()
        assert [leaser.take(1) for _ in range(3)] == [None, None, None]
        done = leaser.obtaining
        assert done is not None and not done.is_set()  # the lease call is still held
        assert leaser.take(1) is None and leaser.obtaining is done  # one lease call under way
        client.send.set()
        assert done.wait(BOUND)
        assert client.bodies == [{"subscriber": leaser.subscriber}]
        answer = leaser.take(1)
        assert answer is not None and answer["headers"] == {"Authorization": "Bearer sync-lease-token-0123456789"}
        assert leaser.served == 1 and leaser.terms == (599.0, 299)
        leaser.close()


def test_the_renewal_runs_while_requests_spend_the_share_and_carries_what_is_left(socket: Path) -> None:
    """At half the lease a request is served from the share at once and starts the renewal; more
    are served while it is under way. The renewal holds the terms being spent, asks for twice what
    was used, and says what the bucket has left (`spare`). Its smaller share is said at once (a
    second renewal holding it, asking the same demand: under a quarter of a lease measures
    nothing), and the new bucket starts with the permits the old one had left (up to its burst),
    not empty: the sidecar moved none to it (it had more than the new burst)."""
    clock = FakeClock()
    with LeaseCalls(socket, clock) as client:
        leaser = SyncLeaser(client, "renew", clock=clock)
        leased(leaser, client)
        assert leaser.terms == (599.0, 299)
        for _ in range(10):
            assert leaser.take(1) is not None
        clock.now = leaser.renew_at  # 30 s after the lease was asked for
        client.send.clear()
        assert leaser.take(1) is not None  # served, and the renewal started
        done = leaser.obtaining
        assert done is not None and not done.is_set()
        with client.answered:  # the renewal's request is made (and held)
            assert client.answered.wait_for(lambda: len(client.bodies) == 2, BOUND)
        for _ in range(4):
            assert leaser.take(1) is not None
        assert leaser.served == 15 and not done.is_set()
        client.send.set()
        assert done.wait(BOUND)
        _, renewal, shrink = client.bodies
        lease, subscriber = leaser.lease, leaser.subscriber
        # 11 permits in 30 s of a 60 s period, twice; refilled in 30 s, less the one just taken
        assert renewal == {"holding": [599.0, 299], "lease": lease, "subscriber": subscriber,
                           "demand": 44.0, "spare": 298}
        assert shrink == {"holding": [44.0, 22], "lease": lease, "subscriber": subscriber,
                          "demand": 44.0, "spare": 22}
        assert leaser.terms == (44.0, 22)
        assert leaser.bucket is not None and leaser.bucket.level(clock()) == 22.0  # carried
        leaser.close()


def test_a_share_that_holds_requests_back_grows_at_once_and_wakes_the_waiter(socket: Path) -> None:
    """A `lease` event ("renew now") 15 s in: the renewal asks for what was used (none: 1 a
    minute) and gets a share of 1, burst 1. The one permit is spent; the next request waits for
    the share (60 s to refill on a clock that does not move). Having asked for less than it uses,
    the holder renews at once asking for all, and the waiting request is woken by the new terms and
    served from them (the sidecar moved permits to the new bucket)."""
    clock = FakeClock()
    with LeaseCalls(socket, clock) as client:
        leaser = SyncLeaser(client, "grow", clock=clock)
        leased(leaser, client)
        clock.advance(15.0)
        leaser.on_event({"kind": "lease", "key": leaser.key})
        done = leaser.obtaining
        assert done is not None and done.wait(BOUND)
        assert [b.get("demand") for b in client.bodies] == [None, 1.0, 1.0]  # asked; said it spends 1
        assert leaser.terms == (1.0, 1) and not leaser.asked_all
        assert leaser.take(1) is not None
        leaser.borrow_at = math.inf  # (the shared bucket's stock is not asked: this is about the share)
        got: list[dict[str, Any] | None] = []
        waiter = threading.Thread(target=lambda: got.append(leaser.take(1)))
        waiter.start()
        waiter.join(BOUND)
        assert not waiter.is_alive(), "the waiting request was not served from the grown share"
        assert got == [leaser.answer] and leaser.served == 2
        assert client.bodies[3] == {"holding": [1.0, 1], "lease": leaser.lease,
                                    "subscriber": leaser.subscriber, "spare": 0}  # all it can get
        assert leaser.terms[0] > 1.0
        leaser.close()


def test_a_lease_answered_after_close_is_not_used(socket: Path) -> None:
    """The client closes while a lease's answer is on its way: the answer is not used (the event
    stream that would say it is invalidated is closed), and nothing is reopened for it."""
    clock = FakeClock()
    with LeaseCalls(socket, clock) as client:
        leaser = SyncLeaser(client, "closed", clock=clock)
        client.hand.clear()
        assert [leaser.take(1) for _ in range(3)] == [None, None, None]
        done = leaser.obtaining
        assert done is not None
        with client.answered:  # the sidecar has granted it; the answer is held
            assert client.answered.wait_for(lambda: client.held == 1, BOUND)
        leaser.close()
        client.hand.set()
        assert done.wait(BOUND)
        assert leaser.answer is None and leaser.take(1) is None and leaser.served == 0
        assert leaser.stream is None and leaser.subscriber is None and leaser.bucket is None


def test_a_nudge_while_a_renewal_is_under_way_renews_again_after_it(socket: Path) -> None:
    """A `lease` event arrives while the renewal it would start is already under way (its answer
    may predate what the sidecar changed): one more renewal follows it, and only one."""
    clock = FakeClock()
    with LeaseCalls(socket, clock) as client:
        leaser = SyncLeaser(client, "nudged", clock=clock)
        leased(leaser, client)
        client.send.clear()
        leaser.on_event({"kind": "lease", "key": leaser.key})
        done = leaser.obtaining
        assert done is not None
        with client.answered:
            assert client.answered.wait_for(lambda: len(client.bodies) == 2, BOUND)
        leaser.on_event({"kind": "lease", "key": leaser.key})
        leaser.on_event({"kind": "lease", "key": leaser.key})
        assert leaser.obtaining is done  # no second renewal at the same time
        client.send.set()
        assert done.wait(BOUND)
        assert len(client.bodies) == 3 and leaser.obtaining is None and not leaser.nudged
        assert leaser.answer is not None and leaser.terms == (599.0, 299)
        leaser.close()


def test_a_failed_renewal_after_a_shrink_is_not_repeated_at_once(socket: Path) -> None:
    """A renewal shrinks the share; the renewal that says so fails (the sidecar is unreachable):
    it is tried again a second later (at a request), not at once in a loop."""
    clock = FakeClock()
    with LeaseCalls(socket, clock) as client:
        leaser = SyncLeaser(client, "failed", clock=clock)
        leased(leaser, client)
        clock.advance(15.0)
        client.fail.add(3)
        leaser.on_event({"kind": "lease", "key": leaser.key})
        done = leaser.obtaining
        assert done is not None and done.wait(BOUND)
        assert [b.get("demand") for b in client.bodies] == [None, 1.0, 1.0]  # the third one failed
        assert leaser.terms == (1.0, 1) and leaser.shrunk and leaser.obtaining is None
        assert leaser.renew_at == leaser.retry_at == clock() + 1.0
        clock.advance(1.0)
        assert leaser.take(1) is not None  # served from the share; the renewal starts now
        done = leaser.obtaining
        assert done is not None and done.wait(BOUND)
        assert len(client.bodies) == 4 and client.bodies[3]["holding"] == [1.0, 1]
        leaser.close()


def test_an_answer_that_comes_after_its_headers_were_dropped_is_not_used_for_them(socket: Path) -> None:
    """A renewal is under way when the token changes and an invalidation drops the leased headers:
    its answer carries the old token, so its share is applied but its headers are not, and the
    holder asks again at once; the next request waits for that and is served the new token."""
    clock = FakeClock()
    token = socket.parent.parent / "secrets" / "TOKEN"
    with LeaseCalls(socket, clock) as client, Client(socket) as admin:
        leaser = SyncLeaser(client, "stale", clock=clock)
        leased(leaser, client)
        clock.advance(30.0)  # half of the 60 s lease: the next take renews
        client.hand.clear()
        assert leaser.take(1) is not None  # served from the lease; the renewal's answer is held
        with client.answered:
            assert client.answered.wait_for(lambda: client.held == 1, BOUND)
        try:
            token.write_text("sync-lease-token-new-0123456789")
            admin.invalidate("stale")
            leaser.on_event({"kind": "invalidate", "key": leaser.key})  # (as its event stream would)
            assert leaser.answer is None
            client.hand.set()
            answer = leaser.take(1)  # waits for the renewal asked again, not the held answer
            assert answer is not None
            assert answer["headers"] == {"Authorization": "Bearer sync-lease-token-new-0123456789"}
        finally:
            token.write_text("sync-lease-token-0123456789")
            admin.invalidate("stale")
        leaser.close()


def test_a_holder_whose_share_is_spent_is_served_from_the_shared_stock_then_waits_for_its_share(
        socket: Path) -> None:
    """The share spent, a request is served at once from what the shared bucket holds (a `call`
    that does not wait), not left waiting for the share while that stock stands idle. Once the
    shared bucket refuses (empty, and refilled at the rate less the share), the holder asks it no
    more until it said it would have a permit, and waits for its own share."""
    clock = FakeClock()
    with LeaseCalls(socket, clock) as client:
        leaser = SyncLeaser(client, "borrow", clock=clock)
        leased(leaser, client)
        assert leaser.terms == (599.0, 299)
        answer = leaser.answer
        while (borrowed := leaser.take(1)) == answer:  # what the lease moved to its bucket
            assert leaser.served <= 299
        assert borrowed is not None and borrowed["granted"] == 1  # a permit of the shared bucket
        assert answer is not None and borrowed["headers"] == answer["headers"] and leaser.borrowed == 1
        got: list[dict[str, Any] | None] = []
        stop = threading.Event()

        def drain() -> None:  # borrows until the shared bucket refuses, then waits for the share
            while not stop.is_set():
                got.append(leaser.take(1))

        waiter = threading.Thread(target=drain)
        waiter.start()
        deadline = time.monotonic() + BOUND
        while not 0.0 < leaser.borrow_at < math.inf:  # until a borrow was refused
            assert time.monotonic() < deadline, "the shared bucket never refused"
            time.sleep(0.001)
        # not asked again before it said it would have a permit (the holder's clock has not moved)
        assert leaser.borrowed < 301 and leaser.borrow_at > clock()
        (bucket,) = [b for b in client.status()["buckets"] if b["key"] == "service:borrow"]
        assert bucket["refused"] == 1 and waiter.is_alive()  # waiting for the share
        stop.set()
        clock.advance(1.0)  # the share refills (the lease lives on)
        waiter.join(BOUND)
        assert not waiter.is_alive() and got[-1] is not None
        leaser.close()
