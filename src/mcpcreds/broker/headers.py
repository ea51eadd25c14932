"""The headers answer: what a server's credential adds to a request, encoded once for the wire."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ..core.http import Response


@dataclass(frozen=True, slots=True)
class HeadersResult:
    headers: Mapping[str, str]
    key: str
    expires_at: float | None
    fingerprint: str | None
    body: bytes  # the JSON answer, encoded once
    wire: bytes  # the whole keep-alive HTTP answer, for the hot path

    @classmethod
    def build(cls, headers: Mapping[str, str], key: str, expires_at: float | None,
              fp: str | None) -> HeadersResult:
        body = json.dumps({"headers": headers, "key": key, "expires_at": expires_at,
                           "fingerprint": fp}, separators=(",", ":")).encode()
        return cls(headers, key, expires_at, fp, body, Response(200, body).encode(keep_alive=True))


@dataclass(slots=True)
class CachedHeaders:
    result: HeadersResult
    fresh_until: float  # clock.time()
