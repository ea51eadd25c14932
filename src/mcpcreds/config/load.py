"""TOML config -> frozen, validated objects. Every error carries its TOML path."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeVar
from urllib.parse import parse_qsl, urlsplit

import httpx

from ..core.credshape import credential_name, credential_value
from ..core.policy import TrustPolicy, find_trifecta, trifecta_message
from ..core.rates import Rate, parse_duration, parse_rate
from ..core.templates import Template, TemplateError, is_credential_header, parse_template
from ..errors import ConfigError
from ..net.egress import EgressPolicy, is_dev_loopback_url, parse_host_pattern, parse_private_entry
from .aauth import AAuthConfig, entry_aauth, parse_aauth, signs
from .aws import aws_egress_check, aws_templates, parse_aws_auth
from .exec import ExecEntry, exec_trifecta_warnings, parse_execs
from .spiffe import parse_spiffe_auth, spiffe_entry_check

TAGS: Final = ("untrusted_input", "sensitive", "egress")
DEFAULT_TAGS: Final = frozenset({"untrusted_input"})
AUTH_METHODS: Final = ("client_secret_basic", "client_secret_post", "private_key_jwt", "none")
GRANTS: Final = ("client_credentials", "device", "authorization_code")
SUPPORTED_GRANTS: Final = GRANTS
LOGIN_GRANTS: Final = ("device", "authorization_code")  # run by `mcpcreds login`, renewed by refresh token
SIGNING_ALGS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
                       "EdDSA")
DEFAULT_EXPIRES_IN: Final = 300.0
_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}\Z")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_SOURCE_KINDS: Final = ("env", "keyring")
CREDENTIALS_SOURCE: Final = "dir:$CREDENTIALS_DIRECTORY"  # systemd LoadCredential=: the folder of this start

AuthKind = Literal["auth", "oauth", "aauth"]
T = TypeVar("T")


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
    max_subgrants: int = 64  # live sub-grants one grant holder may have minted
    grant_pause_budget: float = 300.0  # seconds of pause grant holders may set per key ...
    grant_pause_window: float = 900.0  # ... within this window


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
    """How to obtain a login (OAuth client credentials), normalised from `oauth` or `auth`."""

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

    @property
    def templates(self) -> tuple[Template, ...]:
        return tuple(t for t in (self.client_secret, self.private_key) if t is not None)


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
    waits for a permit before a 429."""

    expose: str = "both"
    rate_methods: tuple[str, ...] | None = None
    max_wait: float = DEFAULT_GATEWAY_WAIT
    # clients may lease a share of the bucket (leases.py, bucket_scripts.py); false: per request
    # only; None (unset) leases as true does
    leases: bool | None = None

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


# ---------------------------------------------------------------------------- locating


def find_config_path(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit)
    if env := os.environ.get("MCPCREDS_CONFIG"):
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mcpcreds" / "config.toml"


def default_socket_path(configured: str | None = None) -> Path:
    if configured:
        return Path(configured)
    if env := os.environ.get("MCPCREDS_SOCKET"):
        return Path(env)
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "mcpcreds" / "mcpcreds.sock"
    return Path(f"/tmp/mcpcreds-{os.getuid()}") / "mcpcreds.sock"


def load_config(path: str | Path | None = None) -> Config:
    """Read and validate the config file; raise ConfigError listing every problem."""
    resolved = find_config_path(str(path) if path else None)
    try:
        raw = resolved.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{resolved}: cannot read config: {exc.strerror or exc}"]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{resolved}: not valid TOML: {exc}"]) from None
    return parse_config(data, path=str(resolved))


# ---------------------------------------------------------------------------- parsing


