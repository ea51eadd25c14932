"""`creds.auth(name)` end to end: httpx -> the real sidecar (a process) -> a local upstream, with a
real authorization server (oidc-provider) behind the logins.

Every "wait" here waits on a condition (a log line, a count, a bucket's waiting list) with a
timeout; the one fixed pause (`test_connect_retry_window_starts_at_the_failure`) only makes a call
older than the retry window, it races with nothing.

Times: the sidecar's buckets read `time.monotonic()`, one clock for every process of the machine,
and so do these tests; a pause starts after the 429 that caused it was sent, and a permit is
granted after its request was sent and before its answer is read. The bounds below follow from
that alone, whatever the load.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from mcpcreds import AsyncClient, Client, RateLimited, SidecarUnavailable
from tests.conftest import module_peer
from tests.peers.oidc_peer import OidcPeer
from tests.peers.upstream import Upstream, one_of, start_upstream
from tests.sidecar_proc import SidecarProcess, run_sidecar

CLIENT_SECRET = "e2e-client-secret-5d1f"
STATIC_TOKEN = "static-token-8c0b7e2a41f9"
OIDC_CLIENTS: list[dict[str, Any]] = [  # on the shared peer (conftest)
    {"client_id": "c-crm", "client_secret": CLIENT_SECRET, "token_endpoint_auth_method": "client_secret_basic",
     "scope": "tools:read tools:call"},
]
TTL = 600  # no renewal by time during a test: every token request here comes from a 401
RESTART_WINDOW = 30.0  # connect_retry for the kill/restart test; a restart takes ~1 s here, idle
SLACK = 1e-6  # float rounding in the sidecar's arithmetic (its own grant slack is 1e-9 s)

OAUTH_CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[services.crm]
endpoint = "{endpoint}"
[services.crm.oauth]
token_url = "{token_url}"
client_id = "c-crm"
client_secret = "{{{{secret:CRM_SECRET}}}}"
scope = "tools:read tools:call"
[[servers]]
name = "crm-ro"
service = "crm"
[[servers]]
name = "crm-rw"
service = "crm"
"""

STATIC_CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[services.api]
endpoint = "{endpoint}"
auth = {{ kind = "static", token = "{{{{secret:API_TOKEN}}}}" }}
{rate}
[[servers]]
name = "a"
service = "api"
[[servers]]
name = "b"
service = "api"
"""


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def peer(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, TTL)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with start_upstream() as up:
        yield up


def jwt_accepter(peer: OidcPeer, audience: str) -> Callable[[str], bool]:
    """What a resource server checks: the peer's signature, our audience, not expired."""
    keys = KeySet.import_key_set(cast(Any, peer.jwks()))
    registry = jwt.JWTClaimsRegistry(aud={"essential": True, "value": audience}, exp={"essential": True})

    def accept(token: str) -> bool:
        try:
            registry.validate(jwt.decode(token, keys).claims)
        except (JoseError, ValueError):
            return False
        return True

    return accept


@pytest.fixture
def oauth_sidecar(peer: OidcPeer, upstream: Upstream, tmp_path: Path) -> Iterator[SidecarProcess]:
    """Logins for `crm` (default resource = its endpoint = the upstream) from the oidc peer;
    the upstream takes only the peer's JWTs for that audience, minus the revoked ones."""
    endpoint = f"{upstream.url}/mcp"
    upstream.accept = jwt_accepter(peer, endpoint)
    socket = tmp_path / "run" / "s.sock"
    config = tmp_path / "config.toml"
    config.write_text(OAUTH_CONFIG.format(socket=socket, endpoint=endpoint, token_url=peer.token_url))
    peer.reset_stats()
    with run_sidecar(config, socket, {"CRM_SECRET": CLIENT_SECRET}) as proc:
        yield proc


def static_config(tmp_path: Path, upstream: Upstream, rate: str | None = None) -> tuple[Path, Path]:
    socket = tmp_path / "run" / "s.sock"
    config = tmp_path / "config.toml"
    config.write_text(STATIC_CONFIG.format(socket=socket, endpoint=f"{upstream.url}/mcp",
                                           rate=f'rate = "{rate}"' if rate else ""))
    upstream.accept = one_of(STATIC_TOKEN)
    return config, socket


STATIC_ENV = {"API_TOKEN": STATIC_TOKEN}


@pytest.fixture
def static_sidecar(upstream: Upstream, tmp_path: Path) -> Iterator[SidecarProcess]:
    config, socket = static_config(tmp_path, upstream)
    with run_sidecar(config, socket, STATIC_ENV) as proc:
        yield proc


def token_requests(peer: OidcPeer) -> int:
    return int(peer.stats()["token_requests"])


