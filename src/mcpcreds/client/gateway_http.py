"""The gateway's httpx clients: `httpx.AsyncClient` (MCP SDK 1.x) or `httpx2.AsyncClient` (2.x)
bound to the sidecar's Unix socket, for `/mcp/{server}`.

Every new connection is checked before its first byte, as the library's own calls are: the
socket's folder (owner, mode, not a symlink) before connecting, the listener's SO_PEERCRED uid
once connected. A request is written in one write (httpcore writes its head, then its body, each
on its own, and the sidecar woke up twice per request).

On asyncio, a connection is an asyncio transport (`_Stream`), not anyio's stream: anyio reads a
Unix socket through a future that the loop's reader callback completes, and a read that the MCP
SDK cancels (it closes an SSE answer before its end) can leave that callback to complete a
cancelled future, which the loop reports as "Exception in callback Future.set_result(None) ...
InvalidStateError" in the user's process (anyio 4.16). On another event loop (trio), anyio's
stream is used.

Importing this module pulls in neither asyncio nor httpx (the command line imports `client.py`).
"""

from __future__ import annotations

from ..core.socket_check import check_folder, check_peer

TYPE_CHECKING = False  # not `typing`'s: the command line pays for every module imported here
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Iterable
    from types import ModuleType
    from typing import Any, Final

GATEWAY_ORIGIN: Final = "http://mcpcreds"  # the host part of gateway URLs: the socket is what is reached
# the MCP SDK's own defaults: 30 s to connect or write, 300 s between two bytes of an SSE stream
MCP_CONNECT_TIMEOUT: Final = 30.0
MCP_READ_TIMEOUT: Final = 300.0
COALESCE_BYTES: Final = 64 * 1024  # a request written before its answer is read: at most this is held back
READ_HIGH_WATER: Final = 256 * 1024  # unread bytes a connection holds before it stops reading


def gateway_url(name: str) -> str:
    """The URL to give an MCP client for server `name`, with a client from `mcp_http_client`."""
    from urllib.parse import quote

    return f"{GATEWAY_ORIGIN}/mcp/{quote(name, safe=':')}"


def check_folder_if_there(socket_path: str, sidecar_uid: int) -> None:
    """The folder check, now; a folder not made yet (no sidecar yet) is left to connect time."""
    import contextlib

    with contextlib.suppress(FileNotFoundError):
        check_folder(socket_path, sidecar_uid)


def gateway_http_client(flavour: str, socket_path: str, sidecar_uid: int, name: str,
                        grant_headers: dict[str, str], **kwargs: Any) -> Any:
    """An `httpx.AsyncClient` (`flavour` "httpx") or `httpx2.AsyncClient` ("httpx2") bound to the
    sidecar's socket, its base URL the gateway URL of server `name`. The socket's folder is
    checked now, and every new connection is checked before its first byte. `kwargs` go to the
    client; `headers`, `timeout` and `auth` may be None (the MCP SDK 1.x `httpx_client_factory`
    signature), a None timeout meaning the MCP SDK's defaults."""
    import importlib

    http = importlib.import_module(flavour)
    core = importlib.import_module("httpcore2" if flavour == "httpx2" else "httpcore")
    check_folder_if_there(socket_path, sidecar_uid)
    limits = kwargs.pop("limits", http.Limits(max_connections=100, max_keepalive_connections=20))
    transport = http.AsyncHTTPTransport(uds=socket_path, verify=False, limits=limits)
    if not hasattr(transport, "_pool"):  # pragma: no cover - an httpx that builds its pool elsewhere
        raise RuntimeError(f"this {flavour} version cannot carry the sidecar's socket checks")
    transport._pool = core.AsyncConnectionPool(
        uds=socket_path, network_backend=checked_backend(core, socket_path, sidecar_uid),
        max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry)
    if kwargs.get("timeout") is None:
        kwargs["timeout"] = http.Timeout(MCP_CONNECT_TIMEOUT, read=MCP_READ_TIMEOUT)
    if kwargs.get("auth") is None:
        kwargs.pop("auth", None)
    merged = {**(kwargs.pop("headers", None) or {}), **grant_headers}
    return http.AsyncClient(transport=transport, base_url=gateway_url(name), headers=merged, **kwargs)


