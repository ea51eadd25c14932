"""The body of `POST /v1/servers/{name}/sign`, checked once for every signer (AAuth, SigV4): the
method, a URL of the server's own origin, and the headers to cover, all bounded; what was sent
is never echoed. The body itself never reaches the sidecar (only its digest)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from ..config.model import Target
from ..errors import InvalidRequest

MAX_SIGN_HEADERS: Final = 32
MAX_HEADER_VALUE: Final = 8192
MAX_URL: Final = 2048
_METHOD: Final = re.compile(r"[A-Z]{1,16}\Z")
_FIELDS: Final = frozenset({"method", "url", "headers", "content_digest"})


@dataclass(frozen=True, slots=True)
class SignRequest:
    method: str
    url: str
    headers: dict[str, str]


def parse_sign_request(target: Target, body: dict[str, Any], *, header_ok: Callable[[str, str], bool],
                       values: str = "string values", extra: frozenset[str] = frozenset()) -> SignRequest:
    """The request a direct client wants signed. `header_ok` is the signer's own rule for a header
    name and value (beyond types and sizes); `values` names what it accepts in the error; `extra`
    the fields of its own it checks itself."""
    if "body" in body:
        raise InvalidRequest("the body is never sent to the sidecar: send content_digest (RFC 9530)")
    if set(body) - _FIELDS - extra:
        raise InvalidRequest("unknown fields: the body holds " + ", ".join(sorted(_FIELDS | extra)))
    method = body.get("method")
    if not isinstance(method, str) or not _METHOD.match(method):
        raise InvalidRequest("method must be an upper-case HTTP method")
    url = body.get("url")
    if not isinstance(url, str) or len(url) > MAX_URL or not same_origin(url, target.endpoint):
        raise InvalidRequest(f"url must be a URL of server {target.name!r}'s origin (scheme, host, port)")
    headers = body.get("headers", {})
    if not isinstance(headers, dict) or len(headers) > MAX_SIGN_HEADERS or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_HEADER_VALUE and header_ok(k, v)
            for k, v in headers.items()):
        raise InvalidRequest(f"headers must be an object of at most {MAX_SIGN_HEADERS} header names "
                             f"to {values}")
    return SignRequest(method, url, headers)


def same_origin(url: str, endpoint: str) -> bool:
    try:
        a, b = urlsplit(url), urlsplit(endpoint)
        return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port) and not a.username \
            and not a.password and not a.fragment and bool(a.hostname)
    except ValueError:
        return False
