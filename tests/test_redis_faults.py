"""The shared state failing under a real sidecar: a stopped redis-server, one that accepts
connections but never answers (SIGSTOP), and degraded mode (`on_state_loss = "local"`).

What a caller sees is checked on the wire (HTTP status and error code), not through the client
library, which rebuilds its exception from the code alone."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpcreds import AsyncClient, Client, RateLimited, StateUnavailable
from tests.conftest import module_peer
from tests.peers.oidc_peer import OidcPeer
from tests.peers.redis_peer import RedisPeer
from tests.redis_sidecar import oauth_line, oidc_client, start_on_state, until_state_available
from tests.sidecar_proc import SidecarProcess

SECRET = "faults-client-secret-0"
API_KEY = "api-key-for-fault-tests-0123"
OIDC_CLIENTS = [oidc_client("faults", SECRET)]  # on the shared peer (conftest)
# A hung Redis costs one call timeout (1 s, docs/tasks/many-hosts.md); only a hang crosses this.
HANG_BOUND = 10.0
WIRE_TIMEOUT = 30.0  # the test's own HTTP timeout: a hung request fails the test, never blocks it


@pytest.fixture(scope="module")
def peer(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, 300)


def start_sidecar(stack: ExitStack, tmp_path: Path, redis: RedisPeer, peer: OidcPeer,
                  extra: str = "") -> SidecarProcess:
    """One sidecar on `redis`: `crm` logs in at the real IdP, `api` has a static header; both
    have a slow rate, so nothing refills during a test."""
    return start_on_state(stack, tmp_path, redis.url, f"""
[[servers]]
name = "crm"
endpoint = "https://crm.example.com/mcp"
rate = "100/10m"
{oauth_line(peer, "faults")}
[[servers]]
name = "api"
endpoint = "https://api.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:API_KEY}}}}" }}
rate = "100/10m"
""", {"CRM_SECRET": SECRET, "API_KEY": API_KEY}, extra)


def wire(sidecar: SidecarProcess) -> httpx.AsyncClient:
    """A plain HTTP client on the sidecar's socket: the raw status and body of each answer."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sidecar.socket)),
                             base_url="http://mcpcreds", timeout=WIRE_TIMEOUT)


# what needs the shared state when no login is cached: (name, method, path, body)
NEEDS_STATE = [
    ("headers of a login not cached", "GET", "/v1/servers/crm/headers", None),
    ("acquire", "POST", "/v1/servers/api/acquire", {"cost": 1, "max_wait": 0}),
    ("call (static headers, the permit)", "POST", "/v1/servers/api/call", {"cost": 1, "max_wait": 0}),
    ("call (a login not cached)", "POST", "/v1/servers/crm/call", {"cost": 1, "max_wait": 0}),
    ("grant creation", "POST", "/v1/grants", {"servers": ["api"], "ttl": 60}),
]


async def send(http: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None,
               grant: str | None = None) -> tuple[int, dict[str, Any], float]:
    """(status, JSON body, seconds it took) of one request."""
    headers = {"Authorization": f"Bearer {grant}"} if grant else {}
    start = time.monotonic()
    response = await http.request(method, path, json=body, headers=headers)
    return response.status_code, response.json(), time.monotonic() - start


def assert_state_unavailable(what: str, status: int, body: dict[str, Any]) -> None:
    assert (status, body.get("error", {}).get("code")) == (503, "state_unavailable"), f"{what}: {status} {body}"


async def test_redis_down_is_503_state_unavailable_on_the_wire(
        tmp_path: Path, redis: RedisPeer, peer: OidcPeer) -> None:
    with ExitStack() as stack:
        sidecar = start_sidecar(stack, tmp_path, redis, peer)
        async with wire(sidecar) as http:
            status, minted, _ = await send(http, "POST", "/v1/grants", {"servers": ["api"], "ttl": 600})
            assert status == 200
            redis.stop()
            for what, method, path, body in NEEDS_STATE:
                status, answer, _ = await send(http, method, path, body)
                assert_state_unavailable(what, status, answer)
            # a grant cannot be checked either: that is an outage, not a refusal (403) or a crash
            status, answer, _ = await send(http, "GET", "/v1/servers/api/headers", None, minted["grant"])
            assert_state_unavailable("a request with a grant", status, answer)
            status, answer, _ = await send(http, "GET", "/v1/health", None)
            assert (status, answer["status"]) == (200, "ok")  # the sidecar itself keeps serving
    assert "internal_error" not in sidecar.log


