"""The sidecar's renewal of a person's login (grant = "device" or "authorization_code"): the
refresh token from the keyring, `grant_type=refresh_token`, a rotated refresh token stored
before the new access token is used (write-then-use: a crash after the answer loses nothing the
keyring does not have), and `login_required` when there is none or it is refused. Single flight,
refresh ahead and stale-if-error are the login cache's (logins.py), as for client credentials."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .config import Target
from .errors import LoginRequired, TokenEndpointError
from .login_store import StoredLogin, login_store
from .logs import get_logger
from .oauth import Token, build_token_request, send_token_request

if TYPE_CHECKING:
    from .broker import Broker

_log = get_logger("refresh")


def login_required(target: Target, why: str) -> LoginRequired:
    command = f"mcpcreds login {target.name}"
    return LoginRequired(f"{target.key}: {why}; run `{command}`", command=command)


async def refresh_login(broker: Broker, target: Target, overrides: Mapping[str, str] | None = None) -> Token:
    """A new access token from the stored refresh token; `overrides` are secret values to use
    instead of the stored ones (a rotation's trial of a new client secret or key)."""
    login = target.login
    assert login is not None
    store = login_store(broker.config.secrets, broker.resolver)
    stored = await asyncio.to_thread(store.get, target.key)
    if stored is None:
        raise login_required(target, "no login stored")
    if stored.client_id != login.client_id:
        raise login_required(target, "the stored login belongs to another client_id")
    http = broker.http_for(target)
    token_url = await broker.discovery.token_url(login, target.endpoint, http)
    credential = None
    if login.templates:
        template = login.private_key or login.client_secret
        assert template is not None
        if overrides:
            credential = await asyncio.to_thread(broker.resolver.render, template, overrides)
        else:
            credential = (await broker._render(target.key, [("credential", template)]))["credential"]
    request = build_token_request(login, token_url, credential,
                                  issuer=login.issuer or broker.discovery.issuers.get(target.endpoint),
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
            raise login_required(target, "the authorization server refused the refresh token "
                                         "(invalid_grant)") from None
        raise
    rotated = extras.get("refresh_token")
    if rotated is not None and rotated != stored.refresh_token:
        # write-then-use: the old one is spent at the server; the new one must be kept first
        await asyncio.to_thread(store.put, target.key, StoredLogin(rotated, login.client_id))
        _log.info("refresh token rotated", extra={"key": target.key})
    return token
