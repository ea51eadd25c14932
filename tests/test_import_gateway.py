"""A sidecar started on what `mcpcreds import` wrote behaves as the seed documents, shown against a
real MCP server behind the gateway (tests/peers/mcp_untrusted_peer.py, the MCP SDK 2.x): agentd's
allow/exclude patterns under the catalog's ceiling, the tag floor (a server restating the catalog
URL inline keeps the entry's tags, tool lists and bucket), closed egress (a server under no entry
is refused at check and at reload), and `spawn-payload --grant --format agentd` telling an agentd
child the tools the gateway lets it through to; and mur's `broad_audited` without an authorization,
downgraded to `inherit` (no proxy, no consent), beside one with its authorization (proxied, consent
audited). The imported files are used as written: the socket comes from $MCPCREDS_SOCKET."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from mcpcreds import AsyncClient, Client
from tests.conftest import CANARY, run_cli
from tests.peers.mcp_untrusted_peer import UntrustedPeer, start_untrusted_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_import import MUR

AGENTD = """
services:
  tools:
    kind: mcp
    endpoint: {url}
    tags: [sensitive, egress]
    rate: 20/1d
    allow: ["ask*", "roots"]
    exclude: ["ask_any"]
mcp:
  servers:
    - name: tools-ro
      service: tools
      allow: ["ask*", "image"]
    - name: tools-inline
      endpoint: {url}
      tags: [untrusted_input]
security:
  egress: closed
"""

# for an agentd child: no `egress` tag, so a grant of both servers keeps the Rule of Two
AGENTD_CHILD = """
services:
  tools:
    kind: mcp
    endpoint: {url}
    headers:
      X-Api-Key: {canary}
    tags: [sensitive]
    allow: ["ask*", "roots"]
    exclude: ["ask_any"]
mcp:
  servers:
    - name: tools-ro
      service: tools
      allow: ["ask*", "image"]
      timeout: 45s
    - name: tools-inline
      endpoint: {url}
"""


@pytest.fixture(scope="module")
def peer() -> Iterator[UntrustedPeer]:
    with start_untrusted_peer() as server:
        yield server


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mcpcreds-import-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def import_to(source: Path, out: Path) -> str:
    result = run_cli("import", str(source), "-o", str(out))
    assert result.code == 0, result.output
    return out.read_text()


@pytest.fixture(scope="module")
def agentd(peer: UntrustedPeer, workdir: Path) -> Iterator[SidecarProcess]:
    source = workdir / "agentd.yaml"
    source.write_text(AGENTD.format(url=peer.url))
    config = workdir / "config.toml"
    import_to(source, config)
    socket = workdir / "run" / "mcpcreds.sock"
    with run_sidecar(config, socket, {"MCPCREDS_SOCKET": str(socket)}) as proc:
        yield proc


def cli(sidecar: SidecarProcess, *args: str) -> Any:
    return run_cli(*args, "--config", str(sidecar.config), env={"MCPCREDS_SOCKET": str(sidecar.socket)})


@asynccontextmanager
async def session(sidecar: SidecarProcess, name: str, grant: str | None = None) -> AsyncIterator[ClientSession]:
    async with AsyncClient(sidecar.socket, grant=grant) as creds, creds.mcp_httpx2_client(name) as http, \
            streamable_http_client(creds.mcp_url(name), http_client=http) as (read, write), \
            ClientSession(read, write) as client:
        await client.initialize()
        yield client


async def tool_names(sidecar: SidecarProcess, name: str, grant: str | None = None) -> list[str]:
    async with session(sidecar, name, grant) as client:
        return [t.name for t in (await client.list_tools()).tools]


async def peer_tools(peer: UntrustedPeer) -> list[str]:
    """Every tool the peer offers, asked of it directly."""
    async with streamable_http_client(peer.url) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        return [t.name for t in (await client.list_tools()).tools]


def agentd_admits(spec: dict[str, Any], tools: list[str]) -> list[str]:
    """The tools an agentd child admits by the spec's `allow` and `exclude` (`prefix*` patterns)."""
    def match(patterns: list[str], tool: str) -> bool:
        return any(tool.startswith(p[:-1]) if p.endswith("*") else tool == p for p in patterns)
    return [t for t in tools if ("allow" not in spec or match(spec["allow"], t))
            and not match(spec.get("exclude", []), t)]


# ---------------------------------------------------------------------------- agentd


async def test_allow_and_exclude_patterns_hold_under_the_catalogs_ceiling(agentd: SidecarProcess) -> None:
    """The entry allows `ask*` and `roots` less `ask_any`; the server names it with `ask*` and
    `image`: it sees what both allow and the entry does not exclude, and a call past that is
    refused by the gateway (the server never sees it)."""
    assert await tool_names(agentd, "tools-ro") == ["ask", "ask_url"]
    async with session(agentd, "tools-ro") as client:
        for tool in ("image", "ask_any"):
            with pytest.raises(MCPError, match="tools/call refused by the gateway"):
                await client.call_tool(tool, {})


async def test_a_server_restating_the_catalog_url_inline_is_held_as_the_entry(agentd: SidecarProcess) -> None:
    """`tools-inline` names no service and no allow list, and tags itself untrusted_input only:
    the floor gives it the entry's tool lists (without them it would show none), its tags (so a
    grant of it alone completes the trifecta), and its cache key."""
    assert await tool_names(agentd, "tools-inline") == ["ask", "ask_url", "roots"]
    refused = cli(agentd, "spawn-payload", "--grant", "tools-inline")
    assert refused.code == 77 and "the Rule of Two forbids all three" in refused.stderr
    status = json.loads(cli(agentd, "status", "--json").stdout)
    keys = {row["name"]: row["key"] for row in status["servers"] if row["name"].startswith("tools-")}
    assert keys == {"tools-ro": "service:tools", "tools-inline": "service:tools"}


