"""`mcpcreds exec NAME -- CMD ARGS...`: run a stdio MCP server with the environment and the
network of `[exec.NAME]`.

The sidecar resolves the entry's environment (peer-checked, grant-aware); this builds the
child's environment from it and `execve`s the command: the process *becomes* the child, so its
stdin/stdout (the MCP channel: nothing here writes to stdout), its signals and its exit status
are the child's own. Secret values travel from the sidecar's socket into `execve`'s environment
only: never argv, never this process's `os.environ`, never a log line.

Network: `inherit` changes nothing. `off`: a network namespace with loopback only.
`restricted` / `broad_audited`: a namespace whose only way out is the sidecar's egress proxy,
through a forwarder on 127.0.0.1 inside it (`netns.py`); the child gets the proxy URL, with the
session's credential, in `HTTPS_PROXY`/`HTTP_PROXY`/`ALL_PROXY` (both cases) and an empty
`NO_PROXY`. Without namespaces, `off` and `restricted` refuse unless `--advisory`.

Whatever the network, the child gets a user namespace of its own (entered last, after the
forwarder is started): the sidecar lets a peer in another user namespace act only within a grant,
so the child is not its caller to the sidecar. Without one, stderr says the child can reach every
credential its caller can.
With it, a mount namespace in which the caller's runtime folders and session bus socket are
covered (`mountns.py`): no D-Bus session bus, so no Secret Service keyring.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from ..client.calls import MalformedAnswer
from ..core.socket_check import check_folder, check_peer, expected_sidecar_uid
from ..errors import InvalidRequest, McpcredsError
from ..exec.egress_notices import HEADER as NOTICES_HEADER
from ..exec.egress_proxy import HOLD_METHOD, USER, proxy_url
from ..exec.mountns import hide_session
from ..exec.netns import (
    ForwarderFailed,
    NamespaceUnavailable,
    enter_network_namespace,
    enter_user_namespace,
    start_forwarder,
)

BASE_VARS: Final = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TZ", "TMPDIR",
                              "XDG_RUNTIME_DIR"})
PROXY_VARS: Final = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
NAMESPACES_ENV: Final = "MCPCREDS_EXEC_NAMESPACES"  # "0": behave as if namespaces were unavailable
DEAD_PROXY: Final = "http://127.0.0.1:9"  # advisory `off`: well-behaved clients fail at once
_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}\Z")
EXIT_NOT_FOUND: Final = 127
EXIT_NOT_EXECUTABLE: Final = 126


class ExecError(McpcredsError):
    """`mcpcreds exec` cannot start the child as configured (nothing was started)."""

    code = "exec_error"
    status = 500


def base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables an isolated child keeps: PATH HOME USER LOGNAME LANG LC_* TERM TZ TMPDIR
    XDG_RUNTIME_DIR (those that are set)."""
    return {k: v for k, v in environ.items() if k in BASE_VARS or k.startswith("LC_")}


def env_digests(environ: Mapping[str, str]) -> dict[str, str]:
    """SHA-256 of each value (surrounding whitespace stripped): the sidecar names the ones that are
    secrets without seeing any."""
    return {k: hashlib.sha256(v.strip().encode("utf-8", "surrogateescape")).hexdigest()
            for k, v in list(environ.items())[:4096] if 0 < len(k) <= 256}


def child_env(environ: Mapping[str, str], answer: Mapping[str, Any]) -> dict[str, str]:
    """The child's environment from the caller's and the sidecar's answer (proxy variables aside)."""
    if answer["env_isolation"]:
        env = base_env(environ)
    else:
        drop = set(answer["drop"]) | {"MCPCREDS_GRANT"}
        env = {k: v for k, v in environ.items() if k not in drop}
    env.update(answer["env"])
    return env


def proxy_env(url: str) -> dict[str, str]:
    env = {}
    for name in PROXY_VARS:
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = ""
    return env


def _checked(answer: Any) -> dict[str, Any]:
    ok = (isinstance(answer, dict) and isinstance(answer.get("env"), dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in answer["env"].items())
          and isinstance(answer.get("drop"), list) and all(isinstance(d, str) for d in answer["drop"])
          and isinstance(answer.get("env_isolation"), bool) and isinstance(answer.get("net"), str)
          and (answer.get("policy") is None or isinstance(answer["policy"], dict))
          and (answer.get("proxy") is None or (isinstance(answer["proxy"], dict)
                                               and isinstance(answer["proxy"].get("socket"), str)
                                               and isinstance(answer["proxy"].get("token"), str))))
    if not ok:
        raise MalformedAnswer("the sidecar's exec answer is malformed")
    return answer  # type: ignore[no-any-return]


def _warn(text: str) -> None:
    print(f"mcpcreds exec: warning: {text}", file=sys.stderr)


def _warn_all(texts: list[str]) -> None:
    for text in texts:
        _warn(text)


