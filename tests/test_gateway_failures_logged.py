"""An upstream failure is one log line naming the server, never a secret: the real sidecar
(`mcpcreds serve`) relays to loopback upstreams that refuse the connection, answer HTTP 502,
never answer, or present a certificate nobody signed, and to a server whose token endpoint fails.
Each request gets the gateway's error, and the sidecar's log has exactly one WARNING line for it;
the API key and client secret configured for them appear nowhere in the log."""

from __future__ import annotations

import datetime
import json
import shutil
import socket
import socketserver
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CANARY
from tests.sidecar_proc import run_sidecar
from tests.test_egress import _cert

API_KEY = "api-key-" + CANARY
CLIENT_SECRET = "client-secret-" + CANARY
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}}
RELEASE_WAIT = 60.0  # a stalled connection is let go at the end of the test, or after this at most


def read_request(rfile: Any) -> None:
    length = 0
    while (line := rfile.readline(65536)) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    rfile.read(length)


class Upstreams:
    """Loopback servers: one answers 502 (to the MCP request and to the token request alike), one
    reads the request and never answers, one speaks TLS with a self-signed certificate; and a
    bound port that listens not, so a connection to it is refused."""

    def __init__(self, folder: Path) -> None:
        self.release = threading.Event()
        cert, key = _cert(folder, "localhost")
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(cert, key)
        release = self.release

        class BadGateway(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                read_request(self.rfile)
                body = b"<html><body>502 Bad Gateway</body></html>"
                self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body))

        class Stalled(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                read_request(self.rfile)
                release.wait(RELEASE_WAIT)

        class SelfSigned(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    with tls.wrap_socket(self.request, server_side=True) as conn:
                        conn.recv(1)
                except (ssl.SSLError, OSError):  # the sidecar refuses the certificate
                    pass

        self.servers = [socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
                        for handler in (BadGateway, Stalled, SelfSigned)]
        for server in self.servers:
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.bad_gateway, self.stalled, self.self_signed = (s.server_address[1] for s in self.servers)
        self.closed = socket.socket()
        self.closed.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused
        self.refused = self.closed.getsockname()[1]

    def close(self) -> None:
        self.release.set()
        for server in self.servers:
            server.shutdown()
            server.server_close()
        self.closed.close()


@pytest.fixture
def upstreams() -> Iterator[Upstreams]:
    folder = Path(tempfile.mkdtemp(prefix="mcpcreds-up-"))
    servers = Upstreams(folder)
    try:
        yield servers
    finally:
        servers.close()
        shutil.rmtree(folder, ignore_errors=True)


def keyed(name: str, endpoint: str, extra: str = "") -> str:
    return f"""
[[servers]]
name = "{name}"
endpoint = "{endpoint}"
headers = {{ "X-Api-Key" = "{{{{secret:API_KEY}}}}" }}
trust = "trusted"
{extra}
"""


def config_text(up: Upstreams, folder: Path) -> str:
    return f"""
[sidecar]
socket = "{folder / 'mcpcreds.sock'}"
[secrets]
sources = ["env"]
{keyed("refused", f"http://127.0.0.1:{up.refused}/mcp?view=in-the-query")}
{keyed("bad-gateway", f"http://127.0.0.1:{up.bad_gateway}/mcp")}
{keyed("stalled", f"http://127.0.0.1:{up.stalled}/mcp", 'timeout = "1s"')}
{keyed("bad-tls", f"https://127.0.0.1:{up.self_signed}/mcp", 'allow_private = ["127.0.0.1"]')}

[services.idp-down]
endpoint = "http://127.0.0.1:{up.bad_gateway}/api"
[services.idp-down.oauth]
token_url = "http://127.0.0.1:{up.bad_gateway}/token"
client_id = "agent"
client_secret = "{{{{secret:CLIENT_SECRET}}}}"

[[servers]]
name = "login-down"
service = "idp-down"
trust = "trusted"
"""


EXPECTED = {
    "refused": ('upstream "refused" failed: connect error (connection refused)', "connect_error", 502),
    "bad-gateway": ('upstream "bad-gateway" failed: answered HTTP 502', "http_error", 502),
    "stalled": ('upstream "stalled" failed: timed out after 1s (no answer)', "timeout", 504),
    "bad-tls": ('upstream "bad-tls" failed: TLS error (CERTIFICATE_VERIFY_FAILED)', "tls_error", 502),
}


def test_each_upstream_failure_is_one_warning_naming_the_server_and_no_secret(upstreams: Upstreams) -> None:
    folder = Path(tempfile.mkdtemp(prefix="mcpcreds-fail-"))
    folder.chmod(0o700)
    try:
        config = folder / "config.toml"
        config.write_text(config_text(upstreams, folder))
        answers: dict[str, httpx.Response] = {}
        env = {"API_KEY": API_KEY, "CLIENT_SECRET": CLIENT_SECRET}
        with (run_sidecar(config, folder / "mcpcreds.sock", env) as sidecar,
              httpx.Client(transport=httpx.HTTPTransport(uds=str(sidecar.socket)), base_url="http://mcpcreds",
                           headers={"Accept": "application/json, text/event-stream"}, timeout=30) as http):
            for name in (*EXPECTED, "login-down"):
                answers[name] = http.post(f"/mcp/{name}", json=INIT)
        # the sidecar is stopped: every line the requests caused has been read
        entries = [json.loads(line) for line in sidecar.log.splitlines()]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert CANARY not in sidecar.log
    assert "in-the-query" not in sidecar.log  # no URL, no query string
    failed = [e for e in entries if e["event"].startswith("upstream ")]
    for name, (event, failure, status) in EXPECTED.items():
        assert answers[name].status_code == status, (name, answers[name].text)
        mine = [e for e in failed if e.get("server") == name]
        assert len(mine) == 1, (name, mine)
        assert (mine[0]["event"], mine[0]["level"], mine[0]["logger"], mine[0]["failure"]) \
            == (event, "warning", "mcpcreds.gateway", failure)
        # the ISO-8601 time and the unix time are one instant
        stamp = datetime.datetime.fromisoformat(mine[0]["timestamp"].replace("Z", "+00:00"))
        assert stamp.timestamp() == pytest.approx(mine[0]["time"], abs=1e-6)
    assert next(e for e in failed if e.get("server") == "bad-gateway")["status"] == 502
    # the token endpoint failing: one line, naming the cache key, and the request never went upstream
    assert answers["login-down"].status_code == 502
    logins = [e for e in entries if e["event"].startswith("login failed")]
    assert len(logins) == 1 and logins[0]["key"] == "service:idp-down" and logins[0]["level"] == "warning"
    assert not [e for e in failed if e.get("server") == "login-down"]
    # nothing else warned of these failures a second time
    warnings = [e for e in entries if e["level"] in ("warning", "error")]
    assert len(warnings) == len(EXPECTED) + 1, warnings
