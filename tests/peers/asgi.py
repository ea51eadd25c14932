"""What the MCP server peers (mcp_server.py, mcp_gateway_peer.py, aauth_peer.py, sigv4_peer.py)
share around the SDK's ASGI app: reading a request body while letting the app read it again, a
JSON answer, the switch that answers the next N requests of a JSON-RPC method with 429 +
Retry-After, and serving on loopback until stopped."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Send


async def buffered(receive: Receive) -> tuple[bytes, Receive]:
    """Read the whole request body; return it and a `receive` that replays it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


async def send_json(send: Send, status: int, payload: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def rpc_methods(body: bytes) -> list[str]:
    """The JSON-RPC methods of a POST body (a message or a batch); [] if it is no JSON."""
    try:
        data = json.loads(body)
    except ValueError:
        return []
    items = data if isinstance(data, list) else [data]
    return [m["method"] for m in items if isinstance(m, dict) and isinstance(m.get("method"), str)]


@dataclass
class Fail429:
    """The next `count` POSTs holding a request of `method` (None: any POST) get a 429."""

    count: int = 0
    retry_after: str = "1"
    method: str | None = "tools/call"
    refused: int = 0  # 429s sent so far

    def arm(self, args: dict[str, Any]) -> None:
        self.count = int(args.get("count", 1))
        self.retry_after = str(args.get("retry_after", 1))
        self.method = args.get("method", "tools/call")

    async def refuse(self, send: Send, methods: Iterable[str]) -> bool:
        """Answer 429 if armed for one of `methods`; True if it did."""
        if self.count <= 0 or (self.method is not None and self.method not in methods):
            return False
        self.count -= 1
        self.refused += 1
        await send_json(send, 429, {"error": "rate_limited"}, [(b"retry-after", self.retry_after.encode())])
        return True


async def serve_on_loopback(make_app: Callable[[int], Any]) -> None:
    """Serve `make_app(port)` with uvicorn on an ephemeral 127.0.0.1 port, print `READY <url>`
    once it listens (what `process.ready_process` waits for), and run until stopped."""
    import asyncio
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted connections inherit it
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(make_app(port), log_level="critical", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.01)
    print(f"READY http://127.0.0.1:{port}", flush=True)
    await task
