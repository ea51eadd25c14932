"""Each call of the socket API described once: method, path, body and what to return.
The sync and async clients, and the auth flow, only drive the I/O. Every answer is checked for
the shape its caller relies on: a malformed one is a `MalformedAnswer`, never a TypeError."""

from __future__ import annotations

from ..errors import McpcredsError

# the command line imports this module: neither typing (~3 ms with what it imports) nor
# urllib.parse (~2 ms: it imports ipaddress) is imported at run time, and no Protocol class is made
TYPE_CHECKING = False
if TYPE_CHECKING:
    from _thread import LockType
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any, Generic, Protocol, TypeVar

    R = TypeVar("R")
else:
    class Generic:
        """`Call[R]` for mypy; at run time `Call[...]` is `Call` itself."""

        __slots__ = ()

        def __class_getitem__(cls, item: object) -> type:
            return cls

    R = None

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def quote(text: str, safe: str = "") -> str:
    """`urllib.parse.quote(text, safe)` for a path segment: UTF-8, every byte but the unreserved
    ones and those of `safe` (ASCII) percent-encoded."""
    keep = _UNRESERVED.union(safe.encode("ascii")) if safe else _UNRESERVED
    data = text.encode("utf-8")
    if all(b in keep for b in data):
        return text
    return "".join(chr(b) if b in keep else f"%{b:02X}" for b in data)


class Call(Generic[R]):
    """One API call. A plain class, not a dataclass: `dataclasses` (with `inspect`) would cost
    every CLI command several ms of imports."""

    __slots__ = ("body", "extra_time", "extract", "method", "path")

    def __init__(self, method: str, path: str, extract: Callable[[Any], R],
                 body: dict[str, Any] | None = None, extra_time: float = 0.0) -> None:
        self.method = method
        self.path = path
        self.extract = extract
        self.body = body
        self.extra_time = extra_time  # on top of the client timeout (a permit wait)

    def __repr__(self) -> str:
        return f"Call({self.method} {self.path})"


if TYPE_CHECKING:
    class SidecarClient(Protocol):
        """What the sync auth (auth.py) and lease holder (leaser_sync.py) use of a `Client`
        (client.py), which satisfies it structurally: they are typed by it rather than import it.
        The underscored members are the client's own, shared within this package: the grant's
        headers (sent on the event stream too) and the lease holders it closes with itself."""

        @property
        def socket_path(self) -> Path: ...
        @property
        def sidecar_uid(self) -> int: ...
        @property
        def _headers(self) -> dict[str, str]: ...
        _leasers: list[Any]
        @property
        def _leasers_lock(self) -> LockType: ...
        def run(self, call: Call[R]) -> R: ...

    class AsyncSidecarClient(Protocol):
        """The same of an `AsyncClient`, for the async auth and lease holder (leaser.py)."""

        @property
        def socket_path(self) -> Path: ...
        @property
        def sidecar_uid(self) -> int: ...
        @property
        def _headers(self) -> dict[str, str]: ...
        _leasers: list[Any]
        async def run(self, call: Call[R]) -> R: ...


class MalformedAnswer(McpcredsError):
    """The sidecar answered, but not with the shape this call expects."""

    code = "malformed_answer"
    status = 502


def _server(name: str, action: str) -> str:
    return f"/v1/servers/{quote(name, safe=':')}/{action}"


def whole(body: Any) -> dict[str, Any]:
    """The answer, which must be an object."""
    if not isinstance(body, dict):
        raise MalformedAnswer(f"the sidecar answered {type(body).__name__} where an object was expected")
    return body


def _field(body: Any, key: str, *types: type) -> Any:
    """`body[key]`, which must be there and be one of `types` (a bool is not a number here)."""
    fields = whole(body)
    value = fields.get(key)
    if key not in fields or not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise MalformedAnswer(f"the sidecar's answer has no valid {key!r} "
                              f"({' or '.join(t.__name__ for t in types)} expected)")
    return value


def _renewed(body: Any) -> bool:
    if "renewed" in whole(body):
        return bool(_field(body, "renewed", bool))
    return bool(_field(body, "dropped", bool))  # a sidecar from before the cooldown


def _strings(body: Any, key: str) -> list[str]:
    value: list[Any] = _field(body, key, list)
    if not all(isinstance(item, str) for item in value):
        raise MalformedAnswer(f"the sidecar's answer has a non-string in {key!r}")
    return value


def _with_headers(body: Any) -> dict[str, Any]:
    headers: dict[Any, Any] = _field(body, "headers", dict)
    if not all(isinstance(v, str) for v in headers.values()):
        raise MalformedAnswer("the sidecar's answer has a header value that is not a string")
    return whole(body)


def _servers(body: Any) -> list[dict[str, Any]]:
    servers: list[Any] = _field(body, "servers", list)
    if not all(isinstance(s, dict) for s in servers):
        raise MalformedAnswer("the sidecar's answer has a server that is not an object")
    return servers


def _permits(body: Any) -> dict[str, Any]:
    _field(body, "granted", int)
    _field(body, "waited", int, float)
    return whole(body)


def _permits_and_headers(body: Any) -> dict[str, Any]:
    return _permits(_with_headers(body))


def _step_up(body: Any) -> dict[str, Any]:
    _field(body, "step_up", bool)
    _field(body, "renewed", bool)
    return whole(body)


def _grant(body: Any) -> dict[str, Any]:
    _field(body, "id", str)
    _field(body, "grant", str)
    return whole(body)


def _rotation(body: Any) -> dict[str, Any]:
    _strings(body, "renewed")
    _field(body, "stored_in", str)
    return whole(body)


