"""The gateway's loopback TCP listener (`[gateway] listen`), for MCP clients that cannot speak to a
Unix socket: `http://127.0.0.1:PORT/mcp/{server}`, and nothing else of the API.

- The caller's uid comes from the kernel (`tcp_peer`) when the connection is accepted, and is
  checked against `allow_uids` before a byte is read; a uid that cannot be found is refused. The
  kernel answers the one socket's lookup within the request, so it is asked on the event loop,
  as the Unix socket asks for SO_PEERCRED. Only where it does not answer at once (or has no
  sock_diag: the whole-table fallback) does the lookup go to a worker thread, at most
  `MAX_PENDING_LOOKUPS` at once: a connection accepted past that is refused at once (a local
  user's connect flood costs only TCP connections, not the Unix socket's service). From there on
  the connection is the Unix socket's (`wire.HttpConnection`): the same limits,
  `grant_only_uids`, grants as `Authorization: Bearer <grant>` (never forwarded).
- Every accepted socket has TCP_NODELAY: without it an answer's last small write waits for the
  client's delayed ACK (40 ms) whenever the one before it is not acknowledged yet.
- Only `/mcp/{server}` (and `GET /v1/health`) are routed; every other path is a 404.
- A request must name this listener in its `Host` and carry no `Origin`: a web page in the
  user's browser (an allowed uid) cannot reach the gateway through DNS rebinding or a cross-site
  request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Final, cast

from ..config.model import ListenConfig
from ..core.http import Answer, Request, Response
from ..core.logs import get_logger
from ..core.tasks import spawn
from ..errors import Forbidden, McpcredsError, NotFound
from .api import Api, error_to_response
from .tcp_peer import UidLookup, choose_lookup, lookup_uid, proc_lookup_uid
from .wire import LISTEN_BACKLOG, Acceptor, Connections, HttpConnection, serve_socket

_log = get_logger("gateway.tcp")
# read from a peer before its uid is known: uvloop reads up to 256 KiB at once, then reading pauses
EARLY_BYTES: Final = 512 * 1024

HEALTH: Final = "/v1/health"
LOOKUP_THREADS: Final = 2
MAX_PENDING_LOOKUPS: Final = 32


class ListenFailed(McpcredsError):
    code = "listen_failed"


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
        sent = request.header_table()
        host = sent.get(b"host")  # b"\0" when sent twice: no host of ours
        if host is None or host.lower() not in self.hosts:
            return self._refuse(request, gateway, "the Host header must name this listener "
                                                  "(127.0.0.1:PORT, [::1]:PORT or localhost:PORT)")
        if b"origin" in sent:
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


class PeerLookups:
    """The uid lookups of the listener's new connections: `at_once` on the event loop where it
    answers without waiting (it raises BlockingIOError where it cannot), else `lookup` in
    `threads` worker threads, at most `limit` admitted and not finished."""

    def __init__(self, lookup: UidLookup, limit: int = MAX_PENDING_LOOKUPS,
                 threads: int = LOOKUP_THREADS, at_once: UidLookup | None = None) -> None:
        self.lookup = lookup
        self.at_once = at_once
        self.limit = limit
        self.pending = 0
        self.busy = False  # refusing since the last admitted lookup: logged once per streak
        self.tasks: set[asyncio.Task[None]] = set()
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tcp-peer")

    def admit(self) -> bool:
        if self.pending >= self.limit:
            if not self.busy:
                _log.warning("peer refused: too many connections awaiting their uid lookup",
                             extra={"pending": self.pending, "listener": "tcp"})
            self.busy = True
            return False
        self.pending += 1
        self.busy = False
        return True

    def now(self, peer: Any, ours: Any) -> int | None:
        """The uid without waiting; BlockingIOError when it must be asked off the loop (`run`)."""
        if self.at_once is None:
            raise BlockingIOError
        try:
            return self.at_once(tuple(peer), tuple(ours))
        except BlockingIOError:
            raise
        except Exception:  # as in `run`: unknown, refused
            return None

    async def run(self, peer: Any, ours: Any) -> int | None:
        """An admitted lookup."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self.executor, self.lookup, tuple(peer), tuple(ours))
        except Exception:  # whatever went wrong, the uid is unknown: the connection is refused
            return None
        finally:
            self.pending -= 1


