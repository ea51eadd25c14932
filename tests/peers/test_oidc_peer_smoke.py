"""Smoke test: the oidc-provider peer issues RFC 9068 JWT access tokens to authlib clients."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from authlib.deprecate import AuthlibDeprecationWarning  # installs its own "always" filter

with warnings.catch_warnings():
    warnings.simplefilter("ignore", AuthlibDeprecationWarning)  # "use httpx2 instead"
    from authlib.integrations.base_client.errors import OAuthError
    from authlib.integrations.httpx_client import OAuth2Client
    from authlib.oauth2.rfc7523 import PrivateKeyJWT
from joserfc import jwt
from joserfc.jwk import KeySet

from tests.peers.oidc_peer import OidcPeer, make_rsa_keypair, start_oidc_peer

RESOURCE = "http://127.0.0.1:9999/mcp"
SCOPE = "tools:read tools:call"

PRIV_PEM, PUB_JWK = make_rsa_keypair(kid="smoke-key")
CLIENTS: list[dict[str, Any]] = [
    {
        "client_id": "c-basic",
        "client_secret": "basic-secret-1",
        "token_endpoint_auth_method": "client_secret_basic",
        "scope": SCOPE,
    },
    {
        "client_id": "c-post",
        "client_secret": "post-secret-1",
        "token_endpoint_auth_method": "client_secret_post",
        "scope": SCOPE,
    },
    {
        "client_id": "c-jwt",
        "token_endpoint_auth_method": "private_key_jwt",
        "jwks": {"keys": [PUB_JWK]},
        "scope": SCOPE,
    },
]


@pytest.fixture(scope="module")
def peer() -> Iterator[OidcPeer]:
    with start_oidc_peer(CLIENTS, access_token_ttl=5) as p:
        yield p


def _client(peer: OidcPeer, client_id: str, secret: str | None = None) -> OAuth2Client:
    if client_id == "c-jwt":
        client = OAuth2Client(client_id, PRIV_PEM, token_endpoint_auth_method="private_key_jwt")
        client.register_client_auth_method(
            PrivateKeyJWT(peer.token_url, headers={"kid": PUB_JWK["kid"]}, alg="RS256")
        )
        return client
    method = "client_secret_basic" if client_id == "c-basic" else "client_secret_post"
    return OAuth2Client(client_id, secret, token_endpoint_auth_method=method)


def _fetch(peer: OidcPeer, client_id: str, secret: str | None = None) -> dict[str, Any]:
    with _client(peer, client_id, secret) as client:
        return dict(
            client.fetch_token(
                peer.token_url,
                grant_type="client_credentials",
                scope=SCOPE,
                resource=RESOURCE,
            )
        )


def _verify(peer: OidcPeer, token: str) -> dict[str, Any]:
    keys = KeySet.import_key_set(peer.jwks())  # type: ignore[arg-type]
    decoded = jwt.decode(token, keys)
    assert decoded.header["typ"] == "at+jwt"
    return dict(decoded.claims)


@pytest.mark.parametrize(
    ("client_id", "secret"),
    [("c-basic", "basic-secret-1"), ("c-post", "post-secret-1"), ("c-jwt", None)],
)
def test_client_credentials_jwt_token(peer: OidcPeer, client_id: str, secret: str | None) -> None:
    token = _fetch(peer, client_id, secret)
    assert token["token_type"].lower() == "bearer"
    assert token["expires_in"] == 5
    claims = _verify(peer, token["access_token"])
    assert claims["aud"] == RESOURCE
    assert claims["iss"] == peer.issuer
    assert claims["client_id"] == client_id
    assert set(SCOPE.split()) <= set(claims["scope"].split())
    assert claims["exp"] - claims["iat"] == 5


def test_wrong_secret_is_invalid_client(peer: OidcPeer) -> None:
    with pytest.raises(OAuthError) as exc:
        _fetch(peer, "c-basic", "nope")
    assert exc.value.error == "invalid_client"


def test_disallowed_resource_is_invalid_target(peer: OidcPeer) -> None:
    with pytest.raises(OAuthError) as exc, _client(peer, "c-post", "post-secret-1") as client:
        client.fetch_token(
            peer.token_url, grant_type="client_credentials", scope=SCOPE, resource="http://example.com/mcp"
        )
    assert exc.value.error == "invalid_target"


def test_secret_rotation_and_stats(peer: OidcPeer) -> None:
    peer.reset_stats()
    peer.set_secret("c-post", "post-secret-2", keep_old=True)
    _fetch(peer, "c-post", "post-secret-1")
    _fetch(peer, "c-post", "post-secret-2")
    peer.drop_old("c-post")
    with pytest.raises(OAuthError) as exc:
        _fetch(peer, "c-post", "post-secret-1")
    assert exc.value.error == "invalid_client"
    _fetch(peer, "c-post", "post-secret-2")

    peer.set_secret("c-post", "post-secret-3")  # keep_old=False: old one stops at once
    with pytest.raises(OAuthError):
        _fetch(peer, "c-post", "post-secret-2")
    _fetch(peer, "c-post", "post-secret-3")
    peer.set_secret("c-post", "post-secret-1")  # restore for other tests

    stats = peer.stats()
    assert stats["token_requests"] == 6
    assert stats["token_issued"] == 4
    assert stats["by_client"] == {"c-post": 6}


def test_set_ttl(peer: OidcPeer) -> None:
    peer.set_ttl(30)
    try:
        token = _fetch(peer, "c-basic", "basic-secret-1")
        assert token["expires_in"] == 30
        claims = _verify(peer, token["access_token"])
        assert claims["exp"] - claims["iat"] == 30
    finally:
        peer.set_ttl(5)
