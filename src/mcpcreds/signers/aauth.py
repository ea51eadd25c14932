"""The AAuth agent: one durable key (Ed25519, or ECDSA P-256 with `[aauth] alg = "ES256"`) that
never leaves the sidecar process, and the signer
the gateway and the `sign` route use (the signature itself is `httpsig`).

- The key file (`[aauth] key_file`, default `aauth-agent.key` in the sidecar's state folder, the
  socket's 0700 folder) is created 0600 (`O_EXCL`, `O_NOFOLLOW`) if absent. An existing one must be
  a regular file owned by the sidecar's uid and not readable or writable by group or others, else
  it is refused (at start: `serve` exits with the reason). It is read `O_NOFOLLOW | O_NONBLOCK`,
  checked with `fstat`, bounded, and must hold a PKCS#8 private key of the configured `alg`.
- The private key lives in a `cryptography` key object only: nothing returns, logs or serialises
  it; its raw value is handed to the redactor all the same, as a last guard.
- Without a provider, requests carry `Signature-Key: sig=hwk;...` (a bare public key). With one
  (`[aauth] provider`), `sig=jwt;jwt="<agent token>"`: the token is fetched from the provider
  (`AgentTokens`), validated (its JWS against the provider's JWKS, `iss`, `exp`, `cnf.jwk` equal to
  our public key), held in memory only, and renewed ahead of expiry with a single fetch at a time.
  The provider's answers (metadata, JWKS, token) are asked for uncompressed and read bounded (64
  KiB): any other `Content-Encoding` is refused, never decoded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Final

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from ..config.load import default_socket_path
from ..config.model import Config, Target, uses_aauth
from ..core.aauth_requirement import access_token, refusal, requirement
from ..core.logs import get_logger
from ..core.secret import REDACTOR
from ..core.templates import Template
from ..errors import ConfigError, Forbidden, InvalidRequest, McpcredsError
from ..net.egress import EgressPolicy, is_dev_loopback_url
from ..net.egress_http import UnreadableAnswer, egress_client, read_answer
from . import httpsig
from .aauth_resource import MAX_COMPONENTS, ResourceMetadata, parse_components, required_input
from .sign_request import parse_sign_request

_log = get_logger("aauth")
MAX_KEY_FILE: Final = 8192
_CHALLENGE: Final = ("www-authenticate", "aauth-requirement", "signature-error", "accept-signature-scheme",
                      "accept-signature-alg")


class AAuthKeyError(McpcredsError):
    """The agent key cannot be used (its file refused or unreadable)."""

    code: ClassVar[str] = "aauth_key_unavailable"
    status: ClassVar[int] = 503


class AgentTokenError(McpcredsError):
    """No valid agent token could be obtained from the Agent Provider (names what is missing)."""

    code: ClassVar[str] = "aauth_token_unavailable"
    status: ClassVar[int] = 502


AGENT_DWK: Final = "aauth-agent.json"
AGENT_TYP: Final = "aa-agent+jwt"
IAT_SKEW: Final = 60.0  # an agent token's iat may be this far ahead of our clock
MAX_PROVIDER_ANSWER: Final = 65536
MAX_TOKEN_LIFE: Final = 86400.0
RENEW_AHEAD: Final = 60.0  # renew this long before expiry (at most half the token's life)


class AgentKey:
    """The agent's private key. `repr` never shows it; `sign` is the one use of it."""

    __slots__ = ("_key", "jwk", "path", "thumbprint")

    def __init__(self, key: httpsig.SigningKey, path: Path) -> None:
        self._key = key
        self.path = path
        self.jwk = httpsig.public_jwk(key)
        self.thumbprint = httpsig.jwk_thumbprint(self.jwk)
        if isinstance(key, ec.EllipticCurvePrivateKey):
            raw = key.private_numbers().private_value.to_bytes(32, "big")
        else:
            raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                    serialization.NoEncryption())
        REDACTOR.add(httpsig.b64url(raw), owner="aauth:key")  # a last guard: it is never written anywhere

    def __repr__(self) -> str:
        return f"AgentKey(thumbprint={self.thumbprint})"

    def sign(self, method: str, url: str, headers: Iterable[tuple[str, str]], body: bytes | None,
             created: int, *, cover: Iterable[str] = (), digest: str | None = None,
             token: str | None = None) -> httpsig.Signed:
        """Signed with `Signature-Key: sig=jwt` when an agent token is given, else `sig=hwk`."""
        key = httpsig.jwt_key(token) if token is not None else httpsig.hwk_key(self.jwk)
        return httpsig.sign_request(self._key, method, url, headers, body, created, key, cover=cover,
                                    digest=digest)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("the agent key cannot be pickled")


