"""The request metadata headers of the Streamable HTTP transport (pure): what the headers a client
sends say about the body, checked, and the headers that go upstream, derived from the body the
gateway forwards.

- `Mcp-Method` mirrors the body's `method`, `Mcp-Name` its `params.name` (or `params.uri`) for
  `tools/call`, `prompts/get` and `resources/read`, its `params.taskId` for `tasks/get`,
  `tasks/update` and `tasks/cancel` (the tasks extension's routing header); in the 2026-07-28
  era `MCP-Protocol-Version` mirrors `_meta["io.modelcontextprotocol/protocolVersion"]`, and a
  `tools/call` argument whose schema property carries `x-mcp-header: NAME` is mirrored as
  `Mcp-Param-NAME`.
- A header the client sent that says otherwise is refused (`HeaderMismatch`, -32020): nothing
  is forwarded. What goes upstream is derived from the body, never the client's copy: a 2026-07-28
  request gets every header it requires, whether or not its client sent it; a request of the 2025
  revisions gets `Mcp-Method` / `Mcp-Name` only when its client sent them (they were not defined).
- Which arguments a tool mirrors is learned from the listings that pass (`ParamTable`, bounded):
  an `Mcp-Param-*` header of a tool the gateway has not seen listed, or that no annotation of it
  names, is not the gateway's to judge and goes on as sent (as HTTP asks of an intermediary).
- The other way, while traces are on: the gateway's trace context goes into the `_meta` of each
  request whose era carries it there (`with_trace`).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..core.http import holds
from . import jsonrpc

MODERN_VERSIONS: Final = frozenset({"2026-07-28"})  # the revisions of the per-request envelope
PROTOCOL_VERSION_META: Final = "io.modelcontextprotocol/protocolVersion"
TRACE_META: Final = ("traceparent", "tracestate")  # W3C trace context, unprefixed in _meta (SEP-414)
# the params member Mcp-Name mirrors, per method
NAMED_METHODS: Final = {"tools/call": ("name", "uri"), "prompts/get": ("name", "uri"),
                        "resources/read": ("name", "uri"), "tasks/get": ("taskId",),
                        "tasks/update": ("taskId",), "tasks/cancel": ("taskId",)}
HEADER_MISMATCH: Final = -32020
PARAM_PREFIX: Final = b"mcp-param-"
VERSION_HEADER: Final = b"mcp-protocol-version"
MAX_TOOLS: Final = 16_384  # tools whose annotations are kept, every server together
MAX_ANNOTATIONS: Final = 64  # in one tool's schema (past it, the tool's annotations are not learned)
MAX_PATH: Final = 16  # `properties` steps from the schema's root to an annotated property
SAFE_INTEGER: Final = 2**53 - 1

_SENTINEL: Final = re.compile(r"=\?base64\?(.*)\?=", re.DOTALL)
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class Mismatch(ValueError):
    """A header that does not say what the body says (the message names the header, never a value)."""


def encode_header_value(value: str) -> bytes:
    """A value as an `Mcp-*` header carries it: printable ASCII as it is, anything else (and
    anything that looks like the sentinel) as `=?base64?...?=` over its UTF-8."""
    if value.isascii() and value.isprintable() and value == value.strip() and not _SENTINEL.fullmatch(value):
        return value.encode("ascii")
    return b"=?base64?" + base64.b64encode(value.encode("utf-8", "surrogatepass")) + b"?="


def decode_header_value(raw: bytes) -> str | None:
    """What an `Mcp-*` header says (None if it says nothing readable)."""
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    sentinel = _SENTINEL.fullmatch(text)
    if sentinel is None:
        return text
    try:
        return base64.b64decode(sentinel.group(1), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


# ---------------------------------------------------------------------------- x-mcp-header


@dataclass(frozen=True, slots=True)
class ParamHeader:
    """One annotated property: its path of `properties` keys, the header's name part as the
    server wrote it, and whether it is an integer (compared by value)."""

    path: tuple[str, ...]
    token: str
    integer: bool

    @property
    def header(self) -> bytes:
        return PARAM_PREFIX + self.token.lower().encode("ascii")


def annotated(schema: Any) -> tuple[ParamHeader, ...] | None:
    """The `x-mcp-header` annotations of a tool's `inputSchema`, or None when one breaks the rules
    (not a header token, not unique, not on a string / integer / boolean property reached by
    `properties` keys alone): such a definition is invalid, and nothing of it is mirrored."""
    found: list[ParamHeader] = []
    if not _walk(schema, (), found, root=True):
        return None
    tokens = [p.token.lower() for p in found]
    return tuple(found) if len(set(tokens)) == len(tokens) else None


def _walk(schema: Any, path: tuple[str, ...], found: list[ParamHeader], root: bool = False) -> bool:
    if not isinstance(schema, dict):
        return True
    if "x-mcp-header" in schema:
        token = schema["x-mcp-header"]
        kind = schema.get("type")
        if (root or not isinstance(token, str) or not _TOKEN.fullmatch(token)
                or kind not in ("string", "integer", "boolean") or len(found) >= MAX_ANNOTATIONS):
            return False
        found.append(ParamHeader(path, token, kind == "integer"))
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict) and len(path) < MAX_PATH:
            if not all(_walk(sub, (*path, name), found) for name, sub in value.items()):
                return False
        elif key not in ("x-mcp-header", "properties") and _annotated_below(value):
            return False  # an annotation under items, oneOf, $defs...: not statically reachable
    return True


def _annotated_below(value: Any, depth: int = 0) -> bool:
    if depth > 64:
        return True
    if isinstance(value, dict):
        return "x-mcp-header" in value or any(_annotated_below(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return any(_annotated_below(v, depth + 1) for v in value)
    return False


def rendered(value: Any) -> str | None:
    """An argument as its header carries it (before encoding); None: no header (absent, null,
    or not a string, a safe integer or a boolean)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) <= SAFE_INTEGER:
        return str(value)
    if isinstance(value, float) and value.is_integer() and abs(value) <= SAFE_INTEGER:
        return str(int(value))
    return value if isinstance(value, str) else None


