"""What the `[services]` catalog holds over every server, hand-written configs included: the tag
floor (a server whose endpoint is under a catalog entry's carries its tags, key, bucket and tool
ceiling, whether it names the entry or restates its URL), tool patterns (`prefix*`) and
`tool_exclude`, and closed egress (`[sidecar] egress = "closed"`)."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from typing import Any

import pytest

from mcpcreds.config.catalog import covering, place, refuse_uncovered, under
from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Config
from mcpcreds.core.policy import TrustPolicy, find_trifecta, patterns_cover, tool_pattern_problem
from mcpcreds.errors import ConfigError, Forbidden
from mcpcreds.sidecar.api import grant_tools
from mcpcreds.state.grants import Grant

CATALOG = """
[services.crm]
endpoint = "https://crm.example.com/mcp"
headers = { "Authorization" = "Bearer {{secret:CRM_TOKEN}}" }
tags = ["sensitive", "egress"]
rate = "5/1m"
tool_allowlist = ["read_*", "search"]
tool_exclude = ["read_secrets"]
"""


def config(text: str) -> Config:
    return parse_config(tomllib.loads(text))


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        config(text)
    return refused.value.errors


def server(name: str, endpoint: str, extra: str = "") -> str:
    return f'\n[[servers]]\nname = "{name}"\nendpoint = "{endpoint}"\n{extra}\n'


# ---------------------------------------------------------------------------- where a URL is


@pytest.mark.parametrize(("url", "covered"), [
    ("https://crm.example.com/mcp", True),
    ("https://crm.example.com/mcp/", True),
    ("https://crm.example.com/mcp/v2", True),
    ("https://CRM.Example.com.:443/MCP/v2?tenant=a", True),  # host case, trailing dot, default port, path case
    ("https://crm.example.com//mcp/./v2", True),  # empty and `.` segments
    ("https://crm.example.com/%6Dcp/v2", True),  # a percent-encoded letter
    ("https://crm.example.com/x/../mcp", True),
    ("https://crm.example.com/mcpx", False),  # not at a segment boundary
    ("https://crm.example.com/", False),
    ("https://crm.example.com:8443/mcp", False),  # another port
    ("http://crm.example.com/mcp", False),  # another scheme
    ("https://other.example.com/mcp", False),
])
def test_a_url_is_under_an_entry_at_a_segment_boundary(url: str, covered: bool) -> None:
    entry = place("https://crm.example.com/mcp")
    at = place(url)
    assert entry is not None and at is not None
    assert under(entry, at) is covered


def test_an_entry_at_the_root_covers_its_whole_host() -> None:
    services = config(CATALOG + '\n[services.all]\nendpoint = "https://crm.example.com"\n').services
    assert [t.key for t in covering(services, "https://crm.example.com/mcp/v2")] == ["service:crm", "service:all"]
    assert [t.key for t in covering(services, "https://crm.example.com/other")] == ["service:all"]


# ---------------------------------------------------------------------------- the tag floor


def test_restating_an_entrys_url_inline_keeps_its_tags_key_and_bucket() -> None:
    """A server that restates the catalog URL (here a path below it, spelt differently) with a
    harmless-looking tag is still the entry's: its tags, its cache key, its bucket."""
    loaded = config(CATALOG + server("inline", "https://CRM.example.com:443/mcp/v2",
                                     'tags = ["untrusted_input"]\nheaders = { "X-Api-Key" = "{{secret:K}}" }'))
    inline = loaded.servers["inline"]
    assert inline.key == "service:crm"
    assert inline.tags >= {"sensitive", "egress", "untrusted_input"}
    assert inline.rate == loaded.services["service:crm"].rate
    assert inline.spec.service == "crm" and set(inline.spec.tags) >= {"sensitive", "egress"}
    assert any("servers[0]: its endpoint is under [services.crm]'s" in w for w in loaded.warnings)
    assert loaded.rates["service:crm"] == loaded.services["service:crm"].rate
    # one server now holds untrusted input, sensitive data and egress: the trifecta
    assert find_trifecta({"inline": inline.tags}) == ("inline", "inline", "inline")


def test_a_server_beside_the_entry_is_not_floored() -> None:
    loaded = config(CATALOG + server("near", "https://crm.example.com/mcpx", 'tags = ["untrusted_input"]'))
    near = loaded.servers["near"]
    assert near.key == "mcp:near" and near.tags == frozenset({"untrusted_input"})
    assert not loaded.warnings or not any("[services.crm]" in w for w in loaded.warnings)


def test_a_floored_server_may_not_bring_its_own_login_or_rate() -> None:
    found = errors(CATALOG + server("inline", "https://crm.example.com/mcp", """rate = "100/1s"
oauth = { token_url = "https://auth.example.com/token", client_id = "x", client_secret = "{{secret:S}}" }
"""))
    assert any(e.startswith("servers[0].oauth: its endpoint is under [services.crm]'s") for e in found)
    assert any(e.startswith("servers[0].rate: its endpoint is under [services.crm]'s") for e in found)
    # the entry's own rate, restated, is no escape and no error
    assert config(CATALOG + server("inline", "https://crm.example.com/mcp", 'rate = "5/1m"')).servers


