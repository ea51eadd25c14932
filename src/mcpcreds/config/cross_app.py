"""`auth = { kind = "oauth2", grant = "cross_app", ... }` (parsed, pure): enterprise-managed
authorization (the MCP extension; draft-ietf-oauth-identity-assertion-authz-grant). The person's
identity assertion from the enterprise IdP (an OpenID Connect ID token, or a SAML 2.0 assertion)
is exchanged at the IdP's token endpoint (RFC 8693) for an Identity Assertion JWT Authorization
Grant (ID-JAG) addressed to the MCP server's authorization server, which redeems it (RFC 7523
jwt-bearer) for the access token. The keys of the IdP side are here; the client at the MCP
server's authorization server is the login's own `client_id` and `client_secret`/`private_key`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..core.templates import Template
from .reader import join, url

if TYPE_CHECKING:
    from .reader import Collector

CROSS_APP: Final = "cross_app"
CROSS_APP_KEYS: Final = ("idp_issuer", "idp_token_url", "idp_client_id", "idp_client_secret",
                         "subject_token", "subject_token_type")
SUBJECT_TOKEN_TYPES: Final = {"id_token": "urn:ietf:params:oauth:token-type:id_token",
                              "saml2": "urn:ietf:params:oauth:token-type:saml2"}
MAX_CLIENT_ID_CHARS: Final = 512


@dataclass(frozen=True, slots=True)
class IdpSpec:
    """The enterprise IdP of a cross-app login: where the identity assertion is exchanged (its
    token endpoint, else discovered from its issuer), as which client, and the assertion itself
    (a secret template, rendered at each exchange: a renewed assertion is picked up)."""

    issuer: str | None
    token_url: str | None
    client_id: str | None
    client_secret: Template | None
    subject_token: Template
    subject_token_type: str  # a key of SUBJECT_TOKEN_TYPES

    @property
    def templates(self) -> tuple[Template, ...]:
        return tuple(t for t in (self.subject_token, self.client_secret) if t is not None)

    @property
    def token_type_urn(self) -> str:
        return SUBJECT_TOKEN_TYPES[self.subject_token_type]


def parse_idp(c: Collector, path: str, t: dict[str, Any], grant: str) -> IdpSpec | None:
    """The IdP keys of an `oauth2` auth table: required with grant = "cross_app", refused with
    any other grant (never silently ignored)."""
    present = [k for k in CROSS_APP_KEYS if k in t]
    if grant != CROSS_APP:
        for key in present:
            c.error(join(path, key), "only with grant = 'cross_app'")
        return None
    issuer = url(c, join(path, "idp_issuer"), t.get("idp_issuer"))
    token_url = url(c, join(path, "idp_token_url"), t.get("idp_token_url"))
    if "idp_issuer" not in t and "idp_token_url" not in t:
        c.error(join(path, "idp_token_url"), "grant = 'cross_app' needs the enterprise IdP: idp_token_url "
                                              "(its token endpoint) or idp_issuer (discovered)")
    if "token_url" in t and "issuer" not in t:
        c.error(join(path, "issuer"), "grant = 'cross_app' with token_url needs issuer too: the ID-JAG is "
                                      "addressed to the authorization server's issuer")
    client_id = t.get("idp_client_id")
    if client_id is not None and (not isinstance(client_id, str) or not client_id.isprintable()
                                  or not 0 < len(client_id) <= MAX_CLIENT_ID_CHARS):
        c.error(join(path, "idp_client_id"), f"expected a client id (1 to {MAX_CLIENT_ID_CHARS} characters)")
        client_id = None
    secret = None
    if "idp_client_secret" in t:
        secret = c.template(join(path, "idp_client_secret"), t["idp_client_secret"], credential=True)
        if "idp_client_id" not in t:
            c.error(join(path, "idp_client_id"), "required with idp_client_secret")
    subject = None
    if "subject_token" not in t:
        c.error(join(path, "subject_token"),
                "grant = 'cross_app' needs the person's identity assertion: a secret template, e.g. "
                "\"{{secret-file:/run/user/1000/id-token}}\"")
    else:
        subject = c.template(join(path, "subject_token"), t["subject_token"], credential=True)
    kind = c.typed(join(path, "subject_token_type"), t.get("subject_token_type"), str, "id_token")
    if kind not in SUBJECT_TOKEN_TYPES:
        c.error(join(path, "subject_token_type"), f"expected one of {', '.join(SUBJECT_TOKEN_TYPES)}")
        kind = "id_token"
    if subject is None:
        return None
    return IdpSpec(issuer, token_url, client_id if isinstance(client_id, str) else None, secret, subject,
                   kind)