async def test_a_redis_that_never_answers_fails_within_the_bound_and_recovers(
        tmp_path: Path, redis: RedisPeer, peer: OidcPeer) -> None:
    """A paused redis-server accepts connections and never answers: every request that needs it
    is a 503 after at most the call timeout (1 s), never a hang; after SIGCONT the sidecar is
    back on Redis by itself."""
    with ExitStack() as stack:
        sidecar = start_sidecar(stack, tmp_path, redis, peer)
        async with wire(sidecar) as http:
            status, _, _ = await send(http, "POST", "/v1/servers/api/acquire", {})
            assert status == 200  # a connection to Redis is open and in the pool
            redis.pause()
            try:
                # at once: some on the pooled connection, the others on new ones
                answers = await asyncio.gather(*(send(http, m, p, b) for _, m, p, b in NEEDS_STATE),
                                               *(send(http, "POST", "/v1/servers/api/acquire", {})
                                                 for _ in range(3)))
                names = [n for n, *_ in NEEDS_STATE] + ["acquire"] * 3
                for what, (status, answer, seconds) in zip(names, answers, strict=True):
                    assert_state_unavailable(what, status, answer)
                    assert seconds < HANG_BOUND, f"{what} took {seconds:.1f} s"
            finally:
                redis.resume()
        with Client(sidecar.socket) as client:
            assert until_state_available(lambda: client.acquire("api"))["granted"] == 1
            assert until_state_available(lambda: client.headers_info("crm"))["headers"]["Authorization"].startswith("Bearer ")


def claims(access_token: str) -> dict[str, Any]:
    """The payload of the IdP's JWT access token (the peer signs them; the test only reads)."""
    payload = access_token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


async def test_degraded_mode_fetches_a_login_locally(tmp_path: Path, redis: RedisPeer,
                                                     peer: OidcPeer) -> None:
    """on_state_loss = "local", Redis gone before any login: a cold OAuth server's headers come
    from a login this sidecar fetches itself, once for all its callers."""
    with ExitStack() as stack:
        sidecar = start_sidecar(stack, tmp_path, redis, peer, 'on_state_loss = "local"\nlocal_share = 0.5')
        redis.stop()
        peer.reset_stats()
        client = AsyncClient(sidecar.socket)
        try:
            answers = await asyncio.gather(*(client.headers_info("crm") for _ in range(20)))
        finally:
            await client.aclose()
        sidecar.wait_for("shared state unreachable: fetching this login locally")
    assert len({a["headers"]["Authorization"] for a in answers}) == 1
    scheme, token = answers[0]["headers"]["Authorization"].split(" ")
    assert scheme == "Bearer"
    assert claims(token)["client_id"] == "faults"  # issued by the IdP to this client
    assert peer.stats()["token_requests"] == 1


def test_degraded_mode_never_grants_more_than_the_local_share_in_one_acquire(
        tmp_path: Path, redis: RedisPeer, peer: OidcPeer) -> None:
    """A tenth of 100/10m is a local bucket of 10 refilled at 1 a minute: acquires of 50 at a
    time are never granted more than that, whatever they are answered instead."""
    with ExitStack() as stack:
        sidecar = start_sidecar(stack, tmp_path, redis, peer, 'on_state_loss = "local"\nlocal_share = 0.1')
        redis.stop()
        start = time.monotonic()
        granted = 0
        with Client(sidecar.socket) as client:
            for _ in range(5):
                with contextlib.suppress(RateLimited, StateUnavailable):
                    granted += client.acquire("api", cost=50, max_wait=0)["granted"]
        assert granted <= 10 + (time.monotonic() - start) / 60
