"""`mcpcreds status` says, per server, how many of its tools the gateway exposes and why not the
others: end to end through the real sidecar to a real MCP SDK server (tests/peers/mcp_gateway_peer.py:
echo, add, progress, leak), listed by the real MCP SDK client; then the parts on their own (pages
of a listing, the bounds, a changed pin, the words of the view)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import tempfile
import tomllib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient, Client
from mcpcreds.cli.status_view import tools_summary
from mcpcreds.config.load import parse_config
from mcpcreds.errors import Forbidden
from mcpcreds.gateway.tools_seen import MAX_SERVERS, ToolsSeen, status_rows, tools_status
from mcpcreds.state.pins import MAX_PINNED_TOOLS, Definition, MemoryPins
from tests.conftest import CANARY, run_cli
from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_status_view import on_a_terminal, row, section

KEY = "status-tools-" + CANARY


def server(name: str, url: str, extra: str = "") -> str:
    return f"""
[[servers]]
name = "{name}"
endpoint = "{url}"
headers = {{ "X-Api-Key" = "{{{{secret:KEY}}}}" }}
{extra}
"""


def config_text(folder: Path, url: str, allowlist: list[str]) -> str:
    return f"""
[sidecar]
socket = "{folder / 'mcpcreds.sock'}"
[secrets]
sources = ["env"]
{server("open", url, 'trust = "trusted"')}
{server("allow", url, f'tool_allowlist = {json.dumps(allowlist)}' + chr(10)
        + 'tool_metadata = { echo = { data_sensitivity = "high" } }')}
{server("closed", url)}
{server("picky", url, 'tool_allowlist = ["echo", "add", "progress"]' + chr(10) + 'tool_exclude = ["progress"]')}
{server("unseen", url, 'trust = "trusted"')}
{server("headers-only", url, 'trust = "trusted"' + chr(10) + 'expose = "headers"')}
"""


@pytest.fixture(scope="module")
def peer() -> Iterator[GatewayPeer]:
    with start_gateway_peer("status-tools-token-", KEY) as up:
        yield up


@pytest.fixture(scope="module")
def sidecar(peer: GatewayPeer) -> Iterator[SidecarProcess]:
    folder = Path(tempfile.mkdtemp(prefix="mcpcreds-st-"))
    folder.chmod(0o700)
    config = folder / "config.toml"
    config.write_text(config_text(folder, peer.url, ["echo", "add", "progress"]))
    try:
        with run_sidecar(config, folder / "mcpcreds.sock", {"KEY": KEY}) as proc:
            yield proc
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@asynccontextmanager
async def mcp_session(sidecar: SidecarProcess, name: str) -> AsyncIterator[ClientSession]:
    async with (AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client(name) as http,
                streamable_http_client(creds.mcp_url(name), http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


def tools_rows(sidecar: SidecarProcess) -> dict[str, Any]:
    result = run_cli("status", "--json", "--config", str(sidecar.config))
    assert result.code == 0, result.stderr
    assert CANARY not in result.stdout
    return {s["name"]: s["tools"] for s in json.loads(result.stdout)["servers"]}


def counts(tools: dict[str, Any]) -> tuple[Any, Any, dict[str, int], Any]:
    return tools["seen"], tools["exposed"], tools["hidden"], tools["closed_by"]


async def test_status_counts_the_tools_each_server_exposes_and_says_why_not_the_others(
        sidecar: SidecarProcess) -> None:
    before = tools_rows(sidecar)
    assert counts(before["open"]) == (None, None, {}, None)  # nothing listed through the gateway yet
    assert counts(before["closed"]) == (None, None, {}, "no_tool_allowlist")  # closed whatever it offers
    assert before["headers-only"] is None  # not served through the gateway

    listed = {}
    for name in ("open", "allow", "closed"):
        async with mcp_session(sidecar, name) as session:
            listed[name] = {t.name for t in (await session.list_tools()).tools}
    assert listed == {"open": {"echo", "add", "progress", "leak"}, "allow": {"echo", "add", "progress"},
                      "closed": set()}

    after = tools_rows(sidecar)
    assert counts(after["open"]) == (4, 4, {}, None)
    # echo is listed, but its calls are refused (data_sensitivity high on a server not trusted)
    assert counts(after["allow"]) == (4, 2, {"tool_allowlist": 1, "tool_metadata": 1}, None)
    assert counts(after["closed"]) == (4, 0, {"no_tool_allowlist": 4}, "no_tool_allowlist")
    assert counts(after["unseen"]) == (None, None, {}, None)
    assert after["open"]["seen_at"] > 0 and after["unseen"]["seen_at"] is None

    code, out, err = on_a_terminal("status", "--config", str(sidecar.config))
    assert code == 0, err
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip() for line in out.replace("\r\n", "\n").splitlines()]
    lines = section(lines, "gateway tools")
    assert row(lines, "open") == ["open", "4 of 4 exposed"]
    assert row(lines, "allow") == ["allow", "2 of 4 exposed (2 hidden: 1 not in tool_allowlist, 1 refused by "
                                            "tool_metadata)"]
    assert row(lines, "closed") == ["closed", "0 of 4 exposed: no tool_allowlist"]
    assert row(lines, "unseen") == ["unseen", "none seen yet (mcpcreds tools unseen shows those pinned)"]
    assert not any(line.startswith("headers-only") for line in lines)

    # judged by the config of now: a reload that widens the allowlist shows without a new listing
    sidecar.config.write_text(config_text(sidecar.config.parent, tomllib.loads(
        sidecar.config.read_text())["servers"][0]["endpoint"], ["echo", "add", "progress", "leak"]))
    sidecar.signal(signal.SIGHUP)
    sidecar.wait_for("config reloaded")
    assert counts(tools_rows(sidecar)["allow"]) == (4, 3, {"tool_metadata": 1}, None)


def tool_lines(out: str) -> dict[str, list[str]]:
    """`mcpcreds tools`'s table rows by tool name: the columns, split at runs of spaces."""
    return {cells[0]: cells for line in out.splitlines() if len(cells := re.split(r"\s{2,}", line.strip())) >= 4}


