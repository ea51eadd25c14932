"""The gateway's loopback TCP listener (issue 14, `[gateway] listen`): the real MCP SDK client
(2.x here, 1.x in its side venv) through `http://127.0.0.1:PORT/mcp/{server}` of the real sidecar
to a real MCP server that demands a key only the sidecar holds; the caller's uid from the
kernel (a peer running as `nobody` is refused until a reload allows it); nothing but the gateway
on that port. The /proc/net/tcp(6) parser (the fallback where the kernel gives no sock_diag) is
tested on canned lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient
from mcpcreds.config.load import parse_config
from mcpcreds.config.model import ListenConfig
from mcpcreds.core.http import Request, Response
from mcpcreds.errors import ConfigError
from mcpcreds.sidecar.tcp_listener import EARLY_BYTES, LoopbackApp, PeerLookups, TcpConnection
from mcpcreds.sidecar.tcp_peer import (
    find_peer_uid,
    lookup_uid,
    parse_endpoint,
    parse_line,
    parse_table,
    proc_lookup_uid,
)
from mcpcreds.sidecar.wire import Connections
from tests.conftest import CANARY, run_cli
from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar
from tests.test_hardening_socket import NOBODY, SETPRIV
from tests.test_mcp_sdk_e2e import mcp1_python  # noqa: F401  (the side venv with MCP SDK 1.x)

ROOT = Path(__file__).resolve().parents[1]
STATIC_KEY = "STATIC-" + CANARY
ALL_TOOLS = {"echo", "add", "progress", "leak"}
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
RPC_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

pytestmark = pytest.mark.both_loops  # the listener's protocol on the sidecar's loop too


# ------------------------------------------------------------------------------------- the parser

# from a little-endian host: a listener on 127.0.0.1:8080, then both ends of one connection from
# 127.0.0.1:50000 (uid 1000) to it (the accepted end, uid 0)
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1513 1 0000 100 0 0 10 0
   1: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 2201 1 0000 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2202 1 0000 20 4 30 10 -1
   3: 0100007F:C351 0100007F:1F90 06 00000000:00000000 03:00000DAC 00000000     0        0 0 3 0000
"""
# [::1]:8080 <- [::1]:50000 (uid 1000), and an AF_INET6 socket of uid 1001 connected to an IPv4
# listener (its addresses IPv4-mapped: ::ffff:127.0.0.1)
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:C350 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 3301 1 0000 20 4 30 10 -1
   1: 0000000000000000FFFF00000100007F:C352 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 3302 1 0000 20 4 30 10 -1
