"""Least privilege for agents: the Rule of Two, and which tools of a server an agent may see.

Rule of Two: no single agent may hold untrusted input, sensitive data and egress at once. Each
server carries tags among `untrusted_input`, `sensitive`, `egress`; an untagged server counts as
`untrusted_input` (config.py already resolves that into `Target.tags`).

Trust policy (the semantics of the seed's `ServerEntry`):

| trust       | no `tool_allowlist`                     | with `tool_allowlist`         |
|-------------|-----------------------------------------|-------------------------------|
| `trusted`   | every tool                              | every tool (list ignored)     |
| `untrusted` | none, unless `allow_untrusted_without_allowlist` (then all, with a warning) | those listed |
| `sandboxed` | none (the escape hatch is never honoured) | those listed                |

`untrusted` is the default. A non-empty `expected_tools` is an attestation list: a tool the
server offers outside it is dropped for `untrusted`/`sandboxed` and kept with a warning for
`trusted`; an expected tool the server does not offer is warned about. An empty list means
"no attestation".

An allowlist entry is a tool name or a prefix pattern (`read_*`: every tool whose name starts with
`read_`; `*` alone: every tool). `tool_exclude` (names or patterns) hides what it matches whatever
the trust. A catalog entry's lists are a ceiling (`ceiling_allow`, `ceiling_exclude`): a tool
outside any of them is hidden whatever the trust, so a server that names the entry can only narrow
them; a server without an allowlist of its own takes the ceiling's as its allowlist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import Forbidden

TRUST_LEVELS: Final = ("trusted", "untrusted", "sandboxed")
DEFAULT_TRUST: Final = "untrusted"
TRIFECTA: Final = ("untrusted_input", "sensitive", "egress")
_UNTAGGED: Final = frozenset({"untrusted_input"})
_WHAT: Final = {"untrusted_input": "untrusted input", "sensitive": "sensitive data", "egress": "egress"}


# ---------------------------------------------------------------------------- Rule of Two


def find_trifecta(servers: Mapping[str, frozenset[str]]) -> tuple[str, str, str] | None:
    """The servers giving untrusted input, sensitive data and egress, or None if some is missing.

    For each tag, the first server by name that carries it; one server may fill several places.
    """
    chosen: list[str] = []
    for tag in TRIFECTA:
        name = next((n for n in sorted(servers) if tag in (servers[n] or _UNTAGGED)), None)
        if name is None:
            return None
        chosen.append(name)
    return chosen[0], chosen[1], chosen[2]


def trifecta_message(trio: tuple[str, str, str]) -> str:
    a, b, c = trio
    return (f"grant would give one agent untrusted input ({a}), sensitive data ({b}) and egress ({c}): "
            "the Rule of Two forbids all three")


def check_rule_of_two(servers: Mapping[str, frozenset[str]], *, allow_trifecta: bool = False) -> str | None:
    """Raise Forbidden if the servers complete the trifecta; with `allow_trifecta`, return the
    message as a warning instead. None when the Rule of Two holds."""
    trio = find_trifecta(servers)
    if trio is None:
        return None
    message = trifecta_message(trio)
    if not allow_trifecta:
        raise Forbidden(message, servers=list(dict.fromkeys(trio)))
    return message


# ---------------------------------------------------------------------------- tool patterns

MAX_PATTERN: Final = 128


def tool_pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is not a tool pattern (a tool name, or a prefix ending in one `*`), or None."""
    if not 0 < len(pattern) <= MAX_PATTERN or not pattern.isprintable():
        return f"expected a tool name or `prefix*` pattern of 1 to {MAX_PATTERN} printable characters"
    if "*" in pattern[:-1]:
        return "a pattern takes one `*`, at its end (`prefix*`)"
    return None


def tool_matches(pattern: str, name: str) -> bool:
    """Whether tool `name` is matched by `pattern` (exactly, or by its prefix before a final `*`)."""
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


def matches_any(patterns: Iterable[str], name: str) -> bool:
    return any(tool_matches(p, name) for p in patterns)


def pattern_covers(outer: str, inner: str) -> bool:
    """Whether every tool name `inner` matches is matched by `outer` too (a tool name never holds a
    `*`, so a `*` is always a pattern's)."""
    if outer.endswith("*"):
        return inner.startswith(outer[:-1])
    return inner == outer


def patterns_cover(outer: Iterable[str], inner: Iterable[str]) -> bool:
    """Whether the patterns `outer` match every name the patterns `inner` match."""
    wide = tuple(outer)
    return all(any(pattern_covers(o, i) for o in wide) for i in inner)


