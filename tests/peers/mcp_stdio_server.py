"""A real stdio MCP server (the MCP Python SDK 2.x's `MCPServer`), run by tests through
`mcpcreds exec NAME -- python tests/peers/mcp_stdio_server.py`.

Tools:
- `pid()`: its process id (the test reads /proc/PID/environ);
- `fetch(url)`: an HTTP GET with httpx, which follows HTTP(S)_PROXY from the environment;
  returns "<status> <body>" or "error: <exception type>: <message>";
- `tunnel(host, port)`: a CONNECT through $HTTPS_PROXY by hand, then a GET inside the tunnel;
  returns "<proxy status line> | <first line of the upstream's answer>";
- `direct(host, port)`: a TCP connect that ignores every proxy variable; "connected" or the error.
"""

from __future__ import annotations

import base64
import os
import socket
from urllib.parse import urlsplit

import httpx
from mcp.server.mcpserver import MCPServer

server = MCPServer("exec-test")


@server.tool()
def pid() -> int:
    return os.getpid()


@server.tool()
def fetch(url: str) -> str:
    try:
        response = httpx.get(url, timeout=10)
    except Exception as exc:  # the test reads what failed
        return f"error: {type(exc).__name__}: {exc}"
    return f"{response.status_code} {response.text}"


@server.tool()
def tunnel(host: str, port: int) -> str:
    proxy = urlsplit(os.environ["HTTPS_PROXY"])
    credential = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
    try:
        with socket.create_connection((proxy.hostname, proxy.port), timeout=10) as sock:
            sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                         f"Proxy-Authorization: Basic {credential}\r\n\r\n".encode())
            head = _read_head(sock)
            status = head.split(b"\r\n", 1)[0].decode()
            if " 200 " not in status + " ":
                return f"{status} | "
            sock.sendall(f"GET /tunnelled HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            answer = _read_head(sock).split(b"\r\n", 1)[0].decode()
            return f"{status} | {answer}"
    except OSError as exc:
        return f"error: {type(exc).__name__}: {exc}"


@server.tool()
def direct(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=10):
            return "connected"
    except OSError as exc:
        return f"error: {type(exc).__name__}: {exc}"


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


if __name__ == "__main__":
    server.run("stdio")
