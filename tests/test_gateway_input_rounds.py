"""The requestState tokens of the 2026-07-28 input rounds the gateway answers part of
(mcpcreds.protocol.input_rounds), on a fake clock: taken once, by the caller that got them, within
their time; the table bounded. And the input a task asks for (mcpcreds.protocol.task_input): judged
once per request, the gateway's answers sent again while the task still asks, a client's
`tasks/update` relayed only for what it was shown, what cannot be judged withheld; the Inspector
hands it every task state that carries input requests."""

from __future__ import annotations

from typing import Any

import pytest

from mcpcreds.protocol import jsonrpc
from mcpcreds.protocol.input_rounds import MAX_INPUT_REQUESTS, PREFIX, InputRounds
from mcpcreds.protocol.task_input import MAX_ID, TaskInputs, envelope, update

ME = ("crm", 1000, None)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_token_gives_back_the_servers_state_and_the_answers_once_to_its_holder() -> None:
    rounds = InputRounds(Clock())
    token = rounds.hold(ME, "server-state", {"ask": {"action": "decline"}})
    assert token.startswith(PREFIX) and "server-state" not in token
    assert rounds.take(("crm", 1000, "grant-1"), token) is None  # another caller (a grant) gets nothing
    assert rounds.take(ME, token) == ("server-state", {"ask": {"action": "decline"}})
    assert rounds.take(ME, token) is None  # used
    assert rounds.take(ME, PREFIX + "made-up") is None


def test_a_token_expires_and_the_table_is_bounded() -> None:
    clock = Clock()
    rounds = InputRounds(clock, ttl=60, limit=2)
    old = rounds.hold(ME, None, {})
    clock.now += 61
    assert rounds.take(ME, old) is None  # expired
    tokens = [rounds.hold(ME, n, {}) for n in range(3)]
    assert len(rounds) == 2 and rounds.take(ME, tokens[0]) is None  # the oldest went
    assert rounds.take(ME, tokens[2]) == (2, {})


ELICIT = {"method": "elicitation/create", "params": {"mode": "form", "message": "name?", "requestedSchema": {}}}
ROOTS = {"method": "roots/list", "params": {}}


