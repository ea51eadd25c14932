"""Sidecar impersonation (issue #12): a socket someone else planted gets no byte from any client,
`serve` refuses a socket folder it cannot trust, a malformed answer is a clear CLI error, and a
hung worker thread does not keep a stopped sidecar alive.

The attacker is a real listener, run as `nobody` where it matters, that records every byte it
receives and answers like a sidecar would. "Nothing arrived" is checked by a probe connection
after the client gave up: the listener handles connections one at a time, in order, so when it
reports the probe it has reported everything before it.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpcreds import AsyncClient, Client, SecretUnavailable, SidecarUnavailable
from mcpcreds.cli.main import main
from mcpcreds.client.calls import MalformedAnswer
from mcpcreds.core.socket_check import UntrustedSidecar
from tests.conftest import CANARY, run_cli
from tests.sidecar_proc import SidecarProcess

NOBODY = 65534
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
GRANT = "GRANT-" + CANARY
SIDECAR_LIKE = json.dumps({  # satisfies every client call, so a client that sends is not stopped by it
    "status": "ok", "headers": {"Authorization": "Bearer attacker"}, "key": "k", "expires_at": None,
    "fingerprint": None, "granted": 1, "waited": 0.0, "renewed": [], "stored_in": "keyring",
    "servers": [], "id": "g", "grant": "g"})

LISTENER = r"""
import json, socket, sys
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1])
server.listen(16)
answer = sys.argv[2].encode()
print("READY", flush=True)
while True:
    conn, _ = server.accept()
    conn.settimeout(30)
    received = b""
    try:
        chunk = conn.recv(65536)
        received += chunk
        if chunk and chunk != b"PROBE":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(answer) + answer)
        while chunk:
            chunk = conn.recv(65536)
            received += chunk
    except OSError:
        pass
    conn.close()
    print(json.dumps({"received": received.decode("latin-1")}), flush=True)
