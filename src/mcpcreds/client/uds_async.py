"""The asyncio twin of `uds.SyncUdsHttp`, for `AsyncClient`: one `asyncio.Protocol` per connection
that feeds what arrives straight into its httptools parser and completes the caller's future.

No StreamReader, no new parser and no `asyncio.timeout` per call: together they cost about
15 µs of every call (issue 18). A connection keeps its parser and one timer, re-armed only when
it fires or a call needs an earlier deadline, so a call that does not finish in its timeout fails
with TimeoutError and its connection is closed, never reused.

Kept connections are reused (one per concurrent request, per event loop); a kept connection the
sidecar closed, or that received bytes no request asked for, is dropped before reuse; a connection
that fails before any answer byte is reported retryable. Each new connection is checked before its
first byte (`socket_check`): the folder, then the peer's uid.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httptools

from ..core.socket_check import check_folder, check_peer
from .uds import MAX_HEAD, MAX_INTERIM, MAX_RESPONSE, Retryable, decode_json, encode

Answer = tuple[int, bytes, bool]  # status, body, keep-alive


class _Connection(asyncio.Protocol):
    """One connection to the sidecar; at most one request in flight on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.parser = httptools.HttpResponseParser(self)  # reused: it resets after each answer
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future[Answer] | None = None  # the request in flight's
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.received = False  # a byte of the current answer came
        self.head = 0  # bytes of the current head so far, -1 once it is complete
        self.interim = 0
        self.body: list[bytes] = []
        self.size = 0

    # -- the caller's side

    def send(self, request: bytes, deadline: float) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self.waiter = waiter = self.loop.create_future()
        self.received = False
        self.head = self.interim = self.size = 0
        self.body = []
        self.deadline = deadline
        if self.timer is None or self.timer.when() > deadline:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_at(deadline, self._on_timer)
        self.transport.write(request)
        return waiter

    def close(self) -> None:
        self.closed = True
        # a loop that has ended (asyncio.run) cannot close it: the socket closes with the transport
        if self.transport is None or self.transport.is_closing() or self.loop.is_closed():
            return
        self.transport.abort()  # a request in an unknown state: nothing more is sent or read

    def _on_timer(self) -> None:
        self.timer = None
        if self.waiter is None:
            return  # idle: the next call arms it again
        if self.loop.time() < self.deadline:  # armed for an earlier call: wait for this one's deadline
            self.timer = self.loop.call_at(self.deadline, self._on_timer)
            return
        self._fail(TimeoutError())

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are no asyncio.Transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():  # bytes no request asked for (or a cancelled one's)
            self._fail(ConnectionResetError("the sidecar sent bytes no request asked for"))
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except (ValueError, httptools.HttpParserError) as exc:  # a bound crossed, or not HTTP
            self._fail(exc)
            return
        if self.head >= 0 and self.waiter is not None:
            self.head += len(data)  # all of `data` is head: the head did not end in it
            if self.head > MAX_HEAD:
                self._fail(ValueError("sidecar answer head too large"))

    def eof_received(self) -> None:
        self.closed = True  # not taken for a call again; the transport closes and connection_lost
        # tells a call in flight what it means

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():
            return
        if self.received:
            waiter.set_exception(ConnectionResetError("the sidecar closed the connection mid-answer"))
        else:  # no answer byte yet: the sidecar went away (a kept connection closed as it was used)
            waiter.set_exception(Retryable(str(exc) if exc else "the sidecar closed the connection"))

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        if self.waiter is None:  # a second answer in the bytes of the first
            raise ValueError("the sidecar sent bytes no request asked for")
        self.head = 0

    def on_headers_complete(self) -> None:
        self.head = -1

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > MAX_RESPONSE:
            raise ValueError("sidecar answer too large")
        self.body.append(body)

    def on_message_complete(self) -> None:
        # read while the parser still holds this message (it resets once the callback returns)
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer: the final one follows (a sidecar sends none)
            self.interim += 1
            if self.interim > MAX_INTERIM:
                raise ValueError("too many interim answers")
            return
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((status, b"".join(self.body), self.parser.should_keep_alive()))


class UdsHttp:
    """`await http.request("POST", "/v1/...", {"cost": 1}, timeout=10)` -> (status, JSON body)."""

    def __init__(self, path: str, headers: dict[str, str], sidecar_uid: int) -> None:
        self.path = path
        self.sidecar_uid = sidecar_uid
        self._head = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        self._idle: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        try:
            check_folder(self.path, self.sidecar_uid)
            _, conn = await loop.create_unix_connection(lambda: _Connection(loop), self.path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise Retryable(str(exc)) from None
        try:
            assert conn.transport is not None
            check_peer(conn.transport.get_extra_info("socket"), self.path, self.sidecar_uid)
        except BaseException:
            conn.close()
            raise
        return conn

    async def request(self, method: str, path: str, body: dict[str, Any] | None,
                      timeout: float) -> tuple[int, Any]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._drop_idle()
            self._loop = loop
        deadline = loop.time() + timeout
        conn = None
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                break
            conn = None
        if conn is None:
            async with asyncio.timeout_at(deadline):  # a new connection only: a few per client
                conn = await self._open(loop)
        try:
            status, raw, keep = await conn.send(encode(self._head, method, path, body), deadline)
        except BaseException:  # failed, timed out or cancelled mid-request: its state is unknown
            conn.close()
            raise
        if keep and not conn.closed:
            self._idle.append(conn)
        else:
            conn.close()
        return status, decode_json(raw)

    def _drop_idle(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def aclose(self) -> None:
        self._drop_idle()
