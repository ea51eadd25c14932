"""The sidecar's spans, after the OpenTelemetry semantic conventions for MCP and for HTTP clients
(imported only when traces are on: see switch.py).

- A gateway POST is a SERVER span `{mcp.method.name} {target}` (the tool or prompt the message
  names; a tool the server's policy does not expose stays out of the name, as does a method name
  that is no plain token). Its parent is the trace context of the message's `params._meta`
  (`traceparent`, `tracestate`), else that of the request's HTTP headers (linked when both are
  there). Its children: `policy` (reading and judging the request), `credential` (the server's
  headers, with the login under it when one is fetched for this request), `permit wait` (the
  server's bucket) and a CLIENT span per upstream attempt, whose context goes upstream in the
  `traceparent`/`tracestate` headers and, where the request's era carries it there, in `_meta`
  (the relay's `with_trace`). The SERVER span ends with its answer (an SSE answer: when the
  stream ends), the CLIENT span when the upstream's answer is closed; `error.type` is the JSON-RPC
  error's code (the gateway's own code for its errors), `tool_error`, the gateway's error code,
  `cancelled`, or the HTTP status.
- A login is `login {key}` (a renewal in a trace of its own), each token endpoint request in it
  an HTTP CLIENT span `POST`, its context sent along.
- The request's trace id is set on it (`Request.trace_id`) for its audit lines.

No attribute holds what the audit log would not: names cut to 128 characters, the MCP session id
as a digest, never arguments, results, resource URIs or error messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import httpx
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..config.model import Target
from ..core.http import Answer, Request, ResponseBody, StreamingResponse, holds
from ..core.version import installed_version

T = TypeVar("T")
Headers = Sequence[tuple[bytes, bytes]]
Posted = tuple[int, str, bytes]  # a form's answer: status, content type, body (credentials/oauth.py)

MAX_NAME: Final = 128  # a name in an attribute or a span name
MAX_TRACEPARENT: Final = 512  # the propagator's own bound (it warns past it)
MAX_TRACESTATE: Final = 4096
TRACE_HEADERS: Final = (b"traceparent", b"tracestate")
PROTOCOL_VERSION_META: Final = "io.modelcontextprotocol/protocolVersion"  # as protocol/mirror.py
_TOKEN: Final = re.compile(r"[A-Za-z0-9_./\-]{1,64}\Z")
_PROPAGATOR: Final = TraceContextTextMapPropagator()


@dataclass(frozen=True, slots=True)
class Peeked:
    """The first request or notification of a JSON-RPC body, read leniently (for naming only: the
    gateway's strict reading decides what is forwarded)."""

    method: str
    id: Any  # None for a notification
    name: str | None  # the tool of a tools/call, the prompt of a prompts/get
    meta: Mapping[str, Any]
    version: str | None  # _meta's protocol version, or an initialize's
    batch: int  # messages in a batch, 0 for one message


def peek(body: bytes | None) -> Peeked | None:
    if not body:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    items = data if isinstance(data, list) else [data]
    first = next((m for m in items if isinstance(m, dict) and isinstance(m.get("method"), str)), None)
    if first is None:
        return None
    method = first["method"]
    params: dict[str, Any] = first["params"] if isinstance(first.get("params"), dict) else {}
    meta: dict[str, Any] = params["_meta"] if isinstance(params.get("_meta"), dict) else {}
    name = params.get("name") if method in ("tools/call", "prompts/get") else None
    version = meta.get(PROTOCOL_VERSION_META)
    if method == "initialize" and not version:
        version = params.get("protocolVersion")
    return Peeked(method, first.get("id"), name if isinstance(name, str) else None, meta,
                  version if isinstance(version, str) else None, len(data) if isinstance(data, list) else 0)


def _header(headers: Headers, name: bytes) -> str | None:
    for key, value in headers:
        if key.strip().lower() == name:
            return value.decode("latin-1")
    return None


def _mcp_attributes(message: Peeked, headers: Headers, server: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {"mcp.method.name": message.method[:MAX_NAME], "mcpcreds.server": server,
                                  "network.protocol.name": "http", "network.protocol.version": "1.1"}
    if isinstance(message.id, str | int) and not isinstance(message.id, bool):
        attributes["jsonrpc.request.id"] = str(message.id)[:MAX_NAME]
    if message.method == "tools/call":
        attributes["gen_ai.operation.name"] = "execute_tool"
        if message.name is not None:
            attributes["gen_ai.tool.name"] = message.name[:MAX_NAME]
    elif message.name is not None:
        attributes["gen_ai.prompt.name"] = message.name[:MAX_NAME]
    version = message.version or _header(headers, b"mcp-protocol-version")
    if version:
        attributes["mcp.protocol.version"] = version[:32]
    session = _header(headers, b"mcp-session-id")
    if session:  # a digest: the id itself lets its holder use the session
        attributes["mcp.session.id"] = hashlib.sha256(session.encode("latin-1")).hexdigest()[:32]
    if message.batch:
        attributes["mcpcreds.batch.size"] = message.batch
    return attributes


def _span_name(message: Peeked, show_target: bool) -> str:
    method = message.method if _TOKEN.match(message.method) else "mcp"
    return f"{method} {message.name[:MAX_NAME]}" if show_target and message.name else method


def _context_of(traceparent: Any, tracestate: Any) -> Context | None:
    """The remote context a `traceparent` (and `tracestate`) carry, or None for none valid."""
    if not isinstance(traceparent, str) or len(traceparent) > MAX_TRACEPARENT:
        return None
    carrier = {"traceparent": traceparent}
    if isinstance(tracestate, str) and len(tracestate) <= MAX_TRACESTATE:
        carrier["tracestate"] = tracestate
    found = _PROPAGATOR.extract(carrier, context=Context())
    return found if trace.get_current_span(found).get_span_context().is_valid else None


def _error_type(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    code = getattr(exc, "code", None)  # McpcredsError's wire code
    return code if isinstance(code, str) and _TOKEN.match(code) else type(exc).__qualname__


def _failed(span: Span, error_type: str) -> None:
    span.set_attribute("error.type", error_type)
    span.set_status(StatusCode.ERROR, error_type)


class _Traced:
    """One traced gateway POST: its SERVER span, the id its answer carries, the outcome read from
    the answer, and its CLIENT spans still open."""

    def __init__(self, span: Span, id_: Any) -> None:
        self.span = span
        self.id = id_
        self.error: str | None = None
        self.answered = False
        self.open: set[Span] = set()
        self.ended = False

    def read(self, chunk: bytes) -> None:
        """SSE events the client is sent: the answer to the request, once it passes."""
        if self.answered or not holds(chunk, b"data:"):
            return
        for line in chunk.split(b"\n"):
            if line.startswith(b"data:"):
                self.read_json(line[5:])

    def read_json(self, body: bytes) -> None:
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            return
        for message in document if isinstance(document, list) else [document]:
            if isinstance(message, dict) and "method" not in message and not self.answered:
                self._answer(message)

    def _answer(self, message: dict[str, Any]) -> None:
        error, result = message.get("error"), message.get("result")
        if isinstance(error, dict) and message.get("id") in (self.id, None):
            self.answered = True
            code, data = error.get("code"), error.get("data")
            if isinstance(code, int) and not isinstance(code, bool):
                self.span.set_attribute("rpc.response.status_code", str(code))
                own = data.get("code") if isinstance(data, dict) else None  # the gateway's error code
                self.error = own if isinstance(own, str) and _TOKEN.match(own) else str(code)
            else:
                self.error = "_OTHER"
        elif isinstance(result, dict) and message.get("id") == self.id:
            self.answered = True
            if result.get("isError") is True:
                self.error = "tool_error"

    def status(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 400 and self.error is None and not self.answered:
            self.error = str(status)

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        for span in list(self.open):  # never closed: they end with their request
            span.end()
        self.open.clear()
        if self.error is not None:
            _failed(self.span, self.error)
        self.span.end()


_CURRENT: ContextVar[_Traced | None] = ContextVar("traced_post", default=None)


class _Relayed:
    """An SSE answer as the wire streams it (see `core.http.ResponseBody`): each chunk read for the
    answer, the span ended when the stream is."""

    def __init__(self, body: ResponseBody, traced: _Traced) -> None:
        self.body = body
        self.traced = traced
        self.gen: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self.gen is None:
            self.gen = self._chunks()
        return self.gen

    async def _chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self.body:
            self.traced.read(chunk)
            yield chunk

    async def aclose(self) -> None:
        try:
            if self.gen is not None:
                await self.gen.aclose()  # type: ignore[attr-defined]
            await self.body.aclose()
        finally:
            self.traced.end()


class _Closing(httpx.AsyncByteStream):
    """An upstream answer's body: its CLIENT span ends when it is closed."""

    def __init__(self, inner: httpx.AsyncByteStream, done: Callable[[str | None], None],
                 error: str | None) -> None:
        self.inner = inner
        self.done = done
        self.error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            self.done(self.error)


class _Upstream(httpx.AsyncBaseTransport):
    """The server's transport for one attempt: its CLIENT span follows the answer."""

    def __init__(self, inner: httpx.AsyncBaseTransport, span: Span, traced: _Traced) -> None:
        self.inner = inner
        self.span = span
        self.traced = traced

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException as exc:
            self._end(_error_type(exc))
            raise
        status = response.status_code
        self.span.set_attribute("http.response.status_code", status)
        if isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _Closing(response.stream, self._end, str(status) if status >= 400 else None)
        else:
            self._end(None)
        return response

    def _end(self, error: str | None) -> None:
        if self.span not in self.traced.open:
            return
        self.traced.open.discard(self.span)
        if error is not None:
            _failed(self.span, error)
        self.span.end()


def _server_of(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"server.address": parts.hostname or "", "server.port": port}


class Tracing:
    """The spans of one sidecar (see the module doc), on its own tracer provider."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("mcpcreds", installed_version())
        # the API logs a tracestate member it refuses as the caller wrote it: a caller's text never
        # reaches the sidecar's log (the member is dropped all the same)
        logging.getLogger("opentelemetry.trace.span").setLevel(logging.ERROR)

    def shutdown(self) -> None:
        self.provider.shutdown()

    def _current(self, name: str, *, kind: SpanKind = SpanKind.INTERNAL, context: Context | None = None,
                 attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Span]:
        """A span made current for the `with` (its errors are set by the caller, as types only)."""
        return self.tracer.start_as_current_span(name, context=context, kind=kind, attributes=attributes,
                                                 record_exception=False, set_status_on_exception=False)

    # -- the gateway

    async def gateway_post(self, request: Request, target: Target,
                           post: Callable[[Request, Target], Awaitable[Answer]]) -> Answer:
        """`post(request, target)` in a SERVER span (a body with no request or notification,
        a client's response, in none)."""
        message = peek(request.body)
        if message is None:
            return await post(request, target)
        from_meta = _context_of(message.meta.get("traceparent"), message.meta.get("tracestate"))
        headers = request.headers
        from_http = _context_of(_header(headers, b"traceparent"), _header(headers, b"tracestate"))
        links = []
        if from_meta is not None and from_http is not None:  # the transport's context, beside the message's
            transport = trace.get_current_span(from_http).get_span_context()
            if transport != trace.get_current_span(from_meta).get_span_context():
                links.append(Link(transport))
        parent = from_meta if from_meta is not None else from_http if from_http is not None else Context()
        # a tool the policy does not expose is no name of the server's: never a span's name
        shown = message.name is not None and (message.method != "tools/call"
                                              or target.trust.allows(message.name))
        span = self.tracer.start_span(_span_name(message, shown), context=parent, kind=SpanKind.SERVER,
                                      attributes=_mcp_attributes(message, headers, target.name),
                                      links=links)
        traced = _Traced(span, message.id)
        if span.get_span_context().is_valid:
            request.trace_id = format(span.get_span_context().trace_id, "032x")
        attached = otel_context.attach(trace.set_span_in_context(span, parent))
        current = _CURRENT.set(traced)
        try:
            answer = await post(request, target)
        except BaseException as exc:
            traced.error = _error_type(exc)
            traced.end()
            raise
        finally:
            _CURRENT.reset(current)
            otel_context.detach(attached)
        traced.status(answer.status)
        if isinstance(answer, StreamingResponse):
            traced.read(answer.first)
            answer.body = _Relayed(answer.body, traced)
        else:
            if answer.body:
                traced.read_json(answer.body)
            traced.end()
        return answer

    async def step(self, name: str, work: Awaitable[T], permits: int | None = None) -> T:
        """`work` in a child span of the gateway request under way (none outside one)."""
        if _CURRENT.get() is None:
            return await work
        attributes = {} if permits is None else {"mcpcreds.permits": permits}
        with self._current(name, attributes=attributes) as span:
            try:
                return await work
            except BaseException as exc:
                _failed(span, _error_type(exc))
                raise

    def policy(self, started: float, refused: bool) -> None:
        """The `policy` span of the gateway request under way: from `started` (perf_counter) to now."""
        if _CURRENT.get() is None:
            return
        now = time.time_ns()
        span = self.tracer.start_span("policy", start_time=now - int((time.perf_counter() - started) * 1e9),
                                      attributes={"mcpcreds.policy.refused": refused})
        span.end(end_time=now)

    def upstream(self, target: Target, forwarded: list[tuple[bytes, bytes]], body: bytes | None,
                 transport: httpx.AsyncBaseTransport, with_trace: Callable[[bytes, Mapping[str, str]], bytes]
                 ) -> tuple[list[tuple[bytes, bytes]], bytes | None, httpx.AsyncBaseTransport]:
        """One attempt of the gateway request under way, in a CLIENT span: the headers with its
        context instead of the caller's, the body as `with_trace` puts it in `_meta`, and the
        transport that ends the span with the answer. As they were outside a traced request, or
        for a body that is no request or notification."""
        traced = _CURRENT.get()
        message = peek(body) if traced is not None else None
        if message is None or body is None or traced is None:
            return forwarded, body, transport
        attributes = {**_mcp_attributes(message, forwarded, target.name), **_server_of(target.endpoint),
                      "network.transport": "tcp"}
        span = self.tracer.start_span(_span_name(message, True), kind=SpanKind.CLIENT, attributes=attributes)
        traced.open.add(span)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        headers = [h for h in forwarded if h[0] not in TRACE_HEADERS]
        headers += [(key.encode("ascii"), value.encode("ascii")) for key, value in carrier.items()]
        return headers, with_trace(body, carrier), _Upstream(transport, span, traced)

    # -- logins

    async def login(self, target: Target, work: Awaitable[T], renewal: bool) -> T:
        """A login fetched: a child of what asked for it, a renewal (served from the current
        login meanwhile) a trace of its own."""
        key = target.key[:MAX_NAME]
        attributes: dict[str, Any] = {"mcpcreds.key": key, "mcpcreds.login.renewal": renewal}
        if target.login is not None:
            attributes["mcpcreds.login.grant"] = target.login.grant
        with self._current(f"login {key}", context=Context() if renewal else None,
                           attributes=attributes) as span:
            try:
                return await work
            except BaseException as exc:
                _failed(span, _error_type(exc))
                raise

    async def token_fetch(self, url: str, work: Callable[[Mapping[str, str]], Awaitable[Posted]]) -> Posted:
        """A POST to a token endpoint, in an HTTP CLIENT span whose context `work` sends along."""
        parts = urlsplit(url)
        attributes = {"http.request.method": "POST", **_server_of(url),
                      "url.full": f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"}
        with self._current("POST", kind=SpanKind.CLIENT, attributes=attributes) as span:
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier)
            try:
                status, content_type, body = await work(carrier)
            except BaseException as exc:
                _failed(span, _error_type(exc))
                raise
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                _failed(span, str(status))
            return status, content_type, body
