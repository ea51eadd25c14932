"""SPIFFE SVIDs from files (the I/O half of `spiffe_config`): the JWT-SVID a request carries,
and the TLS client context of an X.509-SVID. Both are re-read only when a file changed (its
device, inode, size, mtime or ctime: a chmod or a rename over it counts), with the checks of the
`dir:` source (O_NOFOLLOW, a regular file, ours or root's, in a folder no one else can write;
private files 0600 or 0400; bounded size).

An X.509-SVID and its key are written by the SPIFFE helper one after the other: while the pair
does not match (or a file is missing) the last good context stays in use, and the change is
tried again at the next connection; with none, the request fails with a clear error."""

from __future__ import annotations

import contextlib
import errno
import os
import ssl
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..config.model import spiffe_of
from ..config.spiffe import MAX_JWT_BYTES, MAX_PEM_BYTES, JwtSvid, SpiffeAuth, SvidError, parse_jwt_svid
from ..core.logs import get_logger
from ..core.secret import Secret
from ..errors import SecretUnavailable
from .sources import file_kind, open_folder, read_at_most, trusted_owner

if TYPE_CHECKING:
    from ..config.model import Target

FileKey = tuple[int, int, int, int, int]  # device, inode, size, mtime_ns, ctime_ns
_log = get_logger("spiffe")
_PROC_FD: Final = "/proc/self/fd"


