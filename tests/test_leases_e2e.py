"""Leases end to end: the real sidecar (`mcpcreds serve`), the upstream peer, clients using
`auth=creds.auth(name)` with httpx; workers in their own processes where processes matter.

Nothing here asserts a duration: an invalidation is checked by the order of what reaches the
upstream, the limit by the windows of tests/windows.py (each request's (sent, answered)
interval brackets its permit, wherever it was taken), the return of a killed holder's share by a
bound a broken release would cross (half the lease, which is 60 s on that server).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpcreds import AsyncClient, Client
from mcpcreds.client.lease_terms import AUTO_LEAST
from mcpcreds.errors import LeasesRefused
from tests.peers.upstream import Upstream, one_of, start_upstream
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.windows import overfull_windows

T1 = "lease-token-one-0123456789"
T2 = "lease-token-two-9876543210"
CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["dir:{secrets}"]
[services.api]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "40/1s"
[services.shared]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "20/1s"
[services.fast]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "100000/1s"
[services.stock]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "600/1m"
[services.slow]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "600/1m"
[services.slow2]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "600/1m"
[services.slow3]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "600/1m"
[services.slow4]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "600/1m"
[services.slow5]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "600/1m"
[services.slow6]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "600/1m"
[[servers]]
name = "slow3"
service = "slow3"
[[servers]]
name = "slow5"
service = "slow5"
[[servers]]
name = "slow6"
service = "slow6"
[[servers]]
name = "slow4"
service = "slow4"
[[servers]]
name = "a"
service = "api"
[[servers]]
name = "slow2"
service = "slow2"
[[servers]]
name = "b"
service = "shared"
[[servers]]
name = "slow"
service = "slow"
[[servers]]
name = "fast"
service = "fast"
[[servers]]
name = "stock"
service = "stock"
[[servers]]
name = "off"
service = "api"
leases = false
"""


@dataclass
class Env:
    upstream: Upstream
    sidecar: SidecarProcess
    secrets: Path

    def set_token(self, value: str) -> None:
        path = self.secrets / "TOKEN"
        tmp = self.secrets / ".TOKEN.tmp"
        tmp.write_text(value)
        tmp.chmod(0o600)
        os.replace(tmp, path)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("leases")
    secrets = tmp / "secrets"
    secrets.mkdir(mode=0o700)
    (tmp / "run").mkdir(mode=0o700)
    with start_upstream(accept=one_of(T1, T2)) as upstream:
        config = tmp / "config.toml"
        config.write_text(CONFIG.format(socket=tmp / "run" / "s.sock", secrets=secrets, url=upstream.url))
        found = Env(upstream, None, secrets)  # type: ignore[arg-type]
        found.set_token(T1)
        with run_sidecar(config, tmp / "run" / "s.sock") as sidecar:
            found.sidecar = sidecar
            yield found


