"""What a server sends is policed as what the agent asks (the untrusted pipeline), end to end: the
real MCP SDK 2.x client through `/mcp/...` on the real sidecar, to a real MCP SDK 2.x server that
elicits, lists roots, returns media, sleeps and carries poisoned descriptions
(tests/peers/mcp_untrusted_peer.py). What a policy refuses is counted on both sides: at the
server (what reached it) and at the client (what its callbacks saw)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CreateMessageResult, ElicitResult, ListRootsResult, Root, TextContent

from mcpcreds import AsyncClient
from mcpcreds.protocol.screen import SAMPLING_REFUSED
from tests.conftest import run_cli
from tests.peers.mcp_untrusted_peer import (
    INJECTED_DESCRIPTION,
    INJECTED_RESULT,
    PNG,
    UntrustedPeer,
    start_untrusted_peer,
)
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_gateway import INIT, RPC_HEADERS, raw_client
from tests.test_gateway_tcp import listening

EVERY_TOOL = ('["ask", "ask_url", "roots", "image", "sleep", "add", "helper", "exfiltrate", "shifty", '
              '"ask_any", "roots_any", "get_api_token", "read_note", "sample"]')
FLAGGED = ('tool_metadata = { read_note = { data_sensitivity = "low", flagged_parameters = '
           '[{ pointer = "/path", pattern = "path_traversal" }] } }')
CLIENT_ROOT = "file:///home/agent/client-root"
PNG_B64 = base64.b64encode(PNG).decode()


@pytest.fixture(scope="module")
def peer() -> Iterator[UntrustedPeer]:
    with start_untrusted_peer() as server:
        yield server


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mcpcreds-untrusted-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def server(name: str, url: str, keys: str) -> str:
    return f'\n[[servers]]\nname = "{name}"\nendpoint = "{url}"\n{keys}\n'


@pytest.fixture(scope="module")
def sidecar(peer: UntrustedPeer, workdir: Path) -> Iterator[SidecarProcess]:
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[gateway]
listen = "127.0.0.1:0"
{server("trusted", peer.url, 'trust = "trusted"')}
{server("no-elicit", peer.url, f'trust = "untrusted"{chr(10)}tool_allowlist = {EVERY_TOOL}{chr(10)}'
        'elicitation_enabled = false')}
{server("no-sample", peer.url, f'trust = "untrusted"{chr(10)}tool_allowlist = {EVERY_TOOL}{chr(10)}'
        'sampling_enabled = false')}
{server("untrusted", peer.url, f'trust = "untrusted"{chr(10)}tool_allowlist = {EVERY_TOOL}{chr(10)}{FLAGGED}')}
{server("sandboxed", peer.url, f'trust = "sandboxed"{chr(10)}tool_allowlist = {EVERY_TOOL}')}
{server("rooted", peer.url, 'trust = "trusted"' + chr(10) + 'roots = ["file:///srv/project", "file:///srv/data"]')}
{server("quick", peer.url, 'trust = "trusted"' + chr(10) + 'timeout = "1s"')}
{server("quick-json", peer.base + "/mcp-json", 'trust = "trusted"' + chr(10) + 'timeout = "1s"')}
{server("media", peer.url, 'trust = "trusted"' + chr(10) + 'media_passthrough = true')}
{server("sandboxed-media", peer.url, f'trust = "sandboxed"{chr(10)}tool_allowlist = {EVERY_TOOL}{chr(10)}'
        'media_passthrough = true')}
{server("impatient", peer.url, 'trust = "trusted"' + chr(10) + 'elicitation_timeout_secs = 1')}
{server("walled", peer.url, 'trust = "trusted"' + chr(10) + 'net = "off"')}
{server("blocking", peer.url, f'trust = "untrusted"{chr(10)}tool_allowlist = {EVERY_TOOL}{chr(10)}'
        'on_injection = "block"')}
""")
    with run_sidecar(config, socket) as proc:
        yield proc


