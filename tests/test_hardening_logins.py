"""Logins that fail unexpectedly (issue 12): a hostile or broken IdP answer, a malformed key or an
unusable URL is a token_endpoint_error with backoff and a status, never a 500 or a served header."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import random
import subprocess
import time
import tomllib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpcreds.broker.broker import Broker
from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Target
from mcpcreds.core.clock import FakeClock, SystemClock
from mcpcreds.core.metrics import Metrics
from mcpcreds.core.secret import REDACTOR
from mcpcreds.credentials.discovery import Discovery, token_endpoint_from
from mcpcreds.credentials.logins import LoginCache
from mcpcreds.credentials.oauth import (
    TokenRequest,
    build_token_request,
    parse_token_response,
    send_token_request,
)
from mcpcreds.credentials.sources import EnvSource, SecretResolver
from mcpcreds.credentials.tokens import Token, backoff_delay
from mcpcreds.errors import TokenEndpointError
from tests.conftest import CANARY
from tests.peers.fault_idp import FaultIdp, fault_idp
from tests.sidecar_proc import run_sidecar
from tests.test_logins import TARGET
from tests.test_oauth import spec

BAD_PEM = f"-----BEGIN PRIVATE KEY-----\n{CANARY}\n-----END PRIVATE KEY-----\n"


def b64(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def answer(**fields: Any) -> bytes:
    return json.dumps({"access_token": "t1234", "token_type": "Bearer", **fields}).encode()


# -- parse_token_response: every number and string from the IdP is checked


@pytest.mark.parametrize("value", ["tok\r\nX-Injected: 1", "tok\nen", "tok\x00en", "tok\ten", "tok en",
                                   "tok\x7fen", "tök-en", "tok\u2028en"])
def test_an_access_token_that_is_not_header_safe_is_refused(value: str) -> None:
    with pytest.raises(TokenEndpointError) as info:
        parse_token_response(200, "", json.dumps({"access_token": value}).encode(), 0, 300)
    assert info.value.error == "invalid_response" and value not in info.value.message
    assert value not in REDACTOR  # refused, so never registered: it is never served


def test_a_refused_token_is_not_registered_with_the_redactor() -> None:
    value = "refused-token-5c1e7b"
    with pytest.raises(TokenEndpointError):
        parse_token_response(200, "", answer(access_token=value, token_type="mac"), 0, 300)
    assert value not in REDACTOR


@pytest.mark.parametrize("expires_in", [10**400, 1e300, "1e300", 86401], ids=["10^400", "1e300", "str", "day+1"])
def test_a_huge_expires_in_is_cut_to_a_day(expires_in: Any) -> None:
    token = parse_token_response(200, "", answer(expires_in=expires_in), 1000.0, 300)
    assert (token.obtained_at, token.expires_at) == (1000.0, 1000.0 + 86400)


@pytest.mark.parametrize("body", [answer(expires_in=True), answer(expires_in=0.5)], ids=["bool", "half-second"])
def test_a_lifetime_too_short_to_serve_or_not_a_number_is_refused(body: bytes) -> None:
    with pytest.raises(TokenEndpointError) as info:
        parse_token_response(200, "", body, 1000.0, 300)
    assert info.value.error == "invalid_response"


@pytest.mark.parametrize("exp", ["1" + "0" * 400, "-Infinity"], ids=["10^400", "-inf"])
def test_a_jwt_exp_no_float_can_hold_is_ignored(exp: str) -> None:
    payload = base64.urlsafe_b64encode(f'{{"exp": {exp}}}'.encode()).decode().rstrip("=")
    token = parse_token_response(200, "", answer(access_token=f"{b64({'alg': 'none'})}.{payload}.sig",
                                                 expires_in=60), 1000.0, 300)
    assert token.expires_at == 1060.0


def test_json_nested_too_deep_is_invalid_not_a_crash() -> None:
    with pytest.raises(TokenEndpointError) as info:
        parse_token_response(200, "", b"[" * 60_000, 0, 300)
    assert info.value.error == "invalid_response"
    deep_jwt = f"{b64({'alg': 'none'})}.{base64.urlsafe_b64encode(b'[' * 9000).decode()}.sig"
    token = parse_token_response(200, "", answer(access_token=deep_jwt, expires_in=60), 0, 300)
    assert token.expires_at == 60.0  # its exp is unreadable: expires_in decides


def test_a_scope_with_control_characters_is_dropped() -> None:
    assert parse_token_response(200, "", answer(scope="a\r\nb"), 0, 300).scope is None


# -- the request: a malformed key, an unusable URL


def test_a_malformed_private_key_is_a_token_endpoint_error_that_does_not_quote_it() -> None:
    with pytest.raises(TokenEndpointError) as info:
        build_token_request(spec("private_key_jwt", client_secret=None), "https://a.example/token", BAD_PEM)
    assert info.value.error == "invalid_private_key" and "ValueError" in info.value.message
    assert CANARY not in info.value.message and info.value.__cause__ is None
    assert info.value.__suppress_context__


async def test_a_token_url_httpx_cannot_parse_is_a_token_endpoint_error() -> None:
    request = TokenRequest("https://0177.0.0.1/token", {}, "grant_type=client_credentials")
    async with httpx.AsyncClient() as http:
        with pytest.raises(TokenEndpointError) as info:
            await send_token_request(http, request, 0, 300)
    assert info.value.error == "invalid_token_url"


async def test_a_compressed_token_response_is_refused_before_it_is_inflated(idp: FaultIdp) -> None:
    idp.mode = "gzip"
    request = build_token_request(spec("client_secret_post"), idp.token_url, "s")
    assert request.headers["Accept-Encoding"] == "identity"
    async with httpx.AsyncClient() as http:
        with pytest.raises(TokenEndpointError) as info:
            await send_token_request(http, request, 0, 300)
    assert info.value.error == "invalid_response" and "compressed" in info.value.message


# -- discovery documents from a hostile server


@pytest.mark.parametrize("endpoint", ["https://as.example/tok\r\nen", "https://as.example/tok\ten",
                                      "https://as.example/" + "a" * 3000], ids=["crlf", "tab", "3000-chars"])
def test_metadata_with_an_unusable_token_endpoint_is_refused(endpoint: Any) -> None:
    with pytest.raises(TokenEndpointError) as info:
        token_endpoint_from({"issuer": "https://as.example", "token_endpoint": endpoint}, "https://as.example")
    assert info.value.error == "invalid_metadata"


def hostile(handler: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def test_metadata_nested_too_deep_or_compressed_is_invalid_metadata() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("nested"):
            return httpx.Response(200, content=b"[" * 60_000)
        doc = json.dumps({"issuer": "https://as.example/gz", "token_endpoint": "https://as.example/t"})
        return httpx.Response(200, content=gzip.compress(doc.encode()), headers={"Content-Encoding": "gzip"})

    async with hostile(handler) as http:
        for issuer in ("https://as.example/nested", "https://as.example/gz"):
            with pytest.raises(TokenEndpointError) as info:
                await Discovery().from_issuer(issuer, http)
            assert info.value.error == "invalid_metadata"


async def test_the_challenge_reads_only_the_head_of_an_endless_body() -> None:
    pulled = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(64):  # 64 MiB, as far as anyone reads
            pulled += 1
            yield b"x" * (1 << 20)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(401, content=endless(), headers={
                "WWW-Authenticate": 'Bearer resource_metadata="https://rs.example/prm\tx"'})
        return httpx.Response(404)

    async with hostile(handler) as http:
        with pytest.raises(TokenEndpointError) as info:
            await Discovery().issuer_for("https://rs.example/mcp", http)
    assert info.value.error == "discovery_failed"  # the tab makes the named URL unusable
    assert pulled <= 1


# -- the login cache: any exception while fetching is a token_endpoint_error with backoff


class Raising:
    """A fetch that fails the way a bug or a hostile answer does, quoting a secret."""

    def __init__(self, clock: FakeClock, exc: type[Exception] = OverflowError) -> None:
        self.clock = clock
        self.exc = exc
        self.calls = 0
        self.fail = True

    async def fetch(self, target: Target) -> Token:
        self.calls += 1
        if self.fail:
            raise self.exc(f"could not load {BAD_PEM}")
        now = self.clock.time()
        return Token(f"token-{self.calls}", "Bearer", now, now + 100.0, None, f"{self.calls:08x}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def raising(clock: FakeClock) -> Raising:
    return Raising(clock)


@pytest.fixture
def cache(raising: Raising, clock: FakeClock) -> Iterator[LoginCache]:
    c = LoginCache(raising.fetch, clock, refresh_ahead=20, rng=random.Random(0))
    yield c
    c.close()


def first_backoff() -> float:
    return backoff_delay(1, random.Random(0))  # the cache's rng, drawn for the first failure


async def test_an_unexpected_exception_is_a_token_endpoint_error_then_backoff(
        cache: LoginCache, raising: Raising, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "mcpcreds")
    with pytest.raises(TokenEndpointError) as info:
        await cache.get(TARGET)
    err = info.value
    assert (err.status, err.error) == (502, "unexpected_error")
    assert TARGET.key in err.message and "OverflowError" in err.message and CANARY not in err.message
    assert err.__cause__ is None and err.__context__ is None
    failed = [r for r in caplog.records if r.getMessage().startswith("login failed")]
    assert len(failed) == 1 and failed[0].exception == "OverflowError"  # type: ignore[attr-defined]
    assert CANARY not in caplog.text
    row = cache.status()[0]
    assert (row["state"], row["last_error"], row["token_requests"]) == ("failing", "unexpected_error", 1)
    clock.advance(first_backoff() - 0.001)  # within the backoff window: answered without a fetch
    for _ in range(20):
        with pytest.raises(TokenEndpointError):
            await cache.get(TARGET)
    assert raising.calls == 1
    clock.advance(0.001)  # the window is over: one more try
    raising.fail = False
    assert (await cache.get(TARGET)).access_token == "token-2"
    assert cache.status()[0]["last_error"] is None


async def test_a_failing_renewal_serves_the_current_login_and_backs_off(
        cache: LoginCache, raising: Raising, clock: FakeClock) -> None:
    raising.fail = False
    first = await cache.get(TARGET)
    raising.fail, raising.exc = True, ValueError
    clock.advance(85)  # past refresh_at: renewed in the background, which fails
    assert (await cache.get(TARGET)) is first
    await asyncio.sleep(0)
    row = cache.status()[0]
    assert (row["state"], row["last_error"]) == ("stale", "unexpected_error") and raising.calls == 2
    for _ in range(10):  # backing off: served, and no new fetch
        assert (await cache.get(TARGET)) is first
        await asyncio.sleep(0)
    assert raising.calls == 2


async def test_renew_for_a_rotation_turns_an_unexpected_exception_into_a_token_endpoint_error(
        cache: LoginCache, raising: Raising) -> None:
    raising.exc = KeyError
    with pytest.raises(TokenEndpointError) as info:
        await cache.renew(TARGET)
    assert info.value.error == "unexpected_error" and "KeyError" in info.value.message
    assert cache.status()[0]["last_error"] == "unexpected_error"


# -- end to end: a real token endpoint, the broker and the real sidecar


@pytest.fixture
def idp() -> Iterator[FaultIdp]:
    with fault_idp() as server:
        yield server


def make_broker(idp: FaultIdp, oauth: str) -> Broker:
    config = parse_config(tomllib.loads(f"""
