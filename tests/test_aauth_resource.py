"""AAuth, what a resource asks of the agent (issue 15), in process:

- its metadata (`/.well-known/aauth-resource.json`): the `additional_signature_components` taken
  (only what the signer produces), fetched once per origin for concurrent callers, cached
  `FRESH` seconds (`RETRY` after a failure or a 404) on a fake clock, bounded, no redirect;
- the derived components it may ask for, signed by `httpsig` and verified by the independent
  verifier (tests/peers/aauth_verify.py: `http-message-signatures`, no mcpcreds code);
- `AAuth-Access` session tokens (token68, exactly one) and `AAuth-Requirement` 401s (named from
  the draft's list, the resource's words never echoed);
- `creds.auth()`'s flow driven by hand: the session token presented, covered, replaced by a new
  one, dropped on a 401; a requirement it cannot meet raised as an error naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mcpcreds.client.auth import Sidecar, Upstream, credential_flow
from mcpcreds.config.load import parse_config
from mcpcreds.core.aauth_requirement import (
    AAuthRequirementError,
    access_token,
    describe,
    refusal,
    requirement,
)
from mcpcreds.signers import httpsig
from mcpcreds.signers.aauth_resource import (
    FRESH,
    MAX_METADATA,
    RETRY,
    ResourceMetadata,
    parse_components,
    required_input,
)
from tests.peers.aauth_verify import Rejected, verify

CONFIG = parse_config({"sidecar": {"socket": "/tmp/x/s.sock"}, "aauth": {"default": True},
                       "servers": [{"name": "res", "endpoint": "https://res.example:8443/api/mcp"},
                                   {"name": "twin", "endpoint": "https://res.example:8443/other"},
                                   {"name": "far", "endpoint": "https://far.example/mcp"}]})


# ------------------------------------------------------------------------------ the metadata document


def test_only_components_the_signer_produces_are_taken() -> None:
    doc = {"additional_signature_components": ["content-digest", "Content-Type", "@target-uri", "@query-param",
                                               '"x";sf', "signature", "@status", "content-type", 7, ""]}
    assert parse_components(doc) == (("content-digest", "content-type", "@target-uri"), 6)
    bad: object
    for bad in (None, [], "x", {"additional_signature_components": "content-digest"}, {}):
        assert parse_components(bad) == ((), 0)
    many = {"additional_signature_components": [f"x-h{i}" for i in range(100)]}
    taken, skipped = parse_components(many)
    assert len(taken) == 32 and skipped == 68  # bounded


class Resource:
    """A resource origin answering its metadata as a test says; counts the fetches."""

    def __init__(self) -> None:
        self.answer: Callable[[httpx.Request], httpx.Response] = lambda _: httpx.Response(
            200, json={"additional_signature_components": ["content-digest"]})
        self.seen: list[str] = []
        self.gate: asyncio.Event | None = None

    async def handler(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(str(request.url))
        if self.gate is not None:
            await self.gate.wait()
        return self.answer(request)


def metadata(resource: Resource, now: list[float]) -> ResourceMetadata:
    client = httpx.AsyncClient(transport=httpx.MockTransport(resource.handler))
    return ResourceMetadata(lambda: now[0], lambda _target: client, timeout=5)


async def test_fetched_once_per_origin_for_concurrent_callers_and_cached_fresh() -> None:
    resource, now = Resource(), [1000.0]
    held = metadata(resource, now)
    resource.gate = asyncio.Event()
    waiting = [asyncio.ensure_future(held.components(CONFIG.servers[name])) for name in ("res", "twin", "res")]
    await asyncio.sleep(0)
    resource.gate.set()
    assert await asyncio.gather(*waiting) == [("content-digest",)] * 3
    assert resource.seen == ["https://res.example:8443/.well-known/aauth-resource.json"]  # the origin's, once
    now[0] = 1000 + FRESH - 1
    assert await held.components(CONFIG.servers["twin"]) == ("content-digest",) and len(resource.seen) == 1
    resource.answer = lambda _: httpx.Response(200, json={"additional_signature_components": ["@target-uri"]})
    now[0] = 1000 + FRESH
    assert await held.components(CONFIG.servers["res"]) == ("@target-uri",) and len(resource.seen) == 2
    assert held.held() == {"https://res.example:8443": ["@target-uri"]}


@pytest.mark.parametrize("answer", [
    lambda _: httpx.Response(404),
    lambda _: httpx.Response(500, json={"additional_signature_components": ["content-digest"]}),
    lambda _: httpx.Response(302, headers={"location": "https://evil.example/.well-known/aauth-resource.json"}),
    lambda _: httpx.Response(200, content=b"{" + b" " * MAX_METADATA + b"}"),
    lambda _: httpx.Response(200, content=b"not json"),
    lambda request: (_ for _ in ()).throw(httpx.ConnectError("refused", request=request)),
], ids=["404", "500", "redirect-not-followed", "too-large", "not-json", "unreachable"])
async def test_without_a_readable_document_the_base_components_and_a_retry_later(answer: Any) -> None:
    resource, now = Resource(), [1000.0]
    resource.answer = answer
    held = metadata(resource, now)
    assert await held.components(CONFIG.servers["res"]) == ()
    now[0] = 1000 + RETRY - 1
    assert await held.components(CONFIG.servers["res"]) == () and len(resource.seen) == 1
    resource.answer = Resource().answer
    now[0] = 1000 + RETRY
    assert await held.components(CONFIG.servers["res"]) == ("content-digest",) and len(resource.seen) == 2


async def test_without_an_http_client_nothing_is_fetched() -> None:
    assert await ResourceMetadata(lambda: 0.0, None).components(CONFIG.servers["far"]) == ()


def test_a_refusal_naming_required_input_teaches_the_origin() -> None:
    header = ('error=invalid_input, required_input=("@method" "@authority" "@path" "signature-key" '
              '"content-digest" "@scheme" "@query-param" "x-tenant")')
    assert required_input([("Signature-Error", header)]) == ("content-digest", "@scheme", "x-tenant")
    assert required_input([("Signature-Error", "error=invalid_signature")]) == ()
    assert required_input([("Signature-Error", "error=invalid_input")]) == ()
    assert required_input([("Signature-Error", "error=invalid_input, required_input=(" + '"a" ' * 2000 + ")")]) == ()


async def test_learned_components_join_the_document_and_expire_with_it() -> None:
    resource, now = Resource(), [1000.0]
    held = metadata(resource, now)
    assert await held.components(CONFIG.servers["res"]) == ("content-digest",)
    now[0] = 1500.0
    assert held.learn(CONFIG.servers["twin"], ("@method", "content-digest", "@scheme"))  # the same origin
    assert not held.learn(CONFIG.servers["res"], ("@scheme", "signature-key"))  # nothing new
    assert await held.components(CONFIG.servers["res"]) == ("content-digest", "@scheme")
    assert await held.components(CONFIG.servers["far"]) == ("content-digest",)  # another origin: its own
    now[0] = 1000 + FRESH  # the document's entry expires: read again, what was learned goes with it
    assert await held.components(CONFIG.servers["res"]) == ("content-digest",)
    assert not ResourceMetadata(lambda: 0.0, None).learn(CONFIG.servers["res"], ("@scheme",))


# ------------------------------------------------------------------------------ derived components


KEY = Ed25519PrivateKey.generate()
HWK = httpsig.hwk_key(httpsig.public_jwk(KEY))


@pytest.mark.parametrize("url", ["https://res.example:8443/api/mcp?tenant=a", "https://res.example/api/mcp"])
def test_derived_components_a_resource_asks_for_verify_independently(url: str) -> None:
    asked = ["@target-uri", "@scheme", "@request-target", "@query"]
    signed = httpsig.sign_request(KEY, "GET", url, [], None, 1_800_000_000, HWK, cover=asked,
                                  digest=httpsig.content_digest(b""))
    host = url.split("/")[2]
    lines = [("host", host), *signed.headers().items()]
    verified = verify("GET", url, lines, b"", 1_800_000_000, required=[*asked, "content-digest"])
    assert set(asked) <= set(verified.covered)
    with pytest.raises(Rejected) as info:  # another scheme: @target-uri and @scheme no longer match
        verify("GET", url.replace("https", "http"), lines, b"", 1_800_000_000)
    assert info.value.error == "invalid_signature"
    with pytest.raises(Rejected) as info:  # a covered digest must match, the empty body's too
        verify("GET", url, lines, b"x", 1_800_000_000)
    with pytest.raises(httpsig.SignatureError, match="not one this signer produces"):
        httpsig.sign_request(KEY, "GET", url, [], None, 1_800_000_000, HWK, cover=["@query-param"])


def test_a_resource_that_asks_for_more_than_was_covered_refuses() -> None:
    url = "https://res.example/api/mcp"
    signed = httpsig.sign_request(KEY, "GET", url, [], None, 1_800_000_000, HWK)
    with pytest.raises(Rejected) as info:
        verify("GET", url, [("host", "res.example"), *signed.headers().items()], b"", 1_800_000_000,
               required=["content-digest"])
    assert info.value.error == "invalid_input"


# ------------------------------------------------------------------------------ AAuth-Access, AAuth-Requirement


def test_a_session_token_is_one_token68() -> None:
    assert access_token([("AAuth-Access", " abc.DEF-_~+/== ")]) == "abc.DEF-_~+/=="
    for lines in ([], [("aauth-access", "")], [("aauth-access", "a b")], [("aauth-access", "a\x01")],
                  [("aauth-access", "a"), ("AAuth-Access", "b")], [("aauth-access", "=a")],
                  [("aauth-access", "a" * 16385)]):
        assert access_token(lines) is None


def test_a_requirement_is_named_from_the_drafts_list_only() -> None:
    secret = "resource-token-eyJhbGciOi"
    assert requirement([("AAuth-Requirement", f'requirement=auth-token; resource-token="{secret}"')]) == "auth-token"
    assert requirement([("WWW-Authenticate", "AAuth requirement=person-token")]) == "person-token"
    assert requirement([("WWW-Authenticate", "Bearer realm=x")]) is None
    assert requirement([("WWW-Authenticate", "AAuth"), ("Signature-Error", "error=invalid_signature")]) is None
    assert requirement([("AAuth-Requirement", f"requirement={secret}")]) == "other"
    assert requirement([("AAuth-Requirement", "garbage")]) == "other"
    error = refusal("svc", 401, [("AAuth-Requirement", f'requirement=auth-token; resource-token="{secret}"')])
    assert isinstance(error, AAuthRequirementError) and error.status == 401
    assert error.to_wire()["error"]["requirement"] == "auth-token" and secret not in str(error.to_wire())
    assert "auth token from the agent's Person Server" in error.message and "'svc'" in error.message
    assert refusal("svc", 403, [("AAuth-Requirement", "requirement=auth-token")]) is None
    assert "configure [aauth] provider" in describe("svc", "agent-token")


# ------------------------------------------------------------------------------ creds.auth()'s flow


def drive(flow: Generator[Any, Any, Any], upstream: Callable[[httpx.Request], httpx.Response],
          signs: list[dict[str, Any]]) -> Any:
    """Run the flow: the sidecar's answers for an AAuth server, `upstream` for the server."""
    step = next(flow)
    try:
        while True:
            if isinstance(step, Sidecar):
                path = step.call.path
                if path.endswith("/call"):
                    step = flow.send({"headers": {}, "fingerprint": None, "aauth": True})
                elif path.endswith("/sign"):
                    assert step.call.body is not None
                    signs.append(step.call.body)
                    step = flow.send({"headers": {"Signature-Key": HWK, "Signature-Input": "sig=()",
                                                  "Signature": "sig=:AA==:"}})
                elif path.endswith("/invalidate"):
                    step = flow.send(True)
                else:
                    raise AssertionError(path)
            else:
                assert isinstance(step, Upstream)
                step = flow.send(upstream(step.request))
    except StopIteration as done:
        return done.value


