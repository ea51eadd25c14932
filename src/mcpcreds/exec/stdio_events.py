"""`POST /v1/exec/{name}/events`: what `mcpcreds exec`'s stdio relay decided (exec/stdio_relay.py),
written to the sidecar's audit log and counted, attributed to the exec entry and its caller.

The caller is the one that may open the entry's session (same socket access, same grant check):
the lines say what it reports, under its uid and pid. Everything is bounded and checked against a
closed shape before a line is written; a body that is not one is refused whole, never echoed.
Metrics are labelled by entry and outcome only (tool names come from the server: no label).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from ..core.audit import AuditLog
from ..core.metrics import Metrics
from ..errors import InvalidRequest

MAX_EVENTS: Final = 64  # per request
MAX_FOUND: Final = 32
_TOOL: Final = re.compile(r"[^\x00-\x1f\x7f]{0,128}\Z")
_SHORT: Final = re.compile(r"[\x20-\x7e]{0,64}\Z")
_METRIC_STATUSES: Final = frozenset({"ok", "tool_error", "error", "refused", "withheld", "no_response",
                                     "cancelled", "dropped", "timeout"})
_STATUS: Final = re.compile(r"[a-z_]{1,32}(:-?[0-9]{1,10})?\Z")
MAX_DURATION_MS: Final = 7 * 24 * 3600 * 1000
SCREENED: Final = ("sanitized", "injection", "media")
REASONS: Final = ("sandboxed", "elicitation_enabled")  # declined by the policy
TIMED_OUT: Final = "elicitation_timeout"  # cancelled: the client did not answer in time
SAMPLING_REASONS: Final = ("sandboxed", "sampling_enabled")  # refused by the policy
BAD: Final = ("events must be a list of at most 64 relay events (tool_call, screened, elicitation, "
              "sampling), each of the documented shape")


def _tool_call(e: dict[str, Any]) -> dict[str, Any] | None:
    tool, status, ms = e.get("tool"), e.get("status"), e.get("duration_ms")
    if (set(e) == {"event", "tool", "status", "duration_ms"} and isinstance(tool, str) and _TOOL.match(tool)
            and isinstance(status, str) and _STATUS.match(status) and isinstance(ms, int)
            and not isinstance(ms, bool) and 0 <= ms <= MAX_DURATION_MS):
        return {"tool": tool, "status": status, "duration": round(ms / 1000, 3)}
    return None


def _screened(e: dict[str, Any]) -> dict[str, Any] | None:
    found = e.get("found")
    if (set(e) == {"event", "kind", "found"} and e.get("kind") in SCREENED and isinstance(found, list)
            and len(found) <= MAX_FOUND and all(isinstance(f, str) and _SHORT.match(f) for f in found)):
        return {"kind": e["kind"], "found": found}
    return None


def _elicitation(e: dict[str, Any]) -> dict[str, Any] | None:
    if (set(e) == {"event", "mode", "action", "reason"} and e.get("mode") in ("form", "url")
            and ((e.get("action") == "declined" and e.get("reason") in REASONS)
                 or (e.get("action") == "cancelled" and e.get("reason") == TIMED_OUT))):
        return {"mode": e["mode"], "action": e["action"], "reason": e["reason"]}
    return None


def _sampling(e: dict[str, Any]) -> dict[str, Any] | None:
    if (set(e) == {"event", "action", "reason"} and e.get("action") == "refused"
            and e.get("reason") in SAMPLING_REASONS):
        return {"action": "refused", "reason": e["reason"]}
    return None


_SHAPES: Final = {"tool_call": _tool_call, "screened": _screened, "elicitation": _elicitation,
                  "sampling": _sampling}


def checked_events(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(event, fields) of each event of the body; InvalidRequest if any is not of its shape."""
    raw = body.get("events")
    if set(body) != {"events"} or not isinstance(raw, list) or len(raw) > MAX_EVENTS:
        raise InvalidRequest(BAD)
    out = []
    for e in raw:
        kind = e.get("event") if isinstance(e, dict) else None
        shape = _SHAPES.get(kind) if isinstance(kind, str) else None
        fields = shape(e) if shape is not None else None
        if fields is None:
            raise InvalidRequest(BAD)
        out.append((str(e["event"]), fields))
    return out


def write_events(audit: Callable[[], AuditLog], metrics: Metrics | None, name: str,
                 events: list[tuple[str, dict[str, Any]]], actor: dict[str, Any]) -> None:
    for event, fields in events:
        audit().write(event, exec=name, **fields, **actor)
        if metrics is None:
            continue
        if event == "tool_call":
            status = fields["status"].split(":", 1)[0]
            status = status if status in _METRIC_STATUSES else "other"  # the label's values stay few
            metrics.inc("mcpcreds_exec_tool_calls_total", (("exec", name), ("status", status)),
                        help_text="tools/call requests through mcpcreds exec's relay, by entry and outcome.")
        elif event == "screened":
            metrics.inc("mcpcreds_exec_screened_total", (("exec", name), ("kind", fields["kind"])),
                        help_text="Results mcpcreds exec's stdio relay changed or reported, by entry.")
        elif event == "sampling":
            metrics.inc("mcpcreds_exec_sampling_total", (("exec", name), ("outcome", fields["action"])),
                        help_text="Sampling requests of stdio servers refused by mcpcreds exec, by entry.")
        else:
            metrics.inc("mcpcreds_exec_elicitations_total", (("exec", name), ("outcome", fields["action"])),
                        help_text="Elicitations of stdio servers answered by mcpcreds exec, by entry.")