async def test_tools_names_every_tool_the_server_offered_and_the_rule_that_hides_it(
        sidecar: SidecarProcess) -> None:
    agent_saw = {}
    for name in ("closed", "picky"):
        async with mcp_session(sidecar, name) as session:
            agent_saw[name] = {t.name for t in (await session.list_tools()).tools}
    assert agent_saw == {"closed": set(), "picky": {"echo", "add"}}

    closed = run_cli("tools", "closed", "--config", str(sidecar.config))
    assert closed.code == 0, closed.output
    rows = tool_lines(closed.stdout)
    for tool in ("echo", "add", "progress", "leak"):  # every tool offered, none pinned: none exposed
        assert rows[tool][1:3] == ["unpinned", "hidden by no_tool_allowlist"], closed.stdout
    # what to write to expose some, in TOML
    assert 'tool_allowlist = ["echo", "add", "progress", "leak"]' in closed.stdout
    # a hidden tool's description is never kept: not even the owner sees it
    assert "credentials this server received" not in closed.output and CANARY not in closed.output

    picky = run_cli("tools", "picky", "--config", str(sidecar.config))
    assert picky.code == 0, picky.output
    rows = tool_lines(picky.stdout)
    assert {t: rows[t][1:3] for t in ("echo", "add", "progress", "leak")} == {
        "echo": ["pinned", "exposed"], "add": ["pinned", "exposed"],
        "progress": ["unpinned", "hidden by tool_exclude"], "leak": ["unpinned", "hidden by tool_allowlist"]}

    as_json = run_cli("tools", "closed", "--json", "--config", str(sidecar.config))
    listed = json.loads(as_json.stdout)
    assert listed["seen"] == 4 and listed["seen_at"] > 0
    assert [(t["name"], t["hidden_by"], t["exposed"], t["offered"], t["definition"]) for t in listed["tools"]] == [
        (n, "no_tool_allowlist", False, True, None) for n in ("echo", "add", "progress", "leak")]

    with Client(sidecar.socket) as owner:  # the listing is the owner's: an agent's grant is refused it
        grant = owner.grant(["closed"])["grant"]
    with Client(sidecar.socket, grant=grant) as agent, pytest.raises(Forbidden):
        agent.request("GET", "/v1/tools/closed")


# ---------------------------------------------------------------------------- the parts


def target(extra: str = "", name: str = "docs") -> Any:
    text = f'[[servers]]\nname = "{name}"\nendpoint = "https://docs.example.com/mcp"\n{extra}\n'
    return parse_config(tomllib.loads(text)).servers[name]


def listing(*names: Any) -> list[Any]:
    return [{"name": n, "inputSchema": {"type": "object"}} for n in names]


