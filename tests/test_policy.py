"""The Rule of Two and the trust policy (pure), and the MCP session helpers on real MCP sessions:
the real MCP server peer (tools/list over Streamable HTTP, behind OAuth), and an in-process SDK
server that pages."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types
import pytest
from mcp.client import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server

from mcpcreds.core.policy import (
    MAX_TOOL_PAGES,
    TrustPolicy,
    check_rule_of_two,
    check_tool_call,
    find_trifecta,
    intersect_patterns,
    list_allowed_tools,
    matches_any,
    trifecta_message,
    visible_tools,
)
from mcpcreds.errors import Forbidden
from tests.conftest import CANARY, module_peer
from tests.peers.mcp_server import McpServerPeer
from tests.peers.oidc_peer import OidcPeer
from tests.test_mcp_sdk_e2e import mcp1_python

__all__ = ["mcp1_python"]  # the fixture (the side venv with the MCP SDK 1.x), imported to be used here

U, S, E = "untrusted_input", "sensitive", "egress"


# ---------------------------------------------------------------------------- Rule of Two


def test_trifecta_from_three_servers() -> None:
    servers = {"web": frozenset({U}), "crm": frozenset({S}), "mail": frozenset({E})}
    assert find_trifecta(servers) == ("web", "crm", "mail")


def test_no_trifecta_when_a_tag_is_missing() -> None:
    assert find_trifecta({"crm": frozenset({S}), "mail": frozenset({E})}) is None
    assert find_trifecta({"web": frozenset({U}), "crm": frozenset({S})}) is None
    assert find_trifecta({}) is None


def test_untagged_server_counts_as_untrusted_input() -> None:
    servers = {"docs": frozenset(), "crm": frozenset({S}), "mail": frozenset({E})}
    assert find_trifecta(servers) == ("docs", "crm", "mail")
    # an explicitly tagged server is not untrusted input
    assert find_trifecta({"crm": frozenset({S}), "mail": frozenset({E})}) is None


def test_one_server_may_fill_several_places() -> None:
    assert find_trifecta({"all": frozenset({U, S, E})}) == ("all", "all", "all")
    assert find_trifecta({"a": frozenset({U, S}), "b": frozenset({E})}) == ("a", "a", "b")


def test_choice_is_deterministic_first_by_name() -> None:
    servers = {"z-web": frozenset({U}), "a-web": frozenset({U}), "m-crm": frozenset({S}),
               "b-crm": frozenset({S}), "mail": frozenset({E, U})}
    assert find_trifecta(servers) == ("a-web", "b-crm", "mail")
    assert find_trifecta(dict(reversed(list(servers.items())))) == ("a-web", "b-crm", "mail")


def test_trifecta_message() -> None:
    assert trifecta_message(("web", "crm", "mail")) == (
        "grant would give one agent untrusted input (web), sensitive data (crm) and egress (mail): "
        "the Rule of Two forbids all three")


def test_check_rule_of_two() -> None:
    servers = {"web": frozenset({U}), "crm": frozenset({S}), "mail": frozenset({E})}
    with pytest.raises(Forbidden) as info:
        check_rule_of_two(servers)
    assert info.value.message == trifecta_message(("web", "crm", "mail"))
    assert info.value.to_wire()["error"]["code"] == "forbidden"
    assert check_rule_of_two(servers, allow_trifecta=True) == trifecta_message(("web", "crm", "mail"))
    assert check_rule_of_two({"crm": frozenset({S})}) is None


# ---------------------------------------------------------------------------- trust table

TOOLS = ["read", "write", "delete"]


def test_trusted_exposes_every_tool() -> None:
    d = visible_tools("trusted", TOOLS)
    assert d.tools == TOOLS and d.hidden == [] and d.warnings == []
    # an allowlist does not narrow a trusted server (seed semantics)
    assert visible_tools("trusted", TOOLS, tool_allowlist=["read"]).tools == TOOLS


def test_untrusted_without_allowlist_fails_closed() -> None:
    d = visible_tools("untrusted", TOOLS)
    assert d.tools == [] and d.hidden == TOOLS
    assert any("fail closed" in w for w in d.warnings)


def test_untrusted_escape_hatch_exposes_all_with_a_warning() -> None:
    d = visible_tools("untrusted", TOOLS, allow_untrusted_without_allowlist=True)
    assert d.tools == TOOLS
    assert any("allow_untrusted_without_allowlist" in w for w in d.warnings)


def test_untrusted_with_allowlist() -> None:
    d = visible_tools("untrusted", TOOLS, tool_allowlist=["read", "missing"])
    assert d.tools == ["read"] and d.hidden == ["write", "delete"]
    # the escape hatch does not widen a declared allowlist
    d = visible_tools("untrusted", TOOLS, tool_allowlist=["read"], allow_untrusted_without_allowlist=True)
    assert d.tools == ["read"]


def test_untrusted_with_empty_allowlist_exposes_nothing() -> None:
    d = visible_tools("untrusted", TOOLS, tool_allowlist=[], allow_untrusted_without_allowlist=True)
    assert d.tools == []
    assert any("empty tool_allowlist" in w for w in d.warnings)


def test_sandboxed_only_allowlisted() -> None:
    assert visible_tools("sandboxed", TOOLS, tool_allowlist=["write"]).tools == ["write"]
    assert visible_tools("sandboxed", TOOLS).tools == []
    assert visible_tools("sandboxed", TOOLS, tool_allowlist=[]).tools == []


def test_sandboxed_never_honours_the_escape_hatch() -> None:
    d = visible_tools("sandboxed", TOOLS, allow_untrusted_without_allowlist=True)
    assert d.tools == []
    assert any("ignored for a sandboxed server" in w for w in d.warnings)


@pytest.mark.parametrize("trust", ["untrusted", "sandboxed"])
def test_expected_tools_filter_untrusted_and_sandboxed(trust: str) -> None:
    d = visible_tools(trust, TOOLS, tool_allowlist=["read", "delete"], expected_tools=["read", "write"])
    assert d.tools == ["read"]  # delete is allowlisted but not expected
    assert any("not in expected_tools, hidden: delete" in w for w in d.warnings)


def test_expected_tools_filter_the_escape_hatch_too() -> None:
    d = visible_tools("untrusted", TOOLS, expected_tools=["read"], allow_untrusted_without_allowlist=True)
    assert d.tools == ["read"]


def test_expected_tools_only_warn_for_trusted() -> None:
    d = visible_tools("trusted", TOOLS, expected_tools=["read", "write", "search"])
    assert d.tools == TOOLS
    assert "tools not in expected_tools, exposed anyway (trusted): delete" in d.warnings
    assert "expected tools the server does not offer: search" in d.warnings


def test_empty_expected_tools_means_no_attestation() -> None:
    assert visible_tools("trusted", TOOLS, expected_tools=[]).warnings == []
    assert visible_tools("untrusted", TOOLS, tool_allowlist=TOOLS, expected_tools=[]).tools == TOOLS


def test_duplicate_tools_and_order() -> None:
    assert visible_tools("trusted", ["b", "a", "b"]).tools == ["b", "a"]


def test_unknown_trust() -> None:
    with pytest.raises(ValueError, match="unknown trust: expected one of"):
        visible_tools("yolo", TOOLS)
    with pytest.raises(ValueError, match="unknown trust"):
        TrustPolicy(trust="Trusted")


def test_trust_policy_defaults_to_untrusted_and_fails_closed() -> None:
    policy = TrustPolicy()
    assert policy.trust == "untrusted"
    assert policy.filter(TOOLS).tools == []
    assert not policy.allows("read")


def test_trust_policy_normalises_lists_and_filters() -> None:
    policy = TrustPolicy(trust="untrusted", tool_allowlist=["read"], expected_tools=["read"])  # type: ignore[arg-type]
    assert policy.tool_allowlist == ("read",) and policy.expected_tools == ("read",)
    assert policy.filter(TOOLS).tools == ["read"]
    assert policy.allows("read") and not policy.allows("write")
    hash(policy)  # frozen and hashable: usable as a cache key


@pytest.mark.parametrize("policy", [
    TrustPolicy("trusted"),
    TrustPolicy("trusted", expected_tools=("read",)),
    TrustPolicy("untrusted"),
    TrustPolicy("untrusted", allow_untrusted_without_allowlist=True),
    TrustPolicy("untrusted", tool_allowlist=("read", "delete"), expected_tools=("read",)),
    TrustPolicy("sandboxed", tool_allowlist=("write",)),
    TrustPolicy("sandboxed", allow_untrusted_without_allowlist=True),
])
def test_allows_agrees_with_filter(policy: TrustPolicy) -> None:
    shown = policy.filter(TOOLS).tools
    assert [t for t in TOOLS if policy.allows(t)] == shown


NAMES = ["read", "read_file", "read_secrets", "readme", "write", "write_all", "ask", "ask_url", "x"]


@pytest.mark.parametrize("policy", [
    TrustPolicy("trusted"),
    TrustPolicy("trusted", tool_allowlist=("read",), ceiling_allow=(("read*", "ask"),), ceiling_exclude=("readme",)),
    TrustPolicy("untrusted"),
    TrustPolicy("untrusted", allow_untrusted_without_allowlist=True, tool_exclude=("write_*",)),
    TrustPolicy("untrusted", tool_allowlist=("read*", "write"), ceiling_allow=(("read_*", "write*"), ("*",)),
                ceiling_exclude=("read_secrets",)),
    TrustPolicy("untrusted", ceiling_allow=(("ask*", "x"),), tool_exclude=("ask",)),
    TrustPolicy("untrusted", tool_allowlist=("read*",), expected_tools=("read", "readme", "write")),
    TrustPolicy("untrusted", tool_allowlist=("*",), ceiling_allow=((),)),
    TrustPolicy("sandboxed", allow_untrusted_without_allowlist=True),
    TrustPolicy("sandboxed", tool_allowlist=("read", "read_*"), ceiling_allow=(("read_f*",),)),
])
def test_one_allow_list_and_one_exclude_list_admit_what_the_policy_does(policy: TrustPolicy) -> None:
    """`spawn-payload --format agentd` tells a child one `allow` and one `exclude` list: they must
    admit exactly the tools the gateway would, the catalog ceiling and expected_tools included."""
    allow, exclude = policy.exposed_patterns, policy.excluded_patterns
    admitted = [t for t in NAMES if (allow is None or matches_any(allow, t)) and not matches_any(exclude, t)]
    assert admitted == [t for t in NAMES if policy.allows(t)]


def test_pattern_lists_intersect_to_what_both_match() -> None:
    assert intersect_patterns(["read*", "write"], ["read_*", "write*", "ask"]) == ("read_*", "write")
    assert intersect_patterns(["*"], ["a", "b*"]) == ("a", "b*")
    assert intersect_patterns(["a*"], ["b*"]) == ()
    assert intersect_patterns(["read*", "read_x"], ["*"]) == ("read*",)  # read_x is within read*


# ---------------------------------------------------------------------------- MCP helpers


OIDC_CLIENTS: list[dict[str, Any]] = [  # on the shared peer (conftest)
    {"client_id": "agent", "client_secret": CANARY, "token_endpoint_auth_method": "client_secret_basic",
     "scope": "tools:read tools:call"},
]


@pytest.fixture(scope="module")
def mcp_peer(oidc_session: OidcPeer, mcp_server_session: McpServerPeer) -> tuple[McpServerPeer, str]:
    """The real MCP server peer (shared with test_mcp_sdk_e2e, conftest) and a bearer token it
    accepts (from the real oidc-provider)."""
    oidc = module_peer(oidc_session, 600)
    server = mcp_server_session
    response = httpx.post(oidc.token_url, auth=("agent", CANARY), timeout=30, data={
        "grant_type": "client_credentials", "scope": "tools:read tools:call", "resource": server.url})
    response.raise_for_status()
    return server, response.json()["access_token"]


@asynccontextmanager
async def peer_session(peer: tuple[McpServerPeer, str]) -> AsyncIterator[ClientSession]:
    server, token = peer
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        streamable_http_client(server.url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


PEER_POLICIES: list[tuple[TrustPolicy, set[str]]] = [
    (TrustPolicy("trusted"), {"echo", "add"}),
    (TrustPolicy("trusted", expected_tools=("echo",)), {"echo", "add"}),
    (TrustPolicy(), set()),
    (TrustPolicy("untrusted", tool_allowlist=("add", "missing")), {"add"}),
    (TrustPolicy("untrusted", allow_untrusted_without_allowlist=True), {"echo", "add"}),
    (TrustPolicy("untrusted", allow_untrusted_without_allowlist=True, expected_tools=("echo",)), {"echo"}),
    (TrustPolicy("sandboxed", tool_allowlist=("echo",)), {"echo"}),
    (TrustPolicy("sandboxed", allow_untrusted_without_allowlist=True), set()),
]


async def test_policy_on_the_real_peers_tools_list(mcp_peer: tuple[McpServerPeer, str]) -> None:
    """The peer's real `tools/list`: for each policy, `list_allowed_tools` keeps exactly the exposed
    tools, as the SDK's own objects in the server's order, and `check_tool_call` refuses exactly
    the others; an exposed tool, as listed, is callable on the peer."""
    async with peer_session(mcp_peer) as session:
        offered = [tool.name for tool in (await session.list_tools()).tools]
        assert sorted(offered) == ["add", "echo"]
        for policy, expected in PEER_POLICIES:
            allowed = await list_allowed_tools(session, policy)
            assert [tool.name for tool in allowed] == [name for name in offered if name in expected], policy
            assert all(isinstance(tool, mcp_types.Tool) for tool in allowed), policy
            for name in offered:
                if name in expected:
                    check_tool_call(policy, name, server="tools")
                else:
                    with pytest.raises(Forbidden, match=f"tool '{name}' of server 'tools' is not exposed"):
                        check_tool_call(policy, name, server="tools")
        add = next(tool for tool in await list_allowed_tools(session, TrustPolicy("trusted")) if tool.name == "add")
        assert add.description == "Add two integers."
        result = await session.call_tool(add.name, {"a": 2, "b": 3})
        assert not result.is_error and result.structured_content == {"result": 5}


def paging_server(pages: list[list[str]] | None, cursors: list[str | None]) -> Server[Any]:
    """A real SDK server whose `tools/list` answers one page per request (`cursors` records the
    cursor of each request); `pages=None`: a page with one new tool and a next cursor for ever."""
    async def on_list_tools(ctx: Any, params: mcp_types.PaginatedRequestParams | None) -> mcp_types.ListToolsResult:
        cursor = None if params is None else params.cursor
        cursors.append(cursor)
        index = 0 if cursor is None else int(cursor)
        names = [f"tool{index}"] if pages is None else pages[index]
        more = pages is None or index + 1 < len(pages)
        return mcp_types.ListToolsResult(tools=[mcp_types.Tool(name=n, input_schema={"type": "object"})
                                                for n in names], next_cursor=str(index + 1) if more else None)
    return Server("paging", on_list_tools=on_list_tools)


async def test_list_allowed_tools_follows_every_page_of_a_real_session() -> None:
    cursors: list[str | None] = []
    async with Client(paging_server([["read"], ["write", "admin"], ["delete"]], cursors)) as client:
        tools = await list_allowed_tools(client.session, TrustPolicy("untrusted", tool_allowlist=("read", "delete")))
    assert [tool.name for tool in tools] == ["read", "delete"]  # the first page and the last one
    assert cursors == [None, "1", "2"]


async def test_list_allowed_tools_stops_at_the_page_cap_of_an_endless_listing() -> None:
    cursors: list[str | None] = []
    async with Client(paging_server(None, cursors)) as client:
        tools = await asyncio.wait_for(list_allowed_tools(client.session, TrustPolicy("trusted")), 60)
    assert len(cursors) == MAX_TOOL_PAGES and cursors[-1] == str(MAX_TOOL_PAGES - 1)
    assert [tool.name for tool in tools] == [f"tool{i}" for i in range(MAX_TOOL_PAGES)]


# the MCP SDK 1.x (in the side venv of tests/test_mcp_sdk_e2e.py): a real 1.x server that pages,
# in memory, and a real 1.x ClientSession; prints what list_allowed_tools returned
SDK1_PAGING = """
import asyncio, json
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.shared.memory import create_connected_server_and_client_session
from mcpcreds.core.policy import TrustPolicy, list_allowed_tools

