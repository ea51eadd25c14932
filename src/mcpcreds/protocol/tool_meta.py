"""What a tool handles and can do (zeph `ToolSecurityMeta`), and what the gateway makes of it
(pure: no I/O, bounded work whatever the call carries).

- `meta_for(tool, configured) -> (ToolMeta, source)`: the server's `tool_metadata` entry for the
  tool (source "configured"), else `infer(name, description)` (source "inferred"). `tool` is its
  name or its `tools/list` item.
- `data_flow(meta, trust) -> Decision`: a tool of `data_sensitivity` high on an untrusted or
  sandboxed server is refused (verdict "refuse", policy "data_flow"); medium on a sandboxed
  server is a warning ("warn"); anything else is allowed. An unknown trust is taken as sandboxed.
- `flagged(meta, arguments, roots=()) -> list[str]`: the pointers of the tool's flagged parameters
  whose value in a `tools/call`'s `arguments` matches its pattern (never the value).
- `check_call(meta, trust, arguments, roots=()) -> Decision`: both, as a `tools/call` gets them: a
  data-flow refusal, else a refusal by flagged parameters (policy "flagged_parameter", their
  pointers in `parameters`), else the data-flow verdict (allow or warn).
- `describe(meta, source)`: the metadata as JSON, for `mcpcreds tools SERVER`.

Inference, from the tool's name: it is cut into words at `_`, `-`, `.`, `/`, spaces, digits and
camelCase (`readFile`, `HTTPRequest`), NFKC-normalised and lower-cased, a plural also read as its
singular (`keys` is `key`, `entries` is `entry`). Words are matched whole (`monkey` is no `key`).

| words in the name                                                  | gives                       |
|--------------------------------------------------------------------|-----------------------------|
| exec, execute, shell, bash, sh, zsh, powershell, pwsh, cmd,        | shell (and sensitivity high)|
|   command, terminal, subprocess, spawn, eval, script, repl;        |                             |
|   run with code, python, node, javascript, js, program, process    |                             |
| a file word (file, dir, directory, folder, path, fs, filesystem,   | filesystem_read; with a     |
|   disk, readfile, listdir, readdir, glob, ls, cat, stat)           |   write verb filesystem_write|
| rm, mkdir, rmdir, unlink, touch, chmod, chown, mv, cp, writefile;  | filesystem_write            |
|   write, delete, remove, del, erase, overwrite, append, edit,      |                             |
|   move, rename, copy with no database, memory, network or API word|                             |
| query, sql, select, or a database word (db, database, table, row,  | database_read; with a write |
|   record, collection, schema, sqlite, postgres, postgresql, mysql, |   verb database_write       |
|   mongo, mongodb, cypher)                                          |                             |
| insert, update, upsert, drop, truncate, alter, migrate, migration  | database_write (but with a  |
|   (exec, execute with a database word: read and write)             |   file, memory or API word: |
|                                                                    |   that instead)             |
| fetch, http, https, url, uri, browse, browser, download, curl,     | network                     |
|   wget, web, webpage, website, scrape, crawl, navigate, request,   |                             |
|   ping, dns, socket, html                                          |                             |
| api, send, post, publish, notify, webhook, slack, github, gitlab,  | external_api                |
|   jira, linear, stripe, twilio, sms, tweet, discord, telegram,     |                             |
|   issue, ticket, repo, repository, channel, pr, email, mail, inbox |                             |
| remember, memorize; memory, knowledge, observation with a write    | memory_write                |
|   verb (or add, store)                                             |                             |
| secret, password, passwd, passphrase, token, credential, cred,     | data_sensitivity high       |
|   key, apikey, privatekey, ssh, gpg, pgp, vault, keychain, keyring,|                             |
|   otp, totp, mfa, cookie                                           |                             |
| email, mail, inbox, user, customer, payment, account, profile,     | data_sensitivity medium     |
|   contact, person, people, employee, patient, medical, health,     |                             |
|   billing, invoice, card, bank, ssn, salary, payroll, phone,       |                             |
|   message, chat, calendar, location, personal, pii                 |                             |
| any capability, none of the above sensitivity words                | data_sensitivity low        |
| nothing matched                                                    | none, no capability         |

The write verbs: write, create, delete, remove, del, erase, overwrite, append, edit, move, rename,
copy, save, put, patch, upload, update, set, modify, add, store, insert, upsert, destroy, purge,
clear. The sensitivity comes from the name alone, so that a `tools/list` and a `tools/call` (which
carries only the name) agree; a description (the server's own words, and noisy) only adds
capabilities, by the same table.

The patterns of a flagged parameter (names in config/tool_meta.py PATTERNS). A value is every
string in it (and the text of every number: `2130706433` is 127.0.0.1 to a resolver), object keys
included, at most `MAX_DEPTH` deep and `MAX_STRINGS` of them; the call's values are read up to
`MAX_SCAN_CHARS` characters in all. Past any of these bounds the parameter counts as matching.

- `path_traversal`: a NUL; a segment of two or more dots (and spaces, which Windows drops: `..`,
  `.. `); an absolute path (`/...`, `\\...`, `~...`, `C:...`, a `file:` URI) not under one of the
  `roots` given (the server's `roots`, `file://` URIs). Read as written, `\\` as `/`, NFKC-normalised
  (full-width dots) and percent-decoded once and twice.
- `shell_metacharacters`: any of ``; & | ` $ < > ( )``, newline, carriage return, NUL.
- `url_with_credentials`: a URL (`scheme://...`) with a user (`user:pass@host`), or whose query
  has a parameter named like a credential (`token`, `key`, `password`, ... as for the config,
  core/credshape.py) with a value. Read as written and percent-decoded once.
- `private_address`: the host of a URL in the value, or the whole value read as `host[:port]`,
  is an address no public server has (loopback, private, link-local, CGNAT, metadata, reserved:
  the SSRF guard's ranges, net/egress.py, numeric forms like `0x7f.1` included), `localhost`, or
  a name under .localhost, .local, .internal, .lan, .intranet, .corp, .private, .home.arpa; a URL
  whose host is a single label (`http://db/`) too.
- `sql_injection` (simple, case ignored; read as written and percent-decoded once): a quote
  followed by OR, AND, UNION, `||`, `;` or a comment; a comment (`--`, `/*`, `*/`); a stacked
  statement (`;` then SELECT, INSERT, UPDATE, DELETE, DROP, ALTER, CREATE, TRUNCATE, EXEC,
  EXECUTE, GRANT, SHUTDOWN, DECLARE); `UNION [ALL] SELECT`; OR/AND `n = n`; SLEEP(, PG_SLEEP(,
  BENCHMARK(, LOAD_FILE(, WAITFOR DELAY, XP_CMDSHELL, INTO OUTFILE / DUMPFILE.
- `secret_shaped`: what the config refuses as a credential (core/credshape.py: an auth scheme, a
  JWT, a well-known token prefix, a long random-looking run).
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from ..config.tool_meta import CAPABILITIES, SENSITIVITIES, Sensitivity, ToolMeta, parse_pointer
from ..core.credshape import credential_name, credential_value
from ..net.egress import address_problem, normalize_host
from .jsonrpc import INVALID_PARAMS, TOOLS_CALL, Outgoing, error, id_key, whole_batch

Source = Literal["configured", "inferred"]
Verdict = Literal["allow", "warn", "refuse"]
DATA_FLOW: Final = "data_flow"
FLAGGED_PARAMETER: Final = "flagged_parameter"
MAX_NAME_CHARS: Final = 256
MAX_DESCRIPTION_CHARS: Final = 4096
MAX_SCAN_CHARS: Final = 1 << 20
MAX_STRINGS: Final = 4096
MAX_DEPTH: Final = 32
MAX_URLS: Final = 64  # URLs read in one string; more count as a match
MAX_URL_CHARS: Final = 8192

# ---------------------------------------------------------------------------- inference

_SHELL: Final = frozenset({"exec", "execute", "shell", "bash", "sh", "zsh", "powershell", "pwsh", "cmd",
                           "command", "terminal", "subprocess", "spawn", "eval", "script", "repl"})
_RUNNABLE: Final = frozenset({"code", "python", "node", "javascript", "js", "program", "process"})
_FILE: Final = frozenset({"file", "dir", "directory", "folder", "path", "fs", "filesystem", "disk",
                          "readfile", "listdir", "readdir", "glob", "ls", "cat", "stat"})
_FILE_WRITE: Final = frozenset({"rm", "mkdir", "rmdir", "unlink", "touch", "chmod", "chown", "mv", "cp",
                                "writefile"})
_WRITE_ALONE: Final = frozenset({"write", "delete", "remove", "del", "erase", "overwrite", "append", "edit",
                                 "move", "rename", "copy"})
_DB_WRITE: Final = frozenset({"insert", "update", "upsert", "drop", "truncate", "alter", "migrate",
                              "migration"})
_WRITE: Final = _WRITE_ALONE | _DB_WRITE | frozenset({"create", "save", "put", "patch", "upload", "set",
                                                      "modify", "add", "store", "destroy", "purge", "clear"})
_DB_READ: Final = frozenset({"query", "sql", "select"})
_DB: Final = _DB_READ | frozenset({"db", "database", "table", "row", "record", "collection", "schema",
                                   "sqlite", "postgres", "postgresql", "mysql", "mongo", "mongodb", "cypher"})
_NETWORK: Final = frozenset({"fetch", "http", "https", "url", "uri", "browse", "browser", "download", "curl",
                             "wget", "web", "webpage", "website", "scrape", "crawl", "navigate", "request",
                             "ping", "dns", "socket", "html"})
_EXTERNAL: Final = frozenset({"api", "send", "post", "publish", "notify", "webhook", "slack", "github",
                              "gitlab", "jira", "linear", "stripe", "twilio", "sms", "tweet", "discord",
                              "telegram", "issue", "ticket", "repo", "repository", "channel", "pr", "email",
                              "mail", "inbox"})
_MEMORY: Final = frozenset({"memory", "knowledge", "observation"})
_REMEMBER: Final = frozenset({"remember", "memorize"})
_HIGH: Final = frozenset({"secret", "password", "passwd", "passphrase", "token", "credential", "cred", "key",
                          "apikey", "privatekey", "ssh", "gpg", "pgp", "vault", "keychain", "keyring", "otp",
                          "totp", "mfa", "cookie"})
_MEDIUM: Final = frozenset({"email", "mail", "inbox", "user", "customer", "payment", "account", "profile",
                            "contact", "person", "people", "employee", "patient", "medical", "health",
                            "billing", "invoice", "card", "bank", "ssn", "salary", "payroll", "phone",
                            "message", "chat", "calendar", "location", "personal", "pii"})
_WORD: Final = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def words(text: str) -> frozenset[str]:
    """The words of a tool's name (see the module doc), each also as its singular."""
    found: set[str] = set()
    for word in _WORD.findall(unicodedata.normalize("NFKC", text)):
        word = word.lower()
        found.add(word)
        if len(word) > 4 and word.endswith("ies"):
            found.add(word[:-3] + "y")
        elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            found.add(word[:-1])
    return frozenset(found)