async def until(condition: object, what: str, timeout: float = 20.0) -> None:
    """Wait for `condition()` on the event loop (each check yields to the other tasks)."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {what}")
        await asyncio.sleep(0.002)


async def test_an_invalidation_stops_a_leased_client_from_sending_the_old_token(env: Env) -> None:
    """A leased client sends requests one after the other. The token changes and is invalidated:
    once the invalidation's event has reached the client, every request that reaches the
    upstream carries the new token; before the invalidation, the leased one (no round trip)."""
    env.set_token(T1)
    async with AsyncClient(env.sidecar.socket) as creds, AsyncClient(env.sidecar.socket) as admin:
        await admin.invalidate("a")  # whatever an earlier test left cached
        auth = creds.auth("a", lease=True)
        async with httpx.AsyncClient(base_url=env.upstream.url, auth=auth) as http:
            for _ in range(5):  # a few calls in a short time: the auth leases (in the background)
                assert (await http.get("/mcp")).status_code == 200
            leaser = auth._leaser
            assert leaser is not None
            await until(lambda: leaser.answer is not None, "the lease")
            assert leaser.terms[1] > 0
            first = len(env.upstream.arrivals())
            sent = 0
            delivered_at: int | None = None
            invalidated_at: int | None = None
            generation = leaser.generation
            stop = False

            async def traffic() -> None:
                nonlocal sent, delivered_at
                while not stop:
                    if delivered_at is None and leaser.generation != generation:
                        delivered_at = sent  # the event reached the client before this request
                    assert (await http.get("/mcp")).status_code == 200
                    sent += 1

            task = asyncio.create_task(traffic())
            try:
                await until(lambda: sent >= 10, "10 leased requests")
                env.set_token(T2)
                await admin.invalidate("a")
                invalidated_at = sent
                await until(lambda: delivered_at is not None, "the invalidation's event at the client")
                await until(lambda: sent >= (delivered_at or 0) + 10, "10 requests after the event")
            finally:
                stop = True
                await task
        arrivals = env.upstream.arrivals()[first:first + sent]
    assert delivered_at is not None and invalidated_at is not None
    assert set(arrivals[:10]) == {T1}
    assert set(arrivals[delivered_at:]) == {T2}, arrivals  # never the old token after the event
    assert T1 not in arrivals[invalidated_at + 1:][delivered_at - invalidated_at:]


async def test_a_leased_client_whose_headers_were_dropped_waits_for_the_renewal_not_the_shared_bucket(
        env: Env) -> None:
    """A new login drops the leased headers while the share is still the holder's: its next
    request is served from that share once the renewal brings the new headers, not per request
    from the shared bucket, which refills at the rate less every share (drained by the test)
    while the holder's share goes unspent. 10 s: a bound, not a timing."""
    env.set_token(T1)
    async with AsyncClient(env.sidecar.socket) as creds, AsyncClient(env.sidecar.socket) as admin:
        await admin.invalidate("slow5")
        auth = creds.auth("slow5", lease=True)
        async with httpx.AsyncClient(base_url=env.upstream.url, auth=auth) as http:
            for _ in range(5):
                assert (await http.get("/mcp")).status_code == 200
            leaser = auth._leaser
            assert leaser is not None
            await until(lambda: leaser.answer is not None, "the lease")
            # the shared bucket, drained: what the lease left (how much depends on the demand its
            # per-request calls showed before the lease; a permit there is never at once)
            [bucket] = [b for b in (await admin.status())["buckets"] if b["key"] == "service:slow5"]
            if int(bucket["level"]) >= 1:
                await admin.acquire("slow5", cost=int(bucket["level"]))  # drained
            served, generation = leaser.served, leaser.generation
            env.set_token(T2)
            await admin.invalidate("slow5")
            await until(lambda: leaser.generation != generation, "the invalidation's event at the client")
            first = len(env.upstream.arrivals())
            response = await asyncio.wait_for(http.get("/mcp"), 10.0)
            assert response.status_code == 200
            assert env.upstream.arrivals()[first:] == [T2] and leaser.served == served + 1


def test_a_sync_client_whose_headers_were_dropped_waits_for_the_renewal_not_the_shared_bucket(
        env: Env) -> None:
    """The same with the sync `Client`: the next request after a new login is served from the
    holder's share once the renewal brings the new headers."""
    env.set_token(T1)
    with Client(env.sidecar.socket) as creds, Client(env.sidecar.socket) as admin:
        admin.invalidate("slow6")
        auth = creds.auth("slow6", lease=True)
        with httpx.Client(base_url=env.upstream.url, auth=auth, timeout=10.0) as http:
            deadline = time.monotonic() + 20  # per request while the lease is obtained in the background
            while auth._sync_leaser is None or auth._sync_leaser.answer is None:
                assert time.monotonic() < deadline, "never saw the lease"
                assert http.get("/mcp").status_code == 200
            leaser = auth._sync_leaser
            [bucket] = [b for b in admin.status()["buckets"] if b["key"] == "service:slow6"]  # drained
            if int(bucket["level"]) >= 1:
                admin.acquire("slow6", cost=int(bucket["level"]))  # drained
            served, generation = leaser.served, leaser.generation
            env.set_token(T2)
            admin.invalidate("slow6")
            while leaser.generation == generation:  # the invalidation's event at the client
                assert time.monotonic() < deadline + 20, "never saw the invalidation's event"
                time.sleep(0.002)
            first = len(env.upstream.arrivals())
            assert http.get("/mcp").status_code == 200
            assert env.upstream.arrivals()[first:] == [T2] and leaser.served == served + 1


