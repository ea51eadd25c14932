"""Which server, which cache key, which headers: the sidecar's decisions, apart from the socket."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..config.model import LOGIN_GRANTS, Config, Target, jwt_svid_file, spiffe_of
from ..config.servers import proxy_only_keys
from ..config.spiffe import JwtSvid, SpiffeAuth
from ..core.audit import AuditLog
from ..core.clock import Clock
from ..core.logs import get_logger
from ..core.metrics import Labels, Metrics
from ..core.rates import Rate
from ..core.secret import REDACTOR
from ..core.tasks import spawn
from ..core.version import installed_version
from ..credentials.login_store import entry_name
from ..credentials.logins import LoginCache
from ..credentials.sources import SecretResolver
from ..credentials.spiffe import JwtSvidFiles
from ..credentials.tokens import Token
from ..errors import (
    InvalidRequest,
    McpcredsError,
    SecretUnavailable,
    StateUnavailable,
    TokenEndpointError,
    UnknownSecret,
    UnknownServer,
)
from ..limits.buckets import UNLIMITED, Limiter
from ..limits.leases import MAX_LEASE_ID, LeaseBook
from ..net.egress import EgressPolicy
from ..state.bucket_scripts import MAX_LEASES_PER_KEY
from ..state.lease_asks import MAX_PAUSE
from ..state.shared import SharedLimiter, build_state
from .events import EventHub, Subscription
from .headers import CachedHeaders, HeadersResult
from .leasing import LeaseService, release_shared
from .refresh import refresh_login

if TYPE_CHECKING:  # imported where they are used: a sidecar without a login or gateway call imports no httpx
    import httpx

    from ..credentials.discovery import Discovery
    from ..credentials.spiffe import X509Source

# Connections of the gateway's pool per upstream (host, port): SSE streams hold theirs for long,
# so the gateway has its own pool, and logins are never queued behind open streams.
GATEWAY_CONNECTIONS: Final = 1000
# a server name (the config's grammar) or a cache key made of one
_SERVER_NAME: Final = re.compile(r"(?:(?:service|mcp):)?[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}\Z")
_log = get_logger("broker")


@dataclass(frozen=True, slots=True)
class Actor:
    """Who asked: the peer's uid and pid, the id of the grant it acted within, if any, and the
    trace of its request while traces are on (in its audit lines)."""

    uid: int
    pid: int
    grant: str | None = None
    trace_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.trace_id is not None:
            return {"uid": self.uid, "pid": self.pid, "grant": self.grant, "trace_id": self.trace_id}
        return {"uid": self.uid, "pid": self.pid, "grant": self.grant}


@dataclass(slots=True)
class _PauseBudget:
    """The pause grant holders have set on one key in the current window (monotonic seconds)."""

    window_start: float
    used: float = 0.0
    until: float = 0.0  # the end of the last pause they set


class Broker:
    """Serves headers for a server name or cache key. Static templates are resolved at request
    time and kept for `secrets.cache_ttl` seconds (or until a rotation notice drops them); logins
    come from the login cache, one per cache key."""

    def __init__(self, config: Config, resolver: SecretResolver, clock: Clock, metrics: Metrics,
                 audit: AuditLog | None = None) -> None:
        self.config = config
        self.resolver = resolver
        self.clock = clock
        self.metrics = metrics
        self.audit = audit or AuditLog(None, clock)
        self._http: dict[tuple[str, EgressPolicy, bool, SpiffeAuth | None], httpx.AsyncClient] = {}
        self.jwt_svids = JwtSvidFiles(clock.time)  # auth kind "spiffe", svid "jwt" (spiffe.py)
        self.x509_sources: dict[SpiffeAuth, X509Source] = {}  # ... "x509": the gateway's identities
        self._discovery: Discovery | None = None
        parts = build_state(config, resolver, clock, self._fetch_login,
                            lambda: self.config.sidecar.refresh_ahead)
        self.limiter = parts.limiter
        self.grants = parts.grants
        self.pins = parts.pins  # tool pins (state/pins.py): the gateway and /v1/tools read them
        self.sharing = parts.logins
        self.logins = LoginCache(self.sharing.fetch, clock, config.sidecar.refresh_ahead)
        self._cache: dict[str, CachedHeaders] = {}
        self._resolving: dict[str, asyncio.Task[HeadersResult]] = {}
        self.server_specs = self._specs()
        self.proxy_only_keys = proxy_only_keys(config.services.values(), config.servers.values())
        self._forced_at: dict[str, float] = {}  # key -> when an invalidation last dropped its login
        self._pause_budgets: dict[str, _PauseBudget] = {}
        self._paused_by: dict[str, tuple[float, Actor]] = {}  # key -> (paused until, who set it)
        self.leases = LeaseBook()  # capacity leases (leases.py; granted by leasing.py)
        self.events = EventHub(on_close=self._events_closed)  # GET /v1/events (events.py)
        self.lease_service = LeaseService(self.limiter, self.leases, self.events, clock,
                                          lambda: self.config.rates, self.headers)
        self._background: set[asyncio.Task[None]] = set()
        if isinstance(self.limiter, SharedLimiter):
            self.limiter.on_told = self.nudge_leases
        self._served_fp: dict[str, str] = {}  # key -> fingerprint of the login last served

    @property
    def version(self) -> str:
        return installed_version()  # read once (importlib.metadata: ~10 ms), by the first health or status

    @functools.cached_property
    def health_body(self) -> bytes:
        return json.dumps({"status": "ok", "version": self.version}).encode()

    def _events_closed(self, sub: Subscription) -> None:
        """A client's event stream closed: its process is gone or it has stopped using its leases,
        so their shares come back now. One the sidecar cut off lapses instead (its holder may
        spend it until the lease ends)."""
        if sub.cut_off:
            return
        held = self.leases.leases_of(sub.id)
        if self.leases.release_subscriber(sub.id):
            _log.info("leases released: their holder's event stream closed", extra={"uid": sub.uid})
            for key in self.config.rates:
                self.lease_changed(key)
            if isinstance(self.limiter, SharedLimiter):  # the shared bucket keeps them aside
                spawn(self._background, self._release_shared(held))

    def nudge_leases(self, key: str, leases: Iterable[str], publish: bool = True) -> None:
        """Tell these lease holders to renew now (the shared state's split changed their part):
        ours on their event stream, the sidecar's own lease at once, the others' sidecars through
        the shared state (`publish`)."""
        subscribers, elsewhere = [], []
        for lease in leases:
            if (held_key := self.leases.key_of(lease)) is not None:
                if held_key == key and (sub := self.leases.subscriber_of(lease)) is not None:
                    subscribers.append(sub)
            elif not (isinstance(self.limiter, SharedLimiter) and self.limiter.reserves.nudge(lease)):
                elsewhere.append(lease)
        if subscribers:
            self.events.send(subscribers, "lease", key)
        if elsewhere and publish and isinstance(self.limiter, SharedLimiter):
            spawn(self._background, self._publish_nudge(key, elsewhere))

    async def _publish_nudge(self, key: str, leases: list[str]) -> None:
        assert isinstance(self.limiter, SharedLimiter)
        with contextlib.suppress(McpcredsError):  # they renew at half their lease instead
            await self.limiter.state.publish("nudge", key, leases=leases)

    async def _release_shared(self, held: list[tuple[str, str]]) -> None:
        assert isinstance(self.limiter, SharedLimiter)
        try:
            await release_shared(self.limiter, self.config.rates, held)
        except McpcredsError:  # the shared state is away: the leases lapse there instead
            _log.warning("leases could not be released in the shared state; they lapse")

    def lease_changed(self, key: str) -> None:
        """Give the shared bucket of `key` its rate less what is leased now (after a grant, a
        release, a lapse): its waiters are served at that rate from now, not at the next caller."""
        target = self.config.targets_by_key.get(key)
        if target is not None and isinstance(self.limiter, Limiter):
            self.limiter.take_up_to(key, self.rate_of(target), 0)

    # -- shared state

    async def start(self) -> None:
        self.sharing.start(self._on_event)

    def _on_event(self, event: dict[str, Any]) -> None:
        """Another sidecar changed a login (stop serving our local copy of the old one), paused a
        bucket after an upstream 429 (tell our lease holders), or leased so that some of our
        holders should renew now."""
        key, fp = str(event.get("key")), event.get("fingerprint")
        kind = event.get("kind")
        if kind == "login":
            current = self.logins.peek(key)
            if current is not None and current.fingerprint != fp:
                self.logins.drop(key)
                self._drop_cached({key})
                self.events.publish("login", key, fingerprint=fp if isinstance(fp, str) else None)
                _log.info("login dropped by another sidecar", extra={"key": key, "fingerprint": fp})
            self.sharing.notify(key)
        elif kind == "pause":  # a lease holder of ours must stop now, not at its next renewal
            seconds = event.get("seconds")
            if isinstance(seconds, int | float) and not isinstance(seconds, bool) \
                    and 0 <= seconds <= MAX_PAUSE and key in self.config.rates:
                if isinstance(self.limiter, SharedLimiter):
                    self.limiter.reserves.drop(key)
                self.events.publish("pause", key, seconds=round(float(seconds), 3))
        elif kind == "nudge":  # holders of ours the shared state's split changed: renew now
            leases = event.get("leases")
            if isinstance(leases, list) and len(leases) <= MAX_LEASES_PER_KEY and key in self.config.rates \
                    and all(isinstance(lease, str) and len(lease) <= MAX_LEASE_ID for lease in leases):
                self.nudge_leases(key, leases, publish=False)
        elif kind == "invalidate" and self.logins.invalidate(key, fp if isinstance(fp, str) else None):
            self._drop_cached({key})
            self.events.publish("invalidate", key, fingerprint=fp if isinstance(fp, str) else None)
            _log.info("login dropped by another sidecar", extra={"key": key, "fingerprint": fp})

    # -- config

    def reload(self, config: Config, resolver: SecretResolver) -> None:
        old, old_rates = self.config.targets_by_key, self.config.rates
        self.config = config
        self.resolver = resolver
        self.logins.refresh_ahead = config.sidecar.refresh_ahead
        new = config.targets_by_key
        # a login survives a reload only if how it is obtained did not change
        changed = {k for k, t in old.items()
                   if k not in new or (new[k].login, new[k].egress) != (t.login, t.egress)}
        self.logins.forget(changed)  # their timers and in-flight fetches too
        self._resolving.clear()  # a resolution under way serves its callers, not the new config
        if self._discovery is not None:
            self._discovery.forget()
        self.limiter.reconfigure(self._shared_rates(config))
        for key in old_rates.keys() | config.rates.keys():
            if old_rates.get(key) != config.rates.get(key):
                self.events.publish("lease", key)  # its lease holders renew now, on the new rate
        self._cache.clear()
        self.server_specs = self._specs()
        self.proxy_only_keys = proxy_only_keys(config.services.values(), config.servers.values())

    def _shared_rates(self, config: Config) -> dict[str, Rate]:
        """The configured rates, less what is leased (a reload does not hand leased shares out twice)."""
        now = self.clock.monotonic()
        return {k: self.leases.shared_rate(k, r, now) if self.leases.holds(k) else r
                for k, r in config.rates.items()}

    def serves_headers(self, target: Target) -> bool:
        """Whether the credential of `target` may be handed to callers (`headers`, `call`). It is
        judged per credential, like tags: when any name of a cache key is `expose = "proxy"`,
        the login behind every name of that key stays inside the sidecar."""
        return target.gateway.serves_headers and target.key not in self.proxy_only_keys

    def rate_of(self, target: Target) -> Rate:
        """The rate of the bucket callers without a lease share: the configured one less what is
        leased (leases.py)."""
        rate = target.rate or UNLIMITED
        if self.leases.holds(target.key):
            return self.leases.shared_rate(target.key, rate, self.clock.monotonic())
        return rate

    def _specs(self) -> dict[str, Any]:
        return {"servers": [t.spec_dict() for t in self.config.servers.values()]}

    def target(self, name: str) -> Target:
        """The server (or catalog entry) `name` names. A name that is not configured is never
        echoed: a masked echo would tell the caller it had guessed a live secret."""
        target = self.config.target(name)
        if target is None:
            if not _SERVER_NAME.match(name):
                raise InvalidRequest("invalid server name: letters, digits, '_', '.', '-' (at most 128), "
                                     "or a cache key")
            raise UnknownServer("unknown server: no configured server or cache key has that name")
        return target

    async def aclose(self) -> None:
        if isinstance(self.limiter, SharedLimiter):  # our holders' shares, back to the others now
            await self._release_shared(self.leases.all_leases())
        self.events.close()
        self.logins.close()
        self.limiter.close()
        for task in list(self._background):
            task.cancel()
        if isinstance(self.limiter, SharedLimiter):
            await self.limiter.aclose()
        await self.sharing.aclose()
        for client in self._http.values():
            await client.aclose()

    # -- headers

    @property
    def secret_cache_ttl(self) -> float:
        return self.config.secrets.cache_ttl

    def cached_headers(self, target: Target) -> HeadersResult | None:
        """The answer without any I/O, if one is fresh (the hot path). Static headers a little
        past their freshness are still served while they are re-read in the background, so a
        slow source (a keyring is ~25 ms a call) never stalls a request once warm."""
        entry = self._cache.get(target.name)
        if entry is None:
            return None
        now = self.clock.time()
        if (svid_file := jwt_svid_file(target)) is not None and (entry.fresh_until <= now or
                                                                 self.jwt_svids.changed(svid_file)):
            return None  # a JWT-SVID: never served past its expiry, read again once its file changed
        if entry.fresh_until <= now:
            if target.login is not None or now >= entry.fresh_until + self.secret_cache_ttl:
                return None
            self._start_resolving(target)
            return entry.result
        if target.login is not None:
            token = self.logins.current(target.key)
            if token is None or token.fingerprint != entry.result.fingerprint:
                return None
        return entry.result

    async def headers(self, target: Target) -> HeadersResult:
        cached = self.cached_headers(target)
        if cached is not None:
            return cached
        task = self._resolving.get(target.name)
        if task is None:
            task = self._start_resolving(target)
        elif target.login is not None:
            self.logins.note_shared(target.key)
        return await asyncio.shield(task)

    def _start_resolving(self, target: Target) -> asyncio.Task[HeadersResult]:
        """One resolution per target at a time, as its own task: a caller that goes away
        cancels only its wait, never the others'."""
        task = self._resolving.get(target.name)
        if task is None:
            task = asyncio.ensure_future(self._resolve(target))
            self._resolving[target.name] = task
            task.add_done_callback(functools.partial(self._resolved, target.name))
        return task

    def _resolved(self, name: str, task: asyncio.Task[HeadersResult]) -> None:
        if self._resolving.get(name) is task:
            del self._resolving[name]
        if not task.cancelled():
            task.exception()  # retrieved: the waiters re-raise it, nobody else must log it

    async def _resolve(self, target: Target) -> HeadersResult:
        static = await self.render_templates(target.key, target.headers.items()) if target.headers else {}
        expires_at = None
        if (spiffe := spiffe_of(target)) is not None and spiffe.jwt_svid_file is not None:
            svid = await self._jwt_svid(target.key, spiffe.jwt_svid_file, spiffe.audience)
            static = {**static, "Authorization": f"Bearer {svid.token}"}
            expires_at = svid.expires_at
        now = self.clock.time()
        fresh_until = min(now + self.secret_cache_ttl, expires_at or now + self.secret_cache_ttl)
        if target.login is None:
            result = HeadersResult.build(static, target.key, expires_at, None)
        else:
            token = await self.logins.get(target)
            headers = {"Authorization": f"Bearer {token.access_token}"}
            headers.update((k, v) for k, v in static.items() if k.lower() != "authorization")
            REDACTOR.add(token.access_token, owner=f"login:{target.key}")  # forgets the one it replaces
            result = HeadersResult.build(headers, target.key, token.expires_at, token.fingerprint)
            if token.fingerprint is not None and self._served_fp.get(target.key) != token.fingerprint:
                if target.key in self._served_fp:  # a new login: leased clients drop the old one
                    self.events.publish("login", target.key, fingerprint=token.fingerprint)
                self._served_fp[target.key] = token.fingerprint
            fresh_until = min(fresh_until, self.logins.refresh_time(target.key, token))
        if self.secret_cache_ttl > 0:
            self._cache[target.name] = CachedHeaders(result, fresh_until)
        return result

    async def render_templates(self, key: str, templates: Iterable[tuple[str, Any]]) -> dict[str, str]:
        try:
            return await asyncio.to_thread(self.resolver.render_all, list(templates))
        except SecretUnavailable as exc:
            self.metrics.inc("mcpcreds_secret_errors_total", (("key", key),),
                             help_text="Secret lookups that failed, by cache key.")
            _log.warning("secret unavailable", extra={"key": key, "error": exc.message})
            raise

    async def _jwt_svid(self, key: str, path: str, audience: str | None) -> JwtSvid:
        try:
            return await asyncio.to_thread(self.jwt_svids.read, path, audience)
        except SecretUnavailable as exc:
            self.metrics.inc("mcpcreds_secret_errors_total", (("key", key),),
                             help_text="Secret lookups that failed, by cache key.")
            _log.warning("secret unavailable", extra={"key": key, "error": exc.message})
            raise

    @property
    def discovery(self) -> Discovery:
        """The authorization servers' metadata, made at the first login (discovery.py imports httpx)."""
        if self._discovery is None:
            from ..credentials.discovery import Discovery

            self._discovery = Discovery()
        return self._discovery

    async def _fetch_login(self, target: Target, overrides: Mapping[str, str] | None = None) -> Token:
        from ..credentials.oauth import build_token_request, send_token_request  # httpx, authlib

        login = target.login
        assert login is not None
        if login.grant in LOGIN_GRANTS:  # a person's login, renewed by its refresh token
            return await refresh_login(self, target, overrides)
        if login.idp is not None:  # cross_app: the person's assertion exchanged, then redeemed
            from ..credentials.cross_app import cross_app_login  # httpx, authlib

            return await cross_app_login(self, target, overrides)
        http = self.http_for(target)
        token_url = await self.discovery.token_url(login, target.endpoint, http)
        credential_template = login.private_key or login.client_secret
        assert credential_template is not None
        if overrides:
            credential = await asyncio.to_thread(self.resolver.render, credential_template, overrides)
        else:
            rendered = await self.render_templates(target.key, [("credential", credential_template)])
            credential = rendered["credential"]
        request = build_token_request(login, token_url, credential,
                                      issuer=login.issuer or self.discovery.issuers.get(target.endpoint))
        self.metrics.inc("mcpcreds_token_requests_total", (("key", target.key),),
                         help_text="Token requests sent to token endpoints, by cache key.")
        try:
            return await send_token_request(http, request, self.clock.time(),
                                            login.expires_in_default,
                                            timeout=self.config.sidecar.token_timeout)
        except Exception:
            self.metrics.inc("mcpcreds_token_errors_total", (("key", target.key),),
                             help_text="Token requests that failed, by cache key.")
            raise

    def http_for(self, target: Target, gateway: bool = False) -> httpx.AsyncClient:
        """The HTTP client for a target's outbound calls, behind its egress policy (SSRF guard,
        pinned DNS, audit): its own calls (logins, discovery), or with `gateway` the MCP traffic
        the gateway relays, in a pool of its own."""
        x509 = spiffe_of(target) if gateway else None
        x509 = x509 if x509 is not None and x509.svid == "x509" else None
        key = (target.key, target.egress, gateway, x509)
        client = self._http.get(key)
        if client is None:
            import httpx

            from ..net.egress_http import egress_client

            def on_connect(host: str, ip: str, port: int) -> None:
                self.audit.write("egress", key=target.key, host=host, ip=ip, port=port)

            kwargs: dict[str, Any] = {}
            if gateway:
                kwargs["limits"] = httpx.Limits(max_connections=GATEWAY_CONNECTIONS,
                                                max_keepalive_connections=64)
                from ..credentials.spiffe import X509Source
                from ..net.upstream import H1Transport

                kwargs["pool_class"] = H1Transport  # the relayed traffic: a lean HTTP/1.1 client
                if x509 is not None:  # a SPIFFE X.509-SVID: presented on every upstream connection
                    kwargs["tls"] = self.x509_sources.setdefault(x509, X509Source(x509)).context
            client = self._http[key] = egress_client(target.egress, on_connect=on_connect,
                                                     transport_kwargs=kwargs)
        return client

    def gateway_transport(self, target: Target) -> httpx.AsyncBaseTransport:
        """The egress transport under `http_for(target, gateway=True)`: the gateway sends to it
        directly, with no client layer (no cookie jar shared between its callers)."""
        return self.http_for(target, gateway=True)._transport

    # -- invalidation

    def _drop_cached(self, keys: set[str]) -> None:
        for name in [n for n, c in self._cache.items() if c.result.key in keys]:
            del self._cache[name]

    async def invalidate(self, target: Target, fingerprint: str | None) -> tuple[bool, bool]:
        """Drop the login (or the cached headers) the caller was refused with, here and, with a
        shared state, everywhere. Returns (dropped, renewed): `dropped` when this call dropped it,
        `renewed` when the login named is no longer the one served (dropped now or replaced
        before). A login is dropped by invalidation at most once per `invalidate_cooldown` per
        key: within it, the current login stays (dropped and renewed false)."""
        key = target.key
        if target.login is None:
            self._drop_cached({key})
            self.events.publish("invalidate", key)
            return True, True
        current = self.logins.peek(key)
        # nothing held (a renewal under way): the next call brings a new login, whatever was named
        named_is_current = current is not None and (fingerprint is None or current.fingerprint == fingerprint)
        now = self.clock.monotonic()
        last = self._forced_at.get(key)
        if named_is_current and last is not None and now < last + self.config.sidecar.invalidate_cooldown:
            return False, False
        dropped = self.logins.invalidate(key, fingerprint)
        dropped = await self.sharing.drop(key, fingerprint) or dropped
        if dropped:
            self._forced_at[key] = now
            self._drop_cached({key})
            self.events.publish("invalidate", key, fingerprint=fingerprint)
        return dropped, dropped or not named_is_current

    async def pause(self, target: Target, seconds: float, actor: Actor | None = None) -> float | None:
        """Pause the key's bucket for `seconds` (an upstream 429). A grant holder's pauses are
        bounded: `grant_pause_budget` seconds in all per `grant_pause_window` per key; past it, the
        pause is not extended. Returns the end of the pause (wall clock), if any."""
        if actor is not None and actor.grant is not None:
            seconds = self._grant_pause(target.key, seconds)
        until = await self.limiter.apause(target.key, self.rate_of(target), seconds)
        if until is not None:
            left = round(max(0.0, until - self.clock.time()), 3)
            self.events.publish("pause", target.key, seconds=left)
            if isinstance(self.limiter, SharedLimiter):  # the other sidecars' lease holders too
                with contextlib.suppress(McpcredsError):
                    await self.limiter.state.publish("pause", target.key, seconds=left)
        if actor is not None and seconds > 0 and until is not None:
            previous = self._paused_by.get(target.key)
            if previous is None or until > previous[0] + 0.001:
                self._paused_by[target.key] = (until, actor)  # this call moved the end of the pause
        return until

    def _grant_pause(self, key: str, seconds: float) -> float:
        """How much of a `seconds` pause a grant holder may set on `key` now: only the part past
        the end of the pauses grant holders set before counts against the budget."""
        side = self.config.sidecar
        now = self.clock.monotonic()
        budget = self._pause_budgets.get(key)
        if budget is None or now >= budget.window_start + side.grant_pause_window:
            budget = self._pause_budgets[key] = _PauseBudget(now, 0.0, budget.until if budget else 0.0)
        start = max(now, budget.until)
        extra = min(max(0.0, now + seconds - start), max(0.0, side.grant_pause_budget - budget.used))
        if extra < now + seconds - start:
            _log.warning("grant pause budget spent: the pause is not extended",
                         extra={"key": key, "budget": side.grant_pause_budget,
                                "window": side.grant_pause_window})
        budget.used += extra
        budget.until = start + extra
        return budget.until - now

    # -- secrets and rotation

    def dependents(self, secret: str) -> list[Target]:
        """One target per cache key whose headers or login use `secret`."""
        found: dict[str, Target] = {}
        for target in (*self.config.services.values(), *self.config.servers.values()):
            if secret in target.secret_names or (target.login is not None and target.login.grant
                                                 in LOGIN_GRANTS and secret == entry_name(target.key)):
                found.setdefault(target.key, target)
        return list(found.values())

    def dependency_map(self) -> dict[str, list[str]]:
        deps: dict[str, set[str]] = {}
        for target in (*self.config.services.values(), *self.config.servers.values()):
            for name in target.secret_names:
                deps.setdefault(name, set()).add(target.key)
        return {name: sorted(keys) for name, keys in sorted(deps.items())}

    async def rotated(self, secret: str) -> tuple[list[str], dict[str, str]]:
        """A secret changed elsewhere: re-read it and renew the logins that use it.
        Returns the keys renewed (or re-read) and the keys whose renewal failed, with why."""
        targets = self.dependents(secret)
        if not targets:
            raise UnknownSecret("no configured server uses a secret of that name")
        self._drop_cached({t.key for t in targets})
        for target in targets:
            self.events.publish("rotation", target.key)
        renewed: list[str] = []
        failed: dict[str, str] = {}
        for target in targets:
            if target.login is None:
                renewed.append(target.key)
                continue
            try:
                if target.login.grant in LOGIN_GRANTS and secret == entry_name(target.key):
                    # a new login (`mcpcreds login`): renewed from it, not from the access token
                    # other sidecars share (refresh.py adopts it: login_share.py)
                    await self.sharing.drop(target.key, None)
                    # made at the authorization server the server's metadata names now: the
                    # sidecar's pin of the old one goes
                    self.discovery.forget_endpoint(target.endpoint)
                await self.logins.renew(target)
                renewed.append(target.key)
            except McpcredsError as exc:
                failed[target.key] = str(exc.details.get("error") or exc.code)
        return sorted(renewed), failed

    async def _trial_login(self, target: Target, secret: str, value: str) -> Token:
        """A login with the new value, outside the login cache; whatever goes wrong is a
        token_endpoint_error that never quotes the exception (it may carry key material)."""
        try:
            return await self._fetch_login(target, {secret: value})
        except McpcredsError:
            raise
        except Exception as exc:
            kind = type(exc).__name__
        raise TokenEndpointError(f"{target.key}: the trial login failed unexpectedly ({kind})",
                                 "unexpected_error")

    async def rotate(self, secret: str, value: str, force: bool) -> tuple[list[str], str]:
        """Rotate with overlap: try `value` first (a token request per login that uses it), store
        it only if every trial succeeds, then make the trial logins current. Returns the keys
        renewed and where the value was stored."""
        targets = self.dependents(secret)
        if not targets:
            raise UnknownSecret("no configured server uses a secret of that name")
        logins = [t for t in targets if t.login is not None]
        if not logins and not force:
            raise InvalidRequest(f"nothing can test secret {secret!r} (no login uses it); "
                                 "rotate with --force to store it untested")
        trials: list[tuple[Target, Token]] = []
        if not force:
            for target in logins:
                trials.append((target, await self._trial_login(target, secret, value)))
        where = await asyncio.to_thread(self.resolver.store, secret, value)
        for target, token in trials:
            self.logins.install(target, token)
            await self.sharing.share(target.key, token)
        self._drop_cached({t.key for t in targets})
        for target in targets:
            self.events.publish("rotation", target.key)
        if force:
            for target in logins:
                with contextlib.suppress(McpcredsError):
                    await self.logins.renew(target)
        return sorted(t.key for t in targets), where

    # -- status

    async def status(self) -> dict[str, Any]:
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
        return {"version": self.version, "config": self.config.path, "servers": servers,
                "logins": self.logins.status(), "buckets": await self.buckets(),
                "secrets": self.dependency_map(),
                "state": self.sharing.kind,
                "leases": self.leases.status(self.clock.monotonic()),
                "grants": await self.grants_status()}

    async def grants_status(self) -> dict[str, int] | None:
        """Live grants and their limit (None when the shared state cannot say: status still answers)."""
        try:
            live = await self.grants.live()
        except StateUnavailable:
            return None
        return {"live": live, "limit": self.config.sidecar.max_grants}

    async def buckets(self) -> list[dict[str, Any]]:
        """The buckets, each with who set its current pause (`paused_by`: uid, pid, grant)."""
        rows = await self.limiter.astatus(self.config.rates)
        for row in rows:
            setter = self._paused_by.get(row["key"])
            row["paused_by"] = setter[1].to_dict() if setter and row["paused_until"] is not None else None
        return rows

    async def gauges(self) -> list[tuple[str, str, Labels, float]]:
        out: list[tuple[str, str, Labels, float]] = []
        for row in self.logins.status():
            labels: Labels = (("key", row["key"]),)
            out.append(("mcpcreds_login_expiry_timestamp_seconds",
                        "Expiry (unix time) of the current login; 0: none.", labels, row["expires_at"] or 0))
            out.append(("mcpcreds_login_renewals_total", "Logins renewed.", labels, row["renewals"]))
            out.append(("mcpcreds_login_shared_fetches_total",
                        "Requests that waited on a fetch another request started.", labels,
                        row["shared_fetches"]))
            for state in ("valid", "renewing", "stale", "failing"):
                out.append(("mcpcreds_login_state", "1 for the login's current state.",
                            (*labels, ("state", state)), 1.0 if row["state"] == state else 0.0))
        for bucket in await self.buckets():
            labels = (("key", bucket["key"]),)
            out += [
                ("mcpcreds_bucket_level", "Permits in the bucket now.", labels, bucket["level"]),
                ("mcpcreds_bucket_capacity", "Burst size of the bucket.", labels, bucket["capacity"]),
                ("mcpcreds_bucket_waiting", "Requests waiting for permits.", labels, bucket["waiting"]),
                ("mcpcreds_bucket_granted_permits_total",
                 "Permits granted (those later given back too: a counter never goes down).", labels,
                 bucket["granted"]),
                ("mcpcreds_bucket_returned_permits_total",
                 "Granted permits given back: the caller went away before using them.", labels,
                 bucket.get("returned", 0)),  # the shared state's buckets never give back
                ("mcpcreds_bucket_refused_requests_total", "Requests refused past max_wait.", labels,
                 bucket["refused"]),
                ("mcpcreds_bucket_paused_until_timestamp_seconds",
                 "Unix time an upstream 429 pauses the bucket until; 0: not paused.",
                 labels, bucket["paused_until"] or 0),
            ]
        return out
