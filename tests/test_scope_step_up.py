"""Step-up on `403 insufficient_scope` (issue 20, the MCP authorization spec's "Scope Challenge
Handling"): the challenge read from recorded headers (the conformance suite's own), the choice
(a new login with the union of the scopes; none when it would not help, nor past the limit),
the sidecar's answer and what it records in the login's entry, and `creds.auth`'s flow."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from mcpcreds.client.auth import Sidecar, Upstream, credential_flow
from mcpcreds.config.load import parse_config
from mcpcreds.core.scopes import (
    MAX_SCOPES,
    MAX_STEP_UPS,
    Challenge,
    insufficient_scope,
    parse_challenge,
    parse_scope,
    step_up,
    union,
    with_offline_access,
)
from mcpcreds.credentials.login_store import Registration, StoredLogin
from mcpcreds.credentials.tokens import Token
from mcpcreds.errors import LoginRequired

RM = "http://localhost:4001/.well-known/oauth-protected-resource/mcp"
# the headers the suite's servers send (auth/scope-step-up, auth/scope-retry-limit)
STEP_UP_401 = f'Bearer scope="mcp:basic", resource_metadata="{RM}"'
STEP_UP_403 = f'Bearer scope="mcp:basic mcp:write", resource_metadata="{RM}", error="insufficient_scope"'
RETRY_403 = (f'Bearer error="insufficient_scope", scope="mcp:admin", resource_metadata="{RM}", '
             'error_description="Scope upgrade will never succeed"')


# -- the challenge


def test_the_suites_challenges_are_read() -> None:
    assert parse_challenge(STEP_UP_401) == Challenge(None, "mcp:basic")
    assert parse_challenge(STEP_UP_403) == Challenge("insufficient_scope", "mcp:basic mcp:write")
    assert parse_challenge(RETRY_403) == Challenge("insufficient_scope", "mcp:admin")
    # RFC 6750 §3's example, with an escaped quote in the description and a token-form error
    rfc = 'Bearer realm="example", error=insufficient_scope, error_description="need \\"write\\"", scope="a b"'
    assert parse_challenge(rfc) == Challenge("insufficient_scope", "a b")


def test_only_a_403_insufficient_scope_with_a_usable_scope_asks_for_a_step_up() -> None:
    assert insufficient_scope(403, STEP_UP_403) == "mcp:basic mcp:write"
    assert insufficient_scope(401, STEP_UP_403) is None  # a 401 is a refused login, not a scope
    assert insufficient_scope(403, STEP_UP_401) is None  # no error="insufficient_scope"
    assert insufficient_scope(403, 'Bearer error="insufficient_scope"') is None  # no scope: nothing to ask
    assert insufficient_scope(403, 'Basic error="insufficient_scope", scope="a"') is None
    assert insufficient_scope(403, None) is None
    assert insufficient_scope(403, 'Bearer error="insufficient_scope", scope="a\\\\b"') is None  # not a scope-token
    too_many = " ".join(f"s{i}" for i in range(MAX_SCOPES + 1))
    assert insufficient_scope(403, f'Bearer error="insufficient_scope", scope="{too_many}"') is None
    assert insufficient_scope(403, 'Bearer error="insufficient_scope", scope="a"' + " " * 20000) is None
    assert parse_challenge('Bearer error="Insufficient Scope!", scope="a"') == Challenge(None, "a")


# -- the choice


def test_the_step_up_asks_for_the_union_when_the_server_names_a_new_scope() -> None:
    assert step_up("mcp:basic", "mcp:basic mcp:write", 0).scope == "mcp:basic mcp:write"
    # the server names only the new scope: the union keeps what the login had (no lost permission)
    choice = step_up("files:read", "files:write", 0)
    assert (choice.verdict, choice.scope) == ("login", "files:read files:write")
    assert step_up(None, "mcp:admin", 0).scope == "mcp:admin"  # a login that asked for no scope


def test_no_new_login_when_it_would_not_help_or_past_the_limit() -> None:
    # auth/scope-retry-limit: the 403 names the scope the login already asked for
    assert step_up("mcp:admin", "mcp:admin", 0).verdict == "held"
    assert step_up("a b c", "c a", 0).verdict == "held"
    assert step_up("a", "b", MAX_STEP_UPS - 1).verdict == "login"
    assert step_up("a", "b", MAX_STEP_UPS).verdict == "limit"
    asked = " ".join(f"s{i}" for i in range(MAX_SCOPES))
    assert step_up(asked, "one-more", 0).verdict == "too_wide"
    assert MAX_STEP_UPS == 2  # with the first login, at most 3 authorizations (the suite's bound)


def test_scopes_are_normalised_and_bounded() -> None:
    assert parse_scope("b  a b") == "b a"
    assert parse_scope("") is None and parse_scope(" ") is None and parse_scope(7) is None
    assert parse_scope('a"b') is None and parse_scope("x" * 5000) is None
    assert union("a b", None, "b c") == "a b c" and union(None, None) is None


def test_the_entry_keeps_the_scope_and_the_step_up_and_refuses_bad_ones() -> None:
    stored = StoredLogin(None, "c", "at-entry-1", 100.0, scope="a b", step_up="a b c", step_ups=1)
    assert StoredLogin.from_json(stored.to_json()) == stored
    assert StoredLogin.from_json(StoredLogin("rt-entry-1", "c").to_json()) == StoredLogin("rt-entry-1", "c")
    base = json.loads(stored.to_json())
    for bad in ({"scope": 'a"b'}, {"step_up": ""}, {"step_ups": MAX_STEP_UPS + 1}, {"step_ups": -1},
                {"step_ups": True}, {"scope": ["a"]}):
        assert StoredLogin.from_json(json.dumps({**base, **bad})) is None, bad


# -- the sidecar's answer (step_up.py), on a fake keyring entry


MCP = "https://mcp.example.com/mcp"
FP = "fp-current"


class _Store:
    def __init__(self, entry: StoredLogin | None) -> None:
        self.entry = entry
        self.puts: list[StoredLogin] = []

    def get(self, key: str) -> StoredLogin | None:
        return self.entry

    def put(self, key: str, login: StoredLogin, *, person: bool = False) -> None:
        self.puts.append(login)
        self.entry = login


def _target(auth: str) -> Any:
    config = parse_config(tomllib.loads(f'[[servers]]\nname = "notes"\nendpoint = "{MCP}"\nauth = {auth}\n'))
    return config.servers["notes"]


PERSON = '{ kind = "oauth2", grant = "authorization_code", issuer = "https://as.example.com" }'
REG = Registration("https://as.example.com", "dyn-1", "none", None, "http://127.0.0.1:5/callback")


async def _report(monkeypatch: pytest.MonkeyPatch, store: _Store, scope: str, fingerprint: str | None = FP,
                  auth: str = PERSON) -> dict[str, Any]:
    from mcpcreds.broker import step_up as module

    token = Token("at-current", "Bearer", 0.0, 3600.0, None, FP)
    logins = SimpleNamespace(peek=lambda key: token)
    return await module.report_insufficient_scope(logins, store, _target(auth), fingerprint,  # type: ignore[arg-type]
                                                  scope)


async def test_a_wider_scope_is_recorded_and_the_answer_names_the_login_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = _Store(StoredLogin(None, "dyn-1", "at-current", 3600.0, REG, scope="mcp:basic"))
    with pytest.raises(LoginRequired) as info:
        await _report(monkeypatch, store, "mcp:basic mcp:write")
    assert info.value.details["command"] == "mcpcreds login notes"
    assert "mcp:write" not in info.value.message  # the reported scope is never echoed
    assert store.entry is not None and store.entry.step_up == "mcp:basic mcp:write"
    assert dataclasses.replace(store.entry, step_up=None) == StoredLogin(None, "dyn-1", "at-current", 3600.0, REG,
                                                                         scope="mcp:basic")
    # reported again (another request, the same 403): the same answer, nothing written again
    with pytest.raises(LoginRequired):
        await _report(monkeypatch, store, "mcp:write")
    assert len(store.puts) == 1


async def test_no_login_is_due_when_it_would_not_help(monkeypatch: pytest.MonkeyPatch) -> None:
    held = _Store(StoredLogin(None, "dyn-1", "at-current", 3600.0, REG, scope="mcp:admin"))
    assert await _report(monkeypatch, held, "mcp:admin") == {"step_up": False, "renewed": False, "why": "held"}
    limit = _Store(StoredLogin(None, "dyn-1", "at-current", 3600.0, REG, scope="a", step_ups=MAX_STEP_UPS))
    assert (await _report(monkeypatch, limit, "b"))["why"] == "limit"
    assert held.puts == [] and limit.puts == []
    # the login named is no longer the one served: a retry with the current one may pass
    renewed = await _report(monkeypatch, held, "x", fingerprint="fp-older")
    assert renewed == {"step_up": False, "renewed": True, "why": "renewed"}
    # client credentials may abort (the spec): the 403 goes back
    cc = '{ kind = "oauth2", client_id = "c", client_secret = "{{secret:S}}", token_url = "https://as.example.com/t" }'
    assert (await _report(monkeypatch, held, "x", auth=cc))["why"] == "not_a_person_login"
    assert (await _report(monkeypatch, _Store(None), "x"))["why"] == "no_login"


async def test_a_login_that_replaced_the_entry_meanwhile_is_not_overwritten() -> None:
    from mcpcreds.broker.step_up import _record

    old = StoredLogin(None, "dyn-1", "at-old-1", 3600.0, REG, scope="a")
    newer = StoredLogin(None, "dyn-1", "at-new-1", 7200.0, REG, scope="a b")
    store = _Store(newer)
    _record(store, "mcp:notes", old, "a c")  # type: ignore[arg-type]
    assert store.puts == [] and store.entry == newer


# -- creds.auth's flow, driven step by step


def _drive(responses: list[httpx.Response], answers: dict[str, Any]) -> tuple[list[str], Any]:
    """Run credential_flow: the sidecar's answers by route (an exception is raised), the
    upstream's in order. Returns the steps taken and the flow's result."""
    request = httpx.Request("POST", MCP, content=b"{}")
    flow = credential_flow("notes", request)
    steps: list[str] = []
    reply: Any = None
    try:
        while True:
            step = flow.send(reply)
            if isinstance(step, Sidecar):
                route = step.call.path.rsplit("/", 1)[1]
                steps.append(f"{route} {json.dumps(step.call.body, sort_keys=True)}")
                answer = answers[route]
                if isinstance(answer, Exception):
                    flow.throw(answer)
                reply = answer() if callable(answer) else answer
            else:
                assert isinstance(step, Upstream)
                steps.append("upstream")
                reply = responses.pop(0)
    except StopIteration as stop:
        return steps, stop.value


CALL = {"headers": {"Authorization": "Bearer at-current"}, "fingerprint": FP, "granted": 1, "waited": 0}


def test_the_flow_reports_the_scope_and_raises_login_required() -> None:
    forbidden = httpx.Response(403, headers={"www-authenticate": STEP_UP_403})
    with pytest.raises(LoginRequired):
        _drive([forbidden], {"call": CALL, "step-up": LoginRequired("run it", command="mcpcreds login notes")})


def test_the_flow_hands_back_a_403_no_login_would_help_and_retries_once_after_a_renewal() -> None:
    forbidden = httpx.Response(403, headers={"www-authenticate": RETRY_403})
    steps, result = _drive([forbidden], {"call": CALL, "step-up": {"step_up": False, "renewed": False, "why": "held"}})
    assert result is forbidden
    assert steps == ["call " + json.dumps({"cost": 1, "max_wait": 30.0}), "upstream",
                     "step-up " + json.dumps({"fingerprint": FP, "scope": "mcp:admin"}, sort_keys=True)]
    # renewed: once more with the current login; a second 403 is reported, then handed back
    again = httpx.Response(403, headers={"www-authenticate": RETRY_403})
    steps, result = _drive([forbidden, again],
                           {"call": CALL, "step-up": {"step_up": False, "renewed": True, "why": "renewed"}})
    assert result is again
    assert [s.split(" ")[0] for s in steps] == ["call", "upstream", "step-up", "call", "upstream", "step-up"]
    # a 403 that is not about scope is no step-up: nothing reported
    plain = httpx.Response(403)
    steps, result = _drive([plain], {"call": CALL})
    assert result is plain and steps[-1] == "upstream"


# -- the route: its input checked and never echoed


async def test_the_route_refuses_a_bad_scope_without_echoing_it() -> None:
    import os

    from mcpcreds.broker.broker import Broker
    from mcpcreds.core.audit import AuditLog
    from mcpcreds.core.clock import FakeClock
    from mcpcreds.core.http import Request, Response
    from mcpcreds.core.metrics import Metrics
    from mcpcreds.credentials.sources import EnvSource, SecretResolver
    from mcpcreds.sidecar.api import Api

    config = parse_config(tomllib.loads(
        f'[[servers]]\nname = "docs"\nendpoint = "{MCP}"\nheaders = {{ "X-Api-Key" = "{{{{secret:KEY}}}}" }}\n'
        f'[[servers]]\nname = "notes"\nendpoint = "{MCP}"\nauth = {PERSON}\n'))
    clock = FakeClock()
    log = AuditLog(None, clock)
    broker = Broker(config, SecretResolver([EnvSource({"KEY": "k-1"})]), clock, Metrics(), log)
    api = Api(broker, Metrics(), log)

    async def call(name: str, body: object) -> tuple[int, dict[str, Any]]:
        request = Request("POST", f"/v1/servers/{name}/step-up", "", json.dumps(body).encode(), None,
                          os.getuid(), 1)
        result = api.handle(request)
        response = result if isinstance(result, Response) else await cast(Awaitable[Response], result)
        return response.status, json.loads(response.body)

    try:
        marker = "evil<script>"
        for scope in (f'a"{marker}', marker * 400, " ".join(f"s{i}" for i in range(MAX_SCOPES + 1)), "", 7, None):
            status, answer = await call("notes", {"scope": scope, "fingerprint": FP})
            assert (status, answer["error"]["code"]) == (400, "invalid_request"), scope
            assert marker not in json.dumps(answer)
        # a server with static headers: nothing to widen, the 403 goes back
        assert await call("docs", {"scope": "files:write"}) == (
            200, {"step_up": False, "renewed": False, "why": "not_a_person_login"})
    finally:
        await broker.aclose()


def test_offline_access_is_added_only_where_the_authorization_server_lists_it() -> None:
    """SEP-2207: `offline_access` joins the scope the login asks for when the authorization
    server's `scopes_supported` lists it; never for a server that does not (it may refuse an
    unknown scope), never twice, and never as the only scope (an omitted scope is the server's
    default)."""
    listed = ("openid", "offline_access", "files:read")
    assert with_offline_access("files:read", listed) == "files:read offline_access"
    assert with_offline_access("files:read offline_access", listed) == "files:read offline_access"
    assert with_offline_access("files:read", ("files:read", "files:write")) == "files:read"
    assert with_offline_access("files:read", ()) == "files:read"
    assert with_offline_access(None, listed) is None
    # a step-up's union keeps it (the wider login asks for a refresh token too)
    assert union("files:read offline_access", "files:write") == "files:read offline_access files:write"
