"""What a server asks of the client, and what the gateway does in the client's place (the untrusted
pipeline's requests half): an elicitation the server may not make is declined, one relayed is given
`elicitation_timeout_secs` to be answered (then cancelled, and the client's late answer dropped),
a sampling request the server may not make is refused (an error; in 2026-07-28 the client's request
that carried it fails),
a URL-mode one of a server that is not trusted names the server; `roots/list` is answered with the
configured roots. The same policy judges what a 2026-07-28 task asks for (`task_input`). A request
the gateway stopped waiting for (past the server's `timeout`) is cancelled at the server (`cancel`).
Also the audit lines and metrics of what the screening did to results."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final

from ..broker.broker import Actor
from ..config.content import SANDBOXED, ContentPolicy
from ..config.model import Target
from ..core.audit import AuditLog
from ..core.http import Request
from ..core.logs import get_logger
from ..core.metrics import Metrics
from ..errors import McpcredsError
from ..protocol import jsonrpc, mirror, screen
from ..protocol.elicitations import PendingElicitations
from ..protocol.input_rounds import Holder, InputRounds, put_back, take_out
from ..protocol.task_input import TaskInputs, envelope, update
from .sessions import owner_of

_log = get_logger("gateway")

# the client's headers an answer the gateway sends the server in its place carries
_SESSION_HEADERS: Final = (b"mcp-session-id", b"mcp-protocol-version")
CANCELLED: Final = "notifications/cancelled"
MAX_CANCELS: Final = 64  # notices sent for one request given up (a batch's requests)

SendInPlace = Callable[[Request, Target, bytes, mirror.Mirrors], Awaitable[None]]


def one_header(request: Request, name: bytes) -> bytes | None:
    """The value of a header sent once; two of them are one too many (b"\\0" stands for that: it
    matches nothing)."""
    return request.header_table().get(name)


def actor_of(request: Request) -> Actor:
    return Actor(request.peer_uid, request.peer_pid, request.grant.id if request.grant is not None else None,
                 request.trace_id)


def _holder(request: Request, target: Target) -> Holder:
    return (target.name, *owner_of(request))


def _modern(request: Request) -> bool:
    """Whether a POST speaks 2026-07-28: its version header or a request's `_meta` says so."""
    said = one_header(request, mirror.VERSION_HEADER)
    if said is not None and mirror.decode_header_value(said) in mirror.MODERN_VERSIONS:
        return True
    try:
        out = jsonrpc.parse_body(request.body)
    except jsonrpc.JsonRpcError:
        return False
    return any(mirror.body_version(m.raw) in mirror.MODERN_VERSIONS for m in out.requests)


def _call_later(delay: float, fire: Callable[[], None]) -> asyncio.TimerHandle:
    return asyncio.get_running_loop().call_later(delay, fire)


def refusal_reason(trust: str, key: str) -> str:
    """Which rule kept a server's request from the client, for the audit line: its trust level
    (a sandboxed server never may), else the content key that says no."""
    return SANDBOXED if trust == SANDBOXED else key


