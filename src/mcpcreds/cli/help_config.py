"""`mcpcreds help config`: every config key with its default and meaning, man-page style.

The keys come from the parser's own definitions, so the page cannot drift from what `check`
accepts: the [sidecar] and [secrets] keys are the fields of SidecarConfig and SecretsConfig (their
defaults too), [gateway]'s are config.sidecar.GATEWAY_KEYS (ContentPolicy's defaults), a
server's keys are config.servers.ENTRY_KEYS and TRUST_KEYS (its tool_metadata's
config.tool_meta.TOOL_META_KEYS and FLAGGED_KEYS), the auth tables' are OAUTH_KEYS,
AUTH_KEYS, config.aws.AWS_KEYS and config.spiffe.SPIFFE_KEYS, [aauth]'s, [telemetry]'s and
[exec.NAME]'s (and its authorization's) their modules' tuples. Only the one-line meanings (and
defaults no dataclass holds) are written here; a key the parser accepts without a line here
prints as "(not described yet)", which tests/test_help_config.py refuses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Final, TextIO

from ..config import model as cfg
from ..config.aauth import AAUTH_KEYS, ENROLL_KEYS, AAuthConfig
from ..config.aws import AWS_KEYS, AwsAuth
from ..config.content import DEFAULT_ELICITATION_TIMEOUT, DEFAULT_TIMEOUT, MAX_ROOTS, ContentPolicy
from ..config.exec import AUTHORIZATION_KEYS, EXEC_KEYS, ExecEntry
from ..config.reader import TRUST_KEYS
from ..config.servers import AUTH_KEYS, ENTRY_KEYS, OAUTH_KEYS
from ..config.sidecar import GATEWAY_KEYS
from ..config.spiffe import SPIFFE_KEYS
from ..config.telemetry import TELEMETRY_KEYS, TelemetryConfig
from ..config.tool_meta import (
    CAPABILITIES,
    FLAGGED_KEYS,
    MAX_FLAGGED,
    MAX_TOOLS,
    PATTERNS,
    SENSITIVITIES,
    TOOL_META_KEYS,
)

UNDESCRIBED: Final = "(not described yet)"
_NO_DEFAULT: Final = object()

# (table, key) -> (default shown, meaning); the default is read from the dataclass when absent
TEXT: Final[dict[str, dict[str, tuple[Any, str]]]] = {
    "sidecar": {
        "socket": ("$MCPCREDS_SOCKET, else $XDG_RUNTIME_DIR/mcpcreds/mcpcreds.sock, else "
                   "/run/user/$UID/mcpcreds/mcpcreds.sock when that folder is the user's, else "
                   "/tmp/mcpcreds-$UID/mcpcreds.sock",
                   "the Unix socket; its folder is created 0700 and checked, the socket bound 0600"),
        "sidecar_uid": ("the uid of whoever reads the config",
                        "the uid the sidecar runs as; clients refuse a socket of another uid"),
        "allow_uids": ("the sidecar's own uid", "peer uids (SO_PEERCRED) allowed to talk to the socket"),
        "grant_only_uids": ("none", "peer uids that must present a grant for everything but health"),
        "state": (_NO_DEFAULT, "\"memory\", or \"redis://...\", \"rediss://...\", \"unix:///path\" to "
                  "share logins, buckets and grants between sidecars"),
        "state_key": ("none (required with a shared state)",
                      "secret template: logins kept in a shared state are encrypted with it"),
        "state_password": ("none", "secret template: the Redis password (never in the URL)"),
        "state_ca": ("the system's CAs", "CA file to verify a rediss:// server with"),
        "on_state_loss": (_NO_DEFAULT, "\"local\": degrade to local buckets and logins while Redis "
                          "is unreachable; \"closed\": refuse"),
        "local_share": (_NO_DEFAULT, "share of each rate a sidecar allows itself in degraded mode"),
        "refresh_ahead": (_NO_DEFAULT, "seconds before expiry a login is renewed (at most half its life)"),
        "audit_log": ("none", "JSON lines: rotations, invalidations, reloads, grants, audited egress"),
        "allow_trifecta": (_NO_DEFAULT, "allow (with a warning) a grant completing the Rule-of-Two trifecta"),
        "request_timeout": (_NO_DEFAULT, "seconds for a request head to arrive"),
        "idle_timeout": (_NO_DEFAULT, "seconds before an idle keep-alive connection is closed"),
        "token_timeout": (_NO_DEFAULT, "seconds bounding each token and discovery request"),
        "drain_timeout": (_NO_DEFAULT, "seconds in-flight requests get on SIGTERM (at most 300)"),
        "event_loop": (_NO_DEFAULT, "\"uvloop\" (libuv: less CPU per relayed call) or \"asyncio\" "
                       "(the standard library's); read at start, not on reload"),
        "egress": (_NO_DEFAULT, "\"closed\": every server's endpoint must be under a [services] entry's "
                   "(a server under none is a config error, and the gateway sends to none); \"open\": any"),
        "invalidate_cooldown": (_NO_DEFAULT, "a login is dropped by invalidate at most once per this"),
        "max_grants": (_NO_DEFAULT, "live grants in the whole sidecar"),
        "max_subgrants": (_NO_DEFAULT, "live sub-grants under one top grant, at any depth"),
        "grant_pause_budget": (_NO_DEFAULT, "seconds of 429 pause grant holders may set per key ..."),
        "grant_pause_window": (_NO_DEFAULT, "... within this many seconds"),
    },
    "gateway": {
        "listen": ("off", "\"127.0.0.1:PORT\" or \"[::1]:PORT\": the gateway's loopback TCP listener"),
        "timeout": (_NO_DEFAULT, "every server's timeout unless it sets its own (1s to 1h)"),
        "elicitation_enabled": (_NO_DEFAULT, "every server's elicitation_enabled unless it sets its own"),
        "elicitation_timeout_secs": (_NO_DEFAULT, "every server's elicitation_timeout_secs unless it "
                                     "sets its own"),
        "sampling_enabled": (_NO_DEFAULT, "every server's sampling_enabled unless it sets its own"),
        "media_passthrough": (_NO_DEFAULT, "every server's media_passthrough unless it sets its own"),
        "on_injection": (_NO_DEFAULT, "every server's on_injection unless it sets its own"),
        "pin_tools": ("on for untrusted and sandboxed servers, off for trusted",
                      "every server's pin_tools unless it sets its own"),
    },
    "secrets": {
        "sources": (_NO_DEFAULT, "where secrets are looked up, in order: \"env\", \"keyring\", "
                    "\"dir:/abs/path\", \"dir:$CREDENTIALS_DIRECTORY\""),
        "keyring_service": (_NO_DEFAULT, "the keyring service name entries are stored under"),
        "keyring_backend": ("SecretService on Linux", "pin a keyring backend (\"module.Class\")"),
        "allow_plaintext_keyring": (_NO_DEFAULT, "accept a keyring backend that stores plain text"),
        "keyring_timeout": (_NO_DEFAULT, "seconds bounding each keyring call (one a person waits on: 120 s)"),
        "cache_ttl": (_NO_DEFAULT, "seconds resolved header values are reused before sources are re-read"),
    },
    "server": {
        "name": ("(required)", "the server's name ([[servers]] only)"),
        "service": ("none", "a [services.NAME] catalog entry to inherit endpoint, auth, rate, tags from"),
        "endpoint": ("(required unless service)", "https://host[:port][/path]; http:// for loopback only"),
        "headers": ("{}", "header templates, e.g. { \"X-Api-Key\" = \"{{secret:KEY}}\" }"),
        "literal_headers": ("[]", "headers whose literal value is public though credential-like"),
        "tags": ("[] (counts as untrusted_input)", "untrusted_input, sensitive, egress (the trifecta)"),
        "rate": ("none (unlimited)", "\"<burst>/<per>\", e.g. \"60/1m\": a shared token bucket"),
        "oauth": ("none", "OAuth client credentials table (keys below)"),
        "auth": ("none", "the unified auth table: kind static, oauth2, aws, spiffe (keys below)"),
        "aauth": ("[aauth] default", "sign requests to this server with the AAuth agent key"),
        "net": ("\"inherit\"", "egress of the sidecar's own calls: inherit, restricted, broad_audited, off"),
        "allow_hosts": ("[]", "hosts the sidecar's own calls may reach (*.example.com matches subdomains)"),
        "deny_hosts": ("[]", "hosts they may not reach"),
        "allow_private": ("[]", "private or metadata addresses allowed all the same"),
        "expose": (_NO_DEFAULT, "\"proxy\": the credential stays in the sidecar (gateway only); "
                   "\"headers\": no gateway; \"both\""),
        "rate_methods": ("every request but tasks/*",
                         "JSON-RPC methods through the gateway that take a permit"),
        "max_wait": (_NO_DEFAULT, "seconds a gateway request waits for a permit before a 429"),
        "leases": ("true", "clients may lease a share of the bucket (with a shared state, of the "
                   "bucket in Redis); false: per request only"),
        "cache_results": ("true", "answer from a result the server marked cacheable (2026-07-28: ttlMs, "
                          "cacheScope), with nothing sent upstream; false: relay every request"),
        "trust": ("\"untrusted\"", "trusted, untrusted or sandboxed (for clients that filter tools)"),
        "tool_allowlist": ("none (a server: its catalog entry's)",
                           "the tools the gateway lets through: names or `prefix*` patterns; a catalog "
                           "entry's is a ceiling its servers can only narrow, whatever their trust"),
        "tool_exclude": ("[]", "tools hidden whatever the trust: names or `prefix*` patterns (a catalog "
                         "entry's hide them from every server under it)"),
        "expected_tools": ("none", "the tools the server is expected to list"),
        "allow_untrusted_without_allowlist": ("false", "serve an untrusted server without a tool_allowlist"),
        "timeout": (f"[gateway] timeout, else {DEFAULT_TIMEOUT:g}",
                    "seconds the gateway waits for the server's answer, and between two events of an "
                    "SSE answer (1s to 1h); past it: upstream_timeout, and the request is cancelled"),
        "roots": ("none (relayed to the client; [] for a sandboxed server)",
                  f"file:///absolute/path URIs (at most {MAX_ROOTS}) the gateway answers roots/list with, "
                  "never relaying it to the client"),
        "elicitation_enabled": ("[gateway] elicitation_enabled, else true",
                                "the server's elicitation requests reach the client (never for a "
                                "sandboxed server); false: the gateway declines them"),
        "elicitation_timeout_secs": (
            f"[gateway] elicitation_timeout_secs, else {DEFAULT_ELICITATION_TIMEOUT}",
            "seconds the client has to answer an elicitation (1 to 3600); then the gateway cancels it"),
        "sampling_enabled": ("[gateway] sampling_enabled, else true",
                             "the server may ask the client's LLM (sampling/createMessage; never a "
                             "sandboxed server); false: the gateway refuses it and hides the capability"),
        "media_passthrough": ("[gateway] media_passthrough, else false",
                              "image and audio content reaches the client (never from a sandboxed "
                              "server); false: replaced by a text saying what was withheld"),
        "on_injection": ("[gateway] on_injection, else \"log\"",
                         "an injection pattern in an untrusted or sandboxed server's result: \"log\" "
                         "(audit line and metric) or \"block\" (the result becomes an error)"),
        "pin_tools": ("[gateway] pin_tools, else on for untrusted and sandboxed, off for trusted",
                      "pin each tool's definition; a changed tool is withheld until approved "
                      "(mcpcreds tools approve)"),
        "tool_metadata": ("none (inferred from each tool's name)",
                          f"tool name = {{ data_sensitivity, capabilities, flagged_parameters }} (at most "
                          f"{MAX_TOOLS} tools; a server's entries over its service's, tool by tool): a "
                          "high-sensitivity tool on an untrusted or sandboxed server is refused, medium on "
                          "a sandboxed one warned about; an argument matching a flagged pattern is refused"),
    },
    "tool_metadata": {
        "data_sensitivity": ("(required)", f"one of {', '.join(SENSITIVITIES)}"),
        "capabilities": ("[]", f"among {', '.join(CAPABILITIES)}"),
        "flagged_parameters": ("[]", f"at most {MAX_FLAGGED} {{ pointer, pattern }} tables: arguments "
                               "of a tools/call refused when their value matches the pattern"),
    },
    "tool_metadata.flagged": {
        "pointer": ("(required)", "an RFC 6901 JSON pointer into the call's arguments, e.g. \"/path\" "
                    "(~1 is '/', ~0 is '~'; \"\" is all of them)"),
        "pattern": ("(required)", f"one of {', '.join(PATTERNS)} (described in docs/reference/gateway.md)"),
    },
    "auth": {
        "kind": ("(required)", "\"static\", \"oauth2\", \"aws\" or \"spiffe\""),
        "token": ("none", "static: secret template sent as Authorization: Bearer"),
        "header": ("none", "static: the header name carrying value"),
        "value": ("none", "static: secret template of that header"),
        "grant": ("\"client_credentials\"", "oauth2: client_credentials, device, authorization_code, "
                  "cross_app (enterprise-managed: an IdP's identity assertion exchanged for an ID-JAG)"),
        "scopes": ("none", "oauth2: the scopes as a list"),
        "token_url": ("discovered", "the token endpoint"),
        "issuer": ("none", "the authorization server (RFC 8414 / OpenID discovery)"),
        "client_id": ("(required; person logins may register)", "the OAuth client id"),
        "client_secret": ("none", "secret template of the client secret"),
        "private_key": ("none", "secret template of a PEM key (auth_method = \"private_key_jwt\")"),
        "auth_method": ("\"client_secret_basic\"", "or client_secret_post, private_key_jwt"),
        "scope": ("none", "the scope string"),
        "resource": ("the endpoint", "RFC 8707 resource indicator"),
        "audience": ("none", "audience parameter some servers want"),
        "expires_in_default": (f"{cfg.DEFAULT_EXPIRES_IN:g}", "seconds a token lives without expires_in"),
        "signing_alg": ("from the key", "private_key_jwt: the JWS algorithm"),
        "idp_issuer": ("none", "cross_app: the enterprise IdP (its token endpoint discovered: RFC 8414, "
                       "OpenID)"),
        "idp_token_url": ("discovered from idp_issuer", "cross_app: the IdP's token endpoint (RFC 8693 "
                          "token exchange)"),
        "idp_client_id": ("none (no client authentication at the IdP)",
                          "cross_app: the client id at the IdP"),
        "idp_client_secret": ("none (a public client)", "cross_app: secret template of the client secret at "
                              "the IdP (client_secret_basic)"),
        "subject_token": ("(required with cross_app)", "cross_app: secret template of the person's identity "
                          "assertion from the IdP, read at each renewal"),
        "subject_token_type": ("\"id_token\"", "cross_app: \"id_token\" (OpenID Connect) or \"saml2\""),
    },
    "aws": {
        "kind": ("(required)", "\"aws\": sign with SigV4"),
        "region": ("(required)", "the AWS region, e.g. \"us-east-1\""),
        "service": ("(required)", "the SigV4 service name"),
        "source": ("\"env\"", "where credentials come from: env, static, imds, web_identity, sso"),
        "access_key_id": ("none", "static: secret template"),
        "secret_access_key": ("none", "static: secret template"),
        "session_token": ("none", "static: secret template (temporary credentials)"),
        "imds_endpoint": (_NO_DEFAULT, "imds: the instance metadata endpoint"),
        "role_arn": ("none", "web_identity: the role to assume"),
        "web_identity_token_file": ("none", "web_identity: absolute path of the OIDC token file"),
        "role_session_name": (_NO_DEFAULT, "web_identity: the session name"),
        "sts_endpoint": ("https://sts.{region}.amazonaws.com/", "web_identity: the STS endpoint"),
        "sso_start_url": ("(required with sso)", "sso: the IAM Identity Center start URL"),
        "sso_region": ("(required with sso)", "sso: the IAM Identity Center region"),
        "sso_account_id": ("(required with sso)", "sso: the 12-digit account id"),
        "sso_role_name": ("(required with sso)", "sso: the role (permission set) to take"),
        "sso_oidc_endpoint": ("https://oidc.{sso_region}.amazonaws.com", "sso: the SSO OIDC endpoint"),
        "sso_portal_endpoint": ("https://portal.sso.{sso_region}.amazonaws.com", "sso: the portal"),
    },
    "spiffe": {
        "kind": ("(required)", "\"spiffe\": present a SPIFFE SVID read from files"),
        "svid": ("(required)", "\"jwt\" (a bearer JWT-SVID) or \"x509\" (an mTLS client identity)"),
        "jwt_svid_file": ("none", "jwt: absolute path of the JWT-SVID (re-read when it changes)"),
        "audience": ("none", "jwt: the audience the JWT-SVID must carry"),
        "svid_file": ("none", "x509: absolute path of the certificate chain (PEM)"),
        "key_file": ("none", "x509: absolute path of its private key (PEM)"),
        "bundle_file": ("none", "x509: absolute path of the trust bundle (PEM)"),
    },
    "aauth": {
        "provider": ("none", "the AAuth agent provider URL"),
        "key_file": ("aauth-agent.key in the state folder", "the agent's private key file (absolute)"),
        "enroll": ("none", "enrollment table: token or assertion_file"),
        "default": ("on when a provider is set", "sign servers without auth/oauth that say nothing"),
        "alg": (_NO_DEFAULT, "the agent key's algorithm: \"Ed25519\" or \"ES256\" (ECDSA P-256)"),
    },
    "aauth.enroll": {
        "token": ("none", "secret template of an enrollment token"),
        "assertion_file": ("none", "absolute path of an enrollment assertion"),
    },
    "exec": {
        "env": ("{}", "environment variables of the child: templates, literal values"),
        "env_isolation": (_NO_DEFAULT, "true: the child gets PATH, HOME, LANG... and env, nothing else; "
                          "false: the caller's environment less the secrets the sidecar knows, and env"),
        "net": ("\"inherit\"", "the child's network: inherit, restricted, broad_audited, off"),
        "allow_hosts": ("[]", "hosts the child may reach (restricted)"),
        "deny_hosts": ("[]", "hosts it may not reach"),
        "allow_private": ("[]", "private addresses allowed all the same"),
        "tags": (_NO_DEFAULT, "the child's tags (the trifecta check)"),
        "authorization": ("none (required with net = \"broad_audited\")",
                          "the operator's consent to broad_audited: { by, reason }, written to the "
                          "audit log when the sidecar first applies the mode"),
        "trust": ("\"trusted\" (unlike a server: entries older than the key keep working)",
                  "trusted, untrusted, sandboxed: what the relay lets through the child's stdio"),
        "tool_allowlist": ("none", "the tools exposed (untrusted, sandboxed): names or `prefix*` patterns; "
                           "others never reach it"),
        "tool_exclude": ("[]", "tools never exposed, whatever the trust (names or `prefix*` patterns)"),
        "expected_tools": ("[]", "attestation: tools outside it dropped (untrusted, sandboxed) or warned"),
        "allow_untrusted_without_allowlist": ("false", "untrusted without tool_allowlist: every tool"),
        "timeout": (f"[gateway]'s, else {DEFAULT_TIMEOUT:g} s",
                    "the wait for the child's answer to a request (then an error, and it is cancelled)"),
        "roots": ("none (relayed to the client; [] for a sandboxed entry)",
                  "file:// URIs the relay answers the child's roots/list with ([gateway] takes no roots)"),
        "elicitation_enabled": ("[gateway]'s, else true (never for sandboxed)",
                                "the child's elicitations reach the client (else declined)"),
        "elicitation_timeout_secs": (f"[gateway]'s, else {DEFAULT_ELICITATION_TIMEOUT}",
                                     "the client's time to answer an elicitation (then cancelled)"),
        "sampling_enabled": ("[gateway]'s, else true (never for sandboxed)",
                             "the child may ask the client's LLM (else refused)"),
        "media_passthrough": ("[gateway]'s, else false (never for sandboxed)",
                              "image and audio content passes (else withheld)"),
        "on_injection": ("[gateway]'s, else \"log\"", "log or block a result that reads as an injection"),
        "pin_tools": ("[gateway]'s, else on unless trusted",
                      "pin tool definitions (the sidecar's, under exec:NAME): a changed one withheld until "
                      "mcpcreds tools approve"),
        "tool_metadata": ("none (inferred from each tool's name)",
                          "per tool: data_sensitivity, capabilities, flagged_parameters (calls refused)"),
    },
    "telemetry": {
        "exporter": (_NO_DEFAULT, "\"otlp\": send traces (OpenTelemetry spans) over OTLP/HTTP, with the otel "
                     "extra installed; \"none\": traces off, nothing of OpenTelemetry imported"),
        "endpoint": (_NO_DEFAULT, "the collector's OTLP/HTTP base URL (spans go to its /v1/traces); http:// "
                     "only to a loopback host"),
        "service_name": (_NO_DEFAULT, "the service.name the spans carry"),
        "sample_ratio": (_NO_DEFAULT, "share of new traces recorded (0 to 1); a request that comes with a "
                         "trace follows its caller's decision"),
    },
    "exec.authorization": {
        "by": ("(required)", "who allowed broad_audited (at most 128 characters)"),
        "reason": ("(required)", "why (at most 1024 characters)"),
    },
}


def _fields(cls: Any) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def sections() -> list[tuple[str, str, list[str], dict[str, Any]]]:
    """(heading, TEXT table, keys the parser accepts, dataclass defaults) per config table."""
    server = [*ENTRY_KEYS, "name", "service", *TRUST_KEYS]
    return [
        ("[sidecar]", "sidecar", list(_fields(cfg.SidecarConfig)), _fields(cfg.SidecarConfig)),
        ("[gateway]", "gateway", list(GATEWAY_KEYS), _fields(ContentPolicy)),
        ("[secrets]", "secrets", list(_fields(cfg.SecretsConfig)), _fields(cfg.SecretsConfig)),
        ("[[servers]] and [services.NAME]", "server", list(dict.fromkeys(server)),
         {**_fields(cfg.GatewaySpec), **_fields(ContentPolicy)}),
        ("tool_metadata = { TOOL = {...} } (a server's tool metadata)", "tool_metadata",
         list(TOOL_META_KEYS), {}),
        ("flagged_parameters = [{ pointer, pattern }] (a tool's)", "tool_metadata.flagged",
         list(FLAGGED_KEYS), {}),
        ("oauth = {...} (a server's OAuth client)", "auth", list(OAUTH_KEYS), {}),
        ("auth = {...} (kind static, oauth2)", "auth", list(AUTH_KEYS), {}),
        ("auth = { kind = \"aws\", ... }", "aws", list(AWS_KEYS), _fields(AwsAuth)),
        ("auth = { kind = \"spiffe\", ... }", "spiffe", list(SPIFFE_KEYS), {}),
        ("[telemetry]", "telemetry", list(TELEMETRY_KEYS), _fields(TelemetryConfig)),
        ("[aauth]", "aauth", list(AAUTH_KEYS), _fields(AAuthConfig)),
        ("[aauth.enroll]", "aauth.enroll", list(ENROLL_KEYS), {}),
        ("[exec.NAME]", "exec", list(EXEC_KEYS), _fields(ExecEntry)),
        ("authorization = { by, reason } (an [exec.NAME]'s consent)", "exec.authorization",
         list(AUTHORIZATION_KEYS), {}),
    ]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple | list | frozenset):
        items = sorted(value) if isinstance(value, frozenset) else value
        return "[" + ", ".join(_toml(v) for v in items) + "]"
    if value is None:
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def entries() -> Iterable[tuple[str, str, str, str]]:
    """(heading, key, default, meaning) for every key, in the parser's order."""
    for heading, table, keys, defaults in sections():
        for key in keys:
            shown, meaning = TEXT.get(table, {}).get(key, (_NO_DEFAULT, UNDESCRIBED))
            if shown is _NO_DEFAULT:
                shown = _toml(defaults[key]) if key in defaults else "none"
            yield heading, key, str(shown), meaning


def render(out: TextIO, width: int = 100) -> None:
    import textwrap

    out.write("MCPCREDS CONFIG\n\n"
              "  TOML, read from --config PATH, else $MCPCREDS_CONFIG, else\n"
              "  $XDG_CONFIG_HOME/mcpcreds/config.toml. `mcpcreds check` validates it. Durations are\n"
              "  seconds or \"500ms\", \"60s\", \"5m\"...; a secret is written {{secret:NAME}}, never\n"
              "  its value.\n")
    heading = None
    for section, key, default, meaning in entries():
        if section != heading:
            heading = section
            out.write(f"\n{section}\n")
        out.write(f"  {key} = {default}\n")
        out.write(textwrap.fill(meaning, width, initial_indent="      ", subsequent_indent="      ") + "\n")
