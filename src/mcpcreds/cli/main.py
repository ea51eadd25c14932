"""The `mcpcreds` command line.

`token`, `headers`, `acquire`, `status` and `credential-helper` run once per operation (from
scripts, git, docker), so they import only what they need: no config parser, httpx, asyncio,
authlib or cryptography (tests/test_cli_imports.py). Heavier modules are imported inside the
commands that use them, and the parser of the other commands' modules (exec, login) is built only
when one of those commands, or --help, is asked for.
"""

from __future__ import annotations

import os
import sys

from ..client.calls import MalformedAnswer
from ..core.socket_check import UntrustedSidecar
from ..errors import (
    ConfigError,
    InvalidRequest,
    McpcredsError,
    SidecarUnavailable,
    UnknownSecret,
    UnknownServer,
)
from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    MAX_NAME,
    client_of,
    config_of,
    exit_code_for,
    keyring_of,
    print_json,
    sidecar_address_of,
)

TYPE_CHECKING = False  # not `typing`'s: importing typing costs each command ~2 ms
if TYPE_CHECKING:
    import argparse  # imported by build_parser: `token NAME` and `headers NAME` run without it
    from collections.abc import Sequence
    from typing import Any, NoReturn, TextIO

    from .common import Handler


# ---------------------------------------------------------------------------- helpers


def read_secret_value(stdin: TextIO, prompt: str) -> str:
    """The value from stdin (one trailing newline stripped), or a no-echo prompt on a terminal."""
    if stdin.isatty():
        import getpass

        value = getpass.getpass(prompt)
    else:
        value = stdin.read()
        if value.endswith("\r\n"):
            value = value[:-2]
        elif value.endswith("\n"):
            value = value[:-1]
    if not value:
        raise InvalidRequest("empty secret value: nothing stored")
    return value


# ---------------------------------------------------------------------------- commands


def cmd_serve(args: argparse.Namespace) -> int:
    from ..core.logs import configure_logging
    from ..sidecar.serve import serve

    # unset: a readable line on a terminal, JSON lines elsewhere (journald, a file, a pipe)
    fmt = getattr(args, "log_format", None)
    configure_logging(level=getattr(args, "log_level", "info"),
                      json_lines=None if fmt is None else fmt == "json")
    return serve(getattr(args, "config", None))


