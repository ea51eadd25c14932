"""Where a client finds the sidecar: the config file's place, the socket, the sidecar's uid.

Standard library only, and no `config` import: `config` validates the whole file (and imports
httpx), which would cost each `mcpcreds token|headers|acquire|status` about a hundred ms while
they need two keys of `[sidecar]`. `config` holds the same two locating functions (kept equal by
tests/test_cli_imports.py); the sidecar itself still validates everything at `serve`.

The paths are handled as text (`path_text` spells them as `pathlib` does): importing pathlib costs
those commands ~2 ms (urllib.parse, ipaddress); so does tomllib, which `lean_toml` mostly spares.
"""

from __future__ import annotations

import os

from ..core.socket_check import default_socket

TYPE_CHECKING = False  # not `typing`'s: importing typing costs these commands ~2 ms
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


def path_text(path: str) -> str:
    """`str(pathlib.PurePosixPath(path))`: the same spelling, without the import."""
    root = "/" if path.startswith("/") else ""
    if path.startswith("//") and not path.startswith("///"):
        root = "//"  # POSIX leaves the meaning of two leading slashes open: pathlib keeps them
    return root + "/".join(part for part in path.split("/") if part and part != ".") or "."


def config_file(explicit: str | None = None) -> str:
    """`explicit`, else $MCPCREDS_CONFIG, else $XDG_CONFIG_HOME/mcpcreds/config.toml."""
    if explicit:
        return path_text(explicit)
    if env := os.environ.get("MCPCREDS_CONFIG"):
        return path_text(env)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return path_text(f"{base}/mcpcreds/config.toml")


def socket_file(configured: str | None = None) -> str:
    """`configured`, else $MCPCREDS_SOCKET, else the default socket (`core.socket_check`): in
    $XDG_RUNTIME_DIR, else /run/user/UID, else /tmp/mcpcreds-UID."""
    if configured:
        return path_text(configured)
    if env := os.environ.get("MCPCREDS_SOCKET"):
        return path_text(env)
    return path_text(default_socket())


def find_config_path(explicit: str | None = None) -> Path:
    """`config_file` as a Path."""
    from pathlib import Path

    return Path(config_file(explicit))


def default_socket_path(configured: str | None = None) -> Path:
    """`socket_file` as a Path."""
    from pathlib import Path

    return Path(socket_file(configured))


def _sidecar_keys(path: str) -> tuple[str | None, int | None] | None:
    """`sidecar.socket` and `sidecar.sidecar_uid` of the config at `path`, checked as `config`
    checks them; None if the file cannot be read or parsed or either key is not valid."""
    from ..core.lean_toml import loads

    try:
        with open(path, "rb") as file:
            text = file.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    try:  # RecursionError, ValueError: nested too deep, an integer past Python's digit limit
        data: Any = loads(text)
        if data is None:  # outside the lean reader's subset of TOML (or not TOML)
            import tomllib

            data = tomllib.loads(text)
    except (ValueError, RecursionError):  # tomllib.TOMLDecodeError is a ValueError
        return None
    table = data.get("sidecar", {})
    if not isinstance(table, dict):
        return None
    socket = table.get("socket")
    uid = table.get("sidecar_uid")
    if socket is not None and not isinstance(socket, str):
        return None
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int) or not 0 <= uid < 2**32):
        return None
    return socket or None, uid


def sidecar_address(config: str | None, socket: str | None) -> tuple[str, int | None]:
    """The socket (`socket`, else the config's sidecar.socket if a config exists, else the
    defaults) and the uid the sidecar must run as (sidecar.sidecar_uid, else None: the client's
    defaults). An explicit `config` that cannot be read, or whose two keys are not valid, raises
    the full `ConfigError`; a default config that does is passed over."""
    keys: tuple[str | None, int | None] | None = None
    path = config_file(config)
    if config or os.path.exists(path):
        keys = _sidecar_keys(path)
        if keys is None and config:
            from ..config.load import load_config

            full = load_config(config)  # raises ConfigError with every problem
            keys = full.sidecar.socket, full.sidecar.sidecar_uid
    configured, uid = keys if keys is not None else (None, None)
    return socket or socket_file(configured), uid
