"""`check` and the unified `auth` provider (issue 16): every kind/grant/source combination that is
built passes, every other one is a config error naming where and why, never a warning that
validates a configuration which then fails at its first request."""

from __future__ import annotations

from typing import Any

import pytest

from mcpcreds.config.load import parse_config
from mcpcreds.errors import ConfigError

SECRET = "{{secret:S}}"
ROLE = "arn:aws:iam::123456789012:role/mcp"
AWS = {"kind": "aws", "region": "us-east-1", "service": "execute-api"}
X509 = {"kind": "spiffe", "svid": "x509", "svid_file": "/a", "key_file": "/b", "bundle_file": "/c"}

BUILT: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("static-token", {"kind": "static", "token": SECRET}, {}),
    ("static-header", {"kind": "static", "header": "X-Key", "value": SECRET}, {}),
    ("client-credentials", {"kind": "oauth2", "token_url": "https://idp.example.com/token", "client_id": "c",
                            "client_secret": SECRET}, {}),
    ("client-credentials-jwt", {"kind": "oauth2", "issuer": "https://idp.example.com", "client_id": "c",
                                "private_key": SECRET, "auth_method": "private_key_jwt", "signing_alg": "ES256"}, {}),
    ("device", {"kind": "oauth2", "grant": "device", "issuer": "https://idp.example.com", "client_id": "c",
                "scopes": ["openid", "offline_access"]}, {}),
    ("authorization-code", {"kind": "oauth2", "grant": "authorization_code", "issuer": "https://idp.example.com",
                            "client_id": "c", "scope": "mcp"}, {}),
    ("authorization-code-registered", {"kind": "oauth2", "grant": "authorization_code"}, {}),
    ("aws-env", {**AWS, "source": "env"}, {}),
    ("aws-static", {**AWS, "source": "static", "access_key_id": "{{secret:K}}", "secret_access_key": SECRET}, {}),
    ("aws-imds", {**AWS, "source": "imds"}, {"allow_private": ["169.254.169.254"]}),
    ("aws-web-identity", {**AWS, "source": "web_identity", "role_arn": ROLE, "web_identity_token_file": "/t"}, {}),
    ("aws-sso", {**AWS, "source": "sso", "sso_start_url": "https://example.awsapps.com/start",
                 "sso_region": "eu-west-1", "sso_account_id": "123456789012", "sso_role_name": "Tools"}, {}),
    ("spiffe-jwt", {"kind": "spiffe", "svid": "jwt", "jwt_svid_file": "/run/spiffe/jwt"}, {}),
    ("spiffe-x509", X509, {"expose": "proxy"}),
]

REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("no-kind", {"token": SECRET}, {}, "auth.kind: expected 'static', 'oauth2', 'aws' or 'spiffe'"),
    ("unknown-kind", {"kind": "kerberos"}, {}, "auth.kind: expected"),
    ("grant-refresh-token", {"kind": "oauth2", "grant": "refresh_token", "client_id": "c"}, {},
     "auth.grant: a refresh token comes from a login"),
    ("grant-password", {"kind": "oauth2", "grant": "password", "client_id": "c", "client_secret": SECRET}, {},
     "auth.grant: expected one of client_credentials, device, authorization_code"),
    ("grant-implicit", {"kind": "oauth2", "grant": "implicit", "client_id": "c"}, {}, "auth.grant: expected one of"),
    ("public-client-credentials", {"kind": "oauth2", "token_url": "https://idp.example.com/token", "client_id": "c",
                                   "auth_method": "none"}, {}, "auth.auth_method: 'none' (a public client) only with grant"),
    ("static-with-a-grant", {"kind": "static", "token": SECRET, "grant": "device"}, {},
     "auth.grant: unknown key (allowed: kind, token, header, value)"),
    ("static-token-and-header", {"kind": "static", "token": SECRET, "header": "X-Key", "value": SECRET}, {},
     "auth.token: static auth takes `token`, or `header` and `value`: not both"),
    ("oauth2-with-a-token", {"kind": "oauth2", "grant": "device", "client_id": "c", "token": SECRET}, {},
     "auth.token: unknown key"),
    ("scope-and-scopes", {"kind": "oauth2", "grant": "device", "client_id": "c", "scope": "a", "scopes": ["b"]},
     {}, "auth.scope: `scope` or `scopes`: not both"),
    ("aws-sso-incomplete", {**AWS, "source": "sso"}, {}, "auth.sso_region: required"),
    ("aws-with-a-grant", {**AWS, "source": "env", "grant": "device"}, {}, "auth.grant: unknown key"),
    ("spiffe-x509-direct", X509, {}, "expose: auth kind \"spiffe\" with svid = \"x509\""),
    ("spiffe-with-a-token", {"kind": "spiffe", "svid": "jwt", "jwt_svid_file": "/j", "token": SECRET}, {},
     "auth.token: unknown key"),
]


def config(auth: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    # an allowlist: the server exposes a tool (else `check` warns it exposes none, whatever its auth)
    return {"servers": [{"name": "s", "endpoint": "https://mcp.example.com/mcp", "auth": auth,
                         "tool_allowlist": ["search"], **extra}]}


@pytest.mark.parametrize(("auth", "extra"), [(a, e) for _, a, e in BUILT], ids=[n for n, _, _ in BUILT])
def test_every_built_combination_passes_check_without_a_warning(auth: dict[str, Any], extra: dict[str, Any]) -> None:
    parsed = parse_config(config(auth, extra))
    assert parsed.warnings == ()
    assert parsed.servers["s"].auth_kind == "auth"


@pytest.mark.parametrize(("auth", "extra", "says"), [(a, e, s) for _, a, e, s in REFUSED],
                         ids=[n for n, _, _, _ in REFUSED])
def test_every_other_combination_is_a_config_error(auth: dict[str, Any], extra: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(auth, extra))
    assert f"servers[0].{says}" in str(caught.value)
    assert "{{secret:S}}" not in str(caught.value)  # no value repeated