def intersect_patterns(a: Iterable[str], b: Iterable[str]) -> tuple[str, ...]:
    """The patterns matching exactly the tool names both `a` and `b` match: where two patterns
    overlap, one covers the other (prefixes), and the narrower is what both match."""
    found: list[str] = []
    others = tuple(b)
    for x in a:
        for y in others:
            if pattern_covers(x, y):
                found.append(y)
            elif pattern_covers(y, x):
                found.append(x)
    unique = tuple(dict.fromkeys(found))
    return tuple(p for p in unique if not any(q != p and pattern_covers(q, p) for q in unique))


# ---------------------------------------------------------------------------- trust policy


@dataclass(slots=True)
class ToolDecision:
    tools: list[str] = field(default_factory=list)      # exposed, in the server's order
    hidden: list[str] = field(default_factory=list)     # offered by the server, not exposed
    warnings: list[str] = field(default_factory=list)


def visible_tools(trust: str, tools: Iterable[str], *, tool_allowlist: Sequence[str] | None = None,
                  expected_tools: Sequence[str] | None = None,
                  allow_untrusted_without_allowlist: bool = False, tool_exclude: Sequence[str] = (),
                  ceiling_allow: Sequence[Sequence[str]] = (), ceiling_exclude: Sequence[str] = ()
                  ) -> ToolDecision:
    """Which of a server's `tools` an agent may see under this trust policy (see the module doc)."""
    if trust not in TRUST_LEVELS:
        raise ValueError(f"unknown trust: expected one of {', '.join(TRUST_LEVELS)}")
    policy = TrustPolicy(trust, None if tool_allowlist is None else tuple(tool_allowlist),
                         tuple(expected_tools or ()), allow_untrusted_without_allowlist, tuple(tool_exclude),
                         tuple(tuple(c) for c in ceiling_allow), tuple(ceiling_exclude))
    offered = list(dict.fromkeys(tools))
    decision = ToolDecision()
    if expected_tools:
        expected = set(expected_tools)
        unexpected = [t for t in offered if t not in expected]
        if unexpected:
            verdict = "exposed anyway (trusted)" if trust == "trusted" else "hidden"
            decision.warnings.append(f"tools not in expected_tools, {verdict}: {', '.join(unexpected)}")
        if missing := [t for t in dict.fromkeys(expected_tools) if t not in offered]:
            decision.warnings.append(f"expected tools the server does not offer: {', '.join(missing)}")
    own = tool_allowlist
    if trust == "untrusted" and own is None and not ceiling_allow:
        if allow_untrusted_without_allowlist:
            decision.warnings.append(
                "untrusted server without tool_allowlist: every tool exposed because "
                "allow_untrusted_without_allowlist = true; consider an explicit tool_allowlist")
        else:
            decision.warnings.append(
                "untrusted server without tool_allowlist: no tool exposed (fail closed); declare a "
                "tool_allowlist or set allow_untrusted_without_allowlist = true")
    elif trust != "trusted" and not own and not (own is None and ceiling_allow):
        how = "without" if own is None else "with an empty"
        decision.warnings.append(f"{trust} server {how} tool_allowlist: no tool exposed")
    if trust == "sandboxed" and allow_untrusted_without_allowlist:
        decision.warnings.append("allow_untrusted_without_allowlist is ignored for a sandboxed server")
    for tool in offered:
        (decision.tools if policy.allows(tool) else decision.hidden).append(tool)
    return decision


