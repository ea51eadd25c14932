"""AAuth (issue 15): requests signed with an agent key that never leaves the sidecar.

- The signer (`httpsig`) against RFC 9421's Ed25519 test vector (B.2.6) and RFC 9530's digest
  example, exactly, and against an independent verifier (tests/peers/aauth_verify.py: the
  `http-message-signatures` package builds the signature base, `http-sf` parses Signature-Key).
- The key file: created 0600, durable, refused when group-readable (a unit and `serve` itself).
- End to end: the real sidecar, the MCP SDK 2.x client through the gateway to a real MCP server
  that admits only verified signatures (tests/peers/aauth_peer.py); `aauth = false` sends none;
  the 401 challenge of a resource that wants a token is passed on; the `sign` route for direct
  clients, peer-checked and grant-aware; the private key in no output (canary scan).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from http_message_signatures.digests import ContentDigest
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, OKPKey
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient
from mcpcreds.config.load import parse_config
from mcpcreds.errors import ConfigError
from mcpcreds.signers import httpsig
from mcpcreds.signers.aauth import AAuthSigner, AgentTokenError, check_agent_token, load_key, load_or_create
from tests.conftest import CANARY, module_peer, run_cli
from tests.peers.aauth_peer import AAuthPeer, start_aauth_peer
from tests.peers.aauth_verify import Rejected, verify
from tests.peers.oidc_peer import OidcPeer
from tests.sidecar_proc import SidecarProcess, run_sidecar

# RFC 9421 B.1.4: the test key test-key-ed25519
RFC_KEY = b"""-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF
-----END PRIVATE KEY-----
"""
RFC_X = "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}}
RPC = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def rfc_key() -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(RFC_KEY, None)
    assert isinstance(key, Ed25519PrivateKey)
    return key


# ------------------------------------------------------------------------------ the signer, pure


def test_rfc9421_b26_ed25519_vector_exactly() -> None:
    components = [("date", "Tue, 20 Apr 2021 02:07:55 GMT"), ("@method", "POST"), ("@path", "/foo"),
                  ("@authority", "example.com"), ("content-type", "application/json"),
                  ("content-length", "18")]
    params = httpsig.signature_params([n for n, _ in components], 1618884473, keyid="test-key-ed25519")
    base = httpsig.signature_base(components, params)
    assert base == (b'"date": Tue, 20 Apr 2021 02:07:55 GMT\n"@method": POST\n"@path": /foo\n'
                    b'"@authority": example.com\n"content-type": application/json\n"content-length": 18\n'
                    b'"@signature-params": ("date" "@method" "@path" "@authority" "content-type" '
                    b'"content-length");created=1618884473;keyid="test-key-ed25519"')
    assert httpsig.sf_bytes(rfc_key().sign(base)) == (
        ":wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw==:")


def test_rfc9530_content_digest_and_the_hwk_key_of_the_rfc_test_key() -> None:
    assert httpsig.content_digest(b'{"hello": "world"}') == "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"
    for body in (b"0", b"", b'{"jsonrpc":"2.0","id":1}'):  # b"0": a digest with "+" and "/" in it
        assert httpsig.content_digest(body) == ContentDigest.create(body)  # the verifier's library
    jwk = httpsig.public_jwk(rfc_key())
    assert jwk == {"kty": "OKP", "crv": "Ed25519", "x": RFC_X, "alg": "Ed25519"}
    assert httpsig.hwk_key(jwk) == f'sig=hwk;kty="OKP";crv="Ed25519";x="{RFC_X}";alg="Ed25519"'
    assert httpsig.jwk_thumbprint(jwk) == OKPKey.import_key({k: jwk[k] for k in ("kty", "crv", "x")}).thumbprint()


def signed_request(body: bytes | None = b'{"jsonrpc":"2.0"}', created: int = 1_800_000_000,
                   url: str = "https://mcp.example.com:8443/v1/mcp?tenant=a") -> tuple[list[tuple[str, str]], Any]:
    key = rfc_key()
    headers = [("Content-Type", "application/json"), ("Authorization", "AAuth access-token-1")]
    signed = httpsig.sign_request(key, "POST", url, headers, body, created, httpsig.hwk_key(httpsig.public_jwk(key)))
    return [("Host", "mcp.example.com:8443"), *headers, *signed.headers().items()], signed


def test_a_signed_request_is_exactly_the_aauth_profile_and_verifies_independently() -> None:
    lines, signed = signed_request()
    assert signed.signature_input == (
        'sig=("@method" "@authority" "@path" "@query" "signature-key" "authorization" "content-digest")'
        ";created=1800000000")
    assert signed.content_digest == httpsig.content_digest(b'{"jsonrpc":"2.0"}')
    verified = verify("POST", "https://mcp.example.com:8443/v1/mcp?tenant=a", lines, b'{"jsonrpc":"2.0"}',
                      now=1_800_000_030)
    assert verified.jwk["x"] == RFC_X and verified.scheme == "hwk"
    no_body, bare = signed_request(body=None)
    assert "content-digest" not in bare.covered and not any(n == "Content-Digest" for n, _ in no_body)


@pytest.mark.parametrize(("method", "url", "body", "now", "error"), [
    ("GET", "https://mcp.example.com:8443/v1/mcp?tenant=a", b'{"jsonrpc":"2.0"}', 1_800_000_000, "invalid_signature"),
    ("POST", "https://mcp.example.com:8443/v1/other?tenant=a", b'{"jsonrpc":"2.0"}', 1_800_000_000, "invalid_signature"),
    ("POST", "https://mcp.example.com:8443/v1/mcp?tenant=b", b'{"jsonrpc":"2.0"}', 1_800_000_000, "invalid_signature"),
    ("POST", "https://evil.example.com:8443/v1/mcp?tenant=a", b'{"jsonrpc":"2.0"}', 1_800_000_000, "invalid_signature"),
    ("POST", "https://mcp.example.com:8443/v1/mcp?tenant=a", b'{"jsonrpc":"2.1"}', 1_800_000_000, "invalid_signature"),
    ("POST", "https://mcp.example.com:8443/v1/mcp?tenant=a", b'{"jsonrpc":"2.0"}', 1_800_000_061, "invalid_signature"),
    ("POST", "https://mcp.example.com:8443/v1/mcp?tenant=a", b'{"jsonrpc":"2.0"}', 1_799_999_939, "invalid_signature"),
], ids=["method", "path", "query", "authority", "body", "created-too-old", "created-in-future"])
def test_tampering_fails_verification(method: str, url: str, body: bytes, now: int, error: str) -> None:
    lines, _ = signed_request()
    with pytest.raises(Rejected) as info:
        verify(method, url, lines, body, now=now)
    assert info.value.error == error


def test_a_swapped_key_or_authorization_fails_verification() -> None:
    lines, _ = signed_request()
    other = httpsig.hwk_key(httpsig.public_jwk(Ed25519PrivateKey.generate()))
    swapped = [(n, other if n == "Signature-Key" else v) for n, v in lines]
    with pytest.raises(Rejected):
        verify("POST", "https://mcp.example.com:8443/v1/mcp?tenant=a", swapped, b'{"jsonrpc":"2.0"}', 1_800_000_000)
    token = [(n, "AAuth access-token-2" if n == "Authorization" else v) for n, v in lines]
    with pytest.raises(Rejected):
        verify("POST", "https://mcp.example.com:8443/v1/mcp?tenant=a", token, b'{"jsonrpc":"2.0"}', 1_800_000_000)


def test_what_cannot_be_signed_is_refused_without_quoting_it() -> None:
    key = rfc_key()
    with pytest.raises(httpsig.SignatureError) as info:
        httpsig.sign_request(key, "POST", "https://a.example/", [("X-Note", "line\r\nbreak-secret")], None, 1,
                             httpsig.hwk_key(httpsig.public_jwk(key)), cover=["x-note"])
    assert "secret" not in str(info.value)
    for bad in ("sha-256=:short:", "md5=:AAAA:", "sha-256=:" + "A" * 40 + ":"):
        with pytest.raises(httpsig.SignatureError):
            httpsig.check_content_digest(bad)


def test_es256_signatures_verify_independently() -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    jwk = httpsig.public_jwk(key)
    assert set(jwk) == {"kty", "crv", "x", "y", "alg"} and (jwk["kty"], jwk["crv"], jwk["alg"]) == ("EC", "P-256", "ES256")
    assert httpsig.jwk_thumbprint(jwk) == ECKey.import_key({k: jwk[k] for k in ("kty", "crv", "x", "y")}).thumbprint()
    url = "https://mcp.example.com:8443/v1/mcp"
    signed = httpsig.sign_request(key, "POST", url, [("Content-Type", "application/json")], b"{}", 1_800_000_000,
                                  httpsig.hwk_key(jwk))
    assert f'y="{jwk["y"]}"' in signed.signature_key and 'alg="ES256"' in signed.signature_key
    lines = [("Host", "mcp.example.com:8443"), ("Content-Type", "application/json"), *signed.headers().items()]
    verified = verify("POST", url, lines, b"{}", 1_800_000_000)
    assert verified.jwk["alg"] == "ES256" and len(base64.b64decode(signed.signature.split(":")[1])) == 64  # r || s
    with pytest.raises(Rejected):
        verify("POST", url, lines, b"{ }", 1_800_000_000)
    other = httpsig.hwk_key(httpsig.public_jwk(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(Rejected):
        verify("POST", url, [(n, other if n == "Signature-Key" else v) for n, v in lines], b"{}", 1_800_000_000)


# ------------------------------------------------------------------------------ the key file


def test_the_key_file_is_created_0600_and_is_durable(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    first = load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create(path).thumbprint == first.thumbprint  # the same key after a restart
    assert "PRIVATE" not in repr(first) and first.thumbprint in repr(first)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_key_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "agent.key"
    load_or_create(path)
    path.chmod(mode)
    with pytest.raises(ConfigError) as info:
        load_key(path)
    assert info.value.errors == [f"aauth.key_file: {path}: readable or writable by group or others (mode "
                                 f"{mode:04o}): chmod 600 it, and rotate the key if others may have read it"]


def test_a_symlinked_or_foreign_key_file_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.key"
    load_or_create(real)
    link = tmp_path / "link.key"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="a symlink is refused"):
        load_key(link)
    if os.geteuid() == 0:
        os.chown(real, 65534, 65534)
        with pytest.raises(ConfigError, match="owned by uid 65534"):
            load_key(real)


def test_the_key_is_of_the_configured_algorithm(tmp_path: Path) -> None:
    es = load_or_create(tmp_path / "es.key", "ES256")
    assert es.jwk["alg"] == "ES256" and stat.S_IMODE((tmp_path / "es.key").stat().st_mode) == 0o600
    assert load_or_create(tmp_path / "es.key", "ES256").thumbprint == es.thumbprint
    with pytest.raises(ConfigError, match="not an Ed25519 key, as \\[aauth\\] alg"):
        load_key(tmp_path / "es.key")
    load_or_create(tmp_path / "ed.key")
    with pytest.raises(ConfigError, match="not a P-256 key"):
        load_key(tmp_path / "ed.key", "ES256")


def test_serve_refuses_to_start_with_a_group_readable_key(tmp_path: Path) -> None:
    key = tmp_path / "agent.key"
    load_or_create(key)
    key.chmod(0o640)
    config = tmp_path / "config.toml"
    config.write_text(f'[sidecar]\nsocket = "{tmp_path}/run/s.sock"\n[secrets]\nsources = ["env"]\n'
                      f'[aauth]\nkey_file = "{key}"\n[[servers]]\nname = "s"\n'
                      'endpoint = "https://s.example/mcp"\naauth = true\n')
    result = run_cli("serve", "--config", str(config), timeout=20)
    assert result.code == 2, result.output
    assert f"aauth.key_file: {key}: readable or writable by group or others (mode 0640)" in result.stderr


# ------------------------------------------------------------------------------ end to end


ENROLL = "enroll-" + CANARY  # the enrollment secret the provider demands
BEARER_SECRET = "bearer-secret-0123456789"
OIDC_CLIENTS: list[dict[str, Any]] = [  # on the shared oidc-provider (conftest): the `oauth` server's
    {"client_id": "c-aauth-bearer", "client_secret": BEARER_SECRET,
     "token_endpoint_auth_method": "client_secret_basic", "scope": "tools:read"},
]
ASKED = ("content-digest", "@target-uri")  # what the resource's aauth-resource.json asks to be covered
EMPTY_DIGEST = httpsig.content_digest(b"")


@pytest.fixture(scope="module")
def peer() -> Iterator[AAuthPeer]:
    with start_aauth_peer(enroll=ENROLL, components=ASKED) as server:
        yield server


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mcpcreds-aauth-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def oidc(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, 3600)


def local_url(peer: AAuthPeer, path: str = "/mcp") -> str:
    """The peer under another origin (localhost, not 127.0.0.1): its own metadata cache entry."""
    return peer.base.replace("127.0.0.1", "localhost") + path


@pytest.fixture(scope="module")
def sidecar(peer: AAuthPeer, oidc: OidcPeer, workdir: Path) -> Iterator[SidecarProcess]:
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[secrets]
sources = ["env"]

[aauth]
default = true

[[servers]]
name = "signed"
endpoint = "{peer.url}"
trust = "trusted"

[[servers]]
name = "optout"
endpoint = "{peer.url}"
trust = "trusted"
aauth = false

[[servers]]
name = "needs-token"
endpoint = "{peer.base}/token-required/mcp"
trust = "trusted"

[[servers]]
name = "access"
endpoint = "{peer.base}/access/mcp"
trust = "trusted"

[[servers]]
name = "strict"
endpoint = "{peer.base}/strict/mcp"
trust = "trusted"

[[servers]]
name = "static"
endpoint = "{peer.url}"
trust = "trusted"
aauth = true
auth = {{ kind = "static", token = "{{{{secret:STATIC_TOKEN}}}}" }}

[[servers]]
name = "bearer"
endpoint = "{peer.base}/bearer/mcp"
trust = "trusted"
aauth = true
oauth = {{ token_url = "{oidc.token_url}", client_id = "c-aauth-bearer", client_secret = "{{{{secret:BEARER_SECRET}}}}", scope = "tools:read" }}

[[servers]]
name = "metadata-denied"
endpoint = "{local_url(peer)}"
trust = "trusted"
deny_hosts = ["localhost"]
""")
    with run_sidecar(config, socket, {"STATIC_TOKEN": "static-token-0123456789",
                                      "BEARER_SECRET": BEARER_SECRET}) as proc:
        yield proc


