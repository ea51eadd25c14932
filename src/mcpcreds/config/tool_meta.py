"""A server's or catalog entry's `tool_metadata` (zeph `ToolSecurityMeta`): per tool name, how
sensitive its data is, what it can do, and which of its arguments are checked against a named
pattern. Parsed here into frozen ToolMeta values (`ContentPolicy.tool_metadata`); what the gateway
makes of them (inference when absent, the data-flow check, the patterns) is protocol/tool_meta.py.

    tool_metadata = { run_query = { data_sensitivity = "medium", capabilities = ["database_read"],
                      flagged_parameters = [{ pointer = "/sql", pattern = "sql_injection" }] } }

A configured entry is the whole truth for its tool (nothing of it is inferred): `data_sensitivity`
is required, so that an entry written for its flagged parameters cannot lower a sensitivity the
name would have given by leaving it out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from .reader import join, key_path, kind_of

if TYPE_CHECKING:
    from .reader import Collector

Sensitivity = Literal["none", "low", "medium", "high"]
SENSITIVITIES: Final[tuple[Sensitivity, ...]] = get_args(Sensitivity)  # in rising order
CAPABILITIES: Final = ("filesystem_read", "filesystem_write", "network", "shell", "database_read",
                       "database_write", "memory_write", "external_api")
# the names of the patterns a flagged parameter is checked against (protocol/tool_meta.py has them)
PATTERNS: Final = ("path_traversal", "shell_metacharacters", "url_with_credentials", "private_address",
                   "sql_injection", "secret_shaped")
TOOL_META_KEYS: Final = ("data_sensitivity", "capabilities", "flagged_parameters")
FLAGGED_KEYS: Final = ("pointer", "pattern")
MAX_TOOLS: Final = 1024
MAX_FLAGGED: Final = 16
MAX_POINTER_CHARS: Final = 512
MAX_POINTER_TOKENS: Final = 32
# the MCP spec's tool names: 1 to 128 ASCII letters, digits, '_', '-', '.'
TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_.\-]{1,128}\Z")


@dataclass(frozen=True, slots=True)
class FlaggedParameter:
    """An argument of a tools/call (an RFC 6901 JSON pointer into `arguments`) and the name of
    the pattern (one of PATTERNS) its value must not match."""

    pointer: str
    pattern: str


@dataclass(frozen=True, slots=True)
class ToolMeta:
    """What a tool handles and can do. `capabilities` are in CAPABILITIES' order."""

    data_sensitivity: Sensitivity = "none"
    capabilities: tuple[str, ...] = ()
    flagged_parameters: tuple[FlaggedParameter, ...] = ()


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """The reference tokens of an RFC 6901 JSON pointer (`~1` is `/`, `~0` is `~`; "" is the whole
    document); ValueError says why not, never quoting it."""
    if len(pointer) > MAX_POINTER_CHARS:
        raise ValueError(f"a JSON pointer of at most {MAX_POINTER_CHARS} characters")
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError("a JSON pointer starts with '/' (e.g. \"/path\"; \"\" is the whole arguments)")
    raw = pointer[1:].split("/")
    if len(raw) > MAX_POINTER_TOKENS:
        raise ValueError(f"a JSON pointer of at most {MAX_POINTER_TOKENS} steps")
    if re.search(r"~(?![01])", pointer):
        raise ValueError("'~' in a JSON pointer is written ~0 ('~1' is '/')")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in raw)


def _flagged(c: Collector, path: str, raw: Any) -> tuple[FlaggedParameter, ...] | None:
    if not isinstance(raw, list):
        c.error(path, f"expected an array of at most {MAX_FLAGGED} {{ pointer, pattern }} tables")
        return None
    if len(raw) > MAX_FLAGGED:
        c.error(path, f"at most {MAX_FLAGGED} flagged parameters a tool")
        return None
    out: list[FlaggedParameter] = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(item, dict):
            c.error(where, f"expected a {{ pointer, pattern }} table, got {kind_of(item)}")
            continue
        c.keys(where, item, FLAGGED_KEYS)
        pointer, pattern = item.get("pointer"), item.get("pattern")
        if not isinstance(pointer, str):
            c.error(join(where, "pointer"), "required: a JSON pointer into the arguments, e.g. \"/path\"")
        elif c.parsed(join(where, "pointer"), pointer, parse_pointer) is None:
            pointer = None
        if pattern not in PATTERNS:
            c.error(join(where, "pattern"), f"expected one of {', '.join(PATTERNS)}")
        if isinstance(pointer, str) and pattern in PATTERNS:
            flagged = FlaggedParameter(pointer, pattern)
            if flagged in out:
                c.error(where, f"listed twice (first as [{out.index(flagged)}])")
            out.append(flagged)
    return tuple(out) if len(out) == len(raw) else None


