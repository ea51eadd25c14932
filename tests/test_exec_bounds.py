"""The egress proxy of `mcpcreds exec` under attack: its bounds, who may talk to it, its socket.

In process: a real `EgressProxy` on a Unix socket in a temp folder, a local echo upstream (in
another process: the proxy never connects to its own process's listeners), and a fake clock
(every time bound is enforced by `sweep()` reading the clock, so the tests move time instead of
waiting). The attacker holds a session credential (a prompt-injected child), is
another local uid (run as nobody through setpriv), or opens sessions in a loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcpcreds.core.audit import AuditLog
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.socket_check import UntrustedSidecar
from mcpcreds.errors import ExecSessionsFull, RateLimited
from mcpcreds.exec import egress_proxy as ep
from mcpcreds.exec.egress_proxy import (
    HEAD_TIMEOUT,
    HOLD_TIMEOUT,
    MAX_HEAD,
    MAX_HEADS,
    PROXY_AUTH_REQUIRED,
    TUNNEL_IDLE_TIMEOUT,
    EgressProxy,
    EgressSocketInUse,
)
from mcpcreds.net.egress import EgressPolicy

NOBODY = 65534
POLICY = EgressPolicy("broad_audited", allow_private=("127.0.0.1",))
WORST = ep.MAX_HEADS + 2 * ep.MAX_TUNNELS + ep.MAX_SESSIONS  # descriptors, every bound reached
WAIT = 20.0  # only ever reached when a bound is broken (then the test fails instead of hanging)


ECHO = """
import asyncio

async def echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()

