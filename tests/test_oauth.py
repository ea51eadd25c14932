"""The pure OAuth parts: request building, response parsing, refresh decision, backoff."""

from __future__ import annotations

import base64
import json
import random
from urllib.parse import parse_qs

import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from mcpcreds.config.model import LoginSpec
from mcpcreds.core.secret import REDACTOR
from mcpcreds.core.templates import parse_template
from mcpcreds.credentials.oauth import build_token_request, parse_token_response
from mcpcreds.credentials.tokens import Token, backoff_delay, refresh_at, usable_until
from mcpcreds.errors import TokenEndpointError
from tests.peers.oidc_peer import make_rsa_keypair

URL = "https://auth.example.com/token"


def spec(method: str = "client_secret_basic", **kw: object) -> LoginSpec:
    base: dict[str, object] = dict(
        grant="client_credentials", client_id="agent 7", client_secret=parse_template("{{secret:S}}"),
        private_key=None, auth_method=method, token_url=URL, issuer=None, scope="tools:read tools:call",
        resource="https://crm.example.com/mcp", audience="crm-api")
    base.update(kw)
    return LoginSpec(**base)  # type: ignore[arg-type]


def test_client_secret_basic_sends_every_parameter_and_a_basic_header() -> None:
    req = build_token_request(spec(), URL, "s3cr:et")
    form = parse_qs(req.body)
    assert form == {"grant_type": ["client_credentials"], "scope": ["tools:read tools:call"],
                    "resource": ["https://crm.example.com/mcp"], "audience": ["crm-api"]}
    user, _, password = base64.b64decode(req.headers["Authorization"][6:]).decode().partition(":")
    assert (user, password) == ("agent+7", "s3cr%3Aet")  # RFC 6749 §2.3.1 form-encoding
    assert req.headers["Content-Type"] == "application/x-www-form-urlencoded"


def test_client_secret_post_puts_credentials_in_the_body() -> None:
    req = build_token_request(spec("client_secret_post", audience=None), URL, "s3cret")
    form = parse_qs(req.body)
    assert form["client_id"] == ["agent 7"] and form["client_secret"] == ["s3cret"]
    assert "audience" not in form and "Authorization" not in req.headers


def test_private_key_jwt_signs_an_assertion_for_the_token_endpoint() -> None:
    pem, jwk = make_rsa_keypair(kid="k1")
    req = build_token_request(spec("private_key_jwt", client_secret=None), URL, pem)
    form = parse_qs(req.body)
    assert form["client_assertion_type"] == ["urn:ietf:params:oauth:client-assertion-type:jwt-bearer"]
    token = jwt.decode(form["client_assertion"][0], RSAKey.import_key(jwk))
    assert token.claims["iss"] == token.claims["sub"] == "agent 7"
    assert token.claims["aud"] == URL
    assert form["resource"] == ["https://crm.example.com/mcp"]


def ok(body: dict[str, object], status: int = 200) -> bytes:
    return json.dumps(body).encode()


def test_parse_success_registers_the_token_for_redaction() -> None:
    token = parse_token_response(200, "application/json",
                                 ok({"access_token": "tok-abcdef-123", "token_type": "bearer",
                                     "expires_in": 60, "scope": "a b"}), 1000.0, 300)
    assert (token.obtained_at, token.expires_at, token.scope) == (1000.0, 1060.0, "a b")
    assert len(token.fingerprint) == 8 and "tok-abcdef-123" in REDACTOR
    assert "tok-abcdef" not in repr(token)


def test_missing_expires_in_uses_the_default() -> None:
    token = parse_token_response(200, "", ok({"access_token": "t1234", "token_type": "Bearer"}), 0, 300)
    assert token.expires_at == 300


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (401, ok({"error": "invalid_client", "error_description": "secret SECRETVALUE wrong"}),
         "invalid_client"),
        (400, ok({"error": "invalid_target"}), "invalid_target"),
        (500, b"<html>oops SECRETVALUE</html>", "server_error"),
        (200, b"not json SECRETVALUE", "invalid_response"),
        (200, ok({"token_type": "Bearer"}), "invalid_response"),
        (200, ok({"access_token": "x1234", "token_type": "mac"}), "invalid_response"),
        (200, ok({"access_token": "x1234", "expires_in": "soon"}), "invalid_response"),
        (200, ok({"access_token": "x1234", "expires_in": -5}), "invalid_response"),
        (302, b"", "unexpected_redirect"),
        (400, ok({"error": "<script>alert(1)</script>"}), "invalid_response"),
    ],
)
def test_parse_errors_carry_the_code_never_the_body(status: int, body: bytes, error: str) -> None:
    with pytest.raises(TokenEndpointError) as info:
        parse_token_response(status, "application/json", body, 0, 300)
    assert info.value.error == error
    assert "SECRETVALUE" not in info.value.message and "<script>" not in info.value.message