class Seen:
    """What the client's callbacks were asked."""

    def __init__(self) -> None:
        self.elicitations: list[Any] = []
        self.roots = 0
        self.samplings = 0

    async def sample(self, context: Any, params: Any) -> CreateMessageResult:
        self.samplings += 1
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="an old pond"),
                                   model="client-llm")

    async def elicit(self, context: Any, params: Any) -> ElicitResult:
        self.elicitations.append(params)
        return ElicitResult(action="accept", content={"name": "Ada"} if params.mode != "url" else None)

    async def list_roots(self, context: Any) -> ListRootsResult:
        self.roots += 1
        return ListRootsResult(roots=[Root(uri=CLIENT_ROOT)])  # type: ignore[arg-type]


@asynccontextmanager
async def session(sidecar: SidecarProcess, name: str, seen: Seen) -> AsyncIterator[ClientSession]:
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client(name) as http, \
            streamable_http_client(creds.mcp_url(name), http_client=http) as (read, write), \
            ClientSession(read, write, elicitation_callback=seen.elicit,
                          list_roots_callback=seen.list_roots, sampling_callback=seen.sample) as client:
        await client.initialize()
        yield client


async def text_of(client: ClientSession, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result
    return str(result.content[0].text)  # type: ignore[union-attr]


def audit(workdir: Path, event: str) -> list[dict[str, Any]]:
    return [e for line in (workdir / "audit.jsonl").read_text().splitlines()
            if (e := json.loads(line))["event"] == event]


async def screened(sidecar: SidecarProcess, name: str, kind: str) -> float:
    """The sidecar's `mcpcreds_gateway_screened_total` for a server and kind (0 before the first)."""
    async with raw_client(sidecar) as http:
        text = (await http.get("/metrics")).text
    head = f'mcpcreds_gateway_screened_total{{server="{name}",kind="{kind}"}} '
    return next((float(line[len(head):]) for line in text.splitlines() if line.startswith(head)), 0.0)


# ------------------------------------------------------------------------------------- elicitation


@pytest.mark.parametrize(("name", "reason"), [("sandboxed", "sandboxed"), ("no-elicit", "elicitation_enabled")])
async def test_an_elicitation_the_server_may_not_make_is_declined_and_never_reaches_the_client(
        peer: UntrustedPeer, sidecar: SidecarProcess, workdir: Path, name: str, reason: str) -> None:
    seen = Seen()
    before = len(peer.stats()["elicitations"])
    async with session(sidecar, name, seen) as client:
        assert await text_of(client, "ask") == "decline"
        assert await text_of(client, "ask_url") == "decline"
    assert seen.elicitations == []  # nothing reached the user
    assert peer.stats()["elicitations"][before:] == ["decline", "decline"]
    lines = [e for e in audit(workdir, "elicitation") if e["server"] == name]
    assert [(e["mode"], e["action"], e["reason"]) for e in lines[-2:]] == [
        ("form", "declined", reason), ("url", "declined", reason)]


async def test_an_allowed_elicitation_reaches_the_client_and_a_url_names_an_untrusted_server(
        peer: UntrustedPeer, sidecar: SidecarProcess) -> None:
    seen = Seen()
    async with session(sidecar, "trusted", seen) as client:
        assert await text_of(client, "ask") == "accept"
    async with session(sidecar, "untrusted", seen) as client:
        assert await text_of(client, "ask_url") == "accept"
    form, url = seen.elicitations
    assert form.message == "What is your name?"  # a trusted server's, as it sent it
    assert url.message.startswith("[MCP server 'untrusted', not trusted] ") and url.url == "https://login.example/start"


async def test_an_elicitation_the_client_leaves_unanswered_is_cancelled_and_void(peer: UntrustedPeer,
                                                                                 sidecar: SidecarProcess,
                                                                                 workdir: Path) -> None:
    """Past `elicitation_timeout_secs` the server is told `cancel`, and the client that the request
    is void: the MCP SDK client cancels its callback, whose answer then never comes."""
    asked, cancelled = asyncio.Event(), asyncio.Event()

    async def hesitate(context: Any, params: Any) -> ElicitResult:
        asked.set()
        try:
            await asyncio.sleep(60)  # a user who walked away; the bound a bug would cross
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return ElicitResult(action="accept", content={"name": "too late"})

    seen = Seen()
    seen.elicit = hesitate  # type: ignore[method-assign]
    before = len(peer.stats()["elicitations"])
    async with session(sidecar, "impatient", seen) as client:
        assert await asyncio.wait_for(text_of(client, "ask"), 30) == "cancel"
        await asyncio.wait_for(cancelled.wait(), 30)
    assert asked.is_set() and peer.stats()["elicitations"][before:] == ["cancel"]
    lines = [e for e in audit(workdir, "elicitation") if e["server"] == "impatient"]
    assert [(e["action"], e["reason"]) for e in lines] == [("cancelled", "elicitation_timeout_secs")]


@asynccontextmanager
async def era_client(sidecar: SidecarProcess, name: str, seen: Seen, mode: str) -> AsyncIterator[Client]:
    """The MCP SDK's `Client`: `auto` speaks the 2026-07-28 era (input_required results), `legacy`
    the 2025 handshake (requests of the server's mid-call)."""
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client(name) as http, \
            Client(streamable_http_client(creds.mcp_url(name), http_client=http), mode=mode,
                   elicitation_callback=seen.elicit, list_roots_callback=seen.list_roots,
                   sampling_callback=seen.sample) as client:
        yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_both_eras_get_the_same_policy(peer: UntrustedPeer, sidecar: SidecarProcess, mode: str) -> None:
    """What the 2025 revisions send as a request of the server's mid-call arrives in the 2026-07-28
    era inside an input_required result: declined, answered with the roots, or relayed alike."""
    seen = Seen()
    async with era_client(sidecar, "sandboxed", seen, mode) as client:
        assert (await client.call_tool("ask_any", {})).content[0].text == "decline"  # type: ignore[union-attr]
        assert json.loads((await client.call_tool("roots_any", {})).content[0].text) == []  # type: ignore[union-attr]
    async with era_client(sidecar, "rooted", seen, mode) as client:
        assert json.loads((await client.call_tool("roots_any", {})).content[0].text) == [  # type: ignore[union-attr]
            "file:///srv/project", "file:///srv/data"]
    assert seen.elicitations == [] and seen.roots == 0  # the client was never asked
    async with era_client(sidecar, "untrusted", seen, mode) as client:  # relayed, and answered
        assert (await client.call_tool("ask_any", {})).content[0].text == "accept"  # type: ignore[union-attr]
        assert json.loads((await client.call_tool("roots_any", {})).content[0].text) == [CLIENT_ROOT]  # type: ignore[union-attr]
    assert len(seen.elicitations) == 1 and seen.roots == 1
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client("rooted") as http, \
            Client(streamable_http_client(creds.mcp_url("rooted"), http_client=http), mode=mode) as bare:
        # a client without roots: the gateway declares them for it, and answers
        assert json.loads((await bare.call_tool("roots_any", {})).content[0].text) == [  # type: ignore[union-attr]
            "file:///srv/project", "file:///srv/data"]


# ------------------------------------------------------------------------------------- sampling


async def sampling_refused(sidecar: SidecarProcess, name: str) -> float:
    async with raw_client(sidecar) as http:
        text = (await http.get("/metrics")).text
    head = f'mcpcreds_gateway_sampling_total{{server="{name}",outcome="refused"}} '
    return next((float(line[len(head):]) for line in text.splitlines() if line.startswith(head)), 0.0)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize(("name", "reason"), [("sandboxed", "sandboxed"), ("no-sample", "sampling_enabled")])
async def test_a_sampling_the_server_may_not_make_never_reaches_the_client(
        peer: UntrustedPeer, sidecar: SidecarProcess, workdir: Path, name: str, reason: str, mode: str) -> None:
    """The capability is not declared to the server; one that asks anyway is refused in the 2025
    revisions (the tool gets the gateway's error), and in 2026-07-28 the client's call fails: its
    LLM is never asked, and nothing of the request reaches it."""
    seen = Seen()
    before, counted = peer.stats(), await sampling_refused(sidecar, name)
    async with era_client(sidecar, name, seen, mode) as client:
        if mode == "legacy":
            result = await client.call_tool("sample", {})
            assert result.content[0].text == f"refused: {SAMPLING_REFUSED}"  # type: ignore[union-attr]
        else:
            with pytest.raises(MCPError) as failed:
                await client.call_tool("sample", {})
            assert failed.value.error.data == {"policy": "sampling"} and "haiku" not in failed.value.error.message
    after = peer.stats()
    assert seen.samplings == 0
    assert after["sampling_declared"][len(before["sampling_declared"]):] == [False]
    if mode == "legacy":
        assert after["samplings"][len(before["samplings"]):] == [f"refused: {SAMPLING_REFUSED}"]
    assert [(e["action"], e["reason"]) for e in audit(workdir, "sampling") if e["server"] == name][-1] == (
        "refused", reason)
    assert await sampling_refused(sidecar, name) == counted + 1


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_an_allowed_sampling_asks_the_client_once(peer: UntrustedPeer, sidecar: SidecarProcess,
                                                        mode: str) -> None:
    seen = Seen()
    before = peer.stats()["sampling_declared"]
    for name in ("trusted", "untrusted"):
        async with era_client(sidecar, name, seen, mode) as client:
            assert (await client.call_tool("sample", {})).content[0].text == "an old pond"  # type: ignore[union-attr]
    assert seen.samplings == 2
    assert peer.stats()["sampling_declared"][len(before):] == [True] * (2 if mode == "legacy" else 4)


# ------------------------------------------------------------------------------------- roots


async def test_configured_roots_are_the_servers_answer_and_the_client_is_never_asked(
        sidecar: SidecarProcess) -> None:
    seen = Seen()
    async with session(sidecar, "rooted", seen) as client:
        assert json.loads(await text_of(client, "roots")) == ["file:///srv/project", "file:///srv/data"]
    async with session(sidecar, "sandboxed", seen) as client:
        assert json.loads(await text_of(client, "roots")) == []  # sandboxed, no roots: none
    assert seen.roots == 0
    async with session(sidecar, "trusted", seen) as client:  # no roots configured: the client's
        assert json.loads(await text_of(client, "roots")) == [CLIENT_ROOT]
    assert seen.roots == 1


async def test_a_reload_that_changes_the_roots_tells_each_session_and_serves_the_new_ones(
        peer: UntrustedPeer, tmp_path: Path) -> None:
    socket, config = tmp_path / "run" / "s.sock", tmp_path / "config.toml"
    text = f'[sidecar]\nsocket = "{socket}"\n' + server("rooted", peer.url, 'trust = "trusted"\nroots = ["file:///a"]')
    config.write_text(text)
    with run_sidecar(config, socket) as proc:
        async with session(proc, "rooted", Seen()) as client:
            assert json.loads(await text_of(client, "roots")) == ["file:///a"]
            before = peer.stats()["methods"].get("notifications/roots/list_changed", 0)
            config.write_text(text.replace("file:///a", "file:///b"))
            proc.proc.send_signal(signal.SIGHUP)
            await asyncio.to_thread(proc.wait_for, "config reloaded")
            assert json.loads(await text_of(client, "roots")) == ["file:///b"]
        assert peer.stats()["methods"].get("notifications/roots/list_changed", 0) == before + 1


# ------------------------------------------------------------------------------------- timeout


def sent(peer: UntrustedPeer) -> tuple[int, int, int]:
    """What reached the server so far: `sleep` calls, those cancelled, `notifications/cancelled`."""
    stats = peer.stats()
    return (stats["calls"].get("sleep", 0), stats["calls"].get("sleep_cancelled", 0),
            stats["methods"].get("notifications/cancelled", 0))


async def cancelled_at_server(peer: UntrustedPeer, before: tuple[int, int, int]) -> tuple[int, int, int]:
    """What reached the server since `before`, once a `sleep` call was cancelled there (the server
    cancels it in a task of its own) or 5 s went by (a call that sleeps 60 s: the bound a bug would
    cross). Asked while the session is open: its end would cancel the call too."""
    for _ in range(100):
        now = await asyncio.to_thread(sent, peer)
        if now[1] > before[1]:
            break
        await asyncio.sleep(0.05)
    return now[0] - before[0], now[1] - before[1], now[2] - before[2]


async def raw_session(http: httpx.AsyncClient, name: str) -> dict[str, str]:
    """A 2025-06-18 session opened with plain HTTP: the headers of its requests."""
    init = await http.post(f"/mcp/{name}", json=INIT, headers=RPC_HEADERS)
    assert init.status_code == 200, init.text
    headers = {**RPC_HEADERS, "Mcp-Session-Id": init.headers["mcp-session-id"],
               "MCP-Protocol-Version": "2025-06-18"}  # INIT's
    initialized = await http.post(f"/mcp/{name}", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                                  headers=headers)
    assert initialized.status_code == 202
    return headers


TIMED_OUT = "the gateway gave up waiting for the MCP server: no event from the MCP server within 1 s (its timeout)"
NO_HEAD = "the MCP server did not answer within 1 s"


async def test_a_server_that_does_not_answer_in_its_timeout_gives_upstream_timeout(
        peer: UntrustedPeer, sidecar: SidecarProcess, workdir: Path) -> None:
    """An SSE answer with no event within `timeout`: its head went out already (HTTP 200), the
    error is its last event; in the 2025 revisions a disconnect is no cancellation, so the server
    is told `notifications/cancelled` in the session."""
    audited = len([e for e in audit(workdir, "tool_call") if e["server"] == "quick"])
    before = await asyncio.to_thread(sent, peer)
    async with session(sidecar, "quick", Seen()) as client:
        with pytest.raises(MCPError) as timed_out:
            await asyncio.wait_for(client.call_tool("sleep", {"seconds": 60}), 30)
        at_server = await cancelled_at_server(peer, before)
        assert await text_of(client, "sleep", seconds=0) == "slept"  # the session still serves
    error = timed_out.value.error
    assert (error.code, error.message, error.data) == (-32000, TIMED_OUT, {"code": "upstream_timeout"})
    assert at_server == (1, 1, 1)  # called, told, cancelled
    lines = [e for e in audit(workdir, "tool_call") if e["server"] == "quick"][audited:]
    assert [e["status"] for e in lines] == ["upstream_timeout", "ok"]


async def test_an_answer_that_does_not_begin_in_its_timeout_is_a_504_and_cancelled(
        peer: UntrustedPeer, sidecar: SidecarProcess) -> None:
    """A server that answers in JSON sends nothing before its result: past `timeout` the client
    gets HTTP 504 and the JSON-RPC error, and the server `notifications/cancelled`."""
    before = await asyncio.to_thread(sent, peer)
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "sleep", "arguments": {"seconds": 60}}}
    async with raw_client(sidecar) as http:
        headers = await raw_session(http, "quick-json")
        answer = await http.post("/mcp/quick-json", json=call, headers=headers)
        at_server = await cancelled_at_server(peer, before)
        await http.delete("/mcp/quick-json", headers=headers)
    assert answer.status_code == 504
    assert answer.json() == {"jsonrpc": "2.0", "id": 7, "error": {
        "code": -32000, "message": NO_HEAD, "data": {"code": "upstream_timeout"}}}
    assert at_server == (1, 1, 1)


