"""Where a login's refresh token lives: one keyring entry per cache key (`login.service.crm` for
`service:crm`, `login.mcp.docs` for `mcp:docs`), never a file the config names. The entry holds
JSON: the refresh token and the client id it was issued to (a changed client id needs a new
login)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Final

from .config import SecretsConfig
from .errors import SecretUnavailable
from .secret import REDACTOR
from .sources import KeyringSource, SecretResolver

ENTRY_PREFIX: Final = "login."
MAX_ENTRY_CHARS: Final = 32 * 1024


def entry_name(key: str) -> str:
    """The keyring entry of a cache key: `service:crm` -> `login.service.crm`."""
    kind, _, name = key.partition(":")
    return f"{ENTRY_PREFIX}{kind}.{name}"


@dataclass(frozen=True, slots=True)
class StoredLogin:
    refresh_token: str
    client_id: str

    def __repr__(self) -> str:
        return f"StoredLogin(client_id={self.client_id!r})"

    def to_json(self) -> str:
        return json.dumps({"v": 1, "refresh_token": self.refresh_token, "client_id": self.client_id})

    @classmethod
    def from_json(cls, text: str) -> StoredLogin | None:
        """None for an entry that is not one of ours (never an error that quotes it)."""
        if len(text) > MAX_ENTRY_CHARS:
            return None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict):
            return None
        token, client_id = data.get("refresh_token"), data.get("client_id")
        if not isinstance(token, str) or not token or not isinstance(client_id, str):
            return None
        REDACTOR.add(token)
        return cls(token, client_id)


class LoginStore:
    def __init__(self, keyring: KeyringSource) -> None:
        self.keyring = keyring

    def get(self, key: str) -> StoredLogin | None:
        text = self.keyring.get(entry_name(key))
        return StoredLogin.from_json(text) if text is not None else None

    def put(self, key: str, login: StoredLogin) -> None:
        self.keyring.set(entry_name(key), login.to_json())

    def delete(self, key: str) -> bool:
        return self.keyring.delete(entry_name(key))


@functools.lru_cache(maxsize=8)
def _keyring_for(config: SecretsConfig) -> KeyringSource:
    return KeyringSource(config)


def login_store(config: SecretsConfig, resolver: SecretResolver | None = None) -> LoginStore:
    """The store on the configured keyring (the resolver's, if it reads one)."""
    keyring = resolver.keyring if resolver is not None else None
    if keyring is None:
        try:
            keyring = _keyring_for(config)
        except TypeError:  # an unhashable config: no cache
            keyring = KeyringSource(config)
    if keyring is None:
        raise SecretUnavailable("no keyring to keep the login in")
    return LoginStore(keyring)