[[servers]]
name = "crm"
endpoint = "{idp.base}/mcp"
oauth = {{ client_id = "c", {oauth} }}
"""))
    env = EnvSource({"S": CANARY, "PEM": BAD_PEM})
    return Broker(config, SecretResolver([env]), SystemClock(), Metrics())


@pytest.mark.parametrize(("oauth", "error", "path"), [
    ('client_secret = "{{secret:S}}", token_url = "{url}/crlf"', "invalid_response", "/token/crlf"),
    ('private_key = "{{secret:PEM}}", auth_method = "private_key_jwt", token_url = "{url}"',
     "invalid_private_key", "/token"),
])
async def test_the_broker_answers_502_and_backs_off(idp: FaultIdp, oauth: str, error: str, path: str) -> None:
    broker = make_broker(idp, oauth.replace("{url}", idp.token_url))
    try:
        target = broker.target("crm")
        for _ in range(10):
            with pytest.raises(TokenEndpointError) as info:
                await broker.headers(target)
            assert (info.value.status, info.value.error) == (502, error)
            assert CANARY not in info.value.message and "\n" not in info.value.message
        row = broker.logins.status()[0]
        assert (row["last_error"], row["token_requests"]) == (error, 1)
        assert idp.hits[path] == (1 if path != "/token" else 0)  # a key that cannot sign sends nothing
    finally:
        await broker.aclose()


async def test_a_jwt_with_a_huge_exp_is_served_on_its_expires_in(idp: FaultIdp) -> None:
    broker = make_broker(idp, f'client_secret = "{{{{secret:S}}}}", token_url = "{idp.token_url}/huge_exp"')
    try:
        before = time.time()
        result = await broker.headers(broker.target("crm"))
        assert result.headers["Authorization"].startswith("Bearer ey")
        assert result.expires_at is not None and before + 3600 <= result.expires_at <= time.time() + 3600
    finally:
        await broker.aclose()


def curl(socket: Path, path: str, *args: str) -> tuple[int, Any]:
    out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "--unix-socket", str(socket), *args,
                          f"http://mcpcreds{path}"], capture_output=True, text=True, timeout=20,
                         check=True).stdout
    body, _, code = out.rpartition("\n")
    return int(code), json.loads(body)


def test_the_sidecar_never_answers_500_for_a_login_that_fails_unexpectedly(idp: FaultIdp, tmp_path: Path) -> None:
    socket, config = tmp_path / "run" / "s.sock", tmp_path / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[[servers]]
name = "crlf"
endpoint = "{idp.base}/mcp"
oauth = {{ client_id = "c", client_secret = "{{{{secret:S}}}}", token_url = "{idp.token_url}/crlf" }}
[[servers]]
name = "bigexp"
endpoint = "{idp.base}/mcp2"
oauth = {{ client_id = "c", client_secret = "{{{{secret:S}}}}", token_url = "{idp.token_url}/huge_exp" }}
[[servers]]
name = "badkey"
endpoint = "{idp.base}/mcp3"
oauth = {{ client_id = "c", private_key = "{{{{secret:PEM}}}}", auth_method = "private_key_jwt", token_url = "{idp.token_url}" }}
""")
    with run_sidecar(config, socket, {"S": CANARY, "PEM": BAD_PEM}) as sidecar:
        for _ in range(5):
            code, body = curl(socket, "/v1/servers/crlf/headers")
            assert (code, body["error"]["code"], body["error"]["error"]) == (
                502, "token_endpoint_error", "invalid_response")
        assert idp.hits["/token/crlf"] == 1  # the backoff window answers the other four
        code, body = curl(socket, "/v1/servers/bigexp/headers")
        assert code == 200 and body["headers"]["Authorization"].startswith("Bearer ey")
        for _ in range(3):
            code, body = curl(socket, "/v1/servers/badkey/headers")
            assert (code, body["error"]["error"]) == (502, "invalid_private_key")
        code, body = curl(socket, "/v1/secrets/PEM/rotated", "-X", "POST")
        assert code == 200 and body["failed"] == {"mcp:badkey": "invalid_private_key"}
        logins = {row["key"]: row for row in curl(socket, "/v1/status")[1]["logins"]}
        assert logins["mcp:crlf"]["last_error"] == "invalid_response"
        assert logins["mcp:badkey"]["last_error"] == "invalid_private_key"
        assert logins["mcp:bigexp"]["last_error"] is None
    assert CANARY not in sidecar.log and "Traceback" not in sidecar.log
