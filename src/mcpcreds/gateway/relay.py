"""The gateway: `/mcp/{server}` relays the MCP Streamable HTTP transport to the server's endpoint,
so that the credential never leaves the sidecar and its bucket, tool policy and egress policy are
enforced on the traffic itself.

- `POST` (a JSON-RPC message or batch), `GET` (the server-initiated SSE stream) and `DELETE` (end
  the session) are forwarded. Only the MCP transport's own headers pass (`Accept`,
  `Content-Type`, `Mcp-Session-Id`, `MCP-Protocol-Version`, `Last-Event-ID`, `Mcp-Method`,
  `Mcp-Name`, `Mcp-Param-*` that are not credential-shaped, `traceparent`, `tracestate`,
  `User-Agent`); anything else the caller sent (`Authorization`, `Cookie`, API keys) stays here,
  and the server's credential headers are added.
- Every upstream request goes through the server's egress policy (`Broker.gateway_transport`: the
  egress transport of the gateway's own pool, over `upstream.H1Transport`), sent to it directly
  with no client layer (no cookie jar shared between callers, no redirects followed) and, but for
  SigV4 and traces, as a header list and bytes (`EgressTransport.relay`: no httpx object per call).
- A POST takes one permit per counted JSON-RPC request from the server's shared bucket, waiting
  up to `max_wait`; a 401 to the login sent is invalidated (by fingerprint) and retried once
  with the renewed login; a 429 (or a 503 with Retry-After) pauses the shared bucket and is
  retried once after the pause if that fits in `max_wait`.
- The trust policy applies: see `jsonrpc` (refused calls never reach the upstream; `tools/list`
  results are filtered, in JSON answers and SSE events alike).
- SSE answers are relayed event by event as they arrive (never a partial event, never held back);
  the head of a POST's SSE answer goes out with its first event, in one write (a GET's listening
  stream gets its head at once); a JSON answer is read whole (bounded) to be filtered.
  Credential values the gateway sent are masked in whatever comes back. A client that goes away
  cancels the upstream request; an upstream that drops mid-stream ends the client's stream cleanly
  after the last whole event (the MCP client then resumes with `Last-Event-ID` or fails that
  request). A request past the server's `timeout` is cancelled there too (`InPlace.cancel`).
- One audit line per `tools/call` (server, tool, caller, status, duration; never arguments or
  results) and Prometheus counters and histograms per server and tool. While traces are on
  (`[telemetry]`), each POST is a span with its parts as children, its trace in the audit line,
  and each upstream attempt sends its own context on (telemetry/spans.py).
- A grant that narrows a server's tools (`Grant.tools`) narrows them here, on top of the policy.
- Live state for `status`: requests in flight and SSE streams open per server, and the MCP
  sessions seen (`LiveSessions`: an `Mcp-Session-Id` an answer carried, until its DELETE, a 404
  for it, or an hour without traffic; a bounded table keyed by a digest of the id; see `sessions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import weakref
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import httpx

from ..broker.broker import Actor, Broker
from ..broker.headers import HeadersResult
from ..config.catalog import refuse_uncovered
from ..config.model import Target, is_aws
from ..core.credshape import credential_name
from ..core.http import Answer, Request, Response, StreamingResponse, holds
from ..core.logs import get_logger
from ..core.metrics import Metrics
from ..core.rates import parse_retry_after
from ..core.secret import redact_json
from ..errors import (
    Forbidden,
    InvalidRequest,
    McpcredsError,
    MethodNotAllowed,
    UpstreamError,
    UpstreamTimeout,
)
from ..net.egress_http import EgressTransport, RawAnswer
from ..protocol import jsonrpc, mirror, pins, tool_meta
from ..protocol.strict_json import Masker
from ..telemetry import switch as traces
from . import records, results_cache
from .in_place import InPlace, actor_of, one_header
from .pin_writes import Judge, PinWrites
from .results_cache import CACHEABLE, ResultCache
from .sessions import LiveSessions, owner_of
from .stream import SseBody, ToolCalls, read_whole
from .tools_seen import ToolsSeen

if TYPE_CHECKING:  # made by the sidecar when a server signs (their modules import cryptography)
    from ..signers.aauth import AAuthSigner
    from ..signers.sigv4 import SigV4Signer

_log = get_logger("gateway")

MAX_JSON_ANSWER: Final = 16 * 1024 * 1024  # a JSON (or other non-SSE) answer is read whole, up to this
# connect and write are bounded; reading is not (a tool may run long, an SSE stream may idle):
# a client that gives up closes its connection, and that cancels the upstream request
UPSTREAM_TIMEOUT: Final = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=30.0)
_UPSTREAM_TIMEOUTS: Final = UPSTREAM_TIMEOUT.as_dict()
_USER_AGENT: Final = f"python-httpx/{httpx.__version__}".encode()  # what an httpx client sends
_FORWARDED: Final = frozenset({
    b"accept", b"content-type", b"mcp-session-id", b"mcp-protocol-version", b"last-event-id",
    b"traceparent", b"tracestate", b"user-agent",
})
_PARAM_PREFIX: Final = b"mcp-param-"
_RETURNED: Final = (b"mcp-session-id", b"mcp-protocol-version", b"retry-after", b"cache-control")
_METHODS: Final = ("POST", "GET", "DELETE")
SENT_CACHE: Final = 1024  # servers whose credential headers (and endpoint URLs) are kept prepared
SESSION_NOT_FOUND: Final = -32001  # what MCP servers answer for a session they do not know
LISTEN: Final = "subscriptions/listen"  # 2026-07-28: its answer is a stream that stays open


def forwarded_headers(raw: tuple[tuple[bytes, bytes], ...]) -> list[tuple[bytes, bytes]]:
    """The caller's headers that go upstream (see the module doc), names lower-cased, values as
    sent (a value that is not ASCII goes on as it came, never re-encoded)."""
    kept = []
    for name_b, value_b in raw:
        name = name_b.strip().lower()
        if name in _FORWARDED or (name.startswith(_PARAM_PREFIX)
                                  and not credential_name(name[len(_PARAM_PREFIX):].decode("latin-1"))):
            kept.append((name, value_b))
    return kept


@dataclass(frozen=True, slots=True)
class _Sent:
    """The credential headers of one `HeadersResult` as the gateway sends them."""

    names: frozenset[bytes]  # lower-cased: a caller's header of the same name is dropped
    headers: list[tuple[bytes, bytes]]
    masker: Masker  # masks the credential values in the answers (but what a client sends itself)
    context: bytes  # a digest of the credential: the authorization context of cached results


def _rpc_response(status: int, body: Any, extra: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    return Response(status, jsonrpc.dumps(body), extra_headers=extra)


class Gateway:
    def __init__(self, broker: Broker, metrics: Metrics, aauth: AAuthSigner, sigv4: SigV4Signer) -> None:
        self.broker = broker
        self.metrics = metrics
        self.records = records.GatewayRecords(lambda: broker.audit, metrics)  # audit lines, metrics, warnings
        self.sessions = LiveSessions(broker.clock.monotonic)
        self.tools_seen = ToolsSeen(broker.clock.time)  # what the servers listed, for `status`
        self._in_flight: Counter[str] = Counter()  # server -> requests waiting for the upstream's answer
        self._streams: weakref.WeakSet[SseBody] = weakref.WeakSet()  # SSE answers being relayed
        self._sent: dict[str, tuple[HeadersResult, _Sent]] = {}  # server -> its current credentials, prepared
        self._urls: dict[str, httpx.URL] = {}
        # what the server asks of the client, answered here or relayed
        self.in_place = InPlace(lambda: broker.audit, metrics, self._send_in_place, broker.clock.monotonic)
        self.results = ResultCache(broker.clock.monotonic)  # results the servers marked cacheable
        # the pins listings find, being written; a change found makes the cached listings stale
        self.pin_writes = PinWrites(lambda: broker.pins, self.results.tool_changed)
        self.aauth = aauth  # signs for servers with `aauth`: the agent key stays in the sidecar
        self.sigv4 = sigv4  # signs for servers with auth kind "aws": so does the AWS secret key
        self.params = mirror.ParamTable()  # the x-mcp-header annotations of the tools listed

    # -- entry points

    def handle(self, request: Request, target: Target) -> Awaitable[Answer]:
        if request.method not in _METHODS:
            raise MethodNotAllowed(f"{request.method} is not allowed on /mcp/{{server}}: POST, GET or DELETE")
        config = self.broker.config
        refuse_uncovered(config.services, config.sidecar.egress, target)  # closed egress (config/catalog.py)
        return self._counted(request, target)

    async def _counted(self, request: Request, target: Target) -> Answer:
        self._in_flight[target.name] += 1
        try:
            if request.method == "POST":
                if traces.tracer is not None:  # traces on: the request in a span (telemetry/spans.py)
                    return await traces.tracer.gateway_post(request, target, self._post)
                return await self._post(request, target)
            return await self._relay(request, target)
        finally:
            self._in_flight[target.name] -= 1
            if not self._in_flight[target.name]:
                del self._in_flight[target.name]

    def status(self) -> dict[str, Any]:
        """Live state per server, for `GET /v1/status` (counts and ages only, never a session id)."""
        streams = Counter(body.target.name for body in list(self._streams) if not body.closed)
        sessions = self.sessions.by_server()
        rows = []
        for name in sorted(set(streams) | set(sessions) | set(self._in_flight)):
            count, oldest = sessions.get(name, (0, 0.0))
            rows.append({"name": name, "sessions": count,
                         "oldest_session_age": round(oldest, 3) if count else None,
                         "streams": streams[name], "in_flight": self._in_flight[name]})
        return {"sessions": sum(r["sessions"] for r in rows), "streams": sum(streams.values()),
                "in_flight": sum(self._in_flight.values()), "session_limit": self.sessions.limit,
                "session_idle": self.sessions.idle, "servers": rows}

    def gauges(self) -> list[tuple[str, str, tuple[tuple[str, str], ...], float]]:
        out: list[tuple[str, str, tuple[tuple[str, str], ...], float]] = []
        for row in self.status()["servers"]:
            labels = (("server", row["name"]),)
            out += [("mcpcreds_gateway_sessions", "MCP sessions live through the gateway.", labels,
                     row["sessions"]),
                    ("mcpcreds_gateway_streams", "SSE answers being relayed by the gateway.", labels,
                     row["streams"]),
                    ("mcpcreds_gateway_in_flight", "Gateway requests waiting for the upstream's answer.",
                     labels, row["in_flight"])]
        return out

    def error(self, exc: McpcredsError, request: Request) -> Response:
        """A gateway failure as an MCP client reads one: the HTTP status, and a JSON-RPC error
        (with the id of the request if one was POSTed) whose `data` holds the wire code."""
        wire = redact_json(exc.to_wire())["error"]
        data = {k: v for k, v in wire.items() if k != "message"}
        body = jsonrpc.error(_single_id(request), jsonrpc.GATEWAY_ERROR, str(wire["message"]), data)
        extra: tuple[tuple[bytes, bytes], ...] = ()
        retry_after = exc.details.get("retry_after")
        if isinstance(retry_after, int | float):
            extra = ((b"Retry-After", str(max(1, int(-(-float(retry_after) // 1)))).encode()),)
        return _rpc_response(exc.status, body, extra)

    # -- POST

    async def _post(self, request: Request, target: Target) -> Answer:
        started = time.perf_counter()
        try:
            out = jsonrpc.parse_body(request.body)
        except jsonrpc.JsonRpcError as exc:
            self.records.request(target, request.method, 400, started)
            return _rpc_response(400, jsonrpc.error(None, exc.code, exc.message))
        calls = ToolCalls(self.records.tool_call_done, target, request, out.tool_calls())
        one = None if out.batch else out.messages[0]
        try:
            mirrors = mirror.mirrors(one.raw if one is not None else None, request.header_table(),
                                     self.params.of(target.name, one.tool or "") if one is not None else ())
        except mirror.Mismatch as exc:
            calls.finish_all("refused")
            self.records.request(target, request.method, 400, started)
            return _rpc_response(400, jsonrpc.error(out.single_id, jsonrpc.HEADER_MISMATCH, str(exc)))
        foreign = self._foreign_session(request, target, out.single_id)
        if foreign is not None:
            calls.finish_all("refused")
            self.records.request(target, request.method, foreign.status, started)
            return foreign
        try:
            out, retries = self.in_place.resume(request, target, out)
        except jsonrpc.JsonRpcError as exc:
            calls.finish_all("refused")
            self.records.request(target, request.method, 400, started)
            return _rpc_response(400, jsonrpc.error(out.single_id, exc.code, exc.message))
        void = self.in_place.void_answers(request, target, out)
        if void:  # the client answered an elicitation whose time had run out: the server has its answer
            out = jsonrpc.without_responses(out, void)
            if not out.messages:
                self.records.request(target, request.method, 202, started)
                return Response(202, b"")
        granted = request.grant.tools_of(target.name) if request.grant is not None else None
        refused = (jsonrpc.refusals(out, target.trust, target.name, granted)
                   or await self._changed_tools(out, target))
        if traces.tracer is not None:
            traces.tracer.policy(started, bool(refused))
        if refused:
            calls.finish_all("refused")
            self.records.request(target, request.method, 200, started)
            return _rpc_response(200, refused if out.batch else refused[0])
        trust = target.trust.trust
        roots = target.content.effective_roots(trust)
        out = jsonrpc.declare_capabilities(out, roots is not None, target.content.effective_sampling(trust))
        await self._tell_roots(request, target, roots)
        first = out.messages[0]  # its method looked at first: a call, never cached, pays for no more
        ask = None if out.batch or first.method not in CACHEABLE or not target.gateway.cache_results \
            else results_cache.ask_of(target.name, target.endpoint, first, owner_of(request))
        flight = None
        if ask is not None:
            cached = await self._from_cache(request, target, ask, out, calls, started)
            if cached is not None:
                return cached
            ask = self.results.asked(ask)
            flight = self.results.lead(ask)
        try:
            cost = jsonrpc.permits(out, target.gateway.rate_methods, retries)
            try:
                response, sent = await self._exchange(request, target, cost, out.body, mirrors)
            except BaseException as exc:
                calls.finish_all("cancelled" if isinstance(exc, asyncio.CancelledError) else _failure(exc))
                if isinstance(exc, UpstreamTimeout):  # no head in time: the request may be running there
                    self.in_place.cancel(request, target, out.methods())
                raise
            return await self._answer(request, target, response, sent, calls, out.methods(), started,
                                      out.body, ask, flight)
        finally:
            if ask is not None and flight is not None:
                self.results.land(ask, flight)

    async def _from_cache(self, request: Request, target: Target, ask: results_cache.Ask,
                          out: jsonrpc.Outgoing, calls: ToolCalls, started: float) -> Answer | None:
        """The answer from a result the server marked cacheable, judged as an upstream answer is;
        None when none is fresh (after waiting for the same request on its way upstream)."""
        result = self.results.fresh(ask, self._context(target))
        if result is None and (flight := self.results.in_flight(ask)) is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(target.gateway.max_wait + answer_timeout(target)):
                    await flight.wait()
            result = self.results.fresh(ask, self._context(target))  # the credential may be new
        if result is None:
            return None
        pending = out.methods()
        pinning = await self._pinning(target) if jsonrpc.TOOLS_LIST in pending.values() else None
        inspector = self._inspector(request, target, Masker(()), pending, calls, [], pinning)
        answer = {"jsonrpc": "2.0", "id": out.single_id, "result": result}
        checked = inspector.json_body(jsonrpc.dumps(answer))
        if checked is None:
            return None
        self.records.request(target, request.method, 200, started)
        self.metrics.inc("mcpcreds_gateway_cached_total", (("server", target.name), ("method", ask.method)),
                         help_text="Gateway requests answered from a result the server marked cacheable.")
        return Response(200, checked, content_type=b"application/json")

    # -- GET and DELETE

    async def _relay(self, request: Request, target: Target) -> Answer:
        started = time.perf_counter()
        foreign = self._foreign_session(request, target, None)
        if foreign is not None:
            self.records.request(target, request.method, foreign.status, started)
            return foreign
        response, sent = await self._exchange(request, target, 0, None, mirror.Mirrors())
        return await self._answer(request, target, response, sent, None, {}, started, b"")

    def _foreign_session(self, request: Request, target: Target, id_: Any) -> Response | None:
        """A 404 (as for a session the server does not know) when the request names an MCP session
        that another caller (another uid, or another grant) opened: a session id is no key to
        another principal's session."""
        asked = one_header(request, b"mcp-session-id")
        if asked is None or (asked != b"\0" and self.sessions.belongs(target.name, asked, owner_of(request))):
            return None
        _log.warning("gateway: a session of another caller refused", extra={"server": target.name,
                                                                             "uid": request.peer_uid})
        return _rpc_response(404, jsonrpc.error(id_, SESSION_NOT_FOUND, "Session not found"))

    # -- the upstream exchange

    async def _exchange(self, request: Request, target: Target, cost: int, body: bytes | None,
                        mirrors: mirror.Mirrors) -> tuple[RawAnswer, HeadersResult]:
        """The upstream's answer (its body not read yet) and the credentials it was sent with.
        `body` is what goes upstream: the POST's messages as the gateway read them."""
        broker = self.broker
        max_wait = target.gateway.max_wait
        deadline = broker.clock.monotonic() + max_wait
        rate = broker.rate_of(target)
        tracer = traces.tracer  # None: traces off
        result = broker.cached_headers(target) if tracer is None else None  # fresh: at hand, no wait
        if result is None:  # first: a failing login costs no permit
            credential = broker.headers(target)
            result = await (credential if tracer is None else tracer.step("credential", credential))
        if cost:
            permits = broker.limiter.acquire(target.key, rate, cost, max_wait, request.asker)
            if await (permits if tracer is None else tracer.step("permit wait", permits, cost)) > 0:
                result = await broker.headers(target)  # renewed while we waited, maybe
        forwarded = [h for h in forwarded_headers(request.headers) if h[0] not in mirrors.drop]
        forwarded += mirrors.add
        if (target.aauth or is_aws(target)) and not all(value.isascii() for _, value in forwarded):
            # a signer signs text; the wire would carry other bytes than it signed
            raise InvalidRequest(f"server {target.name!r} signs its requests: a header value that is not "
                                 "ASCII cannot be signed as sent (nothing was sent)")
        renewed_once = paused_once = False
        while True:
            response = await self._send(target, request, forwarded, result, body)
            status = response.status_code
            try:
                retry = False
                if status == 401 and not renewed_once:
                    renewed_once = True
                    # AAuth: the session token refused is dropped first; a requirement: no retry
                    retry = (not target.aauth
                             or self.aauth.retry_after_401(target, response.headers.multi_items())) \
                        and await self._refused_login(request, target, result)
                elif status in (400, 403) and not renewed_once \
                        and is_aws(target):  # an AWS refusal of stale credentials: fetched again, once
                    renewed_once = True
                    sigv4 = response.response  # SigV4's answers are httpx's: see `_send`
                    retry = sigv4 is not None and await self.sigv4.refused(target, sigv4)
                elif _backoff(response) and not paused_once:
                    paused_once = True
                    seconds = parse_retry_after(response.header(b"retry-after"))
                    await broker.pause(target, seconds, Actor(request.peer_uid, request.peer_pid, None))
                    left = deadline - broker.clock.monotonic()
                    retry = seconds <= left
                    _log.info("gateway backoff", extra={"server": target.name, "key": target.key,
                                                        "status": status, "retry_after": seconds,
                                                        "retry": retry})
                    if retry:
                        await response.aclose()
                        if cost:
                            await broker.limiter.acquire(target.key, rate, cost, max(0.0, left),
                                                         request.asker)
                        else:
                            await asyncio.sleep(seconds)
                if not retry:
                    return response, result
                await response.aclose()
                result = await broker.headers(target)
            except BaseException:
                await response.aclose()
                raise

    async def _refused_login(self, request: Request, target: Target, sent: HeadersResult) -> bool:
        """The upstream refused the credentials sent: drop them (by fingerprint); True when the
        next attempt will carry others."""
        dropped, renewed = await self.broker.invalidate(target, sent.fingerprint)
        fields = {"key": target.key, "dropped": dropped, "renewed": renewed, "fingerprint": sent.fingerprint,
                  "reason": "gateway: upstream 401", "uid": request.peer_uid, "pid": request.peer_pid}
        _log.info("invalidate", extra=fields)
        self.broker.audit.write("invalidation", **fields)
        return renewed

    async def _send(self, target: Target, request: Request, forwarded: list[tuple[bytes, bytes]],
                    creds: HeadersResult, body: bytes | None) -> RawAnswer:
        """One request upstream, straight to the egress transport of the server's gateway pool: no
        client layer (its cookie jar would carry one caller's cookies to every other caller; the
        gateway follows no redirect and adds no auth of its own)."""
        transport = self.broker.gateway_transport(target)
        if traces.tracer is not None:  # traces on: this attempt in a span, its context sent on
            forwarded, body, transport = traces.tracer.upstream(target, forwarded, body, transport,
                                                                mirror.with_trace)
        sent = self._credentials(target, creds)
        headers = [(k, v) for k, v in forwarded if k not in sent.names]
        headers += sent.headers
        if not any(k == b"accept" for k, _ in forwarded):
            headers.append((b"accept", b"text/event-stream" if request.method == "GET"
                            else b"application/json, text/event-stream"))
        if request.method == "POST" and not any(k == b"content-type" for k, _ in forwarded):
            headers.append((b"content-type", b"application/json"))
        if not any(k == b"user-agent" for k, _ in headers):
            headers.append((b"user-agent", _USER_AGENT))
        headers.append((b"accept-encoding", b"identity"))  # answers are inspected: not compressed
        if target.aauth:  # signed here: the agent key never leaves the sidecar
            headers += await self.aauth.gateway_headers(target, request.method, target.endpoint, headers,
                                                        body)
        elif is_aws(target):  # SigV4: the AWS secret key stays here too
            signed = await self.sigv4.gateway_headers(target, request.method, target.endpoint, headers,
                                                      body)
            headers = [(k, v) for k, v in headers if k != b"host"] + signed
        url, timeout = self._url(target.endpoint), answer_timeout(target)
        try:
            if isinstance(transport, EgressTransport) and transport.relays and not is_aws(target):
                # a deadline the transport's waits keep (asyncio.timeout costs ~5 µs a request)
                deadline = asyncio.get_running_loop().time() + timeout
                response = await transport.relay(request.method.encode("ascii"), url, headers, body,
                                                 _UPSTREAM_TIMEOUTS, deadline)
            else:  # traced, signed by SigV4 (it reads the request back), or another transport
                async with asyncio.timeout(timeout):
                    upstream = httpx.Request(request.method, url, headers=headers, content=body,
                                             extensions={"timeout": _UPSTREAM_TIMEOUTS})
                    response = RawAnswer.of(await transport.handle_async_request(upstream))
                    response.response.request = upstream  # type: ignore[union-attr]
        except (httpx.TimeoutException, TimeoutError) as exc:
            records.not_answered(target.name, exc, timeout, _UPSTREAM_TIMEOUTS)
            raise UpstreamTimeout(f"the MCP server did not answer within {timeout:g} s") from None
        except Forbidden as refused:  # the egress policy (SSRF guard, deny_hosts, net = "off")
            host = str(refused.details.get("host", ""))[:253]
            self.broker.audit.write("egress_refused", server=target.name, host=host,
                                    **actor_of(request).to_dict())
            raise
        except httpx.HTTPError as exc:
            records.not_answered(target.name, exc, timeout, _UPSTREAM_TIMEOUTS)
            raise UpstreamError(f"the MCP server could not be reached ({type(exc).__name__})") from None
        if (response.header(b"content-encoding") or "identity").strip().lower() != "identity":
            # asked for identity: a compressed answer is a bomb or a lie, and is never inflated
            await response.aclose()
            records.failed(target.name, "refused_answer", "a compressed answer (Content-Encoding)")
            raise UpstreamError("the MCP server sent a compressed answer (Content-Encoding), which the "
                                "gateway does not read: withheld")
        return response

    def _credentials(self, target: Target, creds: HeadersResult) -> _Sent:
        """The credential headers as sent and their masked forms, worked out once per login (the
        broker serves the same `HeadersResult` while it is fresh)."""
        cached = self._sent.get(target.name)
        if cached is not None and cached[0] is creds:
            return cached[1]
        try:
            encoded = [(k.encode("ascii"), v.encode("ascii")) for k, v in creds.headers.items()]
        except UnicodeEncodeError:
            raise UpstreamError(f"a credential of server {target.name!r} is not a valid HTTP header value "
                                "(not ASCII): nothing was sent") from None
        context = hashlib.blake2b(b"\0".join(b"%s\0%s" % pair for pair in sorted(encoded)),
                                  digest_size=16).digest()
        sent = _Sent(frozenset(k.lower() for k, _ in encoded), encoded, Masker(creds.headers.values()),
                     context)
        if len(self._sent) >= SENT_CACHE:
            self._sent.clear()
        self._sent[target.name] = (creds, sent)
        return sent

    def _context(self, target: Target) -> bytes | None:  # the server's authorization context now
        current = self.broker.cached_headers(target)
        return None if current is None else self._credentials(target, current).context

    def _url(self, endpoint: str) -> httpx.URL:
        url = self._urls.get(endpoint)
        if url is None:
            if len(self._urls) >= SENT_CACHE:
                self._urls.clear()
            url = self._urls[endpoint] = httpx.URL(endpoint)
        return url

    # -- the answer

    async def _pinning(self, target: Target) -> Judge:
        """For an answer to `tools/list`: the pins' judgement of its listing."""
        enforce = target.content.effective_pin_tools(target.trust.trust)
        return await self.pin_writes.judge(target.name, enforce)

    def _inspector(self, request: Request, target: Target, masker: Masker, pending: dict[jsonrpc.IdKey, str],
                   calls: ToolCalls | None, outbox: list[bytes], pinning: Judge | None) -> jsonrpc.Inspector:
        """What judges an answer to `request`, the upstream's or one from the cache."""
        granted = request.grant.tools_of(target.name) if request.grant is not None else None
        in_place = self.in_place
        return jsonrpc.Inspector(
            target.trust, masker, pending, calls.answered if calls is not None else None,
            lambda warnings: self.records.policy_warnings(target, warnings), granted=granted,
            # a GET stream outlives reloads: its server's requests are judged by the config of now
            on_server_request=lambda m: in_place.asks(request, self._current(target), m, outbox),
            screening=screening_of(target),
            on_screened=lambda k, f: in_place.screened(request, target, k, f), on_tools=pinning,
            on_listed=None if pinning is None else  # a tools/list answer: what it offers, for `status`
            lambda tools, more: self.tools_seen.listed(target.name, tools, more),
            on_input_required=lambda r: in_place.input_required(request, target, r),
            on_task_input=lambda t: in_place.task_input(request, self._current(target), t),
            on_listing=lambda tools: self.params.learn(target.name, tools),
            on_notification=lambda method: self.results.notified(target.name, method))

    async def _answer(self, request: Request, target: Target, response: RawAnswer, sent: HeadersResult,
                      calls: ToolCalls | None, pending: dict[jsonrpc.IdKey, str], started: float,
                      body_sent: bytes, ask: results_cache.Ask | None = None,
                      flight: asyncio.Event | None = None) -> Answer:
        waiting = dict(pending)
        try:
            status = response.status_code
            credentials = self._credentials(target, sent)
            # what the client sent itself is never masked: masking it would confirm a guess
            masker = credentials.masker.sparing(body_sent, request.headers)
            extra = tuple((name.title(), masker.header(value.encode("latin-1")))
                          for name in _RETURNED if (value := response.header(name)) is not None)
            if target.aauth:  # AAuth-Access kept, a 401's challenge on
                answered = self.aauth.answered(target, status, response.headers.multi_items())
                extra += tuple((k, masker.header(v)) for k, v in answered)
            outbox: list[bytes] = []  # events of the gateway's own for this stream (a voided elicitation)
            pinning = await self._pinning(target) if jsonrpc.TOOLS_LIST in pending.values() else None
            inspector = self._inspector(request, target, masker, pending, calls, outbox, pinning)
            if ask is not None:  # a result kept masked whole: it may serve other callers
                inspector.on_result = lambda _, result: self._keep(target, ask, flight, result, credentials,
                                                                   status == 200)
            self.records.request(target, request.method, status, started)
            self._follow_session(request, target, response)
            kind = jsonrpc.answer_kind(response.header(b"content-type") or "")
            if kind == "sse" and 200 <= status < 300:
                # may stay silent for long: its head goes at once, and it is never cut for a quiet while
                listening = request.method == "GET" or LISTEN in pending.values()
                gap = None if listening else answer_timeout(target)
                stream = SseBody(response, inspector, calls, target, gap, outbox,
                                 lambda given_up: self.in_place.cancel(request, target, given_up))
                first = b"" if listening else await stream.first()
                rest = None if listening else await stream.rest_if_ended()
                if first and not inspector.pending and _takes_json(request):
                    whole = await stream.whole(first, rest)
                    if whole is not None:  # one message and the stream's end: a JSON answer
                        await stream.aclose()
                        return Response(status, whole, content_type=b"application/json", extra_headers=extra)
                self._streams.add(stream)
                return StreamingResponse(status, stream, extra_headers=extra, long_lived=listening,  # SSE
                                         first=first + (rest or b""), ended=rest is not None)
            body = await read_whole(response, MAX_JSON_ANSWER, answer_timeout(target), target.name)
        except BaseException as exc:
            await response.aclose()
            if isinstance(exc, UpstreamTimeout):  # the answer not read whole in time
                self.in_place.cancel(request, target, waiting)
            if calls is not None:
                calls.finish_all("cancelled" if isinstance(exc, asyncio.CancelledError) else _failure(exc))
            raise
        await response.aclose()
        if status >= 500:
            records.answered(target.name, status)
        checked = inspector.json_body(body) if body and kind == "json" else None
        if body and checked is None:  # fail closed: what the gateway cannot read is not passed on
            if status < 500:  # a 5xx answer is logged as such: once
                _log.warning("upstream answer withheld: not JSON-RPC read one way only",
                             extra={"server": target.name, "status": status})
            if calls is not None:
                calls.finish_all("withheld")
            what = f"HTTP {status} with a body that is not JSON-RPC read one way only"
            checked = jsonrpc.dumps(jsonrpc.withheld_answer(waiting, what))
            status = 502 if status < 300 else status
        if calls is not None:
            calls.finish_all(f"http_{status}" if status >= 300 else "no_response")
        if status == 401 and target.aauth:  # names what is missing
            refused = self.aauth.refused_body(target, status, response.headers.multi_items())
            if refused is not None:
                checked = refused
        return Response(status, checked or b"", content_type=b"application/json", extra_headers=extra)

    def _keep(self, target: Target, ask: results_cache.Ask, flight: asyncio.Event | None,
              result: dict[str, Any] | None, credentials: _Sent, ok: bool) -> None:
        if result is None:  # an error: a page's cursor the server no longer takes drops its list's pages
            self.results.failed(ask)
        elif ok:  # a signed request's authorization context is not in its headers: no private result kept
            context = None if target.aauth or is_aws(target) else credentials.context
            self.results.keep(ask, result, context, credentials.masker.value)
        if flight is not None:  # its followers need not wait for the rest of the stream
            self.results.land(ask, flight)

    async def _changed_tools(self, out: jsonrpc.Outgoing, target: Target) -> list[dict[str, Any]]:
        """The refusals of calls the tools' metadata refuses (data flow, flagged arguments), or of
        calls to tools whose definition changed since it was pinned."""
        trust = target.trust.trust
        refused, warnings = tool_meta.call_refusals(out, target.name, target.content.tool_metadata, trust,
                                                    target.content.effective_roots(trust) or ())
        for warning in warnings:
            self.records.policy_warnings(target, [warning])
        if refused or not target.content.effective_pin_tools(trust):
            return refused
        names = pins.called_tools(out)
        if not names:
            return refused
        await self.pin_writes.written(target.name)  # a listing that just found a change: its call refused
        return pins.call_refusals(out, target.name, await self.broker.pins.lookup(target.name, names))

    def _current(self, target: Target) -> Target:
        return self.broker.config.target(target.name) or target

    async def _tell_roots(self, request: Request, target: Target, roots: tuple[str, ...] | None) -> None:
        """A session whose server the gateway answered with other roots before a reload hears that
        they changed (it then asks again, and gets the new ones)."""
        session = one_header(request, b"mcp-session-id")
        if session is None or not self.sessions.roots_changed(target.name, session, roots):
            return
        notice = jsonrpc.dumps({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
        try:
            await self._send_in_place(self.in_place.as_client(request, notice), target, notice)
        except McpcredsError as exc:
            _log.warning("gateway: roots/list_changed not sent", extra={"server": target.name,
                                                                        "error": exc.code})

    async def _send_in_place(self, request: Request, target: Target, body: bytes,
                             mirrors: mirror.Mirrors | None = None) -> None:
        """An answer to the server's request (or a task's), sent as the client would; its answer read."""
        response, _ = await self._exchange(request, target, 0, body, mirrors or mirror.Mirrors())
        try:
            await read_whole(response, MAX_JSON_ANSWER, answer_timeout(target), target.name)
        finally:
            await response.aclose()
        if response.status_code >= 500:
            records.answered(target.name, response.status_code)

    def _follow_session(self, request: Request, target: Target, response: RawAnswer) -> None:
        asked = one_header(request, b"mcp-session-id")
        status = response.status_code
        if 200 <= status < 300:
            if request.method == "DELETE":
                if asked:
                    self.sessions.ended(target.name, asked)
            elif (given := response.header(b"mcp-session-id")):
                self.sessions.seen(target.name, given.encode("latin-1"), owner_of(request),
                                   target.content.effective_roots(target.trust.trust))
            elif asked:
                self.sessions.used(target.name, asked, owner_of(request))
        elif status == 404 and asked:  # the server no longer knows the session
            self.sessions.ended(target.name, asked)


def screening_of(target: Target) -> jsonrpc.Screening:
    """The untrusted pipeline for a server's results: servers that are not trusted are sanitized
    and scanned; media passes only where `media_passthrough` allows it."""
    trust = target.trust.trust
    return jsonrpc.Screening(sanitize=trust != "trusted", block=target.content.on_injection == "block",
                             media=target.content.effective_media(trust))


def answer_timeout(target: Target) -> float:
    """How long the gateway waits for the server's answer, and between the events of an SSE answer."""
    return target.content.timeout


def _backoff(response: RawAnswer) -> bool:
    """An upstream asking to be left alone: a 429, or a 503 that says for how long."""
    return response.status_code == 429 or (response.status_code == 503
                                           and response.header(b"retry-after") is not None)


def _takes_json(request: Request) -> bool:
    """Whether the client accepts an application/json answer (an MCP client must: a client that
    sends no Accept is sent what the gateway asked of the server for it, which includes it)."""
    accept = one_header(request, b"accept")
    return accept is None or holds(accept.lower(), b"application/json") or holds(accept, b"*/*")


def _single_id(request: Request) -> Any:
    if request.method != "POST" or not request.body:
        return None
    try:
        return jsonrpc.parse_body(request.body).single_id
    except jsonrpc.JsonRpcError:
        return None


def _failure(exc: BaseException) -> str:
    """An audit status for a request that failed before any answer: the wire code of the error."""
    return exc.code if isinstance(exc, McpcredsError) else "upstream_error"

