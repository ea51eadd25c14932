"""private_key_jwt for RSA, EC and Ed25519 (issue 20): the assertion as RFC 7523 and the MCP
spec say, decoded and verified with joserfc; unit tests, then the real oidc-provider through a
sidecar (the peer records each assertion's alg and aud)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from joserfc import jwt
from joserfc.jwk import ECKey, OKPKey, RSAKey

from mcpcreds import Client
from mcpcreds.config.model import LoginSpec
from mcpcreds.credentials.client_assertion import (
    ASSERTION_TYPE,
    algorithm_for,
    client_assertion,
    load_private_key,
)
from mcpcreds.credentials.oauth import build_token_request
from mcpcreds.errors import TokenEndpointError
from tests.conftest import module_peer
from tests.peers.oidc_peer import OidcPeer
from tests.sidecar_proc import SidecarProcess, run_sidecar

TOKEN_URL = "https://auth.example.com/oauth/token"
ISSUER = "https://auth.example.com"


def pem_of(key: PrivateKeyTypes) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def public_jwk(key: Any, kid: str, alg: str) -> dict[str, Any]:
    cls = {rsa.RSAPrivateKey: RSAKey, ec.EllipticCurvePrivateKey: ECKey,
           ed25519.Ed25519PrivateKey: OKPKey}
    kind = next(v for k, v in cls.items() if isinstance(key, k))
    jwk = kind.import_key(pem_of(key)).as_dict(private=False)  # type: ignore[attr-defined]
    return {**jwk, "kid": kid, "alg": alg, "use": "sig"}


KEYS: dict[str, PrivateKeyTypes] = {
    "RS256": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ES256": ec.generate_private_key(ec.SECP256R1()),
    "ES384": ec.generate_private_key(ec.SECP384R1()),
    "EdDSA": ed25519.Ed25519PrivateKey.generate(),
}


def spec(**kw: Any) -> LoginSpec:
    base: dict[str, Any] = dict(grant="client_credentials", client_id="agent-7", client_secret=None,
                                private_key=None, auth_method="private_key_jwt", token_url=TOKEN_URL,
                                issuer=None, scope=None, resource=None, audience=None)
    base.update(kw)
    return LoginSpec(**base)


def verify(assertion: str, key: Any, alg: str) -> dict[str, Any]:
    jwk = public_jwk(key, "k", alg)
    imported = {"RSA": RSAKey, "EC": ECKey, "OKP": OKPKey}[jwk["kty"]].import_key(jwk)  # type: ignore[attr-defined]
    token = jwt.decode(assertion, imported, algorithms=[alg])
    assert token.header["alg"] == alg
    return dict(token.claims)


@pytest.mark.parametrize("alg", list(KEYS))
def test_the_algorithm_comes_from_the_key_and_the_assertion_verifies(alg: str) -> None:
    key = KEYS[alg]
    request = build_token_request(spec(), TOKEN_URL, pem_of(key), issuer=ISSUER, now=1_700_000_000)
    form = parse_qs(request.body)
    assert form["client_assertion_type"] == [ASSERTION_TYPE] and form["client_id"] == ["agent-7"]
    assert "Authorization" not in request.headers
    claims = verify(form["client_assertion"][0], key, alg)
    assert claims["iss"] == claims["sub"] == "agent-7"
    assert claims["aud"] == ISSUER  # the authorization server's issuer, as the MCP spec says
    assert claims["iat"] == 1_700_000_000 and claims["exp"] == 1_700_000_060
    assert isinstance(claims["jti"], str) and len(claims["jti"]) >= 16


def test_without_a_known_issuer_the_audience_is_the_token_endpoint() -> None:
    request = build_token_request(spec(), TOKEN_URL, pem_of(KEYS["ES256"]))
    claims = verify(parse_qs(request.body)["client_assertion"][0], KEYS["ES256"], "ES256")
    assert claims["aud"] == TOKEN_URL
    assert claims["exp"] - claims["iat"] == 60 and abs(claims["iat"] - time.time()) < 5


def test_every_assertion_has_its_own_jti() -> None:
    pem = pem_of(KEYS["EdDSA"])
    jtis = {verify(client_assertion(pem, "a", ISSUER, 0, f"j{i}"), KEYS["EdDSA"], "EdDSA")["jti"]
            for i in range(3)}
    assert len(jtis) == 3
    bodies = {parse_qs(build_token_request(spec(), TOKEN_URL, pem).body)["client_assertion"][0]
              for _ in range(3)}
    assert len(bodies) == 3


def test_an_explicit_signing_alg_is_used_when_it_fits_the_key() -> None:
    key = KEYS["RS256"]
    request = build_token_request(spec(signing_alg="PS256"), TOKEN_URL, pem_of(key), issuer=ISSUER)
    verify(parse_qs(request.body)["client_assertion"][0], key, "PS256")


@pytest.mark.parametrize(("alg", "key"), [("ES256", "EdDSA"), ("ES384", "ES256"), ("EdDSA", "RS256"),
                                          ("RS256", "ES384")])
def test_a_signing_alg_that_does_not_fit_the_key_is_refused(alg: str, key: str) -> None:
    with pytest.raises(TokenEndpointError) as info:
        build_token_request(spec(signing_alg=alg), TOKEN_URL, pem_of(KEYS[key]))
    assert info.value.error == "invalid_private_key" and f"signing_alg {alg} does not fit" in info.value.message


def test_the_default_algorithms() -> None:
    assert [algorithm_for(load_private_key(pem_of(k))) for k in KEYS.values()] == list(KEYS)
    p521 = ec.generate_private_key(ec.SECP521R1())
    claims = verify(client_assertion(pem_of(p521), "a", ISSUER, 0, "j"), p521, "ES512")
    assert claims["aud"] == ISSUER


def test_an_unsupported_key_is_refused_without_quoting_it() -> None:
    k1 = ec.generate_private_key(ec.SECP256K1())
    pem = pem_of(k1)
    with pytest.raises(TokenEndpointError) as info:
        client_assertion(pem, "a", ISSUER, 0, "j")
    assert info.value.error == "invalid_private_key" and "secp256k1" in info.value.message
    assert pem.splitlines()[1] not in info.value.message


# -- the real oidc-provider, through the sidecar

JWKS = {alg: public_jwk(key, f"k-{alg}", alg) for alg, key in KEYS.items()}
CLIENTS = {"ES256": "c-jwt-es256", "ES384": "c-jwt-es384", "EdDSA": "c-jwt-eddsa"}
OIDC_CLIENTS: list[dict[str, Any]] = [
    {"client_id": cid, "token_endpoint_auth_method": "private_key_jwt", "jwks": {"keys": [JWKS[alg]]},
     "scope": "tools:read"} for alg, cid in CLIENTS.items()
]


@pytest.fixture(scope="module")
def peer(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, 3600)


@pytest.fixture
def sidecar(peer: OidcPeer, tmp_path: Path) -> Iterator[SidecarProcess]:
    socket = tmp_path / "run" / "s.sock"
    config = tmp_path / "config.toml"
    servers = "".join(f"""
