"""`mcpcreds spawn-payload --format agentd`: a server's secret-free spec in agentd's
`McpServerSpec` JSON shape, for a child that is still an agentd process (pure).

Only agentd's fields: `name`, `endpoint`, `headers` (a list of [name, value] pairs), `tags`,
`aauth`, `oauth`, `auth`, `service`, `rate`; every credential stays a `{{secret:...}}` template
(the config holds no other). mcpcreds' trust and gateway keys have no place in it; an exec entry
(no endpoint) has none either and is left out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

OAUTH: Final = ("token_url", "client_id", "client_secret", "scope")
AUTH_RENAMED: Final = {"sso_account_id": "account_id", "sso_role_name": "role_name"}
AUTH: Final = ("kind", "grant", "issuer", "token_url", "client_id", "client_secret", "scopes", "audience",
               "token", "header", "value", "region", "service", "source", "sso_start_url", "account_id",
               "role_name", "svid", "jwt_svid_file", "svid_file", "key_file")


def agentd_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One spec (`McpServerSpec.to_dict`, or a grant's answer) in agentd's shape."""
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
    return out


def agentd_specs(specs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [agentd_spec(s) for s in specs if isinstance(s, Mapping) and s.get("endpoint")]
