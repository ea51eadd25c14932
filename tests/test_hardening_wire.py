"""HTTP/1.1 over the socket (issue #12): the head limit bounds memory, a partial next head runs
under `request_timeout`, and an `Upgrade` request gets exactly one answer.

Byte-level, against the real sidecar process, or in-process on a real socket pair with the real
`Api` behind an `HttpConnection` on a fake clock (a packet is handed to `data_received` whole,
so "one packet" is exactly what the test says it is).
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mcpcreds.config.load import load_config
from mcpcreds.core.clock import FakeClock
from mcpcreds.sidecar.serve import OPEN_FILES, Sidecar
from mcpcreds.sidecar.wire import MAX_HEAD_BYTES, Connections, HttpConnection
from tests.sidecar_proc import SidecarProcess, run_sidecar

CONFIG = """
[sidecar]
socket = "{socket}"
request_timeout = "60s"
[secrets]
sources = ["env"]
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:DOCS_TOKEN}}}}" }}
"""
HEALTH = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
MB = 1024 * 1024


def write_config(root: Path) -> tuple[Path, Path]:
    sock = root / "run" / "s.sock"
    config = root / "config.toml"
    config.write_text(CONFIG.format(socket=sock))
    return config, sock


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    """One sidecar for the tests on a real socket: none changes its config, each opens its own
    connections, and the memory test measures growth from its own baseline (they share its start-up)."""
    config, sock = write_config(tmp_path_factory.mktemp("wire"))
    with run_sidecar(config, sock, {"DOCS_TOKEN": "docs-token"}) as proc:
        yield proc


def connect(sidecar: SidecarProcess, timeout: float = 30.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(sidecar.socket))
    return s


def read_to_eof(s: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def rss(pid: int) -> int:
    """Resident set size of a process, in bytes (/proc/PID/status VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def stream_header_line(s: socket.socket, total: int) -> int:
    """Send a head whose one header value never ends; how many bytes went out before the
    sidecar closed the connection (or `total`)."""
    sent = 0
    block = b"a" * (256 * 1024)
    try:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        while sent < total:
            s.sendall(block)
            sent += len(block)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


# ------------------------------------------------------------------------ the head limit


def test_an_endless_header_line_is_a_431_and_costs_no_memory(sidecar: SidecarProcess) -> None:
    pid = sidecar.proc.pid
    with connect(sidecar) as warm:  # the first request allocates what every request needs
        warm.sendall(HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert read_to_eof(warm).startswith(b"HTTP/1.1 200 ")
    before = rss(pid)
    conns = [connect(sidecar) for _ in range(4)]
    try:
        sent = [stream_header_line(s, 16 * MB) for s in conns]
        during = rss(pid)  # our ends are still open: whatever the sidecar buffered, it holds
        assert during - before < 6 * MB, (before, during, sent)
        answers = [read_to_eof(s) for s in conns]
    finally:
        for s in conns:
            s.close()
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert b'"headers_too_large"' in answer and answer.count(b"HTTP/1.1 ") == 1
    assert all(n < 16 * MB for n in sent)  # refused long before the end of the stream
    with connect(sidecar) as after:  # and the service goes on
        after.sendall(HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert read_to_eof(after).startswith(b"HTTP/1.1 200 ")


# ------------------------------------------------------------------------ upgrades


@pytest.mark.parametrize("head", [
    b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"GET /v1/servers/docs/headers HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n",
    b"CONNECT docs.example.com:443 HTTP/1.1\r\nHost: docs.example.com:443\r\n\r\n",
])
def test_an_upgrade_request_gets_exactly_one_answer_then_the_connection_closes(
        sidecar: SidecarProcess, head: bytes) -> None:
    with connect(sidecar) as s:
        s.sendall(head + HEALTH)  # the pipelined request behind it is never answered
        answer = read_to_eof(s)
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    assert answer.startswith(b"HTTP/1.1 400 ") and b"Connection: close\r\n" in answer
    assert b"protocol upgrades are not supported" in answer


# ------------------------------------------------------------------------ in-process, on a fake clock


@dataclass
class Wire:
    clock: FakeClock
    connections: Connections
    conn: HttpConnection
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def answer(self) -> bytes:
        """One complete answer (head and Content-Length body)."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
        return head + await asyncio.wait_for(self.reader.readexactly(length), 10)

    async def rest(self) -> bytes:
        return await asyncio.wait_for(self.reader.read(), 10)  # to EOF


@pytest.fixture
async def wire(tmp_path: Path) -> AsyncIterator[Wire]:
    config, _ = write_config(tmp_path)
    clock = FakeClock()
    api = Sidecar(load_config(config), clock).api
    connections = Connections(request_timeout=10.0, idle_timeout=120.0, clock=clock)
    server_end, client_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    loop = asyncio.get_running_loop()
    uid = os.getuid()
    _, conn = await loop.connect_accepted_socket(
        lambda: HttpConnection(api, lambda: frozenset({uid}), connections), server_end)
    assert isinstance(conn, HttpConnection)
    reader, writer = await asyncio.open_unix_connection(sock=client_end)
    yield Wire(clock, connections, conn, reader, writer)
    writer.close()
    if conn.transport is not None:
        conn.transport.close()


async def test_a_partial_head_behind_a_complete_request_runs_under_request_timeout(wire: Wire) -> None:
    wire.conn.data_received(HEALTH + b"\r\n")  # a stray line ending is no head: the connection is idle
    assert (await wire.answer()).startswith(b"HTTP/1.1 200 ")
    wire.clock.advance(60.0)
    wire.connections.sweep(wire.clock.monotonic())
    assert wire.conn in wire.connections.open
    wire.conn.data_received(HEALTH + b"GET /v1/health HTTP/1.1\r\nHo")  # one packet
    assert (await wire.answer()).startswith(b"HTTP/1.1 200 ")
    wire.clock.advance(9.0)
    wire.connections.sweep(wire.clock.monotonic())
    assert wire.conn in wire.connections.open  # within request_timeout: still waiting
    wire.clock.advance(2.0)  # 11 s after the head began: past request_timeout, far from idle_timeout
    wire.connections.sweep(wire.clock.monotonic())
    rest = await wire.rest()
    assert rest.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in rest


async def test_the_head_limit_counts_a_pipelined_partial_head_not_the_body_before_it(wire: Wire) -> None:
    body = b'{"cost": 1, "pad": "' + b"x" * 60_000 + b'"}'
    post = (b"POST /v1/servers/docs/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)
    endless = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Endless: " + b"a" * (MAX_HEAD_BYTES + 4096)
    wire.conn.data_received(post + HEALTH + endless)  # one packet
    first = await wire.answer()
    assert not first.startswith(b"HTTP/1.1 431 ") and not first.startswith(b"HTTP/1.1 413 ")
    assert (await wire.answer()).startswith(b"HTTP/1.1 200 ")
    rest = await wire.rest()
    assert rest.startswith(b"HTTP/1.1 431 ") and rest.count(b"HTTP/1.1 ") == 1


async def test_a_head_of_exactly_the_limit_passes_one_byte_more_does_not(wire: Wire) -> None:
    def head(size: int) -> bytes:
        start = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Pad: "
        return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"

    assert len(head(MAX_HEAD_BYTES)) == MAX_HEAD_BYTES
    wire.conn.data_received(head(MAX_HEAD_BYTES))
    assert (await wire.answer()).startswith(b"HTTP/1.1 200 ")
    wire.conn.data_received(head(MAX_HEAD_BYTES + 1)[:MAX_HEAD_BYTES])
    assert wire.conn in wire.connections.open  # nothing is over the limit yet
    wire.conn.data_received(head(MAX_HEAD_BYTES + 1)[MAX_HEAD_BYTES:])  # its last byte
    rest = await wire.rest()
    assert rest.startswith(b"HTTP/1.1 431 ")


# ------------------------------------------------------------------------ descriptors


def test_the_sidecar_raises_its_open_files_limit_and_serves_past_the_old_one(tmp_path: Path) -> None:
    """Started at a soft limit of 64 descriptors (the usual 1,024 in small), the sidecar raises it
    towards the hard one it inherited: 150 connections held open, a new one is still answered (at
    64, libuv accepted and dropped it without a word), and its ready line says the limit it runs with."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    assert wanted > 200, "this test needs a hard limit on open files above 200"
    config, sock = write_config(tmp_path)
    with run_sidecar(config, sock, {"DOCS_TOKEN": "docs-token"}, wrapper=("prlimit", "--nofile=64:")) as proc:
        limits = Path(f"/proc/{proc.proc.pid}/limits").read_text()
        soft = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max open files"))
        assert soft == str(wanted)
        assert f'"open_files": {wanted}' in proc.log
        held: list[socket.socket] = []
        try:
            held += (connect(proc) for _ in range(150))
            with connect(proc) as s:
                s.sendall(HEALTH)
                assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        finally:
            for h in held:
                h.close()
