"""mcpcreds doctor: every check passes on a sound setup (exit 0); each broken part is a ✗ line
with its fix (exit 1); no secret value is ever printed."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mcpcreds.cli.doctor import FAIL, PASS, Doctor, report
from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Config
from tests.conftest import CANARY, run_cli
from tests.peers.redis_peer import RedisPeer
from tests.sidecar_proc import run_sidecar

CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env", "dir:{creds}"]
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:DOCS_KEY}}}}" }}
[[servers]]
name = "crm"
endpoint = "https://crm.example.com/mcp"
[servers.oauth]
token_url = "{idp}/token"
client_id = "agent-7"
client_secret = "{{{{secret:CRM_CLIENT_SECRET}}}}"
[[servers]]
name = "notes"
endpoint = "https://notes.example.com/mcp"
[servers.oauth]
issuer = "{idp}"
client_id = "agent-8"
client_secret = "{{{{secret:CRM_CLIENT_SECRET}}}}"
"""


class Idp(BaseHTTPRequestHandler):
    """Discovery and a token endpoint that refuses anonymous requests (as real ones do)."""

    def do_GET(self) -> None:
        if self.path == "/.well-known/oauth-authorization-server":
            base = f"http://{self.headers['Host']}"
            self._send(200, {"issuer": base, "token_endpoint": f"{base}/token"})
        else:
            self._send(404, {})

    def do_POST(self) -> None:
        self._send(401, {"error": "invalid_client"})

    def _send(self, status: int, body: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)  # with a Date header
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def idp() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Idp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def setup(tmp_path: Path, idp: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    (creds / "CRM_CLIENT_SECRET").write_text(CANARY + "-file\n")
    (creds / "CRM_CLIENT_SECRET").chmod(0o600)
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(socket=tmp_path / "run" / "mcpcreds.sock", creds=creds,
                                    idp=f"http://127.0.0.1:{idp.server_address[1]}"))
    monkeypatch.setenv("DOCS_KEY", CANARY + "-env")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # no installed units to find
    monkeypatch.delenv("MCPCREDS_SOCKET", raising=False)
    return config


def output(checks: list[object], as_json: bool = False) -> str:
    lines: list[str] = []
    report(checks, as_json, lines.append)  # type: ignore[arg-type]
    return "\n".join(lines)


def test_a_sound_setup_passes_every_check(setup: Path) -> None:
    with run_sidecar(setup, setup.parent / "run" / "mcpcreds.sock"):
        result = run_cli("doctor", "--config", str(setup))
    assert result.code == 0, result.output
    text = result.stdout
    assert all(line.startswith(PASS) for line in text.splitlines()[:-2]), text
    assert text.endswith("\nall checks passed\n")
    for expected in ("✓ config:", "✓ socket folder:", "✓ socket:", "✓ sidecar: answers on",
                     "✓ source env:", "✓ source dir:", "✓ secrets of docs: all resolve: DOCS_KEY",
                     "✓ secrets of crm: all resolve: CRM_CLIENT_SECRET",
                     "✓ token endpoint of crm:", "(HTTP 401 to an anonymous request)",
                     "✓ token endpoint of notes: discovery at", "✓ clock: within",
                     "✓ systemd units: none installed"):
        assert expected in text, text
    assert CANARY not in result.output