async def test_in_the_2026_era_a_timed_out_request_is_cancelled_by_closing_its_stream(
        peer: UntrustedPeer, sidecar: SidecarProcess) -> None:
    """2026-07-28 has no notification of the client's over HTTP: closing the request's stream is
    its cancellation, and the gateway closes it; nothing else is sent."""
    before = await asyncio.to_thread(sent, peer)
    discovered = (await asyncio.to_thread(peer.stats))["methods"].get("server/discover", 0)
    async with era_client(sidecar, "quick", Seen(), "auto") as client:
        with pytest.raises(MCPError) as timed_out:
            await asyncio.wait_for(client.call_tool("sleep", {"seconds": 60}), 30)
        at_server = await cancelled_at_server(peer, before)
        assert (await client.call_tool("sleep", {"seconds": 0})).content[0].text == "slept"  # type: ignore[union-attr]
        told = (await asyncio.to_thread(sent, peer))[2] - before[2]
    assert (await asyncio.to_thread(peer.stats))["methods"]["server/discover"] > discovered  # the 2026 era
    error = timed_out.value.error  # this server sends its answer's head with the first event: a 504
    assert (error.code, error.message, error.data) == (-32000, NO_HEAD, {"code": "upstream_timeout"})
    assert at_server[:2] == (1, 1) and told == 0  # cancelled, and no notification sent