def _capabilities(w: frozenset[str]) -> set[str]:
    caps: set[str] = set()
    db, files, memory = bool(w & _DB), bool(w & _FILE), bool(w & (_MEMORY | _REMEMBER))
    writes = bool(w & _WRITE)
    runs = bool(w & {"exec", "execute"})
    if db and runs:
        caps |= {"database_read", "database_write"}
    elif w & _SHELL or ("run" in w and w & _RUNNABLE):
        caps.add("shell")
    if files:
        caps.add("filesystem_write" if writes else "filesystem_read")
    if w & _FILE_WRITE:
        caps.add("filesystem_write")
    if db:
        caps.add("database_write" if writes else "database_read")
    elif w & _DB_WRITE and not (files or memory or w & _EXTERNAL):
        caps.add("database_write")
    if w & _NETWORK:
        caps.add("network")
    if w & _EXTERNAL:
        caps.add("external_api")
    if w & _REMEMBER or (w & _MEMORY and writes):
        caps.add("memory_write")
    if w & _WRITE_ALONE and not (db or memory or files or w & (_EXTERNAL | _NETWORK)):
        caps.add("filesystem_write")
    return caps


def infer(tool_name: str, description: str | None = None) -> ToolMeta:
    """The metadata the module doc's table gives a tool of this name (and description)."""
    name = words(tool_name[:MAX_NAME_CHARS])
    caps = _capabilities(name)
    shell = "shell" in caps
    if description:
        caps |= _capabilities(words(description[:MAX_DESCRIPTION_CHARS]))
    sensitivity: Sensitivity = "none"
    if name & _HIGH or shell:
        sensitivity = "high"
    elif name & _MEDIUM:
        sensitivity = "medium"
    elif caps:
        sensitivity = "low"
    return ToolMeta(sensitivity, tuple(c for c in CAPABILITIES if c in caps))


