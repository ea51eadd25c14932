"""AWS Signature Version 4 for servers with `auth = { kind = "aws", ... }`: botocore's `SigV4Auth`
over an `AWSRequest` (the canonical request is botocore's), with the sidecar's clock, and the
credentials of `aws_credentials` (they never leave the sidecar process).

- Through the gateway, each upstream request (retries included) is signed here: `host`,
  `x-amz-date`, `x-amz-content-sha256` (the SHA-256 of the body the gateway holds) and
  `x-amz-security-token` (session credentials) are added, and every header sent is covered but the
  ones botocore leaves out (`user-agent`, hop-by-hop headers).
- For direct clients, `POST /v1/servers/{name}/sign` takes `{"method", "url", "headers",
  "content_digest"}` (the body's RFC 9530 `sha-256=:...:`, as for AAuth; none: an empty body;
  `UNSIGNED-PAYLOAD` is never signed) and returns the headers to add. The body never
  reaches the sidecar; the URL must be of the server's origin. The session token of temporary
  credentials is in the answer (the request must carry it; it is useless without the secret key,
  which stays here).
- A refusal (400/403) whose AWS error says the credentials are stale or not recognised
  (`aws_refusal`: an expired session token, an unknown key, a signature that does not match) drops
  the held credentials, if they are the ones that signed the request; the gateway then retries
  once, signed with credentials fetched again. Such a forced refetch happens at most once per
  `invalidate_cooldown` per cache key: within it, the refusal is the caller's answer (no retry).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import httpx

from ..config.aws import AwsAuth
from ..config.model import Config, Target, aws_auth_of, is_aws
from ..core.logs import get_logger
from ..core.templates import Template
from ..credentials.login_store import login_store
from ..errors import Forbidden, InvalidRequest
from .aws_credentials import (
    AwsCredentials,
    CredentialCache,
    botocore_required,
    from_env,
    from_imds,
    from_static,
    from_web_identity,
)
from .aws_refusal import MAX_ERROR_BODY, stale_credentials_code
from .aws_sso import from_sso
from .sign_request import parse_sign_request

EMPTY_SHA256: Final = hashlib.sha256(b"").hexdigest()
_DIGEST: Final = re.compile(r"sha-256=:([A-Za-z0-9+/]{43}=):\Z")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}\Z")
_ADDED: Final = ("authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token")
_log = get_logger("sigv4")


def sign(credentials: AwsCredentials, region: str, service: str, method: str, url: str,
         headers: list[tuple[str, str]], payload_sha256: str, when: float,
         content_header: bool = True) -> dict[str, str]:
    """The headers SigV4 adds to the request (`Authorization`, `X-Amz-Date`, and with
    `content_header` `X-Amz-Content-SHA256`; `X-Amz-Security-Token` for session credentials), as
    botocore computes them at the instant `when` (unix seconds)."""
    clocked, AWSRequest, Credentials = _botocore()
    request = AWSRequest(method=method, url=url)
    request.context["timestamp"] = datetime.fromtimestamp(when, UTC).strftime("%Y%m%dT%H%M%SZ")
    for name, value in headers:
        if name.lower() in ("authorization", "x-amz-date", "x-amz-security-token", "date"):
            continue  # set by the signer
        request.headers[name] = value
    if content_header:
        request.headers["X-Amz-Content-SHA256"] = payload_sha256
    creds = Credentials(credentials.access_key_id, credentials.secret_access_key, credentials.session_token)
    clocked(creds, service, region).add_auth(request)
    out = {"Authorization": request.headers["Authorization"], "X-Amz-Date": request.headers["X-Amz-Date"]}
    if content_header:
        out["X-Amz-Content-SHA256"] = payload_sha256
    if credentials.session_token:
        out["X-Amz-Security-Token"] = credentials.session_token
    return out


@functools.cache
def _botocore() -> tuple[Any, Any, Any]:
    """botocore's signer with the sidecar's clock (the instant in `request.context`, set by
    `sign`, instead of the system's), its request and credentials classes; imported once."""
    botocore_required()
    from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
    from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
    from botocore.credentials import Credentials  # type: ignore[import-untyped]

    class Clocked(SigV4Auth):  # type: ignore[misc]
        def add_auth(self, request: Any) -> None:
            self._modify_request_before_signing(request)
            canonical = self.canonical_request(request)
            signature = self.signature(self.string_to_sign(request, canonical), request)
            self._inject_signature_to_request(request, signature)

    return Clocked, AWSRequest, Credentials


def host_of(url: str) -> str:
    """The Host a client sends for `url` (the port only when it is not the scheme's default)."""
    parts = httpx.URL(url)
    host = parts.host if ":" not in parts.host else f"[{parts.host}]"
    return host if parts.port is None else f"{host}:{parts.port}"


class SigV4Signer:
    """Signs requests to the servers whose `auth` is of kind `aws`."""

    def __init__(self, config: Config, clock: Callable[[], float], render: Callable[[Template], str],
                 http_for: Callable[[Target], httpx.AsyncClient]) -> None:
        self.config = config
        self.clock = clock
        self.render = render
        self.http_for = http_for  # the target's own egress client (IMDS goes through its policy)
        self.cache = CredentialCache(clock)
        self._auth: dict[str, tuple[Mapping[str, Any], AwsAuth]] = {}
        self._sources: dict[str, str] = {}  # cache key -> the source of its credentials (for status)

    def reload(self, config: Config) -> None:
        self.config = config
        self.cache.forget()
        self._auth.clear()
        self._sources.clear()

    def auth(self, target: Target) -> AwsAuth:
        held = self._auth.get(target.name)
        if held is not None and held[0] is target.spec.auth:
            return held[1]
        parsed = aws_auth_of(target)
        assert target.spec.auth is not None
        self._auth[target.name] = (target.spec.auth, parsed)
        return parsed

    def status(self) -> list[dict[str, Any]] | None:
        """Per cache key whose credentials are held: the source, whether they are temporary, when
        they expire and are renewed (never a key or a token)."""
        held = self.cache.held()
        if not held:
            return None
        return [{"key": key, "source": self._sources.get(key), "temporary": creds.session_token is not None,
                 "expires_at": creds.expires_at, "renew_at": round(renew, 3)}
                for key, (creds, renew) in sorted(held.items())]

    async def credentials(self, target: Target) -> AwsCredentials:
        import asyncio

        auth = self.auth(target)
        self._sources[target.key] = auth.source

        async def fetch() -> AwsCredentials:
            if auth.source == "imds":
                return await from_imds(auth, self.http_for(target))
            if auth.source == "web_identity":
                return await from_web_identity(auth, self.http_for(target))
            if auth.source == "static":
                return await asyncio.to_thread(from_static, auth, self.render)
            if auth.source == "sso":  # the login's SSO token (aws_sso.py), from the keyring
                keyring = login_store(self.config.secrets).keyring
                return await from_sso(auth, target.name, target.key, self.http_for(target), keyring,
                                      self.clock)
            return from_env()

        return await self.cache.get(target.key, fetch, self.config.secrets.cache_ttl)

    # -- the gateway's hook

    async def gateway_headers(self, target: Target, method: str, url: str, headers: list[tuple[Any, bytes]],
                              body: bytes | None) -> list[tuple[Any, bytes]]:
        """The headers that sign an upstream request of the gateway (added to `headers`: names
        lower-cased, as bytes or str as `headers` has them); `host` among them."""
        auth = self.auth(target)
        as_bytes = any(isinstance(k, bytes) for k, _ in headers)
        host = host_of(url)
        lines = [(k.decode("latin-1") if isinstance(k, bytes) else k, v.decode("latin-1")) for k, v in headers
                 if (k.lower() if isinstance(k, str) else k.lower().decode("latin-1")) != "host"]
        lines.append(("host", host))
        credentials = await self.credentials(target)
        added = sign(credentials, auth.region, auth.service, method, url, lines,
                     hashlib.sha256(body or b"").hexdigest(), self.clock())
        out = [("host", host), *((k.lower(), v) for k, v in added.items())]
        return [(name.encode("ascii") if as_bytes else name, value.encode("ascii")) for name, value in out]

    async def refused(self, target: Target, response: httpx.Response) -> bool:
        """The server refused a request signed here: True (retry, once: the gateway's rule) when
        its AWS error says the credentials are stale or not recognised; the held ones are dropped
        if they signed the request (a concurrent refusal may have renewed them already), so the
        retry is signed with credentials fetched again. False when they signed it but a refusal
        forced a refetch less than `invalidate_cooldown` ago. Reads a refusal's body only when its
        Content-Length is at most `MAX_ERROR_BODY`; it stays readable for the caller."""
        if response.status_code not in (400, 403):
            return False
        body = b""
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) <= MAX_ERROR_BODY:
            try:
                body = await response.aread()
            except httpx.HTTPError:
                return False
        code = stale_credentials_code(response.status_code, response.headers, body)
        if code is None:
            return False
        held = self.cache.held().get(target.key)
        try:
            sent = response.request.headers.get("authorization", "")
        except RuntimeError:  # an answer without its request: nothing tells which credentials signed
            sent = ""
        signed_by_held = held is not None and f"Credential={held[0].access_key_id}/" in sent
        cooldown = self.config.sidecar.invalidate_cooldown
        dropped = signed_by_held and self.cache.force_refetch(target.key, cooldown)
        retry = dropped or not signed_by_held  # else refused again within the cooldown: no new fetch
        _log.info("aws credentials refused", extra={"server": target.name, "key": target.key, "error": code,
                                                    "dropped": dropped, "retry": retry})
        return retry

    # -- POST /v1/servers/{name}/sign

    async def sign_route(self, target: Target, body: dict[str, Any]) -> dict[str, Any]:
        """The SigV4 headers a direct client adds to its request to `target` (never the body: the
        client sends its SHA-256). The URL must be the server's origin. Never echoes what was sent."""
        if not is_aws(target):
            raise Forbidden(f"requests to server {target.name!r} are not signed with SigV4")
        request = parse_sign_request(
            target, body, values="printable string values",
            header_ok=lambda name, value: bool(_HEADER_NAME.match(name)) and value.isprintable())
        payload = _payload_sha256(body)
        auth = self.auth(target)
        lines = [(k, v) for k, v in request.headers.items() if k.lower() not in ("host", *_ADDED)]
        lines.append(("host", host_of(request.url)))
        credentials = await self.credentials(target)
        added = sign(credentials, auth.region, auth.service, request.method, request.url, lines, payload,
                     self.clock())
        signed = sorted({k.lower() for k, _ in lines} | {"x-amz-date", "x-amz-content-sha256"}
                        | ({"x-amz-security-token"} if credentials.session_token else set()))
        return {"headers": added, "signed_headers": [h for h in signed if h not in _UNSIGNED],
                "expires_at": credentials.expires_at}


_UNSIGNED: Final = frozenset({"connection", "expect", "keep-alive", "proxy-authenticate",
                              "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
                              "user-agent", "x-amzn-trace-id"})


def _payload_sha256(body: Mapping[str, Any]) -> str:
    digest = body.get("content_digest")
    if digest is not None:
        match = _DIGEST.match(digest) if isinstance(digest, str) else None
        if match is None:
            raise InvalidRequest("content_digest must be sha-256=:<base64>: (RFC 9530; SigV4 signs the "
                                 "body's SHA-256)")
        return base64.b64decode(match[1]).hex()
    return EMPTY_SHA256


