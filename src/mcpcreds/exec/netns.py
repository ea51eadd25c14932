"""The namespaces of `mcpcreds exec`'s child, and the forwarder that is its only way out.

`enter_network_namespace()` moves the calling process (single-threaded: the CLI before it
execs) into a new network namespace with only `lo`, brought up. As root: `unshare(CLONE_NEWNET)`;
otherwise an unprivileged user namespace with it (the caller's uid and gid mapped to themselves,
so the child runs as who it was, and loses the namespace's capabilities at `execve`).
`enter_user_namespace()` gives the child a user namespace of its own where it has none yet (root,
or net = "inherit"): the sidecar tells a peer in another user namespace apart and lets it act
only within a grant (`sidecar/peer_ns.py`), and the kernel never lets the child or anything it
starts leave that namespace. Root's map is the identity on every id (written from outside by a
short-lived helper: a process cannot map more than its own uid), so the child keeps root's file
access but has no capability outside its namespace.
Python 3.11 has no `os.unshare`: libc's, through ctypes.

`start_forwarder()` starts the forwarder inside the network namespace: it accepts on 127.0.0.1
(the proxy address the child is given) and relays each connection to the sidecar's egress proxy
on its Unix socket (a path: reachable from any network namespace). It is forked, then re-executed
with an empty environment (this file, run by the interpreter in isolated mode), so it holds
nothing the child may not have: not the caller's environment, not the sidecar's answer. It makes
itself undumpable (the child cannot ptrace it or read its /proc files), dies with the child
(`PR_SET_PDEATHSIG`), ignores the terminal's signals, holds neither the child's stdin nor its
stdout, and exits when the sidecar ends the session. It keeps a copy of stderr for one purpose:
the refusal lines the sidecar sends on the hold connection (`egress_notices.py`), printed as
`mcpcreds exec NAME: refused egress to HOST:PORT (WHY)`, printable ASCII only and bounded,
each answered once written.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import struct
import sys
from typing import Final

CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWNET: Final = 0x40000000
PR_SET_PDEATHSIG: Final = 1
PR_SET_DUMPABLE: Final = 4
FORWARD: Final = "--forward"  # argv[1] of the re-executed forwarder
# root's child: every uid and gid, as outside, in two ranges (a map unlike the initial namespace's one)
FULL_MAP: Final = "0 0 1\n1 1 4294967294\n"
SIOCGIFFLAGS: Final = 0x8913
SIOCSIFFLAGS: Final = 0x8914
IFF_UP: Final = 0x1
NOTICE_MAX: Final = 512  # bytes of one refusal line from the sidecar that are printed
_IFREQ: Final = struct.Struct("16sH22x")


class NamespaceUnavailable(OSError):
    """The kernel (or the sandbox this runs in) refuses a new network namespace."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_network_namespace() -> str:
    """Move this process into a new network namespace with loopback only; returns how
    ("netns" as root, "userns+netns" otherwise). NamespaceUnavailable if the kernel refuses."""
    libc = _libc()
    if os.geteuid() == 0:
        if libc.unshare(CLONE_NEWNET) != 0:
            raise NamespaceUnavailable(ctypes.get_errno(), "unshare(CLONE_NEWNET) refused")
        how = "netns"
    else:
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NamespaceUnavailable(err, f"unprivileged user and network namespaces refused "
                                            f"({os.strerror(err)})")
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
            _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        except OSError as exc:
            raise NamespaceUnavailable(exc.errno or 0, "cannot map the uid in the user namespace") from None
        how = "userns+netns"
    loopback_up()
    return how


def loopback_up() -> None:
    """`ip link set lo up`, as one ioctl."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        raw = fcntl.ioctl(sock, SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0))
        flags = _IFREQ.unpack(raw)[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | IFF_UP))


def enter_user_namespace() -> None:
    """Move this process into a new user namespace: as root with every id mapped to itself,
    otherwise with the caller's uid and gid only. NamespaceUnavailable if the kernel refuses."""
    libc = _libc()
    if os.geteuid() != 0:
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(CLONE_NEWUSER) != 0:
            err = ctypes.get_errno()
            raise NamespaceUnavailable(err, f"unprivileged user namespaces refused ({os.strerror(err)})")
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
            _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        except OSError as exc:
            raise NamespaceUnavailable(exc.errno or 0, "cannot map the uid in the user namespace") from None
        return
    go_read, go_write = os.pipe()
    done_read, done_write = os.pipe()
    helper = os.fork()
    if helper == 0:  # stays in our user namespace, where it may write a map of every id
        try:
            os.close(go_write)
            os.close(done_read)
            if os.read(go_read, 1) == b"1":
                for name in ("uid_map", "gid_map"):
                    _write(f"/proc/{os.getppid()}/{name}", FULL_MAP)
                os.write(done_write, b"1")
        finally:
            os._exit(0)
    os.close(go_read)
    os.close(done_write)
    unshared = libc.unshare(CLONE_NEWUSER) == 0
    err = ctypes.get_errno()
    os.write(go_write, b"1" if unshared else b"0")
    os.close(go_write)
    mapped = os.read(done_read, 1) == b"1"
    os.close(done_read)
    os.waitpid(helper, 0)
    if not unshared:
        raise NamespaceUnavailable(err, f"unshare(CLONE_NEWUSER) refused ({os.strerror(err)})")
    if not mapped:
        raise NamespaceUnavailable(0, "cannot map the ids in the user namespace")


