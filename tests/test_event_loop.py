"""The sidecar's event loop (`[sidecar] event_loop`): uvloop's by default, asyncio's when asked.

The real sidecar relays the real MCP SDK 2.x client's session to a real MCP server on each loop,
over the socket and the loopback TCP listener (the transports, the peer's uid and TCP_NODELAY
differ between the two loops' transports), and says which loop it runs in its `ready` line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient
from mcpcreds.config.load import parse_config
from mcpcreds.errors import ConfigError
from tests.conftest import CANARY
from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar

KEY = "LOOP-" + CANARY


@pytest.fixture(scope="module")
def peer() -> Iterator[GatewayPeer]:
    with start_gateway_peer("unused-token-", KEY) as server:
        yield server


def config_text(folder: Path, peer: GatewayPeer, event_loop: str | None) -> str:
    chosen = "" if event_loop is None else f'event_loop = "{event_loop}"\n'
    return f"""
[sidecar]
socket = "{folder / 'run' / 'mcpcreds.sock'}"
{chosen}
[gateway]
listen = "127.0.0.1:0"

[secrets]
sources = ["env"]

[[servers]]
name = "tools"
endpoint = "{peer.url}"
headers = {{ "X-Api-Key" = "{{{{secret:LOOP_KEY}}}}" }}
trust = "trusted"
"""


def listen_backlog(port: int) -> int:
    """The backlog of the TCP listener on `port`, as the kernel has it (`ss`: Send-Q of a listener)."""
    shown = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True)
    rows = [line.split() for line in shown.stdout.splitlines() if line.strip()]
    assert len(rows) == 1, shown.stdout
    return int(rows[0][2])


async def one_session(http: httpx2.AsyncClient, url: str) -> Any:
    async with streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("add", {"a": 2, "b": 3})
        assert not result.is_error, result
        return result.structured_content["result"]


@contextmanager
def sidecar_on(peer: GatewayPeer, event_loop: str | None) -> Iterator[SidecarProcess]:
    """The real sidecar with server `tools` (the peer, behind its key), `event_loop` as given."""
    folder = Path(tempfile.mkdtemp(prefix="mcpcreds-loop-"))  # short: a socket path has 107 bytes
    try:
        config = folder / "config.toml"
        config.write_text(config_text(folder, peer, event_loop))
        with run_sidecar(config, folder / "run" / "mcpcreds.sock", {"LOOP_KEY": KEY}) as sidecar:
            yield sidecar
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(("asked", "runs"), [(None, "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")])
async def test_the_sidecar_relays_on_the_loop_its_config_names(peer: GatewayPeer, asked: str | None,
                                                               runs: str) -> None:
    before = peer.stats()["unauthorized"]
    with sidecar_on(peer, asked) as sidecar:
        ready = next(e for line in sidecar.lines if (e := json.loads(line)).get("event") == "ready")
        assert ready["event_loop"] == runs
        assert listen_backlog(int(ready["gateway_listen"].rsplit(":", 1)[1])) == 1024
        async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client("tools") as http:
            assert await one_session(http, creds.mcp_url("tools")) == 5  # over the socket
        async with httpx2.AsyncClient() as http:  # over the loopback listener
            assert await one_session(http, f"http://{ready['gateway_listen']}/mcp/tools") == 5
    assert peer.stats()["unauthorized"] == before  # every request carried the sidecar's key


def test_a_client_on_uvloop_reaches_the_sidecar(peer: GatewayPeer) -> None:
    """An application that runs uvloop itself: `AsyncClient` and the gateway through it work on it
    (uvloop's transports are not `asyncio.Transport` subclasses)."""
    import uvloop

    with sidecar_on(peer, None) as sidecar:
        async def app() -> tuple[list[str], Any]:
            async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client("tools") as http:
                names = [s["name"] for s in await creds.servers()]
                return names, await one_session(http, creds.mcp_url("tools"))

        assert uvloop.run(app()) == (["tools"], 5)


def test_an_unknown_event_loop_is_a_config_error_that_does_not_echo_it() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"sidecar": {"event_loop": "tokio-" + CANARY}})
    assert any("sidecar.event_loop" in e and "'uvloop' or 'asyncio'" in e for e in caught.value.errors)
    assert CANARY not in str(caught.value.errors)
    assert parse_config({"sidecar": {"event_loop": "asyncio"}}).sidecar.event_loop == "asyncio"
    assert parse_config({}).sidecar.event_loop == "uvloop"


def test_without_uvloop_the_sidecar_says_so_and_runs_on_asyncio(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import sys

    from mcpcreds.sidecar.serve import new_loop
    from mcpcreds.sidecar.wire import loop_kind

    monkeypatch.setitem(sys.modules, "uvloop", None)  # what an import of a package not installed does
    with caplog.at_level("WARNING", logger="mcpcreds.sidecar"):
        loop = new_loop("uvloop")
    try:
        assert isinstance(loop, asyncio.SelectorEventLoop) and loop_kind(loop) == "asyncio"
        assert any("uvloop is not installed" in r.getMessage() for r in caplog.records)
    finally:
        loop.close()
    monkeypatch.delitem(sys.modules, "uvloop")
    chosen = new_loop("uvloop")
    try:
        assert loop_kind(chosen) == "uvloop"
    finally:
        chosen.close()


def test_the_socket_path_outlives_its_server_on_uvloop(tmp_path: Path) -> None:
    """uvloop's Unix server unlinks its path when it closes on Python 3.13 and later (its default
    there, played here by a loop whose default it is): the sidecar's never does, so systemd's
    socket survives a stop (and ours is unlinked only while it is still ours)."""
    import asyncio

    import uvloop

    from mcpcreds.sidecar.wire import Acceptor, bind_unix_socket, serve_socket

    class Py313Loop(uvloop.Loop):
        async def create_unix_server(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("cleanup_socket", True)
            return await super().create_unix_server(*args, **kwargs)

    path = tmp_path / "s.sock"

    async def serve_and_close() -> None:
        sock = bind_unix_socket(str(path))
        server = await serve_socket(sock, asyncio.Protocol)
        assert not isinstance(server, Acceptor)  # uvloop's server
        server.close()
        await server.wait_closed()

    with asyncio.Runner(loop_factory=Py313Loop) as runner:
        runner.run(serve_and_close())
    assert path.exists()
