"""Leases on a shared state: two sidecars on one real redis-server, each with processes leasing
shares of the same bucket (the bucket's lease script keeps every holder's share and burst aside
from the bucket in Redis, bucket_scripts.py). Counted at the upstream: no window holds more
requests than the one bucket grants (a bucket per sidecar, or shares not kept aside, would let
through about twice that)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpcreds import Client
from mcpcreds.errors import InvalidRequest
from tests.peers.redis_peer import RedisPeer
from tests.peers.upstream import one_of, start_upstream
from tests.redis_sidecar import start_on_state
from tests.sidecar_proc import SidecarProcess
from tests.test_leases_e2e import run_workers
from tests.windows import overfull_windows

TOKEN = "redis-lease-token-0123456789"
BOUND = 10.0  # seconds: a bound for what comes at once, never reached unless broken
BODY = """
[services.api]
endpoint = "{url}/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:TOKEN}}}}" }}
rate = "20/1s"
[[servers]]
name = "b"
service = "api"
"""
NOWHERE = "http://127.0.0.1:9"  # an upstream no test here calls


def sidecars_on(stack: ExitStack, tmp_path: Path, redis: RedisPeer, count: int, url: str = NOWHERE,
                rate: str = "20/1s") -> list[SidecarProcess]:
    """`count` sidecars on the one redis-server, each serving BODY at `rate`."""
    body = BODY.format(url=url).replace('rate = "20/1s"', f'rate = "{rate}"')
    return [start_on_state(stack, tmp_path / f"sidecar{i}", redis.url, body, {"TOKEN": TOKEN})
            for i in range(count)]


def event_lines(stack: ExitStack, socket: Path) -> Iterator[str]:
    """The lines of `GET /v1/events` on `socket`; a read waits BOUND at most."""
    http = stack.enter_context(httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)),
                                            base_url="http://mcpcreds", timeout=BOUND))
    return stack.enter_context(http.stream("GET", "/v1/events")).iter_lines()


def leased_run(tmp_path: Path, redis: RedisPeer, rate: str, per_sidecar: int,
               seconds: str) -> tuple[list[tuple[float, float]], list[dict[str, Any]]]:
    """Two sidecars, `per_sidecar` worker processes on each sending requests for `seconds`: each
    request's (sent, answered), checked to be every request the upstream got, and the reports."""
    with start_upstream(accept=one_of(TOKEN)) as upstream, ExitStack() as stack:
        sidecars = sidecars_on(stack, tmp_path, redis, 2, upstream.url, rate)
        first = len(upstream.arrivals())
        reports = run_workers([s.socket for s in sidecars for _ in range(per_sidecar)], "b", upstream.url, seconds)
        grants = [(float(sent), float(answered)) for r in reports for sent, answered in r["grants"]]
        assert len([t for t in upstream.arrivals()[first:] if t]) == len(grants)  # counted at the upstream
        return grants, reports




def test_leases_on_two_sidecars_never_exceed_the_shared_bucket(tmp_path: Path, redis: RedisPeer) -> None:
    grants, reports = leased_run(tmp_path, redis, "20/1s", 2, "3")
    leased = [r["leased"] for r in reports]
    assert sum(leased) > 0, leased  # leases were bought and spent
    span = max(a for _, a in grants) - min(s for s, _ in grants)
    assert len(grants) <= 20 + 20 * span
    assert overfull_windows(grants, burst=20, per_second=20.0) == []
    print(f"\n2 sidecars x 2 processes, 20/1s on Redis: {len(grants)} requests in {span:.2f} s "
          f"(bound {20 + 20 * span:.0f}), {sum(leased)} leased")


@pytest.mark.soak
def test_eight_processes_on_two_sidecars_on_100_per_second_for_10_s(tmp_path: Path, redis: RedisPeer) -> None:
    """Issue 18's accuracy run on a shared state: 2 sidecars x 4 processes lease shares of one
    100/1s bucket in Redis for 10 s. Never over (the windows, counted at the upstream); the use
    of the bound (burst + rate x span) is printed."""
    grants, reports = leased_run(tmp_path, redis, "100/1s", 4, "10")
    assert overfull_windows(grants, burst=100, per_second=100.0) == []
    span = max(a for _, a in grants) - min(s for s, _ in grants)
    print(f"\n2 sidecars x 4 processes, 100/1s on Redis: {len(grants)} requests in {span:.2f} s, bound "
          f"{100 + 100 * span:.0f}: use {len(grants) / (100 + 100 * span):.1%}; leased "
          f"{sum(r['leased'] for r in reports)}; per process {[len(r['grants']) for r in reports]}")