def test_the_session_token_is_presented_covered_replaced_and_dropped_on_a_401() -> None:
    session: dict[str, str] = {}
    seen: list[str | None] = []
    answers = iter([httpx.Response(200, headers={"AAuth-Access": "s1"}), httpx.Response(200),
                    httpx.Response(200, headers={"AAuth-Access": "s2"}), httpx.Response(200),
                    httpx.Response(401, headers={"WWW-Authenticate": "AAuth"}), httpx.Response(200)])

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return next(answers)

    signs: list[dict[str, Any]] = []
    for _ in range(5):
        request = httpx.Request("POST", "https://res.example/mcp", content=b"{}",
                                headers={"content-type": "application/json"})
        drive(credential_flow("res", request, session=session), upstream, signs)
    assert seen == [None, "AAuth s1", "AAuth s1", "AAuth s2", "AAuth s2", None]  # the 401's retry: without
    assert signs[1]["headers"] == {"authorization": "AAuth s1", "content-type": "application/json"}  # covered
    assert all(s["content_digest"] == httpsig.content_digest(b"{}") for s in signs)
    assert session == {}
    bodiless = httpx.Request("GET", "https://res.example/mcp")
    drive(credential_flow("res", bodiless, session=session), lambda _: httpx.Response(200), signs)
    assert signs[-1]["content_digest"] == httpsig.content_digest(b"")  # a resource may ask for it


