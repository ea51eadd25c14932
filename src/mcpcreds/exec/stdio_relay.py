"""The policy of `mcpcreds exec`'s stdio relay, apart from any I/O (pure): newline-delimited
JSON-RPC between an MCP client and a stdio server, judged line by line by the gateway's own core.

- A client line is read strictly (`jsonrpc.parse_body`); one that is not JSON-RPC is answered
  with a JSON-RPC error and never reaches the server (fail closed). A `tools/call` outside the
  entry's trust policy is answered with the gateway's refusal (`jsonrpc.refusals`): the server
  never sees it. What passes goes on re-serialised.
- A server line goes through a `jsonrpc.Inspector` (tools/list filtered, descriptions sanitized,
  media withheld, injections scanned); what it withholds becomes a JSON-RPC error for the client's
  request it answered (a notification is dropped). A batch from the server is relayed message by
  message. The server's own requests the policy answers (`in_place_policy`: elicitation declined,
  roots) are answered to the server and never reach the client.
- Every `tools/call`, screening and elicitation decided here is kept as an event (`take_events`)
  for the sidecar's audit log (`POST /v1/exec/{name}/events`); never arguments or results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..config.content import ContentPolicy
from ..core.policy import TRUST_LEVELS, TrustPolicy
from ..gateway import jsonrpc
from ..gateway.in_place import in_place_policy
from ..gateway.strict_json import StrictJsonError

MAX_EVENTS: Final = 1024  # kept for the sidecar; past it, the oldest are dropped (and counted)
MAX_NAME: Final = 128
ELICITATION: Final = "elicitation/create"


class BadPolicy(ValueError):
    """The policy in the sidecar's session answer is not one the relay can apply."""


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadPolicy("expected a list of strings")
    return tuple(value)


def policy_of(raw: Mapping[str, Any]) -> tuple[TrustPolicy, ContentPolicy]:
    """The entry's trust and content policy from the session answer (`ExecEntry.policy_dict`)."""
    trust = raw.get("trust")
    flags = ("allow_untrusted_without_allowlist", "elicitation", "media")
    if trust not in TRUST_LEVELS or raw.get("on_injection") not in ("log", "block") or not all(
            isinstance(raw.get(k), bool) for k in flags):
        raise BadPolicy("the exec policy is malformed")
    allowlist = None if raw.get("tool_allowlist") is None else _names(raw["tool_allowlist"])
    roots = None if raw.get("roots") is None else _names(raw["roots"])
    policy = TrustPolicy(str(trust), allowlist, _names(raw.get("expected_tools")),
                         bool(raw["allow_untrusted_without_allowlist"]))
    content = ContentPolicy(roots=roots, elicitation_enabled=bool(raw["elicitation"]),
                            media_passthrough=bool(raw["media"]), on_injection=raw["on_injection"])
    return policy, content


@dataclass(slots=True)
class Relayed:
    """What one line becomes: lines for the client, lines for the server (without newlines)."""

    to_client: list[bytes] = field(default_factory=list)
    to_server: list[bytes] = field(default_factory=list)


