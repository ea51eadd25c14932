"""Person logins whose server issues no refresh token (the access token is the login, until it
expires or a resource refuses it), and dynamic client registration (RFC 7591) when no client_id
is configured: the pure decisions on a fake clock, the registration's request and answer, and
`run_login` against a scripted authorization server with a real loopback redirect."""

from __future__ import annotations

import asyncio
import io
import json
import tomllib
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from mcpcreds.broker.refresh import _access_only, access_only_token, client_of
from mcpcreds.config.load import parse_config
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.secret import REDACTOR, fingerprint
from mcpcreds.credentials.authcode_flow import (
    loopback_port,
    parse_registration,
    registration_body,
    registration_method,
)
from mcpcreds.credentials.login_store import Registration, StoredLogin
from mcpcreds.credentials.logins import LoginCache
from mcpcreds.credentials.tokens import Token
from mcpcreds.errors import ConfigError, LoginRequired, TokenEndpointError

MCP = "https://mcp.example.com/mcp"
AS = "https://as.example.com"
SECRET = "registered-secret-3f9a1c"  # a client secret the registration returns
REG = Registration(AS, "dyn-1", "client_secret_basic", SECRET, "http://127.0.0.1:41234/callback")


# -- an access-only login: served until it expires, on a fake clock


def test_the_stored_access_token_is_served_until_a_second_before_it_expires() -> None:
    stored = StoredLogin(None, "c", "at-abcdef", 1000.0)
    token = access_only_token(stored, 900.0)
    assert token == Token("at-abcdef", "Bearer", 900.0, 1000.0, None, fingerprint("at-abcdef"))
    assert access_only_token(stored, 999.0) == Token("at-abcdef", "Bearer", 999.0, 1000.0, None,
                                                     fingerprint("at-abcdef"))
    assert access_only_token(stored, 999.25) is None  # less than MIN_LIFETIME (1 s) left
    assert access_only_token(stored, 1000.0) is None
    assert access_only_token(stored, 5000.0) is None
    # the one a resource refused is over, whatever time is left
    assert access_only_token(stored, 900.0, refused=fingerprint("at-abcdef")) is None
    assert access_only_token(stored, 900.0, refused=fingerprint("another")) == token
    # a login with a refresh token is renewed by it, never served from the store
    assert access_only_token(StoredLogin("rt-1", "c", "at-abcdef", 1000.0), 900.0) is None


class _Entry:
    """The keyring entry of the login."""

    def __init__(self) -> None:
        self.puts: list[StoredLogin] = []
        self.current: StoredLogin | None = None

    def get(self, key: str) -> StoredLogin | None:
        return self.current

    def put(self, key: str, login: StoredLogin, *, person: bool = False) -> None:
        self.puts.append(login)
        self.current = login