def _hold(proxy_socket: str, token: str, sidecar_uid: int) -> socket.socket:
    """Open the session's hold connection: the session lives as long as it stays open, and the
    forwarder reads the sidecar's refusal lines from it. Before a byte is sent (the credential),
    the socket is checked as the sidecar's own: its folder the sidecar uid's and closed to others,
    the listener running as that uid."""
    check_folder(proxy_socket, sidecar_uid)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(10)
        sock.connect(proxy_socket)
        check_peer(sock, proxy_socket, sidecar_uid)
        credential = base64.b64encode(f"{USER}:{token}".encode()).decode()
        sock.sendall(HOLD_METHOD + f" * HTTP/1.1\r\nProxy-Authorization: Basic {credential}\r\n"
                                   f"{NOTICES_HEADER.decode()}: 1\r\n\r\n".encode())
        head = b""
        while not head.endswith(b"\r\n\r\n") and len(head) < 4096:
            chunk = sock.recv(1)  # the head only: what follows is the forwarder's (refusal lines)
            if not chunk:
                break
            head += chunk
        if not head.startswith(b"HTTP/1.1 200"):
            raise ExecError("the sidecar's egress proxy refused the session")
        sock.settimeout(None)
        return sock
    except OSError as exc:
        sock.close()
        raise ExecError(f"cannot reach the sidecar's egress proxy ({exc.strerror or exc})") from None
    except BaseException:
        sock.close()
        raise


def _namespaces_allowed() -> bool:
    return os.environ.get(NAMESPACES_ENV, "1") != "0"


def _network(answer: Mapping[str, Any], advisory: bool, sidecar_uid: int) -> dict[str, str]:
    """Set up the child's namespaces (this process enters them); its proxy variables."""
    net = answer["net"]
    hold = None
    if net not in ("inherit", "off"):
        proxy = answer["proxy"]
        if proxy is None:
            raise MalformedAnswer("the sidecar's exec answer has no proxy session")
        # before the namespace: in a user namespace the sidecar's uid may read as the overflow uid
        hold = _hold(proxy["socket"], proxy["token"], sidecar_uid)
    try:
        return _isolate(answer, advisory, hold)
    finally:
        if hold is not None:
            hold.close()


def _isolate(answer: Mapping[str, Any], advisory: bool, hold: socket.socket | None) -> dict[str, str]:
    """The network namespace (unless `inherit`), the forwarder in it, then the child's own user
    namespace: entered last, so that root's forwarder stays out of the child's reach."""
    net = answer["net"]
    why = "disabled by MCPCREDS_EXEC_NAMESPACES=0"
    in_netns = in_userns = False
    if _namespaces_allowed() and net != "inherit":
        try:
            in_userns = enter_network_namespace() == "userns+netns"
            in_netns = True
        except NamespaceUnavailable as exc:
            why = exc.strerror or "refused by the kernel"
    if net != "inherit" and not in_netns:
        if net in ("off", "restricted") and not advisory:
            raise ExecError(f"net = {net!r} needs a network namespace, and none is available ({why}); "
                            "--advisory runs the child with proxy variables only (not enforced), and "
                            "able to reach every credential you can")
        _warn(f"no network namespace ({why}): net = {net!r} is advisory, a child that ignores "
              "the proxy variables is not stopped")
    env = _proxy(answer, hold, in_netns)  # the forwarder keeps the caller's mounts: the proxy socket
    hidden: bool | None = None  # not tried yet
    if _namespaces_allowed() and not in_userns:
        if os.geteuid() == 0:  # before: root's child then cannot unmount the covers
            hidden = _hide_session()
        try:
            enter_user_namespace()
            in_userns = True
        except NamespaceUnavailable as exc:
            why = exc.strerror or "refused by the kernel"
    if not in_userns:
        _warn(f"no user namespace ({why}): the child can reach every credential you can (the "
              "sidecar's socket and API: every server's headers, other exec entries' secrets, grants; "
              "your session bus and keyring)")
    elif hidden is None:
        _hide_session()
    return env


def _hide_session() -> bool:
    """The caller's runtime folders and session bus hidden from the child (`mountns.py`); a warning
    if they cannot be."""
    try:
        hide_session(os.environ, os.geteuid())
        return True
    except NamespaceUnavailable as exc:
        _warn(f"cannot hide your session from the child ({exc.strerror}): it can reach your D-Bus session "
              "bus, and through it every item of your keyring, and the sockets in your runtime folder")
        return False


def _proxy(answer: Mapping[str, Any], hold: socket.socket | None, in_netns: bool) -> dict[str, str]:
    """The child's proxy variables; for a proxy session, the forwarder started."""
    net = answer["net"]
    if net == "inherit":
        return {}
    if net == "off" or hold is None:
        return {} if in_netns else proxy_env(DEAD_PROXY)
    proxy = answer["proxy"]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        port = listener.getsockname()[1]
        start_forwarder(listener, proxy["socket"], hold)
    except ForwarderFailed:
        raise ExecError("the egress forwarder did not start; nothing was started") from None
    finally:
        listener.close()
    return proxy_env(proxy_url(proxy["token"], port))


def print_env(env: Mapping[str, str], declared: Mapping[str, str], net: str) -> None:
    for name in sorted(env):
        origin = "declared" if name in declared else "inherited"
        print(f"{name}=***  ({origin})")
    if net in ("restricted", "broad_audited"):
        for name in (*PROXY_VARS, *(n.lower() for n in PROXY_VARS)):
            print(f"{name}=***  (the session's proxy)")
        print("NO_PROXY=  (the session's proxy)\nno_proxy=  (the session's proxy)")


