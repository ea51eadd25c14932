"""HTTP Message Signatures (RFC 9421) as AAuth profiles them, with a `Signature-Key` header
(draft-hardt-httpbis-signature-key): pure functions, the clock passed in.

Written here rather than taken from a library: `http-message-signatures` (PyPI) requires a `keyid`
parameter and knows no `Signature-Key`, and `aauth-signing` (0.2, a few weeks old) pins its own
request objects (`aauth` 0.5, the protocol layer, re-exports it and adds PyJWT and http-sfv, none
of which the sidecar needs); the part that is ours is small (building a signature base from strings and
serialising a few Structured Field values), and it is tested against RFC 9421's Ed25519 vector and
verified in the tests by `http-message-signatures`' own signature-base code.

- The covered components are `@method`, `@authority`, `@path` (plus `@query` when the URL has
  one), `signature-key`, `authorization` when the request carries one, `content-digest` (RFC 9530,
  sha-256) when a body is sent, and any other header the caller names, or derived component
  (`@target-uri`, `@scheme`, `@request-target`, `@query`: what a resource's metadata may ask for).
- `created` comes from the caller's clock; the label is `sig`, as in the AAuth drafts.
- `Signature-Key: sig=hwk;kty="OKP";crv="Ed25519";x="...";alg="Ed25519"` (a bare public key,
  RFC 8037 OKP parameters), or `sig=jwt;jwt="<agent token>"` (a token binding the key in `cnf.jwk`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

LABEL: Final = "sig"
ALG: Final = "Ed25519"  # the fully-specified JOSE identifier (RFC 9864) the draft requires
ES256: Final = "ES256"  # ECDSA P-256 SHA-256 (the draft's SHOULD; RFC 9421 3.3.4: r || s, 64 bytes)
ALGS: Final = (ALG, ES256)
SigningKey = Ed25519PrivateKey | ec.EllipticCurvePrivateKey
_TOKEN_NAME: Final = re.compile(r"[a-z0-9!#$%&'*+\-.^_`|~]+\Z")  # a lower-cased field name
_LABEL: Final = re.compile(r"[a-z*][a-z0-9_\-.*]{0,63}\Z")  # an sf-key
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


class SignatureError(ValueError):
    """A request that cannot be signed as asked (never quotes the value at fault)."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def content_digest(body: bytes) -> str:
    """The RFC 9530 `Content-Digest` field value of `body` (sha-256)."""
    return f"sha-256=:{base64.b64encode(hashlib.sha256(body).digest()).decode('ascii')}:"


_DIGEST: Final = re.compile(r"sha-(?:256|512)=:[A-Za-z0-9+/]+={0,2}:\Z")


def check_content_digest(value: str) -> str:
    """A `Content-Digest` value as a caller sends it (`sha-256=:...:` or `sha-512=:...:`)."""
    if not isinstance(value, str) or len(value) > 256 or not _DIGEST.match(value):
        raise SignatureError("content_digest must be an RFC 9530 value: sha-256=:<base64>:")
    algorithm, _, rest = value.partition("=")
    try:
        digest = base64.b64decode(rest.strip(":"), validate=True)
    except ValueError:
        raise SignatureError("content_digest must be an RFC 9530 value: sha-256=:<base64>:") from None
    if len(digest) != (32 if algorithm == "sha-256" else 64):
        raise SignatureError("content_digest has the wrong length for its algorithm")
    return value


def sf_string(value: str) -> str:
    """A Structured Field String (RFC 8941 4.1.6): visible ASCII and space, `\\` and `"` escaped."""
    if not all(" " <= ch <= "~" for ch in value):
        raise SignatureError("a structured-field string holds printable ASCII only")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sf_bytes(value: bytes) -> str:
    return ":" + base64.b64encode(value).decode("ascii") + ":"


