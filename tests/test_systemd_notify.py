"""sd_notify: a real `serve` tells a test NOTIFY_SOCKET READY=1, RELOADING=1, READY=1, STOPPING=1."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpcreds.sidecar.sdnotify import Notifier, status_text
from tests.sidecar_proc import SidecarProcess

CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:DOCS_KEY}}}}" }}
rate = "60/1m"
"""
TIMEOUT = 20.0


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket in the abstract namespace, as systemd's own NOTIFY_SOCKET is."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"mcpcreds-test-notify-{os.getpid()}-{time.monotonic_ns()}"
    sock.bind("\0" + name)
    sock.settimeout(TIMEOUT)
    yield sock, "@" + name
    sock.close()


def receive(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


def next_state(sock: socket.socket) -> dict[str, str]:
    """The next message that changes state (STATUS= or WATCHDOG= alone are skipped)."""
    while True:
        msg = receive(sock)
        if msg.keys() & {"READY", "RELOADING", "STOPPING"}:
            return msg


def start(tmp_path: Path, env: dict[str, str]) -> SidecarProcess:
    config = tmp_path / "config.toml"
    sock = tmp_path / "run" / "mcpcreds.sock"
    config.write_text(CONFIG.format(socket=sock))
    return SidecarProcess(config, sock, {"DOCS_KEY": "not-a-secret-here", **env})


def test_ready_reloading_stopping_in_order(tmp_path: Path, listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    # WATCHDOG_PID is left out: systemd sets it only when it may name another process
    sidecar = start(tmp_path, {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"})
    try:
        ready = next_state(sock)
        assert ready["READY"] == "1"
        assert ready["STATUS"] == "serving 1 server; 0 logins held; 1 bucket"
        # READY=1 came once the socket answers
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(sidecar.socket))
        probe.close()
        pings = 0
        while pings < 2:  # WATCHDOG=1 at half of WATCHDOG_USEC, while serving
            pings += receive(sock).get("WATCHDOG") == "1"
        sidecar.signal(signal.SIGHUP)
        reloading = next_state(sock)
        assert reloading["RELOADING"] == "1"
        usec = int(reloading["MONOTONIC_USEC"])
        assert 0 < usec <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert next_state(sock) == {"READY": "1"}
        sidecar.signal(signal.SIGTERM)
        stopping = next_state(sock)
        assert stopping["STOPPING"] == "1"
        assert sidecar.wait() == 0
    finally:
        sidecar.stop()


def test_notifier_paths_and_watchdog_pid(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(TIMEOUT)
    try:
        env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
        notifier = Notifier(env)
        assert env == {}  # taken out of the environment: a child never notifies in our name
        assert notifier.watchdog_interval == 2.0
        assert notifier.status("a  b\nc")
        assert not notifier.status("a b c")  # unchanged: not sent again
        assert notifier.stopping()
        assert receive(sock) == {"STATUS": "a b c"}
        assert receive(sock)["STOPPING"] == "1"
        notifier.close()
    finally:
        sock.close()
    other = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval is None  # meant for another process
    assert Notifier({}).enabled is False and not Notifier({}).ready()
    assert Notifier({"NOTIFY_SOCKET": "relative"}).enabled is False
    # no receiver: never raises, reports the failure
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}).ready()


def test_status_text_counts_only() -> None:
    logins = [{"key": "mcp:a", "state": "valid", "fingerprint": "f1", "last_error": None},
              {"key": "mcp:b", "state": "failing", "fingerprint": None, "last_error": "invalid_client"}]
    buckets = [{"key": "mcp:a", "waiting": 2, "paused_until": None},
               {"key": "mcp:b", "waiting": 0, "paused_until": 1.0}]
    text = status_text(3, logins, buckets)
    assert text == "serving 3 servers; 1 login held (1 failing); 2 buckets (2 waiting, 1 paused)"
    assert "mcp:" not in text