def test_a_pause_on_one_sidecar_reaches_the_lease_holders_of_another_at_once(tmp_path: Path, redis: RedisPeer) -> None:
    """An upstream 429 reported to sidecar A pauses the bucket in Redis; sidecar B's lease holders
    hear it on their event stream then (Redis pub/sub), not at their next renewal, and stop."""
    with ExitStack() as stack:
        a, b = sidecars_on(stack, tmp_path, redis, 2)
        lines = event_lines(stack, b.socket)
        with Client(a.socket) as client_a:
            assert json.loads(next(lines))["kind"] == "hello"
            client_a.backoff("b", 30.0)
            event = json.loads(next(lines))  # the read times out (BOUND) if it never comes
            assert event["kind"] == "pause" and event["key"] == "service:api" and 29.0 <= event["seconds"] <= 30.0


def test_a_lease_through_one_sidecar_tells_a_holder_on_another_to_renew_now(tmp_path: Path,
                                                                            redis: RedisPeer) -> None:
    """A holder on sidecar A leases all it may; a newcomer leases through sidecar B and gets
    nothing now: A's holder hears "renew now" on its event stream at once (the lease script names
    it, B publishes it, A tells its holder), not at its renewal half a lease later."""
    with ExitStack() as stack:
        a, b = sidecars_on(stack, tmp_path, redis, 2)
        lines = event_lines(stack, a.socket)
        with Client(a.socket) as client_a, Client(b.socket) as client_b:
            subscriber = json.loads(next(lines))["subscriber"]
            held = client_a.request("POST", "/v1/servers/b/lease", {"subscriber": subscriber})
            assert held["share"] > 15
            newcomer = client_b.request("POST", "/v1/servers/b/lease", {})
            assert newcomer["share"] == 0.0
            event = json.loads(next(lines))  # the read times out (BOUND) if it never comes
            assert event == {"kind": "lease", "key": "service:api"}


def test_a_reload_that_changes_the_rate_tells_the_lease_holders_to_renew_now(tmp_path: Path,
                                                                             redis: RedisPeer) -> None:
    """A lowered rate must not wait for the leases on the old one to end (up to 60 s): their
    holders hear "renew now" when the sidecar reloads, and the bad input of a renewal is refused."""
    with ExitStack() as stack:
        (sidecar,) = sidecars_on(stack, tmp_path, redis, 1)
        lines = event_lines(stack, sidecar.socket)
        with Client(sidecar.socket) as client:
            subscriber = json.loads(next(lines))["subscriber"]
            held = client.request("POST", "/v1/servers/b/lease", {"subscriber": subscriber})
            with pytest.raises(InvalidRequest):  # a number past any share: refused, not a 500
                client.request("POST", "/v1/servers/b/lease", {"lease": held["lease"], "holding": [10**400, 1]})
            sidecar.config.write_text(sidecar.config.read_text().replace('rate = "20/1s"', 'rate = "10/1s"'))
            sidecar.signal(signal.SIGHUP)
            event = json.loads(next(lines))  # the read times out (BOUND) if it never comes
            assert event == {"kind": "lease", "key": "service:api"}


def test_a_sidecar_that_stops_gives_its_holders_shares_back_in_redis(tmp_path: Path, redis: RedisPeer) -> None:
    """Its holders stop spending when their event stream ends; the shares kept aside for them in
    Redis go back to the other sidecars then, not when the leases would have ended."""
    import redis as redis_client

    with ExitStack() as stack:
        (sidecar,) = sidecars_on(stack, tmp_path, redis, 1)
        with Client(sidecar.socket) as client:
            client.request("POST", "/v1/servers/b/lease", {})
        raw = redis_client.Redis(unix_socket_path=str(redis.socket))
        try:
            assert raw.hlen("mcpcreds:{service:api}:leases") == 1
            assert sidecar.stop() == 0
            assert raw.hlen("mcpcreds:{service:api}:leases") == 0
        finally:
            raw.close()