def bearer(response: httpx.Response) -> str:
    value = response.request.headers["Authorization"]
    assert value.startswith("Bearer ")
    return value[7:]


# ------------------------------------------------------------------------------------------ 401


async def test_revoked_token_renews_once_and_the_retry_succeeds(
        peer: OidcPeer, upstream: Upstream, oauth_sidecar: SidecarProcess) -> None:
    async with AsyncClient(oauth_sidecar.socket) as creds, \
            httpx.AsyncClient(base_url=upstream.url, auth=creds.auth("crm-ro")) as http:
        first = await http.get("/mcp")
        assert first.status_code == 200 and token_requests(peer) == 1
        old = bearer(first)
        upstream.revoke(old)

        before = token_requests(peer)
        second = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert second.status_code == 200, second.text
        assert token_requests(peer) == before + 1  # exactly one renewal
        new = bearer(second)
        assert new != old
        assert upstream.tokens() == {old: 2, new: 1}  # old: 200 then 401; new: the retry
        assert upstream.counts() == {200: 2, 401: 1}
        # the renewed login is the one every consumer of the service now gets
        info = await creds.headers_info("crm-rw")
        assert info["headers"]["Authorization"] == f"Bearer {new}"
        third = await http.get("/mcp")
        assert third.status_code == 200 and bearer(third) == new and token_requests(peer) == before + 1


async def test_fifty_concurrent_401s_cause_one_token_request(
        peer: OidcPeer, upstream: Upstream, oauth_sidecar: SidecarProcess) -> None:
    async with AsyncClient(oauth_sidecar.socket) as creds, \
            httpx.AsyncClient(base_url=upstream.url, auth=creds.auth("crm-ro")) as http:
        warm = await http.get("/mcp")
        old = bearer(warm)
        upstream.revoke(old)
        # the upstream holds its 401s until all fifty are in: every request saw the old token
        # (none could have started after another's invalidation)
        upstream.hold_401s(50)
        before = token_requests(peer)
        responses = await asyncio.gather(*(http.get(f"/mcp?i={i}") for i in range(50)))

    assert [r.status_code for r in responses] == [200] * 50
    assert token_requests(peer) == before + 1
    assert upstream.count(401) == 50 and upstream.count(200) == 51
    assert len({bearer(r) for r in responses}) == 1 and bearer(responses[0]) != old
    assert upstream.tokens()[old] == 51
    assert upstream.paths() == {"/mcp": 1, **{f"/mcp?i={i}": 1 for i in range(50)}}


