"""The egress proxy of `mcpcreds exec` against a hostile child holding its session's credential.

In process: a real `EgressProxy`, and an upstream in another process that answers with the very
head it received (so the test reads what the upstream was sent). End to end: a real sidecar with
its gateway's loopback TCP listener, and an exec entry that allows 127.0.0.1.

- Plain-HTTP forwarding sends the `Host` of the URL (the host judged), never the child's.
- A head with a bare CR or LF, a line that is not `name: value`, or two body lengths is refused.
- `host:port` entries in allow_hosts / allow_private open that port only.
- The sidecar's own listeners are never a destination (the proxy connects as the sidecar's uid).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mcpcreds import Client
from mcpcreds.config.load import parse_config
from mcpcreds.errors import ConfigError
from mcpcreds.exec.egress_proxy import EgressProxy
from mcpcreds.exec.egress_rules import PortRules
from mcpcreds.net.egress import EgressPolicy
from tests.egress_proxy_rig import basic, running_proxy
from tests.sidecar_proc import run_sidecar

WAIT = 20.0
OPEN = EgressPolicy("broad_audited", allow_private=("127.0.0.1",))

# answers each request with the head it received, as its body
MIRROR = """
import asyncio

async def mirror(reader, writer):
    try:
        head = await reader.readuntil(b"\\r\\n\\r\\n")
    except Exception:
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n" % len(head) + head)
    await writer.drain()
    writer.close()

async def main():
    servers = [await asyncio.start_server(mirror, "127.0.0.1", 0) for _ in range(2)]
    print(*(s.sockets[0].getsockname()[1] for s in servers), flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))

