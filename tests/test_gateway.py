"""The gateway (issue 14) end to end: the real MCP SDK 2.x client, through `/mcp/{server}` on the
real sidecar's socket (`mcpcreds serve`), to a real MCP SDK 2.x server (tests/peers/mcp_gateway_peer.py)
that demands a bearer token the sidecar obtained from a token endpoint (tests/peers/fault_idp.py),
or a static API key.

What the gateway must do is observed where it happens: the server counts what reached it
(methods, tools, headers, tokens, disconnects), the client records every byte it received.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import TextContent

from mcpcreds import AsyncClient, Forbidden
from mcpcreds.core.http import MAX_GATEWAY_BODY_BYTES
from mcpcreds.core.socket_check import UntrustedSidecar
from mcpcreds.errors import ProxyOnly
from tests.conftest import CANARY, run_cli
from tests.peers.fault_idp import FaultIdp, fault_idp
from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_hardening_socket import NOBODY, Listener, folder
from tests.test_mcp_sdk_e2e import mcp1_python  # noqa: F401  (the side venv with MCP SDK 1.x)

ROOT = Path(__file__).resolve().parents[1]

STATIC_KEY = "STATIC-" + CANARY  # the API key of the key-protected servers
TOKEN_PREFIX = "fault-token-"  # what the token endpoint issues
ODD_KEY = "caf\u00e9-" + CANARY  # a secret that is no valid header value
ALL_TOOLS = {"echo", "add", "progress", "leak"}
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}}
RPC_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def idp() -> Iterator[FaultIdp]:
    with fault_idp() as server:
        yield server


@pytest.fixture(scope="module")
def peer() -> Iterator[GatewayPeer]:
    with start_gateway_peer(TOKEN_PREFIX, STATIC_KEY) as server:
        yield server


def keyed(name: str, endpoint: str, extra: str = "") -> str:
    """A stand-alone server with its own key and bucket. Its host is spelt `localhost`: under the
    catalog entry's `127.0.0.1` URL it would be held to the entry's key and bucket (the tag floor)."""
    return f"""
[[servers]]
name = "{name}"
endpoint = "{endpoint.replace('127.0.0.1', 'localhost')}"
headers = {{ "X-Api-Key" = "{{{{secret:STATIC_KEY}}}}" }}
trust = "trusted"
{extra}
"""


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mcpcreds-gw-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def sidecar(idp: FaultIdp, peer: GatewayPeer, workdir: Path) -> Iterator[SidecarProcess]:
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[secrets]
sources = ["env"]

[services.peer]
endpoint = "{peer.url}"
rate = "1000/1s"
[services.peer.oauth]
token_url = "{idp.token_url}"
client_id = "agent"
client_secret = "{{{{secret:AGENT_SECRET}}}}"

[[servers]]
name = "tools"
service = "peer"
trust = "trusted"
expose = "proxy"

[[servers]]
name = "closed"
service = "peer"

[[servers]]
name = "allow"
service = "peer"
tool_allowlist = ["echo", "progress"]
{keyed("keyed", peer.url, 'rate = "2/1h"' + chr(10) + 'rate_methods = ["tools/call"]' + chr(10) + 'max_wait = "0s"')}
{keyed("impatient", peer.url, 'max_wait = "1s"')}
{keyed("headers-only", peer.url, 'expose = "headers"')}
{keyed("dropper", peer.base + "/drop")}
{keyed("forever", peer.base + "/forever")}
{keyed("linger", peer.base + "/linger")}
{keyed("flood", peer.base + "/flood")}
{keyed("watched", peer.url)}
{keyed("plain", peer.url)}

[[servers]]
name = "odd-key"
endpoint = "{peer.url.replace('127.0.0.1', 'localhost')}"
headers = {{ "X-Api-Key" = "{{{{secret:ODD_KEY}}}}" }}
trust = "trusted"
""")
    env = {"AGENT_SECRET": CANARY, "STATIC_KEY": STATIC_KEY, "ODD_KEY": ODD_KEY}
    with run_sidecar(config, socket, env) as proc:
        yield proc


# ------------------------------------------------------------------------------------- helpers


