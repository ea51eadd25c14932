"""Traces (`[telemetry]`, telemetry/): OpenTelemetry spans of gateway requests, logins and token
requests, after the OpenTelemetry semantic conventions for MCP.

The real sidecar, its spans taken by the SDK's in-memory exporter (tests/peers/traced_sidecar.py)
or sent by its OTLP/HTTP exporter to a receiver here that decodes them with opentelemetry-proto;
the upstream is a real MCP server of both eras (the MCP SDK's, tests/peers/mcp_eras_peer.py),
which records the trace context it receives (headers and `_meta`) and its own spans (the SDK's
server middleware reads `_meta`); logins come from a token endpoint that records the
`traceparent` it receives (tests/peers/fault_idp.py).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from mcpcreds import AsyncClient
from tests.conftest import CANARY
from tests.peers.fault_idp import FaultIdp, fault_idp
from tests.peers.mcp_eras_peer import start_eras_peer
from tests.peers.process import PeerHandle
from tests.sidecar_proc import SidecarProcess
from tests.test_cli_imports import imported

ROOT = Path(__file__).resolve().parents[1]
MODERN = "2026-07-28"
SECRET = "trace-agent-secret"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PYTHONPATH = {"PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "src")))}
# the callers' trace contexts: a (HTTP headers, 2025 era), b (`_meta`, 2026-07-28), c (the headers beside b)
TRACE_A, SPAN_A = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACE_B, SPAN_B = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACE_C, SPAN_C = "5cf92f3577b34da6a3ce929d0e0e4737", "11f067aa0ba902b8"
TRACE_D, SPAN_D = "6df92f3577b34da6a3ce929d0e0e4738", "22f067aa0ba902b9"  # with traces off


def traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def config_text(workdir: Path, peer: str, idp: FaultIdp | None, telemetry: str = "") -> str:
    auth = (f'auth = {{ kind = "oauth2", client_id = "agent", client_secret = "{{{{secret:TRACE_SECRET}}}}", '
            f'token_url = "{idp.token_url}" }}' if idp is not None else "")
    return f"""
[sidecar]
socket = "{workdir / 'run' / 'mcpcreds.sock'}"
audit_log = "{workdir / 'audit.jsonl'}"

[secrets]
sources = ["env"]

