"""The MCP Python SDK end to end: `creds.auth(name)` plugged into the SDK's Streamable HTTP client,
talking to a real MCP server (the SDK's own, tests/peers/mcp_server.py) that verifies RFC 9068
JWT access tokens issued by a real authorization server (oidc-provider, tests/peers/oidc_peer.py)
to the real sidecar (`mcpcreds serve`).

SDK 2.x (httpx2) runs in this interpreter; SDK 1.x (plain httpx) cannot be installed beside it,
so it runs in a side venv, `.venv-mcp1`, made on first use. tests/peers/mcp_client.py drives
either SDK the same way.

Times: the server peer stamps each POST with `time.monotonic()`, the clock the sidecar's buckets
read too (one clock for every process of the machine). A 429 is answered before the pause it
causes begins and a retry arrives after the permit the sidecar granted it, so the gap between the
two is at least the pause whatever the load: a bound only a bug can cross.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from mcpcreds import AsyncClient, Client
from tests.conftest import CANARY, module_peer
from tests.peers.mcp_server import McpServerPeer
from tests.peers.oidc_peer import OidcPeer
from tests.sidecar_proc import SidecarProcess, run_sidecar

ROOT = Path(__file__).resolve().parents[1]
MCP1_VENV = ROOT / ".venv-mcp1"
MCP1_SPEC = "mcp>=1.20,<2"
OIDC_CLIENTS: list[dict[str, Any]] = [  # on the shared peer (conftest)
    {"client_id": "agent", "client_secret": CANARY, "token_endpoint_auth_method": "client_secret_basic",
     "scope": "tools:read tools:call"},
]


@pytest.fixture(scope="module")
def oidc(oidc_session: OidcPeer) -> OidcPeer:
    # Long-lived tokens: every token request in these tests is caused by a test, never by renewal.
    return module_peer(oidc_session, 600)


@pytest.fixture(scope="module")
def mcp_server(oidc: OidcPeer, mcp_server_session: McpServerPeer) -> McpServerPeer:
    return mcp_server_session  # shared with test_policy (conftest): counters are read as differences


@pytest.fixture(scope="module")
def sidecar(oidc: OidcPeer, mcp_server: McpServerPeer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("mcp-e2e")
    socket = workdir / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
# every 401 here follows a revocation a test made on purpose: each must renew, however soon after
# the last one (the cooldown that stops a storm of renewals: tests/test_hardening_api.py)
invalidate_cooldown = "0s"

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
                      on_429: Literal["raise", "wait", "return"] | None = None) -> AsyncIterator[ClientSession]:
    """What a user writes: the sidecar's auth (its defaults unless `on_429` is given) on the SDK's
    HTTP client, then a session."""
    async with (
        AsyncClient(sidecar.socket) as creds,
        httpx2.AsyncClient(auth=creds.auth("tools") if on_429 is None else creds.auth("tools", on_429=on_429)
                           ) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def tool_value(result: Any) -> Any:
    assert not result.is_error, result
    return result.structured_content["result"]


def retry_gap(posts: Sequence[dict[str, Any]]) -> float:
    """Seconds, on the server's clock, from the (one) 429 among `posts` to the next tool call."""
    [i] = [i for i, post in enumerate(posts) if post["status"] == 429]
    retry = next(post for post in posts[i + 1:] if post["method"] == "tools/call")
    return float(retry["at"] - posts[i]["at"])


def revoke_the_login_held(sidecar: SidecarProcess, mcp_server: McpServerPeer) -> None:
    """Make the server refuse the login the sidecar holds (fetched now if it holds none), by its
    `jti`: the next request through the sidecar meets a 401, whatever ran before."""
    with Client(sidecar.socket) as creds:
        token = creds.headers("tools")["Authorization"].removeprefix("Bearer ")
    claims = token.split(".")[1]
    mcp_server.revoke(json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))["jti"])


def wait_for_backoff(sidecar: SidecarProcess, retry_after: float) -> dict[str, Any]:
    """The sidecar's log line for a pause of `retry_after` seconds (each test pauses for its own
    length; the lines of other lengths are passed over)."""
    while (entry := sidecar.wait_for("backoff", timeout=10))["retry_after"] != retry_after:
        pass
    return entry


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


async def test_sdk2_429_with_the_default_auth_waits_out_the_shared_pause(mcp_server: McpServerPeer,
                                                                          sidecar: SidecarProcess) -> None:
    """The default `on_429="wait"`: the call that met the 429 succeeds, once the pause it put on
    the shared bucket is over, and the session goes on."""
    async with mcp_session(sidecar, mcp_server.url) as session:
        before = mcp_server.stats()
        mcp_server.fail_next_with_429(1, retry_after=1)
        assert tool_value(await session.call_tool("add", {"a": 20, "b": 22})) == 42
        after = mcp_server.stats()
        assert tool_value(await session.call_tool("add", {"a": 1, "b": 2})) == 3
    assert after["rate_limited"] == before["rate_limited"] + 1
    assert after["tool_calls"] == before["tool_calls"] + 1  # the retry, and only it, reached the tool
    assert retry_gap(after["posts"][len(before["posts"]):]) >= 1  # granted after the pause, not before
    assert wait_for_backoff(sidecar, 1)["key"] == "service:mcp"  # the pause is the service's bucket's


