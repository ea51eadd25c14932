"""Discovery in the MCP authorization spec's order (2025-11-25, issue 20), on recorded documents:
the protected-resource metadata the 401's WWW-Authenticate names comes before the well-known URIs
(path-based, then root), which are only asked when it is absent or cannot be used; authorization
server metadata for an issuer with a path is asked for by RFC 8414 path insertion, then OpenID
Connect Discovery path insertion, then OpenID Connect path appending."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from mcpcreds.config.model import LoginSpec
from mcpcreds.credentials import discovery
from mcpcreds.credentials.discovery import Discovery, metadata_urls
from mcpcreds.errors import Forbidden, McpcredsError, TokenEndpointError
from mcpcreds.net.egress import EgressPolicy
from mcpcreds.net.egress_http import egress_client

MCP = "https://mcp.example.com/mcp"
PATH_BASED = "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
ROOT = "https://mcp.example.com/.well-known/oauth-protected-resource"
NAMED = "https://mcp.example.com/custom/metadata/location.json"  # where auth/metadata-var3 puts it
AS_A = "https://as-a.example.com"
AS_B = "https://as-b.example.com/tenant1"


def prm(server: str, resource: str = MCP) -> dict[str, Any]:
    """Protected-resource metadata as the conformance suite serves it."""
    return {"resource": resource, "authorization_servers": [server]}


def as_metadata(issuer: str, token: str) -> dict[str, Any]:
    return {"issuer": issuer, "authorization_endpoint": f"{issuer}/authorize", "token_endpoint": token,
            "registration_endpoint": f"{issuer}/register", "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"]}


def challenge(url: str) -> tuple[int, dict[str, str], object]:
    return 401, {"www-authenticate": f'Bearer error="invalid_token", resource_metadata="{url}"'}, {}


Routes = dict[str, tuple[int, dict[str, str], object]]


def responder(routes: Routes, seen: list[str], request: httpx.Request, url: str) -> httpx.Response:
    key = f"{request.method} {url}"
    seen.append(key)
    status, headers, body = routes.get(key, (404, {}, {}))
    if isinstance(body, httpx.AsyncByteStream):
        return httpx.Response(status, headers=headers, stream=body)
    if isinstance(body, bytes):
        return httpx.Response(status, headers=headers, content=body)
    return httpx.Response(status, headers=headers, json=body)


def egress(routes: Routes, policy: EgressPolicy | None = None) -> tuple[httpx.AsyncClient, list[str]]:
    """The sidecar's own egress client (its policy and address checks) with the recorded answers
    behind it in place of the network; every name resolves to one public address."""
    seen: list[str] = []

    class Recorded(httpx.AsyncBaseTransport):
        def __init__(self, **_: Any) -> None:
            pass

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            # the egress transport pins the URL to the address; the Host header keeps the name
            url = str(request.url.copy_with(host=request.headers["host"]))
            return responder(routes, seen, request, url)

    async def resolve(host: str, port: int) -> list[str]:
        return ["93.184.216.34"]

    http = egress_client(policy or EgressPolicy(), resolver=resolve, transport_kwargs={"pool_class": Recorded})
    return http, seen


def login(grant: str = "client_credentials") -> LoginSpec:
    return LoginSpec(grant=grant, client_id="c", client_secret=None, private_key=None,
                     auth_method="client_secret_basic", token_url=None, issuer=None, scope=None,
                     resource=None, audience=None)


# -- protected-resource metadata: the 401's document first


def two_servers() -> Routes:
    """A path-based document naming AS-A, and a 401 naming a document for AS-B: both servers'
    metadata (insertion for AS-B's path) with their own token endpoints."""
    return {
        f"POST {MCP}": challenge(NAMED),
        f"GET {NAMED}": (200, {}, prm(AS_B)),
        f"GET {PATH_BASED}": (200, {}, prm(AS_A)),
        f"GET {ROOT}": (200, {}, prm(AS_A, "https://mcp.example.com")),
        f"GET {AS_A}/.well-known/oauth-authorization-server": (200, {}, as_metadata(AS_A, f"{AS_A}/token")),
        "GET https://as-b.example.com/.well-known/oauth-authorization-server/tenant1":
            (200, {}, as_metadata(AS_B, f"{AS_B}/token")),
    }


async def test_the_document_the_401_names_wins_and_no_well_known_uri_is_asked() -> None:
    """The client secret goes to the token endpoint of the server the 401's document names."""
    http, seen = egress(two_servers())
    async with http:
        assert await Discovery().token_url(login(), MCP, http) == f"{AS_B}/token"
    assert seen[:2] == [f"POST {MCP}", f"GET {NAMED}"]
    assert not {f"GET {PATH_BASED}", f"GET {ROOT}"} & set(seen), seen


UNUSABLE_NAMED: dict[str, tuple[int, dict[str, str], object]] = {
    "not-found": (404, {}, {}),
    "server-error": (500, {}, {}),
    "another-resource": (200, {}, prm(AS_B, "https://mcp.example.com/other")),
    "no-server": (200, {}, {"resource": MCP, "authorization_servers": []}),
    "not-json": (200, {}, b"<html>"),
    # a document for AS-B past the size bound (256 KiB): not read to its end, not used
    "too-large": (200, {}, json.dumps(prm(AS_B)).encode() + b" " * (256 * 1024)),
}


@pytest.mark.parametrize("answer", list(UNUSABLE_NAMED.values()), ids=list(UNUSABLE_NAMED))
async def test_a_named_document_that_cannot_be_used_falls_back_to_the_path_based_one(
        answer: tuple[int, dict[str, str], object]) -> None:
    routes = two_servers()
    routes[f"GET {NAMED}"] = answer
    http, seen = egress(routes)
    async with http:
        assert await Discovery().issuer_for(MCP, http) == AS_A
    assert seen == [f"POST {MCP}", f"GET {NAMED}", f"GET {PATH_BASED}"]


async def test_a_named_document_the_egress_policy_refuses_is_not_fetched_and_the_root_one_is_used() -> None:
    """A 401 pointing at an internal address (SSRF): refused before any connection; the server's
    own root document (path-based absent) speaks for the whole origin."""
    internal = "https://169.254.169.254/latest/meta-data"
    routes = two_servers()
    routes[f"POST {MCP}"] = challenge(internal)
    del routes[f"GET {PATH_BASED}"]
    http, seen = egress(routes)
    async with http:
        assert await Discovery().issuer_for(MCP, http) == AS_A
    assert seen == [f"POST {MCP}", f"GET {PATH_BASED}", f"GET {ROOT}"]  # the internal one never sent


@pytest.mark.parametrize(("named", "error"), [
    ("https://169.254.169.254/prm", Forbidden),
    ("https://meta.example.com/prm", TokenEndpointError),
])
async def test_with_no_well_known_document_the_named_documents_failure_is_the_answer(
        named: str, error: type[McpcredsError]) -> None:
    routes: Routes = {f"POST {MCP}": challenge(named),
                      "GET https://meta.example.com/prm": (200, {}, prm(AS_B, "https://elsewhere.example.com"))}
    http, seen = egress(routes)
    async with http:
        with pytest.raises(error) as info:
            await Discovery().issuer_for(MCP, http)
    # not NoResourceMetadata: the server says it has metadata, so no 2025-03-26 origin guess
    assert type(info.value) is error
    assert seen[-2:] == [f"GET {PATH_BASED}", f"GET {ROOT}"]


async def test_without_a_named_document_the_path_based_one_comes_before_the_root() -> None:
    routes = two_servers()
    routes[f"POST {MCP}"] = (401, {"www-authenticate": 'Bearer error="invalid_token"'}, {})
    http, seen = egress(routes)
    async with http:
        assert await Discovery().issuer_for(MCP, http) == AS_A
    assert seen == [f"POST {MCP}", f"GET {PATH_BASED}"]


# -- authorization server metadata: RFC 8414 insertion, OIDC insertion, OIDC appending


def test_metadata_urls_in_the_specs_order() -> None:
    assert metadata_urls("https://auth.example.com/tenant1") == [
        "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
        "https://auth.example.com/.well-known/openid-configuration/tenant1",
        "https://auth.example.com/tenant1/.well-known/openid-configuration"]
    assert metadata_urls("https://auth.example.com/tenant1/") == metadata_urls("https://auth.example.com/tenant1")
    assert metadata_urls("https://auth.example.com") == [
        "https://auth.example.com/.well-known/oauth-authorization-server",
        "https://auth.example.com/.well-known/openid-configuration"]


async def test_an_issuer_with_a_path_is_read_from_oidc_insertion_before_oidc_appending() -> None:
    """Both OpenID documents exist (a server moving from one to the other): the login's endpoints
    are those of the path-inserted one, as the spec orders; the appended one is not asked."""
    inserted = "https://as-b.example.com/.well-known/openid-configuration/tenant1"
    appended = f"{AS_B}/.well-known/openid-configuration"
    routes: Routes = {f"POST {MCP}": challenge(NAMED), f"GET {NAMED}": (200, {}, prm(AS_B)),
                      f"GET {inserted}": (200, {}, as_metadata(AS_B, f"{AS_B}/oidc-inserted/token")),
                      f"GET {appended}": (200, {}, as_metadata(AS_B, f"{AS_B}/oidc-appended/token"))}
    http, seen = egress(routes)
    async with http:
        ends = await Discovery().endpoints(login("authorization_code"), MCP, http)
    assert ends.token == f"{AS_B}/oidc-inserted/token"
    assert seen[2:] == ["GET https://as-b.example.com/.well-known/oauth-authorization-server/tenant1",
                        f"GET {inserted}"]


async def test_an_issuer_without_a_path_is_read_from_rfc_8414_then_openid() -> None:
    routes: Routes = {f"POST {MCP}": challenge(NAMED), f"GET {NAMED}": (200, {}, prm(AS_A)),
                      f"GET {AS_A}/.well-known/openid-configuration": (200, {}, as_metadata(AS_A, f"{AS_A}/t"))}
    http, seen = egress(routes)
    async with http:
        assert await Discovery().token_url(login(), MCP, http) == f"{AS_A}/t"
    assert seen[2:] == [f"GET {AS_A}/.well-known/oauth-authorization-server",
                        f"GET {AS_A}/.well-known/openid-configuration"]


class Drip(httpx.AsyncByteStream):
    """A body that never ends: a byte every 0.05 s, each read well within httpx's read timeout."""

    async def __aiter__(self) -> Any:
        while True:
            yield b" "
            await asyncio.sleep(0.05)


async def test_a_named_document_that_drips_forever_is_given_up_whole_and_asked_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx's timeout bounds each read, not the document: the whole fetch has DISCOVERY_TIMEOUT;
    then the path-based document is used, and the named URL is not asked a second time."""
    monkeypatch.setattr(discovery, "DISCOVERY_TIMEOUT", 0.5)
    routes = two_servers()
    routes[f"POST {MCP}"] = challenge(PATH_BASED)
    routes[f"GET {PATH_BASED}"] = (200, {}, Drip())
    http, seen = egress(routes)
    async with http:
        assert await asyncio.wait_for(Discovery().token_url(login(), MCP, http), 30) == f"{AS_A}/token"
    assert seen.count(f"GET {PATH_BASED}") == 1 and f"GET {ROOT}" in seen, seen
