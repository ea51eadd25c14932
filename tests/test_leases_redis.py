"""Leases on a shared state: two sidecars on one real redis-server, each with processes leasing
shares of the same bucket (the bucket's lease script keeps every holder's share and burst aside
from the bucket in Redis, bucket_scripts.py). Counted at the upstream: no window holds more
requests than the one bucket grants (a bucket per sidecar, or shares not kept aside, would let
through about twice that)."""

from __future__ import annotations

import json
import signal
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from mcpcreds import Client
from mcpcreds.errors import InvalidRequest
from tests.peers.redis_peer import RedisPeer
from tests.peers.upstream import one_of, start_upstream
from tests.redis_sidecar import start_on_state
from tests.test_leases_e2e import run_workers
from tests.test_rates_e2e import overfull_windows

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
{leases}
"""


def test_leases_on_two_sidecars_never_exceed_the_shared_bucket(tmp_path: Path, redis: RedisPeer) -> None:
    with start_upstream(accept=one_of(TOKEN)) as upstream, ExitStack() as stack:
        sidecars = [start_on_state(stack, tmp_path / f"sidecar{i}", redis.url, BODY.format(url=upstream.url, leases=""),
                                   {"TOKEN": TOKEN}) for i in range(2)]
        first = len(upstream.arrivals())
        reports = run_workers([sidecar.socket for sidecar in sidecars for _ in range(2)], "b", upstream.url, "3")
        grants = [tuple(g) for r in reports for g in r["grants"]]
        assert len([t for t in upstream.arrivals()[first:] if t]) == len(grants)  # counted at the upstream
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
    body = BODY.replace('rate = "20/1s"', 'rate = "100/1s"')
    with start_upstream(accept=one_of(TOKEN)) as upstream, ExitStack() as stack:
        sidecars = [start_on_state(stack, tmp_path / f"sidecar{i}", redis.url, body.format(url=upstream.url, leases=""),
                                   {"TOKEN": TOKEN}) for i in range(2)]
        first = len(upstream.arrivals())
        reports = run_workers([sidecar.socket for sidecar in sidecars for _ in range(4)], "b", upstream.url, "10")
        grants = [tuple(g) for r in reports for g in r["grants"]]
        assert len([t for t in upstream.arrivals()[first:] if t]) == len(grants)
        assert overfull_windows(grants, burst=100, per_second=100.0) == []
        span = max(a for _, a in grants) - min(s for s, _ in grants)
        print(f"\n2 sidecars x 4 processes, 100/1s on Redis: {len(grants)} requests in {span:.2f} s, bound "
              f"{100 + 100 * span:.0f}: use {len(grants) / (100 + 100 * span):.1%}; leased "
              f"{sum(r['leased'] for r in reports)}; per process {[len(r['grants']) for r in reports]}")


def test_a_pause_on_one_sidecar_reaches_the_lease_holders_of_another_at_once(tmp_path: Path, redis: RedisPeer) -> None:
    """An upstream 429 reported to sidecar A pauses the bucket in Redis; sidecar B's lease holders
    hear it on their event stream then (Redis pub/sub), not at their next renewal, and stop."""
    with ExitStack() as stack:
        a, b = (start_on_state(stack, tmp_path / f"sidecar{i}", redis.url,
                               BODY.format(url="http://127.0.0.1:9", leases=""), {"TOKEN": TOKEN}) for i in range(2))
        transport = httpx.HTTPTransport(uds=str(b.socket))
        with httpx.Client(transport=transport, base_url="http://mcpcreds", timeout=BOUND) as http, \
                http.stream("GET", "/v1/events") as events, Client(a.socket) as client_a:
            lines = events.iter_lines()
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
        a, b = (start_on_state(stack, tmp_path / f"sidecar{i}", redis.url,
                               BODY.format(url="http://127.0.0.1:9", leases=""), {"TOKEN": TOKEN}) for i in range(2))
        transport = httpx.HTTPTransport(uds=str(a.socket))
        with httpx.Client(transport=transport, base_url="http://mcpcreds", timeout=BOUND) as http, \
                http.stream("GET", "/v1/events") as events, Client(a.socket) as client_a, Client(b.socket) as client_b:
            lines = events.iter_lines()
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
        sidecar = start_on_state(stack, tmp_path / "sidecar", redis.url,
                                 BODY.format(url="http://127.0.0.1:9", leases=""), {"TOKEN": TOKEN})
        transport = httpx.HTTPTransport(uds=str(sidecar.socket))
        with httpx.Client(transport=transport, base_url="http://mcpcreds", timeout=BOUND) as http, \
                http.stream("GET", "/v1/events") as events, Client(sidecar.socket) as client:
            lines = events.iter_lines()
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
        sidecar = start_on_state(stack, tmp_path / "sidecar", redis.url,
                                 BODY.format(url="http://127.0.0.1:9", leases=""), {"TOKEN": TOKEN})
        with Client(sidecar.socket) as client:
            client.request("POST", "/v1/servers/b/lease", {})
        raw = redis_client.Redis(unix_socket_path=str(redis.socket))
        try:
            assert raw.hlen("mcpcreds:{service:api}:leases") == 1
            assert sidecar.stop() == 0
            assert raw.hlen("mcpcreds:{service:api}:leases") == 0
        finally:
            raw.close()
