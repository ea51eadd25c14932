"""A cold sidecar's first login imports nothing on the event loop: `oauth.prepare` (run off the
loop once the sidecar is ready) has loaded what the first token request would load, the HTTP
stack's lazily imported parts (httpcore, anyio's asyncio backend), which cost 0.1-0.3 s of the
first caller's wait before (bench/status_quo.py, bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys

FIRST_LOGIN = r"""
import asyncio, json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from mcpcreds.credentials import oauth
from mcpcreds.net.egress import EgressPolicy
from mcpcreds.net.egress_http import egress_client

class TokenEndpoint(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"access_token": "cold-token", "token_type": "Bearer", "expires_in": 60}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), TokenEndpoint)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/token"
if sys.argv[1] == "prepared":
    oauth.prepare()

async def first_login():
    async with egress_client(EgressPolicy(dev_loopback=True)) as http:
        before = set(sys.modules)
        request = oauth.TokenRequest(url, {"Content-Type": "application/x-www-form-urlencoded"},
                                     "grant_type=client_credentials")
        token = await oauth.send_token_request(http, request, time.time(), 60.0)
        assert token.access_token == "cold-token"
        return sorted(set(sys.modules) - before)

print(json.dumps(asyncio.run(first_login())))
server.shutdown()
"""


def imported_by_first_login(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", FIRST_LOGIN, mode], capture_output=True, text=True,
                         timeout=60, check=True)
    return list(json.loads(out.stdout))


def test_the_first_token_request_imports_nothing_once_prepared() -> None:
    assert imported_by_first_login("prepared") == []