def cmd_headers(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        info = client.headers_info(args.name)
    if args.json:
        print_json(info)
    else:
        for name, value in info["headers"].items():
            print(f"{name}: {value}")
    return EXIT_OK


def cmd_token(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        headers = client.headers(args.name)
    auth = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
    if auth is None or not auth.lower().startswith("bearer "):
        print(f"mcpcreds: {args.name} has no bearer token (no Authorization: Bearer header)",
              file=sys.stderr)
        return EXIT_FAILURE
    print(auth[7:].strip())
    return EXIT_OK


def cmd_acquire(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        result = client.acquire(args.name, cost=args.cost, max_wait=args.max_wait)
    print(f"granted {result['granted']} after {result['waited']:.3f}s", file=sys.stderr)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """JSON when piped (or --json); on a terminal, tables drawn by status_view (rich), imported
    only then: piped, `status` stays a fast command."""
    tty = sys.stdout.isatty()
    if args.watch:
        if args.json or not tty:
            raise InvalidRequest("--watch redraws a terminal; piped, run `mcpcreds status --json` "
                                 "once per reading")
        from .status_view import check_interval, watch

        interval = check_interval(args.interval)
        with client_of(args, connect_retry=0) as client:
            return watch(client.status, interval=interval, count=args.count)
    with client_of(args) as client:
        status = client.status()
    if args.json or (not tty and args.json is None):
        print_json(status)
        return EXIT_OK
    from .status_view import check_document, show

    try:
        check_document(status)
        show(status)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise MalformedAnswer(f"the sidecar's status answer is malformed ({type(exc).__name__}); "
                              "`mcpcreds status --json` shows it as it came") from None
    return EXIT_OK


def cmd_help(args: argparse.Namespace) -> int:
    from .help_config import render  # the parser's key lists: imported for this command only

    render(sys.stdout)
    sys.stdout.flush()  # `help config | head`: a closed pipe is met here, where main() handles it
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    config = config_of(args)
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    both = [t.name for t in config.servers.values() if t.gateway.expose == "both"]
    if both:
        print(f"hint: expose = \"both\" (the default) on {', '.join(both)}: with expose = \"proxy\" "
              "the credential never leaves the sidecar (only the gateway, /mcp/{server}, uses it)",
              file=sys.stderr)
    from ..config.model import LOGIN_GRANTS

    persons = [t.name for t in config.servers.values()
               if t.login is not None and t.login.grant in LOGIN_GRANTS]
    if persons:
        print(f"hint: {', '.join(persons)} use a person's login: run `mcpcreds login NAME` once for each",
              file=sys.stderr)
    print(f"{config.path}: ok")
    rows: list[tuple[str, ...]] = [("server", "key", "endpoint", "auth", "rate")]
    for target in (*config.services.values(), *config.servers.values()):
        rows.append((target.name, target.key, target.endpoint, target.auth_kind or "headers",
                     str(target.rate) if target.rate else "-"))
    _print_table(rows)
    return EXIT_OK


def _print_table(rows: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")


def cmd_stdio(args: argparse.Namespace) -> int:
    """A stdio MCP server relaying to the gateway: stdout is JSON-RPC only (see stdio_relay)."""
    import contextlib

    from ..client.client import grant_header
    from ..client.stdio_bridge import run
    from ..core.socket_check import check_folder, expected_sidecar_uid

    name = args.name
    if "://" in name:  # `mcpcreds stdio https://server/mcp`: in the place of `npx mcp-remote URL`
        from .onboard import cmd_stdio_url

        return cmd_stdio_url(args)
    if args.client_id is not None:
        raise InvalidRequest("--client-id is for `mcpcreds stdio URL` only: a server named has its own auth")
    if not 0 < len(name) <= MAX_NAME or not name.isprintable():
        raise InvalidRequest(f"SERVER must be a server name or cache key of 1 to {MAX_NAME} printable "
                             "characters")
    socket, configured = sidecar_address_of(args)
    sidecar_uid = expected_sidecar_uid(configured)
    # a planted socket is refused now (exit 69); with no sidecar yet, each request gets an error
    with contextlib.suppress(FileNotFoundError):
        check_folder(socket, sidecar_uid)
    return run(socket, sidecar_uid, name, grant_header(None))


def cmd_init(args: argparse.Namespace) -> int:
    from .onboard import cmd_init as init

    return init(args)


def cmd_credential_helper(args: argparse.Namespace) -> int:
    from .credential_helper import run

    return run(args, lambda: client_of(args))


def _grant_tools(pairs: list[str]) -> dict[str, list[str]] | None:
    """`--tool SERVER:TOOL` options as the grant's {server: [tool, ...]}."""
    tools: dict[str, list[str]] = {}
    for pair in pairs:
        server, sep, tool = pair.partition(":")
        if not sep or not server or not tool:
            raise InvalidRequest("--tool takes SERVER:TOOL")
        tools.setdefault(server, []).append(tool)
    return tools or None


def cmd_spawn_payload(args: argparse.Namespace) -> int:
    if args.tool and not args.grant:
        raise InvalidRequest("--tool narrows a grant: give --grant too")
    if args.grant:
        tools = _grant_tools(args.tool)
        with client_of(args) as client:
            answer = client.grant(list(args.names), ttl=args.ttl, tools=tools)
        if args.format == "agentd":
            from ..importers.payload import agentd_specs

            answer = {**answer, "servers": agentd_specs(answer.get("servers") or [], answer.get("tools"))}
        print_json(answer)
        return EXIT_OK
    config = config_of(args)
    specs = []
    for name in args.names:
        target = config.target(name)
        if target is None:
            raise UnknownServer(f"unknown server {name!r}")
        specs.append(target.spec_dict())
    if args.format == "agentd":
        from ..importers.payload import agentd_specs

        specs = agentd_specs(specs)
    print_json(specs)
    return EXIT_OK


def _notify_sidecar(args: argparse.Namespace, name: str) -> int:
    """Tell a running sidecar that `name` changed; fine if none runs or nothing uses it, but a
    socket that is not the sidecar's is reported (exit 69)."""
    try:
        with client_of(args, connect_retry=0) as client:
            renewed = client.secret_rotated(name)
    except UntrustedSidecar as exc:
        print(f"mcpcreds: the sidecar was not told: {exc.message}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (SidecarUnavailable, UnknownSecret):
        return EXIT_OK
    if renewed:
        print(f"sidecar renewed: {', '.join(renewed)}", file=sys.stderr)
    return EXIT_OK


def _secret_name(name: str) -> str:
    from ..credentials.sources import check_secret_name

    return check_secret_name(name)


def cmd_secret_set(args: argparse.Namespace) -> int:
    name = _secret_name(args.name)
    value = read_secret_value(sys.stdin, f"value for {name}: ")
    keyring_of(args).set(name, value, person=True)
    print(f"stored {name} in the keyring", file=sys.stderr)
    return _notify_sidecar(args, name)


def cmd_secret_rotate(args: argparse.Namespace) -> int:
    """Rotation with overlap, done by the sidecar: try the new value, then store and renew."""
    name = _secret_name(args.name)
    value = read_secret_value(sys.stdin, f"new value for {name}: ")
    try:
        with client_of(args, connect_retry=0, timeout=60) as client:
            result = client.secret_rotate(name, value, force=args.force)
    except SidecarUnavailable as exc:
        if isinstance(exc, UntrustedSidecar):  # someone else's socket: say so, store nothing
            raise
        if not args.force:
            print("mcpcreds: no sidecar is running to try the new value; "
                  "use --force to store it untested", file=sys.stderr)
            return EXIT_UNAVAILABLE
        keyring_of(args).set(name, value, person=True)
        print(f"stored {name} in the keyring (no sidecar running)", file=sys.stderr)
        return EXIT_OK
    renewed = ", ".join(result["renewed"]) or "nothing"
    print(f"rotated {name} (stored in {result['stored_in']}); renewed: {renewed}", file=sys.stderr)
    return EXIT_OK


def cmd_secret_rm(args: argparse.Namespace) -> int:
    from ..config.load import find_config_path, load_config

    name = _secret_name(args.name)
    if not args.force and (explicit := getattr(args, "config", None) or find_config_path()):
        try:
            config = load_config(explicit)
        except ConfigError:
            config = None
        users = [t.name for t in (*config.services.values(), *config.servers.values())
                 if name in t.secret_names] if config else []
        if users:
            raise InvalidRequest(f"secret {name!r} is still used by {', '.join(users)}; "
                                 "use --force to remove it anyway")
    if not keyring_of(args).delete(name):
        print(f"{name}: not in the keyring", file=sys.stderr)
        return EXIT_FAILURE
    print(f"removed {name}", file=sys.stderr)
    return EXIT_OK


def cmd_secret_list(args: argparse.Namespace) -> int:
    for name in keyring_of(args).names():
        print(name)
    return EXIT_OK


# ---------------------------------------------------------------------------- parser


# commands run once per operation: their parser leaves out the modules of the others (exec, login)
LEAN_COMMANDS = frozenset({"token", "headers", "acquire", "status", "credential-helper"})
# and `serve`: the sidecar's start-up would pay ~250 ms for the exec, login and doctor parsers
LEAN_PARSER = LEAN_COMMANDS | {"serve"}


def _command_word(argv: Sequence[str]) -> str | None:
    """The command `argv` names (its first word that is neither an option nor --config's value)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--config":
            skip = True
        elif word == "--":
            return None
        elif not word.startswith("-"):
            return word
    return None


class SimpleArgs:
    """The arguments of a simple form, as argparse's Namespace holds them (without importing
    `types` for SimpleNamespace: every command would pay for it); `config` and `socket` when given."""

    command: str
    name: str
    json: bool
    handler: Handler

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def _simple_form(argv: Sequence[str]) -> SimpleArgs | None:
    """`token NAME` and `headers NAME [--json]`, with `--config PATH` before or after the command
    and `--socket PATH` after it (or `--opt=PATH`), parsed without argparse: its import and parser
    cost these commands a few ms each time. None for anything else (help, another form, an
    option given twice...), which `build_parser` then parses as ever."""
    words = list(argv)
    options: dict[str, str] = {}
    rest: list[str] = []
    while words:
        word = words.pop(0)
        option, eq, value = word.partition("=")
        if option in ("--config", "--socket"):
            if option == "--socket" and not rest:
                return None  # argparse takes --socket after the command only
            if not eq:
                if not words:
                    return None
                value = words.pop(0)
            if option[2:] in options or not value:
                return None
            options[option[2:]] = value
        else:
            rest.append(word)
    as_json = rest[2:] == ["--json"]
    if len(rest) != 2 + as_json or rest[0] not in ("token", "headers") or (as_json and rest[0] != "headers"):
        return None
    if not rest[1] or rest[1].startswith("-"):
        return None
    handler = cmd_token if rest[0] == "token" else cmd_headers
    return SimpleArgs(command=rest[0], name=rest[1], json=as_json, handler=handler, **options)


def build_parser(full: bool = True) -> argparse.ArgumentParser:
    """The whole command line; with `full` False, without the commands defined in other modules,
    for a command of `LEAN_COMMANDS` (run once per operation: it must start fast). A command from
    another module is added under `if full:`, its import there too (tests/test_cli_imports.py)."""
    import argparse

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS,
                        help="config file (default: $MCPCREDS_CONFIG, then "
                             "$XDG_CONFIG_HOME/mcpcreds/config.toml)")
    parser = argparse.ArgumentParser(
        prog="mcpcreds", parents=[common],
        description="Credential and rate-limit sidecar for MCP agents.",
        epilog="exit codes: 0 ok, 1 failure, 2 usage or config error, 69 sidecar unreachable, "
               "73 init: the config exists, 75 rate limited past --max-wait, 77 forbidden",
    )
    class Version(argparse.Action):  # the version is read from the package metadata on use only
        def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
            from ..core.version import installed_version

            print(f"mcpcreds {installed_version()}")  # on stdout, as argparse's own version action
            parser.exit()

    parser.add_argument("--version", action=Version, nargs=0, default=argparse.SUPPRESS,
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    client_opts = argparse.ArgumentParser(add_help=False)
    client_opts.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS,
                             help="the sidecar's socket (default: from the config, $MCPCREDS_SOCKET, "
                                  "$XDG_RUNTIME_DIR/mcpcreds/mcpcreds.sock)")

    def add_client(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common, client_opts], help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    p = add("serve", cmd_serve, "run the sidecar in the foreground; ready when the socket accepts")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="log from this level up (default: info)")
    p.add_argument("--log-format", choices=("text", "json"), default=None,
                   help="text: a readable line with the local time; json: one JSON object a line, "
                        "with ISO-8601 and unix times (default: text on a terminal, json elsewhere)")
    p = add("init", cmd_init, "write a commented starter config (the socket, secret sources that work "
            "here, one example server) where the config is looked for; never over an existing file (exit 73)")
    p.add_argument("-o", "--output", metavar="PATH", default=None,
                   help="write it here instead (default: --config, else the config's default path)")
    add("check", cmd_check, "validate the config and print every error")
    p = add("help", cmd_help, "reference pages: `mcpcreds help config` lists every config key with its "
            "default and meaning")
    p.add_argument("topic", choices=("config",), metavar="TOPIC", help="config")
    if full:  # not for LEAN_COMMANDS: units.py costs them ~10 ms of imports (dataclasses, shutil)
        from .units import add_parser as add_units_parser  # stdlib only

        add_units_parser(add)  # mcpcreds install-units [--user|--system] [--dest DIR] (units.py)
    if full:  # not for LEAN_COMMANDS: doctor.py imports asyncio and email (~30 ms)
        from .doctor import add_parser as add_doctor_parser  # its checks import what they need

        add_doctor_parser(add_client)  # mcpcreds doctor [--json] (doctor.py)
    p = add_client("headers", cmd_headers, "print the resolved headers of a server")
    p.add_argument("name", metavar="NAME", help="server name or cache key (service:crm, mcp:docs)")
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    p = add_client("token", cmd_token, "print the bearer token of a server alone")
    p.add_argument("name", metavar="NAME", help="server name or cache key")
    p = add_client("acquire", cmd_acquire, "block until permits are granted (exit 75 past --max-wait)")
    p.add_argument("name", metavar="NAME", help="server name or cache key")
    p.add_argument("--cost", type=int, default=1, help="permits to take (default 1)")
    p.add_argument("--max-wait", type=float, default=30.0, metavar="S",
                   help="seconds to wait at most (default 30)")
    p = add_client("status", cmd_status, "servers, logins, buckets and gateway sessions, as tables on a "
                   "terminal (JSON when piped)")
    p.add_argument("--json", action="store_true", default=None, help="print JSON")
    p.add_argument("--watch", action="store_true", help="redraw every --interval seconds, top-style "
                   "(Ctrl-C quits); shows granted/refused per minute")
    p.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="seconds between refreshes of --watch (default 2)")
    p.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)  # refreshes, for tests
    p = add_client("spawn-payload", cmd_spawn_payload,
                   "print the secret-free JSON spec of these servers, for a child process")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.add_argument("--grant", action="store_true",
                   help="also mint a grant for exactly these servers (from the sidecar): prints "
                        '{"id", "grant", "expires_at", "servers"}; give the child MCPCREDS_GRANT')
    p.add_argument("--ttl", type=float, default=3600, help="grant lifetime in seconds (default 3600)")
    p.add_argument("--tool", action="append", default=[], metavar="SERVER:TOOL",
                   help="with --grant: the grant reaches only these tools of SERVER through the gateway "
                        "(repeat; a `prefix*` pattern names several; servers not named keep their policy's "
                        "tools)")
    p.add_argument("--format", choices=("mcpcreds", "agentd"), default="mcpcreds",
                   help="agentd: each server in agentd's McpServerSpec JSON shape, for a child that is an "
                        "agentd process (default: mcpcreds' spec)")
    p = add_client("stdio", cmd_stdio,
                   "a stdio MCP server relaying to the gateway, /mcp/SERVER (for MCP clients that launch "
                   "stdio servers); stdout carries JSON-RPC only; MCPCREDS_GRANT is sent as the grant. "
                   "With a URL (in the place of `npx mcp-remote URL`): the server is added to the config "
                   "if none has that endpoint, a sidecar started if none runs, the person logged in once "
                   "if the server asks for it")
    p.add_argument("name", metavar="SERVER", help="server name or cache key, or the URL of an MCP server "
                   "(https://..., http:// on a loopback host)")
    p.add_argument("--no-browser", action="store_true",
                   help="with a URL: print the login URL on stderr, never open a browser")
    p.add_argument("--client-id", metavar="ID",
                   help="with a URL: the OAuth client the login uses, written into the entry added: an id "
                        "registered with the server's authorization server, or the https URL of a client ID "
                        "metadata document (default: none, a client is registered at login, RFC 7591)")

    p = add_client("credential-helper", cmd_credential_helper,
                   "git and docker credential helper: answer `get` with the credential of the server "
                   "whose endpoint matches the host (store and erase do nothing)")
    p.add_argument("action", metavar="ACTION", choices=("get", "store", "erase", "list"),
                   help="get, store or erase (git); get, store, erase or list (--docker)")
    p.add_argument("--docker", action="store_true",
                   help="speak the docker credential helper protocol (docker-credential-mcpcreds)")
    p.add_argument("--server", metavar="NAME", default=None,
                   help="answer with this server's credential whatever the host (default: the server "
                        "whose endpoint matches the host and path)")
    p.add_argument("--username", metavar="NAME", default=None,
                   help="the username to answer with a token (default: the one asked for, else "
                        "\"mcpcreds\"); a Basic credential brings its own")
    p.add_argument("--header", metavar="NAME", default=None,
                   help="the header whose value is the secret (default: Authorization, else the only one)")

    if full:
        from .exec import add_parser as add_exec_parser
        from .login import add_parsers as add_login_parsers

        add_exec_parser(add_client)  # mcpcreds exec NAME -- CMD ARGS... (exec_cli.py)
        add_login_parsers(add_client)  # mcpcreds login NAME / logout NAME (login_flow.py)
        from .aauth import add_parser as add_aauth_parser

        add_aauth_parser(add_client)  # mcpcreds aauth show-key (aauth_cli.py)
        from .tools import add_parser as add_tools_parser

        add_tools_parser(add_client)  # mcpcreds tools SERVER / tools approve SERVER [TOOL...] (tools.py)
        from ..importers.cli import add_parser as add_import_parser

        add_import_parser(add)  # mcpcreds import FILE... [--from SEED] [-o PATH] (importers/cli.py)

    secret = sub.add_parser("secret", parents=[common], help="manage secrets in the keyring",
                            description="Manage secrets in the keyring; values never on argv.")
    ssub = secret.add_subparsers(dest="secret_command", metavar="ACTION", required=True)

    def add_secret(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = ssub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    p = add_secret("set", cmd_secret_set,
                   "store a secret read from stdin (a no-echo prompt on a terminal), then tell the sidecar")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS, help="the sidecar's socket")
    p = add_secret("rotate", cmd_secret_rotate,
                   "rotate a secret that logins depend on: the sidecar tries the new value (stdin) "
                   "first and stores it only if it works")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--force", action="store_true",
                   help="store without a trial (a static API key nothing can test)")
    p.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS, help="the sidecar's socket")
    p = add_secret("rm", cmd_secret_rm, "remove a secret from the keyring")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--force", action="store_true", help="remove even if a server still needs it")
    add_secret("list", cmd_secret_list, "list secret names (never values)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    args: Any = _simple_form(words)
    if args is None:
        lean = _command_word(words) in LEAN_PARSER and not {"-h", "--help"} & set(words)  # help lists all
        parser = build_parser(full=not lean)
        args = parser.parse_args(words)
    code = _run(args)
    if argv is None and isinstance(args, SimpleArgs):  # the process's own command line: it ends here
        _end_process(code)
    return code


def _run(args: Any) -> int:
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        where = f" in {exc.path}" if exc.path else ""
        print(f"mcpcreds: {exc.message.splitlines()[0].rstrip(':')}{where}", file=sys.stderr)
        return EXIT_USAGE
    except McpcredsError as exc:
        print(f"mcpcreds: {exc.code}: {exc.message}", file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `mcpcreds status | head`: the reader left; say nothing more
        _quiet_stdout()
        return EXIT_FAILURE


def _quiet_stdout() -> None:
    import contextlib

    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _end_process(code: int) -> NoReturn:
    """`token NAME` and `headers NAME` end their process once the answer is written: the
    interpreter's teardown (freeing what every module made, `re`'s that the console script
    imports too) would cost them 2-3 ms, a quarter of `python -c pass`. Nothing is left to close:
    no thread, no atexit handler (logging is never imported), the socket closed by its `with`."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # BrokenPipeError too: `mcpcreds token NAME | true`, the reader left
        code = EXIT_FAILURE
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
