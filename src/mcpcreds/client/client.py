"""The library client: `AsyncClient` and `Client` talk to the sidecar over its Unix socket.

Every call is described once (`calls.Call`: method, path, body, what to return); the two classes
are thin drivers that send it, with the same retry and error mapping.

Importing this module (and driving `Client`) pulls in neither asyncio nor httpx: the command line
(`mcpcreds token|headers|acquire|status`) goes through `Client`, and those imports would cost each
command tens of ms. `AsyncClient` imports its asyncio transport when one is made; `auth()` and the
gateway clients import httpx when called (tests/test_cli_imports.py checks what is imported).
"""

from __future__ import annotations

import os
import time
from _thread import allocate_lock  # threading.Lock itself, without importing threading (~1 ms)

from ..core.socket_check import expected_sidecar_uid
from ..errors import McpcredsError, SidecarUnavailable, error_from_wire
from .address import path_text, socket_file
from .calls import Call, Calls, MalformedAnswer
from .uds import Retryable, SyncUdsHttp

TYPE_CHECKING = False  # not `typing`'s: the command line pays for every module imported here
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any, Final, Literal, Self, TypeVar

    import httpx

    from .auth import HttpxAuth

    R = TypeVar("R")

DEFAULT_TIMEOUT: Final = 10.0
CONNECT_RETRY_SECONDS: Final = 2.0  # ride out a sidecar restart
def grant_header(grant: str | None) -> dict[str, str]:
    """`Authorization: Bearer <grant>` for `grant`, else $MCPCREDS_GRANT; none without a grant."""
    grant = grant if grant is not None else os.environ.get("MCPCREDS_GRANT")
    return {"Authorization": f"Bearer {grant}"} if grant else {}


def _decode_parts(status: int, body: Any, call: Call[R]) -> R:
    if status >= 400:
        try:
            error = error_from_wire(status, body if isinstance(body, dict) else {})
        except (TypeError, ValueError) as exc:  # e.g. a retry_after that is not a number
            raise MalformedAnswer(f"the sidecar's HTTP {status} answer to {call.method} {call.path} "
                                  f"is malformed ({exc})") from None
        raise error
    return call.extract(body)


# what a transport raises when the sidecar cannot be reached or its answer cannot be read;
# AsyncClient adds httptools' parser error (Client's transport raises ValueError)
_FAILURES: Final = (TimeoutError, OSError, ValueError)


class _RetryWindow:
    """How long to wait before trying the sidecar again: a window of `seconds` that opens at the
    first failure (a call that waited long in the sidecar is still retried across a restart),
    with doubling delays and a last try on the deadline. Only `Retryable` failures are retried."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline: float | None = None
        self.delay = 0.02

    def wait_after(self, exc: BaseException, unavailable: Callable[[BaseException], McpcredsError]) -> float:
        if not isinstance(exc, Retryable):
            raise unavailable(exc) from None
        if self.deadline is None:
            self.deadline = time.monotonic() + self.seconds
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise unavailable(exc) from None
        wait, self.delay = min(self.delay, left), min(self.delay * 2, 0.25)
        return wait


class _Base:
    _malformed: tuple[type[Exception], ...] = (ValueError,)  # an answer that is not HTTP
    _failures: tuple[type[Exception], ...] = _FAILURES

    def __init__(self, socket: str | os.PathLike[str] | None, grant: str | None, timeout: float,
                 connect_retry: float, sidecar_uid: int | None) -> None:
        self._socket = path_text(os.fspath(socket)) if socket else socket_file()
        self.sidecar_uid = expected_sidecar_uid(sidecar_uid)
        self.timeout = timeout
        self.connect_retry = connect_retry
        self._headers = grant_header(grant)

    @property
    def socket_path(self) -> Path:
        """The sidecar's socket."""
        from pathlib import Path  # not on the command line's path: it uses the text

        return Path(self._socket)

    def _unavailable(self, exc: BaseException) -> SidecarUnavailable:
        if isinstance(exc, TimeoutError):
            return SidecarUnavailable(f"the sidecar on {self.socket_path} did not answer in time")
        if isinstance(exc, self._malformed):
            return SidecarUnavailable(f"the sidecar on {self.socket_path} sent a malformed HTTP answer "
                                      f"({type(exc).__name__})")
        return SidecarUnavailable(f"no mcpcreds sidecar answers on {self.socket_path} "
                                  f"({type(exc).__name__}); start one with `mcpcreds serve`")


