"""Socket activation: systemd-socket-activate (systemd's own tool) binds the socket and starts
`serve` on the first connection; serve takes that socket, answers, and never unlinks it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mcpcreds.sidecar.activation import ActivationRefused, PassedFd, take_unix_socket

ACTIVATE = shutil.which("systemd-socket-activate")
pytestmark = pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate (Debian: systemd) missing")
CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:DOCS_KEY}}}}" }}
"""
TIMEOUT = 20.0


@contextmanager
def activate(tmp_path: Path, listen: Path, configured: Path, *flags: str,
             extra: str = "") -> Iterator[subprocess.Popen[str]]:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(socket=configured) + extra)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "DOCS_KEY": "activation-test-key",
           "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [str(ACTIVATE), *flags, "-l", str(listen), "--fdname=mcpcreds", "-E", "DOCS_KEY", "-E", "PYTHONPATH",
         sys.executable, "-m", "mcpcreds.cli.main", "serve", "--config", str(config)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        listening = 0
        for line in proc.stderr:  # systemd-socket-activate says when it listens (no polling)
            listening += line.startswith("Listening on")
            if listening == sum(1 for f in flags if f == "-l") + 1:
                break
        else:
            raise AssertionError(f"systemd-socket-activate exited ({proc.wait()})")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(TIMEOUT)


def wait_for(proc: subprocess.Popen[str], event: str) -> dict[str, object]:
    assert proc.stderr is not None
    for line in proc.stderr:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event:
            return dict(entry)
    raise AssertionError(f"serve exited ({proc.wait(TIMEOUT)}) before {event!r}")


def get(path: Path, route: str) -> tuple[str, dict[str, object]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(TIMEOUT)
        client.connect(str(path))  # the first connection starts serve
        client.sendall(f"GET {route} HTTP/1.1\r\nHost: mcpcreds\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := client.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode(), json.loads(body)


def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    return folder


def test_serve_takes_the_activated_socket_and_leaves_it(tmp_path: Path) -> None:
    path = run_dir(tmp_path) / "mcpcreds.sock"
    with activate(tmp_path, path, path) as proc:
        before = path.lstat()
        status, body = get(path, "/v1/servers")  # queued in systemd's socket until serve accepts it
        assert status == "HTTP/1.1 200 OK"
        assert "docs" in json.dumps(body)
        ready = wait_for(proc, "ready")
        assert ready["activated"] == "systemd"
        assert ready["pid"] == proc.pid  # exec'ed by systemd-socket-activate: LISTEN_PID is ours
        assert get(path, "/v1/health")[0] == "HTTP/1.1 200 OK"
        proc.send_signal(signal.SIGTERM)
        wait_for(proc, "stopped")
        assert proc.wait(TIMEOUT) == 0
    after = path.lstat()  # the socket unit's file: neither replaced at start nor unlinked at stop
    assert (after.st_ino, after.st_dev) == (before.st_ino, before.st_dev)


def test_a_socket_bound_elsewhere_is_refused(tmp_path: Path) -> None:
    folder = run_dir(tmp_path)
    listen, configured = folder / "other.sock", folder / "mcpcreds.sock"
    with activate(tmp_path, listen, configured) as proc:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(listen))
            assert proc.wait(TIMEOUT) != 0
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert f"bound to {listen}, but sidecar.socket is {configured}" in err
    assert listen.exists() and not configured.exists()  # nothing bound or unlinked


def test_a_datagram_socket_is_refused(tmp_path: Path) -> None:
    path = run_dir(tmp_path) / "mcpcreds.sock"
    with activate(tmp_path, path, path, "--datagram") as proc:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
            client.sendto(b"x", str(path))
            assert proc.wait(TIMEOUT) != 0
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert "a Unix datagram socket; mcpcreds serve needs a Unix stream socket" in err
    assert path.exists()


def test_a_connected_or_non_socket_fd_is_refused(tmp_path: Path) -> None:
    left, right = socket.socketpair()
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(ActivationRefused, match="not a listening one; set Accept=no"):
            take_unix_socket([PassedFd(os.dup(left.fileno()), "mcpcreds")], tmp_path / "s")
        with pytest.raises(ActivationRefused, match="which is not a socket"):
            take_unix_socket([PassedFd(os.dup(read_end), "mcpcreds")], tmp_path / "s")
        assert take_unix_socket([], tmp_path / "s") is None
    finally:
        left.close()
        right.close()
        os.close(read_end)
        os.close(write_end)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_gateway_tcp_socket_is_taken_too(tmp_path: Path) -> None:
    path = run_dir(tmp_path) / "mcpcreds.sock"
    port = free_port()
    with activate(tmp_path, path, path, "-l", f"127.0.0.1:{port}",
                  extra=f'[gateway]\nlisten = "127.0.0.1:{port}"\n') as proc:
        assert get(path, "/v1/health")[0] == "HTTP/1.1 200 OK"
        ready = wait_for(proc, "ready")
        assert ready["gateway_listen"] == f"127.0.0.1:{port}" and ready["activated"] == "systemd"
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as client:
            client.sendall(f"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           "Connection: close\r\n\r\n".encode())
            assert client.recv(65536).startswith(b"HTTP/1.1 200 OK")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0
    # a TCP socket the config does not listen on is refused, not served silently
    with activate(tmp_path, path, path, "-l", f"127.0.0.1:{port}") as proc:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
            assert proc.wait(TIMEOUT) != 0
        assert proc.stderr is not None
        assert "but gateway.listen is off" in proc.stderr.read()
