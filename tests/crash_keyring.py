"""A keyring backend for the crash test: the real one (gnome-keyring, SecretService), except that
the process is killed (SIGKILL, as by `kill -9`) the moment a login entry has been stored: a
sidecar that has just kept a rotated refresh token dies before it uses the new access token."""

from __future__ import annotations

import os
import signal

from keyring.backend import KeyringBackend
from keyring.backends.SecretService import Keyring as SecretService


class KillAfterLoginWrite(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.real = SecretService()

    def get_password(self, service: str, username: str) -> str | None:
        return self.real.get_password(service, username)  # type: ignore[no-any-return]

    def set_password(self, service: str, username: str, password: str) -> None:
        self.real.set_password(service, username, password)
        if username.startswith("login."):
            os.kill(os.getpid(), signal.SIGKILL)

    def delete_password(self, service: str, username: str) -> None:
        self.real.delete_password(service, username)
