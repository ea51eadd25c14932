"""Compressed answers to the signers' own fetches (issue 28, finding 5): the AAuth resource
metadata, the AAuth Agent Provider's metadata, JWKS and agent token answers, IMDS, STS
AssumeRoleWithWebIdentity and the AWS SSO services ask for `Accept-Encoding: identity` and refuse
any other `Content-Encoding`, never decoding it.

The upstream is a hostile HTTP server on loopback answering every request with a decompression
bomb (`Content-Encoding: gzip, gzip`: under a KiB on the wire, 64 MiB decoded) or with a small,
otherwise valid, gzip-compressed answer; paths in `plain` are answered uncompressed, so that each
of the provider's three fetches in turn meets the bomb. What the fetch allocated is measured (tracemalloc's
peak), not the time it took.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from mcpcreds.config.aws import AwsAuth
from mcpcreds.config.load import parse_config
from mcpcreds.errors import TokenEndpointError
from mcpcreds.net.egress import EgressPolicy
from mcpcreds.net.egress_http import egress_client
from mcpcreds.signers.aauth import AAuthSigner, AgentTokenError
from mcpcreds.signers.aauth_resource import ResourceMetadata
from mcpcreds.signers.aws_credentials import AwsCredentialsError, from_imds, from_web_identity
from mcpcreds.signers.aws_sso import SsoLogin, renew, role_credentials
from tests.conftest import CANARY

DECODED = 64 * 1024 * 1024
BOMB = gzip.compress(gzip.compress(bytes(DECODED), 9), 9)
PEAK_LIMIT = 32 * 1024 * 1024  # what a refused answer may cost (imports included); decoding costs > DECODED
ROLE = "arn:aws:iam::123456789012:role/mcp-agent"


class Hostile:
    """Answers every request 200 with `body` under `encoding`, but a path in `plain` with its JSON
    uncompressed; keeps each request's Accept-Encoding."""

    def __init__(self) -> None:
        self.body, self.encoding = BOMB, "gzip, gzip"
        self.plain: dict[str, bytes] = {}
        self.asked: list[str | None] = []
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hostile.asked.append(self.headers.get("Accept-Encoding"))
                plain = hostile.plain.get(self.path)
                body = hostile.body if plain is None else plain
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", hostile.encoding if plain is None else "identity")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    server = Hostile()
    try:
        yield server
    finally:
        server.close()


def sso_auth(url: str) -> AwsAuth:
    return AwsAuth("us-east-1", "execute-api", "sso", sso_start_url="https://example.awsapps.com/start",
                   sso_region="us-east-1", sso_account_id="123456789012", sso_role_name="McpTools",
                   sso_oidc_endpoint=url, sso_portal_endpoint=url)


async def fetch_each(hostile: Hostile, tmp_path: Path) -> dict[str, str]:
    """Every signer fetch against the hostile server: what each one said."""
    said: dict[str, str] = {}
    token_file = tmp_path / "token"
    token_file.write_text("oidc-token\n")
    stored = SsoLogin("client", "client-secret-" + CANARY, time.time() + 86400, "access-" + CANARY,
                      time.time() + 60, "refresh-" + CANARY)
    async with egress_client(EgressPolicy(dev_loopback=True)) as http:
        calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("imds", lambda: from_imds(AwsAuth("us-east-1", "execute-api", "imds", imds_endpoint=hostile.url), http)),
            ("sts", lambda: from_web_identity(AwsAuth(
                "us-east-1", "execute-api", "web_identity", role_arn=ROLE, web_identity_token_file=str(token_file),
                sts_endpoint=hostile.url + "/"), http)),
            ("sso portal", lambda: role_credentials(http, sso_auth(hostile.url), "aws-sso", "access-" + CANARY)),
            ("sso oidc", lambda: renew(http, sso_auth(hostile.url), "aws-sso", stored, time.time())),
        ]
        for name, call in calls:
            with pytest.raises((AwsCredentialsError, TokenEndpointError)) as caught:
                await call()
            said[name] = caught.value.message
    return said


