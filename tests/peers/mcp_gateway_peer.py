"""A real MCP server (the MCP Python SDK 2.x, Streamable HTTP under uvicorn) for the gateway tests.

Tools: ``echo(text)``, ``add(a, b)``, ``progress(steps)`` (reports progress ``steps`` times and,
after the first report, waits until the test releases it: a first event that reached the client
before the tool finished is proven, not timed) and ``leak()`` (returns the Authorization and
X-Api-Key headers the server received: a server that echoes credentials).

Every request to ``/mcp`` must carry credentials: ``Authorization: Bearer <t>`` with ``t``
starting with ``--token-prefix`` and not revoked, or ``X-Api-Key: <--static-key>``; otherwise
401. Besides ``/mcp``:

    POST /drop      answers with an SSE stream: one event, then the connection is cut
    POST /forever   answers with an SSE stream: one event, then nothing until the client leaves
    POST /linger    answers each request with an SSE stream: its result, then nothing until the
                    client leaves (a server that does not end the stream after the answer)
    POST /flood     a tools/call answered by an SSE stream: one progress event; after the test's
                    release, progress events of ``arguments.event`` bytes (default 64 KiB) until
                    ``arguments.bytes`` (default 10 MiB) are sent, then the call's result; it
                    writes as fast as its client's connection takes it (``flood_sent`` counts)
    GET  /_test/stats        {"requests": {"POST": n, ...}, "methods": {...}, "tools": {...},
                              "unauthorized", "rate_limited", "disconnects", "flood_sent",
                              "floods_done", "tokens": [...],
                              "sessions": [...], "headers": [[name, value], ...] of the last request}
    POST /_test/release      let the waiting ``progress`` tool go on
    POST /_test/revoke_all   refuse every token seen so far (a 401 for it)
    POST /_test/fail_429     {"count": N, "retry_after": "S"}: the next N tools/call POSTs get a 429

Run it as ``python -m tests.peers.mcp_gateway_peer --token-prefix P --static-key K``: it prints
``READY <base url>``. From a test: ``with start_gateway_peer(prefix, key) as peer: peer.url``.

``python -m tests.peers.mcp_gateway_peer client SOCKET SERVER`` is the other end, for the MCP SDK
1.x (run in its side venv, where the server's imports are absent): a session through the gateway
with ``creds.mcp_http_client``, by each 1.x entry point, printing one JSON line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.peers.asgi import Fail429, buffered, send_json, serve_on_loopback
from tests.peers.process import PeerHandle, ready_process

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[2]


class PeerState:
    def __init__(self, token_prefix: str, static_key: str) -> None:
        self.token_prefix = token_prefix
        self.static_key = static_key
        self.requests: Counter[str] = Counter()
        self.methods: Counter[str] = Counter()
        self.tools: Counter[str] = Counter()
        self.unauthorized = 0
        self.disconnects = 0
        self.flood_sent = 0
        self.floods_done = 0
        self.tokens: list[str] = []
        self.revoked: set[str] = set()
        self.sessions: list[str | None] = []
        self.headers: list[list[str]] = []
        self.fail_429 = Fail429()
        self.release = asyncio.Event()

    def snapshot(self) -> dict[str, Any]:
        return {"requests": dict(self.requests), "methods": dict(self.methods), "tools": dict(self.tools),
                "unauthorized": self.unauthorized, "rate_limited": self.fail_429.refused,
                "disconnects": self.disconnects, "flood_sent": self.flood_sent, "floods_done": self.floods_done, "tokens": list(self.tokens), "sessions": list(self.sessions),
                "headers": self.headers}

    def authorized(self, headers: dict[str, str]) -> bool:
        if self.static_key and headers.get("x-api-key") == self.static_key:
            return True
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.startswith(self.token_prefix) or token in self.revoked:
            return False
        if token not in self.tokens:
            self.tokens.append(token)
        return True


def build_server(state: PeerState) -> MCPServer[Any]:
    from mcp.server.mcpserver import Context, MCPServer

    globals()["Context"] = Context  # the SDK resolves the tools' annotations in this module's globals
    server: MCPServer[Any] = MCPServer("mcpcreds-gateway-peer", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    async def progress(steps: int, ctx: Context) -> str:
        """Report progress `steps` times; after the first, wait for the test's release."""
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step}")
            if step == 1:
                await state.release.wait()
                state.release.clear()
        return "done"

    @server.tool()
    def leak() -> str:
        """Return the credentials this server received (a server that echoes them)."""
        last = dict((k, v) for k, v in state.headers)
        return json.dumps({"authorization": last.get("authorization"), "x-api-key": last.get("x-api-key")})

    return server


