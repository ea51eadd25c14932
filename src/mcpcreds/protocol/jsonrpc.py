"""The gateway's protocol logic, apart from any I/O (pure): JSON-RPC messages, permits, the tool
policy, and the answers the gateway lets through.

Forward only what was checked: every message, both ways, is read once (`strict_json`), judged, and
written anew from what was read; what cannot be read so is refused, never passed on.

- `parse_body` reads what a client POSTs to `/mcp/{server}`: one JSON-RPC message or a batch, and
  the body to forward (`Outgoing.body`, re-serialised). A key that a lenient decoder would read as
  a member the gateway judges (`Name` beside `name`, `PARAMS`, a long s for `s`) is refused, and so is a
  `tools/call` notification (no id: its answer, and so its audit, would never come).
- `permits` counts the permits a POST takes: one per request (an object with `method` and
  `id`) whose method is counted (`rate_methods`, or every method but the task methods, whose
  polls follow a call already counted); notifications, responses and the retries of an input
  round (2026-07-28: its first request took the permit) take none.
- `refusals` applies the server's trust policy to the `tools/call` requests. A batch with a
  refused call is refused whole (nothing of it is forwarded): each refused call is answered
  with -32602 naming the policy, each other request with -32600 saying why it was not sent.
  An answer never repeats the tool name the caller sent; the request `id` is echoed verbatim,
  as JSON-RPC requires.
- A grant may narrow a server's tools further (`granted`: the tool names it allows there, or
  None): a call outside it is refused like one outside the policy, and listings show only the
  tools both allow.
- `Inspector` follows an upstream answer (a JSON body, or SSE events one by one): each message
  must be JSON-RPC, read strictly; a result with a `tools` array (a `tools/list` page) is filtered
  to the tools the policy (and the grant) expose, whatever stream it comes on; the answers to
  `tools/call` requests are reported (for the audit); every credential value the gateway sent is
  masked; the message is written anew. A JSON body that fails is withheld (`json_body` gives
  None), an SSE event that fails is dropped (`dropped` counts them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..core.policy import TrustPolicy, matches_any
from . import screen, strict_json
from .sse import BadEvent, SseEvent
from .strict_json import Masker, StrictJsonError, check_members

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
GATEWAY_ERROR: Final = -32000  # a failure of the gateway or of the upstream, not of the request
HEADER_MISMATCH: Final = -32020  # an Mcp-Method / Mcp-Name header that is not what the body says

TOOLS_CALL: Final = "tools/call"
TOOLS_LIST: Final = "tools/list"
# the members the gateway judges, at each level: no other key may read as one of them
MESSAGE_MEMBERS: Final = frozenset({"jsonrpc", "id", "method", "params", "result", "error"})
PARAMS_MEMBERS: Final = frozenset({"name", "arguments", "_meta", "uri", "taskId", "inputRequests",
                                   "inputResponses"})
RESULT_MEMBERS: Final = frozenset({"tools", "isError", "resultType", "inputRequests", "requestState",
                                   "taskId"})
TOOL_MEMBERS: Final = frozenset({"name"})

IdKey = tuple[str, Any]  # ("s", "abc") or ("n", 7): a JSON-RPC id, with "1" and 1 kept apart


class JsonRpcError(Exception):
    """A POST body that is not JSON-RPC: answered with HTTP 400 and this error, id null."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def id_key(value: Any) -> IdKey:
    return ("s", value) if isinstance(value, str) else ("n", value)


def valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


loads = strict_json.loads
dumps = strict_json.dumps


# ---------------------------------------------------------------------------- what a client sends


