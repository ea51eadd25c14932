"""The server suite of the MCP conformance package (npm `@modelcontextprotocol/conformance` 0.1.16,
`conformance server --suite all`, on the Node 22 its peer installs from npm) run against
`@modelcontextprotocol/server-everything` three ways: directly, through the gateway's loopback
TCP listener, and through the gateway on the Unix socket (the suite speaks TCP only, so a byte
pipe in this test carries each of its connections to the socket: a transport, no server of its
own). The server is trusted (every tool exposed), its rate loose, `expose = "proxy"`.

server-everything is not the suite's reference server (it has none of the `test_*` tools and
prompts most scenarios call), so most scenarios fail directly (11 of 32 pass); what the gateway owes
is to change nothing: the scenarios that pass through each listener are exactly those that pass
directly and `server-sse-polling` (its SSE checks do not apply to the JSON answer the gateway
sends: JSON_ONLY), and every check of every other scenario ends as it does directly, with the same
message. The one scenario about the listener itself rather than the server behind it,
`dns-rebinding-protection`, is judged check by check: DIFFERENCES lists what the loopback listener
does in the server's place, and why."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peers.process import ready_process
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_conformance import CONFORMANCE, NODE, PEER
from tests.test_gateway_tcp import listening

ROOT = Path(__file__).resolve().parents[1]
TS = ROOT / "tests" / "peers" / "ts_client"
RUN_TIMEOUT = 240  # seconds, for one run of the whole suite (about 5 s on an idle host)
DIRECT_PASSING = 11  # the scenarios server-everything passes directly with the 0.1.16 suite (docs: 11 of 32)
STAMP = re.compile(r"^server-(.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")  # the suite's result folder
RELAYS = ("tcp", "socket")
# check id -> (status through the loopback listener, why it differs from the direct run): the
# listener's own defence against DNS rebinding stands in front of whatever the server does. It
# refuses a foreign Host (server-everything, directly, answers 200), and refuses every request
# that carries an Origin, its own included (no web page is a client of the gateway), where the
# suite would accept a loopback Origin. The scenario fails either way, for different checks.
DIFFERENCES: dict[str, tuple[str, str]] = {
    "localhost-host-rebinding-rejected": ("SUCCESS", "a foreign Host is refused (403) by the listener"),
    "localhost-host-valid-accepted": ("FAILURE", "any Origin is refused (403) by the listener"),
}
LISTENER_SCENARIO = "dns-rebinding-protection"
# the gateway passes an SSE answer of one message that then ends as a JSON body: the suite's SSE
# checks do not apply to it (INFO). Directly, server-everything's SSE answers pass the multiple
# streams checks and fail the polling ones (it has no `test_reconnection` tool: an isError result).
# check id -> the (status, details) it has through the gateway
JSON_CHECKS: dict[str, dict[str, Any]] = {
    "server-sse-content-type": {"status": "INFO", "contentType": "application/json"},
    "server-sse-streams-functional": {"status": "INFO", "numSseStreams": 0},
}
JSON_SCENARIOS = frozenset({"server-sse-polling", "server-sse-multiple-streams"})
# the scenario that passes through the gateway and fails directly: with its SSE checks INFO, the
# suite judges nothing else of it (directly: the tool call it streams fails, and two warnings)
JSON_ONLY = "server-sse-polling"

Checks = dict[str, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def everything() -> Iterator[str]:
    """`@modelcontextprotocol/server-everything` (npm), over Streamable HTTP on a free loopback port."""
    if not (TS / "node_modules" / "@modelcontextprotocol" / "server-everything").is_dir():
        raise RuntimeError(f"{TS}/node_modules missing: run .ci/run (npm ci in tests/peers/ts_client)")
    with ready_process(lambda _: ["node", "everything.mjs"], what="server-everything", cwd=TS,
                       timeout=60) as (_, base, _workdir):
        yield f"{base}/mcp"


@pytest.fixture(scope="module")
def sidecar(everything: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("srvconf")
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"

[gateway]
listen = "127.0.0.1:0"

[[servers]]
name = "everything"
endpoint = "{everything}"
trust = "trusted"
rate = "10000/1s"
expose = "proxy"
""")
    with run_sidecar(config, socket) as proc:
        yield proc


class UnixBridge:
    """A listener on 127.0.0.1 that pipes each connection's bytes, both ways, to a Unix socket,
    on an event loop of its own (the suite runs as a subprocess the test waits on)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.open: set[asyncio.Task[Any]] = set()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self.connect, "127.0.0.1", 0), self.loop).result(timeout=10)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.open.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(self.path)
        except OSError:
            writer.close()
            self.open.discard(task)
            return
        try:
            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        finally:
            for end in (upstream_writer, writer):
                end.close()
            self.open.discard(task)

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for task in self.open:  # connections still open (a GET stream the suite left)
                task.cancel()
            await asyncio.gather(*self.open, return_exceptions=True)
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


@pytest.fixture(scope="module")
def bridge(sidecar: SidecarProcess) -> Iterator[str]:
    """`127.0.0.1:PORT`, a TCP way to the gateway on the sidecar's Unix socket."""
    unix = UnixBridge(sidecar.socket)
    try:
        yield unix.address
    finally:
        unix.close()


