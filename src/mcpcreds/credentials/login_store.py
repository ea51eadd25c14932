"""Where a person's login lives: one keyring entry per cache key (`login.service.crm` for
`service:crm`, `login.mcp.docs` for `mcp:docs`), never a file the config names. The entry holds
JSON: the refresh token, or (a server that issues none) the access token and when it expires; the
client id it was issued to (a changed client id needs a new login); and the client's dynamic
registration (RFC 7591), when mcpcreds registered itself, reused by the next login; the scope the
login asked for, and a step-up the sidecar recorded (a resource answered `403 insufficient_scope`:
the next login asks for the wider scope) with how many step-up logins in a row led here."""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Final, TypeGuard

from ..config.model import SecretsConfig
from ..core.scopes import MAX_STEP_UPS, parse_scope
from ..core.secret import REDACTOR
from ..errors import SecretUnavailable
from .sources import KeyringSource, SecretResolver

ENTRY_PREFIX: Final = "login."
MAX_ENTRY_CHARS: Final = 32 * 1024
MAX_CLIENT_ID_CHARS: Final = 512
MAX_SECRET_CHARS: Final = 4096
MAX_TOKEN_CHARS: Final = 16 * 1024
MAX_URL_CHARS: Final = 2048
_VISIBLE: Final = re.compile(r"[\x21-\x7e]+")  # visible ASCII: safe in a header and a form
REGISTERED_AUTH_METHODS: Final = ("none", "client_secret_basic", "client_secret_post")


def entry_name(key: str) -> str:
    """The keyring entry of a cache key: `service:crm` -> `login.service.crm`."""
    kind, _, name = key.partition(":")
    return f"{ENTRY_PREFIX}{kind}.{name}"


def visible_ascii(value: object, most: int) -> TypeGuard[str]:
    return isinstance(value, str) and 0 < len(value) <= most and _VISIBLE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Registration:
    """A client registered by mcpcreds (RFC 7591): at which authorization server, for which
    redirect URI, with which token endpoint authentication (and secret, if one was issued)."""

    issuer: str
    client_id: str
    auth_method: str
    client_secret: str | None
    redirect_uri: str

    def __repr__(self) -> str:  # the secret is the client's password
        return (f"Registration(issuer={self.issuer!r}, client_id={self.client_id!r}, "
                f"auth_method={self.auth_method!r})")

    def to_dict(self) -> dict[str, str]:
        data = {"issuer": self.issuer, "client_id": self.client_id, "auth_method": self.auth_method,
                "redirect_uri": self.redirect_uri}
        if self.client_secret is not None:
            data["client_secret"] = self.client_secret
        return data

    @classmethod
    def from_dict(cls, data: object) -> Registration | None:
        """None unless every field is there and well formed (secret: iff the method needs one)."""
        if not isinstance(data, dict):
            return None
        issuer, client_id = data.get("issuer"), data.get("client_id")
        method, secret = data.get("auth_method"), data.get("client_secret")
        redirect = data.get("redirect_uri")
        if not (visible_ascii(issuer, MAX_URL_CHARS) and visible_ascii(client_id, MAX_CLIENT_ID_CHARS)
                and visible_ascii(redirect, MAX_URL_CHARS) and method in REGISTERED_AUTH_METHODS):
            return None
        if (secret is None) != (method == "none") or (
                secret is not None and not visible_ascii(secret, MAX_SECRET_CHARS)):
            return None
        if secret is not None:
            REDACTOR.add(secret)
        return cls(issuer, client_id, method, secret, redirect)


@dataclass(frozen=True, slots=True)
class StoredLogin:
    """A refresh token, or else an access token and its expiry (epoch seconds): the server
    issued no refresh token, so the login lasts as long as that access token."""

    refresh_token: str | None
    client_id: str
    access_token: str | None = None
    expires_at: float | None = None
    registration: Registration | None = None
    scope: str | None = None  # what the login asked for (None: no scope parameter)
    step_up: str | None = None  # the wider scope the next login asks for (a 403 insufficient_scope)
    step_ups: int = 0  # step-up logins in a row up to this one (bounded by MAX_STEP_UPS)
    issuer: str | None = None  # the authorization server that issued it (as its metadata names itself)

    def __repr__(self) -> str:
        kind = "refresh" if self.refresh_token is not None else "access-only"
        return (f"StoredLogin(client_id={self.client_id!r}, {kind}, expires_at={self.expires_at!r}, "
                f"scope={self.scope!r}, step_up={self.step_up!r}, step_ups={self.step_ups}, "
                f"issuer={self.issuer!r})")

    def issued_elsewhere(self, current: str | None) -> bool:
        """Whether the login was made at another authorization server than `current` (the one
        the MCP server's metadata names now; None: not known, nothing to compare). A login kept
        before the issuer was recorded is known by its registration's issuer, if any."""
        recorded = self.issuer or (self.registration.issuer if self.registration is not None else None)
        if recorded is None or current is None:
            return False
        return recorded.rstrip("/") != current.rstrip("/")

    def to_json(self) -> str:
        data: dict[str, object] = {"v": 1, "client_id": self.client_id}
        if self.refresh_token is not None:
            data["refresh_token"] = self.refresh_token
        else:
            data.update(access_token=self.access_token, expires_at=self.expires_at)
        if self.registration is not None:
            data["registration"] = self.registration.to_dict()
        for key in ("scope", "step_up", "issuer"):
            if (value := getattr(self, key)) is not None:
                data[key] = value
        if self.step_ups:
            data["step_ups"] = self.step_ups
        return json.dumps(data)

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
        if not isinstance(client_id, str):
            return None
        registration = None
        if "registration" in data and (registration := Registration.from_dict(data["registration"])) is None:
            return None
        scopes = {key: parse_scope(data[key]) for key in ("scope", "step_up") if key in data}
        step_ups = data.get("step_ups", 0)
        if None in scopes.values() or isinstance(step_ups, bool) or not isinstance(step_ups, int) \
                or not 0 <= step_ups <= MAX_STEP_UPS:
            return None
        scope, step_up = scopes.get("scope"), scopes.get("step_up")
        issuer = data.get("issuer")
        if issuer is not None and not visible_ascii(issuer, MAX_URL_CHARS):
            return None
        if isinstance(token, str) and token:
            REDACTOR.add(token)
            return cls(token, client_id, registration=registration, scope=scope, step_up=step_up,
                       step_ups=step_ups, issuer=issuer)
        if token is not None:
            return None
        access, expires_at = data.get("access_token"), data.get("expires_at")
        if not visible_ascii(access, MAX_TOKEN_CHARS) or isinstance(expires_at, bool) \
                or not isinstance(expires_at, int | float) or not math.isfinite(expires_at):
            return None
        REDACTOR.add(access)
        return cls(None, client_id, access, float(expires_at), registration, scope, step_up, step_ups, issuer)


class LoginStore:
    def __init__(self, keyring: KeyringSource) -> None:
        self.keyring = keyring

    def get(self, key: str) -> StoredLogin | None:
        text = self.keyring.get(entry_name(key))
        return StoredLogin.from_json(text) if text is not None else None

    def put(self, key: str, login: StoredLogin, *, person: bool = False) -> None:
        """Keep `login`; `person`: a person waits on the write (see KeyringSource.set)."""
        self.keyring.set(entry_name(key), login.to_json(), person=person)

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
