"""A person's login shared by several sidecars (issue 16, multi-host): two sidecars on one real
redis-server, each with its own keyring (two keyring services: two hosts), the real oidc-provider
rotating refresh tokens. The login made on host A is renewed by either sidecar from the refresh
token in Redis (encrypted: no token in any Redis value), exactly one refresh_token grant request at
the IdP per renewal, concurrent renewals included; a refused refresh token is login_required on
both, and a spent keyring login is never adopted again; a logout on one host ends the login for
both; a new login on host B is adopted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

import httpx
import keyring
import pytest
import redis as redis_sync

from mcpcreds import AsyncClient, Client
from mcpcreds.errors import LoginRequired
from mcpcreds.state.redis_state import SALT_KEY, derive_keys
from tests.conftest import CANARY, KeyringSession, module_peer
from tests.peers.oidc_peer import OidcPeer, approve_in_browser
from tests.peers.redis_peer import RedisPeer, start_redis
from tests.redis_sidecar import STATE_KEY, start_on_state
from tests.sidecar_proc import SidecarProcess

DEVICE = "urn:ietf:params:oauth:grant-type:device_code"
OIDC_CLIENTS: list[dict[str, Any]] = [
    {"client_id": "c-device-shared", "token_endpoint_auth_method": "none",
     "grant_types": [DEVICE, "refresh_token"], "scope": "tools:read"},
]


@pytest.fixture(scope="module")
def peer(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, 3600)


class Hosts:
    def __init__(self, peer: OidcPeer, redis: RedisPeer, workdir: Path, stack: ExitStack) -> None:
        self.peer, self.redis = peer, redis
        self.services = {h: f"mcpcreds-shared-{h}-{uuid.uuid4().hex[:8]}" for h in ("a", "b")}
        self.configs: dict[str, Path] = {}
        self.sidecars: dict[str, SidecarProcess] = {}
        for host, service in self.services.items():
            body = f"""keyring_service = "{service}"