class _Broker:
    """What refresh._access_only reads of the broker: its login cache and its clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.logins = LoginCache(self._fetch, clock, refresh_ahead=30)

    async def _fetch(self, target: Any) -> Token:
        raise AssertionError("not used")


def _target() -> Any:
    config = parse_config(tomllib.loads(f'[[servers]]\nname = "s"\nendpoint = "{MCP}"\n'
                                        'auth = { kind = "oauth2", grant = "authorization_code", '
                                        f'issuer = "{AS}" }}\n'))
    return config.servers["s"]


async def test_expiry_ends_an_access_only_login_with_login_required() -> None:
    entry = _Entry()
    clock = FakeClock(start=10_000.0)
    broker = _Broker(clock)
    target = _target()
    stored = StoredLogin(None, "dyn-1", "at-served-1", 10_600.0, REG)
    token = await _access_only(broker, target, stored, entry)  # type: ignore[arg-type]
    assert (token.access_token, token.obtained_at, token.expires_at) == ("at-served-1", 10_000.0, 10_600.0)
    broker.logins.install(target, token)
    # while the cache holds it, a renewal ahead of expiry gets the same token back
    clock.advance(500)
    assert (await _access_only(broker, target, stored, entry)).fingerprint == token.fingerprint  # type: ignore[arg-type]
    # expired: login_required naming the command
    clock.advance(99.5)
    with pytest.raises(LoginRequired) as info:
        await _access_only(broker, target, stored, entry)  # type: ignore[arg-type]
    assert info.value.details["command"] == "mcpcreds login s" and "expired" in info.value.message
    assert info.value.status == 401
    assert entry.puts == []  # nothing to mark: it expired by itself


async def test_an_invalidated_access_only_login_is_not_served_again() -> None:
    entry = _Entry()
    clock = FakeClock(start=10_000.0)
    broker = _Broker(clock)
    target = _target()
    stored = entry.current = StoredLogin(None, "dyn-1", "at-served-2", 13_600.0, REG)
    token = await _access_only(broker, target, stored, entry)  # type: ignore[arg-type]
    broker.logins.install(target, token)
    assert broker.logins.invalidate(target.key, token.fingerprint)  # a resource answered 401
    with pytest.raises(LoginRequired) as info:
        await _access_only(broker, target, stored, entry)  # type: ignore[arg-type]
    assert "refused" in info.value.message and "at-served-2" not in info.value.message
    # and marked expired in the keyring: a restarted sidecar does not serve it either
    assert entry.puts == [StoredLogin(None, "dyn-1", "at-served-2", 10_000.0, REG)]
    assert access_only_token(entry.puts[0], 10_000.0) is None
    # a new login (another access token) is served
    fresh = StoredLogin(None, "dyn-1", "at-served-3", 13_600.0, REG)
    token = await _access_only(broker, target, fresh, entry)  # type: ignore[arg-type]
    assert token.access_token == "at-served-3"
    # refused while a new login landed in the keyring: the new one is left alone
    broker.logins.install(target, token)
    assert broker.logins.invalidate(target.key, token.fingerprint)
    entry.current = newer = StoredLogin("rt-new", "dyn-1", registration=REG)
    with pytest.raises(LoginRequired):
        await _access_only(broker, target, fresh, entry)  # type: ignore[arg-type]
    assert entry.current is newer and len(entry.puts) == 1


def test_the_entry_keeps_an_access_only_login_and_a_registration() -> None:
    stored = StoredLogin(None, "dyn-1", "at-keep-1", 1234.5, REG)
    text = stored.to_json()
    assert json.loads(text) == {"v": 1, "client_id": "dyn-1", "access_token": "at-keep-1", "expires_at": 1234.5,
                                "registration": {"issuer": AS, "client_id": "dyn-1",
                                                 "auth_method": "client_secret_basic", "client_secret": SECRET,
                                                 "redirect_uri": REG.redirect_uri}}
    assert StoredLogin.from_json(text) == stored
    assert "at-keep-1" not in repr(stored) and SECRET not in repr(stored) and SECRET not in repr(REG)
    assert SECRET in REDACTOR and "at-keep-1" in REDACTOR  # masked in any log line from now on
    bad = [
        {"v": 1, "client_id": "c"},  # neither token
        {"v": 1, "client_id": "c", "access_token": "at", "expires_at": "soon"},
        {"v": 1, "client_id": "c", "access_token": "at", "expires_at": float("inf")},
        {"v": 1, "client_id": "c", "access_token": "a t", "expires_at": 5},
        {"v": 1, "client_id": "c", "access_token": "at", "expires_at": True},
        {"v": 1, "client_id": "c", "refresh_token": "rt", "registration": {**REG.to_dict(), "auth_method": "x"}},
        {"v": 1, "client_id": "c", "refresh_token": "rt", "registration": {**REG.to_dict(), "client_secret": None}},
        {"v": 1, "client_id": "c", "refresh_token": "rt",
         "registration": {**REG.to_dict(), "auth_method": "none"}},  # a secret with none
    ]
    for entry in bad:
        assert StoredLogin.from_json(json.dumps(entry)) is None, entry


def test_a_stored_login_refreshes_as_the_registered_client_only_without_a_configured_one() -> None:
    login = _target().login
    stored = StoredLogin("rt-1", "dyn-1", registration=REG)
    client = client_of(login, stored)
    assert client is not None and (client.client_id, client.auth_method) == ("dyn-1", "client_secret_basic")
    # a configured client_id wins: a login registered before belongs to another client
    import dataclasses

    configured = dataclasses.replace(login, client_id="cfg")
    assert client_of(configured, stored) is None
    assert client_of(configured, StoredLogin("rt-1", "cfg")) == configured
    # no configured client and no registration: nothing to refresh as
    assert client_of(login, StoredLogin("rt-1", "dyn-1")) is None


# -- the registration's request and answer


def test_the_registered_method_prefers_a_public_client_then_basic_then_post() -> None:
    assert registration_method(("client_secret_post", "none")) == "none"
    assert registration_method(("client_secret_basic", "client_secret_post", "none")) == "none"
    assert registration_method(("client_secret_post", "client_secret_basic")) == "client_secret_basic"
    assert registration_method(("private_key_jwt", "client_secret_post")) == "client_secret_post"
    with pytest.raises(TokenEndpointError) as info:
        registration_method(("private_key_jwt",))
    assert info.value.error == "unsupported_auth_method"
    body = json.loads(registration_body("http://127.0.0.1:5/callback", "none"))
    assert body == {"client_name": "mcpcreds", "redirect_uris": ["http://127.0.0.1:5/callback"],
                    "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
                    "token_endpoint_auth_method": "none", "application_type": "native"}


def _answer(**kw: object) -> bytes:
    return json.dumps({k: v for k, v in kw.items() if v is not None}).encode()


def test_the_registration_answer_is_validated_and_bounded() -> None:
    uri = "http://127.0.0.1:5/callback"
    # the method the answer names wins; a secret comes with it
    reg = parse_registration(201, _answer(client_id="d1", client_secret=SECRET,
                                          token_endpoint_auth_method="client_secret_post"), "none", AS, uri)
    assert reg == Registration(AS, "d1", "client_secret_post", SECRET, uri)
    fresh = "fresh-secret-9b7e2d41"
    assert fresh not in REDACTOR
    parse_registration(201, _answer(client_id="d0", client_secret=fresh), "client_secret_basic", AS, uri)
    assert fresh in REDACTOR  # masked in any log line from the moment it is read
    # none named: the one asked for; a secret given to a public client is dropped
    assert parse_registration(201, _answer(client_id="d2", client_secret=SECRET), "none", AS, uri) == \
        Registration(AS, "d2", "none", None, uri)
    assert parse_registration(200, _answer(client_id="d3", client_secret=SECRET), "client_secret_basic", AS,
                              uri) == Registration(AS, "d3", "client_secret_basic", SECRET, uri)
    refused = [
        (201, _answer(client_secret=SECRET), "no usable client_id"),
        (201, _answer(client_id="d\r\n"), "no usable client_id"),
        (201, _answer(client_id="d" * 513), "no usable client_id"),
        (201, _answer(client_id="d", token_endpoint_auth_method="client_secret_basic"), "no usable client_secret"),
        (201, _answer(client_id="d", client_secret="s" * 4097, token_endpoint_auth_method="client_secret_post"),
         "no usable client_secret"),
        (201, _answer(client_id="d", token_endpoint_auth_method="private_key_jwt"), "does not use"),
        (201, b"[]", "without a JSON object"),
        (201, b"{" * 70_000, "without a JSON object"),
        (302, b"", "without a JSON object"),
        (400, _answer(error="invalid_redirect_uri", error_description=SECRET), "invalid_redirect_uri"),
        (500, b"<html>", "HTTP 500, invalid_response"),
    ]
    for status, body, why in refused:
        with pytest.raises(TokenEndpointError) as info:
            parse_registration(status, body, "none", AS, uri)
        assert why in info.value.message and SECRET not in info.value.message, (status, body[:40])


def test_the_loopback_port_of_a_registered_redirect_uri() -> None:
    assert loopback_port("http://127.0.0.1:41234/callback") == 41234
    for uri in ("http://127.0.0.1/callback", "https://127.0.0.1:5/callback", "http://localhost:5/callback",
                "http://127.0.0.1:5/other", "http://127.0.0.1:99999/callback"):
        assert loopback_port(uri) is None, uri


def test_a_login_without_client_id_is_accepted_only_for_the_authorization_code_grant() -> None:
    def errors(auth: str) -> list[str]:
        try:
            parse_config(tomllib.loads(f'[[servers]]\nname = "s"\nendpoint = "{MCP}"\n'
                                       f'auth = {{ kind = "oauth2", {auth} }}\n'))
        except ConfigError as exc:
            return exc.errors
        return []

    assert errors('grant = "authorization_code"') == []
    assert errors('grant = "device", issuer = "https://as.example.com"') != []
    assert errors('grant = "authorization_code", client_secret = "{{secret:S}}"') != []
    assert errors('client_secret = "{{secret:S}}"') != []  # client credentials: always a client_id


# -- run_login against a scripted authorization server, the redirect through the real listener


class _Browser(io.StringIO):
    """stderr of the login: follows the authorization URL to the loopback callback, as the
    suite's authorization server does (it approves at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[asyncio.Task[None]] = []
        self.asked: list[dict[str, list[str]]] = []  # the authorization requests' parameters

    def write(self, text: str) -> int:
        for word in text.split():
            if "code_challenge=" in word:
                self.asked.append(parse_qs(httpx.URL(word).query.decode()))
                self.tasks.append(asyncio.ensure_future(self._follow(word)))
        return super().write(text)

    @staticmethod
    async def _follow(url: str) -> None:
        query = parse_qs(httpx.URL(url).query.decode())
        async with httpx.AsyncClient() as http:
            await http.get(query["redirect_uri"][0], params={"code": "the-code", "state": query["state"][0]})


