"""`mcpcreds import FILE... [--from agentd|zeph|mur] [-o PATH]`: another project's config as an
mcpcreds config (stdout, or a new file: never over one that exists), and on stderr a summary of
what changes in meaning for this file, the secrets to store, the commands to run and what was
not carried over.

The output passes `mcpcreds check`: it is checked here before it is written, and an entry the
check refuses is left out (and listed) rather than written broken."""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..config.load import parse_config
from ..config.model import Config
from ..errors import ConfigError
from .common import Notes
from .emit import Document, Table
from .sources import SEEDS, SourceError, detect, read_all

Handler = Callable[[argparse.Namespace], int]
Translate = Callable[[Mapping[str, Any], Notes], Document]

EXIT_OK: Final = 0
EXIT_USAGE: Final = 2
MAX_ROUNDS: Final = 256
_SERVER: Final = re.compile(r"servers\[(\d+)\][.:\[]")
_SECRET: Final = re.compile(r"\{\{\s*secret:\s*([A-Za-z0-9_][A-Za-z0-9_.\-]*)\s*\}\}")


def translator(seed: str) -> Translate:
    if seed == "agentd":
        from .agentd import translate as agentd
        return agentd
    if seed == "zeph":
        from .zeph import translate as zeph
        return zeph
    from .mur import translate as mur
    return mur


# what the seed showed of a server that mcpcreds shows no tool of
SHOWN: Final = {"agentd": "agentd exposed every tool of a server with no allow list",
                "zeph": "zeph exposed every tool of an untrusted server with no tool_allowlist (and warned)",
                "mur": "mur filtered none of its tools"}


def checked(doc: Document, notes: Notes) -> tuple[str, Config]:
    """The rendered config once `mcpcreds check` accepts it, and what it loads as: each entry the
    check refuses is left out and listed, then the rest is checked again. ConfigError for a problem
    that is no entry's."""
    for _ in range(MAX_ROUNDS):
        text = doc.render()
        try:
            config = parse_config(tomllib.loads(text))
        except ConfigError as exc:
            refused = _refused_tables(doc, exc.errors)
            if refused is None:
                raise
            for table, errors in refused.items():
                origin = table.note.removeprefix("from ").split(" (", 1)[0] or table.name
                for error in errors:
                    notes.drop(origin, f"refused by mcpcreds check, not carried over: {error}")
                doc.tables.remove(table)
            continue
        for name, target in config.servers.items():
            if target.gateway.serves_proxy and target.trust.exposes_nothing:
                notes.differ(f"server {name}: {SHOWN[notes.seed]}; mcpcreds shows it none through the "
                             "gateway until it has a tool_allowlist (or trust = \"trusted\")")
        for name, entry in config.execs.items():
            if entry.policed and entry.trust.exposes_nothing:
                notes.differ(f"exec {name}: {SHOWN[notes.seed]}; mcpcreds relays none of its tools until it "
                             "has a tool_allowlist (or trust = \"trusted\")")
        return text, config
    raise ConfigError(["the import did not settle: report it"])


def _refused_tables(doc: Document, errors: list[str]) -> dict[Table, list[str]] | None:
    """The entry each error is about, by its TOML path; None when one is about no entry."""
    servers = [t for t in doc.tables if t.array and t.name == "servers"]
    named = sorted((t for t in doc.tables if not t.array and t.name.startswith(("services.", "exec."))),
                   key=lambda t: -len(t.name))
    found: dict[Table, list[str]] = {}
    for error in errors:
        match = _SERVER.match(error)
        table: Table | None = None
        if match and int(match.group(1)) < len(servers):
            table = servers[int(match.group(1))]
        else:
            table = next((t for t in named if error.startswith(t.name)
                          and error[len(t.name):len(t.name) + 1] in (".", ":", "[")), None)
        if table is None:
            return None
        found.setdefault(table, []).append(error)
    return found