def test_a_secret_only_the_sidecars_environment_holds_is_no_failure(setup: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The `env` source is the sidecar's environment, not doctor's: a secret set where `serve` runs
    (a unit's Environment=, the shell that started it) resolves; doctor asks the sidecar."""
    socket_path = setup.parent / "run" / "mcpcreds.sock"
    with run_sidecar(setup, socket_path, {"DOCS_KEY": CANARY + "-env"}):
        monkeypatch.delenv("DOCS_KEY")  # doctor's own environment lacks it
        result = run_cli("doctor", "--config", str(setup))
    assert result.code == 0, result.output
    assert "✓ secrets of docs: all resolve: DOCS_KEY (the sidecar's environment)" in result.stdout, result.stdout
    assert CANARY not in result.output


def test_each_broken_part_is_a_cross_with_its_fix(setup: Path, idp: ThreadingHTTPServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCS_KEY")
    (setup.parent / "run").mkdir(mode=0o700)
    (setup.parent / "run").chmod(0o755)
    idp.shutdown()
    idp.server_close()  # the token endpoint and discovery: connection refused
    doctor = Doctor(str(setup), timeout=2.0)
    checks = doctor.run()
    text = output(checks)  # type: ignore[arg-type]
    assert not doctor.ok
    assert json.loads(output(checks, as_json=True))["ok"] is False  # type: ignore[arg-type]
    assert CANARY not in output(checks, as_json=True)  # type: ignore[arg-type]
    for expected in (f"{FAIL} socket folder: {setup.parent / 'run'} has mode 0755, not 0700",
                     f"{FAIL} secrets of docs: not found: DOCS_KEY (looked in: env, dir:",
                     "fix: mcpcreds secret set DOCS_KEY",
                     f"{FAIL} token endpoint of crm: http://127.0.0.1:",
                     f"{FAIL} token endpoint of notes: discovery for issuer",
                     f"{PASS} secrets of crm: all resolve"):
        assert expected in text, text
    assert text.count("    fix: ") == sum(1 for line in text.splitlines() if line.startswith(FAIL))
    assert CANARY not in text
    (setup.parent / "run").chmod(0o700)
    stale = Doctor(str(setup), timeout=2.0)
    assert f"{FAIL} socket: {setup.parent / 'run' / 'mcpcreds.sock'} does not exist" in output(stale.run())  # type: ignore[arg-type]
    bad = setup.parent / "bad.toml"
    bad.write_text("[sidecar]\nsocket = 7\n")
    result = run_cli("doctor", "--config", str(bad))
    assert result.code == 1 and f"{FAIL} config: " in result.stdout and "fix: mcpcreds check" in result.stdout


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that no system store trusts (made here, signed by its own key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mcpcreds doctor test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the doctor's refused handshakes


@pytest.fixture
def tls_idp(tmp_path: Path) -> Iterator[ThreadingHTTPServer]:
    """The same token endpoint over https, with a self-signed certificate."""
    import ssl

    cert, key = self_signed_cert(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = QuietServer(("127.0.0.1", 0), Idp)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_dns_and_tls_failures_of_a_token_endpoint_are_crosses_with_their_fix(
        tmp_path: Path, tls_idp: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token endpoint whose name does not resolve, and one whose certificate the system does not
    trust (checked through the egress policy, which lets the loopback address through): each a ✗
    line naming the URL and the cause, with its fix; exit 1; no traceback."""
    tls = f"https://127.0.0.1:{tls_idp.server_address[1]}"
    config = tmp_path / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{tmp_path / 'run' / 'mcpcreds.sock'}"
[secrets]
sources = ["env"]
[[servers]]
name = "nxdomain"
endpoint = "https://nxdomain.example.com/mcp"
oauth = {{ token_url = "https://idp.mcpcreds-doctor.invalid/token", client_id = "a", client_secret = "{{{{secret:S}}}}" }}
[[servers]]
name = "nxissuer"
endpoint = "https://nxissuer.example.com/mcp"
oauth = {{ issuer = "https://issuer.mcpcreds-doctor.invalid", client_id = "a", client_secret = "{{{{secret:S}}}}" }}
[[servers]]
name = "untrusted"
endpoint = "https://untrusted.example.com/mcp"
allow_private = ["127.0.0.1"]
oauth = {{ token_url = "{tls}/token", client_id = "a", client_secret = "{{{{secret:S}}}}" }}
[[servers]]
name = "untrusted-issuer"
endpoint = "https://untrusted-issuer.example.com/mcp"
allow_private = ["127.0.0.1"]
oauth = {{ issuer = "{tls}", client_id = "a", client_secret = "{{{{secret:S}}}}" }}
""")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # no installed units to find
    monkeypatch.delenv("MCPCREDS_SOCKET", raising=False)
    with run_sidecar(config, tmp_path / "run" / "mcpcreds.sock", {"S": CANARY}):  # all else passes
        result = run_cli("doctor", "--config", str(config), env={"S": CANARY})
    assert result.code == 1, result.output
    assert "Traceback" not in result.output and CANARY not in result.output
    lines = result.stdout.splitlines()
    crosses = sorted(line.split(":")[0] for line in lines if line.startswith(FAIL))
    assert crosses == [f"{FAIL} token endpoint of {name}"
                       for name in ("nxdomain", "nxissuer", "untrusted", "untrusted-issuer")], result.stdout
    assert result.stdout.endswith("\n4 problems found\n"), result.stdout

    def cross(server: str) -> tuple[str, str]:
        (at,) = [i for i, line in enumerate(lines) if line.startswith(f"{FAIL} token endpoint of {server}: ")]
        return lines[at], lines[at + 1]

    line, fix = cross("nxdomain")
    assert ": https://idp.mcpcreds-doctor.invalid/token: ConnectError: cannot resolve " \
        "idp.mcpcreds-doctor.invalid: " in line, line  # then the resolver's words
    assert fix == "    fix: check the token_url, DNS, TLS and egress (net, allow_hosts, allow_private)"
    line, fix = cross("nxissuer")
    assert "discovery for issuer https://issuer.mcpcreds-doctor.invalid failed: ConnectError: cannot resolve " \
        "issuer.mcpcreds-doctor.invalid" in line, line
    assert fix == "    fix: check the issuer URL, DNS, TLS and egress (net, allow_hosts, allow_private)"
    line, fix = cross("untrusted")
    assert f": {tls}/token: ConnectError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: " \
        "self-signed certificate" in line, line
    assert fix == "    fix: check the token_url, DNS, TLS and egress (net, allow_hosts, allow_private)"
    line, fix = cross("untrusted-issuer")
    assert f"discovery for issuer {tls} failed: ConnectError: [SSL: CERTIFICATE_VERIFY_FAILED]" in line, line
    assert fix.startswith("    fix: check the issuer URL")


def test_redis_checked_when_it_holds_the_state(redis: RedisPeer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_KEY", CANARY + "-state-key")
    config = parse_config({"sidecar": {"state": redis.url, "state_key": "{{secret:STATE_KEY}}"},
                           "secrets": {"sources": ["env"]}})
    doctor = Doctor()
    asyncio.run(doctor.check_redis(config))
    assert doctor.ok and f"{PASS} redis: unix://" in output(doctor.checks)  # type: ignore[arg-type]
    redis.stop()
    down = Doctor(timeout=1.0)
    asyncio.run(down.check_redis(config))
    assert not down.ok and f"{FAIL} redis: unix://" in output(down.checks)  # type: ignore[arg-type]


def redis_lines(config: Config) -> tuple[bool, str]:
    doctor = Doctor(timeout=2.0)
    asyncio.run(doctor.check_redis(config))
    return doctor.ok, output(doctor.checks)  # type: ignore[arg-type]


def test_redis_script_and_state_key_are_checked(redis: RedisPeer, monkeypatch: pytest.MonkeyPatch) -> None:
    from redis import Redis

    from mcpcreds.credentials.tokens import Token
    from mcpcreds.state.redis_state import RedisState

    ours, theirs = CANARY + "-ours", CANARY + "-theirs"
    config = parse_config({"sidecar": {"state": redis.url, "state_key": "{{secret:STATE_KEY}}"},
                           "secrets": {"sources": ["env"]}})
    monkeypatch.setenv("STATE_KEY", ours)
    ok, text = redis_lines(config)  # a Redis no sidecar has used
    assert ok, text
    assert f"{PASS} redis script: the bucket script loads (" in text
    assert f"{PASS} redis state_key: resolves; no sidecar has written to this Redis yet" in text

    async def store(state_key: str, key: str) -> None:  # a sidecar stores a login
        state = RedisState(redis.url, state_key)
        try:
            await state.put_login(key, Token("at-" + key, "Bearer", 1.0, time.time() + 600, None, "fp"), 600)
        finally:
            await state.aclose()

    asyncio.run(store(ours, "mcp:a"))
    ok, text = redis_lines(config)
    assert ok, text
    assert f"{PASS} redis script: the bucket script is loaded (" in text  # cached by the run before
    assert f"{PASS} redis state_key: opens the 1 stored login tried" in text
    asyncio.run(store(theirs, "mcp:b"))  # another sidecar with another state_key
    ok, text = redis_lines(config)
    assert not ok
    assert f"{FAIL} redis state_key: opens 1 of the 2 stored logins tried: another sidecar" in text
    assert "fix: give every sidecar sharing this Redis the same state_key secret" in text
    monkeypatch.delenv("STATE_KEY")
    ok, text = redis_lines(config)
    assert not ok and f"{FAIL} redis state_key: does not resolve" in text
    monkeypatch.setenv("STATE_KEY", ours)
    admin = Redis(unix_socket_path=str(redis.socket))
    try:  # a Redis user that may not run scripts
        admin.script_flush()
        admin.acl_setuser("default", enabled=True, nopass=True, commands=["+@all", "-script", "-evalsha",
                                                                          "-eval"], keys=["*"], channels=["*"])
        ok, text = redis_lines(config)
    finally:
        admin.acl_setuser("default", reset=True, enabled=True, nopass=True, commands=["+@all"], keys=["*"],
                          channels=["*"])
        admin.close()
    assert not ok and f"{FAIL} redis script: cannot load the bucket script: NoPermissionError" in text, text
    assert "ACL: +script|load" in text
    assert CANARY not in text


def test_a_redis_that_may_evict_the_sidecars_keys_is_a_failure(redis: RedisPeer,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from redis import Redis

    monkeypatch.setenv("STATE_KEY", CANARY + "-state-key")
    config = parse_config({"sidecar": {"state": redis.url, "state_key": "{{secret:STATE_KEY}}"},
                           "secrets": {"sources": ["env"]}})
    ok, text = redis_lines(config)  # no maxmemory: whatever the policy, nothing is evicted
    assert ok and f"{PASS} redis eviction: nothing is evicted (maxmemory 0," in text, text
    admin = Redis(unix_socket_path=str(redis.socket))
    try:
        admin.config_set("maxmemory", "100mb")
        for policy in ("allkeys-lru", "volatile-ttl"):  # our keys carry TTLs: volatile-* picks them too
            admin.config_set("maxmemory-policy", policy)
            ok, text = redis_lines(config)
            assert not ok and f"{FAIL} redis eviction: maxmemory 104857600 with {policy}" in text, text
            assert "fix: set maxmemory-policy to noeviction" in text
        admin.config_set("maxmemory-policy", "noeviction")
        assert redis_lines(config)[0]
        admin.acl_setuser("default", enabled=True, nopass=True, commands=["+@all", "-config"], keys=["*"],
                          channels=["*"])
        ok, text = redis_lines(config)  # CONFIG refused (as on managed Redis): said, not failed
        assert ok and f"{PASS} redis eviction: the eviction settings cannot be read (NoPermissionError" in text, text
    finally:
        admin.acl_setuser("default", reset=True, enabled=True, nopass=True, commands=["+@all"], keys=["*"],
                          channels=["*"])
        admin.config_set("maxmemory", "0")
        admin.close()


@pytest.mark.parametrize(("version", "ok"), [("4.0.14", False), ("3.2.0", False), ("5.0.0", True),
                                             ("7.2.4", True), ("10.0", True), ("8", True), ("valkey", True)])
def test_the_redis_version_floor(version: str, ok: bool) -> None:
    from mcpcreds.cli.doctor import redis_version_ok

    assert redis_version_ok(version) is ok


def test_installed_units_listen_on_the_socket_and_run_a_program_that_is_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcpcreds.cli.units import install

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    dest = tmp_path / "xdg" / "systemd" / "user"
    socket_path = tmp_path / "run" / "mcpcreds" / "mcpcreds.sock"

    def lines(path: Path = socket_path) -> str:
        doctor = Doctor()
        doctor.check_units(path)
        return output(doctor.checks)  # type: ignore[arg-type]

    install("user", dest, f"{sys.executable} -m mcpcreds")
    text = lines()
    assert f"{PASS} systemd units: {dest}/mcpcreds.socket listens on {socket_path}" in text
    assert f"{PASS} systemd units: {dest}/mcpcreds.service runs {sys.executable}" in text
    assert f"{FAIL} systemd units: {dest}/mcpcreds.socket listens on {socket_path}, but the config's socket " \
        f"is {tmp_path}/other.sock" in lines(tmp_path / "other.sock")
    gone = tmp_path / "venv-removed" / "bin" / "mcpcreds"  # a pipx reinstall elsewhere, a removed venv
    install("user", dest, str(gone), force=True)
    text = lines()
    assert f"{FAIL} systemd units: {dest}/mcpcreds.service runs {gone}, which is not an executable file" in text
    assert "fix: mcpcreds install-units --user --force" in text
    (dest / "mcpcreds.service").unlink()
    assert f"{FAIL} systemd units: {dest}/mcpcreds.service is missing" in lines()


class SkewedIdp(Idp):
    def date_time_string(self, timestamp: float | None = None) -> str:
        return formatdate(time.time() + 600, usegmt=True)  # the server's clock: 10 minutes ahead


def login_config(token_url: str) -> Config:
    return parse_config({"servers": [{"name": "crm", "endpoint": "https://crm.example.com/mcp",
                                      "oauth": {"token_url": token_url, "client_id": "a",
                                                "client_secret": "{{secret:S}}"}}]})


def test_clock_skew_against_a_servers_date_and_a_silent_endpoint_is_bounded() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SkewedIdp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        doctor = Doctor()
        asyncio.run(doctor.check_login(login_config(f"http://127.0.0.1:{server.server_address[1]}/token")
                                       .servers["crm"]))
        doctor.check_clock()
    finally:
        server.shutdown()
        server.server_close()
    text = output(doctor.checks)  # type: ignore[arg-type]
    assert f"{FAIL} clock: " in text and "behind 127.0.0.1" in text and "timedatectl" in text, text
    with socket.socket() as silent:  # accepts (the backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        hung = Doctor(timeout=0.5)
        asyncio.run(hung.check_login(login_config(f"http://127.0.0.1:{silent.getsockname()[1]}/token")
                                     .servers["crm"]))
    assert f"{FAIL} token endpoint of crm: " in output(hung.checks)  # type: ignore[arg-type]


class PlaintextKeyring:
    """A keyring backend that says, by its name, that it keeps secrets in plain text."""

    priority = 1
    entries: dict[tuple[str, str], str] = {("mcpcreds", "K"): CANARY + "-keyring"}

    def get_password(self, service: str, name: str) -> str | None:
        return self.entries.get((service, name))


def test_a_plaintext_keyring_is_a_cross_even_when_allowed() -> None:
    config = parse_config({"secrets": {"sources": ["keyring"], "allow_plaintext_keyring": True,
                                       "keyring_backend": f"{__name__}.PlaintextKeyring"},
                           "servers": [{"name": "k", "endpoint": "https://k.example.com/mcp",
                                        "headers": {"X-Key": "{{secret:K}}"}}]})
    doctor = Doctor()
    doctor.check_secrets(config, doctor.check_sources(config))
    text = output(doctor.checks)  # type: ignore[arg-type]
    assert f"{FAIL} source keyring: backend {__name__}.PlaintextKeyring keeps secrets in plain text" in text
    assert f"{PASS} secrets of k: all resolve: K" in text and CANARY not in text
