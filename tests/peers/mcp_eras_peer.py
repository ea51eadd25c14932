"""A real MCP server that speaks both protocol eras (the MCP Python SDK 2.x under uvicorn: the 2025
handshake and 2026-07-28's per-request envelope), for tests/test_gateway_eras.py.

Tools: ``add(a, b)``; ``ask()`` elicits a name (a request mid-call in the 2025 revisions, an
``input_required`` result in 2026-07-28); ``grow()`` adds a tool ``grown`` and announces the
change (``notifications/tools/list_changed``: on the GET stream, or on a ``subscriptions/listen``
stream); ``region(region, query)`` mirrors its ``region`` argument into ``Mcp-Param-Region``
(``x-mcp-header``); ``hidden()``, which the tests' allowlists leave out; ``slow(text)`` is, for
a client that declares the tasks extension (``io.modelcontextprotocol/tasks``), answered with a
task (``resultType: "task"``) that ``tasks/get`` reports ``working`` twice, then ``completed``;
``survey()`` is always a task (for such a client) that waits for input: ``tasks/get`` reports it
``input_required`` with two ``inputRequests`` (``name``: a form elicitation, ``where``:
``roots/list``) until ``tasks/update`` has answered both, then ``completed`` with the answers as
JSON text. A ``subscriptions/listen`` naming ``notifications.taskIds`` is answered (by the test
app, not the SDK) with an SSE stream: the acknowledgement, then a ``notifications/tasks`` per
task, as ``tasks/get`` would report it. ``tools/list`` carries ``ttlMs`` / ``cacheScope`` (30 s,
private; with ``--public``, 30 s public, and so does ``server/discover``).

``GET /_test/stats`` gives ``{"methods": {...}, "calls": {...}, "elicitations": [...],
"posts": [{"method", "headers": {mcp-*: value}, "trace": {"headers": {...}, "meta": {...}}}, ...],
"updates": [{"id", "taskId", "inputResponses"}, ...]}`` (the last 200 POSTs' headers; ``trace``: the
``traceparent`` and ``tracestate`` of its headers and of its message's ``params._meta``; every
``tasks/update``).

With ``--spans`` the SDK's own OpenTelemetry spans (its server middleware, on by default) are
recorded (the SDK's in-memory exporter, on the process's global tracer provider):
``GET /_test/spans`` gives the last 500 as ``[{"name", "kind", "trace_id", "span_id", "parent_id",
"attributes"}, ...]`` (ids in hex, ``parent_id`` null for a root).

Run it as ``python -m tests.peers.mcp_eras_peer [--spans] [--public]``: it prints ``READY <base url>``; from a
test: ``with start_eras_peer() as peer: peer.url``. ``python -m tests.peers.mcp_eras_peer stdio`` serves
the same tools over stdio.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field

from tests.peers.asgi import buffered, send_json, serve_on_loopback
from tests.peers.process import PeerHandle, ready_process

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[2]
TASKS = "io.modelcontextprotocol/tasks"
CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
TRACE_KEYS = (b"traceparent", b"tracestate")
TRACE_META = ("traceparent", "tracestate")


class Name(BaseModel):
    name: str


class TaskParams(BaseModel):
    model_config = {"extra": "allow"}
    taskId: str  # the wire's name


class UpdateParams(BaseModel):
    model_config = {"extra": "allow"}
    taskId: str
    inputResponses: dict[str, Any]


SURVEY = {"name": {"method": "elicitation/create", "params": {
              "mode": "form", "message": "Who runs this survey?", "requestedSchema": {
                  "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
          "where": {"method": "roots/list", "params": {}}}


class PeerState:
    def __init__(self) -> None:
        self.methods: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.elicitations: list[str] = []
        self.posts: list[dict[str, Any]] = []
        self.tasks: dict[str, dict[str, Any]] = {}
        self.updates: list[dict[str, Any]] = []

    def snapshot(self) -> dict[str, Any]:
        return {"methods": dict(self.methods), "calls": dict(self.calls), "elicitations": self.elicitations,
                "posts": self.posts[-200:], "updates": self.updates}

    def detailed(self, task_id: str) -> dict[str, Any]:
        """The task as `tasks/get` reports it (a poll of `slow` counts)."""
        task = self.tasks[task_id]
        if "asked" in task:  # a survey
            outstanding = {k: v for k, v in task["asked"].items() if k not in task["answers"]}
            if outstanding:
                return _task(task_id, "input_required", inputRequests=outstanding)
            text = json.dumps(task["answers"], sort_keys=True)
            return _task(task_id, "completed", result={"content": [{"type": "text", "text": text}], "isError": False})
        task["polls"] += 1
        if task["polls"] < 3:
            return _task(task_id, "working")
        result = {"content": [{"type": "text", "text": task["text"]}], "isError": False}
        return _task(task_id, "completed", result=result)


def _task(task_id: str, status: str, **extra: Any) -> dict[str, Any]:
    now = "2026-07-28T00:00:00Z"
    return {"taskId": task_id, "status": status, "createdAt": now, "lastUpdatedAt": now, "ttlMs": 60_000,
            "pollIntervalMs": 10, **extra}


def build_server(state: PeerState, public: bool = False) -> MCPServer[Any]:
    from mcp.server.caching import CacheHint
    from mcp.server.elicitation import ElicitationResult
    from mcp.server.extension import Extension, MethodBinding
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.resolve import Elicit, Resolve

    def ask_name() -> Elicit[Name]:
        return Elicit("What is your name?", Name)

    # the SDK resolves the tools' annotations in this module's globals
    globals().update(Context=Context, ElicitationResult=ElicitationResult, Elicit=Elicit, Resolve=Resolve,
                     Annotated=Annotated, ask_name=ask_name, Field=Field)

    class Tasks(Extension):
        identifier = TASKS

        def methods(self) -> list[MethodBinding]:
            async def get(ctx: Any, params: TaskParams) -> dict[str, Any]:
                return {"resultType": "complete", **state.detailed(params.taskId)}

            async def update(ctx: Any, params: UpdateParams) -> dict[str, Any]:
                task = state.tasks[params.taskId]
                request_id = getattr(ctx, "request_id", None)
                state.updates.append({"id": request_id, "taskId": params.taskId,
                                      "inputResponses": params.inputResponses})
                for key, answer in params.inputResponses.items():  # what is not outstanding is ignored
                    if key in task.get("asked", {}) and key not in task["answers"]:
                        task["answers"][key] = answer
                return {"resultType": "complete"}
            return [MethodBinding("tasks/get", TaskParams, get), MethodBinding("tasks/update", UpdateParams, update)]

        async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
            meta = ctx.meta if isinstance(getattr(ctx, "meta", None), dict) else {}
            caps = meta.get(CAPABILITIES) if isinstance(meta, dict) else None
            declared = isinstance(caps, dict) and TASKS in (caps.get("extensions") or {})
            if params.name not in ("slow", "survey") or not declared:
                return await call_next(ctx)
            state.calls[params.name] += 1
            task_id = f"task-{len(state.tasks) + 1}"
            if params.name == "survey":
                state.tasks[task_id] = {"asked": SURVEY, "answers": {}}
            else:
                state.tasks[task_id] = {"polls": 0, "text": str((params.arguments or {}).get("text", ""))}
            return {"resultType": "task", **_task(task_id, "working")}

    server: MCPServer[Any] = MCPServer("mcpcreds-eras-peer", log_level="WARNING", extensions=[Tasks()],
                                       cache_hints={"tools/list": CacheHint(ttl_ms=30_000, scope="public"),
                                                    "server/discover": CacheHint(ttl_ms=30_000, scope="public")}
                                       if public else {"tools/list": CacheHint(ttl_ms=30_000, scope="private")})

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        state.calls["add"] += 1
        return a + b

    @server.tool()
    async def ask(answer: Annotated[ElicitationResult[Name], Resolve(ask_name)]) -> str:
        """Ask the user for a name, in either protocol era."""
        state.calls["ask"] += 1
        state.elicitations.append(answer.action)
        return answer.action

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add the tool `grown`, and say that the tools changed."""
        state.calls["grow"] += 1
        if server._tool_manager.get_tool("grown") is None:
            server.add_tool(lambda: "grown", name="grown", description="A tool added at run time.")
        await ctx.notify_tools_changed()  # to subscriptions/listen streams (2026-07-28)
        if ctx.protocol_version not in ("2026-07-28", None):  # to the session (the 2025 revisions)
            await ctx.session.send_tool_list_changed()
        return "grown"

    @server.tool()
    def region(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], query: str) -> str:
        """Run a query in a region."""
        state.calls["region"] += 1
        return f"{region}: {query}"

    @server.tool()
    def hidden() -> str:
        """Not on any allowlist."""
        state.calls["hidden"] += 1
        return "hidden"

    @server.tool()
    def survey() -> str:
        """A task that asks for input (for a client that takes tasks)."""
        return "survey: a client that takes tasks gets a task"

    @server.tool()
    def slow(text: str) -> str:
        """Echo, as a task when the client takes tasks."""
        state.calls["slow-inline"] += 1
        return text

    return server