async def test_progress_notifications_keep_a_long_call_within_its_timeout(sidecar: SidecarProcess) -> None:
    """`timeout` bounds the gap between events, not the call: a tool that reports progress every
    0.25 s for 2 s answers through a 1 s timeout."""
    seen: list[float] = []

    async def progressed(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with session(sidecar, "quick", Seen()) as client:
        result = await client.call_tool("progress", {"steps": 8, "every": 0.25}, progress_callback=progressed)
    assert not result.is_error and result.content[0].text == "done"  # type: ignore[union-attr]
    assert seen == [1, 2, 3, 4, 5, 6, 7, 8]


async def test_the_sessions_get_stream_outlives_the_timeout(sidecar: SidecarProcess) -> None:
    """The server's GET stream (2025) may stay quiet for long: it is never cut by `timeout`. It
    stays open through a 2 s call (which progress keeps alive) and then carries what the server
    sends."""
    progress = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "progress", "arguments": {"steps": 8, "every": 0.25}, "_meta": {"progressToken": "p"}}}
    announce = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "announce", "arguments": {}}}
    async with raw_client(sidecar) as http:
        headers = await raw_session(http, "quick")
        async with http.stream("GET", "/mcp/quick", headers={**headers, "Accept": "text/event-stream"}) as listening:
            assert listening.status_code == 200
            done = await http.post("/mcp/quick", json=progress, headers=headers)
            assert '"text":"done"' in done.text
            assert '"text":"announced"' in (await http.post("/mcp/quick", json=announce, headers=headers)).text
            async with asyncio.timeout(10):
                async for line in listening.aiter_lines():
                    if "notifications/tools/list_changed" in line:
                        break
                else:
                    pytest.fail("the GET stream was cut")
        await http.delete("/mcp/quick", headers=headers)


