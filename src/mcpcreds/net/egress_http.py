"""The egress policy's I/O shell: `EgressTransport`, an httpx transport that resolves each name
itself, checks every address against the `EgressPolicy` (egress.py), then connects to the address
it checked (so a name cannot resolve to something else at connect time: no DNS-rebinding bypass)
while TLS still verifies the certificate against the original host name (SNI).

`EgressTransport.relay` is the same walk for the gateway's relayed traffic without an httpx
object per call: method, URL, header list and body in, a `RawAnswer` (status, the raw header
list, the body's chunks) out, when the pool under it has a `relay` of its own (`upstream.H1Transport`).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, Protocol

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

    def __init__(self, message: str, *, request: httpx.Request | None, reason: str,
                 tls: bool = False) -> None:
        super().__init__(message, request=request)
        self.reason = reason
        self.tls = tls

    @classmethod
    def of(cls, exc: OSError, request: httpx.Request | None) -> ConnectError:
        """The connect error for `exc` (an `ssl.SSLError` too)."""
        if isinstance(exc, ssl.SSLError):
            reason = "".join(ch for ch in str(exc.reason or "") if ch.isalnum() or ch == "_")[:64]
            return cls(f"cannot connect to the server: {exc}", request=request,
                       reason=reason or type(exc).__name__, tls=True)
        reason = os.strerror(exc.errno).lower() if exc.errno else type(exc).__name__
        return cls(f"cannot connect to the server: {exc}", request=request, reason=reason[:64])


Header = tuple[bytes, bytes]


class BodyReader(Protocol):
    """The body of a `RawAnswer` as its transport reads it (see `upstream.H1Transport.relay`)."""

    async def read(self, deadline: float | None) -> bytes:
        """The bytes received so far (waiting for some), b"" at the end; TimeoutError once the
        loop's clock passes `deadline`."""
        ...

    def at_end(self) -> bool:
        """Whether all of the body was received and read: `read` would return b"" at once."""
        ...

    async def news(self, deadline: float) -> None:
        """Wait, reading nothing, until more of the body or its end is here; TimeoutError once the
        loop's clock passes `deadline`."""
        ...

    async def aclose(self) -> None: ...


class RawAnswer:
    """An upstream answer as the gateway relays it: `status_code`, the header list as received
    (`raw_headers`) and the body (`next_chunk`, `aiter_raw`: never decoded), or an `httpx.Response`
    wrapped (`of`: the answers of another transport). `headers` (an `httpx.Headers`, made on
    first use) is for the rare readers; `header` looks one up without it."""

    def __init__(self, status: int, raw_headers: list[Header], body: BodyReader | None,
                 response: httpx.Response | None = None) -> None:
        self.status_code = status
        self.raw_headers = raw_headers
        self.response = response  # the httpx answer this one wraps, if it does
        self._body = body
        self._index: dict[bytes, bytes] | None = None
        self._headers: httpx.Headers | None = None if response is None else response.headers
        self._chunks: AsyncIterator[bytes] | None = None
        self._content: bytes | None = None

    @classmethod
    def of(cls, response: httpx.Response) -> RawAnswer:
        return cls(response.status_code, response.headers.raw, None, response)

    def header(self, name: bytes) -> str | None:
        """The value of header `name` (lower case) decoded as latin-1, its values joined with
        ", " if it came more than once (as `httpx.Headers.get`); None if absent."""
        index = self._index
        if index is None:
            index = self._index = {}
            for key, value in self.raw_headers:
                key = key.lower()
                index[key] = index[key] + b", " + value if key in index else value
        found = index.get(name)
        return None if found is None else found.decode("latin-1")

    @property
    def headers(self) -> httpx.Headers:
        if self._headers is None:
            self._headers = httpx.Headers(self.raw_headers)
        return self._headers

    @property
    def is_stream_consumed(self) -> bool:
        return self._content is not None or (self.response is not None and self.response.is_stream_consumed)

    @property
    def content(self) -> bytes:
        if self.response is not None:
            return self.response.content
        assert self._content is not None, "read with aread first"
        return self._content

    async def aread(self) -> bytes:
        if self.response is not None:
            return await self.response.aread()
        if self._content is None:
            self._content = b"".join([chunk async for chunk in self.aiter_raw()])
        return self._content

    async def next_chunk(self, deadline: float | None = None) -> bytes:
        """The next bytes of the body, b"" at its end; TimeoutError once the loop's clock passes
        `deadline` (without a timeout context per chunk on the raw way)."""
        if self._body is not None:
            return await self._body.read(deadline)
        if self._chunks is None:
            self._chunks = self.aiter_raw()
        async with asyncio.timeout_at(deadline):
            return await anext(self._chunks, b"")

    def at_end(self) -> bool:
        """Whether the body is known to be all received and read (never for a wrapped answer)."""
        return self._body is not None and self._body.at_end()

    async def news(self, deadline: float) -> None:
        """Wait, reading nothing, until more of the body or its end is here (a wrapped answer: at
        once, knowing nothing); TimeoutError once the loop's clock passes `deadline`."""
        if self._body is not None:
            await self._body.news(deadline)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self.response is not None:
            async for chunk in self.response.aiter_raw():
                yield chunk
            return
        while self._body is not None and (chunk := await self._body.read(None)):
            yield chunk

    async def aclose(self) -> None:
        if self.response is not None:
            await self.response.aclose()
            return
        body, self._body = self._body, None
        if body is not None:
            await body.aclose()


