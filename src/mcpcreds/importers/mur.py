"""mur's agent profile (`mcp_servers:`, `McpServerEntry` with its `McpServerNetwork`) -> mcpcreds
(pure).

    mcp_servers:
      - name: browser
        command: npx                   # stdio: an [exec.NAME] entry (the command goes to the client)
        args: ["-y", "@acme/browser-mcp"]
        timeout_secs: 120
        network:                       # -> net, allow_hosts, deny_hosts, authorization
          mode: restricted             # inherit | restricted | broad_audited | off
          allow_hosts: ["example.com", "*.api.example.com"]
      - name: remote
        url: https://mcp.example.com/mcp            # http: [[servers]]
        auth: { kind: bearer, token: "mur:remote" }  # a keychain reference -> {{secret:NAME}}

Host patterns mean the same in both: `*.example.com` matches `example.com` and every name under
it. mur's own import rules are kept: `broad_audited` without an `authorization` becomes `inherit`,
and `restricted` with no `allow_hosts` (nothing allowed) becomes `off`."""

from __future__ import annotations

import datetime
import re
import shlex
from collections.abc import Mapping
from typing import Any, Final

from ..config.exec import split_port
from ..core.credshape import credential_value
from ..net.egress import parse_host_pattern
from .common import Notes, duration, endpoint, entry_name, label
from .emit import Document, Table
from .zeph import exec_line

ENTRY: Final = ("name", "command", "args", "url", "auth", "network", "timeout_secs", "binary_sha256",
                "description_hash", "publisher", "installed_at", "requires_programs")
NETWORK: Final = ("mode", "allow_hosts", "deny_hosts", "authorization")
MODES: Final = ("inherit", "restricted", "broad_audited", "off")
NOT_CARRIED: Final = {
    "binary_sha256": "mcpcreds does not pin the binary: the command comes from the MCP client's config",
    "description_hash": "mcpcreds pins each tool's definition instead (pin_tools, on unless trusted)",
    "publisher": "display-only metadata: not carried over",
    "installed_at": "display-only metadata: not carried over",
    "requires_programs": "mur's dependency list: not carried over",
}
_REF: Final = re.compile(r"[^A-Za-z0-9]+")


def translate(data: Mapping[str, Any], notes: Notes) -> Document:
    doc = Document()
    notes.unknown("", data, ("mcp_servers",), "a mur profile setting with no mcpcreds counterpart: not "
                                              "carried over")
    servers = data.get("mcp_servers")
    if not isinstance(servers, list):
        notes.drop("mcp_servers", "expected a list of servers")
        return doc
    taken: set[str] = set()
    for i, entry in enumerate(servers):
        where = f"mcp_servers[{i}]"
        if not isinstance(entry, Mapping):
            notes.drop(where, "expected a table")
            continue
        name = entry_name(notes, entry.get("name"), where, f"server-{i + 1}", taken)
        notes.unknown(where, entry, ENTRY, "not a field of mur's McpServerEntry: not carried over")
        for key, why in NOT_CARRIED.items():
            if key in entry:
                notes.drop(f"{where}.{key}", why)
        if entry.get("url") is not None:
            _remote(entry, name, where, doc, notes)
        elif isinstance(entry.get("command"), str) and entry["command"]:
            _stdio(entry, name, where, doc, notes)
        else:
            notes.drop(where, "neither a command nor a url: not carried over")
    inherit = [t.name.partition(".")[2] for t in doc.tables if t.name.startswith("exec.")
               and t.get("net") in (None, "inherit")]
    if inherit:
        notes.differ(f"exec {', '.join(inherit)}: net = inherit: the child reaches the network as its caller "
                     "does; mur ran such a server under the agent's OS sandbox (its ports restricted)")
    return doc


def _stdio(entry: Mapping[str, Any], name: str, where: str, doc: Document, notes: Notes) -> None:
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        notes.drop(where, "args must be a list of strings: not carried over")
        return
    table = Table(f"exec.{name}", note=f"from mur {where} (stdio): the command goes in the MCP client's "
                                      "config")
    if "network" in entry:
        _network(entry["network"], table, name, f"{where}.network", notes, exec_entry=True)
    _timeout(entry, table, where, notes)
    doc.tables.append(table)
    notes.commands.append(exec_line(name, entry["command"], args, where, notes))


