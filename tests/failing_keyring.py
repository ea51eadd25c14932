"""A keyring backend for the failed-write test: the real one (gnome-keyring, SecretService),
except that the first write of a login entry fails (as a locked or stalled keyring's does),
after the sidecar has redeemed the refresh token that entry holds."""

from __future__ import annotations

import threading
from typing import Final

from keyring.errors import PasswordSetError

from tests.fault_keyring import RealKeyring

_LOCK: Final = threading.Lock()
_FAILED: list[str] = []  # module-wide: the sidecar may make a backend per keyring source


class FailFirstLoginWrite(RealKeyring):
    def set_password(self, service: str, username: str, password: str) -> None:
        with _LOCK:
            fail = username.startswith("login.") and not _FAILED
            if fail:
                _FAILED.append(username)
        if fail:
            raise PasswordSetError("the test keyring refuses this write")
        super().set_password(service, username, password)