class TcpConnection(HttpConnection):
    """A connection to the TCP listener: the peer's uid from the kernel, every request's headers
    kept (for the Host and Origin checks)."""

    def __init__(self, app: LoopbackApp, allow_uids: Callable[[], frozenset[int]], connections: Connections,
                 lookups: PeerLookups) -> None:
        super().__init__(app, allow_uids, connections)
        self.lookups = lookups
        self.admitted = False
        self.early = bytearray()  # what came before the uid was known: read, never parsed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = stream = cast(asyncio.Transport, transport)  # uvloop's are no asyncio.Transport
        self.loop = asyncio.get_running_loop()
        set_nodelay(stream)
        peer, ours = stream.get_extra_info("peername"), stream.get_extra_info("sockname")
        try:
            uid = self.lookups.now(peer, ours)
        except BlockingIOError:
            if not self.lookups.admit():
                stream.abort()
                return
            stream.pause_reading()  # asyncio's loop reads nothing then; uvloop's does: see data_received
            spawn(self.lookups.tasks, self._identify(peer, ours))
            return
        self._admit(uid, peer)

    def data_received(self, data: bytes) -> None:
        """Nothing is parsed, let alone answered, before the peer's uid is known and allowed.
        uvloop starts reading once `connection_made` returns, whatever it asked: what comes
        meanwhile is kept with reading paused (one read's worth: past `EARLY_BYTES` the connection
        is cut), and parsed on admission."""
        if self.admitted:
            super().data_received(data)
            return
        self.early += data
        if self.transport is not None:
            if len(self.early) > EARLY_BYTES:
                self.closing = True  # a lookup that ends before the abort is seen admits nothing
                self.transport.abort()
            else:
                self.transport.pause_reading()

    async def _identify(self, peer: Any, ours: Any) -> None:
        uid = await self.lookups.run(peer, ours)
        if self.closing or self.transport is None:  # the client left while it was looked up
            return
        if self._admit(uid, peer):
            early, self.early = bytes(self.early), bytearray()
            # first: a pause that answering `early` asks for (a full write buffer, a deep pipeline)
            # must hold; no read comes between the two calls, so the bytes stay in order
            self.transport.resume_reading()
            if early:
                super().data_received(early)

    def _admit(self, uid: int | None, peer: Any) -> bool:
        assert self.transport is not None
        self.peer_uid = -1 if uid is None else uid  # the kernel gives no pid here: peer_pid stays -1
        if uid is None or uid not in self.allow_uids():
            port = peer[1] if isinstance(peer, tuple) and len(peer) > 1 else None
            _log.warning("peer refused", extra={"uid": uid, "port": port, "listener": "tcp"})
            self.transport.abort()
            return False
        self.admitted = True
        self.connections.open.add(self)
        self.last_active = self.connections.clock.monotonic()
        return True

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self.collect = True


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on a transport's socket. asyncio sets it only on a socket whose protocol reads
    IPPROTO_TCP, and `socket.create_server` makes the listener with protocol 0."""
    sock = transport.get_extra_info("socket")
    with contextlib.suppress(OSError):  # already reset by the client: nothing will be written
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _hosts(host: str, port: int) -> frozenset[bytes]:
    literal = f"[{host}]" if ":" in host else host
    names = {f"{literal}:{port}", f"localhost:{port}"}
    if port == 80:
        names |= {literal, "localhost"}
    return frozenset(name.encode() for name in names)


async def start_listener(listen: ListenConfig, api: Api, allow_uids: Callable[[], frozenset[int]],
                         connections: Connections, sock: socket.socket | None = None,
                         ) -> tuple[asyncio.Server | Acceptor, str]:
    """Bind and serve the listener (or serve `sock`, the one systemd bound: activation.py);
    returns the server and the address it is bound to (the port the kernel picked when `listen`
    asked for 0)."""
    assert listen.host is not None
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    try:
        sock = sock or socket.create_server((listen.host, listen.port), family=family, backlog=LISTEN_BACKLOG)
    except OSError as exc:
        raise ListenFailed(f"cannot listen on {listen.listen} (gateway.listen): "
                           f"{exc.strerror or type(exc).__name__}") from None
    sock.setblocking(False)
    port = sock.getsockname()[1]
    app = LoopbackApp(api, _hosts(listen.host, port))
    lookup = choose_lookup(sock.getsockname())
    if lookup is None:
        _log.warning("the kernel answers no socket diagnostics (NETLINK_SOCK_DIAG): the uid of each TCP "
                     "peer is read from /proc/net/tcp, in time linear in the host's sockets")
    lookups = PeerLookups(lookup or proc_lookup_uid,
                          at_once=None if lookup is None else partial(lookup_uid, wait=False))
    def factory() -> TcpConnection:
        return TcpConnection(app, allow_uids, connections, lookups)

    try:
        server = await serve_socket(sock, factory)
    except BaseException:
        sock.close()
        raise
    bound = f"[{listen.host}]:{port}" if family == socket.AF_INET6 else f"{listen.host}:{port}"
    return server, bound
