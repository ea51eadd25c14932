"""`GET /v1/tools/{server}` and `POST /v1/tools/{server}/approve`: the pinned tools of a server
(state/pins.py) and the operator's approval of changed definitions (gateway/pins.py withholds
them until then), or of an exec entry (`exec:NAME`, whose stdio relay pins them). Owner-only: a
grant holder is refused before these run (api.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ..config.content import ContentPolicy
from ..core.policy import TrustPolicy
from ..errors import InvalidRequest
from ..gateway.tool_meta import data_flow, describe, meta_for
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


def tool_row(target: PinOwner, pin: ToolPin) -> dict[str, Any]:
    definition = _shown(pin.pinned)
    meta, source = meta_for(definition if isinstance(definition, dict) else pin.name,
                            target.content.tool_metadata)
    hidden_by = target.trust.hidden_by(pin.name)
    if hidden_by is None and data_flow(meta, target.trust.trust).verdict == "refuse":
        hidden_by = "tool_metadata"  # listed, but its calls are refused (data_flow)
    row: dict[str, Any] = {"name": pin.name, "state": pin.state, "exposed": hidden_by is None,
                           "hidden_by": hidden_by, "digest": pin.pinned.digest, "definition": definition,
                           "metadata": describe(meta, source)}
    if pin.new is not None and pin.state == "changed":
        row["new_digest"] = pin.new.digest
        row["new_definition"] = _shown(pin.new)
    return row


async def list_tools(store: PinStore, target: PinOwner) -> dict[str, Any]:
    pins = await store.tools(target.name)
    return {"server": target.name, "trust": target.trust.trust,
            "pin_tools": target.content.effective_pin_tools(target.trust.trust),
            "tools": [tool_row(target, p) for p in pins]}


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