@dataclass(frozen=True, slots=True)
class Message:
    raw: dict[str, Any]
    kind: str  # "request", "notification" or "response"
    # read once from `raw` (asked for several times a message)
    method: str | None = field(init=False)
    id: Any = field(init=False)
    tool: str | None = field(init=False)  # the tool a `tools/call` request names (None if it names none)

    def __post_init__(self) -> None:
        raw = self.raw
        method = raw.get("method")
        params = raw.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        object.__setattr__(self, "method", method if isinstance(method, str) else None)
        object.__setattr__(self, "id", raw.get("id"))
        object.__setattr__(self, "tool", name if isinstance(name, str) else None)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One POST body: its messages, whether they came as a batch (an array), and the body that
    goes upstream (written anew from the messages)."""

    messages: tuple[Message, ...]
    batch: bool
    body: bytes = b""
    requests: tuple[Message, ...] = field(init=False)  # the messages that are requests

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(m for m in self.messages if m.kind == "request"))

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
    """One JSON-RPC message, client's or server's; JsonRpcError if it is none."""
    if not isinstance(item, dict) or item.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, "Invalid Request: each message must be a JSON-RPC 2.0 object")
    try:
        check_members(item, MESSAGE_MEMBERS)
        if isinstance(item.get("params"), dict):
            check_members(item["params"], PARAMS_MEMBERS)
    except StrictJsonError as exc:
        raise JsonRpcError(INVALID_REQUEST, f"Invalid Request: {exc}") from None
    if "method" in item:
        if not isinstance(item["method"], str) or not item["method"]:
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: method must be a non-empty string")
        if "params" in item and not isinstance(item["params"], dict | list):
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: params must be an object or an array")
        if "id" not in item:
            if item["method"] == TOOLS_CALL:
                raise JsonRpcError(INVALID_REQUEST,
                                   "Invalid Request: a tools/call must be a request (with an id)")
            return Message(item, "notification")
        if not valid_id(item["id"]):
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
        return Message(item, "request")
    if "id" in item and ("result" in item) != ("error" in item):
        if item["id"] is not None and not valid_id(item["id"]):
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
        return Message(item, "response")
    raise JsonRpcError(INVALID_REQUEST, "Invalid Request: neither a request, a notification nor a response")


def parse_body(body: bytes) -> Outgoing:
    """The JSON-RPC message or batch of a POST; JsonRpcError (-32700 / -32600) if it is none."""
    try:
        data = loads(body)
        forwarded = dumps(data)
    except StrictJsonError as exc:
        raise JsonRpcError(PARSE_ERROR, f"Parse error: the body is not JSON the gateway reads one way only "
                                        f"({exc})") from None
    if isinstance(data, list):
        if not data:
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: an empty batch")
        messages = tuple(_message(item) for item in data)
        ids = [id_key(m.id) for m in messages if m.kind == "request"]
        if len(set(ids)) != len(ids):
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: two requests of the batch share an id")
        return Outgoing(messages, True, forwarded)
    return Outgoing((_message(data),), False, forwarded)


# what follows a request already counted: polling a task (2026-07-28's extension, 2025-11-25's core)
TASK_METHODS: Final = frozenset({"tasks/get", "tasks/result", "tasks/list", "tasks/update", "tasks/cancel"})


def permits(out: Outgoing, rate_methods: Sequence[str] | None, free: frozenset[IdKey] = frozenset()) -> int:
    """Permits the POST takes: one per request whose method is counted. Every method is, when
    `rate_methods` is None, but the task methods; none of the `free` requests is (the retries of
    an input round, whose first request took its permit)."""
    return sum(1 for m in out.requests if id_key(m.id) not in free and (
        m.method not in TASK_METHODS if rate_methods is None else m.method in rate_methods))


def error(id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": err}


def policy_text(policy: TrustPolicy) -> str:
    """The policy in words, for a refusal (configured values only)."""
    excluded = " less its tool_exclude" if policy.tool_exclude or policy.ceiling_exclude else ""
    ceiling = " within its catalog entry's tool_allowlist" if policy.ceiling_allow else ""
    allowlist = policy.effective_allowlist
    if policy.trust == "untrusted" and allowlist is None:
        if policy.allow_untrusted_without_allowlist:
            return f"trust = untrusted, every tool allowed{excluded}"
        return "trust = untrusted and no tool_allowlist: no tool is exposed"
    if policy.trust != "trusted" and not allowlist:
        return f"trust = {policy.trust} and no tool_allowlist: no tool is exposed"
    if policy.trust == "trusted":
        return f"trust = trusted: every tool{ceiling}{excluded} is exposed"
    expected = " and expected_tools" if policy.expected_tools else ""
    return (f"trust = {policy.trust}: only the tools of its tool_allowlist{expected}{ceiling}{excluded} "
            "are exposed")


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
        elif granted is not None and not matches_any(granted, tool):
            refused[id_key(m.id)] = error(m.id, INVALID_PARAMS, "tools/call refused by the gateway: that "
                                          f"tool is not among the tools the caller's grant allows on server "
                                          f"{server!r}", {"policy": "grant"})
    return whole_batch(out, refused)


def whole_batch(out: Outgoing, refused: Mapping[IdKey, dict[str, Any]]) -> list[dict[str, Any]]:
    """The answers of a POST some of whose requests are `refused` (id -> its refusal; [] when
    none is): a batch is forwarded whole or not at all, so each other request gets -32600."""
    if not refused:
        return []
    not_sent = ("not sent: its batch holds a tools/call that the gateway refuses, and a batch is forwarded "
                "whole or not at all")
    return [refused.get(id_key(m.id)) or error(m.id, INVALID_REQUEST, not_sent) for m in out.requests]


# ---------------------------------------------------------------------------- answers

_MEDIA: Final = {"application/json": "json", "text/event-stream": "sse"}


def answer_kind(content_type: str) -> str | None:
    """"json" or "sse" for a Content-Type the gateway reads as exactly one of them (UTF-8), else None."""
    media, _, params = content_type.partition(";")
    kind = _MEDIA.get(media.strip().lower())
    if kind is None or "," in content_type:
        return None
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return None
    return kind


@dataclass(frozen=True, slots=True)
class Screening:
    """What the gateway does to the results of one server (the untrusted pipeline): `sanitize`
    listings and scan results for injections (servers that are not trusted), `block` a result that
    reads as one (else it is only reported), pass `media` (else it is withheld)."""

    sanitize: bool = False
    block: bool = False
    media: bool = True


class Answered(Exception):
    """A request of the server's that the gateway answers itself: not relayed."""


