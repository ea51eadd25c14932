"""`[exec.NAME]`: how `mcpcreds exec NAME -- CMD` runs a stdio MCP server (parsed, pure).

The config never holds a command: an entry says which environment the child gets (templates
resolved by the sidecar), whether the caller's environment is passed on, and what network the
child may use. The command comes only from the command line. `net = "broad_audited"` (any host,
every connection audited) is the operator's explicit consent: the entry must say who gave it and
why (`authorization = { by, reason }`), which the sidecar writes to the audit log.

The trust keys and the content keys a stdio server's traffic is policed by (`mcpcreds exec`
relays the child's stdio through the gateway's policy core) are a server's: `trust`,
`tool_allowlist`, `expected_tools`, `allow_untrusted_without_allowlist`, `timeout`, `roots`,
`elicitation_enabled`, `elicitation_timeout_secs`, `sampling_enabled`, `media_passthrough`,
`on_injection` (over `[gateway]`'s), `pin_tools` (on unless trusted; the pins are the sidecar's,
under `exec:NAME`) and `tool_metadata`. Unlike a server, an entry without `trust` is `trusted`:
entries written before the keys existed run as they did. An entry that sets none of these keys is
not relayed at all (`policed` is false): its child talks to the client directly, as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ..core.credshape import credential_name, credential_value
from ..core.policy import TrustPolicy
from ..core.templates import Template
from ..net.egress import EgressPolicy, parse_host_pattern
from .content import CONTENT_KEYS, ContentPolicy, parse_content, sandbox_warnings
from .reader import NAME, TRUST_KEYS, join, key_path, parse_egress, parse_tags, parse_trust
from .tool_meta import tool_meta_dict

if TYPE_CHECKING:
    from .reader import Collector

EXEC_CONTENT_KEYS: Final = CONTENT_KEYS  # the stdio relay applies every content key a server takes
POLICY_KEYS: Final = (*TRUST_KEYS, *EXEC_CONTENT_KEYS)  # any of them set: the child's stdio is relayed
EXEC_KEYS: Final = ("env", "env_isolation", "net", "allow_hosts", "deny_hosts", "allow_private", "tags",
                    "authorization", *POLICY_KEYS)
EXEC_TRUST: Final = "trusted"  # an entry's trust when unset (entries older than the keys keep working)
AUTHORIZATION_KEYS: Final = ("by", "reason")
AUTHORIZATION_LIMITS: Final = {"by": 128, "reason": 1024}  # characters
CONSENTED: Final = "broad_audited"  # the net mode that needs an authorization
ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
PROXY_VARS: Final = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")
MAX_PORT: Final = 65535
MAX_ENV: Final = 256  # declared variables per entry
EXEC_PREFIX: Final = "exec:"  # how grants name an exec entry
NEEDS_HOSTS: Final = "the hosts the child may reach through the session's egress proxy"
NO_LITERAL: Final = ("or {{secret-file:PATH}} (a literal in env is refused when it looks like a "
                     "credential)")


@dataclass(frozen=True, slots=True)
class Authorization:
    """Who consented to an entry's `net = "broad_audited"`, and why (free text, for the audit)."""

    by: str
    reason: str


@dataclass(frozen=True, slots=True)
class ExecEntry:
    """One `[exec.NAME]` table, validated. `tags` are the effective tags (see `effective_tags`)."""

    name: str
    env: Mapping[str, Template] = field(default_factory=dict)
    env_isolation: bool = True
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    tags: frozenset[str] = frozenset({"untrusted_input", "egress"})
    # (host pattern or allow_private entry, port): a `host:port` entry opens that port only
    host_ports: tuple[tuple[str, int | None], ...] = ()
    private_ports: tuple[tuple[str, int | None], ...] = ()
    authorization: Authorization | None = None  # required with net = "broad_audited"
    trust: TrustPolicy = field(default_factory=lambda: TrustPolicy(EXEC_TRUST))
    content: ContentPolicy = field(default_factory=ContentPolicy)
    policed: bool = False  # the entry sets a policy key: `mcpcreds exec` relays the child's stdio

    @property
    def grant_name(self) -> str:
        return f"{EXEC_PREFIX}{self.name}"

    @property
    def net(self) -> str:
        return self.egress.mode

    @property
    def secret_names(self) -> frozenset[str]:
        names: set[str] = set()
        for template in self.env.values():
            names |= template.secret_names
        return frozenset(names)

    def to_dict(self) -> dict[str, Any]:
        """The secret-free spec (templates intact), as grants and specs show it."""
        return {"name": self.grant_name, "env": {k: t.source for k, t in self.env.items()},
                "env_isolation": self.env_isolation, "net": self.net,
                "allow_hosts": list(self.egress.allow_hosts), "deny_hosts": list(self.egress.deny_hosts),
                "tags": sorted(self.tags)}

    def policy_dict(self) -> dict[str, Any]:
        """What `mcpcreds exec` polices the child's stdio by (sent with the session; None-free)."""
        content = self.content
        trust = self.trust.trust
        roots = content.effective_roots(trust)
        return {"trust": trust, "tool_allowlist": (None if self.trust.tool_allowlist is None
                                                   else list(self.trust.tool_allowlist)),
                "tool_exclude": list(self.trust.tool_exclude),
                "expected_tools": list(self.trust.expected_tools),
                "allow_untrusted_without_allowlist": self.trust.allow_untrusted_without_allowlist,
                "roots": None if roots is None else list(roots),
                "elicitation": content.effective_elicitation(trust),
                "sampling": content.effective_sampling(trust),
                "media": content.effective_media(trust),
                "on_injection": content.on_injection,
                "timeout": content.timeout,
                "elicitation_timeout_secs": content.elicitation_timeout_secs,
                "tool_metadata": {tool: tool_meta_dict(meta) for tool, meta in content.tool_metadata.items()}}