WORKER = """
import asyncio, json, sys, time
import httpx
from mcpcreds import AsyncClient

async def main() -> None:
    socket, name, url, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    lease = {"auto": "auto", "true": True}[sys.argv[5]]
    async with AsyncClient(socket) as creds:
        auth = creds.auth(name, lease=lease)
        async with httpx.AsyncClient(base_url=url, auth=auth) as http:
            await creds.health()
            await http.get("/mcp", auth=None)  # a connection to the upstream (a 401), not timed
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.readline)  # every worker starts at once
            grants = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                sent = time.monotonic()
                response = await http.get("/mcp")
                assert response.status_code == 200, response.status_code
                grants.append((sent, time.monotonic()))
            leased = auth._leaser.served if auth._leaser is not None else 0
    print(json.dumps({"grants": grants, "leased": leased}), flush=True)

asyncio.run(main())
"""


def run_workers(sockets: list[Path], server: str, upstream: str, seconds: str,
                lease: str = "true") -> list[dict[str, Any]]:
    """One WORKER process per socket, started together once all are ready; their reports (a
    worker still running when this fails is killed). `lease`: "true" (`lease=True`) or "auto"."""
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(socket), server, upstream, seconds, lease],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for socket in sockets]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(p.returncode == 0 for p in procs)
    return reports


def test_leases_never_exceed_the_limit_across_processes(env: Env) -> None:
    """Four processes lease shares of one 20/1s bucket (and ask per request when they have none)
    for 3 s: the upstream gets every request, and no window of time holds more of them than the
    bucket allows."""
    env.set_token(T1)
    first = len(env.upstream.arrivals())
    reports = run_workers([env.sidecar.socket] * 4, "b", env.upstream.url, "3")
    grants = [tuple(g) for r in reports for g in r["grants"]]
    assert len([t for t in env.upstream.arrivals()[first:] if t]) == len(grants)  # counted at the upstream
    assert sum(r["leased"] for r in reports) > 0  # the permits of some were leased
    assert overfull_windows(grants, burst=20, per_second=20.0) == []


def test_auth_as_it_comes_takes_no_lease_where_the_share_would_not_pay(env: Env) -> None:
    """`creds.auth()` as it comes (`lease="auto"`): four processes calling one 20/1s bucket as fast
    as it lets them ask per request, where the whole shared burst serves their first calls (a
    lease would be a few permits a second each, a one-permit burst); the limit holds."""
    env.set_token(T1)
    reports = run_workers([env.sidecar.socket] * 4, "b", env.upstream.url, "2", lease="auto")
    grants = [tuple(g) for r in reports for g in r["grants"]]
    assert [r["leased"] for r in reports] == [0, 0, 0, 0]
    assert overfull_windows(grants, burst=20, per_second=20.0) == []


async def test_auth_as_it_comes_leases_when_it_calls_fast_for_a_share_worth_holding(env: Env) -> None:
    """The same auth on a bucket whose share pays: after its first fast calls (per request) it
    leases, and its requests take no round trip."""
    env.set_token(T1)
    async with AsyncClient(env.sidecar.socket) as creds:
        auth = creds.auth("fast")
        async with httpx.AsyncClient(base_url=env.upstream.url, auth=auth) as http:
            deadline = time.monotonic() + 20  # per request while the lease is obtained in the background
            while auth._leaser is None or auth._leaser.answer is None:
                assert time.monotonic() < deadline, "never saw the lease"
                assert (await http.get("/mcp")).status_code == 200
            leaser = auth._leaser
            served = leaser.served
            for _ in range(5):
                assert (await http.get("/mcp")).status_code == 200
            assert leaser.served == served + 5 and leaser.terms[0] >= AUTO_LEAST


