"""`mcpcreds stdio SERVER` (issue 14): the MCP SDK's own stdio client (2.x here, 1.x in its side
venv) launches `python -m mcpcreds stdio tools`, which relays to `/mcp/tools` on the real
sidecar's socket, in front of a real MCP server that demands a key only the sidecar holds.
stdout must carry JSON-RPC and nothing else; the key (a canary) must appear nowhere the client
can see, stderr included.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from mcpcreds import AsyncClient
from mcpcreds.client.stdio_bridge import EventTooLarge, LineSplitter, LineTooLong, SseEvent, SseParser
from tests.conftest import CANARY
from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_hardening_socket import NOBODY, folder
from tests.test_mcp_sdk_e2e import mcp1_python  # noqa: F401  (the side venv with MCP SDK 1.x)

ROOT = Path(__file__).resolve().parents[1]
STATIC_KEY = "STATIC-" + CANARY
ALL_TOOLS = {"echo", "add", "progress", "leak"}


# ------------------------------------------------------------------------------------- pure parts


def test_lines_are_split_on_newlines_and_an_overlong_one_is_reported_once() -> None:
    lines = LineSplitter(limit=8)
    assert lines.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert lines.feed(b":2}\n\n") == [b'{"b":2}', b""]
    out = lines.feed(b"0123456789")  # no newline yet, already over the limit
    assert len(out) == 1 and isinstance(out[0], LineTooLong)
    assert lines.feed(b"more of it\nok\n") == [b"ok"]  # the rest skipped, the next line whole
    out = lines.feed(b"123456789\n")
    assert len(out) == 1 and isinstance(out[0], LineTooLong)
    assert lines.feed(b"last") == [] and lines.end() == [b"last"]


def test_sse_events_are_parsed_by_the_whatwg_rules() -> None:
    sse = SseParser(limit=64)
    assert sse.feed(b"id: 1\r\nevent: message\r\ndata: {\"a\":\r") == []
    assert sse.feed(b"\ndata: 1}\r\n\r\n") == [SseEvent('{"a":\n1}', "1")]  # a CR LF split across chunks
    assert sse.feed(b": a comment\n\ndata:x\rretry: 5\r\r") == []  # a CR last: an LF may follow
    assert sse.feed(b"\n") == [SseEvent("x", "1")]
    assert sse.feed(b"id: 2\ndata:\n\n") == [SseEvent("", "2")]  # a priming event: an id, no message
    assert sse.feed(b"event: other\ndata: y\n\n") == []
    with pytest.raises(EventTooLarge):
        sse.feed(b"data: " + b"z" * 70 + b"\n")
    with pytest.raises(EventTooLarge):
        SseParser(limit=64).feed(b"data: " + b"z" * 70)  # no line end in sight


# ------------------------------------------------------------------------------------- the sidecar


@pytest.fixture(scope="module")
def peer() -> Iterator[GatewayPeer]:
    with start_gateway_peer("unused-token-", STATIC_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mcpcreds-gwstdio-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def sidecar(peer: GatewayPeer, workdir: Path) -> Iterator[SidecarProcess]:
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"

[secrets]
sources = ["env"]

[[servers]]
name = "tools"
endpoint = "{peer.url}"
headers = {{ "X-Api-Key" = "{{{{secret:STATIC_KEY}}}}" }}
trust = "trusted"
expose = "proxy"

[[servers]]
name = "other"
endpoint = "{peer.url}"
headers = {{ "X-Api-Key" = "{{{{secret:STATIC_KEY}}}}" }}
trust = "trusted"
""")
    with run_sidecar(config, socket, {"STATIC_KEY": STATIC_KEY}) as proc:
        yield proc


def relay_env(sidecar: SidecarProcess, workdir: Path, **extra: str) -> dict[str, str]:
    """What a desktop app's config gives `mcpcreds stdio`: where the sidecar is, nothing secret."""
    return {"PYTHONPATH": str(ROOT / "src"), "MCPCREDS_SOCKET": str(sidecar.socket),
            "XDG_CONFIG_HOME": str(workdir / "no-config"), **extra}


def value(result: Any) -> Any:
    assert not result.is_error, result
    return result.structured_content["result"]


def new_sessions(before: dict[str, Any], after: dict[str, Any]) -> list[str | None]:
    return list(after["sessions"][len(before["sessions"]):])


