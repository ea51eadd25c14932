"""`auth = { kind = "aws", ... }` (parsed, pure): requests to a server signed with AWS Signature
Version 4 by the sidecar (the signer is `sigv4`, the credentials `aws_credentials`).

- `region`, `service`: the SigV4 scope (`us-east-1`, `execute-api`, `lambda`, ...).
- `source`: where the AWS credentials come from.
  - `env`: the sidecar's own `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`
    (botocore's `EnvProvider`).
  - `static`: `access_key_id`, `secret_access_key` and optionally `session_token`, each a template
    (`{{secret:NAME}}`): the secret access key is never written in the config.
  - `imds`: the EC2 instance metadata service, IMDSv2 (a token `PUT`, then `GET`s with it), at
    `imds_endpoint` (default `http://169.254.169.254`). That address is link-local metadata: the
    server's egress policy refuses it unless `allow_private` lists it, and `check` says so.
  - `web_identity`: STS `AssumeRoleWithWebIdentity` with the OIDC token in `web_identity_token_file`
    (re-read at each renewal: a projected service-account token rotates) for `role_arn`, at
    `sts_endpoint` (default `https://sts.{region}.amazonaws.com`), through the egress policy.
  - `sso`: AWS IAM Identity Center. `mcpcreds login NAME` registers a public client and runs its
    device authorization at `sso_start_url` (`sso_region`); the SSO access and refresh tokens go
    to the keyring (`aws_sso`); the sidecar gets `sso_role_name` in `sso_account_id` with
    `GetRoleCredentials`, renewing the SSO token from its refresh token (rotated ones stored first).
- The precedence of `auth` holds: a server with `auth` is never also AAuth-signed.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from ..core.templates import Template
from .reader import check_url

if TYPE_CHECKING:
    from .reader import Collector

AWS_KEYS: Final = ("kind", "region", "service", "source", "access_key_id", "secret_access_key",
                   "session_token", "imds_endpoint", "role_arn", "web_identity_token_file",
                   "role_session_name", "sts_endpoint", "sso_start_url", "sso_region", "sso_account_id",
                   "sso_role_name", "sso_oidc_endpoint", "sso_portal_endpoint")
SOURCES: Final = ("env", "static", "imds", "web_identity", "sso")
SSO_KEYS: Final = ("sso_start_url", "sso_region", "sso_account_id", "sso_role_name", "sso_oidc_endpoint",
                   "sso_portal_endpoint")
_ACCOUNT: Final = re.compile(r"[0-9]{12}\Z")
_ROLE_NAME: Final = re.compile(r"[\w+=,.@-]{1,64}\Z")
WEB_IDENTITY_KEYS: Final = ("role_arn", "web_identity_token_file", "role_session_name", "sts_endpoint")
_ROLE_ARN: Final = re.compile(r"arn:aws[a-z-]{0,16}:iam::[0-9]{12}:role/[\w+=,.@/-]{1,512}\Z")
_SESSION_NAME: Final = re.compile(r"[\w+=,.@-]{2,64}\Z")
DEFAULT_IMDS: Final = "http://169.254.169.254"
EXTRA_HINT: Final = "pip install 'mcpcreds[aws]'"
_REGION: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,31}\Z")
_SERVICE: Final = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}\Z")


@dataclass(frozen=True, slots=True)
class AwsAuth:
    """A server's SigV4 settings, templates intact."""

    region: str
    service: str
    source: str
    access_key_id: Template | None = None
    secret_access_key: Template | None = None
    session_token: Template | None = None
    imds_endpoint: str = DEFAULT_IMDS
    role_arn: str | None = None  # web_identity: the role assumed ...
    web_identity_token_file: str | None = None  # ... with the token in this file (re-read each time)
    role_session_name: str = "mcpcreds"
    sts_endpoint: str | None = None  # default: https://sts.{region}.amazonaws.com
    sso_start_url: str | None = None  # sso: the IAM Identity Center start URL ...
    sso_region: str | None = None  # ... its region
    sso_account_id: str | None = None  # ... the account and
    sso_role_name: str | None = None  # ... the role (permission set) whose credentials are asked for
    sso_oidc_endpoint: str | None = None  # default: https://oidc.{sso_region}.amazonaws.com
    sso_portal_endpoint: str | None = None  # default: https://portal.sso.{sso_region}.amazonaws.com

    @property
    def sts_url(self) -> str:
        return self.sts_endpoint or f"https://sts.{self.region}.amazonaws.com/"

    @property
    def sso_oidc_url(self) -> str:
        return (self.sso_oidc_endpoint or f"https://oidc.{self.sso_region}.amazonaws.com").rstrip("/")

    @property
    def sso_portal_url(self) -> str:
        return (self.sso_portal_endpoint or f"https://portal.sso.{self.sso_region}.amazonaws.com").rstrip("/")