[[servers]]
name = "dev"
endpoint = "https://dev.example.com/mcp"
auth = {{ kind = "oauth2", grant = "device", issuer = "{peer.issuer}", client_id = "c-device-shared", scopes = ["tools:read"] }}
"""
            proc = start_on_state(stack, workdir / host, redis.url, body, {},
                                  extra="invalidate_cooldown = 0\n")  # every invalidation renews
            self.sidecars[host] = proc
            self.configs[host] = proc.config

    def login(self, host: str) -> str:
        """`mcpcreds login dev` on `host`, approved in the 'browser'; its output. The command
        returns once the sidecar it told has redeemed the new login: one refresh_token grant."""
        before = self.refresh_grants()
        proc = subprocess.Popen([sys.executable, "-m", "mcpcreds.cli.main", "login", "dev", "--config",
                                 str(self.configs[host])], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        url = None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "(or open " in line or line.startswith("http"):
                url = line.split("(or open ")[-1].strip().rstrip(")").split()[0] if "(or open " in line \
                    else line.strip()
                break
        assert url is not None, "".join(lines)
        approve_in_browser(url)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, "".join(lines) + err + out
        assert self.refresh_grants() == before + 1
        return "".join(lines) + err + out

    def keyring_entry(self, host: str) -> dict[str, Any] | None:
        text = keyring.get_password(self.services[host], "login.mcp.dev")
        return json.loads(text) if text else None

    def shared_refresh_token(self) -> str:
        """The refresh token in Redis, decrypted with the state key (as a sidecar reads it)."""
        client = redis_sync.Redis.from_url(self.redis.url)
        try:
            salt, blob = client.get(SALT_KEY), client.get("mcpcreds:{mcp:dev}:person")
        finally:
            client.close()
        assert salt is not None and blob is not None
        data = json.loads(derive_keys(STATE_KEY, cast(bytes, salt)).fernet.decrypt(blob))
        return str(json.loads(data["login"])["refresh_token"])

    def refresh_grants(self) -> int:
        return int(self.peer.stats().get("by_grant", {}).get("refresh_token", 0))

    def redis_values(self) -> str:
        client = redis_sync.Redis.from_url(self.redis.url)
        try:
            out: list[Any] = []  # bytes (no decode_responses), which redis-py hints as bytes | str
            for name in client.keys("*"):
                kind = client.type(name)
                if kind == b"string":
                    out.append(client.get(name) or b"")
                elif kind == b"hash":
                    out += list(client.hgetall(name).values())
            return b"\n".join(out).decode("latin-1")
        finally:
            client.close()


@pytest.fixture(scope="module")
def hosts(peer: OidcPeer, tmp_path_factory: pytest.TempPathFactory, keyring_session: KeyringSession
          ) -> Iterator[Hosts]:
    """One redis-server and two sidecars for the module; each test starts with a login."""
    with start_redis() as redis, ExitStack() as stack:
        yield Hosts(peer, redis, tmp_path_factory.mktemp("hosts"), stack)


async def fingerprints(hosts: Hosts) -> dict[str, str]:
    out = {}
    for host, proc in hosts.sidecars.items():
        async with AsyncClient(proc.socket) as creds:
            out[host] = (await creds.headers_info("dev"))["fingerprint"]
    return out


async def test_either_sidecar_renews_the_login_with_one_refresh_grant_per_renewal(hosts: Hosts) -> None:
    start = hosts.refresh_grants()
    hosts.login("a")  # told by the login, sidecar A redeems the new refresh token
    assert hosts.refresh_grants() == start + 1
    first = await fingerprints(hosts)  # B has no login in its keyring: it reads the shared one
    assert first["a"] == first["b"] and hosts.refresh_grants() == start + 1
    assert hosts.keyring_entry("b") is None
    seen_tokens = {hosts.keyring_entry("a")["refresh_token"], hosts.shared_refresh_token()}  # type: ignore[index]
    for renewing in ("b", "a", "b"):  # each renewal: an invalidation on one host, then both ask
        before = hosts.refresh_grants()
        async with AsyncClient(hosts.sidecars[renewing].socket) as creds:
            held = await creds.headers_info("dev")
            await creds.invalidate("dev", held["fingerprint"])
        both = await asyncio.gather(*(fingerprints(hosts) for _ in range(3)))  # concurrent asks on both hosts
        assert len({fp for answer in both for fp in answer.values()}) == 1
        assert hosts.refresh_grants() == before + 1  # one redemption at the IdP, whoever asked
        seen_tokens.add(hosts.shared_refresh_token())
    assert len(seen_tokens) == 5  # the login's, then one rotated per redemption
    # the rotated tokens are in Redis encrypted: none appears in any Redis value, nor the first one
    values = hosts.redis_values()
    assert values and all(token not in values for token in seen_tokens)
    assert "c-device-shared" not in values  # the whole record is encrypted, not just the token


async def test_a_refused_refresh_token_is_login_required_on_both_and_no_spent_one_is_redeemed(
        hosts: Hosts) -> None:
    hosts.login("a")
    await fingerprints(hosts)
    # the IdP stops taking the shared refresh token (revoked, as by a security team)
    discovery = httpx.get(f"{hosts.peer.issuer}/.well-known/openid-configuration").json()
    httpx.post(discovery["revocation_endpoint"], data={"token": hosts.shared_refresh_token(),
                                                        "token_type_hint": "refresh_token",
                                                        "client_id": "c-device-shared"}).raise_for_status()
    before = hosts.refresh_grants()
    for host in ("b", "a"):
        with Client(hosts.sidecars[host].socket) as client:
            with contextlib.suppress(LoginRequired):  # A may have dropped its copy on B's event already
                client.invalidate("dev", client.headers_info("dev")["fingerprint"])
            with pytest.raises(LoginRequired) as info:
                client.headers("dev")
        assert info.value.status == 401 and "mcpcreds login dev" in info.value.message
    # B's one refused redemption; A never redeems the spent login its keyring still holds
    assert hosts.refresh_grants() == before + 1
    assert hosts.keyring_entry("a") is not None


async def test_a_logout_on_one_host_ends_the_login_for_both(hosts: Hosts) -> None:
    hosts.login("a")
    await fingerprints(hosts)
    grants = hosts.refresh_grants()
    result = subprocess.run([sys.executable, "-m", "mcpcreds.cli.main", "logout", "dev", "--config",
                             str(hosts.configs["a"])], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert hosts.keyring_entry("a") is None
    for host in ("a", "b"):
        with Client(hosts.sidecars[host].socket) as client:
            with contextlib.suppress(LoginRequired):  # A's was dropped by the logout; B's copy is dropped here
                client.invalidate("dev", client.headers_info("dev")["fingerprint"])
            with pytest.raises(LoginRequired) as info:
                client.headers("dev")
        assert info.value.status == 401 and "mcpcreds login dev" in info.value.message
    # the login is over for both without asking the IdP (the logout cleared the shared one; B did
    # not try the refresh token in Redis, whether or not the revocation reached it)
    assert hosts.refresh_grants() == grants
    # a login on host B is a new login: adopted, and served on both
    hosts.login("b")
    fps = await fingerprints(hosts)
    assert fps["a"] == fps["b"] and hosts.refresh_grants() == grants + 1
    assert CANARY not in hosts.sidecars["a"].log
