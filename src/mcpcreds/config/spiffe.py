"""`auth = { kind = "spiffe", ... }` (parsed, pure): a SPIFFE identity the sidecar presents.

- `svid = "jwt"`, `jwt_svid_file`: the JWT-SVID in that file (written by the SPIRE agent or
  spiffe-helper) is sent as `Authorization: Bearer <JWT-SVID>`. The file is re-read when it
  changes (its inode, size, mtime or ctime), with the checks of the `dir:` source: no symbolic
  link, a regular file, ours (or root's), mode 0600 or 0400, at most `MAX_JWT_BYTES`. The token's
  `sub` must be a SPIFFE ID and its `exp` in the future; with `audience`, its `aud` must name it
  (a JWT-SVID minted for another server is never sent here). Served by the headers route, the
  gateway and the library alike.
- `svid = "x509"`, `svid_file`, `key_file`, `bundle_file` (PEM): the gateway's upstream connections
  present that client certificate and verify the server with the trust bundle (only), reloaded
  when a file changes. A direct client has no such connection: `check` requires
  `expose = "proxy"` and an https:// endpoint. The key file has the JWT file's checks; the
  certificate and the bundle the same but their mode (they are public).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from .reader import Collector

SPIFFE_KEYS: Final = ("kind", "svid", "jwt_svid_file", "audience", "svid_file", "key_file", "bundle_file")
JWT_KEYS: Final = ("jwt_svid_file", "audience")
X509_KEYS: Final = ("svid_file", "key_file", "bundle_file")
MAX_JWT_BYTES: Final = 16 * 1024
MAX_PEM_BYTES: Final = 256 * 1024
_MAX_PATH: Final = 4096


class SvidError(ValueError):
    """A JWT-SVID that cannot be used; the message never repeats the token or its claims."""


@dataclass(frozen=True, slots=True)
class SpiffeAuth:
    svid: str  # "jwt" or "x509"
    jwt_svid_file: str | None = None
    audience: str | None = None
    svid_file: str | None = None
    key_file: str | None = None
    bundle_file: str | None = None


@dataclass(frozen=True, slots=True)
class JwtSvid:
    token: str
    spiffe_id: str
    expires_at: float


def _path(c: Collector, where: str, value: Any) -> str | None:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value or len(value) > _MAX_PATH \
            or value.endswith("/"):
        c.error(where, "required: the absolute path of a file")
        return None
    return value


def parse_spiffe_auth(c: Collector, path: str, t: Mapping[str, Any]) -> SpiffeAuth | None:
    """Validate an `auth` table of kind `spiffe` (errors carry their TOML path, never a value)."""
    c.keys(path, t, SPIFFE_KEYS)
    svid = t.get("svid")
    if svid not in ("jwt", "x509"):
        c.error(f"{path}.svid", "required: \"jwt\" (a bearer JWT-SVID) or \"x509\" (an mTLS client identity)")
        return None
    own, other = (JWT_KEYS, X509_KEYS) if svid == "jwt" else (X509_KEYS, JWT_KEYS)
    ok = True
    for key in other:
        if key in t:
            c.error(f"{path}.{key}", f"only with svid = \"{'x509' if svid == 'jwt' else 'jwt'}\"")
            ok = False
    files = {key: _path(c, f"{path}.{key}", t.get(key)) for key in own if key != "audience"}
    audience = t.get("audience")
    if audience is not None and (not isinstance(audience, str) or not 0 < len(audience) <= 512):
        c.error(f"{path}.audience", "expected the audience the JWT-SVID must name (1 to 512 characters)")
        ok = False
    if not ok or any(v is None for v in files.values()):
        return None
    return SpiffeAuth(str(svid), audience=audience, **files)


def spiffe_entry_check(c: Collector, path: str, t: Mapping[str, Any], endpoint: str | None,
                       expose: str) -> None:
    """An x509 SVID is presented only by the gateway's connections: said by `check`, not at the
    first request (a direct client would reach the server without the client certificate)."""
    auth = t.get("auth")
    if not isinstance(auth, dict) or auth.get("kind") != "spiffe" or auth.get("svid") != "x509":
        return
    if expose != "proxy":
        c.error(f"{path}.expose", "auth kind \"spiffe\" with svid = \"x509\" is an mTLS identity only the "
                                  "gateway's connections present (a direct client would reach the server "
                                  "without it): set expose = \"proxy\" and use /mcp/NAME")
    if endpoint is not None and urlsplit(endpoint).scheme != "https":
        c.error(f"{path}.endpoint", "auth kind \"spiffe\" with svid = \"x509\" needs an https:// endpoint "
                                    "(the client certificate is presented in the TLS handshake)")


def _b64json(part: str) -> Any:
    try:
        return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (binascii.Error, ValueError):
        raise SvidError("not a JWT (a part is not base64url JSON)") from None


def parse_jwt_svid(text: str, now: float, audience: str | None) -> JwtSvid:
    """The JWT-SVID in a file's text (one token, surrounding whitespace ignored), checked for what
    makes it unusable here: not a JWS compact token, `sub` not a SPIFFE ID, expired, or not
    for `audience`. The signature is the server's to verify."""
    token = text.strip()
    parts = token.split(".")
    if len(parts) != 3 or not all(parts) or any(ch.isspace() for ch in token):
        raise SvidError("not a JWT (expected one compact JWS: three dot-separated parts)")
    header, claims = _b64json(parts[0]), _b64json(parts[1])
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise SvidError("not a JWT (the header or the claims are not a JSON object)")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub.startswith("spiffe://") or len(sub) > 2048:
        raise SvidError("not a JWT-SVID: its sub is not a SPIFFE ID (spiffe://...)")
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float) or not math.isfinite(exp):
        raise SvidError("not a JWT-SVID: it has no numeric exp (expiry)")
    if exp <= now:
        raise SvidError(f"the JWT-SVID of {sub} expired at {int(exp)} (is the SPIFFE agent or helper "
                        "that writes the file running?)")
    if audience is not None:
        aud = claims.get("aud")
        names = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if audience not in names:
            raise SvidError(f"the JWT-SVID of {sub} is not for the configured audience (its aud does not "
                            "name it): not sent")
    return JwtSvid(token, sub, float(exp))
