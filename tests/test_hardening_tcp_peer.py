"""The loopback TCP listener's uid lookup (issue 28, finding 6): the kernel is asked for the one
socket (NETLINK_SOCK_DIAG, an exact lookup), never the whole table; the lookup runs off the event
loop, and a connection accepted while too many lookups are under way is refused at once.

Real sockets throughout: a connection from this process and one from a client running as
`nobody`, over IPv4, IPv6 and IPv4-mapped IPv6; thousands of real TIME_WAIT sockets. The work
done is counted (files opened, bytes the kernel answered), not the time taken.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest

from mcpcreds.sidecar.tcp_listener import LoopbackApp, PeerLookups, TcpConnection
from mcpcreds.sidecar.tcp_peer import (
    SOCK_DIAG_BY_FAMILY,
    TCP_ESTABLISHED,
    DiagSocket,
    choose_lookup,
    diag_answer,
    diag_query,
    diag_request,
    endpoint,
    lookup_uid,
    parse_diag_reply,
    parse_table,
    proc_lookup_uid,
)
from mcpcreds.sidecar.wire import Connections
from tests.test_gateway_tcp import App
from tests.test_hardening_socket import NOBODY, SETPRIV

# nlmsghdr + inet_diag_msg (88 bytes) and the few attributes the kernel always adds: one socket
ONE_ANSWER_MAX = 256

HOLDER = r"""
import socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
sock = socket.socket(family)
sock.connect((sys.argv[1], int(sys.argv[2])))
print(sock.getsockname()[1], flush=True)
sys.stdin.read()
"""

pytestmark = pytest.mark.both_loops  # the listener's protocol on the sidecar's loop too


@contextmanager
def held_by_nobody(host: str, port: int) -> Iterator[None]:
    """A connection to host:port from a process running as `nobody`, open until the block ends."""
    proc = subprocess.Popen([*SETPRIV, sys.executable, "-c", HOLDER, host, str(port)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip().isdigit()
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


@contextmanager
def work_counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[str], list[int]]]:
    """Every file opened and the size of every netlink answer received, while the block runs."""
    opened: list[str] = []
    received: list[int] = []
    real_open = builtins.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    class CountingSocket(socket.socket):
        def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, Any]:
            data, sender = super().recvfrom(bufsize, flags)
            received.append(len(data))
            return data, sender

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", counting_open)
        patch.setattr(socket, "socket", CountingSocket)  # the module tcp_peer calls socket.socket of
        yield opened, received


@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_the_kernel_names_the_uid_of_a_real_connection(family: socket.AddressFamily, host: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server((host, 0), family=family) as server:
        port = server.getsockname()[1]
        with socket.socket(family) as client:
            client.connect(server.getsockname())
            accepted, _ = server.accept()
            with accepted, work_counted(monkeypatch) as (opened, received):
                assert lookup_uid(accepted.getpeername(), accepted.getsockname()) == os.getuid()
                assert not opened  # the kernel asked, no table read
                assert len(received) == 1 and received[0] <= ONE_ANSWER_MAX
        with held_by_nobody(host, port):
            accepted, _ = server.accept()
            with accepted:
                assert lookup_uid(accepted.getpeername(), accepted.getsockname()) == NOBODY
                # our own end of it is ours: the lookup is the socket facing us, not any with this tuple
                assert lookup_uid(accepted.getsockname(), accepted.getpeername()) == os.getuid()


def test_an_ipv4_mapped_peer_and_a_dual_stack_listener() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.socket(socket.AF_INET6) as client:
        client.connect(("::ffff:127.0.0.1", server.getsockname()[1]))  # an AF_INET6 socket, mapped
        accepted, _ = server.accept()
        with accepted:
            assert lookup_uid(accepted.getpeername(), accepted.getsockname()) == os.getuid()
    with socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True) as dual, \
            held_by_nobody("127.0.0.1", dual.getsockname()[1]):
        accepted, _ = dual.accept()
        with accepted:
            assert accepted.getpeername()[0] == "::ffff:127.0.0.1"
            assert lookup_uid(accepted.getpeername(), accepted.getsockname()) == NOBODY


def test_a_closed_connection_has_no_uid_though_the_kernel_still_knows_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        peer, ours = accepted.getpeername(), accepted.getsockname()
        client.close()  # the client closes first: its end waits in TIME_WAIT, shown as uid 0
        assert accepted.recv(1) == b""
        accepted.close()
        found = diag_query(endpoint(peer), endpoint(ours))
        assert found is None or found.state != TCP_ESTABLISHED
        assert lookup_uid(peer, ours) is None
        assert lookup_uid(("127.0.0.1", 1), ours) is None  # never was


def test_thousands_of_time_wait_sockets_are_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """What froze the listener: every accept parsed the whole table. Now the lookup's work is one
    request and one answer of one socket however many sockets the host has."""
    with socket.create_server(("127.0.0.1", 0), backlog=128) as server:
        for _ in range(3000):
            client = socket.create_connection(server.getsockname())
            accepted, _ = server.accept()
            client.close()
            accepted.close()
        with open("/proc/net/tcp", "rb") as table:  # they are there, for the old lookup to read
            port = server.getsockname()[1]
            closing = [e for e in parse_table(table.read().decode("ascii")) if e.remote[1] == port]
        assert len(closing) >= 3000
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted, work_counted(monkeypatch) as (opened, received):
                assert lookup_uid(accepted.getpeername(), accepted.getsockname()) == os.getuid()
                assert not [path for path in opened if path.startswith("/proc/")]
                assert len(received) == 1 and received[0] <= ONE_ANSWER_MAX  # one socket answered


# ---------------------------------------------------------------------------------- the kernel's answer

def _answer(seq: int, kind: int = SOCK_DIAG_BY_FAMILY, uid: int = 1000, state: int = TCP_ESTABLISHED) -> bytes:
    request = diag_request(endpoint(("127.0.0.1", 50000)), endpoint(("127.0.0.1", 8080)), seq)
    sockid = request[16 + 8:16 + 8 + 48]  # the request's inet_diag_sockid, as the kernel echoes it
    body = bytes([socket.AF_INET, state, 0, 0]) + sockid + (0).to_bytes(12, "little") \
        + uid.to_bytes(4, sys.byteorder) + (77).to_bytes(4, sys.byteorder)
    return (16 + len(body)).to_bytes(4, sys.byteorder) + kind.to_bytes(2, sys.byteorder) + bytes(2) \
        + seq.to_bytes(4, sys.byteorder) + bytes(4) + body


def test_an_answer_is_read_only_when_it_is_the_one_asked_for() -> None:
    found = parse_diag_reply(_answer(7), 7)
    assert found == DiagSocket(endpoint(("127.0.0.1", 50000)), endpoint(("127.0.0.1", 8080)), TCP_ESTABLISHED, 1000)
    assert parse_diag_reply(_answer(7), 8) is None  # another request's
    assert parse_diag_reply(_answer(7, kind=2), 7) is None  # NLMSG_ERROR (ENOENT: no such socket)
    assert parse_diag_reply(_answer(7)[:60], 7) is None  # cut short
    assert parse_diag_reply(b"", 7) is None
    assert parse_diag_reply(bytes([0xFF] * 200), 7) is None


def test_an_answer_of_another_shape_or_sender_or_socket_is_refused() -> None:
    asked = endpoint(("127.0.0.1", 50000)), endpoint(("127.0.0.1", 8080))
    kernel = (0, 0)
    assert diag_answer(_answer(7), kernel, 7, *asked) is not None
    assert diag_answer(_answer(7), (4321, 0), 7, *asked) is None  # another process sent it, not the kernel
    assert diag_answer(_answer(7), kernel, 7, asked[1], asked[0]) is None  # about another socket than asked
    assert diag_answer(_answer(7), kernel, 7, endpoint(("127.0.0.2", 50000)), asked[1]) is None
    short = bytearray(_answer(7))
    short[0:4] = (16 + 40).to_bytes(4, sys.byteorder)  # its own length says it ends before the uid
    assert parse_diag_reply(bytes(short), 7) is None
    alien = bytearray(_answer(7))
    alien[16] = socket.AF_UNIX  # a family with no address of 4 or 16 bytes
    assert parse_diag_reply(bytes(alien), 7) is None
    longer = bytearray(_answer(7))
    longer[0:4] = (len(longer) + 1).to_bytes(4, sys.byteorder)  # claims a byte more than came
    assert parse_diag_reply(bytes(longer), 7) is None


def test_the_table_is_the_fallback_only_where_the_kernel_answers_no_diagnostics() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        listening = server.getsockname()
        assert choose_lookup(listening) is lookup_uid  # this kernel has sock_diag

        def missing(local: Any, remote: Any) -> DiagSocket | None:
            raise OSError(97, "Address family not supported by protocol")

        assert choose_lookup(listening, missing) is None  # the listener then uses proc_lookup_uid
        assert choose_lookup(listening, lambda local, remote: None) is None
        with socket.create_connection(listening):  # and that still finds the uid
            accepted, _ = server.accept()
            with accepted:
                assert proc_lookup_uid(accepted.getpeername(), accepted.getsockname()) == os.getuid()


# ---------------------------------------------------------------------------------- off the event loop

async def _request(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /mcp/tools HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
    try:
        return await asyncio.wait_for(reader.read(), 60)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def test_a_connection_past_the_lookup_bound_is_refused_while_the_loop_keeps_serving() -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[tuple[Any, Any]] = []

    def slow_lookup(peer: Any, ours: Any) -> int | None:  # a lookup that takes its time, in its thread
        calls.append((peer, ours))
        started.set()
        release.wait(60)
        return os.getuid()

    app = App()

    class Api:
        def handle(self, request: Any) -> Any:
            return app.handle(request)

        def observe(self, route: str, status: int, seconds: float) -> None:
            pass

    loopback = LoopbackApp(Api(), frozenset({b"x"}))  # type: ignore[arg-type]
    lookups = PeerLookups(slow_lookup, limit=1)
    connections = Connections()
    server = await asyncio.get_running_loop().create_server(
        lambda: TcpConnection(loopback, lambda: frozenset({os.getuid()}), connections, lookups), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        first = asyncio.create_task(_request(port))
        assert await asyncio.to_thread(started.wait, 60)  # its lookup is under way, in a thread
        assert app.requests == [] and not connections.open  # and nothing was read before it ends
        assert await _request(port) == b""  # the second is refused at once, the loop free meanwhile
        assert len(calls) == 1 and lookups.pending == 1
        release.set()
        answer = await first
        assert answer.startswith(b"HTTP/1.1 200 ") and len(app.requests) == 1
        assert app.requests[0].peer_uid == os.getuid()
        assert lookups.pending == 0
        assert (await _request(port)).startswith(b"HTTP/1.1 200 ")  # room again
    finally:
        release.set()
        server.close()



async def test_a_lookup_that_fails_refuses_the_connection_and_frees_its_place() -> None:
    def broken(peer: Any, ours: Any) -> int | None:
        raise RuntimeError("not what a lookup raises")

    loopback = LoopbackApp(None, frozenset({b"x"}))  # type: ignore[arg-type]
    lookups = PeerLookups(broken, limit=1)
    connections = Connections()
    server = await asyncio.get_running_loop().create_server(
        lambda: TcpConnection(loopback, lambda: frozenset({os.getuid()}), connections, lookups), "127.0.0.1", 0)
    try:
        for _ in range(3):  # the place is free again each time
            assert await _request(server.sockets[0].getsockname()[1]) == b""
        assert lookups.pending == 0 and not connections.open
    finally:
        server.close()


# ---------------------------------------------------------------------------------- on the event loop

def test_the_kernel_answers_within_the_request() -> None:
    """What lets the listener ask on the event loop: the answer is there when the send returns."""
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()):
        accepted, _ = server.accept()
        with accepted:
            assert lookup_uid(accepted.getpeername(), accepted.getsockname(), wait=False) == os.getuid()
            assert lookup_uid(("127.0.0.1", 1), accepted.getsockname(), wait=False) is None  # none such


async def _served(lookups: PeerLookups, allow: frozenset[int],
                  client: Callable[[int], Awaitable[bytes]] = _request) -> tuple[bytes, App]:
    """One request from `client` to a listener with these lookups: what came back, and what
    reached the app."""
    app = App()

    class Api:
        def handle(self, request: Any) -> Any:
            return app.handle(request)

        def observe(self, route: str, status: int, seconds: float) -> None:
            pass

    loopback = LoopbackApp(Api(), frozenset({b"x"}))  # type: ignore[arg-type]
    server = await asyncio.get_running_loop().create_server(
        lambda: TcpConnection(loopback, lambda: allow, Connections(), lookups), "127.0.0.1", 0)
    try:
        return await client(server.sockets[0].getsockname()[1]), app
    finally:
        server.close()


async def test_a_connection_is_identified_on_the_loop_and_the_thread_only_where_the_kernel_cannot() -> None:
    threaded: list[Any] = []

    def in_a_thread(peer: Any, ours: Any) -> int | None:
        threaded.append(threading.current_thread().name)
        return lookup_uid(peer, ours)

    me = frozenset({os.getuid()})
    answer, app = await _served(PeerLookups(in_a_thread, at_once=partial(lookup_uid, wait=False)), me)
    assert answer.startswith(b"HTTP/1.1 200 ") and app.requests[0].peer_uid == os.getuid()
    assert threaded == []  # answered at once: no worker thread, no task

    def not_at_once(peer: Any, ours: Any) -> int | None:
        raise BlockingIOError

    answer, app = await _served(PeerLookups(in_a_thread, at_once=not_at_once), me)
    assert answer.startswith(b"HTTP/1.1 200 ") and app.requests[0].peer_uid == os.getuid()
    assert len(threaded) == 1 and threaded[0].startswith("tcp-peer")

    for refusing in (lambda peer, ours: 4242, lambda peer, ours: None, lambda peer, ours: 1 // 0):
        answer, app = await _served(PeerLookups(in_a_thread, at_once=refusing), me)
        assert answer == b"" and app.requests == []  # refused before a byte was read
    assert len(threaded) == 1


async def test_a_peer_of_another_uid_is_named_on_the_loop() -> None:
    seen: list[int | None] = []

    def at_once(peer: Any, ours: Any) -> int | None:
        seen.append(uid := lookup_uid(peer, ours, wait=False))
        return uid

    def never(peer: Any, ours: Any) -> int | None:
        raise AssertionError("not asked in a thread")

    async def as_nobody(port: int) -> bytes:
        return await asyncio.to_thread(_as_nobody, port)

    me = frozenset({os.getuid()})
    answer, app = await _served(PeerLookups(never, at_once=at_once), me, as_nobody)
    assert answer == b"" and app.requests == []
    answer, app = await _served(PeerLookups(never, at_once=at_once), me | {NOBODY}, as_nobody)
    assert answer.startswith(b"HTTP/1.1 200 ") and app.requests[0].peer_uid == NOBODY
    assert seen == [NOBODY, NOBODY]


AS_NOBODY = r"""
import socket, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
sock.sendall(b"POST /mcp/tools HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
received = b""
try:
    while chunk := sock.recv(65536):
        received += chunk
except OSError:
    pass
sys.stdout.buffer.write(received)
"""


def _as_nobody(port: int) -> bytes:
    return subprocess.run([*SETPRIV, sys.executable, "-c", AS_NOBODY, str(port)], capture_output=True,
                          timeout=60, cwd="/", check=True).stdout