def aauth_target(url: str) -> Any:
    config = parse_config({"aauth": {"default": True},
                           "servers": [{"name": "res", "endpoint": f"{url}/mcp"}]})
    return config.servers["res"]


async def aauth_fetch(hostile: Hostile, caplog: pytest.LogCaptureFixture) -> tuple[tuple[str, ...], str]:
    """The components the hostile resource's metadata gave, and why it was not read."""
    async with egress_client(EgressPolicy(dev_loopback=True)) as http:
        held = ResourceMetadata(lambda: 1000.0, lambda _target: http, timeout=30)
        with caplog.at_level(logging.WARNING, logger="mcpcreds.aauth"):
            components = await held.components(aauth_target(hostile.url))
    reasons = [getattr(r, "reason", "") for r in caplog.records if "metadata could not be read" in r.getMessage()]
    return components, reasons[-1] if reasons else ""


async def provider_fetches(hostile: Hostile, tmp_path: Path) -> dict[str, str]:
    """Enrollment with the hostile Agent Provider, once with each of its three answers the first
    compressed one: what each attempt said."""
    config = parse_config({"sidecar": {"socket": str(tmp_path / "s.sock")},
                           "aauth": {"provider": hostile.url, "key_file": str(tmp_path / "agent.key"),
                                     "enroll": "open"}})
    steps = {"provider metadata": {},
             "provider JWKS": {"/.well-known/aauth-agent.json": json.dumps({
                 "issuer": hostile.url, "jwks_uri": hostile.url + "/jwks",
                 "registration_endpoint": hostile.url + "/register"}).encode()},
             "agent token request": {"/jwks": b'{"keys":[]}'}}
    said: dict[str, str] = {}
    for what, plain in steps.items():
        hostile.plain.update(plain)
        signer = AAuthSigner(config, time.time)
        try:
            with pytest.raises(AgentTokenError) as caught:
                await signer.agent_token()
        finally:
            await signer.aclose()
        said[what] = caught.value.message
        assert what in said[what], said
    hostile.plain.clear()
    return said


async def test_a_decompression_bomb_is_refused_undecoded_by_every_signer_fetch(
        hostile: Hostile, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert len(BOMB) < 1024
    tracemalloc.start()
    try:
        said = await fetch_each(hostile, tmp_path)
        said |= await provider_fetches(hostile, tmp_path)
        components, reason = await aauth_fetch(hostile, caplog)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for name, message in said.items():
        assert "compressed" in message, (name, message)
        assert CANARY not in message
    assert components == () and reason == "compressed"
    assert hostile.asked and set(hostile.asked) == {"identity"}  # and each asked for none
    assert peak < PEAK_LIMIT, f"{peak} bytes allocated: the bomb was decoded"


async def test_a_small_valid_compressed_answer_is_refused_too(hostile: Hostile, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    hostile.encoding = "gzip"
    hostile.body = gzip.compress(json.dumps({"additional_signature_components": ["content-digest"]}).encode())
    components, reason = await aauth_fetch(hostile, caplog)
    assert components == () and reason == "compressed"  # read, it would have asked for content-digest
    hostile.body = gzip.compress(b"imds-session-token")  # a token PUT answer
    said = await fetch_each(hostile, tmp_path)
    hostile.body = gzip.compress(b'{"keys":[]}')  # a JSON object each provider fetch would have taken
    said |= await provider_fetches(hostile, tmp_path)
    assert all("compressed" in message for message in said.values()), said


@pytest.mark.parametrize("encoding", ["identity", "IDENTITY"])
async def test_an_identity_answer_is_read(hostile: Hostile, caplog: pytest.LogCaptureFixture, encoding: str) -> None:
    hostile.encoding = encoding
    hostile.body = json.dumps({"additional_signature_components": ["content-digest"]}).encode()
    components, reason = await aauth_fetch(hostile, caplog)
    assert components == ("content-digest",) and reason == ""
