"""An AAuth resource: a real MCP server (the MCP Python SDK 2.x, Streamable HTTP under uvicorn) that
admits only requests signed as AAuth profiles HTTP Message Signatures, checked by
`tests.peers.aauth_verify` (http-message-signatures + http-sf + cryptography; no mcpcreds code).

- `/mcp`: a request that fails verification gets 401 with `WWW-Authenticate: AAuth` and
  `Signature-Error: error=<code>`; a verified one reaches the SDK's app. Tools: `echo`, `add`.
- `/token-required/mcp`: verifies the signature, then asks for an AAuth access token the sidecar
  does not have: 401 `WWW-Authenticate: AAuth requirement=auth-token`, `Signature-Error` absent.
- `GET /_test/stats`: {"verified", "rejected": {code: n}, "keys": [x of each verified key],
  "covered": [the components of the last verified request], "unsigned": requests with no signature}.
- `POST /_test/check`: {"method", "url", "headers": [[name, value], ...], "body": "<text>"} -> the
  verification of a request a test signed elsewhere (for the `sign` route): {"ok"} or {"error"}.

Run it as ``python -m tests.peers.aauth_peer``: it prints ``READY <base url>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx

from tests.peers.aauth_verify import Rejected, verify
from tests.peers.asgi import buffered, send_json
from tests.peers.process import read_log, ready_process

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[2]


class State:
    def __init__(self) -> None:
        self.verified = 0
        self.rejected: Counter[str] = Counter()
        self.unsigned = 0
        self.keys: list[str] = []
        self.covered: list[str] = []

    def snapshot(self) -> dict[str, Any]:
        return {"verified": self.verified, "rejected": dict(self.rejected), "keys": self.keys,
                "covered": self.covered, "unsigned": self.unsigned}


def build_server() -> MCPServer[Any]:
    from mcp.server.mcpserver import MCPServer

    server: MCPServer[Any] = MCPServer("aauth-peer", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return server


def build_app(state: State) -> ASGIApp:
    mcp_app = build_server().streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")

    def check(scope: Scope, body: bytes) -> Rejected | None:
        lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        host = next((v for k, v in lines if k.lower() == "host"), "")
        query = scope.get("query_string", b"").decode("latin-1")
        url = f"{scope['scheme']}://{host}{scope.get('raw_path', scope['path'].encode()).decode('latin-1')}"
        if query and "?" not in url:
            url += f"?{query}"
        if not any(k.lower() == "signature" for k, _ in lines):
            state.unsigned += 1
        try:
            verified = verify(scope["method"], url, lines, body, time.time())
        except Rejected as exc:
            state.rejected[exc.error] += 1
            return exc
        state.verified += 1
        state.keys.append(verified.jwk["x"])
        state.covered = verified.covered
        return None

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http":
            await mcp_app(scope, receive, send)
            return
        if path == "/_test/stats":
            await send_json(send, 200, state.snapshot())
            return
        if path == "/_test/check":
            raw, _ = await buffered(receive)
            ask = json.loads(raw)
            try:
                verify(ask["method"], ask["url"], [tuple(h) for h in ask["headers"]], ask["body"].encode(),
                       time.time())
            except Rejected as exc:
                await send_json(send, 200, {"error": exc.error})
                return
            await send_json(send, 200, {"ok": True})
            return
        body, receive = await buffered(receive)
        failed = check(scope, body)
        if failed is not None:
            await send_json(send, 401, {"error": failed.error}, [
                (b"www-authenticate", b'AAuth'), (b"signature-error", f"error={failed.error}".encode())])
            return
        if path == "/token-required/mcp":
            await send_json(send, 401, {"error": "auth_token_required"}, [
                (b"www-authenticate", b'AAuth requirement=auth-token; resource="aauth-peer"')])
            return
        await mcp_app({**scope, "path": "/mcp"} if path.endswith("/mcp") else scope, receive, send)

    return app


async def serve() -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(build_app(State()), log_level="critical", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.01)
    print(f"READY http://127.0.0.1:{port}", flush=True)
    await task


class AAuthPeer:
    def __init__(self, base: str, workdir: Path) -> None:
        self.base = base
        self.url = f"{base}/mcp"
        self._workdir = workdir
        self._http = httpx.Client(base_url=base, timeout=10.0)

    def stats(self) -> dict[str, Any]:
        response = self._http.get("/_test/stats")
        response.raise_for_status()
        return cast(dict[str, Any], response.json())

    def check(self, method: str, url: str, headers: list[tuple[str, str]], body: str) -> dict[str, Any]:
        response = self._http.post("/_test/check", json={"method": method, "url": url,
                                                          "headers": headers, "body": body})
        response.raise_for_status()
        return cast(dict[str, Any], response.json())

    def log(self) -> str:
        return read_log(self._workdir)


@contextlib.contextmanager
def start_aauth_peer() -> Iterator[AAuthPeer]:
    cmd = [sys.executable, "-m", "tests.peers.aauth_peer"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with ready_process(lambda _: cmd, what="AAuth peer", cwd=ROOT, timeout=30, env=env) as (_, base, workdir):
        peer = AAuthPeer(base, workdir)
        try:
            yield peer
        finally:
            peer._http.close()


if __name__ == "__main__":
    asyncio.run(serve())
