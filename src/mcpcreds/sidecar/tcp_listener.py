"""The gateway's loopback TCP listener (`[gateway] listen`), for MCP clients that cannot speak to a
Unix socket: `http://127.0.0.1:PORT/mcp/{server}`, and nothing else of the API.

- The caller's uid comes from the kernel's socket table (`tcp_peer`) when the connection is
  accepted, and is checked against `allow_uids` before a byte is read; a uid that cannot be found
  is refused. From there on the connection is the Unix socket's (`wire.HttpConnection`): the same
  limits, `grant_only_uids`, grants as `Authorization: Bearer <grant>` (never forwarded).
- Only `/mcp/{server}` (and `GET /v1/health`) are routed; every other path is a 404.
- A request must name this listener in its `Host` and carry no `Origin`: a web page in the
  user's browser (an allowed uid) cannot reach the gateway through DNS rebinding or a cross-site
  request.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Final

from ..config.model import ListenConfig
from ..core.http import Answer, Request, Response
from ..core.logs import get_logger
from ..errors import Forbidden, McpcredsError, NotFound
from .api import Api, error_to_response
from .tcp_peer import lookup_uid
from .wire import Connections, HttpConnection

_log = get_logger("gateway.tcp")

UidLookup = Callable[[tuple[object, ...], tuple[object, ...]], int | None]
HEALTH: Final = "/v1/health"


class ListenFailed(McpcredsError):
    code = "listen_failed"


def _header(request: Request, name: bytes) -> list[bytes]:
    return [value for key, value in request.headers if key.lower() == name]


class LoopbackApp:
    """The `wire.App` of the TCP listener: the API's gateway routes and health, nothing else."""

    def __init__(self, api: Api, hosts: frozenset[bytes]) -> None:
        self.api = api
        self.hosts = hosts

    def handle(self, request: Request) -> Answer | Awaitable[Answer]:
        gateway = request.path.startswith("/mcp/")
        if not gateway and not (request.method == "GET" and request.path == HEALTH):
            return error_to_response(NotFound("the TCP listener serves /mcp/{server} only; the API is on "
                                              "the Unix socket"), "tcp_refused")
        hosts = _header(request, b"host")
        if len(hosts) != 1 or hosts[0].lower() not in self.hosts:
            return self._refuse(request, gateway, "the Host header must name this listener "
                                                  "(127.0.0.1:PORT, [::1]:PORT or localhost:PORT)")
        if _header(request, b"origin"):
            return self._refuse(request, gateway, "requests from a web page (with an Origin header) "
                                                  "are refused")
        return self.api.handle(request)

    def _refuse(self, request: Request, gateway: bool, message: str) -> Response:
        if gateway:  # an MCP client reads a JSON-RPC error
            response = self.api.gateway.error(Forbidden(message), request)
            response.route = "tcp_refused"
            return response
        return error_to_response(Forbidden(message), "tcp_refused")

    def fast_get(self, url: bytes, started: float, peer_uid: int) -> bytes | None:
        return None  # every request is routed (and its Host checked)

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.api.observe(route, status, seconds)


class TcpConnection(HttpConnection):
    """A connection to the TCP listener: the peer's uid from the kernel's socket table, every
    request's headers kept (for the Host and Origin checks)."""

    def __init__(self, app: LoopbackApp, allow_uids: Callable[[], frozenset[int]], connections: Connections,
                 lookup: UidLookup = lookup_uid) -> None:
        super().__init__(app, allow_uids, connections)
        self.lookup = lookup

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        try:
            uid = self.lookup(tuple(peer), tuple(transport.get_extra_info("sockname")))
        except (OSError, TypeError, ValueError):
            uid = None
        self.peer_uid = -1 if uid is None else uid  # no pid in the socket table: peer_pid stays -1
        if uid is None or uid not in self.allow_uids():
            port = peer[1] if isinstance(peer, tuple) and len(peer) > 1 else None
            _log.warning("peer refused", extra={"uid": uid, "port": port, "listener": "tcp"})
            transport.abort()
            return
        self.connections.open.add(self)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self.collect = True


def _hosts(host: str, port: int) -> frozenset[bytes]:
    literal = f"[{host}]" if ":" in host else host
    names = {f"{literal}:{port}", f"localhost:{port}"}
    if port == 80:
        names |= {literal, "localhost"}
    return frozenset(name.encode() for name in names)


async def start_listener(listen: ListenConfig, api: Api, allow_uids: Callable[[], frozenset[int]],
                         connections: Connections, sock: socket.socket | None = None,
                         ) -> tuple[asyncio.Server, str]:
    """Bind and serve the listener (or serve `sock`, the one systemd bound: activation.py);
    returns the server and the address it is bound to (the port the kernel picked when `listen`
    asked for 0)."""
    assert listen.host is not None
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    try:
        sock = sock or socket.create_server((listen.host, listen.port), family=family, backlog=1024)
    except OSError as exc:
        raise ListenFailed(f"cannot listen on {listen.listen} (gateway.listen): "
                           f"{exc.strerror or type(exc).__name__}") from None
    sock.setblocking(False)
    port = sock.getsockname()[1]
    app = LoopbackApp(api, _hosts(listen.host, port))
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(lambda: TcpConnection(app, allow_uids, connections), sock=sock)
    except BaseException:
        sock.close()
        raise
    bound = f"[{listen.host}]:{port}" if family == socket.AF_INET6 else f"{listen.host}:{port}"
    return server, bound
