"""A SigV4 resource: a real MCP server (the MCP Python SDK 2.x, Streamable HTTP under uvicorn) that
admits only requests signed with AWS Signature Version 4, checked by `verify` below: written from
the specification (AWS General Reference, "Create a signed AWS API request": canonical request,
string to sign, HMAC-SHA256 key derivation) with hashlib and hmac only; no botocore, no mcpcreds.

- `/mcp`: a request that fails verification gets 403 `{"error": <code>}`; a verified one reaches the
  SDK's app (tools `echo`, `add` of tests.peers.aauth_peer). The keys it accepts come from
  `$SIGV4_PEER_KEYS` (JSON: access key id -> [secret, session token or null]), the scope from
  `$SIGV4_PEER_SCOPE` ("region/service").
- `GET /_test/stats`: {"verified", "rejected": {code: n}, "keys": [access key ids verified],
  "signed_headers": the last verified request's, "tokens": session tokens presented}.
- `POST /_test/expire {"key": ID}`: from now on a request signed with that key gets API Gateway's
  answer to an expired session token: 403, `x-amzn-ErrorType: ExpiredTokenException:...`,
  `{"message": "The security token included in the request is expired"}` (counted as `expired_token`).
- `POST /_test/check`: {"method", "url", "headers": [[name, value], ...], "body": "<text>"} -> the
  verification of a request a test signed elsewhere (the `sign` route): {"ok"} or {"error"}.

Run it as ``python -m tests.peers.sigv4_peer``: it prints ``READY <base url>``.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import hashlib
import hmac
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from tests.peers.asgi import buffered, send_json, serve_on_loopback
from tests.peers.process import PeerHandle, ready_process

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

ROOT = Path(__file__).resolve().parents[2]
MAX_SKEW = 300  # seconds: AWS refuses a request whose X-Amz-Date is further than 5 minutes off
_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/,\s]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request,\s*"
                   r"SignedHeaders=([a-z0-9;\-]+),\s*Signature=([0-9a-f]{64})\Z")


class Rejected(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


def _trimall(value: str) -> str:
    return " ".join(value.strip().split())


def _uri_encode(text: str, slash: bool) -> str:
    return quote(text, safe="-_.~" + ("/" if slash else ""))


def canonical_uri(raw_path: str) -> str:
    """The path as sent (already percent-encoded once), encoded again: every service but S3
    double-encodes. Dot segments are refused rather than normalised (no client here sends them)."""
    path = raw_path or "/"
    if any(seg in (".", "..") for seg in path.split("/")):
        raise Rejected("dot_segment")
    return _uri_encode(path, slash=True)


def canonical_query(query: str) -> str:
    pairs = []
    for part in query.split("&") if query else []:
        name, _, value = part.partition("=")
        pairs.append((_uri_encode(unquote(name), False), _uri_encode(unquote(value), False)))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def verify(method: str, url: str, headers: list[tuple[str, str]], body: bytes, now: float,
           keys: Mapping[str, tuple[str, str | None]], region: str, service: str,
           require_content_sha256: bool = True) -> str:
    """The access key id of a request signed as SigV4 demands, or `Rejected(code)`."""
    lines = [(k.lower(), v) for k, v in headers]
    values: dict[str, list[str]] = {}
    for name, value in lines:
        values.setdefault(name, []).append(value)
    auth = values.get("authorization", [])
    match = _AUTH.match(auth[0]) if len(auth) == 1 else None
    if match is None:
        raise Rejected("missing_or_malformed_authorization")
    key_id, date, scope_region, scope_service, signed_list, signature = match.groups()
    if key_id not in keys:
        raise Rejected("unknown_access_key")
    if (scope_region, scope_service) != (region, service):
        raise Rejected("wrong_scope")
    signed = signed_list.split(";")
    if signed != sorted(set(signed)) or "host" not in signed or "x-amz-date" not in signed:
        raise Rejected("signed_headers")
    if any(name not in values for name in signed):
        raise Rejected("signed_header_missing")
    amz_date = values["x-amz-date"][0]
    try:
        when = calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise Rejected("bad_date") from None
    if amz_date[:8] != date or abs(now - when) > MAX_SKEW:
        raise Rejected("stale_or_future_date")
    secret, token = keys[key_id]
    if token is not None and (values.get("x-amz-security-token") != [token]
                              or "x-amz-security-token" not in signed):
        raise Rejected("security_token")
    payload = hashlib.sha256(body).hexdigest()
    if require_content_sha256 and ("x-amz-content-sha256" not in signed
                                   or values["x-amz-content-sha256"] != [payload]):
        raise Rejected("content_sha256")
    parts = urlsplit(url)
    canonical = "\n".join([
        method.upper(),
        canonical_uri(parts.path),
        canonical_query(parts.query),
        "".join(f"{name}:{','.join(_trimall(v) for v in values[name])}\n" for name in signed),
        signed_list,
        values["x-amz-content-sha256"][0] if "x-amz-content-sha256" in values else payload,
    ])
    string_to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, f"{date}/{region}/{service}/aws4_request",
                                hashlib.sha256(canonical.encode()).hexdigest()])
    expected = hmac.new(signing_key(secret, date, region, service), string_to_sign.encode(),
                        hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise Rejected("signature_mismatch")
    return key_id


class State:
    def __init__(self) -> None:
        raw = json.loads(os.environ.get("SIGV4_PEER_KEYS", "{}"))
        self.keys = {k: (v[0], v[1]) for k, v in raw.items()}
        self.region, _, self.service = os.environ.get("SIGV4_PEER_SCOPE", "us-east-1/execute-api").partition("/")
        self.verified = 0
        self.rejected: Counter[str] = Counter()
        self.key_ids: list[str] = []
        self.signed_headers: list[str] = []
        self.tokens = 0
        self.expired: set[str] = set()

    def snapshot(self) -> dict[str, Any]:
        return {"verified": self.verified, "rejected": dict(self.rejected), "keys": self.key_ids,
                "signed_headers": self.signed_headers, "tokens": self.tokens}

    def check(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes) -> str:
        return verify(method, url, headers, body, time.time(), self.keys, self.region, self.service)


def build_app(state: State) -> ASGIApp:
    from tests.peers.aauth_peer import build_server

    mcp_app = build_server().streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http":
            await mcp_app(scope, receive, send)
            return
        if path == "/_test/stats":
            await send_json(send, 200, state.snapshot())
            return
        if path == "/_test/expire":
            raw, _ = await buffered(receive)
            state.expired.add(json.loads(raw)["key"])
            await send_json(send, 200, {"ok": True})
            return
        if path == "/_test/check":
            raw, _ = await buffered(receive)
            ask = json.loads(raw)
            try:
                state.check(ask["method"], ask["url"], [tuple(h) for h in ask["headers"]], ask["body"].encode())
            except Rejected as exc:
                await send_json(send, 200, {"error": exc.error})
                return
            await send_json(send, 200, {"ok": True})
            return
        body, receive = await buffered(receive)
        lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        host = next((v for k, v in lines if k.lower() == "host"), "")
        raw_path = scope.get("raw_path", path.encode()).decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        url = f"{scope['scheme']}://{host}{raw_path}" + (f"?{query}" if query and "?" not in raw_path else "")
        try:
            key_id = state.check(scope["method"], url, lines, body)
        except Rejected as exc:
            state.rejected[exc.error] += 1
            await send_json(send, 403, {"error": exc.error})
            return
        if key_id in state.expired:
            state.rejected["expired_token"] += 1
            await send_json(send, 403, {"message": "The security token included in the request is expired"},
                            [(b"x-amzn-errortype",
                              b"ExpiredTokenException:http://internal.amazon.com/coral/com.amazon.coral.service/")])
            return
        state.verified += 1
        state.key_ids.append(key_id)
        state.tokens += any(k.lower() == "x-amz-security-token" for k, _ in lines)
        auth = next(v for k, v in lines if k.lower() == "authorization")
        state.signed_headers = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
        await mcp_app(scope, receive, send)

    return app


async def serve() -> None:
    await serve_on_loopback(lambda _port: build_app(State()))


class SigV4Peer(PeerHandle):
    def expire(self, key_id: str) -> None:
        self._http.post("/_test/expire", json={"key": key_id}).raise_for_status()

    def check(self, method: str, url: str, headers: list[tuple[str, str]], body: str) -> dict[str, Any]:
        return self._post("/_test/check", {"method": method, "url": url, "headers": headers, "body": body})


@contextlib.contextmanager
def start_sigv4_peer(keys: dict[str, tuple[str, str | None]], scope: str = "us-east-1/execute-api"
                     ) -> Iterator[SigV4Peer]:
    cmd = [sys.executable, "-m", "tests.peers.sigv4_peer"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "SIGV4_PEER_KEYS": json.dumps({k: list(v) for k, v in keys.items()}), "SIGV4_PEER_SCOPE": scope}
    with ready_process(lambda _: cmd, what="SigV4 peer", cwd=ROOT, timeout=30, env=env) as (_, base, workdir):
        peer = SigV4Peer(base, workdir)
        try:
            yield peer
        finally:
            peer.close()


if __name__ == "__main__":
    asyncio.run(serve())
