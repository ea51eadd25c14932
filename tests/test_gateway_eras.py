"""Both protocol eras through every relay, with real parts: the MCP SDK 2.x `Client` in `auto` mode
(2026-07-28: `server/discover`, `_meta` on each request, `input_required` results,
`subscriptions/listen`) and in `legacy` mode (the 2025 handshake), through the gateway on the
socket and on the loopback listener, through `mcpcreds stdio`, and through `mcpcreds exec`'s stdio
relay, against a server of both eras (tests/peers/mcp_eras_peer.py: the SDK's own); the MCP
TypeScript SDK's client against `@modelcontextprotocol/server-everything` (2025-11-25 and its
tasks) and against the SDK's own server (through the loopback listener and `mcpcreds stdio`); raw
requests of each 2025 revision; the headers of the 2026-07-28 era, a task of each era, and the
rate both eras' retries and polls take."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp.types import ElicitResult

from mcpcreds import AsyncClient
from tests.peers.mcp_eras_peer import TASKS, start_eras_peer
from tests.peers.process import PeerHandle, ready_process
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_gateway_tcp import listening

ROOT = Path(__file__).resolve().parents[1]
TS = ROOT / "tests" / "peers" / "ts_client"
ALLOWED = '["add", "ask", "grow", "grown", "region", "slow"]'
MODERN = "2026-07-28"
RELAYS = ("socket", "tcp", "stdio", "exec")
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def peer() -> Iterator[PeerHandle]:
    with start_eras_peer() as server:
        yield server


@pytest.fixture(scope="module")
def everything() -> Iterator[str]:
    """`@modelcontextprotocol/server-everything` (npm), over Streamable HTTP."""
    if not (TS / "node_modules" / "@modelcontextprotocol" / "server-everything").is_dir():
        raise RuntimeError(f"{TS}/node_modules missing: run .ci/run (npm ci in tests/peers/ts_client)")
    with ready_process(lambda _: ["node", "everything.mjs"], what="server-everything", cwd=TS,
                       timeout=60) as (_, base, _workdir):
        yield f"{base}/mcp"


@pytest.fixture(scope="module")
def sidecar(peer: PeerHandle, everything: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("eras")
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    metered = "".join(f'\n[[servers]]\nname = "metered-{relay}"\nendpoint = "{peer.url}"\ntrust = "untrusted"\n'
                      f'tool_allowlist = {ALLOWED}\nrate = "3/1h"\nmax_wait = "0s"\n' for relay in ("socket", "tcp"))
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[gateway]
listen = "127.0.0.1:0"

[[servers]]
name = "eras"
endpoint = "{peer.url}"
trust = "untrusted"
tool_allowlist = {ALLOWED}

{metered}
[[servers]]
name = "everything"
endpoint = "{everything}"
trust = "untrusted"
tool_allowlist = ["echo", "get-sum", "simulate-research-query"]

[[servers]]
name = "everything-metered"
endpoint = "{everything}"
trust = "untrusted"
tool_allowlist = ["echo", "simulate-research-query"]
rate = "3/1h"
max_wait = "0s"

[exec.eras]
trust = "untrusted"
tool_allowlist = {ALLOWED}
""")
    with run_sidecar(config, socket) as proc:
        yield proc


class Seen:
    def __init__(self) -> None:
        self.elicitations: list[Any] = []
        self.changed = asyncio.Event()

    async def elicit(self, context: Any, params: Any) -> ElicitResult:
        self.elicitations.append(params)
        return ElicitResult(action="accept", content={"name": "Ada"})

    async def message(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self.changed.set()


def stdio_params(sidecar: SidecarProcess, relay: str, tmp_path: Path) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k not in ("MCPCREDS_GRANT", "MCPCREDS_SOCKET")}
    env.update(PYTHONPATH=os.pathsep.join((str(ROOT / "src"), str(ROOT))), MCPCREDS_SOCKET=str(sidecar.socket),
               MCPCREDS_CONFIG=str(sidecar.config), XDG_CONFIG_HOME=str(tmp_path / "no-config"))
    args = (["-m", "mcpcreds", "stdio", "eras"] if relay == "stdio" else
            ["-m", "mcpcreds", "exec", "eras", "--", sys.executable, "-m", "tests.peers.mcp_eras_peer", "stdio"])
    return StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(ROOT))