class _Store:
    def __init__(self) -> None:
        self.entry: StoredLogin | None = None

    def get(self, key: str) -> StoredLogin | None:
        return self.entry

    def put(self, key: str, login: StoredLogin, *, person: bool = False) -> None:
        self.entry = login


def _server(methods: list[str], registration: dict[str, Any], token: dict[str, Any],
            seen: list[tuple[str, Any]], registers: bool = True, cimd: bool = False) -> httpx.AsyncClient:
    """The authorization server (and the MCP server's metadata); run_login opens and closes it."""
    meta: dict[str, Any] = {"issuer": AS, "authorization_endpoint": f"{AS}/authorize", "token_endpoint": f"{AS}/token",
                            "registration_endpoint": f"{AS}/register", "token_endpoint_auth_methods_supported": methods}

    def handler(request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if url == "https://mcp.example.com/.well-known/oauth-protected-resource/mcp":
            return httpx.Response(200, json={"resource": MCP, "authorization_servers": [AS]})
        if url == f"{AS}/.well-known/oauth-authorization-server":
            return httpx.Response(200, json=meta)
        if url == f"{AS}/register":
            seen.append(("register", json.loads(request.content)))
            return httpx.Response(201, json=registration)
        if url == f"{AS}/token":
            seen.append(("token", (request.headers.get("authorization"), parse_qs(request.content.decode()))))
            return httpx.Response(200, json=token)
        return httpx.Response(404)

    if not registers:
        del meta["registration_endpoint"]
    if cimd:
        meta["client_id_metadata_document_supported"] = True
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def _config(client_id: str | None = None) -> Any:
    client = f', client_id = "{client_id}"' if client_id else ""
    return parse_config(tomllib.loads(f'[[servers]]\nname = "s"\nendpoint = "{MCP}"\n'
                                      f'auth = {{ kind = "oauth2", grant = "authorization_code", scope = "m"{client} }}\n'))


async def test_a_login_registers_a_client_and_keeps_the_access_token_when_no_refresh_token_comes() -> None:
    from mcpcreds.cli.login import run_login

    config = _config()
    seen: list[tuple[str, Any]] = []
    store = _Store()
    out = _Browser()
    registration = {"client_id": "dyn-7", "client_secret": SECRET, "token_endpoint_auth_method": "client_secret_post"}
    http = _server(["client_secret_post"], registration, {"access_token": "at-only-1", "expires_in": 600}, seen)
    stored = await run_login(config, config.servers["s"], out, open_browser=False, wait=20,
                             store=store, client=http)  # type: ignore[arg-type]
    await asyncio.gather(*out.tasks)
    assert [kind for kind, _ in seen] == ["register", "token"]
    asked = seen[0][1]
    assert asked["token_endpoint_auth_method"] == "client_secret_post"
    redirect_uri = asked["redirect_uris"][0]
    assert loopback_port(redirect_uri) is not None  # the listener's actual port
    authorization, form = seen[1][1]
    assert authorization is None  # client_secret_post: in the form, as registered
    assert form["client_id"] == ["dyn-7"] and form["client_secret"] == [SECRET]
    assert form["redirect_uri"] == [redirect_uri] and form["code"] == ["the-code"]
    assert stored.refresh_token is None and stored.access_token == "at-only-1"
    assert stored.registration == Registration(AS, "dyn-7", "client_secret_post", SECRET, redirect_uri)
    assert store.entry == stored and stored.client_id == "dyn-7"
    assert "at-only-1" not in out.getvalue() and SECRET not in out.getvalue()
    assert "registered as client dyn-7" in out.getvalue()

    # the next login reuses the registration (the same loopback port, so its redirect URI holds)
    seen.clear()
    out = _Browser()
    http = _server(["client_secret_post"], registration, {"access_token": "at-only-2", "refresh_token": "rt-2",
                                                           "expires_in": 600}, seen)
    again = await run_login(config, config.servers["s"], out, open_browser=False, wait=20,
                            store=store, client=http)  # type: ignore[arg-type]
    await asyncio.gather(*out.tasks)
    assert [kind for kind, _ in seen] == ["token"]
    assert seen[0][1][1]["redirect_uri"] == [redirect_uri] and seen[0][1][1]["client_id"] == ["dyn-7"]
    assert again == StoredLogin("rt-2", "dyn-7", registration=stored.registration, scope="m", issuer=AS)


async def test_a_public_registration_sends_no_secret_and_basic_sends_it_in_the_header() -> None:
    from mcpcreds.cli.login import run_login

    config = _config()
    for methods, answer, header in (
            (["none"], {"client_id": "pub-1", "client_secret": SECRET}, None),  # the suite's default answer
            (["client_secret_basic"], {"client_id": "b-1", "client_secret": SECRET,
                                       "token_endpoint_auth_method": "client_secret_basic"},
             "Basic Yi0xOnJlZ2lzdGVyZWQtc2VjcmV0LTNmOWExYw==")):
        seen: list[tuple[str, Any]] = []
        out = _Browser()
        http = _server(methods, answer, {"access_token": "at-x-1", "expires_in": 60}, seen)
        stored = await run_login(config, config.servers["s"], out, open_browser=False, wait=20,
                                 store=_Store(), client=http)  # type: ignore[arg-type]
        await asyncio.gather(*out.tasks)
        authorization, form = seen[1][1]
        assert authorization == header
        assert "client_secret" not in form
        assert form.get("client_id") == ([answer["client_id"]] if header is None else None)
        assert stored.registration is not None
        assert stored.registration.client_secret == (None if header is None else SECRET)


async def test_without_a_registration_endpoint_the_login_says_to_configure_a_client_id() -> None:
    from mcpcreds.cli.login import run_login

    config = _config()
    seen: list[tuple[str, Any]] = []
    http = _server(["none"], {}, {}, seen, registers=False)
    with pytest.raises(TokenEndpointError) as info:
        await run_login(config, config.servers["s"], io.StringIO(), open_browser=False, wait=5,
                        store=_Store(), client=http)  # type: ignore[arg-type]
    assert info.value.error == "registration_unavailable" and "client_id" in info.value.message
    assert seen == []


# -- Client ID Metadata Documents (issue 20): the configured URL is the client where the server
# -- takes it; elsewhere the login registers (the MCP spec's order), and refreshes as registered

CIMD_URL = "https://client.example.com/mcpcreds/client.json"


def test_a_metadata_document_url_is_https_with_a_path_and_nothing_else() -> None:
    from mcpcreds.credentials.authcode_flow import (
        is_metadata_document_url,
        may_register,
        uses_metadata_document,
    )

    assert is_metadata_document_url(CIMD_URL)
    for bad in ("http://client.example.com/c.json", "https://client.example.com", "https://client.example.com/",
                "https://client.example.com/c.json#x", "https://u:p@client.example.com/c.json",
                "https://client.example.com/a/../c.json", "https://client.example.com/./c.json", "my-client", ""):
        assert not is_metadata_document_url(bad), bad
    assert may_register("") and may_register(CIMD_URL) and not may_register("my-client")
    # pre-registered: always as is; a URL: as is where supported, or when there is no registration
    assert uses_metadata_document("my-client", cimd_supported=False, can_register=True)
    assert uses_metadata_document(CIMD_URL, cimd_supported=True, can_register=True)
    assert not uses_metadata_document(CIMD_URL, cimd_supported=False, can_register=True)
    assert uses_metadata_document(CIMD_URL, cimd_supported=False, can_register=False)
    assert not uses_metadata_document("", cimd_supported=True, can_register=True)


async def test_where_the_server_takes_metadata_documents_the_url_is_the_client_and_nothing_registers() -> None:
    from mcpcreds.cli.login import run_login

    config = _config(CIMD_URL)
    seen: list[tuple[str, Any]] = []
    out = _Browser()
    http = _server(["none"], {}, {"access_token": "at-cimd-1", "expires_in": 600}, seen, cimd=True)
    stored = await run_login(config, config.servers["s"], out, open_browser=False, wait=20,
                             store=_Store(), client=http)  # type: ignore[arg-type]
    await asyncio.gather(*out.tasks)
    assert [kind for kind, _ in seen] == ["token"]
    assert out.asked[0]["client_id"] == [CIMD_URL]
    authorization, form = seen[0][1]
    assert authorization is None and form["client_id"] == [CIMD_URL] and "client_secret" not in form
    assert stored.client_id == CIMD_URL and stored.registration is None
    assert f"the metadata document {CIMD_URL}" in out.getvalue()


async def test_where_the_server_does_not_take_them_the_login_registers_and_refreshes_as_registered() -> None:
    from mcpcreds.cli.login import run_login

    config = _config(CIMD_URL)
    seen: list[tuple[str, Any]] = []
    out = _Browser()
    http = _server(["none"], {"client_id": "dyn-9"}, {"access_token": "at-reg-1", "expires_in": 600}, seen)
    stored = await run_login(config, config.servers["s"], out, open_browser=False, wait=20,
                             store=_Store(), client=http)  # type: ignore[arg-type]
    await asyncio.gather(*out.tasks)
    assert [kind for kind, _ in seen] == ["register", "token"]
    assert out.asked[0]["client_id"] == ["dyn-9"]
    assert stored.client_id == "dyn-9" and stored.registration is not None
    login = config.servers["s"].login
    client = client_of(login, stored)
    assert client is not None and client.client_id == "dyn-9"
    # a login that used the URL itself refreshes as the URL
    assert client_of(login, StoredLogin("rt-1", CIMD_URL)) == login


# -- step-up (issue 20): the next login asks for the wider scope the sidecar recorded


async def test_a_recorded_step_up_widens_the_next_login_and_counts_it() -> None:
    from mcpcreds.cli.login import run_login

    config = _config()
    store = _Store()
    store.entry = StoredLogin(None, "dyn-1", "at-old-1", 5000.0, REG, scope="m", step_up="m files:write")
    seen: list[tuple[str, Any]] = []
    out = _Browser()
    # (the registration is reused; were its loopback port taken, the login registers again)
    again_reg = {"client_id": "dyn-1", "client_secret": SECRET, "token_endpoint_auth_method": "client_secret_basic"}
    http = _server(["client_secret_basic"], again_reg, {"access_token": "at-wide-1", "expires_in": 600}, seen)
    stored = await run_login(config, config.servers["s"], out, open_browser=False, wait=20,
                             store=store, client=http)  # type: ignore[arg-type]
    await asyncio.gather(*out.tasks)
    assert out.asked[0]["scope"] == ["m files:write"]
    assert "scope (a step-up: " in out.getvalue()
    assert (stored.scope, stored.step_up, stored.step_ups) == ("m files:write", None, 1)
    assert store.entry == stored
    # the next login without a recorded step-up: the configured scope, and the count starts over
    seen.clear()
    out = _Browser()
    http = _server(["client_secret_basic"], again_reg, {"access_token": "at-plain-1", "expires_in": 600}, seen)
    again = await run_login(config, config.servers["s"], out, open_browser=False, wait=20,
                            store=store, client=http)  # type: ignore[arg-type]
    await asyncio.gather(*out.tasks)
    assert out.asked[0]["scope"] == ["m"]
    assert (again.scope, again.step_up, again.step_ups) == ("m", None, 0)
