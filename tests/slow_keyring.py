"""A keyring backend for the person-write test: the real one (gnome-keyring, SecretService), except
that the first write of a login entry takes SLOW_SECONDS first, as a keyring asking a person to
make or unlock it does."""

from __future__ import annotations

import time
from typing import Final

from tests.fault_keyring import FirstLoginWrite, RealKeyring

SLOW_SECONDS: Final = 2.0
_FIRST: Final = FirstLoginWrite()


class SlowFirstLoginWrite(RealKeyring):
    def set_password(self, service: str, username: str, password: str) -> None:
        if _FIRST(username):
            time.sleep(SLOW_SECONDS)
        super().set_password(service, username, password)