class Recording(httpx2.AsyncBaseTransport):
    """Every byte the client receives: status lines aside, each header and body chunk."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner
        self.received = bytearray()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        for name, value in response.headers.raw:
            self.received += name + b": " + value + b"\r\n"
        recorder, stream = self, response.stream

        class Stream(httpx2.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in stream:  # type: ignore[union-attr]
                    recorder.received += chunk
                    yield chunk

            async def aclose(self) -> None:
                await stream.aclose()  # type: ignore[union-attr]

        return httpx2.Response(response.status_code, headers=response.headers, stream=Stream(),
                               extensions=response.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def mcp_session(sidecar: SidecarProcess, name: str, grant: str | None = None,
                      recording: Recording | None = None) -> AsyncIterator[ClientSession]:
    """What a user writes: the gateway's client for the MCP SDK 2.x, then a session."""
    async with AsyncClient(sidecar.socket, grant=grant) as creds, creds.mcp_httpx2_client(name) as http:
        if recording is not None:
            recording.inner = http._transport
            http._transport = recording
        async with (streamable_http_client(creds.mcp_url(name), http_client=http) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            yield session


def raw_client(sidecar: SidecarProcess, **headers: str) -> httpx.AsyncClient:
    """Plain httpx on the socket, for what an MCP client would not send."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sidecar.socket)),
                             base_url="http://mcpcreds", headers=headers, timeout=30)


def value(result: Any) -> Any:
    assert not result.is_error, result
    return result.structured_content["result"]


async def healthy(sidecar: SidecarProcess) -> None:
    async with raw_client(sidecar) as http:
        assert (await http.get("/v1/health")).json()["status"] == "ok"


def audit(workdir: Path, event: str) -> list[dict[str, Any]]:
    lines = (workdir / "audit.jsonl").read_text().splitlines()
    return [entry for line in lines if (entry := json.loads(line))["event"] == event]


async def eventually(check: Any, timeout: float = 10.0) -> None:
    """Wait until `check()` holds (what it observes happens in another process)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------------------------- the SDK


async def test_sdk2_initializes_lists_calls_and_ends_its_session_through_the_gateway(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    before = peer.stats()
    async with mcp_session(sidecar, "tools") as session:
        assert {t.name for t in (await session.list_tools()).tools} == ALL_TOOLS
        assert value(await session.call_tool("add", {"a": 2, "b": 3})) == 5
        assert value(await session.call_tool("echo", {"text": "héllo"})) == "héllo"
    after = peer.stats()
    sessions = after["sessions"][len(before["sessions"]):]
    assert sessions[0] is None and len(set(sessions[1:])) == 1 and sessions[1]  # one session throughout
    assert after["requests"]["DELETE"] == before["requests"].get("DELETE", 0) + 1  # the session was ended
    assert after["requests"]["GET"] > before["requests"].get("GET", 0)  # the server's own SSE stream
    assert after["tokens"] and all(t.startswith(TOKEN_PREFIX) for t in after["tokens"])  # the sidecar's login
    assert after["unauthorized"] == before["unauthorized"]


async def test_progress_reaches_the_client_while_the_tool_still_runs(peer: GatewayPeer,
                                                                     sidecar: SidecarProcess) -> None:
    """The tool waits, after its first progress event, until the client has seen that event:
    a gateway that buffered the stream would never deliver it, and the call would not end."""
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)
        if progress == 1:
            await asyncio.to_thread(peer.release)

    async with mcp_session(sidecar, "tools") as session:
        result = await asyncio.wait_for(session.call_tool("progress", {"steps": 3}, progress_callback=on_progress),
                                        30)
    assert value(result) == "done" and seen == [1, 2, 3]


def test_sdk1_through_the_gateway_by_both_of_its_entry_points(mcp1_python: Path,  # noqa: F811
                                                              sidecar: SidecarProcess) -> None:
    proc = subprocess.run([str(mcp1_python), "-m", "tests.peers.mcp_gateway_peer", "client", str(sidecar.socket),
                           "tools"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    runs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["via"] for r in runs] == ["http_client", "httpx_client_factory"]
    for run in runs:
        assert run["mcp"].startswith("1.") and run["tools"] == sorted(ALL_TOOLS) and run["add"] == 5, run
    assert TOKEN_PREFIX not in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------- policy


async def test_an_untrusted_server_without_allowlist_lists_no_tool_and_refuses_every_call(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    before = peer.stats()
    async with mcp_session(sidecar, "closed") as session:
        assert (await session.list_tools()).tools == []
        with pytest.raises(MCPError) as refused:
            await session.call_tool("echo", {"text": "x"})
    assert refused.value.error.code == -32602
    assert "trust policy of server 'closed'" in refused.value.error.message
    after = peer.stats()
    assert after["methods"]["tools/list"] == before["methods"].get("tools/list", 0) + 1  # listed upstream...
    assert after["methods"].get("tools/call", 0) == before["methods"].get("tools/call", 0)  # ...never called


async def test_an_allowlist_shows_exactly_its_tools_and_refuses_the_others_before_the_upstream(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    before = peer.stats()["tools"]
    async with mcp_session(sidecar, "allow") as session:
        assert sorted(t.name for t in (await session.list_tools()).tools) == ["echo", "progress"]
        assert value(await session.call_tool("echo", {"text": "allowed"})) == "allowed"
        for tool in ("add", "leak", "no-such-tool"):
            with pytest.raises(MCPError) as refused:
                await session.call_tool(tool, {})
            assert refused.value.error.code == -32602 and tool not in refused.value.error.message
    after = peer.stats()["tools"]
    assert after.get("echo", 0) == before.get("echo", 0) + 1
    for tool in ("add", "leak", "no-such-tool"):
        assert after.get(tool, 0) == before.get(tool, 0), tool


async def test_a_batch_with_a_refused_call_is_answered_here_and_sends_nothing(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    before = peer.stats()
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {}}},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add", "arguments": {}}}]
    async with raw_client(sidecar) as http:
        answer = await http.post("/mcp/allow", json=batch, headers=RPC_HEADERS)
    assert answer.status_code == 200
    assert [(a["id"], a["error"]["code"]) for a in answer.json()] == [(1, -32600), (2, -32602)]
    assert peer.stats()["requests"] == before["requests"]


# ------------------------------------------------------------------------------------- least privilege


async def test_canary_with_expose_proxy_no_byte_the_client_receives_holds_a_credential(
        idp: FaultIdp, peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    recording = Recording(httpx2.AsyncHTTPTransport())
    async with mcp_session(sidecar, "tools", recording=recording) as session:
        assert {t.name for t in (await session.list_tools()).tools} == ALL_TOOLS
        leaked = json.loads(cast(TextContent, (await session.call_tool("leak", {})).content[0]).text)
        assert leaked["authorization"] == "***"  # the server echoed the token: masked on the way back
        assert value(await session.call_tool("add", {"a": 1, "b": 1})) == 2
    received = bytes(recording.received)
    async with raw_client(sidecar) as http:
        for name in ("tools", "service:peer"):  # every name of the credential
            for method, action in (("GET", "headers"), ("POST", "call")):
                refused = await http.request(method, f"/v1/servers/{name}/{action}")
                assert refused.status_code == 403 and refused.json()["error"]["code"] == "proxy_only", action
                received += refused.content
        for path in ("/v1/status", "/metrics", "/v1/servers"):
            received += (await http.get(path)).content
    tokens = peer.stats()["tokens"]
    assert tokens and received
    assert TOKEN_PREFIX.encode() not in received and CANARY.encode() not in received
    for token in tokens:
        assert token.encode() not in received
    async with AsyncClient(sidecar.socket) as creds:
        with pytest.raises(ProxyOnly):
            await creds.headers("tools")
    result = await asyncio.to_thread(run_cli, "token", "tools", "--socket", str(sidecar.socket))
    assert result.code == 77 and "proxy_only" in result.output and TOKEN_PREFIX not in result.output


async def test_a_credential_the_client_sent_itself_comes_back_unmasked_and_only_in_that_answer(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    """Masking a value the client sent would confirm its guess; the next answer, whose request did
    not carry it, is masked again (the masker kept for the login is not narrowed for good)."""
    async with mcp_session(sidecar, "tools") as session:
        leaked = json.loads(cast(TextContent, (await session.call_tool("leak", {})).content[0]).text)
        assert leaked["authorization"] == "***"
        sent = "Bearer " + peer.stats()["tokens"][-1]  # the header as the server got it: every form
        assert value(await session.call_tool("echo", {"text": sent})) == sent
        leaked = json.loads(cast(TextContent, (await session.call_tool("leak", {})).content[0]).text)
        assert leaked["authorization"] == "***"


async def test_expose_headers_serves_the_credential_and_no_gateway(sidecar: SidecarProcess) -> None:
    async with raw_client(sidecar) as http:
        assert (await http.get("/v1/servers/headers-only/headers")).json()["headers"] == {"X-Api-Key": STATIC_KEY}
        refused = await http.post("/mcp/headers-only", json=INIT, headers=RPC_HEADERS)
    assert refused.status_code == 403
    assert refused.json()["error"]["data"]["code"] == "proxy_disabled" and refused.json()["id"] == 0


async def test_only_mcp_headers_go_upstream_and_the_callers_credentials_stay(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    sent = {"Cookie": "session=caller", "X-Api-Key": "caller-key", "Proxy-Authorization": "Basic Y2FsbGVy",
            "X-Forwarded-For": "10.0.0.1", "Mcp-Session-Id": "caller-session", "MCP-Protocol-Version": "2025-06-18",
            "Last-Event-ID": "41", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "Mcp-Param-Region": "eu", "Mcp-Param-Api-Key": "caller-param-key"}
    async with raw_client(sidecar, **sent) as http:
        await http.post("/mcp/tools", json=INIT, headers=RPC_HEADERS)
    seen = dict(peer.stats()["headers"])
    assert seen["mcp-session-id"] == "caller-session" and seen["mcp-protocol-version"] == "2025-06-18"
    assert seen["last-event-id"] == "41" and seen["traceparent"] == sent["traceparent"]
    assert seen["mcp-param-region"] == "eu"
    assert seen["authorization"].startswith("Bearer " + TOKEN_PREFIX)
    for name in ("cookie", "x-api-key", "proxy-authorization", "x-forwarded-for", "mcp-param-api-key"):
        assert name not in seen, name


async def test_a_grant_reaches_its_servers_only_and_never_travels_upstream(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    async with AsyncClient(sidecar.socket) as creds:
        minted = await creds.grant(["tools"], ttl=60)
    async with mcp_session(sidecar, "tools", grant=minted["grant"]) as session:
        assert value(await session.call_tool("add", {"a": 4, "b": 4})) == 8
    seen = dict(peer.stats()["headers"])
    assert minted["grant"] not in json.dumps(seen) and seen["authorization"].startswith("Bearer " + TOKEN_PREFIX)
    async with raw_client(sidecar, Authorization=f"Bearer {minted['grant']}") as http:
        refused = await http.post("/mcp/allow", json=INIT, headers=RPC_HEADERS)
    assert refused.status_code == 403 and refused.json()["error"]["data"]["code"] == "forbidden"
    async with AsyncClient(sidecar.socket, grant=minted["grant"]) as creds:
        with pytest.raises(Forbidden):
            await creds.headers("tools")  # proxy-only, whoever asks


async def test_what_no_header_can_carry_is_an_error_never_a_500(peer: GatewayPeer,
                                                                 sidecar: SidecarProcess) -> None:
    before = peer.stats()["requests"]
    async with raw_client(sidecar) as http:
        refused = await http.post("/mcp/odd-key", json=INIT, headers=RPC_HEADERS)
        assert refused.status_code == 502 and refused.json()["error"]["data"]["code"] == "upstream_error"
        assert "caf" not in refused.text and CANARY not in refused.text
        assert peer.stats()["requests"] == before  # nothing was sent
        sent = await http.post("/mcp/tools", json=INIT,  # httpx takes str and bytes values mixed; its hint does not
                               headers={**RPC_HEADERS, "User-Agent": "caf\u00e9".encode("latin-1")})  # type: ignore[arg-type]
    assert sent.status_code == 200  # a caller's header is passed on as it came, never re-encoded
    assert dict(peer.stats()["headers"])["user-agent"] == "caf\u00e9"
    await healthy(sidecar)


async def test_a_stale_grant_is_refused_as_an_mcp_client_reads_errors(sidecar: SidecarProcess) -> None:
    async with raw_client(sidecar, Authorization="Bearer revoked-or-never-minted") as http:
        refused = await http.post("/mcp/tools", json=INIT, headers=RPC_HEADERS)
    assert refused.status_code == 403 and refused.json()["id"] == 0
    assert refused.json()["error"]["data"]["code"] == "forbidden"


# ------------------------------------------------------------------------------------- grants narrow tools


async def mint(sidecar: SidecarProcess, body: dict[str, Any], grant: str | None = None) -> httpx.Response:
    """`POST /v1/grants` exactly as sent (bad bodies included)."""
    async with raw_client(sidecar, **({"Authorization": f"Bearer {grant}"} if grant else {})) as http:
        return await http.post("/v1/grants", json=body)


async def test_a_grant_narrows_the_tools_of_a_server_below_its_policy(peer: GatewayPeer, sidecar: SidecarProcess,
                                                                       workdir: Path) -> None:
    """`allow`'s policy exposes echo and progress; the grant allows echo and add: only echo is left."""
    async with AsyncClient(sidecar.socket) as creds:  # the library sends the tools
        minted = await creds.grant(["allow", "tools"], ttl=60, tools={"allow": ["echo", "add"]})
    assert minted["tools"] == {"allow": ["add", "echo"]}
    entry = audit(workdir, "grant")[-1]
    assert entry["id"] == minted["id"] and entry["tools"] == {"allow": ["add", "echo"]}
    before = peer.stats()
    async with mcp_session(sidecar, "allow", grant=minted["grant"]) as session:
        assert [t.name for t in (await session.list_tools()).tools] == ["echo"]
        assert value(await session.call_tool("echo", {"text": "in"})) == "in"
        with pytest.raises(MCPError) as refused:
            await session.call_tool("progress", {"steps": 0})  # the policy allows it, the grant does not
        assert refused.value.error.code == -32602 and "grant" in refused.value.error.message
        assert "progress" not in refused.value.error.message
        with pytest.raises(MCPError) as refused:
            await session.call_tool("add", {"a": 1, "b": 1})  # the grant allows it, the policy does not
        assert refused.value.error.code == -32602 and "trust policy" in refused.value.error.message
    async with mcp_session(sidecar, "tools", grant=minted["grant"]) as session:  # a server it does not narrow
        assert {t.name for t in (await session.list_tools()).tools} == ALL_TOOLS
    after = peer.stats()
    assert after["tools"].get("echo", 0) == before["tools"].get("echo", 0) + 1
    for tool in ("progress", "add"):
        assert after["tools"].get(tool, 0) == before["tools"].get(tool, 0), tool  # never reached the server
    posts = after["requests"]["POST"]
    async with raw_client(sidecar, Authorization=f"Bearer {minted['grant']}") as http:
        answer = await http.post("/mcp/allow", json=[
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {}}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "progress"}}], headers=RPC_HEADERS)
    assert [(a["id"], a["error"]["code"]) for a in answer.json()] == [(1, -32600), (2, -32602)]
    assert peer.stats()["requests"]["POST"] == posts  # a batch with a refused call: nothing sent


async def test_a_sub_grant_can_only_narrow_its_grants_tools(sidecar: SidecarProcess) -> None:
    parent = (await mint(sidecar, {"servers": ["allow", "tools"], "tools": {"allow": ["echo", "progress"]}})).json()
    wider = await mint(sidecar, {"servers": ["allow"], "tools": {"allow": ["echo", "add"]}}, parent["grant"])
    assert wider.status_code == 403 and wider.json()["error"]["code"] == "forbidden"
    inherited = await mint(sidecar, {"servers": ["allow", "tools"]}, parent["grant"])
    assert inherited.status_code == 200 and inherited.json()["tools"] == {"allow": ["echo", "progress"]}
    narrower = (await mint(sidecar, {"servers": ["mcp:allow"], "tools": {"allow": ["progress"]}},
                           parent["grant"])).json()
    assert narrower["tools"] == {"allow": ["progress"]}  # named by the name it resolves to
    nothing = (await mint(sidecar, {"servers": ["allow"], "tools": {"allow": []}}, parent["grant"])).json()
    for grant, tools in ((inherited.json(), ["echo", "progress"]), (narrower, ["progress"]), (nothing, [])):
        async with mcp_session(sidecar, "allow", grant=grant["grant"]) as session:
            assert [t.name for t in (await session.list_tools()).tools] == tools


async def test_grant_tools_are_bounded_and_never_echoed(sidecar: SidecarProcess) -> None:
    made_up = "echo-" + CANARY[:6] + "-server"
    tools: Any
    for tools in ({made_up: ["echo"]}, {"allow": ["x" * 129]}, {"allow": [f"t{i}" for i in range(257)]},
                  {"allow": "echo"}, {"allow": [""]}, {"allow": [7]}, ["allow"], {"allow": [], "mcp:allow": []},
                  {"tools": ["echo"]}):
        refused = await mint(sidecar, {"servers": ["allow"], "tools": tools})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request", tools
        assert made_up not in refused.text and "xxxxxxxx" not in refused.text and "t256" not in refused.text
    assert (await mint(sidecar, {"servers": ["allow"], "tools": {"allow": ["y" * 128] * 2}})).status_code == 200


async def test_a_grant_that_narrows_a_credentials_tools_cannot_take_the_credential(sidecar: SidecarProcess) -> None:
    """With the API key in hand the holder could call any tool: the narrowing would be advisory."""
    narrowed = (await mint(sidecar, {"servers": ["plain"], "tools": {"plain": ["echo"]}})).json()
    plain = (await mint(sidecar, {"servers": ["plain"]})).json()
    async with raw_client(sidecar, Authorization=f"Bearer {narrowed['grant']}") as http:
        for method, action in (("GET", "headers"), ("POST", "call")):
            refused = await http.request(method, f"/v1/servers/plain/{action}")
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "proxy_only", action
            assert STATIC_KEY not in refused.text
    async with raw_client(sidecar, Authorization=f"Bearer {plain['grant']}") as http:
        assert (await http.get("/v1/servers/plain/headers")).json()["headers"] == {"X-Api-Key": STATIC_KEY}
    async with mcp_session(sidecar, "plain", grant=narrowed["grant"]) as session:
        assert [t.name for t in (await session.list_tools()).tools] == ["echo"]


# ------------------------------------------------------------------------------------- live sessions


async def gateway_row(sidecar: SidecarProcess, server: str) -> tuple[dict[str, Any], str]:
    async with raw_client(sidecar) as http:
        answer = await http.get("/v1/status")
    rows = {row["name"]: row for row in answer.json()["gateway"]["servers"]}
    return rows.get(server, {"sessions": 0, "streams": 0, "in_flight": 0}), answer.text


async def status_until(sidecar: SidecarProcess, server: str, check: Any) -> tuple[dict[str, Any], str]:
    """The status row of `server` once `check(row)` holds (what it counts changes in other processes)."""
    deadline = time.monotonic() + 30
    while not check((found := await gateway_row(sidecar, server))[0]):
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.02)
    return found


async def test_status_counts_live_sessions_and_streams_per_server_never_their_ids(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    seen = set(peer.stats()["sessions"])  # the ids of earlier tests' sessions (none if run alone)
    async with mcp_session(sidecar, "watched") as session:
        row, text = await status_until(sidecar, "watched", lambda r: r["sessions"] == 1 and r["streams"] == 1)

        def new_ids() -> set[str]:  # this session's upstream id, on the requests after initialize
            return {s for s in peer.stats()["sessions"] if s and s not in seen}

        await eventually(new_ids)
        ids = new_ids()
        assert len(ids) == 1, ids
        session_id = ids.pop()
        assert row["oldest_session_age"] >= 0 and row["in_flight"] == 0  # the stream: the SDK's GET
        assert session_id not in text
        async with raw_client(sidecar) as http:
            assert session_id not in (await http.get("/metrics")).text
        # a second session, ended by its DELETE (sent here: the SDK's own DELETE at exit is
        # best-effort, and on a loaded machine its cleanup may be cancelled before it is sent)
        async with raw_client(sidecar) as http:
            opened = await http.post("/mcp/watched", json=INIT, headers=RPC_HEADERS)
            other = opened.headers["mcp-session-id"]
            await status_until(sidecar, "watched", lambda r: r["sessions"] == 2)
            ended = await http.delete("/mcp/watched", headers={**RPC_HEADERS, "Mcp-Session-Id": other})
            assert ended.status_code < 300, ended.text
        await status_until(sidecar, "watched", lambda r: r["sessions"] == 1)  # the other one was DELETEd
        assert value(await session.call_tool("echo", {"text": "still here"})) == "still here"
    await status_until(sidecar, "watched", lambda r: r["sessions"] == 0 and r["streams"] == 0)
    async with raw_client(sidecar) as http:  # an id no answer carried counts for nothing, nor does its DELETE
        await http.post("/mcp/watched", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                        headers={**RPC_HEADERS, "Mcp-Session-Id": "made-up"})
    row, _ = await gateway_row(sidecar, "watched")
    assert row["sessions"] == 0


# ------------------------------------------------------------------------------------- streaming

FLOOD = 12 * 2**20  # bytes of SSE events the peer streams


def vm(pid: int, field: str) -> int:
    """A memory figure of a process from /proc/PID/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


async def flood(peer: GatewayPeer, sidecar: SidecarProcess, size: int) -> int:
    """Stream `size` bytes of SSE events from the peer to a slow reader; the bytes received."""
    call = {"jsonrpc": "2.0", "id": "flood", "method": "tools/call",
            "params": {"name": "flood", "arguments": {"bytes": size}}}
    done = peer.stats()["floods_done"]
    received, tail = 0, b""
    async with raw_client(sidecar) as http, http.stream("POST", "/mcp/flood", json=call, headers=RPC_HEADERS) as answer:
        chunks = answer.aiter_raw()
        first = await chunks.__anext__()
        # the first event arrived while the peer waits for the release: relayed, not held back
        assert b'"progress":0' in first and peer.stats()["flood_sent"] == 0
        await asyncio.to_thread(peer.release)
        received = len(first)
        async for chunk in chunks:
            received += len(chunk)
            tail = (tail + chunk)[-256:]
            await asyncio.sleep(0.004)  # a slow reader: the peer is held back by the gateway, not by us
    assert b"flooded" in tail and peer.stats()["floods_done"] == done + 1
    return received


# ------------------------------------------------- one message and the end: a JSON answer
# An SSE answer that is one message and then ends goes to the client as one JSON body: the MCP SDK
# client reads a JSON answer to its end and keeps its connection for the next request, where it
# leaves an SSE answer before its last chunk and opens a new connection per request. What is more
# than one message, or does not end, is relayed as a stream, event by event, never held back.

CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}}}


@asynccontextmanager
async def raw_session(sidecar: SidecarProcess, name: str
                      ) -> AsyncIterator[tuple[httpx2.AsyncClient, str, dict[str, str]]]:
    """The gateway's client, its URL and the headers of an initialized MCP session."""
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client(name) as http:
        url = creds.mcp_url(name)
        init = await http.post(url, json=INIT, headers=RPC_HEADERS)
        headers = {**RPC_HEADERS, "Mcp-Session-Id": init.headers["mcp-session-id"],
                   "MCP-Protocol-Version": "2025-06-18"}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        yield http, url, headers


async def test_a_one_message_answer_is_a_json_body(sidecar: SidecarProcess) -> None:
    async with raw_session(sidecar, "tools") as (http, url, headers):
        answer = await http.post(url, json=CALL, headers=headers)
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
        assert answer.json()["id"] == 7 and answer.json()["result"]["content"][0]["text"] == "hi"
        assert "mcp-session-id" not in answer.headers or answer.headers["mcp-session-id"] == headers["Mcp-Session-Id"]


async def test_the_sdk_client_keeps_one_connection_for_its_calls(sidecar: SidecarProcess) -> None:
    connects: list[str] = []
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client("tools") as http:
        backend: Any = http._transport._pool._network_backend
        connect = backend.connect_unix_socket

        async def counted(path: str, *args: Any, **kwargs: Any) -> Any:
            connects.append(path)
            return await connect(path, *args, **kwargs)

        backend.connect_unix_socket = counted
        async with (streamable_http_client(creds.mcp_url("tools"), http_client=http) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            await session.call_tool("add", {"a": 1, "b": 1})
            before = len(connects)
            for i in range(12):
                assert value(await session.call_tool("add", {"a": i, "b": 1})) == i + 1
            # each SSE answer left before its end cost a new connection: 12 here
            assert len(connects) - before <= 1, connects


async def test_the_sdk_client_writes_each_request_in_one_piece(sidecar: SidecarProcess) -> None:
    """httpcore writes a request's head and its body apart: through `mcp_httpx2_client` they go in
    one write, so the sidecar reads (and wakes up) once per request."""
    writes: list[bytes] = []
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client("tools") as http:
        backend: Any = http._transport._pool._network_backend
        connect = backend.open  # the connection itself, before the one-write wrapper

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            stream = await connect(*args, **kwargs)
            write = stream.write

            async def record(data: bytes, timeout: float | None = None) -> None:
                writes.append(data)
                await write(data, timeout)

            stream.write = record
            return stream

        backend.open = recorded
        async with (streamable_http_client(creds.mcp_url("tools"), http_client=http) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            for i in range(6):
                assert value(await session.call_tool("add", {"a": i, "b": 1})) == i + 1
    heads = [w for w in writes if w.startswith((b"POST ", b"GET ", b"DELETE "))]
    assert len(heads) >= 8 and len(writes) == len(heads), [w[:40] for w in writes]
    assert all(b"\r\n\r\n{" in w for w in heads if w.startswith(b"POST "))  # the body with its head


async def test_an_answer_with_progress_is_relayed_as_a_stream_in_order(peer: GatewayPeer,
                                                                       sidecar: SidecarProcess) -> None:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)
        if progress == 1:
            await asyncio.to_thread(peer.release)

    async with mcp_session(sidecar, "tools") as session:
        result = await asyncio.wait_for(session.call_tool("progress", {"steps": 2}, progress_callback=on_progress),
                                        30)
    assert value(result) == "done" and seen == [1, 2]


async def test_a_server_that_keeps_its_stream_open_after_the_answer_is_not_waited_for(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    """The server sends its answer and holds the stream until the client leaves: a gateway that
    waited for the stream's end to answer in JSON would never answer (bounded here by 30 s)."""
    before = peer.stats()["disconnects"]
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client("linger") as http, \
            http.stream("POST", creds.mcp_url("linger"), json=CALL, headers=RPC_HEADERS) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream"), (answer.status_code, await answer.aread())
        chunks = answer.aiter_raw()
        first = await asyncio.wait_for(anext(chunks), 30)
        assert json.loads(first.split(b"data: ", 1)[1])["id"] == 7
    for _ in range(300):  # the client left: the upstream request is cancelled
        if peer.stats()["disconnects"] > before:
            break
        await asyncio.sleep(0.1)
    assert peer.stats()["disconnects"] > before


async def test_a_big_sse_stream_to_a_slow_reader_passes_with_bounded_sidecar_memory(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    """The peer writes as fast as the gateway reads; the client reads slowly. A gateway that kept
    what the client has not read yet (or read the stream whole) would grow by about FLOOD; one that
    stops reading while its client does not stays within a few events (measured after a first,
    small stream: the allocator's first growth is not what is measured)."""
    pid = sidecar.proc.pid
    assert await flood(peer, sidecar, 2**20) > 2**20
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
    base = vm(pid, "VmRSS")
    assert await flood(peer, sidecar, FLOOD) > FLOOD
    growth = vm(pid, "VmHWM") - base
    assert growth < FLOOD // 3, f"the sidecar grew by {growth / 2**20:.1f} MiB"
    await healthy(sidecar)


# ------------------------------------------------------------------------------------- logins and rate


async def test_a_401_renews_the_login_and_retries_once(idp: FaultIdp, peer: GatewayPeer,
                                                       sidecar: SidecarProcess, workdir: Path) -> None:
    async with mcp_session(sidecar, "tools") as session:
        assert value(await session.call_tool("add", {"a": 1, "b": 2})) == 3
        logins, before = idp.hits["/token"], peer.stats()
        peer.revoke_all()  # the token is unexpired, but the server now answers 401
        assert value(await session.call_tool("add", {"a": 2, "b": 3})) == 5
        after = peer.stats()
        assert idp.hits["/token"] == logins + 1  # one renewal
        assert after["unauthorized"] == before["unauthorized"] + 1  # one 401, then the retry passed
        assert after["tools"]["add"] == before["tools"]["add"] + 2  # the refused attempt and the retry
        assert len(after["tokens"]) == len(before["tokens"]) + 1
    entry = audit(workdir, "invalidation")[-1]
    assert entry["reason"] == "gateway: upstream 401" and entry["renewed"] is True


async def test_a_429_pauses_the_shared_bucket_and_is_retried_after_the_pause(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    async with mcp_session(sidecar, "tools") as session:
        before = peer.stats()
        peer.fail_next_with_429(1, "1")
        started = time.monotonic()
        assert value(await session.call_tool("add", {"a": 20, "b": 22})) == 42
        elapsed = time.monotonic() - started
    after = peer.stats()
    assert after["rate_limited"] == before["rate_limited"] + 1
    assert after["tools"]["add"] == before["tools"].get("add", 0) + 2  # the attempt refused with 429, and one retry
    assert elapsed >= 0.9, elapsed  # the retry waited for the pause
    backoff = await asyncio.to_thread(sidecar.wait_for, "gateway backoff", 5)
    assert backoff["key"] == "service:peer" and backoff["retry"] is True and backoff["retry_after"] == 1


async def test_a_429_whose_pause_exceeds_max_wait_is_passed_on(peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    async with mcp_session(sidecar, "impatient") as session:
        peer.fail_next_with_429(1, "30")
        with pytest.raises(MCPError):
            await session.call_tool("add", {"a": 1, "b": 1})
        async with raw_client(sidecar) as http:  # the shared bucket is paused: the gateway says so itself
            refused = await http.post("/mcp/impatient", json={"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                                              "params": {"name": "add"}}, headers=RPC_HEADERS)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 1
    assert refused.json()["id"] == 5 and refused.json()["error"]["data"]["code"] == "rate_limited"


async def test_the_gateway_takes_one_permit_per_counted_request(peer: GatewayPeer,
                                                                sidecar: SidecarProcess) -> None:
    """`keyed`: 2 permits an hour, counting tools/call only, no waiting."""
    async with mcp_session(sidecar, "keyed") as session:
        for _ in range(3):  # not counted
            assert {t.name for t in (await session.list_tools()).tools} == ALL_TOOLS
        before = peer.stats()["tools"].get("echo", 0)
        assert value(await session.call_tool("echo", {"text": "1"})) == "1"
        assert value(await session.call_tool("echo", {"text": "2"})) == "2"
        with pytest.raises(MCPError) as limited:
            await session.call_tool("echo", {"text": "3"})
        assert limited.value.error.data["code"] == "rate_limited"
        async with raw_client(sidecar) as http:
            answer = await http.post("/mcp/keyed", json={"jsonrpc": "2.0", "id": "x", "method": "tools/call",
                                                         "params": {"name": "echo"}}, headers=RPC_HEADERS)
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) > 1000
    assert answer.json()["id"] == "x" and answer.json()["error"]["data"]["code"] == "rate_limited"
    assert peer.stats()["tools"]["echo"] == before + 2


# ------------------------------------------------------------------------------------- bad input


async def test_malformed_json_rpc_is_answered_here(peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    before = peer.stats()["requests"]
    async with raw_client(sidecar) as http:
        for raw, code in ((b"{not json", -32700), (b'{"jsonrpc": "2.0", "id": 1}', -32600), (b"[]", -32600)):
            answer = await http.post("/mcp/tools", content=raw, headers=RPC_HEADERS)
            assert answer.status_code == 400
            assert answer.json()["error"]["code"] == code and answer.json()["id"] is None
        assert (await http.put("/mcp/tools", content=b"{}")).status_code == 405
        assert (await http.post("/mcp/nope", json=INIT)).json()["error"]["data"]["code"] == "unknown_server"
    assert peer.stats()["requests"] == before
    await healthy(sidecar)


async def test_a_body_over_the_limit_is_refused_and_nothing_sent(peer: GatewayPeer,
                                                                 sidecar: SidecarProcess) -> None:
    before = peer.stats()["requests"]
    big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"text": "x" * MAX_GATEWAY_BODY_BYTES}}})
    async with raw_client(sidecar) as http:
        answer = await http.post("/mcp/tools", content=big, headers=RPC_HEADERS)
        assert answer.status_code == 413 and answer.json()["error"]["code"] == "payload_too_large"
        assert peer.stats()["requests"] == before
        # bigger than the API's 64 KiB, within the gateway's limit: relayed (a notification: no answer)
        fits = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"pad": "x" * (MAX_GATEWAY_BODY_BYTES - 1024)}}
        assert (await http.post("/mcp/tools", json=fits, headers=RPC_HEADERS)).status_code != 413
    assert peer.stats()["requests"]["POST"] == before.get("POST", 0) + 1
    async with mcp_session(sidecar, "tools") as session:  # an SDK client's big call (its answer < 1 MiB)
        text = "y" * 300_000
        assert value(await session.call_tool("echo", {"text": text})) == text
    await healthy(sidecar)


async def test_an_upstream_that_drops_mid_stream_ends_the_clients_stream_cleanly(
        peer: GatewayPeer, sidecar: SidecarProcess, workdir: Path) -> None:
    call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "echo"}}
    async with raw_client(sidecar) as http, http.stream("POST", "/mcp/dropper", json=call,
                                                        headers=RPC_HEADERS) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
        body = await answer.aread()  # a clean end of the chunked body: no error here
    assert body.count(b"data:") == 1 and b"first and last event" in body and b"partial" not in body
    assert audit(workdir, "tool_call")[-1]["status"] == "dropped"

    async def sdk_session() -> None:
        async with mcp_session(sidecar, "dropper"):
            pass

    with pytest.raises(Exception) as failed:  # what the SDK makes of it: an error, not a hang
        await asyncio.wait_for(sdk_session(), 30)
    assert failed.group_contains(MCPError, match="SSE stream ended without a response")
    await healthy(sidecar)


async def test_a_client_that_leaves_cancels_the_upstream_stream(peer: GatewayPeer, sidecar: SidecarProcess,
                                                                workdir: Path) -> None:
    before = peer.stats()["disconnects"]
    call = {"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "echo"}}
    async with raw_client(sidecar) as http, http.stream("POST", "/mcp/forever", json=call,
                                                        headers=RPC_HEADERS) as answer:
        first = await answer.aiter_raw().__anext__()
        assert b"first and last event" in first
    await eventually(lambda: peer.stats()["disconnects"] == before + 1)
    await eventually(lambda: audit(workdir, "tool_call")[-1]["status"] == "cancelled")
    await healthy(sidecar)


# ------------------------------------------------------------------------------------- audit, metrics


async def test_each_tool_call_is_audited_and_measured_without_its_arguments(
        sidecar: SidecarProcess, workdir: Path) -> None:
    marker = "ARGUMENT-" + os.urandom(4).hex()
    async with AsyncClient(sidecar.socket) as creds:
        minted = await creds.grant(["allow"], ttl=60)
    async with mcp_session(sidecar, "allow", grant=minted["grant"]) as session:
        assert value(await session.call_tool("echo", {"text": marker})) == marker
        with pytest.raises(MCPError):
            await session.call_tool("add", {"a": 1, "b": 2})
    lines = audit(workdir, "tool_call")
    ok, refused = lines[-2], lines[-1]
    assert (ok["server"], ok["tool"], ok["status"], ok["grant"]) == ("allow", "echo", "ok", minted["id"])
    assert ok["uid"] == os.getuid() and ok["pid"] > 0 and 0 < ok["duration"] < 30 and ok["key"] == "service:peer"
    assert (refused["tool"], refused["status"]) == ("add", "refused")
    assert marker not in (workdir / "audit.jsonl").read_text()
    async with raw_client(sidecar) as http:
        metrics = (await http.get("/metrics")).text
    assert 'mcpcreds_tool_calls_total{server="allow",tool="echo",status="ok"}' in metrics
    assert 'mcpcreds_tool_calls_total{server="allow",tool="_refused",status="refused"}' in metrics
    assert 'mcpcreds_tool_call_seconds_count{server="allow",tool="echo"}' in metrics
    assert 'mcpcreds_gateway_requests_total{server="allow",method="POST",status="200"}' in metrics
    assert 'mcpcreds_gateway_request_seconds_bucket{server="allow",le="+Inf"}' in metrics
    assert marker not in metrics


# ------------------------------------------------------------------------------------- the library


async def test_the_gateway_client_checks_the_socket_before_a_byte(sidecar: SidecarProcess, tmp_path: Path) -> None:
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_http_client("tools") as http:
        assert str(http.base_url).rstrip("/") == creds.mcp_url("tools") == "http://mcpcreds/mcp/tools"
        assert (await http.get("http://mcpcreds/v1/health")).status_code == 200
    shared = tmp_path / "shared"
    shared.mkdir()
    link = shared / "s.sock"
    link.symlink_to(sidecar.socket)  # the real sidecar, behind a folder others may write to
    shared.chmod(0o777)
    async with AsyncClient(link) as creds:
        for build in (creds.mcp_http_client, creds.mcp_httpx2_client):
            with pytest.raises(UntrustedSidecar):
                build("tools")  # checked when the client is built...
    shared.chmod(0o700)
    async with AsyncClient(link) as creds, creds.mcp_http_client("tools") as http:
        shared.chmod(0o777)  # ...and again when it connects
        with pytest.raises(UntrustedSidecar):
            await http.get("http://mcpcreds/v1/health")


async def test_the_gateway_client_sends_nothing_to_a_listener_of_another_uid() -> None:
    """A socket in a folder that passes, but `nobody` listens on it: refused once connected."""
    arena = Path(tempfile.mkdtemp(prefix="mcpcreds-arena-"))
    arena.chmod(0o755)
    listener = Listener(folder(arena / "theirs", uid=NOBODY) / "s.sock", as_nobody=True)
    try:
        listener.moved_to(folder(arena / "ours") / "s.sock")
        async with AsyncClient(listener.path) as creds:
            for build in (creds.mcp_http_client, creds.mcp_httpx2_client):
                async with build("tools") as http:
                    with pytest.raises(UntrustedSidecar) as refused:
                        await http.post(creds.mcp_url("tools"), json=INIT)
                assert f"runs as uid {NOBODY}" in refused.value.message
        assert await asyncio.to_thread(listener.connections) == ["", ""]  # connected, sent nothing
    finally:
        listener.stop()
        shutil.rmtree(arena, ignore_errors=True)


# ------------------------------------------------------------------------------------- wire streaming


class _Transport(asyncio.Transport):
    """What the connection writes, on a real socket pair (for SO_PEERCRED)."""

    def __init__(self) -> None:
        super().__init__()
        self.sock, self._peer = __import__("socket").socketpair()
        self.written = bytearray()
        self.writes: list[bytes] = []
        self.aborted = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sock if name == "socket" else default

    def write(self, data: Any) -> None:
        self.written += data
        self.writes.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Body:
    def __init__(self, fail: bool = False) -> None:
        self.pulled: list[int] = []
        self.closed = False
        self.fail = fail

    async def _chunks(self) -> AsyncIterator[bytes]:
        for i in range(5):
            self.pulled.append(i)
            yield b"c%d" % i
        if self.fail:
            raise RuntimeError("the upstream went away")

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def aclose(self) -> None:
        self.closed = True


def _connection(body: _Body, first: bytes = b"", ended: bool = False) -> tuple[Any, _Transport]:
    from mcpcreds.core.http import StreamingResponse
    from mcpcreds.sidecar.wire import Connections, HttpConnection

    class App:
        def handle(self, request: Any) -> Any:
            return StreamingResponse(200, body, first=first, ended=ended)

        def fast_get(self, url: bytes, started: float, peer_uid: int) -> None:
            return None

        def observe(self, route: str, status: int, seconds: float) -> None:
            pass

    transport = _Transport()
    conn = HttpConnection(App(), lambda: frozenset({os.getuid()}), Connections())
    conn.connection_made(transport)
    return conn, transport


async def test_a_streaming_body_is_not_read_while_the_client_does_not_read() -> None:
    body = _Body()
    conn, transport = _connection(body)
    conn.pause_writing()  # the client's transport is full
    conn.data_received(b"GET /mcp/x HTTP/1.1\r\nHost: mcpcreds\r\n\r\n")
    for _ in range(50):  # the loop runs freely: nothing else can make the body go on
        await asyncio.sleep(0)
    assert body.pulled == [0]
    assert transport.written.endswith(b"Transfer-Encoding: chunked\r\n\r\n2\r\nc0\r\n")
    conn.resume_writing()
    await conn.in_flight
    assert body.pulled == [0, 1, 2, 3, 4] and body.closed
    assert transport.written.endswith(b"2\r\nc4\r\n0\r\n\r\n") and not transport.aborted
    transport.sock.close()
    transport._peer.close()


async def test_a_first_chunk_ready_with_the_head_goes_out_in_the_same_write() -> None:
    """(A POST's SSE answer: the gateway waits for the first event and hands it over with the
    head, so the client reads both at once.) What follows streams chunk by chunk as before."""
    body = _Body()
    conn, transport = _connection(body, first=b"f")
    conn.data_received(b"POST /mcp/x HTTP/1.1\r\nHost: mcpcreds\r\nContent-Length: 0\r\n\r\n")
    await conn.in_flight
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b"Transfer-Encoding: chunked\r\n\r\n1\r\nf\r\n")
    assert transport.written.endswith(b"\r\n1\r\nf\r\n" + b"".join(b"2\r\nc%d\r\n" % i for i in range(5))
                                      + b"0\r\n\r\n")
    assert body.closed and not transport.aborted
    transport.sock.close()
    transport._peer.close()


async def test_a_body_all_there_goes_out_with_its_head_and_end_in_one_write() -> None:
    """(A POST's SSE answer whose upstream answer came whole before the gateway relayed it.) The
    body is not read, only closed; the connection serves the next request."""
    body = _Body()
    conn, transport = _connection(body, first=b"all", ended=True)
    conn.data_received(b"POST /mcp/x HTTP/1.1\r\nHost: mcpcreds\r\nContent-Length: 0\r\n\r\n")
    await conn.in_flight
    assert len(transport.writes) == 1
    assert transport.writes[0].endswith(b"Transfer-Encoding: chunked\r\n\r\n3\r\nall\r\n0\r\n\r\n")
    assert body.closed and body.pulled == [] and conn.connections.busy() == 0 and not transport.aborted
    conn.data_received(b"POST /mcp/x HTTP/1.1\r\nHost: mcpcreds\r\nContent-Length: 0\r\n\r\n")
    await conn.in_flight
    assert len(transport.writes) == 2 and transport.writes[1].startswith(b"HTTP/1.1 200 OK\r\n")
    transport.sock.close()
    transport._peer.close()


async def test_a_body_that_fails_after_the_head_cuts_the_connection() -> None:
    body = _Body(fail=True)
    conn, transport = _connection(body)
    conn.data_received(b"GET /mcp/x HTTP/1.1\r\nHost: mcpcreds\r\n\r\n")
    await conn.in_flight  # the failure is the connection's to handle: it cuts it
    assert transport.aborted and body.closed and conn.in_flight is None
    assert not transport.written.endswith(b"0\r\n\r\n")  # never a complete-looking answer
    transport.sock.close()
    transport._peer.close()


def test_only_an_answer_of_exactly_one_message_is_read_as_one() -> None:
    from mcpcreds.gateway.stream import single_message

    message = b'{"jsonrpc":"2.0","id":1,"result":{}}'
    assert single_message(b"id: 0\ndata:\n\n" + b"data: " + message + b"\n\n") == message  # a priming event
    assert single_message(b":\n\n" + b"id: 4\ndata: " + message + b"\n\n") == message
    assert single_message(b"data: " + message + b"\n\ndata: " + message + b"\n\n") is None
    assert single_message(b"id: 0\ndata:\n\n") is None