def effective_tags(declared: tuple[str, ...], net: str) -> frozenset[str]:
    """Untagged counts as `untrusted_input` (like a server); any `net` but `off` lets the child
    send data out, so it also carries `egress` for the Rule of Two."""
    tags = set(declared) if declared else {"untrusted_input"}
    if net != "off":
        tags.add("egress")
    return frozenset(tags)


def exec_trifecta_warnings(targets: Mapping[str, frozenset[str]], execs: Mapping[str, ExecEntry],
                           servers_trio: tuple[str, str, str] | None) -> list[str]:
    """The config-level Rule-of-Two warnings that involve exec entries (named `exec:NAME`): an
    entry that completes the trifecta by itself (refused at every start unless allow_trifecta),
    and servers and entries that complete it together (grants combining them are refused).
    Nothing when the servers alone already complete it (that warning is the servers')."""
    from ..core.policy import find_trifecta, trifecta_message

    warnings = []
    for entry in execs.values():
        alone = find_trifecta({entry.grant_name: entry.tags})
        if alone is not None:
            warnings.append(f"exec.{entry.name}: its tags complete the trifecta by themselves "
                            f"({', '.join(sorted(entry.tags))}): `mcpcreds exec {entry.name}` is refused "
                            "unless sidecar.allow_trifecta")
    if servers_trio is None:
        trio = find_trifecta({**targets, **{e.grant_name: e.tags for e in execs.values()}})
        if trio is not None and len(set(trio)) > 1 and any(n.startswith(EXEC_PREFIX) for n in trio):
            warnings.append(f"exec: servers and exec entries together complete the trifecta: "
                            f"{trifecta_message(trio)}; grants that combine them are refused")
    return warnings


def parse_execs(c: Collector, raw: Any, content: ContentPolicy | None = None) -> dict[str, ExecEntry]:
    """Every `[exec.NAME]` table; errors go to the collector with their TOML path. `content`:
    `[gateway]`'s content keys, each entry's defaults."""
    defaults = content if content is not None else ContentPolicy()
    entries: dict[str, ExecEntry] = {}
    for i, (name, value) in enumerate(c.table("exec", raw).items()):
        if not NAME.match(name):
            c.error(key_path("exec", name, i), "exec names use letters, digits, '_', '.', '-'")
            continue
        path = f"exec.{name}"
        t = c.table(path, value)
        c.keys(path, {k: v for k, v in t.items() if k not in CONTENT_KEYS}, EXEC_KEYS)
        if "command" in t or "args" in t:  # spelled out: the rule is the point, not a typo
            c.error(path, "an exec entry never holds a command: it comes from the command line "
                          "(mcpcreds exec NAME -- CMD ARGS...)")
        hosts, allow_hosts = _split_ports(c, join(path, "allow_hosts"), t.get("allow_hosts"))
        private, allow_private = _split_ports(c, join(path, "allow_private"), t.get("allow_private"))
        egress = parse_egress(c, path, {**t, "allow_hosts": allow_hosts, "allow_private": allow_private}, [],
                              needs=NEEDS_HOSTS)
        env = _parse_env(c, join(path, "env"), t.get("env"), egress.mode)
        isolation = c.typed(join(path, "env_isolation"), t.get("env_isolation"), bool, True)
        tags = parse_tags(c, join(path, "tags"), t.get("tags"))
        host_ports = tuple((p, port) for p, port in hosts if p in egress.allow_hosts)
        private_ports = tuple((p, port) for p, port in private if p in egress.allow_private)
        authorization = _parse_authorization(c, path, t.get("authorization"), egress.mode)
        trust = parse_trust(c, path, t, EXEC_TRUST)
        c.warnings.extend(sandbox_warnings(path, t, trust.trust))
        entries[name] = ExecEntry(name, env, isolation, egress, effective_tags(tags, egress.mode),
                                  host_ports, private_ports, authorization, trust,
                                  parse_content(c, path, t, defaults, EXEC_CONTENT_KEYS),
                                  any(k in t for k in POLICY_KEYS))
    return entries