def file_key(path: str) -> FileKey | None:
    """What changes when the file at `path` does (never following a link); None if absent."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def open_checked(path: str, what: str, *, private: bool) -> tuple[int, FileKey]:
    """Open `path` read-only with the `dir:` source's checks; the descriptor and its key."""
    folder_fd = open_folder(Path(path).parent, what, None)
    if folder_fd is None:
        raise SecretUnavailable(f"{what}: {path} does not exist")
    try:
        try:
            fd = os.open(Path(path).name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=folder_fd)
        except FileNotFoundError:
            raise SecretUnavailable(f"{what}: {path} does not exist") from None
        except OSError as exc:
            why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot open ({exc.strerror})"
            raise SecretUnavailable(f"{what}: {path}: refused: {why}") from None
    finally:
        os.close(folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretUnavailable(f"{what}: {path}: refused: is {file_kind(info.st_mode)}, "
                                    "not a regular file")
        if not trusted_owner(info.st_uid):
            raise SecretUnavailable(f"{what}: {path}: refused: owned by uid {info.st_uid}, not by uid "
                                    f"{os.geteuid()} or root")
        if private and info.st_mode & 0o077:
            raise SecretUnavailable(f"{what}: {path}: refused: readable by group or others (mode "
                                    f"{stat.S_IMODE(info.st_mode):04o}, expected 0600 or 0400)")
    except BaseException:
        os.close(fd)
        raise
    return fd, (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def read_checked(fd: int, path: str, what: str, limit: int) -> str:
    """The text behind an `open_checked` descriptor: at most `limit` bytes of UTF-8."""
    data = read_at_most(fd, limit + 1)
    if len(data) > limit:
        raise SecretUnavailable(f"{what}: {path}: refused: larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretUnavailable(f"{what}: {path}: refused: not UTF-8 text") from None


class JwtSvidFiles:
    """Reads JWT-SVID files and remembers which version of each it read last, so that the
    broker's cached answer is dropped as soon as the file changes (`changed`: a stat)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self._read: dict[str, FileKey] = {}
        self.held: dict[str, tuple[str, float]] = {}  # path -> the SPIFFE ID and expiry last read (status)

    def changed(self, path: str) -> bool:
        """Whether the file is no longer the one last read (a stat, no read: the hot path)."""
        held = self._read.get(path)
        return held is None or file_key(path) != held

    def read(self, path: str, audience: str | None) -> JwtSvid:
        """The file's JWT-SVID, checked (`spiffe_config.parse_jwt_svid`); SecretUnavailable with
        what is wrong (never the token) when it cannot be sent."""
        what = "spiffe jwt_svid_file"
        fd, key = open_checked(path, what, private=True)
        try:
            text = read_checked(fd, path, what, MAX_JWT_BYTES)
        finally:
            os.close(fd)
        try:
            svid = parse_jwt_svid(text, self.now(), audience)
        except SvidError as exc:
            raise SecretUnavailable(f"{what}: {path}: {exc}") from None
        Secret(svid.token, owner=f"spiffe-jwt:{path}")  # masked wherever it could show
        if len(self._read) > 4096:
            self._read.clear()
            self.held.clear()
        self._read[path] = key
        self.held[path] = (svid.spiffe_id, svid.expires_at)
        return svid


class X509Source:
    """The TLS client context of one X.509-SVID: the certificate (chain) and key presented, the
    bundle the server must chain to (the system's CAs are not trusted for it), rebuilt when a
    file changes. `context()` is cheap when nothing changed (three stats)."""

    def __init__(self, auth: SpiffeAuth) -> None:
        assert auth.svid_file and auth.key_file and auth.bundle_file
        self.files = (auth.svid_file, auth.key_file, auth.bundle_file)
        self._keys: tuple[FileKey | None, ...] | None = None
        self._context: ssl.SSLContext | None = None
        self._failed: tuple[FileKey | None, ...] | None = None  # the last failed load's (logged once)
        self.loads = 0
        self.identity: tuple[str | None, float] | None = None  # the leaf's SPIFFE ID and expiry (status)
        self._identity: tuple[str | None, float] | None = None

    def context(self) -> ssl.SSLContext:
        keys = tuple(file_key(p) for p in self.files)
        if keys == self._keys and self._context is not None:
            return self._context
        try:
            context, loaded = self._load()
        except SecretUnavailable as exc:
            if self._context is None:
                raise
            if keys != self._failed:
                self._failed = keys
                _log.warning("spiffe x509: the changed files cannot be used yet; the previous SVID stays",
                             extra={"error": exc.message})
            return self._context
        self._context, self._keys, self._failed = context, loaded, None
        self.identity = self._identity
        self.loads += 1
        _log.info("spiffe x509: SVID loaded", extra={"svid_file": self.files[0]})
        return context

    def _load(self) -> tuple[ssl.SSLContext, tuple[FileKey | None, ...]]:
        what = "spiffe x509"
        fds: list[int] = []
        try:
            keys: list[FileKey | None] = []
            for path, private in zip(self.files, (False, True, False), strict=True):
                fd, key = open_checked(path, f"{what} {('svid_file', 'key_file', 'bundle_file')[len(fds)]}",
                                       private=private)
                fds.append(fd)
                keys.append(key)
            bundle = read_checked(fds[2], self.files[2], f"{what} bundle_file", MAX_PEM_BYTES)
            leaf = read_checked(fds[0], self.files[0], f"{what} svid_file", MAX_PEM_BYTES)
            for fd, path in zip(fds[:2], self.files[:2], strict=True):
                if os.fstat(fd).st_size > MAX_PEM_BYTES:
                    raise SecretUnavailable(f"{what}: {path}: refused: larger than {MAX_PEM_BYTES} bytes")
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                context.load_verify_locations(cadata=bundle)
            except (ssl.SSLError, ValueError):
                raise SecretUnavailable(f"{what}: bundle_file {self.files[2]} holds no PEM certificate "
                                        "(the trust bundle, PEM)") from None
            try:  # the very files checked, by their descriptors: a link swapped in since is never read
                context.load_cert_chain(f"{_PROC_FD}/{fds[0]}", f"{_PROC_FD}/{fds[1]}")
            except (ssl.SSLError, OSError):
                raise SecretUnavailable(f"{what}: svid_file {self.files[0]} and key_file {self.files[1]} "
                                        "are not a PEM certificate and its private key (or do not match)"
                                        ) from None
            self._identity = _identity(leaf)
            return context, tuple(keys)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _identity(pem: str) -> tuple[str | None, float] | None:
    """The SPIFFE ID (URI SAN) and expiry of the first certificate of a PEM chain."""
    from cryptography import x509  # for an X.509-SVID only

    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
    except ValueError:  # the TLS library took it: not expected
        return None
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = [u for u in names.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith("spiffe://")]
    except x509.ExtensionNotFound:
        uris = []
    return (uris[0] if uris else None), cert.not_valid_after_utc.timestamp()


def spiffe_status(targets: Iterable[Target], jwt_svids: JwtSvidFiles,
                  x509_sources: Mapping[SpiffeAuth, X509Source]) -> list[dict[str, Any]] | None:
    """Per cache key with a SPIFFE SVID read or loaded: the kind, the SPIFFE ID and when the
    SVID expires (never a token or a key)."""
    rows: dict[str, dict[str, Any]] = {}
    for target in targets:
        auth = spiffe_of(target)
        if auth is None:
            continue
        held: tuple[str | None, float] | None = None
        if auth.jwt_svid_file is not None:
            held = jwt_svids.held.get(auth.jwt_svid_file)
        elif (source := x509_sources.get(auth)) is not None:
            held = source.identity
        if held is not None:
            rows[target.key] = {"key": target.key, "svid": auth.svid, "spiffe_id": held[0],
                                "expires_at": held[1]}
    return [rows[k] for k in sorted(rows)] or None