async def test_sdk2_429_returned_fails_that_call_only(mcp_server: McpServerPeer,
                                                      sidecar: SidecarProcess) -> None:
    async with mcp_session(sidecar, mcp_server.url, "return") as session:
        before = mcp_server.stats()
        mcp_server.fail_next_with_429(1, retry_after=0.8)
        with pytest.raises(MCPError):  # the SDK turns the 429 into this request's error
            await session.call_tool("add", {"a": 1, "b": 1})
        assert tool_value(await session.call_tool("add", {"a": 1, "b": 2})) == 3
        after = mcp_server.stats()
    assert after["rate_limited"] == before["rate_limited"] + 1
    assert retry_gap(after["posts"][len(before["posts"]):]) >= 0.8  # the next call waited out the pause
    assert wait_for_backoff(sidecar, 0.8)["key"] == "service:mcp"


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
    # (mcpcreds.client.leaser: its dependencies too, aiolimiter among them, so a venv made before a
    # dependency was added is made again)
    probe = ("import importlib.metadata as m, mcp.client.streamable_http, mcpcreds, mcpcreds.client.leaser, sys; "
             "sys.exit(m.version('mcp').split('.')[0] != '1' or not mcpcreds.__file__.startswith(sys.argv[1]))")
    return subprocess.run([str(python), "-c", probe, str(ROOT / "src")], capture_output=True,
                          timeout=120).returncode == 0


def make_venv(venv: Path, spec: str) -> Path:
    """The python of `venv`, with `spec` and mcpcreds (editable) installed, made if it does not
    work. One maker at a time (a lock beside the system's temp files, keyed by the venv's path):
    every worker of the suite (-n auto) asks for it at once, and two `venv --clear` of one folder
    broke each other's install (all of them failed, on a fresh checkout); a worker that waited
    finds it made."""
    python = _venv_python(venv)
    lock = Path(tempfile.gettempdir()) / f"mcpcreds-{hashlib.sha256(str(venv).encode()).hexdigest()[:16]}.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when closed, or when the process dies
        if _venv_works(python):
            return python
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", spec, "-e", str(ROOT)],
                       check=True, timeout=600, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        print(f"made {venv} in {time.monotonic() - started:.1f}s")
        assert _venv_works(python), f"{venv} was made but does not import mcp 1.x and mcpcreds"
        return python


@pytest.fixture(scope="session")
def mcp1_python() -> Path:
    """`.venv-mcp1`: mcp 1.x and mcpcreds (editable), made once and reused while it imports.
    (.ci/run and .ci/under-load make it before the suite: made inside a test, it counts against
    that test's timeout, which a busy machine's pip install can pass.)"""
    return make_venv(MCP1_VENV, MCP1_SPEC)


# --- both SDKs, one scenario ---------------------------------------------------------------------

# each SDK's run meets a 429 with its own Retry-After, so that its sidecar log line is told apart
SDK_RETRY_AFTER = {"2.x": 0.5, "1.x": 0.4}
SDK_ENTRY_POINTS = {"2.x": ["streamable_http_client(http_client=)"],
                    "1.x": ["streamablehttp_client(auth=)", "streamable_http_client(http_client=)"]}


@pytest.mark.parametrize("sdk", ["2.x", "1.x"])
def test_sdk_client_through_the_library(sdk: str, request: pytest.FixtureRequest, oidc: OidcPeer,
                                        mcp_server: McpServerPeer, sidecar: SidecarProcess) -> None:
    """The MCP SDK's own client, 2.x over httpx2 (this interpreter) and 1.x over plain httpx (the
    side venv), with `creds.auth(name)` and its defaults against the real MCP server: the first
    request meets a 401 (the login is renewed once), the first tool call a 429 (the shared
    bucket is paused, the call waits the pause out and succeeds); every tool answers."""
    python = sys.executable if sdk == "2.x" else request.getfixturevalue("mcp1_python")
    retry_after = SDK_RETRY_AFTER[sdk]
    revoke_the_login_held(sidecar, mcp_server)
    mcp_server.fail_next_with_429(1, retry_after=retry_after)
    tokens_before = oidc.stats()["token_requests"]
    before = mcp_server.stats()
    proc = subprocess.run([str(python), str(ROOT / "tests" / "peers" / "mcp_client.py"), str(sidecar.socket),
                           "tools", mcp_server.url], capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["mcp_version"].split(".")[0] == sdk[0]
    assert out["auth_is_httpx2"] is (sdk == "2.x")  # 1.x: a plain httpx.Auth, no httpx2 there
    assert [run["via"] for run in out["runs"]] == SDK_ENTRY_POINTS[sdk]
    for run in out["runs"]:
        assert run == {"via": run["via"], "tools": ["add", "echo"], "add": 5, "echo": "héllo mcp"}
    after = mcp_server.stats()
    # the 401: one renewal (not one per request or run), and the server verified the new JWT
    assert oidc.stats()["token_requests"] == tokens_before + 1
    assert after["unauthorized"] == before["unauthorized"] + 1
    assert after["rejected"].get("revoked", 0) == before["rejected"].get("revoked", 0) + 1
    assert len(after["tokens_seen"]) == len(before["tokens_seen"]) + 1
    # the 429: the call was retried once the pause it set on the shared bucket was over
    assert after["rate_limited"] == before["rate_limited"] + 1
    assert retry_gap(after["posts"][len(before["posts"]):]) >= retry_after
    assert wait_for_backoff(sidecar, retry_after)["key"] == "service:mcp"
    assert after["tool_calls"] == before["tool_calls"] + 2 * len(out["runs"])
    assert CANARY not in proc.stdout + proc.stderr
