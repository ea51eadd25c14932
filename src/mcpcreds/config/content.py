"""What the gateway does to what a server sends back (the untrusted pipeline's keys): a server's
or catalog entry's `timeout`, `roots`, `elicitation_enabled`, `elicitation_timeout_secs`,
`sampling_enabled`, `media_passthrough`, `on_injection`, `pin_tools` and `tool_metadata`
(config/tool_meta.py), over `[gateway]` defaults (every key but `roots` and `tool_metadata`).
Parsed here into one frozen ContentPolicy (`Target.content`); what a key means for a given trust
level is asked of its `effective_*` methods, never read off the raw field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import unquote, urlsplit

from ..core.rates import parse_duration
from .reader import count, join
from .tool_meta import ToolMeta, merge_tool_metadata, parse_tool_metadata

if TYPE_CHECKING:
    from .reader import Collector

DEFAULT_TIMEOUT: Final = 300.0  # seconds: the upstream's answer, and the gap between SSE events
MIN_TIMEOUT: Final = 1.0
MAX_TIMEOUT: Final = 3600.0
DEFAULT_ELICITATION_TIMEOUT: Final = 120
MAX_ELICITATION_TIMEOUT: Final = 3600
MAX_ROOTS: Final = 64
MAX_ROOT_LENGTH: Final = 2048
ON_INJECTION: Final = ("log", "block")
SANDBOXED: Final = "sandboxed"

# the keys a server or catalog entry takes; [gateway] takes them all but `roots` and
# `tool_metadata` (its defaults)
CONTENT_KEYS: Final = ("timeout", "roots", "elicitation_enabled", "elicitation_timeout_secs",
                       "sampling_enabled", "media_passthrough", "on_injection", "pin_tools", "tool_metadata")
GATEWAY_CONTENT_KEYS: Final = tuple(k for k in CONTENT_KEYS if k not in ("roots", "tool_metadata"))


@dataclass(frozen=True, slots=True)
class ContentPolicy:
    """The untrusted pipeline's settings of one server (resolved: its own keys over its catalog
    entry's, over `[gateway]`'s, over these defaults).

    `timeout`: seconds the gateway waits for the upstream's answer and, in an SSE answer, between
    two events. `roots`: the `file://` URIs the gateway answers `roots/list` with (None: relayed to
    the client). `elicitation_enabled` / `elicitation_timeout_secs`: whether the server's
    `elicitation/create` reaches the client, and how long the client has to answer.
    `sampling_enabled`: whether the server may ask the client's LLM (`sampling/createMessage`).
    `media_passthrough`: image and audio content passes (else withheld). `on_injection`: what an
    injection found in a result does (`log` or `block`). `pin_tools`: tool definitions are pinned
    (None: on unless the server is trusted). `tool_metadata`: tool name -> ToolMeta, as configured
    (a server's entries over its catalog entry's, tool by tool; a tool not in it has its metadata
    inferred from its name: protocol/tool_meta.py). Sandboxed servers never elicit, never sample,
    never pass media and get empty roots when none are set, whatever these say: ask the
    `effective_*` methods."""

    timeout: float = DEFAULT_TIMEOUT
    roots: tuple[str, ...] | None = None
    elicitation_enabled: bool = True
    elicitation_timeout_secs: int = DEFAULT_ELICITATION_TIMEOUT
    media_passthrough: bool = False
    on_injection: Literal["log", "block"] = "log"
    pin_tools: bool | None = None
    tool_metadata: Mapping[str, ToolMeta] = field(default_factory=dict)
    sampling_enabled: bool = True

    def effective_roots(self, trust: str) -> tuple[str, ...] | None:
        """The roots the gateway answers `roots/list` with; None: relay it to the client."""
        if self.roots is None and trust == SANDBOXED:
            return ()
        return self.roots

    def effective_elicitation(self, trust: str) -> bool:
        """Whether the server's elicitations reach the client (never for a sandboxed server)."""
        return self.elicitation_enabled and trust != SANDBOXED

    def effective_sampling(self, trust: str) -> bool:
        """Whether the server may ask the client's LLM (never a sandboxed server)."""
        return self.sampling_enabled and trust != SANDBOXED

    def effective_media(self, trust: str) -> bool:
        """Whether image and audio content passes (never for a sandboxed server)."""
        return self.media_passthrough and trust != SANDBOXED

    def effective_pin_tools(self, trust: str) -> bool:
        """Whether tool definitions are pinned: as set, else on for untrusted and sandboxed."""
        return self.pin_tools if self.pin_tools is not None else trust != "trusted"


