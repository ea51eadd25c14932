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

The connection is made with the library's checks (`client.gateway_http_client`): the socket's
folder, then its listener's SO_PEERCRED uid, before the first byte. A grant
(`MCPCREDS_GRANT`) is sent as `Authorization: Bearer`; the sidecar never forwards it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import IO, Any, Final

import httpx

from ..core.http import MAX_GATEWAY_BODY_BYTES
from ..core.tasks import spawn
from ..errors import McpcredsError
from .client import gateway_http_client, gateway_url

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
    """stdout: one JSON-RPC message a line, nothing else."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.closed = False  # the client closed its end: what comes is dropped until stdin ends

    def write(self, message: Any) -> None:
        if self.closed:
            return
        line = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"
        try:
            self.stream.write(line)
            self.stream.flush()
        except OSError:  # EPIPE
            self.closed = True


# ---------------------------------------------------------------------------- the relay


class Relay:
    def __init__(self, http: httpx.AsyncClient, url: str, out: Output, say: Say,
                 unreachable: str = "") -> None:
        self.http = http
        self.unreachable = unreachable  # what to say when no sidecar answers: where, and the fix
        self.url = url
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

    async def line(self, line: bytes | LineTooLong) -> None:
        if isinstance(line, LineTooLong):
            self.out.write(error(None, INVALID_REQUEST, f"{line}: not sent"))
            return
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            self.out.write(error(None, PARSE_ERROR, "Parse error: a line on stdin is not JSON"))
            return
        if not is_jsonrpc(message):
            self.out.write(error(None, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message"))
            return
        ids = request_ids(message)
        methods = {m.get("method") for m in messages_of(message)}
        for item in messages_of(message):
            if item.get("method") == CANCELLED and isinstance(item.get("params"), dict):
                # over HTTP, a request is cancelled by closing its stream (2026-07-28: the only way,
                # and the way a subscriptions/listen ends): its POST is closed; the notice goes on too
                task = self.by_id.pop(id_key(item["params"].get("requestId")), None)
                if task is not None:
                    task.cancel()
        if "initialize" in methods or not ids:  # in order: the session id first, or a notification
            await self.post(line, ids, initialize="initialize" in methods)
        else:
            task = spawn(self.inflight, self.post(line, ids))
            keys = [id_key(i) for i in ids]
            self.by_id.update(dict.fromkeys(keys, task))
            task.add_done_callback(lambda done: self._forget(keys, done))
        if "notifications/initialized" in methods and self.listener is None:
            self.listener = asyncio.ensure_future(self.listen())

    def _forget(self, keys: list[str], task: asyncio.Task[None]) -> None:
        for key in keys:
            if self.by_id.get(key) is task:
                del self.by_id[key]

    # -- POST

    async def post(self, body: bytes, ids: list[Any], initialize: bool = False) -> None:
        pending = {id_key(i): i for i in ids}
        headers = {**self.headers(), "Content-Type": "application/json"}
        if initialize:
            headers.pop("Mcp-Session-Id", None)
            headers.pop("MCP-Protocol-Version", None)
        reason = "the server's answer ended before the response"
        try:
            async with self.http.stream("POST", self.url, content=body, headers=headers) as response:
                if initialize and (sid := header_value(response.headers.get("mcp-session-id"))):
                    self.session_id = sid
                status = response.status_code
                kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
                if kind == "text/event-stream" and 200 <= status < 300:
                    async for event in self._events(response):
                        self._emit_data(event.data, pending)
                elif status != 202:
                    self._emit_body(await _read(response, MAX_ANSWER), pending)
                if status >= 300:
                    reason = f"the gateway answered HTTP {status}"
                    self.say(f"POST: HTTP {status}")
        except httpx.ConnectError:
            reason = self.unreachable or "the sidecar could not be reached (ConnectError)"
            self.say(reason)
        except (httpx.HTTPError, EventTooLarge, LineTooLong) as exc:
            reason = f"the sidecar's gateway failed ({type(exc).__name__})"
            self.say(f"POST failed: {type(exc).__name__}")
        except McpcredsError as exc:  # UntrustedSidecar: nothing was sent
            reason = exc.message
            self.say(exc.message)
        for id_ in pending.values():
            self.out.write(error(id_, GATEWAY_ERROR, reason))

    def _emit_body(self, body: bytes, pending: dict[str, Any]) -> None:
        if not body.strip():
            return
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            self.say("an answer that is not JSON was dropped")
            return
        self._emit(message, pending)

    def _emit_data(self, data: str, pending: dict[str, Any]) -> None:
        if not data.strip():
            return  # a priming event (an id, no message)
        try:
            message = json.loads(data)
        except (ValueError, RecursionError):
            self.say("an SSE event that is not JSON was dropped")
            return
        self._emit(message, pending)

    def _emit(self, message: Any, pending: dict[str, Any]) -> None:
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
        self.out.write(message)

    async def _events(self, response: httpx.Response) -> AsyncIterator[SseEvent]:
        parser = SseParser()
        async for chunk in response.aiter_bytes():
            for event in parser.feed(chunk):
                yield event

    # -- the server's GET stream

    async def listen(self) -> None:
        """Server-initiated messages, until the session ends; resumed with Last-Event-ID."""
        last_id: str | None = None
        failures = 0
        while failures < GET_RETRIES:
            headers = self.headers("text/event-stream")
            if last_id is not None:
                headers["Last-Event-ID"] = last_id
            try:
                async with self.http.stream("GET", self.url, headers=headers) as response:
                    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
                    if response.status_code == 405:
                        return  # this server sends nothing unasked
                    if response.status_code != 200 or kind != "text/event-stream":
                        self.say(f"GET stream: HTTP {response.status_code}; not listening")
                        return
                    async for event in self._events(response):
                        failures = 0
                        last_id = event.id or last_id
                        self._emit_data(event.data, {})
            except (httpx.HTTPError, EventTooLarge, McpcredsError) as exc:
                self.say(f"GET stream ended: {type(exc).__name__}")
            failures += 1
            await asyncio.sleep(min(0.5 * 2 ** failures, 8.0))
        self.say("GET stream: giving up")

    # -- the end

    async def finish(self, wait: bool) -> None:
        """Answer what is in flight (if `wait`), stop listening, end the session."""
        if wait and self.inflight:
            await asyncio.gather(*self.inflight, return_exceptions=True)
        for task in (*self.inflight, *([self.listener] if self.listener else [])):
            task.cancel()
        if self.session_id is None:
            return
        try:
            response = await self.http.delete(self.url, headers=self.headers(), timeout=DELETE_TIMEOUT)
            if response.status_code not in (200, 202, 204, 404, 405):
                self.say(f"DELETE: HTTP {response.status_code}")
        except (httpx.HTTPError, McpcredsError) as exc:
            self.say(f"DELETE failed: {type(exc).__name__}")


async def _read(response: httpx.Response, limit: int) -> bytes:
    parts, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise LineTooLong(f"an answer over {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


# ---------------------------------------------------------------------------- I/O


Lines = asyncio.Queue[bytes | LineTooLong | None]


def _read_stdin(fd: int, loop: asyncio.AbstractEventLoop, queue: Lines) -> None:
    """In a thread: stdin's lines into `queue` (None at EOF), waiting while the relay is behind.
    Raw reads on the descriptor: no lock of sys.stdin is held if the process exits meanwhile."""
    splitter = LineSplitter()

    def put(item: bytes | LineTooLong | None) -> None:
        asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()

    try:
        while data := os.read(fd, READ_CHUNK):
            for line in splitter.feed(data):
                put(line)
        for line in splitter.end():
            put(line)
    except (OSError, RuntimeError):  # stdin closed under us, or the loop is gone
        pass
    with contextlib.suppress(RuntimeError):
        put(None)


async def relay(http: httpx.AsyncClient, name: str, out: Output, say: Say, stdin_fd: int = 0,
                unreachable: str = "") -> None:
    loop = asyncio.get_running_loop()
    queue: Lines = asyncio.Queue(maxsize=16)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    threading.Thread(target=_read_stdin, args=(stdin_fd, loop, queue), daemon=True,
                     name="mcpcreds-stdin").start()
    r = Relay(http, gateway_url(name), out, say, unreachable)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while True:
            got = asyncio.ensure_future(queue.get())
            await asyncio.wait({got, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not got.done():
                got.cancel()
                break
            item = got.result()
            if item is None:
                break
            line = asyncio.ensure_future(r.line(item))
            await asyncio.wait({line, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not line.done():
                line.cancel()
                break
        await r.finish(wait=not stop.is_set())
    finally:
        stopped.cancel()


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

    async def main() -> None:
        # no read timeout: a tool may run long, and the server's GET stream may idle
        timeout = httpx.Timeout(30.0, read=None)
        async with gateway_http_client("httpx", socket_path, sidecar_uid, name, grant_headers,
                                       timeout=timeout) as http:
            await relay(http, name, out, say, unreachable=unreachable_text(socket_path))

    asyncio.run(main())
    return 0
