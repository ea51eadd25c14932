"""The config files mcpcreds writes itself: the commented starter config of `mcpcreds init`, and
the entry `mcpcreds stdio URL` appends for an endpoint no server has yet.

Text is written, never a re-serialised table: the user's comments and layout stay as they are.
What is written is first parsed with the rest of the file (`parse_config`), so a file that would
not load is never left behind. Callers hold the config's lock around read-check-append."""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from ..errors import ConfigError, InvalidRequest
from .load import parse_config
from .reader import NAME, check_url

MAX_CONFIG_BYTES: Final = 1024 * 1024  # a config read to append to: far more than any needs
MAX_NAME_TRIES: Final = 1000
_DROPPED_LABELS: Final = frozenset({"www", "mcp", "api"})
_NOT_NAME: Final = re.compile(r"[^A-Za-z0-9_.\-]+")
ADDED_BY: Final = "# added by `mcpcreds stdio URL`"


def toml_string(value: str) -> str:
    """`value` as a TOML basic string (a path or URL of ours: quotes, backslashes and control
    characters escaped, the rest as UTF-8)."""
    out = []
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# ---------------------------------------------------------------------------- the starter config


def starter_config(socket: str, keyring: bool, secrets_dir: str, example: bool = True) -> str:
    """The commented config `mcpcreds init` writes: the socket, secret sources that work here
    (the keyring when one is usable, else the environment and a `dir:` folder), and one example
    server (commented out when `example` is False: `mcpcreds stdio URL` adds the real one)."""
    if keyring:
        sources = ('sources = ["env", "keyring"]   # `mcpcreds secret set NAME` stores one in the keyring\n'
                   f"# no keyring: sources = [\"env\", {toml_string('dir:' + secrets_dir)}]\n")
    else:
        sources = (f"sources = [\"env\", {toml_string('dir:' + secrets_dir)}]   # one 0600 file per "
                   "secret, named after it\n"
                   "# no usable keyring was found; with one (SecretService): "
                   'sources = ["env", "keyring"]\n')
    server = (
        "[[servers]]\n"
        'name = "example"\n'
        'endpoint = "https://mcp.example.com/mcp"\n'
        'tool_allowlist = ["search"]      # not trusted (the default): only these tools are exposed\n'
        'expose = "proxy"                 # the credential stays in the sidecar: clients use the '
        "gateway, /mcp/example\n"
        "# a token from the secret sources:\n"
        '# auth = { kind = "static", token = "{{secret:EXAMPLE_TOKEN}}" }\n'
        "# or a person's login (then run `mcpcreds login example` once):\n"
        '# auth = { kind = "oauth2", grant = "authorization_code" }\n'
    )
    if not example:
        server = "".join(f"# {line}\n" if not line.startswith("#") else f"{line}\n"
                         for line in server.splitlines())
    return (
        "# mcpcreds config, written by `mcpcreds init`.\n"
        "# `mcpcreds check` validates it; `mcpcreds help config` lists every key with its default.\n"
        "\n"
        "[sidecar]\n"
        "# the Unix socket the sidecar listens on and every client (`mcpcreds stdio` too) talks to\n"
        f"socket = {toml_string(socket)}\n"
        "\n"
        "[secrets]\n"
        "# where {{secret:NAME}} is looked up, in this order\n"
        f"{sources}"
        "\n"
        "# One MCP server: its descriptions are screened and its results scanned for prompt injections,\n"
        "# and each tool's definition is pinned when first listed (`mcpcreds tools NAME`).\n"
        f"{server}"
    )


def write_new(path: Path, text: str) -> None:
    """Create `path` with `text` (mode 0600, its folder 0700 if made); FileExistsError if there
    is a file, however it got there in the meantime."""
    old = os.umask(0o077)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    finally:
        os.umask(old)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


# ---------------------------------------------------------------------------- an entry for a URL


def check_endpoint(url: str) -> str:
    """`url` if it is an endpoint a server may have (https, or http on a loopback host); never
    quoted in the error."""
    if (problem := check_url(url)) is not None:
        raise InvalidRequest(f"URL: {problem}")
    return url


def _endpoint_key(url: str) -> tuple[str, str, int | None, str, str]:
    parts = urlsplit(url)
    default = {"https": 443, "http": 80}.get(parts.scheme.lower())
    return (parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or default,
            parts.path.rstrip("/") or "/", parts.query)


def same_endpoint(a: str, b: str) -> bool:
    """Whether two endpoint URLs name the same resource (scheme and host in any case, a default
    port written or not, a trailing slash or not)."""
    try:
        return _endpoint_key(a) == _endpoint_key(b)
    except ValueError:
        return False


