"""The AAuth agent: one durable Ed25519 key that never leaves the sidecar process, and the signer
the gateway and the `sign` route use (the signature itself is `httpsig`).

- The key file (`[aauth] key_file`, default `aauth-agent.key` in the sidecar's state folder, the
  socket's 0700 folder) is created 0600 (`O_EXCL`, `O_NOFOLLOW`) if absent. An existing one must be
  a regular file owned by the sidecar's uid and not readable or writable by group or others, else
  it is refused (at start: `serve` exits with the reason). It is read `O_NOFOLLOW | O_NONBLOCK`,
  checked with `fstat`, bounded, and must hold a PKCS#8 Ed25519 private key.
- The private key lives in an `Ed25519PrivateKey` object only: nothing returns, logs or serialises
  it; its raw value is handed to the redactor all the same, as a last guard.
- Without an agent token, requests carry `Signature-Key: sig=hwk;...` (a bare public key).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, Final
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from . import httpsig
from .config import Config, Target, default_socket_path
from .errors import ConfigError, Forbidden, InvalidRequest, McpcredsError
from .logs import get_logger
from .secret import REDACTOR

_log = get_logger("aauth")
MAX_KEY_FILE: Final = 8192
MAX_SIGN_HEADERS: Final = 32
MAX_HEADER_VALUE: Final = 8192
_METHOD: Final = re.compile(r"[A-Z]{1,16}\Z")
_CHALLENGE: Final = ("www-authenticate", "signature-error", "accept-signature-scheme", "accept-signature-alg")


class AAuthKeyError(McpcredsError):
    """The agent key cannot be used (its file refused or unreadable)."""

    code: ClassVar[str] = "aauth_key_unavailable"
    status: ClassVar[int] = 503


class AgentKey:
    """The agent's private key. `repr` never shows it; `sign` is the one use of it."""

    __slots__ = ("_key", "jwk", "path", "thumbprint")

    def __init__(self, key: Ed25519PrivateKey, path: Path) -> None:
        self._key = key
        self.path = path
        self.jwk = httpsig.public_jwk(key)
        self.thumbprint = httpsig.jwk_thumbprint(self.jwk)
        raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
        REDACTOR.add(httpsig.b64url(raw), owner="aauth:key")  # a last guard: it is never written anywhere

    def __repr__(self) -> str:
        return f"AgentKey(thumbprint={self.thumbprint})"

    def sign(self, method: str, url: str, headers: Iterable[tuple[str, str]], body: bytes | None,
             created: int, *, cover: Iterable[str] = (), digest: str | None = None) -> httpsig.Signed:
        return httpsig.sign_request(self._key, method, url, headers, body, created,
                                    httpsig.hwk_key(self.jwk), cover=cover, digest=digest)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("the agent key cannot be pickled")


def _refuse(path: Path, why: str) -> ConfigError:
    return ConfigError([f"aauth.key_file: {path}: {why}"])


def load_key(path: Path) -> AgentKey:
    """Read the agent key, checked (see the module doc); raise ConfigError naming why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _refuse(path, f"cannot open ({exc.strerror}; a symlink is refused)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, "not a regular file")
        if info.st_uid != os.geteuid():
            raise _refuse(path, f"owned by uid {info.st_uid}, not the sidecar's ({os.geteuid()})")
        if info.st_mode & 0o077:
            raise _refuse(path, f"readable or writable by group or others (mode "
                                f"{stat.S_IMODE(info.st_mode):04o}): chmod 600 it, and rotate the key if "
                                "others may have read it")
        if info.st_size > MAX_KEY_FILE:
            raise _refuse(path, f"larger than {MAX_KEY_FILE} bytes: not a key file")
        data = os.read(fd, MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):  # never quotes what it read
        raise _refuse(path, "not a PEM PKCS#8 private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise _refuse(path, "not an Ed25519 key")
    return AgentKey(key, path)


def create_key(path: Path) -> None:
    """A new Ed25519 key, written 0600 with O_EXCL (never over an existing file) and fsync'd."""
    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM,
                                                     serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption())
    old_umask = os.umask(0o077)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return  # made by another process meanwhile: load_key checks it
    except OSError as exc:
        raise _refuse(path, f"cannot create ({exc.strerror})") from None
    finally:
        os.umask(old_umask)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    _log.info("aauth agent key created", extra={"key_file": str(path)})


def load_or_create(path: Path) -> AgentKey:
    if not os.path.lexists(path):
        create_key(path)
    return load_key(path)


def key_path(config: Config) -> Path:
    return config.aauth.key_path(default_socket_path(config.sidecar.socket).parent)


def uses_aauth(config: Config) -> bool:
    return any(t.aauth for t in (*config.services.values(), *config.servers.values()))


