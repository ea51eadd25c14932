"""AWS credentials for SigV4 (`auth = { kind = "aws", source = ... }`), held in the sidecar only.

- `env`: botocore's `EnvProvider` over the sidecar's environment (`AWS_ACCESS_KEY_ID`,
  `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), read again after `secrets.cache_ttl`.
- `static`: the config's templates, rendered by the secret resolver (so `{{secret:...}}` comes
  from the env, the keyring or a credentials folder), read again after `secrets.cache_ttl`.
- `imds`: IMDSv2 through the server's egress policy: `PUT /latest/api/token` (with
  `X-aws-ec2-metadata-token-ttl-seconds`), then, with `X-aws-ec2-metadata-token`, `GET
  /latest/meta-data/iam/security-credentials/` (the role) and `GET .../<role>` (the keys and their
  `Expiration`). Short timeouts, bounded answers (never quoted in errors). The credentials are
  renewed `REFRESH_AHEAD` (at most half their life) before they expire, one fetch at a time; a
  renewal that fails while the held ones are still valid keeps them (logged), an expired set is
  never used.
- `web_identity`: STS `AssumeRoleWithWebIdentity` (the query protocol: a form POST, an XML
  answer, bounded, any DTD refused) with the OIDC token read from `web_identity_token_file` at each
  renewal, through the server's egress policy; renewed like `imds`.

Every secret access key and session token obtained is handed to the redactor; errors name the
source and what failed, never a value. Every fetch asks for `Accept-Encoding: identity` and
refuses a compressed answer (`net.egress_http.read_answer`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Final

import httpx

from ..config.aws import EXTRA_HINT, AwsAuth
from ..core.logs import get_logger
from ..core.secret import REDACTOR
from ..core.templates import Template
from ..errors import McpcredsError, SecretUnavailable
from ..net.egress_http import UnreadableAnswer, read_answer

_log = get_logger("aws")
REFRESH_AHEAD: Final = 300.0  # renew expiring credentials this long before expiry (at most half their life)
IMDS_TOKEN_TTL: Final = 21600  # seconds asked for the IMDSv2 session token
IMDS_TIMEOUT: Final = httpx.Timeout(2.0, connect=1.0)
MAX_IMDS_ANSWER: Final = 16384
IDENTITY: Final = {"Accept-Encoding": "identity"}
_ROLE: Final = re.compile(r"[\w+=,.@-]{1,128}\Z")
_KEY_ID: Final = re.compile(r"[A-Z0-9]{16,128}\Z")


class AwsCredentialsError(McpcredsError):
    """No usable AWS credentials (names the source and what failed, never a value)."""

    code: ClassVar[str] = "aws_credentials_unavailable"
    status: ClassVar[int] = 503


@dataclass(frozen=True, slots=True)
class AwsCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None
    expires_at: float | None  # wall clock; None: does not expire

    def __repr__(self) -> str:  # never the secret, whatever prints it
        return f"AwsCredentials(access_key_id={self.access_key_id[:4]}..., expires_at={self.expires_at})"


def botocore_required() -> None:
    try:
        import botocore  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        raise AwsCredentialsError(f"SigV4 signing needs botocore, an optional extra: {EXTRA_HINT}") from None


def checked_credentials(source: str, key_id: str, secret: str, token: str | None,
             expires_at: float | None) -> AwsCredentials:
    if not _KEY_ID.match(key_id) or not secret or len(secret) > 256 or not secret.isprintable() \
            or (token is not None and (len(token) > 8192 or not token.isprintable())):
        raise AwsCredentialsError(f"aws: the credentials from source {source!r} are malformed")
    REDACTOR.add(secret, owner=f"aws:{source}:secret")
    if token:
        REDACTOR.add(token, owner=f"aws:{source}:token")
    return AwsCredentials(key_id, secret, token or None, expires_at)


def from_env(environ: os._Environ[str] | dict[str, str] | None = None) -> AwsCredentials:
    """botocore's environment provider (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ...)."""
    botocore_required()
    from botocore.credentials import EnvProvider  # type: ignore[import-untyped]

    try:
        loaded = EnvProvider(environ=environ if environ is not None else os.environ).load()
    except Exception as exc:  # botocore's own errors may quote what it read: never passed on
        raise AwsCredentialsError("aws: the environment's credentials are incomplete: AWS_ACCESS_KEY_ID and "
                                  f"AWS_SECRET_ACCESS_KEY must both be set ({type(exc).__name__})") from None
    if loaded is None:
        raise AwsCredentialsError("aws: source = \"env\" but AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                                  "are not set in the sidecar's environment")
    frozen = loaded.get_frozen_credentials()
    return checked_credentials("env", frozen.access_key, frozen.secret_key, frozen.token, None)


def from_static(auth: AwsAuth, render: Callable[[Template], str]) -> AwsCredentials:
    assert auth.access_key_id is not None and auth.secret_access_key is not None
    try:
        key_id = render(auth.access_key_id)
        secret = render(auth.secret_access_key)
        token = render(auth.session_token) if auth.session_token is not None else None
    except SecretUnavailable:
        raise
    except McpcredsError as exc:
        raise AwsCredentialsError(f"aws: the static credentials cannot be resolved ({exc.code})") from None
    return checked_credentials("static", key_id.strip(), secret.strip(),
                               token.strip() if token else None, None)


def _parse_expiration(text: object) -> float:
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError("no Expiration")
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def _imds_call(http: httpx.AsyncClient, method: str, url: str, headers: dict[str, str],
                     what: str) -> bytes:
    try:
        async with http.stream(method, url, headers={**headers, **IDENTITY}, timeout=IMDS_TIMEOUT,
                               follow_redirects=False) as response:
            if response.status_code != 200:
                raise AwsCredentialsError(f"aws: the instance metadata service answered the {what} with "
                                          f"HTTP {response.status_code}")
            return await read_answer(response, MAX_IMDS_ANSWER)
    except UnreadableAnswer as exc:
        raise AwsCredentialsError(f"aws: the instance metadata service's answer to the {what} is {exc}") \
            from None
    except httpx.HTTPError as exc:
        raise AwsCredentialsError(f"aws: the instance metadata service could not be reached for the {what} "
                                  f"({type(exc).__name__})") from None


async def from_imds(auth: AwsAuth, http: httpx.AsyncClient) -> AwsCredentials:
    """IMDSv2: a session token first (PUT), then the role's credentials with it."""
    base = auth.imds_endpoint
    token = (await _imds_call(http, "PUT", f"{base}/latest/api/token",
                              {"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL)},
                              "token request")).decode("ascii", "replace").strip()
    if not token or len(token) > 4096 or not token.isprintable():
        raise AwsCredentialsError("aws: the instance metadata service gave no usable IMDSv2 token")
    with_token = {"X-aws-ec2-metadata-token": token}
    listing = (await _imds_call(http, "GET", f"{base}/latest/meta-data/iam/security-credentials/",
                                with_token, "role lookup")).decode("ascii", "replace").split()
    role = listing[0] if listing else ""
    if not _ROLE.match(role):
        raise AwsCredentialsError("aws: the instance has no IAM role (the metadata service names none)")
    raw = await _imds_call(http, "GET", f"{base}/latest/meta-data/iam/security-credentials/{role}",
                           with_token, "credentials request")
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("Code", "Success") != "Success":
            raise ValueError("not Success")
        key_id, secret, session = data["AccessKeyId"], data["SecretAccessKey"], data.get("Token")
        if not isinstance(key_id, str) or not isinstance(secret, str) \
                or not isinstance(session, str | None):
            raise ValueError("not strings")
        expires = _parse_expiration(data.get("Expiration"))
    except (ValueError, KeyError, TypeError):
        raise AwsCredentialsError("aws: the instance metadata service's credentials are not usable "
                                  "(not the expected JSON document)") from None
    return checked_credentials("imds", key_id, secret, session, expires)


MAX_TOKEN_FILE: Final = 16384
MAX_STS_ANSWER: Final = 65536
STS_TIMEOUT: Final = httpx.Timeout(10.0, connect=5.0)
_STS_NS: Final = "{https://sts.amazonaws.com/doc/2011-06-15/}"


def _read_token_file(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_TOKEN_FILE + 1)
    except OSError as exc:
        raise AwsCredentialsError(f"aws: cannot read web_identity_token_file {path} ({exc.strerror})") \
            from None
    if len(data) > MAX_TOKEN_FILE:
        raise AwsCredentialsError(f"aws: web_identity_token_file {path} is larger than {MAX_TOKEN_FILE} "
                                  "bytes")
    token = data.decode("ascii", "replace").strip()
    if not token or not token.isprintable():
        raise AwsCredentialsError(f"aws: web_identity_token_file {path} holds no token")
    return token


def _sts_credentials(raw: bytes) -> tuple[str, str, str, float]:
    """(key id, secret, session token, expiration) from an AssumeRoleWithWebIdentity answer (XML,
    the query protocol's; a document type declaration, hence any entity, is refused)."""
    import xml.etree.ElementTree as ET

    if b"<!DOCTYPE" in raw.upper() or b"<!ENTITY" in raw.upper():
        raise ValueError("a DTD")
    root = ET.fromstring(raw)
    found = root.find(f"{_STS_NS}AssumeRoleWithWebIdentityResult/{_STS_NS}Credentials")
    if found is None:
        raise ValueError("no Credentials")
    fields = {child.tag.removeprefix(_STS_NS): (child.text or "").strip() for child in found}
    return (fields["AccessKeyId"], fields["SecretAccessKey"], fields["SessionToken"],
            _parse_expiration(fields["Expiration"]))


async def from_web_identity(auth: AwsAuth, http: httpx.AsyncClient) -> AwsCredentials:
    """STS AssumeRoleWithWebIdentity (an unsigned call: the OIDC token is the proof), with the
    token file read now (a projected token rotates)."""
    assert auth.role_arn is not None and auth.web_identity_token_file is not None
    token = await asyncio.to_thread(_read_token_file, auth.web_identity_token_file)
    form = {"Action": "AssumeRoleWithWebIdentity", "Version": "2011-06-15", "RoleArn": auth.role_arn,
            "RoleSessionName": auth.role_session_name, "WebIdentityToken": token}
    try:
        async with http.stream("POST", auth.sts_url, data=form, headers=IDENTITY, timeout=STS_TIMEOUT,
                               follow_redirects=False) as response:
            raw = await read_answer(response, MAX_STS_ANSWER)
            status = response.status_code
    except UnreadableAnswer as exc:
        raise AwsCredentialsError(f"aws: the STS answer is {exc}") from None
    except httpx.HTTPError as exc:
        raise AwsCredentialsError(f"aws: STS could not be reached ({type(exc).__name__})") from None
    if status != 200:
        code = re.search(rb"<Code>([A-Za-z.]{1,64})</Code>", raw)
        why = f" ({code[1].decode()})" if code else ""
        raise AwsCredentialsError(f"aws: STS refused AssumeRoleWithWebIdentity: HTTP {status}{why}",
                                  status=status)
    try:
        key_id, secret, session, expires = _sts_credentials(raw)
    except (ValueError, KeyError, SyntaxError):  # ParseError is a SyntaxError
        raise AwsCredentialsError("aws: the STS answer holds no usable credentials") from None
    return checked_credentials("web_identity", key_id, secret, session, expires)


class CredentialCache:
    """Credentials per server: held until `cache_ttl` (env, static) or until `REFRESH_AHEAD`
    before they expire (imds); one fetch at a time per server; stale-if-error while valid. A
    refetch forced by an upstream's refusal (`force_refetch`) at most once per cooldown per name."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._held: dict[str, tuple[AwsCredentials, float]] = {}  # name -> (credentials, renew at)
        self._fetching: dict[str, asyncio.Task[AwsCredentials]] = {}
        self._forced_at: dict[str, float] = {}  # name -> when a refusal last dropped its credentials

    def forget(self) -> None:
        self._held.clear()
        self._fetching.clear()

    def drop(self, name: str) -> None:
        self._held.pop(name, None)

    def force_refetch(self, name: str, cooldown: float) -> bool:
        """Drop the held credentials so the next call fetches them again, unless a refusal did so
        less than `cooldown` ago (an upstream that refuses every credential would otherwise cost a
        fetch from STS, IMDS or the SSO portal per request). True when dropped."""
        now = self.clock()
        last = self._forced_at.get(name)
        if last is not None and last <= now < last + cooldown:  # a clock gone back ends the cooldown
            return False
        self._forced_at = {k: t for k, t in self._forced_at.items() if t <= now < t + cooldown}  # bounded
        self._forced_at[name] = now
        self.drop(name)
        return True

    def held(self) -> dict[str, tuple[AwsCredentials, float]]:
        """name -> (the credentials held, when they are renewed)."""
        return dict(self._held)

    async def get(self, name: str, fetch: Callable[[], Awaitable[AwsCredentials]],
                  ttl: float) -> AwsCredentials:
        now = self.clock()
        held = self._held.get(name)
        if held is not None and now < held[1]:
            return held[0]
        task = self._fetching.get(name)
        if task is None or task.done():
            task = asyncio.ensure_future(fetch())
            self._fetching[name] = task
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            fresh = await asyncio.shield(task)
        except McpcredsError as exc:
            if held is not None and held[0].expires_at is not None and now < held[0].expires_at:
                _log.warning("aws credentials renewal failed; the held ones are still valid",
                             extra={"server": name, "error": exc.code, "expires_at": held[0].expires_at})
                self._held[name] = (held[0], min(held[0].expires_at, now + 10.0))
                return held[0]
            raise
        finally:
            if self._fetching.get(name) is task and task.done():
                del self._fetching[name]
        now = self.clock()
        if fresh.expires_at is None:
            renew = now + ttl
        else:
            if fresh.expires_at <= now:
                raise AwsCredentialsError(f"aws: the credentials of server {name!r} are already expired")
            renew = fresh.expires_at - min(REFRESH_AHEAD, (fresh.expires_at - now) / 2)
        self._held[name] = (fresh, renew)
        return fresh