async def eventually(check: Any, timeout: float = 30.0) -> None:
    """Until `check()` holds: what it observes happens in other processes."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_the_sdk2_stdio_client_through_mcpcreds_stdio(peer: GatewayPeer, sidecar: SidecarProcess,
                                                            workdir: Path, tmp_path: Path) -> None:
    before = peer.stats()
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcpcreds", "stdio", "tools"],
                                   env=relay_env(sidecar, workdir), cwd=str(tmp_path))
    seen: list[float] = []
    first = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)
        if progress == 1:
            first.set()

    with (tmp_path / "stderr").open("w+") as errlog:
        async with (stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            assert {t.name for t in (await session.list_tools()).tools} == ALL_TOOLS
            assert value(await session.call_tool("add", {"a": 2, "b": 3})) == 5
            progress = asyncio.ensure_future(session.call_tool("progress", {"steps": 3},
                                                               progress_callback=on_progress))
            await asyncio.wait_for(first.wait(), 60)  # the tool now waits for the release: it still runs...
            meanwhile = session.call_tool("echo", {"text": "meanwhile"})  # ...and another request is not held up
            assert value(await asyncio.wait_for(meanwhile, 60)) == "meanwhile"
            await asyncio.to_thread(peer.release)
            assert value(await asyncio.wait_for(progress, 60)) == "done" and seen == [1, 2, 3]
            leaked = json.loads(value(await session.call_tool("leak", {})))
            assert leaked["x-api-key"] == "***"  # the server echoed the key: masked on the way back
        errlog.seek(0)
        stderr = errlog.read()
    after = peer.stats()
    sessions = new_sessions(before, after)
    assert sessions[0] is None and sessions[1] and len(set(sessions[1:])) == 1  # one session throughout
    assert after["requests"].get("GET", 0) > before["requests"].get("GET", 0)  # the server's own stream
    assert dict(after["headers"])["x-api-key"] == STATIC_KEY and after["unauthorized"] == before["unauthorized"]
    await eventually(lambda: peer.stats()["requests"].get("DELETE", 0) == before["requests"].get("DELETE", 0) + 1)
    assert CANARY not in stderr


def test_the_sdk1_stdio_client_through_mcpcreds_stdio(mcp1_python: Path, peer: GatewayPeer,  # noqa: F811
                                                      sidecar: SidecarProcess, workdir: Path) -> None:
    script = """
import asyncio, importlib.metadata, json, sys
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