def public_jwk(key: SigningKey) -> dict[str, str]:
    """The public half as a JWK with the `alg` the draft requires: RFC 8037 OKP for Ed25519, an
    RFC 7518 EC key for P-256 (ES256)."""
    if isinstance(key, ec.EllipticCurvePrivateKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise SignatureError("an EC agent key must be on P-256")
        numbers = key.public_key().public_numbers()
        return {"kty": "EC", "crv": "P-256", "x": b64url(numbers.x.to_bytes(32, "big")),
                "y": b64url(numbers.y.to_bytes(32, "big")), "alg": ES256}
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"kty": "OKP", "crv": "Ed25519", "x": b64url(raw), "alg": ALG}


def public_members(jwk: Mapping[str, str]) -> tuple[str, ...]:
    """The members that make a public key what it is (RFC 7638's required members, in order)."""
    return ("crv", "kty", "x", "y") if jwk.get("kty") == "EC" else ("crv", "kty", "x")


def jwk_thumbprint(jwk: Mapping[str, str]) -> str:
    """RFC 7638 thumbprint (SHA-256): the key's required members, in order, no spaces."""
    canonical = json.dumps({k: jwk[k] for k in public_members(jwk)}, separators=(",", ":"))
    return b64url(hashlib.sha256(canonical.encode("ascii")).digest())


def hwk_key(jwk: Mapping[str, str], label: str = LABEL) -> str:
    """`Signature-Key` for the hwk scheme (a bare public key: pseudonymous)."""
    members = [m for m in ("kty", "crv", "x", "y") if m in jwk]
    return f"{label}=hwk;" + ";".join(f"{m}={sf_string(jwk[m])}" for m in members) + \
        f";alg={sf_string(jwk.get('alg', ALG))}"