def botocore_installed() -> bool:
    return importlib.util.find_spec("botocore") is not None


def parse_aws_auth(c: Collector, path: str, t: Mapping[str, Any]) -> AwsAuth | None:
    """Validate an `auth` table of kind `aws` (errors carry their TOML path, never a value)."""
    c.keys(path, t, AWS_KEYS)
    region, service, source = t.get("region"), t.get("service"), t.get("source", "env")
    ok = True
    if not isinstance(region, str) or not _REGION.match(region):
        c.error(f"{path}.region", "required: an AWS region name (e.g. \"us-east-1\")")
        ok = False
    if not isinstance(service, str) or not _SERVICE.match(service):
        c.error(f"{path}.service", "required: the SigV4 service name (e.g. \"execute-api\")")
        ok = False
    if source not in SOURCES:
        c.error(f"{path}.source", f"expected one of {', '.join(SOURCES)}")
        return None
    if not botocore_installed():
        c.error(f"{path}.kind", f"SigV4 signing needs botocore, an optional extra: {EXTRA_HINT}")
        ok = False
    templates: dict[str, Template | None] = {}
    for key in ("access_key_id", "secret_access_key", "session_token"):
        if key in t and source != "static":
            c.error(f"{path}.{key}", "only with source = \"static\"")
            ok = False
        elif key in t:
            # the key id is not secret, but it is written as a template all the same (rotated together)
            templates[key] = c.template(f"{path}.{key}", t[key], credential=key != "access_key_id",
                                        public="not the value itself")
            ok = ok and templates[key] is not None
    if source == "static":
        for key in ("access_key_id", "secret_access_key"):
            if key not in t:
                c.error(f"{path}.{key}", "required with source = \"static\" (e.g. \"{{secret:NAME}}\")")
                ok = False
    imds = DEFAULT_IMDS
    if "imds_endpoint" in t:
        if source != "imds":
            c.error(f"{path}.imds_endpoint", "only with source = \"imds\"")
            ok = False
        else:
            found = _imds_endpoint(c, f"{path}.imds_endpoint", t["imds_endpoint"])
            ok = ok and found is not None
            imds = found or imds
    web = _web_identity(c, path, t, source)
    sso = _sso(c, path, t, source)
    if not ok or web is None or sso is None:
        return None
    return AwsAuth(str(region), str(service), str(source), templates.get("access_key_id"),
                   templates.get("secret_access_key"), templates.get("session_token"), imds, **web, **sso)


def _sso(c: Collector, path: str, t: Mapping[str, Any], source: str) -> dict[str, Any] | None:
    """`sso_start_url`, `sso_region`, `sso_account_id`, `sso_role_name` (required with source
    "sso"), `sso_oidc_endpoint`, `sso_portal_endpoint` (defaults: AWS's in `sso_region`)."""
    if source != "sso":
        for key in SSO_KEYS:
            if key in t:
                c.error(f"{path}.{key}", "only with source = \"sso\"")
                return None
        return {}
    out: dict[str, Any] = {}
    checks = {"sso_region": (_REGION, "required: the IAM Identity Center region (e.g. \"eu-west-1\")"),
              "sso_account_id": (_ACCOUNT, "required: the 12-digit AWS account id"),
              "sso_role_name": (_ROLE_NAME, "required: the role (permission set) name")}
    for key, (pattern, says) in checks.items():
        value = t.get(key)
        if not isinstance(value, str) or not pattern.match(value):
            c.error(f"{path}.{key}", says)
            return None
        out[key] = value
    for key in ("sso_start_url", "sso_oidc_endpoint", "sso_portal_endpoint"):
        value = t.get(key)
        if value is None and key != "sso_start_url":
            continue
        problem = check_url(value) if isinstance(value, str) else "required: a URL"
        if problem is not None:
            c.error(f"{path}.{key}", problem)
            return None
        out[key] = value
    return out