class _Collector:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def keys(self, path: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        for i, key in enumerate(table):
            if key not in allowed:
                self.error(_key_path(path, key, i), f"unknown key (allowed: {', '.join(allowed)})")

    def table(self, path: str, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(path, f"expected a table, got {_kind(value)}")
            return {}
        return value

    def typed(self, path: str, value: Any, kind: type[T], default: T) -> T:
        if value is None:
            return default
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # type: ignore[return-value]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            self.error(path, f"expected {kind.__name__}, got {_kind(value)}")
            return default
        return value

    def parsed(self, path: str, value: Any, parse: Callable[[Any], T]) -> T | None:
        try:
            return parse(value)
        except (ValueError, TypeError) as exc:
            self.error(path, str(exc))  # the parsers in rates.py and egress.py never quote the value
            return None

    def template(self, path: str, value: Any, *, credential: bool,
                 literal_ok: bool = False,
                 public: str = "or list the header in literal_headers if it is public") -> Template | None:
        """A template; with `credential`, it must not be a literal; unless `literal_ok`, no literal
        part of it may look like a credential either."""
        if not isinstance(value, str):
            self.error(path, f"expected a string, got {_kind(value)}")
            return None
        try:
            template = parse_template(value)
        except TemplateError as exc:
            self.error(path, str(exc))
            return None
        if credential and template.is_literal:
            self.error(
                path,
                "a credential must not be written in the config: "
                "use {{secret:NAME}} or {{secret-file:PATH}}",
            )
            return None
        if not literal_ok:
            for part in template.parts:
                if isinstance(part, str) and (why := credential_value(part)) is not None:
                    self.error(path, f"looks like a credential written in the config ({why}): use "
                               "{{secret:NAME}}, " + public)
                    return None
        return template


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _key_path(path: str, key: str, index: int) -> str:
    """The TOML path of a key, which may itself be a pasted secret: named only if it reads as a name."""
    if _NAME.match(key) and len(key) <= 64 and credential_value(key) is None:
        return _join(path, key)
    return f"{path}.<key #{index + 1}>" if path else f"<key #{index + 1}>"


def _kind(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(value: str) -> str | None:
    """Why `value` is not an acceptable endpoint URL, or None if it is."""
    if len(value) > 2048 or not all("!" <= ch <= "~" for ch in value):
        # urlsplit drops CR, LF and tab silently; what it accepts must also be what httpx sends
        return "must be at most 2048 visible ASCII characters (no spaces or control characters)"
    try:
        parts = urlsplit(value)
        host = parts.hostname
        _ = parts.port
        httpx.URL(value)
    except (ValueError, httpx.InvalidURL):
        return "not a valid URL"
    if parts.scheme not in ("https", "http") or not host:
        return "must be an https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials in the URL"
    if parts.fragment:
        return "must not have a #fragment"
    if parts.scheme == "http" and not _is_loopback(host):
        return "http:// is only allowed for a loopback host; use https://"
    for name, arg in parse_qsl(parts.query, keep_blank_values=True):
        if credential_name(name) or credential_value(arg) is not None:
            return "must not carry a credential in its query (the URL is shown in specs and logs)"
    return None


def _url(c: _Collector, path: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        c.error(path, f"expected a URL string, got {_kind(value)}")
        return None
    if (problem := check_url(value)) is not None:
        c.error(path, problem)
        return None
    return value


def _uids(c: _Collector, path: str, key: str, raw: Any) -> list[int]:
    uids: list[int] = []
    if not isinstance(raw, list):
        c.error(_join(path, key), f"expected an array of integers, got {_kind(raw)}")
        return uids
    for i, uid in enumerate(raw):
        if isinstance(uid, int) and not isinstance(uid, bool) and uid >= 0:
            uids.append(uid)
        else:
            c.error(f"{path}.{key}[{i}]", "expected a non-negative integer uid")
    return uids


def _count(c: _Collector, path: str, raw: Any, default: int, most: int) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= most:
        c.error(path, f"expected a whole number from 1 to {most}")
        return default
    return raw


def _parse_sidecar(c: _Collector, raw: Any) -> SidecarConfig:
    path = "sidecar"
    t = c.table(path, raw)
    c.keys(path, t, ("socket", "allow_uids", "state", "state_key", "on_state_loss",
                     "local_share", "refresh_ahead", "audit_log", "allow_trifecta",
                     "request_timeout", "idle_timeout", "token_timeout", "state_password",
                     "state_ca", "grant_only_uids", "sidecar_uid", "invalidate_cooldown", "max_grants",
                     "max_subgrants", "grant_pause_budget", "grant_pause_window", "drain_timeout"))
    uids = _uids(c, path, "allow_uids", t.get("allow_uids", []))
    grant_only = _uids(c, path, "grant_only_uids", t.get("grant_only_uids", []))
    state = c.typed(_join(path, "state"), t.get("state"), str, "memory")
    if state != "memory" and not state.startswith(("redis://", "rediss://", "unix://")):
        c.error(_join(path, "state"),
                "expected 'memory', 'redis://...', 'rediss://...' or 'unix:///path'")
    state_key = None
    if "state_key" in t:
        state_key = c.template(_join(path, "state_key"), t["state_key"], credential=True)
    state_password = None
    if "state_password" in t:
        state_password = c.template(_join(path, "state_password"), t["state_password"], credential=True)
    shared = state.startswith(("redis://", "rediss://", "unix://"))
    if shared and state_key is None:
        c.error(_join(path, "state_key"), "required with a shared state: logins are stored encrypted "
                "with it (e.g. \"{{secret:MCPCREDS_STATE_KEY}}\")")
    if shared and "@" in state.split("//", 1)[-1].split("/", 1)[0]:
        c.error(_join(path, "state"), "must not carry a password; use sidecar.state_password")
    on_loss = c.typed(_join(path, "on_state_loss"), t.get("on_state_loss"), str, "closed")
    if on_loss not in ("closed", "local"):
        c.error(_join(path, "on_state_loss"), "expected 'closed' or 'local'")
        on_loss = "closed"
    share = c.typed(_join(path, "local_share"), t.get("local_share"), float, 1.0)
    if not 0 < share <= 1:
        c.error(_join(path, "local_share"), "expected a fraction in (0, 1]")
    refresh = c.parsed(_join(path, "refresh_ahead"), t.get("refresh_ahead", "60s"), parse_duration)
    socket = c.typed(_join(path, "socket"), t.get("socket"), str, "") or None
    audit = c.typed(_join(path, "audit_log"), t.get("audit_log"), str, "") or None
    request_timeout = c.parsed(_join(path, "request_timeout"), t.get("request_timeout", 10.0),
                               parse_duration)
    idle_timeout = c.parsed(_join(path, "idle_timeout"), t.get("idle_timeout", 120.0), parse_duration)
    token_timeout = c.parsed(_join(path, "token_timeout"), t.get("token_timeout", 10.0), parse_duration)
    sidecar_uid = t.get("sidecar_uid")
    if sidecar_uid is not None and (isinstance(sidecar_uid, bool) or not isinstance(sidecar_uid, int)
                                    or not 0 <= sidecar_uid < 2**32):
        c.error(_join(path, "sidecar_uid"), "expected a non-negative integer uid")
        sidecar_uid = None
    cooldown = c.parsed(_join(path, "invalidate_cooldown"), t.get("invalidate_cooldown", 5.0), parse_duration)
    pause_budget = c.parsed(_join(path, "grant_pause_budget"), t.get("grant_pause_budget", 300.0),
                            parse_duration)
    pause_window = c.parsed(_join(path, "grant_pause_window"), t.get("grant_pause_window", 900.0),
                            parse_duration)
    drain = c.parsed(_join(path, "drain_timeout"), t.get("drain_timeout", 10.0), parse_duration)
    if drain is not None and drain > 300:
        c.error(_join(path, "drain_timeout"), "expected at most 5m")
    return SidecarConfig(
        drain_timeout=drain if drain is not None and drain <= 300 else 10.0,
        sidecar_uid=sidecar_uid,
        invalidate_cooldown=cooldown if cooldown is not None else 5.0,
        max_grants=_count(c, _join(path, "max_grants"), t.get("max_grants"), 10_000, 1_000_000),
        max_subgrants=_count(c, _join(path, "max_subgrants"), t.get("max_subgrants"), 64, 10_000),
        grant_pause_budget=pause_budget if pause_budget is not None else 300.0,
        grant_pause_window=pause_window or 900.0,
        token_timeout=token_timeout or 10.0,
        request_timeout=request_timeout or 10.0,
        idle_timeout=idle_timeout or 120.0,
        socket=socket,
        allow_uids=tuple(uids),
        grant_only_uids=tuple(grant_only),
        state=state,
        state_key=state_key,
        state_password=state_password,
        state_ca=c.typed(_join(path, "state_ca"), t.get("state_ca"), str, "") or None,
        on_state_loss=on_loss,  # type: ignore[arg-type]
        local_share=share,
        refresh_ahead=refresh if refresh is not None else 60.0,
        audit_log=audit,
        allow_trifecta=c.typed(_join(path, "allow_trifecta"), t.get("allow_trifecta"), bool, False),
    )


def _parse_secrets(c: _Collector, raw: Any) -> SecretsConfig:
    path = "secrets"
    t = c.table(path, raw)
    c.keys(path, t, ("sources", "keyring_service", "keyring_backend", "allow_plaintext_keyring",
                     "keyring_timeout", "cache_ttl"))
    sources_raw = t.get("sources", ["env", "keyring"])
    sources: list[str] = []
    if not isinstance(sources_raw, list) or not sources_raw:
        c.error(_join(path, "sources"), "expected a non-empty array of sources")
    else:
        for i, src in enumerate(sources_raw):
            spath = f"{path}.sources[{i}]"
            if not isinstance(src, str):
                c.error(spath, f"expected a string, got {_kind(src)}")
            elif src in (*_SOURCE_KINDS, CREDENTIALS_SOURCE) or (src.startswith("dir:/") and len(src) > 5):
                sources.append(src)
            else:
                c.error(spath, "unknown source: expected 'env', 'keyring', 'dir:/abs/path' or "
                        f"'{CREDENTIALS_SOURCE}'")
    timeout = c.parsed(_join(path, "keyring_timeout"), t.get("keyring_timeout", 3.0), parse_duration)
    cache_ttl = c.parsed(_join(path, "cache_ttl"), t.get("cache_ttl", 2.0), parse_duration)
    return SecretsConfig(
        cache_ttl=cache_ttl if cache_ttl is not None else 2.0,
        sources=tuple(sources) or ("env", "keyring"),
        keyring_service=c.typed(_join(path, "keyring_service"), t.get("keyring_service"), str,
                                "mcpcreds"),
        keyring_backend=c.typed(_join(path, "keyring_backend"), t.get("keyring_backend"), str,
                                "") or None,
        allow_plaintext_keyring=c.typed(_join(path, "allow_plaintext_keyring"),
                                        t.get("allow_plaintext_keyring"), bool, False),
        keyring_timeout=timeout or 3.0,
    )


def _parse_headers(c: _Collector, path: str, raw: Any, literal: frozenset[str]) -> dict[str, Template]:
    """Header templates. A credential-shaped name, or a literal that looks like a credential, must
    come from a secret, unless the header is listed in `literal_headers` (a public value)."""
    t = c.table(path, raw)
    out: dict[str, Template] = {}
    for i, (name, value) in enumerate(t.items()):
        hpath = _key_path(path, name, i)
        if not _HEADER_NAME.match(name):
            c.error(hpath, "not a valid HTTP header name")
            continue
        if isinstance(value, str) and ("\r" in value or "\n" in value):
            c.error(hpath, "header values must not contain line breaks")
            continue
        public = name.lower() in literal and not is_credential_header(name)
        template = c.template(hpath, value, credential=is_credential_header(name) or
                              (credential_name(name) and not public), literal_ok=public)
        if template is not None:
            out[name] = template
    return out


def _literal_headers(c: _Collector, path: str, raw: Any) -> frozenset[str]:
    names = _strings(c, path, raw) or ()
    for i, name in enumerate(names):
        if is_credential_header(name):
            c.error(f"{path}[{i}]", "a credential header cannot be declared literal")
    return frozenset(n.lower() for n in names)


def _scope(c: _Collector, path: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return " ".join(value.split()) or None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(value) or None
    c.error(path, "expected a string or an array of strings")
    return None


_OAUTH_KEYS: Final = ("token_url", "issuer", "client_id", "client_secret", "private_key",
                      "scope", "resource", "audience", "auth_method", "expires_in_default", "signing_alg")
_AUTH_KEYS: Final = ("kind", "token", "header", "value", "grant", "issuer", "token_url",
                     "client_id", "client_secret", "private_key", "scopes", "scope", "audience",
                     "resource", "auth_method", "expires_in_default", "signing_alg")
# the keys each kind takes: a key of another kind is refused, never silently ignored
_KIND_KEYS: Final = {"static": ("kind", "token", "header", "value"),
                     "oauth2": tuple(k for k in _AUTH_KEYS if k not in ("token", "header", "value"))}


def _parse_login(c: _Collector, path: str, t: dict[str, Any], grant: str,
                 scope_key: str) -> LoginSpec | None:
    client_id = t.get("client_id")
    if grant == "authorization_code" and "client_id" not in t:
        client_id = ""  # none: `mcpcreds login` registers a client (RFC 7591)
        if "client_secret" in t or "private_key" in t:
            c.error(_join(path, "client_id"), "required with client_secret or private_key")
    elif not isinstance(client_id, str) or not client_id:
        c.error(_join(path, "client_id"), "required: a non-empty string")
    public = grant in LOGIN_GRANTS and "client_secret" not in t and "private_key" not in t
    method = c.typed(_join(path, "auth_method"), t.get("auth_method"), str,
                     "none" if public else "client_secret_basic")
    if method not in AUTH_METHODS:
        c.error(_join(path, "auth_method"), f"expected one of {', '.join(AUTH_METHODS)}")
    elif method == "none" and grant not in LOGIN_GRANTS:
        c.error(_join(path, "auth_method"), "'none' (a public client) only with grant = 'device' or "
                                            "'authorization_code'")
    signing_alg = c.typed(_join(path, "signing_alg"), t.get("signing_alg"), str, "") or None
    if signing_alg is not None and signing_alg not in SIGNING_ALGS:
        c.error(_join(path, "signing_alg"), f"expected one of {', '.join(SIGNING_ALGS)}")
    elif signing_alg is not None and method != "private_key_jwt":
        c.error(_join(path, "signing_alg"), "only with auth_method = 'private_key_jwt'")
    secret = private_key = None
    if "client_secret" in t:
        secret = c.template(_join(path, "client_secret"), t["client_secret"], credential=True)
    if "private_key" in t:
        private_key = c.template(_join(path, "private_key"), t["private_key"], credential=True)
    if method == "private_key_jwt" and "private_key" not in t:
        c.error(_join(path, "private_key"), "required for auth_method = 'private_key_jwt'")
    elif method in ("client_secret_basic", "client_secret_post") and "client_secret" not in t:
        c.error(_join(path, "client_secret"), f"required for auth_method = {method!r}")
    expires_default = c.parsed(_join(path, "expires_in_default"),
                               t.get("expires_in_default", DEFAULT_EXPIRES_IN), parse_duration)
    if expires_default is not None and not 1 <= expires_default <= 86400:
        c.error(_join(path, "expires_in_default"), "expected from 1s to 1d")
    return LoginSpec(
        grant=grant,
        client_id=client_id if isinstance(client_id, str) else "",
        client_secret=secret,
        private_key=private_key,
        auth_method=method,
        token_url=_url(c, _join(path, "token_url"), t.get("token_url")),
        issuer=_url(c, _join(path, "issuer"), t.get("issuer")),
        scope=_scope(c, _join(path, scope_key), t.get(scope_key)),
        resource=_url(c, _join(path, "resource"), t.get("resource")),
        audience=c.typed(_join(path, "audience"), t.get("audience"), str, "") or None,
        expires_in_default=expires_default or DEFAULT_EXPIRES_IN,
        signing_alg=signing_alg,
    )


def _parse_oauth(c: _Collector, path: str, raw: Any) -> LoginSpec | None:
    t = c.table(path, raw)
    c.keys(path, t, _OAUTH_KEYS)
    return _parse_login(c, path, t, "client_credentials", "scope")


def _parse_auth(c: _Collector, path: str, raw: Any) -> tuple[dict[str, Template], LoginSpec | None]:
    """The unified provider: `static` gives headers, `oauth2` gives a login."""
    t = c.table(path, raw)
    if t.get("kind") == "aws":  # SigV4, signed by the sidecar (aws_config.py): keys of its own
        parse_aws_auth(c, path, t)
        return {}, None
    if t.get("kind") == "spiffe":  # an SVID from files, presented by the sidecar (spiffe_config.py)
        parse_spiffe_auth(c, path, t)
        return {}, None
    kind = t.get("kind")
    c.keys(path, t, _KIND_KEYS.get(kind, _AUTH_KEYS) if isinstance(kind, str) else _AUTH_KEYS)
    if kind == "static":
        if "token" in t and ("header" in t or "value" in t):
            c.error(_join(path, "token"), "static auth takes `token`, or `header` and `value`: not both")
            return {}, None
        if "token" in t:
            token = c.template(_join(path, "token"), t["token"], credential=True)
            if token is None:
                return {}, None
            return {"Authorization": parse_template("Bearer " + token.source)}, None
        header, value = t.get("header"), t.get("value")
        if not isinstance(header, str) or not _HEADER_NAME.match(header):
            c.error(_join(path, "header"), "static auth needs `token`, or `header` and `value`")
            return {}, None
        template = c.template(_join(path, "value"), value, credential=True)
        return ({header: template} if template else {}), None
    if kind == "oauth2":
        grant = c.typed(_join(path, "grant"), t.get("grant"), str, "client_credentials")
        if grant == "refresh_token":
            c.error(_join(path, "grant"), "a refresh token comes from a login: use grant = 'device' or "
                                          "'authorization_code' and run `mcpcreds login NAME`")
        elif grant not in GRANTS:
            c.error(_join(path, "grant"), f"expected one of {', '.join(GRANTS)}")
        scope_key = "scopes" if "scopes" in t else "scope"
        if "scopes" in t and "scope" in t:
            c.error(_join(path, "scope"), "`scope` or `scopes`: not both")
        return {}, _parse_login(c, path, t, grant, scope_key)
    c.error(_join(path, "kind"), "expected 'static', 'oauth2', 'aws' or 'spiffe'")
    return {}, None


def _parse_tags(c: _Collector, path: str, raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.error(path, f"expected an array of tags, got {_kind(raw)}")
        return ()
    tags: list[str] = []
    for i, tag in enumerate(raw):
        if tag in TAGS:
            if tag not in tags:
                tags.append(tag)
        else:
            c.error(f"{path}[{i}]", f"unknown tag: expected one of {', '.join(TAGS)}")
    return tuple(tags)


@dataclass
class _Entry:
    """What a [services.X] table or a stand-alone [[servers]] entry provides."""

    endpoint: str | None
    headers: dict[str, Template]
    tags: tuple[str, ...]
    rate: Rate | None
    auth_kind: AuthKind | None
    login: LoginSpec | None
    egress: EgressPolicy
    gateway: GatewaySpec


_EGRESS_KEYS: Final = ("net", "allow_hosts", "deny_hosts", "allow_private")
_TRUST_KEYS: Final = ("trust", "tool_allowlist", "expected_tools", "allow_untrusted_without_allowlist")
_GATEWAY_KEYS: Final = ("expose", "rate_methods", "max_wait", "leases")
_ENTRY_KEYS: Final = ("endpoint", "headers", "literal_headers", "tags", "rate", "oauth", "auth", "aauth",
                      *_EGRESS_KEYS, *_GATEWAY_KEYS)


def _strings(c: _Collector, path: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        c.error(path, "expected an array of strings")
        return None
    return tuple(value)


def _parse_egress(c: _Collector, path: str, t: dict[str, Any], urls: list[str | None],
                  needs: str = "the token endpoint, issuer and MCP endpoint hosts it may call"
                  ) -> EgressPolicy:
    """`net` and its host lists; loopback is allowed (dev mode) when the config's own URLs are."""
    mode = c.typed(_join(path, "net"), t.get("net"), str, "inherit")
    lists = {k: _strings(c, _join(path, k), t.get(k)) or () for k in _EGRESS_KEYS[1:]}
    if mode == "restricted" and not lists["allow_hosts"]:
        c.error(_join(path, "allow_hosts"), f'net = "restricted" needs allow_hosts ({needs})')
    dev = any(is_dev_loopback_url(u) for u in urls if u)
    valid: dict[str, tuple[str, ...]] = {}
    for key, patterns in lists.items():
        parse = parse_private_entry if key == "allow_private" else parse_host_pattern
        kept = []
        for i, pattern in enumerate(patterns):
            if c.parsed(f"{path}.{key}[{i}]", pattern, parse) is not None:
                kept.append(pattern)
        valid[key] = tuple(kept)
    try:
        return EgressPolicy(mode, valid["allow_hosts"], valid["deny_hosts"], valid["allow_private"], dev)
    except ValueError as exc:
        c.error(_join(path, "net"), str(exc))
        return EgressPolicy(dev_loopback=dev)


def _parse_gateway(c: _Collector, path: str, t: dict[str, Any], base: GatewaySpec) -> GatewaySpec:
    """A server's gateway keys over `base` (its service's); a server may not widen `expose`."""
    expose = c.typed(_join(path, "expose"), t.get("expose"), str, base.expose)
    if expose not in EXPOSE:
        c.error(_join(path, "expose"), f"expected one of {', '.join(EXPOSE)}")
        expose = base.expose
    elif base.expose != "both" and expose != base.expose:
        c.error(_join(path, "expose"), "wider than its service's: a server may only narrow `expose`")
        expose = base.expose
    methods = base.rate_methods
    if "rate_methods" in t:
        methods = _strings(c, _join(path, "rate_methods"), t["rate_methods"])
        if methods is not None and any(not m or len(m) > 128 for m in methods):
            c.error(_join(path, "rate_methods"), "expected JSON-RPC method names (1 to 128 characters)")
    max_wait = base.max_wait
    if "max_wait" in t:
        parsed = c.parsed(_join(path, "max_wait"), t["max_wait"], parse_duration)
        if parsed is not None and parsed > 3600:
            c.error(_join(path, "max_wait"), "expected at most 1h")
        elif parsed is not None:
            max_wait = parsed
    leases = base.leases if "leases" not in t else c.typed(_join(path, "leases"), t["leases"], bool, True)
    return GatewaySpec(expose, methods, max_wait, leases)


def _parse_trust(c: _Collector, path: str, t: dict[str, Any]) -> TrustPolicy:
    allow_hatch = c.typed(_join(path, "allow_untrusted_without_allowlist"),
                          t.get("allow_untrusted_without_allowlist"), bool, False)
    try:
        return TrustPolicy(
            trust=c.typed(_join(path, "trust"), t.get("trust"), str, "untrusted"),
            tool_allowlist=_strings(c, _join(path, "tool_allowlist"), t.get("tool_allowlist")),
            expected_tools=_strings(c, _join(path, "expected_tools"), t.get("expected_tools")) or (),
            allow_untrusted_without_allowlist=allow_hatch,
        )
    except ValueError as exc:
        c.error(_join(path, "trust"), str(exc))
        return TrustPolicy()


def _parse_entry(c: _Collector, path: str, t: dict[str, Any]) -> _Entry:
    endpoint = _url(c, _join(path, "endpoint"), t.get("endpoint"))
    literal = _literal_headers(c, _join(path, "literal_headers"), t.get("literal_headers"))
    headers = _parse_headers(c, _join(path, "headers"), t.get("headers"), literal)
    tags = _parse_tags(c, _join(path, "tags"), t.get("tags"))
    rate = None
    if "rate" in t:
        rate = c.parsed(_join(path, "rate"), t["rate"], parse_rate)
    auth_kind: AuthKind | None = None
    login = None
    if "auth" in t:
        auth_kind = "auth"
        auth_headers, login = _parse_auth(c, _join(path, "auth"), t["auth"])
        for name, template in auth_headers.items():
            headers.setdefault(name, template)
        if "oauth" in t:  # shadowed, but shown in specs: validated all the same
            _parse_oauth(c, _join(path, "oauth"), t["oauth"])
            c.warnings.append(f"{_join(path, 'oauth')}: not used, `auth` takes precedence")
    elif "oauth" in t:
        auth_kind = "oauth"
        login = _parse_oauth(c, _join(path, "oauth"), t["oauth"])
    entry_aauth(c, path, t, auth_kind)  # a flag; which servers sign is decided in parse_config
    aws_egress_check(c, path, t)  # auth kind "aws", source "imds": its address must pass the egress policy
    urls = [endpoint, *((login.token_url, login.issuer) if login else ())]
    gateway = _parse_gateway(c, path, t, GatewaySpec())
    spiffe_entry_check(c, path, t, endpoint, gateway)  # an x509 SVID: only the gateway presents it
    return _Entry(endpoint, headers, tags, rate, auth_kind, login, _parse_egress(c, path, t, urls), gateway)


def _effective_tags(tags: tuple[str, ...]) -> frozenset[str]:
    return frozenset(tags) if tags else DEFAULT_TAGS


def _default_resource(login: LoginSpec | None, endpoint: str) -> LoginSpec | None:
    if login is None or login.resource is not None:
        return login
    return LoginSpec(**{**{f: getattr(login, f) for f in login.__dataclass_fields__},
                        "resource": endpoint})


def _spec_from_table(name: str, t: dict[str, Any], service: str | None) -> McpServerSpec:
    def mapping(key: str) -> dict[str, Any] | None:
        value = t.get(key)
        return dict(value) if isinstance(value, dict) else None

    return McpServerSpec(
        name=name,
        endpoint=t.get("endpoint") if isinstance(t.get("endpoint"), str) else None,
        headers={k: v for k, v in (mapping("headers") or {}).items() if isinstance(v, str)},
        tags=tuple(x for x in t.get("tags") or () if isinstance(x, str)),
        aauth=t["aauth"] if isinstance(t.get("aauth"), bool) else None,
        oauth=mapping("oauth"),
        auth=mapping("auth"),
        service=service,
        rate=t.get("rate") if isinstance(t.get("rate"), str) else None,
        trust={k: t[k] for k in _TRUST_KEYS if k in t} or None,
    )


def _parse_services(c: _Collector, raw: Any) -> tuple[dict[str, Target], dict[str, dict[str, Any]]]:
    services: dict[str, Target] = {}
    tables: dict[str, dict[str, Any]] = {}
    for name, value in c.table("services", raw).items():
        path = f"services.{name}"
        if not _NAME.match(name):
            c.error(path, "service names use letters, digits, '_', '.', '-'")
            continue
        t = c.table(path, value)
        c.keys(path, t, _ENTRY_KEYS)
        entry = _parse_entry(c, path, t)
        if entry.endpoint is None:
            if "endpoint" not in t:
                c.error(_join(path, "endpoint"), "required")
            continue
        key = f"service:{name}"
        tables[name] = t
        services[key] = Target(
            name=key,
            key=key,
            spec=_spec_from_table(key, t, None),
            endpoint=entry.endpoint,
            headers=entry.headers,
            tags=_effective_tags(entry.tags),
            rate=entry.rate,
            auth_kind=entry.auth_kind,
            login=_default_resource(entry.login, entry.endpoint),
            egress=entry.egress,
            gateway=entry.gateway,
        )
    return services, tables


_INHERITED: Final = ("endpoint", "headers", "literal_headers", "auth", "oauth", "aauth", "rate",
                     *_EGRESS_KEYS)


def _parse_servers(c: _Collector, raw: Any, services: dict[str, Target],
                   service_tables: dict[str, dict[str, Any]]) -> dict[str, Target]:
    servers: dict[str, Target] = {}
    if raw is None:
        return servers
    if not isinstance(raw, list):
        c.error("servers", "expected an array of tables ([[servers]])")
        return servers
    for i, value in enumerate(raw):
        path = f"servers[{i}]"
        t = c.table(path, value)
        c.keys(path, t, ("name", *_ENTRY_KEYS, "service", *_TRUST_KEYS))
        name = t.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            c.error(_join(path, "name"), "required: letters, digits, '_', '.', '-'")
            continue
        if name in servers:
            c.error(_join(path, "name"), f"duplicate server name {name!r}")
            continue
        service = t.get("service")
        if service is not None:
            target = _server_from_service(c, path, name, t, service, services, service_tables)
        else:
            target = _standalone_server(c, path, name, t)
        if target is not None:
            servers[name] = target
    return servers


def _server_from_service(c: _Collector, path: str, name: str, t: dict[str, Any], service: Any,
                         services: dict[str, Target],
                         service_tables: dict[str, dict[str, Any]]) -> Target | None:
    for key in _INHERITED:
        if key in t:
            c.error(_join(path, key), "inherited from its service; do not restate it")
    tags = _parse_tags(c, _join(path, "tags"), t.get("tags"))
    entry = services.get(f"service:{service}") if isinstance(service, str) else None
    if entry is None:
        known = ", ".join(sorted(k.partition(":")[2] for k in services)) or "none defined"
        c.error(_join(path, "service"), f"unknown service (known: {known})")
        return None
    merged: dict[str, Any] = {**service_tables[service], "tags": sorted(set(entry.spec.tags) | set(tags))}
    merged.update((k, t[k]) for k in _TRUST_KEYS if k in t)
    return Target(
        name=name,
        key=entry.key,
        spec=_spec_from_table(name, merged, service),
        endpoint=entry.endpoint,
        headers=entry.headers,
        tags=entry.tags | frozenset(tags) if tags else entry.tags,
        rate=entry.rate,
        auth_kind=entry.auth_kind,
        login=entry.login,
        egress=entry.egress,
        trust=_parse_trust(c, path, t),
        gateway=_parse_gateway(c, path, t, entry.gateway),
    )


def _standalone_server(c: _Collector, path: str, name: str, t: dict[str, Any]) -> Target | None:
    entry = _parse_entry(c, path, t)
    if entry.endpoint is None:
        if "endpoint" not in t:
            c.error(_join(path, "endpoint"), "required (or `service` naming a [services] entry)")
        return None
    return Target(
        name=name,
        key=f"mcp:{name}",
        spec=_spec_from_table(name, t, None),
        endpoint=entry.endpoint,
        headers=entry.headers,
        tags=_effective_tags(entry.tags),
        rate=entry.rate,
        auth_kind=entry.auth_kind,
        login=_default_resource(entry.login, entry.endpoint),
        egress=entry.egress,
        trust=_parse_trust(c, path, t),
        gateway=entry.gateway,
    )


def _share_tags(services: dict[str, Target], servers: dict[str, Target]
                ) -> tuple[dict[str, Target], dict[str, Target]]:
    """Every name that reaches a cache key reaches the same credential: each carries the union of
    the tags of all of them (a read-only name cannot launder a login that another name tags
    `egress`). The specs show these effective tags, `untrusted_input` of an untagged one included."""
    union: dict[str, frozenset[str]] = {}
    for target in (*services.values(), *servers.values()):
        union[target.key] = union.get(target.key, frozenset()) | target.tags

    def widen(target: Target) -> Target:
        tags = union[target.key]
        spec = dataclasses.replace(target.spec, tags=tuple(t for t in TAGS if t in tags))
        return dataclasses.replace(target, tags=tags, spec=spec)

    return ({k: widen(t) for k, t in services.items()}, {k: widen(t) for k, t in servers.items()})


_LISTEN: Final = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]{2,45})\]|(?P<v4>[0-9.]{7,15}))"
                            r":(?P<port>[0-9]{1,5})\Z")


def parse_listen(value: str) -> tuple[str, int]:
    """`127.0.0.1:PORT` or `[::1]:PORT` (a loopback address literal, a port from 0 to 65535; 0:
    one the kernel picks) as (host, port). Raises ValueError, never quoting `value`."""
    match = _LISTEN.match(value) if len(value) <= 64 else None
    if match is None:
        raise ValueError("expected \"127.0.0.1:PORT\" or \"[::1]:PORT\"")
    host = match["v6"] or match["v4"]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError("expected \"127.0.0.1:PORT\" or \"[::1]:PORT\" (not an IP address)") from None
    mapped = getattr(address, "ipv4_mapped", None)
    if not address.is_loopback or mapped is not None:
        raise ValueError("the gateway listens on a loopback address only (127.0.0.0/8 or ::1): "
                         "its callers are identified by the kernel's table of local sockets")
    port = int(match["port"])
    if port > 65535:
        raise ValueError("the port must be from 0 to 65535 (0: one the kernel picks, logged at start)")
    return str(address), port


def _parse_gateway_table(c: _Collector, raw: Any) -> ListenConfig:
    path = "gateway"
    t = c.table(path, raw)
    c.keys(path, t, ("listen",))
    listen = t.get("listen")
    if listen is None:
        return ListenConfig()
    if not isinstance(listen, str):
        c.error(_join(path, "listen"), f"expected a string, got {_kind(listen)}")
        return ListenConfig()
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        c.error(_join(path, "listen"), str(exc))
        return ListenConfig()
    return ListenConfig(host, port)


def parse_config(data: Mapping[str, Any], path: str | None = None) -> Config:
    c = _Collector()
    c.keys("", data, ("sidecar", "secrets", "services", "servers", "gateway", "exec", "aauth"))
    sidecar = _parse_sidecar(c, data.get("sidecar"))
    gateway = _parse_gateway_table(c, data.get("gateway"))
    secrets = _parse_secrets(c, data.get("secrets"))
    services, tables = _parse_services(c, data.get("services"))
    servers = _parse_servers(c, data.get("servers"), services, tables)
    services, servers = _share_tags(services, servers)
    aauth = parse_aauth(c, data.get("aauth"))
    services, servers = ({k: _signing(t, aauth) for k, t in services.items()},
                         {k: _signing(t, aauth) for k, t in servers.items()})
    trio = find_trifecta({name: t.tags for name, t in (*services.items(), *servers.items())})
    if trio is not None:
        c.warnings.append(f"servers: together the servers complete the trifecta: {trifecta_message(trio)}; "
                          "grants that combine them are refused")
    execs = parse_execs(c, data.get("exec"))
    c.warnings.extend(exec_trifecta_warnings({n: t.tags for n, t in (*services.items(), *servers.items())},
                                             execs, trio))
    if c.errors:
        raise ConfigError(c.errors, path)
    return Config(path, sidecar, secrets, services, servers, tuple(c.warnings), gateway, execs=execs,
                  aauth=aauth)


def _signing(target: Target, aauth: AAuthConfig) -> Target:
    """`target` with `aauth` set when its requests are signed (and `auth_kind` "aauth" if it has no other)."""
    if not signs(target, aauth):
        return target
    return dataclasses.replace(target, aauth=True, auth_kind=target.auth_kind or "aauth")