def checked_backend(httpcore: ModuleType, socket_path: str, sidecar_uid: int) -> Any:
    """An httpcore (or httpcore2) network backend that checks the sidecar on every new connection
    before a byte is sent (see the module docstring), its streams writing a request at once."""
    import asyncio

    class OneWrite(httpcore.AsyncNetworkStream):  # type: ignore[misc, name-defined]
        """A request in one write: what is written waits for the next read (httpcore reads the
        answer after the whole request) or for `COALESCE_BYTES`."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.pending: list[bytes] = []
            self.size = 0
            self.timeout: float | None = None

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            if buffer:
                self.pending.append(buffer)
                self.size += len(buffer)
                self.timeout = timeout
            if self.size > COALESCE_BYTES:
                await self.flush()

        async def flush(self) -> None:
            if self.pending:
                data, self.pending, self.size = b"".join(self.pending), [], 0
                await self.inner.write(data, self.timeout)

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            try:  # noqa: SIM105 (contextlib is not imported here: the command line pays for each module)
                await self.flush()
            except httpcore.WriteError:  # as httpcore does: the answer may be there all the same
                pass
            return await self.inner.read(max_bytes, timeout)  # type: ignore[no-any-return]

        async def aclose(self) -> None:
            self.pending, self.size = [], 0
            await self.inner.aclose()

        async def start_tls(self, *args: Any, **kwargs: Any) -> Any:
            raise httpcore.ConnectError("no TLS on the sidecar's socket")

        def get_extra_info(self, info: str) -> Any:
            return self.inner.get_extra_info(info)

    class Stream(asyncio.Protocol):
        """One connection as an asyncio transport: what arrives is kept (reading stops past
        READ_HIGH_WATER until it is read), a read waits for bytes or the end, a write waits while
        the transport is paused. Every wait is a future this stream alone completes, only while
        it is pending."""

        def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
            self.loop = loop
            self.transport: asyncio.Transport | None = None
            self.buffer = bytearray()
            self.ended = False  # the sidecar closed its side, or the connection is gone
            self.error: BaseException | None = None
            self.reading_paused = self.writing_paused = False
            # a read's wait and a write's, each its own (httpcore never runs both at once, yet a
            # wait that ended must never clear another's)
            self.waiters: dict[str, asyncio.Future[None]] = {}

        # -- asyncio.Protocol
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            if len(self.buffer) > READ_HIGH_WATER and self.transport is not None:
                self.transport.pause_reading()
                self.reading_paused = True
            self._wake()

        def eof_received(self) -> bool:
            self.ended = True
            self._wake()
            return False

        def connection_lost(self, exc: BaseException | None) -> None:
            self.ended = True
            self.error = exc
            self.writing_paused = False
            self._wake()

        def pause_writing(self) -> None:
            self.writing_paused = True

        def resume_writing(self) -> None:
            self.writing_paused = False
            self._wake()

        def _wake(self) -> None:
            for waiter in self.waiters.values():
                if not waiter.done():
                    waiter.set_result(None)

        async def _wait(self, kind: str, timeout: float | None, raised: type[Exception]) -> None:
            waiter = self.waiters[kind] = self.loop.create_future()
            try:
                async with asyncio.timeout(timeout):
                    await waiter
            except TimeoutError:
                raise raised("the sidecar did not answer in time") from None
            finally:
                del self.waiters[kind]

        # -- what httpcore asks of a network stream
        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            while not self.buffer and not self.ended:
                await self._wait("read", timeout, httpcore.ReadTimeout)
            if not self.buffer:
                if self.error is not None:
                    raise httpcore.ReadError(f"the sidecar's connection broke ({type(self.error).__name__})")
                return b""
            if len(self.buffer) <= max_bytes:
                data, self.buffer = bytes(self.buffer), bytearray()
            else:
                data = bytes(memoryview(self.buffer)[:max_bytes])
                del self.buffer[:max_bytes]
            if self.reading_paused and len(self.buffer) <= READ_HIGH_WATER // 2 and self.transport:
                self.reading_paused = False
                self.transport.resume_reading()
            return data

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            if self.ended or self.transport is None or self.transport.is_closing():
                raise httpcore.WriteError("the sidecar's connection is closed")
            self.transport.write(buffer)
            while self.writing_paused and not self.ended:
                await self._wait("write", timeout, httpcore.WriteTimeout)
            if self.ended:
                raise httpcore.WriteError("the sidecar's connection is closed")

        async def aclose(self) -> None:
            if self.transport is not None:  # what was not sent yet is dropped: the socket goes now
                self.transport.abort()

        def get_extra_info(self, info: str) -> Any:
            if info == "is_readable":  # a kept connection that received a byte or its end is not reused
                return bool(self.buffer) or self.ended
            if info == "socket" and self.transport is not None:
                return self.transport.get_extra_info("socket")
            return None

    async def connect(path: str, timeout: float | None) -> Stream:
        loop = asyncio.get_running_loop()
        stream = Stream(loop)
        try:
            async with asyncio.timeout(timeout):
                await loop.create_unix_connection(lambda: stream, path)
        except TimeoutError:
            raise httpcore.ConnectTimeout("no connection to the sidecar in time") from None
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise httpcore.ConnectError(f"no connection to the sidecar ({why})") from None
        return stream

    class CheckedBackend(httpcore.AsyncNetworkBackend):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.inner = httpcore.AnyIOBackend()

        async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                      socket_options: Iterable[Any] | None = None) -> Any:
            try:
                check_folder(socket_path, sidecar_uid)
            except FileNotFoundError as exc:
                raise httpcore.ConnectError(f"no sidecar socket folder ({exc.strerror})") from None
            stream = await self.open(timeout, socket_options)
            try:
                check_peer(stream.get_extra_info("socket"), socket_path, sidecar_uid)
            except BaseException:
                await stream.aclose()
                raise
            return OneWrite(stream)

        async def open(self, timeout: float | None, socket_options: Iterable[Any] | None) -> Any:
            """A connection to the socket, unchecked (see the module docstring for which kind)."""
            if on_asyncio():
                return await connect(socket_path, timeout)
            return await self.inner.connect_unix_socket(socket_path, timeout, socket_options)

        async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                              local_address: str | None = None,
                              socket_options: Iterable[Any] | None = None) -> Any:
            raise httpcore.ConnectError("a sidecar client connects to the Unix socket only")

        async def sleep(self, seconds: float) -> None:
            await self.inner.sleep(seconds)

    return CheckedBackend()


def on_asyncio() -> bool:
    """Whether the caller runs on asyncio (or a loop built on it, such as uvloop), as httpcore
    tells: sniffio's answer where it is installed (trio in guest mode inside an asyncio loop is
    trio), else whether an asyncio loop runs."""
    try:
        import sniffio
    except ImportError:
        import asyncio

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True
    try:
        return bool(sniffio.current_async_library() == "asyncio")
    except sniffio.AsyncLibraryNotFoundError:
        return False