def test_a_listing_in_pages_is_gathered_and_the_next_listing_replaces_it() -> None:
    seen = ToolsSeen(lambda: 1000.0)
    seen.listed("docs", listing("a", "b"), more=True)
    seen.listed("docs", [*listing("c", "a"), "junk", {"name": 7}, {"name": "x" * 129}], more=False)
    got = seen.get("docs")
    assert got is not None and list(got.names) == ["a", "b", "c"] and got.at == 1000.0
    seen.listed("docs", listing("z"), more=False)  # a new listing: the server dropped a, b and c
    assert list(seen.get("docs").names) == ["z"]  # type: ignore[union-attr]
    assert seen.get("other") is None


def test_what_is_kept_is_bounded() -> None:
    seen = ToolsSeen(lambda: 0.0)
    seen.listed("docs", listing(*(f"t{i}" for i in range(MAX_PINNED_TOOLS + 10))), more=False)
    assert len(seen.get("docs").names) == MAX_PINNED_TOOLS  # type: ignore[union-attr]
    for i in range(MAX_SERVERS + 1):
        seen.listed(f"s{i}", listing("a"), more=False)
    assert seen.get("docs") is None and seen.get("s0") is None  # the oldest went first
    assert seen.get(f"s{MAX_SERVERS}") is not None


async def test_a_changed_definition_withheld_by_the_pins_is_a_reason(tmp_path: Path) -> None:
    pins = MemoryPins(tmp_path / "pins.json")
    await pins.record("docs", {"read": Definition("a" * 64), "write": Definition("b" * 64)}, {})
    await pins.record("docs", {}, {"read": Definition("c" * 64)})  # read changed since it was pinned
    seen = ToolsSeen(lambda: 5.0)
    seen.listed("docs", listing("read", "write"), more=False)
    untrusted = target('tool_allowlist = ["read", "write"]')
    rows = await status_rows([untrusted], seen, pins)
    assert rows == {("docs", "mcp:docs"): {"seen": 2, "exposed": 1, "hidden": {"pin_changed": 1},
                                           "closed_by": None, "seen_at": 5.0}}
    # pins only warn on a trusted server (pin_tools off): the changed tool is exposed
    trusted = target('trust = "trusted"')
    assert (await status_rows([trusted], seen, pins))[("docs", "mcp:docs")]["exposed"] == 2


def test_expected_tools_and_an_empty_allowlist() -> None:
    seen = ToolsSeen(lambda: 0.0)
    seen.listed("docs", listing("read", "write"), more=False)
    row_ = tools_status(target('tool_allowlist = ["read", "write"]\nexpected_tools = ["read"]'),
                        seen.get("docs"), ())
    assert (row_["exposed"], row_["hidden"]) == (1, {"expected_tools": 1})
    empty = tools_status(target("tool_allowlist = []"), seen.get("docs"), ())
    assert (empty["exposed"], empty["hidden"], empty["closed_by"]) == (0, {"tool_allowlist": 2}, "tool_allowlist")


def test_the_words_of_the_view() -> None:
    def said(**tools: Any) -> str:
        return tools_summary("docs", {"seen": None, "exposed": None, "hidden": {}, "closed_by": None, **tools})

    assert said() == "none seen yet (mcpcreds tools docs shows those pinned)"
    assert said(closed_by="no_tool_allowlist") == "0 exposed: no tool_allowlist"
    assert said(closed_by="tool_allowlist") == "0 exposed: tool_allowlist is empty"
    assert said(seen=5, exposed=3, hidden={"tool_allowlist": 2}) == "3 of 5 exposed (2 hidden: not in tool_allowlist)"
    assert said(seen=3, exposed=2, hidden={"pin_changed": 1}) \
        == "2 of 3 exposed (1 hidden: changed since pinned: mcpcreds tools approve docs)"
    assert said(seen=2, exposed=2) == "2 of 2 exposed"
    # the reasons in the policy's order, whatever the document's
    assert said(seen=4, exposed=2, hidden={"tool_metadata": 1, "tool_allowlist": 1}) \
        == "2 of 4 exposed (2 hidden: 1 not in tool_allowlist, 1 refused by tool_metadata)"
    # a newer sidecar's reason, or garbage, still reads
    assert said(seen=2, exposed="x", hidden={"new_rule\x1b[2J": 1, "bad": "x"}) == "- of 2 exposed (1 hidden: new_rule?[2J)"
