"""`GET /v1/tools/{server}` and `POST /v1/tools/{server}/approve`: every tool the server offered
at its last listing through the gateway (gateway/tools_seen.py: names only) and every pinned one
(state/pins.py), each with the rule that hides it, and the operator's approval of changed
definitions (protocol/pins.py withholds them until then); or the pins of an exec entry (`exec:NAME`,
whose stdio relay pins them). Only exposed tools are pinned, so a hidden tool's description is
never kept. Owner-only: a grant holder is refused before these run (api.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ..config.content import ContentPolicy
from ..core.policy import TrustPolicy
from ..errors import InvalidRequest
from ..gateway.tools_seen import Seen, hiding_rule
from ..protocol.tool_meta import describe, meta_for
from ..state.pins import MAX_PINNED_TOOLS, MAX_TOOL_NAME, Definition, PinStore, ToolPin, valid_name

_DIGEST_CHARS: Final = frozenset("0123456789abcdef")


class PinOwner(Protocol):
    """What owns pins: a server's Target, or an exec entry (ExecPins)."""

    @property
    def name(self) -> str: ...
    @property
    def trust(self) -> TrustPolicy: ...
    @property
    def content(self) -> ContentPolicy: ...


@dataclass(frozen=True, slots=True)
class ExecPins:
    """An exec entry as the owner of its pins: `name` is `exec:NAME`."""

    name: str
    trust: TrustPolicy
    content: ContentPolicy


def _shown(d: Definition) -> Any:
    """A kept definition as the JSON object it is (None when only its digest was kept)."""
    return json.loads(d.text) if d.text is not None else None


def tool_row(target: PinOwner, name: str, pin: ToolPin | None, offered: bool | None) -> dict[str, Any]:
    """One tool: `pin` None when it is not pinned (hidden, so never pinned, or not pinned yet);
    `offered`: whether the last listing offered it (None: no listing seen)."""
    definition = _shown(pin.pinned) if pin is not None else None
    trust = target.trust.trust
    meta, source = meta_for(definition if isinstance(definition, dict) else name,
                            target.content.tool_metadata)
    withheld = pin is not None and pin.state == "changed" and target.content.effective_pin_tools(trust)
    hidden_by = hiding_rule(target.trust, name, meta, withheld)
    row: dict[str, Any] = {"name": name, "state": pin.state if pin is not None else "unpinned",
                           "exposed": hidden_by is None, "hidden_by": hidden_by, "offered": offered,
                           "digest": pin.pinned.digest if pin is not None else None, "definition": definition,
                           "metadata": describe(meta, source)}
    if pin is not None and pin.new is not None and pin.state == "changed":
        row["new_digest"] = pin.new.digest
        row["new_definition"] = _shown(pin.new)
    return row


async def list_tools(store: PinStore, target: PinOwner, seen: Seen | None) -> dict[str, Any]:
    """The tools of the last listing `seen` (in the server's order), then the pinned ones it did
    not offer."""
    pins = {p.name: p for p in await store.tools(target.name)}
    offered = seen.names if seen is not None else {}
    names = [*offered, *(n for n in pins if n not in offered)]
    return {"server": target.name, "trust": target.trust.trust,
            "pin_tools": target.content.effective_pin_tools(target.trust.trust),
            "seen": len(offered) if seen is not None else None,
            "seen_at": round(seen.at, 3) if seen is not None else None,
            "tools": [tool_row(target, n, pins.get(n), n in offered if seen is not None else None)
                      for n in names]}


def approval(body: dict[str, Any]) -> tuple[list[str] | None, dict[str, str] | None]:
    """The tools an approval names (None: every changed one) and the changed digests it expects
    (None: any). Never echoes what was sent."""
    names = body.get("tools")
    if names is not None and (not isinstance(names, list) or len(names) > MAX_PINNED_TOOLS
                              or not all(valid_name(n) for n in names)):
        raise InvalidRequest(f"tools must be an array of at most {MAX_PINNED_TOOLS} tool names, each of 1 to "
                             f"{MAX_TOOL_NAME} printable characters")
    expect = body.get("digests")
    if expect is not None and (not isinstance(expect, dict) or len(expect) > MAX_PINNED_TOOLS or not all(
            valid_name(k) and isinstance(v, str) and len(v) == 64 and set(v) <= _DIGEST_CHARS
            for k, v in expect.items())):
        raise InvalidRequest("digests must be an object: tool name -> the sha256 (64 lowercase hex digits) "
                             f"of the changed definition approved, at most {MAX_PINNED_TOOLS}")
    if set(body) - {"tools", "digests"}:
        raise InvalidRequest("an approval takes tools and digests only")
    return names, expect


async def approve(store: PinStore, target: PinOwner, body: dict[str, Any]) -> dict[str, Any]:
    names, expect = approval(body)
    if names is None and expect is not None:
        names = list(expect)
    approved = await store.approve(target.name, names, expect)
    left = [p.name for p in await store.tools(target.name) if p.state == "changed"]
    return {"server": target.name, "approved": approved, "changed": left}
