"""The sidecar process: socket set-up, the serve loop, signals (SIGTERM drains, SIGHUP reloads)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import socket
import stat
import sys
from pathlib import Path
from typing import Final, NoReturn

from ..broker.broker import Broker
from ..config.load import default_socket_path, load_config
from ..config.model import Config, is_aws
from ..core.audit import AuditLog
from ..core.clock import SYSTEM_CLOCK, Clock
from ..core.logs import get_logger
from ..core.metrics import Metrics
from ..core.version import installed_version
from ..credentials.sources import SecretResolver
from ..errors import ConfigError, McpcredsError
from ..telemetry import switch as traces
from .activation import listen_fds, take_sockets
from .api import Api
from .peer_ns import set_undumpable
from .sdnotify import Notifier, keepalive, status_text
from .tcp_listener import start_listener
from .wire import Acceptor, Connections, HttpConnection, bind_unix_socket, loop_kind, serve_socket

_log = get_logger("sidecar")
GC_YOUNG: Final = 10_000  # objects allocated between two young collections (after `settle_gc`)
OPEN_FILES: Final = 65_536  # the soft limit on descriptors the sidecar raises itself to (hard permitting)


class SocketInUse(McpcredsError):
    code = "socket_in_use"


class UnsafeSocketPath(McpcredsError):
    code = "unsafe_socket_path"


def prepare_socket_dir(path: Path) -> None:
    """Create the socket's folder 0700, or check the existing one, never following a symlink: a
    folder planted by someone else (e.g. at the predictable /tmp/mcpcreds-$UID) is refused, and so
    is a parent that others could swap the folder in."""
    folder = path.parent
    uid = os.getuid()
    old = os.umask(0o077)
    try:
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    finally:
        os.umask(old)
    parent = folder.parent.stat()
    if parent.st_uid not in (0, uid):
        raise UnsafeSocketPath(f"socket folder {folder} is inside {folder.parent}, which belongs to uid "
                               f"{parent.st_uid}; move the socket (sidecar.socket)")
    if parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX:
        raise UnsafeSocketPath(f"socket folder {folder} is inside {folder.parent}, which others can write "
                               f"to (mode {stat.S_IMODE(parent.st_mode):04o}, no sticky bit); "
                               "move the socket (sidecar.socket)")
    info = folder.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeSocketPath(f"socket folder {folder} is a symlink; refusing it (remove it, or set "
                               "sidecar.socket to a folder of your own)")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeSocketPath(f"socket folder {folder} is not a folder")
    if info.st_uid != uid:
        raise UnsafeSocketPath(f"socket folder {folder} belongs to uid {info.st_uid}, not to us (uid {uid})")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise UnsafeSocketPath(
            f"socket folder {folder} has mode {stat.S_IMODE(info.st_mode):04o}; it must be 0700 "
            f"(chmod 700 {folder})"
        )


def check_sidecar_uid(config: Config) -> None:
    """Clients refuse a sidecar that does not run as sidecar.sidecar_uid: say so at start."""
    expected = config.sidecar.sidecar_uid
    if expected is not None and expected != os.getuid():
        raise UnsafeSocketPath(f"sidecar.sidecar_uid is {expected}, but this sidecar runs as uid "
                               f"{os.getuid()}: every client would refuse it")


def claim_socket_path(path: Path) -> None:
    """Remove a stale socket left by a dead sidecar; refuse to steal a live one's."""
    if not path.exists() and not path.is_symlink():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        _log.info("removed stale socket", extra={"socket": str(path)})
        return
    except OSError:
        pass
    finally:
        probe.close()
    raise SocketInUse(f"another sidecar is already listening on {path}")