def _value_at(arguments: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(arguments, dict):
            return None
        arguments = arguments.get(key)
    return arguments


def _agrees(param: ParamHeader, said: str, value: str) -> bool:
    if param.integer and re.fullmatch(r"-?[0-9]+(\.0+)?", said):
        return int(said.split(".")[0]) == int(value)
    return said == value


class ParamTable:
    """The annotations of each tool listed through the gateway, per server (bounded: the least
    recently listed go first). A tool listed without annotations is forgotten."""

    def __init__(self, limit: int = MAX_TOOLS) -> None:
        self._limit = limit
        self._tools: OrderedDict[tuple[str, str], tuple[ParamHeader, ...]] = OrderedDict()

    def learn(self, server: str, tools: Sequence[Any]) -> None:
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            key = (server, tool["name"])
            self._tools.pop(key, None)
            found = annotated(tool.get("inputSchema"))
            if found:
                self._tools[key] = found
        while len(self._tools) > self._limit:
            self._tools.popitem(last=False)

    def of(self, server: str, tool: str) -> tuple[ParamHeader, ...]:
        return self._tools.get((server, tool), ())

    def __len__(self) -> int:
        return len(self._tools)


# ---------------------------------------------------------------------------- the headers of a POST


@dataclass(frozen=True, slots=True)
class Mirrors:
    """What the gateway does to a POST's headers: the client's of these names are dropped, these
    are added (derived from the body)."""

    add: tuple[tuple[bytes, bytes], ...] = ()
    drop: frozenset[bytes] = frozenset()


def body_version(raw: Mapping[str, Any]) -> str | None:
    """The protocol version a request's `_meta` names (2026-07-28: every request carries it)."""
    params = raw.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get(PROTOCOL_VERSION_META) if isinstance(meta, dict) else None
    return version if isinstance(version, str) else None


def mirrors(message: Mapping[str, Any] | None, sent: Mapping[bytes, bytes],
            params: tuple[ParamHeader, ...] = ()) -> Mirrors:
    """The headers of a POST whose body is `message` (None for a batch) as they go upstream;
    Mismatch for a header the client sent that the body contradicts. `sent`: the client's headers
    as `Request.header_table` gives them (a name sent twice matches nothing). `params`: the
    annotations of the tool a `tools/call` names (from `ParamTable`)."""
    sent_method, sent_name = sent.get(b"mcp-method"), sent.get(b"mcp-name")
    sent_version = sent.get(VERSION_HEADER)
    method = message.get("method") if message is not None else None
    method = method if isinstance(method, str) else None
    version = body_version(message) if message is not None else None
    said_version = decode_header_value(sent_version) if sent_version is not None else None
    modern = version in MODERN_VERSIONS or said_version in MODERN_VERSIONS
    if not modern and sent_method is None and sent_name is None:
        return Mirrors()
    name = _target_name(message, NAMED_METHODS[method]) if message is not None and method in NAMED_METHODS \
        else None
    if sent_method is not None and decode_header_value(sent_method) != method:
        raise Mismatch("the Mcp-Method header does not match the body's method")
    if sent_name is not None and decode_header_value(sent_name) != name:
        raise Mismatch("the Mcp-Name header does not match the body")
    add: list[tuple[bytes, bytes]] = []
    drop: set[bytes] = set()
    if modern and version is not None:
        if sent_version is not None and said_version != version:
            raise Mismatch("the MCP-Protocol-Version header does not match the body's _meta protocol version")
        add.append((VERSION_HEADER, encode_header_value(version)))
        drop.add(VERSION_HEADER)
    if method is not None:
        add.append((b"mcp-method", encode_header_value(method)))
    if name is not None:
        add.append((b"mcp-name", encode_header_value(name)))
    if modern and method == "tools/call" and params:
        raw_params = message.get("params") if message is not None else None
        arguments = raw_params.get("arguments") if isinstance(raw_params, dict) else None
        for param in params:
            value = rendered(_value_at(arguments, param.path))
            given = sent.get(param.header)
            drop.add(param.header)
            if given is not None:
                said = decode_header_value(given)
                if value is None or said is None or not _agrees(param, said, value):
                    raise Mismatch(f"the Mcp-Param-{param.token} header does not match the body's arguments")
            if value is not None:
                add.append((b"mcp-param-" + param.token.encode("ascii"), encode_header_value(value)))
    return Mirrors(tuple(add), frozenset(drop))


def _target_name(message: Mapping[str, Any], members: tuple[str, ...]) -> str | None:
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    for member in members:
        if isinstance(params.get(member), str):
            return str(params[member])
    return None


# ---------------------------------------------------------------------------- the trace context


def _carries_trace(params: dict[str, Any]) -> bool:
    meta = params.get("_meta")
    return isinstance(meta, dict) and (meta.get(PROTOCOL_VERSION_META) in MODERN_VERSIONS
                                       or "traceparent" in meta)


def with_trace(body: bytes, carrier: Mapping[str, str]) -> bytes:
    """`body` (as the gateway forwards it) with this trace context (`traceparent`, `tracestate`)
    in the `_meta` of each request that carries one there: a 2026-07-28 request, or one whose
    client put a `traceparent` there (the caller's context is replaced: it is the parent of the
    gateway's span). The body as it was when no request does."""
    if not holds(body, b'"_meta"'):
        return body
    try:
        out = jsonrpc.parse_body(body)
    except jsonrpc.JsonRpcError:
        return body

    def traced(params: dict[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in params["_meta"].items() if k not in TRACE_META}
        return {**params, "_meta": {**meta, **carrier}}

    rewritten = jsonrpc.rewrite_params(out, _carries_trace, traced)
    return body if rewritten is out else rewritten.body