PAGES = [["read"], ["write", "admin"], ["delete"]]
cursors = []
server = Server("paging")

@server.list_tools()
async def list_tools(request: types.ListToolsRequest) -> types.ListToolsResult:
    cursor = request.params.cursor if request.params is not None else None
    cursors.append(cursor)
    index = 0 if cursor is None else int(cursor)
    return types.ListToolsResult(tools=[types.Tool(name=n, inputSchema={"type": "object"}) for n in PAGES[index]],
                                 nextCursor=str(index + 1) if index + 1 < len(PAGES) else None)

async def main():
    async with create_connected_server_and_client_session(server) as session:
        tools = await list_allowed_tools(session, TrustPolicy("untrusted", tool_allowlist=("read", "delete")))
    print(json.dumps({"tools": [t.name for t in tools], "cursors": cursors}))

asyncio.run(main())
"""


def test_list_allowed_tools_follows_every_page_of_an_sdk1_session(mcp1_python: Path) -> None:
    proc = subprocess.run([str(mcp1_python), "-c", SDK1_PAGING], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"tools": ["read", "delete"], "cursors": [None, "1", "2"]}


def test_check_tool_call() -> None:
    policy = TrustPolicy("sandboxed", tool_allowlist=("read",))
    check_tool_call(policy, "read")
    with pytest.raises(Forbidden, match="tool 'write' of server 'crm' is not exposed") as info:
        check_tool_call(policy, "write", server="crm")
    assert info.value.details == {"tool": "write"}
    check_tool_call(TrustPolicy("trusted"), "anything")
    with pytest.raises(Forbidden):
        check_tool_call(TrustPolicy(), "read")


def test_hidden_by_names_the_key_that_hides_a_tool() -> None:
    assert TrustPolicy("trusted").hidden_by("anything") is None
    assert TrustPolicy("untrusted").hidden_by("search") == "tool_allowlist"  # none given: none exposed
    assert TrustPolicy("untrusted", ("search",)).hidden_by("search") is None
    assert TrustPolicy("untrusted", ("search",)).hidden_by("delete") == "tool_allowlist"
    assert TrustPolicy("sandboxed", ("search", "get"), ("get",)).hidden_by("search") == "expected_tools"
