"""The gateway forwards only what it checked, both ways (hardening, second round), end to end: the
real sidecar (`mcpcreds serve`) on its socket, a hostile upstream that reads JSON as Go does and
answers in every spelling a lenient client reads (tests/peers/hostile_mcp.py), and the real MCP
SDK 2.x client where what a client sees is the point.

- a body that a Go server reads as another call than the gateway judged is refused, and what goes
  upstream is the body as the gateway read it, written anew;
- an answer the gateway cannot read one way only is withheld, never passed on (hidden tools);
- a tool list in a 2026-07-28 `server/discover` result is filtered as `tools/list`'s is;
- a compressed answer is refused without being inflated;
- the credential is masked in every spelling an answer can carry, and a guess the client sent is
  never masked;
- `Mcp-Method` / `Mcp-Name` say what the body says; an MCP session belongs to the caller that
  opened it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from mcpcreds import AsyncClient
from tests.conftest import CANARY
from tests.peers.hostile_mcp import HIDDEN, SESSION, HostileUpstream, hostile_upstream
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_gateway import RPC_HEADERS, raw_client, vm
from tests.test_gateway_tcp import listening

TS_CLIENT = Path(__file__).parent / "peers" / "ts_client"

KEY = "HOSTILE-KEY-" + CANARY
FORMS = ("two-events", "sse-latin1", "utf16", "bom", "json-seq", "comma", "deep", "gzip")


@pytest.fixture(scope="module")
def upstream() -> Iterator[HostileUpstream]:
    with hostile_upstream() as server:
        yield server


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mcpcreds-hgw-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def server(name: str, endpoint: str, policy: str = 'trust = "untrusted"\ntool_allowlist = ["search"]') -> str:
    return f"""
[[servers]]
name = "{name}"
endpoint = "{endpoint}"
headers = {{ "X-Api-Key" = "{{{{secret:KEY}}}}" }}
{policy}
"""


@pytest.fixture(scope="module")
def sidecar(upstream: HostileUpstream, workdir: Path) -> Iterator[SidecarProcess]:
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    servers = "".join(server(f"lie-{form}", upstream.url(form)) for form in FORMS)
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[gateway]
listen = "127.0.0.1:0"

[secrets]
sources = ["env"]
{server("go", upstream.url("json"))}
{server("echo", upstream.url("echo"), 'trust = "trusted"')}
{servers}
""")
    with run_sidecar(config, socket, {"KEY": KEY}) as proc:
        yield proc


def call(params: str, id_: str = "1", method: str = '"tools/call"') -> bytes:
    """A tools/call body as raw text: what json.dumps cannot write (duplicate keys)."""
    return f'{{"jsonrpc":"2.0","id":{id_},"method":{method},"params":{params}}}'.encode()


async def post(sidecar: SidecarProcess, server: str, body: bytes, **headers: str) -> httpx.Response:
    async with raw_client(sidecar) as http:
        return await http.post(f"/mcp/{server}", content=body, headers={**RPC_HEADERS, **headers})


def audit(workdir: Path) -> list[dict[str, Any]]:
    return [entry for line in (workdir / "audit.jsonl").read_text().splitlines()
            if (entry := json.loads(line))["event"] == "tool_call"]


# ------------------------------------------------------------------------------------- what goes up


@pytest.mark.parametrize("body", [
    call('{"name":"search","Name":"delete_everything","arguments":{}}'),
    call('{"name":"search","NAME":"delete_everything","arguments":{}}'),
    call('{"name":"search","arguments":{}},"PARAMS":{"name":"delete_everything","arguments":{}}'),
    call('{"name":"search","arguments":{}},"param\u017f":{"name":"delete_everything"}'),  # long s
    call('{"name":"search","arguments":{}}', method='"tools/call","Method":"tools/call"'),
    call('{"name":"delete_everything","name":"search","arguments":{}}'),  # a first-wins parser
    b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"delete_everything"}}',  # a notification
], ids=["Name", "NAME", "PARAMS", "long-s", "Method", "duplicate", "notification"])
async def test_a_body_another_parser_reads_as_another_call_is_refused_and_nothing_runs(
        upstream: HostileUpstream, sidecar: SidecarProcess, body: bytes) -> None:
    upstream.reset()
    answer = await post(sidecar, "go", body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] in (-32600, -32700)
    assert upstream.state.ran == [] and upstream.state.requests == []  # nothing went up