def test_a_referencing_server_also_carries_the_tags_of_an_entry_over_its_own() -> None:
    loaded = config(CATALOG + '\n[services.host]\nendpoint = "https://crm.example.com"\ntags = ["untrusted_input"]\n'
                    '\n[[servers]]\nname = "ro"\nservice = "crm"\ntool_allowlist = ["read_*"]\n')
    ro = loaded.servers["ro"]
    assert ro.key == "service:crm" and ro.tags == frozenset({"sensitive", "egress", "untrusted_input"})


# ---------------------------------------------------------------------------- tool patterns and the ceiling


@pytest.mark.parametrize(("pattern", "problem"), [
    ("read_file", None), ("read_*", None), ("*", None),
    ("re*d", "a pattern takes one `*`, at its end (`prefix*`)"),
    ("**", "a pattern takes one `*`, at its end (`prefix*`)"),
    ("", "expected a tool name or `prefix*` pattern of 1 to 128 printable characters"),
])
def test_a_tool_pattern_is_a_name_or_a_prefix(pattern: str, problem: str | None) -> None:
    assert tool_pattern_problem(pattern) == problem


def test_patterns_and_exclude_decide_what_a_server_exposes() -> None:
    tools = ["read_file", "read_secrets", "write_file", "search"]
    policy = TrustPolicy("untrusted", ("read_*", "search"), tool_exclude=("read_secrets",))
    assert policy.filter(tools).tools == ["read_file", "search"]
    assert policy.hidden_by("read_secrets") == "tool_exclude" and policy.hidden_by("write_file") == "tool_allowlist"
    # an exclude holds whatever the trust
    assert TrustPolicy("trusted", tool_exclude=("write_*",)).filter(tools).tools == ["read_file", "read_secrets",
                                                                                    "search"]


def test_a_catalog_entrys_lists_are_a_ceiling_no_server_widens() -> None:
    """A server naming the entry with a wider allowlist, or as trusted, still sees only what the
    entry allows; one with no allowlist of its own gets the entry's."""
    loaded = config(CATALOG + """
[[servers]]
name = "wide"
service = "crm"
trust = "trusted"
tool_allowlist = ["*"]

[[servers]]
name = "narrow"
service = "crm"
tool_allowlist = ["read_file", "write_file"]

[[servers]]
name = "plain"
service = "crm"
""" + server("inline", "https://crm.example.com/mcp", 'trust = "trusted"'))
    tools = ["read_file", "read_secrets", "write_file", "search", "delete_all"]
    shown = {name: loaded.servers[name].trust.filter(tools).tools for name in ("wide", "narrow", "plain", "inline")}
    assert shown == {"wide": ["read_file", "search"], "narrow": ["read_file"], "plain": ["read_file", "search"],
                     "inline": ["read_file", "search"]}
    assert not any("exposes no tool" in w for w in loaded.warnings)  # the entry's allowlist is theirs


def test_a_tool_pattern_out_of_shape_is_a_config_error_with_its_path() -> None:
    found = errors(CATALOG.replace('"search"]', '"se*rch"]') + server("x", "https://x.example.com/mcp",
                                                                        'tool_exclude = ["a*b"]'))
    assert "services.crm.tool_allowlist[1]: a pattern takes one `*`, at its end (`prefix*`)" in found
    assert "servers[0].tool_exclude[0]: a pattern takes one `*`, at its end (`prefix*`)" in found


def test_an_exec_entry_takes_tool_exclude_to_its_relay() -> None:
    entry = config('[exec.files]\ntrust = "untrusted"\ntool_allowlist = ["fs_*"]\ntool_exclude = ["fs_delete"]\n'
                   ).execs["files"]
    assert entry.policy_dict()["tool_exclude"] == ["fs_delete"]
    assert entry.trust.filter(["fs_read", "fs_delete", "shell"]).tools == ["fs_read"]


def test_a_grant_narrows_with_patterns_and_a_sub_grant_only_further() -> None:
    loaded = config(CATALOG + '\n[[servers]]\nname = "ro"\nservice = "crm"\n')
    names = {"ro": loaded.servers["ro"]}
    top = grant_tools({"tools": {"ro": ["read_*"]}}, names, None)
    assert top == {"ro": frozenset({"read_*"})}
    parent = Grant("g1", ("ro",), 0.0, tools=top)
    assert grant_tools({"tools": {"ro": ["read_file"]}}, names, parent) == {"ro": frozenset({"read_file"})}
    with pytest.raises(Forbidden):
        grant_tools({"tools": {"ro": ["*"]}}, names, parent)
    assert patterns_cover(["read_*"], ["read_f*", "read_file"]) and not patterns_cover(["read_file"], ["read_*"])