@lru_cache(maxsize=4096)  # a tool's name reads the same call after call
def _inferred(name: str) -> ToolMeta:
    return infer(name)


def meta_for(tool: str | Mapping[str, Any], configured: Mapping[str, ToolMeta]) -> tuple[ToolMeta, Source]:
    """A tool's metadata and where it came from: its `tool_metadata` entry, else inferred. `tool`
    is its name or its `tools/list` item (whose description adds capabilities)."""
    if isinstance(tool, str):
        name, description = tool, None
    else:
        raw_name, raw_description = tool.get("name"), tool.get("description")
        name = raw_name if isinstance(raw_name, str) else ""
        description = raw_description if isinstance(raw_description, str) else None
    if name in configured:
        return configured[name], "configured"
    if description is None and len(name) <= 128:
        return _inferred(name), "inferred"
    return infer(name, description), "inferred"


def describe(meta: ToolMeta, source: Source) -> dict[str, Any]:
    """The metadata as JSON (for `mcpcreds tools SERVER` and the sidecar's routes)."""
    return {"data_sensitivity": meta.data_sensitivity, "capabilities": list(meta.capabilities),
            "flagged_parameters": [{"pointer": f.pointer, "pattern": f.pattern}
                                   for f in meta.flagged_parameters],
            "source": source}


