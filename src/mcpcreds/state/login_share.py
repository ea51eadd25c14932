"""A person's login on a shared (Redis) state: the refresh token every sidecar renews from.

With several sidecars, each host's keyring holds only the logins made there; the login they all
renew from is in Redis, Fernet-encrypted with the state key like the access tokens they share,
and is redeemed by one sidecar at a time (under the shared login lock, `shared.SharedLogins`):
refresh-token rotation makes a second redemption of the same token a revocation at most IdPs.

- The record holds the current login (`StoredLogin` JSON, None once refused or logged out) and
  the `seeds`: the fingerprints of the keyring logins it was started from (at most `MAX_SEEDS`,
  newest last).
- A keyring login whose fingerprint is not a seed is a login made since (`mcpcreds login` on this
  host): it is adopted, written to Redis before it is redeemed. One that is a seed was adopted
  already and is spent or replaced: the record's login is used, never the keyring's.
- A rotated refresh token is written to Redis before the new access token is used (write-then-use:
  a crash after the answer loses nothing Redis does not have).
- A refused refresh token (`invalid_grant`) or a logout clears the record's login and keeps the
  seeds, so a spent keyring login is never adopted again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..core.secret import fingerprint
from ..credentials.login_store import StoredLogin

if TYPE_CHECKING:
    from .redis_state import RedisState

MAX_SEEDS: Final = 16


@dataclass(frozen=True, slots=True)
class SharedLogin:
    login: StoredLogin | None
    seeds: tuple[str, ...]


def seed_of(login: StoredLogin) -> str:
    """What identifies a keyring login (its refresh token, else its access token)."""
    return fingerprint(login.refresh_token or login.access_token or "")


def parse_record(data: dict[str, Any] | None) -> SharedLogin | None:
    """The record read from Redis (already decrypted and bound to its key); None if absent or
    malformed."""
    if data is None:
        return None
    seeds, text = data.get("seeds"), data.get("login")
    if not isinstance(seeds, list) or not all(isinstance(s, str) for s in seeds) or len(seeds) > MAX_SEEDS:
        return None
    login = StoredLogin.from_json(text) if isinstance(text, str) else None
    if text is not None and login is None:
        return None
    return SharedLogin(login, tuple(seeds))


def to_record(shared: SharedLogin) -> dict[str, Any]:
    login = shared.login.to_json() if shared.login is not None else None
    return {"login": login, "seeds": list(shared.seeds)}


def choose(local: StoredLogin | None, shared: SharedLogin | None) -> tuple[SharedLogin | None, bool]:
    """The record to renew from, and whether it must be written first (a keyring login adopted)."""
    if local is not None and (shared is None or seed_of(local) not in shared.seeds):
        seeds = (*(shared.seeds if shared is not None else ()), seed_of(local))[-MAX_SEEDS:]
        return SharedLogin(local, seeds), True
    return shared, False


async def read(state: RedisState, key: str) -> SharedLogin | None:
    return parse_record(await state.get_stored_login(key))


async def write(state: RedisState, key: str, shared: SharedLogin) -> None:
    await state.put_stored_login(key, to_record(shared))