def summary(notes: Notes, text: str, warnings: tuple[str, ...], paths: list[str], out: str | None) -> str:
    used = set(_SECRET.findall(text))
    execs = {m for m in re.findall(r"^\[exec\.\"?([^\]\"]+)\"?\]$", text, re.M)}
    servers = set(re.findall(r'^name = "([^"]+)"', text, re.M))
    servers |= {f"service:{m}" for m in re.findall(r"^\[services\.\"?([^\]\"]+)\"?\]$", text, re.M)}
    lines = [f"mcpcreds import: {notes.seed} config from {', '.join(paths)}"
             + (" (merged in this order, RFC 7396)" if len(paths) > 1 else ""),
             f"written to {out}" if out else "written to stdout"]

    def section(title: str, items: list[str]) -> None:
        if items:
            lines.append("")
            lines.append(title)
            lines.extend(f"  {item}" for item in items)

    section("What changes in meaning for this file:", [f"- {d}" for d in notes.differences])
    secrets = [f"mcpcreds secret set {name}    # {where}"
               for name, where in notes.secrets.items() if name in used]
    section("Secrets to store (none is in the output; each command reads the value from stdin):", secrets)
    section("Variables read from the environment (${VAR} is {{secret:VAR}}: the sidecar's environment, "
            "or `mcpcreds secret set VAR`):",
            [f"{var}    # {where}" for var, where in notes.environment.items() if var in used])
    section("Stdio servers: put these in the MCP client's config in place of the command:",
            [c for c in notes.commands if c.split()[2].strip("'") in execs])
    section("Logins to run once:", [c for c in notes.logins if c.split()[2].strip("'") in servers])
    section("Not carried over:", [f"- {d}" for d in notes.dropped])
    section("mcpcreds check warns:", [f"- {w}" for w in warnings])
    lines.append("")
    lines.append("mcpcreds check accepts it" + (f": mcpcreds check --config {out}" if out else ""))
    return "\n".join(lines)


def cmd_import(args: argparse.Namespace) -> int:
    paths: list[str] = args.files
    try:
        data = read_all(paths)
    except SourceError as exc:
        print(f"mcpcreds import: {exc}", file=sys.stderr)
        return EXIT_USAGE
    seed = args.source or detect(data)
    if seed is None:
        print(f"mcpcreds import: cannot tell which project wrote {', '.join(paths)}: give --from "
              f"{'|'.join(SEEDS)}", file=sys.stderr)
        return EXIT_USAGE
    notes = Notes(seed)
    doc = translator(seed)(data, notes)
    doc.header = [f"mcpcreds config, imported from {seed}'s config by `mcpcreds import`.",
                  "Each key's comment says what it came from and what changed in meaning."]
    try:
        text, config = checked(doc, notes)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        print("mcpcreds import: the imported config does not pass mcpcreds check; nothing written",
              file=sys.stderr)
        return EXIT_USAGE
    if args.output:
        try:
            fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            print(f"mcpcreds import: {args.output} exists: an import never writes over a file",
                  file=sys.stderr)
            return EXIT_USAGE
        except OSError as exc:
            print(f"mcpcreds import: cannot write {args.output}: {exc.strerror or 'error'}", file=sys.stderr)
            return EXIT_USAGE
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    print(summary(notes, text, config.warnings, paths, args.output), file=sys.stderr)
    return EXIT_OK


def add_parser(add: Callable[[str, Handler, str], Any]) -> None:
    p = add("import", cmd_import, "translate an agentd, zeph or mur config into an mcpcreds config (stdout, "
            "or -o PATH), with a comment per key and a summary of what changes in meaning")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="the config file(s); several are merged in order (RFC 7396), as agentd's -c a -c b")
    p.add_argument("--from", dest="source", choices=SEEDS, default=None,
                   help="the project that wrote them (default: told from their shape)")
    p.add_argument("-o", "--output", metavar="PATH", default=None,
                   help="write the config to this new file (never over an existing one); default: stdout")