class Sidecar:
    def __init__(self, config: Config, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.metrics = Metrics()
        self.audit = AuditLog(config.sidecar.audit_log, clock)
        self.broker = Broker(config, SecretResolver.from_config(config.secrets), clock, self.metrics,
                             audit=self.audit)
        self.api = Api(self.broker, self.metrics, self.audit, reloader=self._reload_asked)
        self.connections = Connections(config.sidecar.request_timeout, config.sidecar.idle_timeout,
                                       clock=clock)
        self.socket_path = default_socket_path(config.sidecar.socket)
        self._allow_uids = self._uids(config)
        self._listen = config.gateway  # the TCP listener's config, fixed at start
        self._stop = asyncio.Event()
        self.notify = Notifier()  # sd_notify READY/RELOADING/STOPPING/STATUS/WATCHDOG; no-op without systemd

    @staticmethod
    def _uids(config: Config) -> frozenset[int]:
        return frozenset(config.sidecar.allow_uids or (os.getuid(),))

    def allow_uids(self) -> frozenset[int]:
        return self._allow_uids

    def reload(self) -> list[str]:
        """Re-read the config; keep the old one if the new one is invalid. Returns its errors
        ([] when it was taken)."""
        try:
            config = load_config(self.config.path)
        except ConfigError as exc:
            _log.error("reload rejected: config invalid; keeping the old one",
                       extra={"errors": exc.errors})
            self.audit.write("reload", outcome="rejected", errors=exc.errors)
            return exc.errors or ["the config could not be read"]
        if default_socket_path(config.sidecar.socket) != self.socket_path:
            _log.warning("sidecar.socket changed: takes effect at the next restart")
        if config.sidecar.state != self.config.sidecar.state:
            _log.warning("sidecar.state changed: takes effect at the next restart")
        if config.gateway != self._listen:
            _log.warning("gateway.listen changed: takes effect at the next restart")
        if config.telemetry != self.config.telemetry:
            _log.warning("telemetry changed: takes effect at the next restart")
        self.broker.reload(config, SecretResolver.from_config(config.secrets))
        self.api.reload()
        if config.sidecar.audit_log != self.audit.path:
            self.audit.close()
            self.audit = self.api.audit = self.broker.audit = AuditLog(config.sidecar.audit_log, self.clock)
        self.audit.write("reload", outcome="ok", servers=len(config.servers))
        self.connections.request_timeout = config.sidecar.request_timeout
        self.connections.idle_timeout = config.sidecar.idle_timeout
        self.config = config
        self._allow_uids = self._uids(config)
        for conn in list(self.connections.open):  # a uid no longer allowed loses its connections
            if conn.peer_uid not in self._allow_uids and conn.transport is not None:
                conn.transport.close()
        _log.info("config reloaded", extra={"servers": len(config.servers)})
        return []

    def _sighup(self) -> None:
        self._reload_asked()

    def _reload_asked(self) -> list[str]:
        """A reload by SIGHUP or `POST /v1/reload`, told to systemd as one."""
        self.notify.reloading()
        try:
            return self.reload()
        finally:
            self.notify.ready()

    async def _status(self) -> str:
        try:  # shared buckets live in Redis: a STATUS= line must never stop the sidecar serving
            buckets = await asyncio.wait_for(self.broker.buckets(), 2.0)
        except (McpcredsError, OSError, TimeoutError):
            buckets = []
        return status_text(len(self.config.servers) + len(self.config.services), self.broker.logins.status(),
                           buckets)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        set_undumpable()  # an exec child (our uid, maybe) cannot read our memory or environment
        open_files = raise_open_files_limit()
        check_sidecar_uid(self.config)
        traces.start(self.config.telemetry)  # off: nothing of OpenTelemetry is imported
        prepare_socket_dir(self.socket_path)
        self.api.start()  # AAuth: the agent key loaded (or created); a refused key file fails the start
        activated, activated_tcp = take_sockets(listen_fds(), self.socket_path,  # systemd's, never unlinked
                                                self._listen.host, self._listen.port)
        if activated is None:
            claim_socket_path(self.socket_path)
        servers: list[asyncio.Server | Acceptor] = []
        listening: dict[str, str] = {}
        if self._listen.host is not None:  # first: a port taken fails the start before the socket exists
            tcp, listening["gateway_listen"] = await start_listener(self._listen, self.api, self.allow_uids,
                                                                    self.connections, activated_tcp)
            servers.append(tcp)
        try:
            sock = activated or bind_unix_socket(str(self.socket_path))
            bound = None if activated else os.stat(self.socket_path)  # unlinked at stop only if still ours
            def factory() -> HttpConnection:
                return HttpConnection(self.api, self.allow_uids, self.connections)

            servers.append(await serve_socket(sock, factory))
        except BaseException:
            for server in servers:
                server.close()
            raise
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._sighup)
        sweeper = asyncio.create_task(self._sweep())
        await self.broker.start()
        for warning in self.config.warnings:
            _log.warning(warning)
        _log.info("ready", extra={"socket": str(self.socket_path), "pid": os.getpid(),
                                  "servers": len(self.config.servers), "event_loop": loop_kind(loop),
                                  "open_files": open_files,
                                  **listening,
                                  **({"activated": "systemd"} if activated else {})})
        self.notify.ready(await self._status() if self.notify.enabled else "")
        warming = loop.run_in_executor(None, warm_up, self.config)  # off the loop: no call waits for it
        warming.add_done_callback(settle_gc)
        notifier = asyncio.create_task(keepalive(self.notify, self._status)) if self.notify.enabled else None
        try:
            await self._stop.wait()
        finally:
            _log.info("stopping: draining requests")
            self.notify.stopping()
            if notifier is not None:
                notifier.cancel()
            for server in servers:
                server.close()
            await self._drain()
            sweeper.cancel()
            for conn in list(self.connections.open):
                if conn.transport is not None:
                    conn.transport.close()
            self.api.close()  # egress.sock: its connections end, the socket is unlinked
            with contextlib.suppress(FileNotFoundError):
                if bound is not None and os.path.samestat(bound, self.socket_path.lstat()):
                    self.socket_path.unlink()
            await self.broker.aclose()
            self.audit.close()
            if traces.tracer is not None:  # the spans still queued go out (the exporter's timeout bounds it)
                await asyncio.to_thread(traces.stop)
            _log.info("stopped")

    async def _drain(self) -> None:
        deadline = self.clock.monotonic() + self.config.sidecar.drain_timeout
        while self.connections.busy() and self.clock.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def _sweep(self) -> None:
        interval = min(1.0, self.connections.request_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            self.connections.sweep(self.clock.monotonic())


def warm_up(config: Config) -> None:
    """What the first request of each kind would otherwise do on the event loop while a caller
    waits, done in a worker thread once the sidecar is ready, for the parts the config uses: read
    the installed version (health, status), load the CA bundle (~0.1-0.3 s), import httpx and the
    gateway (~0.2 s), the SigV4 signer, authlib and httpcore's backends (oauth.prepare). Imports
    and cached values only: safe off the loop, and a sidecar that serves static headers alone is
    ready without waiting for any of it."""
    installed_version()
    targets = config.targets_by_key.values()
    relayed = any(t.gateway.serves_proxy for t in config.servers.values())
    logins = any(t.login is not None for t in targets)
    signed = any(is_aws(t) for t in targets)
    if not (relayed or logins or signed or any(t.aauth for t in targets)):
        return
    from ..net import egress_http  # noqa: F401  (httpx)
    from ..net.egress import shared_ssl_context

    shared_ssl_context()
    if relayed:
        from ..gateway import relay  # noqa: F401
        from ..net import upstream  # noqa: F401
    if signed:
        from ..signers import sigv4  # noqa: F401
    if logins:
        from ..credentials import oauth

        oauth.prepare()


def raise_open_files_limit() -> int:
    """The soft limit on open descriptors raised towards the hard one (at most OPEN_FILES): each
    gateway stream holds two (the client's connection and the server's), and at the usual soft
    limit of 1,024 new connections were dropped without a word from ~500 open streams on. The
    soft limit in force is returned; a limit already higher is left as it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def settle_gc(_: object = None) -> None:
    """Once started (and warmed up): what exists now lives as long as the sidecar, so it is frozen
    (never scanned again), and young collections come less often than every 700 objects (a relayed
    call makes a few hundred)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 20, 20)


def serve(config_path: str | None) -> int:
    gc.disable()  # what is made now lives as long as the sidecar: collecting meanwhile finds nothing
    try:  # and costs ~10 % of a large config's start
        config = load_config(config_path)
        sidecar = Sidecar(config)
    finally:
        gc.enable()
    loop = new_loop(config.sidecar.event_loop)
    try:
        loop.run_until_complete(sidecar.run())
    finally:
        # what asyncio.run does, bounded, and without waiting for the default executor's threads
        if tasks := asyncio.all_tasks(loop):
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
        loop.close()
    _exit_now(0)


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    """The serve loop: uvloop's by default, which does a relayed call's reads, writes, timers and
    wake-ups in C (about a tenth of the sidecar's instructions per call, bench/RESULTS.md);
    asyncio's when the config asks for it, or when uvloop cannot be imported (a platform without
    its wheel), with a warning."""
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            _log.warning("uvloop is not installed: the sidecar runs on asyncio's event loop")
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _exit_now(code: int) -> NoReturn:
    """Exit without joining worker threads: the interpreter joins every pool thread at exit, and one
    hung in a keyring call or a blocking read would keep a stopped sidecar alive forever. Everything
    is closed and drained by now; only the logs need flushing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