def _capabilities(c: Collector, path: str, raw: Any) -> tuple[str, ...] | None:
    if not isinstance(raw, list):
        c.error(path, f"expected an array among {', '.join(CAPABILITIES)}")
        return None
    ok = True
    for i, value in enumerate(raw):
        if value not in CAPABILITIES:
            c.error(f"{path}[{i}]", f"expected one of {', '.join(CAPABILITIES)}")
            ok = False
        elif raw.index(value) != i:
            c.error(f"{path}[{i}]", f"listed twice (first as [{raw.index(value)}])")
            ok = False
    return tuple(cap for cap in CAPABILITIES if cap in raw) if ok else None


def _tool(c: Collector, path: str, raw: Any) -> ToolMeta | None:
    if not isinstance(raw, dict):
        c.error(path, f"expected a {{ data_sensitivity, capabilities, flagged_parameters }} table, "
                f"got {kind_of(raw)}")
        return None
    c.keys(path, raw, TOOL_META_KEYS)
    sensitivity = raw.get("data_sensitivity")
    if sensitivity not in SENSITIVITIES:
        said = "expected" if "data_sensitivity" in raw else "required:"
        c.error(join(path, "data_sensitivity"), f"{said} one of {', '.join(SENSITIVITIES)}")
    capabilities = _capabilities(c, join(path, "capabilities"), raw.get("capabilities", []))
    flagged = _flagged(c, join(path, "flagged_parameters"), raw.get("flagged_parameters", []))
    if sensitivity not in SENSITIVITIES or capabilities is None or flagged is None:
        return None
    return ToolMeta(sensitivity, capabilities, flagged)


def tool_meta_dict(meta: ToolMeta) -> dict[str, Any]:
    """`meta` as its config table (what `parse_tool_metadata` reads back)."""
    return {"data_sensitivity": meta.data_sensitivity, "capabilities": list(meta.capabilities),
            "flagged_parameters": [{"pointer": f.pointer, "pattern": f.pattern}
                                   for f in meta.flagged_parameters]}


def parse_tool_metadata(c: Collector, path: str, raw: Any) -> dict[str, ToolMeta] | None:
    """`tool_metadata` (a table of tool name -> ToolMeta table) at `path`; None if any of it is
    wrong (errors name the path, never a value)."""
    if not isinstance(raw, dict):
        c.error(path, f"expected a table of tool name = {{ data_sensitivity, ... }}, got {kind_of(raw)}")
        return None
    if len(raw) > MAX_TOOLS:
        c.error(path, f"at most {MAX_TOOLS} tools")
        return None
    out: dict[str, ToolMeta] = {}
    for i, (name, value) in enumerate(raw.items()):
        where = key_path(path, name, i)
        if not TOOL_NAME.match(name):
            c.error(where, "a tool name is 1 to 128 ASCII letters, digits, '_', '-', '.' (as MCP's)")
        elif (meta := _tool(c, where, value)) is not None:
            out[name] = meta
    return out if len(out) == len(raw) else None


def merge_tool_metadata(c: Collector, path: str, base: dict[str, ToolMeta],
                        own: dict[str, ToolMeta]) -> dict[str, ToolMeta]:
    """A server's tool_metadata over its catalog entry's, tool by tool, bounded all the same."""
    merged = {**base, **own}
    if len(merged) > MAX_TOOLS:
        c.error(path, f"at most {MAX_TOOLS} tools, its service's included")
        return base
    return merged