def _refuse(path: Path, why: str) -> ConfigError:
    return ConfigError([f"aauth.key_file: {path}: {why}"])


def generate_key(alg: str) -> httpsig.SigningKey:
    return ec.generate_private_key(ec.SECP256R1()) if alg == httpsig.ES256 else Ed25519PrivateKey.generate()


def load_key(path: Path, alg: str = httpsig.ALG) -> AgentKey:
    """Read the agent key, checked (see the module doc); raise ConfigError naming why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _refuse(path, f"cannot open ({exc.strerror}; a symlink is refused)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, "not a regular file")
        if info.st_uid != os.geteuid():
            raise _refuse(path, f"owned by uid {info.st_uid}, not the sidecar's ({os.geteuid()})")
        if info.st_mode & 0o077:
            raise _refuse(path, f"readable or writable by group or others (mode "
                                f"{stat.S_IMODE(info.st_mode):04o}): chmod 600 it, and rotate the key if "
                                "others may have read it")
        if info.st_size > MAX_KEY_FILE:
            raise _refuse(path, f"larger than {MAX_KEY_FILE} bytes: not a key file")
        data = os.read(fd, MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):  # never quotes what it read
        raise _refuse(path, "not a PEM PKCS#8 private key") from None
    if alg == httpsig.ES256:
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
            raise _refuse(path, "not a P-256 key, as [aauth] alg = \"ES256\" asks (move the file away to "
                                "have a new key made, or set alg to the key's)")
    elif not isinstance(key, Ed25519PrivateKey):
        raise _refuse(path, "not an Ed25519 key, as [aauth] alg (default \"Ed25519\") asks (move the file "
                            "away to have a new key made, or set alg to the key's)")
    return AgentKey(key, path)


def create_key(path: Path, alg: str = httpsig.ALG) -> None:
    """A new key of `alg`, written 0600 with O_EXCL (never over an existing file) and fsync'd."""
    pem = generate_key(alg).private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())
    old_umask = os.umask(0o077)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return  # made by another process meanwhile: load_key checks it
    except OSError as exc:
        raise _refuse(path, f"cannot create ({exc.strerror})") from None
    finally:
        os.umask(old_umask)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    _log.info("aauth agent key created", extra={"key_file": str(path)})