def recorded_spans() -> Callable[[], list[dict[str, Any]]]:
    """The SDK's spans from now on, on the global tracer provider: what `/_test/spans` answers."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    def spans() -> list[dict[str, Any]]:
        return [{"name": s.name, "kind": s.kind.name, "trace_id": f"{s.context.trace_id:032x}",
                 "span_id": f"{s.context.span_id:016x}",
                 "parent_id": f"{s.parent.span_id:016x}" if s.parent is not None else None,
                 "attributes": dict(s.attributes or {})}
                for s in exporter.get_finished_spans()[-500:] if s.context is not None]
    return spans


def build_app(state: PeerState, spans: Callable[[], list[dict[str, Any]]] | None = None,
              public: bool = False) -> ASGIApp:
    mcp_app = build_server(state, public).streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == "/_test/stats":
            await send_json(send, 200, state.snapshot())
            return
        if scope["type"] == "http" and scope.get("path") == "/_test/spans":
            await send_json(send, 200, spans() if spans is not None else [])
            return
        if scope["type"] == "http" and scope.get("method") == "POST":
            body, receive = await buffered(receive)
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
                       if k.lower().startswith(b"mcp-")}
            message: Any = None
            traced = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
                      if k.lower() in TRACE_KEYS}
            with contextlib.suppress(ValueError):
                message = json.loads(body)
                items = message if isinstance(message, list) else [message]
                for item in items:
                    if isinstance(item, dict) and isinstance(item.get("method"), str):
                        state.methods[item["method"]] += 1
                        params: dict[str, Any] = item["params"] if isinstance(item.get("params"), dict) else {}
                        meta: dict[str, Any] = params["_meta"] if isinstance(params.get("_meta"), dict) else {}
                        state.posts.append({"method": item["method"], "headers": headers, "trace": {
                            "headers": traced, "meta": {k: v for k, v in meta.items() if k in TRACE_META}}})
            task_ids = _listened_tasks(message)
            if task_ids is not None:
                await _task_stream(send, message["id"], [state.detailed(t) for t in task_ids if t in state.tasks])
                return
        await mcp_app(scope, receive, send)

    return app


def _listened_tasks(message: Any) -> list[str] | None:
    """The task ids a `subscriptions/listen` asks to hear of (None: not such a request)."""
    if not isinstance(message, dict) or message.get("method") != "subscriptions/listen":
        return None
    wanted = ((message.get("params") or {}).get("notifications") or {}).get("taskIds")
    return [str(t) for t in wanted] if isinstance(wanted, list) else None


async def _task_stream(send: Send, listen_id: Any, tasks: list[dict[str, Any]]) -> None:
    """A listen stream of task notifications: the acknowledgement, then one per task (and its end)."""
    meta = {"io.modelcontextprotocol/subscriptionId": listen_id}
    ack = {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
           "params": {"notifications": {"taskIds": [t["taskId"] for t in tasks]}, "_meta": meta}}
    frames = [ack] + [{"jsonrpc": "2.0", "method": "notifications/tasks", "params": {**t, "_meta": meta}}
                      for t in tasks]
    body = b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames)
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def serve(spans: bool, public: bool) -> None:
    recorded = recorded_spans() if spans else None
    await serve_on_loopback(lambda _port: build_app(PeerState(), recorded, public))


@contextlib.contextmanager
def start_eras_peer(spans: bool = False, public: bool = False) -> Iterator[PeerHandle]:
    cmd = [sys.executable, "-m", "tests.peers.mcp_eras_peer", *(["--spans"] if spans else []),
           *(["--public"] if public else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with ready_process(lambda _: cmd, what="MCP eras peer", cwd=ROOT, timeout=60, env=env) as (_, base, workdir):
        peer = PeerHandle(base, workdir)
        try:
            yield peer
        finally:
            peer.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["stdio"]:  # the same server over stdio, for `mcpcreds exec`
        build_server(PeerState()).run("stdio")
    else:
        asyncio.run(serve("--spans" in sys.argv[1:], "--public" in sys.argv[1:]))
