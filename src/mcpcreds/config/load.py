"""TOML config -> frozen, validated objects. Every error carries its TOML path.

Here the file is found and read, and its tables are handed to their parsers (sidecar.py, servers.py,
aauth.py, exec.py, telemetry.py) with one Collector, so that every problem is raised at once."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ..core.lean_toml import loads as lean_loads
from ..core.policy import find_trifecta, trifecta_message
from ..core.socket_check import default_socket
from ..errors import ConfigError
from .aauth import parse_aauth
from .catalog import CLOSED
from .exec import exec_trifecta_warnings, parse_execs
from .model import Config
from .reader import Collector, key_path
from .servers import parse_servers, parse_services, share_tags, signing
from .sidecar import parse_gateway_table, parse_secrets, parse_sidecar
from .telemetry import parse_telemetry


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
    return Path(default_socket())


def load_config(path: str | Path | None = None) -> Config:
    """Read and validate the config file; raise ConfigError listing every problem."""
    resolved = find_config_path(str(path) if path else None)
    try:
        raw = resolved.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{resolved}: cannot read config: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{resolved}: not UTF-8 text (at byte {exc.start})"]) from None
    try:  # plain TOML is read as tomllib reads it, faster (a large config) and without importing tomllib
        data = lean_loads(text)
    except (ValueError, RecursionError):
        data = None
    if data is None:
        data = _tomllib_loads(text, resolved)
    return parse_config(data, path=str(resolved))


def _tomllib_loads(text: str, resolved: Path) -> dict[str, Any]:
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{resolved}: not valid TOML: {toml_problem(str(exc))}"]) from None
    except ValueError:  # int(): Python's limit on the digits of an integer
        raise ConfigError([f"{resolved}: not valid TOML: an integer out of range "
                           "(TOML integers are 64-bit)"]) from None
    except RecursionError:
        raise ConfigError([f"{resolved}: not valid TOML: arrays or tables nested more than "
                           f"{MAX_DEPTH} deep"]) from None


MAX_DEPTH: Final = 16  # tables and arrays within one another; the deepest key is 4 levels down
_INT64: Final = range(-(2**63), 2**63)
_AT: Final = re.compile(r" \(at (line \d+, column \d+|end of document)\)\Z")
# tomllib's messages that quote nothing of the text, and ours for those that do (a key, a character)
_TOML_SAYS: Final = frozenset({
    "Invalid statement", "Expected newline or end of document after a statement", "Cannot overwrite a value",
    "Expected ']' at the end of a table declaration", "Expected ']]' at the end of an array declaration",
    "Expected '=' after a key in a key/value pair", "Invalid initial character for a key part",
    "Unclosed array", "Unclosed inline table", "Unescaped '\\' in a string", "Invalid hex value",
    "Escaped character is not a Unicode scalar value", "Unterminated string", "Invalid date or datetime",
    "Invalid value"})
_TOML_QUOTES: Final = (
    ("Found invalid character", "a character not allowed here"),
    ("Illegal character", "a character not allowed here"),
    ("Expected ", "an unterminated string or comment"),
    ("Cannot declare", "a table or key defined twice"),
    ("Cannot mutate immutable namespace", "a table or array changed after it was defined"),
    ("Cannot redefine namespace", "a table or array changed after it was defined"),
    ("Duplicate inline table key", "a key given twice in an inline table"),
)


def toml_problem(message: str) -> str:
    """tomllib's error without what it quotes of the text (a key, a character), which may be a
    pasted secret: its own words where they quote nothing, else ours; and where it is."""
    at = _AT.search(message)
    said = message[:at.start()] if at else message
    if said not in _TOML_SAYS:
        said = next((ours for prefix, ours in _TOML_QUOTES if said.startswith(prefix)), "invalid TOML")
    return f"{said} (at {at.group(1)})" if at else said


def bound_data(data: Mapping[str, Any]) -> list[str]:
    """What TOML allows but no config needs, found before a parser reads it: nesting past
    MAX_DEPTH, and integers past 64 bits (which TOML itself refuses), each with its path (spelt
    only for what is reported: a key's path is the costly part of a walk over a large config)."""
    errors: list[str] = []
    # the containers to walk: (container, depth, where); where is None at the root, else
    # (parent's where, key, index), a key None in an array
    stack: list[tuple[Any, int, Any]] = [(data, 0, None)]
    while stack:
        container, depth, where = stack.pop()
        if depth >= MAX_DEPTH:
            errors.append(f"{_spelt(where)}: arrays and tables nest at most {MAX_DEPTH} deep")
            continue
        pairs = container.items() if isinstance(container, dict) else ((None, v) for v in container)
        for i, (key, value) in enumerate(pairs):
            if isinstance(value, dict | list):
                stack.append((value, depth + 1, (where, key, i)))
            elif isinstance(value, int) and not isinstance(value, bool) and value not in _INT64:
                errors.append(f"{_spelt((where, key, i))}: integer out of range (TOML integers are 64-bit)")
    return sorted(errors)


def _spelt(where: Any) -> str:
    """The TOML path of a place `bound_data` reached: a key (`key_path`) or an index."""
    steps = []
    while where is not None:
        steps.append(where[1:])
        where = where[0]
    path = ""
    for key, index in reversed(steps):
        path = f"{path}[{index}]" if key is None else key_path(path, key, index)
    return path


def parse_config(data: Mapping[str, Any], path: str | None = None) -> Config:
    if bounds := bound_data(data):  # refused before any parser reads a number or recurses
        raise ConfigError(bounds, path)
    c = Collector()
    c.keys("", data, ("sidecar", "secrets", "services", "servers", "gateway", "exec", "aauth", "telemetry"))
    sidecar = parse_sidecar(c, data.get("sidecar"))
    gateway, content = parse_gateway_table(c, data.get("gateway"))
    secrets = parse_secrets(c, data.get("secrets"))
    services, tables = parse_services(c, data.get("services"), content)
    servers = parse_servers(c, data.get("servers"), services, tables, content,
                            closed=sidecar.egress == CLOSED)
    aauth = parse_aauth(c, data.get("aauth"))
    telemetry = parse_telemetry(c, data.get("telemetry"))
    services, servers, execs = share_tags(services, servers, parse_execs(c, data.get("exec"), content))
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
                  aauth=aauth, content_defaults=content, telemetry=telemetry)