[[servers]]
name = "eras"
endpoint = "{peer}"
trust = "untrusted"
tool_allowlist = ["add"]
rate = "100/1s"
{auth}
{telemetry}
"""


def sidecar_of(workdir: Path, text: str, wrapper: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> SidecarProcess:
    (workdir / "config.toml").write_text(text)
    proc = SidecarProcess(workdir / "config.toml", workdir / "run" / "mcpcreds.sock",
                          {**PYTHONPATH, "TRACE_SECRET": SECRET, **(env or {})}, wrapper)
    try:
        proc.wait_for("ready")
    except BaseException:
        proc.stop()
        raise
    return proc


def init(id_: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "traces", "version": "0"}}}


def add(id_: int, tool: str = "add", meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": {"a": 2, "b": 3}}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}


def modern_meta(**trace: str) -> dict[str, Any]:
    return {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {}, **trace}


def answer_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a POST, in a JSON body or the SSE stream's data."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()]
        return dict(json.loads(data[-1]))
    return dict(response.json())


def audit_lines(workdir: Path, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in (workdir / "audit.jsonl").read_text().splitlines()]
    return [line for line in lines if line["event"] == event]


# ---------------------------------------------------------------------------- the in-memory exporter


@pytest.fixture(scope="module")
def idp() -> Iterator[FaultIdp]:
    with fault_idp() as server:
        yield server


@pytest.fixture(scope="module")
def peer() -> Iterator[PeerHandle]:
    with start_eras_peer(spans=True) as server:
        yield server


class Run:
    """What one traced sidecar did: its spans, the upstream's record, the audit log."""

    def __init__(self, spans: list[dict[str, Any]], posts: list[dict[str, Any]],
                 upstream_spans: list[dict[str, Any]], workdir: Path, session: str,
                 token_requests: list[str | None]) -> None:
        self.token_requests = token_requests  # the traceparent of each token request
        self.spans = spans
        self.posts = posts
        self.upstream_spans = upstream_spans
        self.workdir = workdir
        self.session = session

    def named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"] == name]

    def one(self, **attributes: Any) -> dict[str, Any]:
        found = [s for s in self.spans if s["kind"] == "SERVER"
                 and all(s["attributes"].get(k) == v for k, v in attributes.items())]
        assert len(found) == 1, (attributes, [s["name"] for s in self.spans])
        return found[0]

    def children(self, span: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {s["name"] if s["kind"] != "CLIENT" else "upstream": s for s in self.spans
                if s["parent_id"] == span["span_id"]}


@pytest.fixture(scope="module")
def run(idp: FaultIdp, peer: PeerHandle, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A traced sidecar: a 2025 session (initialize, then a call with its trace in the HTTP
    headers), a 2026-07-28 call with its trace in `_meta` (and another in the headers), a call the
    policy refuses, a call with no trace context; then stopped, its spans read."""
    workdir = tmp_path_factory.mktemp("traces")
    out = workdir / "spans.jsonl"
    before, tokens = len(peer.stats()["posts"]), len(idp.traceparents)  # the peers serve the module
    sidecar = sidecar_of(workdir, config_text(workdir, peer.url, idp),
                         wrapper=(sys.executable, "-m", "tests.peers.traced_sidecar", str(out)))

    async def calls() -> str:
        async with AsyncClient(sidecar.socket) as creds, creds.mcp_http_client("eras") as http:
            url = creds.mcp_url("eras")
            opened = await http.post(url, json=init(1), headers=HEADERS)
            session = opened.headers["mcp-session-id"]
            in_session = {**HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
            await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=in_session)
            a = await http.post(url, json=add(2), headers={**in_session, "traceparent": traceparent(TRACE_A, SPAN_A)})
            assert answer_of(a)["result"]["content"][0]["text"] == "5"
            b = await http.post(url, json=add(3, meta=modern_meta(traceparent=traceparent(TRACE_B, SPAN_B),
                                                                  tracestate="congo=t61rcWkgMzE")),
                                headers={**HEADERS, "traceparent": traceparent(TRACE_C, SPAN_C)})
            assert answer_of(b)["result"]["content"][0]["text"] == "5"
            refused = await http.post(url, json=add(4, "hidden"), headers=in_session)
            assert answer_of(refused)["error"]["code"] == -32602
            plain = await http.post(url, json=add(5), headers=in_session)
            assert answer_of(plain)["result"]["content"][0]["text"] == "5"
            odd = await http.post(url, json=add(6), headers={**in_session, "tracestate": f"{CANARY} x",
                                                             "traceparent": traceparent(TRACE_A, SPAN_A)})
            assert answer_of(odd)["result"]["content"][0]["text"] == "5"
            return session

    import asyncio

    try:
        session = asyncio.run(calls())
    finally:
        assert sidecar.stop() == 0, sidecar.log
    spans = [json.loads(line) for line in out.read_text().splitlines()]
    upstream_spans = httpx.get(f"{peer.base}/_test/spans").json()
    assert CANARY not in sidecar.log  # a caller's tracestate the API refuses is not logged either
    return Run(spans, peer.stats()["posts"][before:], upstream_spans, workdir, session, idp.traceparents[tokens:])


def test_a_tool_call_is_a_server_span_with_the_mcp_attributes_and_its_parts_as_children(run: Run) -> None:
    server = run.one(**{"jsonrpc.request.id": "2"})
    assert server["name"] == "tools/call add"
    assert server["trace_id"] == TRACE_A and server["parent_id"] == SPAN_A and server["parent_remote"]
    attributes = server["attributes"]
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["gen_ai.tool.name"] == "add" and attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["mcp.protocol.version"] == "2025-11-25"
    # the session as a digest: the id itself lets whoever holds it use the session
    assert attributes["mcp.session.id"] == hashlib.sha256(run.session.encode()).hexdigest()[:32]
    assert run.session not in json.dumps(run.spans)
    assert attributes["mcpcreds.server"] == "eras" and attributes["http.response.status_code"] == 200
    assert server["status"] == "UNSET" and "error.type" not in attributes
    parts = run.children(server)
    assert set(parts) == {"policy", "credential", "permit wait", "upstream"}
    assert parts["permit wait"]["attributes"]["mcpcreds.permits"] == 1
    assert parts["policy"]["attributes"]["mcpcreds.policy.refused"] is False
    upstream = parts["upstream"]
    assert upstream["name"] == "tools/call add" and upstream["kind"] == "CLIENT"
    assert upstream["attributes"]["network.transport"] == "tcp"
    assert upstream["attributes"]["server.address"] == "127.0.0.1"
    assert upstream["attributes"]["http.response.status_code"] == 200
    # each part within the request: the upstream after the permit, the request ending last
    assert server["start"] <= parts["permit wait"]["end"] <= upstream["start"] <= upstream["end"] <= server["end"]


def test_the_upstream_gets_the_gateway_span_as_parent_in_the_headers_of_a_2025_request(run: Run) -> None:
    upstream = run.children(run.one(**{"jsonrpc.request.id": "2"}))["upstream"]
    post = next(p for p in run.posts if p["method"] == "tools/call")
    # the caller's context was replaced by the gateway's CLIENT span; the body was left alone
    assert post["trace"]["headers"] == {"traceparent": traceparent(TRACE_A, upstream["span_id"])}
    assert post["trace"]["meta"] == {}


def test_a_2026_request_is_parented_by_its_meta_and_its_upstream_server_span_by_the_gateway(run: Run) -> None:
    server = run.one(**{"jsonrpc.request.id": "3"})
    # `_meta` is the parent, the HTTP headers' context a link (the conventions' choice)
    assert server["trace_id"] == TRACE_B and server["parent_id"] == SPAN_B
    assert server["links"] == [SPAN_C]
    assert server["attributes"]["mcp.protocol.version"] == MODERN
    upstream = run.children(server)["upstream"]
    post = [p for p in run.posts if p["method"] == "tools/call"][1]
    sent = traceparent(TRACE_B, upstream["span_id"])
    assert post["trace"]["meta"] == {"traceparent": sent, "tracestate": "congo=t61rcWkgMzE"}
    assert post["trace"]["headers"] == {"traceparent": sent, "tracestate": "congo=t61rcWkgMzE"}
    # the MCP SDK's server read it from `_meta`: its span is the child of the gateway's CLIENT span
    theirs = [s for s in run.upstream_spans if s["trace_id"] == TRACE_B and s["kind"] == "SERVER"]
    assert [(s["name"], s["parent_id"]) for s in theirs] == [("tools/call add", upstream["span_id"])]


def test_a_refused_call_names_no_tool_and_ends_in_error(run: Run) -> None:
    server = run.one(**{"jsonrpc.request.id": "4"})
    assert server["name"] == "tools/call"  # a tool the policy does not expose is no span name
    assert server["status"] == "ERROR" and server["attributes"]["error.type"] == "-32602"
    assert server["attributes"]["rpc.response.status_code"] == "-32602"
    parts = run.children(server)
    assert set(parts) == {"policy"} and parts["policy"]["attributes"]["mcpcreds.policy.refused"] is True


def test_a_request_without_trace_context_starts_a_trace(run: Run) -> None:
    server = run.one(**{"jsonrpc.request.id": "5"})
    assert server["parent_id"] is None and server["trace_id"] not in (TRACE_A, TRACE_B, TRACE_C)
    assert "upstream" in run.children(server)


def test_the_login_is_under_the_credential_of_the_request_that_waited_for_it(run: Run, idp: FaultIdp) -> None:
    opened = run.one(**{"mcp.method.name": "initialize"})
    credential = run.children(opened)["credential"]
    (login,) = [s for s in run.spans if s["parent_id"] == credential["span_id"]]
    assert login["name"] == "login mcp:eras"
    assert login["attributes"]["mcpcreds.login.grant"] == "client_credentials"
    (post,) = [s for s in run.spans if s["parent_id"] == login["span_id"]]
    assert post["name"] == "POST" and post["kind"] == "CLIENT"
    assert post["attributes"]["http.response.status_code"] == 200
    assert post["attributes"]["url.full"] == idp.token_url
    (sent,) = run.token_requests  # its flags: sampled (and, for a trace begun here, random)
    assert sent is not None
    assert sent.rsplit("-", 1)[0] == f"00-{opened['trace_id']}-{post['span_id']}" and int(sent[-2:], 16) & 1
    assert run.named("login mcp:eras") == [login]  # once: the later requests used the login held


def test_each_tool_call_audit_line_names_its_trace(run: Run) -> None:
    calls = audit_lines(run.workdir, "tool_call")
    by_trace = {line["trace_id"]: line["status"] for line in calls}
    assert by_trace[TRACE_A] == "ok" and by_trace[TRACE_B] == "ok"
    assert by_trace[run.one(**{"jsonrpc.request.id": "4"})["trace_id"]] == "refused"
    assert by_trace[run.one(**{"jsonrpc.request.id": "5"})["trace_id"]] == "ok"
    assert len(calls) == 5


# ---------------------------------------------------------------------------- OTLP/HTTP, and off


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: what arrives is decoded with opentelemetry-proto."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[tuple[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.paths.append((self.path, self.headers.get("Content-Type", "")))
                receiver.requests.append(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) of every span received."""
        out = []
        for request in self.requests:
            for resource in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
                out += [(attributes, span) for scope in resource.scope_spans for span in scope.spans]
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_otlp_exporter_sends_the_spans_to_the_collector(peer: PeerHandle, tmp_path: Path) -> None:
    receiver = Receiver()
    telemetry = (f'[telemetry]\nexporter = "otlp"\nendpoint = "{receiver.url}"\nservice_name = "gw-test"\n'
                 'sample_ratio = 0')  # new traces are not recorded; a caller's sampled one is
    sidecar = sidecar_of(tmp_path, config_text(tmp_path, peer.url, None, telemetry),
                         env={"PYTHONPROFILEIMPORTTIME": "1"})
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sidecar.socket)), base_url="http://x") as http:
            sampled = http.post("/mcp/eras", json=add(7, meta=modern_meta()),
                                headers={**HEADERS, "traceparent": traceparent(TRACE_A, SPAN_A)})
            assert answer_of(sampled)["result"]["content"][0]["text"] == "5"
            unsampled = http.post("/mcp/eras", json=add(8, meta=modern_meta()), headers=HEADERS)
            assert answer_of(unsampled)["result"]["content"][0]["text"] == "5"
    finally:
        assert sidecar.stop() == 0, sidecar.log  # stopping sends what is queued
        receiver.close()
    assert receiver.paths and all(p == ("/v1/traces", "application/x-protobuf") for p in receiver.paths)
    received = receiver.spans()
    assert {span.trace_id.hex() for _, span in received} == {TRACE_A}  # the unsampled trace: not sent
    assert all(resource["service.name"] == "gw-test" for resource, _ in received)
    (server,) = [span for _, span in received if span.kind == span.SPAN_KIND_SERVER]
    assert server.name == "tools/call add" and server.parent_span_id.hex() == SPAN_A
    attributes = {a.key: a.value.string_value or a.value.int_value for a in server.attributes}
    assert attributes["mcp.method.name"] == "tools/call" and attributes["jsonrpc.request.id"] == "7"
    names = {span.name for _, span in received if span.parent_span_id == server.span_id}
    assert names == {"policy", "credential", "permit wait", "tools/call add"}
    assert "opentelemetry.sdk.trace" in imported(sidecar.log)  # what the next test looks for
    assert importers(sidecar.log, "opentelemetry")["opentelemetry.sdk.trace"] == "mcpcreds.telemetry.export"
    # the audit line of each call names its trace, recorded or not
    traces = [line.get("trace_id") for line in audit_lines(tmp_path, "tool_call")]
    assert traces[0] == TRACE_A and traces[1] is not None and traces[1] != TRACE_A


