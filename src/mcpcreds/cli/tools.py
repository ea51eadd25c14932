"""`mcpcreds tools SERVER`: the server's pinned tools and their state (`GET /v1/tools/{server}`).
`mcpcreds tools approve SERVER [TOOL...]`: the difference between each changed tool's pinned and
new definition (a unified diff of their canonical JSON, indented), then the approval (`POST
/v1/tools/{server}/approve` with the digests shown: a tool that changed again meanwhile is not
approved). What a server sent is printed as JSON with every non-ASCII or control character escaped,
so a definition cannot drive the terminal."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

Handler = Callable[[argparse.Namespace], int]


def _path(server: str, action: str = "") -> str:
    return f"/v1/tools/{quote(server, safe=':')}" + (f"/{action}" if action else "")


def _lines(definition: Any, digest: str) -> list[str]:
    if definition is None:
        return [f"(definition not kept, digest {digest})"]
    return json.dumps(definition, indent=2, sort_keys=True, ensure_ascii=True).splitlines()


def difference(tool: dict[str, Any]) -> str:
    """The unified diff of a changed tool's pinned and new definition."""
    name = json.dumps(str(tool.get("name")), ensure_ascii=True)
    old = _lines(tool.get("definition"), str(tool.get("digest")))
    new = _lines(tool.get("new_definition"), str(tool.get("new_digest")))
    return "\n".join(difflib.unified_diff(old, new, f"{name} pinned", f"{name} new", lineterm=""))


def _show(answer: dict[str, Any]) -> None:
    tools = answer.get("tools") or []
    pin = "on" if answer.get("pin_tools") else "off (changes only warn)"
    print(f"server {answer.get('server')}: trust = {answer.get('trust')}, pin_tools {pin}")
    if not tools:
        print("no tool is pinned yet (the gateway pins each tool the first time it lists it)")
        return
    rows = [("TOOL", "STATE", "POLICY", "SENSITIVITY", "DIGEST")]
    for t in tools:
        meta = t.get("metadata") if isinstance(t.get("metadata"), dict) else {}
        shown = f"{meta.get('data_sensitivity', '?')} ({meta.get('source', '?')})"
        if meta.get("capabilities"):
            shown += ": " + ", ".join(str(c) for c in meta["capabilities"])
        rows.append((json.dumps(str(t.get("name")), ensure_ascii=True)[1:-1], str(t.get("state")),
                     "exposed" if t.get("exposed") else f"filtered ({t.get('hidden_by') or 'policy'})",
                     shown, str(t.get("digest"))[:12]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])
    if changed := [t for t in tools if t.get("state") == "changed"]:
        print(f"{len(changed)} changed: withheld until `mcpcreds tools approve {answer.get('server')}`"
              if answer.get("pin_tools") else f"{len(changed)} changed (exposed: pin_tools is off)")


def cmd_tools(args: argparse.Namespace) -> int:
    from ..client.calls import Call, whole
    from .common import client_of, print_json

    words: list[str] = args.words
    approving = words[0] == "approve" and len(words) > 1
    server = words[1] if approving else words[0]
    if not approving and len(words) > 1:
        print("mcpcreds: usage: mcpcreds tools SERVER | mcpcreds tools approve SERVER [TOOL...]",
              file=sys.stderr)
        return 2
    with client_of(args) as client:
        answer = client.run(Call("GET", _path(server), whole))
        if not approving:
            if args.json:
                print_json(answer)
            else:
                _show(answer)
            return 0
        asked = words[2:]
        changed = [t for t in answer.get("tools") or [] if isinstance(t, dict) and t.get("state") == "changed"
                   and (not asked or t.get("name") in asked)]
        if not changed:
            print("nothing to approve: no tool named is changed" if asked else "nothing to approve: no tool "
                  "is changed", file=sys.stderr)
            return 1
        for tool in changed:
            print(difference(tool))
        if sys.stdin.isatty() and not args.yes:
            reply = input(f"approve {len(changed)} changed tool(s)? [y/N] ")
            if reply.strip().lower() not in ("y", "yes"):
                print("not approved", file=sys.stderr)
                return 1
        body = {"tools": [t["name"] for t in changed],
                "digests": {t["name"]: t["new_digest"] for t in changed}}
        result = client.run(Call("POST", _path(server, "approve"), whole, body))
    approved = result.get("approved") or []
    print(f"approved: {', '.join(json.dumps(str(n), ensure_ascii=True) for n in approved) or 'none'}")
    if missed := [t["name"] for t in changed if t["name"] not in approved]:
        print(f"not approved (changed again since shown, or approved already): "
              f"{', '.join(json.dumps(str(n), ensure_ascii=True) for n in missed)}", file=sys.stderr)
        return 1
    return 0


def add_parser(add_client: Callable[[str, Handler, str], Any]) -> None:
    p = add_client("tools", cmd_tools, "tool pinning: `tools SERVER` lists the server's pinned tools and "
                   "their state (pinned, changed); `tools approve SERVER [TOOL...]` shows how each changed "
                   "tool differs from its pin and approves the new definition")
    p.add_argument("words", nargs="+", metavar="WORD", help="SERVER, or: approve SERVER [TOOL...]")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.add_argument("--yes", action="store_true", help="approve without asking (on a terminal)")