def check_root(value: str) -> str | None:
    """Why `value` is not a root (a `file://` URI of an absolute, normalised path), or None."""
    if len(value) > MAX_ROOT_LENGTH or not all("!" <= ch <= "~" for ch in value):
        return (f"must be at most {MAX_ROOT_LENGTH} visible ASCII characters (percent-encode "
                "spaces and other characters)")
    try:
        parts = urlsplit(value)
    except ValueError:
        return "not a valid URI"
    if parts.scheme != "file" or not value.startswith("file://"):
        return "expected a file:// URI, e.g. \"file:///home/me/project\""
    if parts.netloc not in ("", "localhost"):
        return "expected a file:// URI of this machine (no host, e.g. \"file:///srv/data\")"
    if parts.query or parts.fragment or "?" in value or "#" in value:
        return "must not have a ?query or #fragment"
    path = unquote(parts.path)
    if not path.startswith("/"):
        return "expected an absolute path (file:///...)"
    if "\0" in path or any(seg in (".", "..") for seg in path.split("/")):
        return "expected a normalised absolute path (no '.' or '..' segments, no NUL)"
    return None


def _roots(c: Collector, path: str, raw: Any) -> tuple[str, ...] | None:
    if not isinstance(raw, list):
        c.error(path, f"expected an array of at most {MAX_ROOTS} file:// URIs")
        return None
    if len(raw) > MAX_ROOTS:
        c.error(path, f"at most {MAX_ROOTS} roots")
        return None
    roots: list[str] = []
    for i, value in enumerate(raw):
        if not isinstance(value, str):
            c.error(f"{path}[{i}]", "expected a file:// URI string")
        elif (problem := check_root(value)) is not None:
            c.error(f"{path}[{i}]", problem)
        elif value in roots:
            c.error(f"{path}[{i}]", f"listed twice (first as [{roots.index(value)}])")
        else:
            roots.append(value)
    return tuple(roots) if len(roots) == len(raw) else None


def _timeout(c: Collector, path: str, raw: Any, default: float) -> float:
    seconds = c.parsed(path, raw, parse_duration)
    if seconds is None:
        return default
    if not MIN_TIMEOUT <= seconds <= MAX_TIMEOUT:
        c.error(path, "expected a duration from 1s to 1h")
        return default
    return seconds


def parse_content(c: Collector, path: str, t: dict[str, Any], base: ContentPolicy,
                  keys: tuple[str, ...] = CONTENT_KEYS) -> ContentPolicy:
    """The content keys of table `t` (those of `keys` it has) over `base`: a catalog entry's
    over `[gateway]`'s, a server's over its catalog entry's. Errors name the path, never the value."""
    found = {k: t[k] for k in keys if k in t}

    def flag(key: str, default: bool) -> bool:
        if key not in found:
            return default
        if not isinstance(found[key], bool):
            c.error(join(path, key), "expected true or false")
            return default
        return bool(found[key])

    timeout = base.timeout
    if "timeout" in found:
        timeout = _timeout(c, join(path, "timeout"), found["timeout"], base.timeout)
    on_injection = base.on_injection
    if "on_injection" in found:
        if found["on_injection"] in ON_INJECTION:
            on_injection = found["on_injection"]
        else:
            c.error(join(path, "on_injection"), "expected \"log\" or \"block\"")
    return ContentPolicy(
        timeout=timeout,
        roots=_roots(c, join(path, "roots"), found["roots"]) if "roots" in found else base.roots,
        elicitation_enabled=flag("elicitation_enabled", base.elicitation_enabled),
        elicitation_timeout_secs=count(c, join(path, "elicitation_timeout_secs"),
                                       found.get("elicitation_timeout_secs"), base.elicitation_timeout_secs,
                                       MAX_ELICITATION_TIMEOUT),
        media_passthrough=flag("media_passthrough", base.media_passthrough),
        on_injection=on_injection,
        pin_tools=flag("pin_tools", True) if "pin_tools" in found else base.pin_tools,
        tool_metadata=_tool_metadata(c, join(path, "tool_metadata"), found, base.tool_metadata),
        sampling_enabled=flag("sampling_enabled", base.sampling_enabled),
    )


def _tool_metadata(c: Collector, path: str, found: dict[str, Any], base: Mapping[str, ToolMeta]
                   ) -> Mapping[str, ToolMeta]:
    if "tool_metadata" not in found:
        return base
    own = parse_tool_metadata(c, path, found["tool_metadata"])
    return base if own is None else merge_tool_metadata(c, path, dict(base), own)


def sandbox_warnings(path: str, t: dict[str, Any], trust: str) -> list[str]:
    """A sandboxed server's own keys that its trust overrides (said once, at load)."""
    if trust != SANDBOXED:
        return []
    out = []
    if t.get("elicitation_enabled") is True:
        out.append(f"{join(path, 'elicitation_enabled')}: a sandboxed server never elicits: not used")
    if t.get("sampling_enabled") is True:
        out.append(f"{join(path, 'sampling_enabled')}: a sandboxed server never samples: not used")
    if t.get("media_passthrough") is True:
        out.append(f"{join(path, 'media_passthrough')}: a sandboxed server's media is always withheld: "
                   "not used")
    return out