async def main(python, env):
    params = StdioServerParameters(command=python, args=["-m", "mcpcreds", "stdio", "tools"], env=json.loads(env))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = sorted(t.name for t in (await session.list_tools()).tools)
        added = await session.call_tool("add", {"a": 2, "b": 3})
        echoed = await session.call_tool("echo", {"text": "again"})
    print(json.dumps({"mcp": importlib.metadata.version("mcp"), "tools": tools,
                      "add": added.structuredContent["result"], "echo": echoed.structuredContent["result"]}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""
    before = peer.stats()
    proc = subprocess.run([str(mcp1_python), "-c", script, sys.executable, json.dumps(relay_env(sidecar, workdir))],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"mcp": out["mcp"], "tools": sorted(ALL_TOOLS), "add": 5, "echo": "again"}
    assert out["mcp"].startswith("1.")
    sessions = new_sessions(before, peer.stats())
    assert sessions[0] is None and sessions[1] and len(set(sessions[1:])) == 1
    assert CANARY not in proc.stdout + proc.stderr


def run_relay(sidecar: SidecarProcess, workdir: Path, messages: list[Any], raw: bytes = b"",
              server: str = "tools", **env: str) -> subprocess.CompletedProcess[bytes]:
    """`mcpcreds stdio` fed these lines, then EOF."""
    stdin = b"".join(json.dumps(m).encode() + b"\n" for m in messages) + raw
    return subprocess.run([sys.executable, "-m", "mcpcreds", "stdio", server], input=stdin, capture_output=True,
                          timeout=60, cwd=workdir, env={**os.environ, **relay_env(sidecar, workdir, **env)})


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def rpc_lines(stdout: bytes) -> list[dict[str, Any]]:
    """Every line of stdout, each a JSON-RPC 2.0 message (anything else fails the test)."""
    assert stdout.endswith(b"\n")
    messages = []
    for line in stdout.split(b"\n")[:-1]:
        message = json.loads(line)
        for item in message if isinstance(message, list) else [message]:
            assert item["jsonrpc"] == "2.0" and ("result" in item or "error" in item or "method" in item), line
        messages.append(message)
    return messages


def test_stdout_carries_json_rpc_only_and_every_request_gets_one_answer(
        peer: GatewayPeer, sidecar: SidecarProcess, workdir: Path) -> None:
    before = peer.stats()
    call = {"jsonrpc": "2.0", "id": "leak-1", "method": "tools/call", "params": {"name": "leak", "arguments": {}}}
    batch = [{"jsonrpc": "2.0", "id": 7, "method": "ping"}, {"jsonrpc": "2.0", "id": 8, "method": "ping"}]
    result = run_relay(sidecar, workdir, [INIT, INITIALIZED, call, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}],
                       raw=b"not json\n\n[1, 2]\n" + b"x" * (5 * 2**20) + b"\n")
    assert result.returncode == 0, result.stderr
    messages = rpc_lines(result.stdout)
    answers = {m["id"]: m for m in messages if isinstance(m, dict) and "id" in m}
    assert set(answers) == {0, "leak-1", 3, None}
    assert answers[0]["result"]["serverInfo"]["name"] == "mcpcreds-gateway-peer"
    assert json.loads(answers["leak-1"]["result"]["structuredContent"]["result"])["x-api-key"] == "***"
    assert {t["name"] for t in answers[3]["result"]["tools"]} == ALL_TOOLS
    refusals = [m["error"]["code"] for m in messages if isinstance(m, dict) and m.get("id") is None]
    assert sorted(refusals) == [-32700, -32600, -32600]  # not JSON, not JSON-RPC, over the limit
    assert CANARY.encode() not in result.stdout + result.stderr
    after = peer.stats()
    assert after["requests"].get("DELETE", 0) == before["requests"].get("DELETE", 0) + 1  # ended at EOF
    assert len(set(new_sessions(before, after)[1:])) == 1

    # a batch (2025-03-26) this server refuses with HTTP 400: its error passes, and each request
    # of the batch still gets an answer
    batched = run_relay(sidecar, workdir, [INIT, INITIALIZED, batch])
    assert batched.returncode == 0, batched.stderr
    errors = [(m["id"], m["error"]["code"]) for m in rpc_lines(batched.stdout)[1:]]
    assert errors == [(None, -32602), (7, -32000), (8, -32000)]


async def test_a_refusal_of_the_gateway_reaches_the_client_as_a_json_rpc_error(
        peer: GatewayPeer, sidecar: SidecarProcess, workdir: Path) -> None:
    async with AsyncClient(sidecar.socket) as creds:
        minted = await creds.grant(["other"], ttl=60)
    before = peer.stats()["requests"]
    result = await asyncio.to_thread(run_relay, sidecar, workdir, [INIT], MCPCREDS_GRANT=minted["grant"])
    assert result.returncode == 0
    [answer] = rpc_lines(result.stdout)
    assert answer["id"] == 0 and answer["error"]["data"]["code"] == "forbidden"  # tools is not in the grant
    assert peer.stats()["requests"] == before
    assert minted["grant"].encode() not in result.stdout + result.stderr
    unknown = await asyncio.to_thread(run_relay, sidecar, workdir, [INIT], server="no-such-server")
    [answer] = rpc_lines(unknown.stdout)
    assert answer["id"] == 0 and answer["error"]["data"]["code"] == "unknown_server"


def test_no_sidecar_means_an_error_per_request_and_a_planted_socket_exit_69(
        sidecar: SidecarProcess, workdir: Path) -> None:
    arena = Path(tempfile.mkdtemp(prefix="mcpcreds-stdio-arena-"))
    try:
        arena.chmod(0o755)
        missing = run_relay(sidecar, workdir, [INIT, {"jsonrpc": "2.0", "id": 1, "method": "ping"}],
                            MCPCREDS_SOCKET=str(arena / "none" / "s.sock"))
        assert missing.returncode == 0
        assert [(m["id"], m["error"]["code"]) for m in rpc_lines(missing.stdout)] == [(0, -32000), (1, -32000)]
        tried = str(arena / "none" / "s.sock")  # the socket tried, and the fix, where the user reads
        assert all(tried in m["error"]["message"] and "MCPCREDS_SOCKET" in m["error"]["message"]
                   for m in rpc_lines(missing.stdout))
        assert tried in missing.stderr.decode() and "mcpcreds serve" in missing.stderr.decode()
        theirs = folder(arena / "theirs", uid=NOBODY)
        planted = run_relay(sidecar, workdir, [INIT], MCPCREDS_SOCKET=str(theirs / "s.sock"))
        assert planted.returncode == 69 and planted.stdout == b""
        assert f"belongs to uid {NOBODY}" in planted.stderr.decode()
    finally:
        shutil.rmtree(arena, ignore_errors=True)