@asynccontextmanager
async def connect(relay: str, sidecar: SidecarProcess, mode: str, seen: Seen, tmp_path: Path,
                  name: str = "eras") -> AsyncIterator[Client]:
    """The SDK's `Client` through one relay: the gateway on the socket or the loopback listener,
    `mcpcreds stdio`, or `mcpcreds exec`'s stdio relay (a stdio server of its own)."""
    callbacks: dict[str, Any] = {"mode": mode, "elicitation_callback": seen.elicit, "message_handler": seen.message}
    if relay == "socket":
        async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client(name) as http, \
                Client(streamable_http_client(creds.mcp_url(name), http_client=http), **callbacks) as client:
            yield client
    elif relay == "tcp":
        async with httpx2.AsyncClient() as http, \
                Client(streamable_http_client(f"http://{listening(sidecar)}/mcp/{name}", http_client=http),
                       **callbacks) as client:
            yield client
    else:
        with (tmp_path / f"{relay}.stderr").open("w") as errlog:
            async with Client(stdio_client(stdio_params(sidecar, relay, tmp_path), errlog=errlog),
                              **callbacks) as client:
                yield client


def text(result: Any) -> str:
    assert not result.is_error, result
    return str(result.content[0].text)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("relay", RELAYS)
async def test_each_era_lists_calls_asks_hears_of_changes_and_is_refused_through_each_relay(
        peer: PeerHandle, sidecar: SidecarProcess, tmp_path: Path, relay: str, mode: str) -> None:
    seen = Seen()
    async with connect(relay, sidecar, mode, seen, tmp_path) as client:
        assert client.protocol_version == (MODERN if mode == "auto" else "2025-11-25")
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert {"add", "ask", "grow", "region", "slow"} <= listed and "hidden" not in listed
        assert text(await client.call_tool("add", {"a": 2, "b": 3})) == "5"
        # the server asks the user: an input_required round trip (auto), a request mid-call (legacy)
        assert text(await client.call_tool("ask", {})) == "accept"
        assert [e.message for e in seen.elicitations] == ["What is your name?"]
        # x-mcp-header: Mcp-Param-Region must reach the server as the body says (2026-07-28)
        assert text(await client.call_tool("region", {"region": "eu-west", "query": "q"})) == "eu-west: q"
        with pytest.raises(MCPError) as refused:
            await client.call_tool("hidden", {})
        assert refused.value.error.code == -32602
        if mode == "auto":  # the change notice on a subscriptions/listen stream
            async with client.listen(tools_list_changed=True) as subscription:
                assert text(await client.call_tool("grow", {})) == "grown"
                event = await asyncio.wait_for(anext(aiter(subscription)), 30)
            assert isinstance(event, ToolsListChanged)
        else:  # on the session's streams
            assert text(await client.call_tool("grow", {})) == "grown"
            await asyncio.wait_for(seen.changed.wait(), 30)
        assert "grown" in {tool.name for tool in (await client.list_tools()).tools}
    if relay != "exec":  # the exec relay's server is a child of its own
        assert peer.stats()["calls"].get("hidden", 0) == 0


# ------------------------------------------------------------------------------------- raw requests


def meta(extensions: bool = False) -> dict[str, Any]:
    caps: dict[str, Any] = {"elicitation": {"form": {}}}
    if extensions:
        caps["extensions"] = {TASKS: {}}
    return {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": caps}


def call(id_: int, tool: str, arguments: dict[str, Any], **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta(True), **params}}


@asynccontextmanager
async def raw(sidecar: SidecarProcess, relay: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    if relay == "socket":
        async with AsyncClient(sidecar.socket) as creds, creds.mcp_http_client("eras") as http:
            yield http, creds.mcp_url("eras").removesuffix("eras")
    else:
        async with httpx.AsyncClient(base_url=f"http://{listening(sidecar)}") as http:
            yield http, f"http://{listening(sidecar)}/mcp/"


def last_post(peer: PeerHandle, method: str) -> dict[str, str]:
    headers: dict[str, str] = [p for p in peer.stats()["posts"] if p["method"] == method][-1]["headers"]
    return headers


@pytest.mark.parametrize("relay", ["socket", "tcp"])
async def test_the_2026_headers_are_derived_from_the_body_and_a_contradicting_one_is_refused(
        peer: PeerHandle, sidecar: SidecarProcess, relay: str) -> None:
    async with raw(sidecar, relay) as (http, base):
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}}
        listed = (await http.post(base + "eras", json=listing, headers=HEADERS)).json()["result"]
        # the cache hints pass (from the gateway's copy, the second time: what is left of its 30 s)
        assert 0 < listed["ttlMs"] <= 30_000 and listed["cacheScope"] == "private"
        # a client that sent none of the headers: the server gets each, from the body
        answer = await http.post(base + "eras", json=call(2, "region", {"region": "us-east", "query": "q"}),
                                 headers=HEADERS)
        assert answer.json()["result"]["content"][0]["text"] == "us-east: q"
        assert last_post(peer, "tools/call") == {"mcp-protocol-version": MODERN, "mcp-method": "tools/call",
                                                 "mcp-name": "region", "mcp-param-region": "us-east"}
        calls = peer.stats()["calls"]
        for said in ({"Mcp-Method": "tools/list"}, {"Mcp-Name": "add"}, {"Mcp-Param-Region": "eu-west"},
                     {"MCP-Protocol-Version": "2025-11-25"}):
            refused = await http.post(base + "eras", json=call(3, "region", {"region": "us-east", "query": "q"}),
                                      headers={**HEADERS, **said})
            assert refused.status_code == 400 and refused.json()["error"]["code"] == -32020, said
            assert refused.json()["id"] == 3
        assert peer.stats()["calls"] == calls  # never forwarded