# ------------------------------------------------------------------------------------- media


@pytest.mark.parametrize(("name", "passes"), [("trusted", False), ("media", True), ("sandboxed-media", False)])
async def test_media_passes_only_where_media_passthrough_allows_it(sidecar: SidecarProcess, name: str,
                                                                   passes: bool) -> None:
    counted = await screened(sidecar, name, "media")
    async with session(sidecar, name, Seen()) as client:
        result = await client.call_tool("image", {})
    kinds = [block.type for block in result.content]
    if passes:
        assert kinds == ["image", "audio", "text"]
        assert await screened(sidecar, name, "media") == counted
    else:  # said in words, the data never passes
        assert kinds == ["text", "text", "text"]
        assert await screened(sidecar, name, "media") == counted + 1
        texts = [block.text for block in result.content]  # type: ignore[union-attr]
        assert texts[0].startswith("[image/png withheld by the gateway") and "audio" in texts[1]
        assert PNG_B64 not in json.dumps(result.model_dump(mode="json"))


# ------------------------------------------------------------------------------------- sanitization


async def test_descriptions_of_a_server_not_trusted_are_sanitized_and_audited(sidecar: SidecarProcess,
                                                                             workdir: Path) -> None:
    counted = {name: await screened(sidecar, name, "sanitized") for name in ("untrusted", "trusted")}
    async with session(sidecar, "untrusted", Seen()) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert tools["helper"].description == "[sanitized]"
    assert tools["add"].description == "Adds two integers."  # the zero-width and bidi characters gone
    assert tools["ask"].description == "Ask the user for a name."  # an ordinary one as it was
    hits = [e for e in audit(workdir, "screened") if e["server"] == "untrusted" and e["kind"] == "sanitized"]
    assert hits and hits[-1]["items"][0]["item"] == "helper" and "~/.ssh" not in json.dumps(hits)
    async with session(sidecar, "trusted", Seen()) as client:  # a trusted server's, verbatim
        trusted = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert trusted["helper"].description == INJECTED_DESCRIPTION
    assert await screened(sidecar, "untrusted", "sanitized") == counted["untrusted"] + 1  # one listing
    assert await screened(sidecar, "trusted", "sanitized") == counted["trusted"]


