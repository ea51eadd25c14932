"""systemd units for the sidecar, and `mcpcreds install-units` that writes them.

Two variants, each a socket unit (systemd binds the socket and starts the service on the first
connection) and a `Type=notify` service (sd_notify: READY, RELOADING, STOPPING, STATUS,
WATCHDOG). The user variant runs in the user's manager (`systemctl --user`), the socket in
`$XDG_RUNTIME_DIR/mcpcreds/`; the system variant runs as the `mcpcreds` user (created by its
sysusers.d file), the socket in `/run/mcpcreds/` (made 0700 for that user by its tmpfiles.d file
before any socket is bound), the config in `/etc/mcpcreds/config.toml`.

contrib/systemd/ holds the same text, rendered with the conventional paths of the binary (a test
keeps it so).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

USER_EXEC: Final = "%h/.local/bin/mcpcreds"  # pipx install, pip install --user
SYSTEM_EXEC: Final = "/usr/local/bin/mcpcreds"

_SOCKET: Final = """\
[Unit]
Description=mcpcreds sidecar socket (credentials and rate limits for MCP agents)
# written by mcpcreds install-units; mcpcreds doctor checks the setup (docs/tasks/systemd.md)

[Socket]
ListenStream={socket}
FileDescriptorName=mcpcreds
Accept=no
SocketMode=0600
DirectoryMode=0700
{socket_owner}\
# the file stays when the socket unit stops: serve never unlinks a socket systemd made
RemoveOnStop=no
# the gateway's loopback listener too, when the config sets [gateway] listen to this address:
#ListenStream=127.0.0.1:8931

[Install]
WantedBy=sockets.target
"""

_SERVICE: Final = """\
[Unit]
Description=mcpcreds sidecar (credentials and rate limits for MCP agents)
Requires=mcpcreds.socket
After=mcpcreds.socket{after}

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec_start} serve
ExecReload=kill -HUP $MAINPID
{identity}\
Environment=MCPCREDS_SOCKET={socket}
{config_env}\
Restart=on-failure
RestartSec=2s
WatchdogSec=30s
TimeoutStopSec=30s

# Secrets from systemd credentials: each LoadCredential=NAME:PATH becomes the file
# $CREDENTIALS_DIRECTORY/NAME, read by the source "dir:$CREDENTIALS_DIRECTORY" in
# [secrets] sources. For example:
#LoadCredential=MCP_TOKEN:{credentials_example}/MCP_TOKEN
#LoadCredentialEncrypted=MCP_TOKEN:{credentials_example}/MCP_TOKEN.cred

RuntimeDirectory=mcpcreds
RuntimeDirectoryMode=0700
# the socket unit's file lives in the runtime folder: keep it across stops and restarts
RuntimeDirectoryPreserve=yes
StateDirectory=mcpcreds
StateDirectoryMode=0700
UMask=0077

NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
PrivateMounts=yes
PrivateDevices=yes
DevicePolicy=closed
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
{proc}\
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
CapabilityBoundingSet=
AmbientCapabilities=
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
SystemCallErrorNumber=EPERM

