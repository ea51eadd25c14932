"""The gateway's protocol logic, apart from any I/O (pure): JSON-RPC messages, permits, the tool
policy, Server-Sent Events, and masking the credentials the gateway sent.

- `parse_body` reads what a client POSTs to `/mcp/{server}`: one JSON-RPC message or a batch.
- `permits` counts the permits a POST takes: one per request (an object with `method` and
  `id`) whose method is counted (`rate_methods`, or every method); notifications and responses
  take none.
- `refusals` applies the server's trust policy to the `tools/call` requests. A batch with a
  refused call is refused whole (nothing of it is forwarded): each refused call is answered
  with -32602 naming the policy, each other request with -32600 saying why it was not sent.
  An answer never repeats the tool name the caller sent (the redactor would make an echo an
  oracle for guessed secrets); the request `id` is echoed verbatim, as JSON-RPC requires.
- A grant may narrow a server's tools further (`granted`: the tool names it allows there, or
  None): a call outside it is refused like one outside the policy, and listings show only the
  tools both allow.
- `Inspector` follows an upstream answer (a JSON body, or SSE events one by one): a result with
  a `tools` array (a `tools/list` page) is filtered to the tools the policy (and the grant)
  exposes, whatever stream it comes on; the answers to `tools/call` requests are reported (for
  the audit); every credential value the gateway sent is masked.
- `SseSplitter` cuts a byte stream into complete SSE events, without changing a byte of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..core.policy import TrustPolicy

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
GATEWAY_ERROR: Final = -32000  # a failure of the gateway or of the upstream, not of the request

TOOLS_CALL: Final = "tools/call"
TOOLS_LIST: Final = "tools/list"
MASK: Final = b"***"
MIN_MASKED: Final = 8  # shorter values are not masked: they would mangle ordinary text

IdKey = tuple[str, Any]  # ("s", "abc") or ("n", 7): a JSON-RPC id, with "1" and 1 kept apart


class JsonRpcError(Exception):
    """A POST body that is not JSON-RPC: answered with HTTP 400 and this error, id null."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def id_key(value: Any) -> IdKey:
    return ("s", value) if isinstance(value, str) else ("n", value)


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _no_constant(text: str) -> Any:
    raise ValueError("NaN and Infinity are not JSON")


def loads(data: bytes | str) -> Any:
    """Strict JSON: NaN and Infinity refused, nesting bounded by the interpreter (ValueError)."""
    try:
        return json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deep") from None


def dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


# ---------------------------------------------------------------------------- what a client sends


