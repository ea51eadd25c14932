"""AWS IAM Identity Center (issue 16, `auth = { kind = "aws", source = "sso" }`): what `aws sso
login` does, with the SSO tokens in the keyring.

A fake of the SSO OIDC service and the portal (RegisterClient, StartDeviceAuthorization,
CreateToken with the device code and with a rotating refresh token, GetRoleCredentials), written
from AWS's API reference; the real sidecar, gnome-keyring and the SigV4 verifier peer:

- no login: the gateway answers login_required naming the command;
- `mcpcreds login NAME`: the verification URI and user code printed, the poll pending until the
  person approves, the tokens stored in the keyring; the MCP SDK then reaches the SigV4 server
  through the gateway with the role credentials;
- the SSO access token renewed ahead of its expiry from the refresh token, the rotated one stored
  first; a refused refresh token or SSO token is login_required;
- `check`: the SSO settings required and validated;
- no SSO token, client secret or AWS secret key in any output (canary scan).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import keyring
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient
from mcpcreds.config.aws import AwsAuth
from mcpcreds.config.load import parse_config
from mcpcreds.config.model import SecretsConfig
from mcpcreds.credentials.sources import KeyringSource
from mcpcreds.errors import ConfigError, LoginRequired
from mcpcreds.signers.aws_sso import SsoLogin, from_sso
from tests.conftest import CANARY, KeyringSession
from tests.peers.sigv4_peer import SigV4Peer, start_sigv4_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar

ROLE_ID, ROLE_SECRET, ROLE_TOKEN = "ASIASSOEXAMPLE000001", "sso-role-secret-" + CANARY, "sso-role-session-" + CANARY
CLIENT_SECRET = "sso-client-secret-" + CANARY
ACCOUNT, ROLE = "123456789012", "McpTools"


class FakeSso:
    """The SSO OIDC service and the portal on one loopback server."""

    def __init__(self) -> None:
        self.approved = False
        self.pending = threading.Event()  # a poll was answered authorization_pending
        self.serial = 0
        self.access: str | None = None
        self.refresh: str | None = None
        self.ttl = 3600
        self.calls: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                fake.calls.append(f"POST {self.path} {body.get('grantType', '')}".strip())
                if self.path == "/logout":  # the portal's Logout: the SSO token is over
                    signed_out = self.headers.get("x-amz-sso_bearer_token") == fake.access
                    fake.access = fake.refresh = None if signed_out else fake.access
                    self._reply(200 if signed_out else 401, {})
                elif self.path == "/client/register":
                    assert body == {"clientName": "mcpcreds-aws-sso", "clientType": "public",
                                    "scopes": ["sso:account:access"]}
                    self._reply(200, {"clientId": "sso-client-1", "clientSecret": CLIENT_SECRET,
                                      "clientIdIssuedAt": int(time.time()),
                                      "clientSecretExpiresAt": int(time.time()) + 90 * 86400})
                elif self.path == "/device_authorization":
                    assert body["clientSecret"] == CLIENT_SECRET
                    assert body["startUrl"] == "https://example.awsapps.com/start"
                    self._reply(200, {"deviceCode": "device-code-" + CANARY, "userCode": "WXYZ-ABCD",
                                      "verificationUri": f"{fake.url}/device",
                                      "verificationUriComplete": f"{fake.url}/device?user_code=WXYZ-ABCD",
                                      "expiresIn": 600, "interval": 1})
                elif self.path == "/token" and body.get("grantType") == "urn:ietf:params:oauth:grant-type:device_code":
                    if body.get("deviceCode") != "device-code-" + CANARY or body.get("clientSecret") != CLIENT_SECRET:
                        self._reply(400, {"error": "invalid_grant"})
                    elif not fake.approved:
                        fake.pending.set()
                        self._reply(400, {"error": "authorization_pending"})
                    else:
                        self._reply(200, fake.issue())
                elif self.path == "/token" and body.get("grantType") == "refresh_token":
                    if body.get("refreshToken") != fake.refresh or fake.refresh is None:
                        self._reply(400, {"error": "invalid_grant"})
                    else:
                        self._reply(200, fake.issue())
                else:
                    self._reply(404, {"error": "not_found"})

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                fake.calls.append(f"GET {parts.path}")
                if parts.path == "/device":  # the person approves in the browser
                    fake.approved = parse_qs(parts.query).get("user_code") == ["WXYZ-ABCD"]
                    self._reply(200, {"approved": fake.approved})
                elif parts.path == "/federation/credentials":
                    query = parse_qs(parts.query)
                    if self.headers.get("x-amz-sso_bearer_token") != fake.access or fake.access is None:
                        self._reply(401, {"message": "Session token not found or invalid"})
                    elif query != {"role_name": [ROLE], "account_id": [ACCOUNT]}:
                        self._reply(403, {"message": "No access"})
                    else:
                        self._reply(200, {"roleCredentials": {
                            "accessKeyId": ROLE_ID, "secretAccessKey": ROLE_SECRET, "sessionToken": ROLE_TOKEN,
                            "expiration": int((time.time() + 3600) * 1000)}})
                else:
                    self._reply(404, {"error": "not_found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def issue(self) -> dict[str, Any]:
        self.serial += 1
        self.access = f"sso-access-{self.serial}-{CANARY}"
        self.refresh = f"sso-refresh-{self.serial}-{CANARY}"
        return {"accessToken": self.access, "tokenType": "Bearer", "expiresIn": self.ttl, "refreshToken": self.refresh}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sso_auth(fake: FakeSso, **extra: Any) -> dict[str, Any]:
    return {"kind": "aws", "region": "us-east-1", "service": "execute-api", "source": "sso",
            "sso_start_url": "https://example.awsapps.com/start", "sso_region": "us-east-1",
            "sso_account_id": ACCOUNT, "sso_role_name": ROLE, "sso_oidc_endpoint": fake.url,
            "sso_portal_endpoint": fake.url, **extra}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeSso]:
    sso = FakeSso()
    try:
        yield sso
    finally:
        sso.close()


# -- check

@pytest.mark.parametrize(("drop", "change", "says"), [
    ("sso_start_url", {}, "auth.sso_start_url: required: a URL"),
    ("sso_account_id", {}, "auth.sso_account_id: required: the 12-digit AWS account id"),
    (None, {"sso_account_id": "12345"}, "auth.sso_account_id: required"),
    ("sso_role_name", {}, "auth.sso_role_name: required"),
    ("sso_region", {}, "auth.sso_region: required"),
    (None, {"sso_oidc_endpoint": "http://sso.example.com"}, "auth.sso_oidc_endpoint: http:// is only allowed"),
    (None, {"source": "env"}, "auth.sso_start_url: only with source = \"sso\""),
])
def test_check_requires_and_validates_the_sso_settings(fake: FakeSso, drop: str | None, change: dict[str, Any],
                                                      says: str) -> None:
    auth = {k: v for k, v in sso_auth(fake, **change).items() if k != drop}
    with pytest.raises(ConfigError) as caught:
        parse_config({"servers": [{"name": "s", "endpoint": "https://mcp.example.com/mcp", "auth": auth}]})
    assert f"servers[0].{says}" in str(caught.value)


def test_check_accepts_sso() -> None:
    auth = {"kind": "aws", "region": "us-east-1", "service": "execute-api", "source": "sso",
            "sso_start_url": "https://example.awsapps.com/start", "sso_region": "eu-west-1",
            "sso_account_id": ACCOUNT, "sso_role_name": ROLE}
    parsed = parse_config({"servers": [{"name": "s", "endpoint": "https://mcp.example.com/mcp", "auth": auth,
                                        "tool_allowlist": ["search"]}]})
    assert parsed.warnings == ()


# -- the renewal (in process, a private keyring backend)

def plaintext_keyring() -> KeyringSource:
    from tests.hanging_keyring import PlaintextKeyring

    PlaintextKeyring.store.clear()
    return KeyringSource(SecretsConfig(keyring_backend="tests.hanging_keyring.PlaintextKeyring",
                                       allow_plaintext_keyring=True, keyring_service="sso-unit"))


def auth_of(fake: FakeSso) -> AwsAuth:
    raw = sso_auth(fake)
    return AwsAuth("us-east-1", "execute-api", "sso", sso_start_url=raw["sso_start_url"], sso_region="us-east-1",
                   sso_account_id=ACCOUNT, sso_role_name=ROLE, sso_oidc_endpoint=fake.url,
                   sso_portal_endpoint=fake.url)


async def test_the_sso_token_is_renewed_ahead_from_the_refresh_token_stored_first(fake: FakeSso) -> None:
    ring = plaintext_keyring()
    issued = fake.issue()
    now = time.time()
    ring.set("login.mcp.aws-sso", SsoLogin("sso-client-1", CLIENT_SECRET, now + 86400, issued["accessToken"],
                                           now + 3600, issued["refreshToken"]).to_json())
    async with httpx.AsyncClient() as http:
        creds = await from_sso(auth_of(fake), "aws-sso", "mcp:aws-sso", http, ring, lambda: now)
        assert (creds.access_key_id, creds.session_token) == (ROLE_ID, ROLE_TOKEN)
        assert fake.calls[-1] == "GET /federation/credentials"  # no renewal: the token has an hour left
        # 4 minutes before the SSO token expires (less than 5 left): renewed, the rotated refresh token kept
        creds = await from_sso(auth_of(fake), "aws-sso", "mcp:aws-sso", http, ring, lambda: now + 3360)
        assert fake.calls[-2:] == ["POST /token refresh_token", "GET /federation/credentials"]
        stored = SsoLogin.from_json(ring.get("login.mcp.aws-sso") or "")
        assert stored is not None and (stored.access_token, stored.refresh_token) == (fake.access, fake.refresh)
        assert creds.access_key_id == ROLE_ID
        # the refresh token refused (the session ended at the IdP): login_required, naming the command
        fake.refresh = "revoked"
        with pytest.raises(LoginRequired) as info:
            await from_sso(auth_of(fake), "aws-sso", "mcp:aws-sso", http, ring, lambda: now + 2 * 3600 + 3400)
        assert info.value.status == 401 and "`mcpcreds login aws-sso`" in info.value.message
        assert CANARY not in info.value.message
        # a refused SSO token (signed out): login_required too
        fake.access = "another"
        with pytest.raises(LoginRequired):
            await from_sso(auth_of(fake), "aws-sso", "mcp:aws-sso", http, ring, lambda: now + 3360)


# -- end to end

@pytest.fixture(scope="module")
def peer() -> Iterator[SigV4Peer]:
    with start_sigv4_peer({ROLE_ID: (ROLE_SECRET, ROLE_TOKEN)}) as server:
        yield server


@pytest.fixture
def sidecar(fake: FakeSso, peer: SigV4Peer, tmp_path: Path, keyring_session: KeyringSession
            ) -> Iterator[SidecarProcess]:
    socket = tmp_path / "run" / "s.sock"
    config = tmp_path / "config.toml"
    auth = ", ".join(f'{k} = "{v}"' for k, v in sso_auth(fake).items())
    config.write_text(f"""
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env", "keyring"]
keyring_service = "mcpcreds-sso-{uuid.uuid4().hex[:8]}"
keyring_timeout = "30s"  # a bound only a hung keyring crosses, not a busy machine