async def test_a_holder_whose_share_is_spent_is_served_from_the_shared_bucket_s_stock(env: Env) -> None:
    """A holder that has spent what its bucket holds is served at once from the permits the shared
    bucket holds (a `call` that does not wait), not left waiting for its share (10 a second here)
    while that stock stands idle; the upstream gets the request with the same token."""
    env.set_token(T1)
    async with AsyncClient(env.sidecar.socket) as creds:
        auth = creds.auth("stock", lease=True)
        async with httpx.AsyncClient(base_url=env.upstream.url, auth=auth) as http:
            deadline = time.monotonic() + 20
            while auth._leaser is None or auth._leaser.answer is None:
                assert time.monotonic() < deadline, "never saw the lease"
                assert (await http.get("/mcp")).status_code == 200
            leaser = auth._leaser
            first = len(env.upstream.arrivals())
            leased = time.monotonic()
            while leaser.borrowed == 0:  # the bucket's permits, then one borrowed
                # its burst, and what its share refilled meanwhile (under load each call is slow);
                # the extra second covers the lease's arrival before `leased`
                refilled = leaser.terms[0] / leaser.terms_per * (time.monotonic() - leased + 1)
                assert leaser.served <= leaser.terms[1] + 1 + refilled
                assert time.monotonic() < deadline, "never borrowed from the shared bucket"
                assert (await http.get("/mcp")).status_code == 200
            arrived = env.upstream.arrivals()[first:]
            assert arrived and set(arrived) == {T1}
            [bucket] = [b for b in (await creds.status())["buckets"] if b["key"] == "service:stock"]
            assert bucket["refused"] == 0  # a permit the shared bucket had: nothing refused, nobody waited


HOLDER = """
import asyncio, sys
import httpx
from mcpcreds import AsyncClient

async def main() -> None:
    async with AsyncClient(sys.argv[1]) as creds:
        auth = creds.auth(sys.argv[3], lease=True)
        async with httpx.AsyncClient(base_url=sys.argv[2], auth=auth) as http:
            while auth._leaser is None or auth._leaser.answer is None:
                await http.get("/mcp")
            print("leased", auth._leaser.terms[0], flush=True)
            await asyncio.to_thread(sys.stdin.readline)  # until killed

asyncio.run(main())
"""


