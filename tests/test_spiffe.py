"""SPIFFE (issue 16, `auth = { kind = "spiffe" }`): an SVID from files, presented by the sidecar.

- JWT-SVID: the token's checks (a JWS, a SPIFFE ID, not expired on a fixed clock, the audience);
  the file's checks (no symbolic link, a regular file, private, bounded); a changed file seen by
  a stat (a rename over it, an in-place rewrite, a chmod).
- X.509-SVID: the TLS context's reload, a mismatched pair refused with no previous SVID and the
  previous one kept otherwise; `check` requires expose = "proxy" and https.
- End to end with the real sidecar: the MCP SDK client through the gateway to a real MCP server
  (tests/peers/mcp_gateway_peer.py) carrying the JWT-SVID of the file, the new one once the file
  changes (gateway and headers route); the same server behind a TLS terminator that requires a
  client certificate of the trust domain's CA (certificates made here with `cryptography`): the
  gateway presents the X.509-SVID, and the new one after the files change; status shows each
  SVID's SPIFFE ID and expiry; the SVID key and refused tokens in no output (canary scan).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import json
import os
import shutil
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient
from mcpcreds.config.load import parse_config
from mcpcreds.config.spiffe import SpiffeAuth, SvidError, parse_jwt_svid
from mcpcreds.credentials.spiffe import JwtSvidFiles, X509Source
from mcpcreds.errors import ConfigError, SecretUnavailable
from tests.conftest import CANARY, run_cli
from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar

AGENT_ID = "spiffe://example.org/agent"
NOW = 1_800_000_000.0


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(sub: str = AGENT_ID, exp: Any = NOW + 300, aud: Any = "mcp-upstream", sig: str = "c2ln") -> str:
    claims = {"sub": sub, "exp": exp, "aud": aud, "iat": int(NOW)}
    return f"{b64(json.dumps({'alg': 'ES256', 'typ': 'JWT'}).encode())}.{b64(json.dumps(claims).encode())}.{sig}"


# -- the token's checks (pure, fixed clock)

def test_a_jwt_svid_is_parsed_with_its_spiffe_id_and_expiry() -> None:
    token = jwt()
    svid = parse_jwt_svid(f"  {token}\n", NOW, "mcp-upstream")
    assert (svid.token, svid.spiffe_id, svid.expires_at) == (token, AGENT_ID, NOW + 300)
    assert parse_jwt_svid(jwt(aud=["other", "mcp-upstream"]), NOW, "mcp-upstream").token
    assert parse_jwt_svid(jwt(aud="other"), NOW, None).token  # no audience configured: not checked


@pytest.mark.parametrize(("text", "now", "audience", "says"), [
    (jwt(exp=NOW), NOW, None, f"expired at {int(NOW)}"),  # expiring now is expired
    (jwt(exp=NOW + 0.5), NOW + 1, None, "expired"),
    (jwt(aud="someone-else"), NOW, "mcp-upstream", "not for the configured audience"),
    (jwt(aud=None), NOW, "mcp-upstream", "not for the configured audience"),
    (jwt(sub="user@example.org"), NOW, None, "not a SPIFFE ID"),
    (jwt(exp="tomorrow"), NOW, None, "no numeric exp"),
    (jwt(exp=float("inf")), NOW, None, "no numeric exp"),
    ("a.b", NOW, None, "three dot-separated parts"),
    (jwt() + "\n" + jwt(), NOW, None, "three dot-separated parts"),
    (f"{b64(b'[1]')}.{b64(b'{}')}.x", NOW, None, "not a JSON object"),
    ("e30.!!!.x", NOW, None, "not base64url JSON"),
], ids=["expires-now", "expired", "other-audience", "no-audience", "not-spiffe", "exp-text", "exp-inf",
        "two-parts", "two-tokens", "header-not-object", "not-base64"])
def test_an_unusable_jwt_svid_is_refused_naming_why_never_the_token(text: str, now: float, audience: str | None,
                                                                     says: str) -> None:
    with pytest.raises(SvidError, match=says) as caught:
        parse_jwt_svid(text.replace("c2ln", "Q0FOQVJZ" + b64(CANARY.encode())), now, audience)
    assert CANARY not in str(caught.value) and b64(CANARY.encode()) not in str(caught.value)


# -- the file's checks and its change detection

def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write as the SPIFFE helper does: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "svid").mkdir(mode=0o700)
    return tmp_path / "svid"


def test_the_jwt_file_is_read_again_only_once_it_changed(folder: Path) -> None:
    files = JwtSvidFiles(lambda: NOW)
    path = folder / "jwt"
    write_private(path, jwt(sig="b25l"))
    assert files.changed(str(path))  # never read
    assert files.read(str(path), None).token.endswith(".b25l")
    assert not files.changed(str(path))
    write_private(path, jwt(sig="dHdv"))  # renamed over: a new inode
    assert files.changed(str(path))
    assert files.read(str(path), None).token.endswith(".dHdv")
    assert not files.changed(str(path))
    with path.open("r+") as f:  # rewritten in place, same size
        f.write(jwt(sig="dHdX"))
    assert files.changed(str(path))
    files.read(str(path), None)
    path.chmod(0o400)  # the ctime moves
    assert files.changed(str(path))
    path.unlink()
    assert files.changed(str(path))


@pytest.mark.parametrize(("plant", "says"), [
    ("link", "symbolic link"),
    ("public", "readable by group or others"),
    ("fifo", "FIFO, not a regular file"),
    ("huge", "larger than 16384 bytes"),
    ("absent", "does not exist"),
    ("open-folder", "writable by group or others"),
])
def test_an_unsafe_jwt_file_is_refused(folder: Path, plant: str, says: str) -> None:
    path = folder / "jwt"
    if plant == "link":
        write_private(folder / "real", jwt())
        path.symlink_to(folder / "real")
    elif plant == "public":
        write_private(path, jwt(), 0o644)
    elif plant == "fifo":
        os.mkfifo(path, 0o600)
    elif plant == "huge":
        write_private(path, jwt() + " " * 20_000)
    elif plant == "open-folder":
        write_private(path, jwt())
        folder.chmod(0o777)
    with pytest.raises(SecretUnavailable, match=says):
        JwtSvidFiles(lambda: NOW).read(str(path), None)


# -- certificates (the trust domain's CA, SVIDs with URI SANs, the server's certificate)

def make_ca() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "example.org trust domain")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue(ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], uri: str, server: bool = False
          ) -> tuple[bytes, bytes]:
    """A leaf certificate (PEM) for `uri` (and 127.0.0.1 for the server) and its key (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
    if server:
        import ipaddress
        names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
    cert = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(ca[0].subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca[1], hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def fingerprint(pem: bytes) -> str:
    return hashlib.sha256(x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)).hexdigest()


def write_svid(folder: Path, cert: bytes, key: bytes, bundle: bytes) -> None:
    write_private(folder / "svid.key", key.decode())
    write_private(folder / "svid.pem", cert.decode(), 0o644)
    write_private(folder / "bundle.pem", bundle.decode(), 0o644)


def test_the_x509_context_is_rebuilt_when_a_file_changes_and_a_bad_pair_keeps_the_last(folder: Path) -> None:
    ca = make_ca()
    bundle = ca[0].public_bytes(serialization.Encoding.PEM)
    first, second = issue(ca, AGENT_ID), issue(ca, AGENT_ID)
    auth = SpiffeAuth("x509", svid_file=str(folder / "svid.pem"), key_file=str(folder / "svid.key"),
                      bundle_file=str(folder / "bundle.pem"))
    source = X509Source(auth)
    with pytest.raises(SecretUnavailable, match="does not exist"):
        source.context()
    write_svid(folder, first[0], second[1], bundle)  # a certificate with another one's key
    with pytest.raises(SecretUnavailable, match="do not match") as caught:
        source.context()
    assert second[1].decode().splitlines()[1] not in str(caught.value)
    write_svid(folder, *first, bundle)
    context = source.context()
    assert source.context() is context and source.loads == 1  # nothing changed: the same context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    write_private(folder / "svid.pem", second[0].decode(), 0o644)  # the helper wrote the certificate ...
    assert source.context() is context  # ... not its key yet: the last good pair stays
    write_private(folder / "svid.key", second[1].decode())
    assert source.context() is not context and source.loads == 2
    write_private(folder / "svid.key", second[1].decode(), 0o644)  # a key anyone may read
    assert source.context() is not context  # the last good one stays, the change is refused (logged)
    assert source.loads == 2


def server(auth: str, **extra: str) -> dict[str, Any]:
    return {"sidecar": {"socket": "/tmp/x.sock"}, "servers": [{"name": "s", "endpoint": "https://mcp.example.org/mcp",
                                                               "auth": auth, **extra}]}


@pytest.mark.parametrize(("auth", "extra", "says"), [
    ({"kind": "spiffe"}, {}, "servers[0].auth.svid: required"),
    ({"kind": "spiffe", "svid": "jwt"}, {}, "servers[0].auth.jwt_svid_file: required"),
    ({"kind": "spiffe", "svid": "jwt", "jwt_svid_file": "relative"}, {}, "absolute path"),
    ({"kind": "spiffe", "svid": "jwt", "jwt_svid_file": "/a", "key_file": "/k"}, {}, "only with svid = \"x509\""),
    ({"kind": "spiffe", "svid": "x509", "svid_file": "/a", "key_file": "/b", "bundle_file": "/c"}, {},
     "servers[0].expose: auth kind \"spiffe\" with svid = \"x509\" is an mTLS identity only the gateway"),
    ({"kind": "spiffe", "svid": "x509", "svid_file": "/a", "key_file": "/b"}, {"expose": "proxy"},
     "servers[0].auth.bundle_file: required"),
    ({"kind": "spiffe", "svid": "x509", "svid_file": "/a", "key_file": "/b", "bundle_file": "/c"},
     {"expose": "proxy", "endpoint": "http://127.0.0.1:9/mcp"}, "needs an https:// endpoint"),
    ({"kind": "spiffe", "svid": "spiffe"}, {}, "\"jwt\" (a bearer JWT-SVID) or \"x509\""),
    ({"kind": "kerberos"}, {}, "expected 'static', 'oauth2', 'aws' or 'spiffe'"),
])
def test_check_refuses_what_cannot_work(auth: dict[str, Any], extra: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(server(auth, **extra))  # type: ignore[arg-type]
    assert says in str(caught.value)


def test_check_accepts_both_svids() -> None:
    jwt_auth = {"kind": "spiffe", "svid": "jwt", "jwt_svid_file": "/run/spiffe/jwt", "audience": "mcp"}
    x509_auth = {"kind": "spiffe", "svid": "x509", "svid_file": "/a", "key_file": "/b", "bundle_file": "/c"}
    parse_config(server(jwt_auth))  # type: ignore[arg-type]
    parse_config(server(x509_auth, expose="proxy"))  # type: ignore[arg-type]


# -- end to end: the real sidecar, the MCP SDK, a real MCP server (behind an mTLS terminator)

STATIC_KEY = "static-key-" + CANARY


class MtlsTerminator:
    """A TLS front for the peer (as an mTLS proxy would be): it requires a client certificate of
    the CA, records each connection's certificate (SHA-256 of its DER), then relays bytes."""

    def __init__(self, server_cert: Path, server_key: Path, client_ca: Path, backend_port: int) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(server_cert, server_key)
        self.context.load_verify_locations(client_ca)
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.backend_port = backend_port
        self.presented: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    def _run(self, started: threading.Event) -> None:
        async def main() -> None:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.context)
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            async with server:
                await server.serve_forever()

        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(main())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        self.presented.append(hashlib.sha256(der).hexdigest())
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            self.loop.call_soon_threadsafe(task.cancel)
        self.thread.join(10)


class Env:
    def __init__(self, workdir: Path, peer: GatewayPeer, tls: MtlsTerminator, sidecar: SidecarProcess,
                 ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], bundle: bytes, keys: list[bytes]) -> None:
        self.workdir, self.peer, self.tls, self.sidecar = workdir, peer, tls, sidecar
        self.ca, self.bundle, self.keys = ca, bundle, keys

    @property
    def svid_dir(self) -> Path:
        return self.workdir / "svid"


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    workdir = Path(tempfile.mkdtemp(prefix="mcpcreds-spiffe-"))
    svid_dir = workdir / "svid"
    svid_dir.mkdir(mode=0o700)
    ca = make_ca()
    bundle = ca[0].public_bytes(serialization.Encoding.PEM)
    server_cert, server_key = issue(ca, "spiffe://example.org/mcp-server", server=True)
    (workdir / "server.pem").write_bytes(server_cert)
    (workdir / "server.key").write_bytes(server_key)
    (workdir / "ca.pem").write_bytes(bundle)
    agent = issue(ca, AGENT_ID)
    write_svid(svid_dir, *agent, bundle)
    write_private(svid_dir / "jwt", jwt(exp=time.time() + 3600, sig="Zmlyc3Q"))
    write_private(svid_dir / "jwt-wrong-aud", jwt(exp=time.time() + 3600, aud="elsewhere", sig="Q0FOQVJZ" +
                                                  b64(CANARY.encode())))
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    try:
        with start_gateway_peer("eyJ", STATIC_KEY) as peer:
            backend_port = int(peer.base.rsplit(":", 1)[1])
            tls = MtlsTerminator(workdir / "server.pem", workdir / "server.key", workdir / "ca.pem", backend_port)
            config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[secrets]
