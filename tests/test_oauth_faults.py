"""Token endpoint faults, against a hand-made endpoint: the broker answers with a clear error
code, never a body or a secret, and never follows a redirect."""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import AsyncIterator, Iterator

import pytest

from mcpcreds.broker.broker import Broker
from mcpcreds.config.load import parse_config
from mcpcreds.core.clock import FakeClock, SystemClock
from mcpcreds.core.metrics import Metrics
from mcpcreds.credentials.sources import EnvSource, SecretResolver
from mcpcreds.errors import TokenEndpointError, TokenEndpointTimeout
from tests.conftest import CANARY
from tests.peers.fault_idp import FaultIdp, fault_idp
from tests.peers.oidc_peer import OidcPeer


@pytest.fixture
def idp() -> Iterator[FaultIdp]:
    with fault_idp() as server:
        yield server


def make_broker(idp: FaultIdp, extra: str = "", clock: FakeClock | None = None,
                token_timeout: str = "0.5s") -> Broker:
    """A broker on a fake clock (starting now, so expiries read like real ones): the token
    endpoint is real, time only moves when a test moves it."""
    config = parse_config(tomllib.loads(f"""
[sidecar]
token_timeout = "{token_timeout}"
[[servers]]
name = "crm"
endpoint = "{idp.base}/mcp"
oauth = {{ client_id = "c", client_secret = "{{{{secret:S}}}}", token_url = "{idp.token_url}" {extra} }}
"""))
    return Broker(config, SecretResolver([EnvSource({"S": CANARY})]), clock or FakeClock(time.time()), Metrics())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(time.time())


@pytest.fixture
async def broker(idp: FaultIdp, clock: FakeClock) -> AsyncIterator[Broker]:
    b = make_broker(idp, clock=clock)
    yield b
    await b.aclose()


@pytest.mark.parametrize(
    ("mode", "error"),
    [("500", "server_error"), ("garbage", "invalid_response"), ("huge", "response_too_large"),
     ("redirect", "unexpected_redirect"), ("invalid_client", "invalid_client")],
)
async def test_faults_become_token_endpoint_errors(idp: FaultIdp, broker: Broker, mode: str,
                                                   error: str) -> None:
    idp.mode = mode
    target = broker.target("crm")
    with pytest.raises(TokenEndpointError) as info:
        await broker.headers(target)
    assert info.value.error == error and info.value.status == 502
    assert CANARY not in info.value.message and "internal error" not in info.value.message
    assert idp.hits["/elsewhere"] == 0
    assert broker.logins.status()[0]["state"] == "failing"


async def test_a_stalled_endpoint_times_out_with_504(idp: FaultIdp, broker: Broker) -> None:
    idp.mode = "stall"
    started = time.monotonic()
    with pytest.raises(TokenEndpointTimeout) as info:
        await broker.headers(broker.target("crm"))
    assert info.value.status == 504
    assert time.monotonic() - started < 20  # token_timeout is 0.5 s; the stall would last 30 s


async def test_missing_expires_in_means_300_seconds(idp: FaultIdp, broker: Broker, clock: FakeClock) -> None:
    idp.mode = "no_expires"
    result = await broker.headers(broker.target("crm"))
    assert result.headers["Authorization"] == "Bearer fault-token-no-expiry"
    assert result.expires_at == clock.time() + 300


async def test_service_default_lifetime_is_used_when_configured(idp: FaultIdp, clock: FakeClock) -> None:
    idp.mode = "no_expires"
    broker = make_broker(idp, ', expires_in_default = "1h"', clock)
    try:
        result = await broker.headers(broker.target("crm"))
        assert result.expires_at == clock.time() + 3600
    finally:
        await broker.aclose()


async def test_failures_do_not_herd_the_token_endpoint(idp: FaultIdp, broker: Broker,
                                                      clock: FakeClock) -> None:
    idp.mode = "500"
    target = broker.target("crm")
    for _ in range(50):
        with pytest.raises(TokenEndpointError):
            await broker.headers(target)
    assert idp.hits["/token"] == 1  # later calls are answered from the backoff
    idp.mode = "ok"
    clock.advance(0.49)  # the first backoff is 0.5 to 1 s
    with pytest.raises(TokenEndpointError):
        await broker.headers(target)
    assert idp.hits["/token"] == 1
    clock.advance(0.52)  # the backoff has run out: the next call asks the endpoint again
    assert (await broker.headers(target)).headers["Authorization"] == "Bearer fault-token-2"
    assert idp.hits["/token"] == 2


OIDC_CLIENTS = [{"client_id": "c", "client_secret": CANARY,  # on the shared peer (conftest)
                 "token_endpoint_auth_method": "client_secret_basic", "scope": "tools:read"}]


async def test_discovery_from_protected_resource_metadata(idp: FaultIdp, oidc_session: OidcPeer) -> None:
    """No token_url, no issuer: RFC 9728 metadata of the endpoint names the AS."""
    peer = oidc_session
    idp.authorization_server = peer.issuer
    for challenge_only in (False, True):
        idp.challenge_only = challenge_only
        config = parse_config(tomllib.loads(f"""
[[servers]]
name = "crm"
endpoint = "{idp.base}/mcp"
oauth = {{ client_id = "c", client_secret = "{{{{secret:S}}}}", scope = "tools:read" }}
"""))
        broker = Broker(config, SecretResolver([EnvSource({"S": CANARY})]), SystemClock(), Metrics())
        try:
            result = await broker.headers(broker.target("crm"))
            assert result.headers["Authorization"].startswith("Bearer ey")
            assert broker.discovery.issuers[f"{idp.base}/mcp"] == peer.issuer
        finally:
            await broker.aclose()
    # each round asks the 401 first (the MCP spec's order); its document wins, so the path-based
    # well-known one is never asked
    assert idp.hits["/mcp"] == 2 and idp.hits["/prm"] == 2
    assert idp.hits["/.well-known/oauth-protected-resource/mcp"] == 0


async def test_a_caller_that_leaves_does_not_cancel_the_others(idp: FaultIdp) -> None:
    """Two callers wait on one resolution; the first goes away; the second still gets headers."""
    broker = make_broker(idp, token_timeout="20s")  # the stall ends when the test says so
    idp.mode = "stall"
    target = broker.target("crm")
    first = asyncio.create_task(broker.headers(target))
    second = asyncio.create_task(broker.headers(target))
    assert await asyncio.to_thread(idp.stalled.wait, 20)  # the token request is at the endpoint
    first.cancel()
    idp.release.set()  # the stalled request now answers 503
    try:
        with pytest.raises(TokenEndpointError) as info:
            await second  # answered (with the endpoint's error), not cancelled with the first
    finally:
        await broker.aclose()
    assert info.value.error == "server_error"  # the 503 the stall ends with, not a timeout
    assert first.cancelled() and idp.hits["/token"] == 1
