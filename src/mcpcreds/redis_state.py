"""The shared state in Redis: buckets (one atomic script on the server's clock), logins
(encrypted, with a TTL), a single-flight lock with a lease, and events on pub/sub."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any, Final

import redis.asyncio as aioredis
from cryptography.fernet import Fernet, InvalidToken
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from .errors import StateUnavailable
from .logs import get_logger
from .oauth import Token
from .rates import Rate
from .secret import REDACTOR

CALL_TIMEOUT: Final = 1.0
DOWN_SECONDS: Final = 0.25
EVENTS: Final = "mcpcreds:events"
_log = get_logger("redis")

# Token bucket on the Redis server's clock (so the hosts' clock skew does not matter).
# KEYS[1] bucket hash. ARGV: burst, refill per second, cost, mode (take|peek|pause), pause seconds.
# Returns {granted 0/1, wait seconds, level, pause remaining} (floats as strings: Lua numbers
# would be truncated to integers in the reply).
BUCKET_SCRIPT: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local mode = ARGV[4]
local h = redis.call('HMGET', KEYS[1], 'level', 'updated', 'paused_until')
local level = tonumber(h[1]) or burst
local updated = tonumber(h[2]) or now
local paused = tonumber(h[3]) or 0
level = math.min(burst, level + math.max(0, now - updated) * rate)
if mode == 'pause' then
  local till = now + tonumber(ARGV[5])
  if till > paused then paused = till end
end
local wait = 0
if paused > now then wait = paused - now end
if level < cost then wait = math.max(wait, (cost - level) / rate) end
local granted = 0
if mode == 'take' and wait <= 0 then
  level = level - cost
  granted = 1
end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'updated', tostring(now),
           'paused_until', tostring(paused))
local idle = (burst - level) / rate + math.max(0, paused - now) + 60
redis.call('PEXPIRE', KEYS[1], math.ceil(idle * 1000))
return {granted, tostring(wait), tostring(level), tostring(math.max(0, paused - now))}
"""

# Drop the login only if it is still the one with that fingerprint ('' = any).
DROP_SCRIPT: Final = """
local fp = redis.call('HGET', KEYS[1], 'fingerprint')
if not fp then return 0 end
if ARGV[1] ~= '' and ARGV[1] ~= fp then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

UNLOCK_SCRIPT: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _tag(key: str) -> str:
    """All of a service's keys share a hash tag, so they live on one Redis Cluster slot."""
    return "mcpcreds:{" + key + "}"


def fernet_from_secret(secret: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(secret.encode()).digest()))