[Install]
WantedBy={wanted_by}
"""

_SYSUSERS: Final = """\
# /usr/lib/sysusers.d/mcpcreds.conf: the user the system sidecar runs as
u mcpcreds - "mcpcreds sidecar" /var/lib/mcpcreds
"""

_TMPFILES: Final = """\
# /usr/lib/tmpfiles.d/mcpcreds.conf: the socket folder, 0700 for the sidecar's user, made at boot
# before mcpcreds.socket binds in it (serve refuses a folder that is not its own and 0700)
d /run/mcpcreds 0700 mcpcreds mcpcreds -
"""


@dataclass(frozen=True, slots=True)
class Unit:
    name: str
    text: str
    where: str  # the folder an installed copy goes to, for the message


def render(scope: str, exec_start: str) -> list[Unit]:
    """The files of one variant ('user' or 'system'), with ExecStart= running `exec_start`."""
    if scope == "user":
        socket = "%t/mcpcreds/mcpcreds.sock"
        service = _SERVICE.format(
            after="", exec_start=exec_start, identity="", socket=socket, config_env="",
            credentials_example="%h/.config/mcpcreds/credentials", wanted_by="default.target",
            proc="",  # ProtectProc=/ProcSubset= need a system manager
        )
        return [Unit("mcpcreds.socket", _SOCKET.format(socket=socket, socket_owner=""), "socket"),
                Unit("mcpcreds.service", service, "service")]
    if scope != "system":
        raise ValueError(scope)
    socket = "/run/mcpcreds/mcpcreds.sock"
    service = _SERVICE.format(
        after=" network-online.target\nWants=network-online.target", exec_start=exec_start,
        identity="User=mcpcreds\nGroup=mcpcreds\n", socket=socket,
        config_env="Environment=MCPCREDS_CONFIG=/etc/mcpcreds/config.toml\n",
        credentials_example="/etc/mcpcreds/credentials", wanted_by="multi-user.target",
        proc="ProtectProc=invisible\nProcSubset=pid\n",
    )
    return [Unit("mcpcreds.socket", _SOCKET.format(socket=socket,
                                                    socket_owner="SocketUser=mcpcreds\nSocketGroup=mcpcreds\n"),
                 "socket"),
            Unit("mcpcreds.service", service, "service"),
            Unit("mcpcreds.sysusers.conf", _SYSUSERS, "/usr/lib/sysusers.d/mcpcreds.conf"),
            Unit("mcpcreds.tmpfiles.conf", _TMPFILES, "/usr/lib/tmpfiles.d/mcpcreds.conf")]


def default_exec_start() -> str:
    """This installation's `mcpcreds`: the script on PATH next to this interpreter, else
    `python -m mcpcreds` with this interpreter (both absolute: systemd needs no PATH)."""
    beside = Path(sys.executable).with_name("mcpcreds")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    if found := shutil.which("mcpcreds"):
        return str(Path(found).resolve())
    return f"{shlex.quote(sys.executable)} -m mcpcreds"


def default_dest(scope: str) -> Path:
    if scope == "system":
        return Path("/etc/systemd/system")
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def install(scope: str, dest: Path, exec_start: str, force: bool = False) -> list[Path]:
    """Write the variant's files into `dest` (0644; nothing is overwritten without `force`)."""
    units = render(scope, exec_start)
    targets = [dest / u.name for u in units]
    if not force and (existing := [str(t) for t in targets if t.exists()]):
        raise FileExistsError(f"already there: {', '.join(existing)} (--force to replace)")
    dest.mkdir(parents=True, exist_ok=True)
    for unit, target in zip(units, targets, strict=True):
        tmp = target.with_name(f".{target.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(unit.text)
        os.chmod(tmp, 0o644)  # units are public; the umask may be tighter
        os.replace(tmp, target)
    return targets


def cmd_install_units(args: argparse.Namespace) -> int:
    scope = "system" if args.system else "user"
    dest = Path(args.dest) if args.dest else default_dest(scope)
    exec_start = args.exec_start or default_exec_start()
    try:
        written = install(scope, dest, exec_start, args.force)
    except (FileExistsError, PermissionError) as exc:
        print(f"mcpcreds: install-units: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    ctl = "systemctl --user" if scope == "user" else "systemctl"
    print("\nnext:")
    if scope == "system":
        print(f"  install -m 0644 {dest / 'mcpcreds.sysusers.conf'} /usr/lib/sysusers.d/mcpcreds.conf"
              " && systemd-sysusers")
        print(f"  install -m 0644 {dest / 'mcpcreds.tmpfiles.conf'} /usr/lib/tmpfiles.d/mcpcreds.conf"
              " && systemd-tmpfiles --create mcpcreds.conf")
        print("  put the config in /etc/mcpcreds/config.toml")
    if args.dest:
        print(f"  copy the units into {default_dest(scope)} (or link them: {ctl} link ...)")
    print(f"  {ctl} daemon-reload && {ctl} enable --now mcpcreds.socket")
    print("  mcpcreds doctor")
    return 0


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    """`mcpcreds install-units [--user|--system] [--dest DIR]`; `add` is cli.build_parser's add()."""
    p = add("install-units", cmd_install_units,
            "write the systemd units (socket activation, sd_notify, hardening) for this installation")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--user", action="store_true", help="for systemctl --user (the default): "
                       "~/.config/systemd/user")
    scope.add_argument("--system", action="store_true", help="for the system manager, as the mcpcreds "
                       "user: /etc/systemd/system (plus its sysusers.d and tmpfiles.d files)")
    p.add_argument("--dest", metavar="DIR", help="write into DIR instead")
    p.add_argument("--exec", dest="exec_start", metavar="CMD",
                   help="what ExecStart= runs (default: this installation's mcpcreds)")
    p.add_argument("--force", action="store_true", help="replace units already there")
