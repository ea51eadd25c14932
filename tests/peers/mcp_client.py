"""List and call tools through the MCP Python SDK, 1.x (plain httpx) or 2.x (httpx2), with
`creds.auth(name)` and its defaults (a 401 renews the login, a 429 pauses the bucket and waits).

Runs under the interpreter of either SDK: the main one (2.x) or the side venv `.venv-mcp1`
(mcp 1.x cannot be installed beside mcp 2.x):

    .venv-mcp1/bin/python tests/peers/mcp_client.py SOCKET SERVER_NAME MCP_URL

Prints one JSON object: {"mcp_version", "auth_is_httpx2", "runs": [{"via", "tools", "add", "echo"}]}.
A run is made through each client entry point this SDK version has: `streamablehttp_client(url,
auth=...)` (1.x only) and `streamable_http_client(url, http_client=AsyncClient(auth=...))` (newer
1.x with httpx, 2.x with httpx2).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import json
import sys
import warnings
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import mcp.client.streamable_http as transport
from mcp import ClientSession

from mcpcreds import AsyncClient

MCP_VERSION = importlib.metadata.version("mcp")
# the HTTP client library the SDK's transport takes: httpx for 1.x, httpx2 for 2.x
http_lib: Any = importlib.import_module("httpx" if MCP_VERSION.startswith("1.") else "httpx2")
ECHO = "héllo mcp"


def _value(result: Any) -> Any:
    """A tool's result, from the 1.x (camelCase) or the 2.x (snake_case) result model."""
    is_error = getattr(result, "is_error", getattr(result, "isError", None))
    structured = getattr(result, "structured_content", getattr(result, "structuredContent", None))
    if is_error:
        raise RuntimeError(f"tool call failed: {result.content!r}")
    if structured is not None:
        return structured.get("result")
    return result.content[0].text


async def _run(via: str, streams_cm: AbstractAsyncContextManager[Any]) -> dict[str, Any]:
    async with streams_cm as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            added = await session.call_tool("add", {"a": 2, "b": 3})
            echoed = await session.call_tool("echo", {"text": ECHO})
    return {"via": via, "tools": sorted(t.name for t in tools.tools), "add": _value(added),
            "echo": _value(echoed)}


@asynccontextmanager
async def _with_http_client(url: str, auth: Any) -> AsyncIterator[Any]:
    async with (http_lib.AsyncClient(auth=auth, timeout=http_lib.Timeout(30, read=300)) as http,
                transport.streamable_http_client(url, http_client=http) as streams):
        yield streams


async def main(socket: str, name: str, url: str) -> dict[str, Any]:
    runs = []
    async with AsyncClient(socket) as creds:
        auth = creds.auth(name)
        if hasattr(transport, "streamablehttp_client"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # deprecated for the one below
                runs.append(await _run("streamablehttp_client(auth=)",
                                       transport.streamablehttp_client(url, auth=auth)))
        if hasattr(transport, "streamable_http_client"):
            runs.append(await _run("streamable_http_client(http_client=)", _with_http_client(url, auth)))
    try:
        import httpx2

        is_httpx2 = isinstance(auth, httpx2.Auth)
    except ImportError:
        is_httpx2 = False
    return {"mcp_version": MCP_VERSION, "auth_is_httpx2": is_httpx2, "runs": runs}


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    print(json.dumps(asyncio.run(main(*sys.argv[1:]))))