async def test_an_injection_in_a_result_is_reported_and_with_block_withheld(sidecar: SidecarProcess,
                                                                          workdir: Path) -> None:
    counted = {name: await screened(sidecar, name, "injection") for name in ("untrusted", "blocking")}
    async with session(sidecar, "untrusted", Seen()) as client:
        assert await text_of(client, "exfiltrate") == INJECTED_RESULT  # on_injection = "log": reported only
    found = [e for e in audit(workdir, "screened") if e["server"] == "untrusted" and e["kind"] == "injection"]
    assert found and found[-1]["found"]
    async with session(sidecar, "blocking", Seen()) as client:
        with pytest.raises(MCPError) as blocked:
            await client.call_tool("exfiltrate", {})
        assert blocked.value.error.data["code"] == "injection"
        assert "evil.example" not in json.dumps(blocked.value.error.model_dump(mode="json"))
    assert await screened(sidecar, "untrusted", "injection") == counted["untrusted"] + 1
    assert await screened(sidecar, "blocking", "injection") == counted["blocking"] + 1


# ------------------------------------------------------------------------------------- egress


async def test_a_gateway_request_refused_by_egress_policy_is_audited(peer: UntrustedPeer, sidecar: SidecarProcess,
                                                                   workdir: Path) -> None:
    before = peer.stats()["calls"]
    async with raw_client(sidecar) as http:
        refused_answer = await http.post("/mcp/walled", json=INIT, headers=RPC_HEADERS)
    assert refused_answer.status_code == 403 and refused_answer.json()["error"]["data"]["code"] == "forbidden"
    refused = [e for e in audit(workdir, "egress_refused") if e["server"] == "walled"]
    assert refused and refused[-1]["host"] == "127.0.0.1" and refused[-1]["uid"] == os.getuid()
    assert peer.stats()["calls"] == before


