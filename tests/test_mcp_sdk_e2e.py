"""The MCP Python SDK end to end: `creds.auth(name)` plugged into the SDK's Streamable HTTP client,
talking to a real MCP server (the SDK's own, tests/peers/mcp_server.py) that verifies RFC 9068
JWT access tokens issued by a real authorization server (oidc-provider, tests/peers/oidc_peer.py)
to the real sidecar (`mcpcreds serve`).

SDK 2.x (httpx2) runs in this interpreter; SDK 1.x (plain httpx) cannot be installed beside it,
so it runs in a side venv, `.venv-mcp1`, made on first use (tests/peers/mcp1_client.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from mcpcreds import AsyncClient
from tests.conftest import CANARY
from tests.peers.mcp_server import McpServerPeer, start_mcp_server
from tests.peers.oidc_peer import OidcPeer, start_oidc_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar

ROOT = Path(__file__).resolve().parents[1]
MCP1_VENV = ROOT / ".venv-mcp1"
MCP1_SPEC = "mcp>=1.20,<2"
CLIENTS: list[dict[str, Any]] = [
    {"client_id": "agent", "client_secret": CANARY, "token_endpoint_auth_method": "client_secret_basic",
     "scope": "tools:read tools:call"},
]


@pytest.fixture(scope="module")
def oidc() -> Iterator[OidcPeer]:
    # Long-lived tokens: every token request in these tests is caused by a test, never by renewal.
    with start_oidc_peer(CLIENTS, access_token_ttl=600) as peer:
        yield peer


@pytest.fixture(scope="module")
def mcp_server(oidc: OidcPeer) -> Iterator[McpServerPeer]:
    with start_mcp_server(oidc.issuer, oidc.jwks_uri) as server:
        yield server


@pytest.fixture(scope="module")
def sidecar(oidc: OidcPeer, mcp_server: McpServerPeer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("mcp-e2e")
    socket = workdir / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"

[secrets]
sources = ["env"]

[services.mcp]
endpoint = "{mcp_server.url}"
rate = "100/1s"
[services.mcp.oauth]
token_url = "{oidc.token_url}"
client_id = "agent"
client_secret = "{{{{secret:AGENT_SECRET}}}}"
scope = "tools:read tools:call"

[[servers]]
name = "tools"
service = "mcp"
""")
    with run_sidecar(config, socket, {"AGENT_SECRET": CANARY}) as proc:
        yield proc


