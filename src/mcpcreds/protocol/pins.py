"""Tool pinning (rug pulls), apart from any I/O (pure): a tool's definition is pinned the first time
the gateway lists it, and a definition that differs from its pin later is a change an operator
must approve (`mcpcreds tools approve`).

- `decide(view, tools, enforce)` judges one `tools/list` page against the server's pins (`PinView`,
  read from the store before): a tool never seen is pinned now and exposed (the first listing pins
  it); one whose digest equals its pin is exposed; one whose digest differs is `changed`, withheld
  from the listing when `enforce` (`ContentPolicy.effective_pin_tools`), else exposed with a warning
  (a trusted server). A tool that cannot be pinned (a name that is not 1 to MAX_TOOL_NAME printable
  characters, or past MAX_PINNED_TOOLS pins of the server) is withheld when `enforce`, else
  exposed with a warning: the gateway fails closed on what it cannot follow.
- `call_refusals(out, server, view)` refuses each `tools/call` of a tool known to be changed (its
  pin and the digest last seen differ) with -32602 and `data.policy = "pinned"`; a batch holding
  one is refused whole, as `jsonrpc.refusals` does. The answer never repeats the tool name sent.
- `definition(tool)`: its digest (`screen.tool_digest`) and the canonical JSON of what the digest
  covers (`screen.DIGESTED_FIELDS`), which the store keeps to show a difference (None past
  MAX_DEFINITION bytes: the digest alone is kept). The store and `PinView` are state/pins.py's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..state.pins import MAX_DEFINITION, MAX_PINNED_TOOLS, MAX_TOOL_NAME, Definition, PinView, valid_name
from .jsonrpc import INVALID_PARAMS, TOOLS_CALL, Outgoing, error, id_key, whole_batch
from .screen import canonical_definition

MAX_NAMES_SHOWN: Final = 16  # tool names in one warning
PINNED: Final = "pinned"  # data.policy of a refused call


def definition(tool: Mapping[str, Any]) -> Definition:
    """A listed tool's definition: its digest (`screen.tool_digest`), and its canonical JSON up to
    MAX_DEFINITION bytes."""
    text = canonical_definition(tool)
    digest = hashlib.sha256(text.encode("ascii")).hexdigest()
    return Definition(digest, text if len(text) <= MAX_DEFINITION else None)


@dataclass(frozen=True, slots=True)
class PinDecision:
    """A listing judged: `tools` to pass on (in the server's order); `pin` the first definitions
    to pin now; `changed` the changed definitions to record (not recorded yet with that digest);
    `cleared` the tools whose changed record is to go (the server is back to the pin); `withheld`
    the names withheld; `warnings` to log."""

    tools: list[Any]
    pin: dict[str, Definition]
    changed: dict[str, Definition]
    cleared: tuple[str, ...]
    withheld: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def writes(self) -> bool:
        """Whether the store has anything to write."""
        return bool(self.pin or self.changed or self.cleared)


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:MAX_NAMES_SHOWN])
    return shown + (f" and {len(names) - MAX_NAMES_SHOWN} more" if len(names) > MAX_NAMES_SHOWN else "")


def decide(view: PinView, tools: Sequence[Any], enforce: bool) -> PinDecision:
    """One `tools/list` page judged against the server's pins (see the module doc)."""
    pins = dict(view.pins)
    total = view.total
    shown: list[Any] = []
    new: dict[str, Definition] = {}
    changed: dict[str, Definition] = {}
    cleared: list[str] = []
    changed_names: list[str] = []
    unpinnable = 0
    full: list[str] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        name = tool.get("name")
        if not valid_name(name):
            unpinnable += 1
            if not enforce:
                shown.append(tool)
            continue
        assert isinstance(name, str)
        seen = definition(tool)
        pinned = pins.get(name)
        if pinned is None:
            if total >= MAX_PINNED_TOOLS:
                full.append(name)
                if not enforce:
                    shown.append(tool)
                continue
            pins[name] = seen.digest
            new[name] = seen
            total += 1
            shown.append(tool)
        elif pinned == seen.digest:
            if name in view.changed and name not in cleared:
                cleared.append(name)
            shown.append(tool)
        else:
            if view.changed.get(name) != seen.digest:
                changed[name] = seen
            if name not in changed_names:
                changed_names.append(name)
            if not enforce:
                shown.append(tool)
    verdict = "withheld until approved (mcpcreds tools approve)" if enforce else \
        "exposed anyway (pin_tools off)"
    warnings = []
    if changed_names:
        warnings.append(f"tool definitions changed since they were pinned, {verdict}: "
                        f"{_names(changed_names)}")
    if unpinnable:
        warnings.append(f"{unpinnable} tool(s) whose name cannot be pinned (1 to {MAX_TOOL_NAME} printable "
                        f"characters), {'withheld' if enforce else 'exposed anyway'}")
    if full:
        warnings.append(f"the server has {MAX_PINNED_TOOLS} pinned tools, no more can be pinned, "
                        f"{'withheld' if enforce else 'exposed anyway'}: {_names(full)}")
    withheld = (*changed_names, *full) if enforce else ()
    return PinDecision(shown, new, changed, tuple(cleared), tuple(withheld), tuple(warnings))


def refusal(id_: Any, server: str) -> dict[str, Any]:
    """The answer to a `tools/call` of a changed tool (never naming the tool sent)."""
    return error(id_, INVALID_PARAMS, "tools/call refused by the gateway: that tool's definition changed "
                 f"since it was pinned on server {server!r}; an operator must approve the change "
                 f"(mcpcreds tools approve {server})", {"policy": PINNED})


def call_refusals(out: Outgoing, server: str, view: PinView) -> list[dict[str, Any]]:
    """The answers that refuse this POST for calling a changed tool, or [] if none does."""
    return whole_batch(out, {id_key(m.id): refusal(m.id, server) for m in out.requests
                             if m.method == TOOLS_CALL and m.tool is not None and view.is_changed(m.tool)})


def called_tools(out: Outgoing) -> list[str]:
    """The tool names the POST calls (to look their pins up before `call_refusals`)."""
    return list(dict.fromkeys(m.tool for m in out.requests
                              if m.method == TOOLS_CALL and m.tool is not None and valid_name(m.tool)))

