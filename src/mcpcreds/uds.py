"""A lean HTTP/1.1 client for the sidecar's Unix socket (blocking sockets + httptools), and what
it shares with the asyncio twin in `uds_async`.

httpx costs about 1.7 ms a request here; this costs a tenth of that, and the client's calls are
on every upstream request's path. Kept connections are reused; a connection that fails before
any answer byte is reported retryable. Each new connection is checked before its first byte
(`socket_check`): the folder, then the peer's uid.

No asyncio here: `mcpcreds token|headers|acquire|status` go through `SyncUdsHttp` only, and
importing asyncio would cost each of them tens of ms (tests/test_cli_imports.py).
"""

from __future__ import annotations

import json
from _socket import AF_UNIX, SOCK_STREAM, socket  # `socket`'s base class: its module costs ~1 ms
from _thread import allocate_lock  # threading.Lock itself, without importing threading

import httptools

from .socket_check import check_folder, check_peer

TYPE_CHECKING = False  # not `typing`'s: importing typing costs each CLI command ~2 ms
if TYPE_CHECKING:
    from typing import Any, Final

MAX_RESPONSE: Final = 1024 * 1024


class Retryable(ConnectionError):
    """The request may not have reached the sidecar (refused, missing socket, stale connection)."""


class Parsed:
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.size = 0
        self.done = False
        self.keep_alive = False
        self.status = 0

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > MAX_RESPONSE:
            raise ValueError("sidecar answer too large")
        self.body.append(body)

    def on_message_complete(self) -> None:
        # read while the parser still holds this message (it resets once the callback returns)
        self.keep_alive = self.parser.should_keep_alive()
        self.status = self.parser.get_status_code()
        self.done = True


def encode(head: bytes, method: str, path: str, body: dict[str, Any] | None) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
    lines = f"{method} {path} HTTP/1.1\r\nHost: mcpcreds\r\n".encode() + head
    if body is not None:
        lines += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(payload)
    return lines + b"\r\n" + payload


def decode_json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        return None


class SyncUdsHttp:
    """The blocking twin of `UdsHttp`, for `Client`; kept connections are shared by threads."""

    def __init__(self, path: str, headers: dict[str, str], sidecar_uid: int) -> None:
        self.path = path
        self.sidecar_uid = sidecar_uid
        self._head = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        self._idle: list[socket] = []
        self._lock = allocate_lock()

    def _connection(self, timeout: float) -> socket:
        with self._lock:
            if self._idle:
                sock = self._idle.pop()
                sock.settimeout(timeout)
                return sock
        try:
            check_folder(self.path, self.sidecar_uid)
        except FileNotFoundError as exc:
            raise Retryable(str(exc)) from None
        sock = socket(AF_UNIX, SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.path)
            check_peer(sock, self.path, self.sidecar_uid)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise Retryable(str(exc)) from None
        except BaseException:
            sock.close()
            raise
        return sock

    def request(self, method: str, path: str, body: dict[str, Any] | None,
                timeout: float) -> tuple[int, Any]:
        sock = self._connection(timeout)
        try:
            parsed = Parsed()
            received = False
            try:
                sock.sendall(encode(self._head, method, path, body))
            except OSError as exc:  # a kept connection to a sidecar that went away
                raise Retryable(str(exc)) from None
            while not parsed.done:
                try:
                    chunk = sock.recv(65536)
                except (ConnectionResetError, BrokenPipeError) as exc:
                    if received:
                        raise
                    raise Retryable(str(exc)) from None
                if not chunk:
                    if received:
                        raise ConnectionResetError("the sidecar closed the connection mid-answer")
                    raise Retryable("the sidecar closed the connection")
                received = True
                parsed.parser.feed_data(chunk)
        except BaseException:
            sock.close()
            raise
        if parsed.keep_alive:
            with self._lock:
                self._idle.append(sock)
        else:
            sock.close()
        return parsed.status, decode_json(b"".join(parsed.body))

    def close(self) -> None:
        with self._lock:
            for sock in self._idle:
                sock.close()
            self._idle.clear()
