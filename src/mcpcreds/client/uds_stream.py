"""HTTP/1.1 on the sidecar's Unix socket for the stdio bridge: answers handed over as they arrive.

`uds_async.UdsHttp` reads an answer whole; the bridge relays SSE streams event by event, so here
the caller gives an `Exchange` whose `head` and `body` are called from the connection's
`data_received` (no task, queue or wake-up per chunk), and the request's coroutine waits for the
answer's end. What those callbacks raise fails the request and closes its connection.

Kept connections are reused, one request at a time each, at most MAX_CONNECTIONS at once (more
wait for one). A kept connection the sidecar closed, or that received bytes no request asked for,
is dropped before reuse; a request on a kept connection that ends before any answer byte is sent
again once on a new one (the sidecar closed it as it was taken). A cancelled request closes its
connection: over HTTP, that is how a stream is ended. Each new connection is checked before its
first byte (`socket_check`): the folder, then the listener's uid.
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol, cast

import httptools

from ..core.socket_check import check_folder, check_peer
from .uds import MAX_HEAD, MAX_INTERIM, Retryable

MAX_CONNECTIONS: Final = 100
CONNECT_TIMEOUT: Final = 30.0
_KEPT_HEADERS: Final = frozenset({b"content-type", b"mcp-session-id", b"content-length",
                                  b"transfer-encoding"})


class Unreachable(ConnectionError):
    """No sidecar answers on the socket (no folder, no socket, no listener, or no connection in time)."""


class InvalidHeader(ValueError):
    """A header value that would not be one header line: nothing is sent."""


class Exchange(Protocol):
    """What a request's answer is given, as it arrives (in the connection's callbacks)."""

    def head(self, status: int, headers: dict[str, str]) -> None: ...

    def body(self, chunk: bytes) -> None: ...


class _Connection(asyncio.Protocol):
    """One connection to the sidecar; at most one request in flight on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.parser = httptools.HttpResponseParser(self)  # reused: it resets after each answer
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.done: asyncio.Future[bool] | None = None  # the request in flight's: keep-alive at its end
        self.exchange: Exchange | None = None
        self.received = False  # a byte of the current answer came
        self.head = 0  # bytes of the current head so far, -1 once it is complete
        self.interim = 0
        self.headers: dict[str, str] = {}
        self.framed = False  # a Content-Length or chunked body: its end is in the bytes, not the close

    def send(self, request: bytes, exchange: Exchange) -> asyncio.Future[bool]:
        assert self.transport is not None
        self.done = done = self.loop.create_future()
        self.exchange = exchange
        self.received = False
        self.head = self.interim = 0
        self.headers = {}
        self.transport.write(request)
        return done

    def close(self) -> None:
        self.closed = True
        # a loop that has ended (asyncio.run) cannot close it: the socket closes with the transport
        if self.transport is None or self.transport.is_closing() or self.loop.is_closed():
            return
        self.transport.abort()  # a request in an unknown state: nothing more is sent or read

    def _finish(self, exc: BaseException | None, keep: bool = False) -> None:
        done, self.done, self.exchange = self.done, None, None
        if done is not None and not done.done():
            if exc is None:
                done.set_result(keep)
            else:
                done.set_exception(exc)
        if exc is not None:
            self.close()

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are no asyncio.Transport

    def data_received(self, data: bytes) -> None:
        if self.done is None or self.done.done():  # bytes no request asked for (or a cancelled one's)
            self._finish(ConnectionResetError("the sidecar sent bytes no request asked for"))
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # what an Exchange (or a bound) raised
            self._finish(exc.__context__ or exc)
            return
        except (ValueError, httptools.HttpParserError) as exc:  # not HTTP
            self._finish(exc)
            return
        if self.head >= 0 and self.done is not None:
            self.head += len(data)  # all of `data` is head: the head did not end in it
            if self.head > MAX_HEAD:
                self._finish(ValueError("sidecar answer head too large"))

    def eof_received(self) -> None:
        self.closed = True  # not taken for a request again; connection_lost tells the one in flight

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is None or self.done.done():
            return
        if self.head < 0 and not self.framed:  # a body that ends with the connection
            self._finish(None)
        elif self.received:
            self._finish(ConnectionResetError("the sidecar closed the connection mid-answer"))
        else:  # no answer byte yet: the sidecar went away (a kept connection closed as it was used)
            self._finish(Retryable(str(exc) if exc else "the sidecar closed the connection"))

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        if self.done is None:  # a second answer in the bytes of the first
            raise ValueError("the sidecar sent bytes no request asked for")
        self.head = 0
        self.headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _KEPT_HEADERS and name.decode() not in self.headers:
            self.headers[name.decode()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.head = -1
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            return  # an interim answer: the final one follows (a sidecar sends none)
        self.framed = "content-length" in self.headers or "transfer-encoding" in self.headers
        if self.exchange is not None:
            self.exchange.head(status, self.headers)

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:
            self.exchange.body(body)

    def on_message_complete(self) -> None:
        if 100 <= self.parser.get_status_code() < 200:
            self.interim += 1
            if self.interim > MAX_INTERIM:
                raise ValueError("too many interim answers")
            return
        self._finish(None, self.parser.should_keep_alive())


def _header_line(name: str, value: str) -> str:
    if not value.isascii() or not value.isprintable():  # CR, LF, NUL: another header, or a broken one
        raise InvalidHeader(f"the {name} header's value is not printable ASCII; nothing was sent")
    return f"{name}: {value}\r\n"


class StreamUdsHttp:
    """`await http.request("POST", {"Accept": ...}, body, exchange)`: to the one `path` it serves."""

    def __init__(self, socket_path: str, sidecar_uid: int, path: str, headers: dict[str, str]) -> None:
        self.socket_path = socket_path
        self.sidecar_uid = sidecar_uid
        self.path = path
        try:
            self._base = "".join(_header_line(k, v) for k, v in headers.items())
            self._refused: InvalidHeader | None = None
        except InvalidHeader as exc:  # every request fails with it, nothing sent
            self._base, self._refused = "", exc
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            check_folder(self.socket_path, self.sidecar_uid)
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, conn = await loop.create_unix_connection(lambda: _Connection(loop), self.socket_path)
        except OSError as exc:  # FileNotFoundError, ConnectionRefusedError, TimeoutError, ...
            raise Unreachable(f"{type(exc).__name__}") from None
        try:
            assert conn.transport is not None
            check_peer(conn.transport.get_extra_info("socket"), self.socket_path, self.sidecar_uid)
        except BaseException:
            conn.close()
            raise
        return conn

    def _encode(self, method: str, headers: dict[str, str], body: bytes | None) -> bytes:
        head = f"{method} {self.path} HTTP/1.1\r\nHost: mcpcreds\r\n{self._base}"
        head += "".join(_header_line(k, v) for k, v in headers.items())
        if body is None:
            return f"{head}\r\n".encode("latin-1")
        return f"{head}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body

    async def request(self, method: str, headers: dict[str, str], body: bytes | None,
                      exchange: Exchange) -> None:
        """Send, and return once the answer has ended (its head and body given to `exchange`)."""
        if self._refused is not None:
            raise self._refused
        request = self._encode(method, headers, body)
        async with self._slots:
            for attempt in (1, 2):
                conn = self._kept() if attempt == 1 else None  # the second on a new connection
                kept = conn is not None
                if conn is None:
                    conn = await self._open()
                try:
                    keep = await conn.send(request, exchange)
                except Retryable:
                    conn.close()
                    if kept:
                        continue  # closed by the sidecar as it was taken: once more, on a new one
                    raise
                except BaseException:  # failed or cancelled mid-request: its state is unknown
                    conn.close()
                    raise
                if keep and not conn.closed:
                    self._idle.append(conn)
                else:
                    conn.close()
                return

    def _kept(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
