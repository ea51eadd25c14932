"""The sidecar's renewal of a person's login (grant = "device" or "authorization_code"): the
refresh token from the keyring, `grant_type=refresh_token`, a rotated refresh token stored
before the new access token is used (write-then-use: a crash after the answer loses nothing the
keyring does not have), and `login_required` when there is none or it is refused. A login whose
server issued no refresh token is its stored access token, served until it expires or a resource
refuses it (an invalidation), then `login_required`. A client that mcpcreds registered (RFC 7591)
is the stored registration's. Single flight, refresh ahead and stale-if-error are the login
cache's (logins.py), as for client credentials. On a shared (Redis) state, the login every
sidecar renews from is in Redis, encrypted, redeemed by one sidecar at a time (login_share.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from ..config.model import LOGIN_GRANTS, LoginSpec, Target
from ..core.logs import get_logger
from ..core.secret import fingerprint
from ..credentials.authcode_flow import may_register
from ..credentials.login_store import LoginStore, StoredLogin, login_store
from ..credentials.tokens import MIN_LIFETIME, Token, usable_until
from ..errors import LoginRequired, McpcredsError, StateUnavailable, TokenEndpointError
from ..state import login_share

if TYPE_CHECKING:
    import httpx

    from ..config.model import Config
    from ..core.clock import Clock
    from ..core.metrics import Metrics
    from ..credentials.discovery import Discovery
    from ..credentials.logins import LoginCache
    from ..credentials.sources import SecretResolver
    from ..state.redis_state import RedisState
    from ..state.shared import LoginSharing


class LoginParts(Protocol):
    """What the renewal of a person's login uses of the broker (which it is)."""

    config: Config
    resolver: SecretResolver
    clock: Clock
    metrics: Metrics
    logins: LoginCache
    sharing: LoginSharing

    @property
    def discovery(self) -> Discovery: ...

    def http_for(self, target: Target, gateway: bool = False) -> httpx.AsyncClient: ...

    async def render_templates(self, key: str, templates: Iterable[tuple[str, Any]]) -> dict[str, str]: ...

_log = get_logger("refresh")
# per broker: the access-only login (key -> token) this sidecar served last; asked for again
# while the cache holds none, it was dropped (invalidated: a resource refused it)
_SERVED: Final[weakref.WeakKeyDictionary[object, dict[str, Token]]] = weakref.WeakKeyDictionary()
# per broker: a rotated login whose keyring write failed (key -> (a digest of the spent refresh
# token, the rotated login, its access token)). The keyring holds a refresh token the server has
# spent, so the next renewal writes this one first and serves its access token, instead of
# redeeming the spent one (a refusal, or a revoked login at servers that detect reuse).
_UNSAVED: Final[weakref.WeakKeyDictionary[object, dict[str, tuple[str, StoredLogin, Token]]]] = \
    weakref.WeakKeyDictionary()


# seconds between tries of a rotated login's write to an unreachable shared state (each longer
# than RedisState's fail-fast spell after a failure); all of them well within the login lock's lease
ROTATED_WRITE_RETRIES: Final = (0.3, 0.6, 1.2)


def login_required(target: Target, why: str) -> LoginRequired:
    command = f"mcpcreds login {target.name}"
    return LoginRequired(f"{target.key}: {why}; run `{command}`", command=command)


def access_only_token(stored: StoredLogin, now: float, refused: str | None = None) -> Token | None:
    """The stored access token of a login without a refresh token, if it can still be served at
    `now` (at least MIN_LIFETIME left, as for a fresh token) and is not the `refused` one (by
    fingerprint); else None: the login is over."""
    if stored.access_token is None or stored.expires_at is None or stored.refresh_token is not None:
        return None
    if stored.expires_at - now < MIN_LIFETIME:
        return None
    fp = fingerprint(stored.access_token)
    if fp == refused:
        return None
    return Token(stored.access_token, "Bearer", now, stored.expires_at, None, fp)


def client_of(login: LoginSpec, stored: StoredLogin) -> LoginSpec | None:
    """The client a stored login refreshes as: the registered one (no client_id configured, or a
    metadata document URL the server did not take: the login registered itself), else the
    configured one; None when they differ (a new login is due)."""
    registration = stored.registration
    registered = registration is not None and registration.client_id == stored.client_id
    if registered and may_register(login.client_id):
        assert registration is not None
        return dataclasses.replace(login, client_id=registration.client_id,
                                   auth_method=registration.auth_method)
    if not login.client_id or stored.client_id != login.client_id:
        return None
    return login


