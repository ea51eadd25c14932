"""`mcpcreds credential-helper`: a server's credential for git and docker, which call their
credential helper once per operation.

git (gitcredentials(7)): `get` reads `key=value` lines up to a blank line (protocol, host, path,
username, ...) and answers `username=` and `password=`; `store` and `erase` do nothing (the
sidecar keeps its logins). docker (docker-credential-helpers): `get` reads the registry's URL and
answers `{"ServerURL", "Username", "Secret"}`; a URL no server matches answers "credentials not
found in native keychain" (exit 1), as docker expects; `store`, `erase` do nothing and `list` is
`{}`.

Which server: `--server NAME`, else the configured server (`GET /v1/servers`, which a grant
narrows) whose endpoint has the same scheme (git; docker gives none), host and port, and, when
git sends a path (`credential.useHttpPath`), whose endpoint path is the longest prefix of it at
a `/`. Two servers matching equally are an error: name one with `--server`.

What credential: the server's resolved headers (`GET /v1/servers/{name}/headers`, so `expose =
"proxy"` refuses: the credential never leaves the sidecar, exit 77). `Authorization: Bearer T`
gives the password T; `Authorization: Basic` gives its own username and password; otherwise the
one header there is (or `--header NAME`) gives its value. The username with a token is
`--username`, else the one git asked for, else "mcpcreds".

Standard library and the light client only (tests/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO
from urllib.parse import urlsplit

from ..client.client import Client
from ..errors import InvalidRequest, McpcredsError

DEFAULT_USERNAME = "mcpcreds"
NOT_FOUND = "credentials not found in native keychain"  # docker-credential-helpers' own message
MAX_INPUT = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


class NoMatch(McpcredsError):
    """No configured server's endpoint matches the host asked for."""

    code = "no_match"
    status = 404


def read_git_request(stdin: TextIO) -> dict[str, str]:
    """gitcredentials' `key=value` lines up to a blank line or EOF (the last value of a key wins;
    `key[]` lists are left out)."""
    request: dict[str, str] = {}
    size = 0
    for line in stdin:
        size += len(line)
        if size > MAX_INPUT:
            raise InvalidRequest("credential request too large")
        line = line.rstrip("\r\n")
        if not line:
            break
        key, sep, value = line.partition("=")
        if sep and not key.endswith("[]"):
            request[key] = value
    return request