@asynccontextmanager
async def mcp_session(sidecar: SidecarProcess, url: str,
                      on_429: Literal["raise", "wait", "return"] = "wait") -> AsyncIterator[ClientSession]:
    """What a user writes: the sidecar's auth on the SDK's HTTP client, then a session."""
    async with (
        AsyncClient(sidecar.socket) as creds,
        httpx2.AsyncClient(auth=creds.auth("tools", on_429=on_429)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def tool_value(result: Any) -> Any:
    assert not result.is_error, result
    return result.structured_content["result"]


async def test_sdk2_lists_and_calls_tools(oidc: OidcPeer, mcp_server: McpServerPeer,
                                          sidecar: SidecarProcess) -> None:
    async with mcp_session(sidecar, mcp_server.url) as session:
        tools = await session.list_tools()
        assert {t.name for t in tools.tools} == {"echo", "add"}
        assert tool_value(await session.call_tool("add", {"a": 2, "b": 3})) == 5
        assert tool_value(await session.call_tool("echo", {"text": "héllo"})) == "héllo"
    stats = mcp_server.stats()
    assert stats["tokens_seen"], stats  # the server verified a JWT from the peer, for its resource
    assert stats["rejected"] == {} and stats["unauthorized"] == 0, stats
    assert oidc.stats()["by_client"].get("agent", 0) >= 1


async def test_sdk2_401_renews_the_login_once_and_retries(oidc: OidcPeer, mcp_server: McpServerPeer,
                                                          sidecar: SidecarProcess) -> None:
    async with mcp_session(sidecar, mcp_server.url) as session:
        assert tool_value(await session.call_tool("add", {"a": 1, "b": 1})) == 2
        tokens_before = oidc.stats()["token_requests"]
        server_before = mcp_server.stats()

        mcp_server.revoke_all()  # the token is unexpired, but the server now answers 401
        assert tool_value(await session.call_tool("add", {"a": 2, "b": 3})) == 5

        server_after = mcp_server.stats()
        assert oidc.stats()["token_requests"] == tokens_before + 1  # one renewal, not one per process
        assert server_after["unauthorized"] == server_before["unauthorized"] + 1
        assert server_after["rejected"].get("revoked", 0) == server_before["rejected"].get("revoked", 0) + 1
        assert len(server_after["tokens_seen"]) == len(server_before["tokens_seen"]) + 1

        # the new login is reused: no further token request, no further 401
        assert tool_value(await session.call_tool("echo", {"text": "again"})) == "again"
        assert oidc.stats()["token_requests"] == tokens_before + 1
        assert mcp_server.stats()["unauthorized"] == server_after["unauthorized"]


async def test_sdk2_429_pauses_the_shared_bucket_then_waits(mcp_server: McpServerPeer,
                                                            sidecar: SidecarProcess) -> None:
    async with mcp_session(sidecar, mcp_server.url, "wait") as session:
        before = mcp_server.stats()["rate_limited"]
        mcp_server.fail_next_with_429(1, retry_after=1)
        started = time.monotonic()
        assert tool_value(await session.call_tool("add", {"a": 20, "b": 22})) == 42
        elapsed = time.monotonic() - started
        assert mcp_server.stats()["rate_limited"] == before + 1
        assert elapsed >= 0.9, elapsed  # the retry waited for the pause the 429 asked for
    # the pause was put on the shared bucket: every process using service:mcp waited too
    backoff = sidecar.wait_for("backoff", timeout=5)
    while backoff["retry_after"] != 1:  # skip those of other tests
        backoff = sidecar.wait_for("backoff", timeout=5)
    assert backoff["key"] == "service:mcp"


async def test_sdk2_429_returned_fails_that_call_only(mcp_server: McpServerPeer,
                                                      sidecar: SidecarProcess) -> None:
    async with mcp_session(sidecar, mcp_server.url, "return") as session:
        mcp_server.fail_next_with_429(1, retry_after=1)
        started = time.monotonic()
        with pytest.raises(MCPError):  # the SDK turns the 429 into this request's error
            await session.call_tool("add", {"a": 1, "b": 1})
        assert tool_value(await session.call_tool("add", {"a": 1, "b": 2})) == 3
        assert time.monotonic() - started >= 0.9  # the next permit waited out the shared pause


async def test_sdk2_429_with_the_default_auth_keeps_the_session(mcp_server: McpServerPeer,
                                                                sidecar: SidecarProcess) -> None:
    async with mcp_session(sidecar, mcp_server.url) as session:
        mcp_server.fail_next_with_429(1, retry_after=0.2)
        with contextlib.suppress(MCPError):  # that call may fail, or wait and succeed
            await asyncio.wait_for(session.call_tool("add", {"a": 1, "b": 1}), 10)
        assert tool_value(await asyncio.wait_for(session.call_tool("add", {"a": 1, "b": 2}), 10)) == 3


@pytest.mark.parametrize("example", ["list_tools_mcp.py", "list_tools_httpx.py"])
def test_examples_list_the_tools(example: str, mcp_server: McpServerPeer, sidecar: SidecarProcess) -> None:
    before = mcp_server.stats()["requests"]
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / example), "tools", "--socket",
                           str(sidecar.socket)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(line.split(":")[0] for line in proc.stdout.splitlines()) == ["add", "echo"], proc.stdout
    assert "Add two integers." in proc.stdout
    assert mcp_server.stats()["requests"] > before
    unknown = subprocess.run([sys.executable, str(ROOT / "examples" / example), "nope", "--socket",
                              str(sidecar.socket)], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 1 and "no server 'nope'" in unknown.stderr


# --- SDK 1.x (plain httpx), in a side venv -------------------------------------------------------


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _venv_works(python: Path) -> bool:
    if not python.exists():
        return False
    # mcp 1.x, and mcpcreds from this checkout (a venv copied from another checkout would not be)
    probe = ("import importlib.metadata as m, mcp.client.streamable_http, mcpcreds, sys; "
             "sys.exit(m.version('mcp').split('.')[0] != '1' or not mcpcreds.__file__.startswith(sys.argv[1]))")
    return subprocess.run([str(python), "-c", probe, str(ROOT / "src")], capture_output=True,
                          timeout=120).returncode == 0


@pytest.fixture(scope="session")
def mcp1_python() -> Path:
    """`.venv-mcp1`: mcp 1.x and mcpcreds (editable), made once and reused while it imports."""
    python = _venv_python(MCP1_VENV)
    if _venv_works(python):
        return python
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(MCP1_VENV)], check=True, timeout=120)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", MCP1_SPEC, "-e", str(ROOT)],
                   check=True, timeout=600, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    print(f"made {MCP1_VENV} in {time.monotonic() - started:.1f}s")
    assert _venv_works(python), f"{MCP1_VENV} was made but does not import mcp 1.x and mcpcreds"
    return python


def test_sdk1_lists_and_calls_tools_with_plain_httpx(mcp1_python: Path, oidc: OidcPeer,
                                                     mcp_server: McpServerPeer,
                                                     sidecar: SidecarProcess) -> None:
    mcp_server.revoke_all()  # the first request of each run is a 401 that the auth recovers from
    tokens_before = oidc.stats()["token_requests"]
    proc = subprocess.run(
        [str(mcp1_python), str(ROOT / "tests" / "peers" / "mcp1_client.py"), str(sidecar.socket), "tools",
         mcp_server.url],
        capture_output=True, text=True, timeout=90, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["mcp_version"].startswith("1.")
    assert out["auth_is_httpx2"] is False  # no httpx2 there: a plain httpx.Auth
    assert out["runs"][0]["via"] == "streamablehttp_client(auth=)", out  # the classic 1.x spelling
    for run in out["runs"]:
        assert run["tools"] == ["add", "echo"], run
        assert run["add"] == 5 and run["echo"] == "mcp1", run
    assert oidc.stats()["token_requests"] == tokens_before + 1  # one renewal after the revocation
    assert CANARY not in proc.stdout + proc.stderr
