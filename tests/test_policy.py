"""The Rule of Two and the trust policy (pure), and the MCP session helpers (fake session)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from mcpcreds.errors import Forbidden
from mcpcreds.policy import (
    TrustPolicy,
    check_rule_of_two,
    check_tool_call,
    find_trifecta,
    list_allowed_tools,
    trifecta_message,
    visible_tools,
)

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
    with pytest.raises(ValueError, match="unknown trust 'yolo'"):
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


# ---------------------------------------------------------------------------- MCP helpers


@dataclass
class FakeTool:
    name: str


@dataclass
class FakeResult:
    tools: list[FakeTool]
    next_cursor: str | None = None


class FakeSession:
    """Duck-typed like mcp.ClientSession: list_tools(params=...) with cursor pagination."""

    def __init__(self, pages: list[list[str]]) -> None:
        self.pages = pages
        self.calls: list[Any] = []

    async def list_tools(self, *, params: Any = None) -> FakeResult:
        self.calls.append(params)
        index = 0 if params is None else int(params.cursor)
        nxt = str(index + 1) if index + 1 < len(self.pages) else None
        return FakeResult([FakeTool(n) for n in self.pages[index]], nxt)


async def test_list_allowed_tools_filters_the_session_tools() -> None:
    session = FakeSession([["read", "write", "delete"]])
    tools = await list_allowed_tools(session, TrustPolicy("untrusted", tool_allowlist=("read", "delete")))
    assert [t.name for t in tools] == ["read", "delete"]
    assert all(isinstance(t, FakeTool) for t in tools)  # the session's own objects come back


async def test_list_allowed_tools_follows_pages() -> None:
    session = FakeSession([["read"], ["write"], ["delete"]])
    tools = await list_allowed_tools(session, TrustPolicy("trusted"))
    assert [t.name for t in tools] == ["read", "write", "delete"]
    assert [getattr(p, "cursor", None) for p in session.calls] == [None, "1", "2"]


async def test_list_allowed_tools_default_policy_shows_nothing() -> None:
    assert await list_allowed_tools(FakeSession([TOOLS]), TrustPolicy()) == []


def test_check_tool_call() -> None:
    policy = TrustPolicy("sandboxed", tool_allowlist=("read",))
    check_tool_call(policy, "read")
    with pytest.raises(Forbidden, match="tool 'write' of server 'crm' is not exposed") as info:
        check_tool_call(policy, "write", server="crm")
    assert info.value.details == {"tool": "write"}
    check_tool_call(TrustPolicy("trusted"), "anything")
    with pytest.raises(Forbidden):
        check_tool_call(TrustPolicy(), "read")
