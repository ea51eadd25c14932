"""A person's login is kept under the authorization server that issued it (the MCP authorization
spec, 2026-07-28): the login records the issuer its metadata names; the sidecar's refresh goes
only to that server (a server whose metadata names another one since is `login_required`, and
nothing is sent), asks for the scope the login asked for and names the resource (RFC 8707); the
next `mcpcreds login` registers anew at the new server (RFC 7591, a native client). Against a
scripted authorization server (httpx MockTransport) and the real loopback listener."""

from __future__ import annotations

import asyncio
import io
import json
import tomllib
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from mcpcreds.broker.refresh import refresh_login
from mcpcreds.config.load import parse_config
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.metrics import Metrics
from mcpcreds.credentials.discovery import Discovery
from mcpcreds.credentials.login_store import Registration, StoredLogin, entry_name
from mcpcreds.errors import LoginRequired

MCP = "https://mcp.example.com/mcp"
OLD, NEW = "https://old-as.example.com", "https://new-as.example.com"
PRM = "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"


def _config(extra: str = "") -> Any:
    return parse_config(tomllib.loads(
        f'[[servers]]\nname = "s"\nendpoint = "{MCP}"\n'
        f'auth = {{ kind = "oauth2", grant = "authorization_code", scope = "files:read"{extra} }}\n'))


class _Keyring:
    def __init__(self) -> None:
        self.entries: dict[str, str] = {}

    def get(self, name: str) -> str | None:
        return self.entries.get(name)

    def set(self, name: str, value: str, *, person: bool = False) -> None:
        self.entries[name] = value

    def delete(self, name: str) -> bool:
        return self.entries.pop(name, None) is not None


