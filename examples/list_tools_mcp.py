"""List the tools of an MCP server with the MCP Python SDK, credentials from the mcpcreds sidecar.

    python examples/list_tools_mcp.py SERVER_NAME [--socket PATH]

SERVER_NAME is a `[[servers]]` name from the sidecar's config. This process never sees a
secret: for each HTTP request the sidecar hands out a permit from the server's shared rate
bucket and its current headers (e.g. a fresh OAuth bearer token). A 401 drops that login and
retries once with a new one; a 429 pauses the bucket for every process using it.

Needs the MCP Python SDK 2.x (`pip install 'mcp>=2'`), whose HTTP client is httpx2. With the
SDK 1.x (httpx), pass the same auth: `streamablehttp_client(url, auth=creds.auth(name))`.
"""

from __future__ import annotations

import argparse
import asyncio

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient


async def main(server: str, socket: str | None) -> None:
    # The socket defaults to $MCPCREDS_SOCKET, then $XDG_RUNTIME_DIR/mcpcreds/mcpcreds.sock.
    async with AsyncClient(socket) as creds:
        # The endpoint is in the sidecar's config too: no URL to repeat here.
        specs = {spec["name"]: spec for spec in await creds.servers()}
        if server not in specs:
            raise SystemExit(f"no server {server!r} in the sidecar's config (known: {sorted(specs)})")
        # `creds.auth(server)` is an httpx2.Auth (and an httpx.Auth). on_429="wait": a 429
        # waits out the server's Retry-After (shared with every process) and retries once.
        async with (
            httpx2.AsyncClient(auth=creds.auth(server, on_429="wait")) as http,
            streamable_http_client(specs[server]["endpoint"], http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            for tool in (await session.list_tools()).tools:
                print(f"{tool.name}: {tool.description or ''}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="List an MCP server's tools through mcpcreds.")
    parser.add_argument("server", help="a server name from the sidecar's config")
    parser.add_argument("--socket", help="the sidecar's socket (default: the usual place)")
    args = parser.parse_args()
    asyncio.run(main(args.server, args.socket))
