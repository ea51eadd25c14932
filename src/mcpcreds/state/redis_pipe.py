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
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

MAX_REPLY_BYTES: Final = 1 << 20  # a reply of the bucket script is under 100 bytes
MAX_DEPTH: Final = 4
_AGGREGATES: Final = frozenset(b"*~>%")


class ProtocolError(Exception):
    """The server sent something that is not a RESP reply this module reads."""


class ReplyError(Exception):
    """An error reply (`-ERR ...`), as a value: raised to the caller it belongs to."""


def parse_reply(buf: bytes | bytearray, pos: int = 0, depth: int = 0) -> tuple[Any, int] | None:
    """One reply from `buf` at `pos`: (value, position after it), or None if it is not complete.
    Errors are ReplyError values; a push message (RESP3 `>`) is a tuple ("push", items)."""
    if depth > MAX_DEPTH:
        raise ProtocolError("a reply nested too deep")
    end = buf.find(b"\r\n", pos)
    if end < 0:
        if len(buf) - pos > MAX_REPLY_BYTES:
            raise ProtocolError("a reply line without an end")
        return None
    kind = buf[pos]
    after = end + 2
    # the kinds the bucket script's reply is made of first: this runs once per grant
    if kind == 36 or kind == 61 or kind == 33:  # `$` bulk string (`=` verbatim string, `!` blob error)
        size = int(buf[pos + 1:end])
        if size < 0:
            return None, after
        if size > MAX_REPLY_BYTES:
            raise ProtocolError("a reply larger than this client reads")
        stop = after + size
        if len(buf) < stop + 2:
            return None
        data = bytes(buf[after:stop])
        return (ReplyError(data.decode("utf-8", "replace")) if kind == 33 else data), stop + 2
    if kind == 58 or kind == 40:  # `:` integer, `(` big number
        return int(buf[pos + 1:end]), after
    if kind in _AGGREGATES:  # array, set, push, map (twice the items)
        size = int(buf[pos + 1:end])
        if size < 0:
            return None, after
        if size > 1024:
            raise ProtocolError("a reply with more items than this client reads")
        items = []
        pos = after
        for _ in range(size * 2 if kind == 37 else size):
            parsed = parse_reply(buf, pos, depth + 1)
            if parsed is None:
                return None
            item, pos = parsed
            items.append(item)
        return (("push", items) if kind == 62 else items), pos
    if kind == 43:  # `+`
        return bytes(buf[pos + 1:end]), after
    if kind == 45:  # `-`
        return ReplyError(bytes(buf[pos + 1:end]).decode("utf-8", "replace")), after
    if kind == 44:  # `,`
        return float(buf[pos + 1:end]), after
    if kind == 35:  # `#`
        return buf[pos + 1:end] == b"t", after
    if kind == 95:  # `_` null
        return None, after
    raise ProtocolError(f"an unknown reply type {chr(kind)!r}")


def items(args: Iterable[Any]) -> bytes:
    """Arguments as RESP bulk strings (a command's body, without its array header)."""
    out = []
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def pack(args: tuple[Any, ...]) -> bytes:
    """A command as a RESP array of bulk strings."""
    return b"*%d\r\n" % len(args) + items(args)


class _Replies(asyncio.Protocol):
    """Matches the replies on the connection to the commands in flight, in order."""

    def __init__(self, waiting: deque[tuple[asyncio.Future[Any], float]],
                 on_lost: Callable[[BaseException], None]) -> None:
        self.waiting = waiting
        self.on_lost = on_lost
        self.buf = b""  # the start of a reply not complete yet

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        waiting = self.waiting
        pos = 0
        try:
            while (parsed := parse_reply(buf, pos)) is not None:
                value, pos = parsed
                if isinstance(value, tuple):  # a push message: nobody's reply
                    continue
                if not waiting:
                    raise ProtocolError("a reply nobody asked for")
                future, _ = waiting.popleft()
                if future.done():  # its caller left
                    continue
                if isinstance(value, ReplyError):
                    message = str(value)
                    future.set_exception(NoScriptError(message) if message.startswith("NOSCRIPT")
                                         else ResponseError(message))
                else:
                    future.set_result(value)
        except (ProtocolError, ValueError) as exc:
            self.on_lost(RedisConnectionError(f"Redis reply unreadable: {exc}"))
            return
        self.buf = buf[pos:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost(RedisConnectionError("Redis closed the connection"))


class Pipe:
    """Commands on one connection opened by `make_connection` (a redis-py connection factory)."""

    def __init__(self, make_connection: Callable[[], Any], timeout: float) -> None:
        self._make = make_connection
        self.timeout = timeout
        self._transport: asyncio.WriteTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
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
        self._loop = asyncio.get_running_loop()
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

    def send(self, command: bytes) -> Awaitable[Any]:
        """Send one command, already packed (`pack`); awaiting the result gives its reply (an
        error reply raised as NoScriptError or ResponseError; a lost connection or the timeout as
        a redis ConnectionError/TimeoutError). On an open connection this is a future of the
        reply itself, so the caller waits for the reply and nothing else."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return self._connect_and_send(command)
        return self._write(transport, command)

    async def call(self, *args: Any) -> Any:
        """`send` of the command made of `args`."""
        return await self.send(pack(args))

    async def _connect_and_send(self, command: bytes) -> Any:
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
        return await self._write(transport, command)

    def _write(self, transport: asyncio.WriteTransport, command: bytes) -> asyncio.Future[Any]:
        loop = self._loop
        assert loop is not None  # set with the transport
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((future, loop.time()))
        transport.write(command)
        if self._watch is None:
            self._watch = loop.call_later(self.timeout / 4, self._check)
        return future

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
