"""Secret sources: the environment, the keyring, a credentials folder, `secret-file:` paths."""

from __future__ import annotations

import concurrent.futures
import importlib
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from .config import SecretsConfig
from .errors import InvalidRequest, SecretUnavailable
from .secret import Secret
from .templates import FileRef, SecretRef, Template

_SECRET_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}\Z")
_MAX_SECRET_BYTES: Final = 64 * 1024
_INDEX_ENTRY: Final = "__mcpcreds_index__"
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


def read_private_file(path: Path, what: str) -> str | None:
    """Read a secret file: None if absent; refused if others can read it or it is not a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecretUnavailable(f"{what}: cannot open ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretUnavailable(f"{what}: not a regular file")
        if info.st_mode & 0o077:
            raise SecretUnavailable(
                f"{what}: refused: readable by group or others (mode {stat.S_IMODE(info.st_mode):04o}, "
                "expected 0600 or 0400)"
            )
        data = os.read(fd, _MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_SECRET_BYTES:
        raise SecretUnavailable(f"{what}: larger than {_MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode("utf-8", errors="strict") if data else ""
    except UnicodeDecodeError:
        raise SecretUnavailable(f"{what}: not UTF-8 text") from None
    return text[:-1] if text.endswith("\n") else text


class DirSource:
    """`dir:PATH`: one file per secret, named after it (systemd's $CREDENTIALS_DIRECTORY)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.label = f"dir:{path}"

    def get(self, name: str) -> str | None:
        check_secret_name(name)
        return read_private_file(self.path / name, f"{self.label}/{name}")

    def set(self, name: str, value: str) -> None:
        """Write atomically with mode 0600: a reader sees the old value or the new, never half."""
        check_secret_name(name)
        tmp = self.path / f".{name}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, value.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path / name)


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
            backend = cls()
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

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        # loading the backend talks to D-Bus too, so it runs inside the time box
        future = self._pool.submit(lambda: fn(self._load_backend()))
        try:
            return future.result(timeout=self._timeout)
        except concurrent.futures.TimeoutError:
            raise SecretUnavailable(
                f"keyring: {what} timed out after {self._timeout:g}s "
                "(is the keyring daemon running and unlocked?)"
            ) from None
        except SecretUnavailable:
            raise
        except Exception as exc:
            raise SecretUnavailable(f"keyring: {what} failed: {type(exc).__name__}") from None

    def get(self, name: str) -> str | None:
        check_secret_name(name)
        value: str | None = self._call(f"reading {name!r}", lambda b: b.get_password(self.service, name))
        return value

    def set(self, name: str, value: str) -> None:
        check_secret_name(name)
        self._call(f"storing {name!r}", lambda b: b.set_password(self.service, name, value))
        self._update_index(add=name)

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

    def _update_index(self, add: str | None = None, remove: str | None = None) -> None:
        names = set(self.names())
        if add:
            names.add(add)
        if remove:
            names.discard(remove)
        value = "\n".join(sorted(names))
        self._call("updating the index", lambda b: b.set_password(self.service, _INDEX_ENTRY, value))


def build_sources(config: SecretsConfig) -> list[SecretSource]:
    sources: list[SecretSource] = []
    for spec in config.sources:
        if spec == "env":
            sources.append(EnvSource())
        elif spec == "keyring":
            sources.append(KeyringSource(config))
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
        for source in self.sources:
            value = source.get(name)
            if value is not None:
                return Secret(value, source=source.label)
        where = ", ".join(s.label for s in self.sources) or "no sources configured"
        raise SecretUnavailable(f"secret {name!r} not found (looked in: {where})", secret=name)

    def file(self, path: str) -> Secret:
        value = read_private_file(Path(path), f"secret-file {path}")
        if value is None:
            raise SecretUnavailable(f"secret-file {path} does not exist")
        return Secret(value, source=f"secret-file:{path}")

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
        Secret(value, source=target.label)  # registers the new value with the redactor
        return target.label

    def render_all(self, templates: Iterable[tuple[str, Template]]) -> dict[str, str]:
        return {name: self.render(t) for name, t in templates}
