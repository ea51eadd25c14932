"""The egress proxy of `mcpcreds exec`: requests on a kept tunnel never wait for a delayed ACK.

A real `EgressProxy` in process, and an upstream in another process: uvicorn on asyncio's own
loop with a streamed answer, which holds the answer's body until its head is acknowledged. Linux
delays the ACK on a connection that has just sent, so each request on a kept tunnel waited 40 ms
at least (Linux's TCP_DELACK_MIN) where it takes about 1 ms; the proxy has the upstream's answer
acknowledged at once (`net/quick_ack.py`). A median under 40 ms is a bound only that bug crosses.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mcpcreds.net.egress import EgressPolicy
from tests.egress_proxy_rig import basic, running_proxy

WAIT = 20.0
DELAYED_ACK = 0.040  # Linux's TCP_DELACK_MIN: the least a delayed ACK waits

STREAMING_UPSTREAM = """
import socket, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

async def answer(request):
    await request.body()
    async def events():
        yield b"event: message\\r\\ndata: {}\\r\\n\\r\\n"
    return StreamingResponse(events(), media_type="text/event-stream")

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(16)  # connections wait in the backlog until uvicorn serves
print(sock.getsockname()[1], flush=True)
app = Starlette(routes=[Route("/mcp", answer, methods=["POST"])])
uvicorn.Server(uvicorn.Config(app, loop="asyncio", log_level="warning")).run(sockets=[sock])
"""


async def test_requests_on_a_kept_tunnel_never_wait_for_a_delayed_ack(tmp_path: Path) -> None:
    upstream = subprocess.Popen([sys.executable, "-c", STREAMING_UPSTREAM], stdout=subprocess.PIPE, text=True)
    try:
        async with running_proxy(tmp_path) as (proxy, _audit):
            assert upstream.stdout is not None
            port = int(await asyncio.to_thread(upstream.stdout.readline))
            token = proxy.new_session("t", EgressPolicy("broad_audited", allow_private=("127.0.0.1",)),
                                      os.getuid(), 1, None)[0]
            reader, writer = await asyncio.open_unix_connection(proxy.path)
            writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nProxy-Authorization: Basic ".encode()
                         + basic(token) + b"\r\n\r\n")
            assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)).startswith(b"HTTP/1.1 200 ")
            request = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 2\r\n\r\n{{}}".encode()
            took = []
            for _ in range(15):
                started = time.perf_counter()
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
                assert head.startswith(b"HTTP/1.1 200 ") and b"chunked" in head, head
                await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), WAIT)  # the answer's last chunk
                took.append(time.perf_counter() - started)
            writer.close()
        assert statistics.median(took) < DELAYED_ACK, [round(t * 1e3, 1) for t in took]
    finally:
        upstream.kill()
        upstream.wait()
