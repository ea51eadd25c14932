"""Keyring backends for fault tests: one that never answers, one that is plaintext.

They are named by path (secrets.keyring_backend), never found by keyring's own detection: every
KeyringBackend subclass registers itself, and once this module was imported the test process's
`keyring.get_password` (keyring's default, a ChainerBackend over every viable backend) asked
gnome-keyring, then, for an entry gnome-keyring did not have, HangingKeyring, which waits 30 s
(test_aws_sso's read after logout took 34 s in the full file, 4 s alone)."""

from __future__ import annotations

import threading

from keyring.backend import KeyringBackend

RELEASE = threading.Event()


class HangingKeyring(KeyringBackend):
    priority = 1
    viable = False  # out of keyring's detection and chain

    def get_password(self, service: str, username: str) -> str | None:
        RELEASE.wait(30)
        return None

    def set_password(self, service: str, username: str, password: str) -> None:
        RELEASE.wait(30)

    def delete_password(self, service: str, username: str) -> None:
        RELEASE.wait(30)


class PlaintextKeyring(KeyringBackend):
    priority = 1
    viable = False  # out of keyring's detection and chain
    store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.store.pop((service, username), None)