# ---------------------------------------------------------------------------- the data-flow check


@dataclass(frozen=True, slots=True)
class Decision:
    """What the checks say of a call: `verdict` allow, warn (log `reason`, let it through) or
    refuse (-32602 with `data.policy` = `policy`; `parameters`: the flagged parameters' pointers,
    as configured). `reason` quotes nothing of the call."""

    verdict: Verdict
    reason: str = ""
    policy: str = DATA_FLOW
    parameters: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.verdict != "refuse"


_ALLOW: Final = Decision("allow")  # (frozen: shared by every call allowed)


def data_flow(meta: ToolMeta, trust: str) -> Decision:
    """zeph's data-flow check: high-sensitivity tools only on trusted servers; medium-sensitivity
    ones on a sandboxed server are let through with a warning."""
    if trust not in ("trusted", "untrusted"):
        trust = "sandboxed"  # fail closed
    rank = SENSITIVITIES.index(meta.data_sensitivity)
    if rank >= SENSITIVITIES.index("high") and trust != "trusted":
        return Decision("refuse", f"a tool of data_sensitivity high on a server of trust {trust} is refused "
                        "(data_flow); set the tool's tool_metadata, or trust the server, to allow it")
    if rank >= SENSITIVITIES.index("medium") and trust == "sandboxed":
        return Decision("warn", "a tool of data_sensitivity medium on a sandboxed server")
    return _ALLOW


def check_call(meta: ToolMeta, trust: str, arguments: Any, roots: Sequence[str] = ()) -> Decision:
    """The decision a `tools/call` of a tool with this metadata gets on a server of this trust:
    data flow first, then its flagged parameters (`roots`: the server's effective roots)."""
    decision = data_flow(meta, trust)
    if not decision.allowed:
        return decision
    if hits := flagged(meta, arguments, roots):
        return Decision("refuse", flagged_reason(meta, hits), FLAGGED_PARAMETER, tuple(hits))
    return decision


# ---------------------------------------------------------------------------- flagged parameters


class _Budget:
    def __init__(self) -> None:
        self.left = MAX_SCAN_CHARS


class _OverBudget(Exception):
    pass


def flagged(meta: ToolMeta, arguments: Any, roots: Sequence[str] = ()) -> list[str]:
    """The pointers (as configured) of `meta`'s flagged parameters whose value in `arguments` (a
    `tools/call`'s) matches the parameter's pattern; a pointer that is absent does not match.
    `roots`: the `file://` URIs under which an absolute path is no traversal."""
    budget = _Budget()
    root_paths = _root_paths(roots)
    hits: list[str] = []
    for parameter in meta.flagged_parameters:
        if parameter.pointer in hits:
            continue
        try:
            found, value = resolve(arguments, parse_pointer(parameter.pointer))
            hit = found and any(_matches(parameter.pattern, text, root_paths)
                                for text in _strings(value, budget))
        except (ValueError, _OverBudget):
            hit = True  # a pointer built around the config's checks, or past the bounds: refused
        if hit:
            hits.append(parameter.pointer)
    return hits