class AsyncClient(_Base):
    """`async with AsyncClient() as creds: await creds.headers("crm-ro")`.

    `sidecar_uid`: the uid the sidecar runs as (default $MCPCREDS_SIDECAR_UID, else ours); a socket
    whose folder or listener is another uid's is refused with `UntrustedSidecar` before a byte."""

    def __init__(self, socket: str | os.PathLike[str] | None = None, *, grant: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, connect_retry: float = CONNECT_RETRY_SECONDS,
                 sidecar_uid: int | None = None) -> None:
        super().__init__(socket, grant, timeout, connect_retry, sidecar_uid)
        import httptools

        from .uds_async import UdsHttp

        self._malformed = (ValueError, httptools.HttpParserError)
        self._failures = (*_FAILURES, httptools.HttpParserError)
        self._http = UdsHttp(self._socket, self._headers, self.sidecar_uid)
        self._leasers: list[Any] = []  # leaser.AsyncLeaser of each auth() that leased

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for leaser in self._leasers:  # closing their event streams hands their shares back at once
            await leaser.aclose()
        self._leasers.clear()
        await self._http.aclose()

    async def run(self, call: Call[R]) -> R:
        window: _RetryWindow | None = None  # made at the first failure: most calls have none
        while True:
            try:
                status, body = await self._http.request(call.method, call.path, call.body,
                                                        self.timeout + call.extra_time)
            except self._failures as exc:
                import asyncio

                window = window or _RetryWindow(self.connect_retry)
                await asyncio.sleep(window.wait_after(exc, self._unavailable))
                continue
            return _decode_parts(status, body, call)

    async def request(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        return await self.run(Call(method, path, lambda b: b, json))

    async def health(self) -> dict[str, Any]:
        return await self.run(Calls.health())

    async def servers(self) -> list[dict[str, Any]]:
        return await self.run(Calls.servers())

    async def headers_info(self, name: str) -> dict[str, Any]:
        """The whole answer: headers, key, expires_at, fingerprint."""
        return await self.run(Calls.headers_info(name))

    async def headers(self, name: str) -> dict[str, str]:
        return await self.run(Calls.headers(name))

    async def acquire(self, name: str, cost: int = 1, max_wait: float = 0.0) -> dict[str, Any]:
        return await self.run(Calls.acquire(name, cost, max_wait))

    async def call(self, name: str, cost: int = 1, max_wait: float = 0.0) -> dict[str, Any]:
        """Permits and headers in one round trip."""
        return await self.run(Calls.call(name, cost, max_wait))

    async def invalidate(self, name: str, fingerprint: str | None = None, reason: str = "401") -> bool:
        return await self.run(Calls.invalidate(name, fingerprint, reason))

    async def backoff(self, name: str, retry_after: float) -> float | None:
        return await self.run(Calls.backoff(name, retry_after))

    async def status(self) -> dict[str, Any]:
        return await self.run(Calls.status())

    async def secret_rotated(self, name: str) -> list[str]:
        return await self.run(Calls.secret_rotated(name))

    async def grant(self, servers: list[str], ttl: float = 3600,
                    tools: dict[str, list[str]] | None = None) -> dict[str, Any]:
        """A narrower grant for a child: {"id", "grant", "expires_at", "servers", "tools"}; `tools`
        ({server: [tool, ...]}) narrows what the gateway lets the child list and call."""
        return await self.run(Calls.grant(servers, ttl, tools))

    async def revoke_grant(self, grant_id: str) -> bool:
        return await self.run(Calls.revoke_grant(grant_id))

    async def secret_rotate(self, name: str, value: str, force: bool = False) -> dict[str, Any]:
        """Rotate with overlap: the sidecar tries `value`, then stores it and renews logins."""
        return await self.run(Calls.secret_rotate(name, value, force))

    def auth(self, name: str, *, cost: int = 1, max_wait: float = 30.0,
             on_429: Literal["raise", "wait", "return"] = "wait",
             lease: bool | Literal["auto"] = "auto") -> HttpxAuth:
        """An httpx/httpx2 Auth for `name`: permit and headers per request, 401 and 429 handled.
        `lease="auto"` (default): an auth that calls fast leases a share of the server's bucket, if
        the share is worth holding, and spends it in this process (leaser.py): no round trip per
        request; True: whenever it calls often, whatever the share; False: never."""
        from .auth import AUTH_CLASS

        auth = AUTH_CLASS(None, self, name, cost=cost, max_wait=max_wait, on_429=on_429)
        auth.lease = lease
        return auth  # type: ignore[return-value]

    # -- the gateway

    def mcp_url(self, name: str) -> str:
        """`http://mcpcreds/mcp/{name}`: the URL to give the MCP SDK with `mcp_http_client(name)`."""
        from .gateway_http import gateway_url

        return gateway_url(name)

    def mcp_http_client(self, name: str, **kwargs: Any) -> httpx.AsyncClient:
        """An `httpx.AsyncClient` for the gateway of server `name` (MCP SDK 1.x), over the sidecar's
        socket with the library's checks (see `gateway_http_client`), carrying this client's grant.
        Use it with `streamable_http_client(creds.mcp_url(name), http_client=...)`: the
        credential, the rate limit and the tool policy are applied in the sidecar."""
        from .gateway_http import gateway_http_client

        client: httpx.AsyncClient = gateway_http_client("httpx", self._socket, self.sidecar_uid,
                                                        name, dict(self._headers), **kwargs)
        return client

    def mcp_httpx2_client(self, name: str, **kwargs: Any) -> Any:
        """The same as `mcp_http_client`, an `httpx2.AsyncClient` (the MCP SDK 2.x); needs httpx2."""
        from .gateway_http import gateway_http_client

        return gateway_http_client("httpx2", self._socket, self.sidecar_uid, name,
                                   dict(self._headers), **kwargs)


class Client(_Base):
    """The synchronous twin of `AsyncClient`."""

    def __init__(self, socket: str | os.PathLike[str] | None = None, *, grant: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, connect_retry: float = CONNECT_RETRY_SECONDS,
                 sidecar_uid: int | None = None) -> None:
        super().__init__(socket, grant, timeout, connect_retry, sidecar_uid)
        self._http = SyncUdsHttp(self._socket, self._headers, self.sidecar_uid)
        self._leasers: list[Any] = []  # leaser_sync.SyncLeaser of each auth() that leased
        self._leasers_lock = allocate_lock()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._leasers_lock:  # closing their event streams hands their shares back at once
            leasers, self._leasers = self._leasers, []
        for leaser in leasers:
            leaser.close()
        self._http.close()

    def run(self, call: Call[R]) -> R:
        window = _RetryWindow(self.connect_retry)
        while True:
            try:
                status, body = self._http.request(call.method, call.path, call.body,
                                                  timeout=self.timeout + call.extra_time)
            except self._failures as exc:
                time.sleep(window.wait_after(exc, self._unavailable))
                continue
            return _decode_parts(status, body, call)

    def request(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        return self.run(Call(method, path, lambda b: b, json))

    def health(self) -> dict[str, Any]:
        return self.run(Calls.health())

    def servers(self) -> list[dict[str, Any]]:
        return self.run(Calls.servers())

    def headers_info(self, name: str) -> dict[str, Any]:
        return self.run(Calls.headers_info(name))

    def headers(self, name: str) -> dict[str, str]:
        return self.run(Calls.headers(name))

    def acquire(self, name: str, cost: int = 1, max_wait: float = 0.0) -> dict[str, Any]:
        return self.run(Calls.acquire(name, cost, max_wait))

    def call(self, name: str, cost: int = 1, max_wait: float = 0.0) -> dict[str, Any]:
        return self.run(Calls.call(name, cost, max_wait))

    def invalidate(self, name: str, fingerprint: str | None = None, reason: str = "401") -> bool:
        return self.run(Calls.invalidate(name, fingerprint, reason))

    def backoff(self, name: str, retry_after: float) -> float | None:
        return self.run(Calls.backoff(name, retry_after))

    def status(self) -> dict[str, Any]:
        return self.run(Calls.status())

    def secret_rotated(self, name: str) -> list[str]:
        return self.run(Calls.secret_rotated(name))

    def grant(self, servers: list[str], ttl: float = 3600,
              tools: dict[str, list[str]] | None = None) -> dict[str, Any]:
        return self.run(Calls.grant(servers, ttl, tools))

    def revoke_grant(self, grant_id: str) -> bool:
        return self.run(Calls.revoke_grant(grant_id))

    def secret_rotate(self, name: str, value: str, force: bool = False) -> dict[str, Any]:
        return self.run(Calls.secret_rotate(name, value, force))

    def auth(self, name: str, *, cost: int = 1, max_wait: float = 30.0,
             on_429: Literal["raise", "wait", "return"] = "wait",
             lease: bool | Literal["auto"] = "auto") -> HttpxAuth:
        """An httpx/httpx2 Auth for `name`: permit and headers per request, 401 and 429 handled;
        a leased share spent in this process where it pays (`lease`: as in `AsyncClient.auth`)."""
        from .auth import AUTH_CLASS

        auth = AUTH_CLASS(self, None, name, cost=cost, max_wait=max_wait, on_429=on_429)
        auth.lease = lease
        return auth  # type: ignore[return-value]


__all__ = ["AsyncClient", "Client", "McpcredsError"]
