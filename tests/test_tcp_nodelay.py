"""TCP_NODELAY on the accepted sockets of every TCP listener of mcpcreds: the gateway's loopback
listener (in the real sidecar), the login's loopback redirect and `mcpcreds exec`'s egress
forwarder. Without it an answer's last small write waits for the client's delayed ACK (40 ms).

The option is read back from the listener's own end of a real connection: a copy of that
process's descriptor (pidfd_getfd, which takes root's privilege over another process).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mcpcreds.cli.login import LoopbackListener
from mcpcreds.exec.netns import start_forwarder
from tests.sidecar_proc import run_sidecar

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pidfd_getfd on another process needs root")

SYS_PIDFD_GETFD = 438  # one number on every architecture (asm-generic/unistd.h)


def their_end(pid: int, client: socket.socket) -> socket.socket:
    """Process `pid`'s socket at the other end of `client`'s connection (a copy of its descriptor)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:  # closed meanwhile
                continue
            fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                continue
            sock = socket.socket(fileno=fd)
            try:
                if sock.family in (socket.AF_INET, socket.AF_INET6) \
                        and sock.getpeername()[:2] == client.getsockname()[:2] \
                        and sock.getsockname()[:2] == client.getpeername()[:2]:
                    return sock
            except OSError:  # a listening socket: no peer
                pass
            sock.close()
    finally:
        os.close(pidfd)
    raise AssertionError(f"process {pid} holds no end of that connection")


def nodelay(sock: socket.socket) -> bool:
    with sock:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_the_gateway_listener(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{tmp_path / 'run' / 'mcpcreds.sock'}"

[gateway]
listen = "127.0.0.1:0"

[[servers]]
name = "tools"
endpoint = "https://mcp.example/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:KEY}}}}" }}

[secrets]
sources = ["env"]
""")
    with run_sidecar(config, tmp_path / "run" / "mcpcreds.sock", {"KEY": "unused"}) as sidecar:
        ready = next(e for line in sidecar.lines if (e := json.loads(line)).get("event") == "ready")
        host, _, port = str(ready["gateway_listen"]).rpartition(":")
        with socket.create_connection((host, int(port)), timeout=30) as client:
            client.sendall(f"GET /v1/health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            assert client.recv(65536).startswith(b"HTTP/1.1 200 ")  # accepted, its uid looked up, kept open
            assert nodelay(their_end(sidecar.proc.pid, client))


async def test_the_login_redirect_listener() -> None:
    listener = LoopbackListener()
    port = await listener.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as waiting:  # its handler waits for a head
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 404 ")  # so the first was accepted before
            writer.close()
            assert nodelay(their_end(os.getpid(), waiting))
    finally:
        listener.close()


@contextmanager
def proxy(path: Path) -> Iterator[threading.Event]:
    """A Unix socket standing for the session's egress proxy: the event is set when the
    forwarder connects to it (it does once it has accepted a connection of the child)."""
    reached = threading.Event()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    held: list[socket.socket] = []

    def accept() -> None:
        with server:
            conn, _ = server.accept()
            held.append(conn)
            reached.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield reached
    finally:
        if not reached.is_set():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
                wake.connect(str(path))
        thread.join(30)
        for conn in held:
            conn.close()


def test_the_exec_egress_forwarder(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # as mcpcreds exec makes it
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    hold, sidecar_end = socket.socketpair()
    with proxy(tmp_path / "egress.sock") as reached:
        forwarder = start_forwarder(listener, str(tmp_path / "egress.sock"), hold)
        listener_address = listener.getsockname()
        listener.close()
        hold.close()
        try:
            with socket.create_connection(listener_address, timeout=30) as client:
                assert reached.wait(30)  # the forwarder accepted it and went on to the proxy
                assert nodelay(their_end(forwarder, client))
        finally:
            sidecar_end.close()  # the session ends: the forwarder exits
            os.waitpid(forwarder, 0)
