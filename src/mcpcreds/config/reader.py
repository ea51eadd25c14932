"""The kit every table's parser shares: a collector of the errors (each with its TOML path) and
warnings, and the checks of names, URLs, tags and egress keys that several tables use. It imports
no other module of config: the objects and the sections build on it."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlsplit

from ..core.credshape import credential_name, credential_value
from ..core.policy import TRUST_LEVELS, TrustPolicy, tool_pattern_problem
from ..core.templates import Template, TemplateError, parse_template
from ..net.egress import EgressPolicy, is_dev_loopback_url, parse_host_pattern, parse_private_entry

TAGS: Final = ("untrusted_input", "sensitive", "egress")
DEFAULT_TAGS: Final = frozenset({"untrusted_input"})
NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}\Z")
HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
TRUST_KEYS: Final = ("trust", "tool_allowlist", "tool_exclude", "expected_tools",
                     "allow_untrusted_without_allowlist")
CEILING_KEYS: Final = ("tool_allowlist", "tool_exclude")  # a catalog entry's: the ceiling of its servers
EGRESS_KEYS: Final = ("net", "allow_hosts", "deny_hosts", "allow_private")
# A URL httpx surely accepts (an ASCII host name that is not an IPv4 literal, a port, and a path and
# query httpx only percent-encodes): checked without importing httpx (~0.2 s of a sidecar's start,
# ~0.1 ms a URL). Any other URL is checked by httpx.URL itself.
PLAIN_URL: Final = re.compile(r"https?://(?=[A-Za-z0-9.-]*[A-Za-z-])[A-Za-z0-9.-]+(?::[0-9]{1,5})?"
                               r"(?:/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?(?:\?[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*)?\Z")

_DEFAULT_EGRESS: Final = (EgressPolicy(), EgressPolicy(dev_loopback=True))  # frozen: shared by every entry
T = TypeVar("T")


class Collector:
    """The errors and warnings of one parse (each error prefixed with its TOML path), and the
    typed reads of values that report to it."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def keys(self, path: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        for i, key in enumerate(table):
            if key not in allowed:
                self.error(key_path(path, key, i), f"unknown key (allowed: {', '.join(allowed)})")

    def table(self, path: str, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(path, f"expected a table, got {kind_of(value)}")
            return {}
        return value

    def typed(self, path: str, value: Any, kind: type[T], default: T) -> T:
        if value is None:
            return default
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # type: ignore[return-value]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            self.error(path, f"expected {kind.__name__}, got {kind_of(value)}")
            return default
        return value

    def parsed(self, path: str, value: Any, parse: Callable[[Any], T]) -> T | None:
        try:
            return parse(value)
        except (ValueError, TypeError) as exc:
            self.error(path, str(exc))  # the parsers in rates.py and egress.py never quote the value
            return None

    def template(self, path: str, value: Any, *, credential: bool,
                 literal_ok: bool = False,
                 public: str = "or list the header in literal_headers if it is public") -> Template | None:
        """A template; with `credential`, it must not be a literal; unless `literal_ok`, no literal
        part of it may look like a credential either."""
        if not isinstance(value, str):
            self.error(path, f"expected a string, got {kind_of(value)}")
            return None
        try:
            template = parse_template(value)
        except TemplateError as exc:
            self.error(path, str(exc))
            return None
        if credential and template.is_literal:
            self.error(
                path,
                "a credential must not be written in the config: "
                "use {{secret:NAME}} or {{secret-file:PATH}}",
            )
            return None
        if not literal_ok:
            for part in template.parts:
                if isinstance(part, str) and (why := credential_value(part)) is not None:
                    self.error(path, f"looks like a credential written in the config ({why}): use "
                               "{{secret:NAME}}, " + public)
                    return None
        return template


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def key_path(path: str, key: str, index: int) -> str:
    """The TOML path of a key, which may itself be a pasted secret: named only if it reads as a name."""
    if _reads_as_name(key):
        return join(path, key)
    return f"{path}.<key #{index + 1}>" if path else f"<key #{index + 1}>"


def _reads_as_name(key: str) -> bool:
    if key in _NAMES:
        return True
    if NAME.match(key) and len(key) <= 64 and credential_value(key) is None:
        if len(_NAMES) < MAX_NAMES_KEPT:
            _NAMES.add(key)
        return True
    return False


# the keys that read as names, which paths show anyway (never one that looks like a credential):
# a config repeats its few key names (name, endpoint, headers...) in every entry
MAX_NAMES_KEPT: Final = 1024
_NAMES: Final[set[str]] = set()


def kind_of(value: Any) -> str:
    """TOML's name for the type of `value` (a table or array of the lean reader's is a dict or list)."""
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "float"), (str, "string"),
                       (list, "array"), (dict, "table")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(value: str) -> str | None:
    """Why `value` is not an acceptable endpoint URL, or None if it is."""
    if len(value) > 2048 or not (value.isascii() and value.isprintable()) or " " in value:
        # urlsplit drops CR, LF and tab silently; what it accepts must also be what httpx sends
        return "must be at most 2048 visible ASCII characters (no spaces or control characters)"
    try:
        parts = urlsplit(value)
        host = parts.hostname
        _ = parts.port
    except ValueError:
        return "not a valid URL"
    if not PLAIN_URL.match(value) and not _httpx_accepts(value):
        return "not a valid URL"
    if parts.scheme not in ("https", "http") or not host:
        return "must be an https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials in the URL"
    if parts.fragment:
        return "must not have a #fragment"
    if parts.scheme == "http" and not _is_loopback(host):
        return "http:// is only allowed for a loopback host; use https://"
    for name, arg in parse_qsl(parts.query, keep_blank_values=True):
        if credential_name(name) or credential_value(arg) is not None:
            return "must not carry a credential in its query (the URL is shown in specs and logs)"
    return None


