"""AWS IAM Identity Center (SSO) for `auth = { kind = "aws", source = "sso" }`: what `aws sso
login` does, with the tokens in the keyring.

- `mcpcreds login NAME` registers a public OIDC client (`RegisterClient`, scope
  `sso:account:access`), starts a device authorization at `sso_start_url`
  (`StartDeviceAuthorization`), prints the verification URI and user code, and polls `CreateToken`
  (RFC 8628's rules: `interval`, `authorization_pending`, `slow_down`, expiry). The SSO access token,
  its refresh token and the client are stored in the keyring entry of the cache key
  (`login.<key>`, never a file the config names).
- The sidecar asks `GetRoleCredentials` (the portal, `x-amz-sso_bearer_token`) for `sso_role_name`
  in `sso_account_id`; the SSO access token is renewed from the refresh token 5 minutes before it
  expires (a rotated refresh token is stored before the new access token is used). No login, a
  refused refresh token or a refused access token: `login_required` naming the command.
- Every answer is bounded (64 KiB), uncompressed (`Accept-Encoding: identity`; a compressed one
  is refused, never decoded) and checked; tokens and secrets are given to the redactor and
  never appear in an error.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TextIO
from urllib.parse import urlencode

import httpx

from ..config.aws import AwsAuth
from ..core.secret import REDACTOR
from ..credentials.device_flow import DeviceAuthorization, PollSchedule
from ..credentials.login_store import entry_name
from ..credentials.sources import KeyringSource
from ..errors import LoginRequired, TokenEndpointError
from ..net.egress_http import UnreadableAnswer, read_answer
from .aws_credentials import IDENTITY, AwsCredentials, AwsCredentialsError, checked_credentials

DEVICE_GRANT: Final = "urn:ietf:params:oauth:grant-type:device_code"
MAX_ANSWER: Final = 64 * 1024
RENEW_AHEAD: Final = 300.0
TIMEOUT: Final = httpx.Timeout(10.0)
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SsoLogin:
    """What the keyring keeps for an SSO login."""

    client_id: str
    client_secret: str
    client_expires_at: float
    access_token: str
    expires_at: float
    refresh_token: str | None

    def __repr__(self) -> str:
        return f"SsoLogin(client_id={self.client_id[:6]}..., expires_at={self.expires_at})"

    def to_json(self) -> str:
        return json.dumps({"v": 1, "kind": "aws-sso", "client_id": self.client_id,
                           "client_secret": self.client_secret, "client_expires_at": self.client_expires_at,
                           "access_token": self.access_token, "expires_at": self.expires_at,
                           "refresh_token": self.refresh_token})

    @classmethod
    def from_json(cls, text: str) -> SsoLogin | None:
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("kind") != "aws-sso":
            return None
        strings = [data.get(k) for k in ("client_id", "client_secret", "access_token")]
        numbers = [data.get(k) for k in ("client_expires_at", "expires_at")]
        refresh = data.get("refresh_token")
        if not all(isinstance(v, str) and v for v in strings) or not isinstance(refresh, str | None) \
                or not all(isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n)
                           for n in numbers):
            return None
        for secret in (data["client_secret"], data["access_token"], refresh):
            if secret:
                REDACTOR.add(secret)
        return cls(data["client_id"], data["client_secret"], float(data["client_expires_at"]),
                   data["access_token"], float(data["expires_at"]), refresh)


def login_required(name: str, why: str) -> LoginRequired:
    command = f"mcpcreds login {name}"
    return LoginRequired(f"aws sso: {why}; run `{command}`", command=command)


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A JSON POST to the SSO OIDC service: the status and the JSON object answered."""
    try:
        async with http.stream("POST", url, json=body, headers=IDENTITY, timeout=TIMEOUT,
                               follow_redirects=False) as response:
            raw = await read_answer(response, MAX_ANSWER)
            return response.status_code, _object(response.status_code, raw)
    except UnreadableAnswer as exc:
        raise TokenEndpointError(f"aws sso: an answer {exc}", "invalid_response") from None
    except httpx.HTTPError as exc:
        raise TokenEndpointError(f"aws sso: {url} could not be reached ({type(exc).__name__})",
                                 "temporarily_unavailable") from None


