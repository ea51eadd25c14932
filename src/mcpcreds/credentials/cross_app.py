"""Enterprise-managed authorization (`grant = "cross_app"`; the MCP extension, after
draft-ietf-oauth-identity-assertion-authz-grant): the person's identity assertion from the
enterprise IdP (config/cross_app.py) is exchanged at the IdP's token endpoint for an Identity
Assertion JWT Authorization Grant (RFC 8693 token exchange, `requested_token_type` ID-JAG,
`audience` the MCP server's authorization server, `resource` the MCP server), which that
authorization server redeems (RFC 7523 jwt-bearer, the login's own client authentication) for the
access token. The sidecar does both at each fetch of the login cache (logins.py): renewed ahead
of expiry like any login, with the assertion rendered anew each time, so an assertion renewed
where it comes from is picked up. The requests and the exchange's answer are pure; the ID-JAG
never leaves the sidecar (the redactor masks it) and no error quotes an answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import urlencode

from ..config.cross_app import IdpSpec
from ..config.model import LoginSpec, Target
from ..core.secret import REDACTOR
from ..errors import TokenEndpointError
from .oauth import (
    MAX_TOKEN_CHARS,
    TokenRequest,
    authenticated_request,
    build_token_request,
    post_form,
    send_token_request,
)
from .tokens import Token

if TYPE_CHECKING:
    import httpx

    from ..config.model import Config
    from ..core.clock import Clock
    from ..core.metrics import Metrics
    from ..core.templates import Template
    from .discovery import Discovery
    from .sources import SecretResolver

TOKEN_EXCHANGE: Final = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_BEARER: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ID_JAG: Final = "urn:ietf:params:oauth:token-type:id-jag"
_REQUESTS: Final = "Token requests sent to token endpoints, by cache key."
_VISIBLE: Final = frozenset(chr(c) for c in range(0x21, 0x7f))


class AssertionParts(Protocol):
    """What a cross-app login uses of the broker (which it is)."""

    config: Config
    resolver: SecretResolver
    clock: Clock
    metrics: Metrics

    @property
    def discovery(self) -> Discovery: ...

    def http_for(self, target: Target, gateway: bool = False) -> httpx.AsyncClient: ...

    async def render_templates(self, key: str, templates: Iterable[tuple[str, Any]]) -> dict[str, str]: ...


def exchange_request(idp: IdpSpec, token_url: str, subject_token: str, idp_secret: str | None,
                     audience: str, resource: str | None, scope: str | None) -> TokenRequest:
    """The RFC 8693 request at the IdP's token endpoint for an ID-JAG: `audience` is the issuer
    of the MCP server's authorization server (the ID-JAG's `aud`), `resource` the MCP server (RFC
    8707). As the IdP's client: client_secret_basic with a secret, a public client (its id in the
    form) without, no client authentication when no idp_client_id is configured."""
    form = {"grant_type": TOKEN_EXCHANGE, "requested_token_type": ID_JAG, "audience": audience,
            "subject_token": subject_token, "subject_token_type": idp.token_type_urn}
    if resource:
        form["resource"] = resource
    if scope:
        form["scope"] = scope
    if idp.client_id is None:  # no client configured at the IdP: the assertion alone
        return TokenRequest(token_url, {"Content-Type": "application/x-www-form-urlencoded",
                                        "Accept": "application/json", "Accept-Encoding": "identity"},
                            urlencode(form))
    client = LoginSpec("cross_app", idp.client_id, None, None,
                       "client_secret_basic" if idp_secret is not None else "none", token_url, idp.issuer,
                       None, None, None)
    return authenticated_request(client, token_url, idp_secret, form, issuer=idp.issuer)


def bearer_request(login: LoginSpec, token_url: str, credential: str | None, assertion: str,
                   issuer: str) -> TokenRequest:
    """The RFC 7523 request redeeming the ID-JAG at the MCP server's authorization server, as the
    login's client, with the login's scope and resource."""
    params = {"assertion": assertion}
    if login.scope:
        params["scope"] = login.scope
    return build_token_request(login, token_url, credential, issuer=issuer, grant_type=JWT_BEARER,
                               params=params)


def parse_exchange_response(status: int, body: bytes) -> str:
    """The ID-JAG of the IdP's answer (RFC 8693 §2.2: `issued_token_type` must say it is one,
    and a `token_type` other than N_A is refused: the grant is never a bearer token); an error
    names the OAuth error code only."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    if status != 200:
        code = data.get("error") if isinstance(data, dict) else None
        if not (isinstance(code, str) and code.isascii() and 0 < len(code) <= 64
                and code.replace("_", "").isalnum()):
            code = "server_error" if status >= 500 else "invalid_response"
        hint = ("; the person's identity assertion (subject_token) may have expired: renew it where it "
                "comes from" if code == "invalid_grant" else "")
        raise TokenEndpointError(f"the enterprise IdP refused the token exchange (HTTP {status}, "
                                 f"{code}){hint}", code)
    if not isinstance(data, dict):
        raise TokenEndpointError("the enterprise IdP's token exchange answer is not a JSON object",
                                 "invalid_response")
    if data.get("issued_token_type") != ID_JAG:
        raise TokenEndpointError("the enterprise IdP's token exchange answer is not an ID-JAG "
                                 "(issued_token_type)", "invalid_response")
    token_type = data.get("token_type", "N_A")
    if not isinstance(token_type, str) or token_type.upper() != "N_A":
        raise TokenEndpointError("the enterprise IdP's ID-JAG has a token_type other than N_A",
                                 "invalid_response")
    grant = data.get("access_token")
    if not isinstance(grant, str) or not 0 < len(grant) <= MAX_TOKEN_CHARS or not set(grant) <= _VISIBLE:
        raise TokenEndpointError("the enterprise IdP's token exchange answer has no usable ID-JAG",
                                 "invalid_response")
    REDACTOR.add(grant)
    return grant