class RedisState:
    def __init__(self, url: str, state_key: str, password: str | None = None,
                 timeout: float = CALL_TIMEOUT, ca_file: str | None = None) -> None:
        # no retries inside redis-py: a lost Redis must fail (or degrade) fast, not stall requests
        options: dict[str, Any] = {"password": password, "socket_timeout": timeout,
                                   "socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 0)}
        if url.startswith("rediss://"):
            options["ssl_cert_reqs"] = "required"  # verify the server, always
            if ca_file:
                options["ssl_ca_certs"] = ca_file
        if url.startswith("unix://"):
            self.redis = aioredis.Redis(unix_socket_path=url[len("unix://"):], **options)
        else:
            self.redis = aioredis.Redis.from_url(url, **options)
        self._down_until = 0.0
        self.url = url
        self.fernet = fernet_from_secret(state_key)
        self.node = os.urandom(6).hex()  # who published an event
        self._bucket = self.redis.register_script(BUCKET_SCRIPT)
        self._drop = self.redis.register_script(DROP_SCRIPT)
        self._unlock = self.redis.register_script(UNLOCK_SCRIPT)
        self._listener: asyncio.Task[None] | None = None

    async def call(self, what: str, coro: Any) -> Any:
        """Run one Redis call; after a failure, fail at once for DOWN_SECONDS before trying again,
        so a Redis that hangs costs one timeout, not one per request."""
        if time.monotonic() < self._down_until:
            coro.close()
            raise StateUnavailable("shared state unreachable (a moment ago); retrying shortly")
        try:
            return await coro
        except (TimeoutError, RedisError, OSError) as exc:
            self._down_until = time.monotonic() + DOWN_SECONDS
            raise StateUnavailable(f"shared state unreachable ({what}: {type(exc).__name__}); "
                                   "requests fail until it is back") from None

    # -- buckets

    async def bucket(self, key: str, rate: Rate, cost: int, mode: str,
                     pause: float = 0.0) -> tuple[bool, float, float, float]:
        reply = await self.call("bucket", self._bucket(
            keys=[_tag(key) + ":bucket"], args=[rate.burst, rate.per_second, cost, mode, pause]))
        granted, wait, level, paused = reply
        return bool(int(granted)), float(wait), float(level), float(paused)

    # -- logins

    async def get_login(self, key: str) -> Token | None:
        blob = await self.call("get login", self.redis.hget(_tag(key) + ":login", "blob"))
        if blob is None:
            return None
        try:
            data = json.loads(self.fernet.decrypt(blob))
        except (InvalidToken, ValueError):
            _log.warning("a shared login could not be decrypted (another state_key?)", extra={"key": key})
            return None
        if data.get("key") != key:  # a login copied from another key's slot: not ours
            _log.warning("a shared login is bound to another key; ignored", extra={"key": key})
            return None
        REDACTOR.add(data["access_token"])
        return Token(data["access_token"], data["token_type"], data["obtained_at"], data["expires_at"],
                     data.get("scope"), data["fingerprint"])

    async def put_login(self, key: str, token: Token, ttl: float) -> None:
        blob = self.fernet.encrypt(json.dumps({
            "key": key, "access_token": token.access_token, "token_type": token.token_type,
            "obtained_at": token.obtained_at, "expires_at": token.expires_at, "scope": token.scope,
            "fingerprint": token.fingerprint}).encode())
        name = _tag(key) + ":login"
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(name, mapping={"blob": blob, "fingerprint": token.fingerprint})
        pipe.pexpire(name, max(1, int(ttl * 1000)))
        await self.call("store login", pipe.execute())

    async def drop_login(self, key: str, fingerprint: str | None) -> bool:
        return bool(await self.call("drop login", self._drop(keys=[_tag(key) + ":login"],
                                                               args=[fingerprint or ""])))

    async def lock(self, key: str, lease: float) -> str | None:
        token = os.urandom(8).hex()
        got = await self.call("lock", self.redis.set(_tag(key) + ":lock", token, nx=True,
                                                       px=max(1, int(lease * 1000))))
        return token if got else None

    async def unlock(self, key: str, token: str) -> None:
        await self.call("unlock", self._unlock(keys=[_tag(key) + ":lock"], args=[token]))

    # -- events

    async def publish(self, kind: str, key: str, **fields: Any) -> None:
        message = json.dumps({"kind": kind, "key": key, "node": self.node, **fields})
        await self.call("publish", self.redis.publish(EVENTS, message))

    def listen(self, handler: Callable[[dict[str, Any]], None]) -> None:
        """Deliver other sidecars' events to `handler`, reconnecting after a loss."""
        self._listener = asyncio.create_task(self._listen(handler))

    async def _listen(self, handler: Callable[[dict[str, Any]], None]) -> None:
        delay = 0.1
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(EVENTS)
                delay = 0.1
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                    if message is None or message.get("type") != "message":
                        continue
                    try:
                        event = json.loads(message["data"])
                    except ValueError:
                        continue
                    if isinstance(event, dict) and event.get("node") != self.node:
                        handler(event)
            except asyncio.CancelledError:
                raise
            except (TimeoutError, RedisError, OSError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except (TimeoutError, RedisError, OSError):
            return False

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        await self.redis.aclose()