def private_forms(workdir: Path) -> list[str]:
    """Every spelling of the agent's private key a leak could take."""
    pem = (workdir / "run" / "aauth-agent.key").read_bytes()
    key = serialization.load_pem_private_key(pem, None)
    assert isinstance(key, Ed25519PrivateKey)
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    body = "".join(pem.decode().splitlines()[1:-1])
    return [body, body[:32], httpsig.b64url(raw), base64.b64encode(raw).decode(), raw.hex(), raw.hex().upper()]


def public_x(workdir: Path) -> str:
    key = serialization.load_pem_private_key((workdir / "run" / "aauth-agent.key").read_bytes(), None)
    assert isinstance(key, Ed25519PrivateKey)
    return httpsig.public_jwk(key)["x"]


def raw_client(sidecar: SidecarProcess, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sidecar.socket)),
                             base_url="http://mcpcreds", headers=headers, timeout=30)


async def test_the_mcp_sdk_reaches_a_signed_server_through_the_gateway(
        sidecar: SidecarProcess, peer: AAuthPeer, workdir: Path) -> None:
    key_file = workdir / "run" / "aauth-agent.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600  # created at start, in the state folder
    before = peer.stats()["verified"]
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client("signed") as http, \
            streamable_http_client(creds.mcp_url("signed"), http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        assert {t.name for t in (await session.list_tools()).tools} == {"echo", "add"}
        added = await session.call_tool("add", {"a": 2, "b": 3})
        assert added.structured_content == {"result": 5}
    stats = peer.stats()
    assert stats["verified"] - before >= 4 and not stats["rejected"]
    assert set(stats["keys"]) == {public_x(workdir)}  # every request signed with the one agent key
    assert {"@method", "@authority", "@path", "signature-key", *ASKED} <= set(stats["covered"])


async def test_the_mcp_sdk_reaches_a_signed_server_directly_with_creds_auth(
        sidecar: SidecarProcess, peer: AAuthPeer, workdir: Path) -> None:
    import httpx2

    before = peer.stats()
    async with AsyncClient(sidecar.socket) as creds, httpx2.AsyncClient(auth=creds.auth("signed")) as http, \
            streamable_http_client(peer.url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:  # no gateway: the client talks to the server itself
        await session.initialize()
        assert (await session.call_tool("echo", {"text": "signed"})).structured_content == {"result": "signed"}
    after = peer.stats()
    assert after["verified"] - before["verified"] >= 3 and after["rejected"] == before["rejected"]
    assert set(after["keys"][len(before["keys"]):]) == {public_x(workdir)}
    assert after["digested"] - before["digested"] >= 2  # the POSTs: their body, by its digest


async def test_a_resource_access_token_is_kept_and_presented_signed(sidecar: SidecarProcess,
                                                                    peer: AAuthPeer) -> None:
    before = peer.stats()
    async with raw_client(sidecar, **RPC) as http:
        first = await http.post("/mcp/access", json=INIT)
    assert first.status_code == 200 and "aauth-access" not in first.headers  # kept in the sidecar
    async with AsyncClient(sidecar.socket) as creds, creds.mcp_httpx2_client("access") as http2, \
            streamable_http_client(creds.mcp_url("access"), http_client=http2) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        assert {t.name for t in (await session.list_tools()).tools} == {"echo", "add"}
    after = peer.stats()
    assert after["access_issued"] - before["access_issued"] == 1  # one token, then presented
    assert after["access_presented"] - before["access_presented"] >= 3
    assert "authorization" in after["covered"] and after["rejected"] == before["rejected"]


async def test_a_refused_session_token_is_dropped_and_the_retry_gets_a_new_one(sidecar: SidecarProcess,
                                                                                peer: AAuthPeer) -> None:
    async with raw_client(sidecar, **RPC) as http:
        assert (await http.post("/mcp/access", json=INIT)).status_code == 200  # a session token is held
        peer.forget_access_tokens()
        before = peer.stats()
        answer = await http.post("/mcp/access", json=INIT)  # refused, then retried without it
        assert answer.status_code == 200, answer.text
        after = peer.stats()
        assert after["access_refused"] - before["access_refused"] == 1
        assert after["access_issued"] - before["access_issued"] == 1  # the retry was given a new one
        assert (await http.post("/mcp/access", json=INIT)).status_code == 200
    assert peer.stats()["access_presented"] > after["access_presented"]  # and it is presented


async def test_a_refusal_naming_required_input_is_learned_and_retried(sidecar: SidecarProcess,
                                                                       peer: AAuthPeer) -> None:
    before = peer.stats()
    async with raw_client(sidecar, **RPC) as http:
        answer = await http.post("/mcp/strict", json=INIT)  # refused invalid_input, retried covering @scheme
        assert answer.status_code == 200, answer.text
        after = peer.stats()
        assert after["rejected"].get("invalid_input", 0) - before["rejected"].get("invalid_input", 0) == 1
        assert "@scheme" in after["covered"]
        assert (await http.post("/mcp/strict", json=INIT)).status_code == 200  # learned: no refusal now
        status = (await http.get("/v1/status")).json()
    assert peer.stats()["rejected"].get("invalid_input", 0) == after["rejected"]["invalid_input"]
    assert status["aauth"]["resource_components"][peer.base] == [*ASKED, "@scheme"]


@pytest.mark.parametrize("header", ["user-agent", "mcp-param-region"])
async def test_a_header_value_that_is_not_ascii_is_refused_before_anything_is_signed_or_sent(
        sidecar: SidecarProcess, peer: AAuthPeer, header: str) -> None:
    """The signer signs text: a value of other bytes would be signed as one thing and sent as
    another; it is refused here, and the same request in ASCII goes through signed."""
    before = peer.stats()
    async with raw_client(sidecar, **RPC) as http:
        refused = await http.post("/mcp/signed", json=INIT, headers={header.encode(): "caf\u00e9".encode()})
        assert peer.stats() == before  # nothing reached the resource
        plain = await http.post("/mcp/signed", json=INIT, headers={header.encode(): b"cafe"})
    assert refused.status_code == 400, refused.text
    assert "not ASCII cannot be signed" in refused.text and "caf" not in refused.text
    assert plain.status_code == 200, plain.text
    assert peer.stats()["verified"] > before["verified"]


async def test_aauth_false_sends_no_signature(sidecar: SidecarProcess, peer: AAuthPeer) -> None:
    before = peer.stats()
    async with raw_client(sidecar, **RPC) as http:
        answer = await http.post("/mcp/optout", json=INIT)
    assert answer.status_code == 401
    after = peer.stats()
    assert after["unsigned"] > before["unsigned"] and after["verified"] == before["verified"]


async def test_auth_wins_over_aauth(sidecar: SidecarProcess, peer: AAuthPeer) -> None:
    before = peer.stats()
    async with raw_client(sidecar, **RPC) as http:  # `auth` (a static token) and aauth = true: not signed
        assert (await http.post("/mcp/static", json=INIT)).status_code == 401
        refused = await http.post("/v1/servers/static/sign", json={"method": "GET", "url": peer.url,
                                                                    "content_digest": EMPTY_DIGEST})
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    after = peer.stats()
    assert after["unsigned"] > before["unsigned"] and after["verified"] == before["verified"]


async def test_oauth_wins_over_aauth(sidecar: SidecarProcess, peer: AAuthPeer, oidc: OidcPeer) -> None:
    """`oauth` and aauth = true: the gateway's requests carry the login's bearer and no signature
    field at all, and the sign route refuses the server."""
    async with raw_client(sidecar, **RPC) as http:
        answer = await http.post("/mcp/bearer", json=INIT)
        refused = await http.post("/v1/servers/bearer/sign", json={"method": "GET", "url": f"{peer.base}/bearer/mcp",
                                                                    "content_digest": EMPTY_DIGEST})
    assert answer.status_code == 401  # the peer admits only signed requests: it refused these
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    seen = [r for r in peer.stats()["seen"] if r["path"] == "/bearer/mcp"]
    assert seen and all(r["signature_fields"] == [] for r in seen), seen
    jwks = KeySet.import_key_set(oidc.jwks())  # type: ignore[arg-type]
    for r in seen:  # the bearer is the oauth login's, issued by the authorization server
        assert r["authorization"].startswith("Bearer ")
        claims = jwt.decode(r["authorization"].removeprefix("Bearer "), jwks).claims
        assert claims["client_id"] == "c-aauth-bearer"


async def test_the_resource_metadata_is_fetched_through_the_egress_policy(sidecar: SidecarProcess,
                                                                          peer: AAuthPeer) -> None:
    """The server's egress policy denies its own host: the metadata is not fetched (nothing
    reaches the peer), a warning says so, and the sidecar signs with the base components only."""
    before = peer.stats()["metadata_fetched"]
    async with raw_client(sidecar) as http:
        answer = await http.post("/v1/servers/metadata-denied/sign", json={"method": "GET", "url": local_url(peer)})
        status = (await http.get("/v1/status")).json()
    assert answer.status_code == 200, answer.text
    assert answer.json()["covered"] == ["@method", "@authority", "@path", "signature-key"]
    assert peer.stats()["metadata_fetched"] == before
    logged = sidecar.wait_for("aauth: the resource metadata could not be read; signing with the base components")
    assert logged["server"] == "metadata-denied" and logged["reason"] == "Forbidden"
    assert local_url(peer, "") not in status["aauth"]["resource_components"]


async def test_a_challenge_for_a_token_is_passed_on(sidecar: SidecarProcess, peer: AAuthPeer) -> None:
    before = peer.stats()["verified"]
    async with raw_client(sidecar, **RPC) as http:
        answer = await http.post("/mcp/needs-token", json=INIT)
    assert answer.status_code == 401
    assert peer.stats()["verified"] - before == 1  # a requirement the sidecar cannot meet: not retried
    assert answer.headers["www-authenticate"] == 'AAuth requirement=auth-token; resource="aauth-peer"'
    assert answer.headers["aauth-requirement"] == 'requirement=auth-token; resource-token="eyJ.x.y"'
    error = answer.json()["error"]  # the body names what is missing, never the resource's words
    assert error["code"] == "aauth_requirement" and error["requirement"] == "auth-token"
    assert "an auth token from the agent's Person Server" in error["message"] and "eyJ.x.y" not in answer.text
    logged = sidecar.wait_for("aauth: the resource asks for what the sidecar cannot obtain (a token from a "
                              "person or access server); its 401 is passed on")  # blocks until read, no sleep
    assert logged["requirement"] == "auth-token" and logged["server"] == "needs-token"
    async with raw_client(sidecar, **RPC) as http:  # a bearer server's challenge stays in the sidecar
        assert "www-authenticate" not in (await http.post("/mcp/optout", json=INIT)).headers


async def test_creds_auth_keeps_the_session_token_and_names_a_requirement(sidecar: SidecarProcess,
                                                                          peer: AAuthPeer) -> None:
    import httpx2

    from mcpcreds.core.aauth_requirement import AAuthRequirementError

    before = peer.stats()
    async with AsyncClient(sidecar.socket) as creds, httpx2.AsyncClient(auth=creds.auth("access")) as http, \
            streamable_http_client(f"{peer.base}/access/mcp", http_client=http) as (read, write), \
            ClientSession(read, write) as session:  # the client talks to the server itself
        await session.initialize()
        assert (await session.call_tool("add", {"a": 4, "b": 5})).structured_content == {"result": 9}
    after = peer.stats()
    assert after["access_issued"] - before["access_issued"] == 1  # one session token, then presented
    assert after["access_presented"] - before["access_presented"] >= 2
    assert {"authorization", *ASKED} <= set(after["covered"]) and after["rejected"] == before["rejected"]
    async with AsyncClient(sidecar.socket) as creds, httpx2.AsyncClient(auth=creds.auth("needs-token")) as http:
        with pytest.raises(AAuthRequirementError) as info:
            await http.post(f"{peer.base}/token-required/mcp", json=INIT, headers=RPC)
    assert info.value.details["requirement"] == "auth-token" and "eyJ.x.y" not in str(info.value)
    assert "an auth token from the agent's Person Server" in info.value.message


async def test_the_resource_metadata_is_read_once_per_sidecar(sidecar: SidecarProcess, peer: AAuthPeer) -> None:
    before = peer.stats()
    async with raw_client(sidecar, **RPC) as http:
        for _ in range(3):
            assert (await http.post("/mcp/signed", json=INIT)).status_code == 200
    stats = peer.stats()
    assert set(ASKED) <= set(stats["covered"]) and stats["rejected"] == before["rejected"]
    assert 1 <= stats["metadata_fetched"] <= 2  # one origin: once for each of the two sidecars, not per request
    async with raw_client(sidecar) as http:
        status = (await http.get("/v1/status")).json()
    assert status["aauth"]["resource_components"][peer.base][:2] == list(ASKED)
    logged = [json.loads(line) for line in sidecar.log.splitlines() if "does not produce" in line]
    assert [entry["skipped"] for entry in logged] == [1]  # @query-param, left out (never quoted), once


async def test_the_sign_route_signs_a_direct_clients_request(
        sidecar: SidecarProcess, peer: AAuthPeer, workdir: Path) -> None:
    body = json.dumps(INIT)
    ask = {"method": "POST", "url": peer.url, "headers": {"content-type": "application/json"},
           "content_digest": httpsig.content_digest(body.encode())}
    async with raw_client(sidecar) as http:
        answer = await http.post("/v1/servers/signed/sign", json=ask)
    assert answer.status_code == 200, answer.text
    signed = answer.json()
    assert [c for c in signed["covered"] if c != "@scheme"] == [  # @scheme: if /strict/ taught it already
        "@method", "@authority", "@path", "@target-uri", "signature-key", "content-digest",
        "content-type"]  # @target-uri: the resource asks for it
    assert signed["headers"]["Signature-Key"] == httpsig.hwk_key({"kty": "OKP", "crv": "Ed25519",
                                                                  "x": public_x(workdir), "alg": "Ed25519"})
    with httpx.Client(timeout=10) as direct:  # the client talks to the server itself
        reached = direct.post(peer.url, content=body, headers={**RPC, **signed["headers"]})
    assert reached.status_code == 200, reached.text
    lines = [("host", peer.base.removeprefix("http://")), ("content-type", "application/json"),
             *signed["headers"].items()]
    assert peer.check("POST", peer.url, lines, body) == {"ok": True}
    assert peer.check("POST", peer.url, lines, body.replace("raw", "bad")) == {"error": "invalid_signature"}


@pytest.mark.parametrize(("server", "ask", "status", "code"), [
    ("optout", {"method": "POST", "url": "URL"}, 403, "forbidden"),
    ("signed", {"method": "POST", "url": "http://127.0.0.1:1/mcp"}, 400, "invalid_request"),
    ("signed", {"method": "POST", "url": "URL", "body": "{}"}, 400, "invalid_request"),
    ("signed", {"method": "post", "url": "URL"}, 400, "invalid_request"),
    ("signed", {"method": "POST", "url": "URL", "content_digest": "sha-256=:nope:"}, 400, "invalid_request"),
    ("signed", {"method": "POST", "url": "URL", "headers": {"x-missing": 1}}, 400, "invalid_request"),
])
async def test_the_sign_route_refuses(sidecar: SidecarProcess, peer: AAuthPeer, server: str,
                                      ask: dict[str, Any], status: int, code: str) -> None:
    ask = {k: (peer.url if v == "URL" else v) for k, v in ask.items()}
    async with raw_client(sidecar) as http:
        answer = await http.post(f"/v1/servers/{server}/sign", json=ask)
    assert (answer.status_code, answer.json()["error"]["code"]) == (status, code)


async def test_the_sign_route_needs_the_digest_the_resource_asks_for(sidecar: SidecarProcess,
                                                                     peer: AAuthPeer) -> None:
    async with raw_client(sidecar) as http:
        answer = await http.post("/v1/servers/signed/sign", json={"method": "GET", "url": peer.url})
        assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_request")
        assert "asks that content-digest be covered" in answer.json()["error"]["message"]
        signed = await http.post("/v1/servers/signed/sign", json={"method": "GET", "url": peer.url,
                                                                  "content_digest": EMPTY_DIGEST})
    lines = [("host", peer.base.removeprefix("http://")), *signed.json()["headers"].items()]
    assert peer.check("GET", peer.url, lines, "") == {"ok": True}  # the empty body's digest, covered


async def test_the_sign_route_is_grant_aware(sidecar: SidecarProcess, peer: AAuthPeer) -> None:
    async with AsyncClient(sidecar.socket) as creds:
        minted = await creds.grant(["optout"], ttl=60)
    ask = {"method": "POST", "url": peer.url, "content_digest": EMPTY_DIGEST}
    async with raw_client(sidecar, Authorization=f"Bearer {minted['grant']}") as http:
        refused = await http.post("/v1/servers/signed/sign", json=ask)
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    async with AsyncClient(sidecar.socket) as creds:
        minted = await creds.grant(["signed"], ttl=60)
    async with raw_client(sidecar, Authorization=f"Bearer {minted['grant']}") as http:
        assert (await http.post("/v1/servers/signed/sign", json=ask)).status_code == 200


async def test_the_private_key_appears_in_no_output(sidecar: SidecarProcess, peer: AAuthPeer,
                                                     workdir: Path) -> None:
    seen: list[str] = []
    async with raw_client(sidecar, **RPC) as http:
        for path in ("/v1/status", "/v1/servers", "/metrics", "/v1/servers/signed/headers",
                     "/v1/servers/nope/sign"):
            seen.append((await http.get(path)).text)
        seen.append((await http.post("/v1/servers/signed/sign", json={"method": "POST", "url": peer.url})).text)
        seen.append((await http.post("/v1/servers/signed/sign", json={"method": "POST", "url": "x"})).text)
        answer = await http.post("/mcp/signed", json=INIT)
        seen.append(answer.text + json.dumps(dict(answer.headers)))
        seen.append((await http.post("/mcp/needs-token", json=INIT)).text)
    payload = run_cli("spawn-payload", "signed", "optout", "--socket", str(sidecar.socket),
                      "--config", str(sidecar.config))
    assert payload.code == 0, payload.output
    specs = {spec["name"]: spec for spec in json.loads(payload.stdout)}
    assert "aauth" not in specs["signed"] and specs["optout"]["aauth"] is False  # as written: a boolean
    seen += [payload.stdout, payload.stderr, run_cli("status", "--json", "--socket", str(sidecar.socket),
                                                     "--config", str(sidecar.config)).stdout]
    seen += [(workdir / "audit.jsonl").read_text(), sidecar.log, peer.log()]
    text = "\n".join(seen)
    assert public_x(workdir) in text  # the scan reaches where the key's public half shows
    for form in private_forms(workdir):
        assert form not in text


def test_show_key_prints_the_public_key_only(sidecar: SidecarProcess, workdir: Path) -> None:
    shown = run_cli("aauth", "show-key", "--json", "--socket", str(sidecar.socket), "--config", str(sidecar.config))
    assert shown.code == 0, shown.output
    agent = json.loads(shown.stdout)
    assert agent["public_jwk"] == {"kty": "OKP", "crv": "Ed25519", "x": public_x(workdir), "alg": "Ed25519"}
    assert agent["thumbprint"] == OKPKey.import_key({"kty": "OKP", "crv": "Ed25519", "x": public_x(workdir)}).thumbprint()
    table = run_cli("aauth", "show-key", "--socket", str(sidecar.socket), "--config", str(sidecar.config)).stdout
    for form in private_forms(workdir):
        assert form not in shown.stdout + table


def test_the_sign_route_is_described_in_the_openapi_document() -> None:
    from importlib import resources

    doc = json.loads((resources.files("mcpcreds") / "openapi.json").read_text())
    route = doc["paths"]["/v1/servers/{name}/sign"]["post"]
    assert route["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/SignRequest"}
    assert set(doc["components"]["schemas"]["SignRequest"]["properties"]) == {"method", "url", "headers",
                                                                              "content_digest", "required_input"}
    assert doc["components"]["schemas"]["McpServerSpec"]["properties"]["aauth"]["type"] == "boolean"


# ------------------------------------------------------------------------------ agent tokens (jwt)


PROVIDER_KEY = OKPKey.generate_key("Ed25519", parameters={"kid": "p"})
ISSUER = "https://agents.example"


def agent_token(claims: dict[str, Any], key: OKPKey = PROVIDER_KEY, alg: str = "Ed25519",
                typ: str = "aa-agent+jwt") -> str:
    """An agent token as the draft shapes it (`dwk`, `iat` filled in unless given)."""
    claims = {"dwk": "aauth-agent.json", "iat": int(claims["exp"]) - 300, **claims}
    return jwt.encode({"alg": alg, "typ": typ, "kid": "p"}, claims, key, algorithms=[alg])


@pytest.mark.filterwarnings("ignore:EdDSA is deprecated")  # joserfc, signing the refused case
def test_an_agent_token_is_checked_before_it_is_used() -> None:
    ours = httpsig.public_jwk(rfc_key())
    jwks = {"keys": [PROVIDER_KEY.as_dict(private=False)]}
    good = {"iss": ISSUER, "exp": 2_000_000_100, "cnf": {"jwk": ours}}
    assert check_agent_token(agent_token(good), ISSUER, jwks, ours, now=2_000_000_000) == 2_000_000_100
    cases = {
        "signature does not verify": agent_token(good, OKPKey.generate_key("Ed25519", parameters={"kid": "p"})),
        "iss is not the provider's issuer": agent_token({**good, "iss": "https://other.example"}),
        "no exp, or has expired": agent_token({**good, "exp": 1_999_999_999}),
        "cnf.jwk is not this sidecar's agent key": agent_token(
            {**good, "cnf": {"jwk": httpsig.public_jwk(Ed25519PrivateKey.generate())}}),
        "holds no compact JWT": "not-a-token",
        # the draft's "Agent Token Verification": typ, dwk, iat not ahead, a fully-specified alg
        "typ is not aa-agent\\+jwt": agent_token(good, typ="JWT"),
        "dwk is not aauth-agent.json": agent_token({**good, "dwk": "aauth-person.json"}),
        "no iat, or was issued in the future": agent_token({**good, "iat": 2_000_000_061}),
        "EdDSA is refused": agent_token(good, alg="EdDSA"),
    }
    assert check_agent_token(agent_token({**good, "iat": 2_000_000_060}), ISSUER, jwks, ours,
                             now=2_000_000_000) == 2_000_000_100  # 60 s of clock skew tolerated
    es_key = ECKey.generate_key("P-256", parameters={"kid": "p"})
    good = {**good, "dwk": "aauth-agent.json", "iat": 2_000_000_000}
    es_token = jwt.encode({"alg": "ES256", "typ": "aa-agent+jwt", "kid": "p"}, good, es_key, algorithms=["ES256"])
    es_jwks = {"keys": [es_key.as_dict(private=False)]}
    assert check_agent_token(es_token, ISSUER, es_jwks, ours, now=2_000_000_000) == 2_000_000_100
    head, _, es_sig = es_token.split(".")
    other = jwt.encode({"alg": "ES256", "typ": "aa-agent+jwt", "kid": "p"}, {**good, "exp": 2_000_000_200}, es_key,
                       algorithms=["ES256"])
    with pytest.raises(AgentTokenError, match="signature does not verify"):  # a claims part swapped in
        check_agent_token(f"{head}.{other.split('.')[1]}.{es_sig}", ISSUER, es_jwks, ours,
                          now=2_000_000_000)
    for why, token in cases.items():
        with pytest.raises(AgentTokenError, match=why) as info:
            check_agent_token(token, ISSUER, jwks, ours, now=2_000_000_000)
        assert token not in str(info.value)


def test_an_es256_agents_token_must_bind_its_whole_key() -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    ours = httpsig.public_jwk(ec.generate_private_key(ec.SECP256R1()))
    jwks = {"keys": [PROVIDER_KEY.as_dict(private=False)]}
    good = {"iss": ISSUER, "exp": 2_000_000_100, "cnf": {"jwk": ours}}
    assert check_agent_token(agent_token(good), ISSUER, jwks, ours, now=2_000_000_000) == 2_000_000_100
    other_y = {**ours, "y": httpsig.public_jwk(ec.generate_private_key(ec.SECP256R1()))["y"]}
    with pytest.raises(AgentTokenError, match=r"cnf\.jwk is not this sidecar's agent key"):
        check_agent_token(agent_token({**good, "cnf": {"jwk": other_y}}), ISSUER, jwks, ours, now=2_000_000_000)


async def test_agent_tokens_single_flight_and_renewal_ahead_of_expiry(tmp_path: Path) -> None:
    import asyncio

    config = parse_config({"sidecar": {"socket": str(tmp_path / "s.sock")}, "aauth": {"provider": ISSUER}})
    now = [1000.0]
    signer = AAuthSigner(config, lambda: now[0])
    fetched: list[float] = []
    release = asyncio.Event()

    async def fetch() -> str:
        fetched.append(now[0])
        await release.wait()
        token = f"token-{len(fetched)}"
        signer._token = (token, now[0], now[0] + 300)
        return token

    signer._fetch = fetch  # type: ignore[method-assign]
    waiting = [asyncio.ensure_future(signer.agent_token()) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*waiting) == ["token-1"] * 5 and len(fetched) == 1  # one fetch for all
    now[0] = 1000 + 239  # before the renewal point (60 s ahead of expiry): the held one, no fetch
    assert await signer.agent_token() == "token-1" and len(fetched) == 1
    now[0] = 1000 + 241  # within 60 s of expiry: still served, renewed in the background
    assert await signer.agent_token() == "token-1"
    assert signer._fetching is not None
    await signer._fetching
    assert len(fetched) == 2 and await signer.agent_token() == "token-2"
    now[0] = 2000.0  # past expiry: the caller waits for a new one
    assert await signer.agent_token() == "token-3"


@pytest.fixture(scope="module")
def jwt_sidecar(peer: AAuthPeer, workdir: Path) -> Iterator[SidecarProcess]:
    socket = workdir / "jwt" / "mcpcreds.sock"
    config = workdir / "jwt.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"

[secrets]
sources = ["env"]

[aauth]
provider = "{peer.base}/provider"
enroll = {{ token = "{{{{secret:ENROLL}}}}" }}

[[servers]]
name = "agent"
endpoint = "{peer.url}"
trust = "trusted"

[[servers]]
name = "agent-strict"
endpoint = "{peer.base}/strict/mcp"
trust = "trusted"
""")
    with run_sidecar(config, socket, {"ENROLL": ENROLL}) as proc:
        yield proc


async def test_with_a_provider_requests_carry_the_agent_token(jwt_sidecar: SidecarProcess, peer: AAuthPeer,
                                                              workdir: Path) -> None:
    import asyncio

    before = peer.stats()
    async with raw_client(jwt_sidecar, **RPC) as http:  # concurrent, before any token: one is fetched
        answers = await asyncio.gather(*(http.post("/mcp/agent", json=INIT) for _ in range(6)))
    assert [a.status_code for a in answers] == [200] * 6, answers[0].text
    async with AsyncClient(jwt_sidecar.socket) as creds, creds.mcp_httpx2_client("agent") as http2, \
            streamable_http_client(creds.mcp_url("agent"), http_client=http2) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        assert (await session.call_tool("add", {"a": 1, "b": 2})).structured_content == {"result": 3}
    after = peer.stats()
    assert after["tokens_issued"] - before["tokens_issued"] == 1 and after["enroll_refused"] == 0
    assert after["schemes"].get("jwt", 0) - before["schemes"].get("jwt", 0) >= 9
    async with raw_client(jwt_sidecar) as http:
        signed = (await http.post("/v1/servers/agent/sign", json={"method": "GET", "url": peer.url,
                                                                   "content_digest": EMPTY_DIGEST})).json()
    assert signed["headers"]["Signature-Key"].startswith('sig=jwt;jwt="ey')
    assert peer.check("GET", peer.url, [("host", peer.base.removeprefix("http://")),
                                        *signed["headers"].items()], "") == {"ok": True}
    assert ENROLL not in jwt_sidecar.log and CANARY not in jwt_sidecar.log
    token = after["last_token"]  # held in memory only: in no file, log or status
    status = run_cli("status", "--json", "--socket", str(jwt_sidecar.socket), "--config", str(jwt_sidecar.config))
    assert token and token not in jwt_sidecar.log + status.stdout + status.stderr
    for path in (p for p in (workdir / "jwt").rglob("*") if p.is_file()):
        assert token.encode() not in path.read_bytes(), path


async def test_an_es256_agent_key_with_its_agent_token_through_the_gateway_and_sign(
        peer: AAuthPeer, workdir: Path) -> None:
    socket = workdir / "es" / "mcpcreds.sock"
    config = workdir / "es.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"

[secrets]
sources = ["env"]

[aauth]
provider = "{peer.base}/provider"
enroll = {{ token = "{{{{secret:ENROLL}}}}" }}
alg = "ES256"
default = false

[[servers]]
name = "es"
endpoint = "{peer.url}"
trust = "trusted"
aauth = true

[[servers]]
name = "es-plain"
endpoint = "{peer.base}/plain/mcp"
trust = "trusted"
""")
    before = peer.stats()
    with run_sidecar(config, socket, {"ENROLL": ENROLL}) as proc:
        async with raw_client(proc, **RPC) as http:
            assert (await http.post("/mcp/es", json=INIT)).status_code == 200
            signed = (await http.post("/v1/servers/es/sign", json={"method": "GET", "url": peer.url,
                                                                    "content_digest": EMPTY_DIGEST})).json()
            # default = false: a server without the field is not signed, though a provider is set
            assert (await http.post("/mcp/es-plain", json=INIT)).status_code == 401
            plain_sign = await http.post("/v1/servers/es-plain/sign", json={
                "method": "GET", "url": f"{peer.base}/plain/mcp", "content_digest": EMPTY_DIGEST})
        status = run_cli("aauth", "show-key", "--json", "--socket", str(socket), "--config", str(config))
    jwk = json.loads(status.stdout)["public_jwk"]
    assert (jwk["kty"], jwk["crv"], jwk["alg"]) == ("EC", "P-256", "ES256")
    after = peer.stats()
    signed_refused = {k: v for k, v in after["rejected"].items() if k != "missing_signature"}
    assert signed_refused == {k: v for k, v in before["rejected"].items() if k != "missing_signature"}
    assert after["tokens_issued"] - before["tokens_issued"] == 1
    assert after["keys"][-1] == jwk["x"] and after["schemes"]["jwt"] > before["schemes"].get("jwt", 0)
    assert peer.check("GET", peer.url, [("host", peer.base.removeprefix("http://")),
                                        *signed["headers"].items()], "") == {"ok": True}
    assert (plain_sign.status_code, plain_sign.json()["error"]["code"]) == (403, "forbidden")
    plain = [r for r in after["seen"] if r["path"] == "/plain/mcp"]
    assert plain and all(r["signature_fields"] == [] for r in plain), plain


async def test_creds_auth_retries_covering_what_a_refusal_requires(jwt_sidecar: SidecarProcess,
                                                                   peer: AAuthPeer) -> None:
    import httpx2

    before = peer.stats()  # this sidecar's gateway never met /strict/: only the refusal can say @scheme
    async with AsyncClient(jwt_sidecar.socket) as creds, httpx2.AsyncClient(auth=creds.auth("agent-strict")) as http:
        answer = await http.post(f"{peer.base}/strict/mcp", json=INIT, headers=RPC)
    assert answer.status_code == 200, answer.text
    after = peer.stats()
    assert after["rejected"].get("invalid_input", 0) - before["rejected"].get("invalid_input", 0) == 1
    assert "@scheme" in after["covered"]
    async with raw_client(jwt_sidecar) as http:
        bad = await http.post("/v1/servers/agent-strict/sign", json={
            "method": "GET", "url": f"{peer.base}/strict/mcp", "content_digest": EMPTY_DIGEST,
            "required_input": "@scheme"})
        status = (await http.get("/v1/status")).json()
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_request")
    assert "@scheme" not in status["aauth"]["resource_components"][peer.base]  # one caller's, not shared


def provider_signer(tmp_path: Path, enroll: dict[str, Any] | str, handler: Any) -> AAuthSigner:
    config = parse_config({"sidecar": {"socket": str(tmp_path / "s.sock")},
                           "aauth": {"provider": ISSUER, "key_file": str(tmp_path / "agent.key"), "enroll": enroll}})
    signer = AAuthSigner(config, time.time, render=lambda template: "enroll-secret")
    signer._http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return signer


def provider(issuer: str = ISSUER, register: Any = None) -> tuple[list[httpx.Request], Any]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/.well-known/aauth-agent.json":
            return httpx.Response(200, json={"issuer": issuer, "jwks_uri": f"{ISSUER}/jwks",
                                             "registration_endpoint": f"{ISSUER}/register"})
        if request.url.path == "/jwks":
            return httpx.Response(200, json={"keys": [PROVIDER_KEY.as_dict(private=False)]})
        return cast(httpx.Response, register(request))

    return seen, handler


async def test_enrollment_sends_the_token_or_the_assertion_signed_by_the_key(tmp_path: Path) -> None:
    def issue(request: httpx.Request) -> httpx.Response:
        jwk = {"kty": "OKP", "crv": "Ed25519", "alg": "Ed25519",
               "x": request.headers["signature-key"].split('x="')[1].split('"')[0]}
        token = agent_token({"iss": ISSUER, "exp": int(time.time()) + 300, "cnf": {"jwk": jwk}})
        return httpx.Response(200, json={"agent_token": token})

    seen, handler = provider(register=issue)
    signer = provider_signer(tmp_path, {"token": "{{secret:ENROLL}}"}, handler)
    token = await signer.agent_token()
    register = seen[-1]
    assert register.headers["authorization"] == "Bearer enroll-secret"
    lines = list(register.headers.multi_items())
    verified = verify("POST", str(register.url), lines, register.content, time.time())
    assert "authorization" in verified.covered and verified.scheme == "hwk"  # the key proves itself
    assert await signer.agent_token() == token and len(seen) == 3  # held: no second enrollment
    seen, handler = provider(register=issue)
    signer = provider_signer(tmp_path, "open", handler)
    await signer.agent_token()
    assert json.loads(seen[-1].content) == {} and "authorization" not in seen[-1].headers  # open: the key alone
    assertion = tmp_path / "sa-token"
    assertion.write_text("eyJfederated.assertion.x\n")
    seen, handler = provider(register=issue)
    signer = provider_signer(tmp_path, {"assertion_file": str(assertion)}, handler)
    await signer.agent_token()
    assert json.loads(seen[-1].content) == {"assertion": "eyJfederated.assertion.x"}
    assert "authorization" not in seen[-1].headers


@pytest.mark.parametrize(("issuer", "register", "error"), [
    ("https://evil.example", None, "the provider metadata's issuer is not the configured provider"),
    (ISSUER, lambda r: httpx.Response(403, json={"error": "enrollment_refused"}),
     "the agent token request was answered HTTP 403"),
    (ISSUER, lambda r: httpx.Response(200, json={"token_type": "none"}), "the provider's answer holds no agent_token"),
], ids=["issuer-mismatch", "refused", "no-token"])
async def test_a_provider_that_fails_is_an_error_naming_what(tmp_path: Path, issuer: str, register: Any,
                                                              error: str) -> None:
    _, handler = provider(issuer, register)
    signer = provider_signer(tmp_path, {"token": "{{secret:ENROLL}}"}, handler)
    with pytest.raises(AgentTokenError) as info:
        await signer.agent_token()
    assert info.value.message == f"aauth: {error}" and info.value.status == 502
    assert "enroll-secret" not in str(info.value)


async def test_rotate_key_replaces_the_key_after_the_new_one_is_ready(
        sidecar: SidecarProcess, jwt_sidecar: SidecarProcess, peer: AAuthPeer, workdir: Path) -> None:
    old_x = public_x(workdir)
    async with AsyncClient(sidecar.socket) as creds:
        minted = await creds.grant(["signed"], ttl=60)
    async with raw_client(sidecar, Authorization=f"Bearer {minted['grant']}") as http:
        assert (await http.post("/v1/aauth/rotate-key")).status_code == 403  # not for grant holders
    rotated = run_cli("aauth", "rotate-key", "--socket", str(sidecar.socket), "--config", str(sidecar.config))
    assert rotated.code == 0, rotated.output
    new_x = public_x(workdir)  # the file holds the new key, still 0600
    assert new_x != old_x and stat.S_IMODE((workdir / "run" / "aauth-agent.key").stat().st_mode) == 0o600
    assert OKPKey.import_key({"kty": "OKP", "crv": "Ed25519", "x": new_x}).thumbprint() in rotated.stdout
    async with raw_client(sidecar, **RPC) as http:
        assert (await http.post("/mcp/signed", json=INIT)).status_code == 200
    assert peer.stats()["keys"][-1] == new_x  # signed with the new key from now on
    # with a provider: the new key's agent token is issued before the new key signs
    before = peer.stats()
    async with raw_client(jwt_sidecar) as http:
        answer = await http.post("/v1/aauth/rotate-key")
        assert answer.status_code == 200, answer.text
        new_jwk = answer.json()["public_jwk"]
        assert (await http.post("/mcp/agent", json=INIT, headers=RPC)).status_code == 200
    after = peer.stats()
    assert after["tokens_issued"] - before["tokens_issued"] == 1
    assert after["keys"][-1] == new_jwk["x"] and after["schemes"]["jwt"] > before["schemes"]["jwt"]


async def test_a_rotation_the_provider_refuses_changes_nothing(tmp_path: Path) -> None:
    _, handler = provider(register=lambda r: httpx.Response(403, json={"error": "enrollment_refused"}))
    config = parse_config({"sidecar": {"socket": str(tmp_path / "s.sock")},
                           "aauth": {"provider": ISSUER, "key_file": str(tmp_path / "agent.key")},
                           "servers": [{"name": "s", "endpoint": "https://s.example/mcp"}]})
    signer = AAuthSigner(config, time.time)
    signer._http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    signer.start()
    before, on_disk = signer.key.thumbprint, (tmp_path / "agent.key").read_bytes()
    with pytest.raises(AgentTokenError, match="HTTP 403"):
        await signer.rotate()
    assert signer.key.thumbprint == before and (tmp_path / "agent.key").read_bytes() == on_disk
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.key"]  # no temp file left
