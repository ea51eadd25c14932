"""`mcpcreds stdio SERVER`: a stdio MCP server that relays to the gateway, `/mcp/SERVER` on the
sidecar's socket, for MCP clients that only launch stdio servers.

- Each line on stdin (one JSON-RPC message or batch) is POSTed to the gateway, with the
  `Mcp-Session-Id` the server gave and the `MCP-Protocol-Version` it agreed to. Requests go out
  concurrently (a long tool call does not hold up a cancellation); notifications and responses
  are sent in order, each before the next line is read (as the MCP SDK's HTTP client does).
- Answers (a JSON body, or an SSE stream read event by event) are written to stdout, one JSON-RPC
  message a line. Once the session is initialized, the server's own GET stream is opened for
  server-initiated messages (a 405 means it has none). A request whose answer never came (the
  sidecar unreachable, a stream cut short, an HTTP error without a JSON-RPC body) gets a JSON-RPC
  error, so the client never waits forever.
- A `notifications/cancelled` closes the POST of the request it names (over HTTP, closing the
  stream cancels a request; a 2026-07-28 `subscriptions/listen` ends so) and goes on as well.
- EOF on stdin: the requests in flight are answered, then the session is ended (DELETE).
  SIGTERM or SIGINT: the same without waiting for them.
- stdout carries JSON-RPC only (whatever else might write to it goes to stderr); diagnostics go
  to stderr and never quote a message or a header.

HTTP/1.1 on the socket is `uds_stream`'s (kept connections; an answer handed over as it arrives,
with no task per chunk), with the library's checks: the socket's folder, then its listener's
SO_PEERCRED uid, before the first byte. A grant
(`MCPCREDS_GRANT`) is sent as `Authorization: Bearer`; the sidecar never forwards it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Final

import httptools

from ..core.http import MAX_GATEWAY_BODY_BYTES
from ..core.tasks import spawn
from ..errors import McpcredsError
from .gateway_http import GATEWAY_ORIGIN, check_folder_if_there, gateway_url
from .uds_stream import StreamUdsHttp, Unreachable

MAX_LINE: Final = MAX_GATEWAY_BODY_BYTES  # what the gateway takes in one POST
MAX_ANSWER: Final = 16 * 1024 * 1024  # a JSON answer, read whole
MAX_EVENT: Final = MAX_GATEWAY_BODY_BYTES  # one SSE event (the gateway relays at most this)
MAX_HEADER: Final = 256  # Mcp-Session-Id, MCP-Protocol-Version
GET_RETRIES: Final = 5  # consecutive failed attempts at the server's GET stream before giving up
DELETE_TIMEOUT: Final = 5.0
READ_CHUNK: Final = 64 * 1024
INTERNAL_ERROR: Final = -32603
GATEWAY_ERROR: Final = -32000
INVALID_REQUEST: Final = -32600
PARSE_ERROR: Final = -32700
CANCELLED: Final = "notifications/cancelled"

Say = Callable[[str], None]


class LineTooLong(ValueError):
    pass


class EventTooLarge(ValueError):
    pass


# ---------------------------------------------------------------------------- pure parts


class LineSplitter:
    """Newline-delimited input: whole lines out (without the newline), an overlong one reported
    once as `LineTooLong` and its rest skipped."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.skipping = False

    def feed(self, data: bytes) -> list[bytes | LineTooLong]:
        out: list[bytes | LineTooLong] = []
        self.buf += data
        while True:
            end = self.buf.find(b"\n")
            if end < 0:
                if len(self.buf) > self.limit:
                    if not self.skipping:
                        out.append(LineTooLong(f"a message over {self.limit} bytes"))
                    self.skipping = True
                    self.buf.clear()
                return out
            line = bytes(self.buf[:end])
            del self.buf[:end + 1]
            if self.skipping:
                self.skipping = False
            elif len(line) > self.limit:
                out.append(LineTooLong(f"a message over {self.limit} bytes"))
            else:
                out.append(line)

    def end(self) -> list[bytes | LineTooLong]:
        """At EOF: a last line without its newline."""
        rest = self.feed(b"\n") if self.buf and not self.skipping else []
        self.buf.clear()
        return rest


@dataclass(slots=True)
class SseEvent:
    data: str
    id: str | None


