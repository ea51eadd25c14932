"""OAuth logins end to end: the real sidecar against a real authorization server
(oidc-provider 9 on loopback) issuing short-lived RFC 9068 JWT access tokens."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet

from mcpcreds import Client, TokenEndpointError
from tests.conftest import CANARY, module_peer
from tests.peers.fault_idp import fault_idp
from tests.peers.oidc_peer import OidcPeer, make_rsa_keypair
from tests.sidecar_proc import SidecarProcess, run_sidecar

PEM, JWK = make_rsa_keypair(kid="e2e")
TTL = 3600  # no renewal within a test, unless it sets a short lifetime itself
RENEW_TTL = 8  # renewed at 45-50 % of the lifetime: 4 s of margin before expiry
STALE_TTL = 16  # time to fail, serve the old login, and recover before it expires
OIDC_CLIENTS: list[dict[str, Any]] = [  # on the shared peer (conftest)
    {"client_id": "c-basic", "client_secret": CANARY, "token_endpoint_auth_method": "client_secret_basic",
     "scope": "tools:read tools:call"},
    {"client_id": "c-post", "client_secret": "post-secret:with%odd+chars",
     "token_endpoint_auth_method": "client_secret_post", "scope": "tools:read"},
    {"client_id": "c-jwt", "token_endpoint_auth_method": "private_key_jwt", "jwks": {"keys": [JWK]},
     "scope": "tools:read"},
]


@pytest.fixture(scope="module")
def peer(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, TTL)


def config_text(peer: OidcPeer, socket: Path) -> str:
    return f"""
[sidecar]
socket = "{socket}"
refresh_ahead = "60s"
[secrets]
sources = ["env"]

[services.crm]
endpoint = "https://crm.example.com/mcp"
[services.crm.oauth]
token_url = "{peer.token_url}"
client_id = "c-basic"
client_secret = "{{{{secret:BASIC_SECRET}}}}"
scope = "tools:read tools:call"

[[servers]]
name = "crm-ro"
service = "crm"
[[servers]]
name = "crm-rw"
service = "crm"

[[servers]]
name = "post"
endpoint = "http://127.0.0.1:9/mcp"
headers = {{ "X-Client" = "post-test" }}
oauth = {{ issuer = "{peer.issuer}", client_id = "c-post", client_secret = "{{{{secret:POST_SECRET}}}}", auth_method = "client_secret_post", scope = "tools:read", resource = "https://post.example.com/mcp" }}

[[servers]]
name = "jwt"
endpoint = "https://jwt.example.com/mcp"
auth = {{ kind = "oauth2", grant = "client_credentials", issuer = "{peer.issuer}", client_id = "c-jwt", private_key = "{{{{secret:JWT_KEY}}}}", auth_method = "private_key_jwt", scopes = ["tools:read"] }}