# ---------------------------------------------------------------------------- closed egress


CLOSED = '[sidecar]\negress = "closed"\n'


def test_closed_egress_refuses_a_server_under_no_catalog_entry() -> None:
    found = errors(CLOSED + CATALOG + server("stray", "https://stray.example.com/mcp"))
    assert found == ['servers[0].endpoint: not under any [services] entry\'s endpoint, and sidecar.egress = '
                     '"closed" refuses such a server: add a catalog entry for it']


def test_closed_egress_accepts_servers_under_the_catalog() -> None:
    loaded = config(CLOSED + CATALOG + server("inline", "https://crm.example.com/mcp/v2")
                    + '\n[[servers]]\nname = "ro"\nservice = "crm"\n')
    assert loaded.sidecar.egress == "closed" and set(loaded.servers) == {"inline", "ro"}


def test_egress_takes_open_or_closed() -> None:
    assert config("").sidecar.egress == "open"
    assert errors('[sidecar]\negress = "shut"\n') == [
        "sidecar.egress: expected 'open' or 'closed' (closed: every server's endpoint must be under a "
        "[services] entry's)"]


def test_at_run_time_a_target_under_no_entry_is_refused_when_egress_is_closed() -> None:
    """What the config never lets through (every static server is checked at load) the gateway
    refuses all the same, for a target that reaches it some other way."""
    loaded = config(CATALOG + server("stray", "https://stray.example.com/mcp"))
    stray = loaded.servers["stray"]
    refuse_uncovered(loaded.services, "open", stray)  # open: anything goes
    refuse_uncovered(loaded.services, "closed", loaded.services["service:crm"])
    with pytest.raises(Forbidden, match="under no \\[services\\] entry's"):
        refuse_uncovered(loaded.services, "closed", stray)
    moved: Any = dataclasses.replace(loaded.services["service:crm"], endpoint="https://evil.example.com/mcp")
    with pytest.raises(Forbidden):
        refuse_uncovered({}, "closed", moved)


# ---------------------------------------------------------------------------- where the patterns hold


def test_the_gateway_refuses_and_filters_by_pattern_and_a_grants_patterns_narrow_further() -> None:
    from mcpcreds.protocol import jsonrpc

    policy = config(CATALOG + '\n[[servers]]\nname = "ro"\nservice = "crm"\n').servers["ro"].trust

    def refused(tool: str, granted: frozenset[str] | None = None) -> bool:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool}})
        return bool(jsonrpc.refusals(jsonrpc.parse_body(body.encode()), policy, "ro", granted))

    assert not refused("read_file") and refused("read_secrets") and refused("write_file")
    assert refused("read_file", frozenset({"search", "read_n*"})) and not refused("read_notes", frozenset({"read_n*"}))
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": n, "inputSchema": {"type": "object"}}
                                                              for n in ("read_file", "read_secrets", "search", "x")]}}
    inspector = jsonrpc.Inspector(policy, pending={("n", 1): "tools/list"}, granted=frozenset({"read_*"}))
    written = inspector.json_body(json.dumps(answer).encode())
    assert written is not None
    shown = json.loads(written)
    assert [t["name"] for t in shown["result"]["tools"]] == ["read_file"]


def test_the_status_counts_say_which_list_hides_each_tool() -> None:
    from mcpcreds.gateway.tools_seen import Seen, tools_status

    loaded = config(CATALOG + '\n[[servers]]\nname = "ro"\nservice = "crm"\ntool_exclude = ["search"]\n'
                    '\n[[servers]]\nname = "none"\nservice = "crm"\ntool_allowlist = []\n')
    seen = Seen(dict.fromkeys(["read_file", "read_secrets", "search", "write_file"]), at=1.0)
    row = tools_status(loaded.servers["ro"], seen, ())
    assert (row["exposed"], row["hidden"], row["closed_by"]) == (1, {"tool_allowlist": 1, "tool_exclude": 2}, None)
    assert tools_status(loaded.servers["none"], seen, ())["closed_by"] == "tool_allowlist"


def test_an_exec_entrys_exclude_reaches_the_relay() -> None:
    from mcpcreds.exec.stdio_relay import policy_of

    entry = config('[exec.files]\ntrust = "trusted"\ntool_exclude = ["fs_delete*"]\n').execs["files"]
    trust, _ = policy_of(entry.policy_dict())
    assert trust.filter(["fs_read", "fs_delete", "fs_delete_all"]).tools == ["fs_read"]


def test_murs_host_patterns_mean_the_same_here() -> None:
    """`*.example.com` matches the apex too, in mur and in mcpcreds: the import copies the patterns."""
    from mcpcreds.net.egress import EgressPolicy

    policy = EgressPolicy("restricted", ("*.api.example.com",))
    for host in ("api.example.com", "v1.api.example.com"):
        assert policy.check_host(host) == host
    with pytest.raises(Forbidden):
        policy.check_host("example.com")