"""


def ep(host: str, port: int) -> Any:
    import ipaddress

    return ipaddress.ip_address(host), port


def test_a_request_reads_each_header_by_its_lower_case_name_and_one_sent_twice_as_none_of_ours() -> None:
    request = Request("POST", "/mcp/x", "", b"", None, 0, 0,
                      headers=((b"Host", b"a"), (b" accept ", b"b"), (b"X-Two", b"1"), (b"x-two", b"2")))
    assert request.header_table() == {b"host": b"a", b"accept": b"b", b"x-two": b"\0"}
    request.headers = ((b"Origin", b"o"),)  # replaced: read again
    assert request.header_table() == {b"origin": b"o"}


def test_an_ipv4_line_is_read_as_the_kernel_wrote_it() -> None:
    entry = parse_line(TCP.splitlines()[2], "little")
    assert entry is not None
    assert entry.local == ep("127.0.0.1", 50000) and entry.remote == ep("127.0.0.1", 8080)
    assert entry.state == 0x01 and entry.uid == 1000
    assert parse_line(TCP.splitlines()[0], "little") is None  # the header
    assert parse_endpoint("0100007F:1F90", "little") == ep("127.0.0.1", 8080)
    assert parse_endpoint("7F000001:1F90", "big") == ep("127.0.0.1", 8080)  # each word in host order
    assert parse_endpoint("0A00A8C0:0050", "little") == ep("192.168.0.10", 80)


def test_an_ipv6_line_is_read_word_by_word_and_a_mapped_address_as_ipv4() -> None:
    entries = list(parse_table(TCP6, "little"))
    assert [(e.local, e.remote, e.uid) for e in entries] == [
        (ep("::1", 50000), ep("::1", 8080), 1000),
        (ep("127.0.0.1", 50002), ep("127.0.0.1", 8080), 1001),
    ]
    # 2001:db8::1 as four host-order words on a little-endian and on a big-endian host
    assert parse_endpoint("B80D0120000000000000000001000000:01BB", "little") == ep("2001:db8::1", 443)
    assert parse_endpoint("20010DB8000000000000000000000001:01BB", "big") == ep("2001:db8::1", 443)


def test_the_peer_is_the_established_socket_facing_ours() -> None:
    entries = [*parse_table(TCP, "little"), *parse_table(TCP6, "little")]
    ours = ep("127.0.0.1", 8080)
    assert find_peer_uid(entries, ep("127.0.0.1", 50000), ours) == 1000  # not 0, the accepted end's
    assert find_peer_uid(entries, ep("127.0.0.1", 50002), ours) == 1001  # an IPv6 socket, mapped
    assert find_peer_uid(entries, ep("::1", 50000), ep("::1", 8080)) == 1000
    assert find_peer_uid(entries, ep("127.0.0.1", 50001), ours) is None  # TIME_WAIT shows uid 0: refused
    assert find_peer_uid(entries, ep("127.0.0.1", 40000), ours) is None  # gone
    twice = [*entries, *parse_table(TCP.replace("  1000 ", "  1002 "), "little")]
    assert find_peer_uid(twice, ep("127.0.0.1", 50000), ours) is None  # ambiguous


@pytest.mark.parametrize("line", [
    "   1: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  -1 0 2201",
    "   1: 0100007F:C35 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000 0 2201",
    "   1: 0100007F0:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000 0 2201",
    "   1: 0x00007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000 0 2201",
    "   1: 0100007F:C350 0100007F:1F90 1 00000000:00000000 00:00000000 00000000  1000 0 2201",
    "   1: 0100007F:C350 0100007F:1F90 01",
    "",
])
def test_a_line_of_another_shape_is_skipped(line: str) -> None:
    assert parse_line(line, "little") is None


def test_the_real_table_names_the_uid_of_a_real_connection() -> None:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.create_server((host, 0), family=family) as server, \
                socket.socket(family) as client:
            client.connect(server.getsockname())
            accepted, _ = server.accept()
            with accepted:
                assert lookup_uid(accepted.getpeername(), accepted.getsockname()) == os.getuid()
                assert proc_lookup_uid(accepted.getpeername(), accepted.getsockname()) == os.getuid()
                assert proc_lookup_uid(accepted.getpeername(), accepted.getsockname(), tables=()) is None


# ------------------------------------------------------------------------------------- the config


@pytest.mark.parametrize(("listen", "host", "port"), [
    ("127.0.0.1:8080", "127.0.0.1", 8080), ("[::1]:1", "::1", 1), ("127.0.0.1:0", "127.0.0.1", 0),
    ("127.0.0.1:65535", "127.0.0.1", 65535),
])
def test_a_loopback_listen_address_is_taken(listen: str, host: str, port: int) -> None:
    assert parse_config({"gateway": {"listen": listen}}).gateway == ListenConfig(host, port)
    assert parse_config({}).gateway.host is None  # off by default


@pytest.mark.parametrize(("listen", "message"), [
    ("0.0.0.0:8080", "loopback address only"), ("[::]:8080", "loopback address only"),
    ("192.168.1.5:8080", "loopback address only"), ("[::ffff:127.0.0.1]:80", "loopback address only"),
    ("127.0.0.1:65536", "from 0 to 65535"), ("localhost:8080", 'expected "127.0.0.1:PORT"'),
    ("127.0.0.1", 'expected "127.0.0.1:PORT"'), ("sk-" + CANARY, 'expected "127.0.0.1:PORT"'),
])
def test_any_other_listen_address_is_a_config_error(listen: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"gateway": {"listen": listen}})
    assert len(refused.value.errors) == 1
    error = refused.value.errors[0]
    assert error.startswith("gateway.listen: ") and message in error and CANARY not in error


# ------------------------------------------------------------------------------------- the sidecar


@pytest.fixture(scope="module")
def peer() -> Iterator[GatewayPeer]:
    with start_gateway_peer("unused-token-", STATIC_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mcpcreds-gwtcp-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def config_text(workdir: Path, peer: GatewayPeer, allow_uids: str = "", listen: str = "127.0.0.1:0") -> str:
    return f"""
