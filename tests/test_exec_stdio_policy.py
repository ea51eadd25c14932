"""`mcpcreds exec NAME -- CMD` relays a stdio server's traffic through the gateway's policy core
when `[exec.NAME]` sets trust or content keys: a real stdio MCP server (the untrusted peer's tools,
tests/peers/mcp_untrusted_stdio.py) under a real sidecar, driven by the MCP SDK's stdio client.
What the server received is read from the server itself (its `stats` tool); the relay's audit
lines are read from the sidecar's audit log."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp.types import CreateMessageResult, ElicitResult, ListRootsResult, Root, TextContent

from mcpcreds.protocol.screen import SAMPLING_REFUSED
from tests.conftest import run_cli
from tests.peers.mcp_untrusted_peer import PNG
from tests.sidecar_proc import SidecarProcess, run_sidecar

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = ('["ask", "ask_url", "roots", "image", "add", "helper", "exfiltrate", "stats", "ask_any", "roots_any", '
           '"sample"]')
CLIENT_ROOT = "file:///home/client/secret-project"
PNG_B64 = __import__("base64").b64encode(PNG).decode()
SLOW_TIMEOUT = 10  # seconds: far past the child's start under load, far short of the tool's wait


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exec-stdio")


@pytest.fixture(scope="module")
def sidecar(workdir: Path) -> Iterator[SidecarProcess]:
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[exec.sandboxed]
trust = "sandboxed"
tool_allowlist = {ALLOWED}

[exec.opted]
trust = "untrusted"
tool_allowlist = {ALLOWED}
roots = ["file:///srv/project"]
media_passthrough = true

[exec.no-sample]
trust = "untrusted"
tool_allowlist = {ALLOWED}
sampling_enabled = false

[exec.plain]
env = {{ LOG_LEVEL = "info" }}

[exec.meta]
trust = "untrusted"
tool_allowlist = ["get_api_token", "read_note", "add", "stats"]
tool_metadata = {{ read_note = {{ data_sensitivity = "low", flagged_parameters = [
    {{ pointer = "/path", pattern = "path_traversal" }}] }}, add = {{ data_sensitivity = "high" }} }}

[exec.slow]
trust = "untrusted"
tool_allowlist = ["wait", "add", "stats"]
timeout = "{SLOW_TIMEOUT}s"

[exec.pinned]
trust = "untrusted"
tool_allowlist = ["shifty", "shift", "stats"]

[exec.unpinned]
trust = "untrusted"
tool_allowlist = ["shifty", "shift", "stats"]
pin_tools = false

[exec.hasty]
trust = "untrusted"
tool_allowlist = ["ask", "stats"]
elicitation_timeout_secs = 1
""")
    with run_sidecar(config, socket) as proc:
        yield proc


class Seen:
    def __init__(self) -> None:
        self.elicitations: list[Any] = []
        self.roots = 0
        self.samplings = 0

    async def elicit(self, context: Any, params: Any) -> ElicitResult:
        self.elicitations.append(params)
        return ElicitResult(action="accept", content={"name": "Ada"})

    async def sample(self, context: Any, params: Any) -> CreateMessageResult:
        self.samplings += 1
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="an old pond"),
                                   model="client-llm")

    async def list_roots(self, context: Any) -> ListRootsResult:
        self.roots += 1
        return ListRootsResult(roots=[Root(uri=CLIENT_ROOT)])  # type: ignore[arg-type]


@asynccontextmanager
async def session(sidecar: SidecarProcess, name: str, seen: Seen) -> AsyncIterator[ClientSession]:
    env = {k: v for k, v in os.environ.items() if k not in ("MCPCREDS_GRANT", "MCPCREDS_SOCKET")}
    params = StdioServerParameters(
        command=sys.executable, cwd=str(ROOT), env={**env, "MCPCREDS_CONFIG": str(sidecar.config)},
        args=["-m", "mcpcreds.cli.main", "exec", name, "--", sys.executable, "-m",
              "tests.peers.mcp_untrusted_stdio"])
    async with stdio_client(params) as (read, write), \
            ClientSession(read, write, elicitation_callback=seen.elicit,
                          list_roots_callback=seen.list_roots) as client:
        await client.initialize()
        yield client


