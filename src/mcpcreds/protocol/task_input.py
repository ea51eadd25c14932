"""The input a 2026-07-28 task asks for (the tasks extension, `io.modelcontextprotocol/tasks`), judged
by the policy that judges a server's requests everywhere else. A task waiting for input carries its
outstanding requests in `inputRequests` (a `tasks/get` result, or a `notifications/tasks` on a
listen stream; the gateway judges any result or notification that carries them, whatever its
status), and the client answers with a `tasks/update` naming the task and its `inputResponses`.

- What the policy answers (an elicitation the server may not make declined, `roots/list` answered
  with the configured roots) is answered by the gateway itself: a `tasks/update` of its own goes
  to the server, and the request is taken out of what the client sees. Such an answer stays
  given for that task: while the server still lists the request (its state is eventually
  consistent), the same answer is sent again, never judged (nor audited) twice.
- What the policy lets through is shown to the client (a URL elicitation of a server that is not
  trusted names the server), and remembered as shown to that caller (server, uid, grant) for
  that task.
- A client's `tasks/update` is relayed only when each key it answers is one the gateway showed
  that caller for that task; one answering what the gateway answered itself, or never showed, is
  refused (-32602) and never reaches the server.
- Fail closed: a task carrying input requests whose `taskId` is not a string (of at most
  `MAX_ID` characters), whose `inputRequests` is not an object, or that holds more than
  `MAX_INPUT_REQUESTS` of them is withheld; a request that is not an object (or whose params are
  not one) is neither shown nor answered.

The table is bounded: `MAX_TASKS` tasks (the least recently seen go first), each forgotten
`TTL` seconds after it was last seen, and `MAX_KEYS` keys per task. A client whose task was
forgotten polls again (what the server still asks is shown again) and answers that."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from . import jsonrpc
from .input_rounds import MAX_INPUT_REQUESTS, Holder, Policy

UPDATE: Final = "tasks/update"
MAX_TASKS: Final = 10_000
MAX_KEYS: Final = 256  # keys shown, and keys answered, kept per task (past it, the oldest go)
MAX_ID: Final = 512  # characters of a taskId, or of an inputRequests key
TTL: Final = 3600.0  # seconds a task is remembered after it was last seen
# the `_meta` members of the client's request the gateway's `tasks/update` carries (2026-07-28)
ENVELOPE: Final = ("io.modelcontextprotocol/protocolVersion", "io.modelcontextprotocol/clientCapabilities",
                   "io.modelcontextprotocol/clientInfo")
_REFUSED: Final = ("tasks/update refused by the gateway: its inputResponses answer an input request the "
                   "gateway did not show this caller for that task (the gateway answered it itself, or never "
                   "relayed it): poll tasks/get and answer what it shows")


@dataclass(slots=True)
class _Task:
    expires: float
    shown: OrderedDict[str, None] = field(default_factory=OrderedDict)
    answered: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)

    def show(self, key: str) -> None:
        self.shown[key] = None
        self.shown.move_to_end(key)
        while len(self.shown) > MAX_KEYS:
            self.shown.popitem(last=False)

    def answer(self, key: str, answer: dict[str, Any]) -> None:
        self.shown.pop(key, None)
        self.answered[key] = answer
        while len(self.answered) > MAX_KEYS:
            self.answered.popitem(last=False)


class TaskInputs:
    def __init__(self, clock: Callable[[], float], ttl: float = TTL, limit: int = MAX_TASKS) -> None:
        self._clock = clock
        self._ttl = ttl
        self._limit = limit
        self._tasks: OrderedDict[tuple[Holder, str], _Task] = OrderedDict()

    def judge(self, holder: Holder, task: dict[str, Any],
              policy: Policy) -> tuple[dict[str, Any], str, dict[str, Any]]:
        """The task as the client sees it, its id, and the answers the gateway gives the server
        (key -> result): those `policy` gives now, and those it gave before that the task still
        lists. jsonrpc.Withheld for a task the gateway cannot judge (see the module doc)."""
        task_id = task.get("taskId")
        requests = task.get("inputRequests")
        if not isinstance(task_id, str) or len(task_id) > MAX_ID:
            raise jsonrpc.Withheld("a task's input requests without a taskId the gateway can answer them for")
        if not isinstance(requests, dict) or len(requests) > MAX_INPUT_REQUESTS:
            raise jsonrpc.Withheld(f"a task's inputRequests that are not an object of at most "
                                   f"{MAX_INPUT_REQUESTS} requests")
        seen = self._seen(holder, task_id)
        shown: dict[str, Any] = {}
        answers: dict[str, Any] = {}
        for key, asked in requests.items():
            if key in seen.answered:
                answers[key] = seen.answered[key]
                continue
            params = asked.get("params", {}) if isinstance(asked, dict) else None
            if len(key) > MAX_ID or not isinstance(asked, dict) or not isinstance(params, dict):
                continue
            answer, relayed = policy(asked.get("method"), params)
            if answer is not None:
                seen.answer(key, answer)
                answers[key] = answer
            else:
                seen.show(key)
                shown[key] = asked if relayed is params else {**asked, "params": relayed}
        return {**task, "inputRequests": shown}, task_id, answers

    def check(self, holder: Holder, out: jsonrpc.Outgoing) -> None:
        """JsonRpcError for a POST whose `tasks/update` answers what the gateway did not show
        the caller for that task (see the module doc)."""
        for m in out.requests:
            if m.method != UPDATE:
                continue
            params = m.raw.get("params")
            task_id = params.get("taskId") if isinstance(params, dict) else None
            responses = params.get("inputResponses") if isinstance(params, dict) else None
            if not isinstance(task_id, str) or not isinstance(responses, dict):
                raise jsonrpc.JsonRpcError(jsonrpc.INVALID_PARAMS, "Invalid params: a tasks/update names "
                                           "its task (taskId, a string) and answers in inputResponses "
                                           "(an object)")
            seen = self._live(holder, task_id)
            if responses and (seen is None or any(key not in seen.shown for key in responses)):
                raise jsonrpc.JsonRpcError(jsonrpc.INVALID_PARAMS, _REFUSED)

    def _live(self, holder: Holder, task_id: str) -> _Task | None:
        seen = self._tasks.get((holder, task_id))
        if seen is None or seen.expires <= self._clock():
            return None
        return seen

    def _seen(self, holder: Holder, task_id: str) -> _Task:
        """The task's entry, created or kept, its time renewed."""
        now = self._clock()
        key = (holder, task_id)
        seen = self._tasks.pop(key, None)
        if seen is None or seen.expires <= now:
            seen = _Task(now + self._ttl)
        seen.expires = now + self._ttl
        self._tasks[key] = seen
        while self._tasks and (len(self._tasks) > self._limit
                               or next(iter(self._tasks.values())).expires <= now):
            self._tasks.popitem(last=False)
        return seen

    def __len__(self) -> int:
        return len(self._tasks)


def update(task_id: str, answers: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    """The `tasks/update` the gateway sends the server in the client's place, with the envelope
    of the client's request (its protocol version, capabilities and info) when it had one."""
    params: dict[str, Any] = {"taskId": task_id, "inputResponses": answers}
    if meta:
        params["_meta"] = meta
    request_id = "mcpcreds-" + secrets.token_urlsafe(12)
    return {"jsonrpc": "2.0", "id": request_id, "method": UPDATE, "params": params}


def envelope(body: bytes) -> dict[str, Any] | None:
    """The 2026-07-28 envelope of a client's POST (one request): the `_meta` members of `ENVELOPE`
    it carries; None when it carries none (a batch, a GET, the 2025 revisions)."""
    try:
        out = jsonrpc.parse_body(body) if body else None
    except jsonrpc.JsonRpcError:
        return None
    return envelope_of(out.messages[0].raw) if out is not None and not out.batch else None


def envelope_of(message: dict[str, Any]) -> dict[str, Any] | None:
    """The `ENVELOPE` members of a client's message's `_meta` (None: it carries none)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict):
        return None
    return {k: meta[k] for k in ENVELOPE if k in meta} or None
