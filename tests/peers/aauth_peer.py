"""An AAuth resource: a real MCP server (the MCP Python SDK 2.x, Streamable HTTP under uvicorn) that
admits only requests signed as AAuth profiles HTTP Message Signatures, checked by
`tests.peers.aauth_verify` (http-message-signatures + http-sf + cryptography; no mcpcreds code).

- `/mcp`: a request that fails verification gets 401 with `WWW-Authenticate: AAuth` and
  `Signature-Error: error=<code>`; a verified one reaches the SDK's app. Tools: `echo`, `add`.
- `/strict/mcp`: like `/mcp`, but its verifier also demands `@scheme`, which the metadata does not
  name: the refusal says so (`Signature-Error: error=invalid_input, required_input=(...)`).
- `/token-required/mcp`: verifies the signature, then asks for an AAuth access token the sidecar
  does not have: 401 `WWW-Authenticate: AAuth requirement=auth-token`, `Signature-Error` absent.
- `/.well-known/aauth-resource.json`: with `components` (AAUTH_PEER_COMPONENTS), the resource's
  metadata asks for them (`additional_signature_components`, plus `@query-param`, which the
  sidecar cannot produce and leaves out) and the verifier demands them; without, 404.
- `GET /_test/stats`: {"verified", "rejected": {code: n}, "keys": [x of each verified key],
  "covered": [the components of the last verified request], "unsigned": requests with no signature,
  "seen": the last 64 requests checked, each {"path", "authorization", "signature_fields": which
  of Signature, Signature-Input, Signature-Key it carried}}. Any other path ending in `/mcp`
  (`/bearer/mcp`, ...) is served like `/mcp`.
- `POST /_test/check`: {"method", "url", "headers": [[name, value], ...], "body": "<text>"} -> the
  verification of a request a test signed elsewhere (for the `sign` route): {"ok"} or {"error"}.
- `/access/mcp`: a verified request without `Authorization` is served and its answer carries
  `AAuth-Access: access-N` (a resource token); later ones must present `Authorization: AAuth
  access-N` (covered by the signature: the verifier demands it), an unknown one gets 401
  (`WWW-Authenticate: AAuth error="invalid_token"`; `POST /_test/access/forget` makes every token
  unknown). Stats: "access_issued", "access_presented", "access_refused".
- An Agent Provider under `/provider` (issuer `<base>/provider`, built on joserfc):
  `/.well-known/aauth-agent.json` (issuer, jwks_uri, registration_endpoint), `/provider/jwks`, and
  `POST /provider/register`: a request signed with `sig=hwk` (verified as above) that carries
  `Authorization: Bearer $AAUTH_PEER_ENROLL` gets `{"agent_token"}`, an `aa-agent+jwt` (Ed25519)
  whose `cnf.jwk` is the key that signed, valid `ttl` seconds (300; `POST /_test/provider {"ttl"}`).
  The resource accepts `sig=jwt` with such a token (its JWS, iss and exp checked with joserfc).
  Stats add "schemes": {scheme: n}, "tokens_issued", "enroll_refused".

Run it as ``python -m tests.peers.aauth_peer``: it prints ``READY <base url>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

from tests.peers.aauth_verify import Rejected, verify
from tests.peers.asgi import buffered, send_json, serve_on_loopback
from tests.peers.process import PeerHandle, ready_process

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[2]
SIGNATURE_FIELDS = frozenset({"signature", "signature-input", "signature-key"})


class State:
    def __init__(self) -> None:
        self.verified = 0
        self.rejected: Counter[str] = Counter()
        self.unsigned = 0
        self.keys: list[str] = []
        self.covered: list[str] = []
        self.schemes: Counter[str] = Counter()
        self.digested = 0  # verified requests whose Content-Digest was covered (and matched the body)
        self.access_tokens: set[str] = set()
        self.access_issued = 0
        self.access_presented = 0
        self.access_refused = 0
        # the last requests checked: path, the Authorization header, which signature fields came
        self.seen: deque[dict[str, Any]] = deque(maxlen=64)
        self.tokens_issued = 0
        self.last_token = ""  # the last agent token issued (a test checks it is written nowhere)
        self.enroll_refused = 0
        self.ttl = 300
        self.provider_key = OKPKey.generate_key("Ed25519", parameters={"kid": "provider-1"})
        # the resource's additional_signature_components (its aauth-resource.json), from the environment
        self.components = [c for c in os.environ.get("AAUTH_PEER_COMPONENTS", "").split() if c]
        self.metadata_fetched = 0
        self.issuer = ""  # <base>/provider, once the port is known

    def snapshot(self) -> dict[str, Any]:
        return {"verified": self.verified, "rejected": dict(self.rejected), "keys": self.keys,
                "covered": self.covered, "unsigned": self.unsigned, "schemes": dict(self.schemes),
                "tokens_issued": self.tokens_issued, "enroll_refused": self.enroll_refused,
                "digested": self.digested, "access_issued": self.access_issued,
                "metadata_fetched": self.metadata_fetched, "last_token": self.last_token,
                "access_refused": self.access_refused, "seen": list(self.seen),
                "access_presented": self.access_presented}

    def token_jwk(self, token: str) -> dict[str, Any]:
        """The key an agent token binds, if the token is this provider's and unexpired."""
        try:
            claims = jwt.decode(token, self.provider_key, algorithms=["Ed25519"]).claims
        except (JoseError, ValueError) as exc:
            raise Rejected("invalid_key", f"agent token refused ({type(exc).__name__})") from None
        if claims.get("iss") != self.issuer or not isinstance(claims.get("exp"), int) or claims["exp"] <= time.time():
            raise Rejected("invalid_key", "agent token of another issuer, or expired")
        return dict(claims["cnf"]["jwk"])

    def issue(self, jwk: dict[str, str]) -> str:
        self.tokens_issued += 1
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": f"aauth:agent-{self.tokens_issued}", "jti": f"t{self.tokens_issued}",
                  "iat": now, "exp": now + self.ttl, "dwk": "aauth-agent.json", "cnf": {"jwk": jwk}}
        self.last_token = jwt.encode({"alg": "Ed25519", "typ": "aa-agent+jwt", "kid": "provider-1"}, claims,
                                     self.provider_key, algorithms=["Ed25519"])
        return self.last_token


