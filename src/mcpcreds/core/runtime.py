"""Where the sidecar's socket is by default, read the same way by `serve` and by every client,
whatever environment a client was started with: an MCP client starts its stdio servers with a
reduced environment (the MCP SDK passes HOME, LOGNAME, PATH, SHELL, TERM and USER only), so
`$XDG_RUNTIME_DIR` may be missing where `serve` had it. The user's runtime folder is then found
where systemd-logind makes it, `/run/user/UID`, when it is a real folder of this uid."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

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