def importers(stderr: str, package: str) -> dict[str, str]:
    """Each module of `package` that `-X importtime` reports, and the module outside `package` whose
    import brought it in (its nearest such ancestor in the report's tree, which lists a module after
    the modules it imported, each indented two spaces a level)."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1]
            if name.strip() != "imported package":
                rows.append(((len(name) - len(name.lstrip())) // 2, name.strip()))
    found = {}
    for i, (depth, name) in enumerate(rows):
        if name.split(".")[0] != package:
            continue
        for above, importer in rows[i + 1:]:
            if above < depth:
                depth = above
                if importer.split(".")[0] != package:
                    found[name] = importer
                    break
        else:
            found[name] = "(the program)"
    return found


def test_with_traces_off_the_sidecar_imports_nothing_of_opentelemetry(peer: PeerHandle, idp: FaultIdp,
                                                                     tmp_path: Path) -> None:
    """A login and a call through the gateway, and not one OpenTelemetry module imported by
    mcpcreds (the MCP SDK the tests use imports it: the sidecar never does). redis-py imports the
    SDK's metrics by itself when the SDK is installed, and the sidecar imports redis: those are
    redis's."""
    sidecar = sidecar_of(tmp_path, config_text(tmp_path, peer.url, idp), env={"PYTHONPROFILEIMPORTTIME": "1"})
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sidecar.socket)), base_url="http://x") as http:
            called = http.post("/mcp/eras", json=add(2, meta=modern_meta(traceparent=traceparent(TRACE_D, SPAN_D))),
                               headers={**HEADERS, "traceparent": traceparent(TRACE_D, SPAN_A)})
            assert answer_of(called)["result"]["content"][0]["text"] == "5"
    finally:
        assert sidecar.stop() == 0, sidecar.log
    modules = imported(sidecar.log)
    assert "mcpcreds.gateway.relay" in modules and "mcpcreds.credentials.oauth" in modules
    assert "mcpcreds.telemetry.switch" in modules
    assert not modules & {"mcpcreds.telemetry.spans", "mcpcreds.telemetry.export", "opentelemetry.sdk.trace"}
    brought_by = set(importers(sidecar.log, "opentelemetry").values())
    assert {m for m in brought_by if m.split(".")[0] != "redis"} == set(), brought_by
    assert "trace_id" not in (tmp_path / "audit.jsonl").read_text()
    # and the caller's own context goes upstream untouched
    post = [p for p in peer.stats()["posts"] if p["method"] == "tools/call"][-1]
    assert post["trace"] == {"headers": {"traceparent": traceparent(TRACE_D, SPAN_A)},
                             "meta": {"traceparent": traceparent(TRACE_D, SPAN_D)}}
