"""The parts of grant tool narrowing and live-session counting that need no gateway: the grant
record (in memory and in Redis, old records included), the tool filter and refusals a grant adds
to the trust policy, and the bounded session table."""

from __future__ import annotations

import json
import time
from typing import Any

from mcpcreds.core.policy import TrustPolicy
from mcpcreds.gateway.sessions import LiveSessions
from mcpcreds.protocol import jsonrpc
from mcpcreds.protocol.jsonrpc import Inspector, parse_body
from mcpcreds.state.grants import Grant
from tests.peers.redis_peer import start_redis

TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in ("echo", "add", "delete_all")]
TRUSTED = TrustPolicy("trusted")
ALLOW = TrustPolicy("untrusted", ("echo", "add"))
ONLY_ECHO = frozenset({"echo", "not-offered"})


def read(inspector: Inspector, raw: bytes) -> Any:
    """An answer as the inspector lets it through (it must)."""
    out = inspector.json_body(raw)
    assert out is not None
    return json.loads(out)


def listing(id_: Any, cursor: str | None = "page-2") -> dict[str, Any]:
    result: dict[str, Any] = {"tools": TOOLS}
    if cursor:
        result["nextCursor"] = cursor
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def names(message: dict[str, Any]) -> list[str]:
    return [t["name"] for t in message["result"]["tools"]]


# ---------------------------------------------------------------------------- the record


def test_a_grant_record_keeps_its_tools_and_an_old_record_reads_as_narrowing_none() -> None:
    grant = Grant("g1", ("crm", "docs"), 123.5, "p", ("p",), {"crm": frozenset({"search", "get"})})
    again = Grant.from_json(grant.to_json())
    assert again == grant and again.tools_of("crm") == frozenset({"search", "get"}) and again.tools_of("docs") is None
    assert json.loads(grant.to_json())["tools"] == {"crm": ["get", "search"]}
    old = json.dumps({"id": "g0", "servers": ["crm"], "expires_at": 9.0, "parent": None, "ancestors": []})
    assert Grant.from_json(old) == Grant("g0", ("crm",), 9.0)  # written before grants had tools
    assert "tools" not in json.loads(Grant("g0", ("crm",), 9.0).to_json())  # and still written so
    for bad in ({"crm": "search"}, ["crm"], {"crm": [1]}):
        try:
            Grant.from_json(json.dumps({**json.loads(old), "tools": bad}))
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")


async def test_redis_keeps_a_grants_tools_and_reads_a_record_written_without_them() -> None:
    from mcpcreds.core.clock import SystemClock
    from mcpcreds.state.grants import RedisGrants
    from mcpcreds.state.redis_state import RedisState

    with start_redis() as redis:
        state = RedisState(redis.url, "state-key-for-tests-0123456789")
        grants = RedisGrants(state, SystemClock())
        try:
            narrowed = Grant("n", ("crm",), time.time() + 60, tools={"crm": frozenset({"search"})})
            await grants.put(narrowed, "hash-n")
            assert await grants.get("hash-n") == narrowed
            # a record without "tools", as an older sidecar wrote it (its liveness record is the store's)
            await grants.put(Grant("o", ("crm",), time.time() + 60), "hash-old")
            name = RedisGrants._record("hash-old")
            old = {"id": "o", "servers": ["crm"], "expires_at": time.time() + 60, "parent": None, "ancestors": []}
            await state.redis.set(name, await state.seal("grant", name, json.dumps(old).encode()), keepttl=True)
            found = await grants.get("hash-old")
            assert found is not None and found.id == "o" and found.tools_of("crm") is None
        finally:
            await state.aclose()


# ---------------------------------------------------------------------------- the gateway's filter


def test_a_grant_narrows_tool_listings_to_what_both_allow_in_json_sse_and_every_page() -> None:
    inspector = Inspector(ALLOW, pending={("n", 1): "tools/list"}, granted=ONLY_ECHO)
    page = read(inspector, json.dumps(listing(1)).encode())
    assert names(page) == ["echo"] and page["result"]["nextCursor"] == "page-2"
    last = read(inspector, json.dumps([listing(2, None)]).encode())  # a batch answer
    assert names(last[0]) == ["echo"] and "nextCursor" not in last[0]["result"]
    event = inspector.event(b"id: 3\nevent: message\ndata: " + json.dumps(listing(3)).encode() + b"\n\n")
    assert event.startswith(b"id: 3\n") and names(json.loads(event.split(b"data: ", 1)[1])) == ["echo"]
    assert names(read(Inspector(TRUSTED, granted=frozenset()), json.dumps(listing(4)).encode())) == []
    assert names(read(Inspector(ALLOW), json.dumps(listing(5)).encode())) == ["echo", "add"]


def call(id_: int, tool: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": tool, "arguments": {}}}


def test_a_call_outside_the_grant_is_refused_as_the_policy_refuses_and_never_named() -> None:
    guessed = "ghp_" + "g" * 36
    for tool in ("add", guessed):
        (answer,) = jsonrpc.refusals(parse_body(json.dumps(call(7, tool)).encode()), TRUSTED, "crm", ONLY_ECHO)
        assert answer["id"] == 7 and answer["error"]["code"] == jsonrpc.INVALID_PARAMS
        assert "grant allows on server 'crm'" in answer["error"]["message"]
        assert answer["error"]["data"] == {"policy": "grant"} and guessed not in json.dumps(answer)
    assert jsonrpc.refusals(parse_body(json.dumps(call(1, "echo")).encode()), TRUSTED, "crm", ONLY_ECHO) == []
    batch = parse_body(json.dumps([call(1, "echo"), call(2, "add")]).encode())
    assert [a["error"]["code"] for a in jsonrpc.refusals(batch, TRUSTED, "crm", ONLY_ECHO)] == [
        jsonrpc.INVALID_REQUEST, jsonrpc.INVALID_PARAMS]
    (policy_first,) = jsonrpc.refusals(parse_body(json.dumps(call(3, "delete_all")).encode()), ALLOW, "crm",
                                       frozenset({"delete_all"}))
    assert "trust policy" in policy_first["error"]["message"]  # a grant never widens the policy


# ---------------------------------------------------------------------------- live sessions


ME = (1000, None)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_session_table_is_bounded_expires_idle_entries_and_forgets_ended_sessions() -> None:
    clock = Clock()
    sessions = LiveSessions(clock, limit=3, idle=60)
    for i in range(5):
        clock.now += 1
        sessions.seen("crm", b"s%d" % i, ME)
    assert sessions.by_server() == {"crm": (3, 2.0)}  # the two least recently seen went
    sessions.used("crm", b"made-up", ME)  # a request's id no answer carried adds nothing
    sessions.seen("docs", b"s4", ME)  # one id on two servers: two sessions (and s2 goes: the limit)
    sessions.ended("crm", b"s4")
    assert sessions.by_server() == {"crm": (1, 1.0), "docs": (1, 0.0)}
    clock.now += 59
    sessions.used("crm", b"s3", ME)  # traffic keeps a session
    clock.now += 2
    assert sessions.by_server() == {"crm": (1, 62.0)}  # docs was idle for 61 s
    assert len(sessions._seen) == 1 and all(b"s3" not in key[1] for key in sessions._seen)  # a digest, not the id
