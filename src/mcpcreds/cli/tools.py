"""`mcpcreds tools SERVER`: every tool the server offered at its last listing through the gateway
and every pinned one, with its state and the rule that hides it (`GET /v1/tools/{server}`), and
what to write to expose those a missing `tool_allowlist` hides.
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


# why a tool is hidden, for the lines under the table (the keys of `hidden_by`: gateway/tools_seen.py)
_WHY = {"no_tool_allowlist": "the server is not trusted and has no tool_allowlist, so it exposes no tool",
        "tool_allowlist": "not matched by tool_allowlist (the server's or its catalog entry's)",
        "tool_exclude": "matched by tool_exclude (the server's or its catalog entry's)",
        "expected_tools": "not in expected_tools",
        "tool_metadata": "listed, but its calls are refused: data_sensitivity high on a server not trusted"}


def _name(tool: dict[str, Any]) -> str:
    """The tool's name as a JSON string: escaped, so a name cannot drive the terminal."""
    return json.dumps(str(tool.get("name")), ensure_ascii=True)


def _table(tools: list[dict[str, Any]]) -> None:
    rows = [("TOOL", "STATE", "POLICY", "SENSITIVITY", "DIGEST")]
    for t in tools:
        meta: dict[str, Any] = t["metadata"] if isinstance(t.get("metadata"), dict) else {}
        shown = f"{meta.get('data_sensitivity', '?')} ({meta.get('source', '?')})"
        if meta.get("capabilities"):
            shown += ": " + ", ".join(str(c) for c in meta["capabilities"])
        policy = "exposed" if t.get("exposed") else f"hidden by {t.get('hidden_by') or 'policy'}"
        if t.get("offered") is False:
            policy += " (not offered at the last listing)"
        rows.append((_name(t)[1:-1], str(t.get("state")), policy, shown, str(t.get("digest") or "-")[:12]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])


def _show(answer: dict[str, Any]) -> None:
    tools = [t for t in answer.get("tools") or [] if isinstance(t, dict)]
    server = answer.get("server")
    pin = "on" if answer.get("pin_tools") else "off (changes only warn)"
    print(f"server {server}: trust = {answer.get('trust')}, pin_tools {pin}")
    if answer.get("seen") is None:
        print(f"no tools/list of {server} seen since the sidecar started: list its tools through the gateway "
              "(any MCP client), then run this again to see every tool it offers")
    elif not answer.get("seen"):
        print(f"{server} offered no tool at its last listing")
    if not tools:
        return
    _table(tools)
    offered = [t for t in tools if t.get("offered")]
    for rule, why in _WHY.items():
        if hidden := [t for t in offered if t.get("hidden_by") == rule]:
            print(f"{len(hidden)} hidden by {rule}: {why}")
    if closed := [_name(t) for t in offered if t.get("hidden_by") == "no_tool_allowlist"]:
        print(f"to expose some, name those the agent needs in the server's entry:\n"
              f"  tool_allowlist = [{', '.join(closed)}]")
    if changed := [t for t in tools if t.get("state") == "changed"]:
        print(f"{len(changed)} changed: withheld until `mcpcreds tools approve {server}`"
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
    p = add_client("tools", cmd_tools, "`tools SERVER` lists every tool the server offered at its last "
                   "listing through the gateway and every pinned one: its state (pinned, changed, unpinned) "
                   "and the rule that hides it; `tools approve SERVER [TOOL...]` shows how each changed "
                   "tool differs from its pin and approves the new definition")
    p.add_argument("words", nargs="+", metavar="WORD", help="SERVER, or: approve SERVER [TOOL...]")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.add_argument("--yes", action="store_true", help="approve without asking (on a terminal)")