def build_server() -> MCPServer[Any]:
    from mcp.server.mcpserver import MCPServer

    server: MCPServer[Any] = MCPServer("aauth-peer", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return server


def build_app(state: State) -> ASGIApp:
    mcp_app = build_server().streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")

    def required_of(scope: Scope) -> list[str]:  # /strict/: one more than the metadata says
        return [*state.components, "@scheme"] if scope.get("path", "").startswith("/strict/") else state.components

    def check(scope: Scope, body: bytes) -> Rejected | None:
        lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        host = next((v for k, v in lines if k.lower() == "host"), "")
        query = scope.get("query_string", b"").decode("latin-1")
        url = f"{scope['scheme']}://{host}{scope.get('raw_path', scope['path'].encode()).decode('latin-1')}"
        if query and "?" not in url:
            url += f"?{query}"
        if not any(k.lower() == "signature" for k, _ in lines):
            state.unsigned += 1
        fields = {k.lower(): v for k, v in lines}
        state.seen.append({"path": scope.get("path", ""), "authorization": fields.get("authorization"),
                           "signature_fields": sorted(SIGNATURE_FIELDS & set(fields))})
        try:
            verified = verify(scope["method"], url, lines, body, time.time(), token_jwk=state.token_jwk,
                              required=required_of(scope))
        except Rejected as exc:
            state.rejected[exc.error] += 1
            return exc
        state.verified += 1
        state.schemes[verified.scheme] += 1
        state.digested += "content-digest" in verified.covered
        state.keys.append(verified.jwk["x"])
        state.covered = verified.covered
        return None

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http":
            await mcp_app(scope, receive, send)
            return
        if path == "/_test/stats":
            await send_json(send, 200, state.snapshot())
            return
        if path == "/.well-known/aauth-resource.json":
            state.metadata_fetched += 1
            if not state.components:
                await send_json(send, 404, {"error": "not_found"})
                return
            await send_json(send, 200, {"issuer": state.issuer.removesuffix("/provider"),
                                        "additional_signature_components": [*state.components, "@query-param"]})
            return
        if path == "/provider/.well-known/aauth-agent.json":
            await send_json(send, 200, {"issuer": state.issuer, "jwks_uri": f"{state.issuer}/jwks",
                                        "registration_endpoint": f"{state.issuer}/register"})
            return
        if path == "/provider/jwks":
            await send_json(send, 200, {"keys": [state.provider_key.as_dict(private=False)]})
            return
        if path == "/_test/access/forget":  # the resource forgets the session tokens it gave
            state.access_tokens.clear()
            await send_json(send, 200, {"ok": True})
            return
        if path == "/_test/provider":
            raw, _ = await buffered(receive)
            state.ttl = int(json.loads(raw)["ttl"])
            await send_json(send, 200, {"ok": True})
            return
        if path == "/provider/register":
            raw, _ = await buffered(receive)
            lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
            host = next((v for k, v in lines if k.lower() == "host"), "")
            try:
                signed = verify("POST", f"{scope['scheme']}://{host}{path}", lines, raw, time.time())
            except Rejected as exc:
                await send_json(send, 401, {"error": exc.error})
                return
            enroll = os.environ.get("AAUTH_PEER_ENROLL")
            if enroll and dict((k.lower(), v) for k, v in lines).get("authorization") != f"Bearer {enroll}":
                state.enroll_refused += 1
                await send_json(send, 403, {"error": "enrollment_refused"})
                return
            jwk: dict[str, str] = {k: signed.jwk[k] for k in ("kty", "crv", "x", "y", "alg") if k in signed.jwk}
            await send_json(send, 200, {"agent_token": state.issue(jwk)})
            return
        if path == "/_test/check":
            raw, _ = await buffered(receive)
            ask = json.loads(raw)
            try:
                verify(ask["method"], ask["url"], [tuple(h) for h in ask["headers"]], ask["body"].encode(),
                       time.time(), token_jwk=state.token_jwk, required=state.components)
            except Rejected as exc:
                await send_json(send, 200, {"error": exc.error})
                return
            await send_json(send, 200, {"ok": True})
            return
        body, receive = await buffered(receive)
        failed = check(scope, body)
        if failed is not None:
            await send_json(send, 401, {"error": failed.error}, [
                (b"www-authenticate", b'AAuth'), (b"signature-error", signature_error(failed, required_of(scope)))])
            return
        if path == "/token-required/mcp":
            await send_json(send, 401, {"error": "auth_token_required"}, [
                (b"www-authenticate", b'AAuth requirement=auth-token; resource="aauth-peer"'),
                (b"aauth-requirement", b'requirement=auth-token; resource-token="eyJ.x.y"')])
            return
        if path == "/access/mcp":
            auth = dict((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]).get(
                "authorization")
            if auth is None:
                state.access_issued += 1
                token = f"access-{state.access_issued}-{os.urandom(8).hex()}"
                state.access_tokens.add(token)
                inner = send

                async def send(message: Message) -> None:  # the answer carries the resource's token
                    if message["type"] == "http.response.start":
                        message = {**message, "headers": [*message.get("headers", []),
                                                          (b"aauth-access", token.encode())]}
                    await inner(message)
            elif auth.removeprefix("AAuth ") in state.access_tokens:
                state.access_presented += 1
            else:
                state.access_refused += 1
                await send_json(send, 401, {"error": "invalid_access_token"},
                                [(b"www-authenticate", b'AAuth error="invalid_token"')])
                return
        await mcp_app({**scope, "path": "/mcp"} if path.endswith("/mcp") else scope, receive, send)

    return app


def signature_error(failed: Rejected, required: list[str]) -> bytes:
    """`Signature-Error` (the Signature-Key draft): invalid_input names every component required."""
    if failed.error != "invalid_input":
        return f"error={failed.error}".encode()
    names = " ".join(f'"{n}"' for n in ("@method", "@authority", "@path", "signature-key", *required))
    return f"error=invalid_input, required_input=({names})".encode()


async def serve() -> None:
    def make_app(port: int) -> Any:
        state = State()
        state.issuer = f"http://127.0.0.1:{port}/provider"
        return build_app(state)

    await serve_on_loopback(make_app)


class AAuthPeer(PeerHandle):
    def check(self, method: str, url: str, headers: list[tuple[str, str]], body: str) -> dict[str, Any]:
        return self._post("/_test/check", {"method": method, "url": url, "headers": headers, "body": body})

    def forget_access_tokens(self) -> None:
        self._http.post("/_test/access/forget").raise_for_status()

    def set_token_ttl(self, ttl: int) -> None:
        self._http.post("/_test/provider", json={"ttl": ttl}).raise_for_status()


@contextlib.contextmanager
def start_aauth_peer(enroll: str = "", components: tuple[str, ...] = ()) -> Iterator[AAuthPeer]:
    cmd = [sys.executable, "-m", "tests.peers.aauth_peer"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "AAUTH_PEER_ENROLL": enroll, "AAUTH_PEER_COMPONENTS": " ".join(components)}
    with ready_process(lambda _: cmd, what="AAuth peer", cwd=ROOT, timeout=30, env=env) as (_, base, workdir):
        peer = AAuthPeer(base, workdir)
        try:
            yield peer
        finally:
            peer.close()


if __name__ == "__main__":
    asyncio.run(serve())
