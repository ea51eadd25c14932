"""A keyring backend for the missing-collection test: the real one (gnome-keyring, SecretService),
except that its collection is missing for the first `misses` writes: each fails as gnome-keyring's
answer UnknownMethod makes secretstorage fail (`ItemNotFoundException`), which a write to a new
keyring met while other processes wrote their first entries."""

from __future__ import annotations

from typing import ClassVar

from secretstorage.exceptions import ItemNotFoundException

from tests.fault_keyring import RealKeyring


class MissingCollection(RealKeyring):
    misses: ClassVar[int] = 0
    writes: ClassVar[int] = 0  # every write asked, missed or not

    def set_password(self, service: str, username: str, password: str) -> None:
        cls = type(self)
        cls.writes += 1
        if cls.writes <= cls.misses:
            raise ItemNotFoundException("Item does not exist!")
        super().set_password(service, username, password)