def test_a_killed_holder_gives_its_share_back_at_once(env: Env) -> None:
    """A process holding a lease on a 600/1m bucket (leases of 60 s) is SIGKILLed: its share is
    back (the event stream closed) long before its lease would have lapsed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(env.sidecar.socket), env.upstream.url, "slow"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[0] == "leased" and float(line[1]) > 0
        with Client(env.sidecar.socket) as client:
            rows = {r["key"]: r for r in client.status()["leases"]}
            assert rows["service:slow"]["holders"] == 1 and rows["service:slow"]["leased_share"] > 0
            killed = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            while any(r["key"] == "service:slow" for r in client.status()["leases"]):
                assert time.monotonic() - killed < 30.0, "the share came back only when the lease lapsed"
                time.sleep(0.01)
            client.acquire("slow")  # the shared bucket has its whole rate again
            [bucket] = [b for b in client.status()["buckets"] if b["key"] == "service:slow"]
            assert bucket["capacity"] == 600 and bucket["rate"] == "600/1m"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_server_with_leases_false_is_asked_per_request(env: Env) -> None:
    env.set_token(T1)
    async with AsyncClient(env.sidecar.socket) as creds:
        with pytest.raises(LeasesRefused):
            await creds.run(__import__("mcpcreds.client.calls", fromlist=["Calls"]).Calls.lease("off", None, None, None))
        auth = creds.auth("off", lease=True)
        before = len(env.upstream.arrivals())
        async with httpx.AsyncClient(base_url=env.upstream.url, auth=auth) as http:
            for _ in range(6):
                assert (await http.get("/mcp")).status_code == 200
        assert auth._leaser is not None and auth._leaser.disabled and auth._leaser.served == 0
        assert env.upstream.arrivals()[before:] == [T1] * 6
        [bucket] = [b for b in (await creds.status())["buckets"] if b["key"] == "service:api"]
        assert bucket["granted"] >= 6  # each one a permit of the shared bucket


def test_a_sync_client_leases_and_drops_the_old_token_on_invalidation(env: Env) -> None:
    """The same with the sync `Client` (its own bucket under a lock, its event stream on a thread):
    requests from a thread, one after the other; after the invalidation's event reached the
    client, only the new token arrives."""
    env.set_token(T1)
    with Client(env.sidecar.socket) as creds, Client(env.sidecar.socket) as admin:
        admin.invalidate("a")
        auth = creds.auth("a", lease=True)
        with httpx.Client(base_url=env.upstream.url, auth=auth) as http:
            deadline = time.monotonic() + 20  # per request while the lease is obtained in the background
            while auth._sync_leaser is None or auth._sync_leaser.answer is None:
                assert time.monotonic() < deadline, "never saw the lease"
                assert http.get("/mcp").status_code == 200
            leaser = auth._sync_leaser
            assert http.get("/mcp").status_code == 200
            assert leaser.served > 0
            first = len(env.upstream.arrivals())
            generation = leaser.generation
            sent = 0
            delivered_at: int | None = None
            stop = threading.Event()
            progress = threading.Condition()

            def traffic() -> None:
                nonlocal sent, delivered_at
                while not stop.is_set():
                    if delivered_at is None and leaser.generation != generation:
                        delivered_at = sent
                    assert http.get("/mcp").status_code == 200
                    with progress:
                        sent += 1
                        progress.notify_all()

            def wait_for(condition: Callable[[], bool], what: str) -> None:
                with progress:
                    if not progress.wait_for(condition, timeout=20):
                        raise AssertionError(f"never saw {what}")

            thread = threading.Thread(target=traffic)
            thread.start()
            try:
                wait_for(lambda: sent >= 10, "10 leased requests")
                env.set_token(T2)
                admin.invalidate("a")
                wait_for(lambda: delivered_at is not None and sent >= delivered_at + 10,
                         "10 requests after the invalidation's event reached the client")
            finally:
                stop.set()
                thread.join(30)
        arrivals = env.upstream.arrivals()[first:first + sent]
    assert delivered_at is not None and set(arrivals[:10]) == {T1}
    assert set(arrivals[delivered_at:]) == {T2}, arrivals
    # most of them leased, or from the shared stock once the share was spent (a renewal or two may
    # ask per request)
    assert leaser.served + leaser.borrowed > sent // 2


@pytest.mark.soak
def test_eight_processes_on_100_per_second_for_10_s_stay_within_the_bucket(env: Env, tmp_path: Path) -> None:
    """The issue's accuracy run: eight processes lease shares of one 100/1s bucket for 10 s
    (`lease=True`: as the auth comes, at 12 a second each, they would not lease). Never
    over (the windows, counted at the upstream); the use is printed (issue 18 asks >= 95 %)."""
    config = env.sidecar.config.read_text()
    assert 'rate = "20/1s"' in config  # the `b` server: raised to 100/1s for this run, then back
    env.set_token(T1)
    env.sidecar.config.write_text(config.replace('rate = "20/1s"', 'rate = "100/1s"'))
    env.sidecar.signal(signal.SIGHUP)
    env.sidecar.wait_for("config reloaded")
    try:
        first = len(env.upstream.arrivals())
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(env.sidecar.socket), "b", env.upstream.url,
                                   "10", "true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for _ in range(8)]
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
        grants = [tuple(g) for r in reports for g in r["grants"]]
        assert len([t for t in env.upstream.arrivals()[first:] if t]) == len(grants)
        assert overfull_windows(grants, burst=100, per_second=100.0) == []
        span = max(a for _, a in grants) - min(s for s, _ in grants)
        print(f"\n8 processes, 100/1s: {len(grants)} requests in {span:.2f} s, bound {100 + 100 * span:.0f}: "
              f"use {len(grants) / (100 + 100 * span):.1%}; leased {sum(r['leased'] for r in reports)}; "
              f"per process {[len(r['grants']) for r in reports]}")
    finally:
        env.sidecar.config.write_text(config)
        env.sidecar.signal(signal.SIGHUP)
        env.sidecar.wait_for("config reloaded")


def test_callers_queued_on_the_shared_bucket_get_a_released_share_at_once(env: Env) -> None:
    """While a holder leases nearly all of a 600/1m bucket, the shared bucket refills at 1 permit
    a minute: a caller without a lease queues there. The holder is SIGKILLed: the queued caller is
    served at the whole rate from then (not at 1 a minute, nor only when another caller comes)."""
    # the holder leases without a request asked per request first (LEASE_ONLY): per-request
    # calls would count as demand of callers without a lease, and leave them half the rate
    proc = subprocess.Popen([sys.executable, "-c", LEASE_ONLY, str(env.sidecar.socket), "slow2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().split()[0] == "leased"
        with Client(env.sidecar.socket) as client, Client(env.sidecar.socket) as waiter:
            [bucket] = [b for b in client.status()["buckets"] if b["key"] == "service:slow2"]
            assert bucket["per_second"] < 0.1, bucket  # the shared bucket: what the lease left
            if int(bucket["level"]) >= 1:
                client.acquire("slow2", cost=int(bucket["level"]))  # drained
            done = threading.Event()

            def wait_for_a_permit() -> None:
                waiter.acquire("slow2", cost=1, max_wait=3000)
                done.set()

            thread = threading.Thread(target=wait_for_a_permit)
            thread.start()
            deadline = time.monotonic() + 20
            while not [b for b in client.status()["buckets"] if b["key"] == "service:slow2" and b["waiting"]]:
                assert time.monotonic() < deadline and not done.is_set(), "the caller did not queue"
                time.sleep(0.01)
            killed = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            # at 1 permit a minute it would wait up to 60 s; the lease itself would lapse in 60 s
            assert done.wait(30.0), "the queued caller was not served at the released rate"
            assert time.monotonic() - killed < 30.0
            thread.join()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


LEASE_ONLY = """
import asyncio, sys
from mcpcreds import AsyncClient
from mcpcreds.client.leaser import AsyncLeaser