class Injection(Exception):
    def __init__(self, patterns: list[str]) -> None:
        super().__init__("a result that reads as a prompt injection")
        self.patterns = patterns


class Withheld(ValueError):
    """An upstream message the gateway will not pass on (not JSON-RPC read one way only)."""


@dataclass(slots=True)
class Inspector:
    """Follows the upstream's answer to one request (see the module doc).

    `pending`: id -> method of the requests the POST forwarded (empty for a GET stream).
    `on_answer(id_key, method, status)` is called once per answered request, with the status
    `ok`, `tool_error` (a tool result with isError) or `error:<code>`.
    """

    policy: TrustPolicy
    masker: Masker = field(default_factory=lambda: Masker(()))
    pending: dict[IdKey, str] = field(default_factory=dict)
    on_answer: Callable[[IdKey, str, str], None] | None = None
    on_warnings: Callable[[list[str]], None] | None = None
    limit: int = 16 * 1024 * 1024
    granted: frozenset[str] | None = None  # the tools a grant narrows the server to (None: no narrowing)
    dropped: int = 0  # SSE events withheld
    # a request of the server's own (elicitation, roots, sampling): the message to relay (as it
    # is or changed), or None when the gateway answers it itself and the client never sees it
    on_server_request: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    screening: Screening = field(default_factory=Screening)
    # the pinned definitions' judgement of a listing (after the policy's filter): the tools to pass on
    on_tools: Callable[[list[Any]], list[Any]] | None = None
    # a listing as the server sent it (before any filter), and whether more pages follow (nextCursor)
    on_listed: Callable[[list[Any], bool], None] | None = None
    # an input_required result (2026-07-28) as the client is to see it (see `on_server_request`)
    on_input_required: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # any other result or notification params with `inputRequests` (a task's, its extension's)
    on_task_input: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # what the screening did: ("sanitized", hits), ("injection", pattern names), ("media", types)
    on_screened: Callable[[str, list[Any]], None] | None = None
    # every tools array that passes, as the client sees it (the x-mcp-header annotations are learned)
    on_listing: Callable[[list[Any]], None] | None = None
    # the answer to a pending request as the server sent it (checked, before any filter): its method,
    # and its result (None: an error)
    on_result: Callable[[str, dict[str, Any] | None], None] | None = None
    # the method of each notification of the server's (a list changed: its cached results stale)
    on_notification: Callable[[str], None] | None = None

    def json_body(self, body: bytes) -> bytes | None:
        """A whole application/json answer (one message or a batch), checked, filtered, masked and
        written anew; None if it is withheld."""
        try:
            return self._written(self._document(loads(body)))
        except (StrictJsonError, Withheld):
            return None

    def event(self, raw: bytes) -> bytes:
        """One complete SSE event written anew from what was read (b"" if it is dropped: not a
        message event, or a message that is not JSON-RPC read one way only)."""
        try:
            parsed = SseEvent.parse(raw)
            if not parsed.is_message:
                raise Withheld("an event that is not a message")
            if not parsed.data:  # a keep-alive, or a priming event (an id, empty data)
                return parsed.write(None if parsed.data is None else b"")
            return parsed.write(self._written(self._document(loads(parsed.data))))
        except Answered:
            return b""
        except (BadEvent, StrictJsonError, Withheld):
            self.dropped += 1
            return b""

    def _document(self, data: Any) -> Any:
        if isinstance(data, list):
            if not data:
                raise Withheld("an empty batch")
            return [self._message(item) for item in data]
        return self._message(data)

    def _message(self, message: Any) -> Any:
        """The message checked; a tools/list result filtered; an answer to a pending request
        noted; credentials masked."""
        try:
            kind = _message(message).kind
        except JsonRpcError as exc:
            raise Withheld(exc.message) from None
        if kind == "request" and self.on_server_request is not None:
            relayed = self.on_server_request(message)
            if relayed is None:
                raise Answered
            message = relayed
        elif kind == "notification":
            if self.on_notification is not None:
                self.on_notification(message["method"])
            if self.on_task_input is not None and isinstance(
                    message.get("params"), dict) and "inputRequests" in message["params"]:
                try:
                    message = {**message, "params": self.on_task_input(message["params"])}
                except screen.Refused:
                    raise Withheld("a task's input request the policy refuses") from None
        if kind == "response":
            key = id_key(message.get("id"))
            method = self.pending.pop(key, None) if valid_id(message.get("id")) else None
            result = message.get("result")
            if method is not None and self.on_result is not None and "error" in message:
                self.on_result(method, None)
            if isinstance(result, dict):
                try:
                    check_members(result, RESULT_MEMBERS)
                except StrictJsonError as exc:
                    raise Withheld(str(exc)) from None
                if method is not None and self.on_result is not None:
                    self.on_result(method, result)
                if isinstance(result.get("tools"), list):
                    tools = self._filter_tools(result["tools"])
                    if self.on_listed is not None:
                        self.on_listed(result["tools"], result.get("nextCursor") is not None)
                    result = {**result, "tools": self.on_tools(tools) if self.on_tools is not None else tools}
                    if self.on_listing is not None:
                        self.on_listing(result["tools"])
                try:
                    message = {**message, "result": self._screen(self._input(result))}
                except Injection as found:
                    message = error(message.get("id"), GATEWAY_ERROR, "the MCP server's result was withheld "
                                    "by the gateway: it reads as a prompt injection (on_injection = block)",
                                    {"code": "injection", "patterns": found.patterns})
                except screen.Refused as refused:  # nothing of what it asked reaches the client
                    message = error(message.get("id"), GATEWAY_ERROR, str(refused),
                                    {"policy": refused.policy})
            if method is not None and self.on_answer is not None:
                self.on_answer(key, method, answer_status(message))
        return message

    def _input(self, result: dict[str, Any]) -> dict[str, Any]:
        """A result asking for input (2026-07-28: input_required, or a task's) as the client is to
        see it; screen.Refused when it asks what the policy refuses."""
        if result.get("resultType") == "input_required" and self.on_input_required is not None:
            return self.on_input_required(result)
        if "inputRequests" in result and self.on_task_input is not None:
            return self.on_task_input(result)
        return result

    def _written(self, document: Any) -> bytes:
        """The document as JSON text, every credential value the gateway sent masked."""
        written = dumps(document)
        if not self.masker.present(written):
            return written
        if isinstance(document, list):
            return dumps([self._masked(m) for m in document])
        return dumps(self._masked(document))

    def _masked(self, message: dict[str, Any]) -> dict[str, Any]:
        # the id is the client's own: never masked (see Masker)
        return {k: v if k == "id" else self.masker.value(v) for k, v in message.items()}

    def _screen(self, result: dict[str, Any]) -> dict[str, Any]:
        """A result as the screening leaves it: listings sanitized, media withheld, injections
        reported (or the result replaced by an error, when they block)."""
        screening = self.screening
        listing = any(key in result for key in screen.LISTINGS)
        if screening.sanitize and listing:
            result, hits = screen.sanitize_listing(result)
            if hits:
                self._screened("sanitized", hits)
        if not screening.media:
            result, withheld = screen.withhold_media(result)
            inner = result.get("result")
            if result.get("status") == "completed" and isinstance(inner, dict):  # a task's, from tasks/get
                inner, more = screen.withhold_media(inner)
                result, withheld = {**result, "result": inner}, withheld + more
            if withheld:
                self._screened("media", withheld)
        if screening.sanitize and not listing and (found := screen.scan_result(result)):
            self._screened("injection", found)
            if screening.block:
                raise Injection(found)
        return result

    def _screened(self, kind: str, what: list[Any]) -> None:
        if self.on_screened is not None:
            self.on_screened(kind, what)

    def _filter_tools(self, tools: list[Any]) -> list[Any]:
        """The tools the policy (and the grant) expose, in the server's order."""
        for tool in tools:
            if isinstance(tool, dict):
                try:
                    check_members(tool, TOOL_MEMBERS)
                except StrictJsonError as exc:
                    raise Withheld(str(exc)) from None
        names = [str(t["name"]) for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]
        decision = self.policy.filter(names)
        if decision.warnings and self.on_warnings is not None:
            self.on_warnings(decision.warnings)
        allowed = set(decision.tools)
        if self.granted is not None:
            allowed = {name for name in allowed if matches_any(self.granted, name)}
        return [t for t in tools if isinstance(t, dict) and t.get("name") in allowed]


