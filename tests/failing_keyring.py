"""A keyring backend for the failed-write test: the real one (gnome-keyring, SecretService),
except that the first write of a login entry fails (as a locked or stalled keyring's does),
after the sidecar has redeemed the refresh token that entry holds."""

from __future__ import annotations

from typing import Final

from keyring.errors import PasswordSetError

from tests.fault_keyring import FirstLoginWrite, RealKeyring

_FIRST: Final = FirstLoginWrite()


class FailFirstLoginWrite(RealKeyring):
    def set_password(self, service: str, username: str, password: str) -> None:
        if _FIRST(username):
            raise PasswordSetError("the test keyring refuses this write")
        super().set_password(service, username, password)
