"""AWS SigV4 (issue 16, `auth = { kind = "aws" }`): requests signed by the sidecar with botocore's
signer; the AWS secret key never leaves it.

- The signer against the AWS Signature Version 4 test-suite vectors (get-vanilla,
  get-vanilla-query-order-key-case, post-vanilla: AKIDEXAMPLE, 20150830T123600Z, us-east-1,
  service), exactly, with a fixed clock; the independent verifier of the test peer
  (tests/peers/sigv4_peer.py: hashlib and hmac, written from the specification) accepts them too.
- Credentials from the environment (botocore's EnvProvider), from a fake IMDSv2 endpoint (a
  local HTTP server: the token PUT is demanded before any GET) and from a fake STS
  (AssumeRoleWithWebIdentity with the token file, re-read each time), renewed ahead of expiry on a fake
  clock, kept while valid when a renewal fails; the metadata address refused by the egress policy.
- `check`: the sources not built refused, literals refused, the IMDS address needs allow_private,
  botocore missing named with its extra.
- End to end: the real sidecar, the MCP SDK 2.x client through the gateway to a real MCP server that
  admits only verified signatures, for each source (env, static, imds, web_identity); the `sign` route for direct clients (origin-
  bound, grant-aware), a tampered body or path refused by the verifier; the secret keys in no
  output (canary scan).
"""

from __future__ import annotations

import asyncio
import base64
import calendar
import hashlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient
from mcpcreds.config import aws as aws_config
from mcpcreds.config.load import parse_config
from mcpcreds.config.model import aws_auth_of, is_aws
from mcpcreds.errors import ConfigError, Forbidden
from mcpcreds.net.egress import EgressPolicy
from mcpcreds.net.egress_http import egress_client
from mcpcreds.signers.aws_credentials import (
    AwsCredentials,
    AwsCredentialsError,
    CredentialCache,
    from_env,
    from_imds,
    from_web_identity,
)
from mcpcreds.signers.aws_refusal import stale_credentials_code
from mcpcreds.signers.sigv4 import EMPTY_SHA256, sign
from tests.conftest import CANARY, run_cli
from tests.peers.sigv4_peer import Rejected, SigV4Peer, start_sigv4_peer, verify
from tests.sidecar_proc import SidecarProcess, run_sidecar