def _remote(entry: Mapping[str, Any], name: str, where: str, doc: Document, notes: Notes) -> None:
    url = endpoint(notes, entry.get("url"), f"{where}.url")
    if url is None:
        return
    table = Table("servers", array=True, note=f"from mur {where} (remote)")
    table.set("name", name, f"mur {where}.name")
    table.set("endpoint", url, "mur url: same meaning")
    if "auth" in entry:
        _auth(entry["auth"], table, name, f"{where}.auth", notes)
    if "network" in entry:
        _network(entry["network"], table, name, f"{where}.network", notes, exec_entry=False)
    _timeout(entry, table, where, notes)
    table.set("trust", "untrusted", "mur has no trust level for a server; mcpcreds' default, written out")
    doc.tables.append(table)


def _timeout(entry: Mapping[str, Any], table: Table, where: str, notes: Notes) -> None:
    if "timeout_secs" in entry and (seconds := duration(notes, entry["timeout_secs"],
                                                        f"{where}.timeout_secs")) is not None:
        table.set("timeout", seconds, "mur timeout_secs: the wait for a tool call's answer (an [exec] entry "
                                      "with it is relayed by mcpcreds, which applies it)")


def _auth(raw: Any, table: Table, name: str, where: str, notes: Notes) -> None:
    if not isinstance(raw, Mapping):
        notes.drop(where, "expected a table")
        return
    kind = raw.get("kind")
    if kind in ("bearer", "oauth"):
        known = ("kind", "token") if kind == "bearer" else (
            "kind", "token_endpoint", "client_id", "access_token", "refresh_token", "expires_at")
        notes.unknown(where, raw, known, "not a field of mur's McpAuth: not carried over")
    if kind == "bearer":
        secret = _secret_ref(raw.get("token"), name, "token", f"{where}.token", notes)
        table.set("headers", {"Authorization": f"Bearer {secret}"},
                  "mur auth bearer: the token from the sidecar's secrets, not mur's keychain")
    elif kind == "oauth":
        auth: dict[str, Any] = {"kind": "oauth2", "grant": "authorization_code"}
        for key, target in (("token_endpoint", "token_url"), ("client_id", "client_id")):
            if isinstance(raw.get(key), str):
                auth[target] = raw[key]
        for key in ("access_token", "refresh_token", "expires_at"):
            if key in raw:
                notes.drop(f"{where}.{key}", "mur's keychain holds the login: run mcpcreds login for a "
                                             "new one")
        table.set("auth", auth, "mur auth oauth: a person's login, run once with mcpcreds login")
        notes.logins.append(f"mcpcreds login {shlex.quote(name)}")
    else:
        notes.drop(where, f"auth of kind {label(kind, 'another kind')!r}: not carried over")


def _secret_ref(raw: Any, name: str, what: str, where: str, notes: Notes) -> str:
    """mur keeps a credential in the OS keychain under a reference; here it is a secret whose name
    comes from that reference (a literal credential in its place is taken out all the same)."""
    if isinstance(raw, Mapping):
        raw = raw.get("account") or raw.get("key") or raw.get("name")
    if isinstance(raw, str) and credential_value(raw) is None and len(raw) <= 128:
        secret = _REF.sub("_", raw).strip("_").upper() or f"{name}_{what}".upper()
        secret = notes.secret_name(secret, "mur-ref:" + raw)
        notes.secrets.setdefault(secret, f"{where}: the value mur keeps in its keychain under that name")
        return "{{secret:" + secret + "}}"
    if isinstance(raw, str):
        return notes.value(raw, where=where, hint=f"{name}_{what}", credential=True)
    notes.drop(where, "expected a keychain reference")
    secret = notes.secret_name(f"{name}_{what}", "mur-missing:" + where)
    notes.secrets.setdefault(secret, f"{where}: the credential mur used there")
    return "{{secret:" + secret + "}}"