def test_sync_client_auth_renews_on_401(peer: OidcPeer, upstream: Upstream,
                                        oauth_sidecar: SidecarProcess) -> None:
    with Client(oauth_sidecar.socket) as creds, \
            httpx.Client(base_url=upstream.url, auth=creds.auth("crm-rw")) as http:
        first = http.get("/mcp")
        assert first.status_code == 200
        upstream.revoke(bearer(first))
        before = token_requests(peer)
        second = http.post("/mcp", content=b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call"}')
        assert second.status_code == 200 and bearer(second) != bearer(first)
        assert token_requests(peer) == before + 1
        assert upstream.counts() == {200: 2, 401: 1}
        # a sync auth refuses an async HTTP client rather than blocking its event loop
        with pytest.raises(RuntimeError, match="sync"):
            asyncio.run(_one_async_get(upstream.url, creds.auth("crm-rw")))


async def _one_async_get(url: str, auth: httpx.Auth) -> None:
    async with httpx.AsyncClient(auth=auth) as http:
        await http.get(url)


# ------------------------------------------------------------------------------------------ 429

OTHER_PROCESS = """
import json, sys, time
from mcpcreds import Client, RateLimited
with Client(sys.argv[1]) as client:
    client.health()
    print("ready", flush=True)
    for line in sys.stdin:
        name, max_wait = line.split()
        started = time.monotonic()
        try:
            out = {"ok": True, "waited": client.acquire(name, max_wait=float(max_wait))["waited"]}
        except RateLimited as exc:
            out = {"ok": False, "retry_after": exc.retry_after}
        out.update(started=started, ended=time.monotonic())
        print(json.dumps(out), flush=True)
"""


class OtherProcess:
    """A second process with its own `Client`, driven line by line (no start-up time in the way)."""

    def __init__(self, socket: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", OTHER_PROCESS, str(socket)], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the other process exited ({self.proc.wait()})")
        return line.strip()

    def acquire(self, name: str, max_wait: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{name} {max_wait}\n")
        self.proc.stdin.flush()
        return dict(json.loads(self._line()))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def other_process(static_sidecar: SidecarProcess) -> Iterator[OtherProcess]:
    other = OtherProcess(static_sidecar.socket)
    try:
        yield other
    finally:
        other.close()


async def test_upstream_429_pauses_other_processes(upstream: Upstream, static_sidecar: SidecarProcess,
                                                   other_process: OtherProcess) -> None:
    assert other_process.acquire("b", 0)["ok"]  # not paused yet
    async with AsyncClient(static_sidecar.socket) as creds, \
            httpx.AsyncClient(base_url=upstream.url, auth=creds.auth("a", on_429="raise")) as http:
        upstream.reject_next(1, retry_after=2)
        sent = time.monotonic()
        with pytest.raises(RateLimited) as info:
            await http.get("/mcp")
        assert info.value.retry_after == 2
        # another process, through the other server of the same service, waits the pause out
        waited = other_process.acquire("b", 5)
        assert waited["ok"] and waited["ended"] - sent >= 2 - SLACK  # nothing granted before its end
        # a longer pause: a caller that will not wait is refused, told the pause left (never more)
        upstream.reject_next(1, retry_after=3600)
        sent = time.monotonic()
        with pytest.raises(RateLimited):
            await http.get("/mcp")
        refused = other_process.acquire("b", 0)
    assert not refused["ok"] and sent + 3600 - refused["ended"] <= refused["retry_after"] <= 3600
    assert upstream.counts() == {429: 2}


async def test_on_429_wait_retries_after_the_pause_and_return_hands_back_the_429(
        upstream: Upstream, static_sidecar: SidecarProcess) -> None:
    async with AsyncClient(static_sidecar.socket) as creds:
        assert creds.auth("a").on_429 == "wait"  # the default since 4373967 (not "raise")
        async with httpx.AsyncClient(base_url=upstream.url, auth=creds.auth("a")) as http:
            upstream.reject_next(1, retry_after=1)
            started = time.monotonic()
            response = await http.get("/mcp")
            assert response.status_code == 200
            assert time.monotonic() - started >= 1 - SLACK  # the retry was granted after the pause
        async with httpx.AsyncClient(base_url=upstream.url, auth=creds.auth("b", on_429="return")) as http:
            upstream.reject_next(1, retry_after=3600)
            sent = time.monotonic()
            response = await http.get("/mcp")
            assert response.status_code == 429 and response.headers["Retry-After"] == "3600"
        with pytest.raises(RateLimited) as info:
            await creds.acquire("a", max_wait=0)  # "return" paused the bucket too
        assert sent + 3600 - time.monotonic() <= info.value.retry_after <= 3600
    assert upstream.counts() == {429: 2, 200: 1}


# ------------------------------------------------------------------------------- kill / restart


async def wait_until_waiting(observer: AsyncClient, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        buckets = (await observer.status())["buckets"]
        if buckets and buckets[0]["waiting"] == count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never saw {count} waiting")


async def drain(observer: AsyncClient, name: str) -> None:
    """Take every permit left, so that the next call waits in the sidecar."""
    level = int((await observer.status())["buckets"][0]["level"])
    if level:
        await observer.acquire(name, cost=level)


async def kill(sidecar: SidecarProcess) -> None:
    sidecar.signal(signal.SIGKILL)
    await asyncio.to_thread(sidecar.proc.wait, 10)


async def start(config: Path, socket: Path) -> SidecarProcess:
    """A new sidecar on the same socket path: it must replace the socket the killed one left."""
    assert socket.exists()  # a SIGKILLed sidecar leaves its socket file behind
    sidecar = SidecarProcess(config, socket, STATIC_ENV)
    await asyncio.to_thread(sidecar.wait_for, "removed stale socket")
    await asyncio.to_thread(sidecar.wait_for, "ready")
    return sidecar


async def test_sigkill_and_restart_lose_no_request(upstream: Upstream, tmp_path: Path) -> None:
    """Forty requests through `auth=`; the sidecar is SIGKILLed twice: once between two requests
    (the client's pooled connection is dead), once while a call waits inside it for a permit (the
    call dies mid-flight). Each restart is within the client's connect_retry: all forty succeed,
    each reaches the upstream exactly once. (The per-request path: `lease=False`, so that every
    permit is asked of the sidecar; a leased auth waits for its share in its own process.)"""
    config, socket = static_config(tmp_path, upstream, rate="100/1000s")  # 1 permit per 10 s
    sidecars = [SidecarProcess(config, socket, STATIC_ENV)]
    outcomes: list[str] = []
    restarts: list[float] = []
    try:
        await asyncio.to_thread(sidecars[0].wait_for, "ready")
        async with AsyncClient(socket, connect_retry=RESTART_WINDOW) as creds, \
                AsyncClient(socket) as observer, \
                httpx.AsyncClient(base_url=upstream.url, auth=creds.auth("a", lease=False)) as http:

            async def request(i: int) -> None:
                try:
                    response = await http.get(f"/mcp?i={i}")
                except Exception as exc:  # seen by the caller: counted, never lost
                    outcomes.append(f"{i}: {type(exc).__name__}")
                else:
                    outcomes.append(f"{i}: {response.status_code}")

            for i in range(15):
                await request(i)
            # 1. between two requests
            await kill(sidecars[-1])
            killed = time.monotonic()
            sidecars.append(await start(config, socket))
            restarts.append(time.monotonic() - killed)
            for i in range(15, 30):
                await request(i)
            # 2. while request 30 waits in the sidecar for a permit
            await drain(observer, "b")
            pending = asyncio.create_task(request(30))
            await wait_until_waiting(observer, 1)
            await kill(sidecars[-1])
            killed = time.monotonic()
            sidecars.append(await start(config, socket))
            restarts.append(time.monotonic() - killed)
            await pending
            for i in range(31, 40):
                await request(i)
    finally:
        for sidecar in sidecars:
            sidecar.stop()
    assert all(r < RESTART_WINDOW for r in restarts), restarts
    assert outcomes == [f"{i}: 200" for i in range(40)]
    assert upstream.paths() == {f"/mcp?i={i}": 1 for i in range(40)}
    assert upstream.counts() == {200: 40}


def test_outage_longer_than_connect_retry_is_seen_by_the_caller(upstream: Upstream, tmp_path: Path) -> None:
    """With the sync client: a request made while no sidecar answers fails, in the caller's hands,
    after connect_retry; it never reaches the upstream; the next one after a restart succeeds.
    (The per-request path, `lease=False`: a leased auth may spend its lease until the end of the
    event stream reaches its reader thread, which a busy machine can delay past requests 10, 11.)"""
    config, socket = static_config(tmp_path, upstream)
    sidecar = SidecarProcess(config, socket, STATIC_ENV)
    restarted: SidecarProcess | None = None
    ok = failed = 0
    try:
        sidecar.wait_for("ready")
        with Client(socket, connect_retry=0.3) as creds, \
                httpx.Client(base_url=upstream.url, auth=creds.auth("a", lease=False)) as http:
            for i in range(20):
                if i == 10:
                    sidecar.signal(signal.SIGKILL)
                    sidecar.proc.wait(10)
                if i == 12:
                    restarted = SidecarProcess(config, socket, STATIC_ENV)
                    restarted.wait_for("ready")
                started = time.monotonic()
                try:
                    response = http.get(f"/mcp?i={i}")
                except SidecarUnavailable:
                    failed += 1
                    # it retried until the window (opened at the first failure) was over, and
                    # not for ever (a generous bound: it is 0.3 s and a few connects)
                    assert 0.3 <= time.monotonic() - started < 20
                else:
                    assert response.status_code == 200
                    ok += 1
    finally:
        sidecar.stop()
        if restarted is not None:
            restarted.stop()
    assert (ok, failed) == (18, 2)
    assert upstream.counts() == {200: 18}
    assert set(upstream.paths()) == {f"/mcp?i={i}" for i in (*range(10), *range(12, 20))}


async def test_connect_retry_window_starts_at_the_failure(upstream: Upstream, tmp_path: Path) -> None:
    """A call that waited in the sidecar for longer than connect_retry is still retried across a
    restart: the window opens at the first failure (fixed in 332e4cf; before, it opened when the
    call started and this call failed at once with SidecarUnavailable).

    The replacement sidecar is started beforehand, on a socket beside the first, and its socket
    is renamed onto the first one's path once that one is killed: the restart takes a rename, so
    the window need only be longer than the call's wait, not than a process start under load."""
    config, socket = static_config(tmp_path, upstream, rate="100/1000s")
    spare_socket = socket.with_name("spare.sock")
    spare_config = tmp_path / "spare.toml"
    spare_config.write_text(config.read_text().replace(str(socket), str(spare_socket)))
    sidecars = [SidecarProcess(config, socket, STATIC_ENV), SidecarProcess(spare_config, spare_socket, STATIC_ENV)]
    window = 2.0
    try:
        for sidecar in sidecars:
            await asyncio.to_thread(sidecar.wait_for, "ready")
        async with AsyncClient(socket, connect_retry=window) as creds, AsyncClient(socket) as observer:
            await drain(observer, "a")
            pending = asyncio.create_task(creds.call("a", max_wait=30))
            await wait_until_waiting(observer, 1)
            await asyncio.sleep(window + 0.3)  # the call is now older than the retry window
            await kill(sidecars[0])
            spare_socket.rename(socket)  # the spare sidecar now answers on the socket path
            answer = await pending
            assert answer["granted"] == 1
    finally:
        for sidecar in sidecars:
            sidecar.stop()