@pytest.mark.parametrize("body", [
    call('{"name":"search","Name":"delete_everything","arguments":{}}'),
    call('{"name":"delete_everything","name":"search","arguments":{}}'),
    b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"delete_everything"}}',
], ids=["Name", "duplicate", "notification"])
async def test_a_grant_narrowing_tools_is_judged_on_the_same_reading(upstream: HostileUpstream,
                                                                     sidecar: SidecarProcess, body: bytes) -> None:
    """`echo` has no allowlist: the grant's `tools` is the only narrowing a Go reading could slip past."""
    async with AsyncClient(sidecar.socket) as creds:
        grant = (await creds.grant(["echo"], ttl=60, tools={"echo": ["search"]}))["grant"]
    upstream.reset()
    answer = await post(sidecar, "echo", body, Authorization=f"Bearer {grant}")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] in (-32600, -32700)
    assert upstream.state.ran == [] and upstream.state.requests == []  # nothing went up
    allowed = await post(sidecar, "echo", call('{"name":"search","arguments":{}}'), Authorization=f"Bearer {grant}")
    assert allowed.status_code == 200 and upstream.state.ran == ["search"]  # the grant itself lets search through


async def test_what_goes_upstream_is_the_body_as_the_gateway_read_it(upstream: HostileUpstream,
                                                                      sidecar: SidecarProcess,
                                                                      workdir: Path) -> None:
    upstream.reset()
    sent = b'{ "jsonrpc" : "2.0", "id" : 7, "method" : "tools/call",\n "params" : {"name": "se\\u0061rch"} }'
    answer = await post(sidecar, "go", sent)
    assert answer.status_code == 200 and answer.json()["result"]["content"][0]["text"] == "search"
    assert upstream.state.ran == ["search"]
    (_, _, received), = upstream.state.requests
    assert received == b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search"}}'
    assert audit(workdir)[-1]["tool"] == "search"


async def test_mcp_method_and_name_headers_must_say_what_the_body_says(upstream: HostileUpstream,
                                                                        sidecar: SidecarProcess) -> None:
    upstream.reset()
    body = call('{"name":"search","arguments":{}}')
    for headers in ({"Mcp-Method": "tools/list"}, {"Mcp-Method": "tools/call", "Mcp-Name": "delete_everything"}):
        refused = await post(sidecar, "go", body, **headers)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == -32020
    assert upstream.state.requests == []
    ok = await post(sidecar, "go", body, **{"Mcp-Method": "tools/call", "Mcp-Name": "search"})
    assert ok.status_code == 200
    (_, headers_up, _), = upstream.state.requests
    assert headers_up["mcp-method"] == "tools/call" and headers_up["mcp-name"] == "search"


# ------------------------------------------------------------------------------------- what comes down


@pytest.mark.parametrize("form", FORMS)
async def test_an_answer_the_gateway_cannot_read_one_way_only_is_withheld(upstream: HostileUpstream,
                                                                          sidecar: SidecarProcess,
                                                                          form: str) -> None:
    before = vm(sidecar.proc.pid, "VmHWM")
    answer = await post(sidecar, f"lie-{form}", b'{"jsonrpc":"2.0","id":3,"method":"tools/list"}')
    assert HIDDEN.encode() not in answer.content and b"IGNORE PREVIOUS" not in answer.content
    if form == "two-events":  # the last event line counts, as in a client: a message, filtered
        assert answer.status_code == 200 and b'"name":"search"' in answer.content
    elif form == "sse-latin1":  # the event that fails is replaced by an error for its request (the one
        # message of an answer that then ends: a JSON body)
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
        assert answer.json()["id"] == 3 and b"withheld" in answer.content
    else:
        assert answer.status_code == 502 and answer.json()["id"] == 3, answer.text
        assert answer.json()["error"]["data"]["code"] == "upstream_error"
    # the gzip bomb (64 MiB inflated twice over, 273 bytes on the wire) is never inflated
    assert vm(sidecar.proc.pid, "VmHWM") - before < 32 * 1024 * 1024
    async with raw_client(sidecar) as http:
        assert (await http.get("/v1/health")).json()["status"] == "ok"