def _origin(scheme: str, netloc: str) -> tuple[str, int | None] | None:
    """(host, port) of a URL's netloc, lowercased, the scheme's default port filled in."""
    try:
        parts = urlsplit(f"{scheme or 'https'}://{netloc}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host:
        return None
    return host.lower(), port if port is not None else _DEFAULT_PORTS.get(scheme or "https")


def _segments(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def match_server(servers: list[dict[str, Any]], scheme: str | None, host: str,
                 path: str | None) -> str:
    """The name of the server whose endpoint matches `scheme` (None: any), `host` ("name[:port]")
    and, if given, `path`: the longest endpoint path that is a prefix of it at a `/`."""
    wanted = _origin(scheme or "https", host)
    asked = _segments(path) if path else None
    best: list[str] = []
    best_len = -1
    for server in servers:
        endpoint, name = server.get("endpoint"), server.get("name")
        if not isinstance(endpoint, str) or not isinstance(name, str):
            continue
        try:
            url = urlsplit(endpoint)
        except ValueError:
            continue
        if scheme is not None and url.scheme.lower() != scheme.lower():
            continue
        target = wanted if scheme is not None else _origin(url.scheme.lower(), host)
        if target is None or _origin(url.scheme.lower(), url.netloc) != target:
            continue
        length = 0
        if asked is not None:
            own = _segments(url.path)
            if asked[: len(own)] != own:
                continue
            length = len(own)
        if length > best_len:
            best, best_len = [name], length
        elif length == best_len:
            best.append(name)
    where = f"{scheme + '://' if scheme else ''}{host}{'/' + path if path else ''}"
    if not best:
        raise NoMatch(f"no configured server's endpoint matches {where}")
    if len(best) > 1:
        raise InvalidRequest(f"several servers match {where} ({', '.join(sorted(best))}): "
                             "name one with --server NAME")
    return best[0]


def credential_of(headers: Mapping[str, str], header: str | None) -> tuple[str | None, str]:
    """(username or None, secret) carried by a server's resolved headers."""
    lowered = {k.lower(): (k, v) for k, v in headers.items()}
    if header is not None:
        if header.lower() not in lowered:
            raise InvalidRequest(f"the server resolves no {header!r} header "
                                 f"(it has: {', '.join(sorted(headers)) or 'none'})")
        return None, lowered[header.lower()][1]
    if "authorization" in lowered:
        value = lowered["authorization"][1].strip()
        scheme, _, rest = value.partition(" ")
        if scheme.lower() == "bearer" and rest.strip():
            return None, rest.strip()
        if scheme.lower() == "basic":
            try:
                user, sep, password = base64.b64decode(rest.strip(), validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                sep = ""
            if sep:
                return user, password
            raise InvalidRequest("the server's Authorization: Basic header is not base64 user:password")
        return None, value
    if len(headers) == 1:
        return None, next(iter(headers.values()))
    raise InvalidRequest(f"the server resolves several headers ({', '.join(sorted(headers))}) and git "
                         "and docker carry one secret: choose it with --header NAME")


def _one_line(value: str, what: str) -> str:
    if any(c in value for c in "\r\n\0"):
        raise InvalidRequest(f"the {what} holds a line break or NUL: the credential protocol cannot carry it")
    return value


def _resolve(client: Client, args: argparse.Namespace, scheme: str | None, host: str,
             path: str | None) -> tuple[str | None, str]:
    name = args.server or match_server(client.servers(), scheme, host, path)
    return credential_of(client.headers(name), args.header)


def git(args: argparse.Namespace, client_factory: Callable[[], Client], stdin: TextIO,
        stdout: TextIO) -> int:
    request = read_git_request(stdin)
    if args.action != "get":  # store, erase: the sidecar keeps its logins; list is not git's
        if args.action == "list":
            raise InvalidRequest("list is an action of the docker protocol (--docker)")
        return 0
    host = request.get("host", "")
    if not host and not args.server:
        raise InvalidRequest("the credential request names no host")
    try:
        with client_factory() as client:
            username, secret = _resolve(client, args, request.get("protocol") or "https", host,
                                        request.get("path") or None)
    except NoMatch as exc:  # not ours: git goes on to its next helper or asks
        print(f"mcpcreds: {exc.message}", file=sys.stderr)
        return 0
    username = username or args.username or request.get("username") or DEFAULT_USERNAME
    stdout.write(f"username={_one_line(username, 'username')}\npassword={_one_line(secret, 'credential')}\n")
    return 0


def docker(args: argparse.Namespace, client_factory: Callable[[], Client], stdin: TextIO,
           stdout: TextIO) -> int:
    raw = stdin.read(MAX_INPUT + 1)
    if len(raw) > MAX_INPUT:
        raise InvalidRequest("credential request too large")
    if args.action in ("store", "erase"):
        return 0
    if args.action == "list":
        stdout.write("{}\n")
        return 0
    server_url = raw.strip()
    if not server_url and not args.server:
        raise InvalidRequest("docker sent no server URL")
    url = urlsplit(server_url if "://" in server_url else f"//{server_url}")
    try:
        with client_factory() as client:
            username, secret = _resolve(client, args, None, url.netloc, None)
    except NoMatch:
        stdout.write(NOT_FOUND + "\n")
        return 1
    except McpcredsError as exc:  # docker shows what the helper wrote on stdout
        stdout.write(f"mcpcreds: {exc.code}: {exc.message}\n")
        raise
    answer = {"ServerURL": server_url, "Username": username or args.username or DEFAULT_USERNAME,
              "Secret": secret}
    stdout.write(json.dumps(answer) + "\n")
    return 0


def run(args: argparse.Namespace, client_factory: Callable[[], Client]) -> int:
    """`mcpcreds credential-helper [--docker] ACTION`."""
    speak = docker if args.docker else git
    return speak(args, client_factory, sys.stdin, sys.stdout)
