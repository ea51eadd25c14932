"""The egress proxy of `mcpcreds exec` sessions, served by the sidecar on a Unix socket.

One listener (`egress.sock`, next to the sidecar's socket) serves every session; a session is
found by its credential (`Proxy-Authorization: Basic base64("mcpcreds:" + token)`, the token
stored only as its hash). Per connection: the peer's uid is checked (SO_PEERCRED, the sidecar's
`allow_uids`), then one request:

- `CONNECT host:port`: the exec entry's `EgressPolicy` judges the host, the sidecar resolves it,
  every address is checked (SSRF guard) and the checked address is the one connected to (pinned
  DNS); then bytes are relayed both ways.
- `GET http://host[:port]/path` (any method, absolute form): the same checks, the request sent
  on in origin form with `Connection: close`, then relayed.
- `MCPCREDS-HOLD *`: the session's holder (the forwarder `mcpcreds exec` starts beside the
  child) keeps this connection open; when it closes (the child is gone), the session ends. A
  session nobody holds within `HOLD_TIMEOUT` ends too.

One audit line per connection (`exec_egress`: entry, session, method, host, port, address,
allowed, reason, bytes each way, duration), whatever the mode. Refusals answer 403 (policy) or
407 (no valid credential) with a short text that never repeats what was sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import secrets
import socket
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from .audit import AuditLog
from .egress import EgressPolicy, Resolver, normalize_host, system_resolver
from .errors import Forbidden, TooManyGrants
from .logs import get_logger

HOLD_METHOD: Final = b"MCPCREDS-HOLD"
HOLD_TIMEOUT: Final = 30.0  # a session nobody holds by then ends
MAX_HEAD: Final = 16 * 1024
HEAD_TIMEOUT: Final = 10.0
CONNECT_TIMEOUT: Final = 10.0
MAX_SESSIONS: Final = 1024
USER: Final = "mcpcreds"
_PEERCRED: Final = struct.Struct("3i")
_HOP_HEADERS: Final = (b"proxy-authorization", b"proxy-connection", b"connection", b"keep-alive")
_log = get_logger("egress_proxy")


@dataclass(slots=True)
class ProxySession:
    id: str
    name: str  # the exec entry
    policy: EgressPolicy
    uid: int
    pid: int
    held: bool = False


def proxy_url(token: str, port: int) -> str:
    return f"http://{USER}:{token}@127.0.0.1:{port}"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class _Refused(Exception):
    def __init__(self, status: bytes, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class EgressProxy:
    def __init__(self, path: str, allow_uids: Callable[[], frozenset[int]], audit: AuditLog,
                 resolver: Resolver | None = None) -> None:
        self.path = path
        self.allow_uids = allow_uids
        self.audit = audit
        self.resolver = resolver or system_resolver
        self._sessions: dict[str, ProxySession] = {}  # token hash -> session
        self._server: asyncio.AbstractServer | None = None

    async def start(self, mode: int = 0o600) -> None:
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(self.path)
            if stat.S_ISSOCK(info.st_mode) and info.st_uid == os.geteuid():
                os.unlink(self.path)  # left by an earlier sidecar on this (exclusively held) folder
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_HEAD)
        finally:
            os.umask(old)
        os.chmod(self.path, mode)

    @property
    def started(self) -> bool:
        return self._server is not None

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def new_session(self, name: str, policy: EgressPolicy, uid: int, pid: int) -> tuple[str, ProxySession]:
        """A session for one child; returns its token (given to the caller, never logged)."""
        if len(self._sessions) >= MAX_SESSIONS:
            raise TooManyGrants(f"too many live exec sessions (at most {MAX_SESSIONS})")
        token = secrets.token_urlsafe(32)
        session = ProxySession(secrets.token_hex(8), name, policy, uid, pid)
        hashed = _hash(token)
        self._sessions[hashed] = session
        asyncio.get_running_loop().call_later(HOLD_TIMEOUT, self._expire_unheld, hashed, session)
        return token, session

    def _expire_unheld(self, hashed: str, session: ProxySession) -> None:
        if not session.held and self._sessions.get(hashed) is session:
            del self._sessions[hashed]
            self.audit.write("exec_session_end", name=session.name, session=session.id, held=False)

    @property
    def live_sessions(self) -> int:
        return len(self._sessions)

    # -- one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            _pid, uid, _gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            if uid not in self.allow_uids():
                _log.warning("egress proxy: peer refused", extra={"uid": uid, "pid": _pid})
                return
            await self._one_request(reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                TimeoutError, ValueError):
            pass
        finally:
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except asyncio.LimitOverrunError:
            writer.write(_status(b"431 Request Header Fields Too Large", "request head too large"))
            return
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            writer.write(_status(b"400 Bad Request", "malformed request line"))
            return
        method, target, _version = parts
        headers = [line.partition(b":") for line in lines[1:]]
        hashed = _credential(headers)
        session = self._sessions.get(hashed) if hashed else None
        if session is None or hashed is None:
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                         b"Proxy-Authenticate: Basic realm=\"mcpcreds\"\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
            return
        if method == HOLD_METHOD:
            await self._hold(hashed, session, reader, writer)
        elif method == b"CONNECT":
            await self._connect(session, target, reader, writer)
        else:
            await self._forward(session, method, target, headers, reader, writer)

    async def _hold(self, hashed: str, session: ProxySession, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        if session.held:
            writer.write(_status(b"409 Conflict", "session already held"))
            return
        session.held = True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        try:
            while await reader.read(4096):
                pass
        finally:
            if self._sessions.get(hashed) is session:
                del self._sessions[hashed]
            self.audit.write("exec_session_end", name=session.name, session=session.id, held=True)

    async def _connect(self, session: ProxySession, target: bytes, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        host, _, port_text = target.decode("ascii", "replace").rpartition(":")
        await self._relay(session, "CONNECT", host, port_text, reader, writer, None)

    async def _forward(self, session: ProxySession, method: bytes, target: bytes,
                       headers: list[tuple[bytes, bytes, bytes]], reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        try:
            url = urlsplit(target.decode("ascii"))
            host, port = url.hostname or "", url.port or 80
        except (UnicodeDecodeError, ValueError):
            host, port = "", 0
        if not target.lower().startswith(b"http://") or not host:
            writer.write(_status(b"400 Bad Request", "expected CONNECT host:port or an absolute "
                                                      "http:// URL (https goes through CONNECT)"))
            return
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        head = [method + b" " + path.encode("ascii") + b" HTTP/1.1"]
        head += [name + b":" + value for name, _, value in headers
                 if name.strip().lower() not in _HOP_HEADERS]
        if not any(name.strip().lower() == b"host" for name, _, _ in headers):
            head.append(b"Host: " + url.netloc.rpartition("@")[2].encode("ascii"))
        head.append(b"Connection: close")
        request = b"\r\n".join(head) + b"\r\n\r\n"
        await self._relay(session, method.decode("ascii", "replace")[:16], host, str(port), reader, writer,
                          request)

    async def _relay(self, session: ProxySession, method: str, host: str, port_text: str,
                     reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     first: bytes | None) -> None:
        started = time.monotonic()
        fields: dict[str, object] = {"name": session.name, "session": session.id, "method": method,
                                     "host": host[:253], "port": None, "address": None,
                                     "uid": session.uid, "pid": session.pid}
        counts = [0, 0]
        try:
            try:
                name, _port, upstream = await self._open(session.policy, host, port_text, fields)
            except _Refused as exc:
                fields.update(allowed=False, reason=exc.reason)
                writer.write(_status(exc.status, exc.reason))
                return
            fields.update(allowed=True, host=name)
            up_reader, up_writer = upstream
            try:
                if first is None:
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    up_writer.write(first)
                    counts[0] += len(first)
                await asyncio.gather(_pump(reader, up_writer, counts, 0), _pump(up_reader, writer, counts, 1))
            finally:
                up_writer.close()
        finally:
            self.audit.write("exec_egress", **fields, bytes_up=counts[0], bytes_down=counts[1],
                             duration=round(time.monotonic() - started, 6))

    async def _open(self, policy: EgressPolicy, host: str, port_text: str, fields: dict[str, object]
                    ) -> tuple[str, int, tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536 or not host:
            raise _Refused(b"400 Bad Request", "expected host:port")
        port = int(port_text)
        fields["port"] = port
        try:
            name = policy.check_host(host)
        except Forbidden as exc:
            raise _Refused(b"403 Forbidden", _why(exc, policy)) from None
        fields["host"] = name
        try:
            addresses = ([normalize_host(name)] if _is_ip(name) else
                         await asyncio.wait_for(self.resolver(name, port), CONNECT_TIMEOUT))
        except (OSError, TimeoutError):
            raise _Refused(b"502 Bad Gateway", "cannot resolve the host") from None
        if not addresses:
            raise _Refused(b"502 Bad Gateway", "cannot resolve the host")
        try:
            for address in addresses:
                policy.check_address(name, address)
        except Forbidden as exc:
            fields["address"] = exc.details.get("address")
            raise _Refused(b"403 Forbidden", _why(exc, policy)) from None
        for address in addresses:  # the addresses checked are the ones connected to
            fields["address"] = address
            try:
                stream = await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT)
                return name, port, stream
            except (OSError, TimeoutError):
                continue
        raise _Refused(b"502 Bad Gateway", "cannot connect to the host")


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _why(exc: Forbidden, policy: EgressPolicy) -> str:
    """The kind of refusal, never the host or address the caller sent."""
    text = exc.message
    if policy.mode == "off":
        return 'refused: net = "off"'
    if "deny_hosts" in text:
        return "refused: deny_hosts"
    if "allow_hosts" in text:
        return f'refused: not in allow_hosts (net = "{policy.mode}")'
    if "address" in text or "resolves" in text:
        return "refused: a private, loopback, link-local or metadata address (allow_private)"
    return "refused by the egress policy"


def _credential(headers: list[tuple[bytes, bytes, bytes]]) -> str | None:
    for name, _, value in headers:
        if name.strip().lower() != b"proxy-authorization":
            continue
        scheme, _, encoded = value.strip().partition(b" ")
        if scheme.lower() != b"basic":
            return None
        try:
            user, _, token = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return _hash(token) if user == USER and token else None
    return None


def _status(status: bytes, text: str) -> bytes:
    body = f"mcpcreds egress proxy: {text}\n".encode()
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counts: list[int],
                index: int) -> None:
    """Copy until EOF, then half-close the other side (so each direction ends on its own)."""
    try:
        while data := await reader.read(65536):
            counts[index] += len(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
