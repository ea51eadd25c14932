"""TOML config -> frozen, validated objects. Every error carries its TOML path.

Here the file is found and read, and its tables are handed to their parsers (sidecar.py, servers.py,
aauth.py, exec.py) with one Collector, so that every problem is raised at once."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.policy import find_trifecta, trifecta_message
from ..errors import ConfigError
from .aauth import parse_aauth
from .exec import exec_trifecta_warnings, parse_execs
from .model import Config
from .reader import Collector
from .servers import parse_servers, parse_services, share_tags, signing
from .sidecar import parse_gateway_table, parse_secrets, parse_sidecar


def find_config_path(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit)
    if env := os.environ.get("MCPCREDS_CONFIG"):
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mcpcreds" / "config.toml"


def default_socket_path(configured: str | None = None) -> Path:
    if configured:
        return Path(configured)
    if env := os.environ.get("MCPCREDS_SOCKET"):
        return Path(env)
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "mcpcreds" / "mcpcreds.sock"
    return Path(f"/tmp/mcpcreds-{os.getuid()}") / "mcpcreds.sock"


def load_config(path: str | Path | None = None) -> Config:
    """Read and validate the config file; raise ConfigError listing every problem."""
    resolved = find_config_path(str(path) if path else None)
    try:
        raw = resolved.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{resolved}: cannot read config: {exc.strerror or exc}"]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{resolved}: not valid TOML: {exc}"]) from None
    return parse_config(data, path=str(resolved))


def parse_config(data: Mapping[str, Any], path: str | None = None) -> Config:
    c = Collector()
    c.keys("", data, ("sidecar", "secrets", "services", "servers", "gateway", "exec", "aauth"))
    sidecar = parse_sidecar(c, data.get("sidecar"))
    gateway = parse_gateway_table(c, data.get("gateway"))
    secrets = parse_secrets(c, data.get("secrets"))
    services, tables = parse_services(c, data.get("services"))
    servers = parse_servers(c, data.get("servers"), services, tables)
    aauth = parse_aauth(c, data.get("aauth"))
    services, servers, execs = share_tags(services, servers, parse_execs(c, data.get("exec")))
    services, servers = ({k: signing(t, aauth) for k, t in services.items()},
                         {k: signing(t, aauth) for k, t in servers.items()})
    trio = find_trifecta({name: t.tags for name, t in (*services.items(), *servers.items())})
    if trio is not None:
        c.warnings.append(f"servers: together the servers complete the trifecta: {trifecta_message(trio)}; "
                          "grants that combine them are refused")
    c.warnings.extend(exec_trifecta_warnings({n: t.tags for n, t in (*services.items(), *servers.items())},
                                             execs, trio))
    if c.errors:
        raise ConfigError(c.errors, path)
    return Config(path, sidecar, secrets, services, servers, tuple(c.warnings), gateway, execs=execs,
                  aauth=aauth)