async def main():
    server = await asyncio.start_server(echo, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


@dataclass
class Rig:
    proxy: EgressProxy
    clock: FakeClock
    audit_path: Path
    upstream_port: int

    def audit(self, event: str) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.audit_path.read_text().splitlines()]
        return [e for e in lines if e["event"] == event]

    def session(self, uid: int | None = None) -> str:
        token, _session = self.proxy.new_session("t", POLICY, os.getuid() if uid is None else uid, 1)
        return token

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(self.proxy.path)

    async def request(self, token: str | None, line: str = "") -> tuple[bytes, asyncio.StreamReader,
                                                                         asyncio.StreamWriter]:
        """Send one request head; the answer's status line, and the open connection."""
        reader, writer = await self.open()
        line = line or f"CONNECT 127.0.0.1:{self.upstream_port} HTTP/1.1"
        writer.write(f"{line}\r\n{_auth(token)}\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        return head.split(b"\r\n", 1)[0], reader, writer

    async def tunnel(self, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        status, reader, writer = await self.request(token)
        assert status == b"HTTP/1.1 200 Connection established", status
        return reader, writer

    async def hold(self, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        status, reader, writer = await self.request(token, "MCPCREDS-HOLD * HTTP/1.1")
        assert status == b"HTTP/1.1 200 OK", status
        return reader, writer


def _auth(token: str | None) -> str:
    if token is None:
        return ""
    return f"Proxy-Authorization: Basic {base64.b64encode(f'mcpcreds:{token}'.encode()).decode()}\r\n"


async def until(condition: Callable[[], bool]) -> None:
    """Wait for the proxy's own state to reach `condition` (bounded; no fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not condition():
        assert loop.time() < deadline, "the proxy never got there"
        await asyncio.sleep(0.005)


async def closed(reader: asyncio.StreamReader) -> bytes:
    """Everything until the proxy closes the connection (fails, instead of hanging, if it never does)."""
    return await asyncio.wait_for(reader.read(), WAIT)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    # another process: the proxy never connects to a listener of its own (the sidecar's)
    upstream = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    assert upstream.stdout is not None
    port = int(upstream.stdout.readline())
    clock = FakeClock()
    audit = AuditLog(str(tmp_path / "audit.jsonl"), clock)
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    proxy = EgressProxy(str(folder / "egress.sock"), lambda: frozenset({os.getuid()}), audit, clock=clock)
    await proxy.start()
    try:
        yield Rig(proxy, clock, tmp_path / "audit.jsonl", port)
    finally:
        proxy.close()
        upstream.kill()
        upstream.wait()
        audit.close()


# ---------------------------------------------------------------------------- the request head


async def test_a_head_larger_than_the_limit_is_431_and_closed(rig: Rig) -> None:
    token = rig.session()
    reader, writer = await rig.open()
    writer.write(f"CONNECT 127.0.0.1:{rig.upstream_port} HTTP/1.1\r\n{_auth(token)}".encode())
    writer.write(b"X-Pad: " + b"a" * MAX_HEAD)  # no end of head: an endless header line
    answer = await closed(reader)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    writer.close()
    assert rig.proxy.counts["heads"] == 0 and rig.proxy.counts["tunnels"] == 0


async def test_a_head_that_does_not_arrive_in_time_is_408_and_closed(rig: Rig) -> None:
    reader, writer = await rig.open()
    writer.write(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n")  # and then nothing: slowloris
    await until(lambda: rig.proxy.counts["heads"] == 1)
    rig.clock.advance(HEAD_TIMEOUT - 0.5)
    assert rig.proxy.sweep() == {}  # not before its time
    rig.clock.advance(0.5)
    assert rig.proxy.sweep() == {"head": 1}
    assert (await closed(reader)).startswith(b"HTTP/1.1 408 ")
    await until(lambda: rig.proxy.counts["heads"] == 0)
    writer.close()


async def test_connections_sending_their_head_are_capped_then_refused_503(rig: Rig) -> None:
    slow = []
    for _ in range(MAX_HEADS):
        reader, writer = await rig.open()
        writer.write(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n")
        slow.append((reader, writer))
    await until(lambda: rig.proxy.counts["heads"] == MAX_HEADS)
    reader, writer = await rig.open()
    assert (await closed(reader)).startswith(b"HTTP/1.1 503 ")  # at once: no head read, no hang
    writer.close()
    rig.clock.advance(HEAD_TIMEOUT)
    assert rig.proxy.sweep() == {"head": MAX_HEADS}  # the slow ones are gone; the proxy serves again
    for reader, writer in slow:
        assert (await closed(reader)).startswith(b"HTTP/1.1 408 ")
        writer.close()
    await rig.tunnel(rig.session())


# ---------------------------------------------------------------------------- tunnels


async def test_tunnels_per_session_are_capped_429_and_other_sessions_unaffected(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ep, "MAX_TUNNELS_PER_SESSION", 3)
    greedy, other = rig.session(), rig.session()
    tunnels = [await rig.tunnel(greedy) for _ in range(3)]
    status, reader, writer = await rig.request(greedy)
    assert status == b"HTTP/1.1 429 Too Many Requests"
    assert b"connections open already" in await closed(reader)
    writer.close()
    tunnels.append(await rig.tunnel(other))  # another session is not starved by this one
    tunnels[0][1].close()  # one ends: the session may open one again
    await until(lambda: rig.proxy.counts["tunnels"] == 3)
    tunnels.append(await rig.tunnel(greedy))


async def test_tunnels_in_total_are_capped_503(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ep, "MAX_TUNNELS", 4)
    first, second = rig.session(), rig.session()
    tunnels = [await rig.tunnel(token) for token in (first, first, second, second)]
    status, _reader, _writer = await rig.request(rig.session())
    assert status == b"HTTP/1.1 503 Service Unavailable"
    assert rig.proxy.counts["tunnels"] == len(tunnels)


async def test_an_idle_tunnel_is_closed_and_traffic_keeps_it_open(rig: Rig) -> None:
    token = rig.session()
    _held = await rig.hold(token)  # (a session nobody holds ends sooner, and its tunnels with it)
    reader, writer = await rig.tunnel(token)
    rig.clock.advance(TUNNEL_IDLE_TIMEOUT - 1)
    writer.write(b"ping")  # a byte through moves the deadline
    assert await asyncio.wait_for(reader.readexactly(4), WAIT) == b"ping"
    rig.clock.advance(TUNNEL_IDLE_TIMEOUT - 1)
    assert rig.proxy.sweep() == {}  # idle since the ping only
    rig.clock.advance(1)
    assert rig.proxy.sweep() == {"idle": 1}
    assert await closed(reader) == b""
    await until(lambda: rig.proxy.counts["tunnels"] == 0)
    [line] = rig.audit("exec_egress")
    assert line["closed"] == "idle" and line["bytes_up"] == 4 and line["bytes_down"] == 4


async def test_a_sessions_tunnels_close_when_it_ends(rig: Rig) -> None:
    token = rig.session()
    _hold_reader, hold_writer = await rig.hold(token)
    reader, _writer = await rig.tunnel(token)
    hold_writer.close()  # the forwarder is gone: the child exited
    assert await closed(reader) == b""
    await until(lambda: rig.proxy.counts["tunnels"] == 0 and rig.proxy.live_sessions == 0)
    status, _r, _w = await rig.request(token)
    assert status == b"HTTP/1.1 407 Proxy Authentication Required"


async def test_the_proxys_descriptors_are_bounded_503_at_accept(rig: Rig) -> None:
    rig.proxy.fd_budget = 3
    _tunnel = await rig.tunnel(rig.session())  # two descriptors: the child's side and upstream
    _reader, writer = await rig.open()
    writer.write(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n")  # a third, still sending its head
    await until(lambda: rig.proxy.open_fds == 3)
    reader, _writer = await rig.open()
    assert (await closed(reader)).startswith(b"HTTP/1.1 503 ")


@pytest.mark.parametrize(("limits", "raised", "budget"), [
    ((256, 1 << 20), 2 * WORST + 256, WORST),  # raised towards the hard limit: room for every bound
    ((256, 600), 600, 300),  # raised as far as allowed, then half of it
    ((256, 256), 256, 128),  # cannot be raised: half of it, whatever the bounds would allow
])
def test_the_descriptor_budget_is_a_share_of_the_limit_raised_when_needed(
        monkeypatch: pytest.MonkeyPatch, limits: tuple[int, int], raised: int, budget: int) -> None:
    import resource

    class FakeResource:
        RLIMIT_NOFILE = resource.RLIMIT_NOFILE
        RLIM_INFINITY = resource.RLIM_INFINITY
        now = limits

        def getrlimit(self, which: int) -> tuple[int, int]:
            return self.now

        def setrlimit(self, which: int, value: tuple[int, int]) -> None:
            if value[0] > self.now[1] or value[1] > self.now[1]:
                raise ValueError("not allowed to raise maximum limit")
            self.now = value

    fake = FakeResource()
    monkeypatch.setattr(ep, "resource", fake)
    assert ep._fd_budget() == budget
    assert fake.now[0] == raised


# ---------------------------------------------------------------------------- sessions


async def test_sessions_nobody_holds_are_capped_429_and_expire(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ep, "MAX_PENDING_SESSIONS", 3)
    for _ in range(3):
        rig.session()
    with pytest.raises(RateLimited) as refused:  # a client opening sessions in a loop
        rig.session()
    assert refused.value.status == 429 and refused.value.retry_after == HOLD_TIMEOUT
    rig.clock.advance(HOLD_TIMEOUT - 1)
    assert rig.proxy.sweep() == {}
    assert rig.proxy.live_sessions == 3
    rig.clock.advance(1)
    rig.session()  # expired ones make room (new_session sweeps first)
    assert rig.proxy.live_sessions == 1
    assert [e["held"] for e in rig.audit("exec_session_end")] == [False] * 3


async def test_live_sessions_are_capped_503(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ep, "MAX_SESSIONS", 3)
    holds = [await rig.hold(rig.session()) for _ in range(3)]
    with pytest.raises(ExecSessionsFull) as full:
        rig.session()
    assert full.value.status == 503
    holds[0][1].close()  # one child exits
    await until(lambda: rig.proxy.live_sessions == 2)
    rig.session()


async def test_a_held_session_is_not_expired_and_cannot_be_held_twice(rig: Rig) -> None:
    token = rig.session()
    _held = await rig.hold(token)
    rig.clock.advance(HOLD_TIMEOUT * 10)
    assert rig.proxy.sweep() == {}
    assert rig.proxy.live_sessions == 1
    status, _r, _w = await rig.request(token, "MCPCREDS-HOLD * HTTP/1.1")
    assert status == b"HTTP/1.1 409 Conflict"


async def test_an_expired_credential_answers_exactly_like_an_unknown_one(rig: Rig) -> None:
    expired = rig.session()
    rig.clock.advance(HOLD_TIMEOUT)
    assert rig.proxy.sweep() == {"unheld": 1}
    assert rig.proxy.live_sessions == 0  # forgotten, not kept as a tombstone the lookup could tell apart
    answers = []
    for token in (expired, "not-a-session-token", None):
        reader, writer = await rig.open()
        writer.write(f"CONNECT 127.0.0.1:{rig.upstream_port} HTTP/1.1\r\n{_auth(token)}\r\n".encode())
        answers.append(await closed(reader))
        writer.close()
    assert answers == [PROXY_AUTH_REQUIRED] * 3


# ---------------------------------------------------------------------------- the socket


async def test_socket_is_0600_and_an_unsafe_folder_is_refused(tmp_path: Path, rig: Rig) -> None:
    assert stat.S_IMODE(os.stat(rig.proxy.path).st_mode) == 0o600
    audit = AuditLog(None, rig.clock)
    for mode in (0o777, 0o770):
        folder = tmp_path / f"open{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        with pytest.raises(UntrustedSidecar):
            await EgressProxy(str(folder / "egress.sock"), lambda: frozenset(), audit).start()
        assert not (folder / "egress.sock").exists()
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UntrustedSidecar):
        await EgressProxy(str(tmp_path / "link" / "egress.sock"), lambda: frozenset(), audit).start()


async def test_start_replaces_only_a_stale_socket_and_close_unlinks_only_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "egress.sock"
    audit = AuditLog(None, FakeClock())

    def proxy() -> EgressProxy:
        return EgressProxy(str(path), lambda: frozenset({os.getuid()}), audit)

    path.write_text("not a socket")
    with pytest.raises(EgressSocketInUse):
        await proxy().start()
    assert path.read_text() == "not a socket"
    path.unlink()
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen()
    with pytest.raises(EgressSocketInUse):  # someone listens there: never stolen
        await proxy().start()
    live.close()  # now a stale socket: nobody listens
    first = proxy()
    await first.start()
    first.close()
    assert not path.exists()  # its own socket: unlinked at close
    second = proxy()
    await second.start()
    path.unlink()  # replaced behind its back by another socket
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(path))
    second.close()
    assert stat.S_ISSOCK(path.lstat().st_mode)  # not the one it created: left alone
    other.close()


def _nobody_client(path: str, token: str | None) -> list[str]:
    script = ("import socket, sys\n"
              "s = socket.socket(socket.AF_UNIX)\n"
              "try:\n    s.connect(sys.argv[1])\nexcept OSError as exc:\n"
              "    print('connect', type(exc).__name__); sys.exit()\n"
              "try:\n    s.sendall(sys.argv[2].encode())\nexcept OSError:\n    pass\n"
              "data = b''\n"
              "try:\n    while chunk := s.recv(4096):\n        data += chunk\nexcept OSError:\n    pass\n"
              "print('answer', data.split(b'\\r\\n')[0].decode() or '(closed, nothing)')\n")
    head = f"CONNECT 127.0.0.1:1 HTTP/1.1\r\n{_auth(token)}\r\n"
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            sys.executable, "-S", "-c", script, path, head]


async def _run(command: list[str]) -> str:
    proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err
    return out.decode().strip()


@pytest.fixture
def open_folder() -> Any:
    """A folder nobody may enter (the tests' own temp folders are closed to other uids)."""
    folder = tempfile.mkdtemp(prefix="mcpcreds-egress-")
    os.chmod(folder, 0o755)
    yield Path(folder)
    shutil.rmtree(folder)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
@pytest.mark.parametrize("allowed", [False, True])
async def test_another_uid_gets_nothing(open_folder: Path, allowed: bool) -> None:
    """Even where the socket is reachable (an operator opened its mode), another uid is refused
    before a byte is read unless allowed; allowed, it cannot use a session another uid made,
    holding that session's credential (the answer is the unknown credential's)."""
    clock = FakeClock()
    uids = frozenset({os.getuid(), NOBODY} if allowed else {os.getuid()})
    proxy = EgressProxy(str(open_folder / "egress.sock"), lambda: uids, AuditLog(None, clock), clock=clock)
    await proxy.start(0o666)
    try:
        token, _session = proxy.new_session("t", POLICY, os.getuid(), 1)
        stolen = await _run(_nobody_client(proxy.path, token))
        unknown = await _run(_nobody_client(proxy.path, "no-such-token"))
        if allowed:
            assert stolen == unknown == "answer HTTP/1.1 407 Proxy Authentication Required"
        else:
            assert stolen == unknown == "answer (closed, nothing)"
        assert proxy.counts["tunnels"] == 0
    finally:
        proxy.close()



@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a folder owned by another uid)")
def test_the_hold_sends_no_credential_to_a_socket_that_is_not_the_sidecars(tmp_path: Path) -> None:
    """`mcpcreds exec` checks the proxy socket as the sidecar's own before sending the session's
    credential: the folder (the sidecar uid's, closed to others) and the listener's uid."""
    from mcpcreds.cli.exec import _hold

    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)  # the folder is the expected sidecar uid's (nobody) ...
    path = str(folder / "egress.sock")
    listener = socket.socket(socket.AF_UNIX)  # ... but the process listening in it is not (root)
    listener.bind(path)
    listener.listen()
    listener.settimeout(5)
    try:
        with pytest.raises(UntrustedSidecar, match="runs as uid 0"):
            _hold(path, "the-session-token", NOBODY)
        accepted, _ = listener.accept()
        with accepted:
            accepted.settimeout(5)
            assert accepted.recv(4096) == b""  # nothing was sent
        folder.chmod(0o777)  # a folder others can write to: refused before connecting
        with pytest.raises(UntrustedSidecar, match="writable"):
            _hold(path, "the-session-token", NOBODY)
        listener.settimeout(0)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


def test_a_full_proxy_reaches_the_cli_as_unavailable_exit_69() -> None:
    from mcpcreds.cli.common import EXIT_UNAVAILABLE, exit_code_for
    from mcpcreds.errors import error_from_wire

    wire = ExecSessionsFull("the egress proxy holds as many exec sessions as it may").to_wire()
    again = error_from_wire(503, wire)
    assert isinstance(again, ExecSessionsFull) and exit_code_for(again) == EXIT_UNAVAILABLE