class SseParser:
    """A text/event-stream, event by event (the WHATWG rules: CR, LF or CRLF line ends, `data`
    lines joined with LF, `id` remembered, comments and other fields ignored), each event bounded."""

    def __init__(self, limit: int = MAX_EVENT) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.data: list[str] = []
        self.size = 0
        self.event = ""
        self.last_id: str | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        events: list[SseEvent] = []
        self.buf += chunk
        while True:
            cr, lf = self.buf.find(b"\r"), self.buf.find(b"\n")
            ends = [i for i in (cr, lf) if i >= 0]
            if not ends:
                break
            end = min(ends)
            if end == cr and end + 1 == len(self.buf):
                break  # a CR last: an LF may follow
            skip = 2 if end == cr and self.buf[end + 1:end + 2] == b"\n" else 1
            line = bytes(self.buf[:end]).decode("utf-8", "replace")
            del self.buf[:end + skip]
            event = self._line(line)
            if event is not None:
                events.append(event)
        if len(self.buf) + self.size > self.limit:
            raise EventTooLarge(f"an SSE event over {self.limit} bytes")
        return events

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            data, kind = self.data, self.event or "message"
            self.data, self.size, self.event = [], 0, ""
            if data and kind == "message":
                return SseEvent("\n".join(data), self.last_id)
            return None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self.size += len(value) + 1
            if self.size > self.limit:
                raise EventTooLarge(f"an SSE event over {self.limit} bytes")
            self.data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_id = value
        elif name == "event":
            self.event = value
        return None


def is_jsonrpc(message: Any) -> bool:
    """A JSON-RPC 2.0 message, or a non-empty batch of them."""
    if isinstance(message, list):
        return bool(message) and all(isinstance(m, dict) and m.get("jsonrpc") == "2.0" for m in message)
    return isinstance(message, dict) and message.get("jsonrpc") == "2.0"


def messages_of(message: Any) -> list[dict[str, Any]]:
    return [m for m in (message if isinstance(message, list) else [message]) if isinstance(m, dict)]


def request_ids(message: Any) -> list[Any]:
    """The ids of the requests in a message or batch (notifications and responses have none)."""
    return [m["id"] for m in messages_of(message)
            if isinstance(m.get("method"), str) and "id" in m and _valid_id(m["id"])]


def _valid_id(value: Any) -> bool:
    return (isinstance(value, str | int) and not isinstance(value, bool)) or value is None


def id_key(value: Any) -> str:
    return json.dumps(value)


def error(id_: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}


def header_value(value: str | None) -> str | None:
    """A session id or protocol version the server sent, if it is visible ASCII and bounded."""
    if value and len(value) <= MAX_HEADER and all("!" <= ch <= "~" for ch in value):
        return value
    return None


# ---------------------------------------------------------------------------- output


class Output:
    """stdout: one JSON-RPC message a line, nothing else. The lines of one turn of the event loop
    are written together (at its next turn, or now outside a loop)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.closed = False  # the client closed its end: what comes is dropped until stdin ends
        self.pending: list[bytes] = []

    def write(self, message: Any) -> None:
        self.line(json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))

    def json_text(self, text: str) -> None:
        """A JSON text already parsed, as it came: once more through `json.dumps` if it spans lines."""
        text = text.strip(" \t\r\n")
        if "\n" in text or "\r" in text:
            self.write(json.loads(text))
        else:
            self.line(text.encode("utf-8"))

    def line(self, line: bytes) -> None:
        if self.closed:
            return
        self.pending.append(line)
        if len(self.pending) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: now
                self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        data = b"\n".join(self.pending) + b"\n"
        self.pending.clear()
        if self.closed:
            return
        try:
            self.stream.write(data)
            self.stream.flush()
        except OSError:  # EPIPE
            self.closed = True


# ---------------------------------------------------------------------------- the relay


class NotListening(Exception):
    """The server's GET stream is not there (`status`)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _kind(headers: dict[str, str]) -> str:
    return headers.get("content-type", "").partition(";")[0].strip().lower()


