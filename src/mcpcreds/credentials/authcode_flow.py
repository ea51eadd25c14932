"""The authorization code grant with PKCE (RFC 6749 §4.1, RFC 7636 S256, RFC 8252 loopback
redirect), pure: the verifier and challenge, the authorization URL, and the redirect's check
(exact `state`, the `iss` of RFC 9207 when sent). The loopback listener is in login_flow.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from ..core.secret import REDACTOR
from ..errors import TokenEndpointError
from .login_store import (
    MAX_CLIENT_ID_CHARS,
    MAX_SECRET_CHARS,
    REGISTERED_AUTH_METHODS,
    Registration,
    visible_ascii,
)

CALLBACK_PATH: Final = "/callback"
MAX_CODE_CHARS: Final = 2048


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """One authorization attempt: what goes into the URL, and what the redirect must match."""

    url: str
    state: str
    verifier: str
    redirect_uri: str
    # the issuer the request was sent to (RFC 9207: the redirect's `iss` must be exactly it), and
    # whether its metadata says it always sends `iss` (then a redirect without one is refused)
    issuer: str | None = None
    iss_required: bool = False

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
                          verifier: str | None = None, issuer: str | None = None,
                          iss_required: bool = False) -> AuthRequest:
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
                       redirect_uri, issuer, iss_required and issuer is not None)


def code_from_redirect(query: str, request: AuthRequest) -> str:
    """The code of the redirect's query, after an exact `state` check and RFC 9207's `iss` check:
    the `iss` sent must be exactly the issuer the request went to (a simple string comparison, no
    normalising), and one is required when that server's metadata says it sends it. A redirect
    whose `iss` fails is refused before its `error` is read (it may be an attacker's). The
    caller's strings are never echoed in an error."""
    params = parse_qs(query, keep_blank_values=True, max_num_fields=32)
    states = params.get("state", [])
    if len(states) != 1 or not hmac.compare_digest(states[0].encode(), request.state.encode()):
        raise TokenEndpointError("the redirect's state does not match this login's (a forged or stale "
                                 "redirect); nothing was redeemed", "invalid_state")
    issuers = params.get("iss", [])
    if request.issuer is not None and issuers and (len(issuers) != 1 or issuers[0] != request.issuer):
        raise TokenEndpointError("the redirect names another issuer (RFC 9207); nothing was redeemed",
                                 "invalid_issuer")
    if request.iss_required and not issuers:
        raise TokenEndpointError("the redirect carries no iss though the authorization server says it "
                                 "always sends one (RFC 9207); nothing was redeemed", "invalid_issuer")
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


# ---------------------------------------------------------------------------- Client ID Metadata Documents


def is_metadata_document_url(client_id: str) -> bool:
    """Whether a configured client_id is a Client ID Metadata Document URL (the MCP spec, and
    draft-ietf-oauth-client-id-metadata-document-00 §3): https, with a path component, no
    fragment, no user or password, no dot segments."""
    parts = urlsplit(client_id)
    try:
        user, password = parts.username, parts.password
    except ValueError:
        return False
    segments = parts.path.split("/")
    return (parts.scheme == "https" and bool(parts.hostname) and parts.path not in ("", "/")
            and not parts.fragment and "#" not in client_id and user is None and password is None
            and "." not in segments and ".." not in segments)


def may_register(client_id: str) -> bool:
    """Whether a login configured with this client_id may end up as a client mcpcreds registered
    (RFC 7591): none configured, or a metadata document URL the server does not take."""
    return not client_id or is_metadata_document_url(client_id)


def uses_metadata_document(client_id: str, cimd_supported: bool, can_register: bool) -> bool:
    """Whether a login uses its configured client_id as is (rather than registering): always
    for a pre-registered one; a metadata document URL when the server advertises
    `client_id_metadata_document_supported`, or offers no registration to fall back on (it may
    know the URL as a pre-registered client id). The MCP spec's order: pre-registered, then a
    metadata document when supported, then dynamic registration."""
    if not client_id:
        return False
    return not is_metadata_document_url(client_id) or cimd_supported or not can_register


# ---------------------------------------------------------------------------- dynamic client registration

REGISTRATION_PREFERENCE: Final = ("none", "client_secret_basic", "client_secret_post")
MAX_REGISTRATION_BYTES: Final = 64 * 1024
CLIENT_NAME: Final = "mcpcreds"


def registration_method(supported: tuple[str, ...]) -> str:
    """The token endpoint authentication to register with (RFC 7591 §2): a public client
    (`none`) when the server takes one, else a client secret, in the header before the form."""
    for method in REGISTRATION_PREFERENCE:
        if method in supported:
            return method
    raise TokenEndpointError("the authorization server supports no token endpoint authentication a "
                             "registered person's client can use (none, client_secret_basic, "
                             "client_secret_post)", "unsupported_auth_method")


def registration_body(redirect_uri: str, method: str) -> str:
    """The RFC 7591 registration request: a native client with a loopback redirect URI."""
    return json.dumps({"client_name": CLIENT_NAME, "redirect_uris": [redirect_uri],
                       "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
                       "token_endpoint_auth_method": method, "application_type": "native"})


def parse_registration(status: int, body: bytes, requested: str, issuer: str,
                       redirect_uri: str) -> Registration:
    """The registered client of the server's answer (RFC 7591 §3.2.1), validated and bounded; an
    error never quotes the answer. The method is the one the answer names, else the one asked
    for; a secret with method `none` is dropped, a secret method without a secret refused."""
    try:
        data = json.loads(body) if len(body) <= MAX_REGISTRATION_BYTES else None
    except (ValueError, RecursionError):
        data = None
    if status >= 400:
        code = data.get("error") if isinstance(data, dict) else None
        if not (isinstance(code, str) and code.isascii() and 0 < len(code) <= 64
                and code.replace("_", "").isalnum()):
            code = "invalid_response"
        raise TokenEndpointError(f"the authorization server refused the client registration "
                                 f"(HTTP {status}, {code})", code)
    if status not in (200, 201) or not isinstance(data, dict):
        raise TokenEndpointError(f"the client registration answered HTTP {status} without a JSON object",
                                 "invalid_response")
    client_id, secret, method = data.get("client_id"), data.get("client_secret"), data.get(
        "token_endpoint_auth_method", requested)
    if not visible_ascii(client_id, MAX_CLIENT_ID_CHARS):
        raise TokenEndpointError("the client registration has no usable client_id", "invalid_response")
    if method not in REGISTERED_AUTH_METHODS:
        raise TokenEndpointError("the client registration names a token endpoint authentication "
                                 "mcpcreds does not use", "invalid_response")
    if method == "none":
        secret = None
    elif not visible_ascii(secret, MAX_SECRET_CHARS):
        raise TokenEndpointError("the client registration has no usable client_secret for its "
                                 "token endpoint authentication", "invalid_response")
    if secret is not None:
        REDACTOR.add(secret)
    return Registration(issuer, client_id, method, secret, redirect_uri)


def loopback_port(redirect_uri: str) -> int | None:
    """The port of a redirect URI mcpcreds registered (`http://127.0.0.1:PORT/callback`)."""
    parts = urlsplit(redirect_uri)
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or parts.hostname != "127.0.0.1" or parts.path != CALLBACK_PATH or not port:
        return None
    return port
