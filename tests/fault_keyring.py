"""The real keyring (gnome-keyring, SecretService) as a backend that fault tests subclass to add
a fault to `set_password` (tests/crash_keyring.py, blocking_keyring.py, failing_keyring.py,
vanishing_keyring.py).
Named by path (secrets.keyring_backend) in a sidecar's config, never found by keyring's own
detection (see tests/hanging_keyring.py for why that matters)."""

from __future__ import annotations

import threading

from keyring.backend import KeyringBackend
from keyring.backends.SecretService import Keyring as SecretService


class RealKeyring(KeyringBackend):
    priority = 1
    viable = False  # out of keyring's detection and chain: named by path only

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # keyring leaves __init__ unannotated
        self.real: KeyringBackend = SecretService()  # type: ignore[no-untyped-call]

    def get_password(self, service: str, username: str) -> str | None:
        return self.real.get_password(service, username)

    def set_password(self, service: str, username: str, password: str) -> None:
        self.real.set_password(service, username, password)

    def delete_password(self, service: str, username: str) -> None:
        self.real.delete_password(service, username)


class FirstLoginWrite:
    """`first(username)`: True for the first write of a login entry in this process only (the
    sidecar may make a backend per keyring source, so this lives in the fault's module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = False

    def __call__(self, username: str) -> bool:
        with self._lock:
            first = username.startswith("login.") and not self._seen
            self._seen = self._seen or first
        return first