[[servers]]
name = "{alg.lower()}"
endpoint = "https://{alg.lower()}.example.com/mcp"
auth = {{ kind = "oauth2", issuer = "{peer.issuer}", client_id = "{cid}", private_key = "{{{{secret:KEY_{alg}}}}}", auth_method = "private_key_jwt", scopes = ["tools:read"] }}
""" for alg, cid in CLIENTS.items())
    servers += f"""
[[servers]]
name = "pinned"
endpoint = "https://pinned.example.com/mcp"
oauth = {{ token_url = "{peer.token_url}", client_id = "c-jwt-es256", private_key = "{{{{secret:KEY_ES256}}}}", auth_method = "private_key_jwt", signing_alg = "ES256" }}
"""
    config.write_text(f'[sidecar]\nsocket = "{socket}"\n[secrets]\nsources = ["env"]\n{servers}')
    env = {f"KEY_{alg}": pem_of(KEYS[alg]) for alg in CLIENTS}
    peer.reset_stats()
    with run_sidecar(config, socket, env) as proc:
        yield proc


def test_ec_and_ed25519_keys_log_in_at_the_real_authorization_server(peer: OidcPeer,
                                                                      sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        for alg in CLIENTS:
            assert client.headers(alg.lower())["Authorization"].startswith("Bearer ")
    assertions = peer.stats()["assertions"]
    for alg, cid in CLIENTS.items():
        # the issuer, found by discovery, is the audience; the assertion lives a minute
        assert assertions[cid] == {"alg": alg, "aud": peer.issuer, "lifetime": 60, "ok": True}
    # with a pinned token_url and no issuer, the audience is the token URL
    with Client(sidecar.socket) as client:
        client.headers("pinned")
    assert peer.stats()["assertions"]["c-jwt-es256"] == {"alg": "ES256", "aud": peer.token_url,
                                                         "lifetime": 60, "ok": True}
    log = sidecar.log
    for key in KEYS.values():
        assert pem_of(key).splitlines()[1] not in log