def _messages(body: bytes) -> list[dict[str, Any]]:
    try:
        data = json.loads(body)
    except ValueError:
        return []
    items = data if isinstance(data, list) else [data]
    return [m for m in items if isinstance(m, dict)]


def build_app(state: PeerState) -> ASGIApp:
    mcp_app = build_server(state).streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")

    async def one_event_stream(receive: Receive, send: Send, then_cut: bool) -> None:
        _, receive = await buffered(receive)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        event = {"jsonrpc": "2.0", "method": "notifications/message",
                 "params": {"level": "info", "data": "first and last event"}}
        await send({"type": "http.response.body", "body": b"event: message\ndata: " + json.dumps(event).encode()
                    + b"\n\n", "more_body": True})
        # half an event: a client must never receive it
        await send({"type": "http.response.body", "body": b"event: message\ndata: {\"partial\":", "more_body": True})
        if then_cut:
            raise RuntimeError("the peer cuts the stream")  # uvicorn drops the connection mid-body
        while (await receive())["type"] != "http.disconnect":
            pass
        state.disconnects += 1

    async def linger(body: bytes, receive: Receive, send: Send) -> None:
        call = next((m for m in _messages(body) if "id" in m), {})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        answer = {"jsonrpc": "2.0", "id": call.get("id"), "result": {"content": [], "isError": False}}
        await send({"type": "http.response.body", "body": b"event: message\ndata: " + json.dumps(answer).encode()
                    + b"\n\n", "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass
        state.disconnects += 1

    async def flood(receive: Receive, send: Send) -> None:
        body, _ = await buffered(receive)
        call = next((m for m in _messages(body) if m.get("method") == "tools/call"), {})
        args = (call.get("params") or {}).get("arguments") or {}
        total, size = int(args.get("bytes", 10 * 2**20)), int(args.get("event", 64 * 1024))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})

        def event(message: dict[str, Any]) -> bytes:
            return b"event: message\ndata: " + json.dumps(message).encode() + b"\n\n"

        def progress(n: int, text: str) -> bytes:
            return event({"jsonrpc": "2.0", "method": "notifications/progress",
                          "params": {"progressToken": "flood", "progress": n, "message": text}})

        state.flood_sent = 0
        await send({"type": "http.response.body", "body": progress(0, "first"), "more_body": True})
        await state.release.wait()
        state.release.clear()
        pad, n = "x" * size, 0
        while state.flood_sent < total:
            n += 1
            chunk = progress(n, pad)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})  # waits while full
            state.flood_sent += len(chunk)
        result = {"content": [{"type": "text", "text": f"flooded {n}"}], "isError": False}
        await send({"type": "http.response.body", "body": event({"jsonrpc": "2.0", "id": call.get("id"),
                                                                 "result": result})})
        state.floods_done += 1

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http":
            await mcp_app(scope, receive, send)
            return
        if path == "/_test/stats":
            await send_json(send, 200, state.snapshot())
            return
        if path == "/_test/release":
            state.release.set()
            await send_json(send, 200, {"ok": True})
            return
        if path == "/_test/revoke_all":
            state.revoked.update(state.tokens)
            await send_json(send, 200, {"ok": True})
            return
        if path == "/_test/fail_429":
            body, _ = await buffered(receive)
            state.fail_429.arm(json.loads(body or b"{}"))
            await send_json(send, 200, {"ok": True})
            return
        if path not in ("/mcp", "/drop", "/forever", "/flood", "/linger"):
            await mcp_app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        state.headers = [[k.decode("latin-1").lower(), v.decode("latin-1")] for k, v in scope["headers"]]
        state.requests[scope["method"]] += 1
        state.sessions.append(headers.get("mcp-session-id"))
        body, receive = await buffered(receive)
        messages = _messages(body)
        for message in messages:
            if isinstance(message.get("method"), str):
                state.methods[message["method"]] += 1
                if message["method"] == "tools/call":
                    state.tools[str((message.get("params") or {}).get("name"))] += 1
        if not state.authorized(headers):
            state.unauthorized += 1
            await send_json(send, 401, {"error": "invalid_token"},
                        [(b"www-authenticate", b'Bearer error="invalid_token"')])
            return
        if await state.fail_429.refuse(send, [str(m.get("method")) for m in messages]):
            return
        if path == "/flood":
            await flood(receive, send)
        elif path == "/drop":
            await one_event_stream(receive, send, then_cut=True)
        elif path == "/forever":
            await one_event_stream(receive, send, then_cut=False)
        elif path == "/linger":
            await linger(body, receive, send)
        else:
            await mcp_app(scope, receive, send)

    return app