class ForwarderFailed(OSError):
    """The forwarder could not be started (nothing was started for the child)."""


def start_forwarder(listener: socket.socket, proxy_path: str, hold: socket.socket) -> int:
    """Fork the forwarder and re-execute it clean; returns its pid once it runs undumpable (until
    then, the child is not started: it never sees the fork, which holds what this process holds).
    The caller closes its copies of both sockets. ForwarderFailed if it could not start."""
    parent = os.getpid()
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_write)
        try:
            ready = os.read(ready_read, 1) == b"1"  # or EOF: it exited
        finally:
            os.close(ready_read)
        if not ready:
            raise ForwarderFailed(0, "the egress forwarder did not start")
        return pid
    try:  # the forwarder: never returns
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # kept across the execve
        if os.getppid() != parent:  # the child is already gone
            os._exit(0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        try:  # for the refusal lines only (the interpreter's own words go to /dev/null)
            err = fcntl.fcntl(2, fcntl.F_DUPFD, 3)
        except OSError:
            err = -1
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the MCP channel is the child's alone: its EOF must be its own
            os.dup2(null, fd)
        keep = sorted({listener.fileno(), hold.fileno(), ready_write} | ({err} if err >= 0 else set()))
        os.closerange(3, keep[0])
        for low, high in zip(keep, [*keep[1:], 65536], strict=True):
            os.closerange(low + 1, high)
        for fd in keep:
            os.set_inheritable(fd, True)
        # nothing of this process survives: not its environment (the caller's), not its memory
        os.execve(sys.executable, [sys.executable, "-I", "-S", os.path.abspath(__file__), FORWARD,
                                   proxy_path, str(listener.fileno()), str(hold.fileno()), str(ready_write),
                                   str(err)],
                  {})
    finally:
        os._exit(1)


def forwarder_main(args: list[str]) -> None:
    """The re-executed forwarder: `FORWARD PROXY_PATH LISTENER_FD HOLD_FD READY_FD ERR_FD` (ERR_FD
    -1: no stderr)."""
    _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    proxy_path, listener_fd, hold_fd, ready_fd, err_fd = args
    os.write(int(ready_fd), b"1")  # the child may start now
    os.close(int(ready_fd))
    listener = socket.socket(fileno=int(listener_fd))
    hold = socket.socket(fileno=int(hold_fd))
    asyncio.run(_forward(listener, proxy_path, hold, int(err_fd)))


async def _forward(listener: socket.socket, proxy_path: str, hold: socket.socket, err: int) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(proxy_path)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()

    server = await asyncio.start_server(relay, sock=listener)
    hold_reader, hold_writer = await asyncio.open_connection(sock=hold)
    async with server:
        with contextlib.suppress(OSError):
            await _notices(hold_reader, hold_writer, err)  # until the sidecar ends the session


async def _notices(hold: asyncio.StreamReader, answer: asyncio.StreamWriter, err: int) -> None:
    """Print each line the sidecar sends on the hold connection, then answer it (an empty line):
    the sidecar holds the refused connection until then. Written from a thread: a stderr nobody
    reads blocks that thread, never the connections."""
    pending = b""
    while chunk := await hold.read(4096):
        pending += chunk
        while b"\n" in pending:
            line, _, pending = pending.partition(b"\n")
            await asyncio.to_thread(_say, err, line)
            answer.write(b"\n")
        pending = pending[:NOTICE_MAX]


def _say(err: int, line: bytes) -> None:
    text = bytes(c for c in line[:NOTICE_MAX] if 0x20 <= c < 0x7F)
    if err >= 0 and text:
        with contextlib.suppress(OSError):  # at most 527 bytes: one write, whole (PIPE_BUF)
            os.write(err, b"mcpcreds exec " + text + b"\n")


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


if __name__ == "__main__" and sys.argv[1:2] == [FORWARD]:
    forwarder_main(sys.argv[2:])
