"""The config's objects: the frozen dataclasses the parsers make (config/load.py and its sections)
and everything that serves them reads, with their constants; and what is asked of a Target per
request (SigV4-signed? its SPIFFE settings? AAuth-signed?), answered with the auth modules' parsers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..core.policy import TrustPolicy
from ..core.rates import Rate
from ..core.templates import Template
from ..net.egress import EgressPolicy
from .aauth import AAuthConfig
from .aws import AwsAuth, aws_templates, parse_aws_auth
from .content import ContentPolicy
from .cross_app import CROSS_APP, IdpSpec
from .exec import ExecEntry
from .reader import Collector
from .spiffe import SpiffeAuth, parse_spiffe_auth
from .telemetry import TelemetryConfig

AUTH_METHODS: Final = ("client_secret_basic", "client_secret_post", "private_key_jwt", "none")
GRANTS: Final = ("client_credentials", "device", "authorization_code", CROSS_APP)
SUPPORTED_GRANTS: Final = GRANTS
LOGIN_GRANTS: Final = ("device", "authorization_code")  # run by `mcpcreds login`, renewed by refresh token
SIGNING_ALGS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
                       "EdDSA")
DEFAULT_EXPIRES_IN: Final = 300.0
SOURCE_KINDS: Final = ("env", "keyring")
CREDENTIALS_SOURCE: Final = "dir:$CREDENTIALS_DIRECTORY"  # systemd LoadCredential=: the folder of this start

AuthKind = Literal["auth", "oauth", "aauth"]


# ---------------------------------------------------------------------------- objects


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    socket: str | None = None
    allow_uids: tuple[int, ...] = ()
    grant_only_uids: tuple[int, ...] = ()
    state: str = "memory"
    state_key: Template | None = None
    state_password: Template | None = None
    state_ca: str | None = None
    on_state_loss: Literal["closed", "local"] = "closed"
    local_share: float = 1.0
    refresh_ahead: float = 60.0
    audit_log: str | None = None
    allow_trifecta: bool = False
    request_timeout: float = 10.0
    idle_timeout: float = 120.0
    token_timeout: float = 10.0
    drain_timeout: float = 10.0  # SIGTERM: in-flight requests get this long, then the process exits
    sidecar_uid: int | None = None  # the uid clients expect the sidecar to run as; default: their own
    invalidate_cooldown: float = 5.0  # a renewal forced by `invalidate` at most once per this, per key
    max_grants: int = 10_000  # live grants in the whole sidecar
    max_subgrants: int = 64  # live sub-grants under one top grant, at any depth
    grant_pause_budget: float = 300.0  # seconds of pause grant holders may set per key ...
    grant_pause_window: float = 900.0  # ... within this window
    egress: Literal["open", "closed"] = "open"  # closed: every server's endpoint is under a catalog entry's
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"  # the serve loop's (read at start only)


@dataclass(frozen=True, slots=True)
class SecretsConfig:
    sources: tuple[str, ...] = ("env", "keyring")
    keyring_service: str = "mcpcreds"
    keyring_backend: str | None = None
    allow_plaintext_keyring: bool = False
    keyring_timeout: float = 3.0
    cache_ttl: float = 2.0


@dataclass(frozen=True, slots=True)
class LoginSpec:
    """How to obtain a login (OAuth client credentials, a person's login, or an enterprise-managed
    cross-app login), normalised from `oauth` or `auth`."""

    grant: str
    client_id: str
    client_secret: Template | None
    private_key: Template | None
    auth_method: str
    token_url: str | None
    issuer: str | None
    scope: str | None
    resource: str | None
    audience: str | None
    expires_in_default: float = DEFAULT_EXPIRES_IN
    signing_alg: str | None = None  # private_key_jwt: the JWS alg; default: from the key
    idp: IdpSpec | None = None  # grant = "cross_app": the enterprise IdP and the person's assertion

    @property
    def templates(self) -> tuple[Template, ...]:
        own = tuple(t for t in (self.client_secret, self.private_key) if t is not None)
        return own + (self.idp.templates if self.idp is not None else ())


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """The secret-free spec of a server, as written in the config (templates intact)."""

    name: str
    endpoint: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    aauth: bool | None = None  # sign with the AAuth agent key; None inherits [aauth] default
    oauth: Mapping[str, Any] | None = None
    auth: Mapping[str, Any] | None = None
    service: str | None = None
    rate: str | None = None
    trust: Mapping[str, Any] | None = None  # trust, tool_allowlist, expected_tools, ...

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for key in ("endpoint", "service", "rate", "aauth", "oauth", "auth", "trust"):
            value = getattr(self, key)
            if value is not None:
                out[key] = dict(value) if isinstance(value, Mapping) else value
        out["headers"] = dict(self.headers)
        out["tags"] = list(self.tags)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> McpServerSpec:
        return cls(
            name=str(data["name"]),
            endpoint=data.get("endpoint"),
            headers=dict(data.get("headers") or {}),
            tags=tuple(data.get("tags") or ()),
            aauth=data["aauth"] if isinstance(data.get("aauth"), bool) else None,
            oauth=data.get("oauth"),
            auth=data.get("auth"),
            service=data.get("service"),
            rate=data.get("rate"),
            trust=data.get("trust"),
        )


EXPOSE: Final = ("both", "proxy", "headers")
DEFAULT_GATEWAY_WAIT: Final = 30.0


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    """How the gateway (`/mcp/{server}`) and the credential routes serve a server.

    `expose`: `proxy` keeps the credential inside the sidecar (only the gateway uses it),
    `headers` serves it to callers only, `both` (default) does both. `rate_methods`: the JSON-RPC
    methods that take a permit (None: every request). `max_wait`: how long a gateway request
    waits for a permit before a 429. `cache_results`: answer a request from a result the server
    marked cacheable (2026-07-28's `ttlMs` and `cacheScope`; gateway/results_cache.py)."""

    expose: str = "both"
    rate_methods: tuple[str, ...] | None = None
    max_wait: float = DEFAULT_GATEWAY_WAIT
    # clients may lease a share of the bucket (leases.py, bucket_scripts.py); false: per request
    # only; None (unset) leases as true does
    leases: bool | None = None
    cache_results: bool = True

    @property
    def serves_headers(self) -> bool:
        return self.expose != "proxy"

    @property
    def serves_proxy(self) -> bool:
        return self.expose != "headers"


@dataclass(frozen=True, slots=True)
class Target:
    """A server (or a catalog entry) resolved: what the broker needs to serve it."""

    name: str
    key: str
    spec: McpServerSpec
    endpoint: str
    headers: Mapping[str, Template]
    tags: frozenset[str]
    rate: Rate | None
    auth_kind: AuthKind | None
    login: LoginSpec | None
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    trust: TrustPolicy = field(default_factory=TrustPolicy)
    gateway: GatewaySpec = field(default_factory=GatewaySpec)
    aauth: bool = False  # requests to it are signed with the AAuth agent key (see aauth_config)
    # what the gateway does to what it sends back (config/content.py); ask its effective_* methods
    # with `trust.trust`
    content: ContentPolicy = field(default_factory=ContentPolicy)

    def spec_dict(self) -> dict[str, Any]:
        """The spec as spawn payloads, grants and `/v1/servers` show it, with `limits`: what the
        gateway holds the server to, its catalog entry's ceiling included (`allow`: the tool
        patterns a tool must match, null for any; `exclude`; `timeout` in seconds)."""
        allow = self.trust.exposed_patterns
        limits = {"allow": None if allow is None else list(allow),
                  "exclude": list(self.trust.excluded_patterns), "timeout": self.content.timeout}
        return {**self.spec.to_dict(), "limits": limits}

    @property
    def templates(self) -> tuple[Template, ...]:
        login = self.login.templates if self.login else ()
        return (*self.headers.values(), *login, *aws_templates(self.spec.auth))

    @property
    def secret_names(self) -> frozenset[str]:
        names: set[str] = set()
        for template in self.templates:
            names |= template.secret_names
        return frozenset(names)


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """The `[gateway]` table: the loopback TCP listener of the gateway (off when `listen` is None).
    `host` is a loopback address literal (`127.0.0.1`, `::1`); `port` 0 means one the kernel picks
    (logged at start)."""

    host: str | None = None
    port: int = 0

    @property
    def listen(self) -> str | None:
        if self.host is None:
            return None
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Config:
    path: str | None
    sidecar: SidecarConfig
    secrets: SecretsConfig
    services: Mapping[str, Target]
    servers: Mapping[str, Target]
    warnings: tuple[str, ...] = ()
    gateway: ListenConfig = field(default_factory=ListenConfig)
    execs: Mapping[str, ExecEntry] = field(default_factory=dict)  # [exec.NAME]
    aauth: AAuthConfig = field(default_factory=AAuthConfig)  # [aauth]
    # [gateway]'s content keys: the defaults of every server's `content` (already applied to them)
    content_defaults: ContentPolicy = field(default_factory=ContentPolicy)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)  # [telemetry]: traces

    def target(self, name: str) -> Target | None:
        """A server by name, or a cache key (`service:crm`, `mcp:docs`)."""
        if (server := self.servers.get(name)) is not None:
            return server
        kind, _, rest = name.partition(":")
        if kind == "service":
            return self.services.get(name)
        if kind == "mcp":
            return self.servers.get(rest)
        return None

    @property
    def rates(self) -> dict[str, Rate]:
        """The `rate:` of every cache key that has one (the buckets to keep)."""
        return {key: t.rate for key, t in self.targets_by_key.items() if t.rate is not None}

    @property
    def targets_by_key(self) -> dict[str, Target]:
        keyed: dict[str, Target] = dict(self.services)
        for server in self.servers.values():
            keyed.setdefault(server.key, server)
        return keyed


