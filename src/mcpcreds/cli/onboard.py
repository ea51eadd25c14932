"""The first hour: `mcpcreds init` and `mcpcreds stdio URL`.

`init` writes a commented starter config where the config is looked for, with the socket in the
user's runtime folder and secret sources that work here, and says what to run next.

`stdio URL` is what a desktop client's config names in place of `npx mcp-remote URL`. Before it
relays (as `stdio NAME` does), it makes sure that
- the config has a server for that endpoint: one is appended (the config created first, as `init`
  makes it, when there is none), not trusted, every tool exposed, served through the gateway
  only, with a person's login when the server asks for one (its unauthenticated request answered
  401, or it publishes protected-resource metadata);
- a sidecar answers: a running one is asked to reload, or one is started detached;
- a server that asks for a login has one: the person logs in once, in the browser (`mcpcreds
  login`'s flow: discovery, PKCE, and the client `--client-id` named, written into the entry: a
  pre-registered id or a metadata document's URL; without it, a client registered then, RFC 7591),
  and the refresh token goes to the keyring.
Each of the three is done under a lock file and checked again once the lock is held, so desktop
clients that start together add one entry, start one sidecar and log in once. stdout carries
JSON-RPC only: it is taken before anything else runs, and everything said goes to stderr."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any, Final

from ..client.address import config_file, sidecar_address, socket_file
from ..client.client import Client, grant_header
from ..client.launch import file_lock, fill_session_bus, sidecar_answers, start_sidecar, state_folder
from ..client.stdio_bridge import run, take_stdout, unreachable_text
from ..config.load import default_socket_path, load_config, parse_config
from ..config.model import LOGIN_GRANTS, Config, SecretsConfig, Target
from ..config.starter import (
    append_entry,
    check_endpoint,
    entry_text,
    read_config_text,
    server_for_endpoint,
    server_name_for,
    server_names,
    starter_config,
    write_new,
)
from ..core.socket_check import expected_sidecar_uid
from ..credentials.discovery import Discovery
from ..credentials.login_store import MAX_CLIENT_ID_CHARS, entry_name, login_store
from ..credentials.sources import KeyringSource
from ..errors import (
    ConfigError,
    Forbidden,
    InvalidRequest,
    McpcredsError,
    SidecarUnavailable,
    TokenEndpointError,
    TokenEndpointTimeout,
    UpstreamError,
)
from ..net.egress_http import egress_client
from .common import EXIT_OK, tell_sidecar
from .login import DEFAULT_WAIT, run_login

EXIT_CANTCREAT: Final = 73  # sysexits: the file exists and is not overwritten
CONFIG_LOCK_WAIT: Final = 60.0  # another launch probing the server (10 s at most) and writing
LOGIN_LOCK_WAIT: Final = DEFAULT_WAIT + 60.0  # another launch's person logging in


def say(message: str) -> None:
    print(f"mcpcreds stdio: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- init


def keyring_usable() -> bool:
    """Whether the default keyring backend (SecretService on Linux) answers and is unlocked."""
    try:
        KeyringSource(SecretsConfig()).names()
    except McpcredsError:
        return False
    return True


def secrets_folder() -> str:
    """$XDG_DATA_HOME/mcpcreds/secrets (~/.local/share/...): the `dir:` source when there is no
    keyring."""
    base = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "mcpcreds", "secrets")


def new_config(example: bool) -> tuple[str, bool]:
    """The starter config for this user, checked to load, and whether it uses the keyring; the
    `dir:` folder is made when it is used."""
    keyring = keyring_usable()
    folder = secrets_folder()
    text = starter_config(socket_file(None), keyring, folder, example=example)
    parse_config(tomllib.loads(text))  # what is written must load
    if not keyring:
        old = os.umask(0o077)
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        finally:
            os.umask(old)
    return text, keyring


def cmd_init(args: argparse.Namespace) -> int:
    path = Path(config_file(args.output or getattr(args, "config", None)))
    text, keyring = new_config(example=True)
    try:
        write_new(path, text)
    except FileExistsError:
        print(f"mcpcreds: {path} exists: not overwritten (edit it, or write a new config elsewhere "
              "with -o PATH)", file=sys.stderr)
        return EXIT_CANTCREAT
    sources = "env, keyring" if keyring else f"env, dir:{secrets_folder()} (no usable keyring found)"
    print(f"wrote {path} (secret sources: {sources}; one example server)")
    where = "" if str(path) == config_file(None) else f" --config {shlex.quote(str(path))}"
    print("next:")
    print(f"  mcpcreds check{where}     # validate it")
    print(f"  mcpcreds serve{where}     # run the sidecar (or `mcpcreds install-units` for systemd)")
    return EXIT_OK


# ---------------------------------------------------------------------------- stdio URL: the entry


def _probe_target(url: str) -> Target:
    """The server an entry for `url` would be (its egress policy: loopback only for a loopback
    http:// URL, as the sidecar's own)."""
    config = parse_config({"servers": [{"name": "probe", "endpoint": url, "trust": "untrusted",
                                        "allow_untrusted_without_allowlist": True}]})
    return config.servers["probe"]


def asks_for_login(url: str) -> bool:
    """Whether the MCP server at `url` asks for an OAuth login (discovery's probe)."""
    target = _probe_target(url)

    async def probe() -> bool:
        async with egress_client(target.egress) as http:
            return await Discovery().needs_authorization(url, http)

    try:
        return asyncio.run(probe())
    except (TokenEndpointError, TokenEndpointTimeout, Forbidden) as exc:  # the URL is not repeated
        why = ("the egress policy refuses its address (a private one?)" if isinstance(exc, Forbidden)
               else "it could not be reached")
        raise UpstreamError(f"no server was added for that URL: {why}; nothing was written") from None


def _same_client(config: Config, name: str, client_id: str) -> None:
    """Refuse a `--client-id` that the existing entry `name` does not carry: an entry is never
    rewritten (the id is not repeated: it will be a config value)."""
    login = config.servers[name].login
    if login is not None and login.client_id == client_id:
        return
    has = "no login" if login is None else "another client_id" if login.client_id else "no client_id"
    raise InvalidRequest(f"--client-id: server {name} in {config.path} already has that endpoint, with "
                         f"{has}; the config is never rewritten: set client_id in that server's auth table "
                         "yourself (or remove the entry to have it added again)")


def ensure_entry(path: Path, url: str, client_id: str | None = None) -> tuple[str, bool]:
    """The server of the config at `path` for `url`: (its name, whether it was added now), with
    `client_id` in its login when it asks for one. Called under the config lock: read, check,
    append."""
    text = read_config_text(path)
    data: dict[str, Any] = {}
    if text is not None:
        config = load_config(path)  # a config that does not load is reported as `check` would, untouched
        data = tomllib.loads(text)
        if (name := server_for_endpoint(data, url)) is not None:
            if client_id is not None:
                _same_client(config, name, client_id)
            return name, False
    login = asks_for_login(url)
    if client_id is not None and not login:
        say("the server asks for no login: --client-id is not written")
    name = server_name_for(url, server_names(data))
    entry = entry_text(name, url, login, client_id)
    if text is None:
        starter, _ = new_config(example=False)
        parse_config(tomllib.loads(starter + entry), str(path))
        write_new(path, starter + entry)
        say(f"created {path}")
    else:
        append_entry(path, text, entry)
    say(f"added server {name} to {path}" + ("; it asks for a person's login" if login else ""))
    return name, True


# ---------------------------------------------------------------------------- stdio URL: the sidecar


def ensure_served(config: Config, name: str, socket: str, sidecar_uid: int | None, state: Path) -> None:
    """A sidecar on `socket` that serves `name`: started when none answers (and the socket is the
    one this config's sidecar listens on), else asked to reload when it does not know `name` yet."""
    if not sidecar_answers(socket, sidecar_uid):
        if str(default_socket_path(config.sidecar.socket)) != socket:
            raise SidecarUnavailable(unreachable_text(socket))
        assert config.path is not None
        pid = start_sidecar(Path(config.path), socket, sidecar_uid, state)
        if pid is not None:
            say(f"started a sidecar (pid {pid}) on {socket}; its log is {state / 'sidecar.log'}")
    with Client(socket, sidecar_uid=sidecar_uid, connect_retry=0, timeout=30) as client:
        if any(spec.get("name") == name for spec in client.servers()):
            return
        try:
            answer = client.request("POST", "/v1/reload", json={})
        except McpcredsError as exc:
            if exc.code in ("not_found", "invalid_request"):
                raise SidecarUnavailable(f"the sidecar on {socket} cannot reload its config ({exc.code}): "
                                         f"restart it to serve {name}") from None
            raise
        if isinstance(answer, dict) and answer.get("reloaded") is False:
            raise ConfigError([str(e) for e in answer.get("errors") or []] or ["the config was rejected"],
                              config.path)
        if not any(spec.get("name") == name for spec in client.servers()):
            raise SidecarUnavailable(f"the sidecar on {socket} reloaded but does not serve {name}: it reads "
                                     f"another config than {config.path}")


# ---------------------------------------------------------------------------- stdio URL: the login


NEEDS_LOGIN: Final = ("login_required", "invalid_grant")  # a renewal that only a new login mends
LIVE: Final = ("valid", "stale", "renewing")  # the states of a login the sidecar holds


def sidecar_has_login(socket: str, sidecar_uid: int | None, target: Target) -> bool:
    """Whether the sidecar holds a usable login for `target`: one it has (its status), else one it
    can renew from the stored login now (asked as after `mcpcreds login`); False only when the
    renewal was refused as only a new login mends (a revoked or expired refresh token)."""
    with Client(socket, sidecar_uid=sidecar_uid, connect_retry=0, timeout=30) as client:
        rows = client.status().get("logins") or []
        if any(isinstance(r, dict) and r.get("key") == target.key and r.get("state") in LIVE for r in rows):
            return True
        answer = client.request("POST", f"/v1/secrets/{entry_name(target.key)}/rotated", json={})
    failed = answer.get("failed") if isinstance(answer, dict) else None
    return not (isinstance(failed, dict) and failed.get(target.key) in NEEDS_LOGIN)


def ensure_login(args: argparse.Namespace, config: Config, target: Target, socket: str,
                 sidecar_uid: int | None, state: Path) -> None:
    """A person's login for `target` when it needs one and the sidecar has no usable one (the
    keyring holds none, or the sidecar's renewal from it was refused): once, under the entry's
    login lock (a launch that waited finds the login the first one made)."""
    if target.login is None or target.login.grant not in LOGIN_GRANTS:
        return
    store = login_store(config.secrets)

    def usable() -> bool:
        return store.get(target.key) is not None and sidecar_has_login(socket, sidecar_uid, target)

    if usable():
        return
    entry = entry_name(target.key)
    with file_lock(state / f"{entry}.lock", LOGIN_LOCK_WAIT, f"logging in to {target.name}"):
        if usable():
            return
        say(f"{target.name} asks for a login: opening the browser" if not args.no_browser else
            f"{target.name} asks for a login")
        asyncio.run(run_login(config, target, sys.stderr, open_browser=not args.no_browser,
                              wait=DEFAULT_WAIT))
        say(f"logged in to {target.name}; the refresh token is in the keyring as {entry}")
        tell_sidecar(args, target, logout=False)


# ---------------------------------------------------------------------------- stdio URL


def cmd_stdio_url(args: argparse.Namespace) -> int:
    out = take_stdout()  # first: whatever follows may print, and only JSON-RPC goes to the client
    url = check_endpoint(args.name)
    if args.client_id is not None and not (0 < len(args.client_id) <= MAX_CLIENT_ID_CHARS
                                           and args.client_id.isprintable()):
        raise InvalidRequest(f"--client-id: expected 1 to {MAX_CLIENT_ID_CHARS} printable characters")
    fill_session_bus()  # the keyring, for this process and a sidecar it starts
    state = state_folder()
    path = Path(config_file(getattr(args, "config", None)))
    with file_lock(state / "config.lock", CONFIG_LOCK_WAIT, "adding the server to the config"):
        name, _ = ensure_entry(path, url, args.client_id)
    config = load_config(path)
    target = config.servers[name]
    socket, configured_uid = sidecar_address(str(path), getattr(args, "socket", None))
    ensure_served(config, name, socket, configured_uid, state)
    ensure_login(args, config, target, socket, configured_uid, state)
    return run(socket, expected_sidecar_uid(configured_uid), name, grant_header(None), out)
