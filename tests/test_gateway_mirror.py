"""The request metadata headers (mcpcreds.protocol.mirror, pure): x-mcp-header annotations read as
the 2026-07-28 transport defines them, and the headers of a POST checked against its body and
derived from it."""

from __future__ import annotations

from typing import Any

import pytest

from mcpcreds.core.http import header_table
from mcpcreds.protocol.mirror import Mismatch, ParamTable, annotated, encode_header_value, mirrors

REGION = {"type": "object", "properties": {
    "region": {"type": "string", "x-mcp-header": "Region"},
    "opts": {"type": "object", "properties": {"shard": {"type": "integer", "x-mcp-header": "Shard"}}},
    "query": {"type": "string"}}}


def modern_call(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "run", "arguments": arguments, "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}


def test_annotations_are_read_by_properties_alone_and_a_broken_one_voids_the_tool() -> None:
    assert [(p.path, p.token, p.integer) for p in annotated(REGION) or ()] == [
        (("region",), "Region", False), (("opts", "shard"), "Shard", True)]
    for broken in (
        {"type": "object", "properties": {"a": {"type": "number", "x-mcp-header": "A"}}},  # not a primitive kept
        {"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": "A B"}}},  # not a token
        {"type": "object", "properties": {"a": {"type": "string", "x-mcp-header": "A"},
                                          "b": {"type": "string", "x-mcp-header": "a"}}},  # not unique
        {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "x-mcp-header": "A"}}}},
        {"type": "object", "oneOf": [{"properties": {"a": {"type": "string", "x-mcp-header": "A"}}}]},
    ):
        assert annotated(broken) is None, broken


def test_a_2026_request_gets_every_header_from_its_body() -> None:
    table = ParamTable()
    table.learn("s", [{"name": "run", "inputSchema": REGION}])
    out = mirrors(modern_call({"region": "日本", "opts": {"shard": 7}, "query": "q"}), header_table([]), table.of("s", "run"))
    assert dict(out.add) == {b"mcp-protocol-version": b"2026-07-28", b"mcp-method": b"tools/call",
                             b"mcp-name": b"run", b"mcp-param-Region": encode_header_value("日本"),
                             b"mcp-param-Shard": b"7"}
    assert out.drop == {b"mcp-protocol-version", b"mcp-param-region", b"mcp-param-shard"}
    # what agrees passes (an integer compared by value), and is still sent as derived
    said = [(b"Mcp-Param-Shard", b"7.0"), (b"MCP-Protocol-Version", b"2026-07-28"), (b"Mcp-Name", b"run")]
    assert mirrors(modern_call({"region": "x", "opts": {"shard": 7}}), header_table(said), table.of("s", "run")).add


@pytest.mark.parametrize("said", [
    [(b"mcp-method", b"tools/list")], [(b"mcp-name", b"other")], [(b"mcp-param-region", b"eu")],
    [(b"mcp-param-shard", b"8")], [(b"mcp-protocol-version", b"2025-11-25")],
    [(b"mcp-method", b"tools/call"), (b"mcp-method", b"tools/call")],  # twice: one too many
])
def test_a_header_the_body_contradicts_is_refused(said: list[tuple[bytes, bytes]]) -> None:
    table = ParamTable()
    table.learn("s", [{"name": "run", "inputSchema": REGION}])
    with pytest.raises(Mismatch):
        mirrors(modern_call({"region": "us", "opts": {"shard": 7}}), header_table(said), table.of("s", "run"))


def test_a_2025_request_gets_only_what_its_client_sent_and_an_unknown_tool_nothing_more() -> None:
    legacy = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run"}}
    assert mirrors(legacy, header_table([])).add == ()
    assert dict(mirrors(legacy, header_table([(b"mcp-method", b"tools/call")])).add) == {b"mcp-method": b"tools/call",
                                                                         b"mcp-name": b"run"}
    unknown = mirrors(modern_call({"region": "us"}), header_table([(b"mcp-param-region", b"anything")]))
    assert b"mcp-param-region" not in unknown.drop  # not the gateway's to judge: it goes on as sent
    table = ParamTable(limit=1)
    table.learn("s", [{"name": "run", "inputSchema": REGION}, {"name": "two", "inputSchema": REGION}])
    assert len(table) == 1 and table.of("s", "run") == ()
    table.learn("s", [{"name": "two", "inputSchema": {"type": "object"}}])  # listed again without: forgotten
    assert table.of("s", "two") == ()


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_a_task_method_names_its_task_in_mcp_name(method: str) -> None:
    """The tasks extension's routing header: `Mcp-Name` is the task's id."""
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {
        "taskId": "t-1", "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}
    assert dict(mirrors(message, header_table([])).add)[b"mcp-name"] == b"t-1"
    assert mirrors(message, header_table([(b"Mcp-Name", b"t-1"), (b"Mcp-Method", method.encode())])).add  # as a client sends it
    with pytest.raises(Mismatch):
        mirrors(message, header_table([(b"Mcp-Name", b"t-2")]))