def in_place_policy(name: str, trust: str, content: ContentPolicy, method: Any,
                    params: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(answer, params) for a request of a server's, in either protocol era (pure: the gateway
    and the stdio relay of `mcpcreds exec` share it): the result given in the client's place (None:
    the client is asked), and the params the client sees. Elicitations the server may not make are
    declined; `roots/list` is answered with the configured roots; a URL-mode elicitation of a
    server that is not trusted names the server. A sampling request the server may not make has no
    result to give: screen.Refused (an error to the server, or a failed request of the client's)."""
    if method == "elicitation/create":
        if not content.effective_elicitation(trust):
            return screen.elicitation_result("decline"), params
        if params.get("mode") == "url" and trust != "trusted":
            said = params.get("message") if isinstance(params.get("message"), str) else ""
            return None, {**params, "message": f"[MCP server {name!r}, not trusted] {said}"}
    elif method == screen.SAMPLING_METHOD:
        if not content.effective_sampling(trust):
            raise screen.Refused(screen.SAMPLING)
    elif method == "roots/list":
        roots = content.effective_roots(trust)
        if roots is not None:
            return screen.roots_result([(uri, None) for uri in roots]), params
    return None, params


class InPlace:
    def __init__(self, audit: Callable[[], AuditLog], metrics: Metrics, send: SendInPlace,
                 clock: Callable[[], float]) -> None:
        self.audit = audit
        self.metrics = metrics
        self._send = send
        self.elicitations = PendingElicitations(_call_later)
        self._tasks: set[asyncio.Task[None]] = set()  # answers being sent the server in the client's place
        self.rounds = InputRounds(clock)
        self.tasks = TaskInputs(clock)  # what the gateway showed or answered of each task's input

    @staticmethod
    def as_client(request: Request, body: bytes) -> Request:
        """A POST of `body` in the session of `request`, as its client would send it."""
        headers = tuple((k, v) for k, v in request.headers if k.strip().lower() in _SESSION_HEADERS)
        return Request("POST", request.path, "", body, None, request.peer_uid, request.peer_pid,
                       grant_only=request.grant_only, name=request.name, grant=request.grant, headers=headers)

    def void_answers(self, request: Request, target: Target, out: jsonrpc.Outgoing) -> set[jsonrpc.IdKey]:
        """The ids of the client's answers to elicitations whose time ran out (not to be relayed)."""
        session = one_header(request, b"mcp-session-id")
        return {jsonrpc.id_key(m.id) for m in out.messages if m.kind == "response" and jsonrpc.valid_id(m.id)
                and not self.elicitations.answered((target.name, session, jsonrpc.id_key(m.id)))}

    def policy(self, request: Request, target: Target, method: Any,
               params: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(answer, params) for a request of the server's (see `in_place_policy`); a declined
        elicitation is audited and counted, and so is a refused sampling (screen.Refused)."""
        trust = target.trust.trust
        try:
            answer, shown = in_place_policy(target.name, trust, target.content, method, params)
        except screen.Refused:
            self.audit().write("sampling", server=target.name, action="refused",
                               reason=refusal_reason(trust, "sampling_enabled"),
                               **actor_of(request).to_dict())
            self.metrics.inc("mcpcreds_gateway_sampling_total",
                             (("server", target.name), ("outcome", "refused")),
                             help_text="Sampling requests of servers the gateway refused, by server.")
            raise
        if answer is not None and method == "elicitation/create":
            self.audit().write("elicitation", server=target.name,
                               mode="url" if params.get("mode") == "url" else "form", action="declined",
                               reason=refusal_reason(trust, "elicitation_enabled"),
                               **actor_of(request).to_dict())
            self.metrics.inc("mcpcreds_gateway_elicitations_total",
                             (("server", target.name), ("outcome", "declined")),
                             help_text="Elicitations of servers, by server and outcome.")
        return answer, shown

    def asks(self, request: Request, target: Target, message: dict[str, Any],
             outbox: list[bytes]) -> dict[str, Any] | None:
        """A request of the server's, seen on a stream (the 2025 revisions): relayed (None:
        answered here instead, see `policy`); an elicitation relayed gets its time to be answered."""
        params: dict[str, Any] = message["params"] if isinstance(message.get("params"), dict) else {}
        try:
            answer, shown = self.policy(request, target, message.get("method"), params)
        except screen.Refused:  # no result to give: the server gets an error
            refusal = jsonrpc.error(message.get("id"), screen.SAMPLING_REFUSED_CODE, screen.SAMPLING_REFUSED)
            self._reply(request, target, refusal)
            return None
        if answer is not None:
            self.answer(request, target, message, answer)
            return None
        if message.get("method") == "elicitation/create":
            mode = "url" if params.get("mode") == "url" else "form"
            key = (target.name, one_header(request, b"mcp-session-id"), jsonrpc.id_key(message.get("id")))
            self.elicitations.relayed(key, target.content.elicitation_timeout_secs,
                                      lambda: self._void(request, target, message, mode, outbox))
        return message if shown is params else {**message, "params": shown}

    def input_required(self, request: Request, target: Target, result: dict[str, Any]) -> dict[str, Any]:
        """An `input_required` result (2026-07-28) as the client sees it (`input_rounds.take_out`)."""
        return take_out(result, self.rounds, _holder(request, target),
                        lambda method, params: self.policy(request, target, method, params))

    def resume(self, request: Request, target: Target,
               out: jsonrpc.Outgoing) -> tuple[jsonrpc.Outgoing, frozenset[jsonrpc.IdKey]]:
        """The client's retries with what the gateway answered put back, and their ids
        (`input_rounds.put_back`); JsonRpcError for a `tasks/update` that answers what the gateway
        did not show the caller (`task_input`)."""
        try:
            self.tasks.check(_holder(request, target), out)
        except jsonrpc.JsonRpcError:
            _log.warning("gateway: a tasks/update refused", extra={"server": target.name,
                                                                   "uid": request.peer_uid})
            raise
        return put_back(out, self.rounds, _holder(request, target))

    def task_input(self, request: Request, target: Target, task: dict[str, Any]) -> dict[str, Any]:
        """A task's state carrying `inputRequests` (a result, or a notification's params) as the
        client sees it: what the policy answers is answered to the server with a `tasks/update`
        of the gateway's own, in the client's envelope and session, and taken out."""
        def policy(method: Any, params: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
            return self.policy(request, target, method, params)
        shown, task_id, answers = self.tasks.judge(_holder(request, target), task, policy)
        if answers:
            meta = envelope(request.body)
            caps = meta.get(jsonrpc.CLIENT_CAPABILITIES_META) if meta else None
            if meta and isinstance(caps, dict):  # declared as the gateway declares them for the client
                trust = target.trust.trust
                meta[jsonrpc.CLIENT_CAPABILITIES_META] = jsonrpc.kept_capabilities(
                    caps, target.content.effective_roots(trust) is not None,
                    target.content.effective_sampling(trust))
            message = update(task_id, answers, meta)
            body = jsonrpc.dumps(message)
            as_client = self.as_client(request, body)
            try:  # the headers a 2026-07-28 request carries, derived from the body
                mirrors = mirror.mirrors(message, as_client.header_table())
            except mirror.Mismatch:  # the client's version header against its envelope: refused already
                _log.warning("gateway: a task's answers not sent", extra={"server": target.name})
                return shown
            self._spawn(self._sent(as_client, target, body, mirrors))
        return shown

    def _void(self, request: Request, target: Target, message: dict[str, Any], mode: str,
              outbox: list[bytes]) -> None:
        """The client did not answer an elicitation in its time: the server is told `cancel`, the
        client that the request is void (on the stream that carried it)."""
        self.answer(request, target, message, screen.elicitation_result("cancel"))
        reason = "the gateway's elicitation_timeout_secs ran out: the server was told cancel"
        notice = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": message.get("id"), "reason": reason}}
        outbox.append(b"data: " + jsonrpc.dumps(notice) + b"\n\n")
        self.audit().write("elicitation", server=target.name, mode=mode, action="cancelled",
                                reason="elicitation_timeout_secs", **actor_of(request).to_dict())
        self.metrics.inc("mcpcreds_gateway_elicitations_total",
                         (("server", target.name), ("outcome", "timed_out")),
                         help_text="Elicitations of servers, by server and outcome.")

    def answer(self, request: Request, target: Target, message: dict[str, Any],
                         result: dict[str, Any]) -> None:
        """Send the server the answer to its request, as the client would (same session)."""
        self._reply(request, target, {"jsonrpc": "2.0", "id": message.get("id"), "result": result})

    def _reply(self, request: Request, target: Target, reply: dict[str, Any]) -> None:
        body = jsonrpc.dumps(reply)
        self._spawn(self._sent(self.as_client(request, body), target, body, mirror.Mirrors()))

    def cancel(self, request: Request, target: Target, pending: Mapping[jsonrpc.IdKey, str]) -> None:
        """The requests of a POST the gateway stopped waiting for (past the server's `timeout`),
        cancelled at the server. In the 2025 revisions a disconnect is no cancellation: each gets a
        `notifications/cancelled` in the client's session, sent in the background like an answer in
        its place (no permit: a notification is no request; best effort, each send bounded by the
        timeout). In 2026-07-28 closing the request's stream is its cancellation (the era has no
        notification of the client's over HTTP), and the gateway closed it."""
        if request.method != "POST" or _modern(request):
            return
        # `initialize` is never cancelled (the spec says so)
        ids = [value for (_, value), method in pending.items() if method != "initialize"][:MAX_CANCELS]
        if ids:
            self._spawn(self._cancels(request, target, ids))

    async def _cancels(self, request: Request, target: Target, ids: list[Any]) -> None:
        for id_ in ids:
            params = {"requestId": id_, "reason": "mcpcreds gateway: no answer within the server's timeout"}
            body = jsonrpc.dumps({"jsonrpc": "2.0", "method": CANCELLED, "params": params})
            await self._sent(self.as_client(request, body), target, body, mirror.Mirrors())

    def _spawn(self, sending: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(sending)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sent(self, request: Request, target: Target, body: bytes, mirrors: mirror.Mirrors) -> None:
        try:
            await self._send(request, target, body, mirrors)
        except McpcredsError as exc:
            _log.warning("gateway: a message in the client's place failed", extra={"server": target.name,
                                                                                   "error": exc.code})

    def screened(self, request: Request, target: Target, kind: str, what: list[Any]) -> None:
        """An audit line and a metric for what the screening did to a result (never its text)."""
        if kind == "sanitized":
            fields: dict[str, Any] = {"items": [{"listing": h.listing, "item": h.item, "where": h.where,
                                                 "patterns": list(h.patterns)} for h in what[:32]]}
        else:
            fields = {"found": [str(w)[:64] for w in what[:32]]}
        self.audit().write("screened", server=target.name, kind=kind, **fields,
                                **actor_of(request).to_dict())
        self.metrics.inc("mcpcreds_gateway_screened_total", (("server", target.name), ("kind", kind)),
                         help_text="Results the gateway changed or reported: sanitized descriptions, "
                                   "injections found, media withheld, by server.")