def shared_state(sharing: LoginSharing) -> RedisState | None:
    """The Redis state when the sidecar shares it with others, else None."""
    from ..state.shared import SharedLogins

    return sharing.state if isinstance(sharing, SharedLogins) else None


async def forget_shared_login(sharing: LoginSharing, target: Target) -> None:
    """A logout: the login in Redis is cleared too (its seeds kept), for every sidecar."""
    state = shared_state(sharing)
    if state is None or target.login is None or target.login.grant not in LOGIN_GRANTS:
        return
    shared = await login_share.read(state, target.key)
    if shared is not None and shared.login is not None:
        await login_share.write(state, target.key, login_share.SharedLogin(None, shared.seeds))


async def refresh_login(broker: LoginParts, target: Target,
                        overrides: Mapping[str, str] | None = None) -> Token:
    """A new access token from the stored refresh token; `overrides` are secret values to use
    instead of the stored ones (a rotation's trial of a new client secret or key)."""
    login = target.login
    assert login is not None
    store = login_store(broker.config.secrets, broker.resolver)
    stored = await asyncio.to_thread(store.get, target.key)
    state, shared = shared_state(broker.sharing), None
    if state is not None:  # the login all the sidecars renew from (login_share.py); a new one adopted
        shared, adopt = login_share.choose(stored, await login_share.read(state, target.key))
        if adopt and shared is not None:
            await login_share.write(state, target.key, shared)
        stored = shared.login if shared is not None else None

    async def keep(login: StoredLogin) -> None:
        if state is not None and shared is not None:
            await login_share.write(state, target.key, login_share.SharedLogin(login, shared.seeds))
        else:
            await asyncio.to_thread(store.put, target.key, login)

    stored, late = await _write_unsaved(broker, target.key, stored, keep)
    if late is not None and not overrides:  # a rotation's trial must reach the token endpoint
        return late
    if stored is None:
        raise login_required(target, "no login stored")
    client = client_of(login, stored)
    if client is None:
        raise login_required(target, "the stored login belongs to another client_id")
    if stored.refresh_token is None:
        return await _access_only(broker, target, stored, store)
    # the refresh asks for what the login asked for (a step-up's wider scope, offline_access):
    # the configured scope would narrow it (RFC 6749 §6)
    login = dataclasses.replace(client, scope=stored.scope)
    http = broker.http_for(target)
    token_url = await broker.discovery.token_url(login, target.endpoint, http)
    issuer = login.issuer or broker.discovery.issuers.get(target.endpoint)
    if stored.issued_elsewhere(issuer):
        # the refresh token (and a registered client's secret) is for the server that issued it
        raise login_required(target, "the server's metadata names another authorization server than "
                                     "the one this login was made at")
    credential = None
    if stored.registration is not None and stored.registration.client_id == login.client_id \
            and may_register(target.login.client_id):  # type: ignore[union-attr]
        credential = stored.registration.client_secret
    elif login.templates:
        template = login.private_key or login.client_secret
        assert template is not None
        if overrides:
            credential = await asyncio.to_thread(broker.resolver.render, template, overrides)
        else:
            credential = (await broker.render_templates(target.key, [("credential", template)]))["credential"]
    from ..credentials.oauth import (  # httpx, authlib: for a login only
        build_token_request,
        send_token_request,
    )

    request = build_token_request(login, token_url, credential, issuer=issuer,
                                  grant_type="refresh_token", params={"refresh_token": stored.refresh_token})
    broker.metrics.inc("mcpcreds_token_requests_total", (("key", target.key),),
                       help_text="Token requests sent to token endpoints, by cache key.")
    extras: dict[str, str] = {}
    try:
        token = await send_token_request(http, request, broker.clock.time(), login.expires_in_default,
                                         timeout=broker.config.sidecar.token_timeout, extras=extras)
    except TokenEndpointError as exc:
        broker.metrics.inc("mcpcreds_token_errors_total", (("key", target.key),),
                           help_text="Token requests that failed, by cache key.")
        if exc.error == "invalid_grant":
            if state is not None and shared is not None:  # spent for every sidecar
                await login_share.write(state, target.key, login_share.SharedLogin(None, shared.seeds))
            raise login_required(target, "the authorization server refused the refresh token "
                                         "(invalid_grant)") from None
        raise
    rotated = extras.get("refresh_token")
    if rotated is not None and rotated != stored.refresh_token:
        # write-then-use: the old one is spent at the server; the new one must be kept first
        kept = dataclasses.replace(stored, refresh_token=rotated, client_id=login.client_id)  # scope kept
        # in memory first: a write that fails (a locked keyring, Redis unreachable), or a
        # cancellation while it runs, loses nothing
        pending = _UNSAVED.setdefault(broker, {})
        pending[target.key] = (_digest(stored.refresh_token), kept, token)
        try:
            await keep_rotated(keep, kept)
        except McpcredsError:
            _log.error("rotated refresh token not stored",
                       extra={"key": target.key, "kept": "in memory, until the next renewal writes it"})
            raise
        pending.pop(target.key, None)
        _log.info("refresh token rotated", extra={"key": target.key})
    return token


