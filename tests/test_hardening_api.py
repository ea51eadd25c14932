"""Issue #12, the socket API surface: grant limits, the invalidation cooldown, the grant pause
budget, bounded fields and numbers. The real Api and Broker on a FakeClock, with the fault IdP as
the token endpoint; requests are handed to the Api as the wire layer builds them."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from mcpcreds.broker.broker import Broker
from mcpcreds.config.load import parse_config
from mcpcreds.core.audit import AuditLog
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.http import Request, Response
from mcpcreds.core.metrics import Metrics
from mcpcreds.core.secret import REDACTOR
from mcpcreds.credentials.sources import EnvSource, SecretResolver
from mcpcreds.sidecar.api import Api
from tests.conftest import CANARY
from tests.peers.fault_idp import FaultIdp, fault_idp

PID = 4242
CONFIG = """
[sidecar]
{sidecar}
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:KEY}}}}" }}
[[servers]]
name = "mail"
endpoint = "https://mail.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:KEY}}}}" }}
rate = "10/1s"
[[servers]]
name = "crm"
endpoint = "{base}/mcp"
oauth = {{ client_id = "c", client_secret = "{{{{secret:S}}}}", token_url = "{token_url}" }}
"""


class Harness:
    """An Api over a real Broker on a FakeClock."""

    def __init__(self, idp: FaultIdp, sidecar: str = "", audit: Path | None = None) -> None:
        self.idp = idp
        self.clock = FakeClock()
        text = CONFIG.format(sidecar=sidecar, base=idp.base, token_url=idp.token_url)
        config = parse_config(tomllib.loads(text))
        log = AuditLog(str(audit) if audit else None, self.clock)
        self.broker = Broker(config, SecretResolver([EnvSource({"KEY": CANARY, "S": "client-secret"})]),
                             self.clock, Metrics(), log)
        self.api = Api(self.broker, Metrics(), log)

    async def call(self, method: str, path: str, body: Any = None, grant: str | None = None,
                   raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        request = Request(method, path, "", data, f"Bearer {grant}" if grant else None, os.getuid(), PID)
        result = self.api.handle(request)
        response = result if isinstance(result, Response) else await cast(Awaitable[Response], result)
        answer: dict[str, Any] = json.loads(response.body)  # every answer is valid JSON
        return response.status, answer

    async def ok(self, method: str, path: str, body: Any = None, grant: str | None = None) -> dict[str, Any]:
        status, answer = await self.call(method, path, body, grant)
        assert status == 200, answer
        return answer

    async def aclose(self) -> None:
        await self.broker.aclose()


@pytest.fixture(scope="module")
def idp() -> Iterator[FaultIdp]:
    with fault_idp() as server:
        yield server


@pytest.fixture
async def h(idp: FaultIdp) -> AsyncIterator[Harness]:
    idp.hits.clear()
    harness = Harness(idp)
    yield harness
    await harness.aclose()


# -- grant limits (and grant tokens stay out of the redactor)


async def test_the_configured_grant_limits_apply(idp: FaultIdp) -> None:
    # (the defaults, 64 sub-grants per holder and 10,000 in all, are the grant store's own tests)
    h = Harness(idp, sidecar="max_subgrants = 2\nmax_grants = 4")
    try:
        top = await h.ok("POST", "/v1/grants", {"servers": ["docs"]})
        for _ in range(2):
            await h.ok("POST", "/v1/grants", {"servers": ["docs"]}, top["grant"])
        status, answer = await h.call("POST", "/v1/grants", {"servers": ["docs"]}, top["grant"])
        assert (status, answer["error"]["code"]) == (429, "too_many_grants")
        await h.ok("POST", "/v1/grants", {"servers": ["docs"]})  # the fourth live grant
        status, answer = await h.call("POST", "/v1/grants", {"servers": ["docs"]})
        assert (status, answer["error"]["code"]) == (429, "too_many_grants")
    finally:
        await h.aclose()


async def test_ten_thousand_grants_then_too_many_and_no_grant_token_in_the_redactor(h: Harness) -> None:
    await h.ok("GET", "/v1/servers/docs/headers")
    held = len(REDACTOR)
    tokens = [(await h.ok("POST", "/v1/grants", {"servers": ["docs"]}))["grant"] for _ in range(10_000)]
    status, answer = await h.call("POST", "/v1/grants", {"servers": ["docs"]})
    assert status == 429 and answer["error"]["code"] == "too_many_grants"
    # a grant token is never logged: the redactor neither holds nor scans for it
    assert len(REDACTOR) == held and not any(token in REDACTOR for token in tokens[::100])
    assert (await h.ok("GET", "/v1/servers/docs/headers"))["headers"] == {"X-Api-Key": CANARY}


# -- forced renewals


async def test_an_invalidation_renews_a_login_at_most_once_per_cooldown(h: Harness, idp: FaultIdp) -> None:
    first = await h.ok("GET", "/v1/servers/crm/headers")
    assert await h.ok("POST", "/v1/servers/crm/invalidate", {"fingerprint": first["fingerprint"]}) == {
        "dropped": True, "renewed": True}
    second = await h.ok("GET", "/v1/servers/crm/headers")
    assert second["fingerprint"] != first["fingerprint"] and idp.hits["/token"] == 2
    h.clock.advance(1)
    assert await h.ok("POST", "/v1/servers/crm/invalidate", {"fingerprint": second["fingerprint"]}) == {
        "dropped": False, "renewed": False}
    assert (await h.ok("GET", "/v1/servers/crm/headers"))["fingerprint"] == second["fingerprint"]
    assert idp.hits["/token"] == 2
    # a login already replaced is reported renewed, cooldown or not
    assert await h.ok("POST", "/v1/servers/crm/invalidate", {"fingerprint": first["fingerprint"]}) == {
        "dropped": False, "renewed": True}
    h.clock.advance(4)  # 5 s after the first drop: the cooldown is over
    assert await h.ok("POST", "/v1/servers/crm/invalidate", {"fingerprint": second["fingerprint"]}) == {
        "dropped": True, "renewed": True}
    assert (await h.ok("GET", "/v1/servers/crm/headers"))["fingerprint"] != second["fingerprint"]
    assert idp.hits["/token"] == 3


async def test_an_invalidation_while_the_new_login_is_fetched_reports_renewed(h: Harness) -> None:
    # fifty callers refused with the same login: the first drops it; the others arrive while the
    # new one is fetched (nothing held) and must be told to resend, not handed their 401 back
    first = await h.ok("GET", "/v1/servers/crm/headers")
    assert (await h.ok("POST", "/v1/servers/crm/invalidate", {"fingerprint": first["fingerprint"]}))[
        "renewed"] is True
    assert await h.ok("POST", "/v1/servers/crm/invalidate", {"fingerprint": first["fingerprint"]}) == {
        "dropped": False, "renewed": True}
    assert await h.ok("POST", "/v1/servers/crm/invalidate", {}) == {"dropped": False, "renewed": True}


# -- the grant pause budget


async def test_grant_holders_pause_a_key_for_at_most_the_budget_per_window(h: Harness) -> None:
    grant = await h.ok("POST", "/v1/grants", {"servers": ["mail"]})
    t0 = h.clock.time()
    assert await h.ok("POST", "/v1/servers/mail/backoff", {"retry_after": 300}, grant["grant"]) == {
        "paused_until": t0 + 300}
    h.clock.advance(10)
    # renewing the 300 s pause would extend it by 10 s: past the budget, so it is not extended
    assert await h.ok("POST", "/v1/servers/mail/backoff", {"retry_after": 300}, grant["grant"]) == {
        "paused_until": t0 + 300}
    (row,) = (await h.ok("GET", "/v1/status"))["buckets"]
    assert row["paused_by"] == {"uid": os.getuid(), "pid": PID, "grant": grant["id"]}
    # a caller without a grant is not bounded
    assert await h.ok("POST", "/v1/servers/mail/backoff", {"retry_after": 400}) == {"paused_until": t0 + 410}
    (row,) = (await h.ok("GET", "/v1/status"))["buckets"]
    assert row["paused_by"] == {"uid": os.getuid(), "pid": PID, "grant": None}
    h.clock.advance(900)  # a new window
    assert await h.ok("POST", "/v1/servers/mail/backoff", {"retry_after": 300}, grant["grant"]) == {
        "paused_until": t0 + 1210}


async def test_a_grant_holders_budget_is_spent_only_by_what_extends_the_pause(h: Harness) -> None:
    grant = await h.ok("POST", "/v1/grants", {"servers": ["mail"]})
    t0 = h.clock.time()
    for step in range(5):  # five children report the same 429: 60 s of pause, counted once
        assert await h.ok("POST", "/v1/servers/mail/backoff", {"retry_after": 60 - step}, grant["grant"]) == {
            "paused_until": t0 + 60}
        h.clock.advance(1)
    h.clock.advance(55)  # t0 + 60: the pause is over
    assert await h.ok("POST", "/v1/servers/mail/backoff", {"retry_after": 300}, grant["grant"]) == {
        "paused_until": t0 + 60 + 240}  # what is left of the 300 s budget


# -- bounded fields and numbers


async def test_oversized_fields_are_refused_and_never_logged(idp: FaultIdp, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    h = Harness(idp, audit=audit)
    try:
        fp = (await h.ok("GET", "/v1/servers/crm/headers"))["fingerprint"]
        for body in ({"fingerprint": "f" * 60_000}, {"fingerprint": fp, "reason": "r" * 60_000},
                     {"fingerprint": fp, "reason": "line\nforged"}, {"fingerprint": fp, "reason": ["a"]}):
            status, answer = await h.call("POST", "/v1/servers/crm/invalidate", body)
            assert status == 400 and answer["error"]["code"] == "invalid_request"
        assert not audit.exists() or audit.read_text() == ""
        body = {"fingerprint": "f" * 128, "reason": "r" * 256}
        assert await h.ok("POST", "/v1/servers/crm/invalidate", body) == {"dropped": False, "renewed": True}
        assert len(audit.read_text()) < 1000
    finally:
        await h.aclose()


@pytest.mark.parametrize(("path", "raw"), [
    ("/v1/servers/crm/invalidate", b'{"reason": NaN}'),
    ("/v1/servers/mail/backoff", b'{"retry_after": Infinity}'),
    ("/v1/servers/mail/backoff", b'{"retry_after": 1e999}'),
    ("/v1/servers/mail/acquire", b'{"max_wait": -Infinity}'),
])
async def test_nan_and_infinity_are_not_json(h: Harness, path: str, raw: bytes) -> None:
    status, answer = await h.call("POST", path, raw=raw)
    assert status == 400 and answer["error"]["message"] == "request body is not valid JSON"


@pytest.mark.parametrize("body", [{"servers": ["docs"], "ttl": 5e-324}, {"servers": ["docs"], "ttl": 0.5},
                                  {"servers": ["docs"] * 1025}])
async def test_grant_numbers_are_in_range(h: Harness, body: dict[str, Any]) -> None:
    status, answer = await h.call("POST", "/v1/grants", body)
    assert status == 400 and answer["error"]["code"] == "invalid_request"


async def test_a_cost_or_wait_is_bounded_and_never_echoed(h: Harness) -> None:
    for body in ({"cost": 10**30}, {"cost": 11}, {"max_wait": 3601}):
        status, answer = await h.call("POST", "/v1/servers/mail/acquire", body)
        assert status == 400, answer
        for number in ("1000000000000000000000000000000", "11", "3601"):
            assert number not in answer["error"]["message"]
    status, answer = await h.call("POST", "/v1/servers/mail/acquire", {"cost": 10, "max_wait": 1234})
    assert status == 200
    status, answer = await h.call("POST", "/v1/servers/mail/acquire", {"cost": 10, "max_wait": 0.5})
    assert status == 429 and "0.5" not in answer["error"]["message"]


async def test_names_outside_the_grammar_are_refused(h: Harness) -> None:
    for path in ("/v1/servers/" + "a" * 129 + "/headers", "/v1/servers/a%20b/headers",
                 "/v1/secrets/a%2Fb/rotated", "/v1/grants/" + "a" * 65):
        method = "DELETE" if path.startswith("/v1/grants/") else ("GET" if path.endswith("headers") else "POST")
        status, answer = await h.call(method, path)
        assert status == 400 and answer["error"]["code"] == "invalid_request", path