def _rebuilt(out: Outgoing, messages: Sequence[Message]) -> Outgoing:
    """`out` with these messages, its body re-serialised from them."""
    raws = [m.raw for m in messages]
    return Outgoing(tuple(messages), out.batch, dumps(raws if out.batch else raws[0]))


def rewrite_params(out: Outgoing, wanted: Callable[[dict[str, Any]], bool],
                   rewrite: Callable[[dict[str, Any]], dict[str, Any]]) -> Outgoing:
    """`out` with the params of each request for which `wanted(params)` holds rewritten (and the
    body re-serialised); `out` itself when none is."""
    changed = False
    messages = []
    for m in out.messages:
        params = m.raw.get("params")
        if m.kind == "request" and isinstance(params, dict) and wanted(params):
            m = Message({**m.raw, "params": rewrite(params)}, m.kind)
            changed = True
        messages.append(m)
    if not changed:
        return out
    return _rebuilt(out, messages)


def without_responses(out: Outgoing, ids: set[IdKey]) -> Outgoing:
    """`out` without the responses of these ids (re-serialised)."""
    messages = tuple(m for m in out.messages if not (m.kind == "response" and id_key(m.id) in ids))
    if not messages:
        return Outgoing((), out.batch, b"")
    return _rebuilt(out, messages)