@dataclass(frozen=True, slots=True)
class TrustPolicy:
    """The trust fields of one server. The default is the safe one: `untrusted`, no tools.

    `tool_exclude`: what the server's own `tool_exclude` hides; `ceiling_allow`: the allowlists of
    the catalog entries over it (a tool must match each), `ceiling_exclude`: their exclude lists."""

    trust: str = DEFAULT_TRUST
    tool_allowlist: tuple[str, ...] | None = None
    expected_tools: tuple[str, ...] = ()
    allow_untrusted_without_allowlist: bool = False
    tool_exclude: tuple[str, ...] = ()
    ceiling_allow: tuple[tuple[str, ...], ...] = ()
    ceiling_exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.trust not in TRUST_LEVELS:
            raise ValueError(f"unknown trust: expected one of {', '.join(TRUST_LEVELS)}")
        if self.tool_allowlist is not None:
            object.__setattr__(self, "tool_allowlist", tuple(self.tool_allowlist))
        object.__setattr__(self, "expected_tools", tuple(self.expected_tools))
        object.__setattr__(self, "tool_exclude", tuple(self.tool_exclude))
        object.__setattr__(self, "ceiling_allow", tuple(tuple(c) for c in self.ceiling_allow))
        object.__setattr__(self, "ceiling_exclude", tuple(self.ceiling_exclude))

    @property
    def effective_allowlist(self) -> tuple[str, ...] | None:
        """The allowlist a server that is not trusted is held to: its own, else its catalog
        entry's (None: neither has one)."""
        if self.tool_allowlist is not None:
            return self.tool_allowlist
        return self.ceiling_allow[0] if self.ceiling_allow else None

    @property
    def exposes_nothing(self) -> bool:
        """Whether the policy hides every tool whatever the server lists."""
        if any(not ceiling for ceiling in self.ceiling_allow):
            return True
        if self.trust == "trusted":
            return False
        if self.tool_allowlist is not None:
            return not self.tool_allowlist
        if self.ceiling_allow:
            return False
        return not (self.trust == "untrusted" and self.allow_untrusted_without_allowlist)

    @property
    def exposed_patterns(self) -> tuple[str, ...] | None:
        """The policy's allow rules as one list of patterns (what `allows` admits before the
        exclude lists; `()`: no tool), None: any tool. What a client that knows one allow list
        and one exclude list is told (`spawn-payload --format agentd`)."""
        allowed: tuple[str, ...] | None = None
        rules = list(self.ceiling_allow)
        if self.trust != "trusted":
            if self.expected_tools:  # names, matched exactly: a tool name never holds a `*`
                rules.append(tuple(t for t in self.expected_tools if "*" not in t))
            if self.tool_allowlist is not None:
                rules.append(self.tool_allowlist)
            elif not self.ceiling_allow and not (self.trust == "untrusted"
                                                 and self.allow_untrusted_without_allowlist):
                return ()
        for rule in rules:
            allowed = tuple(dict.fromkeys(rule)) if allowed is None else intersect_patterns(allowed, rule)
        return allowed

    @property
    def excluded_patterns(self) -> tuple[str, ...]:
        """Every pattern that hides a tool whatever the rest says: the server's and its catalog
        entry's."""
        return tuple(dict.fromkeys((*self.tool_exclude, *self.ceiling_exclude)))

    def filter(self, tools: Iterable[str]) -> ToolDecision:
        return visible_tools(self.trust, tools, tool_allowlist=self.tool_allowlist,
                             expected_tools=self.expected_tools,
                             allow_untrusted_without_allowlist=self.allow_untrusted_without_allowlist,
                             tool_exclude=self.tool_exclude, ceiling_allow=self.ceiling_allow,
                             ceiling_exclude=self.ceiling_exclude)

    def allows(self, tool: str) -> bool:
        """Whether a call to `tool` is within the policy (the same rule as `filter`)."""
        return self.hidden_by(tool) is None

    def hidden_by(self, tool: str) -> str | None:
        """The key that hides `tool` (None when the policy exposes it): `tool_allowlist` (outside
        a catalog entry's, not in the server's own, or none given to a server that is not
        trusted), `tool_exclude`, or `expected_tools`."""
        if any(not matches_any(ceiling, tool) for ceiling in self.ceiling_allow):
            return "tool_allowlist"
        if matches_any(self.tool_exclude, tool) or matches_any(self.ceiling_exclude, tool):
            return "tool_exclude"
        if self.trust == "trusted":
            return None
        if self.expected_tools and tool not in self.expected_tools:
            return "expected_tools"
        if self.tool_allowlist is not None:
            return None if matches_any(self.tool_allowlist, tool) else "tool_allowlist"
        if self.ceiling_allow:
            return None  # the catalog entry's allowlist is the server's (matched above)
        if self.trust == "untrusted" and self.allow_untrusted_without_allowlist:
            return None
        return "tool_allowlist"


# ---------------------------------------------------------------------------- MCP sessions

MAX_TOOL_PAGES: Final = 100


async def list_allowed_tools(session: Any, policy: TrustPolicy) -> list[Any]:
    """The tools of an MCP `ClientSession` that `policy` exposes (every page of `tools/list`).

    Duck-typed: `session.list_tools()` returns an object with `.tools` (each with `.name`) and
    `.next_cursor`; the MCP SDK is imported only when a second page is needed.
    """
    result = await session.list_tools()
    tools = list(result.tools)
    cursor = _next_cursor(result)
    pages = 1
    while cursor is not None and pages < MAX_TOOL_PAGES:
        from mcp.types import PaginatedRequestParams

        result = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        tools.extend(result.tools)
        cursor, pages = _next_cursor(result), pages + 1
    allowed = set(policy.filter(t.name for t in tools).tools)
    return [t for t in tools if t.name in allowed]


def _next_cursor(result: Any) -> str | None:
    """The cursor of the next page: `next_cursor` in MCP SDK 2.x, `nextCursor` in 1.x."""
    cursor = getattr(result, "next_cursor", None)
    return cursor if cursor is not None else getattr(result, "nextCursor", None)


def check_tool_call(policy: TrustPolicy, tool_name: str, *, server: str | None = None) -> None:
    """Raise Forbidden for a call to a tool the policy hides."""
    if not policy.allows(tool_name):
        where = f" of server {server!r}" if server else ""
        raise Forbidden(f"tool {tool_name!r}{where} is not exposed by its trust policy ({policy.trust})",
                        tool=tool_name)
