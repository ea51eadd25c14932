"""The routes of the socket API: requests in, broker calls, JSON answers out."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Final
from urllib.parse import unquote

from .broker import Broker, HeadersResult
from .config import Target
from .errors import (
    InvalidRequest,
    McpcredsError,
    MethodNotAllowed,
    NotFound,
)
from .logs import get_logger
from .metrics import Metrics
from .secret import REDACTOR
from .wire import Request, Response, json_response

_log = get_logger("api")
_PROMETHEUS: Final = b"text/plain; version=0.0.4; charset=utf-8"

Handler = Callable[[Request], Response | Awaitable[Response]]


def error_to_response(exc: McpcredsError, route: str) -> Response:
    # a last guard: whatever a message was built from, no live secret leaves in it
    body = REDACTOR.redact(json.dumps(exc.to_wire(), separators=(",", ":"))).encode()
    extra: tuple[tuple[bytes, bytes], ...] = ()
    retry_after = exc.details.get("retry_after")
    if retry_after is not None:
        extra = ((b"Retry-After", str(max(1, int(-(-float(retry_after) // 1)))).encode()),)
    return Response(exc.status, body, extra_headers=extra, route=route)


def parse_json_body(request: Request) -> dict[str, Any]:
    if not request.body.strip():
        return {}
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data


class Api:
    """Routes requests; exceptions become the contract's error answers in one place."""

    def __init__(self, broker: Broker, metrics: Metrics) -> None:
        self.broker = broker
        self.metrics = metrics
        self.openapi = (resources.files("mcpcreds") / "openapi.json").read_bytes()
        self._fixed: dict[tuple[str, str], tuple[str, Handler]] = {
            ("GET", "/v1/health"): ("health", self.health),
            ("GET", "/v1/servers"): ("servers", self.servers),
            ("GET", "/v1/status"): ("status", self.status),
            ("GET", "/v1/openapi.json"): ("openapi", self.openapi_doc),
            ("GET", "/metrics"): ("metrics", self.metrics_text),
        }
        self._server_actions: dict[tuple[str, str], tuple[str, Handler]] = {
            ("GET", "headers"): ("headers", self.headers),
            ("POST", "invalidate"): ("invalidate", self.invalidate),
        }
        self._secret_actions: dict[tuple[str, str], tuple[str, Handler]] = {}
        self._fast_targets: dict[bytes, Target] = {}

    def reload(self) -> None:
        self._fast_targets.clear()

    # -- wire.App

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.metrics.observe_request(route, status, seconds)

    def fast_get(self, url: bytes, started: float) -> bytes | None:
        """Cached `GET /v1/servers/{name}/headers` without routing, parsing or allocation."""
        target = self._fast_targets.get(url)
        if target is None:
            if not (url.startswith(b"/v1/servers/") and url.endswith(b"/headers")) or b"?" in url:
                return None
            try:
                target = self.broker.target(unquote(url[12:-8].decode("utf-8")))
            except (McpcredsError, UnicodeDecodeError):
                return None
            if len(self._fast_targets) < 4096:
                self._fast_targets[url] = target
        cached = self.broker.cached_headers(target)
        if cached is None:
            return None
        self.metrics.observe_request("headers", 200, time.perf_counter() - started)
        return cached.wire

    def handle(self, request: Request) -> Response | Awaitable[Response]:
        route = "unknown"
        try:
            route, handler = self._route(request)
            result = handler(request)
        except McpcredsError as exc:
            return error_to_response(exc, route)
        if isinstance(result, Response):
            result.route = route
            return result
        return self._finish(result, route)

    async def _finish(self, pending: Awaitable[Response], route: str) -> Response:
        try:
            response = await pending
        except McpcredsError as exc:
            return error_to_response(exc, route)
        response.route = route
        return response

    def _route(self, request: Request) -> tuple[str, Handler]:
        found = self._fixed.get((request.method, request.path))
        if found is not None:
            return found
        parts = request.path.split("/")
        # ["", "v1", "servers", NAME, ACTION]
        if len(parts) == 5 and parts[1] == "v1" and parts[3]:
            table = {"servers": self._server_actions, "secrets": self._secret_actions}.get(parts[2])
            if table is not None:
                found = table.get((request.method, parts[4]))
                if found is not None:
                    request.name = unquote(parts[3])
                    return found
                if any(action == parts[4] for _, action in table):
                    raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        if any(path == request.path for _, path in self._fixed):
            raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        raise NotFound(f"no route for {request.method} {request.path}")

    # -- routes

    def health(self, request: Request) -> Response:
        return Response(200, self.broker.health_body)

    def servers(self, request: Request) -> Response:
        return Response(200, self.broker.servers_body)

    def status(self, request: Request) -> Response:
        return json_response(self.broker.status())

    def openapi_doc(self, request: Request) -> Response:
        return Response(200, self.openapi)

    def metrics_text(self, request: Request) -> Response:
        text = self.metrics.render(self.broker.gauges())
        return Response(200, text.encode(), content_type=_PROMETHEUS)

    def headers(self, request: Request) -> Response | Awaitable[Response]:
        target = self.broker.target(request.name)
        cached = self.broker.cached_headers(target)
        if cached is not None:
            return Response(200, cached.body)
        return self._headers_async(target)

    def invalidate(self, request: Request) -> Response:
        target = self.broker.target(request.name)
        body = parse_json_body(request)
        fp = body.get("fingerprint")
        if fp is not None and not isinstance(fp, str):
            raise InvalidRequest("fingerprint must be a string")
        reason = body.get("reason")
        dropped = self.broker.invalidate(target, fp)
        _log.info("invalidate", extra={"key": target.key, "dropped": dropped, "fingerprint": fp,
                                       "reason": str(reason)[:64] if reason else None,
                                       "uid": request.peer_uid, "pid": request.peer_pid})
        return json_response({"dropped": dropped})

    async def _headers_async(self, target: Any) -> Response:
        result: HeadersResult = await self.broker.headers(target)
        return Response(200, result.body)
