"""What a client checks before it sends a byte: that the socket is the sidecar's.

A socket path is only a name: anyone who can write to its folder (or plant that folder, or a
symlink in its place) can put their own listener there and collect grants and secret values.
So a client refuses a folder that is a symlink, belongs to another uid or is writable by group
or others, and, once connected, a listener whose SO_PEERCRED uid is not the sidecar's.
Checked once per new connection: one lstat and one getsockopt.
"""

from __future__ import annotations

# _socket, the C module under `socket`: `socket` itself (its enums) costs each command ~1 ms
import _socket
import os
import stat
import sys
from _socket import SOL_SOCKET

from ..errors import ConfigError, SidecarUnavailable

TYPE_CHECKING = False  # not `typing`'s: importing typing costs each CLI command ~2 ms
if TYPE_CHECKING:
    from _socket import socket
    from asyncio.trsock import TransportSocket  # importing asyncio costs a CLI command tens of ms
    from collections.abc import Mapping  # at run time, with `collections`: ~1 ms
    from typing import Final

UID_ENV: Final = "MCPCREDS_SIDECAR_UID"
_PEERCRED_SIZE: Final = 12  # struct ucred: pid, uid and gid, three C ints
_HINT: Final = ("if the sidecar runs as another user, set sidecar.sidecar_uid in the config or "
                f"{UID_ENV}")


class UntrustedSidecar(SidecarUnavailable):
    """The socket, its folder or the process behind it is not the sidecar's; nothing was sent."""


def expected_sidecar_uid(configured: int | None = None) -> int:
    """The uid the sidecar must run as: `configured`, else $MCPCREDS_SIDECAR_UID, else ours."""
    if configured is not None:
        return configured
    raw = os.environ.get(UID_ENV, "").strip()
    if not raw:
        return os.getuid()
    if not (raw.isascii() and raw.isdigit()) or int(raw) > 0xFFFFFFFE:
        raise ConfigError([f"{UID_ENV}: must be a uid (a whole number from 0)"])
    return int(raw)


def check_folder(socket_path: str, uid: int) -> None:
    """Refuse a socket whose folder others could have planted or can write to. A missing folder
    raises FileNotFoundError (no sidecar yet)."""
    folder = os.path.dirname(socket_path) or "."
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        reason = "is a symlink"
    elif not stat.S_ISDIR(info.st_mode):
        reason = "is not a folder"
    elif info.st_uid != uid:
        reason = f"belongs to uid {info.st_uid}, not to the sidecar's uid {uid} ({_HINT})"
    elif info.st_mode & 0o022:
        reason = f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    else:
        return
    raise UntrustedSidecar(f"refusing the socket {socket_path}: its folder {folder} {reason}; "
                           "nothing was sent")


def check_peer(sock: socket | TransportSocket, socket_path: str, uid: int) -> None:
    """Refuse a connected socket whose listener does not run as `uid` (from the kernel)."""
    peercred = getattr(_socket, "SO_PEERCRED", None)  # Linux; elsewhere refused at use, not at import
    if peercred is None:
        raise UntrustedSidecar(f"refusing the socket {socket_path}: this platform cannot tell who listens "
                               "on it (no SO_PEERCRED); nothing was sent")
    peer_uid = int.from_bytes(sock.getsockopt(SOL_SOCKET, peercred, _PEERCRED_SIZE)[4:8], sys.byteorder)
    if peer_uid != uid:
        raise UntrustedSidecar(f"refusing the socket {socket_path}: the process listening on it runs as "
                               f"uid {peer_uid}, not as the sidecar's uid {uid} ({_HINT}); "
                               "nothing was sent")

# -- where the socket is by default: the same for `serve` and every client, whatever environment
# a client was started with (an MCP client starts its stdio servers with a reduced environment,
# without $XDG_RUNTIME_DIR): the user's runtime folder is then found where systemd-logind makes it,
# /run/user/UID, when it is a real folder of this uid

RUN_USER = "/run/user"


def runtime_folder(environ: Mapping[str, str] | None = None, uid: int | None = None,
                   run_user: str = RUN_USER) -> str | None:
    """$XDG_RUNTIME_DIR, else /run/user/UID if it is a folder (not a link) owned by `uid`, else None."""
    environ = os.environ if environ is None else environ
    if runtime := environ.get("XDG_RUNTIME_DIR"):
        return runtime
    uid = os.getuid() if uid is None else uid
    folder = os.path.join(run_user, str(uid))
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    return folder if stat.S_ISDIR(st.st_mode) and st.st_uid == uid else None


def default_socket(environ: Mapping[str, str] | None = None, uid: int | None = None,
                   run_user: str = RUN_USER) -> str:
    """The socket `serve` listens on and clients look for when nothing names one."""
    uid = os.getuid() if uid is None else uid
    if runtime := runtime_folder(environ, uid, run_user):
        return os.path.join(runtime, "mcpcreds", "mcpcreds.sock")
    return f"/tmp/mcpcreds-{uid}/mcpcreds.sock"