async def cross_app_login(parts: AssertionParts, target: Target,
                          overrides: Mapping[str, str] | None = None) -> Token:
    """One cross-app login: the assertion exchanged at the IdP, the ID-JAG redeemed at the MCP
    server's authorization server; `overrides` are secret values to use instead of the stored
    ones (a rotation's trial)."""
    login = target.login
    assert login is not None and login.idp is not None
    idp = login.idp
    templates: list[tuple[str, Template]] = [("subject_token", idp.subject_token)]
    if idp.client_secret is not None:
        templates.append(("idp_secret", idp.client_secret))
    if (own := login.private_key or login.client_secret) is not None:
        templates.append(("credential", own))
    if overrides:
        rendered = {name: await asyncio.to_thread(parts.resolver.render, template, overrides)
                    for name, template in templates}
    else:
        rendered = await parts.render_templates(target.key, templates)
    http = parts.http_for(target)
    token_url = await parts.discovery.token_url(login, target.endpoint, http)
    issuer = login.issuer or parts.discovery.issuers.get(target.endpoint)
    if issuer is None:  # a configured token_url and no issuer: config/cross_app.py refuses it
        raise TokenEndpointError(f"{target.key}: the authorization server's issuer is not known (the "
                                 "ID-JAG's audience): configure issuer", "discovery_failed")
    idp_url = idp.token_url or await parts.discovery.issuer_token_url(idp.issuer or "", http)
    timeout = parts.config.sidecar.token_timeout
    exchange = exchange_request(idp, idp_url, rendered["subject_token"], rendered.get("idp_secret"),
                                issuer, login.resource, login.scope)
    _count(parts, target, "mcpcreds_token_requests_total", _REQUESTS)
    try:
        status, _, body = await post_form(http, exchange, timeout)
        grant = parse_exchange_response(status, body)
        _count(parts, target, "mcpcreds_token_requests_total", _REQUESTS)
        request = bearer_request(login, token_url, rendered.get("credential"), grant, issuer)
        return await send_token_request(http, request, parts.clock.time(), login.expires_in_default,
                                        timeout=timeout)
    except Exception:
        _count(parts, target, "mcpcreds_token_errors_total", "Token requests that failed, by cache key.")
        raise


def _count(parts: AssertionParts, target: Target, name: str, help_text: str) -> None:
    parts.metrics.inc(name, (("key", target.key),), help_text=help_text)