def flagged_reason(meta: ToolMeta, pointers: Sequence[str]) -> str:
    """The message of a refusal by `flagged`: the patterns matched, never a value."""
    patterns = dict.fromkeys(f.pattern for f in meta.flagged_parameters if f.pointer in pointers)
    return (f"an argument matches its flagged parameter's pattern ({', '.join(patterns)}); "
            "refused (flagged_parameter)")


def resolve(document: Any, tokens: Sequence[str]) -> tuple[bool, Any]:
    """(found, value) at an RFC 6901 pointer's tokens in parsed JSON."""
    for token in tokens:
        if isinstance(document, Mapping) and token in document:
            document = document[token]
        elif (isinstance(document, list) and re.fullmatch(r"0|[1-9][0-9]{0,8}", token)
              and int(token) < len(document)):
            document = document[int(token)]
        else:
            return False, None
    return True, document


def _strings(value: Any, budget: _Budget) -> Iterator[str]:
    """Every string (and number's text) in `value`, keys too; _OverBudget past the bounds."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    count = 0
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _OverBudget
        if isinstance(item, Mapping):
            for key, inner in item.items():
                stack.extend(((key, depth + 1), (inner, depth + 1)))
            continue
        if isinstance(item, list | tuple):
            stack.extend((inner, depth + 1) for inner in item)
            continue
        if isinstance(item, bool) or item is None:
            continue
        text = item if isinstance(item, str) else str(item) if isinstance(item, int | float) else None
        if text is None:
            continue
        count += 1
        budget.left -= len(text)
        if count > MAX_STRINGS or budget.left < 0:
            raise _OverBudget
        yield text


def _matches(pattern: str, text: str, roots: tuple[str, ...]) -> bool:
    if pattern == "path_traversal":
        return _path_traversal(text, roots)
    if pattern == "shell_metacharacters":
        return any(ch in _SHELL_CHARS for ch in text)
    if pattern == "url_with_credentials":
        return any(_url_with_credentials(t) for t in _decoded(text, 1))
    if pattern == "private_address":
        return _private_address(text)
    if pattern == "sql_injection":
        return any(_SQL.search(t) is not None for t in _decoded(text, 1))
    if pattern == "secret_shaped":
        return credential_value(text) is not None
    raise ValueError("unknown pattern")


def _decoded(text: str, rounds: int) -> list[str]:
    """`text`, and percent-decoded up to `rounds` times (each new form once)."""
    forms = [text]
    for _ in range(rounds):
        if "%" not in forms[-1]:
            break
        decoded = unquote(forms[-1])
        if decoded == forms[-1]:
            break
        forms.append(decoded)
    return forms


# --- path_traversal

_DRIVE: Final = re.compile(r"[A-Za-z]:")


def _root_paths(roots: Sequence[str]) -> tuple[str, ...]:
    paths = []
    for root in roots:
        try:
            path = unquote(urlsplit(root).path)
        except ValueError:
            continue
        if path.startswith("/"):
            paths.append(path.rstrip("/") or "/")
    return tuple(paths)


def _path_traversal(text: str, roots: tuple[str, ...]) -> bool:
    if "\0" in text:
        return True
    forms = {f for decoded in _decoded(text, 2) for f in (decoded, unicodedata.normalize("NFKC", decoded))}
    for form in forms:
        path = form.replace("\\", "/")
        if "\0" in path or any(len(seg.strip(" ")) >= 2 and not seg.strip(" .") for seg in path.split("/")):
            return True
        if path[:5].lower() == "file:":
            try:
                parts = urlsplit(path)
            except ValueError:
                return True
            if parts.netloc not in ("", "localhost"):
                return True
            path = parts.path
            if not path.startswith("/"):
                return True
        absolute = path.startswith(("/", "~")) or _DRIVE.match(path)
        if absolute and not any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots):
            return True
    return False


# --- shell_metacharacters

_SHELL_CHARS: Final = frozenset(";&|`$<>()\n\r\0")


# --- url_with_credentials, private_address


def _urls(text: str) -> Iterator[tuple[str, str]]:
    """(scheme, the rest up to white space) of each `scheme://` in `text`; _OverBudget past MAX_URLS."""
    start, n = 0, 0
    while (at := text.find("://", start)) >= 0:
        n += 1
        if n > MAX_URLS:
            raise _OverBudget
        begin = at
        while begin > 0 and at - begin < 32 and (text[begin - 1].isalnum() or text[begin - 1] in "+.-"):
            begin -= 1
        end = at + 3
        while end < len(text) and end - at < MAX_URL_CHARS and not text[end].isspace():
            end += 1
        start = at + 3
        if begin < at:
            yield text[begin:at], text[at + 3:end]


def _authority(rest: str) -> str:
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def _url_with_credentials(text: str) -> bool:
    for scheme, rest in _urls(text.replace("\\", "/")):
        if "@" in _authority(rest):
            return True
        try:
            query = urlsplit(f"{scheme}://{rest}").query
        except ValueError:
            query = rest.partition("?")[2]
        if any(credential_name(name) and value for name, value in parse_qsl(query, keep_blank_values=True)):
            return True
    return False


_PRIVATE_SUFFIXES: Final = (".localhost", ".local", ".internal", ".lan", ".intranet", ".corp", ".private",
                            ".home.arpa")


def _private_host(host: str, in_url: bool) -> bool:
    try:
        host = normalize_host(host)
    except ValueError:
        return False
    if not host:
        return False
    try:
        return address_problem(ipaddress.ip_address(host)) is not None
    except ValueError:
        pass
    if host == "localhost" or host.endswith(_PRIVATE_SUFFIXES):
        return True
    return in_url and "." not in host


def _host_of(authority: str) -> str | None:
    """The host of `[user@]host[:port]` (an IPv6 literal bare or in brackets)."""
    authority = authority.rpartition("@")[2]
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    if authority.count(":") > 1:
        return authority  # a bare IPv6 address
    return authority.partition(":")[0]


def _private_address(text: str) -> bool:
    text = text.replace("\\", "/")  # http:\\host is http://host to a browser and to WHATWG
    for _, rest in _urls(text):
        host = _host_of(_authority(rest))
        if host is not None and _private_host(unquote(host), in_url=True):
            return True
    bare = text.strip()
    if bare and "://" not in bare and not any(ch.isspace() for ch in bare) and len(bare) <= 512:
        host = _host_of(_authority(bare))
        return host is not None and _private_host(host, in_url=False)
    return False


# --- sql_injection

_SQL: Final = re.compile(
    r"""['"`]\s*(?:\)\s*)*(?:or\b|and\b|union\b|\|\||;|--|\#|/\*)"""
    r"|--|/\*|\*/"
    r"|;\s*(?:select|insert|update|delete|drop|alter|create|truncate|exec|execute|grant|shutdown|declare)\b"
    r"|\bunion\s+(?:all\s+)?select\b"
    r"|\b(?:or|and)\s+(\d+)\s*=\s*\1\b"
    r"|\b(?:sleep|pg_sleep|benchmark|load_file)\s*\("
    r"|\bwaitfor\s+delay\b|\bxp_cmdshell\b|\binto\s+(?:out|dump)file\b",
    re.IGNORECASE,
)


