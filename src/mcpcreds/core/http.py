"""HTTP as both sides speak it: a parsed request, an answer (whole or streamed) and how it is
written, and the JSON body of a request read with limits. No I/O: the sidecar's wire and the
gateway build on it, and the stdio bridge (a client) takes its body limit from here."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final, Protocol

from ..errors import InvalidRequest

# The gateway (`/mcp/{server}`) relays JSON-RPC bodies, bigger than the API's but bounded: a body
# is held whole, so it can be replayed when a request is retried (a renewed login, a 429).
GATEWAY_PREFIX: Final = b"/mcp/"


MAX_GATEWAY_BODY_BYTES: Final = 4 * 1024 * 1024


def holds(data: bytes, part: bytes) -> bool:
    """`part in data`, without its cost: on Python 3.11 `in` on bytes first reads `part` as an
    integer, and the TypeError it makes and drops costs several times the search itself."""
    return data.find(part) >= 0


def header_table(headers: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """Each header's value by its name (trimmed, lower-cased). A name sent more than once stands
    for b"\\0", which matches no value: a header meant once and sent twice is one too many."""
    table: dict[bytes, bytes] = {}
    for name, value in headers:
        key = name.strip().lower()
        table[key] = b"\0" if key in table else value
    return table


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    body: bytes
    authorization: str | None
    peer_uid: int
    peer_pid: int
    grant_only: bool = False  # the peer is in other namespaces than the sidecar's (an exec child)
    name: str = ""  # the {name} of the path, set by the router
    grant: Any = None  # the grants.Grant the caller presented, if any
    headers: tuple[tuple[bytes, bytes], ...] = ()  # every header as sent: for /mcp/ requests only
    trace_id: str | None = None  # its trace (32 hex digits) while traces are on: for its audit lines
    # `header_table()` of `headers`, made on first use: the gateway asks it several headers per call
    _table: tuple[tuple[tuple[bytes, bytes], ...], dict[bytes, bytes]] | None = field(
        default=None, repr=False, compare=False)

    def header_table(self) -> dict[bytes, bytes]:
        """`header_table` of this request's headers (read-only for the caller)."""
        cached = self._table
        if cached is None or cached[0] is not self.headers:
            cached = self._table = (self.headers, header_table(self.headers))
        return cached[1]

    @property
    def asker(self) -> tuple[str | int, ...]:
        """Who asks, for the order of a bucket's queue: a grant's holder, else the peer's process
        (its uid and pid; pid -1 on TCP, where the kernel gives none: one asker per uid)."""
        return ("grant", self.grant.id) if self.grant is not None else (self.peer_uid, self.peer_pid)


@dataclass(slots=True)
class Response:
    status: int
    body: bytes
    content_type: bytes = b"application/json"
    extra_headers: tuple[tuple[bytes, bytes], ...] = ()
    close: bool = False
    route: str = field(default="")

    def encode(self, keep_alive: bool, head_only: bool = False) -> bytes:
        """The answer on the wire; `head_only` for a HEAD request (RFC 9110 9.3.2: no content)."""
        head = _STATUS_LINES.get(self.status) or _status_line(self.status)
        parts = [head, b"Content-Type: ", self.content_type, b"\r\nContent-Length: ",
                 str(len(self.body)).encode()]
        for name, value in self.extra_headers:
            parts += [b"\r\n", name, b": ", value]
        parts.append(b"\r\n\r\n" if keep_alive else b"\r\nConnection: close\r\n\r\n")
        if not head_only:
            parts.append(self.body)
        return b"".join(parts)


class ResponseBody(Protocol):
    """What a StreamingResponse streams: chunks as they come; `aclose` releases what feeds it
    (called once the body is done, or never iterated because the client went away)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class StreamingResponse:
    """An answer whose body is written as it is produced (chunked transfer-encoding), chunk by
    chunk, with no buffering; the producer is paused while the client's transport is. A body
    that raises after the head was sent aborts the connection (the client sees a truncated
    answer, never a complete-looking one); one that ends is terminated cleanly.
    `long_lived` marks a listening stream (an SSE GET) that may never end: draining on stop does
    not wait for it. `first`: the body's first chunk, when the producer already has it: written
    with the head, in one write (the client reads both at once). `ended`: `first` is the whole
    body (the producer had all of it): head, body and end go in one write, and the body is only
    closed."""

    status: int
    body: ResponseBody
    content_type: bytes = b"text/event-stream"
    extra_headers: tuple[tuple[bytes, bytes], ...] = ()
    close: bool = False
    route: str = field(default="")
    long_lived: bool = False
    first: bytes = b""
    ended: bool = False

    def head(self, keep_alive: bool) -> bytes:
        head = _STATUS_LINES.get(self.status) or _status_line(self.status)
        parts = [head, b"Content-Type: ", self.content_type, b"\r\nTransfer-Encoding: chunked"]
        for name, value in self.extra_headers:
            parts += [b"\r\n", name, b": ", value]
        parts.append(b"\r\n\r\n" if keep_alive else b"\r\nConnection: close\r\n\r\n")
        return b"".join(parts)


Answer = Response | StreamingResponse


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


def json_response(data: Any, status: int = 200, route: str = "") -> Response:
    return Response(status, json.dumps(data, separators=(",", ":")).encode(), route=route)


def _not_json(text: str) -> float:
    raise ValueError(f"{text} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise ValueError("a number out of range")
    return value


def parse_json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (NaN, Infinity and numbers beyond a float refused)."""
    if not request.body.strip():
        return {}
    try:
        data = json.loads(request.body, parse_constant=_not_json, parse_float=_finite)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nesting too deep
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data


def seconds_field(body: dict[str, Any], field: str, default: float, low: float, high: float) -> float:
    """A finite number of seconds from `low` to `high` (never echoes what was sent)."""
    value = body.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequest(f"{field} must be a number of seconds from {low:g} to {high:g}")
    return float(value)


def text_field(body: dict[str, Any], field: str, limit: int) -> str | None:
    """An optional printable string of at most `limit` characters (never echoes what was sent)."""
    value = body.get(field)
    if value is not None and (not isinstance(value, str) or len(value) > limit or not value.isprintable()):
        raise InvalidRequest(f"{field} must be a printable string of at most {limit} characters")
    return value