@dataclass(frozen=True, slots=True)
class Message:
    raw: dict[str, Any]
    kind: str  # "request", "notification" or "response"

    @property
    def method(self) -> str | None:
        method = self.raw.get("method")
        return method if isinstance(method, str) else None

    @property
    def id(self) -> Any:
        return self.raw.get("id")

    @property
    def tool(self) -> str | None:
        """The tool a `tools/call` request names (None if it names none)."""
        params = self.raw.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        return name if isinstance(name, str) else None


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One POST body: its messages, and whether they came as a batch (an array)."""

    messages: tuple[Message, ...]
    batch: bool

    @property
    def requests(self) -> list[Message]:
        return [m for m in self.messages if m.kind == "request"]

    @property
    def single_id(self) -> Any:
        """The id of the request, when the body is one request (for errors about the whole POST)."""
        if not self.batch and self.messages and self.messages[0].kind == "request":
            return self.messages[0].id
        return None

    def tool_calls(self) -> dict[IdKey, str]:
        """id -> tool name of each `tools/call` request."""
        return {id_key(m.id): m.tool or "" for m in self.requests if m.method == TOOLS_CALL}

    def methods(self) -> dict[IdKey, str]:
        return {id_key(m.id): m.method or "" for m in self.requests}


def _message(item: Any) -> Message:
    if not isinstance(item, dict) or item.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, "Invalid Request: each message must be a JSON-RPC 2.0 object")
    if "method" in item:
        if not isinstance(item["method"], str) or not item["method"]:
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: method must be a non-empty string")
        if "params" in item and not isinstance(item["params"], dict | list):
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: params must be an object or an array")
        if "id" not in item:
            return Message(item, "notification")
        if not _valid_id(item["id"]):
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
        return Message(item, "request")
    if "id" in item and ("result" in item) != ("error" in item):
        if item["id"] is not None and not _valid_id(item["id"]):
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
        return Message(item, "response")
    raise JsonRpcError(INVALID_REQUEST, "Invalid Request: neither a request, a notification nor a response")


def parse_body(body: bytes) -> Outgoing:
    """The JSON-RPC message or batch of a POST; JsonRpcError (-32700 / -32600) if it is none."""
    try:
        data = loads(body)
    except (ValueError, UnicodeDecodeError):
        raise JsonRpcError(PARSE_ERROR, "Parse error: the body is not valid JSON") from None
    if isinstance(data, list):
        if not data:
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: an empty batch")
        messages = tuple(_message(item) for item in data)
        ids = [id_key(m.id) for m in messages if m.kind == "request"]
        if len(set(ids)) != len(ids):
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: two requests of the batch share an id")
        return Outgoing(messages, True)
    return Outgoing((_message(data),), False)


def permits(out: Outgoing, rate_methods: Sequence[str] | None) -> int:
    """Permits the POST takes: one per request whose method is counted."""
    return sum(1 for m in out.requests if rate_methods is None or m.method in rate_methods)


def error(id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": err}


def policy_text(policy: TrustPolicy) -> str:
    """The policy in words, for a refusal (configured values only)."""
    if policy.trust == "untrusted" and policy.tool_allowlist is None:
        if policy.allow_untrusted_without_allowlist:
            return "trust = untrusted, every tool allowed"
        return "trust = untrusted and no tool_allowlist: no tool is exposed"
    if policy.trust != "trusted" and not policy.tool_allowlist:
        return f"trust = {policy.trust} and no tool_allowlist: no tool is exposed"
    expected = " and expected_tools" if policy.expected_tools and policy.trust != "trusted" else ""
    return f"trust = {policy.trust}: only the tools of its tool_allowlist{expected} are exposed"


def refusals(out: Outgoing, policy: TrustPolicy, server: str,
             granted: frozenset[str] | None = None) -> list[dict[str, Any]]:
    """The answers that refuse this POST, or [] if it may be forwarded (see the module doc)."""
    refused: dict[IdKey, dict[str, Any]] = {}
    for m in out.requests:
        if m.method != TOOLS_CALL:
            continue
        tool = m.tool
        if tool is None:
            refused[id_key(m.id)] = error(m.id, INVALID_PARAMS, "tools/call refused by the gateway: "
                                          "params.name must name a tool (a string)")
        elif not policy.allows(tool):
            refused[id_key(m.id)] = error(m.id, INVALID_PARAMS, "tools/call refused by the gateway: that "
                                          f"tool is not exposed by the trust policy of server {server!r} "
                                          f"({policy_text(policy)})", {"policy": policy.trust})
        elif granted is not None and tool not in granted:
            refused[id_key(m.id)] = error(m.id, INVALID_PARAMS, "tools/call refused by the gateway: that "
                                          f"tool is not among the tools the caller's grant allows on server "
                                          f"{server!r}", {"policy": "grant"})
    if not refused:
        return []
    answers = []
    for m in out.requests:
        answer = refused.get(id_key(m.id))
        if answer is None:
            answer = error(m.id, INVALID_REQUEST, "not sent: its batch holds a tools/call that the gateway "
                           "refuses, and a batch is forwarded whole or not at all")
        answers.append(answer)
    return answers


# ---------------------------------------------------------------------------- masking


def mask_forms(values: Iterable[str]) -> tuple[bytes, ...]:
    """The byte spellings of credential values to mask: each value, its token after an auth scheme
    (`Bearer x`: `x` too), and their JSON-escaped forms; longest first, short ones left out."""
    forms: set[bytes] = set()
    for value in values:
        candidates = {value}
        scheme, _, rest = value.partition(" ")
        if rest.strip() and scheme.isalpha():
            candidates.add(rest.strip())
        for candidate in candidates:
            if len(candidate) < MIN_MASKED:
                continue
            escaped = json.dumps(candidate)[1:-1]
            for form in (candidate, escaped, escaped.replace("/", "\\/")):
                forms.add(form.encode("utf-8", "replace"))
    return tuple(sorted(forms, key=len, reverse=True))


def mask(data: bytes, forms: Sequence[bytes]) -> bytes:
    for form in forms:
        if form in data:
            data = data.replace(form, MASK)
    return data


# ---------------------------------------------------------------------------- SSE


# a line end, then an empty line: CR LF is one line end, never a CR and an LF
_BLANK_LINE: Final = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r|\n)")
_LINE: Final = re.compile(rb"\r\n|\r|\n")


class EventTooLarge(ValueError):
    pass


class SseSplitter:
    """Complete SSE events (each with the blank line that ends it), byte for byte as received.

    An event longer than `limit` raises EventTooLarge: memory stays bounded whatever the
    upstream sends. What is left when the stream ends (`rest`) is an incomplete event, which a
    client would discard: it is not forwarded.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = b""
        self.scanned = 0  # the buffer up to here holds no event end (minus a possible \r)

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self.buffer + data if self.buffer else data
        events = []
        start = 0
        pos = max(0, self.scanned - 2)
        while (found := _BLANK_LINE.search(buffer, pos)) is not None:
            # a final CR may be the start of a CR LF: the LF then opens the next event, as an empty
            # line a client ignores (holding the event back instead could delay it indefinitely)
            events.append(buffer[start:found.end()])
            start = pos = found.end()
        self.buffer = buffer[start:]
        self.scanned = len(self.buffer)
        if len(self.buffer) > self.limit:
            raise EventTooLarge(f"an SSE event exceeds {self.limit} bytes")
        return events

    def rest(self) -> bytes:
        return self.buffer


