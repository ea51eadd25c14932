"""Enterprise-managed authorization (`grant = "cross_app"`): what `check` accepts, the token
exchange at the enterprise IdP (RFC 8693, for an ID-JAG) and the jwt-bearer redemption at the MCP
server's authorization server (RFC 7523), pure and against a scripted IdP and authorization
server; renewed by the login cache like any login, with the identity assertion read anew. The
suite's own scenario (auth/cross-app-access-complete-flow) runs in tests/test_conformance.py."""

from __future__ import annotations

import base64
import json
import tomllib
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from mcpcreds.config.load import parse_config
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.metrics import Metrics
from mcpcreds.core.secret import REDACTOR
from mcpcreds.credentials.cross_app import (
    ID_JAG,
    JWT_BEARER,
    TOKEN_EXCHANGE,
    cross_app_login,
    exchange_request,
    parse_exchange_response,
)
from mcpcreds.credentials.discovery import Discovery
from mcpcreds.credentials.logins import LoginCache
from mcpcreds.errors import ConfigError, TokenEndpointError

MCP = "https://mcp.example.com/mcp"
AS = "https://as.example.com"
IDP = "https://idp.example.com"
ID_TOKEN = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLWlkLXRva2Vu"
JAG = "eyJ0eXAiOiJvYXV0aC1pZC1qYWcrand0In0.eyJhdWQiOiJhcyJ9.c2lnLWphZy0xMjM0NQ"
SECRET = "as-client-secret-8c1f"


def _config(extra: str = 'idp_issuer = "https://idp.example.com"') -> Any:
    return parse_config(tomllib.loads(
        f'[[servers]]\nname = "s"\nendpoint = "{MCP}"\n'
        f'auth = {{ kind = "oauth2", grant = "cross_app", client_id = "mcp-client", '
        f'client_secret = "{{{{secret:AS_SECRET}}}}", subject_token = "{{{{secret:ID_TOKEN}}}}", '
        f'scope = "files:read", {extra} }}\n'))


def _errors(body: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(f'[[servers]]\nname = "s"\nendpoint = "{MCP}"\nauth = {{ kind = "oauth2", '
                                   f'{body} }}\n'))
    return str(info.value)


def test_check_accepts_a_cross_app_login_and_refuses_what_it_cannot_run() -> None:
    login = _config('idp_issuer = "https://idp.example.com", idp_client_id = "idp-c", '
                    'idp_client_secret = "{{secret:IDP_SECRET}}"').servers["s"].login
    assert login.grant == "cross_app" and login.idp is not None and login.idp.issuer == IDP
    assert login.idp.client_id == "idp-c" and login.idp.subject_token_type == "id_token"
    assert login.resource == MCP  # RFC 8707: the endpoint by default
    assert _config().servers["s"].secret_names == {"AS_SECRET", "ID_TOKEN"}  # a rotation renews it
    base = 'grant = "cross_app", client_id = "c", client_secret = "{{secret:S}}"'
    assert "idp_token_url (its token endpoint) or idp_issuer" in _errors(
        base + ', subject_token = "{{secret:T}}"')
    assert "needs the person's identity assertion" in _errors(base + ', idp_issuer = "https://idp.example.com"')
    # the assertion is a credential: never written in the config, and never echoed
    written = _errors(base + ', idp_issuer = "https://idp.example.com", subject_token = "' + ID_TOKEN + '"')
    assert "must not be written in the config" in written and ID_TOKEN not in written
    assert "expected one of id_token, saml2" in _errors(
        base + ', idp_issuer = "https://i.example", subject_token = "{{secret:T}}", subject_token_type = "jwt"')
    assert "idp_client_id: required with idp_client_secret" in _errors(
        base + ', idp_issuer = "https://i.example", subject_token = "{{secret:T}}", '
               'idp_client_secret = "{{secret:X}}"')
    assert "needs issuer too" in _errors(base + ', idp_issuer = "https://i.example", subject_token = '
                                                '"{{secret:T}}", token_url = "https://as.example/token"')
    assert "'none' (a public client) only with" in _errors(
        'grant = "cross_app", client_id = "c", auth_method = "none", idp_issuer = "https://i.example", '
        'subject_token = "{{secret:T}}"')
    # the IdP keys belong to cross_app only: never silently ignored elsewhere
    assert "subject_token: only with grant = 'cross_app'" in _errors(
        'client_id = "c", client_secret = "{{secret:S}}", subject_token = "{{secret:T}}"')