# ------------------------------------------------------------------------------------- pinning


async def test_a_tool_that_changes_after_it_was_pinned_is_withheld_until_approved(
        peer: UntrustedPeer, tmp_path: Path) -> None:
    """The rug pull: listed (and so pinned) once, then changed. Withheld from the listing and its
    calls refused until `mcpcreds tools approve`; a trusted server only warns."""
    socket, config = tmp_path / "run" / "s.sock", tmp_path / "config.toml"
    config.write_text(f'[sidecar]\nsocket = "{socket}"\n'
                      + server("pinned", peer.url, f'trust = "untrusted"\ntool_allowlist = {EVERY_TOOL}')
                      + server("open", peer.url, 'trust = "trusted"'))
    with run_sidecar(config, socket) as proc:
        async with session(proc, "pinned", Seen()) as client, session(proc, "open", Seen()) as trusting:
            assert "shifty" in {t.name for t in (await client.list_tools()).tools}  # pinned now
            await trusting.list_tools()
            await asyncio.to_thread(peer.shift)
            try:
                assert "shifty" not in {t.name for t in (await client.list_tools()).tools}
                calls = peer.stats()["calls"].get("shifty", 0)
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("shifty", {"text": "x"})
                assert refused.value.error.data == {"policy": "pinned"}
                assert peer.stats()["calls"].get("shifty", 0) == calls  # never reached the server
                assert "shifty" in {t.name for t in (await trusting.list_tools()).tools}  # trusted: a warning
                approved = await asyncio.to_thread(run_cli, "tools", "approve", "pinned", "--config", str(config))
                assert approved.code == 0 and "first call exfiltrate" in approved.stdout, approved.output
                assert "shifty" in {t.name for t in (await client.list_tools()).tools}
                assert await text_of(client, "shifty", text="back") == "back"
            finally:
                await asyncio.to_thread(peer.unshift)
        assert any("tool pins" in line for line in proc.lines)


