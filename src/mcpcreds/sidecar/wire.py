"""HTTP/1.1 over a Unix socket: peer check, parsing with limits, keep-alive, cached replies.

This module knows bytes and connections, not routes: each parsed request is handed to an
`App`, which answers with a `Response` at once or with an awaitable of one (or of a
`StreamingResponse`, written with chunked transfer-encoding as its body yields, paused while the
client does not read).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol, cast

import httptools

from ..core.clock import SYSTEM_CLOCK, Clock
from ..core.http import (
    GATEWAY_PREFIX,
    MAX_GATEWAY_BODY_BYTES,
    Answer,
    Request,
    Response,
    ResponseBody,
    StreamingResponse,
    error_response,
)
from ..core.logs import get_logger
from ..core.tasks import spawn
from .peer_ns import in_own_namespaces

MAX_HEAD_BYTES: Final = 16 * 1024
MAX_BODY_BYTES: Final = 64 * 1024
MAX_PIPELINED: Final = 32
ACCEPT_RETRY_SECONDS: Final = 1.0  # after an accept that failed for want of file descriptors or memory
# Bytes handed to the parser at once while a head is awaited (or a chunked body, whose end is
# not known in advance). A head that begins inside one of these feeds, after a complete request,
# is counted from the next feed, so it may exceed MAX_HEAD_BYTES by at most this much before its
# 431. A Content-Length body is fed up to its end, so the next head is counted from its first byte.
HEAD_FEED_BYTES: Final = 1024
LISTEN_BACKLOG: Final = 1024  # each listener's, as bound and as served
_PEERCRED: Final = struct.Struct("3i")
_log = get_logger("wire")


class App(Protocol):
    def handle(self, request: Request) -> Answer | Awaitable[Answer]: ...

    def fast_get(self, url: bytes, started: float, peer_uid: int) -> bytes | None:
        """A complete keep-alive answer to a bodiless GET, if one is ready without work."""
        ...

    def observe(self, route: str, status: int, seconds: float) -> None: ...


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid, gid


class Connections:
    """Every open connection, swept regularly for idle and slow ones."""

    def __init__(self, request_timeout: float = 10.0, idle_timeout: float = 120.0,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.open: set[HttpConnection] = set()
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.clock = clock

    def sweep(self, now: float) -> None:
        for conn in list(self.open):
            conn.check_timeouts(now)

    def busy(self) -> int:
        """Connections with an answer under way (a listening stream that may never end aside)."""
        return sum(1 for c in self.open if c.in_flight is not None and not c.long_lived)


class HttpConnection(asyncio.Protocol):
    def __init__(self, app: App, allow_uids: Callable[[], frozenset[int]],
                 connections: Connections) -> None:
        self.app = app
        self.allow_uids = allow_uids
        self.connections = connections
        self.loop: asyncio.AbstractEventLoop  # set by connection_made: the loop it runs on
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.peer_uid = -1
        self.peer_pid = -1
        self.grant_only = False  # a peer in other namespaces than ours: within a grant only
        self.queue: deque[tuple[Request, bool, float]] = deque()
        self.in_flight: asyncio.Task[Any] | None = None
        self.long_lived = False  # in_flight is a listening stream
        self.write_paused = False  # the client's transport is full: a streaming body waits
        self._writable: asyncio.Future[None] | None = None
        self.closing = False
        self.rejected = False  # for good: a rejected request closes its connection
        self.last_active = connections.clock.monotonic()
        self.head_started: float | None = None  # when the pending head's first byte came
        self.head_pending = True  # no head is complete: what comes is (part of) one
        self.head_bytes = 0  # raw bytes fed while head_pending
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.body_parts: list[bytes] = []
        self.body_bytes = 0
        self.content_length: int | None = None
        self.authorization: bytes | None = None
        self.body_limit = MAX_BODY_BYTES
        self.collect = False  # a gateway request: its headers are kept
        self.head_only = False  # the answer being sent is to a HEAD request: head without content
        self.headers: list[tuple[bytes, bytes]] = []

    # -- connection events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = stream = cast(asyncio.Transport, transport)  # uvloop's are no asyncio.Transport
        self.loop = asyncio.get_running_loop()  # kept: on Python 3.11 each lookup is a getpid() call
        sock = stream.get_extra_info("socket")
        try:
            self.peer_pid, self.peer_uid, _ = peer_credentials(sock)
        except OSError:
            self.peer_uid = -1
        if self.peer_uid not in self.allow_uids():
            _log.warning("peer refused", extra={"uid": self.peer_uid, "pid": self.peer_pid})
            stream.abort()
            return
        self.grant_only = not in_own_namespaces(self.peer_pid)
        self.connections.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.open.discard(self)
        self.closing = True
        if self.in_flight is not None:
            self.in_flight.cancel()  # a client gone while waiting gives its place up
        self.queue.clear()
        self._wake_writer()

    def pause_writing(self) -> None:
        """The client does not read its answers: stop reading its requests until it does (and
        stop producing a streaming body)."""
        self.write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()
        if self.transport is not None and not self.closing:
            self.transport.resume_reading()

    def _wake_writer(self) -> None:
        waiter, self._writable = self._writable, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def eof_received(self) -> bool | None:
        """EOF means the client is gone (HTTP clients do not half-close): whatever it waits for
        is cancelled by connection_lost, so a waiter gives up its place in a bucket queue."""
        return None

    def data_received(self, data: bytes) -> None:
        """Feed the parser, counting the raw bytes of a pending head: httptools buffers a partial
        header line itself, so its callbacks come too late to bound a head that never ends."""
        self.last_active = self.connections.clock.monotonic()
        view = memoryview(data)
        while view and not self.rejected:
            if self.head_pending:
                if self.head_bytes >= MAX_HEAD_BYTES:
                    self._reject(431, "headers_too_large",
                                 f"request line and headers exceed {MAX_HEAD_BYTES} bytes")
                    return
                size = min(HEAD_FEED_BYTES, MAX_HEAD_BYTES - self.head_bytes, len(view))
                self.head_bytes += size
            elif self.content_length is not None:  # up to the end of this body, not into the next head
                size = max(1, min(self.content_length, self.body_limit) - self.body_bytes)
            else:
                size = HEAD_FEED_BYTES  # a chunked body
            chunk, view = view[:size], view[size:]
            try:
                self.parser.feed_data(chunk)
            except httptools.HttpParserUpgrade:
                self._reject(400, "invalid_request", "protocol upgrades are not supported")
            except httptools.HttpParserError:
                self._reject(400, "invalid_request", "malformed HTTP request")

    def check_timeouts(self, now: float) -> None:
        if self.transport is None or self.in_flight is not None or self.queue:
            return
        if self.head_started is not None and now - self.head_started > self.connections.request_timeout:
            self._fail(408, "request_timeout", "request not received in time")
        elif now - self.last_active > self.connections.idle_timeout:
            self.transport.close()

    # -- parser callbacks

    def on_message_begin(self) -> None:
        self._reset()
        self.head_started = self.last_active  # request_timeout runs from the head's first byte

    def on_url(self, url: bytes) -> None:
        self.url += url  # the whole target comes before the first header
        if self.url.startswith(GATEWAY_PREFIX):
            self.collect = True
            self.body_limit = MAX_GATEWAY_BODY_BYTES

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.collect:
            self.headers.append((name, value))
        if len(name) == 13 and name.lower() == b"authorization":
            self.authorization = value
        elif len(name) == 14 and name.lower() == b"content-length":
            try:
                self.content_length = int(value)
            except ValueError:
                self.content_length = None  # the parser refuses it
            if self.content_length is not None and self.content_length > self.body_limit:
                self._reject(413, "payload_too_large", f"request body exceeds {self.body_limit} bytes")

    def on_headers_complete(self) -> None:
        self.head_pending = False
        self.head_bytes = 0
        if self.parser.should_upgrade():  # answered here, before on_message_complete dispatches it
            self._reject(400, "invalid_request", "protocol upgrades are not supported")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.body_limit:
            self._reject(413, "payload_too_large", f"request body exceeds {self.body_limit} bytes")
        else:
            self.body_parts.append(body)

    def on_message_complete(self) -> None:
        self.head_started = None
        self.head_pending = True
        if self.rejected or self.closing:  # after a close nothing more is answered: nor run
            return
        if (self.in_flight is None and not self.queue and not self.body_parts
                and self.authorization is None and self.transport is not None and not self.grant_only
                and self.parser.should_keep_alive() and self.parser.get_method() == b"GET"):
            answer = self.app.fast_get(self.url, time.perf_counter(), self.peer_uid)
            if answer is not None:
                self.transport.write(answer)
                return
        parsed = httptools.parse_url(self.url)
        try:
            path = parsed.path.decode("utf-8")
            query = parsed.query.decode("utf-8") if parsed.query else ""
            auth = self.authorization.decode("latin-1") if self.authorization else None
        except UnicodeDecodeError:
            self._fail(400, "invalid_request", "request target is not UTF-8")
            return
        request = Request(
            method=self.parser.get_method().decode("ascii", "replace"),
            path=path,
            query=query,
            body=b"".join(self.body_parts),
            authorization=auth,
            peer_uid=self.peer_uid,
            peer_pid=self.peer_pid,
            grant_only=self.grant_only,
        )
        if self.collect:
            request.headers = tuple(self.headers)
        keep_alive = self.parser.should_keep_alive()
        if self.in_flight is not None or self.queue:
            self.queue.append((request, keep_alive, time.perf_counter()))
            if len(self.queue) >= MAX_PIPELINED and self.transport is not None:
                self.transport.pause_reading()  # back-pressure on a client that floods us
            return
        self._dispatch(request, keep_alive, time.perf_counter())

    # -- answering

    def _dispatch(self, request: Request, keep_alive: bool, started: float) -> None:
        self.head_only = request.method == "HEAD"
        try:
            result = self.app.handle(request)
        except Exception:
            _log.exception("unhandled error in handler")
            result = error_response(500, "internal_error", "internal error")
        if isinstance(result, Response):
            self._send(result, keep_alive, started)
            return
        if isinstance(result, StreamingResponse):
            keep = self._stream_head(result, keep_alive, started)
            if keep is not None:
                self._run(self._stream(result.body, keep, result.ended))
            return
        # reading goes on while the answer is pending, so a disconnect is seen (and cancels it)
        self._run(self._answer_later(result, keep_alive, started))

    def _run(self, work: Coroutine[Any, Any, None]) -> None:
        """The answer's work in one task (its wait, then its stream: no task more per call)."""
        task = self.loop.create_task(work)
        self.in_flight = task
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[None]) -> None:
        if self.in_flight is task:  # cancelled (the client gone), or failed past its own handling
            self.in_flight = None
            self.long_lived = False
        if not task.cancelled() and (exc := task.exception()) is not None:
            _log.error("unhandled error in connection", exc_info=exc)

    async def _answer_later(self, pending: Awaitable[Answer], keep_alive: bool, started: float) -> None:
        try:
            response = await pending
        except Exception:
            _log.exception("unhandled error in handler")
            response = error_response(500, "internal_error", "internal error")
        if isinstance(response, StreamingResponse):
            if self.closing:  # nobody to stream to: release what feeds the body
                _release(response.body)
                return
            keep = self._stream_head(response, keep_alive, started)
            if keep is not None:
                await self._stream(response.body, keep, response.ended)
            return
        self.in_flight = None
        if self.closing:
            return
        self._send(response, keep_alive, started)
        self._next()

    def _next(self) -> None:
        """The answer is out: serve what was pipelined behind it, then read again."""
        while self.queue and self.in_flight is None and not self.closing:
            self._dispatch(*self.queue.popleft())
        if self.in_flight is None and self.transport is not None and not self.closing:
            self.transport.resume_reading()

    # -- streaming

    def _stream_head(self, response: StreamingResponse, keep_alive: bool, started: float) -> bool | None:
        """The head out (with the first chunk, and the end if the body is all there: in one write);
        whether the connection is kept after the body, None if there is no one to stream to (the
        body released)."""
        transport = self.transport
        if transport is None or self.closing:
            _release(response.body)
            return None
        keep = keep_alive and not response.close
        head = response.head(keep)
        if response.first:
            head += b"%x\r\n%b\r\n" % (len(response.first), response.first)
        if response.ended:
            head += b"0\r\n\r\n"
        transport.write(head)
        self.app.observe(response.route, response.status, time.perf_counter() - started)
        self.long_lived = response.long_lived
        return keep

    async def _stream(self, body: ResponseBody, keep: bool, ended: bool = False) -> None:
        try:
            if ended:  # all of it went out with the head
                await body.aclose()
            else:
                await self._pump(body)
        except Exception as exc:
            failed: Exception | None = exc
        else:
            failed = None
        self.in_flight = None
        self.long_lived = False
        if self.transport is None or self.closing:
            return
        if failed is not None:  # the head is out: the only honest end is a cut connection
            _log.warning("streaming answer failed; connection aborted",
                         extra={"error": type(failed).__name__})
            self.closing = True
            self.transport.abort()
            return
        if not keep:
            self.closing = True
            self.transport.close()
            return
        self._next()

    async def _pump(self, body: ResponseBody) -> None:
        """Each chunk out as it comes; while the client's transport is full, the body is not
        read (so neither is whatever feeds it)."""
        try:
            async for chunk in body:
                transport = self.transport
                if transport is None or self.closing:
                    return
                if chunk:
                    transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                    if self.write_paused:
                        self._writable = self._writable or self.loop.create_future()
                        await self._writable
            if self.transport is not None and not self.closing:
                self.transport.write(b"0\r\n\r\n")
        finally:
            await body.aclose()

    def _send(self, response: Response, keep_alive: bool, started: float) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        keep = keep_alive and not response.close
        transport.write(response.encode(keep, self.head_only))
        self.app.observe(response.route, response.status, time.perf_counter() - started)
        if not keep:
            self.closing = True
            transport.close()

    def _reject(self, status: int, code: str, message: str) -> None:
        if not self.rejected:
            self._fail(status, code, message)

    def _fail(self, status: int, code: str, message: str) -> None:
        """Answer an unusable request and close: the stream can no longer be trusted."""
        self.rejected = True
        response = error_response(status, code, message, close=True)
        response.route = "invalid"
        self.queue.clear()
        if self.in_flight is None:
            self._send(response, False, time.perf_counter())
        elif self.transport is not None:
            self.closing = True
            self.transport.close()


