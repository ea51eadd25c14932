"""Leases on a shared state: two sidecars on one real redis-server, each with processes leasing
shares of the same bucket (each sidecar buys its holders' permits from the bucket in Redis
ahead of their use, leases.py `prepaid_cost`). Counted at the upstream: the run holds no more
requests than the one bucket grants in its span (a bucket per sidecar, or leases not bought,
would let through about twice that). A leased permit is bought at most one lease (one period of
the rate) before it is spent, so a shorter window may hold up to one more burst than the bucket
alone would: that is the bound checked on windows. That is why leases on a shared state are
opt-in (`leases = true`): unset, the lease route refuses them there."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from mcpcreds import Client
from mcpcreds.errors import LeasesRefused
from tests.peers.redis_peer import RedisPeer
from tests.peers.upstream import one_of, start_upstream
from tests.redis_sidecar import start_on_state
from tests.test_leases_e2e import run_workers
from tests.test_rates_e2e import overfull_windows

TOKEN = "redis-lease-token-0123456789"
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
        sidecars = [start_on_state(stack, tmp_path / f"sidecar{i}", redis.url, BODY.format(url=upstream.url, leases="leases = true"),
                                   {"TOKEN": TOKEN}) for i in range(2)]
        first = len(upstream.arrivals())
        reports = run_workers([sidecar.socket for sidecar in sidecars for _ in range(2)], "b", upstream.url, "3")
        grants = [tuple(g) for r in reports for g in r["grants"]]
        assert len([t for t in upstream.arrivals()[first:] if t]) == len(grants)  # counted at the upstream
        leased = [r["leased"] for r in reports]
        assert sum(leased) > 0, leased  # leases were bought and spent
        span = max(a for _, a in grants) - min(s for s, _ in grants)
        assert len(grants) <= 20 + 20 * span
        assert overfull_windows(grants, burst=2 * 20, per_second=20.0) == []
        print(f"\n2 sidecars x 2 processes, 20/1s on Redis: {len(grants)} requests in {span:.2f} s "
              f"(bound {20 + 20 * span:.0f}), {sum(leased)} leased")


def test_a_shared_state_leases_only_where_the_config_opts_in(tmp_path: Path, redis: RedisPeer) -> None:
    """Unset, `leases` is on with the memory state and off with a shared one, where a leased
    window may hold one more burst: the lease route refuses, and `creds.auth()` asks per request."""
    with ExitStack() as stack:
        sidecar = start_on_state(stack, tmp_path / "sidecar", redis.url,
                                 BODY.format(url="http://127.0.0.1:9", leases=""), {"TOKEN": TOKEN})
        with Client(sidecar.socket) as client:
            try:
                client.request("POST", "/v1/servers/b/lease", {"demand": 1})
            except LeasesRefused as refused:
                assert "leases = true" in refused.message
            else:
                raise AssertionError("a shared state leased without leases = true")