asyncio.run(main())
"""


@dataclass
class Rig:
    proxy: EgressProxy
    ports: tuple[int, int]  # two upstream ports, in another process

    def session(self, policy: EgressPolicy = OPEN, ports: PortRules | None = None) -> str:
        return self.proxy.new_session("t", policy, os.getuid(), 1, ports)[0]

    async def send(self, token: str, head: bytes) -> bytes:
        """One request head (the credential added after its first line); all the proxy answers."""
        first, _, rest = head.partition(b"\r\n")
        reader, writer = await asyncio.open_unix_connection(self.proxy.path)
        writer.write(first + b"\r\nProxy-Authorization: Basic " + basic(token) + b"\r\n" + rest)
        try:
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
            if answer.startswith(b"HTTP/1.1 200 Connection established"):
                return answer  # a tunnel: open until we close it
            return answer + await asyncio.wait_for(reader.read(), WAIT)
        finally:
            writer.close()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    upstream = subprocess.Popen([sys.executable, "-c", MIRROR], stdout=subprocess.PIPE, text=True)
    assert upstream.stdout is not None
    first, second = (int(p) for p in upstream.stdout.readline().split())
    try:
        async with running_proxy(tmp_path) as (proxy, _audit):
            yield Rig(proxy, (first, second))
    finally:
        upstream.kill()
        upstream.wait()


def _status(answer: bytes) -> bytes:
    return answer.split(b"\r\n", 1)[0]


async def test_plain_http_sends_the_host_of_the_url_not_the_childs(rig: Rig) -> None:
    port = rig.ports[0]
    answer = await rig.send(rig.session(), f"GET http://user:pw@127.0.0.1:{port}/x HTTP/1.1\r\n"
                                           "Host: 127.0.0.1:1\r\nhOsT: evil.example\r\nX-Kept: yes\r\n\r\n".encode())
    assert _status(answer) == b"HTTP/1.1 200 OK", answer
    sent = answer.partition(b"\r\n\r\n")[2]
    hosts = [line for line in sent.split(b"\r\n") if line.lower().startswith(b"host:")]
    assert hosts == [f"Host: 127.0.0.1:{port}".encode()], sent
    assert sent.startswith(b"GET /x HTTP/1.1\r\n") and b"X-Kept: yes" in sent and b"user" not in sent


@pytest.mark.parametrize("head", [
    "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nX-A: 1\nHost: evil.example\r\n\r\n",  # bare LF
    "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nX-A: 1\rHost: evil.example\r\n\r\n",  # bare CR
    "GET http://127.0.0.1:{port}/ HTTP/1.1\nHost: evil.example\r\n\r\n",  # in the request line
    "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost : evil.example\r\n\r\n",  # space before the colon
    "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nX-A: 1\r\n folded: on\r\n\r\n",  # obs-fold
    "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nno colon here\r\n\r\n",
    "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nX-A: a\x00b\r\n\r\n",
    "POST http://127.0.0.1:{port}/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\n",
    "POST http://127.0.0.1:{port}/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nX-A: 1\nX-B: 2\r\n\r\n",
])
async def test_a_head_the_upstream_might_read_otherwise_is_refused(rig: Rig, head: str) -> None:
    answer = await rig.send(rig.session(), head.format(port=rig.ports[0]).encode())
    assert _status(answer) == b"HTTP/1.1 400 Bad Request", answer
    assert b"evil" not in answer


async def test_host_port_entries_open_that_port_only(rig: Rig) -> None:
    listed, other = rig.ports
    private = rig.session(OPEN, PortRules(private=(("127.0.0.1", listed),)))
    assert _status(await rig.send(private, f"CONNECT 127.0.0.1:{listed} HTTP/1.1\r\n\r\n".encode())
                   ) == b"HTTP/1.1 200 Connection established"
    refused = await rig.send(private, f"CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n".encode())
    assert _status(refused) == b"HTTP/1.1 403 Forbidden" and b"on this port" in refused
    restricted = EgressPolicy("restricted", allow_hosts=("localhost",), allow_private=("localhost",))
    hosts = rig.session(restricted, PortRules(hosts=(("localhost", listed),)))
    assert _status(await rig.send(hosts, f"GET http://localhost:{listed}/ HTTP/1.1\r\n\r\n".encode())
                   ) == b"HTTP/1.1 200 OK"
    refused = await rig.send(hosts, f"GET http://localhost:{other}/ HTTP/1.1\r\n\r\n".encode())
    assert _status(refused) == b"HTTP/1.1 403 Forbidden" and b"allow_hosts on this port" in refused
    # an entry without a port beside one with a port: any port
    both = rig.session(OPEN, PortRules(private=(("127.0.0.1", listed), ("127.0.0.0/8", None))))
    assert _status(await rig.send(both, f"CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n".encode())
                   ) == b"HTTP/1.1 200 Connection established"


async def test_a_listener_of_the_proxys_own_process_is_never_a_destination(rig: Rig) -> None:
    async def served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    own = await asyncio.start_server(served, "127.0.0.1", 0)
    wildcard = await asyncio.start_server(served, "0.0.0.0", 0)  # reached by any local address
    try:
        policy = EgressPolicy("broad_audited", allow_private=("127.0.0.0/8", "0.0.0.0/8", "::ffff:0:0/96"))
        token = rig.session(policy)
        port, any_port = own.sockets[0].getsockname()[1], wildcard.sockets[0].getsockname()[1]
        for target in (f"127.0.0.1:{port}", f"[::ffff:127.0.0.1]:{port}", f"0.0.0.0:{port}",
                       f"127.0.0.1:{any_port}", f"127.0.0.2:{any_port}"):
            answer = await rig.send(token, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
            assert _status(answer) == b"HTTP/1.1 403 Forbidden" and b"own listener" in answer, (target, answer)
        # another process's listener on the same address: allowed
        assert _status(await rig.send(token, f"CONNECT 127.0.0.1:{rig.ports[0]} HTTP/1.1\r\n\r\n".encode())
                       ) == b"HTTP/1.1 200 Connection established"
    finally:
        own.close()
        wildcard.close()


def test_config_takes_host_port_entries_and_refuses_bad_ports() -> None:
    config = parse_config({"exec": {"e": {"net": "restricted", "allow_hosts": ["API.example.com:443", "b.example"],
                                          "allow_private": ["127.0.0.1:8080", "[::1]:9", "10.0.0.0/8"]}}})
    entry = config.execs["e"]
    assert entry.egress.allow_hosts == ("api.example.com", "b.example")
    assert entry.host_ports == (("api.example.com", 443), ("b.example", None))
    assert entry.private_ports == (("127.0.0.1", 8080), ("::1", 9), ("10.0.0.0/8", None))
    secret = "s3cr3t-value"
    with pytest.raises(ConfigError) as refused:
        parse_config({"exec": {"e": {"net": "restricted", "allow_hosts": ["a.example:0", f"b.example:{secret}"]}}})
    text = "\n".join(refused.value.errors)
    assert "exec.e.allow_hosts[0]" in text and "exec.e.allow_hosts[1]" in text and "1 to 65535" in text
    assert secret not in text


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    workdir = tmp_path_factory.mktemp("hostile")
    sock = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{sock}"
audit_log = "{workdir / 'audit.jsonl'}"

[gateway]
listen = "127.0.0.1:0"

[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"

[exec.loopback]
net = "broad_audited"
authorization = {{ by = "the tests", reason = "hostile clients of the proxy" }}
allow_private = ["127.0.0.1"]
""")
    with run_sidecar(config, sock) as proc:
        ready = next(json.loads(line) for line in proc.lines if '"ready"' in line)
        yield sock, int(ready["gateway_listen"].rsplit(":", 1)[1])


def _through(egress: str, token: str, head: str) -> bytes:
    credential = base64.b64encode(f"mcpcreds:{token}".encode()).decode()
    first, _, rest = head.partition("\r\n")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(WAIT)
        sock.connect(egress)
        sock.sendall(f"{first}\r\nProxy-Authorization: Basic {credential}\r\n{rest}".encode())
        data = b""
        while b"\r\n\r\n" not in data and (chunk := sock.recv(4096)):
            data += chunk
    return data


def test_the_gateways_tcp_listener_is_not_reachable_through_the_proxy(sidecar: tuple[Path, int]) -> None:
    sock, port = sidecar
    with Client(str(sock)) as client:
        proxy = client.request("POST", "/v1/exec/loopback/session", {"proxy": True})["proxy"]
    tunnel = _through(proxy["socket"], proxy["token"], f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert _status(tunnel).startswith(b"HTTP/1.1 403"), tunnel
    plain = _through(proxy["socket"], proxy["token"],
                     f"POST http://127.0.0.1:{port}/mcp/docs HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert _status(plain).startswith(b"HTTP/1.1 403") and b"own listener" in plain, plain