def _httpx_accepts(value: str) -> bool:
    import httpx

    try:
        httpx.URL(value)
    except (ValueError, httpx.InvalidURL):
        return False
    return True


def url(c: Collector, path: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        c.error(path, f"expected a URL string, got {kind_of(value)}")
        return None
    if (problem := check_url(value)) is not None:
        c.error(path, problem)
        return None
    return value


def uid_list(c: Collector, path: str, key: str, raw: Any) -> list[int]:
    uids: list[int] = []
    if not isinstance(raw, list):
        c.error(join(path, key), f"expected an array of integers, got {kind_of(raw)}")
        return uids
    for i, uid in enumerate(raw):
        if isinstance(uid, int) and not isinstance(uid, bool) and 0 <= uid < 2**32:
            uids.append(uid)
        else:
            c.error(f"{path}.{key}[{i}]", "expected a non-negative integer uid")
    return uids


def count(c: Collector, path: str, raw: Any, default: int, most: int) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= most:
        c.error(path, f"expected a whole number from 1 to {most}")
        return default
    return raw


def strings(c: Collector, path: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        c.error(path, "expected an array of strings")
        return None
    return tuple(value)


def parse_egress(c: Collector, path: str, t: dict[str, Any], urls: list[str | None],
                 needs: str = "the token endpoint, issuer and MCP endpoint hosts it may call"
                 ) -> EgressPolicy:
    """`net` and its host lists; loopback is allowed (dev mode) when the config's own URLs are."""
    if not any(key in t for key in EGRESS_KEYS):  # the common case: the sidecar's default, one object
        return _DEFAULT_EGRESS[any(is_dev_loopback_url(u) for u in urls if u)]
    mode = c.typed(join(path, "net"), t.get("net"), str, "inherit")
    lists = {k: strings(c, join(path, k), t.get(k)) or () for k in EGRESS_KEYS[1:]}
    if mode == "restricted" and not lists["allow_hosts"]:
        c.error(join(path, "allow_hosts"), f'net = "restricted" needs allow_hosts ({needs})')
    dev = any(is_dev_loopback_url(u) for u in urls if u)
    valid: dict[str, tuple[str, ...]] = {}
    for key, patterns in lists.items():
        parse = parse_private_entry if key == "allow_private" else parse_host_pattern
        kept = []
        for i, pattern in enumerate(patterns):
            if c.parsed(f"{path}.{key}[{i}]", pattern, parse) is not None:
                kept.append(pattern)
        valid[key] = tuple(kept)
    try:
        return EgressPolicy(mode, valid["allow_hosts"], valid["deny_hosts"], valid["allow_private"], dev)
    except ValueError as exc:
        c.error(join(path, "net"), str(exc))
        return EgressPolicy(dev_loopback=dev)


def parse_tags(c: Collector, path: str, raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.error(path, f"expected an array of tags, got {kind_of(raw)}")
        return ()
    tags: list[str] = []
    for i, tag in enumerate(raw):
        if tag in TAGS:
            if tag not in tags:
                tags.append(tag)
        else:
            c.error(f"{path}[{i}]", f"unknown tag: expected one of {', '.join(TAGS)}")
    return tuple(tags)


def parse_trust(c: Collector, path: str, t: Mapping[str, Any], default: str = "untrusted") -> TrustPolicy:
    """The trust keys (TRUST_KEYS) of a server or exec entry's table; `default`: the trust when
    `trust` is not set."""
    allow_hatch = c.typed(join(path, "allow_untrusted_without_allowlist"),
                          t.get("allow_untrusted_without_allowlist"), bool, False)
    trust = c.typed(join(path, "trust"), t.get("trust"), str, default)
    if trust not in TRUST_LEVELS:  # checked here: TrustPolicy's own error quotes the value
        c.error(join(path, "trust"), f"expected one of {', '.join(TRUST_LEVELS)}")
        trust = default
    return TrustPolicy(
        trust=trust,
        tool_allowlist=tool_patterns(c, join(path, "tool_allowlist"), t.get("tool_allowlist")),
        expected_tools=strings(c, join(path, "expected_tools"), t.get("expected_tools")) or (),
        allow_untrusted_without_allowlist=allow_hatch,
        tool_exclude=tool_patterns(c, join(path, "tool_exclude"), t.get("tool_exclude")) or (),
    )


def tool_patterns(c: Collector, path: str, raw: Any) -> tuple[str, ...] | None:
    """A list of tool names and `prefix*` patterns (None when not given)."""
    found = strings(c, path, raw)
    if found is None:
        return None
    for i, pattern in enumerate(found):
        if (problem := tool_pattern_problem(pattern)) is not None:
            c.error(f"{path}[{i}]", problem)
    return tuple(p for p in found if tool_pattern_problem(p) is None)