class _Answer:
    """A POST's answer, as it arrives: SSE events emitted one by one, any other body read whole."""

    __slots__ = ("events", "initialize", "parts", "pending", "relay", "size", "status")

    def __init__(self, relay: Relay, pending: dict[str, Any], initialize: bool) -> None:
        self.relay = relay
        self.pending = pending
        self.initialize = initialize
        self.status = 0
        self.events: SseParser | None = None
        self.parts: list[bytes] | None = None
        self.size = 0

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        if self.initialize and (sid := header_value(headers.get("mcp-session-id"))):
            self.relay.session_id = sid
        if _kind(headers) == "text/event-stream" and 200 <= status < 300:
            self.events = SseParser()
        elif status != 202:
            self.parts = []

    def body(self, chunk: bytes) -> None:
        if self.events is not None:
            for event in self.events.feed(chunk):
                self.relay.emit_text(event.data, self.pending)
        elif self.parts is not None:
            self.size += len(chunk)
            if self.size > MAX_ANSWER:
                raise LineTooLong(f"an answer over {MAX_ANSWER} bytes")
            self.parts.append(chunk)

    def end(self) -> None:
        if self.parts:
            self.relay.emit_body(b"".join(self.parts), self.pending)


class _Events:
    """The server's GET stream: its events as they arrive."""

    __slots__ = ("events", "last_id", "relay", "seen")

    def __init__(self, relay: Relay, last_id: str | None) -> None:
        self.relay = relay
        self.events = SseParser()
        self.last_id = last_id
        self.seen = False  # an event came: the stream works

    def head(self, status: int, headers: dict[str, str]) -> None:
        if status != 200 or _kind(headers) != "text/event-stream":
            raise NotListening(status)

    def body(self, chunk: bytes) -> None:
        for event in self.events.feed(chunk):
            self.seen = True
            self.last_id = header_value(event.id) or self.last_id  # sent back as a header
            self.relay.emit_text(event.data, {})


class _Status:
    """An answer whose status is all that counts."""

    __slots__ = ("status",)

    def __init__(self) -> None:
        self.status = 0

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status

    def body(self, chunk: bytes) -> None:
        pass