async def serve(args: argparse.Namespace) -> None:
    await serve_on_loopback(lambda _port: build_app(PeerState(args.token_prefix, args.static_key)))


class GatewayPeer(PeerHandle):
    pid = 0  # the server process

    def release(self) -> None:
        self._http.post("/_test/release").raise_for_status()

    def revoke_all(self) -> None:
        self._http.post("/_test/revoke_all").raise_for_status()

    def fail_next_with_429(self, count: int, retry_after: str) -> None:
        self._http.post("/_test/fail_429", json={"count": count, "retry_after": retry_after}).raise_for_status()


@contextlib.contextmanager
def start_gateway_peer(token_prefix: str, static_key: str) -> Iterator[GatewayPeer]:
    cmd = [sys.executable, "-m", "tests.peers.mcp_gateway_peer", "--token-prefix", token_prefix,
           "--static-key", static_key]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with ready_process(lambda _: cmd, what="MCP gateway peer", cwd=ROOT, timeout=60, env=env) as (proc, base, workdir):
        peer = GatewayPeer(base, workdir)
        peer.pid = proc.pid  # for the benches' CPU figures (/proc/PID/stat)
        try:
            yield peer
        finally:
            peer.close()


async def sdk1_client(socket_path: str, name: str) -> None:
    """Through the gateway with MCP SDK 1.x: `streamable_http_client(url, http_client=...)` (newer
    1.x) and `streamablehttp_client(url, httpx_client_factory=...)` (every 1.x)."""
    import importlib.metadata
    import warnings

    import mcp.client.streamable_http as transport
    from mcp import ClientSession

    from mcpcreds import AsyncClient

    async def run(via: str, streams_cm: Any) -> None:
        async with streams_cm as streams, ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            tools = sorted(t.name for t in (await session.list_tools()).tools)
            added: Any = await session.call_tool("add", {"a": 2, "b": 3})  # SDK 1.x's result
        print(json.dumps({"via": via, "mcp": importlib.metadata.version("mcp"), "tools": tools,
                          "add": (added.structuredContent or {}).get("result")}), flush=True)

    sdk1: Any = transport  # the 1.x API: mypy sees the 2.x SDK installed here
    async with AsyncClient(socket_path) as creds:
        url = creds.mcp_url(name)
        if hasattr(sdk1, "streamable_http_client"):
            async with creds.mcp_http_client(name) as http:
                await run("http_client", sdk1.streamable_http_client(url, http_client=http))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            await run("httpx_client_factory", sdk1.streamablehttp_client(
                url, httpx_client_factory=lambda **kw: creds.mcp_http_client(name, **kw)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        asyncio.run(sdk1_client(sys.argv[2], sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser()
    parser.add_argument("--token-prefix", required=True)
    parser.add_argument("--static-key", default="")
    asyncio.run(serve(parser.parse_args()))