def run_suite(url: str, out: Path) -> tuple[Checks, str]:
    """Every server scenario of the suite against `url`: each scenario's checks, and the output."""
    if not CONFORMANCE.exists() or not NODE.exists():
        raise RuntimeError(f"{PEER}/node_modules incomplete: run .ci/run (npm ci in tests/peers/conformance)")
    result = subprocess.run([str(NODE), str(CONFORMANCE), "server", "--url", url, "--suite", "all", "-o", str(out)],
                            cwd=PEER, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=RUN_TIMEOUT)
    checks: Checks = {}
    for path in out.glob("*/checks.json"):
        stamp = STAMP.match(path.parent.name)
        assert stamp, path
        checks[stamp.group(1)] = json.loads(path.read_text())
    return checks, result.stdout + result.stderr


def server_scenarios() -> list[str]:
    """The server scenarios the installed suite lists (`conformance list --server`)."""
    listed = subprocess.run([str(NODE), str(CONFORMANCE), "list", "--server"], cwd=PEER,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                            check=True).stdout
    # each line: `  - NAME [VERSION,...]`
    return [line.strip()[2:].split(" [")[0] for line in listed.splitlines() if line.strip().startswith("- ")]


@pytest.fixture(scope="module")
def runs(everything: str, sidecar: SidecarProcess, bridge: str,
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Checks, str]]:
    """The suite directly, through the loopback listener, and through the socket (one at a time:
    they share the upstream)."""
    out = tmp_path_factory.mktemp("results")
    urls = {"direct": everything, "tcp": f"http://{listening(sidecar)}/mcp/everything",
            "socket": f"http://{bridge}/mcp/everything"}
    return {way: run_suite(url, out / way) for way, url in urls.items()}


def passed(checks: list[dict[str, Any]]) -> bool:
    """The suite's own verdict, as tests/test_conformance.py reads it: no FAILURE, no WARNING."""
    return not any(c["status"] in ("FAILURE", "WARNING") for c in checks)


def verdicts(checks: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Each check's id, status and message, in the suite's order."""
    return [(c["id"], c["status"], str(c.get("errorMessage") or "")) for c in checks]


def outcomes(runs: dict[str, tuple[Checks, str]]) -> str:
    """Each scenario's verdict each way, and what failed: printed when the ways differ."""
    lines = [f"{'scenario':34} " + " ".join(f"{way:7}" for way in runs)]
    for scenario in sorted(runs["direct"][0]):
        row = [("pass" if passed(runs[way][0][scenario]) else "FAIL") if scenario in runs[way][0] else "-"
               for way in runs]
        lines.append(f"{scenario:34} " + " ".join(f"{cell:7}" for cell in row))
        for way, (checks, _) in runs.items():
            for check in checks.get(scenario, []):
                if check["status"] in ("FAILURE", "WARNING"):
                    lines.append(f"    {way}: {check['id']} {check['status']}: {check.get('errorMessage')}")
    return "\n".join(lines)


@pytest.mark.timeout(RUN_TIMEOUT * 4)
def test_the_suite_ran_every_scenario_each_way(runs: dict[str, tuple[Checks, str]]) -> None:
    listed = server_scenarios()
    assert len(listed) >= 30, listed
    for way, (checks, output) in runs.items():
        assert sorted(checks) == sorted(listed), f"{way}:\n{output[-6000:]}"


@pytest.mark.timeout(RUN_TIMEOUT * 4)
@pytest.mark.parametrize("relay", RELAYS)
def test_the_gateway_passes_the_scenarios_the_server_passes(relay: str, runs: dict[str, tuple[Checks, str]]) -> None:
    """Through the listener pass exactly the scenarios that pass directly (11 of the suite's 32 with
    server-everything) and JSON_ONLY (12), and every check of every other scenario ends as it does
    directly, with the same message (a prompt or resource the server does not have is its own
    -32602, relayed)."""
    direct, through = runs["direct"][0], runs[relay][0]
    table = outcomes({"direct": runs["direct"], relay: runs[relay]})
    passing = {s for s, checks in direct.items() if passed(checks)}
    assert len(passing) == DIRECT_PASSING and JSON_ONLY not in passing, table
    through_passing = {s for s, checks in through.items() if passed(checks)}
    assert through_passing == passing | {JSON_ONLY}, table
    assert {c["status"] for c in through[JSON_ONLY]} == {"INFO"}, through[JSON_ONLY]  # nothing judged
    seen = {c["id"]: c for scenario in JSON_SCENARIOS for c in through[scenario]}
    for check, expected in JSON_CHECKS.items():
        assert {k: seen[check]["status"] if k == "status" else seen[check]["details"][k] for k in expected} \
            == expected, seen[check]
    for scenario, checks in direct.items():
        if (relay == "tcp" and scenario == LISTENER_SCENARIO) or scenario in JSON_SCENARIOS:
            continue  # the listener's own (the test below); JSON answers (above)
        assert verdicts(through[scenario]) == verdicts(checks), f"{scenario} differs through {relay}:\n{table}"


@pytest.mark.timeout(RUN_TIMEOUT * 4)
def test_the_loopback_listener_answers_for_dns_rebinding(runs: dict[str, tuple[Checks, str]]) -> None:
    """`dns-rebinding-protection` judges the listener in front, not the server behind: through the
    loopback listener each check comes out as DIFFERENCES says, whatever the server does (through
    the socket, which no browser reaches and which checks no Host, as directly: the test above)."""
    tcp = {c["id"]: c for c in runs["tcp"][0][LISTENER_SCENARIO]}
    assert {check: tcp[check]["status"] for check in DIFFERENCES} == {
        check: status for check, (status, _) in DIFFERENCES.items()}, tcp
    assert {tcp[check]["details"]["statusCode"] for check in DIFFERENCES} == {403}, tcp