CLIENT_CAPABILITIES_META: Final = "io.modelcontextprotocol/clientCapabilities"  # 2026-07-28: per request


def kept_capabilities(caps: Mapping[str, Any], roots: bool, sampling: bool) -> dict[str, Any]:
    """Client capabilities as the gateway keeps them: `roots` declared when the gateway answers
    `roots/list` itself, `sampling` taken out when the server may not sample."""
    kept = {k: v for k, v in caps.items() if sampling or k != "sampling"}
    if roots:
        kept["roots"] = {"listChanged": True}
    return kept


def declare_capabilities(out: Outgoing, roots: bool, sampling: bool) -> Outgoing:
    """`out` with the client capabilities it declares as the gateway keeps them
    (`kept_capabilities`), whatever the client said: in an `initialize` (the 2025 revisions) and in
    each request's `_meta["io.modelcontextprotocol/clientCapabilities"]` (2026-07-28). An
    elicitation the server may not make is declined, not hidden: a server that requires the
    capability would fail the call instead. Sampling is hidden: a server that asks anyway is refused."""
    if not roots and sampling:
        return out

    def caps_of(m: Message) -> tuple[dict[str, Any], list[str]] | None:
        params = m.raw.get("params")
        if m.kind != "request" or not isinstance(params, dict):
            return None
        if m.method == "initialize" and isinstance(params.get("capabilities"), dict):
            return params["capabilities"], ["capabilities"]
        meta = params.get("_meta")
        if isinstance(meta, dict) and isinstance(meta.get(CLIENT_CAPABILITIES_META), dict):
            return meta[CLIENT_CAPABILITIES_META], ["_meta", CLIENT_CAPABILITIES_META]
        return None

    changed = False
    messages = []
    for m in out.messages:
        found = caps_of(m)
        new_caps = None if found is None else kept_capabilities(found[0], roots, sampling)
        if found is None or new_caps == found[0]:
            messages.append(m)
            continue
        path = found[1]
        params = dict(m.raw["params"])
        if len(path) == 1:
            params["capabilities"] = new_caps
        else:
            params["_meta"] = {**params["_meta"], path[1]: new_caps}
        messages.append(Message({**m.raw, "params": params}, m.kind))
        changed = True
    if not changed:
        return out
    return _rebuilt(out, messages)


def withheld_answer(pending: Mapping[IdKey, str], what: str, code: str = "upstream_error") -> Any:
    """The JSON-RPC error(s) that stand for an upstream answer the gateway withheld (or gave up
    waiting for): one per request still waiting (a batch if several), or one with id null."""
    message = (f"the MCP server's answer was withheld by the gateway: {what}" if code == "upstream_error"
               else f"the gateway gave up waiting for the MCP server: {what}")
    errors = [error(value, GATEWAY_ERROR, message, {"code": code}) for (_, value) in pending]
    if not errors:
        return error(None, GATEWAY_ERROR, message, {"code": code})
    return errors[0] if len(errors) == 1 else errors


def answer_status(message: Mapping[str, Any]) -> str:
    err = message.get("error")
    if isinstance(err, dict):
        code = err.get("code")
        return f"error:{code}" if isinstance(code, int) and not isinstance(code, bool) else "error"
    result = message.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return "tool_error"
    if isinstance(result, dict) and result.get("resultType") in ("input_required", "task"):
        return str(result["resultType"])  # asks for input (2026-07-28), or goes on as a task
    return "ok"