def _parse_authorization(c: Collector, path: str, raw: Any, net: str) -> Authorization | None:
    apath = join(path, "authorization")
    if raw is None:
        if net == CONSENTED:
            c.error(apath, f"net = \"{CONSENTED}\" needs the operator's consent: add authorization = "
                           '{ by = "who allowed it", reason = "why" } to this entry')
        return None
    if net != CONSENTED:
        c.warnings.append(f'{apath}: not used unless net = "{CONSENTED}"')
    if not isinstance(raw, dict):
        c.error(apath, 'expected a table: { by = "who allowed it", reason = "why" }')
        return None
    c.keys(apath, raw, AUTHORIZATION_KEYS)
    said: dict[str, str] = {}
    for key, most in AUTHORIZATION_LIMITS.items():
        value = raw.get(key)
        kpath = join(apath, key)
        if not isinstance(value, str) or not value.strip() or len(value) > most:
            c.error(kpath, f"required: a non-empty string of at most {most} characters")
        elif not value.isprintable():
            c.error(kpath, "must not contain control or format characters")
        elif credential_value(value) is not None:
            c.error(kpath, "looks like a credential: it is written to the audit log")
        else:
            said[key] = value
    return Authorization(said["by"], said["reason"]) if len(said) == len(AUTHORIZATION_LIMITS) else None


def split_port(entry: str) -> tuple[str, int | None]:
    """`host:port`, `[v6]:port`, `cidr:port` -> (host, port); an entry without a port is kept
    whole. ValueError if the port is not a number from 1 to 65535."""
    if entry.startswith("["):
        host, closed, rest = entry[1:].partition("]")
        if not closed or not rest:
            return entry, None
        if not rest.startswith(":"):
            raise ValueError("expected [address]:port")
        return host, _port(rest[1:])
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(port)
    return entry, None


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < len(text) <= 5 and 0 < int(text) <= MAX_PORT):
        raise ValueError("the port must be a number from 1 to 65535")
    return int(text)


def _split_ports(c: Collector, path: str, raw: Any) -> tuple[list[tuple[str, int | None]], Any]:
    """`host:port` entries of a host list: (host, port) pairs, and the list without the ports (as
    `parse_egress` reads it; anything but a list of strings is left for it to refuse)."""
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        return [], raw
    pairs: list[tuple[str, int | None]] = []
    for i, entry in enumerate(raw):
        try:
            host, port = split_port(entry)
        except ValueError as exc:
            c.error(f"{path}[{i}]", str(exc))  # never the entry itself
            continue
        try:
            pattern = parse_host_pattern(host) if path.endswith("allow_hosts") else host
        except ValueError:
            pattern = host  # parse_egress says why
        pairs.append((pattern, port))
    return pairs, [host for host, _ in pairs]


def _parse_env(c: Collector, path: str, raw: Any, net: str) -> dict[str, Template]:
    out: dict[str, Template] = {}
    table = c.table(path, raw)
    if len(table) > MAX_ENV:
        c.error(path, f"at most {MAX_ENV} variables")
        return out
    for i, (name, value) in enumerate(table.items()):
        vpath = key_path(path, name, i)
        if not ENV_NAME.match(name):
            c.error(vpath, "not a valid environment variable name (letters, digits, '_'; at most 128)")
            continue
        if net != "inherit" and name.upper() in PROXY_VARS:
            c.error(vpath, f"set by mcpcreds for net = {net!r}: the session's proxy")
            continue
        if isinstance(value, str) and "\0" in value:
            c.error(vpath, "must not contain a NUL character")
            continue
        template = c.template(vpath, value, credential=credential_name(name), public=NO_LITERAL)
        if template is not None:
            out[name] = template
    return out
