"""The routes of the socket API: requests in, broker calls, JSON answers out."""

from __future__ import annotations

import asyncio
import json
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

from ..broker.broker import Actor, Broker
from ..broker.headers import HeadersResult
from ..broker.refresh import forget_shared_login, forget_unsaved
from ..broker.step_up import report_insufficient_scope
from ..config.exec import EXEC_PREFIX
from ..config.model import Target, is_aws
from ..core.audit import AuditLog
from ..core.http import (
    Answer,
    Request,
    Response,
    StreamingResponse,
    json_response,
    parse_json_body,
    seconds_field,
    text_field,
)
from ..core.logs import get_logger
from ..core.metrics import Metrics
from ..core.policy import check_rule_of_two, patterns_cover, tool_pattern_problem
from ..core.scopes import MAX_SCOPE_CHARS, MAX_SCOPES, parse_scope
from ..core.secret import redact_json
from ..credentials.login_store import login_store
from ..credentials.sources import check_secret_name
from ..credentials.spiffe import spiffe_status
from ..errors import (
    Forbidden,
    InvalidRequest,
    McpcredsError,
    MethodNotAllowed,
    NotFound,
    ProxyDisabled,
    ProxyOnly,
    UnknownSecret,
)
from ..state.grants import MAX_TTL, Grant, GrantLimits, new_token, token_hash
from .parts import Parts

if TYPE_CHECKING:
    from . import tools_api

_log = get_logger("api")
_PROMETHEUS: Final = b"text/plain; version=0.0.4; charset=utf-8"
GRANT_MAX_BACKOFF: Final = 300.0
MAX_COST: Final = 1_000_000_000  # the burst of a server without a rate
MAX_FINGERPRINT: Final = 128
MAX_REASON: Final = 256
MAX_GRANT_SERVERS: Final = 1024
MAX_GRANT_TOOLS: Final = 256  # tool names per server in a grant's `tools`
MAX_TOOL_NAME: Final = 128  # characters (the MCP spec's bound on a tool name)
_GRANT_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_OPEN_ROUTES: Final = frozenset({"health", "openapi"})

Handler = Callable[[Request], Answer | Awaitable[Answer]]
GATEWAY_METHODS: Final = ("POST", "GET", "DELETE")  # on /mcp/{server}


