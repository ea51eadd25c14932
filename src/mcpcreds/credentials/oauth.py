"""OAuth 2.1 client credentials: token request building and response parsing (pure), the
refresh decision (pure), and the fetcher that sends one request over httpx.

authlib encodes the client authentication (client_secret_basic/post, private_key_jwt per
RFC 7523) and the form body. mcpcreds sends the request itself, with every parameter on every
fetch (authlib's own re-fetch drops `resource` and `audience`, authlib#783), no redirects, a
size cap, and its own caching and locking.
"""

from __future__ import annotations

import base64
import json
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote_plus, urlencode

import httpx
from authlib.oauth2.auth import ClientAuth

from ..config.model import LoginSpec
from ..core.secret import REDACTOR, fingerprint
from ..errors import TokenEndpointError, TokenEndpointTimeout
from ..telemetry import switch as traces
from .client_assertion import ASSERTION_TYPE, client_assertion
from .tokens import MIN_LIFETIME, Token

MAX_RESPONSE_BYTES: Final = 64 * 1024
MAX_TOKEN_CHARS: Final = 16 * 1024
MAX_LIFETIME: Final = 86400.0  # a longer expires_in is cut to a day: renewing early is harmless
MAX_SCOPE_CHARS: Final = 4096
_HEADER_SAFE: Final = re.compile(r"[\x21-\x7e]+")  # visible ASCII: no space, CR, LF, NUL, DEL
TOKEN_TIMEOUT: Final = 10.0
_FORM: Final = "application/x-www-form-urlencoded"


@dataclass(frozen=True, slots=True)
class TokenRequest:
    url: str
    headers: dict[str, str]
    body: str


def build_token_request(spec: LoginSpec, token_url: str, credential: str | None, *,
                        issuer: str | None = None, grant_type: str = "client_credentials",
                        params: dict[str, str] | None = None, now: float | None = None) -> TokenRequest:
    """The POST a login sends: client credentials by default, or `grant_type` with its own
    `params` (a refresh token, an authorization code, a device code). `credential` is the client
    secret, the private key (PEM) for private_key_jwt, or None for a public client
    (`auth_method = "none"`). A private_key_jwt assertion is addressed to `issuer` (the
    authorization server's issuer, RFC 7523 and the MCP spec) when known, else the token URL."""
    form: dict[str, str] = {"grant_type": grant_type}
    if spec.scope and grant_type in ("client_credentials", "refresh_token"):
        form["scope"] = spec.scope
    if spec.resource:
        form["resource"] = spec.resource
    if spec.audience:
        form["audience"] = spec.audience
    form.update(params or {})
    return authenticated_request(spec, token_url, credential, form, issuer=issuer, now=now)


def authenticated_request(spec: LoginSpec, url: str, credential: str | None, form: dict[str, str], *,
                          issuer: str | None = None, now: float | None = None) -> TokenRequest:
    """A form POST to an endpoint of the authorization server (token, device authorization,
    revocation) with the client's authentication added (RFC 6749 §2.3, RFC 7523 §2.2)."""
    form = dict(form)
    headers = {"Content-Type": _FORM, "Accept": "application/json", "Accept-Encoding": "identity"}
    if spec.auth_method == "private_key_jwt":
        assertion = client_assertion(credential or "", spec.client_id, issuer or url,
                                     time.time() if now is None else now, secrets.token_urlsafe(24),
                                     spec.signing_alg)
        form.update(client_id=spec.client_id, client_assertion_type=ASSERTION_TYPE,
                    client_assertion=assertion)
        return TokenRequest(url, headers, urlencode(form))
    if spec.auth_method == "none" or credential is None:
        form["client_id"] = spec.client_id
        return TokenRequest(url, headers, urlencode(form))
    method: Any = _client_secret_basic if spec.auth_method == "client_secret_basic" else spec.auth_method
    auth = ClientAuth(spec.client_id, credential, method)
    _, out, body = auth.prepare("POST", url, headers, urlencode(form))
    return TokenRequest(url, dict(out), body)


def _client_secret_basic(auth: Any, method: str, uri: str, headers: dict[str, str],
                         body: str) -> tuple[str, dict[str, str], str]:
    """RFC 6749 §2.3.1: form-encode id and secret before base64 (authlib's encoder does not, and a
    secret with ':', '%' or '+' would then reach the server changed)."""
    pair = f"{quote_plus(auth.client_id)}:{quote_plus(auth.client_secret)}"
    headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    return uri, headers, body


def oauth_error(status: int, data: Any) -> TokenEndpointError:
    code = data.get("error") if isinstance(data, dict) else None
    if isinstance(code, str) and code.isascii() and 0 < len(code) <= 64 and code.replace("_", "").isalnum():
        return TokenEndpointError(f"token endpoint refused the login (HTTP {status}, {code})", code)
    return TokenEndpointError(f"token endpoint answered HTTP {status} without an OAuth error code",
                              "server_error" if status >= 500 else "invalid_response")