async def main() -> None:
    async with AsyncClient(sys.argv[1]) as creds:
        leaser = AsyncLeaser(creds, sys.argv[2])
        assert await leaser._start_obtaining()  # a lease, and not one request asked per request
        print("leased", leaser.terms[0], flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # until killed

asyncio.run(main())
"""


def test_a_caller_without_a_lease_is_served_while_an_idle_holder_has_nearly_all(env: Env) -> None:
    """A process leases nearly all of a 600/1m bucket (leases of 60 s, renewed at 30 s) and then
    sends nothing; the shared bucket is drained and refills at 1 permit a minute. A caller without
    a lease asks: the holder is recalled (a `lease` event), renews and gives the shared callers
    their part, so the caller is served long before the holder's renewal or its lapse would have
    freed anything (at 1 a minute it would wait up to 60 s)."""
    proc = subprocess.Popen([sys.executable, "-c", LEASE_ONLY, str(env.sidecar.socket), "slow3"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().split()[0] == "leased"
        with Client(env.sidecar.socket) as client:
            [bucket] = [b for b in client.status()["buckets"] if b["key"] == "service:slow3"]
            assert bucket["per_second"] < 0.1, (bucket, client.status()["leases"])  # what the lease left
            if int(bucket["level"]) >= 1:
                client.acquire("slow3", cost=int(bucket["level"]))  # drained
            asked = time.monotonic()
            client.acquire("slow3", cost=1, max_wait=3000)
            assert time.monotonic() - asked < 20.0, "served only when the lease was renewed or lapsed"
            [row] = [r for r in client.status()["leases"] if r["key"] == "service:slow3"]
            assert row["holders"] == 1 and row["leased_share"] < 599  # the holder gave some back
    finally:
        proc.kill()
        proc.wait()


async def test_a_process_that_joins_gets_its_fair_share_before_a_renewal_period(env: Env) -> None:
    """A process holds nearly all of a 600/1m bucket and sends nothing. Another leases: it is told
    "not now" (the first holder's lease keeps it aside), but the first holder is told to renew,
    gives up half, and the newcomer is told to ask again: it gets about half the rate within a
    bound a lease period (60 s, renewals at 30 s) would cross."""
    from mcpcreds.client.leaser import AsyncLeaser

    proc = subprocess.Popen([sys.executable, "-c", LEASE_ONLY, str(env.sidecar.socket), "slow4"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().split()[0] == "leased"
        async with AsyncClient(env.sidecar.socket) as creds:
            leaser = AsyncLeaser(creds, "slow4")
            try:
                asked = time.monotonic()
                assert not await leaser._start_obtaining()  # not now: the holder has it all
                assert leaser.terms == (0.0, 0) and leaser.lease is not None
                await until(lambda: leaser.terms[0] > 0, "the newcomer's share", timeout=20.0)
                assert time.monotonic() - asked < 20.0
                assert 250 <= leaser.terms[0] <= 300  # about half of 600 a minute (the shared callers keep 1)
            finally:
                await leaser.aclose()
    finally:
        proc.kill()
        proc.wait()