def error_to_response(exc: McpcredsError, route: str) -> Response:
    # a last guard: whatever a message was built from, no live secret leaves in it
    body = json.dumps(redact_json(exc.to_wire()), separators=(",", ":")).encode()
    extra: tuple[tuple[bytes, bytes], ...] = ()
    retry_after = exc.details.get("retry_after")
    if isinstance(retry_after, int | float) and math.isfinite(retry_after):
        extra = ((b"Retry-After", str(max(1, int(-(-float(retry_after) // 1)))).encode()),)
    return Response(exc.status, body, extra_headers=extra, route=route)


def answer(data: Any) -> Response:
    """A JSON answer built from dynamic data: masked inside its strings, so always valid JSON."""
    return json_response(redact_json(data))


def _actor(request: Request) -> dict[str, int]:
    return {"uid": request.peer_uid, "pid": request.peer_pid}


def _tool_names(value: Any) -> frozenset[str]:
    if not isinstance(value, list) or len(value) > MAX_GRANT_TOOLS or not all(
            isinstance(n, str) and 0 < len(n) <= MAX_TOOL_NAME and n.isprintable() for n in value):
        raise InvalidRequest(f"each entry of tools must be an array of at most {MAX_GRANT_TOOLS} tool names, "
                             f"each of 1 to {MAX_TOOL_NAME} printable characters")
    if any(tool_pattern_problem(n) is not None for n in value):
        raise InvalidRequest("a tool pattern takes one `*`, at its end (`prefix*`)")
    return frozenset(value)


def grant_tools(body: dict[str, Any], names: dict[str, Target],
                parent: Grant | None) -> dict[str, frozenset[str]]:
    """The tools a new grant narrows its servers to: `body["tools"]` (server -> tool names or
    `prefix*` patterns; each server one of the grant's, by the name sent or the one it resolved
    to), within what `parent` allows (each pattern covered by one of the parent's); a server the
    parent narrows and the body does not is narrowed as the parent does. Never echoes what was
    sent."""
    raw = body.get("tools")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict) or len(raw) > MAX_GRANT_SERVERS:
        raise InvalidRequest("tools must be an object: server name -> array of tool names")
    tools: dict[str, frozenset[str]] = {}
    for key, value in raw.items():
        target = names.get(key)
        if target is None:
            raise InvalidRequest("tools names a server that is not in servers")
        if target.name in tools:
            raise InvalidRequest("tools names one server twice")
        tools[target.name] = _tool_names(value)
    if parent is not None:
        for target in names.values():
            inherited = parent.tools_of(target.name)
            if inherited is None:
                continue
            asked = tools.setdefault(target.name, inherited)
            if not patterns_cover(inherited, asked):
                raise Forbidden(f"the grant narrows the tools of server {target.name!r}: a sub-grant "
                                "can only narrow them further")
    return tools


class Api(Parts):
    """Routes requests; exceptions become the contract's error answers in one place. The gateway,
    the signers and the exec routes are made at their first use (parts.py)."""

    def __init__(self, broker: Broker, metrics: Metrics, audit: AuditLog | None = None,
                 reloader: Callable[[], list[str]] | None = None) -> None:
        super().__init__(broker, metrics)
        self.reloader = reloader  # the sidecar's config reload: its errors, [] when it took
        self.audit = audit or AuditLog(None, broker.clock)
        self._openapi: bytes | None = None
        self._fixed: dict[tuple[str, str], tuple[str, Handler]] = {
            ("GET", "/v1/health"): ("health", self.health),
            ("GET", "/v1/servers"): ("servers", self.servers),
            ("GET", "/v1/status"): ("status", self.status),
            ("GET", "/v1/openapi.json"): ("openapi", self.openapi_doc),
            ("GET", "/metrics"): ("metrics", self.metrics_text),
            ("POST", "/v1/grants"): ("grant", self.create_grant),
            ("POST", "/v1/aauth/rotate-key"): ("aauth_rotate", self.aauth_rotate),
            ("GET", "/v1/events"): ("events", self.events),
            ("POST", "/v1/reload"): ("reload", self.reload_config),  # owner-only: not a grant route
        }
        self._server_actions: dict[tuple[str, str], tuple[str, Handler]] = {
            ("GET", "headers"): ("headers", self.headers),
            ("POST", "invalidate"): ("invalidate", self.invalidate),
            ("POST", "acquire"): ("acquire", self.acquire),
            ("POST", "call"): ("call", self.call),
            ("POST", "backoff"): ("backoff", self.backoff),
            ("POST", "sign"): ("sign", self.sign),
            ("POST", "step-up"): ("step_up", self.step_up),
            ("POST", "lease"): ("lease", self.lease),
        }
        self._secret_actions: dict[tuple[str, str], tuple[str, Handler]] = {
            ("POST", "rotated"): ("rotated", self.secret_rotated),
            ("POST", "rotate"): ("rotate", self.secret_rotate),
            ("GET", "origin"): ("secret_origin", self.secret_origin),  # owner-only: not a grant route
        }
        self._tool_actions: dict[tuple[str, str], tuple[str, Handler]] = {
            ("POST", "approve"): ("tools_approve", self.tools_approve),  # owner-only: not a grant route
        }
        self._exec_actions: dict[tuple[str, str], tuple[str, Handler]] = {  # mcpcreds exec
            ("POST", "session"): ("exec", lambda request: self.exec_routes.session(request)),
            ("POST", "events"): ("exec", lambda request: self.exec_routes.events(request)),
            ("POST", "pins"): ("exec", lambda request: self.exec_routes.pins(request)),
        }
        self._fast_targets: dict[bytes, Target] = {}
        self._grant_routes = frozenset({"health", "openapi", "servers", "headers", "acquire", "call",
                                        "invalidate", "backoff", "grant", "revoke", "mcp", "exec", "sign",
                                        "step_up"})

    def reload(self) -> None:
        self._fast_targets.clear()
        if self._gateway is not None:  # what a server answered under the config before
            self._gateway.results.clear()
        self.reload_parts()

    # -- wire.App

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.metrics.observe_request(route, status, seconds)

    def fast_get(self, url: bytes, started: float, peer_uid: int) -> bytes | None:
        """Cached `GET /v1/servers/{name}/headers` without routing, parsing or allocation."""
        if peer_uid in self.broker.config.sidecar.grant_only_uids:
            return None
        target = self._fast_targets.get(url)
        if target is None:
            if not (url.startswith(b"/v1/servers/") and url.endswith(b"/headers")) or b"?" in url:
                return None
            try:
                target = self.broker.target(unquote(url[12:-8].decode("utf-8")))
            except (McpcredsError, UnicodeDecodeError):
                return None
            if not self.broker.serves_headers(target):
                return None  # refused on the slow path (and never cached here)
            if len(self._fast_targets) < 4096:
                self._fast_targets[url] = target
        cached = self.broker.cached_headers(target)
        if cached is None:
            return None
        self.metrics.observe_request("headers", 200, time.perf_counter() - started)
        return cached.wire

    def handle(self, request: Request) -> Answer | Awaitable[Answer]:
        if request.authorization is not None and not self._is_open_route(request):
            return self._handle_with_grant(request)
        route = "unknown"
        try:
            route, handler = self._route(request)
            if request.peer_uid in self.broker.config.sidecar.grant_only_uids and route not in _OPEN_ROUTES:
                raise Forbidden("this uid may only act within a grant (sidecar.grant_only_uids): "
                                "send Authorization: Bearer <grant>")
            if request.grant_only and route not in _OPEN_ROUTES:
                raise Forbidden("a process in another user or network namespace than the sidecar's "
                                "(an `mcpcreds exec` child, a container) may only act within a grant: "
                                "send Authorization: Bearer <grant>")
            result = handler(request)
        except McpcredsError as exc:
            return self._error(exc, route, request)
        if isinstance(result, Response | StreamingResponse):
            result.route = route
            return result
        return self._finish(result, route, request)

    def _is_open_route(self, request: Request) -> bool:
        """Health and the API document answer anyone the socket admits: an Authorization
        header (a grant, live or not) changes nothing there."""
        found = self._fixed.get((request.method, request.path))
        return found is not None and found[0] in _OPEN_ROUTES

    def _error(self, exc: McpcredsError, route: str, request: Request) -> Response:
        if route == "mcp":  # an MCP client reads a JSON-RPC error
            response = self.gateway.error(exc, request)
            response.route = route
            return response
        return error_to_response(exc, route)

    async def _handle_with_grant(self, request: Request) -> Answer:
        """A caller that presents a grant acts within it only."""
        # a gateway request is answered as an MCP client reads errors, a refused grant included
        route = "mcp" if request.path.startswith("/mcp/") and request.method in GATEWAY_METHODS else "unknown"
        try:
            scheme, _, token = (request.authorization or "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Forbidden("Authorization must be 'Bearer <grant>'")
            grant = await self.broker.grants.get(token_hash(token.strip()))
            if grant is None:
                raise Forbidden("grant unknown, expired or revoked")
            request.grant = grant
            route, handler = self._route(request)
            if route not in self._grant_routes:
                raise Forbidden(f"a grant cannot use the {route} route")
            result = handler(request)
            response = result if isinstance(result, Response | StreamingResponse) else await result
        except McpcredsError as exc:
            return self._error(exc, route, request)
        response.route = route
        return response

    def _target(self, request: Request) -> Target:
        """The server a route names, if the caller's grant (if any) covers it."""
        target = self.broker.target(request.name)
        if request.grant is not None and target.name not in request.grant.servers:
            raise Forbidden(f"server {target.name!r} is not in this grant")
        return target

    async def _finish(self, pending: Awaitable[Answer], route: str, request: Request) -> Answer:
        try:
            response = await pending
        except McpcredsError as exc:
            return self._error(exc, route, request)
        response.route = route
        return response

    def _route(self, request: Request) -> tuple[str, Handler]:
        found = self._fixed.get((request.method, request.path))
        if found is not None:
            return found
        parts = request.path.split("/")
        # what the caller put in a path is never echoed: only the route it matched
        if len(parts) == 3 and parts[1] == "mcp" and parts[2]:
            if request.method not in GATEWAY_METHODS:
                raise MethodNotAllowed(f"{request.method} is not allowed on /mcp/{{server}}: "
                                       "POST, GET or DELETE")
            request.name = unquote(parts[2])
            return "mcp", self.mcp
        if len(parts) == 4 and parts[1] == "v1" and parts[2] == "grants" and parts[3]:
            if request.method != "DELETE":
                raise MethodNotAllowed(f"{request.method} is not allowed on /v1/grants/{{id}}")
            request.name = unquote(parts[3])
            return "revoke", self.revoke_grant
        if len(parts) == 4 and parts[1] == "v1" and parts[2] == "tools" and parts[3]:
            if request.method != "GET":
                raise MethodNotAllowed(f"{request.method} is not allowed on /v1/tools/{{server}}")
            request.name = unquote(parts[3])
            return "tools", self.tools  # owner-only: not a grant route
        # ["", "v1", "servers", NAME, ACTION]
        if len(parts) == 5 and parts[1] == "v1" and parts[3]:
            table = {"servers": self._server_actions, "secrets": self._secret_actions,
                     "exec": self._exec_actions, "tools": self._tool_actions}.get(parts[2])
            if table is not None:
                found = table.get((request.method, parts[4]))
                if found is not None:
                    request.name = unquote(parts[3])
                    return found
                if any(action == parts[4] for _, action in table):
                    raise MethodNotAllowed(f"{request.method} is not allowed on /v1/{parts[2]}/{{name}}/"
                                           f"{parts[4]}")
        if any(path == request.path for _, path in self._fixed):
            raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        raise NotFound(f"no route for {request.method} on this path")

    # -- routes

    def health(self, request: Request) -> Response:
        return Response(200, self.broker.health_body)

    def servers(self, request: Request) -> Response:
        if request.grant is not None:
            specs = [t.spec.to_dict() for name in request.grant.servers
                     if (t := self.broker.config.target(name)) is not None]
            return answer({"servers": specs})
        return answer(self.broker.server_specs)

    async def create_grant(self, request: Request) -> Response:
        body = parse_json_body(request)
        names = body.get("servers")
        if not isinstance(names, list) or not 0 < len(names) <= MAX_GRANT_SERVERS \
                or not all(isinstance(n, str) for n in names):
            raise InvalidRequest(f"servers must be an array of 1 to {MAX_GRANT_SERVERS} server names")
        ttl = seconds_field(body, "ttl", 3600, 1, MAX_TTL)
        from ..exec.session import grant_entries

        execs = grant_entries(self.broker.config, names, request)  # the `exec:NAME` entries
        targets = []
        by_name: dict[str, Target] = {}
        for name in names:
            if name.startswith(EXEC_PREFIX):
                continue
            request.name = name
            target = self._target(request)  # a grant can only narrow what its holder has
            targets.append(target)
            by_name[name] = by_name[target.name] = target
        tools = grant_tools(body, by_name, request.grant)
        exec_tags = {e.grant_name: e.tags for e in execs}
        trio_warning = check_rule_of_two({**{t.name: t.tags for t in targets}, **exec_tags},
                                         allow_trifecta=self.broker.config.sidecar.allow_trifecta)
        now = self.broker.clock.time()
        expires_at = now + float(ttl)
        parent = request.grant
        if parent is not None:
            expires_at = min(expires_at, parent.expires_at)
        token = new_token()  # never logged, so not given to the redactor
        granted = [*(t.name for t in targets), *exec_tags]
        grant = Grant(secrets.token_hex(8), tuple(dict.fromkeys(granted)), expires_at,
                      parent.id if parent is not None else None,
                      (*parent.ancestors, parent.id) if parent is not None else (), tools)
        side = self.broker.config.sidecar
        limits = GrantLimits(side.max_grants, side.max_subgrants)
        await self.broker.grants.put(grant, token_hash(token), limits)  # 429 too_many_grants past them
        self.audit.write("grant", id=grant.id, servers=list(grant.servers), expires_at=expires_at,
                         parent=grant.parent, tools=grant.tools_json() or None, **_actor(request))
        if trio_warning:
            _log.warning("grant completes the trifecta (allowed by allow_trifecta)",
                         extra={"grant": grant.id, "warning": trio_warning})
            self.audit.write("grant_trifecta_allowed", id=grant.id, warning=trio_warning, **_actor(request))
        shown = redact_json({"id": grant.id, "grant": token, "expires_at": expires_at,
                             "servers": [*(t.spec_dict() for t in targets),
                                         *(e.to_dict() for e in execs)]})
        # the tool names as the caller sent them, not through the redactor: a name masked because it
        # happens to be a live secret would tell the caller so (the redactor as an oracle)
        shown["tools"] = grant.tools_json()
        return json_response(shown)

    async def revoke_grant(self, request: Request) -> Response:
        grant_id = request.name
        if not _GRANT_ID.match(grant_id):
            raise InvalidRequest("invalid grant id")
        if request.grant is not None and grant_id != request.grant.id:
            # a grant holder may revoke itself; its children go with it
            raise Forbidden("a grant can only revoke itself")
        revoked = await self.broker.grants.revoke(grant_id)
        if not revoked:
            raise NotFound("no live grant has that id")
        self.audit.write("grant_revoked", id=grant_id, **_actor(request))
        return json_response({"revoked": True})

    async def status(self, request: Request) -> Response:
        from ..gateway import tools_seen

        status = await self.broker.status()
        tools = await tools_seen.status_rows(self.broker.config.servers.values(), self.gateway.tools_seen,
                                             self.broker.pins)
        for row in status["servers"]:
            row["tools"] = tools.get((row["name"], row["key"]))  # null: not served through the gateway
        return answer({**status, "gateway": self.gateway.status(),
                       "aauth": self._aauth.status() if self._aauth is not None else None,  # no key loaded
                       "aws": self._sigv4.status() if self._sigv4 is not None else None,  # none held
                       "spiffe": spiffe_status(self.broker.config.targets_by_key.values(),
                                               self.broker.jwt_svids, self.broker.x509_sources)})

    async def tools(self, request: Request) -> Response:
        """The server's tools last listed and pinned, and the rule that hides each (tools_api.py)."""
        from . import tools_api

        owner = self._pin_owner(request)
        seen = self.gateway.tools_seen.get(owner.name)  # None for an exec entry: its relay lists
        return answer(await tools_api.list_tools(self.broker.pins, owner, seen))

    def _pin_owner(self, request: Request) -> tools_api.PinOwner:
        """The server a tools route names, or the exec entry (`exec:NAME`, pinned under that name)."""
        from . import tools_api

        if request.name.startswith(EXEC_PREFIX):
            from ..exec.session import exec_entry

            entry = exec_entry(self.broker.config, request.name[len(EXEC_PREFIX):])
            return tools_api.ExecPins(entry.grant_name, entry.trust, entry.content)
        return self._target(request)

    async def tools_approve(self, request: Request) -> Response:
        """Changed tool definitions accepted as the new pins (tools_api.py)."""
        from . import tools_api

        target = self._pin_owner(request)
        result = await tools_api.approve(self.broker.pins, target, parse_json_body(request))
        if result["approved"]:
            fields = {"server": target.name, "tools": result["approved"]}
            self.audit.write("tools_approved", **fields, **_actor(request))
            _log.info("tool definitions approved", extra=fields)
        return answer(result)

    def reload_config(self, request: Request) -> Response:
        """Re-read the config file, as SIGHUP does (what `mcpcreds stdio URL` asks after adding a
        server): a config with errors is rejected and the old one kept; its errors name TOML paths,
        never values."""
        if self.reloader is None:
            raise InvalidRequest("this sidecar has no config file to reload")
        errors = self.reloader()
        if errors:
            return answer({"reloaded": False, "errors": errors[:100]})
        return answer({"reloaded": True, "servers": len(self.broker.config.servers)})

    def openapi_doc(self, request: Request) -> Response:
        if self._openapi is None:
            from importlib import resources

            self._openapi = (resources.files("mcpcreds") / "openapi.json").read_bytes()
        return Response(200, self._openapi)

    async def metrics_text(self, request: Request) -> Response:
        text = self.metrics.render([*await self.broker.gauges(), *self.gateway.gauges()])
        return Response(200, text.encode(), content_type=_PROMETHEUS)

    def mcp(self, request: Request) -> Awaitable[Answer]:
        """The gateway: MCP Streamable HTTP relayed to the server (see gateway.py)."""
        target = self._target(request)
        if not target.gateway.serves_proxy:
            raise ProxyDisabled(f"server {target.name!r} is not served through the gateway "
                                "(expose = \"headers\")")
        return self.gateway.handle(request, target)

    def _credential_target(self, request: Request) -> Target:
        """The server of a route that hands out its credential, if its `expose` allows that."""
        target = self._target(request)
        if not self.broker.serves_headers(target):
            raise ProxyOnly(f"the credential of server {target.name!r} stays in the sidecar "
                            "(expose = \"proxy\"): use the gateway, /mcp/{server}")
        grant = request.grant
        if grant is not None and grant.tools and any(
                (narrowed := self.broker.config.target(name)) is not None and narrowed.key == target.key
                for name in grant.tools):
            # with the credential in hand, the holder could call any tool: the narrowing would be advisory
            raise ProxyOnly(f"this grant narrows the tools of the credential of server {target.name!r}: "
                            "it is used through the gateway only, /mcp/{server}")
        return target

    async def aauth_rotate(self, request: Request) -> Response:
        """AAuth: a new agent key, with overlap (see aauth.py); not for grant holders."""
        rotated = await self.aauth.rotate()
        self.audit.write("aauth_key_rotated", thumbprint=rotated["thumbprint"], previous=rotated["previous"],
                         **_actor(request))
        return answer(rotated)

    async def sign(self, request: Request) -> Response:
        """AAuth: the headers that sign a direct client's request (see aauth.py); the agent key
        stays here. Peer-checked and grant-aware as `headers` is."""
        target = self._credential_target(request)
        if is_aws(target):  # SigV4 (sigv4.py): the secret key stays here; the answer is the headers to add
            return json_response(await self.sigv4.sign_route(target, parse_json_body(request)))
        # not through the redactor: the agent token is in the answer by design (bound to a key that
        # stays here); nothing the caller sent is echoed but header names (no oracle: nothing masked)
        return json_response(await self.aauth.sign_route(target, parse_json_body(request)))

    def headers(self, request: Request) -> Response | Awaitable[Response]:
        target = self._credential_target(request)
        cached = self.broker.cached_headers(target)
        if cached is not None:
            return Response(200, cached.body)
        return self._headers_async(target)

    @staticmethod
    def _permit_request(request: Request) -> tuple[int, float]:
        body = parse_json_body(request)
        cost = body.get("cost", 1)
        if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST:
            raise InvalidRequest(f"cost must be a whole number from 1 to {MAX_COST}")
        return cost, seconds_field(body, "max_wait", 0.0, 0, 3600)

    def acquire(self, request: Request) -> Response | Awaitable[Response]:
        target = self._target(request)
        cost, max_wait = self._permit_request(request)
        rate = self.broker.rate_of(target)
        if self.broker.limiter.try_acquire(target.key, rate, cost, request.asker):
            return Response(200, b'{"granted":%d,"waited":0.0}' % cost)
        return self._acquire_async(target, cost, max_wait, request.asker)

    async def _acquire_async(self, target: Target, cost: int, max_wait: float, asker: Hashable) -> Response:
        waited = await self.broker.limiter.acquire(target.key, self.broker.rate_of(target), cost, max_wait,
                                                   asker)
        return Response(200, b'{"granted":%d,"waited":%s}' % (cost, repr(round(waited, 6)).encode()))

    def call(self, request: Request) -> Response | Awaitable[Response]:
        """Permits and headers in one round trip: the client's hot path."""
        target = self._credential_target(request)
        cost, max_wait = self._permit_request(request)
        cached = self.broker.cached_headers(target)
        if cached is not None and self.broker.limiter.try_acquire(target.key, self.broker.rate_of(target),
                                                                   cost, request.asker):
            # the client then asks `sign` (auth.py)
            signed = b'"aauth":true,' if target.aauth else b'"sigv4":true,' if is_aws(target) else b""
            return Response(200, b'{%s"granted":%d,"waited":0.0,' % (signed, cost) + cached.body[1:])
        return self._call_async(target, cost, max_wait, request.asker)

    async def _call_async(self, target: Target, cost: int, max_wait: float, asker: Hashable) -> Response:
        # headers first: a failing login costs no permit; again after a wait, in case it was renewed
        result = await self.broker.headers(target)
        waited = await self.broker.limiter.acquire(target.key, self.broker.rate_of(target), cost, max_wait,
                                                   asker)
        if waited > 0:
            result = await self.broker.headers(target)
        signer = b'"aauth":true,' if target.aauth else b'"sigv4":true,' if is_aws(target) else b""
        prefix = b'{%s"granted":%d,"waited":%s,' % (signer, cost,
                                                     repr(round(waited, 6)).encode())
        return Response(200, prefix + result.body[1:])

    async def backoff(self, request: Request) -> Response:
        target = self._target(request)
        body = parse_json_body(request)
        if "retry_after" not in body:
            raise InvalidRequest("retry_after is required")
        retry_after = seconds_field(body, "retry_after", 0.0, 0, 86400)
        grant = request.grant.id if request.grant is not None else None
        if grant is not None:
            retry_after = min(retry_after, GRANT_MAX_BACKOFF)  # a child cannot shut a service...
        # ... nor renew a pause forever: the broker bounds what grant holders set per window
        until = await self.broker.pause(target, retry_after, Actor(request.peer_uid, request.peer_pid, grant))
        _log.info("backoff", extra={"key": target.key, "retry_after": retry_after, "grant": grant,
                                    "uid": request.peer_uid, "pid": request.peer_pid})
        return answer({"paused_until": until})

    async def invalidate(self, request: Request) -> Response:
        target = self._target(request)
        body = parse_json_body(request)
        fp = text_field(body, "fingerprint", MAX_FINGERPRINT)
        reason = text_field(body, "reason", MAX_REASON)
        if fp is None and request.grant is not None and target.login is not None:
            raise InvalidRequest("a grant holder must name the fingerprint of the login it was refused with")
        if reason == "logout":  # `mcpcreds logout`: the login other sidecars share goes too (login_share.py)
            await forget_shared_login(self.broker.sharing, target)
            forget_unsaved(self.broker, target.key)
            if is_aws(target):  # an SSO logout: the role credentials held go too
                self.sigv4.cache.drop(target.key)
        dropped, renewed = await self.broker.invalidate(target, fp)
        fields = {"key": target.key, "dropped": dropped, "renewed": renewed, "fingerprint": fp,
                  "reason": reason, **_actor(request)}
        _log.info("invalidate", extra=fields)
        self.audit.write("invalidation", **fields)
        return answer({"dropped": dropped, "renewed": renewed})

    async def step_up(self, request: Request) -> Response:
        """A `403 insufficient_scope` from the server (step_up.py): login_required when a login
        with the wider scope is due, else why not. The scope is checked, never echoed."""
        target = self._target(request)
        body = parse_json_body(request)
        fp = text_field(body, "fingerprint", MAX_FINGERPRINT)
        scope = parse_scope(body.get("scope"))
        if scope is None:
            raise InvalidRequest(f"scope must be 1 to {MAX_SCOPES} scope-tokens (RFC 6749 §3.3) separated by "
                                 f"spaces, at most {MAX_SCOPE_CHARS} characters")
        if fp is None and request.grant is not None:
            raise InvalidRequest("a grant holder must name the fingerprint of the login it was refused with")
        broker = self.broker
        store = login_store(broker.config.secrets, broker.resolver)
        return answer(await report_insufficient_scope(broker.logins, store, target, fp, scope))

    async def secret_rotated(self, request: Request) -> Response:
        name = check_secret_name(request.name)
        renewed, failed = await self.broker.rotated(name)
        outcome = "ok" if not failed else "failed"
        self.audit.write("rotation", secret=name, how="rotated", keys=renewed, failed=failed,
                         outcome=outcome, **_actor(request))
        _log.info("secret rotated", extra={"secret": name, "renewed": renewed, "failed": failed})
        body: dict[str, Any] = {"renewed": renewed}
        if failed:
            body["failed"] = failed
        return answer(body)

    async def secret_origin(self, request: Request) -> Response:
        """Whether the sidecar resolves a secret its config names, and from which source (never the
        value): `doctor` asks, since the sidecar's environment is not the caller's. A name the config
        does not use is unknown (no probe of the sidecar's environment)."""
        name = check_secret_name(request.name)
        if not self.broker.dependents(name):
            raise UnknownSecret("no server or service of the config uses that secret")
        source = await asyncio.to_thread(self.broker.resolver.origin, name)
        return answer({"name": name, "found": source is not None, "source": source})

    async def secret_rotate(self, request: Request) -> Response:
        name = check_secret_name(request.name)
        body = parse_json_body(request)
        value, force = body.get("value"), body.get("force", False)
        if not isinstance(value, str) or not value:
            raise InvalidRequest("value must be a non-empty string")
        # not given to the redactor here: only a value that gets stored is (by the resolver)
        if not isinstance(force, bool):
            raise InvalidRequest("force must be true or false")
        keys = [t.key for t in self.broker.dependents(name)]
        try:
            renewed, where = await self.broker.rotate(name, value, force)
        except McpcredsError as exc:
            if keys:  # the name of a secret nothing uses is only the caller's word: never logged
                self.audit.write("rotation_failed", secret=name, keys=keys, force=force,
                                 error=str(exc.details.get("error") or exc.code), **_actor(request))
                _log.warning("secret rotation failed; nothing changed",
                             extra={"secret": name, "error": exc.code})
            raise
        self.audit.write("rotation", secret=name, how="rotate", keys=renewed, stored_in=where,
                         force=force, outcome="ok", **_actor(request))
        _log.info("secret rotated", extra={"secret": name, "renewed": renewed, "stored_in": where})
        return answer({"renewed": renewed, "stored_in": where})

    async def lease(self, request: Request) -> Response:
        """A capacity lease: a share of the bucket spent in the caller's process (leasing.py)."""
        target = self._credential_target(request)
        self.broker.lease_service.check_leasable(target)
        return await self.broker.lease_service.lease(target, parse_json_body(request), request.peer_uid)

    def events(self, request: Request) -> StreamingResponse:
        """The event stream leased clients listen to (events.py)."""
        sub = self.broker.events.subscribe(request.peer_uid)
        return StreamingResponse(200, sub, content_type=b"application/x-ndjson",
                                 extra_headers=((b"Cache-Control", b"no-store"),), long_lived=True,
                                 first=sub.hello())

    async def _headers_async(self, target: Target) -> Response:
        result: HeadersResult = await self.broker.headers(target)
        return Response(200, result.body)
