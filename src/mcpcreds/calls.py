"""Each call of the socket API described once: method, path, body and what to return.
The sync and async clients, and the auth flow, only drive the I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Call(Generic[R]):
    method: str
    path: str
    extract: Callable[[Any], R]
    body: dict[str, Any] | None = None
    extra_time: float = 0.0  # on top of the client timeout (a permit wait)


def _server(name: str, action: str) -> str:
    return f"/v1/servers/{quote(name, safe=':')}/{action}"


def _whole(body: Any) -> dict[str, Any]:
    return dict(body)


class Calls:
    """What each API call sends and returns, independent of sync or async I/O."""

    @staticmethod
    def health() -> Call[dict[str, Any]]:
        return Call("GET", "/v1/health", _whole)

    @staticmethod
    def servers() -> Call[list[dict[str, Any]]]:
        return Call("GET", "/v1/servers", lambda b: list(b["servers"]))

    @staticmethod
    def headers_info(name: str) -> Call[dict[str, Any]]:
        return Call("GET", _server(name, "headers"), _whole)

    @staticmethod
    def headers(name: str) -> Call[dict[str, str]]:
        return Call("GET", _server(name, "headers"), lambda b: dict(b["headers"]))

    @staticmethod
    def acquire(name: str, cost: int, max_wait: float) -> Call[dict[str, Any]]:
        return Call("POST", _server(name, "acquire"), _whole, {"cost": cost, "max_wait": max_wait},
                     max_wait)

    @staticmethod
    def call(name: str, cost: int, max_wait: float) -> Call[dict[str, Any]]:
        return Call("POST", _server(name, "call"), _whole, {"cost": cost, "max_wait": max_wait},
                     max_wait)

    @staticmethod
    def invalidate(name: str, fingerprint: str | None, reason: str) -> Call[bool]:
        body: dict[str, Any] = {"reason": reason}
        if fingerprint:
            body["fingerprint"] = fingerprint
        return Call("POST", _server(name, "invalidate"), lambda b: bool(b["dropped"]), body)

    @staticmethod
    def backoff(name: str, retry_after: float) -> Call[float | None]:
        return Call("POST", _server(name, "backoff"), lambda b: b["paused_until"],
                     {"retry_after": retry_after})

    @staticmethod
    def status() -> Call[dict[str, Any]]:
        return Call("GET", "/v1/status", _whole)

    @staticmethod
    def secret_rotated(name: str) -> Call[list[str]]:
        return Call("POST", f"/v1/secrets/{quote(name, safe='')}/rotated", lambda b: list(b["renewed"]),
                     {})

    @staticmethod
    def secret_rotate(name: str, value: str, force: bool) -> Call[dict[str, Any]]:
        return Call("POST", f"/v1/secrets/{quote(name, safe='')}/rotate", lambda b: dict(b),
                    {"value": value, "force": force}, 60.0)

    @staticmethod
    def grant(servers: list[str], ttl: float) -> Call[dict[str, Any]]:
        return Call("POST", "/v1/grants", lambda b: dict(b), {"servers": servers, "ttl": ttl})

    @staticmethod
    def revoke_grant(grant_id: str) -> Call[bool]:
        return Call("DELETE", f"/v1/grants/{quote(grant_id, safe='')}", lambda b: bool(b["revoked"]))