def _hosts(raw: Any, where: str, notes: Notes, exec_entry: bool) -> tuple[list[str], bool]:
    """The patterns mcpcreds reads as mur does, and whether any could not be carried over."""
    if not isinstance(raw, list):
        notes.drop(where, "expected a list of host patterns")
        return [], True
    kept, lost = [], False
    for i, entry in enumerate(raw):
        try:
            host = split_port(entry)[0] if exec_entry else entry
            parse_host_pattern(host)
            kept.append(entry)
        except (ValueError, TypeError):
            notes.drop(f"{where}[{i}]", "a host pattern mcpcreds does not read ('name.example', "
                                        "'*.example.com', an IP): not carried over")
            lost = True
    return kept, lost


def _network(raw: Any, table: Table, name: str, where: str, notes: Notes, exec_entry: bool) -> None:
    if not isinstance(raw, Mapping):
        notes.drop(where, "expected a table")
        return
    notes.unknown(where, raw, NETWORK, "not a field of mur's McpServerNetwork: not carried over")
    mode = raw.get("mode", "inherit")
    if mode not in MODES:
        notes.drop(f"{where}.mode", "not a mode mur writes: off written (nothing allowed)")
        mode = "off"
    allow, _ = _hosts(raw.get("allow_hosts", []), f"{where}.allow_hosts", notes, exec_entry)
    deny, deny_lost = _hosts(raw.get("deny_hosts", []), f"{where}.deny_hosts", notes, exec_entry)
    note = f"mur network.mode = {mode}: same meaning"
    authorization = raw.get("authorization")
    if mode == "broad_audited":
        consent = _consent(authorization, where, notes)
        if consent is None:
            mode, note = "inherit", ("mur broad_audited without an authorization: downgraded to inherit, as "
                                     "mur does")
            notes.differ(f"{name}: network.mode = broad_audited without an authorization: downgraded to "
                         "inherit (as mur does on import); to consent again, set net = \"broad_audited\" "
                         "with authorization = { by, reason }")
        elif exec_entry:
            table.set("authorization", consent, "mur authorization: who consented; the sidecar audits it")
        else:
            notes.drop(f"{where}.authorization", "a [[servers]] entry records no consent: its calls are "
                                                 "audited")
        if deny_lost and mode == "broad_audited":
            mode, note = "off", ("a deny_hosts pattern could not be carried over: off (nothing allowed), to "
                                 "fail closed")
            notes.differ(f"{name}: a deny_hosts pattern mcpcreds does not read: net = \"off\" until it is "
                         "rewritten")
    elif authorization is not None:
        notes.drop(f"{where}.authorization", "used with broad_audited only: not carried over")
    if mode == "restricted" and not allow:
        mode, note = "off", "mur restricted with no allow_hosts allows nothing: off"
        notes.differ(f"{name}: network.mode = restricted with no allow_hosts (nothing allowed in mur): "
                     "net = \"off\"")
    if mode != "broad_audited" and raw.get("deny_hosts"):
        notes.drop(f"{where}.deny_hosts", f"mur ignores deny_hosts in mode {mode}: not carried over")
        deny = []
    table.set("net", mode, note)
    if mode == "restricted":
        table.set("allow_hosts", allow, "mur allow_hosts: the same patterns (*.example.com also matches "
                                        "example.com, in mur and here)")
    elif allow:
        notes.drop(f"{where}.allow_hosts", "mur reads allow_hosts in restricted mode only: not carried over")
    if deny and mode == "broad_audited":
        table.set("deny_hosts", deny, "mur deny_hosts: the same patterns")


def _consent(raw: Any, where: str, notes: Notes) -> dict[str, str] | None:
    if not isinstance(raw, Mapping):
        return None
    by = raw.get("authorized_by")
    if (not isinstance(by, str) or not by.strip() or len(by) > 128 or not by.isprintable()
            or credential_value(by)):
        notes.drop(f"{where}.authorization.authorized_by", "not a name mcpcreds writes to its audit log")
        return None
    when = raw.get("authorized_at_ms")
    at = ""
    if isinstance(when, int) and not isinstance(when, bool) and 0 < when < 2**53:
        stamp = datetime.datetime.fromtimestamp(when / 1000, datetime.UTC)
        at = " on " + stamp.strftime("%Y-%m-%d %H:%M UTC")
    return {"by": by, "reason": f"carried over from mur: broad egress authorized{at}"}