def test_the_exchange_request_asks_for_an_id_jag_for_the_authorization_server_and_the_resource() -> None:
    idp = _config('idp_token_url = "https://idp.example.com/token", idp_client_id = "idp c", '
                  'idp_client_secret = "{{secret:X}}"').servers["s"].login.idp
    request = exchange_request(idp, f"{IDP}/token", ID_TOKEN, "idp:secret", AS, MCP, "files:read")
    form = {k: v[0] for k, v in parse_qs(request.body).items()}
    assert form == {"grant_type": TOKEN_EXCHANGE, "requested_token_type": ID_JAG, "audience": AS,
                    "subject_token": ID_TOKEN, "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
                    "resource": MCP, "scope": "files:read"}
    # client_secret_basic at the IdP, id and secret form-encoded first (RFC 6749 §2.3.1)
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(b"idp+c:idp%3Asecret").decode()
    public = exchange_request(idp.__class__(None, f"{IDP}/token", "idp-c", None, idp.subject_token, "saml2"),
                              f"{IDP}/token", ID_TOKEN, None, AS, None, None)
    form = {k: v[0] for k, v in parse_qs(public.body).items()}
    assert form["client_id"] == "idp-c" and "Authorization" not in public.headers
    assert form["subject_token_type"] == "urn:ietf:params:oauth:token-type:saml2"
    assert "resource" not in form and "scope" not in form
    anonymous = exchange_request(idp.__class__(None, f"{IDP}/token", None, None, idp.subject_token, "id_token"),
                                 f"{IDP}/token", ID_TOKEN, None, AS, MCP, None)
    assert "client_id" not in parse_qs(anonymous.body) and "Authorization" not in anonymous.headers


def _answer(**body: Any) -> bytes:
    return json.dumps(body).encode()