def raw_signature(key: SigningKey, base: bytes) -> bytes:
    """Ed25519's 64 bytes, or ECDSA P-256 SHA-256 as r || s (32 bytes each, RFC 9421 3.3.4)."""
    if isinstance(key, ec.EllipticCurvePrivateKey):
        r, s_ = decode_dss_signature(key.sign(base, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s_.to_bytes(32, "big")
    return key.sign(base)


def jwt_key(token: str, label: str = LABEL) -> str:
    """`Signature-Key` for the jwt scheme (an agent token that binds the key in `cnf.jwk`)."""
    return f"{label}=jwt;jwt={sf_string(token)}"


@dataclass(frozen=True, slots=True)
class RequestTarget:
    """The parts of a request URI the derived components come from (RFC 9421 2.2)."""

    authority: str
    path: str
    query: str | None
    scheme: str = "https"
    target_uri: str = ""

    @classmethod
    def parse(cls, url: str) -> RequestTarget:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise SignatureError("not a valid URL") from None
        host = parts.hostname
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not host:
            raise SignatureError("the URL must be http(s):// with a host")
        if ":" in host:
            host = f"[{host}]"
        authority = host if port is None or port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
        query = f"?{parts.query}" if parts.query else None
        path = parts.path or "/"
        netloc = parts.netloc.rpartition("@")[2]
        return cls(authority.lower(), path, query, scheme, f"{scheme}://{netloc}{path}{query or ''}")

    def derived(self, name: str) -> str | None:
        """The value of a derived component (RFC 9421 2.2) a resource may ask to be covered;
        None for one this signer does not produce."""
        values = {"@target-uri": self.target_uri, "@scheme": self.scheme, "@query": self.query or "?",
                  "@request-target": self.path + (self.query or "")}
        return values.get(name)


def field_value(values: Iterable[str]) -> str:
    """A header's component value (RFC 9421 2.1): each field line trimmed, lines joined by `, `."""
    out = []
    for value in values:
        if "\r" in value or "\n" in value:
            raise SignatureError("a header value holds a line break")
        out.append(value.strip(" \t"))
    return ", ".join(out)


def signature_params(covered: Iterable[str], created: int, keyid: str | None = None) -> str:
    """The `@signature-params` value: the covered components as an inner list, then parameters."""
    params = f";created={int(created)}"
    if keyid is not None:
        params += f";keyid={sf_string(keyid)}"
    return "(" + " ".join(sf_string(name) for name in covered) + ")" + params


def signature_base(components: Iterable[tuple[str, str]], params: str) -> bytes:
    """The signature base (RFC 9421 2.5): one `"name": value` line per covered component, the
    `@signature-params` line last, no trailing newline."""
    lines = [f"{sf_string(name)}: {value}" for name, value in components]
    lines.append(f'"@signature-params": {params}')
    base = "\n".join(lines)
    if not base.isascii():
        raise SignatureError("a covered component is not ASCII")
    return base.encode("ascii")


@dataclass(frozen=True, slots=True)
class Signed:
    """The headers that sign a request, and what was covered (for tests and logs)."""

    signature_key: str
    signature_input: str
    signature: str
    covered: tuple[str, ...]
    content_digest: str | None = None

    def headers(self) -> dict[str, str]:
        out = {"Signature-Key": self.signature_key, "Signature-Input": self.signature_input,
               "Signature": self.signature}
        if self.content_digest is not None:
            out["Content-Digest"] = self.content_digest
        return out


def sign_request(key: SigningKey, method: str, url: str, headers: Iterable[tuple[str, str]],
                 body: bytes | None, created: int, signature_key: str, *,
                 cover: Iterable[str] = (), digest: str | None = None, label: str = LABEL) -> Signed:
    """Sign a request as AAuth does. `headers` are the request's (name, value) field lines;
    `signature_key` the `Signature-Key` value (`hwk_key`, `jwt_key`) for `label`. A body (or a
    `digest` the caller computed) is covered through `Content-Digest`, added if the request has
    none; an `Authorization` the request carries is covered; so is every header in `cover`."""
    if not _LABEL.match(label) or not signature_key.startswith(f"{label}="):
        raise SignatureError("the Signature-Key member must carry the signature's label")
    if not re.fullmatch(r"[A-Z]{1,16}", method):
        raise SignatureError("the method must be an upper-case token")
    target = RequestTarget.parse(url)
    fields: dict[str, list[str]] = {}
    for name, value in headers:
        lowered = name.strip().lower()
        if not _TOKEN_NAME.match(lowered):
            raise SignatureError("a header name is not a valid field name")
        if lowered in ("signature", "signature-input", "signature-key"):
            continue  # ours replace whatever was there
        fields.setdefault(lowered, []).append(value)
    added_digest = None
    if body is not None and digest is None and "content-digest" not in fields:
        digest = content_digest(body)
    if digest is not None and "content-digest" not in fields:
        fields["content-digest"] = [digest]
        added_digest = digest
    fields["signature-key"] = [signature_key]
    components: list[tuple[str, str]] = [("@method", method), ("@authority", target.authority),
                                         ("@path", target.path)]
    if target.query is not None:
        components.append(("@query", target.query))
    names = ["signature-key", *(n for n in ("authorization", "content-digest") if n in fields)]
    for name in (n.strip().lower() for n in cover):
        if name.startswith("@"):  # a derived component the resource asks for (its metadata)
            derived = target.derived(name)
            if derived is None and name not in ("@method", "@authority", "@path"):
                raise SignatureError("a derived component to cover is not one this signer produces")
            if derived is not None and all(name != n for n, _ in components):
                components.append((name, derived))
            continue
        if name not in fields:
            raise SignatureError("a header to cover is not in the request")
        if name not in names:
            names.append(name)
    components += [(name, field_value(fields[name])) for name in names]
    params = signature_params([name for name, _ in components], created)
    signature = raw_signature(key, signature_base(components, params))
    return Signed(signature_key, f"{label}={params}", f"{label}={sf_bytes(signature)}",
                  tuple(name for name, _ in components), added_digest)