def _authorization_server(names: str, seen: list[tuple[str, Any]]) -> httpx.AsyncClient:
    """The MCP server's metadata naming `names`, and both authorization servers."""

    def handler(request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if url == PRM:
            return httpx.Response(200, json={"resource": MCP, "authorization_servers": [names]})
        for issuer in (OLD, NEW):
            if url == f"{issuer}/.well-known/oauth-authorization-server":
                return httpx.Response(200, json={
                    "issuer": issuer, "authorization_endpoint": f"{issuer}/authorize",
                    "token_endpoint": f"{issuer}/token", "registration_endpoint": f"{issuer}/register",
                    "token_endpoint_auth_methods_supported": ["none"],
                    "scopes_supported": ["files:read", "offline_access"]})
            if url == f"{issuer}/token":
                seen.append(("token", (issuer, parse_qs(request.content.decode()))))
                return httpx.Response(200, json={"access_token": "at-new-12345", "expires_in": 600,
                                                 "refresh_token": "rt-next-12345"})
            if url == f"{issuer}/register":
                seen.append(("register", (issuer, json.loads(request.content))))
                return httpx.Response(201, json={"client_id": f"dyn-at-{issuer[8:11]}"})
        return httpx.Response(404)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


class _Broker(SimpleNamespace):
    """What refresh_login uses of the broker (hashable by identity: it keys weak maps)."""

    __hash__ = object.__hash__  # type: ignore[assignment]


def _broker(config: Any, keyring: _Keyring, http: httpx.AsyncClient) -> Any:
    """What refresh_login uses of the broker, on a fake keyring and a scripted network."""
    return _Broker(config=config, resolver=SimpleNamespace(keyring=keyring), clock=FakeClock(),
                   metrics=Metrics(), discovery=Discovery(), logins=None, sharing=object(),
                   http_for=lambda target, gateway=False: http)


STORED = StoredLogin("rt-old-12345", "dyn-at-old", scope="files:read offline_access",
                     registration=Registration(OLD, "dyn-at-old", "none", None, "http://127.0.0.1:4/callback"),
                     issuer=OLD)


async def test_the_refresh_goes_to_the_issuer_of_the_login_with_its_scope_and_the_resource() -> None:
    config = _config()
    keyring = _Keyring()
    keyring.set(entry_name("mcp:s"), STORED.to_json())
    seen: list[tuple[str, Any]] = []
    async with _authorization_server(OLD, seen) as http:
        token = await refresh_login(_broker(config, keyring, http), config.servers["s"])
    assert token.access_token == "at-new-12345"
    [(kind, (issuer, form))] = seen
    assert kind == "token" and issuer == OLD
    assert form["grant_type"] == ["refresh_token"] and form["refresh_token"] == ["rt-old-12345"]
    # the scope the login asked for (not the configured one, which would narrow it), the resource
    assert form["scope"] == ["files:read offline_access"] and form["resource"] == [MCP]
    assert form["client_id"] == ["dyn-at-old"]


async def test_a_login_made_at_another_authorization_server_is_not_refreshed_at_the_new_one() -> None:
    """The MCP server's metadata now names NEW: the refresh token (and the registration made at
    OLD) is not sent anywhere; the person is asked to log in again."""
    config = _config()
    keyring = _Keyring()
    keyring.set(entry_name("mcp:s"), STORED.to_json())
    seen: list[tuple[str, Any]] = []
    async with _authorization_server(NEW, seen) as http:
        with pytest.raises(LoginRequired) as info:
            await refresh_login(_broker(config, keyring, http), config.servers["s"])
    assert "another authorization server" in info.value.message and "mcpcreds login s" in info.value.message
    assert seen == []
    # a login kept before the issuer was recorded is known by its registration's issuer
    keyring.set(entry_name("mcp:s"), StoredLogin("rt-old-12345", "dyn-at-old",
                                                 registration=STORED.registration).to_json())
    async with _authorization_server(NEW, seen) as http:
        with pytest.raises(LoginRequired):
            await refresh_login(_broker(config, keyring, http), config.servers["s"])
    assert seen == []


def test_the_issuer_comparison() -> None:
    assert not STORED.issued_elsewhere(OLD) and not STORED.issued_elsewhere(OLD + "/")
    assert STORED.issued_elsewhere(NEW)
    assert not STORED.issued_elsewhere(None)  # not known (a configured token_url): nothing to compare
    assert not StoredLogin("rt", "c").issued_elsewhere(NEW)  # nothing recorded
    again = StoredLogin.from_json(STORED.to_json())
    assert again == STORED and again.issuer == OLD
    assert StoredLogin.from_json(json.dumps({"v": 1, "client_id": "c", "refresh_token": "r",
                                             "issuer": "bad issuer\n"})) is None


class _Browser(io.StringIO):
    """The login's stderr: follows the authorization URL to the loopback callback."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[asyncio.Task[None]] = []
        self.asked: list[dict[str, list[str]]] = []

    def write(self, text: str) -> int:
        for word in text.split():
            if "code_challenge=" in word:
                query = parse_qs(httpx.URL(word).query.decode())
                self.asked.append(query)
                self.tasks.append(asyncio.ensure_future(self._follow(query)))
        return super().write(text)

    @staticmethod
    async def _follow(query: dict[str, list[str]]) -> None:
        async with httpx.AsyncClient() as http:
            await http.get(query["redirect_uri"][0], params={"code": "the-code", "state": query["state"][0]})


class _Store:
    def __init__(self, entry: StoredLogin | None) -> None:
        self.entry = entry

    def get(self, key: str) -> StoredLogin | None:
        return self.entry

    def put(self, key: str, login: StoredLogin, *, person: bool = False) -> None:
        self.entry = login


async def test_the_next_login_registers_anew_at_the_new_authorization_server() -> None:
    from mcpcreds.cli.login import run_login

    config = _config()
    store = _Store(STORED)
    seen: list[tuple[str, Any]] = []
    out = _Browser()
    http = _authorization_server(NEW, seen)
    stored = await run_login(config, config.servers["s"], out, open_browser=False, wait=20,
                             store=store, client=http)  # type: ignore[arg-type]
    await asyncio.gather(*out.tasks)
    assert [(kind, issuer) for kind, (issuer, _) in seen] == [("register", NEW), ("token", NEW)]
    registration = seen[0][1][1]
    assert registration["application_type"] == "native" and "refresh_token" in registration["grant_types"]
    assert "names another authorization server" in out.getvalue()
    assert out.asked[0]["client_id"] == ["dyn-at-new"]
    # the server lists offline_access: the login asks for a refresh token with it
    assert out.asked[0]["scope"] == ["files:read offline_access"]
    assert stored.issuer == NEW and stored.registration is not None and stored.registration.issuer == NEW
    assert stored.scope == "files:read offline_access" and store.entry == stored


async def test_a_new_login_lifts_the_sidecars_pin_of_the_old_authorization_server() -> None:
    """The sidecar pins the authorization server it discovered per endpoint (a server's metadata
    cannot move a running sidecar's secrets elsewhere); a new `mcpcreds login` (its notice) lifts
    the pin of that endpoint only, so the refresh discovers the server the login was made at."""
    seen: list[tuple[str, Any]] = []
    login = _config().servers["s"].login
    discovery = Discovery()
    async with _authorization_server(OLD, seen) as http:
        assert await discovery.token_url(login, MCP, http) == f"{OLD}/token"
    discovery.issuers["https://other.example.com/mcp"] = OLD
    async with _authorization_server(NEW, seen) as http:
        assert await discovery.token_url(login, MCP, http) == f"{OLD}/token"  # pinned
        discovery.forget_endpoint(MCP)
        assert await discovery.token_url(login, MCP, http) == f"{NEW}/token"
    assert discovery.issuers == {MCP: NEW, "https://other.example.com/mcp": OLD}
