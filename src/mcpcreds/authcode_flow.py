"""The authorization code grant with PKCE (RFC 6749 §4.1, RFC 7636 S256, RFC 8252 loopback
redirect), pure: the verifier and challenge, the authorization URL, and the redirect's check
(exact `state`, the `iss` of RFC 9207 when sent). The loopback listener is in login_flow.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from .errors import TokenEndpointError

CALLBACK_PATH: Final = "/callback"
MAX_CODE_CHARS: Final = 2048


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """One authorization attempt: what goes into the URL, and what the redirect must match."""

    url: str
    state: str
    verifier: str
    redirect_uri: str

    def __repr__(self) -> str:  # the verifier redeems the code
        return f"AuthRequest(url={self.url!r})"


def new_verifier() -> str:
    """43+ characters of the unreserved set (RFC 7636 §4.1): 32 random bytes, base64url."""
    return secrets.token_urlsafe(32)


def challenge_of(verifier: str) -> str:
    """S256: BASE64URL(SHA256(verifier)) without padding (RFC 7636 §4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def redirect_uri_for(port: int) -> str:
    return f"http://127.0.0.1:{port}{CALLBACK_PATH}"


def authorization_request(endpoint: str, client_id: str, redirect_uri: str, scope: str | None,
                          resource: str | None, state: str | None = None,
                          verifier: str | None = None) -> AuthRequest:
    state = state or secrets.token_urlsafe(24)
    verifier = verifier or new_verifier()
    params = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri,
              "state": state, "code_challenge": challenge_of(verifier), "code_challenge_method": "S256"}
    if scope:
        params["scope"] = scope
    if resource:
        params["resource"] = resource
    parts = urlsplit(endpoint)
    query = f"{parts.query}&{urlencode(params)}" if parts.query else urlencode(params)
    return AuthRequest(urlunsplit((parts.scheme, parts.netloc, parts.path, query, "")), state, verifier,
                       redirect_uri)


def code_from_redirect(query: str, request: AuthRequest, issuer: str | None) -> str:
    """The code of the redirect's query, after an exact `state` check (and `iss`, RFC 9207, when
    the server sends one). The caller's strings are never echoed in an error."""
    params = parse_qs(query, keep_blank_values=True, max_num_fields=32)
    states = params.get("state", [])
    if len(states) != 1 or not hmac.compare_digest(states[0].encode(), request.state.encode()):
        raise TokenEndpointError("the redirect's state does not match this login's (a forged or stale "
                                 "redirect); nothing was redeemed", "invalid_state")
    issuers = params.get("iss", [])
    if issuer is not None and issuers and (len(issuers) != 1 or issuers[0].rstrip("/") != issuer.rstrip("/")):
        raise TokenEndpointError("the redirect names another issuer (RFC 9207); nothing was redeemed",
                                 "invalid_issuer")
    errors = params.get("error", [])
    if errors:
        code = errors[0]
        if not (code.isascii() and 0 < len(code) <= 64 and code.replace("_", "").isalnum()):
            code = "invalid_response"
        raise TokenEndpointError(f"the authorization server refused the login ({code})", code)
    codes = params.get("code", [])
    if len(codes) != 1 or not 0 < len(codes[0]) <= MAX_CODE_CHARS or not codes[0].isprintable():
        raise TokenEndpointError("the redirect carries no usable code", "invalid_response")
    return codes[0]
