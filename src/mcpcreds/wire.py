"""HTTP/1.1 over a Unix socket: peer check, parsing with limits, keep-alive, cached replies.

This module knows bytes and connections, not routes: each parsed request is handed to an
`App`, which answers with a `Response` at once or with an awaitable of one.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final, Protocol

import httptools

from .clock import SYSTEM_CLOCK, Clock
from .logs import get_logger

MAX_HEAD_BYTES: Final = 16 * 1024
MAX_BODY_BYTES: Final = 64 * 1024
MAX_PIPELINED: Final = 32
# Bytes handed to the parser at once while a head is awaited (or a chunked body, whose end is
# not known in advance). A head that begins inside one of these feeds, after a complete request,
# is counted from the next feed, so it may exceed MAX_HEAD_BYTES by at most this much before its
# 431. A Content-Length body is fed up to its end, so the next head is counted from its first byte.
HEAD_FEED_BYTES: Final = 1024
_PEERCRED: Final = struct.Struct("3i")
_log = get_logger("wire")


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    body: bytes
    authorization: str | None
    peer_uid: int
    peer_pid: int
    name: str = ""  # the {name} of the path, set by the router
    grant: Any = None  # the grants.Grant the caller presented, if any


@dataclass(slots=True)
class Response:
    status: int
    body: bytes
    content_type: bytes = b"application/json"
    extra_headers: tuple[tuple[bytes, bytes], ...] = ()
    close: bool = False
    route: str = field(default="")

    def encode(self, keep_alive: bool) -> bytes:
        head = _STATUS_LINES.get(self.status) or _status_line(self.status)
        parts = [head, b"Content-Type: ", self.content_type, b"\r\nContent-Length: ",
                 str(len(self.body)).encode()]
        for name, value in self.extra_headers:
            parts += [b"\r\n", name, b": ", value]
        parts.append(b"\r\n\r\n" if keep_alive else b"\r\nConnection: close\r\n\r\n")
        parts.append(self.body)
        return b"".join(parts)


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_STATUS_LINES: Final = {s: _status_line(s) for s in (200, 400, 403, 404, 405, 408, 413, 429, 431,
                                                       500, 502, 503, 504)}


def error_response(status: int, code: str, message: str, close: bool = False) -> Response:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return Response(status, body, close=close)


class App(Protocol):
    def handle(self, request: Request) -> Response | Awaitable[Response]: ...

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
        return sum(1 for c in self.open if c.in_flight is not None)


class HttpConnection(asyncio.Protocol):
    def __init__(self, app: App, allow_uids: Callable[[], frozenset[int]],
                 connections: Connections) -> None:
        self.app = app
        self.allow_uids = allow_uids
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.peer_uid = -1
        self.peer_pid = -1
        self.queue: deque[tuple[Request, bool, float]] = deque()
        self.in_flight: asyncio.Task[Response] | None = None
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

    # -- connection events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        try:
            self.peer_pid, self.peer_uid, _ = peer_credentials(sock)
        except OSError:
            self.peer_uid = -1
        if self.peer_uid not in self.allow_uids():
            _log.warning("peer refused", extra={"uid": self.peer_uid, "pid": self.peer_pid})
            transport.abort()
            return
        self.connections.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.open.discard(self)
        self.closing = True
        if self.in_flight is not None:
            self.in_flight.cancel()  # a client gone while waiting gives its place up
        self.queue.clear()

    def pause_writing(self) -> None:
        """The client does not read its answers: stop reading its requests until it does."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closing:
            self.transport.resume_reading()

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
                size = max(1, min(self.content_length, MAX_BODY_BYTES) - self.body_bytes)
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
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 13 and name.lower() == b"authorization":
            self.authorization = value
        elif len(name) == 14 and name.lower() == b"content-length":
            try:
                self.content_length = int(value)
            except ValueError:
                self.content_length = None  # the parser refuses it
            if self.content_length is not None and self.content_length > MAX_BODY_BYTES:
                self._reject(413, "payload_too_large", f"request body exceeds {MAX_BODY_BYTES} bytes")

    def on_headers_complete(self) -> None:
        self.head_pending = False
        self.head_bytes = 0
        if self.parser.should_upgrade():  # answered here, before on_message_complete dispatches it
            self._reject(400, "invalid_request", "protocol upgrades are not supported")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > MAX_BODY_BYTES:
            self._reject(413, "payload_too_large", f"request body exceeds {MAX_BODY_BYTES} bytes")
        else:
            self.body_parts.append(body)

    def on_message_complete(self) -> None:
        self.head_started = None
        self.head_pending = True
        if self.rejected or self.closing:  # after a close nothing more is answered: nor run
            return
        if (self.in_flight is None and not self.queue and not self.body_parts
                and self.authorization is None and self.transport is not None
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
        )
        keep_alive = self.parser.should_keep_alive()
        if self.in_flight is not None or self.queue:
            self.queue.append((request, keep_alive, time.perf_counter()))
            if len(self.queue) >= MAX_PIPELINED and self.transport is not None:
                self.transport.pause_reading()  # back-pressure on a client that floods us
            return
        self._dispatch(request, keep_alive, time.perf_counter())

    # -- answering

    def _dispatch(self, request: Request, keep_alive: bool, started: float) -> None:
        try:
            result = self.app.handle(request)
        except Exception:
            _log.exception("unhandled error in handler")
            result = error_response(500, "internal_error", "internal error")
        if isinstance(result, Response):
            self._send(result, keep_alive, started)
            return
        # reading goes on while the answer is pending, so a disconnect is seen (and cancels it)
        task = asyncio.ensure_future(result)
        self.in_flight = task
        task.add_done_callback(lambda t: self._finished(t, keep_alive, started))

    def _finished(self, task: asyncio.Task[Response], keep_alive: bool, started: float) -> None:
        self.in_flight = None
        if task.cancelled() or self.closing:
            return
        exc = task.exception()
        if exc is not None:
            _log.error("unhandled error in handler", exc_info=exc)
            response = error_response(500, "internal_error", "internal error")
        else:
            response = task.result()
        self._send(response, keep_alive, started)
        while self.queue and self.in_flight is None and not self.closing:
            self._dispatch(*self.queue.popleft())
        if self.in_flight is None and self.transport is not None and not self.closing:
            self.transport.resume_reading()

    def _send(self, response: Response, keep_alive: bool, started: float) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        keep = keep_alive and not response.close
        transport.write(response.encode(keep))
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
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def json_response(data: Any, status: int = 200, route: str = "") -> Response:
    return Response(status, json.dumps(data, separators=(",", ":")).encode(), route=route)
