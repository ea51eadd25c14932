"""The pure parts of person logins (issue 16): the device flow's answer and poll schedule on a
fake clock, PKCE and the redirect check, the one-shot loopback listener, the keyring entry, and
what `check` accepts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from mcpcreds.cli.login import LoopbackListener
from mcpcreds.config.load import parse_config
from mcpcreds.credentials.authcode_flow import (
    authorization_request,
    challenge_of,
    code_from_redirect,
    redirect_uri_for,
)
from mcpcreds.credentials.device_flow import DeviceAuthorization, PollSchedule, parse_device_authorization
from mcpcreds.credentials.login_store import StoredLogin, entry_name
from mcpcreds.errors import ConfigError, TokenEndpointError
from tests.conftest import run_cli


def device_answer(**kw: object) -> bytes:
    body: dict[str, object] = {"device_code": "dc-1", "user_code": "ABCD-EFGH",
                               "verification_uri": "https://as.example/device", "expires_in": 60, "interval": 5}
    body.update(kw)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


def auth(interval: float = 5, expires_in: float = 60) -> DeviceAuthorization:
    return DeviceAuthorization("dc", "UC", "https://as.example/device", None, expires_in, interval)


# -- the device flow's poll schedule, on a fake clock


def run_schedule(answers: list[str], interval: float = 5, expires_in: float = 60) -> tuple[list[float], str]:
    """Drive the schedule as login_flow does, on a clock that only moves when it sleeps; each poll
    takes the next answer. Returns the poll times and how it ended."""
    now = 1000.0
    schedule = PollSchedule(now, auth(interval, expires_in))
    polls: list[float] = []
    at = schedule.first()
    for answer in answers:
        now = max(now, at)  # sleep until the poll
        polls.append(now - 1000.0)
        if answer == "ok":
            return polls, "ok"
        try:
            at = schedule.after(answer, now)
        except TokenEndpointError as exc:
            return polls, exc.error
    return polls, "more"


def test_polls_at_the_interval_while_pending() -> None:
    assert run_schedule(["authorization_pending"] * 3 + ["ok"]) == ([5.0, 10.0, 15.0, 20.0], "ok")


def test_slow_down_adds_five_seconds_for_good() -> None:
    polls, end = run_schedule(["authorization_pending", "slow_down", "authorization_pending", "slow_down",
                               "authorization_pending", "ok"])
    assert (polls, end) == ([5.0, 10.0, 20.0, 30.0, 45.0, 60.0], "ok")


def test_no_poll_past_the_expiry() -> None:
    # expires at 60 s: polls at 5..60, the one at 65 would be late: expired_token, without a 13th poll
    polls, end = run_schedule(["authorization_pending"] * 20)
    assert polls == [5.0 * i for i in range(1, 13)] and end == "expired_token"


def test_expired_denied_and_other_errors_end_the_login() -> None:
    assert run_schedule(["authorization_pending", "expired_token"]) == ([5.0, 10.0], "expired_token")
    assert run_schedule(["access_denied"]) == ([5.0], "access_denied")
    assert run_schedule(["invalid_client"]) == ([5.0], "invalid_client")


def test_a_passing_outage_keeps_the_schedule() -> None:
    assert run_schedule(["server_error", "temporarily_unavailable", "ok"]) == ([5.0, 10.0, 15.0], "ok")


def test_a_code_that_expires_before_the_first_poll() -> None:
    with pytest.raises(TokenEndpointError) as info:
        PollSchedule(0.0, auth(interval=10, expires_in=5)).first()
    assert info.value.error == "expired_token"


# -- the device authorization answer


def test_the_answer_is_parsed_and_bounded() -> None:
    a = parse_device_authorization(200, device_answer(verification_uri_complete="https://as.example/device?c=1"))
    assert (a.user_code, a.interval, a.expires_in) == ("ABCD-EFGH", 5.0, 60.0)
    assert a.verification_uri_complete == "https://as.example/device?c=1" and "dc-1" not in repr(a)
    assert parse_device_authorization(200, device_answer(interval=None, expires_in=None)).interval == 5.0
    assert parse_device_authorization(200, device_answer(interval=0.01)).interval == 1.0
    assert parse_device_authorization(200, device_answer(interval=10**400 // 10**399 * 10**6)).interval == 60.0
    assert parse_device_authorization(200, device_answer(expires_in=10**9)).expires_in == 3600.0


@pytest.mark.parametrize("body", [
    device_answer(interval="soon"), device_answer(interval=-1), device_answer(expires_in=True),
    device_answer(user_code=None), device_answer(verification_uri="javascript:alert(1)"),
    device_answer(device_code="a b"), b"[1]", b"not json",
    device_answer(user_code="\x1b[2J\x1b[31mPAY-NOW"),  # no terminal escapes reach the person's screen
    device_answer(verification_uri="https://as.example/\u202edevice"),
])
def test_a_malformed_answer_is_refused_without_quoting_it(body: bytes) -> None:
    with pytest.raises(TokenEndpointError) as info:
        parse_device_authorization(200, body)
    assert info.value.error == "invalid_response" and "alert" not in info.value.message


def test_a_refusal_carries_the_oauth_error() -> None:
    with pytest.raises(TokenEndpointError) as info:
        parse_device_authorization(400, json.dumps({"error": "invalid_scope"}).encode())
    assert info.value.error == "invalid_scope"


# -- authorization code + PKCE


def test_pkce_s256_matches_rfc_7636_appendix_b() -> None:
    assert challenge_of("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk") == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_the_authorization_url() -> None:
    request = authorization_request("https://as.example/auth?tenant=x", "c 1", redirect_uri_for(4242),
                                    "a b", "https://mcp.example/mcp")
    params = httpx.URL(request.url).params
    assert dict(params) == {"tenant": "x", "response_type": "code", "client_id": "c 1",
                            "redirect_uri": "http://127.0.0.1:4242/callback", "state": request.state,
                            "code_challenge": challenge_of(request.verifier), "code_challenge_method": "S256",
                            "scope": "a b", "resource": "https://mcp.example/mcp"}
    assert len(request.verifier) >= 43 and len(request.state) >= 32
    assert request.verifier not in repr(request)
    other = authorization_request("https://as.example/auth", "c", redirect_uri_for(1), None, None)
    assert other.state != request.state and other.verifier != request.verifier
    assert "scope" not in httpx.URL(other.url).params


def test_the_redirect_check() -> None:
    request = authorization_request("https://as.example/auth", "c", redirect_uri_for(1), None, None,
                                    issuer="https://as.example")
    ok = f"code=the-code&state={request.state}"
    assert code_from_redirect(ok, request) == "the-code"  # a server that does not send iss
    assert code_from_redirect(ok + "&iss=https%3A%2F%2Fas.example", request) == "the-code"
    for query, error in [(f"code=x&state={request.state}x", "invalid_state"), ("code=x", "invalid_state"),
                         (f"code=x&state={request.state}&state={request.state}", "invalid_state"),
                         (f"code=x&state={request.state}&iss=https://evil.example", "invalid_issuer"),
                         # RFC 9207: a simple string comparison, no normalising
                         (f"code=x&state={request.state}&iss=https://as.example/", "invalid_issuer"),
                         (f"code=x&state={request.state}&iss=https://AS.example", "invalid_issuer"),
                         (f"code=x&state={request.state}&iss=https://as.example&iss=https://as.example",
                          "invalid_issuer"),
                         # another issuer's error is not believed: the mix-up defence comes first
                         (f"error=access_denied&state={request.state}&iss=https://evil.example",
                          "invalid_issuer"),
                         (f"error=access_denied&state={request.state}", "access_denied"),
                         (f"error=%3Cb%3E&state={request.state}", "invalid_response"),
                         (f"state={request.state}", "invalid_response")]:
        with pytest.raises(TokenEndpointError) as info:
            code_from_redirect(query, request)
        assert info.value.error == error, query
        assert "evil" not in info.value.message and request.state not in info.value.message


def test_a_server_that_says_it_sends_iss_must_send_it() -> None:
    """RFC 9207 §2.4: with `authorization_response_iss_parameter_supported: true` in the metadata
    the login recorded before the redirect, a redirect without `iss` is refused (an attacker's
    redirect from another server need not carry one), error or code alike."""
    request = authorization_request("https://as.example/auth", "c", redirect_uri_for(1), None, None,
                                    issuer="https://as.example", iss_required=True)
    assert code_from_redirect(f"code=c1&state={request.state}&iss=https://as.example", request) == "c1"
    for query in (f"code=c1&state={request.state}", f"error=access_denied&state={request.state}"):
        with pytest.raises(TokenEndpointError) as info:
            code_from_redirect(query, request)
        assert info.value.error == "invalid_issuer", query
    # no issuer known (nothing to compare): never required
    assert not authorization_request("https://as.example/auth", "c", redirect_uri_for(1), None, None,
                                     iss_required=True).iss_required


async def test_the_loopback_listener_takes_one_callback_then_closes() -> None:
    listener = LoopbackListener()
    port = await listener.start()
    listener.expect(lambda query: query.upper())
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"http://127.0.0.1:{port}/favicon.ico")).status_code == 404
        assert (await http.post(f"http://127.0.0.1:{port}/callback")).status_code == 404
        answer = await http.get(f"http://127.0.0.1:{port}/callback?code=a")
        assert answer.status_code == 200 and "close this window" in answer.text
        assert listener.result is not None and await listener.result == "CODE=A"
        await asyncio.sleep(0)
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/callback?code=b")


# -- the keyring entry, and what check accepts


def test_the_entry_is_named_after_the_cache_key_and_never_shows_the_token() -> None:
    assert entry_name("service:crm") == "login.service.crm" and entry_name("mcp:a.b") == "login.mcp.a.b"
    stored = StoredLogin("rt-secret-value-123", "c")
    assert "rt-secret" not in repr(stored)
    assert StoredLogin.from_json(stored.to_json()) == stored
    for bad in ("x", "[]", '{"refresh_token": 1, "client_id": "c"}', "{" * 5000):
        assert StoredLogin.from_json(bad) is None


BASE = '[[servers]]\nname = "s"\nendpoint = "https://s.example.com/mcp"\n'


def errors_of(auth: str) -> list[str]:
    import tomllib

    try:
        parse_config(tomllib.loads(BASE + f"auth = {{ kind = \"oauth2\", {auth} }}\n"))
    except ConfigError as exc:
        return exc.errors
    return []


def test_check_accepts_only_the_grants_that_run() -> None:
    assert errors_of('grant = "device", issuer = "https://as.example", client_id = "c"') == []
    assert errors_of('grant = "authorization_code", issuer = "https://as.example", client_id = "c", '
                     'client_secret = "{{secret:S}}"') == []
    assert errors_of('grant = "refresh_token", issuer = "https://as.example", client_id = "c"')[0].startswith(
        "servers[0].auth.grant: a refresh token comes from a login")
    assert errors_of('grant = "password", client_id = "c", client_secret = "{{secret:S}}"')[0].startswith(
        "servers[0].auth.grant: expected one of client_credentials, device, authorization_code")
    assert errors_of('client_id = "c", auth_method = "none"') == [
        "servers[0].auth.auth_method: 'none' (a public client) only with grant = 'device' or 'authorization_code'"]
    assert errors_of('client_id = "c"') == [
        "servers[0].auth.client_secret: required for auth_method = 'client_secret_basic'"]


def test_signing_alg_is_checked() -> None:
    key = 'client_id = "c", private_key = "{{secret:K}}", auth_method = "private_key_jwt"'
    assert errors_of(key + ', signing_alg = "ES256"') == []
    assert errors_of(key + ', signing_alg = "HS256"')[0].startswith("servers[0].auth.signing_alg: expected one of")
    assert errors_of('client_id = "c", client_secret = "{{secret:S}}", signing_alg = "ES256"') == [
        "servers[0].auth.signing_alg: only with auth_method = 'private_key_jwt'"]


def test_a_stored_login_cannot_be_read_through_a_template() -> None:
    from mcpcreds.credentials.sources import EnvSource, SecretResolver
    from mcpcreds.errors import SecretUnavailable

    resolver = SecretResolver([EnvSource({"login.mcp.dev": "rt-value-123456", "OTHER": "x"})])
    assert resolver.secret("OTHER").reveal() == "x"
    with pytest.raises(SecretUnavailable) as info:
        resolver.secret("login.mcp.dev")
    assert "stored login" in info.value.message and "rt-value" not in info.value.message


def test_check_names_the_servers_that_need_a_login(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(BASE + 'auth = { kind = "oauth2", grant = "device", issuer = "https://as.example", '
                             'client_id = "c" }\n')
    result = run_cli("check", "--config", str(config))
    assert result.code == 0 and "hint: s use a person's login: run `mcpcreds login NAME`" in result.stderr
    result = run_cli("login", "nope", "--config", str(config))
    assert result.code == 2 and "nope" not in result.stderr


# -- the device flow's driver (login_flow.device_login) on a fake clock and a scripted server


async def test_the_device_login_polls_on_the_schedule_the_server_sets() -> None:
    import io
    import tomllib

    from mcpcreds.cli.login import device_login
    from mcpcreds.credentials.discovery import ServerEndpoints

    config = parse_config(tomllib.loads(BASE + 'auth = { kind = "oauth2", grant = "device", client_id = "c", '
                                               'issuer = "https://as.example", scopes = ["a"] }\n'))
    target = config.servers["s"]
    ends = ServerEndpoints("https://as.example", "https://as.example/token", "https://as.example/device",
                           None, None)
    now = [100.0]
    answers = [(400, {"error": "authorization_pending"}), (400, {"error": "slow_down"}), (503, {}),
               (400, {"error": "authorization_pending"}),
               (200, {"access_token": "at-123456", "refresh_token": "rt-123456789", "expires_in": 60})]
    polls: list[tuple[float, dict[str, list[str]]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode())
        if request.url.path == "/device":
            assert form == {"scope": ["a"], "resource": ["https://s.example.com/mcp"], "client_id": ["c"]}
            return httpx.Response(200, json={"device_code": "dc-1", "user_code": "WXYZ-1234", "interval": 5,
                                             "expires_in": 120, "verification_uri": "https://as.example/d"})
        polls.append((now[0] - 100.0, form))
        status, body = answers[len(polls) - 1]
        return httpx.Response(status, json=body)

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    out = io.StringIO()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        token, extras = await device_login(http, target, ends, None, out, sleep=sleep, clock=lambda: now[0])
    # 5 s, pending: 10 s, slow_down (10 s from now on): 20 s, a 503 is a passing outage: 30 s, pending: 40 s
    assert [t for t, _ in polls] == [5.0, 10.0, 20.0, 30.0, 40.0]
    assert all(form == {"grant_type": ["urn:ietf:params:oauth:grant-type:device_code"], "device_code": ["dc-1"],
                        "resource": ["https://s.example.com/mcp"], "client_id": ["c"]} for _, form in polls)
    assert token.access_token == "at-123456" and extras == {"refresh_token": "rt-123456789"}
    text = out.getvalue()
    assert "open https://as.example/d and enter the code WXYZ-1234" in text and "dc-1" not in text
    assert "rt-123456789" not in text and "at-123456" not in text


# -- the scope a person's login asks for (issue 20: the MCP spec's order), on recorded answers

MCP = "https://mcp.example.com/tools/mcp"


def test_the_scope_comes_from_config_then_challenge_then_resource_metadata() -> None:
    from mcpcreds.core.scopes import challenge_scope
    from mcpcreds.credentials.discovery import choose_scope

    doc = {"resource": MCP, "scopes_supported": ["files:read", "files:write", "files:read"]}
    assert choose_scope("mine", "theirs", doc) == "mine"
    assert choose_scope(None, "theirs", doc) == "theirs"
    assert choose_scope(None, None, doc) == "files:read files:write"
    assert choose_scope(None, None, {"scopes_supported": []}) is None
    assert choose_scope(None, None, {"scopes_supported": ['a"b']}) is None
    assert choose_scope(None, None, {"scopes_supported": "files:read"}) is None
    assert choose_scope(None, None, None) is None
    header = ('Bearer error="insufficient_scope", scope="files:read  files:write", '
              'resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/tools/mcp"')
    assert challenge_scope(header) == "files:read files:write"
    assert challenge_scope('Bearer realm="x"') is None
    assert challenge_scope('Bearer scope="a\\\\b"') is None and challenge_scope(None) is None


def scripted(routes: dict[str, tuple[int, dict[str, str], object]]) -> httpx.AsyncClient:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        key = f"{request.method} {request.url}"
        seen.append(key)
        status, headers, body = routes.get(key, (404, {}, {}))
        return httpx.Response(status, headers=headers, json=body)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client.seen = seen  # type: ignore[attr-defined]
    return client


@pytest.mark.parametrize(("routes", "scope"), [
    # the 401's challenge names the scope
    ({f"POST {MCP}": (401, {"www-authenticate": 'Bearer scope="files:read"'}, {})}, "files:read"),
    # none there: the resource's metadata, path-based first
    ({f"POST {MCP}": (401, {"www-authenticate": "Bearer"}, {}),
      "GET https://mcp.example.com/.well-known/oauth-protected-resource/tools/mcp":
          (200, {}, {"resource": MCP, "scopes_supported": ["a", "b"]}),
      "GET https://mcp.example.com/.well-known/oauth-protected-resource":
          (200, {}, {"resource": "https://mcp.example.com", "scopes_supported": ["root"]})}, "a b"),
    # then the root document of the server
    ({"GET https://mcp.example.com/.well-known/oauth-protected-resource":
          (200, {}, {"resource": "https://mcp.example.com", "scopes_supported": ["root"]})}, "root"),
    # the document the challenge points at
    ({f"POST {MCP}": (401, {"www-authenticate": 'Bearer resource_metadata="https://meta.example.com/prm"'}, {}),
      "GET https://meta.example.com/prm": (200, {}, {"resource": MCP, "scopes_supported": ["x"]})}, "x"),
    # metadata for another resource says nothing about this one
    ({"GET https://mcp.example.com/.well-known/oauth-protected-resource":
          (200, {}, {"resource": "https://mcp.example.com/to", "scopes_supported": ["root"]})}, None),
    # nothing anywhere: no scope parameter
    ({}, None),
])
async def test_the_login_scope_is_discovered(routes: dict[str, tuple[int, dict[str, str], object]],
                                            scope: str | None) -> None:
    from mcpcreds.credentials.discovery import Discovery

    async with scripted(routes) as http:
        assert await Discovery().login_scope(MCP, http) == scope


@pytest.mark.parametrize("as_scopes, asked_scope", [
    (None, "files:read"),
    (["files:read", "files:write"], "files:read"),
    # SEP-2207: the server lists offline_access, so the login asks for a refresh token with it
    (["openid", "offline_access", "files:read"], "files:read offline_access"),
])
async def test_a_login_without_a_configured_scope_asks_for_the_one_the_resource_names(
        as_scopes: list[str] | None, asked_scope: str) -> None:
    import io
    import tomllib

    from mcpcreds.cli.login import run_login

    config = parse_config(tomllib.loads(f'[[servers]]\nname = "s"\nendpoint = "{MCP}"\n'
                                        'auth = { kind = "oauth2", grant = "device", client_id = "c", '
                                        'issuer = "https://as.example.com" }\n'))
    meta: dict[str, Any] = {"issuer": "https://as.example.com", "token_endpoint": "https://as.example.com/token",
                            "device_authorization_endpoint": "https://as.example.com/device"}
    if as_scopes is not None:
        meta["scopes_supported"] = as_scopes
    asked: list[dict[str, list[str]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if url == MCP:
            return httpx.Response(401, headers={"www-authenticate": 'Bearer scope="files:read"'})
        if url == "https://as.example.com/.well-known/oauth-authorization-server":
            return httpx.Response(200, json=meta)
        if url == meta["device_authorization_endpoint"]:
            asked.append(parse_qs(request.content.decode()))
            return httpx.Response(200, json={"device_code": "d", "user_code": "U", "interval": 1,
                                             "verification_uri": "https://as.example.com/d"})
        if url == meta["token_endpoint"]:
            return httpx.Response(200, json={"access_token": "at-1234567", "refresh_token": "rt-1234567"})
        return httpx.Response(404)

    class Store:
        def __init__(self) -> None:
            self.put_: list[tuple[str, StoredLogin]] = []

        def get(self, key: str) -> None:
            return None

        def put(self, key: str, login: StoredLogin, *, person: bool = False) -> None:
            self.put_.append((key, login))

    store = Store()
    out = io.StringIO()
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    await run_login(config, config.servers["s"], out, open_browser=False, wait=5, store=store,  # type: ignore[arg-type]
                    client=http)
    assert asked == [{"scope": [asked_scope], "resource": [MCP], "client_id": ["c"]}]
    assert f"scope (asked for by {MCP}): files:read" in out.getvalue()
    assert ("lists offline_access" in out.getvalue()) == ("offline_access" in asked_scope)
    assert store.put_ == [("mcp:s", StoredLogin("rt-1234567", "c", scope=asked_scope,
                                                 issuer="https://as.example.com"))]


def test_a_login_with_no_sidecar_running_says_it_will_be_used_at_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import tomllib

    from mcpcreds.cli.common import tell_sidecar

    config = tmp_path / "c.toml"
    config.write_text(BASE + 'auth = { kind = "oauth2", grant = "device", issuer = "https://as.example", '
                             'client_id = "c" }\n')
    target = parse_config(tomllib.loads(config.read_text())).servers["s"]
    (tmp_path / "run").mkdir(mode=0o700)
    tell_sidecar(argparse.Namespace(config=str(config), socket=str(tmp_path / "run" / "none.sock")), target,
                 logout=False)
    assert capsys.readouterr().err == "no sidecar is running: it will use the login when it starts\n"


async def test_the_listener_drops_an_oversized_head_and_keeps_waiting() -> None:
    listener = LoopbackListener()
    port = await listener.start()
    listener.expect(lambda query: query)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /callback?" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n")
    await writer.drain()
    assert await reader.read() == b""  # closed, unanswered
    writer.close()
    assert listener.result is not None and not listener.result.done()
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"http://127.0.0.1:{port}/callback?code=a")).status_code == 200
    assert await listener.result == "code=a"


async def test_an_endless_answer_of_the_server_is_cut_off() -> None:
    from mcpcreds.cli.login import _post_form

    async def endless(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            while True:
                yield b"x" * 65536

        return httpx.Response(200, content=body())

    async with httpx.AsyncClient(transport=httpx.MockTransport(endless)) as http:
        with pytest.raises(TokenEndpointError) as info:
            await _post_form(http, "https://as.example/device", {}, "")
    assert info.value.error == "response_too_large"


# -- a server without protected-resource metadata (the 2025-03-26 MCP spec's fallback)

ORIGIN_META = {"issuer": "https://mcp.example.com", "token_endpoint": "https://mcp.example.com/oauth/token",
               "authorization_endpoint": "https://mcp.example.com/oauth/authorize",
               "device_authorization_endpoint": "https://mcp.example.com/oauth/device"}


def person(grant: str = "device", **kw: object) -> object:
    from mcpcreds.config.model import LoginSpec

    base: dict[str, object] = dict(grant=grant, client_id="c", client_secret=None, private_key=None,
                                   auth_method="none", token_url=None, issuer=None, scope=None,
                                   resource=MCP, audience=None)
    base.update(kw)
    return LoginSpec(**base)  # type: ignore[arg-type]


async def test_without_resource_metadata_a_person_login_uses_the_servers_origin() -> None:
    from mcpcreds.credentials.discovery import Discovery, ServerEndpoints

    routes: dict[str, tuple[int, dict[str, str], object]] = {
        "GET https://mcp.example.com/.well-known/oauth-authorization-server": (200, {}, ORIGIN_META)}
    async with scripted(routes) as http:
        discovery = Discovery()
        found = await discovery.endpoints(person(), MCP, http)  # type: ignore[arg-type]
        assert found == ServerEndpoints("https://mcp.example.com", ORIGIN_META["token_endpoint"],
                                        ORIGIN_META["device_authorization_endpoint"],
                                        ORIGIN_META["authorization_endpoint"], None)
        assert discovery.issuers[MCP] == "https://mcp.example.com"
        # the sidecar's refresh finds the same token endpoint
        assert await Discovery().token_url(person(), MCP, http) == ORIGIN_META["token_endpoint"]  # type: ignore[arg-type]
    async with scripted({}) as http:  # no metadata at all: the default paths
        found = await Discovery().endpoints(person("authorization_code"), MCP, http)  # type: ignore[arg-type]
        assert (found.authorization, found.token) == ("https://mcp.example.com/authorize",
                                                      "https://mcp.example.com/token")


async def test_the_fallback_is_for_person_logins_and_missing_metadata_only() -> None:
    from mcpcreds.credentials.discovery import Discovery

    routes: dict[str, tuple[int, dict[str, str], object]] = {
        "GET https://mcp.example.com/.well-known/oauth-authorization-server": (200, {}, ORIGIN_META)}
    async with scripted(routes) as http:  # a client secret goes only where metadata points
        with pytest.raises(TokenEndpointError, match="publishes no protected-resource metadata"):
            await Discovery().token_url(person("client_credentials", auth_method="client_secret_basic"),  # type: ignore[arg-type]
                                        MCP, http)
    routes["GET https://mcp.example.com/.well-known/oauth-protected-resource/tools/mcp"] = (
        200, {}, {"resource": "https://other.example.com/mcp", "authorization_servers": ["https://as.example"]})
    async with scripted(routes) as http:  # metadata for another resource is refused, not worked around
        with pytest.raises(TokenEndpointError, match="is for another resource"):
            await Discovery().endpoints(person(), MCP, http)  # type: ignore[arg-type]