def _web_identity(c: Collector, path: str, t: Mapping[str, Any], source: str) -> dict[str, Any] | None:
    """`role_arn`, `web_identity_token_file` (required), `role_session_name`, `sts_endpoint`."""
    if source != "web_identity":
        for key in WEB_IDENTITY_KEYS:
            if key in t:
                c.error(f"{path}.{key}", "only with source = \"web_identity\"")
                return None
        return {}
    out: dict[str, Any] = {}
    role, token_file = t.get("role_arn"), t.get("web_identity_token_file")
    if not isinstance(role, str) or not _ROLE_ARN.match(role):
        c.error(f"{path}.role_arn", "required: an IAM role ARN (arn:aws:iam::123456789012:role/NAME)")
        return None
    if not isinstance(token_file, str) or not token_file.startswith("/") or "\x00" in token_file \
            or len(token_file) > 4096:
        c.error(f"{path}.web_identity_token_file", "required: the absolute path of the OIDC token file")
        return None
    out.update(role_arn=role, web_identity_token_file=token_file)
    name = t.get("role_session_name", "mcpcreds")
    if not isinstance(name, str) or not _SESSION_NAME.match(name):
        c.error(f"{path}.role_session_name", "expected 2 to 64 of letters, digits and +=,.@_-")
        return None
    out["role_session_name"] = name
    endpoint = t.get("sts_endpoint")
    if endpoint is not None:
        problem = check_url(endpoint) if isinstance(endpoint, str) else "expected a URL string"
        if problem is not None:
            c.error(f"{path}.sts_endpoint", problem)
            return None
        out["sts_endpoint"] = endpoint
    return out


def _imds_endpoint(c: Collector, path: str, value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > 256:
        c.error(path, "expected an http:// URL (the instance metadata service)")
        return None
    try:
        parts = urlsplit(value)
        _ = parts.port
    except ValueError:
        parts = None
    if parts is None or parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username or parts.password:
        c.error(path, "expected http://HOST[:PORT] (IMDS speaks plain HTTP on a local address), no path")
        return None
    return value.rstrip("/")


def imds_egress_problem(imds_endpoint: str, allow_private: tuple[str, ...]) -> str | None:
    """Why the egress policy would refuse the IMDS address, known from the config alone: a
    non-loopback private or metadata address literal that `allow_private` does not list."""
    host = urlsplit(imds_endpoint).hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: the egress guard decides when it resolves
    if address.is_global or address.is_loopback:
        return None
    for entry in allow_private:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return None
        except ValueError:
            continue
    # the default address is named; one from the config is not quoted back (no config value is)
    listed = f'allow_private = ["{address}"]' if imds_endpoint == DEFAULT_IMDS else "imds_endpoint's address"
    return (f"the instance metadata service is refused by the egress policy: add {listed} to this "
            "server (or its service) to let the sidecar reach it")


def aws_egress_check(c: Collector, path: str, t: Mapping[str, Any]) -> None:
    """A server's `auth` of kind `aws` with `source = "imds"`: its IMDS address must pass the
    server's egress policy (`allow_private`), said by `check` rather than at the first request."""
    auth = t.get("auth")
    if not isinstance(auth, dict) or auth.get("kind") != "aws" or auth.get("source") != "imds":
        return
    endpoint = auth.get("imds_endpoint", DEFAULT_IMDS)
    private = t.get("allow_private")
    listed = tuple(p for p in private if isinstance(p, str)) if isinstance(private, list) else ()
    if isinstance(endpoint, str) and (problem := imds_egress_problem(endpoint, listed)) is not None:
        c.error(f"{path}.auth.source", problem)


def aws_templates(auth: Mapping[str, Any] | None) -> tuple[Template, ...]:
    """The templates of a `static` aws auth table as written (its secrets: rotation, `secret rm`,
    doctor and exec's leak check know them); () for anything else or what does not parse."""
    from ..core.templates import TemplateError, parse_template

    if auth is None or auth.get("kind") != "aws" or auth.get("source") != "static":
        return ()
    found = []
    for key in ("access_key_id", "secret_access_key", "session_token"):
        value = auth.get(key)
        if isinstance(value, str):
            try:
                found.append(parse_template(value))
            except TemplateError:
                continue
    return tuple(found)
