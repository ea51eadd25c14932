"""The policy of `mcpcreds exec`'s stdio relay, apart from any I/O (pure): newline-delimited
JSON-RPC between an MCP client and a stdio server, judged line by line by the gateway's own core.

- A client line is read strictly (`jsonrpc.parse_body`); one that is not JSON-RPC is answered
  with a JSON-RPC error and never reaches the server (fail closed). A `tools/call` outside the
  entry's trust policy, or that the tool's metadata refuses (`tool_meta.call_refusals`: data flow,
  flagged arguments), is answered with the gateway's refusal: the server never sees it. What
  passes goes on re-serialised.
- Pins (`pins`: the sidecar's view of the entry's pins, None when it does not pin): each
  `tools/list` is judged by `protocol.pins.decide` (a changed definition withheld) and a `tools/call`
  of a changed tool refused (`data.policy = "pinned"`); what it pinned or saw changed is kept for
  the sidecar (`take_pin_writes`, `POST /v1/exec/{name}/pins`) and in the view, for this session.
- Time (`schedule`, given by the relay; timers run under its lock, and what they decide is taken
  with `take_late`): a request the server has not answered within `timeout` (a progress
  notification for it restarts the wait) is answered to the client with an error (data.code
  `upstream_timeout`) and cancelled at the server (`notifications/cancelled`); its late answer is
  dropped, as is the answer to a request the client cancelled. A `subscriptions/listen` is never
  timed out: its answer comes when the subscription ends. An elicitation relayed to the
  client and not answered within `elicitation_timeout_secs` is answered to the server in the
  client's place (`cancel`), the client is told it is void (`notifications/cancelled`), and its
  late answer is dropped.
- A server line goes through a `jsonrpc.Inspector` (tools/list filtered, descriptions sanitized,
  media withheld, injections scanned); what it withholds becomes a JSON-RPC error for the client's
  request it answered (a notification is dropped). A batch from the server is relayed message by
  message. The server's own requests the policy answers (`in_place_policy`: elicitation declined,
  roots, sampling refused with an error) are answered to the server and never reach the client
  (the client's capabilities never declare sampling then); an `input_required` result asking
  for a refused sampling becomes an error for the client's request; so is what a 2026-07-28 task asks
  for (`protocol.task_input`: a `tasks/update` of the relay's own, in the envelope of the client's
  last request, its answer dropped), and a client's `tasks/update` answering what it was not
  shown is refused.
- Every `tools/call`, screening, elicitation and sampling refusal decided here is kept as an event
  (`take_events`) for the sidecar's audit log (`POST /v1/exec/{name}/events`); never arguments or results.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..config import content as limits
from ..config.content import ContentPolicy
from ..config.reader import Collector
from ..config.tool_meta import ToolMeta, parse_tool_metadata
from ..core.policy import TRUST_LEVELS, TrustPolicy
from ..gateway.in_place import in_place_policy, refusal_reason
from ..protocol import jsonrpc, pins, screen, tool_meta
from ..protocol.elicitations import Handle, PendingElicitations, Schedule
from ..protocol.input_rounds import InputRounds, put_back, take_out
from ..protocol.strict_json import StrictJsonError
from ..protocol.task_input import TaskInputs, envelope_of, update
from ..state.pins import PinView

_HOLDER = ("stdio", 0, None)  # one client per relay: its input rounds are all its own

MAX_EVENTS: Final = 1024  # kept for the sidecar; past it, the oldest are dropped (and counted)
MAX_NAME: Final = 128
ELICITATION: Final = "elicitation/create"
CANCELLED: Final = "notifications/cancelled"
PROGRESS: Final = "notifications/progress"
LISTEN: Final = "subscriptions/listen"  # 2026-07-28
MAX_VOID: Final = 1024  # requests timed out or cancelled, remembered so that a late answer is dropped


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
            isinstance(raw.get(k), bool) for k in flags) or not isinstance(raw.get("sampling", True), bool):
        raise BadPolicy("the exec policy is malformed")
    allowlist = None if raw.get("tool_allowlist") is None else _names(raw["tool_allowlist"])
    roots = None if raw.get("roots") is None else _names(raw["roots"])
    policy = TrustPolicy(str(trust), allowlist, _names(raw.get("expected_tools")),
                         bool(raw["allow_untrusted_without_allowlist"]), _names(raw.get("tool_exclude", [])))
    content = ContentPolicy(timeout=_timeout(raw), roots=roots, elicitation_enabled=bool(raw["elicitation"]),
                            elicitation_timeout_secs=_elicitation_timeout(raw),
                            sampling_enabled=bool(raw.get("sampling", True)),  # absent: a sidecar before it
                            media_passthrough=bool(raw["media"]), on_injection=raw["on_injection"],
                            tool_metadata=_tool_metadata(raw))
    return policy, content


def _timeout(raw: Mapping[str, Any]) -> float:
    value = raw.get("timeout", limits.DEFAULT_TIMEOUT)
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not limits.MIN_TIMEOUT <= value <= limits.MAX_TIMEOUT):
        raise BadPolicy("the exec policy's timeout is malformed")
    return float(value)


def _elicitation_timeout(raw: Mapping[str, Any]) -> int:
    value = raw.get("elicitation_timeout_secs", limits.DEFAULT_ELICITATION_TIMEOUT)
    if (isinstance(value, bool) or not isinstance(value, int)
            or not 1 <= value <= limits.MAX_ELICITATION_TIMEOUT):
        raise BadPolicy("the exec policy's elicitation_timeout_secs is malformed")
    return value


def _tool_metadata(raw: Mapping[str, Any]) -> dict[str, ToolMeta]:
    c = Collector()
    parsed = parse_tool_metadata(c, "tool_metadata", raw.get("tool_metadata", {}))
    if parsed is None or c.errors:
        raise BadPolicy("the exec policy's tool_metadata is malformed")
    return parsed


@dataclass(slots=True)
class Relayed:
    """What one line becomes: lines for the client, lines for the server (without newlines)."""

    to_client: list[bytes] = field(default_factory=list)
    to_server: list[bytes] = field(default_factory=list)


class StdioPolicy:
    def __init__(self, name: str, trust: TrustPolicy, content: ContentPolicy,
                 clock: Callable[[], float], on_warnings: Callable[[list[str]], None] | None = None,
                 pin_view: PinView | None = None) -> None:
        self.name = name
        self.trust = trust
        self.content = content
        self.clock = clock
        self.pending: dict[jsonrpc.IdKey, str] = {}  # the client's requests the server has yet to answer
        self._calls: dict[jsonrpc.IdKey, tuple[str, float]] = {}  # tools/call id -> (tool, started)
        self._answers: list[bytes] = []  # answers to the server's requests, given in the client's place
        self.events: list[dict[str, Any]] = []
        self.events_dropped = 0
        self.on_warnings = on_warnings
        self.schedule: Schedule | None = None  # set by the relay; None: nothing is timed
        self.late = Relayed()  # what the timers decided, for the relay (take_late)
        self._timers: dict[jsonrpc.IdKey, Handle] = {}
        self._progress: dict[jsonrpc.IdKey, jsonrpc.IdKey] = {}  # progress token -> the request it reports on
        self._void: OrderedDict[jsonrpc.IdKey, None] = OrderedDict()  # requests whose answer is dropped
        self.elicitations = PendingElicitations(self._schedule)
        self.pins = pin_view
        self.pin_writes: list[pins.PinDecision] = []  # for the sidecar (take_pin_writes)
        level = trust.trust
        self.roots_answered = content.effective_roots(level) is not None
        self.inspector = jsonrpc.Inspector(
            trust, pending=self.pending, on_answer=self._answered, on_warnings=on_warnings,
            screening=jsonrpc.Screening(sanitize=level != "trusted", block=content.on_injection == "block",
                                        media=content.effective_media(level)),
            on_server_request=self._server_request, on_screened=self._screened,
            on_tools=None if pin_view is None else self._pinned,
            on_input_required=self._input_required, on_task_input=self._task_input)
        self.rounds = InputRounds(clock)  # the 2026-07-28 input rounds it answers part of
        self.tasks = TaskInputs(clock)  # what it showed or answered of each task's input
        self._envelope: dict[str, Any] | None = None  # of the client's last request (2026-07-28)

    # -- client -> server

    def from_client(self, line: bytes) -> Relayed:
        if not line.strip():
            return Relayed()
        try:
            out = jsonrpc.parse_body(line)
        except jsonrpc.JsonRpcError as exc:
            return Relayed([jsonrpc.dumps(jsonrpc.error(None, exc.code, exc.message))])
        try:
            self.tasks.check(_HOLDER, out)
            out, _ = put_back(out, self.rounds, _HOLDER)
        except jsonrpc.JsonRpcError as exc:
            return Relayed([jsonrpc.dumps(jsonrpc.error(out.single_id, exc.code, exc.message))])
        voided = {key for m in out.messages if m.kind == "response" and jsonrpc.valid_id(m.id)
                  and not self.elicitations.answered((self.name, None, key := jsonrpc.id_key(m.id)))}
        if voided:  # answers to elicitations whose time ran out: the server has its answer already
            out = jsonrpc.without_responses(out, voided)
            if not out.messages:
                return Relayed()
        refused = jsonrpc.refusals(out, self.trust, self.name)
        if not refused:
            level = self.trust.trust
            refused, warnings = tool_meta.call_refusals(out, self.name, self.content.tool_metadata, level,
                                                        self.content.effective_roots(level) or ())
            if warnings and self.on_warnings is not None:
                self.on_warnings(warnings)
        if not refused and self.pins is not None:
            refused = pins.call_refusals(out, self.name, self.pins)
        if refused:
            for m in out.requests:
                if m.method == jsonrpc.TOOLS_CALL:
                    self._event({"event": "tool_call", "tool": (m.tool or "")[:MAX_NAME], "status": "refused",
                                 "duration_ms": 0})
            return Relayed([jsonrpc.dumps(refused if out.batch else refused[0])])
        out = jsonrpc.declare_capabilities(out, self.roots_answered,
                                           self.content.effective_sampling(self.trust.trust))
        now = self.clock()
        for m in out.messages:
            if m.kind == "notification" and m.method == CANCELLED:
                self._cancelled(m.raw.get("params"))
        for m in out.requests:
            key = jsonrpc.id_key(m.id)
            self._envelope = envelope_of(m.raw) or self._envelope
            self.pending[key] = m.method or ""
            self._void.pop(key, None)
            if m.method == jsonrpc.TOOLS_CALL:
                self._calls[key] = ((m.tool or "")[:MAX_NAME], now)
            token = _progress_token(m.raw.get("params"))
            if token is not None:
                self._progress[token] = key
            if m.method != LISTEN:  # answered only when the subscription ends
                self._start_timer(key)
        return Relayed(to_server=[out.body])

    def _cancelled(self, params: Any) -> None:
        """The client cancelled a request of its own: no answer is waited for, a late one dropped."""
        value = params.get("requestId") if isinstance(params, dict) else None
        if not jsonrpc.valid_id(value) or (key := jsonrpc.id_key(value)) not in self.pending:
            return
        del self.pending[key]
        self._stop_timer(key)
        self._call_done(key, "cancelled")
        self._voided(key)

    # -- time

    def _schedule(self, seconds: float, then: Callable[[], None]) -> Handle:
        if self.schedule is None:
            return _NoTimer()
        return self.schedule(seconds, then)

    def _start_timer(self, key: jsonrpc.IdKey) -> None:
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        if self.schedule is not None:
            self._timers[key] = self.schedule(self.content.timeout, lambda: self._timed_out(key))

    def _stop_timer(self, key: jsonrpc.IdKey) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        for token in [t for t, k in self._progress.items() if k == key]:
            del self._progress[token]

    def _timed_out(self, key: jsonrpc.IdKey) -> None:
        self._timers.pop(key, None)
        if self.pending.pop(key, None) is None:
            return  # answered meanwhile
        self._stop_timer(key)
        self._call_done(key, "timeout")
        self._voided(key)
        said = f"the MCP server did not answer within {self.content.timeout:g} s"
        self.late.to_client.append(jsonrpc.dumps(jsonrpc.error(key[1], jsonrpc.GATEWAY_ERROR, said,
                                                               {"code": "upstream_timeout"})))
        self.late.to_server.append(_cancel(key[1], "no answer within the entry's timeout"))

    def _voided(self, key: jsonrpc.IdKey) -> None:
        self._void[key] = None
        while len(self._void) > MAX_VOID:
            self._void.popitem(last=False)

    def _elicitation_expired(self, id_: Any, mode: str) -> None:
        self.late.to_server.append(jsonrpc.dumps(screen.elicitation_answer(id_, "cancel")))
        self.late.to_client.append(_cancel(id_, "not answered within elicitation_timeout_secs"))
        self._event({"event": "elicitation", "mode": mode, "action": "cancelled",
                     "reason": "elicitation_timeout"})

    def take_late(self) -> Relayed:
        taken, self.late = self.late, Relayed()
        return taken

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
            if self._late_answer(item):
                continue
            self._progressed(item)
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

    def _late_answer(self, item: Any) -> bool:
        """An answer to a request that timed out or was cancelled: dropped (the client has its error)."""
        if not isinstance(item, dict) or "method" in item or not jsonrpc.valid_id(item.get("id")):
            return False
        key = jsonrpc.id_key(item["id"])
        if key in self.pending or key not in self._void:
            return False
        del self._void[key]
        return True

    def _progressed(self, item: Any) -> None:
        """A progress notification for a pending request restarts its wait."""
        if isinstance(item, dict) and item.get("method") == PROGRESS and "id" not in item:
            params = item.get("params")
            token = params.get("progressToken") if isinstance(params, dict) else None
            key = self._progress.get(jsonrpc.id_key(token)) if jsonrpc.valid_id(token) else None
            if key is not None and key in self.pending:
                self._start_timer(key)

    def _waiting(self, item: Any) -> jsonrpc.IdKey | None:
        """The client's request a server message answers (None if it answers none)."""
        if not isinstance(item, dict) or "method" in item:
            return None
        value = item.get("id")
        if not jsonrpc.valid_id(value):
            return None
        key = jsonrpc.id_key(value)
        return key if key in self.pending else None

    def _withheld(self, key: jsonrpc.IdKey | None) -> list[bytes]:
        if key is None:
            return []
        self.pending.pop(key, None)
        self._stop_timer(key)
        self._call_done(key, "withheld")
        said = "the MCP server's answer was withheld by mcpcreds exec: not JSON-RPC read one way only"
        return [jsonrpc.dumps(jsonrpc.error(key[1], jsonrpc.GATEWAY_ERROR, said, {"code": "upstream_error"}))]

    def _answered(self, key: jsonrpc.IdKey, method: str, status: str) -> None:
        self._stop_timer(key)
        self._call_done(key, status)

    def _call_done(self, key: jsonrpc.IdKey, status: str) -> None:
        call = self._calls.pop(key, None)
        if call is not None:
            tool, started = call
            self._event({"event": "tool_call", "tool": tool, "status": status[:64],
                         "duration_ms": max(0, int((self.clock() - started) * 1000))})

    def _policy(self, method: Any, params: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """`in_place_policy` for this entry, in either era; a declined elicitation is reported."""
        try:
            answer, shown = in_place_policy(self.name, self.trust.trust, self.content, method, params)
        except screen.Refused:
            reason = refusal_reason(self.trust.trust, "sampling_enabled")
            self._event({"event": "sampling", "action": "refused", "reason": reason})
            raise
        if answer is not None and method == ELICITATION:
            reason = refusal_reason(self.trust.trust, "elicitation_enabled")
            self._event({"event": "elicitation", "mode": _mode(params), "action": "declined",
                         "reason": reason})
        return answer, shown

    def _server_request(self, message: dict[str, Any]) -> dict[str, Any] | None:
        method = message.get("method")
        params: dict[str, Any] = message["params"] if isinstance(message.get("params"), dict) else {}
        try:
            answer, shown = self._policy(method, params)
        except screen.Refused:  # no result to give: the server gets an error (the 2025 revisions)
            self._answers.append(jsonrpc.dumps(jsonrpc.error(message.get("id"), screen.SAMPLING_REFUSED_CODE,
                                                           screen.SAMPLING_REFUSED)))
            return None
        if answer is None:
            if method == ELICITATION and jsonrpc.valid_id(message.get("id")):
                id_ = message["id"]
                self.elicitations.relayed((self.name, None, jsonrpc.id_key(id_)),
                                          self.content.elicitation_timeout_secs,
                                          lambda: self._elicitation_expired(id_, _mode(params)))
            return message if shown is params else {**message, "params": shown}
        self._answers.append(jsonrpc.dumps({"jsonrpc": "2.0", "id": message.get("id"), "result": answer}))
        return None

    def _input_required(self, result: dict[str, Any]) -> dict[str, Any]:
        """An `input_required` result (2026-07-28): what the policy answers is taken out, to be put
        back into the client's retry (as the gateway does)."""
        return take_out(result, self.rounds, _HOLDER, self._policy)

    def _task_input(self, task: dict[str, Any]) -> dict[str, Any]:
        """A task's state carrying `inputRequests`: what the policy answers goes to the server in a
        `tasks/update` of the relay's own (its answer dropped), and is taken out (as the gateway does)."""
        shown, task_id, answers = self.tasks.judge(_HOLDER, task, self._policy)
        if answers:
            message = update(task_id, answers, self._envelope)
            self._voided(jsonrpc.id_key(message["id"]))
            self._answers.append(jsonrpc.dumps(message))
        return shown

    def _pinned(self, tools: list[Any]) -> list[Any]:
        """A listing judged against the pins; what it pinned or saw changed kept in the view too."""
        assert self.pins is not None
        decision = pins.decide(self.pins, tools, enforce=True)
        if decision.writes:
            changed = {k: v for k, v in self.pins.changed.items() if k not in decision.cleared}
            changed.update({k: d.digest for k, d in decision.changed.items()})
            self.pins = PinView({**self.pins.pins, **{k: d.digest for k, d in decision.pin.items()}}, changed,
                                self.pins.total + len(decision.pin))
            self.pin_writes.append(decision)
        if decision.warnings and self.on_warnings is not None:
            self.on_warnings(list(decision.warnings))
        return decision.tools

    def take_pin_writes(self) -> list[pins.PinDecision]:
        taken, self.pin_writes = self.pin_writes, []
        return taken

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




def _mode(params: Mapping[str, Any]) -> str:
    return "url" if params.get("mode") == "url" else "form"


class _NoTimer:
    def cancel(self) -> None:
        pass


def _progress_token(params: Any) -> jsonrpc.IdKey | None:
    meta = params.get("_meta") if isinstance(params, dict) else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return jsonrpc.id_key(token) if jsonrpc.valid_id(token) else None


def _cancel(id_: Any, reason: str) -> bytes:
    params = {"requestId": id_, "reason": f"mcpcreds exec: {reason}"}
    return jsonrpc.dumps({"jsonrpc": "2.0", "method": CANCELLED, "params": params})