def test_closed_egress_refuses_a_server_under_no_catalog_entry(agentd: SidecarProcess, workdir: Path) -> None:
    """agentd's `security.egress: closed`: a server added by hand under no catalog entry fails
    `mcpcreds check`, and a reload bringing it in is refused as a whole (the old config serves on)."""
    config = agentd.config
    imported = config.read_text()
    stray = imported + '\n[[servers]]\nname = "stray"\nendpoint = "https://stray.example.com/mcp"\n'
    (workdir / "stray.toml").write_text(stray)
    checked = run_cli("check", "--config", str(workdir / "stray.toml"))
    assert checked.code == 2 and "servers[2].endpoint: not under any [services] entry's endpoint, and " \
                                 "sidecar.egress = \"closed\" refuses such a server" in checked.stderr
    config.write_text(stray)
    try:
        agentd.signal(signal.SIGHUP)
        agentd.wait_for("reload rejected: config invalid; keeping the old one")
        with Client(str(agentd.socket)) as client:
            names = [s["name"] for s in client.request("GET", "/v1/servers")["servers"]]
        assert "stray" not in names and "tools-inline" in names
    finally:
        config.write_text(imported)


def test_the_inline_server_takes_from_the_entrys_bucket(agentd: SidecarProcess) -> None:
    """Last in this file: it empties the entry's bucket (20 a day). What is left of it is taken
    through `tools-ro`; `tools-inline` then has no permit left, though it states no rate."""
    status = json.loads(cli(agentd, "status", "--json").stdout)
    level = next(b["level"] for b in status["buckets"] if b["key"] == "service:tools")
    assert cli(agentd, "acquire", "tools-ro", "--cost", str(int(level)), "--max-wait", "0").code == 0
    assert cli(agentd, "acquire", "tools-inline", "--max-wait", "0").code == 75


async def test_spawn_payload_tells_an_agentd_child_the_tools_the_gateway_lets_through(
        peer: UntrustedPeer, workdir: Path) -> None:
    """`spawn-payload --grant --format agentd`: `allow` is the server's own list within its catalog
    entry's (the entry's for the inline server, which has none), narrowed by the grant's `--tool`;
    `exclude` the entry's; `timeout` the server's. An agentd child filtering the peer's tools by
    them keeps exactly what the gateway shows the grant; the entry's key, which the sidecar holds,
    never reaches the payload."""
    source = workdir / "agentd-child.yaml"
    source.write_text(AGENTD_CHILD.format(url=peer.url, canary=CANARY))
    config = workdir / "child.toml"
    assert "{{secret:TOOLS_X_API_KEY}}" in import_to(source, config)
    socket = workdir / "child-run" / "mcpcreds.sock"
    offered = await peer_tools(peer)
    with run_sidecar(config, socket, {"MCPCREDS_SOCKET": str(socket), "TOOLS_X_API_KEY": CANARY}) as sidecar:
        result = cli(sidecar, "spawn-payload", "--grant", "tools-ro", "tools-inline", "--format", "agentd")
        assert result.code == 0, result.output
        answer = json.loads(result.stdout)
        ro, inline = answer["servers"]
        assert (ro["allow"], ro["exclude"], ro["timeout"]) == (["ask*"], ["ask_any"], "45s")
        assert (inline["allow"], inline["exclude"]) == (["ask*", "roots"], ["ask_any"])
        assert ro["headers"] == [["X-Api-Key", "{{secret:TOOLS_X_API_KEY}}"]]
        for spec, shown in ((ro, ["ask", "ask_url"]), (inline, ["ask", "ask_url", "roots"])):
            assert agentd_admits(spec, offered) == await tool_names(sidecar, spec["name"], answer["grant"]) == shown

        narrowed = cli(sidecar, "spawn-payload", "--grant", "tools-ro", "--tool", "tools-ro:ask_u*", "--tool",
                       "tools-ro:image", "--format", "agentd")
        assert narrowed.code == 0, narrowed.output
        answer = json.loads(narrowed.stdout)
        spec = answer["servers"][0]
        assert spec["allow"] == ["ask_u*"]  # `image`, outside the entry's allow list, is not given
        assert agentd_admits(spec, offered) == await tool_names(sidecar, "tools-ro", answer["grant"]) == ["ask_url"]
    for output in (result.output, narrowed.output):
        assert "canary" not in output.lower()


# ---------------------------------------------------------------------------- mur


def test_murs_broad_audited_without_authorization_runs_as_inherit(workdir: Path) -> None:
    """mur's import rule kept: `research` (broad_audited, no authorization) gets no proxy and no
    consent line; `crawler` (with mur's authorization) is proxied and its consent audited once."""
    config = workdir / "mur.toml"
    import_to(MUR, config)
    audit = workdir / "mur-audit.jsonl"
    with config.open("a") as f:
        f.write(f'\n[sidecar]\naudit_log = "{audit}"\n')  # the operator's own setting, beside the import
    socket = workdir / "mur-run" / "mcpcreds.sock"
    with run_sidecar(config, socket, {"MCPCREDS_SOCKET": str(socket)}) as sidecar, \
            Client(str(sidecar.socket)) as client:
        research = client.request("POST", "/v1/exec/research/session", {"proxy": True})
        crawler = client.request("POST", "/v1/exec/crawler/session", {"proxy": True})
    assert research["proxy"] is None and crawler["proxy"] is not None
    consents = [e for e in map(json.loads, audit.read_text().splitlines()) if e["event"] == "consent"]
    assert [(e["name"], e["net"], e["by"]) for e in consents] == [("crawler", "broad_audited", "operator")]
