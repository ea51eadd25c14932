"""The stdio relay's policy (exec/stdio_relay.py) and the events route's checks
(exec/stdio_events.py), pure: fail closed on what does not parse, a withheld answer becomes an
error for the request it answered, events bounded and checked before a line is written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcpcreds.config.content import ContentPolicy
from mcpcreds.core.policy import TrustPolicy
from mcpcreds.errors import InvalidRequest
from mcpcreds.exec.stdio_events import MAX_EVENTS, checked_events
from mcpcreds.exec.stdio_relay import BadPolicy, StdioPolicy, policy_of


def relay(trust: str = "untrusted", allow: tuple[str, ...] = ("add",),
          content: ContentPolicy | None = None) -> StdioPolicy:
    return StdioPolicy("e", TrustPolicy(trust, allow), content or ContentPolicy(), lambda: 0.0)


def one(lines: list[bytes]) -> Any:
    assert len(lines) == 1
    return json.loads(lines[0])


def test_a_client_line_that_is_not_json_rpc_is_answered_and_never_reaches_the_server() -> None:
    for line in (b"{not json", b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add","Name":"x"}}',
                 b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"add"}}'):
        out = relay().from_client(line)
        assert out.to_server == [] and one(out.to_client)["error"]["code"] in (-32700, -32600)


def test_a_refused_call_is_answered_and_a_batch_with_one_is_refused_whole() -> None:
    r = relay()
    batch = b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}},' \
            b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"rm"}}]'
    out = r.from_client(batch)
    assert out.to_server == [] and [e["error"]["code"] for e in one(out.to_client)] == [-32600, -32602]
    assert r.take_events() == [{"event": "tool_call", "tool": "add", "status": "refused", "duration_ms": 0},
                               {"event": "tool_call", "tool": "rm", "status": "refused", "duration_ms": 0}]


def test_a_withheld_answer_becomes_an_error_for_its_request() -> None:
    r = relay()
    assert r.from_client(b'{"jsonrpc":"2.0","id":"a","method":"tools/list"}').to_server
    out = r.from_server(b'{"jsonrpc":"2.0","id":"a","result":{"tools":[],"Tools":[]}}')
    answer = one(out.to_client)
    assert answer["id"] == "a" and answer["error"]["data"] == {"code": "upstream_error"}
    assert r.pending == {}


def test_a_tools_list_is_filtered_and_the_servers_elicitation_answered_in_the_clients_place() -> None:
    r = relay("sandboxed")
    r.from_client(b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
    listed = one(r.from_server(b'{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"add"},{"name":"rm"}]}}')
                 .to_client)
    assert [t["name"] for t in listed["result"]["tools"]] == ["add"]
    out = r.from_server(b'{"jsonrpc":"2.0","id":9,"method":"elicitation/create","params":{"message":"pw?"}}')
    assert out.to_client == [] and one(out.to_server) == {"jsonrpc": "2.0", "id": 9,
                                                          "result": {"action": "decline"}}


def test_a_malformed_policy_is_refused() -> None:
    with pytest.raises(BadPolicy):
        policy_of({"trust": "root"})
    good = {"trust": "sandboxed", "tool_allowlist": ["a"], "expected_tools": [],
            "allow_untrusted_without_allowlist": False, "roots": [], "elicitation": False, "media": False,
            "on_injection": "log"}
    assert policy_of(good)[0].tool_allowlist == ("a",)
    with pytest.raises(BadPolicy):
        policy_of({**good, "tool_allowlist": [1]})


@pytest.mark.parametrize("body", [
    {}, {"events": "x"}, {"events": [{"event": "tool_call"}] * (MAX_EVENTS + 1)},
    {"events": [{"event": "tool_call", "tool": "a", "status": "ok", "duration_ms": -1}]},
    {"events": [{"event": "tool_call", "tool": "a\n", "status": "ok", "duration_ms": 1}]},
    {"events": [{"event": "screened", "kind": "media", "found": ["x" * 65]}]},
    {"events": [{"event": "elicitation", "mode": "form", "action": "accepted", "reason": "sandboxed"}]},
    {"events": [{"event": "consent", "by": "me"}]},
    {"events": [{"event": "tool_call", "tool": "a", "status": "ok", "duration_ms": 1, "extra": 1}]},
])
def test_events_out_of_shape_are_refused_whole_and_never_echoed(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as refused:
        checked_events(body)
    assert "x" * 65 not in refused.value.message and "me" not in refused.value.message.split()


def test_events_in_shape_are_written_as_checked() -> None:
    events = checked_events({"events": [
        {"event": "tool_call", "tool": "add", "status": "error:-32602", "duration_ms": 1500},
        {"event": "elicitation", "mode": "url", "action": "declined", "reason": "sandboxed"}]})
    assert events == [("tool_call", {"tool": "add", "status": "error:-32602", "duration": 1.5}),
                      ("elicitation", {"mode": "url", "action": "declined", "reason": "sandboxed"})]


def test_what_a_task_asks_is_judged_and_a_tasks_update_for_what_was_not_shown_refused() -> None:
    """2026-07-28's tasks extension: an entry's task elicitation it may not make is declined to the
    server in a `tasks/update` of the relay's own (in the client's envelope; its answer dropped),
    never shown."""
    r = relay("untrusted", ("survey",), ContentPolicy(elicitation_enabled=False))
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
    get = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "t", "_meta": meta}}
    assert r.from_client(json.dumps(get).encode()).to_server
    asked = {"taskId": "t", "status": "input_required", "resultType": "complete", "inputRequests": {
        "name": {"method": "elicitation/create", "params": {"message": "pw?", "requestedSchema": {}}},
        "model": {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}}}}
    out = r.from_server(json.dumps({"jsonrpc": "2.0", "id": 1, "result": asked}).encode())
    assert list(one(out.to_client)["result"]["inputRequests"]) == ["model"]  # sampling is the client's
    sent = one(out.to_server)
    assert sent["method"] == "tasks/update" and sent["params"]["inputResponses"] == {"name": {"action": "decline"}}
    caps = sent["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]  # as the server saw them
    assert sent["params"]["taskId"] == "t" and caps["extensions"] == {"io.modelcontextprotocol/tasks": {}}
    assert r.from_server(json.dumps({"jsonrpc": "2.0", "id": sent["id"], "result": {}}).encode()).to_client == []
    assert [e["event"] for e in r.take_events()] == ["elicitation"]
    for answered, passes in (({"name": {"action": "accept", "content": {}}}, False), ({"model": {}}, True)):
        update = {"jsonrpc": "2.0", "id": 2, "method": "tasks/update",
                  "params": {"taskId": "t", "inputResponses": answered, "_meta": meta}}
        relayed = r.from_client(json.dumps(update).encode())
        assert bool(relayed.to_server) is passes
        if not passes:
            assert one(relayed.to_client)["error"]["code"] == -32602


SAMPLE: Any = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}}
META: Any = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
             "io.modelcontextprotocol/clientCapabilities": {"sampling": {}, "roots": {}}}


@pytest.mark.parametrize(("trust", "content", "reason"), [
    ("sandboxed", ContentPolicy(), "sandboxed"),
    ("untrusted", ContentPolicy(sampling_enabled=False), "sampling_enabled")])
def test_a_sampling_the_entry_may_not_make_never_reaches_the_client(trust: str, content: ContentPolicy,
                                                                  reason: str) -> None:
    """Undeclared to the server, refused with an error when it asks anyway (2025), and in 2026-07-28
    the client's request whose result asks for it fails, in an input_required result or a task's."""
    r = relay(trust, ("survey",), content)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"sampling": {"tools": {}}, "elicitation": {}},
        "clientInfo": {"name": "c", "version": "1"}}}
    caps = json.loads(r.from_client(json.dumps(init).encode()).to_server[0])["params"]["capabilities"]
    assert "sampling" not in caps and caps["elicitation"] == {}
    out = r.from_server(json.dumps({"jsonrpc": "2.0", "id": 9, **SAMPLE}).encode())
    assert out.to_client == [] and one(out.to_server) == {"jsonrpc": "2.0", "id": 9, "error": {
        "code": -1, "message": "sampling refused by the mcpcreds gateway: this MCP server may not ask the "
                               "client's LLM (sampling_enabled, or a sandboxed server)"}}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "survey", "_meta": META}}
    sent = json.loads(r.from_client(json.dumps(call).encode()).to_server[0])
    assert "sampling" not in sent["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    asked = {"resultType": "input_required", "requestState": "s", "inputRequests": {"m": SAMPLE}}
    out = r.from_server(json.dumps({"jsonrpc": "2.0", "id": 1, "result": asked}).encode())
    failed = one(out.to_client)
    assert failed["id"] == 1 and failed["error"]["data"] == {"policy": "sampling"} and out.to_server == []
    assert "maxTokens" not in json.dumps(failed)
    get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": "t", "_meta": META}}
    r.from_client(json.dumps(get).encode())
    task = {"taskId": "t", "status": "input_required", "inputRequests": {"m": SAMPLE}}
    out = r.from_server(json.dumps({"jsonrpc": "2.0", "id": 2, "result": task}).encode())
    assert one(out.to_client)["error"]["data"] == {"policy": "sampling"} and out.to_server == []
    events = r.take_events()
    assert [e for e in events if e["event"] == "sampling"] == [
        {"event": "sampling", "action": "refused", "reason": reason}] * 3
    assert [e["status"] for e in events if e["event"] == "tool_call"] == ["error:-32000"]


def test_a_sampling_the_entry_may_make_reaches_the_client_as_sent() -> None:
    r = relay("untrusted", ("survey",))
    out = r.from_server(json.dumps({"jsonrpc": "2.0", "id": 9, **SAMPLE}).encode())
    assert one(out.to_client) == {"jsonrpc": "2.0", "id": 9, **SAMPLE} and out.to_server == []
    assert r.take_events() == []


def test_sampling_events_are_checked() -> None:
    assert checked_events({"events": [{"event": "sampling", "action": "refused", "reason": "sandboxed"}]}) == [
        ("sampling", {"action": "refused", "reason": "sandboxed"})]
    with pytest.raises(InvalidRequest):
        checked_events({"events": [{"event": "sampling", "action": "accepted", "reason": "sandboxed"}]})
