"""What the commands share: exit codes, and the config, keyring and sidecar client a command's
arguments name. Imported by every command, so it stays as lean as main.py (no typing, json or
config parser until a command asks for them)."""

from __future__ import annotations

import sys

from ..client.address import sidecar_address
from ..client.client import Client
from ..errors import (
    ConfigError,
    ExecSessionsFull,
    Forbidden,
    InvalidRequest,
    LoginRequired,
    McpcredsError,
    RateLimited,
    SidecarUnavailable,
    UnknownSecret,
    UnknownServer,
)

TYPE_CHECKING = False  # not `typing`'s: importing typing costs each command ~2 ms
if TYPE_CHECKING:
    import argparse  # imported by build_parser: `token NAME` and `headers NAME` run without it
    from collections.abc import Callable
    from typing import Any

    from ..config.model import Config, SecretsConfig, Target
    from ..credentials.sources import KeyringSource

    Handler = Callable[["argparse.Namespace"], int]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69
EXIT_RATE_LIMITED = 75
EXIT_FORBIDDEN = 77
MAX_NAME = 256  # a server name or cache key on the command line
def exit_code_for(exc: McpcredsError) -> int:
    if isinstance(exc, ConfigError | InvalidRequest | UnknownServer):
        return EXIT_USAGE
    if isinstance(exc, SidecarUnavailable | ExecSessionsFull):
        return EXIT_UNAVAILABLE
    if isinstance(exc, RateLimited):
        return EXIT_RATE_LIMITED
    if isinstance(exc, Forbidden | LoginRequired):  # login_required: run `mcpcreds login NAME`
        return EXIT_FORBIDDEN
    return EXIT_FAILURE


def config_of(args: argparse.Namespace) -> Config:
    from ..config.load import load_config

    return load_config(getattr(args, "config", None))


def secrets_config_of(args: argparse.Namespace) -> SecretsConfig:
    """The [secrets] table if a config exists; defaults otherwise (so `secret set` works first)."""
    from ..config.load import find_config_path
    from ..config.model import SecretsConfig

    explicit = getattr(args, "config", None)
    if explicit or find_config_path().exists():
        return config_of(args).secrets
    return SecretsConfig()


def keyring_of(args: argparse.Namespace) -> KeyringSource:
    from ..credentials.sources import KeyringSource

    return KeyringSource(secrets_config_of(args))


def print_json(data: Any) -> None:
    import json  # not for `token` and `headers`: json (its `re`) costs a command ~2 ms

    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def sidecar_address_of(args: argparse.Namespace) -> tuple[str, int | None]:
    """The socket (--socket, else the config's sidecar.socket if a config exists, else the
    defaults) and the uid the sidecar must run as (sidecar.sidecar_uid, else the client's defaults).
    Only those two keys of the config are read (`address`): the sidecar validates the rest."""
    return sidecar_address(getattr(args, "config", None), getattr(args, "socket", None))


def client_of(args: argparse.Namespace, **options: Any) -> Client:
    socket, sidecar_uid = sidecar_address_of(args)
    return Client(socket, sidecar_uid=sidecar_uid, **options)


def tell_sidecar(args: argparse.Namespace, target: Target, logout: bool) -> None:
    """Tell a running sidecar that the login of `target` changed (or ended), saying on stderr
    whether it heard."""
    from ..credentials.login_store import entry_name

    try:
        with client_of(args, connect_retry=0, timeout=30) as client:
            if logout:
                client.request("POST", f"/v1/servers/{target.name}/invalidate", json={"reason": "logout"})
            else:
                client.secret_rotated(entry_name(target.key))
    except SidecarUnavailable as exc:
        if exc.code == "sidecar_unavailable" and type(exc) is SidecarUnavailable:
            print("no sidecar is running: it will use the login when it starts", file=sys.stderr)
        else:  # a socket that is not the sidecar's: nothing was sent
            print(f"mcpcreds: the sidecar was not told: {exc.message}", file=sys.stderr)
        return
    except UnknownSecret:
        return
    except McpcredsError as exc:
        print(f"mcpcreds: the sidecar was told, and answered {exc.code}", file=sys.stderr)
        return
    print("the sidecar was told", file=sys.stderr)
