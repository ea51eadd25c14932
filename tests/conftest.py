"""Shared fixtures: temp configs, the CLI, a real SecretService keyring in a private D-Bus."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

CANARY = "CANARY-7f3a9c2e-do-not-leak"


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 30) -> CliResult:
    merged = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "mcpcreds.cli", *args],
        input=stdin if stdin is not None else "",
        capture_output=True, text=True, env=merged, timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def write_config(tmp_path: Path):  # type: ignore[no-untyped-def]
    def write(text: str, name: str = "config.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@dataclass
class KeyringSession:
    bus_address: str
    env: dict[str, str]


def _start_keyring_session(workdir: Path) -> tuple[KeyringSession, list[int]]:
    missing = [b for b in ("dbus-daemon", "gnome-keyring-daemon") if shutil.which(b) is None]
    if missing:
        raise RuntimeError(f"missing {missing}: run .ci/run (apt-get install dbus gnome-keyring)")
    home = workdir / "home"
    runtime = workdir / "run"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    out = subprocess.run(
        ["dbus-daemon", "--session", "--fork", "--print-address=1", "--print-pid=1"],
        capture_output=True, text=True, env=env, check=True, timeout=20,
    ).stdout.split()
    address, dbus_pid = out[0], int(out[1])
    env["DBUS_SESSION_BUS_ADDRESS"] = address
    daemon = subprocess.run(
        ["gnome-keyring-daemon", "--unlock", "--components=secrets", "--daemonize"],
        input="test-password", capture_output=True, text=True, env=env, check=True, timeout=20,
    )
    pids = [dbus_pid]
    for line in daemon.stdout.splitlines():
        if line.startswith("GNOME_KEYRING_PID="):
            pids.append(int(line.split("=", 1)[1]))
    return KeyringSession(address, {"DBUS_SESSION_BUS_ADDRESS": address,
                                    "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}), pids


@pytest.fixture(scope="session")
def keyring_session() -> Iterator[KeyringSession]:
    """A real gnome-keyring (SecretService) on a private D-Bus session bus."""
    workdir = Path(tempfile.mkdtemp(prefix="mcpcreds-keyring-"))
    session, pids = _start_keyring_session(workdir)
    old = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = session.bus_address
    try:
        yield session
    finally:
        if old is None:
            os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
        else:
            os.environ["DBUS_SESSION_BUS_ADDRESS"] = old
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(workdir, ignore_errors=True)