@dataclass(slots=True)
class SseEvent:
    lines: list[bytes]  # the event's lines, without line ends
    data: str | None  # the joined data lines, None if the event has none

    @classmethod
    def parse(cls, raw: bytes) -> SseEvent:
        lines = _LINE.split(raw)
        data: list[str] = []
        for line in lines:
            if line.startswith(b"data"):
                name, _, value = line.partition(b":")
                if name == b"data":
                    data.append(value[1:].decode("utf-8", "replace") if value.startswith(b" ")
                                else value.decode("utf-8", "replace"))
        return cls([line for line in lines if line], "\n".join(data) if data else None)

    @property
    def is_message(self) -> bool:
        for line in self.lines:
            name, _, value = line.partition(b":")
            if name == b"event":
                return value.strip() in (b"", b"message")
        return True

    def with_data(self, data: bytes) -> bytes:
        """The event with its data replaced (its id, event and retry fields kept)."""
        kept = [line for line in self.lines if not line.startswith(b"data")]
        return b"\n".join([*kept, b"data: " + data]) + b"\n\n"


# ---------------------------------------------------------------------------- answers


@dataclass(slots=True)
class Inspector:
    """Follows the upstream's answer to one request (see the module doc).

    `pending`: id -> method of the requests the POST forwarded (empty for a GET stream).
    `on_answer(id_key, method, status)` is called once per answered request, with the status
    `ok`, `tool_error` (a tool result with isError) or `error:<code>`.
    """

    policy: TrustPolicy
    forms: tuple[bytes, ...] = ()
    pending: dict[IdKey, str] = field(default_factory=dict)
    on_answer: Callable[[IdKey, str, str], None] | None = None
    on_warnings: Callable[[list[str]], None] | None = None
    limit: int = 16 * 1024 * 1024
    granted: frozenset[str] | None = None  # the tools a grant narrows the server to (None: no narrowing)

    def json_body(self, body: bytes) -> bytes:
        """A whole application/json answer (one message or a batch), filtered and masked."""
        try:
            data = loads(body)
        except (ValueError, UnicodeDecodeError):
            return mask(body, self.forms)
        if isinstance(data, list):
            changed = [self._message(item) for item in data]
            if any(c for c, _ in changed):
                return mask(dumps([m for _, m in changed]), self.forms)
        else:
            did, message = self._message(data)
            if did:
                return mask(dumps(message), self.forms)
        return mask(body, self.forms)

    def event(self, raw: bytes) -> bytes:
        """One complete SSE event, rewritten if its message changed, masked either way."""
        parsed = SseEvent.parse(raw)
        if parsed.data is None or not parsed.is_message:
            return mask(raw, self.forms)
        try:
            data = loads(parsed.data)
        except (ValueError, UnicodeDecodeError):
            return mask(raw, self.forms)
        if isinstance(data, list):
            changed = [self._message(item) for item in data]
            if any(c for c, _ in changed):
                return mask(parsed.with_data(dumps([m for _, m in changed])), self.forms)
        else:
            did, message = self._message(data)
            if did:
                return mask(parsed.with_data(dumps(message)), self.forms)
        return mask(raw, self.forms)

    def _message(self, message: Any) -> tuple[bool, Any]:
        """(changed, message): a tools/list result filtered; an answer to a pending request noted."""
        if not isinstance(message, dict) or "method" in message or "id" not in message:
            return False, message
        key = id_key(message.get("id"))
        method = self.pending.pop(key, None) if _valid_id(message.get("id")) else None
        result = message.get("result")
        changed = False
        if isinstance(result, dict) and isinstance(result.get("tools"), list):
            filtered = self._filter_tools(result["tools"])
            if filtered is not None:
                message = {**message, "result": {**result, "tools": filtered}}
                changed = True
        if method is not None and self.on_answer is not None:
            self.on_answer(key, method, answer_status(message))
        return changed, message

    def _filter_tools(self, tools: list[Any]) -> list[Any] | None:
        """The tools the policy (and the grant) expose, in the server's order (None if nothing is
        removed)."""
        names = [str(t["name"]) for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]
        decision = self.policy.filter(names)
        if decision.warnings and self.on_warnings is not None:
            self.on_warnings(decision.warnings)
        allowed = set(decision.tools)
        if self.granted is not None:
            allowed &= self.granted
        kept = [t for t in tools if isinstance(t, dict) and t.get("name") in allowed]
        return None if len(kept) == len(tools) else kept


def answer_status(message: Mapping[str, Any]) -> str:
    err = message.get("error")
    if isinstance(err, dict):
        code = err.get("code")
        return f"error:{code}" if isinstance(code, int) and not isinstance(code, bool) else "error"
    result = message.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return "tool_error"
    return "ok"