# ---------------------------------------------------------------------------- a POST's calls


def call_refusals(out: Outgoing, server: str, configured: Mapping[str, ToolMeta], trust: str,
                  roots: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """(refusals, warnings) for the `tools/call` requests of a POST: each call `check_call`
    refuses gets -32602 with `data.policy`, and a batch holding one is refused whole (as
    `jsonrpc.refusals` does); `warnings` are the reasons of the calls let through with one."""
    refused: dict[Any, dict[str, Any]] = {}
    warnings: list[str] = []
    for m in out.requests:
        if m.method != TOOLS_CALL or m.tool is None:
            continue
        meta, _ = meta_for(m.tool, configured)
        params = m.raw.get("params")
        arguments = params.get("arguments") if isinstance(params, dict) else None
        decision = check_call(meta, trust, arguments, roots)
        if decision.verdict == "refuse":
            data: dict[str, Any] = {"policy": decision.policy}
            if decision.parameters:
                data["parameters"] = list(decision.parameters)
            refused[id_key(m.id)] = error(m.id, INVALID_PARAMS, "tools/call refused by the gateway on "
                                          f"server {server!r}: {decision.reason}", data)
        elif decision.verdict == "warn":
            warnings.append(decision.reason)
    return whole_batch(out, refused), warnings
