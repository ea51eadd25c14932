"""The egress proxy of `mcpcreds exec` sessions, served by the sidecar on a Unix socket.

One listener (`egress.sock`, next to the sidecar's socket) serves every session; a session is
found by its credential (`Proxy-Authorization: Basic base64("mcpcreds:" + token)`, the token
stored only as its hash). Per connection: the peer's uid is checked (SO_PEERCRED, the sidecar's
`allow_uids`), then one request:

- `CONNECT host:port`: the exec entry's `EgressPolicy` judges the host, the sidecar resolves it,
  every address is checked (SSRF guard) and the checked address is the one connected to (pinned
  DNS); then bytes are relayed both ways.
- `GET http://host[:port]/path` (any method, absolute form): the same checks, the request sent
  on in origin form with `Connection: close` and the `Host` of the URL (the child's own is
  dropped), then relayed.
- `MCPCREDS-HOLD *`: the session's holder (the forwarder `mcpcreds exec` starts beside the
  child) keeps this connection open; when it closes (the child is gone), the session ends. A
  session nobody holds within `HOLD_TIMEOUT` ends too.

Beyond the policy (`egress_rules.py`): a `host:port` entry of allow_hosts or allow_private
opens that port only, and the sidecar's own listeners are never connected to. A request head
with a bare CR or LF, a line that is not `name: value`, or an ambiguous body length is refused
(400): the upstream must read the head the proxy judged.

One audit line per connection (`exec_egress`: entry, session, method, host, port, address,
allowed, reason, bytes each way, duration), whatever the mode. Refusals answer 403 (policy) or
407 (no valid credential: unknown, ended, expired or another uid's session alike) with a short
text that never repeats what was sent. A 403 by the entry's rules is first told to the session's
holder, which prints it on `mcpcreds exec`'s stderr naming the host (`egress_notices.py`: once
per host and port, repeats counted in `exec_session_end`).

Bounds (against a child holding the credential, another allowed uid, or a client that opens
sessions in a loop): a request head is at most `MAX_HEAD` bytes (431) and must arrive within
`HEAD_TIMEOUT` of the accept (408); at most `MAX_HEADS` connections may be sending their head at
once (503 at accept); a session has at most `MAX_TUNNELS_PER_SESSION` tunnels (429) and the proxy
`MAX_TUNNELS` (503), and all its connections together at most half the sidecar's descriptor
limit (503 at accept); a tunnel with no byte either way for `TUNNEL_IDLE_TIMEOUT` is closed, and
opening one (DNS and connect, every address) has `CONNECT_TIMEOUT` in all, with at most
`MAX_RESOLVING` name look-ups at once (they use the sidecar's worker threads). Sessions: at most
`MAX_PENDING_SESSIONS` not yet held (429, per caller's patience) and `MAX_SESSIONS` in all (503);
an unheld one ends after `HOLD_TIMEOUT`; a session's tunnels close when it ends. Time is read
from the sidecar's clock and enforced by `sweep()` (every `SWEEP_INTERVAL`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import re
import resource
import secrets
import socket
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from ..core.audit import AuditLog
from ..core.clock import SYSTEM_CLOCK, Clock
from ..core.logs import get_logger
from ..core.socket_check import check_folder
from ..errors import ExecSessionsFull, Forbidden, McpcredsError, RateLimited
from ..net.egress import EgressPolicy, Resolver, normalize_host, system_resolver
from ..net.quick_ack import ack_at_once, tcp_socket
from .egress_notices import HEADER as NOTICES_HEADER
from .egress_notices import Notices, printable
from .egress_rules import PortRules, reaches_own_listener

HOLD_METHOD: Final = b"MCPCREDS-HOLD"
HOLD_TIMEOUT: Final = 30.0  # a session nobody holds by then ends
MAX_HEAD: Final = 16 * 1024  # request line and headers
HEAD_TIMEOUT: Final = 10.0  # from the accept to the end of the head
MAX_HEADS: Final = 128  # connections still sending their head, at once
CONNECT_TIMEOUT: Final = 10.0  # resolving and connecting, every address together
MAX_RESOLVING: Final = 8  # name look-ups at once (each holds one of the sidecar's worker threads)
TUNNEL_IDLE_TIMEOUT: Final = 300.0  # no byte either way for this long: the tunnel closes
MAX_TUNNELS_PER_SESSION: Final = 64
MAX_TUNNELS: Final = 512
MAX_SESSIONS: Final = 1024
MAX_PENDING_SESSIONS: Final = 64  # made but not yet held by their forwarder
SWEEP_INTERVAL: Final = 1.0
FD_SHARE: Final = 2  # the proxy's connections may use at most 1/FD_SHARE of the sidecar's fd limit
USER: Final = "mcpcreds"
_PEERCRED: Final = struct.Struct("3i")
_HOP_HEADERS: Final = (b"proxy-authorization", b"proxy-connection", b"connection", b"keep-alive", b"host")
_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_VALUE: Final = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*\Z")  # no control character but HTAB
_log = get_logger("egress_proxy")
PROXY_AUTH_REQUIRED: Final = (b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                              b"Proxy-Authenticate: Basic realm=\"mcpcreds\"\r\nContent-Length: 0\r\n"
                              b"Connection: close\r\n\r\n")


class EgressSocketInUse(McpcredsError):
    code = "socket_in_use"


@dataclass(slots=True, eq=False)
class ProxySession:
    id: str
    name: str  # the exec entry
    policy: EgressPolicy
    uid: int
    pid: int
    created: float = 0.0  # clock.monotonic()
    ports: PortRules = field(default_factory=PortRules)
    held: bool = False
    tunnels: int = 0
    notices: Notices = field(default_factory=Notices)


@dataclass(slots=True, eq=False)
class _Conn:
    """One accepted connection, as the sweep sees it."""

    writer: asyncio.StreamWriter
    since: float  # head: when accepted; tunnel: the last byte either way
    phase: str = "head"  # "head" | "tunnel" | "hold"
    session: ProxySession | None = None
    upstream: asyncio.StreamWriter | None = None
    closed_by: list[str] = field(default_factory=list)

    def close(self, why: str) -> None:
        self.closed_by.append(why)
        for writer in (self.writer, self.upstream):
            if writer is not None:
                writer.close()


def proxy_url(token: str, port: int) -> str:
    return f"http://{USER}:{token}@127.0.0.1:{port}"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class _Refused(Exception):
    """`reason` answers the child; `notice`, for a refusal by the entry's rules, says why on
    `mcpcreds exec`'s stderr."""

    def __init__(self, status: bytes, reason: str, notice: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.notice = notice


class EgressProxy:
    def __init__(self, path: str, allow_uids: Callable[[], frozenset[int]],
                 audit: AuditLog | Callable[[], AuditLog], resolver: Resolver | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path
        self.allow_uids = allow_uids
        self._audit = audit  # a callable: the sidecar's current audit log (a reload may replace it)
        self.resolver = resolver or system_resolver
        self.clock = clock
        self._sessions: dict[str, ProxySession] = {}  # token hash -> session
        self._conns: set[_Conn] = set()
        self._heads = 0
        self._tunnels = 0
        self._resolving = asyncio.Semaphore(MAX_RESOLVING)
        self._server: asyncio.AbstractServer | None = None
        self._created: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket we bound
        self._sweeper: asyncio.Task[None] | None = None
        self.fd_budget = _fd_budget()

    async def start(self, mode: int = 0o600) -> None:
        """Listen on `path`: its folder must be ours and closed to others (as the sidecar's own
        socket's); a stale socket there (nobody listening) is replaced, a live one or another
        file refused. The socket is made 0600 and then given `mode` (never more than 0666)."""
        check_folder(self.path, os.geteuid())
        _claim(self.path)
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_HEAD,
                                                           backlog=MAX_HEADS)
        finally:
            os.umask(old)
        info = os.lstat(self.path)
        self._created = (info.st_dev, info.st_ino)
        os.chmod(self.path, mode & 0o666)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    @property
    def audit(self) -> AuditLog:
        return self._audit if isinstance(self._audit, AuditLog) else self._audit()

    @property
    def started(self) -> bool:
        return self._server is not None

    def close(self) -> None:
        """Stop listening, end every connection, and unlink the socket if it is still the one
        this proxy bound (never a file someone else put at the path since)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            self._server.close()
            self._server = None
            for conn in list(self._conns):
                conn.close("shutdown")
            self._sessions.clear()
            with contextlib.suppress(OSError):
                info = os.lstat(self.path)
                if (info.st_dev, info.st_ino) == self._created and stat.S_ISSOCK(info.st_mode):
                    os.unlink(self.path)

    def new_session(self, name: str, policy: EgressPolicy, uid: int, pid: int,
                    ports: PortRules | None = None) -> tuple[str, ProxySession]:
        """A session for one child; returns its token (given to the caller, never logged)."""
        self.sweep()
        if len(self._sessions) >= MAX_SESSIONS:
            raise ExecSessionsFull(f"the egress proxy holds as many exec sessions as it may "
                                   f"({MAX_SESSIONS}); try again when some have ended")
        if sum(not s.held for s in self._sessions.values()) >= MAX_PENDING_SESSIONS:
            raise RateLimited(f"too many exec sessions waiting for their forwarder (at most "
                              f"{MAX_PENDING_SESSIONS}; one not taken ends after {HOLD_TIMEOUT:g} s)",
                              HOLD_TIMEOUT)
        token = secrets.token_urlsafe(32)
        session = ProxySession(secrets.token_hex(8), name, policy, uid, pid, self.clock.monotonic(),
                               ports or PortRules())
        self._sessions[_hash(token)] = session
        return token, session

    def _end(self, hashed: str, session: ProxySession, held: bool) -> None:
        if self._sessions.get(hashed) is session:
            del self._sessions[hashed]
            for conn in list(self._conns):
                if conn.session is session and conn.phase == "tunnel":
                    conn.close("session ended")
            self.audit.write("exec_session_end", name=session.name, session=session.id, held=held,
                             **session.notices.audit_fields())

    def sweep(self) -> dict[str, int]:
        """Enforce the time bounds by the clock: heads too slow (408), tunnels idle too long,
        sessions nobody held in time. Returns how many of each it ended."""
        now = self.clock.monotonic()
        ended = {"head": 0, "idle": 0, "unheld": 0}
        for conn in list(self._conns):
            if conn.closed_by:
                continue
            if conn.phase == "head" and now - conn.since >= HEAD_TIMEOUT:
                with contextlib.suppress(RuntimeError, OSError):
                    conn.writer.write(_status(b"408 Request Timeout", "the request head took too long"))
                conn.close("head timeout")
                ended["head"] += 1
            elif conn.phase == "tunnel" and now - conn.since >= TUNNEL_IDLE_TIMEOUT:
                conn.close("idle")
                ended["idle"] += 1
        for hashed, session in list(self._sessions.items()):
            if not session.held and now - session.created >= HOLD_TIMEOUT:
                self._end(hashed, session, held=False)
                ended["unheld"] += 1
        return {k: v for k, v in ended.items() if v}

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            if ended := self.sweep():
                _log.info("egress proxy: ended by its time bounds", extra=ended)

    @property
    def live_sessions(self) -> int:
        return len(self._sessions)

    @property
    def open_fds(self) -> int:
        """File descriptors held by the proxy's connections (a tunnel holds two)."""
        return len(self._conns) + self._tunnels

    @property
    def counts(self) -> dict[str, int]:
        """Live connections by phase, and sessions (for tests and status)."""
        return {"heads": self._heads, "tunnels": self._tunnels,
                "holds": sum(c.phase == "hold" for c in self._conns), "sessions": len(self._sessions)}

    # -- one connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer, self.clock.monotonic())
        try:
            sock = writer.get_extra_info("socket")
            _pid, uid, _gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            if uid not in self.allow_uids():
                _log.warning("egress proxy: peer refused", extra={"uid": uid, "pid": _pid})
                return
            if self._heads >= MAX_HEADS or self.open_fds >= self.fd_budget:
                writer.write(_status(b"503 Service Unavailable", "too many connections at once"))
                return
            self._conns.add(conn)
            self._heads += 1
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            finally:
                self._heads -= 1
            if conn.closed_by:  # the sweep answered 408
                return
            conn.phase = "request"
            await self._one_request(conn, uid, head, reader, writer)
        except asyncio.LimitOverrunError:
            writer.write(_status(b"431 Request Header Fields Too Large", "request head too large"))
        except (ConnectionError, OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            pass
        finally:
            self._conns.discard(conn)
            writer.close()

    async def _one_request(self, conn: _Conn, uid: int, head: bytes, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            writer.write(_status(b"400 Bad Request", "malformed request line"))
            return
        method, target, _version = parts
        headers = [line.partition(b":") for line in lines[1:]]
        if problem := _head_problem(lines, headers):
            writer.write(_status(b"400 Bad Request", problem))
            return
        hashed = _credential(headers)
        # looked up by the SHA-256 of what was sent: the time taken depends on that digest, never
        # on a stored token; unknown, ended, expired and another uid's sessions answer alike
        session = self._sessions.get(hashed) if hashed else None
        if session is None or hashed is None or session.uid != uid:
            writer.write(PROXY_AUTH_REQUIRED)
            return
        if method == HOLD_METHOD:
            notices = any(name.strip().lower() == NOTICES_HEADER and value.strip() == b"1"
                          for name, _, value in headers)
            await self._hold(conn, hashed, session, reader, writer, notices)
            return
        if session.tunnels >= MAX_TUNNELS_PER_SESSION:
            writer.write(_status(b"429 Too Many Requests",
                                 f"this session has {MAX_TUNNELS_PER_SESSION} connections open already"))
            return
        if self._tunnels >= MAX_TUNNELS:
            writer.write(_status(b"503 Service Unavailable", "the proxy has as many connections as it may"))
            return
        conn.phase, conn.session, conn.since = "tunnel", session, self.clock.monotonic()
        session.tunnels += 1
        self._tunnels += 1
        try:
            if method == b"CONNECT":
                await self._connect(conn, session, target, reader, writer)
            else:
                await self._forward(conn, session, method, target, headers, reader, writer)
        finally:
            session.tunnels -= 1
            self._tunnels -= 1

    async def _hold(self, conn: _Conn, hashed: str, session: ProxySession, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, notices: bool) -> None:
        """Hold the session; a holder that asked for notices gets the refusal lines
        (`egress_notices.py`) and answers each."""
        if session.held:
            writer.write(_status(b"409 Conflict", "session already held"))
            return
        session.held = True
        conn.phase, conn.session = "hold", session
        try:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            if notices:
                session.notices.holder = writer
            while data := await reader.read(4096):
                session.notices.answered(data)
        finally:
            session.notices.release()
            self._end(hashed, session, held=True)

    async def _connect(self, conn: _Conn, session: ProxySession, target: bytes, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        host, _, port_text = target.decode("ascii", "replace").rpartition(":")
        await self._relay(conn, session, "CONNECT", host, port_text, reader, writer, None)

    async def _forward(self, conn: _Conn, session: ProxySession, method: bytes, target: bytes,
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
        head += [name + b":" + value for name, _, value in headers if name.lower() not in _HOP_HEADERS]
        head.append(b"Host: " + url.netloc.rpartition("@")[2].encode("ascii"))  # the host judged
        head.append(b"Connection: close")
        request = b"\r\n".join(head) + b"\r\n\r\n"
        await self._relay(conn, session, method.decode("ascii", "replace")[:16], host, str(port), reader,
                          writer, request)

    async def _relay(self, conn: _Conn, session: ProxySession, method: str, host: str, port_text: str,
                     reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     first: bytes | None) -> None:
        started = self.clock.monotonic()
        fields: dict[str, object] = {"name": session.name, "session": session.id, "method": method,
                                     "host": host[:253], "port": None, "address": None,
                                     "uid": session.uid, "pid": session.pid}
        counts = [0, 0]
        try:
            try:
                name, _port, upstream = await self._open(session, host, port_text, fields)
            except _Refused as exc:
                fields.update(allowed=False, reason=exc.reason)
                if exc.notice is not None:  # on exec's stderr before the child hears of it
                    # the name judged, or (refused before it was) all the child sent
                    shown = host if fields["host"] == host[:253] else str(fields["host"])
                    await session.notices.tell(session.name, shown, fields["port"], exc.notice)
                writer.write(_status(exc.status, exc.reason))
                return
            fields.update(allowed=True, host=name)
            up_reader, up_writer = upstream
            conn.upstream = up_writer
            try:
                if conn.closed_by:  # idle or ended while connecting
                    return
                if first is None:
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    up_writer.write(first)
                    counts[0] += len(first)
                conn.since = self.clock.monotonic()
                await asyncio.gather(self._pump(conn, reader, up_writer, counts, 0),
                                     self._pump(conn, up_reader, writer, counts, 1))
            finally:
                up_writer.close()
        finally:
            if conn.closed_by:
                fields["closed"] = conn.closed_by[0]
            self.audit.write("exec_egress", **fields, bytes_up=counts[0], bytes_down=counts[1],
                             duration=round(max(0.0, self.clock.monotonic() - started), 6))

    async def _pump(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    counts: list[int], index: int) -> None:
        """Copy until EOF, then half-close the other side (so each direction ends on its own);
        every chunk moves the tunnel's idle deadline."""
        # toward the upstream: its answer acknowledged as it arrives (net/quick_ack.py)
        quick = tcp_socket(writer.transport) if index == 0 else None
        try:
            while data := await reader.read(65536):
                conn.since = self.clock.monotonic()
                counts[index] += len(data)
                writer.write(data)
                if quick is not None and not ack_at_once(quick):
                    quick = None
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof():
                    writer.write_eof()

    async def _open(self, session: ProxySession, host: str, port_text: str, fields: dict[str, object]
                    ) -> tuple[str, int, tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        policy = session.policy
        if not port_text.isdigit() or not 0 < int(port_text) < 65536 or not host:
            raise _Refused(b"400 Bad Request", "expected host:port")
        port = int(port_text)
        fields["port"] = port
        try:
            name = policy.check_host(host)
        except Forbidden as exc:
            raise _Refused(b"403 Forbidden", *_why(exc, policy)) from None
        fields["host"] = name
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                return await self._open_checked(session, name, port, fields)
        except TimeoutError:
            raise _Refused(b"504 Gateway Timeout", "cannot reach the host in time") from None

    async def _open_checked(self, session: ProxySession, name: str, port: int, fields: dict[str, object]
                            ) -> tuple[str, int, tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        policy = session.policy
        try:
            if _is_ip(name):
                addresses = [normalize_host(name)]
            else:
                async with self._resolving:
                    addresses = await self.resolver(name, port)
        except OSError:
            raise _Refused(b"502 Bad Gateway", "cannot resolve the host") from None
        if not addresses:
            raise _Refused(b"502 Bad Gateway", "cannot resolve the host")
        try:
            for address in addresses:
                policy.check_address(name, address)
        except Forbidden as exc:
            fields["address"] = exc.details.get("address")
            raise _Refused(b"403 Forbidden", *_why(exc, policy, fields["address"])) from None
        if refusal := session.ports.refusal(policy, name, addresses, port):
            raise _Refused(b"403 Forbidden", refusal, refusal.removeprefix("refused: "))
        async with self._resolving:  # reads our descriptors: off the event loop
            own = await asyncio.to_thread(reaches_own_listener, addresses, port)
        if own:
            raise _Refused(b"403 Forbidden", "refused: the sidecar's own listener",
                           "the sidecar's own listener")
        for address in addresses:  # the addresses checked are the ones connected to
            fields["address"] = address
            try:
                stream = await asyncio.open_connection(address, port)
                return name, port, stream
            except OSError:
                continue
        raise _Refused(b"502 Bad Gateway", "cannot connect to the host")


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _why(exc: Forbidden, policy: EgressPolicy, address: object = None) -> tuple[str, str]:
    """The kind of refusal, as the child is answered (never the host or address it sent) and as
    `mcpcreds exec`'s stderr says it (with the address the host resolved to, if that was refused)."""
    text = exc.message
    if policy.mode == "off":
        return 'refused: net = "off"', 'net = "off"'
    if "deny_hosts" in text:
        return "refused: deny_hosts", "in deny_hosts"
    if "allow_hosts" in text:
        return (f'refused: not in allow_hosts (net = "{policy.mode}")',
                f'not in allow_hosts; net = "{policy.mode}"')
    if "address" in text or "resolves" in text:
        resolved = f"resolves to {printable(address)}, " if isinstance(address, str) else ""
        return ("refused: a private, loopback, link-local or metadata address (allow_private)",
                f"{resolved}a private, loopback, link-local or metadata address; not in allow_private")
    return "refused by the egress policy", "refused by the egress policy"


def _head_problem(lines: list[bytes], headers: list[tuple[bytes, bytes, bytes]]) -> str | None:
    """What makes a request head one an upstream might read otherwise than the proxy; None if
    nothing does."""
    if any(b"\r" in line or b"\n" in line for line in lines):
        return "a bare CR or LF in the request head"
    lengths = 0
    for name, colon, value in headers:
        if not colon or not _TOKEN.match(name) or not _VALUE.match(value):
            return "a header line that is not 'name: value'"
        lowered = name.lower()
        lengths += lowered == b"content-length" or lowered == b"transfer-encoding"
    if lengths > 1:
        return "more than one Content-Length or Transfer-Encoding"
    return None


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


def _fd_budget() -> int:
    """How many descriptors the proxy's connections may hold: a share of the process's limit
    (raised towards the hard limit if the bounds above need more), so a flood of proxy
    connections can never starve the sidecar's own socket of descriptors."""
    worst = MAX_HEADS + 2 * MAX_TUNNELS + MAX_SESSIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_SHARE * worst + 256
    if soft != resource.RLIM_INFINITY and soft < want and (hard == resource.RLIM_INFINITY or hard > soft):
        with contextlib.suppress(ValueError, OSError):
            soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return worst
    return max(16, min(worst, soft // FD_SHARE))


def _claim(path: str) -> None:
    """Replace a stale socket (nobody listening: left by a sidecar that died); refuse a live one,
    or anything that is not a socket of ours."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
        raise EgressSocketInUse(f"{path} exists and is not a socket of ours; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError:
        pass
    finally:
        probe.close()
    raise EgressSocketInUse(f"another process is listening on {path}")


def _status(status: bytes, text: str) -> bytes:
    body = f"mcpcreds egress proxy: {text}\n".encode()
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)