def _replace_key_file(path: Path, key: httpsig.SigningKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    temp = path.with_name(f".{path.name}.{os.urandom(6).hex()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def load_or_create(path: Path, alg: str = httpsig.ALG) -> AgentKey:
    if not os.path.lexists(path):
        create_key(path, alg)
    return load_key(path, alg)


def key_path(config: Config) -> Path:
    return config.aauth.key_path(default_socket_path(config.sidecar.socket).parent)


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _verify_jws(header: Mapping[str, Any], signing_input: bytes, signature: bytes,
                jwks: Mapping[str, Any]) -> None:
    """The JWS signature of an agent token, by the provider key its `kid` names (Ed25519 or ES256:
    the draft refuses the polymorphic `EdDSA`). Raises AgentTokenError."""
    keys = [k for k in jwks.get("keys", []) if isinstance(k, dict)]
    kid = header.get("kid")
    key = next((k for k in keys if kid is None or k.get("kid") == kid), None)
    if key is None:
        raise AgentTokenError("aauth: the agent token's key (kid) is not in the provider's JWKS")
    alg = header.get("alg")
    try:
        if alg == "Ed25519" and (key.get("kty"), key.get("crv")) == ("OKP", "Ed25519"):
            Ed25519PublicKey.from_public_bytes(_b64decode(key["x"])).verify(signature, signing_input)
        elif alg == "ES256" and (key.get("kty"), key.get("crv")) == ("EC", "P-256") and len(signature) == 64:
            public = ec.EllipticCurvePublicNumbers(int.from_bytes(_b64decode(key["x"]), "big"),
                                                   int.from_bytes(_b64decode(key["y"]), "big"),
                                                   ec.SECP256R1()).public_key()
            r, s_ = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
            der = encode_dss_signature(r, s_)
            public.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
        else:
            raise AgentTokenError("aauth: the agent token's alg is not Ed25519 or ES256 (fully specified: "
                                  "EdDSA is refused) with a matching key")
    except (InvalidSignature, KeyError, ValueError, TypeError):
        raise AgentTokenError("aauth: the agent token's signature does not verify with the provider's "
                              "keys") from None


def check_agent_token(token: str, issuer: str, jwks: Mapping[str, Any], jwk: Mapping[str, str],
                      now: float) -> float:
    """Validate an agent token as the draft's "Agent Token Verification" asks (`typ`
    `aa-agent+jwt`, its JWS by the provider's key, `iss`, `dwk`, `exp`, `iat` not ahead,
    `cnf.jwk` = our key); return its expiry (capped at a day). Raises AgentTokenError naming
    what is wrong, never quoting the token."""
    parts = token.split(".") if isinstance(token, str) and len(token) <= 16384 else []
    if len(parts) != 3 or not all(ch.isascii() and (ch.isalnum() or ch in "-_.") for ch in token):
        raise AgentTokenError("aauth: the provider's answer holds no compact JWT")
    try:
        header = json.loads(_b64decode(parts[0]))
        claims = json.loads(_b64decode(parts[1]))
        signature = _b64decode(parts[2])
    except (ValueError, UnicodeDecodeError):
        raise AgentTokenError("aauth: the agent token cannot be decoded") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise AgentTokenError("aauth: the agent token cannot be decoded")
    if header.get("typ") != AGENT_TYP:
        raise AgentTokenError(f"aauth: the agent token's typ is not {AGENT_TYP}")
    _verify_jws(header, f"{parts[0]}.{parts[1]}".encode("ascii"), signature, jwks)
    if claims.get("iss") != issuer:
        raise AgentTokenError("aauth: the agent token's iss is not the provider's issuer")
    if claims.get("dwk") != AGENT_DWK:
        raise AgentTokenError(f"aauth: the agent token's dwk is not {AGENT_DWK}")
    exp, iat = claims.get("exp"), claims.get("iat")
    if isinstance(exp, bool) or not isinstance(exp, int | float) or exp <= now:
        raise AgentTokenError("aauth: the agent token has no exp, or has expired")
    if isinstance(iat, bool) or not isinstance(iat, int | float) or iat > now + IAT_SKEW:
        raise AgentTokenError("aauth: the agent token has no iat, or was issued in the future")
    bound = (claims.get("cnf") or {}).get("jwk") if isinstance(claims.get("cnf"), dict) else None
    if not isinstance(bound, dict) or any(bound.get(k) != jwk[k] for k in httpsig.public_members(jwk)):
        raise AgentTokenError("aauth: the agent token's cnf.jwk is not this sidecar's agent key")
    return min(float(exp), now + MAX_TOKEN_LIFE)


class AAuthSigner:
    """Signs requests to the servers with `aauth` on. The key is loaded at start (`start`), or at
    the first signature if the sidecar was built without one."""

    def __init__(self, config: Config, clock: Callable[[], float],
                 render: Callable[[Template], str] | None = None,
                 http_for: Callable[[Target], httpx.AsyncClient] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.render = render  # resolves the enrollment token's template
        # what each resource asks to be covered (its aauth-resource.json), through its egress client
        self.resources = ResourceMetadata(clock, http_for, config.sidecar.token_timeout)
        self._key: AgentKey | None = None
        self._token: tuple[str, float, float] | None = None  # (agent token, issued at, expires at)
        self._fetching: asyncio.Task[str] | None = None
        self._http: httpx.AsyncClient | None = None
        self._access: dict[str, str] = {}  # server -> the AAuth-Access token its resource gave (memory only)
        self._warned: set[tuple[str, str]] = set()

    def start(self) -> None:
        """Load (or create) the key if any server signs: a refused key file fails the start."""
        if uses_aauth(self.config):
            self._key = load_or_create(key_path(self.config), self.config.aauth.alg)
            _log.info("aauth agent key loaded", extra={"key_file": str(self._key.path),
                                                       "thumbprint": self._key.thumbprint})

    def reload(self, config: Config) -> None:
        """A new config: a moved key file is loaded now; if it is refused, the old key stays."""
        old = self.config.aauth
        if (config.aauth.provider, config.aauth.enroll) != (old.provider, old.enroll):
            self._token = None  # another provider or enrollment: fetched again
        self.config = config
        wanted = (key_path(config), config.aauth.alg)  # a moved key file, or another algorithm
        if self._key is not None and (self._key.path, self._key.jwk["alg"]) != wanted:
            try:
                self._key = load_or_create(key_path(config), config.aauth.alg)
            except ConfigError as exc:
                _log.error("aauth key file refused; the old key stays", extra={"errors": exc.errors})

    @property
    def key(self) -> AgentKey:
        if self._key is None:
            try:
                self._key = load_or_create(key_path(self.config), self.config.aauth.alg)
            except ConfigError as exc:
                raise AAuthKeyError("the AAuth agent key cannot be used: " + "; ".join(exc.errors)) from None
        return self._key

    def status(self) -> dict[str, Any] | None:
        if self._key is None:
            return None
        return {"key_file": str(self._key.path), "thumbprint": self._key.thumbprint,
                "public_jwk": self._key.jwk, "scheme": "jwt" if self.config.aauth.provider else "hwk",
                "token_expires_at": self._token[2] if self._token else None,
                "resource_components": self.resources.held()}  # origin -> what its metadata asks to cover

    # -- agent tokens

    async def agent_token(self) -> str | None:
        """The agent token to present (None without a provider): the one held while it is fresh; one
        fetch at a time when it is missing or expired (callers wait for it); renewed in the
        background once `RENEW_AHEAD` (at most half its life) before it expires."""
        if self.config.aauth.provider is None:
            return None
        now = self.clock()
        held = self._token
        if held is not None and now < held[2]:
            token, issued, expires = held
            if now >= expires - min(RENEW_AHEAD, (expires - issued) / 2):
                self._start_fetch()  # renewed ahead of expiry; the held one is still served
            return token
        return await asyncio.shield(self._start_fetch())

    def _start_fetch(self) -> asyncio.Task[str]:
        task = self._fetching
        if task is None or task.done():
            task = self._fetching = asyncio.ensure_future(self._fetch())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: waiters re-raise
        return task

    async def _fetch(self) -> str:
        token, issued, expires = await self._enroll(self.key)
        self._token = (token, issued, expires)
        return token

    async def _enroll(self, key: AgentKey) -> tuple[str, float, float]:
        """An agent token for `key` from the provider, checked: (token, issued at, expires at)."""
        aauth = self.config.aauth
        issuer = aauth.provider
        assert issuer is not None
        http = self._client(issuer)
        meta = await self._json(http, "GET", f"{issuer.rstrip('/')}/.well-known/{AGENT_DWK}",
                                "provider metadata")
        if meta.get("issuer") != issuer:
            raise AgentTokenError("aauth: the provider metadata's issuer is not the configured provider")
        endpoint, jwks_uri = meta.get("registration_endpoint"), meta.get("jwks_uri")
        if not isinstance(endpoint, str) or not isinstance(jwks_uri, str):
            raise AgentTokenError("aauth: the provider metadata lacks registration_endpoint or jwks_uri")
        jwks = await self._json(http, "GET", jwks_uri, "provider JWKS")
        body: dict[str, Any] = {}
        headers = [("content-type", "application/json")]
        enroll = aauth.enroll
        if enroll is not None and enroll.token is not None:
            if self.render is None:
                raise AgentTokenError("aauth: the enrollment token cannot be resolved here")
            secret = await asyncio.to_thread(self.render, enroll.token)
            headers.append(("authorization", f"Bearer {secret}"))
        elif enroll is not None and enroll.assertion_file is not None:
            body["assertion"] = await asyncio.to_thread(_read_assertion, enroll.assertion_file)
        raw = json.dumps(body, separators=(",", ":")).encode()
        signed = key.sign("POST", endpoint, headers, raw, int(self.clock()))  # hwk: the key itself
        answer = await self._json(http, "POST", endpoint, "agent token request", content=raw,
                                  headers=[*headers, *signed.headers().items()])
        token = answer.get("agent_token")
        if not isinstance(token, str):
            raise AgentTokenError("aauth: the provider's answer holds no agent_token")
        now = self.clock()
        expires = check_agent_token(token, issuer, jwks, key.jwk, now)
        REDACTOR.add(token, owner="aauth:agent_token")  # bound to our key, but never logged all the same
        _log.info("aauth agent token issued", extra={"provider": issuer, "expires_at": expires,
                                                     "thumbprint": key.thumbprint})
        return token, now, expires

    async def rotate(self) -> dict[str, Any]:
        """A new agent key, with overlap: the old one signs until the new one is ready (with a
        provider: until the new key's agent token is issued; a failure there changes nothing).
        The new key file replaces the old one atomically (a 0600 temp file, fsync'd, renamed)."""
        if not uses_aauth(self.config):
            raise InvalidRequest("no server signs with AAuth (aauth = true, or [aauth] default / provider): "
                                 "there is no agent key to rotate")
        old = self.key
        fresh = generate_key(self.config.aauth.alg)
        candidate = AgentKey(fresh, old.path)
        token = await self._enroll(candidate) if self.config.aauth.provider is not None else None
        await asyncio.to_thread(_replace_key_file, old.path, fresh)
        self._key = candidate
        self._token = token
        self._fetching = None
        self._access.clear()  # a resource's tokens were given to the old key's requests
        _log.info("aauth agent key rotated", extra={"previous": old.thumbprint, "key_file": str(old.path),
                                                    "thumbprint": candidate.thumbprint})
        return {"thumbprint": candidate.thumbprint, "previous": old.thumbprint, "public_jwk": candidate.jwk}

    def _client(self, issuer: str) -> httpx.AsyncClient:
        if self._http is None:
            self._http = egress_client(EgressPolicy(dev_loopback=is_dev_loopback_url(issuer)))
        return self._http

    async def _json(self, http: httpx.AsyncClient, method: str, url: str, what: str, *,
                    content: bytes | None = None,
                    headers: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        sent = [*(headers or []), ("accept-encoding", "identity")]
        try:
            async with http.stream(method, url, content=content, headers=sent,
                                   timeout=self.config.sidecar.token_timeout) as response:
                if response.status_code != 200:
                    raise AgentTokenError(f"aauth: the {what} was answered HTTP {response.status_code}",
                                          status=response.status_code)
                raw = await read_answer(response, MAX_PROVIDER_ANSWER)  # compressed: refused, never decoded
        except httpx.HTTPError as exc:
            raise AgentTokenError(f"aauth: the {what} failed ({type(exc).__name__})") from None
        except UnreadableAnswer as exc:
            raise AgentTokenError(f"aauth: the {what} was refused: {exc}") from None
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise AgentTokenError(f"aauth: the {what} is not a JSON object")
        return data

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    # -- the gateway's hook

    async def gateway_headers(self, target: Target, method: str, url: str, headers: list[tuple[Any, bytes]],
                              body: bytes | None) -> list[tuple[Any, bytes]]:
        """The headers that sign an upstream request of the gateway (added to `headers`: names
        lower-cased, as bytes or str as `headers` has them)."""
        as_bytes = any(isinstance(k, bytes) for k, _ in headers)
        lines = [(k.decode("latin-1") if isinstance(k, bytes) else k, v.decode("latin-1"))
                 for k, v in headers]
        added: list[tuple[str, str]] = []
        access = self._access.get(target.name)
        if access is not None and not any(k.lower() == "authorization" for k, _ in lines):
            added.append(("authorization", f"AAuth {access}"))  # the resource's token, covered below
            lines += added
        asked = await self.resources.components(target)
        present = {name.lower() for name, _ in lines}
        cover = [c for c in asked if c.startswith("@") or (c in present and c != "content-digest")]
        digest = httpsig.content_digest(b"") if "content-digest" in asked and body is None else None
        try:
            token = await self.agent_token()
            signed = self.key.sign(method, url, lines, body, int(self.clock()), token=token, cover=cover,
                                   digest=digest)
        except httpsig.SignatureError as exc:
            raise InvalidRequest(f"the request to server {target.name!r} cannot be signed: {exc}") from None
        return [(name.lower().encode("ascii") if as_bytes else name.lower(), value.encode("ascii"))
                for name, value in [*added, *signed.headers().items()]]

    def answered(self, target: Target, status: int,
                 headers: Iterable[tuple[str, str]]) -> tuple[tuple[bytes, bytes], ...]:
        """What a signed server's answer tells the gateway: an `AAuth-Access` session token is kept
        for that server (presented as `Authorization: AAuth <token>` from then on, in memory only;
        a new one replaces it); a 401 drops it and is passed on with its challenge, logged once
        naming what the resource wants."""
        lines = list(headers)
        given = access_token(lines)
        if given is not None:
            if self._access.get(target.name) != given:
                REDACTOR.add(given, owner=f"aauth:access:{target.name}")
                self._access[target.name] = given
                _log.info("aauth access token kept", extra={"server": target.name})
        elif status == 401:
            self._access.pop(target.name, None)
            wants = requirement(lines)
            if wants is not None and (target.name, wants) not in self._warned and len(self._warned) < 1024:
                self._warned.add((target.name, wants))
                _log.warning("aauth: the resource asks for what the sidecar cannot obtain (a token from a "
                             "person or access server); its 401 is passed on",
                             extra={"server": target.name, "requirement": wants})
        return challenge_headers(target, status, lines)

    def retry_after_401(self, target: Target, headers: Iterable[tuple[str, str]]) -> bool:
        """A signed server's 401 before the gateway's one retry: the session token it refused is
        dropped (the retry goes without it, and the resource may give a new one); components an
        `invalid_input` error requires are covered from now on (the retry included); a 401 that
        names a requirement the sidecar cannot meet is not retried."""
        lines = list(headers)
        self._access.pop(target.name, None)
        self.resources.learn(target, required_input(lines))  # invalid_input naming what to cover
        return requirement(lines) is None

    def refused_body(self, target: Target, status: int, headers: Iterable[tuple[str, str]]) -> bytes | None:
        """The gateway's answer body for a signed server's 401 that names an AAuth requirement: an
        mcpcreds error naming what is missing (the resource's own words are not repeated)."""
        error = refusal(target.name, status, headers)
        return None if error is None else json.dumps(error.to_wire(), separators=(",", ":")).encode()

    # -- POST /v1/servers/{name}/sign

    async def sign_route(self, target: Target, body: dict[str, Any]) -> dict[str, Any]:
        """The headers a direct client adds to sign its request to `target` (never the body: the
        client sends its digest). The URL must be the server's origin. Never echoes what was sent."""
        if not target.aauth:
            raise Forbidden(f"requests to server {target.name!r} are not signed with AAuth (aauth = false, "
                            "or `auth`/`oauth` takes precedence)")
        request = parse_sign_request(target, body, header_ok=lambda _name, _value: True,
                                     extra=frozenset({"required_input"}))
        digest = body.get("content_digest")
        asked = await self.resources.components(target)
        named = body.get("required_input")
        if named is not None:  # what a refusal's Signature-Error named: covered in this signature
            if not isinstance(named, list) or len(named) > MAX_COMPONENTS or not all(
                    isinstance(c, str) and len(c) <= 64 for c in named):
                raise InvalidRequest(f"required_input must be a list of at most {MAX_COMPONENTS} component "
                                     "names (what a refusal's Signature-Error named)")
            # only for this caller's signature: a caller does not change what others' cover
            more, _ = parse_components({"additional_signature_components": named})
            asked = (*asked, *(c for c in more if c not in asked))
        if digest is None and "content-digest" in asked:
            raise InvalidRequest(f"server {target.name!r} asks that content-digest be covered (its "
                                 "aauth-resource.json): send content_digest (RFC 9530), the empty body's too")
        try:
            if digest is not None:
                digest = httpsig.check_content_digest(digest)
            headers = list(request.headers.items())
            token = await self.agent_token()
            signed = self.key.sign(request.method, request.url, headers, None, int(self.clock()),
                                   cover=[*request.headers, *(c for c in asked if c.startswith("@"))],
                                   digest=digest, token=token)
        except httpsig.SignatureError as exc:
            raise InvalidRequest(f"cannot sign: {exc}") from None
        return {"headers": signed.headers(), "covered": list(signed.covered),
                "thumbprint": self.key.thumbprint}


def _read_assertion(path: str) -> str:
    """A federated assertion (a projected service-account token): read at each enrollment."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(16385)
    except OSError as exc:
        raise AgentTokenError(f"aauth.enroll.assertion_file: cannot read {path} ({exc.strerror})") from None
    if len(data) > 16384:
        raise AgentTokenError(f"aauth.enroll.assertion_file: {path} is larger than 16 KiB")
    return data.decode("ascii", "replace").strip()


def challenge_headers(target: Target, status: int,
                      headers: Iterable[tuple[str, str]]) -> tuple[tuple[bytes, bytes], ...]:
    """A signed server's 401 challenge, passed on to the gateway's caller (`WWW-Authenticate:
    AAuth ...`, `AAuth-Requirement`, `Signature-Error`, `Accept-Signature-*`): what the server wants
    that the sidecar did not send. Other servers' challenges stay in the sidecar, as before."""
    if not target.aauth or status != 401:
        return ()
    out = []
    for name, value in headers:
        if name.lower() in _CHALLENGE:
            with contextlib.suppress(UnicodeEncodeError):
                out.append((name.title().encode("ascii"), value.encode("latin-1")))
    return tuple(out)
