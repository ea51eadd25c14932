"""The shared state in Redis: buckets (one atomic script on the server's clock), logins
(encrypted, with a TTL), a single-flight lock with a lease, and events on pub/sub.

Whoever can write to Redis must not be able to mint a grant or send an event: the keys come from
`state_key` with HKDF (a salt kept in Redis, set once with SET NX so every sidecar agrees), logins
are Fernet-encrypted, grants and events carry an HMAC bound to what they are (kind and Redis key),
and a record or event that does not verify is ignored and logged once."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn, TypeVar, cast

import redis.asyncio as aioredis
from cryptography.exceptions import InvalidSignature
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError
from redis.retry import Retry

from ..core.logs import get_logger
from ..core.rates import Rate
from ..core.secret import REDACTOR
from ..credentials.tokens import Token
from ..errors import StateUnavailable
from .bucket_scripts import BUCKET_SCRIPT, LEASE_SCRIPT
from .lease_asks import MAX_BATCH, MAX_PAUSE, LeaseAsk, LeaseReply
from .redis_pipe import Pipe, items, pack

CALL_TIMEOUT: Final = 1.0
DOWN_SECONDS: Final = 0.25
EVENTS: Final = "mcpcreds:events"
SALT_KEY: Final = "mcpcreds:salt"
MAX_REFUSALS_LOGGED: Final = 1024
MAX_PACKED_TAKES: Final = 4096  # (key, rate) pairs whose take command is kept packed
_log = get_logger("redis")
T = TypeVar("T")

_TAKE_ARGS: Final = items(("take", 0.0, MAX_PAUSE))

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


def _bucket_keys(key: str) -> tuple[str, str]:
    """The bucket's hash and its leases' (bucket_scripts.py)."""
    tag = _tag(key)
    return tag + ":bucket", tag + ":leases"


def _bound(kind: str, name: str) -> bytes:
    """What a MAC is bound to, length-prefixed so no two (kind, name) pairs read the same."""
    return f"mcpcreds/{kind}/{len(name)}:{name}\n".encode()


@dataclass(frozen=True, slots=True)
class StateKeys:
    """Keys derived from state_key with HKDF and the deployment's salt: one for encrypting logins,
    another for the HMAC on grants and events."""

    salt: bytes
    fernet: Fernet
    mac_key: bytes

    def _mac(self, kind: str, name: str, payload: bytes) -> hmac.HMAC:
        mac = hmac.HMAC(self.mac_key, hashes.SHA256())
        mac.update(_bound(kind, name) + payload)
        return mac

    def seal(self, kind: str, name: str, payload: bytes) -> bytes:
        """`payload` with an HMAC (hex, then a dot) bound to the record's kind and Redis key."""
        return self._mac(kind, name, payload).finalize().hex().encode() + b"." + payload

    def open(self, kind: str, name: str, sealed: bytes) -> bytes | None:
        """The payload if its HMAC is valid for this kind and name, else None."""
        tag, dot, payload = sealed.partition(b".")
        try:
            if not dot or len(tag) != 64:
                return None
            self._mac(kind, name, payload).verify(bytes.fromhex(tag.decode("ascii")))
        except (ValueError, InvalidSignature):
            return None
        return payload