async def keep_rotated(keep: Callable[[StoredLogin], Awaitable[None]], login: StoredLogin,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Store a rotated login; an unreachable shared state is tried again for about 2 s. The
    renewal holds the login lock meanwhile, so no other sidecar redeems the spent refresh token
    from Redis (a refusal that would end the login for all): a blip of Redis loses nothing. A
    keyring's failure is not retried here (the next renewal writes the login kept in memory)."""
    for delay in ROTATED_WRITE_RETRIES:
        try:
            await keep(login)
            return
        except StateUnavailable:
            _log.warning("rotated refresh token not stored yet: the shared state is unreachable; "
                         "trying again", extra={"retry_in": delay})
            await sleep(delay)
    await keep(login)


async def _write_unsaved(broker: LoginParts, key: str, stored: StoredLogin | None,
                         keep: Callable[[StoredLogin], Awaitable[None]]
                         ) -> tuple[StoredLogin | None, Token | None]:
    """Store (`keep`) the rotated login a failed write left in memory, if the store still holds
    the refresh token it replaced (not a logout or a new login since). Returns the stored login,
    and the rotated login's access token if it has not expired (else None: renew from the login)."""
    pending = _UNSAVED.get(broker, {})
    unsaved = pending.get(key)
    if unsaved is None:
        return stored, None
    spent, kept, token = unsaved
    if stored is None or stored.refresh_token is None or _digest(stored.refresh_token) != spent:
        pending.pop(key, None)
        return stored, None
    await keep(kept)  # on failure it stays pending
    pending.pop(key, None)
    _log.info("refresh token rotated", extra={"key": key, "written_late": True})
    fresh = usable_until(token) - broker.clock.time() >= MIN_LIFETIME
    return kept, token if fresh else None


def forget_unsaved(broker: LoginParts, key: str) -> None:
    """A logout: a rotated login still waiting for its keyring write is not written any more."""
    _UNSAVED.get(broker, {}).pop(key, None)


def _digest(refresh_token: str) -> str:
    return hashlib.sha256(refresh_token.encode()).hexdigest()


async def _access_only(broker: LoginParts, target: Target, stored: StoredLogin, store: LoginStore) -> Token:
    """The stored access token while it lasts; a refused one is marked expired in the keyring
    too, so a restarted sidecar does not serve it again."""
    served = _SERVED.setdefault(broker, {})
    now = broker.clock.time()
    if access_only_token(stored, now) is None:
        raise login_required(target, "the login's access token expired, and the server issued no "
                                     "refresh token to renew it")
    # asked again while the cache holds none, though the one served would still be there: it
    # was dropped (a resource refused it)
    last = served.get(target.key)
    refused = (last.fingerprint if last is not None and broker.logins.peek(target.key) is None
               and now < usable_until(last) else None)
    token = access_only_token(stored, now, refused)
    if token is None:
        await asyncio.to_thread(_mark_expired, store, target.key, stored, now)
        raise login_required(target, "the resource refused the login's access token, and the server "
                                     "issued no refresh token to renew it")
    served[target.key] = token
    return token


def _mark_expired(store: LoginStore, key: str, stored: StoredLogin, now: float) -> None:
    """Mark the refused login expired, unless a new login replaced it in the meantime."""
    current = store.get(key)
    if current is not None and current.access_token == stored.access_token:
        store.put(key, dataclasses.replace(current, expires_at=now))