def server_for_endpoint(data: Mapping[str, Any], url: str) -> str | None:
    """The first `[[servers]]` entry of a parsed config whose endpoint (its own, or its
    service's) is `url`."""
    raw_services, raw_servers = data.get("services"), data.get("servers")
    services: dict[str, Any] = raw_services if isinstance(raw_services, dict) else {}
    servers: list[Any] = raw_servers if isinstance(raw_servers, list) else []
    for entry in servers:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        endpoint = entry.get("endpoint")
        service = entry.get("service")
        if endpoint is None and isinstance(service, str) and isinstance(services.get(service), dict):
            endpoint = services[service].get("endpoint")
        if isinstance(endpoint, str) and same_endpoint(endpoint, url):
            return str(entry["name"])
    return None


def _host_name(url: str) -> str:
    """A readable name for the server at `url`: the host without `mcp.`/`www.`/`api.` in front and
    without its top-level domain (`mcp.notion.com` -> `notion`); an address or `localhost` with
    its port (`127.0.0.1-8931`)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        ipaddress.ip_address(host)
        literal = True
    except ValueError:
        literal = host == "localhost" or "." not in host
    if literal:
        base = host.replace(":", "-") + (f"-{parts.port}" if parts.port else "")
    else:
        labels = [label for label in host.split(".") if label]
        while len(labels) > 2 and labels[0] in _DROPPED_LABELS:
            labels.pop(0)
        if len(labels) > 1:
            labels.pop()
        base = ".".join(labels)
    base = _NOT_NAME.sub("-", base).strip("-.")[:100]
    return base if base and NAME.match(base) else "server"


def server_names(data: Mapping[str, Any]) -> list[str]:
    """The names of a parsed config's `[[servers]]`."""
    servers = data.get("servers")
    return [s["name"] for s in servers if isinstance(s, dict) and isinstance(s.get("name"), str)] \
        if isinstance(servers, list) else []


def server_name_for(url: str, taken: Iterable[str]) -> str:
    """A valid server name for `url` that no server in `taken` has (`notion`, `notion-2`, ...)."""
    used = set(taken)
    base = _host_name(url)
    for n in range(1, MAX_NAME_TRIES + 1):
        name = base if n == 1 else f"{base}-{n}"
        if name not in used:
            return name
    raise InvalidRequest(f"no free server name for this URL after {MAX_NAME_TRIES} tries")


def entry_text(name: str, url: str, login: bool, client_id: str | None = None) -> str:
    """The `[[servers]]` entry for `url`: not trusted (descriptions screened, results scanned, tool
    definitions pinned), every tool it lists exposed, served only through the gateway, and a
    person's login when the server asks for one: with `client_id` (pre-registered, or the https
    URL of a client ID metadata document), else a client registered at login (RFC 7591)."""
    text = (
        f"\n{ADDED_BY}: not trusted, every tool it lists exposed\n"
        "[[servers]]\n"
        f"name = {toml_string(name)}\n"
        f"endpoint = {toml_string(url)}\n"
        'trust = "untrusted"\n'
        "allow_untrusted_without_allowlist = true   # narrow it with tool_allowlist = [...]\n"
        'expose = "proxy"\n'
    )
    if login:
        client = f", client_id = {toml_string(client_id)}" if client_id is not None else ""
        auth = f'{{ kind = "oauth2", grant = "authorization_code"{client} }}'
        text += f"auth = {auth}   # `mcpcreds login {name}`\n"
    return text


def read_config_text(path: Path) -> str | None:
    """The config's text, None if there is no file; bounded, and UTF-8 or refused."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config: {exc.strerror or exc}"]) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{path}: larger than {MAX_CONFIG_BYTES} bytes"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not UTF-8 text (at byte {exc.start})"]) from None


def append_entry(path: Path, text: str, entry: str) -> None:
    """Append `entry` to the config at `path` whose text is `text`, once the whole new text parses
    as a valid config (ConfigError otherwise, nothing written). One write on an O_APPEND
    descriptor: the file keeps its inode, mode, owner and symlink."""
    joined = text if not text or text.endswith("\n") else text + "\n"
    try:
        data = tomllib.loads(joined + entry)
    except (ValueError, RecursionError):
        raise ConfigError([f"{path}: a [[servers]] entry cannot be appended to it (is `servers` "
                           "written as an inline array?): add the server by hand"], str(path)) from None
    parse_config(data, str(path))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        added = (joined[len(text):] + entry).encode("utf-8")
        if os.write(fd, added) != len(added):
            raise ConfigError([f"{path}: the new entry was written in part; remove its lines"])
        os.fsync(fd)
    finally:
        os.close(fd)
