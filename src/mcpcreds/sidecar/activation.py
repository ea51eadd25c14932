"""systemd socket activation (sd_listen_fds(3)): the listening sockets systemd passes to `serve`.

systemd binds the socket (`mcpcreds.socket`, `ListenStream=`), starts the service when a client
connects, and passes the listening socket as fd 3 (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`).
`serve` takes it only if it is a listening Unix stream socket bound to the configured
`sidecar.socket` (anything else is refused, naming the fix), and never unlinks it: the socket unit
owns that file, and it stays for the next activation. A second socket, a listening TCP socket
bound to `gateway.listen` (its host, and its port unless the config says 0), is the gateway's
loopback listener.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..errors import McpcredsError

LISTEN_FDS_START: Final = 3
_ENV: Final = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
_KINDS: Final = {socket.AF_UNIX: "Unix", socket.AF_INET: "IPv4", socket.AF_INET6: "IPv6"}


class ActivationRefused(McpcredsError):
    code = "activation_refused"


@dataclass(frozen=True, slots=True)
class PassedFd:
    fd: int
    name: str


def listen_fds(env: MutableMapping[str, str] | None = None) -> list[PassedFd]:
    """The fds systemd passed to this process (none when not socket-activated, or when the
    variables are meant for another process). The variables leave the environment, as
    `sd_listen_fds(unset_environment=1)` does, so nothing we start inherits them."""
    env = os.environ if env is None else env
    pid, count, names = (env.pop(k, "").strip() for k in _ENV)
    if not pid or not count:
        return []
    if not (pid.isdigit() and int(pid) == os.getpid()):
        return []
    if not count.isdigit() or not 0 < int(count) <= 64:
        raise ActivationRefused(f"LISTEN_FDS={count!r} is not a count of passed sockets")
    labels = names.split(":") if names else []
    fds = []
    for i in range(int(count)):
        fd = LISTEN_FDS_START + i
        try:
            os.set_inheritable(fd, False)  # FD_CLOEXEC, as sd_listen_fds sets it
        except OSError as exc:
            raise ActivationRefused(f"LISTEN_FDS={count}: fd {fd} is not open ({exc.strerror})") from None
        fds.append(PassedFd(fd, labels[i] if i < len(labels) else "unknown"))
    return fds


def _describe(sock: socket.socket) -> str:
    kind = "stream" if sock.type == socket.SOCK_STREAM else "datagram" if sock.type == socket.SOCK_DGRAM \
        else f"type {int(sock.type)}"
    return f"a {_KINDS.get(sock.family, f'family {int(sock.family)}')} {kind} socket"


def _bound_path(sock: socket.socket) -> str:
    name = sock.getsockname()
    if isinstance(name, bytes):  # the abstract namespace, or unnamed
        return "@" + name[1:].decode(errors="replace") if name else "(unnamed)"
    return str(name)


def _tcp_matches(sock: socket.socket, host: str | None, port: int) -> bool:
    if host is None:
        return False
    bound_host, bound_port = sock.getsockname()[:2]
    return bool(bound_host == host and (port == 0 or bound_port == port))


def take_unix_socket(fds: list[PassedFd], path: Path) -> socket.socket | None:
    """The passed listening Unix socket bound to `path` (see `take_sockets`)."""
    return take_sockets(fds, path)[0]


def take_sockets(fds: list[PassedFd], path: Path, gateway_host: str | None = None,
                 gateway_port: int = 0) -> tuple[socket.socket | None, socket.socket | None]:
    """The passed listening Unix socket bound to `path` and, when `gateway_host` is set, the
    listening TCP socket bound to it (and to `gateway_port` unless 0), made non-blocking;
    (None, None) when systemd passed nothing. Any other passed fd is refused (closing them all):
    a socket unit that listens elsewhere would otherwise serve nobody, silently."""
    if not fds:
        return None, None
    taken: socket.socket | None = None
    tcp: socket.socket | None = None
    problems: list[str] = []
    for passed in fds:
        where = f"systemd passed fd {passed.fd} (FileDescriptorName={passed.name})"
        if not stat.S_ISSOCK(os.fstat(passed.fd).st_mode):
            problems.append(f"{where}, which is not a socket")
            continue
        sock = socket.socket(fileno=passed.fd)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM \
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) and tcp is None \
                and _tcp_matches(sock, gateway_host, gateway_port):
            tcp = sock
            continue
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            want = f"gateway.listen is {gateway_host}:{gateway_port}" if gateway_host \
                else "gateway.listen is off"
            problems.append(f"{where}: {_describe(sock)} bound to {sock.getsockname()[:2]}, but {want}; make "
                            "the socket unit's TCP ListenStream= and gateway.listen the same address")
        elif sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            problems.append(f"{where}: {_describe(sock)}; mcpcreds serve needs a Unix stream socket "
                            f"(ListenStream={path} in mcpcreds.socket)")
        elif not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            problems.append(f"{where}: a connected socket, not a listening one; set Accept=no in "
                            "mcpcreds.socket")
        elif (bound := _bound_path(sock)) != str(path):
            problems.append(f"{where}: bound to {bound}, but sidecar.socket is {path}; make "
                            f"ListenStream= and sidecar.socket (or $MCPCREDS_SOCKET) the same path")
        elif taken is None:
            taken = sock
            continue
        else:
            problems.append(f"{where}: a second socket bound to {path}")
        sock.detach()
    if taken is None and not problems:
        problems.append(f"systemd passed no Unix socket bound to {path} (ListenStream={path} in "
                        "mcpcreds.socket)")
    if problems:
        for kept in (taken, tcp):
            if kept is not None:
                kept.detach()
        for passed in fds:
            with contextlib.suppress(OSError):
                os.close(passed.fd)
        raise ActivationRefused("refusing the socket-activated start: " + "; ".join(problems))
    assert taken is not None
    taken.setblocking(False)
    if tcp is not None:
        tcp.setblocking(False)
    return taken, tcp
