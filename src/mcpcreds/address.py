"""Where a client finds the sidecar: the config file's place, the socket, the sidecar's uid.

Standard library only, and no `config` import: `config` validates the whole file (and imports
httpx), which would cost each `mcpcreds token|headers|acquire|status` about a hundred ms while
they need two keys of `[sidecar]`. `config` holds the same two locating functions (kept equal by
tests/test_cli_imports.py); the sidecar itself still validates everything at `serve`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def find_config_path(explicit: str | None = None) -> Path:
    """`explicit`, else $MCPCREDS_CONFIG, else $XDG_CONFIG_HOME/mcpcreds/config.toml."""
    if explicit:
        return Path(explicit)
    if env := os.environ.get("MCPCREDS_CONFIG"):
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mcpcreds" / "config.toml"


def default_socket_path(configured: str | None = None) -> Path:
    """`configured`, else $MCPCREDS_SOCKET, else $XDG_RUNTIME_DIR/mcpcreds/mcpcreds.sock, else
    /tmp/mcpcreds-UID/mcpcreds.sock."""
    if configured:
        return Path(configured)
    if env := os.environ.get("MCPCREDS_SOCKET"):
        return Path(env)
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "mcpcreds" / "mcpcreds.sock"
    return Path(f"/tmp/mcpcreds-{os.getuid()}") / "mcpcreds.sock"


def _sidecar_keys(path: Path) -> tuple[str | None, int | None] | None:
    """`sidecar.socket` and `sidecar.sidecar_uid` of the config at `path`, checked as `config`
    checks them; None if the file cannot be read or parsed or either key is not valid."""
    import tomllib

    try:
        data: Any = tomllib.loads(path.read_bytes().decode("utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
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
    path = find_config_path(config)
    if config or path.exists():
        keys = _sidecar_keys(path)
        if keys is None and config:
            from .config import load_config

            full = load_config(config)  # raises ConfigError with every problem
            keys = full.sidecar.socket, full.sidecar.sidecar_uid
    configured, uid = keys if keys is not None else (None, None)
    return str(socket or default_socket_path(configured)), uid