def test_the_exchange_answer_must_be_an_id_jag_and_never_a_bearer_token() -> None:
    ok = {"access_token": JAG, "issued_token_type": ID_JAG, "token_type": "N_A", "expires_in": 300}
    assert parse_exchange_response(200, _answer(**ok)) == JAG and JAG in REDACTOR
    for bad in ({**ok, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"},
                {**ok, "token_type": "Bearer"}, {**ok, "access_token": "a b"}, {**ok, "access_token": ""},
                {k: v for k, v in ok.items() if k != "issued_token_type"}):
        with pytest.raises(TokenEndpointError) as info:
            parse_exchange_response(200, _answer(**bad))
        assert info.value.error == "invalid_response" and JAG not in info.value.message
    with pytest.raises(TokenEndpointError) as info:
        parse_exchange_response(400, _answer(error="invalid_grant", error_description="<b>" + ID_TOKEN))
    assert info.value.error == "invalid_grant" and "subject_token" in info.value.message
    assert ID_TOKEN not in info.value.message and "<b>" not in info.value.message
    with pytest.raises(TokenEndpointError) as info:
        parse_exchange_response(502, b"<html>")
    assert info.value.error == "server_error"


class _Parts(SimpleNamespace):
    """What cross_app_login uses of the broker."""

    __hash__ = object.__hash__  # type: ignore[assignment]

    async def render_templates(self, key: str, templates: Any) -> dict[str, str]:
        return {name: self.resolver.render(template) for name, template in templates}


class _Resolver:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def render(self, template: Any, overrides: Any = None) -> str:
        values = {**self.values, **(overrides or {})}
        return "".join(part if isinstance(part, str) else values[part.name] for part in template.parts)


def _network(seen: list[tuple[str, dict[str, str], str | None]], jag_answer: dict[str, Any] | None = None,
             ) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if url == "https://mcp.example.com/.well-known/oauth-protected-resource/mcp":
            return httpx.Response(200, json={"resource": MCP, "authorization_servers": [AS]})
        if url == f"{AS}/.well-known/oauth-authorization-server":
            return httpx.Response(200, json={"issuer": AS, "token_endpoint": f"{AS}/token",
                                             "grant_types_supported": [JWT_BEARER]})
        if url == f"{IDP}/.well-known/openid-configuration":
            return httpx.Response(200, json={"issuer": IDP, "token_endpoint": f"{IDP}/oauth2/token"})
        form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        if url in (f"{IDP}/oauth2/token", f"{AS}/token"):
            seen.append((url, form, request.headers.get("authorization")))
        if url == f"{IDP}/oauth2/token":
            return httpx.Response(200, json=jag_answer or {"access_token": f"{JAG}{len(seen)}",
                                                           "issued_token_type": ID_JAG, "token_type": "N_A"})
        if url == f"{AS}/token":
            return httpx.Response(200, json={"access_token": f"at-cross-{len(seen)}", "token_type": "Bearer",
                                             "expires_in": 600})
        return httpx.Response(404)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def _parts(config: Any, http: httpx.AsyncClient, values: dict[str, str], clock: FakeClock) -> _Parts:
    return _Parts(config=config, resolver=_Resolver(values), clock=clock, metrics=Metrics(),
                  discovery=Discovery(), http_for=lambda target, gateway=False: http)


async def test_the_assertion_is_exchanged_then_redeemed_and_renewed_like_any_login() -> None:
    config = _config()
    target = config.servers["s"]
    seen: list[tuple[str, dict[str, str], str | None]] = []
    clock = FakeClock()
    values = {"ID_TOKEN": ID_TOKEN, "AS_SECRET": SECRET}
    async with _network(seen) as http:
        parts = _parts(config, http, values, clock)
        cache = LoginCache(lambda t: cross_app_login(parts, t), clock, refresh_ahead=60)
        token = await cache.get(target)
        assert token.access_token == "at-cross-2"
        (idp_url, exchange, idp_auth), (as_url, bearer, as_auth) = seen
        # at the IdP its discovered token endpoint (OpenID), no client authentication configured
        assert idp_url == f"{IDP}/oauth2/token" and idp_auth is None
        assert exchange["subject_token"] == ID_TOKEN and exchange["audience"] == AS
        assert exchange["resource"] == MCP and exchange["requested_token_type"] == ID_JAG
        # at the authorization server: the ID-JAG, as the login's client, with its scope and resource
        assert as_url == f"{AS}/token" and bearer["grant_type"] == JWT_BEARER and bearer["assertion"] == f"{JAG}1"
        assert as_auth == "Basic " + base64.b64encode(f"mcp-client:{SECRET}".encode()).decode()
        assert bearer["scope"] == "files:read" and bearer["resource"] == MCP
        # renewed ahead of expiry like any login, with the assertion read anew (renewed at its source)
        values["ID_TOKEN"] = ID_TOKEN + "x"
        clock.advance(600 - 30)
        await cache.get(target)  # served, and a renewal starts in the background
        renewed = await cache.renew(target)
        assert renewed.access_token == "at-cross-4"
        assert seen[2][1]["subject_token"] == ID_TOKEN + "x" and seen[3][1]["assertion"] == f"{JAG}3"
        assert len([s for s in seen if s[0] == f"{IDP}/oauth2/token"]) == 2  # the IdP's metadata: once
        cache.close()


async def test_an_idp_that_answers_with_a_bearer_token_is_refused_and_nothing_is_redeemed() -> None:
    config = _config()
    seen: list[tuple[str, dict[str, str], str | None]] = []
    async with _network(seen, {"access_token": "at-from-idp", "token_type": "Bearer"}) as http:
        parts = _parts(config, http, {"ID_TOKEN": ID_TOKEN, "AS_SECRET": SECRET}, FakeClock())
        with pytest.raises(TokenEndpointError) as info:
            await cross_app_login(parts, config.servers["s"])
    assert info.value.error == "invalid_response" and [url for url, _, _ in seen] == [f"{IDP}/oauth2/token"]
    assert parts.metrics.render().count('mcpcreds_token_errors_total{key="mcp:s"} 1') == 1
