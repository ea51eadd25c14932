"""A real MCP server (the MCP Python SDK 2.x, Streamable HTTP) that demands OAuth bearer tokens.

It accepts only RFC 9068 JWT access tokens from one issuer, verified against that issuer's
JWKS (fetched once, fetched again for an unknown ``kid``), for its own resource URL (``aud``),
unexpired and not revoked. Tools: ``echo(text)`` and ``add(a, b)``.

Test controls are plain HTTP routes beside ``/mcp`` (no auth):

    GET  /_test/stats          -> {"requests", "by_method", "unauthorized", "rate_limited",
                                   "tool_calls", "tokens_seen", "jwks_fetches", "rejected", "posts"}
                               "posts": every POST to /mcp, in order, as {"at": time.monotonic()
                               once its body was read (before any answer), "method": its JSON-RPC
                               method, "status": the answer's}; monotonic time is one clock for
                               every process of the machine, so tests compare it with their own
    POST /_test/reset_stats
    POST /_test/revoke         {"jti": "..."} revokes one token; {"all": true} every token
                               issued before now (and every token seen so far)
    POST /_test/fail_429       {"count": N, "retry_after": S, "method": "tools/call"}: the next
                               N POSTs to /mcp of that JSON-RPC method (null: any POST) get a
                               429 with Retry-After: S (GETs, the SSE stream, are left alone)

Run it as ``python -m tests.peers.mcp_server --issuer URL --jwks-uri URL [--port 0]``: it
prints ``READY <mcp url>`` once it accepts connections. From a test, use::

    with start_mcp_server(peer.issuer, peer.jwks_uri) as mcp:
        mcp.url, mcp.stats(), mcp.revoke_all(), mcp.fail_next_with_429(1, retry_after=1)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import uvicorn
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from pydantic import AnyHttpUrl
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.peers.asgi import Fail429, buffered, rpc_methods
from tests.peers.process import PeerHandle, ready_process

READY_TIMEOUT = 60.0
ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------
# The server process
# --------------------------------------------------------------------------------------------


class ServerState:
    """Counters and switches shared by the verifier, the ASGI wrapper and the control routes."""

    def __init__(self) -> None:
        self.requests = 0
        self.by_method: Counter[str] = Counter()
        self.unauthorized = 0
        self.tool_calls = 0
        self.jwks_fetches = 0
        self.rejected: Counter[str] = Counter()  # why a token was refused
        self.tokens_seen: list[str] = []  # jti of every distinct token verified, in order
        self.posts: list[dict[str, Any]] = []  # every POST to /mcp: {"at", "method", "status"}
        self.revoked_jtis: set[str] = set()
        self.revoked_before = 0  # tokens with iat < this are revoked
        self.fail_429 = Fail429()

    def reset(self) -> None:
        self.requests = self.unauthorized = self.fail_429.refused = self.tool_calls = 0
        self.by_method.clear()
        self.rejected.clear()
        self.tokens_seen.clear()
        self.posts.clear()

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_method": dict(self.by_method),
            "unauthorized": self.unauthorized,
            "rate_limited": self.fail_429.refused,
            "tool_calls": self.tool_calls,
            "tokens_seen": list(self.tokens_seen),
            "jwks_fetches": self.jwks_fetches,
            "rejected": dict(self.rejected),
            "posts": [dict(post) for post in self.posts],
        }


def _jws_header(token: str) -> dict[str, Any]:
    head = token.split(".", 1)[0]
    return cast(dict[str, Any], json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))))


class JwtTokenVerifier:
    """An SDK `TokenVerifier` for RFC 9068 JWT access tokens from one issuer, for one resource."""

    def __init__(self, state: ServerState, issuer: str, jwks_uri: str, resource: str) -> None:
        self.state = state
        self.issuer = issuer
        self.jwks_uri = jwks_uri
        self.resource = resource
        self._jwks: dict[str, Any] | None = None

    async def _fetch_jwks(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.get(self.jwks_uri)
            response.raise_for_status()
        self.state.jwks_fetches += 1
        self._jwks = cast(dict[str, Any], response.json())
        return self._jwks

    async def _keys_for(self, kid: str | None) -> dict[str, Any]:
        jwks = self._jwks or await self._fetch_jwks()
        if kid is not None and not any(k.get("kid") == kid for k in jwks.get("keys", [])):
            jwks = await self._fetch_jwks()  # the issuer may have rotated its key
        return jwks

    def _reject(self, why: str) -> None:
        self.state.rejected[why] += 1

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            header = _jws_header(token)
        except (ValueError, UnicodeDecodeError):
            self._reject("malformed")
            return None
        if header.get("typ", "").lower() not in ("at+jwt", "application/at+jwt"):
            self._reject("typ")
            return None
        try:
            keys = KeySet.import_key_set(cast(Any, await self._keys_for(header.get("kid"))))
            decoded = jwt.decode(token, keys, algorithms=["RS256", "PS256", "ES256", "EdDSA"])
            jwt.JWTClaimsRegistry(
                iss={"essential": True, "value": self.issuer},
                aud={"essential": True, "value": self.resource},
                exp={"essential": True},
                client_id={"essential": True},
            ).validate(decoded.claims)
        except (JoseError, ValueError) as exc:
            self._reject(type(exc).__name__)
            return None
        claims = decoded.claims
        jti = str(claims.get("jti", ""))
        if jti in self.state.revoked_jtis or int(claims.get("iat", 0)) < self.state.revoked_before:
            self._reject("revoked")
            return None
        if jti not in self.state.tokens_seen:
            self.state.tokens_seen.append(jti)
        aud = claims["aud"]
        return AccessToken(
            token=token,
            client_id=str(claims["client_id"]),
            scopes=str(claims.get("scope", "")).split(),
            expires_at=int(claims["exp"]),
            resource=self.resource if isinstance(aud, list) else str(aud),
            subject=claims.get("sub"),
            claims={"iss": claims["iss"], "jti": jti},
        )


def build_app(state: ServerState, *, issuer: str, jwks_uri: str, resource: str,
              scopes: list[str] | None = None, cache_ttl_ms: int = 0) -> ASGIApp:
    """The SDK's Streamable HTTP app with bearer auth, wrapped by the test controls; `scopes`: the
    scopes a token must have, advertised as the metadata's `scopes_supported`; `cache_ttl_ms`: the
    2026-07-28 caching hints of its `tools/list` and `server/discover` (public, that long; 0: none)."""
    from mcp.server.caching import CacheHint

    hint = CacheHint(ttl_ms=cache_ttl_ms, scope="public")
    server: MCPServer[Any] = MCPServer(
        "mcpcreds-test-tools",
        cache_hints={"tools/list": hint, "server/discover": hint} if cache_ttl_ms else None,
        token_verifier=JwtTokenVerifier(state, issuer, jwks_uri, resource),
        auth=AuthSettings(issuer_url=AnyHttpUrl(issuer), resource_server_url=AnyHttpUrl(resource),
                          validate_token_resource=True, required_scopes=scopes),
        log_level="WARNING",
    )

    @server.tool()
    def echo(text: str) -> str:
        """Return the text unchanged."""
        state.tool_calls += 1
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        state.tool_calls += 1
        return a + b

    async def read_args(request: Request) -> dict[str, Any]:
        raw = await request.body()
        return cast(dict[str, Any], json.loads(raw)) if raw else {}

    @server.custom_route("/_test/stats", methods=["GET"])  # type: ignore[untyped-decorator]  # mcp leaves custom_route unannotated
    async def stats(request: Request) -> Response:
        return JSONResponse(state.snapshot())

    @server.custom_route("/_test/reset_stats", methods=["POST"])  # type: ignore[untyped-decorator]  # mcp leaves custom_route unannotated
    async def reset_stats(request: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    @server.custom_route("/_test/revoke", methods=["POST"])  # type: ignore[untyped-decorator]  # mcp leaves custom_route unannotated
    async def revoke(request: Request) -> Response:
        args = await read_args(request)
        if args.get("all"):
            # `iat` has whole seconds: tokens issued earlier in this second but already seen
            # are caught by their jti; one issued later in this second stays valid.
            state.revoked_before = int(time.time())
            state.revoked_jtis.update(state.tokens_seen)
        if args.get("jti"):
            state.revoked_jtis.add(str(args["jti"]))
        return JSONResponse({"revoked_before": state.revoked_before, "revoked_jtis": len(state.revoked_jtis)})

    @server.custom_route("/_test/fail_429", methods=["POST"])  # type: ignore[untyped-decorator]  # mcp leaves custom_route unannotated
    async def fail_429(request: Request) -> Response:
        state.fail_429.arm(await read_args(request))
        return JSONResponse({"ok": True})

    app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/mcp":
            await app(scope, receive, send)
            return
        state.requests += 1
        state.by_method[scope["method"]] += 1
        post: dict[str, Any] = {}
        if scope["method"] == "POST":
            body, receive = await buffered(receive)  # read the body to see the JSON-RPC method
            methods = rpc_methods(body)
            post = {"at": time.monotonic(), "method": methods[0] if len(methods) == 1 else None, "status": None}
            state.posts.append(post)
            if await state.fail_429.refuse(send, methods):
                post["status"] = 429
                return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                post["status"] = message["status"]
                if message["status"] == 401:
                    state.unauthorized += 1
            await send(message)

        await app(scope, receive, counting_send)

    return wrapped


async def serve(args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"
    state = ServerState()
    app = build_app(state, issuer=args.issuer, jwks_uri=args.jwks_uri, resource=args.resource or url,
                    scopes=args.scope or None, cache_ttl_ms=args.cache_ttl_ms)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task  # raises what stopped it
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.01)
    print(f"READY {url}", flush=True)
    await task


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--issuer", required=True)
    parser.add_argument("--jwks-uri", required=True)
    parser.add_argument("--resource", default=None, help="the expected `aud` (default: the server's URL)")
    parser.add_argument("--scope", action="append", default=[],
                        help="a scope every token must have, advertised in the metadata (repeat)")
    parser.add_argument("--cache-ttl-ms", type=int, default=0,
                        help="mark tools/list and server/discover public for this long (default 0: no hints)")
    asyncio.run(serve(parser.parse_args(argv)))


# --------------------------------------------------------------------------------------------
# The test-side handle
# --------------------------------------------------------------------------------------------


class McpServerPeer(PeerHandle):
    """A running MCP server process. Use start_mcp_server() to create one."""

    def __init__(self, proc: subprocess.Popen[str], url: str, workdir: Path) -> None:
        super().__init__(url.rsplit("/", 1)[0], workdir)
        self.proc = proc
        self.url = url

    def reset_stats(self) -> None:
        self._post("/_test/reset_stats", {})

    def revoke(self, jti: str) -> None:
        self._post("/_test/revoke", {"jti": jti})

    def revoke_all(self) -> None:
        """Refuse every token issued so far (a 401 for tokens that have not expired)."""
        self._post("/_test/revoke", {"all": True})

    def fail_next_with_429(self, n: int = 1, retry_after: float = 1, method: str | None = "tools/call") -> None:
        """Answer the next `n` POSTs of JSON-RPC `method` (None: any POST) with 429 + Retry-After."""
        self._post("/_test/fail_429", {"count": n, "retry_after": f"{retry_after:g}", "method": method})

    def stop(self) -> None:
        """Close the control client; the process ends with start_mcp_server's block."""
        self._http.close()


@contextlib.contextmanager
def start_mcp_server(issuer: str, jwks_uri: str, *, resource: str | None = None,
                     scopes: tuple[str, ...] = (), ready_timeout: float = READY_TIMEOUT,
                     cache_ttl_ms: int = 0) -> Iterator[McpServerPeer]:
    """Run the server for the duration of the with-block; yields an McpServerPeer."""
    cmd = [sys.executable, "-m", "tests.peers.mcp_server", "--port", "0", "--issuer", issuer,
           "--jwks-uri", jwks_uri, "--cache-ttl-ms", str(cache_ttl_ms)]
    if resource is not None:
        cmd += ["--resource", resource]
    for scope in scopes:
        cmd += ["--scope", scope]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with ready_process(lambda _: cmd, what="MCP server peer", cwd=ROOT, timeout=ready_timeout,
                       env=env) as (proc, url, workdir):
        peer = McpServerPeer(proc, url, workdir)
        try:
            yield peer
        finally:
            peer.stop()

if __name__ == "__main__":
    main()