# ---------------------------------------------------------------------------- a target's auth


def uses_aauth(config: Config) -> bool:
    """Whether any server or service signs its requests with AAuth (it then needs the agent key)."""
    return any(t.aauth for t in (*config.services.values(), *config.servers.values()))


def is_aws(target: Target) -> bool:
    """Whether requests to `target` are SigV4-signed (its `auth` is `kind = "aws"`)."""
    auth = target.spec.auth
    return auth is not None and auth.get("kind") == "aws" and target.auth_kind == "auth"


def aws_auth_of(target: Target) -> AwsAuth:
    """The parsed settings of a target `is_aws` (the config was validated when it was loaded)."""
    assert target.spec.auth is not None
    parsed = parse_aws_auth(Collector(), "auth", target.spec.auth)
    assert parsed is not None
    return parsed


# the parsed SPIFFE settings per auth table (by identity; the table is kept so its id is not reused):
# the gateway asks for them per request
_PARSED: dict[int, tuple[Mapping[str, Any], SpiffeAuth | None]] = {}


def spiffe_of(target: Target) -> SpiffeAuth | None:
    """The parsed settings of a target whose `auth` is `kind = "spiffe"` (validated at load)."""
    auth = target.spec.auth
    if auth is None or auth.get("kind") != "spiffe" or target.auth_kind != "auth":
        return None
    held = _PARSED.get(id(auth))
    if held is not None and held[0] is auth:
        return held[1]
    parsed = parse_spiffe_auth(Collector(), "auth", auth)
    if len(_PARSED) >= 1024:
        _PARSED.clear()
    _PARSED[id(auth)] = (auth, parsed)
    return parsed


def jwt_svid_file(target: Target) -> str | None:
    """The JWT-SVID file of a target (cheap: the hot path asks it per request), else None."""
    auth = target.spec.auth
    if auth is None or auth.get("kind") != "spiffe" or auth.get("svid") != "jwt":
        return None
    if target.auth_kind != "auth":
        return None
    found = auth.get("jwt_svid_file")
    return found if isinstance(found, str) else None


def signs(target: Target, aauth: AAuthConfig) -> bool:
    """Whether requests to `target` are signed: never with `auth`/`oauth`; else its own flag, else
    the global default."""
    if target.auth_kind in ("auth", "oauth"):
        return False
    own = target.spec.aauth
    return own if own is not None else aauth.signs_by_default
