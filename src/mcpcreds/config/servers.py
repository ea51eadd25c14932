"""`[services.NAME]` and `[[servers]]`: each entry's endpoint, headers, `auth` or `oauth`, tags,
rate, egress, trust, gateway and content keys, resolved into Targets. A server that names a service
inherits its endpoint, credentials and rate (it may add tags and narrow `expose`); its gateway and
content keys default to its service's, whose content keys default to `[gateway]`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from ..core.credshape import credential_name
from ..core.policy import TrustPolicy
from ..core.rates import Rate, parse_duration, parse_rate
from ..core.templates import Template, is_credential_header, parse_template
from ..net.egress import EgressPolicy
from .aauth import AAuthConfig, entry_aauth
from .aws import aws_egress_check, parse_aws_auth
from .catalog import closed_egress_check, covering, floor
from .content import CONTENT_KEYS, ContentPolicy, parse_content, sandbox_warnings
from .cross_app import CROSS_APP_KEYS, parse_idp
from .exec import ExecEntry
from .model import (
    AUTH_METHODS,
    DEFAULT_EXPIRES_IN,
    EXPOSE,
    GRANTS,
    LOGIN_GRANTS,
    SIGNING_ALGS,
    AuthKind,
    GatewaySpec,
    LoginSpec,
    McpServerSpec,
    Target,
    signs,
)
from .reader import (
    CEILING_KEYS,
    DEFAULT_TAGS,
    EGRESS_KEYS,
    HEADER_NAME,
    NAME,
    TAGS,
    Collector,
    join,
    key_path,
    parse_egress,
    parse_tags,
    parse_trust,
    strings,
    tool_patterns,
    url,
)
from .reader import (
    TRUST_KEYS as TRUST_KEYS,  # re-exported: a server's keys
)
from .spiffe import parse_spiffe_auth, spiffe_entry_check


def _parse_headers(c: Collector, path: str, raw: Any, literal: frozenset[str]) -> dict[str, Template]:
    """Header templates. A credential-shaped name, or a literal that looks like a credential, must
    come from a secret, unless the header is listed in `literal_headers` (a public value)."""
    t = c.table(path, raw)
    out: dict[str, Template] = {}
    for i, (name, value) in enumerate(t.items()):
        hpath = key_path(path, name, i)
        if not HEADER_NAME.match(name):
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


def _literal_headers(c: Collector, path: str, raw: Any) -> frozenset[str]:
    names = strings(c, path, raw) or ()
    for i, name in enumerate(names):
        if is_credential_header(name):
            c.error(f"{path}[{i}]", "a credential header cannot be declared literal")
    return frozenset(n.lower() for n in names)


def _scope(c: Collector, path: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return " ".join(value.split()) or None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(value) or None
    c.error(path, "expected a string or an array of strings")
    return None


OAUTH_KEYS: Final = ("token_url", "issuer", "client_id", "client_secret", "private_key",
                     "scope", "resource", "audience", "auth_method", "expires_in_default", "signing_alg")
AUTH_KEYS: Final = ("kind", "token", "header", "value", "grant", "issuer", "token_url",
                    "client_id", "client_secret", "private_key", "scopes", "scope", "audience",
                    "resource", "auth_method", "expires_in_default", "signing_alg", *CROSS_APP_KEYS)
# the keys each kind takes: a key of another kind is refused, never silently ignored
_KIND_KEYS: Final = {"static": ("kind", "token", "header", "value"),
                     "oauth2": tuple(k for k in AUTH_KEYS if k not in ("token", "header", "value"))}


def _parse_login(c: Collector, path: str, t: dict[str, Any], grant: str,
                 scope_key: str) -> LoginSpec | None:
    client_id = t.get("client_id")
    if grant == "authorization_code" and "client_id" not in t:
        client_id = ""  # none: `mcpcreds login` registers a client (RFC 7591)
        if "client_secret" in t or "private_key" in t:
            c.error(join(path, "client_id"), "required with client_secret or private_key")
    elif not isinstance(client_id, str) or not client_id:
        c.error(join(path, "client_id"), "required: a non-empty string")
    public = grant in LOGIN_GRANTS and "client_secret" not in t and "private_key" not in t
    method = c.typed(join(path, "auth_method"), t.get("auth_method"), str,
                     "none" if public else "client_secret_basic")
    if method not in AUTH_METHODS:
        c.error(join(path, "auth_method"), f"expected one of {', '.join(AUTH_METHODS)}")
    elif method == "none" and grant not in LOGIN_GRANTS:
        c.error(join(path, "auth_method"), "'none' (a public client) only with grant = 'device' or "
                                           "'authorization_code'")
    signing_alg = c.typed(join(path, "signing_alg"), t.get("signing_alg"), str, "") or None
    if signing_alg is not None and signing_alg not in SIGNING_ALGS:
        c.error(join(path, "signing_alg"), f"expected one of {', '.join(SIGNING_ALGS)}")
    elif signing_alg is not None and method != "private_key_jwt":
        c.error(join(path, "signing_alg"), "only with auth_method = 'private_key_jwt'")
    secret = private_key = None
    if "client_secret" in t:
        secret = c.template(join(path, "client_secret"), t["client_secret"], credential=True)
    if "private_key" in t:
        private_key = c.template(join(path, "private_key"), t["private_key"], credential=True)
    if method == "private_key_jwt" and "private_key" not in t:
        c.error(join(path, "private_key"), "required for auth_method = 'private_key_jwt'")
    elif method in ("client_secret_basic", "client_secret_post") and "client_secret" not in t:
        c.error(join(path, "client_secret"), f"required for auth_method = {method!r}")
    expires_default = c.parsed(join(path, "expires_in_default"),
                               t.get("expires_in_default", DEFAULT_EXPIRES_IN), parse_duration)
    if expires_default is not None and not 1 <= expires_default <= 86400:
        c.error(join(path, "expires_in_default"), "expected from 1s to 1d")
    idp = parse_idp(c, path, t, grant)
    return LoginSpec(
        grant=grant,
        client_id=client_id if isinstance(client_id, str) else "",
        client_secret=secret,
        private_key=private_key,
        auth_method=method,
        token_url=url(c, join(path, "token_url"), t.get("token_url")),
        issuer=url(c, join(path, "issuer"), t.get("issuer")),
        scope=_scope(c, join(path, scope_key), t.get(scope_key)),
        resource=url(c, join(path, "resource"), t.get("resource")),
        audience=c.typed(join(path, "audience"), t.get("audience"), str, "") or None,
        expires_in_default=expires_default or DEFAULT_EXPIRES_IN,
        signing_alg=signing_alg,
        idp=idp,
    )


def _parse_oauth(c: Collector, path: str, raw: Any) -> LoginSpec | None:
    t = c.table(path, raw)
    c.keys(path, t, OAUTH_KEYS)
    return _parse_login(c, path, t, "client_credentials", "scope")


def _parse_auth(c: Collector, path: str, raw: Any) -> tuple[dict[str, Template], LoginSpec | None]:
    """The unified provider: `static` gives headers, `oauth2` gives a login."""
    t = c.table(path, raw)
    if t.get("kind") == "aws":  # SigV4, signed by the sidecar (config/aws.py): keys of its own
        parse_aws_auth(c, path, t)
        return {}, None
    if t.get("kind") == "spiffe":  # an SVID from files, presented by the sidecar (config/spiffe.py)
        parse_spiffe_auth(c, path, t)
        return {}, None
    kind = t.get("kind")
    c.keys(path, t, _KIND_KEYS.get(kind, AUTH_KEYS) if isinstance(kind, str) else AUTH_KEYS)
    if kind == "static":
        if "token" in t and ("header" in t or "value" in t):
            c.error(join(path, "token"), "static auth takes `token`, or `header` and `value`: not both")
            return {}, None
        if "token" in t:
            token = c.template(join(path, "token"), t["token"], credential=True)
            if token is None:
                return {}, None
            return {"Authorization": parse_template("Bearer " + token.source)}, None
        header, value = t.get("header"), t.get("value")
        if not isinstance(header, str) or not HEADER_NAME.match(header):
            c.error(join(path, "header"), "static auth needs `token`, or `header` and `value`")
            return {}, None
        template = c.template(join(path, "value"), value, credential=True)
        return ({header: template} if template else {}), None
    if kind == "oauth2":
        grant = c.typed(join(path, "grant"), t.get("grant"), str, "client_credentials")
        if grant == "refresh_token":
            c.error(join(path, "grant"), "a refresh token comes from a login: use grant = 'device' or "
                                         "'authorization_code' and run `mcpcreds login NAME`")
        elif grant not in GRANTS:
            c.error(join(path, "grant"), f"expected one of {', '.join(GRANTS)}")
        scope_key = "scopes" if "scopes" in t else "scope"
        if "scopes" in t and "scope" in t:
            c.error(join(path, "scope"), "`scope` or `scopes`: not both")
        return {}, _parse_login(c, path, t, grant, scope_key)
    c.error(join(path, "kind"), "expected 'static', 'oauth2', 'aws' or 'spiffe'")
    return {}, None


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
    content: ContentPolicy


_GATEWAY_KEYS: Final = ("expose", "rate_methods", "max_wait", "leases", "cache_results")
ENTRY_KEYS: Final = ("endpoint", "headers", "literal_headers", "tags", "rate", "oauth", "auth", "aauth",
                     *EGRESS_KEYS, *_GATEWAY_KEYS, *CONTENT_KEYS)


def _parse_gateway(c: Collector, path: str, t: dict[str, Any], base: GatewaySpec) -> GatewaySpec:
    """A server's gateway keys over `base` (its service's); a server may not widen `expose`."""
    expose = c.typed(join(path, "expose"), t.get("expose"), str, base.expose)
    if expose not in EXPOSE:
        c.error(join(path, "expose"), f"expected one of {', '.join(EXPOSE)}")
        expose = base.expose
    elif base.expose != "both" and expose != base.expose:
        c.error(join(path, "expose"), "wider than its service's: a server may only narrow `expose`")
        expose = base.expose
    methods = base.rate_methods
    if "rate_methods" in t:
        methods = strings(c, join(path, "rate_methods"), t["rate_methods"])
        if methods is not None and any(not m or len(m) > 128 for m in methods):
            c.error(join(path, "rate_methods"), "expected JSON-RPC method names (1 to 128 characters)")
    max_wait = base.max_wait
    if "max_wait" in t:
        parsed = c.parsed(join(path, "max_wait"), t["max_wait"], parse_duration)
        if parsed is not None and parsed > 3600:
            c.error(join(path, "max_wait"), "expected at most 1h")
        elif parsed is not None:
            max_wait = parsed
    leases = base.leases if "leases" not in t else c.typed(join(path, "leases"), t["leases"], bool, True)
    cache = c.typed(join(path, "cache_results"), t.get("cache_results"), bool, base.cache_results)
    return GatewaySpec(expose, methods, max_wait, leases, cache)


def _parse_entry(c: Collector, path: str, t: dict[str, Any], content: ContentPolicy) -> _Entry:
    endpoint = url(c, join(path, "endpoint"), t.get("endpoint"))
    literal = _literal_headers(c, join(path, "literal_headers"), t.get("literal_headers"))
    headers = _parse_headers(c, join(path, "headers"), t.get("headers"), literal)
    tags = parse_tags(c, join(path, "tags"), t.get("tags"))
    rate = None
    if "rate" in t:
        rate = c.parsed(join(path, "rate"), t["rate"], parse_rate)
    auth_kind: AuthKind | None = None
    login = None
    if "auth" in t:
        auth_kind = "auth"
        auth_headers, login = _parse_auth(c, join(path, "auth"), t["auth"])
        for name, template in auth_headers.items():
            headers.setdefault(name, template)
        if "oauth" in t:  # shadowed, but shown in specs: validated all the same
            _parse_oauth(c, join(path, "oauth"), t["oauth"])
            c.warnings.append(f"{join(path, 'oauth')}: not used, `auth` takes precedence")
    elif "oauth" in t:
        auth_kind = "oauth"
        login = _parse_oauth(c, join(path, "oauth"), t["oauth"])
    entry_aauth(c, path, t, auth_kind)  # a flag; which servers sign is decided in parse_config
    aws_egress_check(c, path, t)  # auth kind "aws", source "imds": its address must pass the egress policy
    urls = [endpoint, *((login.token_url, login.issuer) if login else ()),
            *((login.idp.token_url, login.idp.issuer) if login and login.idp else ())]
    gateway = _parse_gateway(c, path, t, GatewaySpec())
    spiffe_entry_check(c, path, t, endpoint, gateway.expose)  # an x509 SVID: only the gateway presents it
    return _Entry(endpoint, headers, tags, rate, auth_kind, login, parse_egress(c, path, t, urls), gateway,
                  parse_content(c, path, t, content))


def _effective_tags(tags: tuple[str, ...]) -> frozenset[str]:
    return frozenset(tags) if tags else DEFAULT_TAGS


def _default_resource(login: LoginSpec | None, endpoint: str) -> LoginSpec | None:
    if login is None or login.resource is not None:
        return login
    return LoginSpec(**{**{f: getattr(login, f) for f in login.__dataclass_fields__},
                        "resource": endpoint})


def shown_tags(tags: frozenset[str]) -> tuple[str, ...]:
    """A spec's tags: the effective ones, in TAGS' order."""
    return tuple(t for t in TAGS if t in tags)


def _spec_from_table(name: str, t: dict[str, Any], service: str | None,
                     tags: tuple[str, ...] | None = None) -> McpServerSpec:
    def mapping(key: str) -> dict[str, Any] | None:
        value = t.get(key)
        return dict(value) if isinstance(value, dict) else None

    return McpServerSpec(
        name=name,
        endpoint=t.get("endpoint") if isinstance(t.get("endpoint"), str) else None,
        headers={k: v for k, v in (mapping("headers") or {}).items() if isinstance(v, str)},
        tags=tuple(x for x in t.get("tags") or () if isinstance(x, str)) if tags is None else tags,
        aauth=t["aauth"] if isinstance(t.get("aauth"), bool) else None,
        oauth=mapping("oauth"),
        auth=mapping("auth"),
        service=service,
        rate=t.get("rate") if isinstance(t.get("rate"), str) else None,
        trust={k: t[k] for k in TRUST_KEYS if k in t} or None,
    )


def parse_services(c: Collector, raw: Any, content: ContentPolicy
                   ) -> tuple[dict[str, Target], dict[str, dict[str, Any]]]:
    """The catalog; `content`: `[gateway]`'s content keys, each entry's defaults."""
    services: dict[str, Target] = {}
    tables: dict[str, dict[str, Any]] = {}
    for i, (name, value) in enumerate(c.table("services", raw).items()):
        path = key_path("services", name, i)
        if not NAME.match(name):
            c.error(path, "service names use letters, digits, '_', '.', '-'")
            continue
        t = c.table(path, value)
        c.keys(path, t, (*ENTRY_KEYS, *CEILING_KEYS))
        entry = _parse_entry(c, path, t, content)
        allow = tool_patterns(c, join(path, "tool_allowlist"), t.get("tool_allowlist"))
        exclude = tool_patterns(c, join(path, "tool_exclude"), t.get("tool_exclude")) or ()
        if entry.endpoint is None:
            if "endpoint" not in t:
                c.error(join(path, "endpoint"), "required")
            continue
        key = f"service:{name}"
        tables[name] = t
        tags = _effective_tags(entry.tags)
        services[key] = Target(
            name=key,
            key=key,
            spec=_spec_from_table(key, t, None, shown_tags(tags)),  # as share_tags shows them, unless widened
            endpoint=entry.endpoint,
            headers=entry.headers,
            tags=tags,
            rate=entry.rate,
            auth_kind=entry.auth_kind,
            login=_default_resource(entry.login, entry.endpoint),
            egress=entry.egress,
            trust=TrustPolicy(tool_allowlist=allow, tool_exclude=exclude),  # the ceiling of its servers
            gateway=entry.gateway,
            content=entry.content,
        )
    return services, tables


_INHERITED: Final = ("endpoint", "headers", "literal_headers", "auth", "oauth", "aauth", "rate",
                     *EGRESS_KEYS)


def parse_servers(c: Collector, raw: Any, services: dict[str, Target],
                  service_tables: dict[str, dict[str, Any]], content: ContentPolicy,
                  closed: bool = False) -> dict[str, Target]:
    """`[[servers]]`; `content`: `[gateway]`'s content keys, a stand-alone server's defaults. Each is
    held to the catalog entries over its endpoint (config/catalog.py); `closed`: a server under
    none is an error."""
    servers: dict[str, Target] = {}
    if raw is None:
        return servers
    if not isinstance(raw, list):
        c.error("servers", "expected an array of tables ([[servers]])")
        return servers
    first: dict[str, int] = {}  # name -> the first server that has it, whether it parsed or not
    for i, value in enumerate(raw):
        path = f"servers[{i}]"
        t = c.table(path, value)
        c.keys(path, t, ("name", *ENTRY_KEYS, "service", *TRUST_KEYS))
        name = t.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            c.error(join(path, "name"), "required: letters, digits, '_', '.', '-'")
            continue
        if name in first:
            c.error(join(path, "name"), f"duplicate server name (servers[{first[name]}] has it)")
            continue
        first[name] = i
        service = t.get("service")
        if service is not None:
            target = _server_from_service(c, path, name, t, service, services, service_tables)
        else:
            target = _standalone_server(c, path, name, t, content)
        if target is not None:
            over = covering(services, target.endpoint)
            if closed:
                closed_egress_check(c, path, target, over)
            target = floor(c, path, t, target, over)
            servers[name] = target
            c.warnings.extend(sandbox_warnings(path, t, target.trust.trust))
            if target.gateway.serves_proxy and exposes_no_tool(target.trust):
                c.warnings.append(f"{path}: exposes no tool through the gateway (trust = "
                                  f"{target.trust.trust} and no tool_allowlist): list the tools it may offer "
                                  "in tool_allowlist, or set trust = \"trusted\" for a server you trust")
    return servers


def exposes_no_tool(policy: TrustPolicy) -> bool:
    """Whether the policy hides every tool whatever the server lists (the fail-closed default of a
    server that is not trusted and has no allowlist)."""
    return policy.exposes_nothing


def _server_from_service(c: Collector, path: str, name: str, t: dict[str, Any], service: Any,
                         services: dict[str, Target],
                         service_tables: dict[str, dict[str, Any]]) -> Target | None:
    for key in _INHERITED:
        if key in t:
            c.error(join(path, key), "inherited from its service; do not restate it")
    tags = parse_tags(c, join(path, "tags"), t.get("tags"))
    entry = services.get(f"service:{service}") if isinstance(service, str) else None
    if entry is None:
        known = ", ".join(sorted(k.partition(":")[2] for k in services)) or "none defined"
        c.error(join(path, "service"), f"unknown service (known: {known})")
        return None
    merged: dict[str, Any] = {**service_tables[service], "tags": sorted(set(entry.spec.tags) | set(tags))}
    merged.update((k, t[k]) for k in TRUST_KEYS if k in t)
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
        trust=parse_trust(c, path, t),
        gateway=_parse_gateway(c, path, t, entry.gateway),
        content=parse_content(c, path, t, entry.content),
    )


def _standalone_server(c: Collector, path: str, name: str, t: dict[str, Any],
                       content: ContentPolicy) -> Target | None:
    entry = _parse_entry(c, path, t, content)
    if entry.endpoint is None:
        if "endpoint" not in t:
            c.error(join(path, "endpoint"), "required (or `service` naming a [services] entry)")
        return None
    tags = _effective_tags(entry.tags)
    return Target(
        name=name,
        key=f"mcp:{name}",
        spec=_spec_from_table(name, t, None, shown_tags(tags)),  # as share_tags shows them, unless widened
        endpoint=entry.endpoint,
        headers=entry.headers,
        tags=tags,
        rate=entry.rate,
        auth_kind=entry.auth_kind,
        login=_default_resource(entry.login, entry.endpoint),
        egress=entry.egress,
        trust=parse_trust(c, path, t),
        gateway=entry.gateway,
        content=entry.content,
    )


class CredentialGroups:
    """The credentials behind names: cache keys whose templates name a common `{{secret:NAME}}` or
    `{{secret-file:PATH}}` (transitively) are one credential (a union-find over keys and secrets)."""

    def __init__(self, targets: Iterable[Target]) -> None:
        self._parent: dict[object, object] = {}
        for target in targets:
            for template in target.templates:
                for ref in template.refs:
                    self._parent[self.find(ref)] = self.find(("key", target.key))

    def find(self, node: object) -> object:
        parent = self._parent
        root = parent.setdefault(node, node)
        while root != parent[root]:
            root = parent[root]
        while node != root:  # path compression
            parent[node], node = root, parent[node]
        return root

    def of_key(self, key: str) -> object:
        return self.find(("key", key))


def proxy_only_keys(services: Iterable[Target], servers: Iterable[Target]) -> frozenset[str]:
    """The keys whose credential only the gateway may use: judged per credential, so a key that
    names a secret a proxy-only server names too is proxy-only as well (else its headers would
    hand that secret out)."""
    targets = (*services, *servers)
    if not any(t.gateway.expose == "proxy" for t in targets):
        return frozenset()  # without grouping every credential (a config may have thousands)
    groups = CredentialGroups(targets)
    proxied = {groups.of_key(t.key) for t in targets if t.gateway.expose == "proxy"}
    return frozenset(t.key for t in targets if groups.of_key(t.key) in proxied)


def share_tags(services: dict[str, Target], servers: dict[str, Target], execs: dict[str, ExecEntry]
               ) -> tuple[dict[str, Target], dict[str, Target], dict[str, ExecEntry]]:
    """Every name that reaches a credential carries the union of the tags of all names that reach
    it (a read-only name cannot launder a credential that another name tags `sensitive` or
    `egress`): the names of one cache key, and the servers whose templates name the same
    `{{secret:NAME}}` or `{{secret-file:PATH}}`, under whatever cache keys. Sharing is transitive:
    a server that shares one secret with a second and another with a third is grouped with both
    (it errs on the side of refusing a grant). An exec entry's child holds the secrets of its
    `env`: the entry also carries the tags of every server that shares one of them (its own tags
    describe the child, not the credential, so they do not flow back to the servers). The specs
    show these effective tags, `untrusted_input` of an untagged one included."""
    targets = (*services.values(), *servers.values())
    groups = CredentialGroups(targets)
    find = groups.find
    tags: dict[object, frozenset[str]] = {}
    for target in targets:
        root = find(("key", target.key))
        tags[root] = tags.get(root, frozenset()) | target.tags

    def widen(target: Target) -> Target:
        shared = tags[find(("key", target.key))]
        shown = shown_tags(shared)
        if shared == target.tags and shown == target.spec.tags:
            return target  # nothing to widen: no copy (a config may have thousands of servers)
        return dataclasses.replace(target, tags=shared, spec=dataclasses.replace(target.spec, tags=shown))

    def widen_exec(entry: ExecEntry) -> ExecEntry:
        shared = entry.tags.union(*(tags.get(find(ref), frozenset())
                                    for template in entry.env.values() for ref in template.refs))
        return dataclasses.replace(entry, tags=shared)

    return ({k: widen(t) for k, t in services.items()}, {k: widen(t) for k, t in servers.items()},
            {k: widen_exec(e) for k, e in execs.items()})


def signing(target: Target, aauth: AAuthConfig) -> Target:
    """`target` with `aauth` set when its requests are signed (and `auth_kind` "aauth" if it has no other)."""
    if not signs(target, aauth):
        return target
    return dataclasses.replace(target, aauth=True, auth_kind=target.auth_kind or "aauth")