class AAuthSigner:
    """Signs requests to the servers with `aauth` on. The key is loaded at start (`start`), or at
    the first signature if the sidecar was built without one."""

    def __init__(self, config: Config, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self._key: AgentKey | None = None

    def start(self) -> None:
        """Load (or create) the key if any server signs: a refused key file fails the start."""
        if uses_aauth(self.config):
            self._key = load_or_create(key_path(self.config))
            _log.info("aauth agent key loaded", extra={"key_file": str(self._key.path),
                                                       "thumbprint": self._key.thumbprint})
            if self.config.aauth.provider is not None:
                _log.warning("aauth: agent tokens from the provider are not fetched yet; requests are "
                             "signed with the hwk scheme (a bare public key)")

    def reload(self, config: Config) -> None:
        """A new config: a moved key file is loaded now; if it is refused, the old key stays."""
        self.config = config
        if self._key is not None and self._key.path != key_path(config):
            try:
                self._key = load_or_create(key_path(config))
            except ConfigError as exc:
                _log.error("aauth key file refused; the old key stays", extra={"errors": exc.errors})

    @property
    def key(self) -> AgentKey:
        if self._key is None:
            try:
                self._key = load_or_create(key_path(self.config))
            except ConfigError as exc:
                raise AAuthKeyError("the AAuth agent key cannot be used: " + "; ".join(exc.errors)) from None
        return self._key

    def status(self) -> dict[str, Any] | None:
        if self._key is None:
            return None
        return {"key_file": str(self._key.path), "thumbprint": self._key.thumbprint,
                "public_jwk": self._key.jwk, "scheme": "hwk"}

    # -- the gateway's hook

    def gateway_headers(self, target: Target, method: str, url: str, headers: list[tuple[Any, bytes]],
                        body: bytes | None) -> list[tuple[Any, bytes]]:
        """The headers that sign an upstream request of the gateway (added to `headers`: names
        lower-cased, as bytes or str as `headers` has them)."""
        as_bytes = any(isinstance(k, bytes) for k, _ in headers)
        lines = [(k.decode("latin-1") if isinstance(k, bytes) else k, v.decode("latin-1"))
                 for k, v in headers]
        try:
            signed = self.key.sign(method, url, lines, body, int(self.clock()))
        except httpsig.SignatureError as exc:
            raise InvalidRequest(f"the request to server {target.name!r} cannot be signed: {exc}") from None
        return [(name.lower().encode("ascii") if as_bytes else name.lower(), value.encode("ascii"))
                for name, value in signed.headers().items()]

    # -- POST /v1/servers/{name}/sign

    def sign_route(self, target: Target, body: dict[str, Any]) -> dict[str, Any]:
        """The headers a direct client adds to sign its request to `target` (never the body: the
        client sends its digest). The URL must be the server's origin. Never echoes what was sent."""
        if not target.aauth:
            raise Forbidden(f"requests to server {target.name!r} are not signed with AAuth (aauth = false, "
                            "or `auth`/`oauth` takes precedence)")
        if "body" in body:
            raise InvalidRequest("the body is never sent to the sidecar: send content_digest (RFC 9530)")
        unknown = set(body) - {"method", "url", "headers", "content_digest"}
        if unknown:
            raise InvalidRequest("unknown fields: the body holds method, url, headers, content_digest")
        method = body.get("method")
        if not isinstance(method, str) or not _METHOD.match(method):
            raise InvalidRequest("method must be an upper-case HTTP method")
        url = body.get("url")
        if not isinstance(url, str) or len(url) > 2048 or not _same_origin(url, target.endpoint):
            raise InvalidRequest(f"url must be a URL of server {target.name!r}'s origin (scheme, host, port)")
        raw_headers = body.get("headers", {})
        if not isinstance(raw_headers, dict) or len(raw_headers) > MAX_SIGN_HEADERS or not all(
                isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_HEADER_VALUE
                for k, v in raw_headers.items()):
            raise InvalidRequest(f"headers must be an object of at most {MAX_SIGN_HEADERS} header names "
                                 "to string values")
        digest = body.get("content_digest")
        try:
            if digest is not None:
                digest = httpsig.check_content_digest(digest)
            headers = [(k, v) for k, v in raw_headers.items()]
            signed = self.key.sign(method, url, headers, None, int(self.clock()), cover=list(raw_headers),
                                   digest=digest)
        except httpsig.SignatureError as exc:
            raise InvalidRequest(f"cannot sign: {exc}") from None
        return {"headers": signed.headers(), "covered": list(signed.covered),
                "thumbprint": self.key.thumbprint}


def _same_origin(url: str, endpoint: str) -> bool:
    try:
        a, b = urlsplit(url), urlsplit(endpoint)
        return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port) and not a.username \
            and not a.password and not a.fragment and bool(a.hostname)
    except ValueError:
        return False


def challenge_headers(target: Target, status: int,
                      headers: Iterable[tuple[str, str]]) -> tuple[tuple[bytes, bytes], ...]:
    """A signed server's 401 challenge, passed on to the gateway's caller (`WWW-Authenticate:
    AAuth ...`, `Signature-Error`, `Accept-Signature-*`): what the server wants that the sidecar
    did not send. Other servers' challenges stay in the sidecar, as before."""
    if not target.aauth or status != 401:
        return ()
    out = []
    for name, value in headers:
        if name.lower() in _CHALLENGE:
            with contextlib.suppress(UnicodeEncodeError):
                out.append((name.title().encode("ascii"), value.encode("latin-1")))
    return tuple(out)
