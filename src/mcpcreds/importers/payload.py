"""`mcpcreds spawn-payload --format agentd`: a server's secret-free spec in agentd's
`McpServerSpec` JSON shape, for a child that is still an agentd process (pure).

Only agentd's fields: `name`, `endpoint`, `headers` (a list of [name, value] pairs), `tags`,
`aauth`, `oauth`, `auth`, `service`, `rate`, `allow`, `exclude`, `timeout`; every credential stays
a `{{secret:...}}` template (the config holds no other). agentd knows no trust levels: `allow` and
`exclude` are the tools the gateway would let through (the spec's `limits`: its trust policy under
its catalog entry's ceiling), narrowed by a grant's tools, and `allow: []` when that is none; an
exec entry (no endpoint) has no place in it and is left out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ..core.policy import intersect_patterns

OAUTH: Final = ("token_url", "client_id", "client_secret", "scope")
AUTH_RENAMED: Final = {"sso_account_id": "account_id", "sso_role_name": "role_name"}
AUTH: Final = ("kind", "grant", "issuer", "token_url", "client_id", "client_secret", "scopes", "audience",
               "token", "header", "value", "region", "service", "source", "sso_start_url", "account_id",
               "role_name", "svid", "jwt_svid_file", "svid_file", "key_file")


def agentd_spec(spec: Mapping[str, Any], granted: Iterable[str] | None = None) -> dict[str, Any]:
    """One spec (`Target.spec_dict`, or one of a grant's answer) in agentd's shape; `granted`: the
    tools a grant narrows it to."""
    out: dict[str, Any] = {"name": spec.get("name"), "endpoint": spec.get("endpoint") or ""}
    if headers := spec.get("headers"):
        out["headers"] = [[str(k), str(v)] for k, v in dict(headers).items()]
    if tags := spec.get("tags"):
        out["tags"] = list(tags)
    if isinstance(spec.get("aauth"), bool):
        out["aauth"] = spec["aauth"]
    oauth = spec.get("oauth")
    if isinstance(oauth, Mapping):
        out["oauth"] = {k: oauth[k] for k in OAUTH if k in oauth}
        if isinstance(out["oauth"].get("scope"), list):
            out["oauth"]["scope"] = " ".join(out["oauth"]["scope"])
    auth = spec.get("auth")
    if isinstance(auth, Mapping):
        renamed = {AUTH_RENAMED.get(k, k): v for k, v in auth.items()}
        if renamed.get("source") == "web_identity":
            renamed["source"] = "irsa"
        if isinstance(renamed.get("scope"), str) and "scopes" not in renamed:
            renamed["scopes"] = renamed["scope"].split()
        out["auth"] = {k: renamed[k] for k in AUTH if k in renamed}
    for key in ("service", "rate"):
        if isinstance(spec.get(key), str):
            out[key] = spec[key]
    limits = spec.get("limits")
    if not isinstance(limits, Mapping):  # a spec that does not say what it is held to: no tool
        limits = {"allow": []}
    allow = limits.get("allow")
    if granted is not None:
        allow = list(granted) if allow is None else list(intersect_patterns(allow, granted))
    if allow is not None:
        out["allow"] = list(allow)
    if exclude := limits.get("exclude"):
        out["exclude"] = list(exclude)
    if isinstance(limits.get("timeout"), int | float):
        out["timeout"] = f"{limits['timeout']:g}s"
    return out


def agentd_specs(specs: Iterable[Mapping[str, Any]],
                 tools: Mapping[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """`tools`: a grant's answer's, server -> the tools it narrows that server to."""
    return [agentd_spec(s, (tools or {}).get(s["name"])) for s in specs
            if isinstance(s, Mapping) and s.get("endpoint")]