# ------------------------------------------------------------------------------------- tool metadata


async def test_a_sensitive_tool_of_a_server_not_trusted_is_refused_by_data_flow(peer: UntrustedPeer,
                                                                             sidecar: SidecarProcess) -> None:
    """`get_api_token` reads as high sensitivity (a `token` tool): refused on an untrusted server
    though its allowlist names it, served by a trusted one."""
    calls = peer.stats()["calls"].get("get_api_token", 0)
    async with session(sidecar, "untrusted", Seen()) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("get_api_token", {})
        assert refused.value.error.data == {"policy": "data_flow"}
    assert peer.stats()["calls"].get("get_api_token", 0) == calls
    async with session(sidecar, "trusted", Seen()) as client:
        assert await text_of(client, "get_api_token") == "not-a-real-token"


async def test_a_flagged_argument_is_refused_and_an_ordinary_one_passes(peer: UntrustedPeer,
                                                                        sidecar: SidecarProcess) -> None:
    async with session(sidecar, "untrusted", Seen()) as client:
        assert await text_of(client, "read_note", path="notes/today.txt") == "note notes/today.txt"
        calls = peer.stats()["calls"]["read_note"]
        with pytest.raises(MCPError) as refused:
            await client.call_tool("read_note", {"path": "notes/%2e%2e/%2e%2e/etc/passwd"})
        assert refused.value.error.data == {"policy": "flagged_parameter", "parameters": ["/path"]}
        assert "passwd" not in refused.value.error.message
    assert peer.stats()["calls"]["read_note"] == calls


# ------------------------------------------------------------------------------------- every way in


async def test_the_loopback_listener_and_mcpcreds_stdio_get_the_same_policy(sidecar: SidecarProcess,
                                                                          tmp_path: Path) -> None:
    """The pipeline is the gateway's, whichever way a client comes in: the loopback TCP listener (an
    HTTP-configured client) and `mcpcreds stdio` (a desktop client's stdio entry)."""
    import httpx2
    from mcp.client.stdio import StdioServerParameters, stdio_client

    seen = Seen()
    url = f"http://{listening(sidecar)}/mcp/sandboxed"
    async with httpx2.AsyncClient() as http, \
            streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write, elicitation_callback=seen.elicit, list_roots_callback=seen.list_roots) as tcp:
        await tcp.initialize()
        assert await text_of(tcp, "ask") == "decline"
        assert (await tcp.call_tool("image", {})).content[0].type == "text"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "MCPCREDS_SOCKET": str(sidecar.socket),
           "XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcpcreds", "stdio", "sandboxed"], env=env,
                                   cwd=str(tmp_path))
    with (tmp_path / "stderr").open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write, elicitation_callback=seen.elicit,
                              list_roots_callback=seen.list_roots) as stdio:
            await stdio.initialize()
            assert await text_of(stdio, "ask") == "decline"
            assert json.loads(await text_of(stdio, "roots")) == []
    assert seen.elicitations == [] and seen.roots == 0
