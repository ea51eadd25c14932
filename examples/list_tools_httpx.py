"""List the tools of an MCP server with plain httpx (no MCP SDK), credentials from mcpcreds.

    python examples/list_tools_httpx.py SERVER_NAME [--socket PATH]

Speaks just enough Streamable HTTP by hand: POST `initialize`, then the `initialized`
notification, then `tools/list`, each a JSON-RPC message. `auth=creds.auth(SERVER_NAME)` adds
the sidecar's headers (e.g. an OAuth bearer token) and takes a rate permit per request; a 401
drops that login and retries once with a new one.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx

from mcpcreds import Client

PROTOCOL_VERSION = "2025-06-18"


def rpc_result(response: httpx.Response) -> Any:
    """The JSON-RPC result of a POST: the body is JSON, or an SSE stream of `data:` lines."""
    response.raise_for_status()
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        messages = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
        message = next(m for m in messages if "id" in m)  # skip notifications sent before it
    else:
        message = response.json()
    if "error" in message:
        raise SystemExit(f"MCP error: {message['error']}")
    return message["result"]


def main(server: str, socket: str | None) -> None:
    with Client(socket) as creds:  # the synchronous client; AsyncClient for asyncio code
        # The endpoint is in the sidecar's config too: no URL to repeat here.
        specs = {spec["name"]: spec for spec in creds.servers()}
        if server not in specs:
            raise SystemExit(f"no server {server!r} in the sidecar's config (known: {sorted(specs)})")
        endpoint = specs[server]["endpoint"]
        headers = {"Accept": "application/json, text/event-stream"}
        with httpx.Client(auth=creds.auth(server), headers=headers, timeout=30) as http:
            init = http.post(endpoint, json={
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                           "clientInfo": {"name": "list_tools_httpx", "version": "1"}},
            })
            version = rpc_result(init)["protocolVersion"]
            # The server names the session in a header; later requests send it back.
            http.headers["MCP-Protocol-Version"] = version
            if "mcp-session-id" in init.headers:
                http.headers["Mcp-Session-Id"] = init.headers["mcp-session-id"]
            http.post(endpoint, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            tools = rpc_result(http.post(endpoint, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
            for tool in tools["tools"]:
                print(f"{tool['name']}: {tool.get('description', '')}")
            if "Mcp-Session-Id" in http.headers:
                http.delete(endpoint)  # end the session politely


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="List an MCP server's tools through mcpcreds, with httpx.")
    parser.add_argument("server", help="a server name from the sidecar's config")
    parser.add_argument("--socket", help="the sidecar's socket (default: the usual place)")
    args = parser.parse_args()
    main(args.server, args.socket)
