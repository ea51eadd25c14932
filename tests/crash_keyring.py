"""A keyring backend for the crash test: the real one (gnome-keyring, SecretService), except that
the process is killed (SIGKILL, as by `kill -9`) the moment a login entry has been stored: a
sidecar that has just kept a rotated refresh token dies before it uses the new access token."""

from __future__ import annotations

import os
import signal

from tests.fault_keyring import RealKeyring


class KillAfterLoginWrite(RealKeyring):
    def set_password(self, service: str, username: str, password: str) -> None:
        super().set_password(service, username, password)
        if username.startswith("login."):
            os.kill(os.getpid(), signal.SIGKILL)
