"""agentd-core's YAML config -> mcpcreds (pure).

    services:                      # the catalog: [services.NAME]
      crm: { kind: mcp, endpoint, headers, auth | oauth, aauth, tags, rate, allow, exclude, timeout }
    mcp:
      servers:                     # [[servers]]: a `service:` reference, or an inline endpoint
        - { name, service, endpoint, headers, auth, oauth, aauth, tags, rate, allow, exclude, timeout }
    security: { egress: open | closed }   # [sidecar] egress

agentd has no trust levels: a server's tools are all of them but what `allow`/`exclude` leave out.
The import writes each server `untrusted` (mcpcreds' default) with its patterns as its allowlist,
and says which servers, with no allow list, now show no tool through the gateway."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, Final

from ..config.model import LOGIN_GRANTS
from ..config.reader import key_path
from .common import Notes, duration, endpoint, entry_name, headers, label, rate, tags, tool_list
from .emit import Document, Table

ENTRY: Final = ("kind", "endpoint", "headers", "auth", "oauth", "aauth", "tags", "rate", "allow", "exclude",
                "timeout")
SERVER: Final = ("name", "service", *ENTRY[1:])
RESTATED: Final = ("endpoint", "headers", "auth", "oauth")  # agentd refuses them beside `service`
INHERITED: Final = ("aauth", "rate")  # a reference takes its entry's: mcpcreds refuses them restated
OAUTH: Final = ("token_url", "client_id", "client_secret", "scope")
AUTH_RENAMED: Final = {"account_id": "sso_account_id", "role_name": "sso_role_name"}
AUTH_KEEP: Final = ("kind", "grant", "issuer", "token_url", "client_id", "client_secret", "scopes",
                    "audience", "token", "header", "value", "region", "service", "source", "sso_start_url",
                    "svid", "jwt_svid_file", "svid_file", "key_file")
AUTH_SECRETS: Final = ("client_secret", "token", "value")
NOT_OURS: Final = "an agentd setting with no mcpcreds counterpart: not carried over"


def translate(data: Mapping[str, Any], notes: Notes) -> Document:
    doc = Document()
    notes.unknown("", data, ("services", "mcp", "security"), NOT_OURS)
    _security(data.get("security"), doc, notes)
    catalog = _services(data.get("services"), doc, notes)
    _servers(data.get("mcp"), catalog, doc, notes)
    return doc


def _security(raw: Any, doc: Document, notes: Notes) -> None:
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        notes.drop("security", "expected a table")
        return
    notes.unknown("security", raw, ("egress",), NOT_OURS)
    egress = raw.get("egress")
    if egress in ("open", "closed"):
        doc.table("sidecar").set("egress", egress, "agentd security.egress: same meaning (closed: an "
                                 "endpoint under no services: entry is refused, at load and by the gateway)")
        if egress == "closed":
            notes.differ("security.egress = closed: a server under no catalog entry is a config error here "
                         "(`mcpcreds check`), and a config reload that adds one is refused as a whole")
    elif egress is not None:
        notes.drop("security.egress", "expected open or closed")


def _services(raw: Any, doc: Document, notes: Notes) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """The catalog entries carried over, by their name in the source: (name in the output, entry)."""
    catalog: dict[str, tuple[str, Mapping[str, Any]]] = {}
    if raw is None:
        return catalog
    if not isinstance(raw, Mapping):
        notes.drop("services", "expected a map of catalog entries")
        return catalog
    taken: set[str] = set()
    for i, (source, entry) in enumerate(raw.items()):
        where = key_path("services", str(source), i)
        if not isinstance(entry, Mapping):
            notes.drop(where, "expected a table")
            continue
        kind = entry.get("kind", "mcp")
        if kind != "mcp":
            notes.drop(where, f"a catalog entry of kind {label(kind, 'another kind')!r}, not an MCP server: "
                              "not carried over")
            continue
        name = entry_name(notes, source, where, f"service-{i + 1}", taken)
        table = Table(f"services.{name}", note=f"from agentd {where}")
        if _entry(entry, table, where, name, notes, ENTRY):
            doc.tables.append(table)
            catalog[str(source)] = (name, entry)
    return catalog


def _servers(raw: Any, catalog: dict[str, tuple[str, Mapping[str, Any]]], doc: Document,
             notes: Notes) -> None:
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        notes.drop("mcp", "expected a table")
        return
    notes.unknown("mcp", raw, ("servers",), NOT_OURS)
    servers = raw.get("servers")
    if servers is None:
        return
    if not isinstance(servers, list):
        notes.drop("mcp.servers", "expected a list of servers")
        return
    taken: set[str] = set()
    for i, server in enumerate(servers):
        where = f"mcp.servers[{i}]"
        if not isinstance(server, Mapping):
            notes.drop(where, "expected a table")
            continue
        name = entry_name(notes, server.get("name"), where, f"server-{i + 1}", taken)
        table = Table("servers", array=True, note=f"from agentd {where}")
        table.set("name", name, f"agentd {where}.name")
        service = server.get("service")
        if service is not None:
            if not _reference(server, service, catalog, table, where, notes):
                continue
        elif not _entry(server, table, where, name, notes, SERVER):
            continue
        table.set("trust", "untrusted", "agentd has no trust levels; mcpcreds' default, written out: "
                  "the tools of its tool_allowlist only")
        doc.tables.append(table)


def _reference(server: Mapping[str, Any], service: Any, catalog: dict[str, tuple[str, Mapping[str, Any]]],
               table: Table, where: str, notes: Notes) -> bool:
    if not isinstance(service, str) or service not in catalog:
        notes.drop(where, "names a service that is not in the catalog carried over: not carried over")
        return False
    table.set("service", catalog[service][0], f"agentd {where}.service: same meaning (the entry's endpoint, "
              "credentials, key and bucket)")
    for key in RESTATED:
        if key in server:
            notes.drop(f"{where}.{key}", "restates its service's (agentd refuses that too): the entry's "
                                         "is used")
    for key in INHERITED:
        if key in server:
            notes.drop(f"{where}.{key}", "a server that names a service takes the entry's: not carried over")
    notes.unknown(where, server, SERVER, "not a field of agentd's McpServerSpec: not carried over")
    _timeout(server, table, where, notes)
    _lists_and_tags(server, table, where, notes)
    return True


def _entry(entry: Mapping[str, Any], table: Table, where: str, name: str, notes: Notes,
           known: tuple[str, ...]) -> bool:
    """A catalog entry's or stand-alone server's keys; False when it cannot be carried over."""
    url = endpoint(notes, entry.get("endpoint"), f"{where}.endpoint")
    if url is None:
        notes.drop(where, "no endpoint mcpcreds accepts: the entry is not carried over")
        return False
    notes.unknown(where, entry, known, "not a field of agentd's McpServerSpec: not carried over")
    table.set("endpoint", url, f"agentd {where}.endpoint: same meaning")
    found = headers(notes, entry["headers"], f"{where}.headers", name) if "headers" in entry else None
    if found is not None:
        table.set("headers", found, "agentd headers: secret templates kept as they are")
    if isinstance(entry.get("aauth"), bool):
        table.set("aauth", entry["aauth"], "agentd aauth: same meaning")
    elif "aauth" in entry:
        notes.drop(f"{where}.aauth", "expected true or false")
    if "auth" in entry:
        _auth(entry["auth"], table, f"{where}.auth", name, notes)
    if "oauth" in entry:
        if "auth" in entry:
            notes.drop(f"{where}.oauth", "auth takes precedence (in agentd too): not carried over")
        else:
            _oauth(entry["oauth"], table, f"{where}.oauth", name, notes)
    if "rate" in entry and (found_rate := rate(notes, entry["rate"], f"{where}.rate")) is not None:
        table.set("rate", found_rate, _rate_note(found_rate))
        notes.differ(f"{where}.rate: one bucket shared by every process that uses it, and by every sidecar "
                     "sharing a Redis state; agentd paced each process on its own")
    _timeout(entry, table, where, notes)
    _lists_and_tags(entry, table, where, notes)
    return True


def _timeout(entry: Mapping[str, Any], table: Table, where: str, notes: Notes) -> None:
    if "timeout" in entry and (seconds := duration(notes, entry["timeout"], f"{where}.timeout")) is not None:
        table.set("timeout", seconds, "agentd timeout: the gateway's wait for the server's answer, in "
                                      "seconds")


def _rate_note(text: str) -> str:
    per = text.partition("/")[2].strip()
    if per and not per[0].isdigit():
        return ("agentd rate: agentd's parser refuses this form; mcpcreds reads it (a bucket of that many "
                "per unit)")
    return "agentd rate: the same string means the same bucket, shared by every process here"


def _lists_and_tags(entry: Mapping[str, Any], table: Table, where: str, notes: Notes) -> None:
    if "tags" in entry and (found := tags(notes, entry["tags"], f"{where}.tags")) is not None:
        table.set("tags", found, "agentd tags: same meaning (untagged counts as untrusted_input)")
    if "allow" in entry and (allow := tool_list(notes, entry["allow"], f"{where}.allow")) is not None:
        table.set("tool_allowlist", allow, "agentd allow: the same prefix* patterns; a catalog entry's is a "
                                           "ceiling its servers only narrow")
    if "exclude" in entry and (exclude := tool_list(notes, entry["exclude"], f"{where}.exclude")) is not None:
        table.set("tool_exclude", exclude, "agentd exclude: same meaning, whatever the trust")


def _oauth(raw: Any, table: Table, where: str, name: str, notes: Notes) -> None:
    if not isinstance(raw, Mapping):
        notes.drop(where, "expected a table")
        return
    notes.unknown(where, raw, OAUTH, "not a field of agentd's oauth: not carried over")
    out: dict[str, Any] = {}
    for key in OAUTH:
        value = raw.get(key)
        if isinstance(value, str) and key == "client_secret":
            out[key] = notes.value(value, where=f"{where}.{key}", hint=f"{name}_{key}", credential=True)
        elif isinstance(value, str):
            out[key] = value
        elif isinstance(value, list) and key == "scope" and all(isinstance(x, str) for x in value):
            out[key] = " ".join(value)
        elif value is not None:
            notes.drop(f"{where}.{key}", "expected a string")
    table.set("oauth", out, "agentd oauth (client credentials): same meaning; the token is fetched and "
                            "renewed by the sidecar, one login shared by every process")


def _auth(raw: Any, table: Table, where: str, name: str, notes: Notes) -> None:
    if not isinstance(raw, Mapping):
        notes.drop(where, "expected a table")
        return
    out: dict[str, Any] = {}
    for i, (key, value) in enumerate(raw.items()):
        path = key_path(where, str(key), i)
        target = AUTH_RENAMED.get(str(key), str(key))
        if key in ("device_authorization_url", "authorization_url"):
            notes.drop(path, "mcpcreds finds it from the issuer's metadata (RFC 8414): not carried over")
            continue
        if target not in (*AUTH_KEEP, *AUTH_RENAMED.values()):
            notes.drop(path, "not a field of agentd's auth: not carried over")
            continue
        if key == "source" and value == "irsa":
            value = "web_identity"
            notes.drop(path, "irsa is web_identity here, which needs role_arn and web_identity_token_file "
                             "written in the entry (IRSA gives them to the pod as AWS_ROLE_ARN and "
                             "AWS_WEB_IDENTITY_TOKEN_FILE): add them to carry the entry over")
        if isinstance(value, str) and key in AUTH_SECRETS:
            value = notes.value(value, where=path, hint=f"{name}_{key}", credential=True)
        out[target] = value
    if isinstance(out.get("scopes"), str):
        out["scopes"] = out["scopes"].split()
    login = f"service:{name}" if where.startswith("services") else name
    if out.get("kind") == "aws" and out.get("source") == "sso":
        if "sso_region" not in out and isinstance(out.get("region"), str):
            out["sso_region"] = out["region"]
            notes.differ(f"{where}: sso_region is written as agentd's one region (IAM Identity Center's and "
                         "the signature's); set it apart if your Identity Center is in another region")
        notes.logins.append(f"mcpcreds login {shlex.quote(login)}")
    elif out.get("kind") == "oauth2" and out.get("grant") in LOGIN_GRANTS:
        notes.logins.append(f"mcpcreds login {shlex.quote(login)}")
    table.set("auth", out, "agentd auth: the same provider kinds; the sidecar holds the login")