_FLAGS: Final = ("--advisory", "--print-env")
_VALUED: Final = ("--config", "--socket")  # the options every client command takes


def _options_before_dash(args: argparse.Namespace, rest: list[str]) -> list[str]:
    """`exec NAME --advisory --config X -- CMD`: the options written after NAME, before `--`
    (argparse leaves them in the command, since the command takes everything after NAME)."""
    if "--" not in rest:
        return rest
    cut = rest.index("--")
    before = rest[:cut]
    i = 0
    while i < len(before):
        option = before[i]
        name, eq, value = option.partition("=")
        if option in _FLAGS:
            setattr(args, option[2:].replace("-", "_"), True)
        elif name in _VALUED and (eq or i + 1 < len(before)):
            if not eq:
                i += 1
                value = before[i]
            setattr(args, name[2:], value)
        else:
            raise InvalidRequest("before `--` only --advisory, --print-env, --config PATH and --socket "
                                 "PATH are understood: mcpcreds exec NAME [--advisory] [--config PATH] -- "
                                 "CMD [ARGS...]")
        i += 1
    return rest[cut + 1:]


def cmd_exec(args: argparse.Namespace) -> int:
    from .common import client_of, sidecar_address_of

    command = _options_before_dash(args, list(args.command))
    if not command and not args.print_env:
        raise InvalidRequest("no command: mcpcreds exec NAME -- CMD [ARGS...]")
    if not _NAME.match(args.name):  # never echoed: it may be a pasted secret
        raise InvalidRequest("invalid exec name: letters, digits, '_', '.', '-' (at most 128)")
    environ = dict(os.environ)
    with client_of(args) as client:
        answer = _checked(client.request("POST", f"/v1/exec/{quote(args.name)}/session",
                                         {"env_hashes": env_digests(environ),
                                          "proxy": not args.print_env}))
    env = child_env(environ, answer)
    if args.print_env:
        print_env(env, answer["env"], answer["net"])
        return 0
    program = shutil.which(command[0], path=env.get("PATH", os.defpath))
    if program is None:
        print("mcpcreds exec: command not found (on the child's PATH)", file=sys.stderr)
        return EXIT_NOT_FOUND
    sidecar_uid = expected_sidecar_uid(sidecar_address_of(args)[1])
    if answer.get("policy") is None:
        return _start(program, command, env, answer, args.advisory, sidecar_uid)
    from ..exec.stdio_pins import view_of
    from ..exec.stdio_relay import BadPolicy, StdioPolicy, policy_of
    from .exec_relay import run_relayed

    try:
        trust, content = policy_of(answer["policy"])
    except BadPolicy:
        raise MalformedAnswer("the sidecar's exec answer has a malformed policy") from None
    pin_view = None if answer.get("pins") is None else view_of(answer["pins"])
    if answer.get("pins") is not None and pin_view is None:
        raise MalformedAnswer("the sidecar's exec answer has malformed tool pins")
    name = args.name
    policy = StdioPolicy(name, trust, content, time.monotonic, on_warnings=_warn_all, pin_view=pin_view)

    def post(events: list[dict[str, Any]]) -> None:
        with client_of(args) as events_client:
            events_client.request("POST", f"/v1/exec/{quote(name)}/events", {"events": events})

    def post_pins(bodies: list[dict[str, Any]]) -> None:
        with client_of(args) as pins_client:
            for body in bodies:
                pins_client.request("POST", f"/v1/exec/{quote(name)}/pins", body)

    return run_relayed(policy, lambda: sys.exit(_start(program, command, env, answer, args.advisory,
                                                         sidecar_uid)), post, post_pins)


def _start(program: str, command: list[str], env: dict[str, str], answer: Mapping[str, Any], advisory: bool,
           sidecar_uid: int) -> int:
    """Isolate this process as the entry says and become the command (an exit code if it cannot)."""
    env.update(_network(answer, advisory, sidecar_uid))
    try:
        os.execve(program, command, env)
    except OSError as exc:
        print(f"mcpcreds exec: cannot run the command ({exc.strerror})", file=sys.stderr)
        return EXIT_NOT_EXECUTABLE if isinstance(exc, PermissionError) else EXIT_NOT_FOUND
    return EXIT_NOT_FOUND  # not reached: execve does not return


def add_parser(add_client: Any) -> None:
    """`mcpcreds exec`, added with cli.py's `add_client`."""
    p = add_client("exec", cmd_exec, "run a stdio MCP server with the environment and network of "
                                     "[exec.NAME] (secrets from the sidecar)")
    p.add_argument("name", metavar="NAME", help="the [exec.NAME] entry")
    p.add_argument("--print-env", action="store_true",
                   help="print the child's variable names (values masked) instead of running it")
    p.add_argument("--advisory", action="store_true",
                   help="where network namespaces are unavailable, run net = off/restricted with "
                        "proxy variables only (not enforced)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...")
