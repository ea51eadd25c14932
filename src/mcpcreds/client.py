"""The library client: `AsyncClient` and `Client` talk to the sidecar over its Unix socket."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import httpx

from .config import default_socket_path
from .errors import McpcredsError, SidecarUnavailable, error_from_wire

DEFAULT_TIMEOUT: Final = 10.0
CONNECT_RETRY_SECONDS: Final = 2.0  # ride out a sidecar restart
_BASE: Final = "http://mcpcreds"
_RETRYABLE: Final = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError,
                     httpx.WriteError)


def _server_path(name: str, action: str) -> str:
    return f"/v1/servers/{quote(name, safe=':')}/{action}"


def _headers(grant: str | None) -> dict[str, str]:
    grant = grant if grant is not None else os.environ.get("MCPCREDS_GRANT")
    return {"Authorization": f"Bearer {grant}"} if grant else {}


def _decode(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise error_from_wire(response.status_code, body if isinstance(body, dict) else {})
    return body


def _unavailable(path: Path, exc: Exception) -> SidecarUnavailable:
    return SidecarUnavailable(f"no mcpcreds sidecar answers on {path} ({type(exc).__name__}); "
                              "start one with `mcpcreds serve`")


class AsyncClient:
    """`async with AsyncClient() as creds: await creds.headers("crm-ro")`."""

    def __init__(self, socket: str | os.PathLike[str] | None = None, *, grant: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 connect_retry: float = CONNECT_RETRY_SECONDS) -> None:
        self.socket_path = Path(socket) if socket else default_socket_path()
        self.timeout = timeout
        self.connect_retry = connect_retry
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.socket_path)),
            base_url=_BASE, headers=_headers(grant), timeout=timeout,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, json: dict[str, Any] | None = None,
                      timeout: float | None = None) -> Any:
        deadline = time.monotonic() + self.connect_retry
        delay = 0.02
        while True:
            try:
                response = await self._http.request(method, path, json=json,
                                                    timeout=timeout or self.timeout)
                return _decode(response)
            except httpx.TimeoutException as exc:
                raise SidecarUnavailable(f"the sidecar on {self.socket_path} did not answer in time "
                                         f"({type(exc).__name__})") from None
            except _RETRYABLE as exc:
                if time.monotonic() + delay > deadline:
                    raise _unavailable(self.socket_path, exc) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)

    async def health(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", "/v1/health")
        return result

    async def servers(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = (await self.request("GET", "/v1/servers"))["servers"]
        return result

    async def headers_info(self, name: str) -> dict[str, Any]:
        """The whole answer: headers, key, expires_at, fingerprint."""
        result: dict[str, Any] = await self.request("GET", _server_path(name, "headers"))
        return result

    async def headers(self, name: str) -> dict[str, str]:
        result: dict[str, str] = (await self.headers_info(name))["headers"]
        return result

    async def status(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", "/v1/status")
        return result

    async def secret_rotated(self, name: str) -> list[str]:
        result: list[str] = (await self.request(
            "POST", f"/v1/secrets/{quote(name, safe='')}/rotated", json={}))["renewed"]
        return result


class Client:
    """The synchronous twin of `AsyncClient`."""

    def __init__(self, socket: str | os.PathLike[str] | None = None, *, grant: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 connect_retry: float = CONNECT_RETRY_SECONDS) -> None:
        self.socket_path = Path(socket) if socket else default_socket_path()
        self.timeout = timeout
        self.connect_retry = connect_retry
        self._http = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket_path)),
            base_url=_BASE, headers=_headers(grant), timeout=timeout,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, json: dict[str, Any] | None = None,
                timeout: float | None = None) -> Any:
        deadline = time.monotonic() + self.connect_retry
        delay = 0.02
        while True:
            try:
                return _decode(self._http.request(method, path, json=json,
                                                  timeout=timeout or self.timeout))
            except httpx.TimeoutException as exc:
                raise SidecarUnavailable(f"the sidecar on {self.socket_path} did not answer in time "
                                         f"({type(exc).__name__})") from None
            except _RETRYABLE as exc:
                if time.monotonic() + delay > deadline:
                    raise _unavailable(self.socket_path, exc) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.25)

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", "/v1/health")
        return result

    def servers(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", "/v1/servers")["servers"]
        return result

    def headers_info(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", _server_path(name, "headers"))
        return result

    def headers(self, name: str) -> dict[str, str]:
        result: dict[str, str] = self.headers_info(name)["headers"]
        return result

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", "/v1/status")
        return result

    def secret_rotated(self, name: str) -> list[str]:
        result: list[str] = self.request(
            "POST", f"/v1/secrets/{quote(name, safe='')}/rotated", json={})["renewed"]
        return result


__all__ = ["AsyncClient", "Client", "McpcredsError"]