def _lease(body: Any) -> dict[str, Any]:
    _with_headers(body)
    for key in ("share", "per", "lease_seconds"):
        _field(body, key, int, float)
    for key in ("burst", "initial"):
        _field(body, key, int)
    _field(body, "lease", str)
    _field(body, "key", str)
    return whole(body)


class Calls:
    """What each API call sends and returns, independent of sync or async I/O."""

    @staticmethod
    def health() -> Call[dict[str, Any]]:
        return Call("GET", "/v1/health", whole)

    @staticmethod
    def servers() -> Call[list[dict[str, Any]]]:
        return Call("GET", "/v1/servers", _servers)

    @staticmethod
    def headers_info(name: str) -> Call[dict[str, Any]]:
        return Call("GET", _server(name, "headers"), _with_headers)

    @staticmethod
    def headers(name: str) -> Call[dict[str, str]]:
        return Call("GET", _server(name, "headers"), lambda b: dict(_with_headers(b)["headers"]))

    @staticmethod
    def acquire(name: str, cost: int, max_wait: float) -> Call[dict[str, Any]]:
        return Call("POST", _server(name, "acquire"), _permits, {"cost": cost, "max_wait": max_wait},
                     max_wait)

    @staticmethod
    def call(name: str, cost: int, max_wait: float) -> Call[dict[str, Any]]:
        return Call("POST", _server(name, "call"), _permits_and_headers,
                    {"cost": cost, "max_wait": max_wait}, max_wait)

    @staticmethod
    def lease(name: str, lease: str | None, subscriber: str | None, demand: float | None,
              holding: tuple[float, int] | None = None, least: float = 0.0) -> Call[dict[str, Any]]:
        """A capacity lease (new, or a renewal of `lease`, whose terms `holding` are being spent),
        tied to the event stream `subscriber`; `least`: a share under this many permits a second
        is not worth holding (the sidecar answers "not now" instead)."""
        body: dict[str, Any] = {}
        if least > 0.0:
            body["least"] = least
        if holding is not None:
            body["holding"] = [holding[0], holding[1]]
        if lease is not None:
            body["lease"] = lease
        if subscriber is not None:
            body["subscriber"] = subscriber
        if demand is not None:
            body["demand"] = round(demand, 3)
        return Call("POST", _server(name, "lease"), _lease, body)

    @staticmethod
    def sign(name: str, method: str, url: str, headers: dict[str, str],
             content_digest: str | None, required_input: tuple[str, ...] = ()) -> Call[dict[str, Any]]:
        """AAuth: the headers that sign this request with the sidecar's agent key (covering, too,
        what a refusal's `required_input` named)."""
        body: dict[str, Any] = {"method": method, "url": url, "headers": headers}
        if content_digest is not None:
            body["content_digest"] = content_digest
        if required_input:
            body["required_input"] = list(required_input)
        return Call("POST", _server(name, "sign"), _with_headers, body)

    @staticmethod
    def invalidate(name: str, fingerprint: str | None, reason: str) -> Call[bool]:
        body: dict[str, Any] = {"reason": reason}
        if fingerprint:
            body["fingerprint"] = fingerprint
        return Call("POST", _server(name, "invalidate"), lambda b: bool(_field(b, "dropped", bool)),
                    body)

    @staticmethod
    def refused(name: str, fingerprint: str | None) -> Call[bool]:
        """The upstream answered 401 to this login: drop it. True when the next `call` will
        carry another login (within the invalidation cooldown it will not: no point resending)."""
        body: dict[str, Any] = {"reason": "401"}
        if fingerprint:
            body["fingerprint"] = fingerprint
        return Call("POST", _server(name, "invalidate"), _renewed, body)

    @staticmethod
    def step_up(name: str, fingerprint: str | None, scope: str) -> Call[dict[str, Any]]:
        """The upstream answered `403 insufficient_scope` naming `scope`: raises login_required
        when a login with the wider scope is due; else `step_up: false` and whether the login
        named was `renewed` meanwhile (a retry may pass)."""
        body: dict[str, Any] = {"scope": scope}
        if fingerprint:
            body["fingerprint"] = fingerprint
        return Call("POST", _server(name, "step-up"), _step_up, body)

    @staticmethod
    def backoff(name: str, retry_after: float) -> Call[float | None]:
        return Call("POST", _server(name, "backoff"),
                    lambda b: _field(b, "paused_until", int, float, type(None)), {"retry_after": retry_after})

    @staticmethod
    def status() -> Call[dict[str, Any]]:
        return Call("GET", "/v1/status", whole)

    @staticmethod
    def secret_rotated(name: str) -> Call[list[str]]:
        return Call("POST", f"/v1/secrets/{quote(name, safe='')}/rotated", lambda b: _strings(b, "renewed"),
                     {})

    @staticmethod
    def secret_rotate(name: str, value: str, force: bool) -> Call[dict[str, Any]]:
        return Call("POST", f"/v1/secrets/{quote(name, safe='')}/rotate", _rotation,
                    {"value": value, "force": force}, 60.0)

    @staticmethod
    def grant(servers: list[str], ttl: float,
              tools: dict[str, list[str]] | None = None) -> Call[dict[str, Any]]:
        body: dict[str, Any] = {"servers": servers, "ttl": ttl}
        if tools is not None:
            body["tools"] = tools
        return Call("POST", "/v1/grants", _grant, body)

    @staticmethod
    def revoke_grant(grant_id: str) -> Call[bool]:
        return Call("DELETE", f"/v1/grants/{quote(grant_id, safe='')}",
                    lambda b: bool(_field(b, "revoked", bool)))