async def text_of(client: ClientSession, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result
    return str(result.content[0].text)  # type: ignore[union-attr]


async def stats(client: ClientSession) -> dict[str, Any]:
    return dict(json.loads(await text_of(client, "stats")))


def audit(workdir: Path, event: str, name: str) -> list[dict[str, Any]]:
    return [e for line in (workdir / "audit.jsonl").read_text().splitlines()
            if (e := json.loads(line))["event"] == event and e.get("exec") == name]


async def test_the_allowlist_hides_tools_and_refused_calls_never_reach_the_server(
        sidecar: SidecarProcess, workdir: Path) -> None:
    async with session(sidecar, "sandboxed", Seen()) as client:
        listed = sorted(tool.name for tool in (await client.list_tools()).tools)
        with pytest.raises(MCPError) as refused:
            await client.call_tool("get_api_token", {})
        assert "add" in listed and await text_of(client, "add", a=2, b=3) == "5"
        seen = await stats(client)
    assert listed == sorted(json.loads(ALLOWED))
    assert refused.value.error.code == -32602 and refused.value.error.data == {"policy": "sandboxed"}
    assert "get_api_token" not in seen["calls"] and seen["calls"]["add"] == 1
    calls = audit(workdir, "tool_call", "sandboxed")
    assert {(e["tool"], e["status"]) for e in calls} >= {("get_api_token", "refused"), ("add", "ok")}
    assert all(isinstance(e["uid"], int) for e in calls)


async def test_a_sandboxed_servers_elicitation_is_declined_and_never_reaches_the_client(
        sidecar: SidecarProcess, workdir: Path) -> None:
    seen = Seen()
    async with session(sidecar, "sandboxed", seen) as client:
        assert await text_of(client, "ask") == "decline"
        at_server = await stats(client)
    assert seen.elicitations == [] and at_server["elicitations"] == ["decline"]
    lines = audit(workdir, "elicitation", "sandboxed")
    assert lines and lines[-1]["action"] == "declined" and lines[-1]["reason"] == "sandboxed"


async def test_roots_are_answered_with_the_configured_ones_and_the_client_is_never_asked(
        sidecar: SidecarProcess) -> None:
    for name, expected in (("sandboxed", []), ("opted", ["file:///srv/project"])):
        seen = Seen()
        async with session(sidecar, name, seen) as client:
            assert json.loads(await text_of(client, "roots")) == expected
        assert seen.roots == 0


async def test_media_is_withheld_unless_opted_in(sidecar: SidecarProcess, workdir: Path) -> None:
    async with session(sidecar, "sandboxed", Seen()) as client:
        withheld = await client.call_tool("image", {})
    assert [block.type for block in withheld.content] == ["text", "text", "text"]
    assert PNG_B64 not in json.dumps(withheld.model_dump(mode="json"))
    assert any(e["kind"] == "media" for e in audit(workdir, "screened", "sandboxed"))
    async with session(sidecar, "opted", Seen()) as client:
        passed = await client.call_tool("image", {})
    assert [block.type for block in passed.content] == ["image", "audio", "text"]


async def test_descriptions_are_sanitized(sidecar: SidecarProcess, workdir: Path) -> None:
    async with session(sidecar, "sandboxed", Seen()) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert tools["helper"].description == "[sanitized]"
    assert tools["add"].description == "Adds two integers."
    hits = [e for e in audit(workdir, "screened", "sandboxed") if e["kind"] == "sanitized"]
    assert hits and "~/.ssh" not in json.dumps(hits)


async def test_an_opted_in_elicitation_reaches_the_client(sidecar: SidecarProcess) -> None:
    seen = Seen()
    async with session(sidecar, "opted", seen) as client:
        assert await text_of(client, "ask") == "accept"
    assert len(seen.elicitations) == 1


async def test_an_entry_without_policy_keys_runs_as_before(sidecar: SidecarProcess) -> None:
    seen = Seen()
    async with session(sidecar, "plain", seen) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert await text_of(client, "get_api_token") == "not-a-real-token"
        assert await text_of(client, "ask") == "accept"
    assert "get_api_token" in names and len(seen.elicitations) == 1


async def test_tool_metadata_refuses_calls_before_the_server_sees_them(
        sidecar: SidecarProcess, workdir: Path) -> None:
    async with session(sidecar, "meta", Seen()) as client:
        refused = {}
        for tool, arguments in (("get_api_token", {}), ("add", {"a": 1, "b": 2}),
                                ("read_note", {"path": "../../etc/passwd"})):
            with pytest.raises(MCPError) as error:
                await client.call_tool(tool, arguments)
            refused[tool] = (error.value.error.code, error.value.error.data)
        assert await text_of(client, "read_note", path="notes/today.txt") == "note notes/today.txt"
        seen = await stats(client)
    assert refused == {"get_api_token": (-32602, {"policy": "data_flow"}),  # inferred from its name
                       "add": (-32602, {"policy": "data_flow"}),  # configured
                       "read_note": (-32602, {"policy": "flagged_parameter", "parameters": ["/path"]})}
    assert seen["calls"] == {"read_note": 1}
    statuses = [(e["tool"], e["status"]) for e in audit(workdir, "tool_call", "meta")]
    assert ("get_api_token", "refused") in statuses and ("read_note", "refused") in statuses


async def test_a_request_past_its_timeout_gets_an_error_and_is_cancelled_at_the_server(
        sidecar: SidecarProcess, workdir: Path) -> None:
    async with session(sidecar, "slow", Seen()) as client:
        with pytest.raises(MCPError) as error:
            await client.call_tool("wait", {"seconds": 600})
        assert await text_of(client, "add", a=2, b=3) == "5"  # the session goes on
        for _ in range(100):  # the server handles the cancellation in a task of its own
            seen = await stats(client)
            if "wait_cancelled" in seen["calls"]:
                break
            await asyncio.sleep(0.05)
    assert error.value.error.code == -32000 and error.value.error.data == {"code": "upstream_timeout"}
    assert seen["calls"]["wait"] == 1 and seen["calls"]["wait_cancelled"] == 1
    assert ("wait", "timeout") in [(e["tool"], e["status"]) for e in audit(workdir, "tool_call", "slow")]


async def test_an_elicitation_left_unanswered_is_cancelled_and_the_late_answer_dropped(
        sidecar: SidecarProcess, workdir: Path) -> None:
    release = asyncio.Event()

    class Slow(Seen):
        async def elicit(self, context: Any, params: Any) -> ElicitResult:
            self.elicitations.append(params)
            await release.wait()  # answers only after the server has had its answer
            return ElicitResult(action="accept", content={"name": "Ada"})

    seen = Slow()
    async with session(sidecar, "hasty", seen) as client:
        assert await text_of(client, "ask") == "cancel"
        release.set()
        at_server = await stats(client)
    assert len(seen.elicitations) == 1 and at_server["elicitations"] == ["cancel"]
    lines = audit(workdir, "elicitation", "hasty")
    assert lines and lines[-1]["action"] == "cancelled" and lines[-1]["reason"] == "elicitation_timeout"


async def test_a_changed_tool_is_withheld_and_refused_and_the_pins_are_the_sidecars(
        sidecar: SidecarProcess, workdir: Path) -> None:
    async with session(sidecar, "pinned", Seen()) as client:
        first = {tool.name for tool in (await client.list_tools()).tools}  # pins shifty
        assert await text_of(client, "shift") == "shifted"
        after = {tool.name for tool in (await client.list_tools()).tools}
        with pytest.raises(MCPError) as refused:
            await client.call_tool("shifty", {"text": "x"})
        seen = await stats(client)
    assert "shifty" in first and "shifty" not in after
    assert refused.value.error.code == -32602 and refused.value.error.data == {"policy": "pinned"}
    assert "shifty" not in seen["calls"]
    async with session(sidecar, "pinned", Seen()) as client:  # a new child, shifted before any listing
        assert await text_of(client, "shift") == "shifted"
        again = {tool.name for tool in (await client.list_tools()).tools}
    assert "shifty" not in again  # the pin of the first session, kept by the sidecar
    config = str(sidecar.config)
    shown = await asyncio.to_thread(run_cli, "tools", "exec:pinned", "--json", "--config", config)
    states = {t["name"]: t["state"] for t in json.loads(shown.stdout)["tools"]}
    assert shown.code == 0 and states["shifty"] == "changed" and states["stats"] == "pinned"
    approved = await asyncio.to_thread(run_cli, "tools", "approve", "exec:pinned", "--config", config)
    assert approved.code == 0, approved.stderr
    async with session(sidecar, "pinned", Seen()) as client:  # the approved definition is the pin now
        assert await text_of(client, "shift") == "shifted"
        assert "shifty" in {tool.name for tool in (await client.list_tools()).tools}
        assert await text_of(client, "shifty", text="x") == "x"
    async with session(sidecar, "unpinned", Seen()) as client:
        await client.list_tools()
        assert await text_of(client, "shift") == "shifted"
        assert "shifty" in {tool.name for tool in (await client.list_tools()).tools}
        assert await text_of(client, "shifty", text="x") == "x"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_both_eras_get_the_same_policy_on_a_stdio_server(sidecar: SidecarProcess, mode: str) -> None:
    """What the 2025 revisions send as a request of the server's mid-call arrives in the 2026-07-28
    era inside an input_required result: the relay declines and answers roots alike."""
    from mcp.client import Client

    seen = Seen()
    async with Client(exec_params(sidecar, "sandboxed"), mode=mode, elicitation_callback=seen.elicit,
                      list_roots_callback=seen.list_roots) as client:
        assert (await client.call_tool("ask_any", {})).content[0].text == "decline"  # type: ignore[union-attr]
        assert json.loads((await client.call_tool("roots_any", {})).content[0].text) == []  # type: ignore[union-attr]
    assert seen.elicitations == [] and seen.roots == 0


def exec_params(sidecar: SidecarProcess, name: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k not in ("MCPCREDS_GRANT", "MCPCREDS_SOCKET")}
    return StdioServerParameters(
        command=sys.executable, cwd=str(ROOT), env={**env, "MCPCREDS_CONFIG": str(sidecar.config)},
        args=["-m", "mcpcreds.cli.main", "exec", name, "--", sys.executable, "-m", "tests.peers.mcp_untrusted_stdio"])


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_sampling_the_entry_may_not_make_never_reaches_the_client(sidecar: SidecarProcess,
                                                                          workdir: Path, mode: str) -> None:
    """Undeclared to the child; one that asks anyway gets the relay's error (2025), or the client's
    call fails (2026-07-28): the client's LLM is never asked. An entry that may sample asks it once."""
    from mcp.client import Client

    for name, reason in (("sandboxed", "sandboxed"), ("no-sample", "sampling_enabled")):
        seen = Seen()
        async with Client(exec_params(sidecar, name), mode=mode, sampling_callback=seen.sample) as client:
            if mode == "legacy":
                refused = (await client.call_tool("sample", {})).content[0].text  # type: ignore[union-attr]
                assert refused == f"refused: {SAMPLING_REFUSED}"
            else:
                with pytest.raises(MCPError) as failed:
                    await client.call_tool("sample", {})
                assert failed.value.error.data == {"policy": "sampling"}
            at_server = json.loads((await client.call_tool("stats", {})).content[0].text)  # type: ignore[union-attr]
        assert seen.samplings == 0 and at_server["sampling_declared"] == [False]
        lines = audit(workdir, "sampling", name)
        assert lines and (lines[-1]["action"], lines[-1]["reason"]) == ("refused", reason)
    seen = Seen()
    async with Client(exec_params(sidecar, "opted"), mode=mode, sampling_callback=seen.sample) as client:
        assert (await client.call_tool("sample", {})).content[0].text == "an old pond"  # type: ignore[union-attr]
    assert seen.samplings == 1