def _object(status: int, raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise TokenEndpointError(f"aws sso: HTTP {status}, not a JSON object", "invalid_response")
    return data


def _string(data: dict[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value or len(value) > 8192 or not value.isprintable():
        raise TokenEndpointError(f"aws sso: the {what} answer has no usable {key}", "invalid_response")
    return value


def _seconds(data: dict[str, Any], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return float(min(max(value, 1), 86400 * 90))


def _error(data: dict[str, Any]) -> str:
    error = data.get("error")
    return error if isinstance(error, str) and error.isprintable() and len(error) <= 64 else "invalid_request"


async def login(http: httpx.AsyncClient, auth: AwsAuth, name: str, out: TextIO,
                sleep: Sleep = asyncio.sleep, clock: Callable[[], float] = time.monotonic) -> SsoLogin:
    """The device authorization of `aws sso login`: the login to store."""
    oidc = auth.sso_oidc_url
    status, client = await _post(http, f"{oidc}/client/register", {
        "clientName": f"mcpcreds-{name}", "clientType": "public", "scopes": ["sso:account:access"]})
    if status != 200:
        raise TokenEndpointError(f"aws sso: RegisterClient failed (HTTP {status}, {_error(client)})",
                                 _error(client))
    client_id = _string(client, "clientId", "RegisterClient")
    secret = _string(client, "clientSecret", "RegisterClient")
    REDACTOR.add(secret)
    status, start = await _post(http, f"{oidc}/device_authorization", {
        "clientId": client_id, "clientSecret": secret, "startUrl": auth.sso_start_url})
    if status != 200:
        raise TokenEndpointError(f"aws sso: StartDeviceAuthorization failed (HTTP {status}, {_error(start)})",
                                 _error(start))
    device = DeviceAuthorization(_string(start, "deviceCode", "StartDeviceAuthorization"),
                                 _string(start, "userCode", "StartDeviceAuthorization"),
                                 _string(start, "verificationUri", "StartDeviceAuthorization"),
                                 start.get("verificationUriComplete") if isinstance(
                                     start.get("verificationUriComplete"), str) else None,
                                 _seconds(start, "expiresIn", 600), _seconds(start, "interval", 5))
    out.write(f"To log in to {name} (AWS IAM Identity Center), open {device.verification_uri} and enter "
              f"the code {device.user_code}\n")
    if device.verification_uri_complete:
        out.write(f"(or open {device.verification_uri_complete})\n")
    out.write(f"Waiting for the approval (the code expires in {device.expires_in:.0f}s)...\n")
    out.flush()
    schedule = PollSchedule(clock(), device)
    at = schedule.first()
    while True:
        await sleep(max(0.0, at - clock()))
        status, token = await _post(http, f"{oidc}/token", {
            "clientId": client_id, "clientSecret": secret, "grantType": DEVICE_GRANT,
            "deviceCode": device.device_code})
        if status == 200:
            expires = _seconds(client, "clientSecretExpiresAt", 0)
            return _stored(token, client_id, secret, expires, time.time())
        at = schedule.after(_error(token), clock())


def _stored(token: dict[str, Any], client_id: str, secret: str, client_expires_at: float,
            now: float, previous: str | None = None) -> SsoLogin:
    access = _string(token, "accessToken", "CreateToken")
    refresh = token.get("refreshToken", previous)
    if refresh is not None and not isinstance(refresh, str):
        refresh = previous
    REDACTOR.add(access)
    if refresh:
        REDACTOR.add(refresh)
    return SsoLogin(client_id, secret, client_expires_at, access, now + _seconds(token, "expiresIn", 3600),
                    refresh or None)


async def renew(http: httpx.AsyncClient, auth: AwsAuth, name: str, stored: SsoLogin, now: float) -> SsoLogin:
    """A new SSO access token from the refresh token (CreateToken, grant refresh_token)."""
    if stored.refresh_token is None or (stored.client_expires_at and stored.client_expires_at <= now):
        raise login_required(name, "the SSO session expired and cannot be renewed")
    status, token = await _post(http, f"{auth.sso_oidc_url}/token", {
        "clientId": stored.client_id, "clientSecret": stored.client_secret, "grantType": "refresh_token",
        "refreshToken": stored.refresh_token})
    if status == 200:
        return _stored(token, stored.client_id, stored.client_secret, stored.client_expires_at, now,
                       stored.refresh_token)
    if _error(token) in ("invalid_grant", "expired_token", "access_denied", "unauthorized_client"):
        raise login_required(name, f"the SSO session was refused ({_error(token)})")
    raise TokenEndpointError(f"aws sso: renewing the SSO token failed (HTTP {status}, {_error(token)})",
                             _error(token))


async def role_credentials(http: httpx.AsyncClient, auth: AwsAuth, name: str,
                           access_token: str) -> AwsCredentials:
    """GetRoleCredentials for the configured account and role."""
    query = urlencode({"role_name": auth.sso_role_name, "account_id": auth.sso_account_id})
    try:
        async with http.stream("GET", f"{auth.sso_portal_url}/federation/credentials?{query}",
                               headers={"x-amz-sso_bearer_token": access_token, **IDENTITY}, timeout=TIMEOUT,
                               follow_redirects=False) as response:
            status = response.status_code
            raw = await read_answer(response, MAX_ANSWER) if status == 200 else b""
    except UnreadableAnswer as exc:
        raise AwsCredentialsError(f"aws sso: the portal's answer is {exc}") from None
    except httpx.HTTPError as exc:
        raise AwsCredentialsError(f"aws sso: the portal could not be reached ({type(exc).__name__})"
                                  ) from None
    if status in (401, 403):
        raise login_required(name, f"the portal refused the SSO token (HTTP {status})")
    if status != 200:
        raise AwsCredentialsError(f"aws sso: GetRoleCredentials failed (HTTP {status})")
    try:
        creds = _object(status, raw).get("roleCredentials")
        if not isinstance(creds, dict):
            raise ValueError("no roleCredentials")
        expiration = creds.get("expiration")
        if isinstance(expiration, bool) or not isinstance(expiration, int | float) \
                or not math.isfinite(expiration):
            raise ValueError("no expiration")
        key_id, secret, session = creds["accessKeyId"], creds["secretAccessKey"], creds.get("sessionToken")
        if not isinstance(key_id, str) or not isinstance(secret, str) or not isinstance(session, str | None):
            raise ValueError("not strings")
    except (ValueError, KeyError, TokenEndpointError):
        raise AwsCredentialsError("aws sso: the role credentials are not usable (not the expected JSON "
                                  "document)") from None
    return checked_credentials("sso", key_id, secret, session, float(expiration) / 1000.0)


async def from_sso(auth: AwsAuth, name: str, key: str, http: httpx.AsyncClient, keyring: KeyringSource,
                   now: Callable[[], float]) -> AwsCredentials:
    """The role credentials of a stored SSO login, its token renewed first when it is due."""
    entry = entry_name(key)
    text = await asyncio.to_thread(keyring.get, entry)
    stored = SsoLogin.from_json(text) if text is not None else None
    if stored is None:
        raise login_required(name, "no SSO login stored")
    if stored.expires_at - now() < RENEW_AHEAD:
        renewed = await renew(http, auth, name, stored, now())
        # write-then-use: a rotated refresh token is kept before the new access token is used
        await asyncio.to_thread(keyring.set, entry, renewed.to_json())
        stored = renewed
    return await role_credentials(http, auth, name, stored.access_token)


