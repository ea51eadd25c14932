"""Issue #12, redaction: the redactor holds only live values and is bounded; a redaction never
breaks JSON; a name the caller sent is never echoed (a masked echo is an oracle for secrets);
every answer built from dynamic data is masked."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from mcpcreds.core.audit import AuditLog
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.logs import JsonFormatter
from mcpcreds.core.secret import REDACTED, REDACTOR, Redactor
from tests.conftest import CANARY
from tests.peers.fault_idp import FaultIdp, fault_idp
from tests.test_hardening_api import Harness

# values that are JSON syntax: masking them in serialised text would break it
SYNTAX: tuple[str, ...] = ('":{"', '", "', '","id"', '"}}')


@pytest.fixture(scope="module")
def idp() -> Iterator[FaultIdp]:
    with fault_idp() as server:
        yield server


@pytest.fixture
async def h(idp: FaultIdp) -> AsyncIterator[Harness]:
    idp.mode = "ok"
    harness = Harness(idp)
    yield harness
    await harness.aclose()


@pytest.fixture
def syntax_secrets() -> Iterator[None]:
    for i, value in enumerate(SYNTAX):
        REDACTOR.add(value, owner=f"test:syntax{i}")
    yield
    for i in range(len(SYNTAX)):
        REDACTOR.forget(f"test:syntax{i}")


# -- the redactor


def test_an_owner_holds_one_value_and_forgets_the_one_it_replaced() -> None:
    r = Redactor()
    r.add("first-value", owner="secret:A")
    r.add("second-value", owner="secret:A")
    r.add("other-value", owner="secret:B")
    assert r.redact("first-value second-value other-value") == f"first-value {REDACTED} {REDACTED}"
    assert "first-value" not in r and len(r) == 2
    r.add("x", owner="secret:A")  # too short to mask, but the old value is not live any more
    assert "second-value" not in r and len(r) == 1


def test_a_text_masked_before_is_masked_again_by_the_values_held_now() -> None:
    """Texts are kept with their masked form (a log or audit line repeats its names); a value
    added or forgotten since is never answered from what was kept."""
    r = Redactor()
    r.add("older-value", owner="secret:A")
    line = "server=bench key=newer-value other=older-value"
    assert r.redact(line) == f"server=bench key=newer-value other={REDACTED}"
    assert r.redact(line) == f"server=bench key=newer-value other={REDACTED}"  # kept
    r.add("newer-value", owner="secret:B")
    assert r.redact(line) == f"server=bench key={REDACTED} other={REDACTED}"
    r.forget("secret:A")
    assert r.redact(line) == f"server=bench key={REDACTED} other=older-value"


def test_a_value_is_masked_throughout_its_claim_by_an_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token is added without an owner when it is read, then claimed by its login. The claim let
    the value go before holding it again; a log line masked on another thread in between (here:
    while the claim writes the value's JSON spellings) showed the token."""
    import types

    from mcpcreds.core import secret

    r = Redactor()
    r.add("token-being-claimed")
    during: list[str] = []

    def dumps(value: object, **kwargs: object) -> str:
        during.append(r.redact("x token-being-claimed y"))
        return json.dumps(value, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(secret, "json", types.SimpleNamespace(dumps=dumps))
    r.add("token-being-claimed", owner="login:k")
    assert during and set(during) == {f"x {REDACTED} y"}
    assert r.redact("token-being-claimed") == REDACTED and len(r) == 1


def test_a_value_added_without_an_owner_is_claimed_by_one() -> None:
    r = Redactor()
    r.add("token-one")  # as the token parser does, before the token is served
    r.add("token-one", owner="login:k")
    assert len(r) == 1
    r.add("token-one")  # held by its owner: nothing to add
    r.add("token-two", owner="login:k")
    assert "token-one" not in r and r.redact("token-one token-two") == f"token-one {REDACTED}"


def test_the_redactor_is_bounded_and_forgets_the_least_recently_added_first() -> None:
    r = Redactor(limit=3)
    for name in ("a", "b", "c"):
        r.add(f"value-{name}", owner=name)
    r.add("value-a", owner="a")  # used again: now the most recent
    r.add("value-d", owner="d")
    assert len(r) == 3 and "value-b" not in r
    assert r.redact("value-a value-b value-c value-d") == f"{REDACTED} value-b {REDACTED} {REDACTED}"


def test_masking_among_thousands_of_values_finds_each_and_masks_the_longest_whole() -> None:
    r = Redactor()
    values = [f"tok-{i:05d}-{'x' * (i % 7)}" for i in range(4000)]
    for i, value in enumerate(values):
        r.add(value, owner=f"login:{i}")
    r.add("tok-00001-x-and-more", owner="longer")  # contains values[1]
    assert len(r) == 4001
    text = f"a {values[3999]} b tok-00001-x-and-more c {values[0]}"
    assert r.redact(text) == f"a {REDACTED} b {REDACTED} c {REDACTED}"


def test_redact_json_masks_inside_strings_only() -> None:
    from mcpcreds.core.secret import redact_json

    data = {"error": {"code": "x", "message": 'it said ":{" and left', '":{"': [1, None, True, '":{"']}}
    REDACTOR.add('":{"', owner="test:redact_json")
    try:
        masked = redact_json(data)
    finally:
        REDACTOR.forget("test:redact_json")
    assert masked == {"error": {"code": "x", "message": f"it said {REDACTED} and left",
                                REDACTED: [1, None, True, REDACTED]}}


# -- JSON that stays JSON


async def test_a_failed_rotation_does_not_register_its_value_or_break_error_bodies(h: Harness) -> None:
    # nothing can test KEY (a static header): without force the rotation fails, nothing stored
    status, answer = await h.call("POST", "/v1/secrets/KEY/rotate", {"value": '":{"'})
    assert status == 400 and answer["error"]["code"] == "invalid_request"
    assert '":{"' not in REDACTOR
    status, answer = await h.call("GET", "/v1/servers/nope/headers")  # Harness.call parses the body
    assert status == 404 and answer["error"]["code"] == "unknown_server"


async def test_bodies_logs_and_audit_lines_stay_json_whatever_is_registered(
        h: Harness, syntax_secrets: None, tmp_path: Path) -> None:
    for method, path in (("GET", "/v1/servers/nope/headers"), ("GET", "/v1/status"), ("GET", "/v1/servers"),
                         ("POST", "/v1/secrets/KEY/rotated"), ("POST", "/v1/grants")):
        await h.call(method, path, {"servers": ["docs"]} if path == "/v1/grants" else None)
    record = logging.LogRecord("mcpcreds.test", logging.INFO, __file__, 1, "event", (), None)
    record.__dict__.update({"key": "service:crm", "nested": {"id": 1, "x": "y"}})
    assert json.loads(JsonFormatter().format(record))["nested"] == {"id": 1, "x": "y"}
    audit = AuditLog(str(tmp_path / "audit.jsonl"), FakeClock())
    audit.write("grant", id="abc", servers=["docs"], nested={"a": {"b": "c"}})
    audit.close()
    assert json.loads((tmp_path / "audit.jsonl").read_text())["nested"] == {"a": {"b": "c"}}


# -- no oracle: a name the caller sent is never echoed


async def test_an_unknown_name_is_never_echoed(h: Harness) -> None:
    await h.ok("GET", "/v1/servers/docs/headers")  # CANARY is now a live, masked value
    guess = quote(CANARY)
    grant = (await h.ok("POST", "/v1/grants", {"servers": ["docs"]}))["grant"]
    for method, path, body, bearer in (
            ("GET", f"/v1/servers/{guess}/headers", None, None),
            ("POST", f"/v1/servers/{guess}/acquire", None, None),
            ("PUT", f"/v1/servers/{guess}/headers", None, None),
            ("POST", f"/v1/secrets/{guess}/rotated", None, None),
            ("POST", f"/v1/secrets/{guess}/rotate", {"value": "new-value", "force": True}, None),
            ("DELETE", f"/v1/grants/{guess}", None, None),
            ("GET", f"/v1/{guess}", None, None),
            ("POST", "/v1/grants", {"servers": [CANARY]}, None),
            ("POST", f"/v1/secrets/{guess}/rotated", None, grant),
    ):
        status, answer = await h.call(method, path, body, bearer)
        assert status in (403, 404, 405), (path, answer)
        assert REDACTED not in answer["error"]["message"] and CANARY not in answer["error"]["message"], path


# -- every answer masked


async def test_status_and_the_rotated_failures_are_masked(h: Harness, idp: FaultIdp) -> None:
    idp.mode = "invalid_client"
    status, _ = await h.call("GET", "/v1/servers/crm/headers")
    assert status == 502
    # an IdP's error text that holds a live value (here, one made so) never leaves unmasked
    REDACTOR.add("invalid_client", owner="test:idp-error")
    try:
        logins = (await h.ok("GET", "/v1/status"))["logins"]
        failed = (await h.ok("POST", "/v1/secrets/S/rotated"))["failed"]
    finally:
        REDACTOR.forget("test:idp-error")
    assert [row["last_error"] for row in logins] == [REDACTED]
    assert failed == {"mcp:crm": REDACTED}


async def test_a_renewed_access_token_is_forgotten(h: Harness) -> None:
    first = await h.ok("GET", "/v1/servers/crm/headers")
    token = first["headers"]["Authorization"].removeprefix("Bearer ")
    assert token in REDACTOR
    await h.ok("POST", "/v1/servers/crm/invalidate", {"fingerprint": first["fingerprint"]})
    second = await h.ok("GET", "/v1/servers/crm/headers")
    assert second["headers"]["Authorization"].removeprefix("Bearer ") in REDACTOR
    assert token not in REDACTOR
