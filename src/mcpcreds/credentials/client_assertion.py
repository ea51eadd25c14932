"""private_key_jwt client assertions (RFC 7523 §2.2, RFC 7521 §4.2): a JWS signed with the
client's private key, for RSA (RS256/384/512, PS256/384/512), EC (ES256 on P-256, ES384 on
P-384, ES512 on P-521) and Ed25519 (EdDSA). Pure: the time and the jti are passed in.

The algorithm comes from the key, or from an explicit `signing_alg` that must fit the key. No
error ever quotes the key or the text of an exception raised while reading it."""

from __future__ import annotations

import base64
import json
from typing import Any, Final

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from ..errors import TokenEndpointError

ASSERTION_TYPE: Final = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ASSERTION_LIFETIME: Final = 60  # seconds: short, as RFC 7523 §3 and the MCP spec advise
SIGNING_ALGS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                       "ES256", "ES384", "ES512", "EdDSA")
_HASHES: Final[dict[str, hashes.HashAlgorithm]] = {"256": hashes.SHA256(), "384": hashes.SHA384(),
                                                   "512": hashes.SHA512()}
_EC_ALGS: Final = {"secp256r1": ("ES256", 32), "secp384r1": ("ES384", 48), "secp521r1": ("ES512", 66)}

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


def _invalid(why: str) -> TokenEndpointError:
    return TokenEndpointError(f"private_key cannot sign a client assertion ({why})", "invalid_private_key")


def load_private_key(pem: str) -> PrivateKey:
    """The key of a PEM (PKCS#8, or the traditional RSA/EC forms), unencrypted."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except Exception as exc:  # its text may quote the key: name only its type
        raise _invalid(type(exc).__name__) from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise _invalid(f"unsupported key type {type(key).__name__}")
    return key


def algorithm_for(key: PrivateKey, explicit: str | None = None) -> str:
    """The JWS algorithm: `explicit` if it fits the key, else the key's own."""
    if isinstance(key, rsa.RSAPrivateKey):
        fits: tuple[str, ...] = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
        default = "RS256"
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        curve = _EC_ALGS.get(key.curve.name)
        if curve is None:
            raise _invalid(f"unsupported curve {key.curve.name}")
        default = curve[0]
        fits = (default,)
    else:
        fits, default = ("EdDSA",), "EdDSA"
    if explicit is None:
        return default
    if explicit not in fits:
        raise _invalid(f"signing_alg {explicit} does not fit a {_kind(key)} key; it takes {', '.join(fits)}")
    return explicit


def _kind(key: PrivateKey) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        return "RSA"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return f"EC {key.curve.name}"
    return "Ed25519"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign(key: PrivateKey, alg: str, data: bytes) -> bytes:
    """The JWS signature of `data` (RFC 7518 §3: raw r||s for ECDSA)."""
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    digest = _HASHES[alg[2:]]
    if isinstance(key, rsa.RSAPrivateKey):
        pad: Any = (padding.PKCS1v15() if alg.startswith("RS")
                    else padding.PSS(padding.MGF1(digest), digest.digest_size))
        return key.sign(data, pad, digest)
    r, s = decode_dss_signature(key.sign(data, ec.ECDSA(digest)))
    size = _EC_ALGS[key.curve.name][1]
    return r.to_bytes(size, "big") + s.to_bytes(size, "big")


def client_assertion(pem: str, client_id: str, audience: str, now: float, jti: str,
                     signing_alg: str | None = None, lifetime: int = ASSERTION_LIFETIME) -> str:
    """A signed assertion: iss = sub = client_id, aud = `audience` (the authorization server's
    issuer when known, else the token endpoint), iat, exp = iat + lifetime, jti."""
    key = load_private_key(pem)
    alg = algorithm_for(key, signing_alg)
    issued = int(now)
    header = {"alg": alg, "typ": "JWT"}
    claims = {"iss": client_id, "sub": client_id, "aud": audience, "iat": issued,
              "exp": issued + lifetime, "jti": jti}
    signing_input = (_b64(json.dumps(header, separators=(",", ":")).encode()) + "."
                     + _b64(json.dumps(claims, separators=(",", ":")).encode()))
    try:
        signature = sign(key, alg, signing_input.encode("ascii"))
    except Exception as exc:  # e.g. an RSA key too small for PS512: never the key's text
        raise _invalid(type(exc).__name__) from None
    return signing_input + "." + _b64(signature)