def parse_token_response(status: int, content_type: str, body: bytes, now: float,
                         default_expires_in: float, extras: dict[str, str] | None = None) -> Token:
    """A Token from the endpoint's answer, or TokenEndpointError. Never quotes the body. With
    `extras`, a usable `refresh_token` of the answer is put there (and registered with the
    redactor)."""
    if 300 <= status < 400:
        raise TokenEndpointError(f"token endpoint answered a redirect (HTTP {status}); "
                                 "redirects are not followed", "unexpected_redirect")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        if status >= 400:
            raise oauth_error(status, None) from None
        raise TokenEndpointError(f"token endpoint answered HTTP {status} with a body that is not "
                                 "JSON", "invalid_response") from None
    if status != 200:
        raise oauth_error(status, data)
    if not isinstance(data, dict):
        raise TokenEndpointError("token response is not a JSON object", "invalid_response")
    token = data.get("access_token")
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not _HEADER_SAFE.fullmatch(token):
        # a token with CR/LF or other control characters must never reach a header
        raise TokenEndpointError("token response has no usable access_token", "invalid_response")
    token_type = data.get("token_type", "Bearer")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise TokenEndpointError("token response has an unsupported token_type (want Bearer)",
                                 "invalid_response")
    lifetime = _lifetime(data.get("expires_in"), default_expires_in)
    expires_at = now + lifetime
    if (jwt_exp := _jwt_expiry(token)) is not None and jwt_exp < expires_at:
        expires_at = jwt_exp  # the token's own exp is the truth; expires_in is rounded, and late
    if expires_at - now < MIN_LIFETIME:
        # it could not be handed out long enough to use: refused, so it is retried with backoff
        raise TokenEndpointError("token response carries a token that expires within a second or has "
                                 "expired", "invalid_response")
    scope = data.get("scope")
    if not isinstance(scope, str) or len(scope) > MAX_SCOPE_CHARS or not scope.isprintable():
        scope = None
    REDACTOR.add(token)  # only a token that will be served
    refresh = data.get("refresh_token")
    if extras is not None and isinstance(refresh, str) and len(refresh) <= MAX_TOKEN_CHARS \
            and _HEADER_SAFE.fullmatch(refresh):
        REDACTOR.add(refresh)
        extras["refresh_token"] = refresh
    return Token(token, "Bearer", now, expires_at, scope, fingerprint(token))


def _lifetime(expires_in: Any, default: float) -> float:
    """Seconds the token lives: `expires_in` (a number or a numeric string), else `default`; it
    must be finite and positive, and is cut to MAX_LIFETIME."""
    invalid = TokenEndpointError("token response has an invalid expires_in", "invalid_response")
    if expires_in is None:
        lifetime = default
    elif isinstance(expires_in, bool) or not isinstance(expires_in, int | float | str):
        raise invalid
    elif isinstance(expires_in, int):
        lifetime = float(min(expires_in, int(MAX_LIFETIME)))  # an int may be beyond any float
    else:
        try:
            lifetime = float(expires_in)
        except ValueError:
            raise invalid from None
    if not math.isfinite(lifetime) or lifetime <= 0:
        raise invalid
    return min(lifetime, MAX_LIFETIME)


def _jwt_expiry(token: str) -> float | None:
    """The `exp` of a JWT access token (RFC 9068), unverified: only ever used to expire a
    token sooner than `expires_in` says, never later."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, RecursionError):
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return None
    try:
        value = float(exp)
    except OverflowError:  # an int beyond any float: far in the future, so it shortens nothing
        return None
    return value if math.isfinite(value) else None


def prepare() -> None:
    """Import ahead what the first token request would otherwise import on the event loop while
    a caller waits: httpx imports httpcore when it builds its first transport (and httpcore
    imports trio when it is installed), and httpcore's first request loads anyio's asyncio backend
    for its locks and events. 0.1-0.3 s of a cold sidecar's first login (bench/status_quo.py).
    Imports only: safe in a worker thread."""
    import anyio._backends._asyncio  # noqa: F401  (what anyio imports for the asyncio backend)
    import httpcore  # noqa: F401


async def send_token_request(http: httpx.AsyncClient, request: TokenRequest, now: float,
                             default_expires_in: float, timeout: float = TOKEN_TIMEOUT,
                             extras: dict[str, str] | None = None) -> Token:
    """POST the request; read at most MAX_RESPONSE_BYTES; parse. No redirects are followed."""
    status, content_type, body = await post_form(http, request, timeout)
    return parse_token_response(status, content_type, body, now, default_expires_in, extras)


async def post_form(http: httpx.AsyncClient, request: TokenRequest,
                    timeout: float = TOKEN_TIMEOUT) -> tuple[int, str, bytes]:
    """POST a token request (or any form to the authorization server); its status, content type
    and body, at most MAX_RESPONSE_BYTES of it. No redirects are followed; errors never quote what
    was sent."""
    if traces.tracer is not None:  # traces on: the request in a span, its context sent along
        return await traces.tracer.token_fetch(request.url,
                                               lambda carrier: _post(http, request, timeout, carrier))
    return await _post(http, request, timeout)


async def _post(http: httpx.AsyncClient, request: TokenRequest, timeout: float,
                carrier: Mapping[str, str] | None = None) -> tuple[int, str, bytes]:
    headers = {**request.headers, **carrier} if carrier else request.headers
    try:
        async with http.stream("POST", request.url, headers=headers,
                               content=request.body.encode(), follow_redirects=False,
                               timeout=timeout) as response:
            if response.headers.get("content-encoding", "identity").lower() != "identity":
                # decoding is not bounded per chunk: a small gzip body can expand a thousandfold
                raise TokenEndpointError("token endpoint answered with a compressed body", "invalid_response")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    raise TokenEndpointError(
                        f"token response larger than {MAX_RESPONSE_BYTES} bytes", "response_too_large")
                chunks.append(chunk)
            return response.status_code, response.headers.get("content-type", ""), b"".join(chunks)
    except httpx.TimeoutException:
        raise TokenEndpointTimeout(f"token endpoint did not answer within {timeout:g}s") from None
    except httpx.HTTPError as exc:
        raise TokenEndpointError(f"token endpoint unreachable ({type(exc).__name__})",
                                 "temporarily_unavailable") from None
    except httpx.InvalidURL:
        raise TokenEndpointError("token URL cannot be requested (InvalidURL)", "invalid_token_url") from None