# the AWS SigV4 test suite's credentials, scope and instant
SUITE = AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None, None)
SUITE_WHEN = calendar.timegm(time.strptime("20150830T123600Z", "%Y%m%dT%H%M%SZ"))
SUITE_CRED = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
VECTORS = [  # (name, method, url, the published signature)
    ("get-vanilla", "GET", "https://example.amazonaws.com/",
     "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
    ("get-vanilla-query-order-key-case", "GET", "https://example.amazonaws.com/?Param2=value2&Param1=value1",
     "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
    ("post-vanilla", "POST", "https://example.amazonaws.com/",
     "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
]


@pytest.mark.parametrize(("name", "method", "url", "signature"), VECTORS, ids=[v[0] for v in VECTORS])
def test_the_signer_matches_the_aws_test_suite_exactly(name: str, method: str, url: str, signature: str) -> None:
    added = sign(SUITE, "us-east-1", "service", method, url, [("Host", "example.amazonaws.com")], EMPTY_SHA256,
                 SUITE_WHEN, content_header=False)
    assert added == {"Authorization": f"{SUITE_CRED}SignedHeaders=host;x-amz-date, Signature={signature}",
                     "X-Amz-Date": "20150830T123600Z"}
    # the independent verifier of the test peer agrees with the published vector
    headers = [("Host", "example.amazonaws.com"), *added.items()]
    keys = {"AKIDEXAMPLE": (SUITE.secret_access_key, None)}
    assert verify(method, url, headers, b"", SUITE_WHEN, keys, "us-east-1", "service",
                  require_content_sha256=False) == "AKIDEXAMPLE"


BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
SESSION = AwsCredentials("ASIAEXAMPLESESSION01", "session-secret-" + CANARY, "session-token-" + CANARY, None)


def signed_request(body: bytes = BODY, url: str = "https://api.example.com/prod/mcp") -> list[tuple[str, str]]:
    lines = [("host", "api.example.com"), ("content-type", "application/json"), ("mcp-session-id", "s1")]
    added = sign(SESSION, "eu-west-1", "execute-api", "POST", url, lines, hashlib.sha256(body).hexdigest(),
                 time.time())
    return [*lines, *added.items()]


KEYS = {SESSION.access_key_id: (SESSION.secret_access_key, SESSION.session_token)}


def check(headers: list[tuple[str, str]], body: bytes = BODY, url: str = "https://api.example.com/prod/mcp",
          method: str = "POST") -> str:
    return verify(method, url, headers, body, time.time(), KEYS, "eu-west-1", "execute-api")


def test_a_signed_request_covers_body_token_and_headers_and_verifies_independently() -> None:
    headers = signed_request()
    assert check(headers) == SESSION.access_key_id
    auth = dict(headers)["Authorization"]
    assert "SignedHeaders=content-type;host;mcp-session-id;x-amz-content-sha256;x-amz-date;x-amz-security-token" \
        in auth
    assert dict(headers)["X-Amz-Content-SHA256"] == hashlib.sha256(BODY).hexdigest()


@pytest.mark.parametrize(("change", "error"), [
    ("body", "content_sha256"),
    ("path", "signature_mismatch"),
    ("method", "signature_mismatch"),
    ("header", "signature_mismatch"),
    ("token", "security_token"),
])
def test_tampering_fails_verification(change: str, error: str) -> None:
    headers = signed_request()
    body, url, method = BODY, "https://api.example.com/prod/mcp", "POST"
    if change == "body":
        body = BODY.replace(b"tools/list", b"tools/call")
    elif change == "path":
        url = "https://api.example.com/prod/admin"
    elif change == "method":
        method = "PUT"
    elif change == "header":
        headers = [(k, "s2" if k == "mcp-session-id" else v) for k, v in headers]
    else:
        headers = [(k, "other" if k == "X-Amz-Security-Token" else v) for k, v in headers]
    with pytest.raises(Rejected) as caught:
        check(headers, body, url, method)
    assert caught.value.error == error


# ------------------------------------------------------------------------------ credentials


def test_env_credentials_come_from_botocores_env_provider() -> None:
    creds = from_env({"AWS_ACCESS_KEY_ID": "AKIAENVEXAMPLE000001", "AWS_SECRET_ACCESS_KEY": "env-" + CANARY,
                      "AWS_SESSION_TOKEN": "tok-" + CANARY})
    assert (creds.access_key_id, creds.secret_access_key, creds.session_token) == (
        "AKIAENVEXAMPLE000001", "env-" + CANARY, "tok-" + CANARY)
    assert CANARY not in repr(creds)
    with pytest.raises(AwsCredentialsError) as caught:
        from_env({"AWS_ACCESS_KEY_ID": "AKIAENVEXAMPLE000001"})
    assert "AWS_SECRET_ACCESS_KEY" in caught.value.message


class FakeImds:
    """IMDSv2: PUT /latest/api/token (with the TTL header) gives a token; every GET must carry it
    (401 otherwise, as an instance with IMDSv1 disabled answers)."""

    def __init__(self, key_id: str, secret: str, token: str, expires: float) -> None:
        self.creds = {"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": key_id, "SecretAccessKey": secret,
                      "Token": token, "Expiration": datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        self.session = "imds-token-" + CANARY[:8]
        self.calls: list[tuple[str, str, bool]] = []  # (method, path, carried the token)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                fake.calls.append(("PUT", self.path, False))
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._reply(400, b"")
                    return
                self._reply(200, fake.session.encode())

            def do_GET(self) -> None:
                carried = self.headers.get("X-aws-ec2-metadata-token") == fake.session
                fake.calls.append(("GET", self.path, carried))
                if not carried:
                    self._reply(401, b"")
                elif self.path == "/latest/meta-data/iam/security-credentials/":
                    self._reply(200, b"mcp-role\n")
                elif self.path == "/latest/meta-data/iam/security-credentials/mcp-role":
                    self._reply(200, json.dumps(fake.creds).encode())
                else:
                    self._reply(404, b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeImds:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def imds_auth(url: str) -> aws_config.AwsAuth:
    return aws_config.AwsAuth("us-east-1", "execute-api", "imds", imds_endpoint=url)


async def test_imds_v2_token_first_then_the_role_credentials() -> None:
    expires = time.time() + 3600
    with FakeImds("ASIAIMDSEXAMPLE00001", "imds-" + CANARY, "imds-session-" + CANARY, expires) as imds:
        async with egress_client(EgressPolicy(dev_loopback=True)) as http:
            creds = await from_imds(imds_auth(imds.url), http)
    assert (creds.access_key_id, creds.secret_access_key, creds.session_token) == (
        "ASIAIMDSEXAMPLE00001", "imds-" + CANARY, "imds-session-" + CANARY)
    assert creds.expires_at == pytest.approx(int(expires))
    assert imds.calls[0] == ("PUT", "/latest/api/token", False)  # the token first ...
    assert [c[1:] for c in imds.calls[1:]] == [  # ... then every GET carries it
        ("/latest/meta-data/iam/security-credentials/", True),
        ("/latest/meta-data/iam/security-credentials/mcp-role", True)]


async def test_imds_without_a_token_or_a_role_is_an_error_naming_what() -> None:
    with FakeImds("ASIAIMDSEXAMPLE00001", "imds-" + CANARY, "t", time.time() + 3600) as imds:
        imds.session = ""  # the token PUT answers an empty token
        async with egress_client(EgressPolicy(dev_loopback=True)) as http:
            with pytest.raises(AwsCredentialsError) as caught:
                await from_imds(imds_auth(imds.url), http)
    assert "IMDSv2 token" in caught.value.message and CANARY not in caught.value.message


async def test_the_metadata_address_is_refused_by_the_egress_policy_unless_allowed() -> None:
    async with egress_client(EgressPolicy()) as http:
        with pytest.raises(Forbidden) as caught:
            await from_imds(imds_auth(aws_config.DEFAULT_IMDS), http)
    assert "metadata" in caught.value.message


class FakeSts:
    """STS's AssumeRoleWithWebIdentity (the query protocol, an XML answer): the form must carry the
    role and the token the test wrote; anything else is 403 AccessDenied."""

    def __init__(self, role: str, token_file: Path, key_id: str, secret: str, session: str, expires: float) -> None:
        self.tokens: list[str] = []
        self.token_file = token_file
        self.answer: bytes | None = None  # instead of the credentials
        expiration = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.creds = creds = (f'<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
                 f"<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>{key_id}</AccessKeyId>"
                 f"<SecretAccessKey>{secret}</SecretAccessKey><SessionToken>{session}</SessionToken>"
                 f"<Expiration>{expiration}</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
                 f"</AssumeRoleWithWebIdentityResponse>").encode()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                from urllib.parse import parse_qs

                form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()}
                fake.tokens.append(form.get("WebIdentityToken", ""))
                ok = (form.get("Action"), form.get("RoleArn"), form.get("WebIdentityToken")) == (
                    "AssumeRoleWithWebIdentity", role, token_file.read_text().strip())
                body = (fake.answer or creds) if ok else b"<ErrorResponse><Error><Code>AccessDenied</Code></Error></ErrorResponse>"
                self.send_response(200 if ok else 403)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeSts:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


ROLE = "arn:aws:iam::123456789012:role/mcp-agent"


async def test_web_identity_assumes_the_role_with_the_token_file_read_each_time(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("oidc-token-1\n")
    with FakeSts(ROLE, token_file, "ASIAWEBEXAMPLE000001", "web-" + CANARY, "web-session-" + CANARY,
                 time.time() + 3600) as sts:
        auth = aws_config.AwsAuth("us-east-1", "execute-api", "web_identity", role_arn=ROLE,
                                  web_identity_token_file=str(token_file), sts_endpoint=sts.url)
        async with egress_client(EgressPolicy(dev_loopback=True)) as http:
            creds = await from_web_identity(auth, http)
            assert (creds.access_key_id, creds.secret_access_key, creds.session_token) == (
                "ASIAWEBEXAMPLE000001", "web-" + CANARY, "web-session-" + CANARY)
            token_file.write_text("oidc-token-2\n")  # a projected token rotated
            await from_web_identity(auth, http)
            assert sts.tokens == ["oidc-token-1", "oidc-token-2"]
            refused = aws_config.AwsAuth("us-east-1", "execute-api", "web_identity", role_arn=ROLE + "-other",
                                         web_identity_token_file=str(token_file), sts_endpoint=sts.url)
            with pytest.raises(AwsCredentialsError) as caught:
                await from_web_identity(refused, http)
            assert "AccessDenied" in caught.value.message and "oidc-token" not in caught.value.message
            # the same credentials, spelled through an entity of a DTD: refused, never expanded
            inner = sts.creds.split(b"<AssumeRoleWithWebIdentityResult>")[1].split(b"</AssumeRoleWithWebIdentityResult>")[0]
            sts.answer = (b'<!DOCTYPE r [<!ENTITY c "' + inner + b'">]><AssumeRoleWithWebIdentityResponse '
                          b'xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleWithWebIdentityResult>&c;'
                          b"</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>")
            with pytest.raises(AwsCredentialsError) as caught:
                await from_web_identity(auth, http)
            assert "no usable credentials" in caught.value.message


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_expiring_credentials_are_renewed_ahead_and_kept_while_valid_when_renewal_fails() -> None:
    clock = FakeClock()
    cache = CredentialCache(clock)
    issued: list[AwsCredentials] = []
    failing = False

    async def fetch() -> AwsCredentials:
        if failing:
            raise AwsCredentialsError("aws: the instance metadata service could not be reached")
        issued.append(AwsCredentials(f"ASIAROTATING{len(issued):08d}", "s", "t", clock.now + 3600))
        return issued[-1]

    first = await cache.get("imds", fetch, 2.0)
    clock.now += 3000  # 10 minutes before expiry: still held
    assert await cache.get("imds", fetch, 2.0) is first and len(issued) == 1
    clock.now += 301  # within REFRESH_AHEAD (300 s) of expiry: renewed
    second = await cache.get("imds", fetch, 2.0)
    assert second is not first and len(issued) == 2
    failing = True
    clock.now += 3400  # renewal due, the IMDS fails: the held set is still valid, so it is used
    assert await cache.get("imds", fetch, 2.0) is second
    clock.now += 300  # expired now: never used, the failure surfaces
    with pytest.raises(AwsCredentialsError):
        await cache.get("imds", fetch, 2.0)


async def test_concurrent_requests_share_one_fetch() -> None:
    cache = CredentialCache(FakeClock())
    started = asyncio.Event()
    release = asyncio.Event()
    calls = 0

    async def fetch() -> AwsCredentials:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return AwsCredentials("AKIASHAREDEXAMPLE001", "s", None, None)

    waiting = [asyncio.ensure_future(cache.get("k", fetch, 60.0)) for _ in range(5)]
    await started.wait()
    release.set()
    assert len({id(c) for c in await asyncio.gather(*waiting)}) == 1 and calls == 1


# ------------------------------------------------------------------------------ check


def server(auth: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"servers": [{"name": "s", "endpoint": "https://api.example.com/mcp", "auth": auth, **extra}]}


AWS = {"kind": "aws", "region": "us-east-1", "service": "execute-api"}


@pytest.mark.parametrize(("auth", "extra", "where", "says"), [
    ({**AWS, "source": "sso"}, {}, "auth.sso_region", "required"),  # sso's settings: tests/test_aws_sso.py
    ({**AWS, "source": "web_identity", "web_identity_token_file": "/t"}, {}, "auth.role_arn", "required"),
    ({**AWS, "source": "web_identity", "role_arn": "arn:aws:iam::123456789012:role/r"}, {},
     "auth.web_identity_token_file", "required"),
    ({**AWS, "source": "env", "role_arn": "arn:aws:iam::123456789012:role/r"}, {}, "auth.role_arn", "only with"),
    ({**AWS, "source": "web_identity", "role_arn": "arn:aws:iam::123456789012:role/r", "web_identity_token_file": "/t",
      "sts_endpoint": "http://sts.example.com/"}, {}, "auth.sts_endpoint", "https"),
    ({**AWS, "source": "vault"}, {}, "auth.source", "expected one of env, static, imds, web_identity"),
    ({**AWS, "source": "static", "access_key_id": "{{secret:K}}",
      "secret_access_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}, {}, "auth.secret_access_key",
     "must not be written in the config"),
    ({**AWS, "source": "static", "access_key_id": "{{secret:K}}"}, {}, "auth.secret_access_key", "required"),
    ({**AWS, "source": "env", "secret_access_key": "{{secret:S}}"}, {}, "auth.secret_access_key",
     "only with source"),
    ({**AWS, "source": "imds"}, {}, "auth.source", 'allow_private = ["169.254.169.254"]'),
    ({**AWS, "source": "imds", "imds_endpoint": "http://169.254.169.254/latest"}, {"allow_private": ["169.254.169.254"]},
     "auth.imds_endpoint", "no path"),
    ({"kind": "aws", "service": "execute-api"}, {}, "auth.region", "required"),
    ({**AWS, "profile": "x"}, {}, "auth.profile", "unknown key"),
])
def test_check_refuses_what_cannot_work(auth: dict[str, Any], extra: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(server(auth, **extra))
    assert any(e.startswith(f"servers[0].{where}:") and says in e for e in caught.value.errors), caught.value.errors
    assert "EXAMPLEKEY" not in str(caught.value.errors)


def test_check_accepts_each_source_built() -> None:
    static = {**AWS, "source": "static", "access_key_id": "{{secret:AWS_KEY_ID}}",
              "secret_access_key": "{{secret:AWS_SECRET}}", "session_token": "{{secret:AWS_TOKEN}}"}
    web = {**AWS, "source": "web_identity", "role_arn": "arn:aws:iam::123456789012:role/mcp",
           "web_identity_token_file": "/var/run/secrets/token"}
    for auth, extra in [(AWS, {}), (static, {}), ({**AWS, "source": "imds"}, {"allow_private": ["169.254.169.254"]}),
                        (web, {})]:
        config = parse_config(server(auth, **extra))
        target = config.servers["s"]
        assert is_aws(target) and not target.aauth and target.login is None
        assert aws_auth_of(target).source == auth.get("source", "env")


def test_check_names_the_extra_when_botocore_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aws_config, "botocore_installed", lambda: False)
    with pytest.raises(ConfigError) as caught:
        parse_config(server(AWS))
    assert any("mcpcreds[aws]" in e for e in caught.value.errors)


# ------------------------------------------------------------------------------ end to end

STATIC_ID, STATIC_SECRET = "AKIASTATICEXAMPLE001", "static-secret-" + CANARY
ENV_ID, ENV_SECRET = "AKIAENVEXAMPLE000001", "env-secret-" + CANARY
IMDS_ID, IMDS_SECRET, IMDS_TOKEN = "ASIAIMDSEXAMPLE00001", "imds-secret-" + CANARY, "imds-session-" + CANARY
WEB_ID, WEB_SECRET, WEB_TOKEN = "ASIAWEBEXAMPLE000002", "web-secret-" + CANARY, "web-session-" + CANARY
# the credentials of the instance whose role credentials are replaced early (the 403 retry test)
ROT1 = ("ASIAROTATINGEXAMPLE1", "rot1-secret-" + CANARY, "rot1-session-" + CANARY)
ROT2 = ("ASIAROTATINGEXAMPLE2", "rot2-secret-" + CANARY, "rot2-session-" + CANARY)
SECRETS = (STATIC_SECRET, ENV_SECRET, IMDS_SECRET, WEB_SECRET, ROT1[1], ROT2[1])


@pytest.fixture(scope="module")
def peer() -> Iterator[SigV4Peer]:
    keys = {STATIC_ID: (STATIC_SECRET, None), ENV_ID: (ENV_SECRET, None), IMDS_ID: (IMDS_SECRET, IMDS_TOKEN),
            WEB_ID: (WEB_SECRET, WEB_TOKEN), ROT1[0]: ROT1[1:], ROT2[0]: ROT2[1:]}
    with start_sigv4_peer(keys) as server:
        yield server


@pytest.fixture(scope="module")
def imds() -> Iterator[FakeImds]:
    with FakeImds(IMDS_ID, IMDS_SECRET, IMDS_TOKEN, time.time() + 6 * 3600) as fake:
        yield fake


@pytest.fixture(scope="module")
def imds_rotating() -> Iterator[FakeImds]:
    with FakeImds(*ROT1, time.time() + 6 * 3600) as fake:
        yield fake


@pytest.fixture(scope="module")
def sts() -> Iterator[FakeSts]:
    workdir = Path(tempfile.mkdtemp(prefix="mcpcreds-sts-"))
    (workdir / "token").write_text("projected-oidc-token\n")
    try:
        with FakeSts(ROLE, workdir / "token", WEB_ID, WEB_SECRET, WEB_TOKEN, time.time() + 3600) as fake:
            yield fake
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def sidecar(peer: SigV4Peer, imds: FakeImds, sts: FakeSts, imds_rotating: FakeImds) -> Iterator[SidecarProcess]:
    workdir = Path(tempfile.mkdtemp(prefix="mcpcreds-sigv4-"))
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    scope = 'region = "us-east-1", service = "execute-api"'
    # the stand-alone servers' host is spelt `localhost`: under the catalog entry's `127.0.0.1` URL
    # the tag floor would hold them to its key, whose AWS credentials are the entry's
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"
invalidate_cooldown = "1h"

[secrets]
sources = ["env"]

[services.aws-api]
endpoint = "{peer.url}"
auth = {{ kind = "aws", {scope}, source = "static", access_key_id = "{{{{secret:AWS_TEST_KEY_ID}}}}", secret_access_key = "{{{{secret:AWS_TEST_SECRET}}}}" }}

[[servers]]
name = "aws-static"
service = "aws-api"
trust = "trusted"

[[servers]]
name = "aws-env"
endpoint = "{local_url(peer)}"
trust = "trusted"
auth = {{ kind = "aws", {scope}, source = "env" }}

[[servers]]
name = "aws-imds"
endpoint = "{local_url(peer)}"
trust = "trusted"
auth = {{ kind = "aws", {scope}, source = "imds", imds_endpoint = "{imds.url}" }}

[[servers]]
name = "aws-web"
endpoint = "{local_url(peer)}"
trust = "trusted"
auth = {{ kind = "aws", {scope}, source = "web_identity", role_arn = "{ROLE}", web_identity_token_file = "{sts.token_file}", sts_endpoint = "{sts.url}" }}

[[servers]]
name = "aws-rotating"
endpoint = "{local_url(peer)}"
trust = "trusted"
auth = {{ kind = "aws", {scope}, source = "imds", imds_endpoint = "{imds_rotating.url}" }}

[[servers]]
name = "aws-other-region"
endpoint = "{local_url(peer)}"
trust = "trusted"
auth = {{ kind = "aws", region = "eu-west-1", service = "execute-api", source = "env" }}

[[servers]]
name = "plain"
endpoint = "{local_url(peer)}"
trust = "trusted"
""")
    env = {"AWS_TEST_KEY_ID": STATIC_ID, "AWS_TEST_SECRET": STATIC_SECRET,
           "AWS_ACCESS_KEY_ID": ENV_ID, "AWS_SECRET_ACCESS_KEY": ENV_SECRET}
    try:
        with run_sidecar(config, socket, env) as proc:
            yield proc
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def raw_client(sidecar: SidecarProcess, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sidecar.socket)),
                             base_url="http://mcpcreds", headers=headers, timeout=30)


@pytest.mark.parametrize(("name", "key_id"), [("aws-static", STATIC_ID), ("aws-env", ENV_ID),
                                              ("aws-imds", IMDS_ID), ("aws-web", WEB_ID)])
async def test_the_mcp_sdk_reaches_a_sigv4_server_through_the_gateway(
        sidecar: SidecarProcess, peer: SigV4Peer, imds: FakeImds, name: str, key_id: str) -> None:
    before = peer.stats()
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client(name) as http, \
            streamable_http_client(creds.mcp_url(name), http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        assert {t.name for t in (await session.list_tools()).tools} == {"echo", "add"}
        added = await session.call_tool("add", {"a": 2, "b": 3})
        assert added.structured_content == {"result": 5}
    stats = peer.stats()
    assert stats["verified"] - before["verified"] >= 4 and stats["rejected"] == before["rejected"]
    assert set(stats["keys"][len(before["keys"]):]) == {key_id}
    assert {"host", "x-amz-date", "x-amz-content-sha256", "content-type"} <= set(stats["signed_headers"])
    if name in ("aws-imds", "aws-web"):  # temporary credentials: the session token is sent
        assert stats["tokens"] > before["tokens"]
    if name == "aws-imds":
        assert ("PUT", "/latest/api/token", False) in imds.calls
        assert all(carried for method, _, carried in imds.calls if method == "GET")


async def test_the_mcp_sdk_reaches_a_sigv4_server_directly_with_creds_auth(sidecar: SidecarProcess,
                                                                           peer: SigV4Peer) -> None:
    import httpx2

    before = peer.stats()
    async with AsyncClient(sidecar.socket) as creds, httpx2.AsyncClient(auth=creds.auth("aws-imds")) as http, \
            streamable_http_client(local_url(peer), http_client=http) as (read, write), \
            ClientSession(read, write) as session:  # no gateway: the client talks to the server itself
        await session.initialize()
        assert (await session.call_tool("echo", {"text": "sigv4"})).structured_content == {"result": "sigv4"}
    after = peer.stats()
    assert after["verified"] - before["verified"] >= 3 and after["rejected"] == before["rejected"]
    assert set(after["keys"][len(before["keys"]):]) == {IMDS_ID} and after["tokens"] > before["tokens"]
    assert "content-type" in after["signed_headers"]


async def test_a_wrong_scope_and_an_unsigned_server_are_refused_by_the_verifier(
        sidecar: SidecarProcess, peer: SigV4Peer) -> None:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    before = peer.stats()["rejected"]
    async with raw_client(sidecar, Accept="application/json, text/event-stream") as http:
        assert (await http.post("/mcp/aws-other-region", json=init)).status_code == 403
        assert (await http.post("/mcp/plain", json=init)).status_code == 403
    rejected = peer.stats()["rejected"]
    assert rejected.get("wrong_scope", 0) == before.get("wrong_scope", 0) + 1
    assert rejected.get("missing_or_malformed_authorization", 0) == \
        before.get("missing_or_malformed_authorization", 0) + 1


@pytest.mark.parametrize("header", ["user-agent", "mcp-param-region"])
async def test_a_header_value_that_is_not_ascii_is_refused_before_anything_is_signed_or_sent(
        sidecar: SidecarProcess, peer: SigV4Peer, header: str) -> None:
    """The signer signs text: a value of other bytes would be signed as one thing and sent as
    another (the server's refusal would cost a credential refetch); it is refused here."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    before = peer.stats()
    async with raw_client(sidecar, Accept="application/json, text/event-stream") as http:
        refused = await http.post("/mcp/aws-static", json=init, headers={header.encode(): "caf\u00e9".encode()})
        assert peer.stats() == before  # nothing reached the server
        plain = await http.post("/mcp/aws-static", json=init, headers={header.encode(): b"cafe"})
    assert refused.status_code == 400, refused.text
    assert "not ASCII cannot be signed" in refused.text and "caf" not in refused.text
    assert plain.status_code == 200, plain.text  # the same request in ASCII is signed and verified
    assert peer.stats()["verified"] == before["verified"] + 1


def local_url(peer: SigV4Peer) -> str:
    """The peer's MCP URL as the stand-alone servers spell it (another authority than the catalog's)."""
    return peer.url.replace("127.0.0.1", "localhost")


async def test_the_sign_route_signs_a_direct_clients_request(sidecar: SidecarProcess, peer: SigV4Peer) -> None:
    body = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    digest = hashlib.sha256(body.encode()).digest()
    headers = {"content-type": "application/json", "mcp-session-id": "abc"}
    async with raw_client(sidecar) as http:
        static, session = [await http.post(f"/v1/servers/{name}/sign", json={
            "method": "POST", "url": url, "headers": headers,
            "content_digest": f"sha-256=:{base64.b64encode(digest).decode()}:"})
            for name, url in (("aws-static", peer.url), ("aws-imds", local_url(peer)))]
    assert static.status_code == 200 and session.status_code == 200, static.text
    answer = static.json()
    assert set(answer["headers"]) == {"Authorization", "X-Amz-Date", "X-Amz-Content-SHA256"}
    assert answer["signed_headers"] == ["content-type", "host", "mcp-session-id", "x-amz-content-sha256", "x-amz-date"]
    assert f"SignedHeaders={';'.join(answer['signed_headers'])}," in answer["headers"]["Authorization"]
    host = peer.base.removeprefix("http://")
    for signed, signed_host in ((answer, host), (session.json(), host.replace("127.0.0.1", "localhost"))):
        lines = [("host", signed_host), *headers.items(), *signed["headers"].items()]
        assert peer.check("POST", peer.url, lines, body) == {"ok": True}
        # the body or the path changed after signing: refused
        assert peer.check("POST", peer.url, lines, body.replace("list", "call")) == {"error": "content_sha256"}
        assert peer.check("POST", f"{peer.base}/admin", lines, body) == {"error": "signature_mismatch"}
    assert session.json()["headers"]["X-Amz-Security-Token"] == IMDS_TOKEN  # the request must carry it
    assert answer["expires_at"] is None and session.json()["expires_at"] > time.time()


@pytest.mark.parametrize(("server", "ask", "status", "code"), [
    ("aws-static", {"method": "POST", "url": "https://elsewhere.example.com/mcp"}, 400, "invalid_request"),
    ("aws-static", {"method": "POST", "url": "URL", "body": "x"}, 400, "invalid_request"),
    ("aws-static", {"method": "POST", "url": "URL", "content_digest": "UNSIGNED-PAYLOAD"}, 400, "invalid_request"),
    ("aws-static", {"method": "POST", "url": "URL", "content_digest": "sha-512=:" + "A" * 86 + "==:"}, 400,
     "invalid_request"),
    ("aws-static", {"method": "post", "url": "URL"}, 400, "invalid_request"),
    ("aws-static", {"method": "POST", "url": "URL", "headers": {"x": "a\nb"}}, 400, "invalid_request"),
    ("plain", {"method": "POST", "url": "URL"}, 403, "forbidden"),
])
async def test_the_sign_route_refuses(sidecar: SidecarProcess, peer: SigV4Peer, server: str,
                                      ask: dict[str, Any], status: int, code: str) -> None:
    ask = {k: (peer.url if v == "URL" else v) for k, v in ask.items()}
    async with raw_client(sidecar) as http:
        answer = await http.post(f"/v1/servers/{server}/sign", json=ask)
    assert (answer.status_code, answer.json()["error"]["code"]) == (status, code)
    assert "elsewhere" not in answer.text and "UNSIGNED" not in answer.text  # nothing sent is echoed


async def test_the_sign_route_is_grant_aware(sidecar: SidecarProcess, peer: SigV4Peer) -> None:
    ask = {"method": "POST", "url": peer.url}
    async with AsyncClient(sidecar.socket) as creds:
        other = await creds.grant(["aws-env"], ttl=60)
        mine = await creds.grant(["aws-static"], ttl=60)
    async with raw_client(sidecar, Authorization=f"Bearer {other['grant']}") as http:
        refused = await http.post("/v1/servers/aws-static/sign", json=ask)
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    async with raw_client(sidecar, Authorization=f"Bearer {mine['grant']}") as http:
        assert (await http.post("/v1/servers/aws-static/sign", json=ask)).status_code == 200


async def test_static_secrets_are_known_to_status_and_rotation(sidecar: SidecarProcess) -> None:
    async with raw_client(sidecar) as http:
        status = (await http.get("/v1/status")).json()
        assert status["secrets"]["AWS_TEST_SECRET"] == ["service:aws-api"]
        assert status["secrets"]["AWS_TEST_KEY_ID"] == ["service:aws-api"]
        rotated = await http.post("/v1/secrets/AWS_TEST_SECRET/rotated")
    assert (rotated.status_code, rotated.json()["renewed"]) == (200, ["service:aws-api"])


async def test_status_shows_the_credentials_held_never_their_values(sidecar: SidecarProcess, peer: SigV4Peer,
                                                                     imds: FakeImds) -> None:
    async with raw_client(sidecar) as http:
        assert (await http.post("/v1/servers/aws-imds/sign", json={"method": "GET", "url": local_url(peer)})
                ).status_code == 200
        rows = {row["key"]: row for row in (await http.get("/v1/status")).json()["aws"]}
    row = rows["mcp:aws-imds"]
    assert (row["source"], row["temporary"]) == ("imds", True)
    expires = calendar.timegm(time.strptime(imds.creds["Expiration"], "%Y-%m-%dT%H:%M:%SZ"))
    assert row["expires_at"] == expires and row["renew_at"] == pytest.approx(expires - 300, abs=1)
    assert set(row) == {"key", "source", "temporary", "expires_at", "renew_at"}


async def test_the_secret_keys_appear_in_no_output(sidecar: SidecarProcess, peer: SigV4Peer) -> None:
    seen: list[str] = []
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    async with raw_client(sidecar, Accept="application/json, text/event-stream") as http:
        for path in ("/v1/status", "/v1/servers", "/metrics", "/v1/servers/aws-static/headers",
                     "/v1/servers/aws-imds/headers"):
            seen.append((await http.get(path)).text)
        for name in ("aws-static", "aws-env", "aws-imds", "aws-web", "aws-other-region"):
            answer = await http.post(f"/mcp/{name}", json=init)
            seen.append(answer.text + json.dumps(dict(answer.headers)))
            url = peer.url if name == "aws-static" else local_url(peer)
            seen.append((await http.post(f"/v1/servers/{name}/sign", json={"method": "POST", "url": url})).text)
            seen.append((await http.post(f"/v1/servers/{name}/sign", json={"method": "POST", "url": "x"})).text)
    payload = run_cli("spawn-payload", "aws-static", "aws-env", "aws-imds", "--socket", str(sidecar.socket),
                      "--config", str(sidecar.config))
    assert payload.code == 0, payload.output
    seen += [payload.stdout, payload.stderr, run_cli("status", "--json", "--socket", str(sidecar.socket),
                                                     "--config", str(sidecar.config)).stdout]
    seen += [(sidecar.config.parent / "audit.jsonl").read_text(), sidecar.log]
    text = "\n".join(seen)
    assert STATIC_ID in text or "AWS_TEST_KEY_ID" in text  # the scan reaches where the servers show
    for secret in SECRETS:
        assert secret not in text and secret[:20] not in text


@pytest.mark.parametrize(("status", "headers", "body", "code"), [
    (403, {"x-amzn-errortype": "ExpiredTokenException:http://internal.amazon.com/coral/com.amazon.coral.service/"},
     b'{"message":"The security token included in the request is expired"}', "ExpiredTokenException"),
    (403, {}, b'{"message":"The security token included in the request is expired"}', "ExpiredTokenException"),
    (403, {}, b'{"message":"The security token included in the request is invalid."}', "UnrecognizedClientException"),
    (403, {}, b'{"message":"The request signature we calculated does not match the signature you provided."}',
     "InvalidSignatureException"),
    (400, {}, b'{"__type":"com.amazon.coral.service#ExpiredTokenException","message":"expired"}',
     "ExpiredTokenException"),
    (400, {}, b"<?xml version='1.0'?><Error><Code>ExpiredToken</Code><Message>x</Message></Error>", "ExpiredToken"),
    (403, {}, b"<ErrorResponse><Error><Type>Sender</Type><Code>SignatureDoesNotMatch</Code></Error></ErrorResponse>",
     "SignatureDoesNotMatch"),
    (403, {}, b'{"Error":{"Code":"InvalidClientTokenId"}}', "InvalidClientTokenId"),
    (403, {"x-amzn-errortype": "AccessDeniedException"}, b'{"message":"User is not authorized"}', None),
    (403, {}, b'{"message":"Forbidden"}', None),
    (400, {}, b'{"__type":"ThrottlingException"}', None),
    (401, {"x-amzn-errortype": "ExpiredTokenException"}, b"", None),
    (500, {}, b"<Error><Code>ExpiredToken</Code></Error>", None),
    (403, {}, b'{"message":"The security token included in the request is expired"' + b" " * 20_000 + b"}", None),
    (403, {}, b"not json", None),
])
def test_the_refusals_that_mean_stale_credentials(status: int, headers: dict[str, str], body: bytes,
                                                   code: str | None) -> None:
    assert stale_credentials_code(status, httpx.Headers(headers), body) == code


async def test_an_aws_refusal_of_stale_credentials_fetches_them_again_and_retries_once(
        sidecar: SidecarProcess, peer: SigV4Peer, imds_rotating: FakeImds) -> None:
    """The instance's role credentials are replaced before the held ones' expiry (the server says
    ExpiredToken): the gateway fetches them again and retries, once. Refused again within the
    cooldown (`invalidate_cooldown`, an hour here), the caller gets the server's answer and
    nothing is fetched: 20 more refused requests cost IMDS nothing."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    creds_gets = sum(1 for _, path, _ in imds_rotating.calls if path.endswith("/mcp-role"))
    async with raw_client(sidecar, Accept="application/json, text/event-stream") as http:
        assert (await http.post("/mcp/aws-rotating", json=init)).status_code == 200
        assert peer.stats()["keys"][-1] == ROT1[0]
        peer.expire(ROT1[0])  # the server no longer takes the first credentials ...
        imds_rotating.creds.update(AccessKeyId=ROT2[0], SecretAccessKey=ROT2[1], Token=ROT2[2])  # ... IMDS has new ones
        before = peer.stats()["rejected"].get("expired_token", 0)
        assert (await http.post("/mcp/aws-rotating", json=init)).status_code == 200
        after = peer.stats()
        assert after["rejected"].get("expired_token", 0) == before + 1 and after["keys"][-1] == ROT2[0]
        assert sum(1 for _, path, _ in imds_rotating.calls if path.endswith("/mcp-role")) == creds_gets + 2
        peer.expire(ROT2[0])  # refused whatever the credentials: within the cooldown, no retry, no fetch
        for _ in range(20):
            refused = await http.post("/mcp/aws-rotating", json=init)
            # the AWS error is no JSON-RPC: withheld, the status kept, the gateway's error in its place
            assert refused.status_code == 403 and "HTTP 403" in refused.text and "withheld" in refused.text
    assert peer.stats()["rejected"]["expired_token"] == before + 1 + 20
    assert sum(1 for _, path, _ in imds_rotating.calls if path.endswith("/mcp-role")) == creds_gets + 2
