"""The gateway's upstream connections: a lean HTTP/1.1 client transport (asyncio and httptools).

The gateway relays every MCP request to its server; with httpx's default stack (httpcore, h11,
anyio) that hop cost about 2 ms of CPU per request, two thirds of the sidecar's. This transport
does the same work with one protocol object per connection:

- It sits under `egress_http.EgressTransport`, which checks the policy, resolves and pins the address
  and audits: a request reaches it with the address in its URL and the name to verify the TLS
  certificate against in `extensions["sni_hostname"]`.
- The request goes out in one write (head and body together); the answer's head is parsed by
  httptools; its body is streamed chunk by chunk, reading paused while more than `HIGH_WATER`
  bytes wait for the consumer (so a 10 MB stream holds a bounded amount); a head over
  `MAX_HEAD_BYTES` is refused.
- Connections are kept alive and reused per (scheme, address, port, server name) — one that
  receives bytes while no request is out is closed, so they never reach the next request; the
  rest of an answer its reader left before its end (not a GET's) is read and dropped first
  (bounded) — at most
  `limits.max_connections` open (a request waits up to the pool timeout for a free one) and
  `limits.max_keepalive_connections` idle.
- An answer that arrives in pieces on a TCP connection has its first piece acknowledged at once
  (`quick_ack.py`): a server that holds an answer's body until its head is acknowledged (uvicorn
  on asyncio's loop) would otherwise wait for Linux's delayed ACK, 40 ms, on every kept
  connection. An answer that arrives whole costs nothing more.
- Timeouts as httpx reads them (`extensions["timeout"]`): connect, write (the body stuck in the
  send buffer), read (each wait for bytes; None waits as long as the caller does), pool.
- Errors are httpx's (`ConnectError`, `ReadError`, `RemoteProtocolError`, timeouts), so callers
  handle them as they would httpx's own; a connect error is `egress_http.ConnectError`, which says why
  in words that quote no address (`reason`, `tls`). Header names and values are checked (no CR, LF or NUL:
  nothing can be smuggled into the head).
- `tls`, when given, is asked for the TLS context at each https request (a client certificate
  that changes: a SPIFFE X.509-SVID, `spiffe.X509Source`); when it hands out a new one, the idle
  connections made with the old one are closed and busy ones are not reused, so every new request
  goes out on a connection that presented the current certificate.
- Not supported (the gateway sends none of them): HEAD, `Expect: 100-continue`, upgrades, HTTP/2,
  proxies.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, cast

import httptools
import httpx

from .deadlines import Deadlines
from .egress_http import ConnectError, Header, RawAnswer
from .quick_ack import ack_at_once, tcp_socket

HIGH_WATER: Final = 256 * 1024  # body bytes buffered before reading from the server pauses
MAX_HEAD_BYTES: Final = 64 * 1024  # the status line and headers of an answer
# the rest of an answer its reader left (an MCP client closes an SSE answer before its end): read
# and dropped, up to this much for this long, so that its connection serves the next request. Never
# a GET's: an MCP server takes one listening stream per session, and the next must find it closed
DRAIN_BYTES: Final = 64 * 1024
DRAIN_SECONDS: Final = 0.5
DEFAULT_LIMITS: Final = httpx.Limits(max_connections=100, max_keepalive_connections=20)
# a header name's characters (RFC 9110 tchar): what is left after deleting them is not a token
_TCHARS: Final = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# bytes a header value may not hold, as the integers `in` finds at once in bytes (a one-byte bytes
# needle is first tried as an integer, at the cost of an exception made and dropped)
_CR, _LF, _NUL = 13, 10, 0
Key = tuple[str, str, int, str]  # scheme, address, port, server name
Asker = httpx.Request | None  # the request errors name (None on the gateway's raw way)


def request_head(method: bytes, target: bytes, headers: list[Header],
                 request: httpx.Request | None = None) -> bytes:
    """The request line and headers, checked: LocalProtocolError for a name that is not a token
    or a value with CR, LF or NUL."""
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    # checked all at once (one translate, one search a byte): a name is a token, none is empty
    names = [name for name, _ in headers]
    values = b"".join([value for _, value in headers])
    if b"" in names or b"".join(names).translate(None, _TCHARS) or _CR in values or _LF in values \
            or _NUL in values:
        raise httpx.LocalProtocolError("an invalid header name or value: not sent", request=request)
    return b"".join(parts)


class _Connection(asyncio.Protocol):
    """One upstream connection, one exchange at a time."""

    def __init__(self, key: Key, loop: asyncio.AbstractEventLoop, deadlines: Deadlines) -> None:
        self.key = key
        # the loop it runs on, kept: on Python 3.11 each get_running_loop() is a getpid() system call
        self.loop = loop
        self.deadlines = deadlines  # the waits' deadlines, on one timer of the loop's
        self.generation = 0  # the transport's TLS context it was made with (see H1Transport.tls)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False  # the connection is closed (by either side)
        self.busy = False  # a request was sent and its answer is not done with
        self.write_paused = False
        self._wake: asyncio.Future[None] | None = None
        self._drained: Callable[[], None] | None = None  # while the rest of an answer is dropped
        self._drain_timer: asyncio.TimerHandle | None = None
        self.dropped = 0  # bytes of the answer's rest dropped so far
        self.drainable = False  # the request sent was no GET (see DRAIN_BYTES)
        self.quick_ack: Any = None  # the TCP socket, on Linux (see net/quick_ack.py)
        self.quick_pending = False  # a request went out: its answer's first piece is acknowledged at once
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.head_bytes = 0  # bytes received while the head is incomplete (a body part included)
        self.header_bytes = 0  # the headers' own size (interim answers' included)
        self.keep_alive = False
        self.framed = False  # Content-Length or chunked: the body does not end at EOF
        self.complete = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.error: Exception | None = None

    # -- protocol events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are no asyncio.Transport
        self.quick_ack = tcp_socket(transport)

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes no request asked for: never handed to the next request
            self.close()
            return
        if not self.head_done:  # httptools holds a partial header itself: bound what it is fed
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES + HIGH_WATER:
                self._fail(f"the head of the server's answer exceeds {MAX_HEAD_BYTES} bytes")
                return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._fail("the server's answer is not valid HTTP/1.1")
            return
        if self.header_bytes > MAX_HEAD_BYTES or (not self.head_done and self.head_bytes > MAX_HEAD_BYTES):
            self._fail(f"the head of the server's answer exceeds {MAX_HEAD_BYTES} bytes")
            return
        if self._drained is not None:
            self.dropped += len(data)
            self.chunks.clear()
            self.buffered = 0
            if not self.complete and self.dropped > DRAIN_BYTES:
                self.close()
            if self.complete or self.lost:
                self._drain_end()
            return
        if self.quick_pending and not self.complete:  # more of the answer to come: see quick_ack.py
            self.quick_pending = False
            if not ack_at_once(self.quick_ack):
                self.quick_ack = None
        self._notify()

    def _fail(self, message: str) -> None:
        self.error = httpx.RemoteProtocolError(message)
        self.close()
        self._notify()
        self._drain_end()

    def eof_received(self) -> bool | None:
        if self.head_done and not self.complete and not self.framed:
            self.complete = True  # a body delimited by the end of the connection
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.complete and self.error is None:
            self.error = httpx.RemoteProtocolError("the server closed the connection before its answer was "
                                                   "complete" if self.head_done else
                                                   "the server closed the connection without an answer")
        self.write_paused = False
        self._notify()
        self._drain_end()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._notify()

    # -- parser callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        self.headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (103 Early Hints): the real one follows
            self.headers = []
            self.framed = False
            return
        self.status = status
        self.head_done = self.header_bytes <= MAX_HEAD_BYTES

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()  # known only while in the message

    # -- waiting

    def _notify(self) -> None:
        waiter, self._wake = self._wake, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, timeout: float | None, error: type[httpx.TimeoutException], what: str) -> None:
        self._wake = self.loop.create_future()
        if timeout is None:  # the gateway's read: bounded by the caller (a timeout context costs)
            await self._wake
            return
        try:
            async with asyncio.timeout(timeout):
                await self._wake
        except TimeoutError:
            raise error(f"the server did not {what} in time") from None

    async def _wait_until(self, deadline: float) -> None:
        """Wait for news, TimeoutError past `deadline`: the waiter in `Deadlines` (a timeout context
        or a timer of its own costs more, and this is per chunk)."""
        waiter = self._wake = self.loop.create_future()
        self.deadlines.bound(waiter, deadline)
        await waiter

    async def send(self, data: bytes, timeouts: dict[str, Any], deadline: float | None = None) -> None:
        """`data` written and the answer's head read: httpx's write and read timeouts, and
        TimeoutError past `deadline` (the loop's clock), if one is given."""
        assert self.transport is not None
        self.busy = True
        self.transport.write(data)
        # the answer's first bytes acknowledged at once if more is to come (net/quick_ack.py): one
        # system call for an answer in pieces, none for one that arrives whole
        self.quick_pending = self.quick_ack is not None
        while self.write_paused and not self.lost:
            await self._wait_within(timeouts.get("write"), deadline, httpx.WriteTimeout, "take the request")
        while not self.head_done:
            if self.error is not None:
                raise self.error
            # the gateway's own read timeout is None: its deadline bounds the wait
            await self._wait_within(timeouts.get("read"), deadline, httpx.ReadTimeout, "answer")

    async def _wait_within(self, timeout: float | None, deadline: float | None,
                           error: type[httpx.TimeoutException], what: str) -> None:
        """Wait for news: `error` past `timeout` (httpx's own); with a `deadline` too, whichever
        comes first, TimeoutError when it is the deadline."""
        if deadline is None:
            await self._wait(timeout, error, what)
            return
        until = deadline if timeout is None else min(deadline, self.loop.time() + timeout)
        try:
            await self._wait_until(until)
        except TimeoutError:
            if until < deadline:
                raise error(f"the server did not {what} in time") from None
            raise

    async def news(self, deadline: float) -> None:
        """Wait, reading nothing, until bytes or the end of the answer are here (at once if they
        are); TimeoutError past `deadline` (the loop's clock)."""
        if not (self.chunks or self.complete or self.error is not None or self.lost):
            await self._wait_until(deadline)

    async def read(self, timeout: float | None, deadline: float | None = None) -> bytes:
        """The body bytes received so far (waiting for some), b"" at its end; past `deadline`
        (the loop's clock), TimeoutError."""
        while not self.chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise httpx.ReadError(str(self.error))
            if deadline is not None:
                await self._wait_until(deadline)
            else:
                await self._wait(timeout, httpx.ReadTimeout, "send the rest of its answer")
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()
        return data

    def drain(self, done: Callable[[], None]) -> bool:
        """Drop the rest of an answer nobody reads (up to DRAIN_BYTES, for DRAIN_SECONDS), then call
        `done`; False (nothing done) unless the answer has a known end still to come."""
        if not (self.drainable and self.head_done and self.framed and not self.complete and not self.lost
                and self.error is None and self.transport is not None):
            return False
        self.chunks.clear()
        self.buffered = 0
        self.dropped = 0
        self._drained = done
        self._drain_timer = self.loop.call_later(DRAIN_SECONDS, self._drain_timeout)
        self.transport.resume_reading()
        return True

    def _drain_timeout(self) -> None:
        self.close()
        self._drain_end()

    def _drain_end(self) -> None:
        done, self._drained = self._drained, None
        if done is None:
            return
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        done()

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.lost and self.error is None

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


def _supported(method: str, url: httpx.URL, request: httpx.Request | None) -> None:
    if method == "HEAD" or url.scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"{method} {url.scheme}: not sent by this transport", request=request)