def test_the_retry_asks_to_cover_what_the_refusal_required() -> None:
    answers = iter([httpx.Response(401, headers={"Signature-Error": 'error=invalid_input, required_input=("@method" '
                                                                    '"@authority" "@path" "signature-key" "@scheme")'}),
                    httpx.Response(200)])
    signs: list[dict[str, Any]] = []
    request = httpx.Request("GET", "https://res.example/mcp")
    assert drive(credential_flow("res", request, session={}), lambda _: next(answers), signs).status_code == 200
    assert "required_input" not in signs[0] and signs[1]["required_input"] == ["@scheme"]


def test_a_requirement_the_sidecar_cannot_meet_is_raised_naming_it() -> None:
    request = httpx.Request("POST", "https://res.example/mcp", content=b"{}")
    refused = httpx.Response(401, headers={"AAuth-Requirement": 'requirement=auth-token; resource-token="eyJ.x"'})
    upstream_calls: list[int] = []

    def upstream(_: httpx.Request) -> httpx.Response:
        upstream_calls.append(1)
        return refused

    with pytest.raises(AAuthRequirementError, match="requires an auth token") as info:
        drive(credential_flow("res", request, session={}), upstream, [])
    assert "eyJ.x" not in str(info.value) and len(upstream_calls) == 1  # no pointless retry
