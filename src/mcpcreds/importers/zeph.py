"""zeph's `[[mcp.servers]]` (`ServerEntry`) -> mcpcreds (pure).

    [[mcp.servers]]
    id = "github"                       # -> name
    command = "npx"                     # stdio: an [exec.ID] entry; the command goes to the MCP
    args = ["-y", "@modelcontextprotocol/server-github"]   # client's config, never to mcpcreds'
    timeout = 30
    trust_level = "Untrusted"           # -> trust, lower case
    [mcp.servers.env]
    GITHUB_PERSONAL_ACCESS_TOKEN = "${GITHUB_PERSONAL_ACCESS_TOKEN}"   # -> {{secret:...}}

    [[mcp.servers]]
    id = "remote"
    url = "https://mcp.example.com/mcp"  # http: [[servers]] endpoint (+ headers)
    [mcp.servers.oauth]                  # OAuth: `oauth` (client credentials) or a person's login

The trust keys (`tool_allowlist`, `expected_tools`) and the untrusted pipeline's (`roots`,
`tool_metadata`, `elicitation_*`, `media_passthrough`, `timeout`) keep their names; each value is
written out, zeph's defaults included where mcpcreds' differ (`trust`, `env_isolation`)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from ..config.content import check_root
from ..config.reader import Collector, key_path
from ..config.tool_meta import parse_tool_metadata
from ..core.credshape import credential_name, credential_value
from ..core.policy import TRUST_LEVELS
from .common import Notes, duration, endpoint, entry_name, headers, strings, tool_list
from .emit import Document, Table

TRANSPORT: Final = ("type", "command", "args", "env", "url", "headers", "oauth")
SHARED: Final = ("id", "timeout", "trust_level", "tool_allowlist", "expected_tools", "roots", "tool_metadata",
                 "elicitation_enabled", "elicitation_timeout_secs", "media_passthrough", "transport")
STDIO: Final = (*SHARED, "command", "args", "env", "env_isolation")
HTTP: Final = (*SHARED, "url", "headers", "oauth")
OAUTH_KEYS: Final = ("enabled", "client_id", "client_secret", "token_url", "issuer", "scopes", "scope",
                     "resource")
NOT_OURS: Final = "a zeph setting with no mcpcreds counterpart: not carried over"


def translate(data: Mapping[str, Any], notes: Notes) -> Document:
    doc = Document()
    notes.unknown("", data, ("mcp",), NOT_OURS)
    mcp = data.get("mcp")
    if not isinstance(mcp, Mapping):
        notes.drop("mcp", "expected the [mcp] table")
        return doc
    notes.unknown("mcp", mcp, ("servers",), "zeph's own MCP setting (its command allowlist, discovery, "
                                           "dynamic servers): not carried over")
    servers = mcp.get("servers")
    if not isinstance(servers, list):
        notes.drop("mcp.servers", "expected [[mcp.servers]] entries")
        return doc
    taken: set[str] = set()
    for i, raw in enumerate(servers):
        where = f"mcp.servers[{i}]"
        if not isinstance(raw, Mapping):
            notes.drop(where, "expected a table")
            continue
        entry = _flat(raw, where, notes)
        name = entry_name(notes, entry.get("id"), where, f"server-{i + 1}", taken)
        if "command" in entry:
            _stdio(entry, name, where, doc, notes)
        elif "url" in entry:
            _http(entry, name, where, doc, notes)
        else:
            notes.drop(where, "neither a command (stdio) nor a url (http): not carried over")
    return doc


def _flat(raw: Mapping[str, Any], where: str, notes: Notes) -> dict[str, Any]:
    """An entry with its `transport = { type, ... }` table, when it has one, spread out: an OAuth
    transport's `client_id`, `scopes`, ... become the entry's `oauth` table."""
    entry = dict(raw)
    transport = raw.get("transport")
    if isinstance(transport, Mapping):
        oauth = str(transport.get("type", "")).lower() == "oauth"
        notes.unknown(f"{where}.transport", transport, (*TRANSPORT, *(OAUTH_KEYS if oauth else ())),
                      "not a field of zeph's transport: not carried over")
        entry.pop("transport")
        entry.update((k, v) for k, v in transport.items()
                     if k in TRANSPORT and k != "type" and not (oauth and k in OAUTH_KEYS))
        if oauth:
            found = {k: v for k, v in transport.items() if k in OAUTH_KEYS}
            if "oauth" in entry:
                for key in found:
                    notes.drop(f"{where}.transport.{key}", "the entry's own oauth table is used: not carried "
                                                           "over")
            else:
                entry["oauth"] = found
    return entry


def _trust(entry: Mapping[str, Any], table: Table, where: str, name: str, notes: Notes) -> str:
    raw = entry.get("trust_level")
    trust = raw.lower() if isinstance(raw, str) and raw.lower() in TRUST_LEVELS else None
    if raw is not None and trust is None:
        notes.drop(f"{where}.trust_level", f"expected one of {', '.join(TRUST_LEVELS)}: untrusted written")
    table.set("trust", trust or "untrusted", "zeph trust_level: the same levels, in lower case" if trust else
              "zeph's default trust_level, written out (an [exec] entry's own default is trusted)")
    return trust or "untrusted"


def _shared(entry: Mapping[str, Any], table: Table, where: str, notes: Notes) -> None:
    if "tool_allowlist" in entry and (allow := tool_list(notes, entry["tool_allowlist"],
                                                         f"{where}.tool_allowlist")) is not None:
        table.set("tool_allowlist", allow, "zeph tool_allowlist: same meaning (prefix* patterns too)")
    if "expected_tools" in entry and (expected := strings(notes, entry["expected_tools"],
                                                          f"{where}.expected_tools")) is not None:
        table.set("expected_tools", expected, "zeph expected_tools: same meaning")
    if "timeout" in entry and (seconds := duration(notes, entry["timeout"], f"{where}.timeout")) is not None:
        table.set("timeout", seconds, "zeph timeout: the wait for the server's answer, in seconds")
    if "roots" in entry and (roots := _roots(entry["roots"], f"{where}.roots", notes)) is not None:
        table.set("roots", roots, "zeph roots: the roots answered to the server's roots/list, as file:// "
                                  "URIs")
    for key in ("elicitation_enabled", "media_passthrough"):
        if isinstance(entry.get(key), bool):
            table.set(key, entry[key], f"zeph {key}: same meaning")
        elif key in entry:
            notes.drop(f"{where}.{key}", "expected true or false")
    if "elicitation_timeout_secs" in entry:
        value = entry["elicitation_timeout_secs"]
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 3600:
            table.set("elicitation_timeout_secs", value, "zeph elicitation_timeout_secs: same meaning")
        else:
            notes.drop(f"{where}.elicitation_timeout_secs", "expected whole seconds from 1 to 3600")
    if "tool_metadata" in entry and (meta := _tool_metadata(entry["tool_metadata"], f"{where}.tool_metadata",
                                                            notes)) is not None:
        table.set("tool_metadata", meta, "zeph tool_metadata: the same sensitivity, capabilities and flagged "
                                         "parameters")


def _stdio(entry: Mapping[str, Any], name: str, where: str, doc: Document, notes: Notes) -> None:
    command, args = entry.get("command"), entry.get("args", [])
    if not isinstance(command, str) or not command or not isinstance(args, list) or not all(
            isinstance(a, str) for a in args):
        notes.drop(where, "a command (a string) and args (a list of strings) are needed: not carried over")
        return
    notes.unknown(where, {k: v for k, v in entry.items() if k not in HTTP}, STDIO,
                  "not a field of zeph's ServerEntry: not carried over")
    notes.unknown(where, {k: v for k, v in entry.items() if k in HTTP}, STDIO,
                  "applies to an http server only: not carried over")
    table = Table(f"exec.{name}", note=f"from zeph {where} (stdio): the command is not here, it goes in the "
                                      "MCP client's config")
    if "env" in entry:
        env = entry["env"]
        if isinstance(env, Mapping):
            out: dict[str, str] = {}
            for i, (var, value) in enumerate(env.items()):
                path = key_path(f"{where}.env", str(var), i)
                if isinstance(var, str) and isinstance(value, str):
                    out[var] = notes.value(value, where=path, hint=f"{name}_{var}",
                                           credential=credential_name(var))
                else:
                    notes.drop(path, "expected a name and a string value")
            table.set("env", out, "zeph env: ${VAR} is read as {{secret:VAR}} (the [secrets] sources, env "
                                  "first)")
        else:
            notes.drop(f"{where}.env", "expected a table")
    isolation = entry.get("env_isolation", False)
    if not isinstance(isolation, bool):
        notes.drop(f"{where}.env_isolation", "expected true or false: false written (zeph's default)")
        isolation = False
    table.set("env_isolation", isolation, "zeph env_isolation, written out (zeph's default is false, "
                                          "mcpcreds' true)")
    if not isolation:
        notes.differ(f"exec {name}: env_isolation = false: the child gets the caller's environment less the "
                     "secrets the sidecar knows (zeph stripped a fixed list of secret-named variables)")
    _trust(entry, table, where, name, notes)
    _shared(entry, table, where, notes)
    doc.tables.append(table)
    notes.commands.append(exec_line(name, command, args, where, notes))


def exec_line(name: str, command: str, args: list[str], where: str, notes: Notes) -> str:
    """`mcpcreds exec NAME -- COMMAND ARGS`, for the MCP client's config; an argument that looks like
    a credential (or is not printable) is not printed."""
    words = [command, *args]
    shown = []
    for i, word in enumerate(words):
        if credential_value(word) is not None or not word.isprintable():
            shown.append("<not shown>")
            notes.differ(f"{where}: argument {i} of its command looks like a credential: not shown; pass it "
                         "to the child through [exec] env as {{secret:NAME}} instead")
        else:
            shown.append(shlex.quote(word))
    return f"mcpcreds exec {shlex.quote(name)} -- {' '.join(shown)}"


def _http(entry: Mapping[str, Any], name: str, where: str, doc: Document, notes: Notes) -> None:
    url = endpoint(notes, entry.get("url"), f"{where}.url")
    if url is None:
        return
    notes.unknown(where, {k: v for k, v in entry.items() if k not in STDIO}, HTTP,
                  "not a field of zeph's ServerEntry: not carried over")
    notes.unknown(where, {k: v for k, v in entry.items() if k in STDIO}, HTTP,
                  "applies to a stdio server only: not carried over")
    table = Table("servers", array=True, note=f"from zeph {where} (http)")
    table.set("name", name, f"zeph {where}.id")
    table.set("endpoint", url, "zeph url: same meaning")
    found = headers(notes, entry["headers"], f"{where}.headers", name) if "headers" in entry else None
    if found is not None:
        table.set("headers", found, "zeph headers: secrets taken out of the file")
    if "oauth" in entry:
        _oauth(entry["oauth"], table, name, f"{where}.oauth", notes)
    trust = _trust(entry, table, where, name, notes)
    if trust == "trusted":
        notes.differ(f"server {name}: trusted: zeph skipped its SSRF checks for it; mcpcreds does not relax "
                     "them (a private address needs allow_private)")
    _shared(entry, table, where, notes)
    doc.tables.append(table)


def _oauth(raw: Any, table: Table, name: str, where: str, notes: Notes) -> None:
    if not isinstance(raw, Mapping):
        notes.drop(where, "expected a table")
        return
    notes.unknown(where, raw, OAUTH_KEYS, "not a field mcpcreds' OAuth takes: not carried over")
    if raw.get("enabled") is False:
        notes.drop(where, "enabled = false: not carried over")
        return
    values: dict[str, Any] = {}
    for key in ("client_id", "client_secret", "token_url", "issuer", "resource"):
        if isinstance(raw.get(key), str) and key == "client_secret":
            values[key] = notes.value(raw[key], where=f"{where}.{key}", hint=f"{name}_{key}", credential=True)
        elif isinstance(raw.get(key), str):
            values[key] = raw[key]
    scopes = raw.get("scopes", raw.get("scope"))
    scope = " ".join(scopes) if isinstance(scopes, list) else scopes if isinstance(scopes, str) else None
    if "client_secret" in values and "client_id" in values and ("token_url" in values or "issuer" in values):
        table.set("oauth", {**values, **({"scope": scope} if scope else {})},
                  "zeph OAuth, a confidential client: client credentials, fetched and renewed by the sidecar")
        return
    auth = {"kind": "oauth2", "grant": "authorization_code", **values,
            **({"scopes": scope.split()} if scope else {})}
    table.set("auth", auth, "zeph OAuth in a browser: a person's login, run once with mcpcreds login")
    notes.logins.append(f"mcpcreds login {shlex.quote(name)}")


def _roots(raw: Any, where: str, notes: Notes) -> list[str] | None:
    if not isinstance(raw, list):
        notes.drop(where, "expected a list")
        return None
    out = []
    for i, root in enumerate(raw):
        uri = root.get("uri") if isinstance(root, Mapping) else root
        if isinstance(uri, str) and uri.startswith("/"):
            uri = "file://" + quote(uri)
        if isinstance(uri, str) and check_root(uri) is None:
            out.append(uri)
        else:
            notes.drop(f"{where}[{i}]", "not a file:// URI or absolute path mcpcreds takes: not carried over")
    return out


def _snake(value: Any) -> Any:
    """zeph's CamelCase enum values (`High`, `FilesystemRead`) as mcpcreds writes them."""
    if isinstance(value, str):
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", value).lower()
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value


def _snake_meta(key: str, value: Any) -> Any:
    if key in ("data_sensitivity", "capabilities"):
        return _snake(value)
    if key == "flagged_parameters" and isinstance(value, list):
        return [{**p, "pattern": _snake(p.get("pattern"))} if isinstance(p, Mapping) else p for p in value]
    return value


def _tool_metadata(raw: Any, where: str, notes: Notes) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping):
        notes.drop(where, "expected a table of tools")
        return None
    out: dict[str, Any] = {}
    for tool, meta in raw.items():
        if not isinstance(meta, Mapping):
            out[tool] = meta
            continue
        out[tool] = {k: _snake_meta(k, v) for k, v in meta.items()}
    c = Collector()
    parse_tool_metadata(c, "tool_metadata", out)
    if c.errors:
        notes.drop(where, "not in a shape mcpcreds reads (see `mcpcreds help config`, tool_metadata): "
                          "not carried over")
        return None
    return out