class Judge:
    """The policy as the gateway applies it: roots answered, elicitations relayed; each call noted."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, method: Any, params: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        self.calls.append(method)
        return ({"roots": []}, params) if method == "roots/list" else (None, params)


def task(task_id: Any = "t-1", **requests: Any) -> dict[str, Any]:
    return {"resultType": "complete", "taskId": task_id, "status": "input_required", "inputRequests": requests}


def updating(task_id: Any, **responses: Any) -> jsonrpc.Outgoing:
    return jsonrpc.parse_body(jsonrpc.dumps({"jsonrpc": "2.0", "id": 9, "method": "tasks/update",
                                             "params": {"taskId": task_id, "inputResponses": responses}}))


def test_a_tasks_input_is_judged_once_and_the_gateways_answer_sent_again_while_it_is_asked() -> None:
    inputs, judge = TaskInputs(Clock()), Judge()
    shown, task_id, answers = inputs.judge(ME, task(name=ELICIT, where=ROOTS), judge)
    assert shown["inputRequests"] == {"name": ELICIT} and shown["status"] == "input_required"
    assert (task_id, answers) == ("t-1", {"where": {"roots": []}})
    # polled again before the server took the answer in: the same, the policy not asked again
    again = inputs.judge(ME, task(name=ELICIT, where=ROOTS), judge)
    assert again == (shown, "t-1", answers) and judge.calls == ["elicitation/create", "roots/list", "elicitation/create"]
    inputs.check(ME, updating("t-1", name={"action": "accept", "content": {"n": "Ada"}}))  # shown: relayed
    inputs.check(ME, updating("t-1"))  # answers nothing


@pytest.mark.parametrize(("holder", "task_id", "responses"), [
    (ME, "t-1", {"where": {"roots": ["file:///x"]}}),  # answered by the gateway
    (ME, "t-1", {"other": {"action": "accept"}}),  # never shown
    (ME, "t-2", {"name": {"action": "decline"}}),  # shown for another task
    (("crm", 1000, "grant-1"), "t-1", {"name": {"action": "decline"}}),  # shown to another caller
    (ME, "t-1", {"name": {"action": "decline"}, "WHERE": {"roots": []}}),  # another spelling of an answered one
])
def test_a_tasks_update_answering_what_its_caller_was_not_shown_is_refused(
        holder: Any, task_id: str, responses: dict[str, Any]) -> None:
    inputs = TaskInputs(Clock())
    inputs.judge(ME, task(name=ELICIT, where=ROOTS), Judge())
    with pytest.raises(jsonrpc.JsonRpcError) as refused:
        inputs.check(holder, updating(task_id, **responses))
    assert refused.value.code == jsonrpc.INVALID_PARAMS
    for bad in ({"taskId": 1, "inputResponses": {}}, {"taskId": "t-1", "inputResponses": []}, {"taskId": "t-1"}):
        with pytest.raises(jsonrpc.JsonRpcError):
            inputs.check(ME, jsonrpc.parse_body(jsonrpc.dumps(
                {"jsonrpc": "2.0", "id": 9, "method": "tasks/update", "params": bad})))


def test_a_task_the_gateway_cannot_judge_is_withheld_and_an_unreadable_request_never_shown() -> None:
    inputs = TaskInputs(Clock())
    for bad in (task(None, name=ELICIT), task("x" * (MAX_ID + 1), name=ELICIT),
                {**task(), "inputRequests": [ELICIT]},
                task(**{f"k{n}": ELICIT for n in range(MAX_INPUT_REQUESTS + 1)})):
        with pytest.raises(jsonrpc.Withheld):
            inputs.judge(ME, bad, Judge())
    shown, _, answers = inputs.judge(ME, task(a="elicit", b={"method": "elicitation/create", "params": "x"},
                                              **{"k" * (MAX_ID + 1): ELICIT}), Judge())
    assert shown["inputRequests"] == {} and answers == {}


def test_the_tasks_are_forgotten_after_their_time_and_the_table_is_bounded() -> None:
    clock = Clock()
    inputs = TaskInputs(clock, ttl=60, limit=2)
    inputs.judge(ME, task("t-1", name=ELICIT), Judge())
    clock.now += 61
    with pytest.raises(jsonrpc.JsonRpcError):  # forgotten: polled again, it is shown again
        inputs.check(ME, updating("t-1", name={"action": "decline"}))
    for n in range(3):
        inputs.judge(ME, task(f"t-{n}", name=ELICIT), Judge())
    assert len(inputs) == 2
    with pytest.raises(jsonrpc.JsonRpcError):
        inputs.check(ME, updating("t-0", name={"action": "decline"}))  # the least recently seen went
    inputs.check(ME, updating("t-2", name={"action": "decline"}))


def test_the_gateways_tasks_update_carries_the_clients_envelope() -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
            "progressToken": 3}
    body = jsonrpc.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "t", "_meta": meta}})
    kept = envelope(body)
    assert kept == {k: v for k, v in meta.items() if k != "progressToken"}
    sent = update("t", {"where": {"roots": []}}, kept)
    assert sent["method"] == "tasks/update" and sent["params"] == {
        "taskId": "t", "inputResponses": {"where": {"roots": []}}, "_meta": kept}
    assert envelope(b"") is None and envelope(b"[1]") is None
    assert "_meta" not in update("t", {}, None)["params"]


def test_the_inspector_hands_over_every_task_state_that_carries_input_requests() -> None:
    from mcpcreds.core.policy import TrustPolicy

    seen: list[dict[str, Any]] = []

    def hook(state: dict[str, Any]) -> dict[str, Any]:
        seen.append(state)
        return {**state, "inputRequests": {}}
    inspector = jsonrpc.Inspector(TrustPolicy("trusted"), pending={("n", 1): "tasks/get"},
                                  on_input_required=lambda result: result, on_task_input=hook)
    answered = jsonrpc.loads(inspector.json_body(jsonrpc.dumps({"jsonrpc": "2.0", "id": 1, "result": task(
        name=ELICIT)})) or b"")
    assert answered["result"]["inputRequests"] == {} and seen[-1]["taskId"] == "t-1"
    notice = {"jsonrpc": "2.0", "method": "notifications/tasks", "params": task(name=ELICIT)}
    event = inspector.event(b"data: " + jsonrpc.dumps(notice) + b"\n\n")
    assert b"elicitation" not in event and len(seen) == 2
    # an input round's result is the round's (input_rounds), a task without input requests nobody's
    inspector.json_body(jsonrpc.dumps({"jsonrpc": "2.0", "id": 2, "result": {
        "resultType": "input_required", "inputRequests": {"name": ELICIT}}}))
    inspector.json_body(jsonrpc.dumps({"jsonrpc": "2.0", "id": 3, "result": {"taskId": "t", "status": "working"}}))
    assert len(seen) == 2
    # a key that reads as a member the gateway judges is withheld
    assert inspector.json_body(jsonrpc.dumps({"jsonrpc": "2.0", "id": 4, "result": {
        "taskid": "t", "inputRequests": {}}})) is None