[sidecar]
socket = "{workdir / 'run' / 'mcpcreds.sock'}"
{allow_uids}

[gateway]
listen = "{listen}"

[secrets]
sources = ["env"]

[[servers]]
name = "tools"
endpoint = "{peer.url}"
headers = {{ "X-Api-Key" = "{{{{secret:STATIC_KEY}}}}" }}
trust = "trusted"
expose = "proxy"

[[servers]]
name = "other"
endpoint = "{peer.url}"
headers = {{ "X-Api-Key" = "{{{{secret:STATIC_KEY}}}}" }}
trust = "trusted"
"""


@pytest.fixture(scope="module")
def sidecar(peer: GatewayPeer, workdir: Path) -> Iterator[SidecarProcess]:
    config = workdir / "config.toml"
    config.write_text(config_text(workdir, peer))
    with run_sidecar(config, workdir / "run" / "mcpcreds.sock", {"STATIC_KEY": STATIC_KEY}) as proc:
        yield proc


def listening(sidecar: SidecarProcess) -> str:
    """The address the listener is bound to, from the `ready` log line (the port was 0)."""
    ready = next(e for line in sidecar.lines if (e := json.loads(line)).get("event") == "ready")
    return str(ready["gateway_listen"])


def base_url(sidecar: SidecarProcess) -> str:
    return f"http://{listening(sidecar)}"


class Recording(httpx2.AsyncBaseTransport):
    """Every header and body byte the client receives."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.received = bytearray()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        for name, value in response.headers.raw:
            self.received += name + b": " + value + b"\r\n"
        recorder, stream = self, response.stream

        class Stream(httpx2.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in stream:  # type: ignore[union-attr]
                    recorder.received += chunk
                    yield chunk

            async def aclose(self) -> None:
                await stream.aclose()  # type: ignore[union-attr]

        return httpx2.Response(response.status_code, headers=response.headers, stream=Stream(),
                               extensions=response.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


def value(result: Any) -> Any:
    assert not result.is_error, result
    return result.structured_content["result"]


async def test_sdk2_through_the_tcp_listener_keeps_its_session_and_never_sees_the_key(
        peer: GatewayPeer, sidecar: SidecarProcess) -> None:
    before = peer.stats()
    recording = Recording()
    async with (httpx2.AsyncClient(transport=recording) as http,
                streamable_http_client(f"{base_url(sidecar)}/mcp/tools", http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        assert {t.name for t in (await session.list_tools()).tools} == ALL_TOOLS
        assert value(await session.call_tool("add", {"a": 2, "b": 3})) == 5
        leaked = json.loads(value(await session.call_tool("leak", {})))
        assert leaked["x-api-key"] == "***"  # the server echoed the key it received: masked on the way back
    after = peer.stats()
    sessions = after["sessions"][len(before["sessions"]):]
    assert sessions[0] is None and sessions[1] and len(set(sessions[1:])) == 1  # one session throughout
    assert after["requests"]["DELETE"] == before["requests"].get("DELETE", 0) + 1
    assert after["unauthorized"] == before["unauthorized"]  # every request carried the sidecar's key
    assert dict(after["headers"])["x-api-key"] == STATIC_KEY
    assert recording.received and CANARY.encode() not in recording.received


def test_sdk1_through_the_tcp_listener(mcp1_python: Path, peer: GatewayPeer,  # noqa: F811
                                       sidecar: SidecarProcess) -> None:
    script = """
import asyncio, importlib.metadata, json, sys, warnings
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

async def main(url):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        async with streamablehttp_client(url) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            tools = sorted(t.name for t in (await session.list_tools()).tools)
            added = await session.call_tool("add", {"a": 2, "b": 3})
            echoed = await session.call_tool("echo", {"text": "again"})
    print(json.dumps({"mcp": importlib.metadata.version("mcp"), "tools": tools,
                      "add": added.structuredContent["result"], "echo": echoed.structuredContent["result"]}))

asyncio.run(main(sys.argv[1]))
"""
    before = peer.stats()
    proc = subprocess.run([str(mcp1_python), "-c", script, f"{base_url(sidecar)}/mcp/tools"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"mcp": out["mcp"], "tools": sorted(ALL_TOOLS), "add": 5, "echo": "again"}
    assert out["mcp"].startswith("1.")
    sessions = peer.stats()["sessions"][len(before["sessions"]):]
    assert sessions[0] is None and sessions[1] and len(set(sessions[1:])) == 1
    assert CANARY not in proc.stdout + proc.stderr


async def status_of_raw(sidecar: SidecarProcess, host_lines: str) -> int:
    """The status of a POST written by hand (what an HTTP client library will not send)."""
    host, port = listening(sidecar).rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    body = json.dumps(INIT).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in RPC_HEADERS.items())
    writer.write(f"POST /mcp/tools HTTP/1.1\r\n{host_lines}{head}Content-Length: {len(body)}\r\n\r\n".encode()
                 + body)
    try:
        return int((await reader.readline()).split()[1])
    finally:
        writer.close()


async def test_only_the_gateway_and_health_are_served_on_the_port(peer: GatewayPeer,
                                                                  sidecar: SidecarProcess) -> None:
    before = peer.stats()["requests"]
    async with httpx.AsyncClient(base_url=base_url(sidecar), timeout=30) as http:
        assert (await http.get("/v1/health")).json()["status"] == "ok"
        for method, path in (("GET", "/v1/status"), ("GET", "/metrics"), ("GET", "/v1/servers"),
                             ("GET", "/v1/servers/other/headers"), ("POST", "/v1/servers/other/call"),
                             ("POST", "/v1/grants"), ("GET", "/v1/openapi.json"), ("GET", "/"),
                             ("GET", "/%6Dcp/tools")):
            refused = await http.request(method, path)
            assert refused.status_code == 404, path
            assert STATIC_KEY not in refused.text and refused.json()["error"]["code"] == "not_found"
        # a web page reaching the port (DNS rebinding, a cross-site form) is refused before the upstream
        for headers in ({"Host": "attacker.example"}, {"Origin": "http://attacker.example"}):
            refused = await http.post("/mcp/tools", json=INIT, headers={**RPC_HEADERS, **headers})
            assert refused.status_code == 403 and refused.json()["error"]["data"]["code"] == "forbidden"
        ours = "localhost:" + listening(sidecar).rsplit(":", 1)[1]
        assert await status_of_raw(sidecar, f"Host: {ours}\r\nhost: {ours}\r\n") == 403  # sent twice: none of ours
        served = await http.post("/mcp/tools", json=INIT, headers={**RPC_HEADERS, "Host": ours})
        assert served.status_code == 200
    assert peer.stats()["requests"].get("POST", 0) == before.get("POST", 0) + 1  # the last one only


async def test_a_grant_is_presented_as_a_bearer_and_never_forwarded(peer: GatewayPeer,
                                                                    sidecar: SidecarProcess) -> None:
    async with AsyncClient(sidecar.socket) as creds:
        minted = await creds.grant(["tools"], ttl=60)
    async with httpx.AsyncClient(base_url=base_url(sidecar), timeout=30,
                                 headers={"Authorization": f"Bearer {minted['grant']}"}) as http:
        served = await http.post("/mcp/tools", json=INIT, headers=RPC_HEADERS)
        assert served.status_code == 200
        seen = dict(peer.stats()["headers"])
        assert seen["x-api-key"] == STATIC_KEY and "authorization" not in seen
        assert minted["grant"] not in json.dumps(seen)
        refused = await http.post("/mcp/other", json=INIT, headers=RPC_HEADERS)  # not in the grant
        assert refused.status_code == 403 and refused.json()["error"]["data"]["code"] == "forbidden"
    async with httpx.AsyncClient(base_url=base_url(sidecar), timeout=30,
                                 headers={"Authorization": "Bearer never-minted"}) as http:
        stale = await http.post("/mcp/tools", json=INIT, headers=RPC_HEADERS)
    assert stale.status_code == 403 and stale.json()["id"] == 0


NOBODY_CLIENT = r"""
import json, socket, sys
host, port = sys.argv[1].rsplit(":", 1)
body = sys.argv[2].encode()
sock = socket.create_connection((host.strip("[]"), int(port)), timeout=30)
sock.sendall(b"POST /mcp/tools HTTP/1.1\r\nHost: " + sys.argv[1].encode() + b"\r\nConnection: close\r\n"
             b"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n" % len(body) + body)
received, error = b"", None
try:
    while chunk := sock.recv(65536):
        received += chunk
except OSError as exc:
    error = type(exc).__name__
print(json.dumps({"received": received.decode("latin-1"), "error": error}))
"""


def as_nobody(sidecar: SidecarProcess) -> dict[str, Any]:
    proc = subprocess.run([*SETPRIV, "/usr/bin/python3", "-c", NOBODY_CLIENT, listening(sidecar), json.dumps(INIT)],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def reload(sidecar: SidecarProcess, text: str) -> None:
    sidecar.config.write_text(text)
    sidecar.signal(signal.SIGHUP)
    sidecar.wait_for("config reloaded")


def test_a_peer_of_another_uid_is_refused_until_allow_uids_has_it(peer: GatewayPeer, sidecar: SidecarProcess,
                                                                   workdir: Path) -> None:
    before = peer.stats()["requests"]
    refused = as_nobody(sidecar)
    assert refused["received"] == ""  # not a byte served
    entry = sidecar.wait_for("peer refused")
    assert entry["uid"] == NOBODY and entry["listener"] == "tcp"  # found in the kernel's table
    assert peer.stats()["requests"] == before  # nothing reached the upstream
    reload(sidecar, config_text(workdir, peer, allow_uids=f"allow_uids = [0, {NOBODY}]"))
    try:
        served = as_nobody(sidecar)
        assert served["received"].startswith("HTTP/1.1 200 "), served
        assert '"serverInfo"' in served["received"] and CANARY not in served["received"]
        assert peer.stats()["requests"]["POST"] == before.get("POST", 0) + 1
    finally:
        reload(sidecar, config_text(workdir, peer))
    assert as_nobody(sidecar)["received"] == ""


def test_a_changed_listen_address_waits_for_a_restart(peer: GatewayPeer, sidecar: SidecarProcess,
                                                       workdir: Path) -> None:
    address = listening(sidecar)
    reload(sidecar, config_text(workdir, peer, listen="127.0.0.1:1"))
    try:
        assert any(json.loads(line).get("event") == "gateway.listen changed: takes effect at the next restart"
                   for line in sidecar.lines)
        with httpx.Client(base_url=f"http://{address}", timeout=30) as http:
            assert http.get("/v1/health").status_code == 200  # still the listener it started with
    finally:
        reload(sidecar, config_text(workdir, peer))


def test_an_ipv6_loopback_listener(peer: GatewayPeer, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(config_text(tmp_path, peer, listen="[::1]:0"))
    with run_sidecar(config, tmp_path / "run" / "mcpcreds.sock", {"STATIC_KEY": STATIC_KEY}) as proc:
        address = listening(proc)
        assert address.startswith("[::1]:")
        with httpx.Client(base_url=f"http://{address}", timeout=30) as http:
            served = http.post("/mcp/tools", json=INIT, headers=RPC_HEADERS)
        assert served.status_code == 200 and CANARY not in served.text
        refused = as_nobody(proc)
        assert refused["received"] == "" and proc.wait_for("peer refused")["uid"] == NOBODY


def test_a_port_in_use_fails_the_start_clearly(peer: GatewayPeer, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        config = tmp_path / "config.toml"
        config.write_text(config_text(tmp_path, peer, listen=f"127.0.0.1:{port}"))
        proc = subprocess.run([sys.executable, "-m", "mcpcreds.cli.main", "serve", "--config", str(config)],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "STATIC_KEY": STATIC_KEY})
    assert proc.returncode == 1
    assert f"listen_failed: cannot listen on 127.0.0.1:{port} (gateway.listen)" in proc.stderr
    assert not (tmp_path / "run" / "mcpcreds.sock").exists()


# ------------------------------------------------------------------------------------- in process


class App:
    """Counts what reaches it, and answers each with `answer`."""

    def __init__(self, answer: bytes = b"{}") -> None:
        self.requests: list[Request] = []
        self.answer = answer

    def handle(self, request: Request) -> Response:
        self.requests.append(request)
        return Response(200, self.answer)

    def fast_get(self, url: bytes, started: float, peer_uid: int) -> bytes | None:
        return None

    def observe(self, route: str, status: int, seconds: float) -> None:
        pass


class Listener:
    """TcpConnections on a loopback port, each peer's uid looked up by `lookup` off the loop; an
    `App` behind them."""

    def __init__(self, lookup: Any, allow: frozenset[int], answer: bytes = b"{}") -> None:
        self.app = App(answer)
        self.connections = Connections()
        self.made: list[TcpConnection] = []
        self.loopback = LoopbackApp(self.app, frozenset({b"x"}))  # type: ignore[arg-type]
        self.lookups = PeerLookups(lookup)
        self.allow = allow

    def connection(self) -> TcpConnection:
        made = TcpConnection(self.loopback, lambda: self.allow, self.connections, self.lookups)
        self.made.append(made)
        return made


@asynccontextmanager
async def tcp_listener(lookup: Any, allow: frozenset[int],
                       answer: bytes = b"{}") -> AsyncIterator[tuple[Listener, int]]:
    listener = Listener(lookup, allow, answer)
    server = await asyncio.get_running_loop().create_server(listener.connection, "127.0.0.1", 0)
    try:
        yield listener, server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def serve_once(lookup: Any, allow: frozenset[int]) -> tuple[bytes, App, Connections]:
    """One request to a TcpConnection whose uid lookup is `lookup`: what came back."""
    async with tcp_listener(lookup, allow) as (listener, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /mcp/tools HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        try:
            received = await asyncio.wait_for(reader.read(), 30)
        except ConnectionResetError:
            received = b""
        writer.close()
    return received, listener.app, listener.connections


async def test_a_uid_that_cannot_be_found_is_refused_before_a_byte_is_read() -> None:
    seen: list[tuple[Any, Any]] = []

    def not_found(peer: Any, ours: Any) -> int | None:
        seen.append((peer, ours))
        return None

    received, app, connections = await serve_once(not_found, frozenset({0, os.getuid()}))
    assert received == b"" and app.requests == [] and not connections.open
    assert [(peer[0], ours[0]) for peer, ours in seen] == [("127.0.0.1", "127.0.0.1")]  # asked once

    received, app, _ = await serve_once(lambda peer, ours: os.getuid(), frozenset({os.getuid()}))
    assert received.startswith(b"HTTP/1.1 200 ") and len(app.requests) == 1
    assert app.requests[0].peer_uid == os.getuid() and app.requests[0].peer_pid == -1

    received, app, _ = await serve_once(lambda peer, ours: 4242, frozenset({os.getuid()}))
    assert received == b"" and app.requests == []


async def test_bytes_sent_while_the_uid_is_looked_up_are_bounded_and_never_answered_early() -> None:
    """uvloop reads a new connection whatever `connection_made` asked: a request sent at once (a
    large one too) is kept unparsed until the uid is known, then answered; a head that never ends
    is refused once read, never served."""
    release = threading.Event()

    def slow(peer: Any, ours: Any) -> int | None:
        release.wait(30)
        return os.getuid()

    try:
        async with tcp_listener(slow, frozenset({os.getuid()})) as (listener, port):
            app = listener.app
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = b'{"pad": "' + b"a" * 200_000 + b'"}'
            writer.write(b"POST /mcp/tools HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            flood_reader, flood = await asyncio.open_connection("127.0.0.1", port)
            flood.write(b"GET /mcp/tools HTTP/1.1\r\nX-Pad: " + b"a" * 40_000)
            await asyncio.sleep(0.3)  # time for a loop that reads early to have read and answered
            assert app.requests == []  # nothing parsed while the uid is unknown
            release.set()
            answer = await asyncio.wait_for(reader.read(), 30)
            assert answer.startswith(b"HTTP/1.1 200 ") and len(app.requests) == 1 and app.requests[0].body == body
            try:
                flooded = await asyncio.wait_for(flood_reader.read(), 30)
            except ConnectionResetError:
                flooded = b""
            assert flooded == b"" or flooded.startswith(b"HTTP/1.1 431 ")  # cut, or refused once read
            assert len(app.requests) == 1
            writer.close()
            flood.close()
    finally:
        release.set()


async def test_answers_to_what_came_before_admission_keep_their_back_pressure() -> None:
    """Pipelined requests sent while the uid is looked up, by a client that never reads: their
    answers fill the write buffer, and reading stays paused once the connection is admitted (it
    was switched back on after them, and the sidecar read on while the buffer grew without end)."""
    release = threading.Event()

    def held(peer: Any, ours: Any) -> int | None:
        release.wait(30)
        return os.getuid()

    try:
        async with tcp_listener(held, frozenset({os.getuid()}), b"x" * 8000) as (listener, port):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            request = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
            writer.write(request * (200_000 // len(request)))
            await asyncio.sleep(0.3)
            release.set()
            for _ in range(300):  # until the admission has answered what was held
                if listener.made[0].write_paused:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            transport = listener.made[0].transport
            assert transport is not None and listener.made[0].write_paused and not transport.is_reading()
            writer.transport.abort()
    finally:
        release.set()


def test_what_a_peer_sends_before_its_uid_is_known_is_bounded() -> None:
    class Transport:
        aborted = paused = False

        def abort(self) -> None:
            self.aborted = True

        def pause_reading(self) -> None:
            self.paused = True

    connection = Listener(lambda peer, ours: None, frozenset({os.getuid()})).connection()
    transport = Transport()
    connection.transport = transport  # type: ignore[assignment]
    connection.data_received(b"a" * EARLY_BYTES)
    assert transport.paused and not transport.aborted  # one read's worth: kept, reading paused
    connection.data_received(b"a")
    assert transport.aborted  # more than a paused reader can have read: cut


def test_check_hints_at_expose_proxy_for_servers_that_keep_both(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[[servers]]\nname = "open"\nendpoint = "https://a.example/mcp"\n'
                      '[[servers]]\nname = "closed"\nendpoint = "https://a.example/mcp"\nexpose = "proxy"\n')
    result = run_cli("check", "--config", str(config))
    assert result.code == 0, result.output
    hints = [line for line in result.stderr.splitlines() if line.startswith("hint: ")]
    assert len(hints) == 1 and hints[0].startswith('hint: expose = "both" (the default) on open: ')
    assert 'expose = "proxy"' in hints[0] and "closed" not in hints[0]
