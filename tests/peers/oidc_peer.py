"""Start/stop a real OAuth 2.0 authorization server (oidc-provider 9 on Node) for tests.

Usage::

    priv_pem, pub_jwk = make_rsa_keypair()
    clients = [
        {"client_id": "a", "client_secret": "s", "token_endpoint_auth_method": "client_secret_basic",
         "scope": "tools:read tools:call"},
        {"client_id": "k", "token_endpoint_auth_method": "private_key_jwt",
         "jwks": {"keys": [pub_jwk]}, "scope": "tools:read"},
    ]
    with start_oidc_peer(clients, access_token_ttl=5) as peer:
        peer.token_url, peer.jwks_uri, peer.stats(), peer.set_secret("a", "s2", keep_old=True) ...

Tokens requested with a ``resource`` (https://..., or http on 127.0.0.1/localhost) are
RFC 9068 JWTs with ``aud`` = resource; without ``resource`` they are opaque.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.peers.process import read_log, ready_process

PEER_DIR = Path(__file__).resolve().parent / "oidc"
NODE = shutil.which("node") or "/usr/bin/node"
READY_TIMEOUT = 60.0


def ensure_node_modules() -> None:
    """Install oidc-provider into tests/peers/oidc/node_modules if it is missing."""
    if (PEER_DIR / "node_modules" / "oidc-provider" / "package.json").exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm not found; needed to install the oidc-provider test peer")
    cmd = [npm, "ci"] if (PEER_DIR / "package-lock.json").exists() else [npm, "install"]
    subprocess.run(
        [*cmd, "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=PEER_DIR,
        check=True,
        timeout=300,
    )


def _b64url_uint(n: int) -> str:
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def make_rsa_keypair(kid: str | None = None) -> tuple[str, dict[str, Any]]:
    """Return (private key PEM, public JWK with kid/alg/use) for a private_key_jwt client."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")
    pub = key.public_key().public_numbers()
    jwk = {
        "kty": "RSA",
        "n": _b64url_uint(pub.n),
        "e": _b64url_uint(pub.e),
        "kid": kid or base64.urlsafe_b64encode(os.urandom(9)).decode("ascii"),
        "alg": "RS256",
        "use": "sig",
    }
    return pem, jwk


class OidcPeer:
    """A running oidc-provider process. Use start_oidc_peer() to create one."""

    def __init__(self, proc: subprocess.Popen[str], issuer: str, workdir: Path) -> None:
        self.proc = proc
        self.issuer = issuer
        self._workdir = workdir
        self._http = httpx.Client(base_url=issuer, timeout=10.0)
        meta = self._http.get("/.well-known/oauth-authorization-server")
        meta.raise_for_status()
        self.metadata: dict[str, Any] = meta.json()
        self.token_url: str = self.metadata["token_endpoint"]
        self.jwks_uri: str = self.metadata["jwks_uri"]

    def jwks(self) -> dict[str, Any]:
        resp = self._http.get(self.jwks_uri)
        resp.raise_for_status()
        return cast(dict[str, Any], resp.json())

    def _post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        resp = self._http.post(path, json=body or {})
        resp.raise_for_status()
        return cast(dict[str, Any], resp.json())

    def stats(self) -> dict[str, Any]:
        """{"token_requests": N, "token_issued": N, "by_client": {client_id: N}}."""
        resp = self._http.get("/_test/stats")
        resp.raise_for_status()
        return cast(dict[str, Any], resp.json())

    def reset_stats(self) -> None:
        self._post("/_test/reset_stats")

    def set_secret(self, client_id: str, secret: str, keep_old: bool = False) -> None:
        self._post(f"/_test/clients/{client_id}/secret", {"client_secret": secret, "keep_old": keep_old})

    def drop_old(self, client_id: str) -> None:
        self._post(f"/_test/clients/{client_id}/drop_old")

    def set_ttl(self, seconds: int) -> None:
        self._post("/_test/ttl", {"seconds": seconds})

    def log(self) -> str:
        """The server's stderr so far (warnings, server errors)."""
        return read_log(self._workdir)

    def stop(self) -> None:
        """Close the control client; the process ends with start_oidc_peer's block."""
        self._http.close()


@contextlib.contextmanager
def start_oidc_peer(
    clients: list[dict[str, Any]],
    access_token_ttl: int = 5,
    port: int = 0,
    ready_timeout: float = READY_TIMEOUT,
    attempts: int = 2,
) -> Iterator[OidcPeer]:
    """Run the peer for the duration of the with-block; yields an OidcPeer. A start that stalls
    (no READY line within `ready_timeout`, the process alive) is tried again, `attempts` in all."""
    ensure_node_modules()

    def command(workdir: Path) -> list[str]:
        cfg = workdir / "cfg.json"
        cfg.write_text(json.dumps({"port": port, "access_token_ttl": access_token_ttl, "clients": clients}))
        return [NODE, str(PEER_DIR / "server.mjs"), str(cfg)]

    with contextlib.ExitStack() as stack:
        for attempt in range(1, attempts + 1):
            try:
                proc, issuer, workdir = stack.enter_context(
                    ready_process(command, what="oidc peer", cwd=PEER_DIR, timeout=ready_timeout))
                break
            except RuntimeError as exc:
                # once in a suite run of this machine, node started and then printed nothing for
                # 90 s (alive, no error): a peer that stalls so is stopped and started again
                if attempt == attempts or "(process still running)" not in str(exc):
                    raise
                print(f"oidc peer: attempt {attempt} stalled, starting another: {str(exc)[:300]}",
                      file=sys.stderr)
        peer = OidcPeer(proc, issuer, workdir)
        try:
            yield peer
        finally:
            peer.stop()


_FORM = re.compile(r"<form\b([^>]*)>(.*?)</form>", re.S | re.I)
_ATTR = re.compile(r'([a-z_]+)="([^"]*)"', re.I)
_INPUT = re.compile(r"<(?:input|button)\b([^>]*)>", re.I)


def _form_of(page: str) -> tuple[str, dict[str, str]] | None:
    """The first form of an oidc-provider page: its action and the fields a person would send
    (hidden inputs, the login and password boxes filled in, the submit button pressed)."""
    match = _FORM.search(page)
    if match is None:
        return None
    attrs = dict(_ATTR.findall(match.group(1)))
    fields: dict[str, str] = {}
    for raw in _INPUT.findall(match.group(2)):
        a = dict(_ATTR.findall(raw))
        name = a.get("name")
        if not name or name == "abort":
            continue
        if name == "login":
            fields[name] = "alice"
        elif name == "password":
            fields[name] = "any-password"
        elif name not in fields:
            fields[name] = a.get("value", "")
    return attrs.get("action", ""), fields


def approve_in_browser(url: str, max_steps: int = 12) -> httpx.Response:
    """Do what a person does in a browser at oidc-provider's devInteractions pages: open `url`,
    follow redirects, fill in the sign-in form (any login and password), press each submit
    button (the device code confirmation, consent), until a page without a form (the device
    flow's success page) or the client's redirect (followed too, as a browser would). Returns
    the last response."""
    with httpx.Client(follow_redirects=True, timeout=10.0) as browser:
        response = browser.get(url)
        for _ in range(max_steps):
            form = _form_of(response.text) if "html" in response.headers.get("content-type", "") else None
            if form is None:
                return response
            action, fields = form
            response = browser.post(httpx.URL(str(response.url)).join(action), data=fields)
        raise RuntimeError("the login did not finish within the expected number of pages")
