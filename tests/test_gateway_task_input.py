"""The input a 2026-07-28 task asks for goes through the same policy as any request of a server's,
end to end: raw requests of a client of the tasks extension through the gateway (on the socket and
on the loopback listener) to a real MCP SDK 2.x server whose `survey` task asks for a form
elicitation and the roots (tests/peers/mcp_eras_peer.py). What the policy answers reaches the
server in a `tasks/update` of the gateway's own and never the client; what it lets through
reaches the client, and the client's answer the server; a client's `tasks/update` answering what
it was not shown never reaches the server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpcreds import AsyncClient
from tests.peers.mcp_eras_peer import TASKS, start_eras_peer
from tests.peers.process import PeerHandle
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_gateway import audit, eventually, raw_client
from tests.test_gateway_tcp import listening

MODERN = "2026-07-28"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TOOLS = '["survey", "slow"]'
CLIENT_ROOT = {"uri": "file:///home/agent/client-root"}
ASKED = {"mode": "form", "message": "Who runs this survey?", "requestedSchema": {
    "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}


@pytest.fixture(scope="module")
def peer() -> Iterator[PeerHandle]:
    with start_eras_peer() as server:
        yield server


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("task-input")


@pytest.fixture(scope="module")
def sidecar(peer: PeerHandle, workdir: Path) -> Iterator[SidecarProcess]:
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"

    def server(name: str, keys: str) -> str:
        return f'\n[[servers]]\nname = "{name}"\nendpoint = "{peer.url}"\n{keys}\n'
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[gateway]
listen = "127.0.0.1:0"
{server("sandboxed", f'trust = "sandboxed"{chr(10)}tool_allowlist = {TOOLS}')}
{server("no-elicit", f'trust = "untrusted"{chr(10)}tool_allowlist = {TOOLS}{chr(10)}elicitation_enabled = false')}
{server("trusted", 'trust = "trusted"')}
{server("rooted", 'trust = "trusted"' + chr(10) + 'roots = ["file:///srv/project"]')}
""")
    with run_sidecar(config, socket) as proc:
        yield proc