[[servers]]
name = "wrong"
endpoint = "https://wrong.example.com/mcp"
oauth = {{ token_url = "{peer.token_url}", client_id = "c-basic", client_secret = "{{{{secret:WRONG_SECRET}}}}" }}
"""


@pytest.fixture
def sidecar(peer: OidcPeer, tmp_path: Path) -> Iterator[SidecarProcess]:
    socket = tmp_path / "run" / "s.sock"
    config = tmp_path / "config.toml"
    config.write_text(config_text(peer, socket))
    env = {"BASIC_SECRET": CANARY, "POST_SECRET": "post-secret:with%odd+chars", "JWT_KEY": PEM,
           "WRONG_SECRET": "not-the-secret"}
    peer.reset_stats()
    with run_sidecar(config, socket, env) as proc:
        yield proc


def claims(peer: OidcPeer, authorization: str) -> dict[str, Any]:
    assert authorization.startswith("Bearer ")
    token = jwt.decode(authorization[7:], KeySet.import_key_set(peer.jwks()))  # type: ignore[arg-type]
    return dict(token.claims)


def test_three_auth_methods_with_scope_and_resource(peer: OidcPeer, sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        crm = client.headers_info("crm-ro")
        post = client.headers_info("post")
        jwt_ = client.headers_info("jwt")
    c = claims(peer, crm["headers"]["Authorization"])
    assert c["client_id"] == "c-basic" and c["aud"] == "https://crm.example.com/mcp"  # default resource
    assert set(c["scope"].split()) == {"tools:read", "tools:call"}
    assert crm["key"] == "service:crm" and crm["expires_at"] == pytest.approx(c["exp"], abs=1)
    assert len(crm["fingerprint"]) == 8
    p = claims(peer, post["headers"]["Authorization"])
    assert p["client_id"] == "c-post" and p["aud"] == "https://post.example.com/mcp"
    assert post["headers"]["X-Client"] == "post-test"
    j = claims(peer, jwt_["headers"]["Authorization"])
    assert j["client_id"] == "c-jwt" and j["aud"] == "https://jwt.example.com/mcp" and j["scope"] == "tools:read"


def test_one_login_per_service_shared_by_its_servers(peer: OidcPeer, sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        tokens = {client.headers(name)["Authorization"] for name in ("crm-ro", "crm-rw", "service:crm")
                  for _ in range(20)}
    assert len(tokens) == 1
    assert peer.stats()["by_client"] == {"c-basic": 1}


def test_renewal_before_expiry(peer: OidcPeer, sidecar: SidecarProcess) -> None:
    peer.set_ttl(RENEW_TTL)
    try:
        with Client(sidecar.socket) as client:
            first = client.headers_info("crm-ro")
            lifetime = sidecar.wait_for("login fetched")["expires_in"]  # to 0.1 s (the JWT's exp)
            renewed = sidecar.wait_for("login renewed", timeout=RENEW_TTL + 20)
            second = client.headers_info("crm-ro")
    finally:
        peer.set_ttl(TTL)
    # renewed by the timer, without a request, while the first token was still valid, and not
    # before 45 % of its life (all times read by the sidecar)
    assert renewed["key"] == "service:crm" and renewed["time"] < first["expires_at"]
    assert renewed["time"] >= first["expires_at"] - 0.55 * lifetime - 0.1
    assert second["fingerprint"] != first["fingerprint"]
    assert second["expires_at"] > first["expires_at"]
    # one token request per renewal: a login lives at least 35 % of its lifetime before the next
    assert peer.stats()["by_client"]["c-basic"] <= 2 + (time.time() - renewed["time"]) // (RENEW_TTL * 0.35)


def test_wrong_secret_is_invalid_client_without_the_secret(peer: OidcPeer, sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client, pytest.raises(TokenEndpointError) as info:
        client.headers("wrong")
    assert info.value.error == "invalid_client" and info.value.status == 502
    out = subprocess.run(["curl", "-s", "--unix-socket", str(sidecar.socket),
                          "http://x/v1/servers/wrong/headers"], capture_output=True, text=True,
                         check=True).stdout
    body = json.loads(out)
    assert body["error"]["code"] == "token_endpoint_error" and body["error"]["error"] == "invalid_client"
    assert "not-the-secret" not in out


def test_invalidate_with_fingerprint_renews_once(peer: OidcPeer, sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        first = client.headers_info("crm-ro")
        results = [client.request("POST", "/v1/servers/crm-ro/invalidate",
                                  json={"reason": "401", "fingerprint": first["fingerprint"]})
                   for _ in range(50)]
        assert [r["dropped"] for r in results] == [True] + [False] * 49
        second = client.headers_info("crm-rw")
        assert second["fingerprint"] != first["fingerprint"]
    assert peer.stats()["by_client"]["c-basic"] == 2


def test_status_and_metrics_show_logins_without_tokens(peer: OidcPeer, sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        token = client.headers("crm-ro")["Authorization"][7:]
        with pytest.raises(TokenEndpointError):
            client.headers("wrong")
        status = client.status()
        metrics = subprocess.run(["curl", "-s", "--unix-socket", str(sidecar.socket), "http://x/metrics"],
                                 capture_output=True, text=True, check=True).stdout
    logins = {row["key"]: row for row in status["logins"]}
    assert logins["service:crm"]["state"] == "valid" and logins["service:crm"]["token_requests"] == 1
    assert logins["mcp:wrong"]["state"] == "failing" and logins["mcp:wrong"]["last_error"] == "invalid_client"
    assert 'mcpcreds_token_requests_total{key="service:crm"} 1' in metrics
    assert 'mcpcreds_login_state{key="service:crm",state="valid"} 1' in metrics
    for text in (json.dumps(status), metrics, sidecar.log):
        assert token not in text and CANARY not in text and "not-the-secret" not in text


def test_a_failing_idp_is_bridged_by_the_still_valid_login_until_it_recovers(tmp_path: Path) -> None:
    """Stale-if-error with a real sidecar: the IdP fails at renewal time, the old login (still
    valid) keeps being served, and once the IdP is back a new login comes before the old expires."""
    socket = tmp_path / "run" / "s.sock"
    config = tmp_path / "config.toml"
    with fault_idp() as idp:
        idp.expires_in = STALE_TTL
        config.write_text(f"""
[sidecar]
socket = "{socket}"
refresh_ahead = "60s"
[secrets]
sources = ["env"]
[[servers]]
name = "crm"
endpoint = "{idp.base}/mcp"
oauth = {{ client_id = "c", client_secret = "{{{{secret:S}}}}", token_url = "{idp.token_url}" }}
""")
        with run_sidecar(config, socket, {"S": CANARY}) as sidecar, Client(socket) as client:
            first = client.headers_info("crm")
            assert first["headers"] == {"Authorization": "Bearer fault-token-1"}
            idp.mode = "500"
            failed = sidecar.wait_for("login failed; serving the current login (stale)", timeout=STALE_TTL + 20)
            assert failed["key"] == "mcp:crm" and failed["time"] < first["expires_at"]
            for _ in range(5):  # the IdP is down: the old login, still valid, is what is served
                assert client.headers_info("crm") == first
            login = client.status()["logins"][0]
            assert login["state"] == "stale" and login["last_error"] == "server_error"
            idp.mode = "ok"
            while True:
                asked = time.time()  # before the call: a stall after its answer cannot fail it
                if (info := client.headers_info("crm"))["fingerprint"] != first["fingerprint"]:
                    break
                # never past expiry: a call begun once the old login expired is not given it
                assert info == first and asked < first["expires_at"], "the old login served past its expiry"
                time.sleep(0.05)  # the next request after the backoff renews in the background
            renewed = sidecar.wait_for("login renewed")
    assert renewed["time"] < first["expires_at"]  # the new login came before the old one expired
    assert info["headers"]["Authorization"].startswith("Bearer fault-token-")
    assert info["expires_at"] > first["expires_at"]