_releasing: set[asyncio.Task[None]] = set()


def _release(body: ResponseBody) -> None:
    """Close a body that will never be streamed, in a task kept until it is done."""
    spawn(_releasing, body.aclose())


class Acceptor:
    """A listening socket (the Unix socket, the loopback listener) served without the task per
    connection of `loop.create_unix_server` and `create_server`: each connection is accepted in
    the loop's reader callback, one per wake-up (the selector reports the socket again while more
    wait: no failing accept after each), and given its transport at once. MCP clients open about
    one connection per call, so this is a per-call cost."""

    def __init__(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        self.loop = asyncio.get_running_loop()
        self.sock = sock
        self.factory = factory
        self.closed = False
        sock.setblocking(False)  # (a socket systemd passed may come blocking)
        self.loop.add_reader(sock.fileno(), self._accept)

    @staticmethod
    def usable(loop: asyncio.AbstractEventLoop) -> bool:
        """Whether `loop` is asyncio's selector loop, whose transports this makes."""
        return hasattr(loop, "_make_socket_transport") and hasattr(loop, "add_reader")

    def _accept(self) -> None:
        try:
            conn, address = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                raise  # the loop logs it
            # the selector would report the socket again at once: pause, as asyncio's server does
            _log.warning("accept failed: out of resources", extra={"error": errno.errorcode.get(exc.errno)})
            self.loop.remove_reader(self.sock.fileno())
            self.loop.call_later(ACCEPT_RETRY_SECONDS, self._resume)
            return
        conn.setblocking(False)
        make: Any = self.loop._make_socket_transport  # type: ignore[attr-defined]
        make(conn, self.factory(), extra={"peername": address})  # known: not asked of the kernel again

    def _resume(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


async def serve_socket(sock: socket.socket,
                       factory: Callable[[], asyncio.Protocol]) -> asyncio.Server | Acceptor:
    """A listening socket served: by the `Acceptor` on asyncio's loop, else by the loop's own
    server (uvloop's), which listens again with `LISTEN_BACKLOG` (its default is 100) and never
    unlinks a Unix socket's path when it closes (uvloop's would on Python 3.13 and later, as
    asyncio's would there): systemd's socket outlives the sidecar, and ours is unlinked at stop
    only while it is still ours."""
    loop = asyncio.get_running_loop()
    if Acceptor.usable(loop):
        return Acceptor(sock, factory)
    if sock.family != socket.AF_UNIX:
        return await loop.create_server(factory, sock=sock, backlog=LISTEN_BACKLOG)
    unlinks = loop_kind(loop) == "uvloop" or sys.version_info >= (3, 13)
    keep: dict[str, Any] = {"cleanup_socket": False} if unlinks else {}
    return await loop.create_unix_server(factory, sock=sock, backlog=LISTEN_BACKLOG, **keep)


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if any(c.__module__.startswith("uvloop") for c in type(loop).__mro__) else "asyncio"


def bind_unix_socket(path: str) -> socket.socket:
    """Bind `path` with mode 0600 (made so by the umask, never chmod'ed after)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


