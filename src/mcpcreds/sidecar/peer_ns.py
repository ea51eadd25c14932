"""Whether a peer of the Unix socket shares the sidecar's user and network namespaces.

`mcpcreds exec` runs its child in a user namespace of its own (and, unless net = "inherit", a
network namespace of its own). The socket is a path, reachable from any namespace, and the
child's uid is its caller's: so the sidecar tells the child apart by its namespaces, which the
kernel keeps it and everything it starts in. A peer in another user or network namespace (an
exec child, a container) may act only within a grant, as a `grant_only_uids` uid does.

The peer's pid comes from SO_PEERCRED. Its namespace links are readable when the sidecar may
inspect that process (its own uid, or root); for another uid's process the user namespace is
judged by its id maps (world-readable), the network namespace cannot be told. A peer whose pid
is unknown (outside the sidecar's pid namespace) or gone is not in the sidecar's namespaces.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Final

PR_SET_DUMPABLE: Final = 4
KINDS: Final = ("user", "net")


@functools.cache
def _own(kind: str) -> str:
    return os.readlink(f"/proc/self/ns/{kind}")


@functools.cache
def _own_maps() -> tuple[bytes, bytes]:
    return _maps("self")


def _maps(pid: str) -> tuple[bytes, bytes]:
    with open(f"/proc/{pid}/uid_map", "rb") as uids, open(f"/proc/{pid}/gid_map", "rb") as gids:
        return uids.read(4096), gids.read(4096)


def in_own_namespaces(pid: int) -> bool:
    """Whether the process `pid` is in this process's user and network namespaces."""
    if pid <= 0:
        return False
    try:
        for kind in KINDS:
            try:
                if os.readlink(f"/proc/{pid}/ns/{kind}") != _own(kind):
                    return False
            except PermissionError:  # another uid's process
                if kind == "user" and _maps(str(pid)) != _own_maps():
                    return False
    except OSError:  # gone, or no /proc
        return False
    return True


def set_undumpable() -> None:
    """PR_SET_DUMPABLE 0: a process of the same uid without CAP_SYS_PTRACE (an exec child)
    cannot ptrace this one, nor read its /proc/PID/environ, mem or root."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