class Relay:
    def __init__(self, http: StreamUdsHttp, out: Output, say: Say, unreachable: str = "") -> None:
        self.http = http
        self.unreachable = unreachable  # what to say when no sidecar answers: where, and the fix
        self.out = out
        self.say = say
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self.inflight: set[asyncio.Task[None]] = set()
        self.by_id: dict[str, asyncio.Task[None]] = {}  # the POST of each request in flight
        self.listener: asyncio.Task[None] | None = None

    def headers(self, accept: str = "application/json, text/event-stream") -> dict[str, str]:
        headers = {"Accept": accept}
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        if self.protocol_version is not None:
            headers["MCP-Protocol-Version"] = self.protocol_version
        return headers

    # -- from stdin

    def line(self, line: bytes | LineTooLong) -> asyncio.Task[None] | None:
        """Send a line on: a request's POST runs alongside the next lines; what must go in order
        (a notification, a response, initialize) is the task returned, to be waited for."""
        if isinstance(line, LineTooLong):
            self.out.write(error(None, INVALID_REQUEST, f"{line}: not sent"))
            return None
        if not line.strip():
            return None
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            self.out.write(error(None, PARSE_ERROR, "Parse error: a line on stdin is not JSON"))
            return None
        if not is_jsonrpc(message):
            self.out.write(error(None, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message"))
            return None
        ids = request_ids(message)
        items = messages_of(message)
        methods = {m.get("method") for m in items}
        if CANCELLED in methods:
            for item in items:
                if item.get("method") == CANCELLED and isinstance(item.get("params"), dict):
                    # over HTTP, a request is cancelled by closing its stream (2026-07-28: the only
                    # way, and the way a subscriptions/listen ends): its POST is closed; the notice
                    # goes on too
                    task = self.by_id.pop(id_key(item["params"].get("requestId")), None)
                    if task is not None:
                        task.cancel()
        if "initialize" in methods or not ids:  # in order: the session id first, or a notification
            ordered = asyncio.ensure_future(self.post(line, ids, initialize="initialize" in methods))
        else:
            ordered = None
            task = spawn(self.inflight, self.post(line, ids))
            keys = [id_key(i) for i in ids]
            for key in keys:
                self.by_id[key] = task
            task.add_done_callback(lambda done: self._forget(keys, done))
        if "notifications/initialized" in methods and self.listener is None:
            self.listener = asyncio.ensure_future(self.listen())
        return ordered

    def _forget(self, keys: list[str], task: asyncio.Task[None]) -> None:
        for key in keys:
            if self.by_id.get(key) is task:
                del self.by_id[key]

    # -- POST

    async def post(self, body: bytes, ids: list[Any], initialize: bool = False) -> None:
        pending = {id_key(i): i for i in ids}
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if not initialize:
            headers = {**self.headers(), "Content-Type": "application/json"}
        answer = _Answer(self, pending, initialize)
        reason = "the server's answer ended before the response"
        try:
            await self.http.request("POST", headers, body, answer)
            answer.end()
            if answer.status >= 300:
                reason = f"the gateway answered HTTP {answer.status}"
                self.say(f"POST: HTTP {answer.status}")
        except Unreachable as exc:
            reason = self.unreachable or f"the sidecar could not be reached ({exc})"
            self.say(reason)
        except McpcredsError as exc:  # UntrustedSidecar: nothing was sent
            reason = exc.message
            self.say(exc.message)
        except (OSError, ValueError, httptools.HttpParserError) as exc:
            reason = f"the sidecar's gateway failed ({type(exc).__name__})"
            self.say(f"POST failed: {type(exc).__name__}")
        for id_ in pending.values():
            self.out.write(error(id_, GATEWAY_ERROR, reason))

    def emit_body(self, body: bytes, pending: dict[str, Any]) -> None:
        try:
            text = body.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError:
            self.say("an answer that is not UTF-8 was dropped")
            return
        if text.strip():
            self._emit(text, pending, "an answer that is not JSON was dropped")

    def emit_text(self, data: str, pending: dict[str, Any]) -> None:
        if data.strip():  # else a priming event (an id, no message)
            self._emit(data, pending, "an SSE event that is not JSON was dropped")

    def _emit(self, text: str, pending: dict[str, Any], not_json: str) -> None:
        try:
            message = json.loads(text)
        except (ValueError, RecursionError):
            self.say(not_json)
            return
        if not is_jsonrpc(message):
            self.say("an answer that is not JSON-RPC was dropped")
            return
        for item in messages_of(message):
            if "method" not in item and ("result" in item or "error" in item):
                pending.pop(id_key(item.get("id")), None)
                result = item.get("result")
                if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str) \
                        and "serverInfo" in result:
                    self.protocol_version = header_value(result["protocolVersion"]) or self.protocol_version
        self.out.json_text(text)

    # -- the server's GET stream

    async def listen(self) -> None:
        """Server-initiated messages, until the session ends; resumed with Last-Event-ID."""
        last_id: str | None = None
        failures = 0
        while failures < GET_RETRIES:
            headers = self.headers("text/event-stream")
            if last_id is not None:
                headers["Last-Event-ID"] = last_id
            events = _Events(self, last_id)
            try:
                await self.http.request("GET", headers, None, events)
            except NotListening as exc:
                if exc.status != 405:  # 405: this server sends nothing unasked
                    self.say(f"GET stream: HTTP {exc.status}; not listening")
                return
            except (OSError, ValueError, httptools.HttpParserError, McpcredsError) as exc:
                self.say(f"GET stream ended: {type(exc).__name__}")
            last_id = events.last_id
            failures = 1 if events.seen else failures + 1
            await asyncio.sleep(min(0.5 * 2 ** failures, 8.0))
        self.say("GET stream: giving up")

    # -- the end

    async def finish(self, wait: bool) -> None:
        """Answer what is in flight (if `wait`), stop listening, end the session."""
        if wait and self.inflight:
            await asyncio.gather(*self.inflight, return_exceptions=True)
        for task in (*self.inflight, *([self.listener] if self.listener else [])):
            task.cancel()
        self.out.flush()
        if self.session_id is None:
            return
        ended = _Status()
        try:
            async with asyncio.timeout(DELETE_TIMEOUT):
                await self.http.request("DELETE", self.headers(), None, ended)
            if ended.status not in (200, 202, 204, 404, 405):
                self.say(f"DELETE: HTTP {ended.status}")
        except (OSError, ValueError, httptools.HttpParserError, McpcredsError) as exc:
            self.say(f"DELETE failed: {type(exc).__name__}")


# ---------------------------------------------------------------------------- stdin


class StdinLines:
    """stdin's lines on the event loop: read as it becomes readable (a pipe, socket or terminal),
    else by a thread (a file, which epoll cannot watch), by raw reads on the descriptor (no lock
    of sys.stdin is held if the process exits meanwhile). Once QUEUED lines wait, reading pauses."""

    QUEUED: Final = 16

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self.fd = fd
        self.loop = loop
        self.splitter = LineSplitter()
        self.lines: collections.deque[bytes | LineTooLong | None] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.stopped = False
        self.ended = False
        self.watched = False  # by the loop (else by the thread)
        self.go = threading.Event()  # the thread's: it may read
        self.go.set()
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # no stdin: the thread's first read ends it
            mode = 0
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode):
            with contextlib.suppress(OSError):  # e.g. /dev/null: EPERM
                loop.add_reader(fd, self._readable)
                self.watched = True
        if not self.watched:
            threading.Thread(target=self._read, daemon=True, name="mcpcreds-stdin").start()

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # stdin closed under us
            data = b""
        self._data(data)

    def _read(self) -> None:
        """In the thread."""
        with contextlib.suppress(OSError, RuntimeError):  # stdin closed under us, or the loop is gone
            while self.go.wait() and (data := os.read(self.fd, READ_CHUNK)):
                self.loop.call_soon_threadsafe(self._data, data)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._data, b"")

    def _data(self, data: bytes) -> None:
        if self.ended:
            return
        if data:
            self.lines.extend(self.splitter.feed(data))
        else:
            self.lines.extend(self.splitter.end())
            self.lines.append(None)
            self.ended = True
            self._pause()
        if len(self.lines) >= self.QUEUED:
            self._pause()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _pause(self) -> None:
        if self.watched:
            self.loop.remove_reader(self.fd)
        else:
            self.go.clear()

    def _resume(self) -> None:
        if self.ended or self.stopped:
            return
        if self.watched:
            self.loop.add_reader(self.fd, self._readable)
        else:
            self.go.set()

    async def get(self) -> bytes | LineTooLong | None:
        """The next line; None at EOF, or once stopped."""
        while not self.lines and not self.stopped:
            self.waiter = self.loop.create_future()
            await self.waiter
        if self.stopped:
            return None
        item = self.lines.popleft()
        if len(self.lines) == self.QUEUED - 1:
            self._resume()
        return item

    def stop(self) -> None:
        self.stopped = True
        self._pause()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