class StdioPolicy:
    def __init__(self, name: str, trust: TrustPolicy, content: ContentPolicy,
                 clock: Callable[[], float], on_warnings: Callable[[list[str]], None] | None = None) -> None:
        self.name = name
        self.trust = trust
        self.content = content
        self.clock = clock
        self.pending: dict[jsonrpc.IdKey, str] = {}  # the client's requests the server has yet to answer
        self._calls: dict[jsonrpc.IdKey, tuple[str, float]] = {}  # tools/call id -> (tool, started)
        self._answers: list[bytes] = []  # answers to the server's requests, given in the client's place
        self.events: list[dict[str, Any]] = []
        self.events_dropped = 0
        level = trust.trust
        self.roots_answered = content.effective_roots(level) is not None
        self.inspector = jsonrpc.Inspector(
            trust, pending=self.pending, on_answer=self._answered, on_warnings=on_warnings,
            screening=jsonrpc.Screening(sanitize=level != "trusted", block=content.on_injection == "block",
                                        media=content.effective_media(level)),
            on_server_request=self._server_request, on_screened=self._screened)

    # -- client -> server

    def from_client(self, line: bytes) -> Relayed:
        if not line.strip():
            return Relayed()
        try:
            out = jsonrpc.parse_body(line)
        except jsonrpc.JsonRpcError as exc:
            return Relayed([jsonrpc.dumps(jsonrpc.error(None, exc.code, exc.message))])
        refused = jsonrpc.refusals(out, self.trust, self.name)
        if refused:
            for m in out.requests:
                if m.method == jsonrpc.TOOLS_CALL:
                    self._event({"event": "tool_call", "tool": (m.tool or "")[:MAX_NAME], "status": "refused",
                                 "duration_ms": 0})
            return Relayed([jsonrpc.dumps(refused if out.batch else refused[0])])
        out = jsonrpc.declare_roots(out, True if self.roots_answered else None)
        now = self.clock()
        for m in out.requests:
            key = jsonrpc.id_key(m.id)
            self.pending[key] = m.method or ""
            if m.method == jsonrpc.TOOLS_CALL:
                self._calls[key] = ((m.tool or "")[:MAX_NAME], now)
        return Relayed(to_server=[out.body])

    # -- server -> client

    def from_server(self, line: bytes) -> Relayed:
        if not line.strip():
            return Relayed()
        try:
            data = jsonrpc.loads(line)
        except StrictJsonError:
            return Relayed()  # whose answer it was cannot be told: dropped
        relayed = Relayed()
        for item in data if isinstance(data, list) and data else [data]:
            self._answers = []
            waiting = self._waiting(item)
            try:
                body = self.inspector.json_body(jsonrpc.dumps(item))
            except jsonrpc.Answered:
                body = b""
            relayed.to_server += self._answers
            if body is None:
                relayed.to_client += self._withheld(waiting)
            elif body:
                relayed.to_client.append(body)
        return relayed

    def _waiting(self, item: Any) -> jsonrpc.IdKey | None:
        """The client's request a server message answers (None if it answers none)."""
        if not isinstance(item, dict) or "method" in item:
            return None
        value = item.get("id")
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            return None
        key = jsonrpc.id_key(value)
        return key if key in self.pending else None

    def _withheld(self, key: jsonrpc.IdKey | None) -> list[bytes]:
        if key is None:
            return []
        self.pending.pop(key, None)
        self._call_done(key, "withheld")
        said = "the MCP server's answer was withheld by mcpcreds exec: not JSON-RPC read one way only"
        return [jsonrpc.dumps(jsonrpc.error(key[1], jsonrpc.GATEWAY_ERROR, said, {"code": "upstream_error"}))]

    def _answered(self, key: jsonrpc.IdKey, method: str, status: str) -> None:
        self._call_done(key, status)

    def _call_done(self, key: jsonrpc.IdKey, status: str) -> None:
        call = self._calls.pop(key, None)
        if call is not None:
            tool, started = call
            self._event({"event": "tool_call", "tool": tool, "status": status[:64],
                         "duration_ms": max(0, int((self.clock() - started) * 1000))})

    def _server_request(self, message: dict[str, Any]) -> dict[str, Any] | None:
        method = message.get("method")
        params: dict[str, Any] = message["params"] if isinstance(message.get("params"), dict) else {}
        answer, shown = in_place_policy(self.name, self.trust.trust, self.content, method, params)
        if answer is None:
            return message if shown is params else {**message, "params": shown}
        self._answers.append(jsonrpc.dumps({"jsonrpc": "2.0", "id": message.get("id"), "result": answer}))
        if method == ELICITATION:
            self._event({"event": "elicitation", "mode": "url" if params.get("mode") == "url" else "form",
                         "action": "declined",
                         "reason": "sandboxed" if self.trust.trust == "sandboxed" else "elicitation_enabled"})
        return None

    def _screened(self, kind: str, what: list[Any]) -> None:
        if kind == "sanitized":
            found = [f"{h.listing}:{h.item}:{','.join(h.patterns)}"[:64] for h in what[:32]]
        else:
            found = [str(w)[:64] for w in what[:32]]
        self._event({"event": "screened", "kind": kind, "found": found})

    def _event(self, event: dict[str, Any]) -> None:
        if len(self.events) >= MAX_EVENTS:
            del self.events[0]
            self.events_dropped += 1
        self.events.append(event)

    def take_events(self) -> list[dict[str, Any]]:
        taken, self.events = self.events, []
        return taken
