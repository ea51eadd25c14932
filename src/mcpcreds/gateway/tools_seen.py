"""What the gateway saw of each server's tools, for `mcpcreds status`: how many tools a server
offers, how many of them the gateway exposes now, and why the others are not.

- `ToolsSeen.listed(server, tools, more)`: the names a `tools/list` answer offered, as the server
  sent them (before the trust policy, a grant or the pins took any out). A listing in pages
  (`nextCursor`) is gathered page by page; the next listing replaces it. In this sidecar's memory
  only (none seen since it started: none known), bounded: MAX_SERVERS servers, MAX_PINNED_TOOLS
  names each.
- `tools_status(target, seen, changed)`: the server's row, judged by the config of now (a reload
  that widens the allowlist shows at once): `seen` (null: none seen yet), `exposed`, `hidden`
  (reason -> count), `closed_by` (the policy exposes nothing whatever the server offers) and
  `seen_at`. The reasons: `no_tool_allowlist` (not trusted, no allowlist), `tool_allowlist` (not
  matched by it, or by its catalog entry's), `tool_exclude` (matched by it), `expected_tools`,
  `tool_metadata` (listed, but its calls are refused: data_flow) and `pin_changed` (its definition
  changed since it was pinned: withheld until approved), the same rules, in the same order, as
  `mcpcreds tools SERVER`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..config.model import Target
from ..config.servers import exposes_no_tool
from ..config.tool_meta import ToolMeta
from ..core.policy import TrustPolicy
from ..errors import McpcredsError
from ..protocol.tool_meta import data_flow, meta_for
from ..state.pins import MAX_PINNED_TOOLS, PinStore, valid_name

MAX_SERVERS: Final = 1024
REASONS: Final = ("no_tool_allowlist", "tool_allowlist", "tool_exclude", "expected_tools", "tool_metadata",
                   "pin_changed")
PINS_WAIT: Final = 2.0  # seconds a status waits for a server's pins (in the shared state maybe)


@dataclass(slots=True)
class Seen:
    """A server's latest listing: its tool names in the server's order, when it was seen (unix
    time), and whether the server said more pages follow."""

    names: dict[str, None] = field(default_factory=dict)
    at: float = 0.0
    more: bool = False


class ToolsSeen:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._seen: dict[str, Seen] = {}

    def listed(self, server: str, tools: Sequence[Any], more: bool) -> None:
        """One page of a `tools/list` answer; `more`: the server gave a `nextCursor`."""
        entry = self._seen.pop(server, None)  # re-inserted last: the oldest server goes first
        if entry is None or not entry.more:
            entry = Seen()
        if len(self._seen) >= MAX_SERVERS:
            del self._seen[next(iter(self._seen))]
        for tool in tools:
            name = tool.get("name") if isinstance(tool, dict) else None
            if len(entry.names) >= MAX_PINNED_TOOLS:
                break
            if isinstance(name, str) and valid_name(name):
                entry.names[name] = None
        entry.at, entry.more = self.clock(), more
        self._seen[server] = entry

    def get(self, server: str) -> Seen | None:
        return self._seen.get(server)


def policy_reason(policy: TrustPolicy, name: str) -> str | None:
    """The key of the trust policy that hides `name` (None: none does), `no_tool_allowlist` when
    the server is not trusted and has no allowlist, its own or its catalog entry's."""
    reason = policy.hidden_by(name)
    if reason == "tool_allowlist" and policy.tool_allowlist is None and not policy.ceiling_allow:
        return "no_tool_allowlist"
    return reason


def hiding_rule(policy: TrustPolicy, name: str, meta: ToolMeta, changed: bool) -> str | None:
    """The rule that hides `name` (None: it is exposed): a trust policy key, `tool_metadata` (listed
    but its calls refused by data flow, `meta` its metadata), or `pin_changed` (`changed`: its pin
    changed and is withheld until approved)."""
    reason = policy_reason(policy, name)
    if reason is not None:
        return reason
    if data_flow(meta, policy.trust).verdict == "refuse":
        return "tool_metadata"
    return "pin_changed" if changed else None


def hidden_by(target: Target, name: str, changed: Collection[str]) -> str | None:
    """Why the gateway does not expose `name` of `target` now (None: it does)."""
    return hiding_rule(target.trust, name, meta_for(name, target.content.tool_metadata)[0], name in changed)


def tools_status(target: Target, seen: Seen | None, changed: Collection[str]) -> dict[str, Any]:
    """The server's row of `tools` in `GET /v1/status` (see the module doc); `changed`: the seen
    tools whose pins are changed and withheld (empty when `pin_tools` is off)."""
    closed_by = None
    if exposes_no_tool(target.trust):
        closed_by = "no_tool_allowlist" if target.trust.effective_allowlist is None else "tool_allowlist"
    if seen is None:
        return {"seen": None, "exposed": None, "hidden": {}, "closed_by": closed_by, "seen_at": None}
    hidden = Counter(reason for name in seen.names if (reason := hidden_by(target, name, changed)))
    return {"seen": len(seen.names), "exposed": len(seen.names) - sum(hidden.values()),
            "hidden": {r: hidden[r] for r in REASONS if r in hidden}, "closed_by": closed_by,
            "seen_at": round(seen.at, 3)}


async def status_rows(targets: Iterable[Target], seen: ToolsSeen, pins: PinStore
                      ) -> dict[tuple[str, str], dict[str, Any]]:
    """The `tools` row of each server the gateway serves, by (name, cache key): servers of one
    service share its key."""
    rows = {}
    for target in targets:
        if target.gateway.serves_proxy:
            listing = seen.get(target.name)
            withheld = await _withheld(target, listing, pins)
            rows[target.name, target.key] = tools_status(target, listing, withheld)
    return rows


async def _withheld(target: Target, listing: Seen | None, pins: PinStore) -> frozenset[str]:
    """The seen tools withheld because their definition changed since it was pinned."""
    if listing is None or not listing.names or not target.content.effective_pin_tools(target.trust.trust):
        return frozenset()
    try:
        view = await asyncio.wait_for(pins.lookup(target.name, listing.names), PINS_WAIT)
    except (McpcredsError, OSError, TimeoutError):  # the shared state is away: status answers all the same
        return frozenset()
    return frozenset(name for name in listing.names if view.is_changed(name))