def meta() -> dict[str, Any]:
    caps: dict[str, Any] = {"elicitation": {"form": {}}, "roots": {}, "extensions": {TASKS: {}}}
    return {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": caps}


def rpc(id_: int, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": {**params, "_meta": meta()}}


class Tasks:
    """A client of the tasks extension on one server, through one relay."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url

    async def post(self, message: dict[str, Any]) -> httpx.Response:
        return await self.http.post(self.url, json=message, headers=HEADERS)

    async def survey(self) -> str:
        created = (await self.post(rpc(1, "tools/call", name="survey", arguments={}))).json()["result"]
        assert created["resultType"] == "task"
        return str(created["taskId"])

    async def get(self, task_id: str) -> dict[str, Any]:
        # with the routing headers a client of the extension sends (Mcp-Name: the task's id)
        answer = await self.http.post(self.url, json=rpc(2, "tasks/get", taskId=task_id), headers={
            **HEADERS, "Mcp-Method": "tasks/get", "Mcp-Name": task_id, "MCP-Protocol-Version": MODERN})
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()["result"]
        return result

    async def update(self, task_id: str, **responses: Any) -> httpx.Response:
        return await self.post(rpc(3, "tasks/update", taskId=task_id, inputResponses=responses))


@asynccontextmanager
async def tasks(sidecar: SidecarProcess, relay: str, name: str) -> AsyncIterator[Tasks]:
    if relay == "socket":
        async with AsyncClient(sidecar.socket) as creds, creds.mcp_http_client(name) as http:
            yield Tasks(http, creds.mcp_url(name))
    else:
        async with httpx.AsyncClient(timeout=30) as http:
            yield Tasks(http, f"http://{listening(sidecar)}/mcp/{name}")


def updates(peer: PeerHandle, task_id: str) -> list[dict[str, Any]]:
    return [u for u in peer.stats()["updates"] if u["taskId"] == task_id]


def answers(result: dict[str, Any]) -> dict[str, Any]:
    assert result["status"] == "completed", result
    answered: dict[str, Any] = json.loads(result["result"]["content"][0]["text"])
    return answered


@pytest.mark.parametrize("relay", ["socket", "tcp"])
@pytest.mark.parametrize(("name", "reason"), [("sandboxed", "sandboxed"), ("no-elicit", "elicitation_enabled")])
async def test_a_task_elicitation_the_server_may_not_make_never_reaches_the_client_and_the_server_gets_the_decline(
        peer: PeerHandle, sidecar: SidecarProcess, workdir: Path, relay: str, name: str, reason: str) -> None:
    audited = len(audit(workdir, "elicitation"))
    counted = await declined_count(sidecar, name)
    async with tasks(sidecar, relay, name) as client:
        task_id = await client.survey()
        waiting = await client.get(task_id)
        declined: dict[str, Any] = {"name": {"action": "decline"}}
        if name == "sandboxed":  # the roots too: a sandboxed server gets none, and the client is never asked
            assert waiting["status"] == "input_required" and waiting["inputRequests"] == {}
            declined["where"] = {"roots": []}
        else:  # an untrusted server's roots/list is the client's to answer
            assert waiting["inputRequests"] == {"where": {"method": "roots/list", "params": {}}}
        await eventually(lambda: updates(peer, task_id))
        [sent] = updates(peer, task_id)
        assert sent["inputResponses"] == declined and sent["id"].startswith("mcpcreds-")
        headers = [p for p in peer.stats()["posts"] if p["method"] == "tasks/update"][-1]["headers"]
        assert headers == {"mcp-protocol-version": MODERN, "mcp-method": "tasks/update", "mcp-name": task_id}
        if name == "no-elicit":
            assert (await client.update(task_id, where={"roots": [CLIENT_ROOT]})).json()["result"]["resultType"] == \
                "complete"
            declined["where"] = {"roots": [CLIENT_ROOT]}
        assert answers(await client.get(task_id)) == declined
    # one audit line and one count per request declined, however often the task was polled
    assert [(e["server"], e["mode"], e["action"], e["reason"]) for e in audit(workdir, "elicitation")[audited:]] \
        == [(name, "form", "declined", reason)]
    assert await declined_count(sidecar, name) == counted + 1


async def declined_count(sidecar: SidecarProcess, name: str) -> float:
    async with raw_client(sidecar) as http:
        scraped = (await http.get("/metrics")).text
    wanted = f'mcpcreds_gateway_elicitations_total{{server="{name}",outcome="declined"}} '
    return next((float(line[len(wanted):]) for line in scraped.splitlines() if line.startswith(wanted)), 0.0)


async def test_a_trusted_servers_task_input_reaches_the_client_and_its_answers_reach_the_server(
        peer: PeerHandle, sidecar: SidecarProcess) -> None:
    async with tasks(sidecar, "socket", "trusted") as client:
        task_id = await client.survey()
        waiting = await client.get(task_id)
        assert waiting["inputRequests"] == {"name": {"method": "elicitation/create", "params": ASKED},
                                            "where": {"method": "roots/list", "params": {}}}
        assert (await client.get(task_id))["inputRequests"] == waiting["inputRequests"]  # polled again: the same
        given = {"name": {"action": "accept", "content": {"name": "Ada"}}, "where": {"roots": [CLIENT_ROOT]}}
        assert (await client.update(task_id, **given)).json()["result"]["resultType"] == "complete"
        assert answers(await client.get(task_id)) == given
    assert [u["inputResponses"] for u in updates(peer, task_id)] == [given]  # the client's only


async def test_roots_inside_a_task_are_answered_from_the_config_and_the_elicitation_is_the_clients(
        peer: PeerHandle, sidecar: SidecarProcess) -> None:
    async with tasks(sidecar, "tcp", "rooted") as client:
        task_id = await client.survey()
        assert (await client.get(task_id))["inputRequests"] == {
            "name": {"method": "elicitation/create", "params": ASKED}}
        await eventually(lambda: updates(peer, task_id))
        assert updates(peer, task_id)[0]["inputResponses"] == {"where": {"roots": [{"uri": "file:///srv/project"}]}}
        accepted = {"action": "accept", "content": {"name": "Ada"}}
        assert (await client.update(task_id, name=accepted)).status_code == 200
        assert answers(await client.get(task_id)) == {"name": accepted, "where": {"roots": [{"uri": "file:///srv/project"}]}}


@pytest.mark.parametrize("relay", ["socket", "tcp"])
async def test_a_tasks_update_answering_what_the_client_was_not_shown_is_refused(
        peer: PeerHandle, sidecar: SidecarProcess, relay: str) -> None:
    async with tasks(sidecar, relay, "rooted") as client:
        task_id = await client.survey()
        before = await client.update(task_id, where={"roots": [CLIENT_ROOT]})  # nothing shown yet
        assert before.status_code == 400 and before.json()["error"]["code"] == -32602
        await client.get(task_id)
        await eventually(lambda: updates(peer, task_id))
        forged: list[dict[str, Any]] = [{"where": {"roots": [CLIENT_ROOT]}},  # the gateway answered it itself
                                        {"name": {"action": "accept", "content": {"name": "Mallory"}},
                                         "where": {"roots": []}},
                                        {"made-up": {"action": "accept"}}]  # never shown
        for responses in forged:
            refused = await client.update(task_id, **responses)
            assert refused.status_code == 400 and refused.json()["error"]["code"] == -32602, refused.text
            assert refused.json()["id"] == 3
        assert (await client.update("task-unknown", name={"action": "decline"})).json()["error"]["code"] == -32602
        assert len(updates(peer, task_id)) == 1  # the gateway's own: nothing forged was forwarded
        assert (await client.update(task_id, name={"action": "decline"})).status_code == 200  # what it was shown
        assert len(updates(peer, task_id)) == 2


async def test_a_task_notification_on_a_listen_stream_is_judged_like_a_poll(
        peer: PeerHandle, sidecar: SidecarProcess) -> None:
    async with tasks(sidecar, "socket", "sandboxed") as client:
        task_id = await client.survey()
        listen = rpc(5, "subscriptions/listen", notifications={"taskIds": [task_id]})
        events = await client.post(listen)
        frames = [json.loads(line[5:]) for line in events.text.splitlines() if line.startswith("data:")]
        assert [f["method"] for f in frames] == ["notifications/subscriptions/acknowledged", "notifications/tasks"]
        assert frames[1]["params"]["status"] == "input_required" and frames[1]["params"]["inputRequests"] == {}
        await eventually(lambda: updates(peer, task_id))
        assert updates(peer, task_id)[0]["inputResponses"] == {"name": {"action": "decline"}, "where": {"roots": []}}
        assert answers(await client.get(task_id))["name"] == {"action": "decline"}
