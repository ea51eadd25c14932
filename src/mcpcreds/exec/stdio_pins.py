"""The tool pins of a policed `[exec.NAME]` entry (`pin_tools`, on unless trusted), as they travel
between the sidecar and `mcpcreds exec`'s relay (pure). The sidecar keeps them in its pin store
under `exec:NAME` (a name no server can have) and sends the store's view with the session
(`view_dict`); the relay judges each `tools/list` against it (`protocol.pins.decide`) and sends back
what it pinned, saw changed or saw back to its pin (`POST /v1/exec/{name}/pins`, `checked_pins`).
An approval (`mcpcreds tools approve exec:NAME`) reaches a relay at its next session.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..errors import InvalidRequest
from ..state.pins import MAX_PINNED_TOOLS, Definition, PinView, valid_name

DIGEST_CHARS: Final = frozenset("0123456789abcdef")
BAD: Final = (f"pins must be {{pin, changed: tool name -> {{digest, definition}}, cleared: [tool names]}}, "
              f"at most {MAX_PINNED_TOOLS} of each")


def view_dict(view: PinView) -> dict[str, Any]:
    return {"pins": dict(view.pins), "changed": dict(view.changed), "total": view.total}


def _digests(raw: Any) -> dict[str, str] | None:
    if not isinstance(raw, dict) or len(raw) > MAX_PINNED_TOOLS or not all(
            valid_name(k) and isinstance(v, str) and len(v) == 64 and set(v) <= DIGEST_CHARS
            for k, v in raw.items()):
        return None
    return dict(raw)


def view_of(raw: Any) -> PinView | None:
    """The pin view of a session answer; None if malformed."""
    if not isinstance(raw, dict) or set(raw) != {"pins", "changed", "total"}:
        return None
    pins, changed, total = _digests(raw["pins"]), _digests(raw["changed"]), raw["total"]
    if pins is None or changed is None or isinstance(total, bool) or not isinstance(total, int) \
            or not 0 <= total <= MAX_PINNED_TOOLS:
        return None
    return PinView(pins, changed, total)


def pins_body(pin: Mapping[str, Definition], changed: Mapping[str, Definition],
              cleared: tuple[str, ...]) -> dict[str, Any]:
    return {"pin": {k: d.to_json() for k, d in pin.items()},
            "changed": {k: d.to_json() for k, d in changed.items()}, "cleared": list(cleared)}


def _definitions(raw: Any) -> dict[str, Definition]:
    if not isinstance(raw, dict) or len(raw) > MAX_PINNED_TOOLS or not all(valid_name(k) for k in raw):
        raise InvalidRequest(BAD)
    out = {}
    for name, value in raw.items():
        d = Definition.read(value)
        if d is None:
            raise InvalidRequest(BAD)
        out[name] = d
    return out


def checked_pins(body: dict[str, Any]) -> tuple[dict[str, Definition], dict[str, Definition], list[str]]:
    """(pin, changed, cleared) of a relay's report; InvalidRequest (never echoing) if malformed."""
    cleared = body.get("cleared")
    if set(body) != {"pin", "changed", "cleared"} or not isinstance(cleared, list) \
            or len(cleared) > MAX_PINNED_TOOLS or not all(valid_name(n) for n in cleared):
        raise InvalidRequest(BAD)
    return _definitions(body["pin"]), _definitions(body["changed"]), list(cleared)
