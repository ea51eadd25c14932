"""The gateway against a real MCP server (the MCP SDK 2.x on uvicorn, tests/peers/mcp_server.py)
on a kept upstream connection, with the SDK's client in this process through
`creds.mcp_httpx2_client`: what a user of the gateway sees call after call.

- Linux delays the ACK of what arrives on a connection that has just sent; uvicorn on asyncio's
  loop holds a streamed answer's body until its head is acknowledged, so every call on a kept
  connection waited for the delayed ACK: 40 ms at least (Linux's TCP_DELACK_MIN), 44-48 ms here,
  where a call takes 3-5 ms. A median under 40 ms is a bound only that bug crosses, whatever the
  load.
- anyio's Unix socket stream lets a read the SDK cancels be completed by the loop's reader
  callback: "Exception in callback Future.set_result(None) ... InvalidStateError" in the user's
  process. The gateway client's streams are asyncio transports; the loop reports no exception.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpcore2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient
from mcpcreds.client.gateway_http import checked_backend
from tests.conftest import CANARY, module_peer
from tests.peers.mcp_server import McpServerPeer
from tests.peers.oidc_peer import OidcPeer
from tests.sidecar_proc import SidecarProcess, run_sidecar

OIDC_CLIENTS: list[dict[str, Any]] = [  # on the shared peer (conftest)
    {"client_id": "kept-agent", "client_secret": CANARY, "token_endpoint_auth_method": "client_secret_basic",
     "scope": "tools:read tools:call"},
]
DELAYED_ACK = 0.040  # Linux's TCP_DELACK_MIN: the least a delayed ACK waits


@pytest.fixture(scope="module")
def sidecar(oidc_session: OidcPeer, mcp_server_session: McpServerPeer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    oidc = module_peer(oidc_session, 600)
    workdir = tmp_path_factory.mktemp("kept-upstream")
    socket = workdir / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"

[secrets]
sources = ["env"]

[services.mcp]
endpoint = "{mcp_server_session.url}"
[services.mcp.oauth]
token_url = "{oidc.token_url}"
client_id = "kept-agent"
client_secret = "{{{{secret:AGENT_SECRET}}}}"
scope = "tools:read tools:call"

[[servers]]
name = "tools"
service = "mcp"
trust = "trusted"
""")
    with run_sidecar(config, socket, {"AGENT_SECRET": CANARY}) as proc:
        yield proc


async def calls_through_the_gateway(sidecar: SidecarProcess, calls: int) -> tuple[list[float], list[dict[str, Any]]]:
    """One SDK session through the gateway: `calls` sequential `add` calls, each timed; and what
    the loop reported as exceptions in callbacks meanwhile (its exception handler's contexts)."""
    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reported.append(context))
    took = []
    async with (
        AsyncClient(sidecar.socket) as creds,
        creds.mcp_httpx2_client("tools") as http,
        streamable_http_client(creds.mcp_url("tools"), http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for n in range(calls):
            started = time.perf_counter()
            result = await session.call_tool("add", {"a": n, "b": 1})
            took.append(time.perf_counter() - started)
            assert not result.is_error and result.structured_content == {"result": n + 1}, result
    await asyncio.sleep(0)  # the callbacks the session's end scheduled have run
    return took, reported


async def test_calls_on_a_kept_upstream_connection_never_wait_for_a_delayed_ack(sidecar: SidecarProcess) -> None:
    took, _ = await calls_through_the_gateway(sidecar, 15)
    assert statistics.median(took) < DELAYED_ACK, [round(t * 1e3, 1) for t in took]


async def test_a_session_through_the_gateway_client_leaves_no_exception_in_the_loop(sidecar: SidecarProcess) -> None:
    for _ in range(3):  # each session's end cancels the SDK's reads
        _, reported = await calls_through_the_gateway(sidecar, 3)
        assert reported == [], [str(context.get("exception") or context.get("message")) for context in reported]


@asynccontextmanager
async def client_and_listener_end(tmp_path: Path) -> AsyncIterator[tuple[Any, socket.socket]]:
    """A gateway client connection (`checked_backend`'s, checks passed) to a listener of ours, and
    the listener's end of it (a plain blocking socket)."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = str(folder / "s.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        stream = await checked_backend(httpcore2, path, os.getuid()).connect_unix_socket(path, 5.0)
        peer, _ = listener.accept()
        with peer:
            yield stream, peer


async def test_a_read_cancelled_as_its_bytes_arrive_leaves_no_exception_in_the_loop(tmp_path: Path) -> None:
    """The race itself: the read's bytes and its cancellation (a pipe polled in the same pass of
    the loop cancels it) come in the same pass, in either order."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    async with client_and_listener_end(tmp_path) as (stream, peer):
        trigger, pull = os.pipe()
        try:
            for cancel_first in (True, False, True, False):  # the order epoll gives them is its own
                reading = asyncio.ensure_future(stream.read(1024, 5.0))
                for _ in range(3):  # passes of the loop until the read waits for bytes (anyio's took 2)
                    await asyncio.sleep(0)
                loop.add_reader(trigger, reading.cancel)
                if cancel_first:
                    os.write(pull, b"x")
                peer.send(b"bytes")
                if not cancel_first:
                    os.write(pull, b"x")
                try:
                    got = await reading
                except asyncio.CancelledError:
                    got = await stream.read(1024, 5.0)  # the bytes are kept for the next read
                loop.remove_reader(trigger)
                os.read(trigger, 1)
                assert got == b"bytes"
            await stream.aclose()
        finally:
            os.close(trigger)
            os.close(pull)
    assert reported == [], [str(context.get("exception") or context.get("message")) for context in reported]


async def test_a_connection_closed_with_bytes_unsent_is_gone_at_once(tmp_path: Path) -> None:
    """A write the sidecar does not take (it stopped reading) times out; closing the connection
    then drops what was not sent and the socket at once, rather than holding both until the
    sidecar reads again."""
    async with client_and_listener_end(tmp_path) as (stream, _peer):
        with pytest.raises(httpcore2.WriteTimeout):
            await stream.write(b"x" * (16 << 20), 0.2)  # more than the socket's buffers hold
        sock = stream.get_extra_info("socket")
        await stream.aclose()
        for _ in range(3):  # passes of the loop: the transport's end runs from call_soon
            await asyncio.sleep(0)
        assert sock.fileno() == -1
