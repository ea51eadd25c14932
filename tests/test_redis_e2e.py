"""Several sidecars sharing logins and buckets through a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from mcpcreds import AsyncClient, Client, Forbidden, RateLimited, StateUnavailable
from tests.conftest import module_peer
from tests.peers.oidc_peer import OidcPeer
from tests.peers.redis_peer import RedisPeer, start_redis
from tests.redis_sidecar import (
    LIVENESS,
    STATE_KEY,
    oauth_line,
    oidc_client,
    start_on_state,
    until_state_available,
)
from tests.sidecar_proc import SidecarProcess, run_sidecar

SECRET = "shared-client-secret-0"
OIDC_CLIENTS = [oidc_client("shared", SECRET)]  # on the shared peer (conftest)


@pytest.fixture(scope="module")
def peer(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, 300)


def start_sidecars(stack: ExitStack, tmp_path: Path, redis: RedisPeer, peer: OidcPeer, count: int,
                   extra: str = "", rate: str = "100/1s") -> list[SidecarProcess]:
    """`count` sidecars on `redis`, each with the service `crm` (one login, one bucket of `rate`)."""
    body = f"""
[services.crm]
endpoint = "https://crm.example.com/mcp"
rate = "{rate}"
{oauth_line(peer, "shared")}
[[servers]]
name = "crm"
service = "crm"
"""
    return [start_on_state(stack, tmp_path / f"sidecar{i}", redis.url, body, {"CRM_SECRET": SECRET}, extra)
            for i in range(count)]


async def test_one_token_request_for_a_cold_service_across_sidecars(
        tmp_path: Path, redis: RedisPeer, peer: OidcPeer) -> None:
    peer.reset_stats()
    with ExitStack() as stack:
        sidecars = start_sidecars(stack, tmp_path, redis, peer, 3)
        clients = [AsyncClient(s.socket) for s in sidecars]
        try:
            answers = await asyncio.gather(*[c.headers_info("crm") for c in clients for _ in range(30)])
        finally:
            for c in clients:
                await c.aclose()
    assert len({a["fingerprint"] for a in answers}) == 1
    assert peer.stats()["token_requests"] == 1


def test_invalidation_on_one_sidecar_is_seen_by_the_others(tmp_path: Path, redis: RedisPeer,
                                                            peer: OidcPeer) -> None:
    with ExitStack() as stack:
        a, b = start_sidecars(stack, tmp_path, redis, peer, 2)
        with Client(a.socket) as ca, Client(b.socket) as cb:
            first = ca.headers_info("crm")["fingerprint"]
            assert cb.headers_info("crm")["fingerprint"] == first
            assert ca.invalidate("crm", first)
            b.wait_for("login dropped by another sidecar", timeout=LIVENESS)
            second = cb.headers_info("crm")["fingerprint"]
            assert second != first
            assert ca.headers_info("crm")["fingerprint"] == second
            assert not cb.invalidate("crm", first)  # already gone everywhere


async def test_shared_bucket_holds_across_sidecars(tmp_path: Path, redis: RedisPeer, peer: OidcPeer) -> None:
    """100/1s hammered through three sidecars for 3 s: every grant counted was decided within
    those 3 s, so one bucket allows at most 100 + 100 x 3 (a bucket per sidecar would allow three
    times that). At least half of it is granted (liveness; the machine may be busy)."""
    seconds = 3.0
    bound = 100 + 100 * seconds
    with ExitStack() as stack:
        sidecars = start_sidecars(stack, tmp_path, redis, peer, 3)
        clients = [AsyncClient(s.socket, timeout=30) for s in sidecars]
        start = time.monotonic()
        end = start + seconds
        grants: list[float] = []

        async def hammer(client: AsyncClient) -> None:
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    return
                try:
                    await client.acquire("crm", max_wait=left)
                except RateLimited:
                    return
                now = time.monotonic()
                if now <= end:
                    grants.append(now)

        try:
            await asyncio.gather(*[hammer(c) for c in clients for _ in range(4)])
        finally:
            for c in clients:
                await c.aclose()
    assert len(grants) <= bound
    assert len(grants) >= bound / 2, f"{len(grants)} grants"


def test_redis_lost_and_back(tmp_path: Path, redis: RedisPeer, peer: OidcPeer) -> None:
    with ExitStack() as stack:
        (sidecar,) = start_sidecars(stack, tmp_path, redis, peer, 1)
        with Client(sidecar.socket) as client:
            assert client.acquire("crm")["granted"] == 1
            login = client.headers_info("crm")
            redis.stop()
            with pytest.raises(StateUnavailable) as info:
                client.acquire("crm")
            assert "shared state unreachable" in info.value.message
            assert client.health()["status"] == "ok"  # the sidecar itself keeps serving
            assert client.headers_info("crm") == login  # a login it holds is still served
            redis.start()
            assert until_state_available(lambda: client.acquire("crm"))["granted"] == 1  # recovers by itself
            assert client.headers_info("crm")["key"] == "service:crm"
    assert sidecar.proc.returncode == 0


def test_degraded_mode_uses_a_local_share(tmp_path: Path, redis: RedisPeer, peer: OidcPeer) -> None:
    """A tenth of 100/10m while Redis is away: a local bucket of 10 refilled at 1 a minute, so at
    most 10 + (minutes asked) of 50 immediate acquires are granted, and all of the first 10 (the
    sidecar's own clock decides, however slow the machine). Back on Redis, its bucket's 100 are
    there again, which the empty local one could not give."""
    with ExitStack() as stack:
        (sidecar,) = start_sidecars(stack, tmp_path, redis, peer, 1, rate="100/10m",
                                    extra='on_state_loss = "local"\nlocal_share = 0.1')
        with Client(sidecar.socket) as client:
            redis.stop()
            start = time.monotonic()
            granted = 0
            for _ in range(50):
                with contextlib.suppress(RateLimited):
                    granted += client.acquire("crm", max_wait=0)["granted"]
            minutes = (time.monotonic() - start) / 60
            assert 10 <= granted <= 10 + minutes, granted
            redis.start()
            deadline = time.monotonic() + LIVENESS
            shared = 0
            while shared < 30:  # the local bucket holds at most 1 a minute now
                try:
                    shared += client.acquire("crm", max_wait=0)["granted"]
                except RateLimited:
                    assert time.monotonic() < deadline, f"{shared} granted since Redis came back"
                    time.sleep(0.05)


def test_a_grant_minted_on_one_sidecar_works_on_another(tmp_path: Path, redis: RedisPeer,
                                                        peer: OidcPeer) -> None:
    with ExitStack() as stack:
        a, b = start_sidecars(stack, tmp_path, redis, peer, 2)
        with Client(a.socket) as parent:
            minted = parent.grant(["crm"], ttl=60)
        with Client(b.socket, grant=minted["grant"]) as child:
            assert child.headers_info("crm")["key"] == "service:crm"
        with Client(b.socket) as other_parent:
            assert other_parent.revoke_grant(minted["id"])
        with Client(a.socket, grant=minted["grant"]) as child, pytest.raises(Forbidden):
            child.headers("crm")


def test_tls_and_a_password_from_a_secret_template(tmp_path: Path, peer: OidcPeer) -> None:
    password = "redis-pass-0123456789"
    with start_redis(tls=True, password=password) as tls_redis:
        socket = tmp_path / "run" / "s.sock"
        config = tmp_path / "config.toml"
        base = f"""
[sidecar]
socket = "{socket}"
state = "{tls_redis.url}"
state_key = "{{{{secret:STATE_KEY}}}}"
state_password = "{{{{secret:REDIS_PASSWORD}}}}"
state_ca = "{tls_redis.ca}"
[secrets]
sources = ["env"]
[[servers]]
name = "api"
endpoint = "https://api.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:STATE_KEY}}}}" }}
rate = "5/1h"
"""
        # 5 an hour: on a busy machine the refused take may come long after the five, and a
        # bucket refilling at 5/1s had a permit again by then (it failed so under load)
        config.write_text(base)
        env = {"STATE_KEY": STATE_KEY, "REDIS_PASSWORD": password}
        with run_sidecar(config, socket, env) as sidecar, Client(sidecar.socket) as client:
            assert client.acquire("api", cost=5)["granted"] == 5
            with pytest.raises(RateLimited):  # the bucket really is the one in Redis
                client.acquire("api", max_wait=0)
            assert client.status()["state"] == "shared"
        assert password not in sidecar.log
        with run_sidecar(config, socket, {**env, "REDIS_PASSWORD": "wrong"}) as sidecar, \
                Client(sidecar.socket) as client, pytest.raises(StateUnavailable):
            client.acquire("api")
        config.write_text(base.replace(f'state_ca = "{tls_redis.ca}"\n', ""))
        with run_sidecar(config, socket, env) as sidecar, Client(sidecar.socket) as client, \
                pytest.raises(StateUnavailable):
            client.acquire("api")  # an unknown CA is not trusted


async def test_revoking_a_parent_ends_every_child_whatever_its_ttl(redis: RedisPeer) -> None:
    from mcpcreds.core.clock import SystemClock
    from mcpcreds.state.grants import Grant, RedisGrants
    from mcpcreds.state.redis_state import RedisState

    state = RedisState(redis.url, STATE_KEY)
    grants = RedisGrants(state, SystemClock())
    now = time.time()
    try:
        await grants.put(Grant("p", ("crm",), now + 3600), "hash-p")
        await grants.put(Grant("a", ("crm",), now + 3000, "p", ("p",)), "hash-a")
        await grants.put(Grant("b", ("crm",), now + 0.2, "p", ("p",)), "hash-b")  # shortens the set
        await asyncio.sleep(0.3)  # b lapses (time only moves forward)
        assert await grants.get("hash-a") is not None
        assert await grants.revoke("p")
        assert await grants.get("hash-a") is None
    finally:
        await state.aclose()
