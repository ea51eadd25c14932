"""The library client: `AsyncClient` and `Client` talk to the sidecar over its Unix socket.

Every call is described once (`_Call`: method, path, body, what to return); the two classes
are thin drivers that send it, with the same retry and error mapping.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, TypeVar
from urllib.parse import quote

import httpx

from .config import default_socket_path
from .errors import McpcredsError, SidecarUnavailable, error_from_wire

DEFAULT_TIMEOUT: Final = 10.0
CONNECT_RETRY_SECONDS: Final = 2.0  # ride out a sidecar restart
_BASE: Final = "http://mcpcreds"
_RETRYABLE: Final = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError,
                     httpx.WriteError)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class _Call(Generic[R]):
    method: str
    path: str
    extract: Callable[[Any], R]
    body: dict[str, Any] | None = None
    extra_time: float = 0.0  # on top of the client timeout (a permit wait)


def _server(name: str, action: str) -> str:
    return f"/v1/servers/{quote(name, safe=':')}/{action}"


def _whole(body: Any) -> dict[str, Any]:
    return dict(body)


class _Calls:
    """What each API call sends and returns, independent of sync or async I/O."""

    @staticmethod
    def health() -> _Call[dict[str, Any]]:
        return _Call("GET", "/v1/health", _whole)

    @staticmethod
    def servers() -> _Call[list[dict[str, Any]]]:
        return _Call("GET", "/v1/servers", lambda b: list(b["servers"]))

    @staticmethod
    def headers_info(name: str) -> _Call[dict[str, Any]]:
        return _Call("GET", _server(name, "headers"), _whole)

    @staticmethod
    def headers(name: str) -> _Call[dict[str, str]]:
        return _Call("GET", _server(name, "headers"), lambda b: dict(b["headers"]))

    @staticmethod
    def acquire(name: str, cost: int, max_wait: float) -> _Call[dict[str, Any]]:
        return _Call("POST", _server(name, "acquire"), _whole, {"cost": cost, "max_wait": max_wait},
                     max_wait)

    @staticmethod
    def call(name: str, cost: int, max_wait: float) -> _Call[dict[str, Any]]:
        return _Call("POST", _server(name, "call"), _whole, {"cost": cost, "max_wait": max_wait},
                     max_wait)

    @staticmethod
    def invalidate(name: str, fingerprint: str | None, reason: str) -> _Call[bool]:
        body: dict[str, Any] = {"reason": reason}
        if fingerprint:
            body["fingerprint"] = fingerprint
        return _Call("POST", _server(name, "invalidate"), lambda b: bool(b["dropped"]), body)

    @staticmethod
    def backoff(name: str, retry_after: float) -> _Call[float | None]:
        return _Call("POST", _server(name, "backoff"), lambda b: b["paused_until"],
                     {"retry_after": retry_after})

    @staticmethod
    def status() -> _Call[dict[str, Any]]:
        return _Call("GET", "/v1/status", _whole)

    @staticmethod
    def secret_rotated(name: str) -> _Call[list[str]]:
        return _Call("POST", f"/v1/secrets/{quote(name, safe='')}/rotated", lambda b: list(b["renewed"]),
                     {})


def _grant_header(grant: str | None) -> dict[str, str]:
    grant = grant if grant is not None else os.environ.get("MCPCREDS_GRANT")
    return {"Authorization": f"Bearer {grant}"} if grant else {}


def _decode(response: httpx.Response, call: _Call[R]) -> R:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise error_from_wire(response.status_code, body if isinstance(body, dict) else {})
    return call.extract(body)


class _Base:
    def __init__(self, socket: str | os.PathLike[str] | None, grant: str | None, timeout: float,
                 connect_retry: float) -> None:
        self.socket_path = Path(socket) if socket else default_socket_path()
        self.timeout = timeout
        self.connect_retry = connect_retry
        self._headers = _grant_header(grant)

    def _unavailable(self, exc: Exception) -> SidecarUnavailable:
        if isinstance(exc, httpx.TimeoutException):
            return SidecarUnavailable(f"the sidecar on {self.socket_path} did not answer in time")
        return SidecarUnavailable(f"no mcpcreds sidecar answers on {self.socket_path} "
                                  f"({type(exc).__name__}); start one with `mcpcreds serve`")


class AsyncClient(_Base):
    """`async with AsyncClient() as creds: await creds.headers("crm-ro")`."""

    def __init__(self, socket: str | os.PathLike[str] | None = None, *, grant: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, connect_retry: float = CONNECT_RETRY_SECONDS) -> None:
        super().__init__(socket, grant, timeout, connect_retry)
        self._http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(self.socket_path)),
                                       base_url=_BASE, headers=self._headers, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def run(self, call: _Call[R]) -> R:
        deadline = time.monotonic() + self.connect_retry
        delay = 0.02
        while True:
            try:
                response = await self._http.request(call.method, call.path, json=call.body,
                                                    timeout=self.timeout + call.extra_time)
            except httpx.TimeoutException as exc:
                raise self._unavailable(exc) from None
            except _RETRYABLE as exc:
                if time.monotonic() + delay > deadline:
                    raise self._unavailable(exc) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)
                continue
            return _decode(response, call)

    async def request(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        return await self.run(_Call(method, path, lambda b: b, json))

    async def health(self) -> dict[str, Any]:
        return await self.run(_Calls.health())

    async def servers(self) -> list[dict[str, Any]]:
        return await self.run(_Calls.servers())

    async def headers_info(self, name: str) -> dict[str, Any]:
        """The whole answer: headers, key, expires_at, fingerprint."""
        return await self.run(_Calls.headers_info(name))

    async def headers(self, name: str) -> dict[str, str]:
        return await self.run(_Calls.headers(name))

    async def acquire(self, name: str, cost: int = 1, max_wait: float = 0.0) -> dict[str, Any]:
        return await self.run(_Calls.acquire(name, cost, max_wait))

    async def call(self, name: str, cost: int = 1, max_wait: float = 0.0) -> dict[str, Any]:
        """Permits and headers in one round trip."""
        return await self.run(_Calls.call(name, cost, max_wait))

    async def invalidate(self, name: str, fingerprint: str | None = None, reason: str = "401") -> bool:
        return await self.run(_Calls.invalidate(name, fingerprint, reason))

    async def backoff(self, name: str, retry_after: float) -> float | None:
        return await self.run(_Calls.backoff(name, retry_after))

    async def status(self) -> dict[str, Any]:
        return await self.run(_Calls.status())

    async def secret_rotated(self, name: str) -> list[str]:
        return await self.run(_Calls.secret_rotated(name))


class Client(_Base):
    """The synchronous twin of `AsyncClient`."""

    def __init__(self, socket: str | os.PathLike[str] | None = None, *, grant: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, connect_retry: float = CONNECT_RETRY_SECONDS) -> None:
        super().__init__(socket, grant, timeout, connect_retry)
        self._http = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket_path)),
                                  base_url=_BASE, headers=self._headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def run(self, call: _Call[R]) -> R:
        deadline = time.monotonic() + self.connect_retry
        delay = 0.02
        while True:
            try:
                response = self._http.request(call.method, call.path, json=call.body,
                                              timeout=self.timeout + call.extra_time)
            except httpx.TimeoutException as exc:
                raise self._unavailable(exc) from None
            except _RETRYABLE as exc:
                if time.monotonic() + delay > deadline:
                    raise self._unavailable(exc) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.25)
                continue
            return _decode(response, call)

    def request(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        return self.run(_Call(method, path, lambda b: b, json))

    def health(self) -> dict[str, Any]:
        return self.run(_Calls.health())

    def servers(self) -> list[dict[str, Any]]:
        return self.run(_Calls.servers())

    def headers_info(self, name: str) -> dict[str, Any]:
        return self.run(_Calls.headers_info(name))

    def headers(self, name: str) -> dict[str, str]:
        return self.run(_Calls.headers(name))

    def acquire(self, name: str, cost: int = 1, max_wait: float = 0.0) -> dict[str, Any]:
        return self.run(_Calls.acquire(name, cost, max_wait))

    def call(self, name: str, cost: int = 1, max_wait: float = 0.0) -> dict[str, Any]:
        return self.run(_Calls.call(name, cost, max_wait))

    def invalidate(self, name: str, fingerprint: str | None = None, reason: str = "401") -> bool:
        return self.run(_Calls.invalidate(name, fingerprint, reason))

    def backoff(self, name: str, retry_after: float) -> float | None:
        return self.run(_Calls.backoff(name, retry_after))

    def status(self) -> dict[str, Any]:
        return self.run(_Calls.status())

    def secret_rotated(self, name: str) -> list[str]:
        return self.run(_Calls.secret_rotated(name))


__all__ = ["AsyncClient", "Client", "McpcredsError"]
