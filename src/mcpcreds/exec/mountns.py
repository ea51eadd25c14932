"""The child's mount namespace: its caller's session services hidden.

A user namespace keeps the caller's uid, and a network namespace does not stop a connect to a
Unix socket by path. So the child could reach the caller's D-Bus session bus (and through it the
Secret Service keyring: every item, refresh tokens included), the keyring daemon's control
socket, agents (ssh, gpg) and the sidecar's default socket folder, all in the runtime folder
(`$XDG_RUNTIME_DIR`, `/run/user/UID`). `hide_session()` gives this process (the CLI, just before
it becomes the child) a mount namespace of its own in which each runtime folder is an empty
private tmpfs, and a session bus socket named by `DBUS_SESSION_BUS_ADDRESS` outside them is
covered by `/dev/null` (its folder, `/tmp` often, stays as it is).

Entered after the egress forwarder is started: the forwarder keeps the caller's mounts, and the
proxy socket it connects to for each connection. As root it is entered before the child's user
namespace (a mount namespace that namespace does not own: its root cannot unmount the covers);
otherwise inside it (the child has no capability left after `execve`). A namespace the child
makes later copies the covers locked: unmounting one to see beneath is refused by the kernel.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Final
from urllib.parse import unquote

from .netns import NamespaceUnavailable

CLONE_NEWNS: Final = 0x00020000
MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
MS_BIND: Final = 0x1000
MS_REC: Final = 0x4000
MS_PRIVATE: Final = 0x40000
RUN_USER: Final = "/run/user"


def runtime_folders(environ: Mapping[str, str], uid: int) -> list[str]:
    """The caller's runtime folders that exist: `$XDG_RUNTIME_DIR` and `/run/user/UID`, resolved
    (a link is covered where it leads), never `/`."""
    found: list[str] = []
    for folder in (environ.get("XDG_RUNTIME_DIR", ""), os.path.join(RUN_USER, str(uid))):
        if not os.path.isabs(folder):
            continue
        real = os.path.realpath(folder)
        if real != "/" and os.path.isdir(real) and real not in found:
            found.append(real)
    return found


def bus_sockets(environ: Mapping[str, str]) -> list[str]:
    """The `unix:path=` sockets of `DBUS_SESSION_BUS_ADDRESS` that exist (an abstract socket
    belongs to the network namespace: a child with one of its own cannot reach it)."""
    found: list[str] = []
    for address in environ.get("DBUS_SESSION_BUS_ADDRESS", "").split(";"):
        transport, _, params = address.partition(":")
        if transport != "unix":
            continue
        for pair in params.split(","):
            key, _, value = pair.partition("=")
            path = unquote(value)
            if key == "path" and os.path.isabs(path) and os.path.exists(path):
                found.append(os.path.realpath(path))
    return found


def _mount(source: str | None, target: str | None, fstype: str | None, flags: int, data: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    encoded = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    if libc.mount(*encoded[:3], ctypes.c_ulong(flags), encoded[3]) != 0:
        err = ctypes.get_errno()
        raise NamespaceUnavailable(err, f"mount on {target or '/'} refused ({os.strerror(err)})")


def hide_session(environ: Mapping[str, str], uid: int) -> list[str]:
    """Enter a new mount namespace and cover the runtime folders and the session bus sockets;
    returns what was covered. NamespaceUnavailable if the kernel refuses (nothing is covered then,
    or only part: the caller says the child can reach its session)."""
    folders = runtime_folders(environ, uid)
    sockets = [s for s in bus_sockets(environ)
               if not any(s.startswith(folder + "/") for folder in folders)]
    if not folders and not sockets:
        return []
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise NamespaceUnavailable(err, f"unshare(CLONE_NEWNS) refused ({os.strerror(err)})")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)  # as root: nothing propagates to the caller's
    for socket_path in sockets:
        _mount("/dev/null", socket_path, None, MS_BIND, None)
    for folder in folders:
        _mount("mcpcreds-exec", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
    return [*folders, *sockets]