sources = ["env"]

[[servers]]
name = "spiffe-jwt"
endpoint = "{peer.url}"
trust = "trusted"
auth = {{ kind = "spiffe", svid = "jwt", jwt_svid_file = "{svid_dir / 'jwt'}", audience = "mcp-upstream" }}

[[servers]]
name = "spiffe-wrong-aud"
endpoint = "{peer.url}"
trust = "trusted"
auth = {{ kind = "spiffe", svid = "jwt", jwt_svid_file = "{svid_dir / 'jwt-wrong-aud'}", audience = "mcp-upstream" }}

[[servers]]
name = "spiffe-x509"
endpoint = "https://127.0.0.1:{tls.port}/mcp"
trust = "trusted"
expose = "proxy"
allow_private = ["127.0.0.1"]
headers = {{ X-Api-Key = "{{{{secret:PEER_KEY}}}}" }}
auth = {{ kind = "spiffe", svid = "x509", svid_file = "{svid_dir / 'svid.pem'}", key_file = "{svid_dir / 'svid.key'}", bundle_file = "{svid_dir / 'bundle.pem'}" }}
""")
            try:
                with run_sidecar(config, socket, {"PEER_KEY": STATIC_KEY}) as proc:
                    yield Env(workdir, peer, tls, proc, ca, bundle, [agent[1]])
            finally:
                tls.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def raw_client(env: Env) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(env.sidecar.socket)),
                             base_url="http://mcpcreds", timeout=30,
                             headers={"Accept": "application/json, text/event-stream"})


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


async def sdk_session(env: Env, name: str) -> None:
    async with AsyncClient(env.sidecar.socket) as creds, creds.mcp_httpx2_client(name) as http, \
            streamable_http_client(creds.mcp_url(name), http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        assert (await session.call_tool("add", {"a": 2, "b": 3})).structured_content == {"result": 5}


def last_authorization(peer: GatewayPeer) -> str | None:
    return next((v for k, v in peer.stats()["headers"] if k.lower() == "authorization"), None)


async def test_the_jwt_svid_reaches_the_server_and_the_new_one_once_the_file_changes(env: Env) -> None:
    path = env.svid_dir / "jwt"
    first = path.read_text()
    await sdk_session(env, "spiffe-jwt")
    assert last_authorization(env.peer) == f"Bearer {first}"
    async with AsyncClient(env.sidecar.socket) as creds:
        headers = await creds.headers("spiffe-jwt")  # the library, by the headers route
    assert headers["Authorization"] == f"Bearer {first}"
    second = jwt(exp=time.time() + 7200, sig="c2Vjb25k")
    write_private(path, second)
    async with raw_client(env) as http:
        assert (await http.post("/mcp/spiffe-jwt", json=INIT)).status_code == 200
        answer = (await http.get("/v1/servers/spiffe-jwt/headers")).json()
    assert last_authorization(env.peer) == f"Bearer {second}"
    assert answer["headers"]["Authorization"] == f"Bearer {second}"
    assert answer["expires_at"] == json.loads(base64.urlsafe_b64decode(second.split(".")[1] + "=="))["exp"]


async def test_an_expired_or_misdirected_jwt_svid_is_never_sent(env: Env) -> None:
    path = env.svid_dir / "jwt"
    good = path.read_text()
    before = env.peer.stats()["requests"].get("POST", 0)
    try:
        write_private(path, jwt(exp=time.time() - 5, sig="Q0FOQVJZ" + b64(CANARY.encode())))
        async with raw_client(env) as http:
            expired = await http.post("/mcp/spiffe-jwt", json=INIT)
            wrong = await http.post("/mcp/spiffe-wrong-aud", json=INIT)
        assert env.peer.stats()["requests"].get("POST", 0) == before  # nothing reached the server
        assert (expired.status_code, expired.json()["error"]["data"]["code"]) == (503, "secret_unavailable")
        assert "expired" in expired.json()["error"]["message"]
        assert "not for the configured audience" in wrong.json()["error"]["message"]
    finally:
        write_private(path, good)


async def test_the_gateway_presents_the_x509_svid_and_the_new_one_after_the_files_change(env: Env) -> None:
    seen = len(env.tls.presented)
    await sdk_session(env, "spiffe-x509")  # a real MCP session through the gateway and the mTLS front
    current = fingerprint((env.svid_dir / "svid.pem").read_bytes())
    assert env.tls.presented[seen:] and set(env.tls.presented[seen:]) == {current}
    new_cert, new_key = issue(env.ca, AGENT_ID)
    env.keys.append(new_key)
    write_private(env.svid_dir / "svid.key", new_key.decode())
    write_private(env.svid_dir / "svid.pem", new_cert.decode(), 0o644)
    seen = len(env.tls.presented)
    async with raw_client(env) as http:
        for _ in range(2):
            assert (await http.post("/mcp/spiffe-x509", json=INIT)).status_code == 200
    assert env.tls.presented[seen:] and set(env.tls.presented[seen:]) == {fingerprint(new_cert)}
    async with raw_client(env) as http:  # a direct client cannot use it: the credential stays inside
        assert (await http.get("/v1/servers/spiffe-x509/headers")).status_code == 403


async def test_an_svid_the_server_does_not_trust_is_refused_by_the_server(env: Env) -> None:
    """A certificate from another CA (an attacker's, or another trust domain): the terminator
    refuses the handshake, the gateway says the server could not be reached."""
    other = make_ca()
    cert, key = issue(other, AGENT_ID)
    good = [(env.svid_dir / n).read_bytes() for n in ("svid.pem", "svid.key")]
    write_private(env.svid_dir / "svid.key", key.decode())
    write_private(env.svid_dir / "svid.pem", cert.decode(), 0o644)
    env.keys.append(key)
    try:
        async with raw_client(env) as http:
            answer = await http.post("/mcp/spiffe-x509", json=INIT)
        assert answer.status_code == 502, answer.text
    finally:
        write_private(env.svid_dir / "svid.key", good[1].decode())
        write_private(env.svid_dir / "svid.pem", good[0].decode(), 0o644)


async def test_status_shows_each_svid_its_spiffe_id_and_expiry_never_a_token(env: Env) -> None:
    async with raw_client(env) as http:
        assert (await http.post("/mcp/spiffe-jwt", json=INIT)).status_code == 200
        assert (await http.post("/mcp/spiffe-x509", json=INIT)).status_code == 200
        status = (await http.get("/v1/status")).json()
    rows = {row["key"]: row for row in status["spiffe"]}
    token = (env.svid_dir / "jwt").read_text()
    exp = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))["exp"]
    assert rows["mcp:spiffe-jwt"] == {"key": "mcp:spiffe-jwt", "svid": "jwt", "spiffe_id": AGENT_ID,
                                      "expires_at": exp}
    cert = x509.load_pem_x509_certificate((env.svid_dir / "svid.pem").read_bytes())
    assert rows["mcp:spiffe-x509"] == {"key": "mcp:spiffe-x509", "svid": "x509", "spiffe_id": AGENT_ID,
                                       "expires_at": cert.not_valid_after_utc.timestamp()}
    assert "mcp:spiffe-wrong-aud" not in rows  # never read successfully
    assert token not in json.dumps(status)


async def test_the_svid_key_appears_in_no_output(env: Env) -> None:
    seen: list[str] = []
    async with raw_client(env) as http:
        for path in ("/v1/status", "/v1/servers", "/metrics", "/v1/servers/spiffe-x509/headers",
                     "/v1/servers/spiffe-wrong-aud/headers"):
            seen.append((await http.get(path)).text)
        for name in ("spiffe-jwt", "spiffe-wrong-aud", "spiffe-x509"):
            answer = await http.post(f"/mcp/{name}", json=INIT)
            seen.append(answer.text + json.dumps(dict(answer.headers)))
    seen.append(run_cli("status", "--json", "--socket", str(env.sidecar.socket), "--config",
                        str(env.sidecar.config)).stdout)
    seen += [(env.workdir / "audit.jsonl").read_text(), env.sidecar.log]
    text = "\n".join(seen)
    assert "spiffe-x509" in text  # the scan reaches where the servers show
    for key in env.keys:
        for line in key.decode().splitlines()[1:-1]:
            assert line not in text
    assert CANARY not in text and b64(CANARY.encode()) not in text