async def relay(http: StreamUdsHttp, out: Output, say: Say, stdin_fd: int = 0, unreachable: str = "") -> None:
    loop = asyncio.get_running_loop()
    lines = StdinLines(stdin_fd, loop)
    r = Relay(http, out, say, unreachable)
    ordered: asyncio.Task[None] | None = None

    def stop() -> None:  # SIGTERM, SIGINT: what is in flight is not waited for
        lines.stop()
        if ordered is not None:
            ordered.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        while (item := await lines.get()) is not None:
            ordered = r.line(item)
            if ordered is not None:
                await asyncio.wait({ordered})
                ordered = None
        await r.finish(wait=not lines.stopped)
    finally:
        out.flush()


def unreachable_text(socket_path: str) -> str:
    """What a client is told when no sidecar answers: the socket tried, and how to fix it."""
    return (f"no sidecar answers on {socket_path}: start one (`mcpcreds serve`), or name its socket in "
            "this server's entry of the MCP client's config: \"env\": {\"MCPCREDS_SOCKET\": \"PATH\"}")


def take_stdout() -> Output:
    """Keep stdout for JSON-RPC: the Output that writes to it, while fd 1 (and `sys.stdout`)
    become stderr, so nothing else this process (or a child it starts) prints reaches the client."""
    out = Output(os.fdopen(os.dup(1), "wb"))
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def run(socket_path: str, sidecar_uid: int, name: str, grant_headers: dict[str, str],
        out: Output | None = None) -> int:
    """The `mcpcreds stdio` process: stdout is kept for JSON-RPC (`out`, or taken now)."""
    out = out or take_stdout()

    def say(message: str) -> None:
        print(f"mcpcreds stdio: {message}", file=sys.stderr, flush=True)

    check_folder_if_there(socket_path, sidecar_uid)  # a planted folder is refused before anything
    path = gateway_url(name).removeprefix(GATEWAY_ORIGIN)

    async def main() -> None:
        # no read timeout: a tool may run long, and the server's GET stream may idle
        http = StreamUdsHttp(socket_path, sidecar_uid, path, grant_headers)
        try:
            await relay(http, out, say, unreachable=unreachable_text(socket_path))
        finally:
            http.close()

    asyncio.run(main())
    return 0