class RawPool(Protocol):
    """A pool that relays without httpx objects (see `upstream.H1Transport.relay`)."""

    async def relay(self, method: bytes, url: httpx.URL, headers: list[Header], body: bytes | None,
                    timeouts: dict[str, Any], sni: str, deadline: float | None = None) -> RawAnswer: ...


RESOLVED_TTL: Final = 30.0  # seconds a name's addresses are reused, as a DNS client's cache does


def _port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


class EgressTransport(httpx.AsyncBaseTransport):
    """An httpx transport that enforces an `EgressPolicy` on every request.

    Per request: check the host; resolve it (unless it is an IP literal; a name's addresses are
    reused for RESOLVED_TTL seconds, and looked up again at once when none of them connects);
    check every address;
    report to `on_connect` when the policy is audited; send the request to the first address
    (the next ones on a connect error), with the `Host` header and the TLS `sni_hostname` of
    the original name, so certificates are verified against it. Each (scheme, host, port) has
    its own connection pool, so a TLS connection verified for one name never carries another.
    Keyword arguments (`verify`, `http2`, `limits`, `retries`, ...) go to each
    `httpx.AsyncHTTPTransport` (or `pool_class`, when given). Environment proxies are not used.
    """

    def __init__(self, policy: EgressPolicy, *, on_connect: OnConnect | None = None,
                 resolver: Resolver | None = None, clock: Callable[[], float] = time.monotonic,
                 **transport_kwargs: Any) -> None:
        self.policy = policy
        self.on_connect = on_connect
        self.resolver = resolver or system_resolver
        self.clock = clock
        # name -> (until when, its addresses as the resolver gave them): every address is still
        # checked against the policy before use; bounded like the caches below
        self._resolved: dict[str, tuple[float, list[str]]] = {}
        self._transport_kwargs = transport_kwargs
        self.relays = hasattr(transport_kwargs.get("pool_class"), "relay")  # `relay` may be used
        self._pools: dict[tuple[str, str, int], httpx.AsyncBaseTransport] = {}
        # what the (immutable) policy already allowed: host as in the URL -> canonical name, and
        # (name, address) pairs; bounded, and only ever a cache of a pure decision
        self._hosts: dict[str, str] = {}
        self._addresses: set[tuple[str, str]] = set()
        self._literals: set[str] = set()  # canonical hosts that are IP addresses
        self._urls: dict[tuple[str, str], httpx.URL] = {}  # (URL, address) -> the URL pinned to it
        # (id of URL, address) -> (that URL, the URL pinned): `relay`'s URLs are the gateway's, kept
        self._pinned: dict[tuple[int, str], tuple[httpx.URL, httpx.URL]] = {}

    def _pool(self, key: tuple[str, str, int]) -> httpx.AsyncBaseTransport:
        if (pool := self._pools.get(key)) is None:
            kwargs = dict(self._transport_kwargs)
            kwargs.setdefault("verify", shared_ssl_context())
            pool_class = kwargs.pop("pool_class", httpx.AsyncHTTPTransport)
            pool = self._pools[key] = pool_class(**kwargs)
        return pool

    async def _resolve(self, request: httpx.Request | None, host: str, port: int,
                       timeout: float | None) -> tuple[list[str], bool]:
        """`host`'s addresses, and whether the resolver gave them just now (not an IP literal,
        nor kept from an earlier lookup)."""
        if host in self._literals or ip_literal(host) is not None:  # (parsing an address is costly)
            if len(self._literals) >= CHECK_CACHE:
                self._literals.clear()
            self._literals.add(host)
            return [host], False
        cached = self._resolved.get(host)
        if cached is not None and self.clock() < cached[0]:
            return cached[1], False
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
        return addresses, True

    def _known(self, url: httpx.URL) -> tuple[str, int, list[str]] | None:
        """`_checked`'s answer with no wait when it is at hand: the host's addresses (an IP
        literal, or a name looked up less than RESOLVED_TTL ago), each allowed already."""
        host = self._hosts.get(url.raw_host.decode("ascii"))
        if host is None:
            return None
        if host in self._literals:
            addresses = [host]
        else:
            cached = self._resolved.get(host)
            if cached is None or self.clock() >= cached[0]:
                return None
            addresses = cached[1]
        if not all((host, address) in self._addresses for address in addresses):
            return None
        return host, _port(url), addresses

    async def _checked(self, url: httpx.URL, request: httpx.Request | None,
                       timeout: float | None) -> tuple[str, int, list[str]]:
        """The canonical host, the port and the addresses to try, each allowed by the policy."""
        raw_host = url.raw_host.decode("ascii")
        host = self._hosts.get(raw_host) or self.policy.check_host(raw_host)
        port = _port(url)
        asked = self.clock()
        addresses, looked_up = await self._resolve(request, host, port, timeout)
        for address in addresses:
            if (host, address) not in self._addresses:
                self.policy.check_address(host, address)
                if len(self._addresses) >= CHECK_CACHE:
                    self._addresses.clear()
                self._addresses.add((host, address))
        if looked_up:  # kept only once every address is allowed: a refused answer is asked again
            if len(self._resolved) >= CHECK_CACHE:
                self._resolved.clear()
            self._resolved[host] = (asked + RESOLVED_TTL, addresses)
        if raw_host not in self._hosts:
            if len(self._hosts) >= CHECK_CACHE:
                self._hosts.clear()
            self._hosts[raw_host] = host
        return host, port, addresses

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        host, port, addresses = self._known(url) or await self._checked(
            url, request, request.extensions.get("timeout", {}).get("connect"))
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
            except httpx.ConnectTimeout:
                self._resolved.pop(host, None)  # it did not answer in time: looked up again next time
                raise
        assert last is not None
        self._resolved.pop(host, None)  # none of them answered: the name is looked up again next time
        raise last

    async def relay(self, method: bytes, url: httpx.URL, headers: list[Header], body: bytes | None,
                    timeouts: dict[str, Any], deadline: float | None = None) -> RawAnswer:
        """`handle_async_request` without the httpx objects (see the module doc): the same checks,
        audit and pinning; `headers` as sent, a `Host` first unless they carry one, and the
        `Content-Length` httpx would add. Only when `relays` (its pools are `RawPool`s).
        `deadline` (the loop's clock): TimeoutError if the answer's head is not here by then."""
        known = self._known(url)
        if known is None:  # a lookup, and the checks of its addresses: bounded by the deadline too
            async with asyncio.timeout_at(deadline):
                known = await self._checked(url, None, timeouts.get("connect"))
        host, port, addresses = known
        pool: Any = self._pool((url.scheme, host, port))
        if not any(len(k) == 4 and k.lower() == b"host" for k, _ in headers):
            headers = [(b"Host", url.netloc), *headers]
        if not any(k.lower() in (b"content-length", b"transfer-encoding") for k, _ in headers):
            if body is not None:
                headers = [*headers, (b"Content-Length", b"%d" % len(body))]
            elif method in (b"POST", b"PUT", b"PATCH"):
                headers = [*headers, (b"Content-Length", b"0")]
        last: httpx.ConnectError | None = None
        for address in addresses:
            if self.policy.audited and self.on_connect is not None:
                self.on_connect(host, address, port)
            try:
                pinned = self._pinned.get((id(url), address))
                if pinned is None or pinned[0] is not url:  # an id is unique only while its URL lives
                    if len(self._pinned) >= CHECK_CACHE:
                        self._pinned.clear()
                    pinned = self._pinned[(id(url), address)] = (url, self._pinned_url(url, address))
                relayed: RawAnswer = await pool.relay(method, pinned[1], headers, body, timeouts, host,
                                                      deadline)
                return relayed
            except httpx.ConnectError as exc:
                last = exc
            except httpx.ConnectTimeout:
                self._resolved.pop(host, None)  # it did not answer in time: looked up again next time
                raise
        assert last is not None
        self._resolved.pop(host, None)  # none of them answered: the name is looked up again next time
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
                  clock: Callable[[], float] = time.monotonic, **client_kwargs: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` whose every request goes through an `EgressTransport`."""
    transport = EgressTransport(policy, on_connect=on_connect, resolver=resolver, clock=clock,
                                **(transport_kwargs or {}))
    client_kwargs.setdefault("follow_redirects", False)
    return httpx.AsyncClient(transport=transport, **client_kwargs)


class UnreadableAnswer(ValueError):
    """An answer refused before it is parsed; the message says why (never what it held).
    `compressed`: refused for its Content-Encoding (else for its size)."""

    def __init__(self, why: str, compressed: bool) -> None:
        super().__init__(why)
        self.compressed = compressed


async def read_answer(response: httpx.Response, limit: int) -> bytes:
    """The body of an uncompressed answer of at most `limit` bytes. A compressed one is refused,
    never decoded: httpx decodes each chunk whole, so a few KiB of nested gzip become gigabytes
    before any size check sees them."""
    if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
        raise UnreadableAnswer("compressed (a Content-Encoding other than identity)", compressed=True)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise UnreadableAnswer(f"larger than {limit} bytes", compressed=False)
    return bytes(body)
