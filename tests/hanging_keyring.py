"""Keyring backends for fault tests: one that never answers, one that is plaintext."""

from __future__ import annotations

import threading

from keyring.backend import KeyringBackend

RELEASE = threading.Event()


class HangingKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def get_password(self, service: str, username: str) -> str | None:
        RELEASE.wait(30)
        return None

    def set_password(self, service: str, username: str, password: str) -> None:
        RELEASE.wait(30)

    def delete_password(self, service: str, username: str) -> None:
        RELEASE.wait(30)


class PlaintextKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]
    store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.store.pop((service, username), None)
