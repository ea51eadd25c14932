"""Shared fixtures: temp configs, the CLI, a real SecretService keyring in a private D-Bus."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import secretstorage
import uvloop
from jeepney.bus_messages import MatchRule, message_bus
from jeepney.io.blocking import open_dbus_connection

from tests.peers.mcp_server import McpServerPeer, start_mcp_server
from tests.peers.oidc_peer import OidcPeer, start_oidc_peer
from tests.peers.redis_peer import RedisPeer, start_redis


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    """Async tests run on asyncio's loop; one marked `both_loops` on uvloop's too, the sidecar's
    default (their transports differ where a protocol's timing matters: when reading starts).
    Once implemented, the hook must name a loop for every async test."""
    if item.get_closest_marker("both_loops") is None:
        return {"asyncio": asyncio.new_event_loop}
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


# The suite starts hundreds of Python processes (sidecars, the CLI, peers). With
# $PYTHONDONTWRITEBYTECODE set (this sandbox sets it) none of them writes the bytecode it compiles,
# so every one compiled the package and the test peers again (up to ~0.5 s of CPU each on 2 cores).
# They write it as an installed package has it: __pycache__ is in .gitignore.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With $MCPCREDS_NO_SKIP set (CI sets it), a skipped test fails: CI installs every
    dependency, so a skip there means a missing one went unnoticed."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("MCPCREDS_NO_SKIP") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, and $MCPCREDS_NO_SKIP forbids skips: {report.longrepr}"


CANARY = "CANARY-7f3a9c2e-do-not-leak"
SECRET_SERVICE = "org.freedesktop.secrets"
KEYRING_READY_TIMEOUT = 60.0  # generous: a bound only a daemon that never comes up crosses


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
        [sys.executable, "-m", "mcpcreds.cli.main", *args],
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


# The private session bus activates nothing: with the system's service files, a call made while
# no daemon owns the SecretService name (the test daemon gone) started a second daemon, which
# never got the password, and every later test failed with KeyringLocked.
_BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:tmpdir={runtime}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
  <!-- a session bus's limits (Debian's session.conf), not the low built-in ones a config without
       them gets: a test bus is to behave as a user's session bus does -->
  <limit name="auth_timeout">240000</limit>
  <limit name="pending_fd_timeout">150000</limit>
  <limit name="max_completed_connections">100000</limit>
  <limit name="max_incomplete_connections">10000</limit>
  <limit name="max_connections_per_user">100000</limit>
  <limit name="max_replies_per_connection">50000</limit>
  <limit name="max_match_rules_per_connection">50000</limit>
</busconfig>
"""


def _start_daemon(env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """gnome-keyring-daemon unlocked with the test password, its login keyring in env's HOME (so a
    daemon started again there opens the same entries), its stderr appended to `log`."""
    # in the foreground, so its pid is known and it is stopped with the session (--daemonize
    # prints no pid for the secrets component alone, and left a daemon behind every run)
    with log.open("a") as stderr:
        daemon = subprocess.Popen(
            ["gnome-keyring-daemon", "--unlock", "--components=secrets", "--foreground"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=env,
        )
    try:
        assert daemon.stdin is not None
        daemon.stdin.write("test-password")  # --unlock reads the password up to end of input
        daemon.stdin.close()
        _wait_until_secret_service_is_ready(env["DBUS_SESSION_BUS_ADDRESS"], daemon)
    except BaseException:
        _stop(daemon)
        raise
    return daemon


def _stop(daemon: subprocess.Popen[str]) -> None:
    daemon.terminate()
    try:
        daemon.wait(10)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait(10)


def _start_keyring_session(workdir: Path) -> tuple[KeyringSession, Callable[[], None], Callable[[], bool]]:
    """Start a private session bus and gnome-keyring-daemon (unlocked with a test password) on it;
    return the session once the keyring is ready, the function that stops both, and the one that
    starts the daemon again if it has gone (True if it had)."""
    missing = [b for b in ("dbus-daemon", "gnome-keyring-daemon") if shutil.which(b) is None]
    if missing:
        raise RuntimeError(f"missing {missing}: run .ci/run (apt-get install dbus gnome-keyring)")
    home = workdir / "home"
    runtime = workdir / "run"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    (workdir / "bus.conf").write_text(_BUS_CONFIG.format(runtime=runtime))
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    out = subprocess.run(
        ["dbus-daemon", f"--config-file={workdir / 'bus.conf'}", "--fork", "--print-address=1", "--print-pid=1"],
        capture_output=True, text=True, env=env, check=True, timeout=20,
    ).stdout.split()
    address, dbus_pid = out[0], int(out[1])
    env["DBUS_SESSION_BUS_ADDRESS"] = address
    log = workdir / "gnome-keyring.log"
    daemons = [_start_daemon(env, log)]

    def stop() -> None:
        _stop(daemons[-1])
        with contextlib.suppress(ProcessLookupError):
            os.kill(dbus_pid, signal.SIGTERM)

    def revive() -> bool:
        if daemons[-1].poll() is None:
            return False
        sys.stderr.write(f"\ngnome-keyring-daemon exited ({daemons[-1].returncode}); started again. Its log:\n"
                         f"{log.read_text(errors='replace')[-2000:]}\n")
        daemons.append(_start_daemon(env, log))
        return True

    return KeyringSession(address, {"DBUS_SESSION_BUS_ADDRESS": address,
                                    "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}), stop, revive


def _wait_until_secret_service_is_ready(address: str, daemon: subprocess.Popen[str],
                                        timeout: float = KEYRING_READY_TIMEOUT) -> None:
    """Block until the daemon started with the password owns the SecretService name, and its
    default collection is unlocked.

    The daemon claims its bus name some time after it starts. A call made in that gap
    D-Bus-activates a second daemon (org.freedesktop.secrets.service), which never received the
    password: the collection it serves is locked, and the first test fails with KeyringLocked
    on a loaded machine. Waiting is on the bus's NameOwnerChanged signal, not on a clock."""
    deadline = time.monotonic() + timeout
    conn = open_dbus_connection(bus=address)
    try:
        rule = MatchRule(type="signal", sender=message_bus.bus_name, interface=message_bus.interface,
                         member="NameOwnerChanged", path=message_bus.object_path)
        rule.add_arg_condition(0, SECRET_SERVICE)
        with conn.filter(rule) as changes:
            conn.send_and_get_reply(message_bus.AddMatch(rule), timeout=timeout)
            # subscribed first, then asked: an owner that appears in between is not missed
            owned = bool(conn.send_and_get_reply(message_bus.NameHasOwner(SECRET_SERVICE), timeout=timeout).body[0])
            while not owned:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or daemon.poll() is not None:
                    raise RuntimeError(f"gnome-keyring-daemon (exit {daemon.poll()}) did not claim "
                                       f"{SECRET_SERVICE} in {timeout:g}s")
                try:
                    owned = conn.recv_until_filtered(changes, timeout=remaining).body[2] != ""
                except TimeoutError:
                    continue  # the deadline is checked above
        owner = conn.send_and_get_reply(message_bus.GetConnectionUnixProcessID(SECRET_SERVICE),
                                        timeout=timeout).body[0]
        if owner != daemon.pid:
            raise RuntimeError(f"{SECRET_SERVICE} is owned by pid {owner}, not by the daemon started "
                               f"with the password ({daemon.pid})")
        if _default_collection(conn, deadline).is_locked():
            raise RuntimeError("the keyring's default collection is locked after --unlock")
    finally:
        conn.close()


def _default_collection(conn: Any, deadline: float) -> secretstorage.Collection:
    """The default collection, once the daemon serves it. `--unlock` makes the login keyring after
    the daemon has claimed its name, and on a loaded machine the default alias named a collection
    not there yet ("Object does not exist"), which secretstorage's get_default_collection then
    tried to create, through a prompt no one answers. Waiting is on the service's
    CollectionCreated signal; a look again each second stands in for a signal that never comes."""
    rule = MatchRule(type="signal", interface="org.freedesktop.Secret.Service", member="CollectionCreated")
    with conn.filter(rule) as created:
        conn.send_and_get_reply(message_bus.AddMatch(rule), timeout=max(1.0, deadline - time.monotonic()))
        while True:  # subscribed first, then looked: a collection made in between is not missed
            try:
                return secretstorage.Collection(conn)
            except secretstorage.exceptions.ItemNotFoundException as missing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError("gnome-keyring-daemon did not serve its default collection "
                                       "in time") from missing
                with contextlib.suppress(TimeoutError):
                    conn.recv_until_filtered(created, timeout=min(remaining, 1.0))


@contextlib.contextmanager
def private_keyring(workdir: Path) -> Iterator[KeyringSession]:
    """A real gnome-keyring on a private session bus, for a script (a bench) rather than a test:
    its folders in `workdir`; stopped at the end of the block."""
    session, stop, _ = _start_keyring_session(workdir)
    try:
        yield session
    finally:
        stop()


_REVIVE: list[Callable[[], bool]] = []  # the session keyring's, while it runs


@pytest.fixture(autouse=True)
def _keyring_daemon_alive() -> None:
    """Before each test: a keyring daemon that has gone is started again, on the same bus and with
    the same stored entries, rather than failing every later test of the worker."""
    for revive in _REVIVE:
        revive()


@pytest.fixture(scope="session")
def keyring_session() -> Iterator[KeyringSession]:
    """A real gnome-keyring (SecretService) on a private D-Bus session bus."""
    workdir = Path(tempfile.mkdtemp(prefix="mcpcreds-keyring-"))
    session, stop, revive = _start_keyring_session(workdir)
    old = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = session.bus_address
    _REVIVE.append(revive)
    try:
        yield session
    finally:
        _REVIVE.remove(revive)
        if old is None:
            os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
        else:
            os.environ["DBUS_SESSION_BUS_ADDRESS"] = old
        stop()
        shutil.rmtree(workdir, ignore_errors=True)


# -- one oidc-provider for the whole run

OIDC_TTL = 3600  # the shared peer's token lifetime until a module sets its own


@pytest.fixture(scope="session")
def oidc_session(request: pytest.FixtureRequest) -> Iterator[OidcPeer]:
    """One real authorization server (oidc-provider) for every module that needs one: node takes
    a second or more to start, once per module added up to a sixth of the suite. It knows every
    client a collected test module declares in its OIDC_CLIENTS; a client id declared twice must
    be declared alike. Use it through `module_peer` (a module's token lifetime, fresh counters)."""
    clients: dict[str, dict[str, Any]] = {}
    modules = {cast(Any, item).module for item in request.session.items if getattr(item, "module", None) is not None}
    for module in sorted(modules, key=lambda m: m.__name__):
        for client in getattr(module, "OIDC_CLIENTS", ()):
            known = clients.setdefault(client["client_id"], client)
            if known != client:
                raise RuntimeError(f"{module.__name__} declares oidc client {client['client_id']!r} "
                                   "unlike another module: give it another client_id")
    with start_oidc_peer(list(clients.values()), access_token_ttl=OIDC_TTL, ready_timeout=60) as peer:
        yield peer


def module_peer(peer: OidcPeer, ttl: int) -> OidcPeer:
    """The shared peer as one module wants it: tokens live `ttl` seconds, the counters start at 0.
    (Client secrets a module changes are its own to set back: each module has its own clients.)"""
    peer.set_ttl(ttl)
    peer.reset_stats()
    return peer


@pytest.fixture(scope="session")
def mcp_server_session(oidc_session: OidcPeer) -> Iterator[McpServerPeer]:
    """One real MCP server peer (tests/peers/mcp_server.py: the MCP SDK 2.x, taking the shared
    oidc-provider's JWTs) for the modules that read its counters as differences and revoke tokens
    by their own jti: its start-up (the SDK, uvicorn) is paid once."""
    with start_mcp_server(oidc_session.issuer, oidc_session.jwks_uri) as server:
        yield server


@pytest.fixture
def redis() -> Iterator[RedisPeer]:
    """A fresh redis-server (on a Unix socket) per test: the tests stop, pause and fill it."""
    with start_redis() as r:
        yield r
