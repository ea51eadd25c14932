"""A keyring backend for the failed-write test: the real one (gnome-keyring, SecretService),
except that the first write of a login entry fails (as a locked or stalled keyring's does),
after the sidecar has redeemed the refresh token that entry holds."""

from __future__ import annotations

import threading
from typing import Final

from keyring.backend import KeyringBackend
from keyring.backends.SecretService import Keyring as SecretService
from keyring.errors import PasswordSetError

_LOCK: Final = threading.Lock()
_FAILED: list[str] = []  # module-wide: the sidecar may make a backend per keyring source


class FailFirstLoginWrite(KeyringBackend):
    priority = 1  # type: ignore[assignment]
    viable = False  # out of keyring's detection and chain: named by path only

    def __init__(self) -> None:
        super().__init__()
        self.real = SecretService()

    def get_password(self, service: str, username: str) -> str | None:
        return self.real.get_password(service, username)  # type: ignore[no-any-return]

    def set_password(self, service: str, username: str, password: str) -> None:
        with _LOCK:
            fail = username.startswith("login.") and not _FAILED
            if fail:
                _FAILED.append(username)
        if fail:
            raise PasswordSetError("the test keyring refuses this write")
        self.real.set_password(service, username, password)

    def delete_password(self, service: str, username: str) -> None:
        self.real.delete_password(service, username)
