"""Which server, which cache key, which headers: the sidecar's decisions, apart from I/O."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from . import __version__
from .clock import Clock
from .config import Config, Target
from .errors import SecretUnavailable, UnknownServer
from .logs import get_logger
from .metrics import Metrics
from .sources import SecretResolver
from .wire import Response

SECRET_CACHE_TTL: Final = 2.0
_log = get_logger("broker")


def fingerprint(token: str) -> str:
    """The first 8 hex of SHA-256: enough to tell tokens apart, useless to an attacker."""
    return hashlib.sha256(token.encode()).hexdigest()[:8]


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
class _Cached:
    result: HeadersResult
    fresh_until: float  # monotonic


class Broker:
    """Serves headers for a server name or cache key; static templates are resolved at request
    time and kept for `SECRET_CACHE_TTL` seconds (or until a rotation notice drops them)."""

    def __init__(self, config: Config, resolver: SecretResolver, clock: Clock, metrics: Metrics,
                 secret_cache_ttl: float = SECRET_CACHE_TTL) -> None:
        self.config = config
        self.resolver = resolver
        self.clock = clock
        self.metrics = metrics
        self.secret_cache_ttl = secret_cache_ttl
        self._cache: dict[str, _Cached] = {}
        self._resolving: dict[str, asyncio.Future[HeadersResult]] = {}
        self._servers_body = self._encode_servers()
        self.health_body = json.dumps({"status": "ok", "version": __version__}).encode()

    # -- config

    def reload(self, config: Config, resolver: SecretResolver) -> None:
        self.config = config
        self.resolver = resolver
        self._cache.clear()
        self._servers_body = self._encode_servers()

    def _encode_servers(self) -> bytes:
        specs = [t.spec.to_dict() for t in self.config.servers.values()]
        return json.dumps({"servers": specs}, separators=(",", ":")).encode()

    @property
    def servers_body(self) -> bytes:
        return self._servers_body

    def target(self, name: str) -> Target:
        target = self.config.target(name)
        if target is None:
            raise UnknownServer(f"unknown server {name!r}")
        return target

    # -- headers

    def cached_headers(self, target: Target) -> HeadersResult | None:
        """The answer without any I/O, if one is fresh (the hot path)."""
        entry = self._cache.get(target.name)
        if entry is not None and entry.fresh_until > self.clock.monotonic():
            return entry.result
        return None

    async def headers(self, target: Target) -> HeadersResult:
        cached = self.cached_headers(target)
        if cached is not None:
            return cached
        pending = self._resolving.get(target.name)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[HeadersResult] = asyncio.get_running_loop().create_future()
        self._resolving[target.name] = future
        try:
            result = await self._resolve(target)
            future.set_result(result)
            return result
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody else must log it
            raise
        finally:
            del self._resolving[target.name]

    async def _resolve(self, target: Target) -> HeadersResult:
        try:
            headers = await asyncio.to_thread(self.resolver.render_all, target.headers.items())
        except SecretUnavailable as exc:
            self.metrics.inc("mcpcreds_secret_errors_total", (("key", target.key),),
                             help_text="Secret lookups that failed, by cache key.")
            _log.warning("secret unavailable", extra={"key": target.key, "error": exc.message})
            raise
        result = HeadersResult.build(headers, target.key, None, None)
        if self.secret_cache_ttl > 0:
            self._cache[target.name] = _Cached(result, self.clock.monotonic() + self.secret_cache_ttl)
        return result

    def forget_secret(self, name: str) -> list[str]:
        """Drop cached headers that use secret `name`; return the cache keys affected."""
        keys: set[str] = set()
        for target in (*self.config.services.values(), *self.config.servers.values()):
            if name in target.secret_names:
                self._cache.pop(target.name, None)
                keys.add(target.key)
        return sorted(keys)

    def forget_all(self) -> None:
        self._cache.clear()

    # -- status

    def status(self) -> dict[str, Any]:
        servers = []
        for target in (*self.config.services.values(), *self.config.servers.values()):
            servers.append({
                "name": target.name,
                "key": target.key,
                "endpoint": target.endpoint,
                "auth": target.auth_kind or "headers",
                "rate": str(target.rate) if target.rate else None,
                "secrets": sorted(target.secret_names),
                "tags": sorted(target.tags),
            })
        return {"version": __version__, "config": self.config.path, "servers": servers,
                "logins": [], "buckets": []}
