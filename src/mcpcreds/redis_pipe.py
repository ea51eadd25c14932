"""One Redis connection for the hot path (the bucket script), pipelined: a command is written as
soon as it is asked for and its reply is matched to it by order, so concurrent callers share the
connection without a pool, a lock or a round trip each to take a connection.

redis-py opens the connection (TCP or Unix socket, TLS with the server verified, AUTH, HELLO,
SELECT: all as for every other call of the state); then its transport is handed to this module's
protocol, which parses the replies (RESP2 and RESP3, `parse_reply`, pure) as they arrive. A reply
that does not come within the timeout (checked every quarter of it, by one timer for the
connection rather than one per command) fails every command in flight and drops the connection
(a hung server costs one timeout); the next command connects again."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

MAX_REPLY_BYTES: Final = 1 << 20  # a reply of the bucket script is under 100 bytes
MAX_DEPTH: Final = 4
_SCALARS: Final = frozenset(b"+-:$_,#(=!")


class ProtocolError(Exception):
    """The server sent something that is not a RESP reply this module reads."""


class ReplyError(Exception):
    """An error reply (`-ERR ...`), as a value: raised to the caller it belongs to."""


def _line(buf: bytes | bytearray, pos: int) -> tuple[bytes, int] | None:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        if len(buf) - pos > MAX_REPLY_BYTES:
            raise ProtocolError("a reply line without an end")
        return None
    return bytes(buf[pos:end]), end + 2


def parse_reply(buf: bytes | bytearray, pos: int = 0, depth: int = 0) -> tuple[Any, int] | None:
    """One reply from `buf` at `pos`: (value, position after it), or None if it is not complete.
    Errors are ReplyError values; a push message (RESP3 `>`) is a tuple ("push", items)."""
    if pos >= len(buf):
        return None
    if depth > MAX_DEPTH:
        raise ProtocolError("a reply nested too deep")
    kind = buf[pos]
    head = _line(buf, pos + 1)
    if head is None:
        return None
    text, pos = head
    if kind in _SCALARS and kind not in b"$=!":
        if kind == ord("+"):
            return text, pos
        if kind == ord("-"):
            return ReplyError(text.decode("utf-8", "replace")), pos
        if kind in b":(":
            return int(text), pos
        if kind == ord(","):
            return float(text), pos
        if kind == ord("#"):
            return text == b"t", pos
        return None, pos  # `_`: null
    size = int(text)
    if kind in b"$=!":  # bulk string (or verbatim string, blob error)
        if size < 0:
            return None, pos
        if size > MAX_REPLY_BYTES:
            raise ProtocolError("a reply larger than this client reads")
        if len(buf) < pos + size + 2:
            return None
        data = bytes(buf[pos:pos + size])
        return (ReplyError(data.decode("utf-8", "replace")) if kind == ord("!") else data), pos + size + 2
    if kind in b"*~>%":  # array, set, push, map (twice the items)
        if size < 0:
            return None, pos
        if size > 1024:
            raise ProtocolError("a reply with more items than this client reads")
        items = []
        for _ in range(size * 2 if kind == ord("%") else size):
            parsed = parse_reply(buf, pos, depth + 1)
            if parsed is None:
                return None
            item, pos = parsed
            items.append(item)
        return (("push", items) if kind == ord(">") else items), pos
    raise ProtocolError(f"an unknown reply type {chr(kind)!r}")


def pack(args: tuple[Any, ...]) -> bytes:
    """A command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Replies(asyncio.Protocol):
    """Matches the replies on the connection to the commands in flight, in order."""

    def __init__(self, waiting: deque[tuple[asyncio.Future[Any], float]],
                 on_lost: Callable[[BaseException], None]) -> None:
        self.waiting = waiting
        self.on_lost = on_lost
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        pos = 0
        try:
            while (parsed := parse_reply(self.buf, pos)) is not None:
                value, pos = parsed
                if isinstance(value, tuple):  # a push message: nobody's reply
                    continue
                if not self.waiting:
                    raise ProtocolError("a reply nobody asked for")
                future, _ = self.waiting.popleft()
                if not future.done():  # its caller may have left
                    future.set_result(value)
        except (ProtocolError, ValueError) as exc:
            self.on_lost(RedisConnectionError(f"Redis reply unreadable: {exc}"))
            return
        del self.buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost(RedisConnectionError("Redis closed the connection"))


class Pipe:
    """Commands on one connection opened by `make_connection` (a redis-py connection factory)."""

    def __init__(self, make_connection: Callable[[], Any], timeout: float) -> None:
        self._make = make_connection
        self.timeout = timeout
        self._transport: asyncio.BaseTransport | None = None
        self._waiting: deque[tuple[asyncio.Future[Any], float]] = deque()  # with the time sent
        self._connecting: asyncio.Task[None] | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._writer: Any = None

    async def _connect(self) -> None:
        conn = self._make()
        try:
            await conn.connect()
            writer = getattr(conn, "_writer", None)
            transport = getattr(writer, "transport", None)
            if transport is None:
                raise RedisConnectionError("the Redis connection cannot be pipelined")
        except BaseException:
            await conn.disconnect()
            raise
        # the transport is ours from now on: the connection object must not close it when it is
        # collected (redis-py closes an unclosed connection's streams in __del__), and the stream
        # writer, which closes it when it is collected, lives as long as the connection
        conn._reader = conn._writer = None
        self._writer = writer
        waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        transport.set_protocol(_Replies(waiting, lambda exc: self._lost(transport, waiting, exc)))
        self._transport, self._waiting = transport, waiting

    def _lost(self, transport: asyncio.BaseTransport, waiting: deque[tuple[asyncio.Future[Any], float]],
              exc: BaseException) -> None:
        """The connection is done with: every command in flight on it fails."""
        transport.close()
        if self._transport is transport:
            self._transport = None
        while waiting:
            future, _ = waiting.popleft()
            if not future.done():
                future.set_exception(exc)

    async def call(self, *args: Any) -> Any:
        """Send one command and return its reply (an error reply raised as NoScriptError or
        ResponseError; a lost connection or the timeout as a redis ConnectionError/TimeoutError)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            if self._connecting is None:
                self._connecting = asyncio.ensure_future(self._connect())
            connecting = self._connecting
            try:
                await asyncio.wait_for(asyncio.shield(connecting), self.timeout)
            finally:
                if connecting.done() and self._connecting is connecting:
                    self._connecting = None
            transport = self._transport
            if transport is None:
                raise RedisConnectionError("Redis connection lost as it opened")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((future, loop.time()))
        transport.write(pack(args))  # type: ignore[attr-defined]
        if self._watch is None:
            self._watch = loop.call_later(self.timeout / 4, self._check)
        reply = await future
        if isinstance(reply, ReplyError):
            message = str(reply)
            raise NoScriptError(message) if message.startswith("NOSCRIPT") else ResponseError(message)
        return reply

    def _check(self) -> None:
        """The watchdog: fail the connection if its oldest command is older than the timeout;
        look again in a quarter of it while commands are in flight."""
        self._watch = None
        transport, waiting = self._transport, self._waiting
        if transport is None or not waiting:
            return  # idle: the next command arms it again
        loop = asyncio.get_running_loop()
        if loop.time() - waiting[0][1] >= self.timeout:
            self._lost(transport, waiting, TimeoutError(f"Redis did not answer within {self.timeout:g}s"))
            return
        self._watch = loop.call_later(self.timeout / 4, self._check)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._connecting is not None:
            self._connecting.cancel()
        if self._transport is not None:
            self._lost(self._transport, self._waiting, RedisConnectionError("closed"))