class _Body(httpx.AsyncByteStream):
    def __init__(self, pool: H1Transport, conn: _Connection, timeout: float | None) -> None:
        self.pool = pool
        self.conn: _Connection | None = conn
        self.timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.conn is not None and (chunk := await self.conn.read(self.timeout)):
            yield chunk

    def at_end(self) -> bool:
        conn = self.conn
        return conn is None or (conn.complete and not conn.chunks and conn.error is None)

    async def read(self, deadline: float | None) -> bytes:
        """See `egress_http.BodyReader`."""
        return b"" if self.conn is None else await self.conn.read(self.timeout, deadline)

    async def news(self, deadline: float) -> None:
        """See `egress_http.BodyReader`."""
        if self.conn is not None:
            await self.conn.news(deadline)

    async def aclose(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.release(conn)


class H1Transport(httpx.AsyncBaseTransport):
    """See the module doc. `verify` is the TLS context (or True for the default one)."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True, limits: httpx.Limits = DEFAULT_LIMITS,
                 tls: Callable[[], ssl.SSLContext] | None = None) -> None:
        if verify is False:
            raise ValueError("the gateway always verifies TLS")
        self.ssl = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
        self.tls = tls
        self.generation = 0  # bumped when `tls` hands out a new context
        self.max_open = limits.max_connections or 1_000_000
        self.max_idle = limits.max_keepalive_connections or 0
        self.idle: dict[Key, list[_Connection]] = {}
        self.idle_count = 0
        self.open = 0  # connections open or being opened, idle ones included
        self._free: deque[asyncio.Future[None]] = deque()  # requests waiting for a connection slot
        self.deadlines: Deadlines | None = None  # its connections' waits (made on the loop, at first)
        self.closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        _supported(request.method, url, request)
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        data = request_head(request.method.encode("ascii"), url.raw_path, request.headers.raw, request)
        conn = await self._exchange(url, request.extensions.get("sni_hostname") or url.host,
                                    data + await request.aread(), timeouts, request)
        body = _Body(self, conn, timeouts.get("read"))
        return httpx.Response(conn.status, headers=conn.headers, stream=body,
                              extensions={"http_version": b"HTTP/1.1"}, request=request)

    async def relay(self, method: bytes, url: httpx.URL, headers: list[Header], body: bytes | None,
                    timeouts: dict[str, Any], sni: str, deadline: float | None = None) -> RawAnswer:
        """`handle_async_request` without the httpx objects (the gateway's way, through
        `EgressTransport.relay`): `headers` go as given (Host included), `sni` is the name the
        TLS certificate is verified against; TimeoutError if the answer's head is not here by
        `deadline` (the loop's clock: a timer on the waits, not a timeout context per request)."""
        _supported(method.decode("ascii", "replace"), url, None)
        data = request_head(method, url.raw_path, headers)
        conn = await self._exchange(url, sni, data + body if body else data, timeouts, None, deadline)
        return RawAnswer(conn.status, conn.headers, _Body(self, conn, timeouts.get("read")))

    async def _exchange(self, url: httpx.URL, sni: str, data: bytes, timeouts: dict[str, Any],
                        request: httpx.Request | None, deadline: float | None = None) -> _Connection:
        """`data` sent on a connection to `url`'s address, its answer's head received (by
        `deadline`, if one is given: TimeoutError)."""
        port = url.port or (443 if url.scheme == "https" else 80)
        key: Key = (url.scheme, url.host, port, sni)
        if self.tls is not None and url.scheme == "https" and (context := self.tls()) is not self.ssl:
            self.ssl = context
            self.generation += 1
            self._close_idle(self.idle_count)  # made with the old identity
        conn = self._reuse(key)  # kept: no wait
        if conn is None:
            async with asyncio.timeout_at(deadline):
                conn = await self._acquire(key, timeouts, request)
        conn.drainable = not data.startswith(b"GET ")
        try:
            await conn.send(data, timeouts, deadline)
        except BaseException:
            self._discard(conn)
            raise
        return conn

    # -- connections

    def _reuse(self, key: Key) -> _Connection | None:
        idle = self.idle.get(key)
        while idle:
            conn = idle.pop()
            self.idle_count -= 1
            if not conn.lost:
                return conn
            self._closed()
        return None

    async def _acquire(self, key: Key, timeouts: dict[str, Any], request: Asker) -> _Connection:
        """An idle connection to `key`, else a new one once fewer than `max_open` are open (an idle
        one to elsewhere is closed for it; else the request waits up to the pool timeout)."""
        loop = asyncio.get_running_loop()
        pool = timeouts.get("pool")
        deadline = None if pool is None else loop.time() + pool
        while True:
            conn = self._reuse(key)
            if conn is not None:
                return conn
            if self.open >= self.max_open:
                self._close_idle(1)
            if self.open < self.max_open:
                return await self._connect(key, timeouts, request)
            waiter = loop.create_future()
            self._free.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except BaseException as exc:
                if waiter in self._free:
                    self._free.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake_next()  # woken, but leaving: the next in line gets the chance
                if isinstance(exc, TimeoutError):
                    raise httpx.PoolTimeout("no connection to the server was free in time",
                                            request=request) from None
                raise

    async def _connect(self, key: Key, timeouts: dict[str, Any], request: Asker) -> _Connection:
        self.open += 1
        scheme, address, port, sni = key
        loop = asyncio.get_running_loop()
        if self.deadlines is None or self.deadlines.loop is not loop:
            self.deadlines = Deadlines(loop)
        conn = _Connection(key, loop, self.deadlines)
        conn.generation = self.generation
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                await loop.create_connection(
                    lambda: conn, address, port, ssl=self.ssl if scheme == "https" else None,
                    server_hostname=sni if scheme == "https" else None)
        except BaseException as exc:
            conn.close()
            self._closed()
            if isinstance(exc, TimeoutError):
                raise httpx.ConnectTimeout("connecting to the server timed out", request=request) from None
            if isinstance(exc, OSError):  # ssl.SSLError included
                raise ConnectError.of(exc, request) from None
            raise
        return conn

    def release(self, conn: _Connection) -> None:
        """The answer's body is done with: keep the connection for the next request (once the rest
        of its answer is dropped, if it is still to come), or close it."""
        if conn.generation == self.generation and conn.drain(lambda: self._keep(conn)):
            return
        self._keep(conn)

    def _keep(self, conn: _Connection) -> None:
        if not conn.reusable or conn.generation != self.generation or self.closed:
            self._discard(conn)
            return
        conn._reset()
        conn.busy = False
        self.idle.setdefault(conn.key, []).append(conn)
        self.idle_count += 1
        if self.idle_count > self.max_idle:
            self._close_idle(self.idle_count - self.max_idle)
        self._wake_next()  # a request waiting for a connection may take this one

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._closed()

    def _close_idle(self, count: int) -> None:
        for key in list(self.idle):
            idle = self.idle[key]
            while idle and count > 0:
                idle.pop(0).close()
                self.idle_count -= 1
                self._closed()
                count -= 1
            if not idle:
                del self.idle[key]

    def _closed(self) -> None:
        self.open -= 1
        self._wake_next()

    def _wake_next(self) -> None:
        while self._free:
            waiter = self._free.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        self.closed = True  # a connection still dropping the rest of an answer is closed when done
        self._close_idle(self.open)