"""


class Listener:
    """A process listening on `path` (as `nobody` if asked) that reports what each connection sent."""

    def __init__(self, path: Path, as_nobody: bool, answer: str = SIDECAR_LIKE) -> None:
        self.path = path
        prefix = SETPRIV if as_nobody else []
        self.proc = subprocess.Popen([*prefix, "/usr/bin/python3", "-c", LISTENER, str(path), answer],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, cwd="/")
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._lines.get(timeout=20) == "READY"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())

    def moved_to(self, path: Path) -> None:
        """Rename the bound socket file: the listener keeps it (connects follow the inode)."""
        os.rename(self.path, path)
        self.path = path

    def connections(self) -> list[str]:
        """What every connection so far sent, in order (the probe's own excluded)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(self.path))
            probe.sendall(b"PROBE")
        seen = []
        while (received := json.loads(self._lines.get(timeout=20))["received"]) != "PROBE":
            seen.append(received)
        return seen

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def arena() -> Iterator[Path]:
    """A folder that `nobody` can traverse (pytest's tmp tree is 0700 root)."""
    root = Path(tempfile.mkdtemp(prefix="mcpcreds-arena-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def listeners() -> Iterator[list[Listener]]:
    started: list[Listener] = []
    yield started
    for listener in started:
        listener.stop()


def folder(path: Path, mode: int = 0o700, uid: int = 0) -> Path:
    path.mkdir()
    os.chown(path, uid, uid)
    path.chmod(mode)
    return path


def plant(arena: Path, listeners: list[Listener], case: str) -> tuple[Path, str]:
    """A socket whose folder or listener is not the sidecar's (root's), and the reason to expect."""
    if case == "symlinked folder":  # to a folder and listener that are root's: only the symlink is wrong
        real = folder(arena / "real")
        (arena / "link").symlink_to(real)
        listeners.append(Listener(real / "s.sock", as_nobody=False))
        return arena / "link" / "s.sock", "is a symlink"
    if case == "folder of another uid":
        theirs = folder(arena / "theirs", uid=NOBODY)
        listeners.append(Listener(theirs / "s.sock", as_nobody=False))
        return theirs / "s.sock", f"belongs to uid {NOBODY}, not to the sidecar's uid 0"
    if case in ("group-writable folder", "world-writable folder"):
        shared = folder(arena / "shared", 0o770 if case.startswith("group") else 0o703)
        listeners.append(Listener(shared / "s.sock", as_nobody=False))
        return shared / "s.sock", "is writable by group or others"
    assert case == "listener of another uid"  # a folder that passes, a socket `nobody` listens on
    theirs = folder(arena / "theirs", uid=NOBODY)
    listener = Listener(theirs / "s.sock", as_nobody=True)
    listeners.append(listener)
    listener.moved_to(folder(arena / "ours") / "s.sock")
    return listener.path, f"runs as uid {NOBODY}, not as the sidecar's uid 0"


CASES = ["symlinked folder", "folder of another uid", "group-writable folder", "world-writable folder",
         "listener of another uid"]


@pytest.mark.parametrize("case", CASES)
def test_sync_client_sends_nothing_to_a_socket_that_is_not_the_sidecars(
        arena: Path, listeners: list[Listener], case: str) -> None:
    path, reason = plant(arena, listeners, case)
    with Client(path, grant=GRANT) as client, pytest.raises(UntrustedSidecar) as refused:
        client.headers("docs")
    assert isinstance(refused.value, SidecarUnavailable)
    assert reason in refused.value.message and "nothing was sent" in refused.value.message
    # the folder checks refuse before connecting; the peer check connects and sends nothing
    expected = [""] if case == "listener of another uid" else []
    assert listeners[0].connections() == expected


@pytest.mark.parametrize("case", CASES)
async def test_async_client_sends_nothing_to_a_socket_that_is_not_the_sidecars(
        arena: Path, listeners: list[Listener], case: str) -> None:
    path, reason = plant(arena, listeners, case)
    async with AsyncClient(path, grant=GRANT) as creds:
        with pytest.raises(UntrustedSidecar) as refused:
            await creds.call("docs")
    assert reason in refused.value.message
    expected = [""] if case == "listener of another uid" else []
    assert await asyncio.to_thread(listeners[0].connections) == expected  # the loop closes the socket


def test_cli_sends_no_rotated_secret_and_no_grant_to_a_planted_default_folder(
        arena: Path, listeners: list[Listener], tmp_path: Path) -> None:
    """The issue's attack: in a world-writable parent, `nobody` symlinks the predictable socket
    folder to its own and listens there; `secret rotate --force` and a grant holder's CLI run."""
    public = folder(arena / "public", 0o1777)
    evil = folder(arena / "evil", uid=NOBODY)
    subprocess.run([*SETPRIV, "ln", "-s", str(evil), str(public / "mcpcreds-0")], check=True)
    listeners.append(Listener(evil / "mcpcreds.sock", as_nobody=True))
    config = tmp_path / "config.toml"
    config.write_text('[secrets]\nsources = ["env"]\n')
    env = {"MCPCREDS_SOCKET": str(public / "mcpcreds-0" / "mcpcreds.sock")}

    rotate = run_cli("secret", "rotate", "DOCS_KEY", "--force", "--config", str(config), stdin=CANARY,
                     env=env)
    headers = run_cli("headers", "docs", "--config", str(config), env={**env, "MCPCREDS_GRANT": GRANT})
    for result in (rotate, headers):
        assert result.code == 69, result.output
        assert "is a symlink" in result.stderr and "Traceback" not in result.output
        assert CANARY not in result.output
    assert "stored" not in rotate.stderr  # no fallback to storing it untested either
    assert listeners[0].connections() == []


def test_a_sidecar_of_another_uid_is_trusted_when_named(
        arena: Path, listeners: list[Listener], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = folder(arena / "theirs", uid=NOBODY)
    listeners.append(Listener(theirs / "s.sock", as_nobody=True))
    path = theirs / "s.sock"
    with Client(path, sidecar_uid=NOBODY) as client:
        assert client.health()["status"] == "ok"
    config = tmp_path / "config.toml"
    config.write_text(f'[sidecar]\nsocket = "{path}"\nsidecar_uid = {NOBODY}\n')
    result = run_cli("headers", "docs", "--config", str(config))
    assert result.code == 0 and result.stdout == "Authorization: Bearer attacker\n", result.output
    monkeypatch.setenv("MCPCREDS_SIDECAR_UID", str(NOBODY))
    with Client(path) as client:
        assert client.health()["status"] == "ok"
    assert len(listeners[0].connections()) == 3
    monkeypatch.setenv("MCPCREDS_SIDECAR_UID", "root")
    result = run_cli("headers", "docs", "--socket", str(path))
    assert result.code == 2 and "MCPCREDS_SIDECAR_UID: must be a uid" in result.stderr


# ------------------------------------------------------------------------------------- serve

SERVE_CONFIG = '[sidecar]\nsocket = "{socket}"\n{extra}\n[secrets]\nsources = ["env"]\n'


def sidecar_config(tmp_path: Path, socket_path: Path, extra: str = "") -> Path:
    config = tmp_path / "sidecar.toml"
    config.write_text(SERVE_CONFIG.format(socket=socket_path, extra=extra))
    return config


def serve_once(tmp_path: Path, socket_path: Path, extra: str = "") -> subprocess.CompletedProcess[str]:
    """`mcpcreds serve` expected to refuse to start (a sidecar that starts runs into the timeout)."""
    config = sidecar_config(tmp_path, socket_path, extra)
    return subprocess.run([sys.executable, "-m", "mcpcreds.cli.main", "serve", "--config", str(config)],
                          capture_output=True, text=True, timeout=30)


def test_serve_refuses_a_symlinked_socket_folder(arena: Path, tmp_path: Path) -> None:
    real = folder(arena / "real")  # ours and 0700: only the symlink is wrong
    (arena / "link").symlink_to(real)
    result = serve_once(tmp_path, arena / "link" / "mcpcreds.sock")
    assert result.returncode == 1
    assert f"socket folder {arena / 'link'} is a symlink" in result.stderr
    assert "Traceback" not in result.stderr and list(real.iterdir()) == []


def test_serve_refuses_a_folder_others_can_swap_but_takes_one_in_a_sticky_parent(
        arena: Path, tmp_path: Path) -> None:
    shared = folder(arena / "shared", 0o777)
    result = serve_once(tmp_path, shared / "run" / "mcpcreds.sock")
    assert result.returncode == 1
    assert f"inside {shared}, which others can write to (mode 0777, no sticky bit)" in result.stderr
    public = folder(arena / "public", 0o1777)  # like /tmp
    socket_path = public / "run" / "mcpcreds.sock"
    proc = SidecarProcess(sidecar_config(tmp_path, socket_path), socket_path)
    try:
        proc.wait_for("ready")
    finally:
        assert proc.stop() == 0


def test_serve_refuses_to_run_as_another_uid_than_sidecar_uid(tmp_path: Path) -> None:
    result = serve_once(tmp_path, tmp_path / "run" / "mcpcreds.sock", f"sidecar_uid = {NOBODY}")
    assert result.returncode == 1
    assert f"sidecar.sidecar_uid is {NOBODY}, but this sidecar runs as uid 0" in result.stderr


def test_sigterm_exits_although_a_worker_thread_hangs(tmp_path: Path) -> None:
    """A keyring call that never returns (tests.hanging_keyring: 30 s) holds a pool thread; the
    request gets its 503 after keyring_timeout, and SIGTERM must still end the process at once."""
    socket_path = tmp_path / "run" / "mcpcreds.sock"
    config = tmp_path / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket_path}"
[secrets]
sources = ["keyring"]
keyring_backend = "tests.hanging_keyring.HangingKeyring"
keyring_timeout = "0.2s"
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:DOCS_KEY}}}}" }}
""")
    proc = SidecarProcess(config, socket_path)
    try:
        proc.wait_for("ready")
        with Client(socket_path) as client, pytest.raises(SecretUnavailable):
            client.headers("docs")
        proc.signal(signal.SIGTERM)
        # the hung call ends 30 s after it began; draining has nothing to wait for
        assert proc.proc.wait(timeout=15) == 0
        proc.wait_for("stopped")
    finally:
        proc.stop()


# ---------------------------------------------------------------------------- malformed answers


class FakeSidecar:
    """Answers every request on `path` with one canned HTTP answer (as our own uid, in a 0700 folder)."""

    def __init__(self, path: Path, status: int, body: bytes) -> None:
        path.parent.mkdir(mode=0o700)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(16)
        self.answer = (b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nConnection: close\r\n"
                       b"Content-Length: %d\r\n\r\n" % (status, len(body)) + body)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self.answer)

    def close(self) -> None:
        self.server.close()


MALFORMED = {
    "not JSON": (200, b"<html>hello</html>"),
    "a list": (200, b"[1, 2]"),
    "wrong types": (200, json.dumps({
        "headers": ["x"], "granted": "1", "waited": None, "renewed": "r", "stored_in": 1, "id": 5,
        "grant": None, "servers": [{"name": 1, "key": 2, "auth": 3}], "logins": "x",
        "buckets": [{"key": "k", "level": "high", "capacity": 1}]}).encode()),
    "missing fields": (200, b'{"servers": [{}], "buckets": [{}]}'),
    "nested too deep": (200, b"[" * 200_000),
    "a time out of range": (200, json.dumps({
        "servers": [], "buckets": [{"key": "k", "level": 1.0, "capacity": 1, "paused_until": 1e300}],
        "headers": {"X": 1}}).encode()),
    "an error with a bad retry_after": (429, b'{"error": {"code": "rate_limited", "message": "m", '
                                             b'"retry_after": "soon"}}'),
}
COMMANDS = {
    "headers": ["headers", "docs"],
    "token": ["token", "docs"],
    "acquire": ["acquire", "docs", "--max-wait", "0"],
    "status": ["status"],
    "spawn-payload --grant": ["spawn-payload", "docs", "--grant"],
    "secret rotate": ["secret", "rotate", "DOCS_KEY"],
}


@pytest.mark.parametrize("answer", MALFORMED)
def test_the_cli_reports_a_malformed_answer_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        answer: str) -> None:
    path = tmp_path / "run" / "s.sock"
    fake = FakeSidecar(path, *MALFORMED[answer])
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # `status` prints its tables
    try:
        for name, args in COMMANDS.items():
            monkeypatch.setattr(sys, "stdin", io.StringIO("new-value\n"))
            code = main([*args, "--socket", str(path)])
            err = capsys.readouterr().err
            assert code != 0, f"{name}: {err}"
            assert err.startswith("mcpcreds: ") and len(err.splitlines()) == 1, f"{name}: {err}"
    finally:
        fake.close()


def test_a_malformed_answer_is_an_error_of_the_library_too(tmp_path: Path) -> None:
    path = tmp_path / "run" / "s.sock"
    fake = FakeSidecar(path, 200, b'{"headers": {"X": null}}')
    try:
        with Client(path) as client, pytest.raises(MalformedAnswer) as caught:
            client.headers("docs")
        assert "header value that is not a string" in str(caught.value)
    finally:
        fake.close()
