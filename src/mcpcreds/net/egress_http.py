"""The egress policy's I/O shell: `EgressTransport`, an httpx transport that resolves each name
itself, checks every address against the `EgressPolicy` (egress.py), then connects to the address
it checked (so a name cannot resolve to something else at connect time: no DNS-rebinding bypass)
while TLS still verifies the certificate against the original host name (SNI)."""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Any

import httpx

from .egress import (
    CHECK_CACHE,
    EgressPolicy,
    OnConnect,
    Resolver,
    ip_literal,
    shared_ssl_context,
    system_resolver,
)


class ConnectError(httpx.ConnectError):
    """No connection to the server. `reason` says why in a few words that quote nothing of the
    request (no URL, no address): "connection refused", "cannot resolve the host", or for a failed
    TLS handshake (`tls`) OpenSSL's name for it ("CERTIFICATE_VERIFY_FAILED"). Named as httpx's,
    whose place it takes: messages that show the error's type read as before."""

    def __init__(self, message: str, *, request: httpx.Request, reason: str, tls: bool = False) -> None:
        super().__init__(message, request=request)
        self.reason = reason
        self.tls = tls

    @classmethod
    def of(cls, exc: OSError, request: httpx.Request) -> ConnectError:
        """The connect error for `exc` (an `ssl.SSLError` too)."""
        if isinstance(exc, ssl.SSLError):
            reason = "".join(ch for ch in str(exc.reason or "") if ch.isalnum() or ch == "_")[:64]
            return cls(f"cannot connect to the server: {exc}", request=request,
                       reason=reason or type(exc).__name__, tls=True)
        reason = os.strerror(exc.errno).lower() if exc.errno else type(exc).__name__
        return cls(f"cannot connect to the server: {exc}", request=request, reason=reason[:64])


class EgressTransport(httpx.AsyncBaseTransport):
    """An httpx transport that enforces an `EgressPolicy` on every request.

    Per request: check the host; resolve it (unless it is an IP literal); check every address;
    report to `on_connect` when the policy is audited; send the request to the first address
    (the next ones on a connect error), with the `Host` header and the TLS `sni_hostname` of
    the original name, so certificates are verified against it. Each (scheme, host, port) has
    its own connection pool, so a TLS connection verified for one name never carries another.
    Keyword arguments (`verify`, `http2`, `limits`, `retries`, ...) go to each
    `httpx.AsyncHTTPTransport` (or `pool_class`, when given). Environment proxies are not used.
    """

    def __init__(self, policy: EgressPolicy, *, on_connect: OnConnect | None = None,
                 resolver: Resolver | None = None, **transport_kwargs: Any) -> None:
        self.policy = policy
        self.on_connect = on_connect
        self.resolver = resolver or system_resolver
        self._transport_kwargs = transport_kwargs
        self._pools: dict[tuple[str, str, int], httpx.AsyncBaseTransport] = {}
        # what the (immutable) policy already allowed: host as in the URL -> canonical name, and
        # (name, address) pairs; bounded, and only ever a cache of a pure decision
        self._hosts: dict[str, str] = {}
        self._addresses: set[tuple[str, str]] = set()
        self._urls: dict[tuple[str, str], httpx.URL] = {}  # (URL, address) -> the URL pinned to it

    def _pool(self, key: tuple[str, str, int]) -> httpx.AsyncBaseTransport:
        if (pool := self._pools.get(key)) is None:
            kwargs = dict(self._transport_kwargs)
            kwargs.setdefault("verify", shared_ssl_context())
            pool_class = kwargs.pop("pool_class", httpx.AsyncHTTPTransport)
            pool = self._pools[key] = pool_class(**kwargs)
        return pool

    async def _resolve(self, request: httpx.Request, host: str, port: int) -> list[str]:
        if ip_literal(host) is not None:
            return [host]
        timeout = request.extensions.get("timeout", {}).get("connect")
        try:
            addresses = await asyncio.wait_for(self.resolver(host, port), timeout)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"resolving {host} timed out", request=request) from None
        except OSError as exc:
            raise ConnectError(f"cannot resolve {host}: {exc}", request=request,
                               reason="cannot resolve the host") from None
        if not addresses:
            raise ConnectError(f"cannot resolve {host}: no address", request=request,
                               reason="cannot resolve the host")
        return addresses

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        raw_host = url.raw_host.decode("ascii")
        host = self._hosts.get(raw_host) or self.policy.check_host(raw_host)
        port = url.port or (443 if url.scheme == "https" else 80)
        addresses = await self._resolve(request, host, port)
        for address in addresses:
            if (host, address) not in self._addresses:
                self.policy.check_address(host, address)
                if len(self._addresses) >= CHECK_CACHE:
                    self._addresses.clear()
                self._addresses.add((host, address))
        if raw_host not in self._hosts:
            if len(self._hosts) >= CHECK_CACHE:
                self._hosts.clear()
            self._hosts[raw_host] = host
        pool = self._pool((url.scheme, host, port))
        headers = httpx.Headers(request.headers)
        if "host" not in headers:
            headers["Host"] = url.netloc.decode("ascii")
        last: httpx.ConnectError | None = None
        for address in addresses:
            if self.policy.audited and self.on_connect is not None:
                self.on_connect(host, address, port)
            pinned = httpx.Request(
                request.method, self._pinned_url(url, address), headers=headers, stream=request.stream,
                extensions={**request.extensions, "sni_hostname": host},
            )
            try:
                return await pool.handle_async_request(pinned)
            except httpx.ConnectError as exc:
                last = exc
        assert last is not None
        raise last

    def _pinned_url(self, url: httpx.URL, address: str) -> httpx.URL:
        """`url` with `address` for its host (parsing a URL is the costly part of a request)."""
        key = (str(url), address)
        pinned = self._urls.get(key)
        if pinned is None:
            if len(self._urls) >= CHECK_CACHE:
                self._urls.clear()
            pinned = self._urls[key] = url.copy_with(host=address)
        return pinned

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


def egress_client(policy: EgressPolicy, *, on_connect: OnConnect | None = None,
                  resolver: Resolver | None = None, transport_kwargs: dict[str, Any] | None = None,
                  **client_kwargs: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` whose every request goes through an `EgressTransport`."""
    transport = EgressTransport(policy, on_connect=on_connect, resolver=resolver,
                                **(transport_kwargs or {}))
    client_kwargs.setdefault("follow_redirects", False)
    return httpx.AsyncClient(transport=transport, **client_kwargs)