@pytest.mark.parametrize("relay", ["socket", "tcp"])
async def test_a_task_is_relayed_and_its_polls_and_an_input_rounds_retry_take_no_permit(
        peer: PeerHandle, sidecar: SidecarProcess, relay: str) -> None:
    """`metered-*` has 3 permits an hour and waits for none: the task's call takes one and its polls
    none; the call that asks for input one and its retry none; one more call takes the last."""
    async with raw(sidecar, relay) as (http, base):
        url = base + f"metered-{relay}"
        created = (await http.post(url, json=call(1, "slow", {"text": "later"}), headers=HEADERS)).json()["result"]
        assert created["resultType"] == "task" and created["status"] == "working"
        statuses = []
        for n in range(3):
            got = await http.post(url, headers=HEADERS, json={
                "jsonrpc": "2.0", "id": 10 + n, "method": "tasks/get",
                "params": {"taskId": created["taskId"], "_meta": meta(True)}})
            statuses.append(got.json()["result"]["status"])
        assert statuses == ["working", "working", "completed"]
        assert got.json()["result"]["result"]["content"][0]["text"] == "later"
        asked = (await http.post(url, json=call(20, "ask", {}), headers=HEADERS)).json()["result"]
        assert asked["resultType"] == "input_required" and asked["requestState"].startswith("mcpcreds-rs:")
        [key] = asked["inputRequests"]
        retry = call(21, "ask", {}, inputResponses={key: {"action": "accept", "content": {"name": "Ada"}}},
                     requestState=asked["requestState"])
        answered = (await http.post(url, json=retry, headers=HEADERS)).json()
        assert answered["result"]["content"][0]["text"] == "accept"
        assert (await http.post(url, json=call(30, "add", {"a": 1, "b": 1}), headers=HEADERS)).status_code == 200
        limited = await http.post(url, json=call(31, "add", {"a": 1, "b": 1}), headers=HEADERS)
        assert limited.status_code == 429 and limited.json()["error"]["data"]["code"] == "rate_limited"
        # a requestState is the caller's once: replayed, it is refused, not a free call
        replayed = await http.post(url, json={**retry, "id": 22}, headers=HEADERS)
        assert replayed.json()["error"]["code"] == -32602


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
@pytest.mark.parametrize("relay", ["socket", "tcp"])
async def test_each_2025_revision_lists_calls_and_is_refused(peer: PeerHandle, sidecar: SidecarProcess,
                                                            relay: str, version: str) -> None:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
    async with raw(sidecar, relay) as (http, base):
        opened = await http.post(base + "eras", json=init, headers=HEADERS)
        assert _messages(opened)[0]["result"]["protocolVersion"] == version
        session = {**HEADERS, "Mcp-Session-Id": opened.headers["mcp-session-id"]}
        if version != "2025-03-26":
            session["MCP-Protocol-Version"] = version
        await http.post(base + "eras", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                        headers=session)
        listed = _messages(await http.post(base + "eras", headers=session,
                                           json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        assert "hidden" not in {t["name"] for t in listed[0]["result"]["tools"]}
        added = _messages(await http.post(base + "eras", headers=session, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 1, "b": 2}}}))
        assert added[-1]["result"]["content"][0]["text"] == "3"
        refused = _messages(await http.post(base + "eras", headers=session, json={
            "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "hidden", "arguments": {}}}))
        assert refused[0]["error"]["code"] == -32602


def _messages(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a JSON or SSE answer."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")
                and line[5:].strip()]
    return [response.json()]


# ------------------------------------------------------------------------------------- server-everything


@pytest.mark.parametrize("relay", ["socket", "tcp"])
async def test_an_sdk_client_of_2026_falls_back_to_the_handshake_with_a_2025_server(
        sidecar: SidecarProcess, tmp_path: Path, relay: str) -> None:
    async with connect(relay, sidecar, "auto", Seen(), tmp_path, name="everything") as client:
        assert client.protocol_version == "2025-11-25"
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert listed == {"echo", "get-sum", "simulate-research-query"}
        assert text(await client.call_tool("echo", {"message": "hi"})) == "Echo: hi"
        with pytest.raises(MCPError) as refused:
            await client.call_tool("get-env", {})
        assert refused.value.error.code == -32602


async def test_a_2025_task_is_relayed_and_its_polls_and_result_take_no_permit(sidecar: SidecarProcess) -> None:
    """`everything-metered` has 3 permits an hour and waits for none: `initialize` takes one, the
    call that creates a task (2025-11-25) one and the task's `tasks/get` and `tasks/result` none;
    one more call takes the last."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"tasks": {}}, "clientInfo": {"name": "raw", "version": "0"}}}
    async with raw(sidecar, "socket") as (http, base):
        url = base + "everything-metered"
        opened = await http.post(url, json=init, headers=HEADERS)
        assert _messages(opened)[0]["result"]["protocolVersion"] == "2025-11-25"
        session = {**HEADERS, "Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)

        def request(id_: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
            return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}

        async def rpc(id_: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
            answer = await http.post(url, headers=session, json=request(id_, method, params))
            assert answer.status_code == 200, (method, answer.text)  # a 429: the request took a permit
            result: dict[str, Any] = _messages(answer)[-1]["result"]
            return result

        task = (await rpc(1, "tools/call", {"name": "simulate-research-query", "arguments": {"topic": "permits"},
                                            "task": {"ttl": 60000}}))["task"]
        assert task["status"] == "working"
        polled = [(await rpc(10 + n, "tasks/get", {"taskId": task["taskId"]}))["status"] for n in range(3)]
        assert set(polled) <= {"working", "completed"}, polled
        result = await rpc(20, "tasks/result", {"taskId": task["taskId"]})
        assert result["content"][0]["text"].startswith("# Research Report: permits")
        assert (await rpc(21, "tasks/get", {"taskId": task["taskId"]}))["status"] == "completed"
        echoed = await rpc(30, "tools/call", {"name": "echo", "arguments": {"message": "last"}})
        assert echoed["content"][0]["text"] == "Echo: last"
        limited = await http.post(url, headers=session, json=request(
            31, "tools/call", {"name": "echo", "arguments": {"message": "one too many"}}))
        assert limited.status_code == 429 and limited.json()["error"]["data"]["code"] == "rate_limited"


def ts_client(plan: dict[str, Any]) -> dict[str, Any]:
    """What the TypeScript SDK's client saw, run as `plan` says (tests/peers/ts_client/eras.mjs)."""
    run = subprocess.run(["node", str(TS / "eras.mjs"), json.dumps(plan)], capture_output=True, text=True,
                         timeout=90, check=True)
    seen: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    assert "error" not in seen, (seen, run.stderr[-2000:])
    return seen


def test_the_typescript_sdk_client_runs_a_task_of_server_everything(sidecar: SidecarProcess) -> None:
    """The TypeScript SDK's client (2025-11-25) through the loopback listener: list, call, a refused
    call, and `simulate-research-query` as a task followed to its result."""
    seen = ts_client({"url": f"http://{listening(sidecar)}/mcp/everything", "refuse": "get-env", "task": True,
                      "call": {"name": "echo", "arguments": {"message": "héllo"}}})
    assert seen["protocol"] == "2025-11-25" and seen["tools"] == ["echo", "get-sum", "simulate-research-query"]
    assert seen["called"] == "Echo: héllo"
    assert seen["refused"]["code"] == -32602
    assert seen["task"][0] == "created:working" and seen["task"][-1].startswith("result:# Research Report")


@pytest.mark.parametrize("relay", ["tcp", "stdio"])
def test_the_typescript_sdk_client_lists_calls_and_is_refused_by_the_python_sdks_server(
        peer: PeerHandle, sidecar: SidecarProcess, tmp_path: Path, relay: str) -> None:
    """The TypeScript SDK's client against the Python SDK's two-era server (which takes its
    2025-11-25 handshake), through the loopback listener, and through `mcpcreds stdio` spawned by the
    SDK's StdioClientTransport as a desktop client spawns it (the SDK speaks no Unix socket)."""
    if relay == "tcp":
        plan: dict[str, Any] = {"url": f"http://{listening(sidecar)}/mcp/eras"}
    else:
        params = stdio_params(sidecar, relay, tmp_path)
        plan = {"command": params.command, "args": params.args, "env": params.env, "cwd": str(params.cwd)}
    seen = ts_client({**plan, "call": {"name": "add", "arguments": {"a": 2, "b": 3}}, "refuse": "hidden"})
    assert seen["protocol"] == "2025-11-25"
    assert {"add", "ask", "grow", "region", "slow"} <= set(seen["tools"]) and "hidden" not in seen["tools"]
    assert seen["called"] == "5"
    assert seen["refused"]["code"] == -32602
    assert peer.stats()["calls"].get("hidden", 0) == 0