def token(lifetime: float, obtained: float = 0.0) -> Token:
    return Token("t", "Bearer", obtained, obtained + lifetime, None, "00000000")


def test_refresh_ahead_is_capped_at_half_the_lifetime() -> None:
    assert refresh_at(token(3600), 60, 0.0) == 3540
    assert refresh_at(token(10), 60, 0.0) == 5  # half of a short lifetime
    assert refresh_at(token(3600), 60, 1.0) == pytest.approx(3534)  # jitter moves it earlier only
    assert usable_until(token(3600)) == 3598 and usable_until(token(10)) == 9.8
    assert refresh_at(token(15), 0.1, 0.0) == pytest.approx(15 - 0.3 - 0.05)  # before it is withheld
    assert usable_until(token(3)) == pytest.approx(2.9)


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    rng = random.Random(1)
    delays = [backoff_delay(n, rng) for n in range(1, 10)]
    for n, d in enumerate(delays, start=1):
        ceiling = min(60.0, 2.0 ** (n - 1))
        assert ceiling / 2 <= d <= ceiling


def test_a_jwt_exp_earlier_than_expires_in_wins() -> None:
    def b64(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    jwt_token = f"{b64({'alg': 'none'})}.{b64({'exp': 1003})}.sig"
    token = parse_token_response(200, "", ok({"access_token": jwt_token, "expires_in": 5}), 1000.4, 300)
    assert token.expires_at == 1003  # not 1005.4: expires_in is rounded and counted from receipt
    later = parse_token_response(200, "", ok({"access_token": jwt_token, "expires_in": 2}), 1000.0, 300)
    assert later.expires_at == 1002.0  # never later than expires_in says
    with pytest.raises(TokenEndpointError):
        parse_token_response(200, "", ok({"access_token": jwt_token, "expires_in": 60}), 1004.0, 300)


# -- person logins: the refresh token of an answer, public clients, the grants' own parameters


def test_a_refresh_token_in_the_answer_is_handed_over_and_registered_for_redaction() -> None:
    extras: dict[str, str] = {}
    parse_token_response(200, "", ok({"access_token": "at-123456", "refresh_token": "rt-abcdef-98765"}),
                         0, 300, extras)
    assert extras == {"refresh_token": "rt-abcdef-98765"} and "rt-abcdef-98765" in REDACTOR


@pytest.mark.parametrize("refresh", ["rt\r\nX-Injected: 1", 12345, "x" * (16 * 1024 + 1), "", None])
def test_an_unusable_refresh_token_is_dropped(refresh: object) -> None:
    extras: dict[str, str] = {}
    token = parse_token_response(200, "", ok({"access_token": "at-123456", "refresh_token": refresh}), 0, 300,
                                 extras)
    assert extras == {} and token.access_token == "at-123456"


def test_a_public_client_sends_its_id_and_no_secret() -> None:
    req = build_token_request(spec("none", client_secret=None), URL, None, grant_type="refresh_token",
                              params={"refresh_token": "rt"})
    form = parse_qs(req.body)
    assert form == {"grant_type": ["refresh_token"], "scope": ["tools:read tools:call"],
                    "resource": ["https://crm.example.com/mcp"], "audience": ["crm-api"],
                    "refresh_token": ["rt"], "client_id": ["agent 7"]}
    assert "Authorization" not in req.headers


def test_code_and_device_grants_send_no_scope_of_their_own() -> None:
    req = build_token_request(spec(), URL, "s", grant_type="authorization_code",
                              params={"code": "c", "redirect_uri": "http://127.0.0.1:5/callback",
                                      "code_verifier": "v"})
    form = parse_qs(req.body)
    assert "scope" not in form and form["code_verifier"] == ["v"] and form["grant_type"] == ["authorization_code"]
    assert req.headers["Authorization"].startswith("Basic ")
