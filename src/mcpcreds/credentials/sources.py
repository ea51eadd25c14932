"""Secret sources: the environment, the keyring, a credentials folder, `secret-file:` paths."""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import importlib
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from ..config.model import CREDENTIALS_SOURCE, SecretsConfig
from ..core.secret import Secret
from ..core.templates import FileRef, SecretRef, Template
from ..errors import InvalidRequest, SecretUnavailable
from .secret_service import collection_missing, keep_connections

_SECRET_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}\Z")
_MAX_SECRET_BYTES: Final = 64 * 1024
_INDEX_ENTRY: Final = "__mcpcreds_index__"
# the pauses before a keyring call is tried again when the daemon's collection was missing (see
# `secret_service.collection_missing`): 0.7 s in all, inside the default 3 s time box
MISSING_PAUSES: Final = (0.1, 0.2, 0.4)
# the bound of a keyring write a person waits on (`secret set`, the end of a login): the keyring may
# be asking them to unlock it, or to make one (a first secret on a desktop without a login keyring)
PERSON_WRITE_TIMEOUT: Final = 120.0
_DBUS_ERROR: Final = re.compile(r"org\.freedesktop\.[A-Za-z0-9.]{1,96}")  # a D-Bus error name, bounded
_DEFAULT_BACKENDS: Final = {
    "linux": "keyring.backends.SecretService.Keyring",
    "darwin": "keyring.backends.macOS.Keyring",
    "win32": "keyring.backends.Windows.WinVaultKeyring",
}
T = TypeVar("T")


def check_secret_name(name: str) -> str:
    if not _SECRET_NAME.match(name):
        raise InvalidRequest("invalid secret name: use letters, digits, '_', '.', '-'")
    return name


class SecretSource(Protocol):
    label: str

    def get(self, name: str) -> str | None:
        """The value, None if this source does not have it; SecretUnavailable if it failed."""
        ...


class EnvSource:
    label = "env"

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        self._environ = environ if environ is not None else os.environ

    def get(self, name: str) -> str | None:
        return self._environ.get(name)


def _refused(what: str, why: str, secret: str | None) -> SecretUnavailable:
    return SecretUnavailable(f"{what}: refused: {why}", **({"secret": secret} if secret else {}))


def trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def open_folder(folder: Path, what: str, secret: str | None) -> int | None:
    """Open a secret's folder and check that no other user can change what is in it; None if absent.
    Files are then opened relative to this descriptor, so the folder checked is the folder used."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refused(what, f"cannot open folder {folder} ({exc.strerror})", secret) from None
    try:
        info = os.fstat(fd)
        if not trusted_owner(info.st_uid):
            raise _refused(what, f"folder {folder} is owned by uid {info.st_uid}, not by uid "
                                 f"{os.geteuid()} or root", secret)
        if info.st_mode & 0o022:
            raise _refused(what, f"folder {folder} is writable by group or others "
                                 f"(mode {stat.S_IMODE(info.st_mode):04o})", secret)
    except BaseException:
        os.close(fd)
        raise
    return fd


def file_kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket",
             stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}
    return next((kind for test, kind in kinds.items() if test(mode)), "a special file")


def read_private_file(path: Path, what: str, secret: str | None = None) -> str | None:
    """Read a secret file: None if absent. Refused unless its folder and the file are ours (or root's),
    the folder is writable by no one else, the file is regular, private and at most 64 KiB."""
    folder_fd = open_folder(path.parent, what, secret)
    if folder_fd is None:
        return None
    try:
        try:
            # O_NONBLOCK: opening a planted FIFO must not wait for a writer
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=folder_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot open ({exc.strerror})"
            raise _refused(what, why, secret) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _refused(what, f"is {file_kind(info.st_mode)}, not a regular file", secret)
            if not trusted_owner(info.st_uid):
                raise _refused(what, f"owned by uid {info.st_uid}, not by uid {os.geteuid()} or root",
                               secret)
            if info.st_mode & 0o077:
                raise _refused(what, f"readable by group or others (mode {stat.S_IMODE(info.st_mode):04o}, "
                                     "expected 0600 or 0400)", secret)
            data = read_at_most(fd, _MAX_SECRET_BYTES + 1)  # a huge planted file costs 64 KiB
        finally:
            os.close(fd)
    finally:
        os.close(folder_fd)
    if len(data) > _MAX_SECRET_BYTES:
        raise _refused(what, f"larger than {_MAX_SECRET_BYTES} bytes", secret)
    try:
        text = data.decode("utf-8", errors="strict") if data else ""
    except UnicodeDecodeError:
        raise _refused(what, "not UTF-8 text", secret) from None
    return text[:-1] if text.endswith("\n") else text


def read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit and (chunk := os.read(fd, limit - size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def random_temp_name() -> str:
    """A temporary file name: unpredictable, and never a secret name (those cannot start with '.')."""
    return f".mcpcreds-{secrets.token_hex(12)}.tmp"


def write_private_file(folder: Path, name: str, value: str, what: str,
                       temp_name: Callable[[], str] = random_temp_name) -> None:
    """Replace `folder/name` atomically with a new 0600 file: a reader sees the old value or the
    new, never half. Only a file this call created receives the value: a link planted at the temp
    or the target name is replaced, never written through. `temp_name` draws the temporary names
    (a test passes names it planted links at)."""
    folder_fd = open_folder(folder, what, name)
    if folder_fd is None:
        raise SecretUnavailable(f"{what}: cannot store: folder {folder} does not exist", secret=name)
    try:
        for _ in range(16):
            tmp = temp_name()
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=folder_fd)
                break
            except FileExistsError:
                continue
        else:
            raise SecretUnavailable(f"{what}: cannot store: no free temporary name in {folder}", secret=name)
        try:
            try:
                data = value.encode()
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder_fd)
            raise
        os.fsync(folder_fd)  # the rename itself survives a crash
    except OSError as exc:
        raise SecretUnavailable(f"{what}: cannot store in {folder} ({exc.strerror})", secret=name) from None
    finally:
        os.close(folder_fd)


class DirSource:
    """`dir:PATH`: one file per secret, named after it (systemd's $CREDENTIALS_DIRECTORY)."""

    def __init__(self, path: str, temp_name: Callable[[], str] = random_temp_name) -> None:
        self.path = Path(path)
        self.label = f"dir:{path}"
        self.temp_name = temp_name  # where set() writes before the rename

    def get(self, name: str) -> str | None:
        check_secret_name(name)
        return read_private_file(self.path / name, f"{self.label}/{name}", secret=name)

    def set(self, name: str, value: str) -> None:
        check_secret_name(name)
        write_private_file(self.path, name, value, f"{self.label}/{name}", self.temp_name)


def failure_name(exc: BaseException) -> str:
    """The exception's class, and the D-Bus error under it if there is one (`InitError` alone does
    not tell a keyring daemon that is gone from one that did not answer); names only, never the
    error's text."""
    name = type(exc).__name__
    cause: BaseException | None = exc
    for _ in range(8):
        cause = cause.__cause__ or cause.__context__ if cause is not None else None
        if cause is None:
            break
        dbus = getattr(cause, "name", None)  # jeepney's DBusErrorResponse
        if isinstance(dbus, str) and _DBUS_ERROR.fullmatch(dbus):
            return f"{name} ({dbus})"
    return name


class KeyringSource:
    """The OS keyring through `keyring`, with the backend pinned and every call time-boxed."""

    def __init__(self, config: SecretsConfig) -> None:
        self.service = config.keyring_service
        self.label = f"keyring (service {self.service!r})"
        self._backend_path = config.keyring_backend or _DEFAULT_BACKENDS.get(sys.platform, "")
        self._allow_plaintext = config.allow_plaintext_keyring
        self._timeout = config.keyring_timeout
        self._backend: Any = None
        # D-Bus calls can hang forever; a small private pool keeps a stuck call from
        # blocking anything but other keyring calls.
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="mcpcreds-keyring")

    def _load_backend(self) -> Any:
        if self._backend is not None:
            return self._backend
        module_name, _, class_name = self._backend_path.rpartition(".")
        if not module_name:
            raise SecretUnavailable(f"keyring: no backend for platform {sys.platform!r}; "
                                    "set secrets.keyring_backend")
        if "plaintext" in self._backend_path.lower() and not self._allow_plaintext:
            raise SecretUnavailable(
                f"keyring: backend {self._backend_path} stores secrets in plain text; refused "
                "(set secrets.allow_plaintext_keyring = true to accept it)"
            )
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
            backend = keep_connections(cls())
            priority = getattr(cls, "priority", 1)
        except Exception as exc:
            raise SecretUnavailable(f"keyring: cannot load backend {self._backend_path}: "
                                    f"{type(exc).__name__} (is a D-Bus session with a SecretService "
                                    "daemon running?)") from None
        if isinstance(priority, int | float) and priority <= 0:
            raise SecretUnavailable(f"keyring: backend {self._backend_path} is not usable here "
                                    "(is a D-Bus session with a SecretService daemon running?)")
        self._backend = backend
        return backend

    def _call(self, what: str, fn: Callable[[Any], T], timeout: float | None = None) -> T:
        # loading the backend talks to D-Bus too, so it runs inside the time box
        bound = self._timeout if timeout is None else max(self._timeout, timeout)
        future = self._pool.submit(self._on_backend, fn, time.monotonic() + bound)
        try:
            return future.result(timeout=bound)
        except concurrent.futures.TimeoutError:
            raise SecretUnavailable(
                f"keyring: {what} timed out after {bound:g}s "
                "(is the keyring daemon running and unlocked?)"
            ) from None
        except SecretUnavailable:
            raise
        except Exception as exc:
            raise SecretUnavailable(f"keyring: {what} failed: {failure_name(exc)}") from None

    def _on_backend(self, fn: Callable[[Any], T], deadline: float) -> T:
        """`fn` on the backend, tried again while the daemon's collection is missing and the
        caller still waits (past `deadline` its time box has answered it)."""
        backend = self._load_backend()
        pauses = iter(MISSING_PAUSES)
        while True:
            try:
                return fn(backend)
            except Exception as exc:
                drop = getattr(backend, "drop_connection", None)
                # a kept connection that broke (the bus or the daemon restarted since its last
                # call) costs one retry on a new one; the next call on this thread connects again
                reused = drop is not None and drop()
                if reused and isinstance(exc, OSError | EOFError):
                    return fn(backend)
                pause = next(pauses, None)
                if pause is None or not collection_missing(exc) or time.monotonic() + pause >= deadline:
                    raise
            time.sleep(pause)  # the daemon's collection was not there: it may be a moment later

    def get(self, name: str) -> str | None:
        check_secret_name(name)
        value: str | None = self._call(f"reading {name!r}", lambda b: b.get_password(self.service, name))
        return value

    def set(self, name: str, value: str, *, person: bool = False) -> None:
        """Store `name`; `person`: a person waits on it, bounded by PERSON_WRITE_TIMEOUT (at least)."""
        check_secret_name(name)
        timeout = PERSON_WRITE_TIMEOUT if person else None
        self._call(f"storing {name!r}", lambda b: b.set_password(self.service, name, value), timeout)
        self._update_index(add=name, timeout=timeout)

    def delete(self, name: str) -> bool:
        check_secret_name(name)
        if self.get(name) is None:
            return False
        self._call(f"removing {name!r}", lambda b: b.delete_password(self.service, name))
        self._update_index(remove=name)
        return True

    def names(self) -> list[str]:
        raw = self._call("listing", lambda b: b.get_password(self.service, _INDEX_ENTRY)) or ""
        return sorted({n for n in raw.split("\n") if n})

    def _update_index(self, add: str | None = None, remove: str | None = None,
                      timeout: float | None = None) -> None:
        def update(backend: Any) -> None:  # read and written in one call: a retry reads again
            raw = backend.get_password(self.service, _INDEX_ENTRY) or ""
            names = {n for n in raw.split("\n") if n}
            if add:
                names.add(add)
            if remove:
                names.discard(remove)
            backend.set_password(self.service, _INDEX_ENTRY, "\n".join(sorted(names)))

        self._call("updating the index", update, timeout)


def build_sources(config: SecretsConfig) -> list[SecretSource]:
    sources: list[SecretSource] = []
    for spec in config.sources:
        if spec == "env":
            sources.append(EnvSource())
        elif spec == "keyring":
            sources.append(KeyringSource(config))
        elif spec == CREDENTIALS_SOURCE:  # set by systemd for this start only; unset: nothing to read
            if folder := os.environ.get("CREDENTIALS_DIRECTORY", "").strip():
                sources.append(DirSource(folder))
        elif spec.startswith("dir:"):
            sources.append(DirSource(spec[4:]))
    return sources


class SecretResolver:
    """Looks secrets up in the configured order, at each use."""

    def __init__(self, sources: Sequence[SecretSource]) -> None:
        self.sources = list(sources)

    @classmethod
    def from_config(cls, config: SecretsConfig) -> SecretResolver:
        return cls(build_sources(config))

    @property
    def keyring(self) -> KeyringSource | None:
        return next((s for s in self.sources if isinstance(s, KeyringSource)), None)

    def secret(self, name: str) -> Secret:
        check_secret_name(name)
        if name.startswith("login."):  # a person's refresh token (login_store.py): never a header
            raise SecretUnavailable(f"secret {name!r} is a stored login, which the sidecar keeps to "
                                    "itself; it cannot be used in a template", secret=name)
        for source in self.sources:
            value = source.get(name)
            if value is not None:
                return Secret(value, source=source.label, owner=f"secret:{name}")
        where = ", ".join(s.label for s in self.sources) or "no sources configured"
        raise SecretUnavailable(f"secret {name!r} not found (looked in: {where})", secret=name)

    def file(self, path: str) -> Secret:
        value = read_private_file(Path(path), f"secret-file {path}")
        if value is None:
            raise SecretUnavailable(f"secret-file {path} does not exist")
        return Secret(value, source=f"secret-file:{path}", owner=f"secret-file:{path}")

    def lookup(self, ref: SecretRef | FileRef) -> str:
        return (self.secret(ref.name) if isinstance(ref, SecretRef) else self.file(ref.path)).reveal()

    def render(self, template: Template, overrides: Mapping[str, str] | None = None) -> str:
        """Render; `overrides` supplies values for some secret names (a rotation's trial)."""
        if not overrides:
            return template.render(self.lookup)

        def lookup(ref: SecretRef | FileRef) -> str:
            if isinstance(ref, SecretRef) and ref.name in overrides:
                return overrides[ref.name]
            return self.lookup(ref)

        return template.render(lookup)

    def origin(self, name: str) -> str | None:
        """The label of the first source that holds `name` (the one in use), or None."""
        for source in self.sources:
            if source.get(name) is not None:
                return source.label
        return None

    def writable(self) -> KeyringSource | DirSource | None:
        """Where a rotation stores a new value: the keyring if configured, else a dir: source."""
        if (keyring := self.keyring) is not None:
            return keyring
        return next((s for s in self.sources if isinstance(s, DirSource)), None)

    def store(self, name: str, value: str) -> str:
        """Store `name` where the resolver will read it next; refuse if a source before it
        (the environment, say) would keep shadowing the new value."""
        target = self.writable()
        if target is None:
            raise SecretUnavailable("no writable secret source configured (add 'keyring' or 'dir:...' "
                                    "to secrets.sources)")
        for source in self.sources:
            if source is target:
                break
            if source.get(name) is not None:
                raise SecretUnavailable(f"secret {name!r} comes from {source.label}, which mcpcreds "
                                        f"cannot change; storing it in {target.label} would not take effect")
        target.set(name, value)
        Secret(value, source=target.label, owner=f"secret:{name}")  # the redactor forgets the old value
        return target.label

    def render_all(self, templates: Iterable[tuple[str, Template]]) -> dict[str, str]:
        return {name: self.render(t) for name, t in templates}
