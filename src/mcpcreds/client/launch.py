"""What a client does to have a sidecar at all: find the user's state folder, take a lock file
there, fill in the session bus a reduced environment lacks, and start `mcpcreds serve` detached
when none answers on the socket.

MCP desktop clients start their stdio servers at once (three of them may launch
`mcpcreds stdio URL` in the same second), with a reduced environment (no $XDG_RUNTIME_DIR, no
$DBUS_SESSION_BUS_ADDRESS). So every step that must happen once (the config entry, the sidecar's
start, a person's login) is done under a lock file (`flock`), and re-checked once the lock is
held; a lock dies with its holder, so a crashed launch never blocks the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Final

from ..core.socket_check import UntrustedSidecar, runtime_folder
from ..errors import McpcredsError, SidecarUnavailable
from .client import Client

START_TIMEOUT: Final = 10.0  # a started sidecar answers within this, or the start failed
LOCK_STEP: Final = 0.01  # the first wait for a lock; doubled up to LOCK_STEP_MAX
LOCK_STEP_MAX: Final = 0.2
READY_STEP_MAX: Final = 0.05  # a started sidecar is asked this often at most (one health call each)
LOG_NAME: Final = "sidecar.log"
LOG_KEPT: Final = 8 * 1024 * 1024  # past this, a start moves the log to `sidecar.log.1` (one kept)
GRANT_ENV: Final = "MCPCREDS_GRANT"  # a grant is the caller's, never the sidecar's

Sleep = Callable[[float], None]
Clock = Callable[[], float]


class Busy(McpcredsError):
    """Another mcpcreds process held a lock for longer than this one waits."""

    code = "busy"


def state_folder(environ: MutableMapping[str, str] | None = None) -> Path:
    """$XDG_STATE_HOME/mcpcreds (~/.local/state/mcpcreds): lock files and the log of a sidecar
    started on demand; created 0700."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative path is to be ignored
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    folder = Path(base) / "mcpcreds"
    old = os.umask(0o077)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    finally:
        os.umask(old)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise SidecarUnavailable(f"the state folder {folder} is not a folder of this user's that only "
                                 "it can write to; fix it or set $XDG_STATE_HOME")
    return folder


@contextlib.contextmanager
def file_lock(path: Path, timeout: float, what: str, sleep: Sleep = time.sleep,
              clock: Clock = time.monotonic) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created 0600), waiting at most `timeout` seconds for
    another process to let it go (`Busy` past that). Closing the descriptor releases it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = clock() + timeout
        step = LOCK_STEP
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - clock()
                if left <= 0:
                    raise Busy(f"{what}: another mcpcreds process has held {path} for over "
                               f"{timeout:g}s") from None
                sleep(min(step, left))
                step = min(step * 2, LOCK_STEP_MAX)
        yield
    finally:
        os.close(fd)


def fill_session_bus(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set $DBUS_SESSION_BUS_ADDRESS to the user's bus in the runtime folder when it is unset (a
    client started with a reduced environment), as libdbus and sd-bus find it: the keyring
    (SecretService) is reached over it, by this process and by a sidecar it starts. True if set."""
    environ = os.environ if environ is None else environ
    if environ.get("DBUS_SESSION_BUS_ADDRESS"):
        return False
    folder = runtime_folder(environ)
    if folder is None:
        return False
    bus = os.path.join(folder, "bus")
    try:
        info = os.lstat(bus)
    except OSError:
        return False
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        return False
    environ["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={bus}"
    return True


def sidecar_answers(socket: str, sidecar_uid: int | None) -> bool:
    """Whether a sidecar answers `GET /v1/health` on `socket` now (no retry). A socket that is not
    the sidecar's raises `UntrustedSidecar`: never start one beside it."""
    try:
        with Client(socket, sidecar_uid=sidecar_uid, connect_retry=0, timeout=5.0) as client:
            client.health()
    except UntrustedSidecar:
        raise
    except SidecarUnavailable:
        return False
    return True


def rotate_log(path: Path, kept: int = LOG_KEPT) -> None:
    """A log past `kept` bytes becomes `NAME.1` (the one before it dropped): a sidecar started
    at every login of a desktop never fills the disk with its log."""
    try:
        if path.lstat().st_size > kept:
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass


def start_sidecar(config: Path, socket: str, sidecar_uid: int | None, state: Path,
                  timeout: float = START_TIMEOUT, sleep: Sleep = time.sleep,
                  clock: Clock = time.monotonic) -> int | None:
    """Start `mcpcreds serve --config CONFIG` detached (a session of its own, stdin and stdout on
    /dev/null, stderr appended to `sidecar.log` in `state`) unless a sidecar answers on `socket`,
    and wait until it answers. Under the state folder's sidecar lock, so launches at once start one.
    Returns the pid started, None when one was running."""
    if sidecar_answers(socket, sidecar_uid):
        return None
    with file_lock(state / "sidecar.lock", timeout + 5.0, "starting the sidecar", sleep, clock):
        if sidecar_answers(socket, sidecar_uid):  # another launch started it while we waited
            return None
        log_path = state / LOG_NAME
        rotate_log(log_path)
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            env = {k: v for k, v in os.environ.items() if k != GRANT_ENV}
            proc = subprocess.Popen([sys.executable, "-m", "mcpcreds", "serve", "--config", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                    start_new_session=True, close_fds=True, cwd="/", env=env)
        finally:
            os.close(log)
        deadline = clock() + timeout
        step = LOCK_STEP
        while not sidecar_answers(socket, sidecar_uid):
            if proc.poll() is not None:
                raise SidecarUnavailable(f"the sidecar started for {socket} exited (status "
                                         f"{proc.returncode}): its log is {log_path}")
            left = deadline - clock()
            if left <= 0:
                raise SidecarUnavailable(f"the sidecar started for {socket} did not answer within "
                                         f"{timeout:g}s: its log is {log_path}")
            sleep(min(step, left))
            step = min(step * 2, READY_STEP_MAX)
        return proc.pid
