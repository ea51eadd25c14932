"""An AAuth resource's signature check, built on an implementation other than the one that signs:
`http-message-signatures` (PyPI, the RFC 9421 implementation of pyauth) parses Signature-Input and
Signature and builds the signature base from the request as received; `http-sf` parses the
`Signature-Key` dictionary; `cryptography` checks the Ed25519 signature against the key it names.
Nothing of mcpcreds is imported.

The profile checked (draft-hardt-oauth-aauth / httpbis-signature-key): one signature labelled
`sig`; it covers `@method`, `@authority`, `@path` and `signature-key`, `authorization` when the
request has one, `content-digest` when it has a body (and a covered digest matches the body, even
an empty one), every component the resource's metadata asks for (`required`); `created`
within `WINDOW` seconds of now; `Signature-Key: sig=hwk` with an OKP Ed25519 key whose `alg` is
`Ed25519` or an EC P-256 key whose `alg` is `ES256` (or `sig=jwt` with a token whose `cnf.jwk`
is such a key, when a token check is given).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import http_sf
from cryptography.exceptions import InvalidSignature as BadEd25519
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from http_message_signatures import HTTPMessageVerifier, algorithms
from http_message_signatures.digests import ContentDigest
from http_message_signatures.exceptions import HTTPMessageSignaturesException

WINDOW = 60
REQUIRED = ("@method", "@authority", "@path", "signature-key")


class Rejected(Exception):
    """Verification failed; `error` is a Signature-Error code."""

    def __init__(self, error: str, why: str) -> None:
        super().__init__(f"{error}: {why}")
        self.error = error


@dataclass
class _Headers:
    lines: Sequence[tuple[str, str]]

    def items(self) -> Sequence[tuple[str, str]]:
        return self.lines

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(n for n, _ in self.lines))

    def __contains__(self, name: str) -> bool:
        return any(n.lower() == name.lower() for n, _ in self.lines)


@dataclass
class _Message:
    method: str
    url: str
    headers: _Headers


@dataclass
class Verified:
    jwk: dict[str, str]
    covered: list[str]
    created: int
    scheme: str


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _field(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    values = [v.strip() for n, v in headers if n.lower() == name]
    return ", ".join(values) if values else None


def _check(jwk: dict[str, str], signature: bytes, base: bytes) -> None:
    """Ed25519, or ES256 as RFC 9421 3.3.4 encodes it (r || s, 32 bytes each)."""
    if jwk["kty"] == "OKP":
        Ed25519PublicKey.from_public_bytes(_b64url(jwk["x"])).verify(signature, base)
        return
    if len(signature) != 64:
        raise ValueError("an ES256 signature is 64 bytes")
    public = ec.EllipticCurvePublicNumbers(int.from_bytes(_b64url(jwk["x"]), "big"),
                                           int.from_bytes(_b64url(jwk["y"]), "big"), ec.SECP256R1()).public_key()
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
    public.verify(der, base, ec.ECDSA(hashes.SHA256()))


def verify(method: str, url: str, headers: Sequence[tuple[str, str]], body: bytes, now: float,
           token_jwk: Callable[[str], dict[str, Any]] | None = None, required: Sequence[str] = ()) -> Verified:
    """Verify the request (`url` as the resource sees it: its scheme, Host and path); raise Rejected.
    `required`: the resource's `additional_signature_components` (its metadata), each to be covered."""
    handler = HTTPMessageVerifier(signature_algorithm=algorithms.ED25519, key_resolver=None)
    raw_input, raw_sig, raw_key = (_field(headers, n) for n in ("signature-input", "signature", "signature-key"))
    if raw_input is None or raw_sig is None or raw_key is None:
        raise Rejected("missing_signature", "Signature-Input, Signature and Signature-Key are required")
    try:
        inputs = handler._parse_signature_dictionary(raw_input)
        signatures = handler._parse_signature_dictionary(raw_sig)
        keys = cast(dict[str, Any], http_sf.parse(raw_key.encode("ascii"), tltype="dictionary"))
    except Exception as exc:
        raise Rejected("invalid_input", f"malformed signature headers ({type(exc).__name__})") from None
    if "sig" not in inputs or "sig" not in signatures or "sig" not in keys:
        raise Rejected("invalid_input", "no member labelled sig")
    params = inputs["sig"].params
    covered = [str(item.value) for item in inputs["sig"]]
    for name in (*REQUIRED, *required):
        if name not in covered:
            raise Rejected("invalid_input", f"{name} is not covered")
    if _field(headers, "authorization") is not None and "authorization" not in covered:
        raise Rejected("invalid_input", "authorization is sent but not covered")
    if body or "content-digest" in covered:  # a covered digest must match, the empty body's too
        digest = _field(headers, "content-digest")
        if digest is None or "content-digest" not in covered:
            raise Rejected("invalid_input", "a body without a covered Content-Digest")
        try:
            ContentDigest.verify(digest, body)
        except HTTPMessageSignaturesException:
            raise Rejected("invalid_signature", "Content-Digest does not match the body") from None
    created = params.get("created")
    if type(created) is not int or abs(now - created) > WINDOW:
        raise Rejected("invalid_signature", "created is missing or outside the window")
    scheme, key_params = keys["sig"]
    if str(scheme) == "hwk":
        jwk = {k: str(v) for k, v in key_params.items()}
    elif str(scheme) == "jwt" and token_jwk is not None:
        jwk = token_jwk(str(key_params.get("jwt", "")))
    else:
        raise Rejected("unsupported_scheme", "only hwk (and jwt when tokens are checked)")
    kind = (jwk.get("kty"), jwk.get("crv"), jwk.get("alg"))
    if kind not in (("OKP", "Ed25519", "Ed25519"), ("EC", "P-256", "ES256")) or "kid" in key_params:
        raise Rejected("unsupported_algorithm", "an OKP Ed25519 key with alg Ed25519, or an EC P-256 key with "
                                                "alg ES256 (and no kid)")
    message = _Message(method, url, _Headers(headers))
    try:
        base, _, _ = handler._build_signature_base(message, covered_component_ids=list(inputs["sig"]),
                                                   signature_params=params)
        _check(jwk, signatures["sig"].value, base.encode())
    except (BadEd25519, HTTPMessageSignaturesException, ValueError) as exc:
        raise Rejected("invalid_signature", f"the signature does not verify ({type(exc).__name__})") from None
    return Verified(jwk, covered, created, str(scheme))