def derive_keys(state_key: str, salt: bytes) -> StateKeys:
    def hkdf(purpose: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt,
                    info=b"mcpcreds " + purpose).derive(state_key.encode())

    return StateKeys(salt, Fernet(base64.urlsafe_b64encode(hkdf(b"login encryption v1"))),
                     hkdf(b"record mac v1"))


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
        self._state_key = state_key
        self._keys: StateKeys | None = None
        self._refused: set[tuple[str, str]] = set()
        self.refusals = 0  # records and events that failed verification
        self.node = os.urandom(6).hex()  # who published an event
        self._bucket_sha = self.redis.register_script(BUCKET_SCRIPT).sha
        self._lease = self.redis.register_script(LEASE_SCRIPT)
        self._pipe = Pipe(self.redis.connection_pool.make_connection, timeout)
        self._takes: dict[tuple[str, Rate], bytes] = {}  # _bucket_command's
        self._drop = self.redis.register_script(DROP_SCRIPT)
        self._unlock = self.redis.register_script(UNLOCK_SCRIPT)
        self._listener: asyncio.Task[None] | None = None
        # event kind -> the part of the state that takes it (grants.py's "revoke"), not the listener
        self.taps: dict[str, Callable[[dict[str, Any]], None]] = {}

    async def call(self, what: str, coro: Any) -> Any:
        """Run one Redis call; after a failure, fail at once for DOWN_SECONDS before trying again,
        so a Redis that hangs costs one timeout, not one per request."""
        if time.monotonic() < self._down_until:
            coro.close()
            self._still_down()
        try:
            return await coro
        except (TimeoutError, RedisError, OSError) as exc:
            self._failed(what, exc)

    @staticmethod
    def _still_down() -> NoReturn:
        raise StateUnavailable("shared state unreachable (a moment ago); retrying shortly")

    def _failed(self, what: str, exc: BaseException) -> NoReturn:
        self._down_until = time.monotonic() + DOWN_SECONDS
        raise StateUnavailable(f"shared state unreachable ({what}: {type(exc).__name__}); "
                               "requests fail until it is back") from None

    # -- keys

    async def keys(self, refresh: bool = False) -> StateKeys:
        """The keys for the salt in Redis. The first sidecar sets the salt (SET NX) and the others
        read it; `refresh` reads it again and sets ours back if Redis lost it (a restart without
        persistence), so sidecars started before and after the loss agree again."""
        if self._keys is not None and not refresh:
            return self._keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(SALT_KEY, self._keys.salt if self._keys is not None else os.urandom(16), nx=True)
        pipe.get(SALT_KEY)
        _, salt = await self.call("read salt", pipe.execute())
        if salt is None:
            raise StateUnavailable("shared state: the key salt vanished as it was set; try again")
        if self._keys is None or salt != self._keys.salt:
            self._keys = derive_keys(self._state_key, bytes(salt))
        return self._keys

    async def seal(self, kind: str, name: str, payload: bytes) -> bytes:
        return (await self.keys(refresh=True)).seal(kind, name, payload)

    async def unseal(self, kind: str, name: str, sealed: bytes) -> bytes | None:
        return await self._verified(kind, name, lambda keys: keys.open(kind, name, sealed))

    async def _verified(self, kind: str, name: str, read: Callable[[StateKeys], T | None]) -> T | None:
        """`read` with our keys, then (if that fails) with the salt read again: None, logged once,
        if the record still does not verify."""
        keys = await self.keys()
        value = read(keys)
        if value is None:
            fresh = await self.keys(refresh=True)
            if fresh is not keys:
                value = read(fresh)
        if value is None:
            self.refuse(kind, name)
        return value

    def refuse(self, kind: str, name: str) -> None:
        """Count a record or event that failed verification; log it the first time."""
        self.refusals += 1
        if (kind, name) in self._refused or len(self._refused) >= MAX_REFUSALS_LOGGED:
            return
        self._refused.add((kind, name))
        _log.warning(f"a shared {kind} failed verification and is ignored (forged, or another state_key)",
                     extra={"record": name})

    # -- buckets

    async def bucket(self, key: str, rate: Rate, cost: int, mode: str,
                     pause: float = 0.0) -> tuple[bool, float, float, float]:
        """One caller's take (or a peek, or a pause): (granted, wait, level, pause remaining)."""
        granted, wait, level, paused = await self.take_batch(key, rate, (cost,), mode, pause)
        return granted > 0, wait, level, paused

    async def take_batch(self, key: str, rate: Rate, costs: Sequence[int], mode: str = "take",
                         pause: float = 0.0) -> tuple[int, float, float, float]:
        """One run of the bucket script for callers in order (at most MAX_BATCH): how many of the
        first were granted, the wait for the next, the level and the pause remaining. The hot path:
        the call's error handling is `call`'s, written out, and the command comes packed."""
        if not 1 <= len(costs) <= MAX_BATCH:
            raise ValueError(f"a batch is 1 to {MAX_BATCH} costs")
        if time.monotonic() < self._down_until:
            self._still_down()
        try:
            try:
                reply = await self._pipe.send(self._bucket_command(key, rate, costs, mode, pause))
            except NoScriptError:  # the server lost it (a restart, SCRIPT FLUSH): load it again
                self._bucket_sha = await self.redis.script_load(BUCKET_SCRIPT)
                reply = await self._pipe.send(self._bucket_command(key, rate, costs, mode, pause))
        except (TimeoutError, RedisError, OSError) as exc:
            self._failed("bucket", exc)
        granted, wait, level, paused = reply
        return int(granted), float(wait), float(level), float(paused)

    def _bucket_command(self, key: str, rate: Rate, costs: Sequence[int], mode: str, pause: float) -> bytes:
        """EVALSHA of the bucket script, packed: KEYS[1], then burst, rate, the first cost, mode,
        pause, the longest pause and the further costs. What a key's takes share (all but the
        costs) is packed once per key and rate (the script's SHA1 is that of a constant)."""
        if mode != "take" or pause != 0.0:
            return pack(("EVALSHA", self._bucket_sha, 2, *_bucket_keys(key), rate.burst, rate.per_second,
                         costs[0], mode, pause, MAX_PAUSE, *costs[1:]))
        head = self._takes.get((key, rate))
        if head is None:
            if len(self._takes) >= MAX_PACKED_TAKES:
                self._takes.clear()
            head = self._takes[(key, rate)] = items(
                ("EVALSHA", self._bucket_sha, 2, *_bucket_keys(key), rate.burst, rate.per_second))
        return b"*%d\r\n%b%b%b%b" % (10 + len(costs), head, items(costs[:1]), _TAKE_ARGS, items(costs[1:]))

    async def lease(self, key: str, rate: Rate, ask: LeaseAsk) -> LeaseReply:
        """One run of the lease script (bucket_scripts.py) for a holder's grant or its release."""
        holding = ask.holding if ask.holding is not None else (-1.0, -1)
        reply = await self.call("lease", self._lease(keys=list(_bucket_keys(key)), args=[
            rate.burst, repr(rate.per_second), ask.lease, repr(ask.demand / rate.per), repr(ask.seconds),
            ask.spare,
            repr(holding[0] / rate.per if holding[0] >= 0 else -1.0), holding[1], 1 if ask.release else 0,
            repr(ask.leasable), repr(ask.least_shared / rate.per), repr(ask.least / rate.per)]))
        share, burst, initial, paused, dropped, *told = reply
        ids = tuple(t.decode("ascii", "replace") if isinstance(t, bytes) else str(t) for t in told)
        return LeaseReply(float(share) * rate.per, int(burst), int(initial), float(paused), ids,
                          int(dropped) == 1)

    # -- logins

    async def get_login(self, key: str) -> Token | None:
        name = _tag(key) + ":login"
        blob = await self.call("get login", self.redis.hget(name, "blob"))
        if blob is None:
            return None

        def read(keys: StateKeys) -> dict[str, Any] | None:
            try:
                data = json.loads(keys.fernet.decrypt(blob))
            except (InvalidToken, ValueError):
                return None
            # a login copied from another key's slot is not ours
            return data if isinstance(data, dict) and data.get("key") == key else None

        data = await self._verified("login", name, read)
        if data is None:
            return None
        REDACTOR.add(data["access_token"])
        return Token(data["access_token"], data["token_type"], data["obtained_at"], data["expires_at"],
                     data.get("scope"), data["fingerprint"])

    async def put_login(self, key: str, token: Token, ttl: float) -> None:
        keys = await self.keys(refresh=True)
        blob = keys.fernet.encrypt(json.dumps({
            "key": key, "access_token": token.access_token, "token_type": token.token_type,
            "obtained_at": token.obtained_at, "expires_at": token.expires_at, "scope": token.scope,
            "fingerprint": token.fingerprint}).encode())
        name = _tag(key) + ":login"
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(name, mapping={"blob": blob, "fingerprint": token.fingerprint})
        pipe.pexpire(name, max(1, int(ttl * 1000)))
        await self.call("store login", pipe.execute())

    # -- a person's login (login_share.py): encrypted like logins, bound to its key, no expiry

    async def get_stored_login(self, key: str) -> dict[str, Any] | None:
        name = _tag(key) + ":person"
        blob = await self.call("get stored login", self.redis.get(name))
        if blob is None:
            return None

        def read(keys: StateKeys) -> dict[str, Any] | None:
            try:
                data = json.loads(keys.fernet.decrypt(blob))
            except (InvalidToken, ValueError):
                return None
            return data if isinstance(data, dict) and data.get("key") == key else None

        return await self._verified("stored login", name, read)

    async def put_stored_login(self, key: str, record: dict[str, Any]) -> None:
        keys = await self.keys(refresh=True)
        blob = keys.fernet.encrypt(json.dumps({**record, "key": key}).encode())
        await self.call("store stored login", self.redis.set(_tag(key) + ":person", blob))

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
        message = json.dumps({"kind": kind, "key": key, "node": self.node, **fields}).encode()
        await self.call("publish", self.redis.publish(EVENTS, await self.seal("event", EVENTS, message)))

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
                    event = await self._event(message["data"])
                    if event is not None and event.get("node") != self.node:
                        tap = self.taps.get(str(event.get("kind")))
                        (tap or handler)(event)
            except asyncio.CancelledError:
                raise
            except (TimeoutError, RedisError, OSError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    # typed in redis-py 8, not in 5 to 7: called untyped in every one
                    await cast(Any, pubsub).aclose()

    async def _event(self, data: Any) -> dict[str, Any] | None:
        """A published event if its HMAC verifies, else None."""
        if not isinstance(data, bytes):
            return None
        try:
            payload = await self.unseal("event", EVENTS, data)
            event = json.loads(payload) if payload is not None else None
        except (StateUnavailable, ValueError):
            return None
        return event if isinstance(event, dict) else None

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except (TimeoutError, RedisError, OSError):
            return False

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        self._pipe.close()
        await self.redis.aclose()