[[servers]]
name = "aws-sso"
endpoint = "{peer.url}"
trust = "trusted"
allow_private = ["127.0.0.1"]
auth = {{ {auth} }}
""")
    with run_sidecar(config, socket) as proc:
        yield proc


def login(config: Path, fake: FakeSso) -> str:
    proc = subprocess.Popen([sys.executable, "-m", "mcpcreds.cli.main", "login", "aws-sso", "--config", str(config)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "(or open " in line:
            assert fake.pending.wait(30)  # the person approves while the login polls
            httpx.get(line.split("(or open ", 1)[1].strip().rstrip(")")).raise_for_status()  # the person approves
            break
    out, err = proc.communicate(timeout=60)
    output = "".join(lines) + err + out
    assert proc.returncode == 0, output
    return output


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


async def test_sso_login_then_the_mcp_sdk_reaches_the_sigv4_server_through_the_gateway(
        fake: FakeSso, peer: SigV4Peer, sidecar: SidecarProcess) -> None:
    fake.approved = False
    fake.access = fake.refresh = None
    raw = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sidecar.socket)), base_url="http://x",
                            headers={"Accept": "application/json, text/event-stream"}, timeout=30)
    async with raw:
        refused = await raw.post("/mcp/aws-sso", json=INIT)
    assert refused.status_code == 401 and "mcpcreds login aws-sso" in refused.text  # nobody logged in yet
    fake.pending.clear()
    output = login(sidecar.config, fake)
    assert "open " in output and "WXYZ-ABCD" in output and "logged in: aws-sso" in output
    assert fake.calls.count("POST /token urn:ietf:params:oauth:grant-type:device_code") >= 2  # pending, then approved
    service = sidecar.config.read_text().split('keyring_service = "')[1].split('"')[0]
    entry = json.loads(keyring.get_password(service, "login.mcp.aws-sso") or "{}")
    assert (entry["kind"], entry["access_token"], entry["refresh_token"]) == ("aws-sso", fake.access, fake.refresh)
    before = peer.stats()
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client("aws-sso") as http, \
            streamable_http_client(creds.mcp_url("aws-sso"), http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        assert (await session.call_tool("add", {"a": 2, "b": 3})).structured_content == {"result": 5}
        status = json.dumps(await creds.status())
    after = peer.stats()
    rows = {row["key"]: row for row in json.loads(status)["aws"]}
    assert (rows["mcp:aws-sso"]["source"], rows["mcp:aws-sso"]["temporary"]) == ("sso", True)
    assert after["verified"] > before["verified"] and set(after["keys"][len(before["keys"]):]) == {ROLE_ID}
    assert after["tokens"] > before["tokens"]
    for text in (output, sidecar.log, status, refused.text):
        assert CANARY not in text

    # logout: signed out at the portal, the keyring entry deleted, the sidecar's role credentials dropped
    result = subprocess.run([sys.executable, "-m", "mcpcreds.cli.main", "logout", "aws-sso", "--config",
                             str(sidecar.config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "POST /logout" in fake.calls and fake.access is None
    assert keyring.get_password(service, "login.mcp.aws-sso") is None
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sidecar.socket)), base_url="http://x",
                                 headers={"Accept": "application/json, text/event-stream"}, timeout=30) as raw:
        again = await raw.post("/mcp/aws-sso", json=INIT)
    assert again.status_code == 401 and "mcpcreds login aws-sso" in again.text
    assert CANARY not in result.stderr + again.text
