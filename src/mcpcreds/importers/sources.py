"""The files an import reads: each parsed (TOML, YAML or JSON, by its name, else by trying TOML
then YAML), merged in the order given (RFC 7396 JSON merge patch: a later file's table merges into
the earlier one's, its `null` removes a key, any other value replaces), and the project that wrote
them told apart.

What a parser says of a file never reaches a message: only where (line, column) it stopped. YAML
is read with the safe loader and without anchors or aliases (no document that grows as it is read),
and every file is bounded in size and nesting."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ..config.load import bound_data, toml_problem

SEEDS: Final = ("agentd", "zeph", "mur")
MAX_FILE: Final = 1024 * 1024  # bytes
MAX_FILES: Final = 32


class SourceError(ValueError):
    """A file that cannot be read as a config; the message says where, never what."""


def read(path: str) -> Any:
    """The parsed content of one file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE + 1)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc.strerror or 'error'}") from None
    if len(raw) > MAX_FILE:
        raise SourceError(f"{path}: larger than {MAX_FILE // 1024} KiB: not a config this import reads")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 text (at byte {exc.start})") from None
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        data = _json(path, text)
    elif suffix in (".yaml", ".yml"):
        data = _yaml(path, text)
    elif suffix == ".toml":
        data = _toml(path, text)
    else:
        try:
            data = _toml(path, text)
        except SourceError:
            data = _yaml(path, text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a table (a mapping) at the top of the file")
    if problems := bound_data(data):
        raise SourceError(f"{path}: {problems[0]}")
    return data


def _toml(path: str, text: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SourceError(f"{path}: not valid TOML: {toml_problem(str(exc))}") from None
    except (ValueError, RecursionError):
        raise SourceError(f"{path}: not valid TOML (out of range, or nested too deep)") from None


def _json(path: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: not valid JSON (at line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError):
        raise SourceError(f"{path}: not valid JSON (out of range, or nested too deep)") from None


def _yaml(path: str, text: str) -> Any:
    import yaml  # agentd and mur write YAML

    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise SourceError(f"{path}: YAML anchors and aliases are not read (write each value out)")
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (at line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise SourceError(f"{path}: not valid YAML{where}") from None
    except (yaml.YAMLError, RecursionError, ValueError):
        raise SourceError(f"{path}: not valid YAML") from None


def merge(base: Any, patch: Any) -> Any:
    """RFC 7396: `patch` applied to `base`."""
    if not isinstance(patch, Mapping):
        return patch
    out = dict(base) if isinstance(base, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def read_all(paths: list[str]) -> dict[str, Any]:
    if len(paths) > MAX_FILES:
        raise SourceError(f"at most {MAX_FILES} files at once")
    merged: dict[str, Any] = {}
    for path in paths:
        merged = merge(merged, read(path))
    return merged


def detect(data: Mapping[str, Any]) -> str | None:
    """Which project wrote `data`: zeph (`[[mcp.servers]]` entries with an `id`), mur (a
    `mcp_servers` list), agentd (a `services` catalog, or `mcp.servers` entries with a `name`)."""
    mcp = data.get("mcp")
    servers = mcp.get("servers") if isinstance(mcp, Mapping) else None
    if isinstance(servers, list) and servers and all(isinstance(s, Mapping) for s in servers):
        if all("id" in s for s in servers):
            return "zeph"
        if all("name" in s for s in servers):
            return "agentd"
    if isinstance(data.get("mcp_servers"), list):
        return "mur"
    if isinstance(data.get("services"), Mapping) or isinstance(data.get("security"), Mapping):
        return "agentd"
    return None
