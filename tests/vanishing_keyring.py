"""A keyring backend for the missing-collection test: the real one (gnome-keyring, SecretService),
except that its collection is missing for the first `misses` writes: each fails as gnome-keyring's
answer UnknownMethod makes secretstorage fail (`ItemNotFoundException`), which a write to a new
keyring met while other processes wrote their first entries."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from secretstorage.exceptions import ItemNotFoundException

from tests.fault_keyring import RealKeyring


class MissingCollection(RealKeyring):
    misses: ClassVar[int] = 0
    passes_first: ClassVar[int] = 0  # writes that pass before the misses
    writes: ClassVar[int] = 0  # every write asked, missed or not
    # called at a missed write, before it fails (another process writing meanwhile)
    meanwhile: ClassVar[Callable[[], None] | None] = None

    def set_password(self, service: str, username: str, password: str) -> None:
        cls = type(self)
        cls.writes += 1
        if cls.passes_first < cls.writes <= cls.passes_first + cls.misses:
            if cls.meanwhile is not None:
                cls.meanwhile()
            raise ItemNotFoundException("Item does not exist!")
        super().set_password(service, username, password)