@asynccontextmanager
async def sdk_session(sidecar: SidecarProcess, name: str) -> AsyncIterator[ClientSession]:
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client(name) as http, \
            streamable_http_client(creds.mcp_url(name), http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


@pytest.mark.parametrize("relay", ["socket", "tcp"])
async def test_a_hidden_tool_in_a_discover_result_never_reaches_the_client(sidecar: SidecarProcess,
                                                                          relay: str) -> None:
    """A 2026-07-28 `server/discover` result that carries the server's tools: the list is cut to
    the allowlist as a `tools/list` result is, the rest of the result relayed."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}).encode()
    if relay == "socket":
        answer = await post(sidecar, "go", body)
    else:
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.post(f"http://{listening(sidecar)}/mcp/go", content=body, headers=RPC_HEADERS)
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert [tool["name"] for tool in result["tools"]] == ["search"]
    assert result["supportedVersions"] == ["2026-07-28"] and result["serverInfo"]["name"] == "hostile"
    assert HIDDEN not in answer.text and "IGNORE PREVIOUS" not in answer.text


@pytest.mark.parametrize("form", ["two-events", "bom", "comma", "json"])
async def test_the_mcp_sdk_client_never_sees_a_hidden_tool(sidecar: SidecarProcess, form: str) -> None:
    name = "go" if form == "json" else f"lie-{form}"
    async with sdk_session(sidecar, name) as session:
        try:
            listed = [tool.name for tool in (await session.list_tools()).tools]
        except MCPError:
            listed = []  # withheld: the client gets an error, not the listing
    assert HIDDEN not in listed
    if form == "json":
        assert listed == ["search"]


@pytest.mark.parametrize("form", ["two-events", "sse-latin1", "bom", "comma", "json-seq", "deep", "json"])
def test_the_mcp_typescript_sdk_client_never_sees_a_hidden_tool(sidecar: SidecarProcess, form: str) -> None:
    """The TypeScript SDK (from npm) through the loopback listener, as an HTTP-configured client."""
    if not (TS_CLIENT / "node_modules").is_dir():
        raise RuntimeError(f"{TS_CLIENT}/node_modules missing: run .ci/run (npm ci in tests/peers/ts_client)")
    name = "go" if form == "json" else f"lie-{form}"
    run = subprocess.run(["node", str(TS_CLIENT / "list_tools.mjs"), f"http://{listening(sidecar)}/mcp/{name}"],
                         capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert HIDDEN not in run.stdout and "IGNORE PREVIOUS" not in run.stdout
    assert seen == {"tools": ["search"]} if form in ("json", "two-events") else "error" in seen, seen


@pytest.mark.parametrize("form", ["bom", "comma", "json"])
async def test_mcpcreds_stdio_never_hands_a_hidden_tool_to_its_client(sidecar: SidecarProcess, workdir: Path,
                                                                      tmp_path: Path, form: str) -> None:
    """The MCP SDK's stdio client launches `mcpcreds stdio`, as a desktop client does."""
    name = "go" if form == "json" else f"lie-{form}"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "MCPCREDS_SOCKET": str(sidecar.socket),
           "XDG_CONFIG_HOME": str(workdir / "no-config")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcpcreds", "stdio", name], env=env,
                                   cwd=str(tmp_path))
    with (tmp_path / "stderr").open("w+") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            try:
                listed = [tool.name for tool in (await session.list_tools()).tools]
            except MCPError:
                listed = []
        errlog.seek(0)
        assert HIDDEN not in errlog.read()
    assert listed == (["search"] if form == "json" else [])


async def test_the_credential_is_masked_in_escaped_json_and_in_returned_headers(upstream: HostileUpstream,
                                                                                 sidecar: SidecarProcess) -> None:
    answer = await post(sidecar, "echo", b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
    assert answer.status_code == 200
    assert CANARY not in answer.text and CANARY not in str(answer.headers)
    assert answer.json()["result"]["note"] == "***" and answer.headers["mcp-session-id"] == "***"


async def test_a_guess_the_client_sent_is_never_masked(sidecar: SidecarProcess) -> None:
    """A mask on the client's own id or argument would tell it which guess is the credential."""
    for guess in (KEY, "HOSTILE-KEY-not-it-" + CANARY):
        answer = await post(sidecar, "echo", json.dumps({"jsonrpc": "2.0", "id": guess,
                                                         "method": "ping"}).encode())
        assert answer.status_code == 200 and answer.json()["id"] == guess


# ------------------------------------------------------------------------------------- sessions


async def test_an_mcp_session_belongs_to_the_caller_that_opened_it(sidecar: SidecarProcess) -> None:
    init = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    opened = await post(sidecar, "go", init.encode())
    assert opened.headers["mcp-session-id"] == SESSION
    async with AsyncClient(sidecar.socket) as creds:
        grant = (await creds.grant(["go"], ttl=60))["grant"]
    ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    mine = await post(sidecar, "go", ping, **{"Mcp-Session-Id": SESSION})
    theirs = await post(sidecar, "go", ping, **{"Mcp-Session-Id": SESSION, "Authorization": f"Bearer {grant}"})
    assert mine.status_code == 200
    assert theirs.status_code == 404 and theirs.json()["error"]["message"] == "Session not found"
