"""A hand-made token endpoint for fault injection: it stalls, fails, lies or redirects on demand.
It also serves RFC 9728 protected-resource metadata for discovery tests."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FaultIdp:
    def __init__(self) -> None:
        self.mode = "ok"
        self.hits: Counter[str] = Counter()
        self.release = threading.Event()
        self.stalled = threading.Event()  # set once a token request is held by "stall"
        self.expires_in = 3600  # the lifetime of the tokens of mode "ok"
        self.authorization_server = ""  # issuer named by the protected-resource metadata
        self.challenge_only = False  # hide the well-known PRM: only the 401 names it
        self.traceparents: list[str | None] = []  # the traceparent header of each token request
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.token_url = f"{self.base}/token"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json",
                      headers: dict[str, str] | None = None) -> None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the caller gave up
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(body)

            def do_GET(self) -> None:
                idp.hits[self.path] += 1
                if (self.path == "/.well-known/oauth-protected-resource/mcp" and not idp.challenge_only) or self.path == "/prm":
                    self._prm()
                else:
                    self._send(404, b"{}")

            def _prm(self) -> None:
                self._send(200, json.dumps({"resource": f"{idp.base}/mcp",
                                            "authorization_servers": [idp.authorization_server]}).encode())

            def do_POST(self) -> None:
                idp.hits[self.path] += 1
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if self.path == "/mcp":
                    self._send(401, b"{}", headers={
                        "WWW-Authenticate": f'Bearer resource_metadata="{idp.base}/prm"'})
                    return
                if self.path != "/token" and not self.path.startswith("/token/"):
                    self._send(404, b"{}")
                    return
                idp.traceparents.append(self.headers.get("traceparent"))
                mode = self.path.removeprefix("/token/") if self.path != "/token" else idp.mode  # per URL
                if mode == "stall":
                    idp.stalled.set()
                    idp.release.wait(30)
                    self._send(503, b"{}")
                elif mode == "500":
                    self._send(500, b"<html>internal error</html>", "text/html")
                elif mode == "garbage":
                    self._send(200, b"this is not json at all", "text/plain")
                elif mode == "huge":
                    pad = "x" * (1024 * 1024)
                    self._send(200, json.dumps({"access_token": "t", "pad": pad}).encode())
                elif mode == "redirect":
                    self._send(302, b"", headers={"Location": f"{idp.base}/elsewhere"})
                elif mode == "invalid_client":
                    self._send(401, b'{"error": "invalid_client"}')
                elif mode == "crlf":  # a header injection, if it were ever served
                    self._send(200, json.dumps({"access_token": "fault-token\r\nX-Injected: 1",
                                                "token_type": "Bearer", "expires_in": 3600}).encode())
                elif mode == "huge_exp":  # a JWT whose exp no float can hold
                    self._send(200, json.dumps({"access_token": _jwt({"exp": 10**400}), "token_type": "Bearer",
                                                "expires_in": 3600}).encode())
                elif mode == "gzip":  # compressed although the request asked for identity
                    body = gzip.compress(json.dumps({"access_token": "fault-token-gzip", "expires_in": 60}).encode())
                    self._send(200, body, headers={"Content-Encoding": "gzip"})
                elif mode == "no_expires":
                    self._send(200, b'{"access_token": "fault-token-no-expiry", "token_type": "Bearer"}')
                else:
                    n = idp.hits["/token"]
                    self._send(200, json.dumps({"access_token": f"fault-token-{n}", "token_type": "Bearer",
                                                "expires_in": idp.expires_in}).encode())

        return Handler


def _jwt(claims: dict[str, Any]) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.sig"


@contextmanager
def fault_idp() -> Iterator[FaultIdp]:
    idp = FaultIdp()
    try:
        yield idp
    finally:
        idp.stop()
