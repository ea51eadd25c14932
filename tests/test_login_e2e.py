"""Person logins end to end (issue 16): `mcpcreds login` with the device flow and with the
authorization code + PKCE flow against the real oidc-provider (its sign-in and consent pages
driven over HTTP as a browser would), the refresh token in a real keyring (gnome-keyring on a
private D-Bus), the sidecar renewing from it with rotation, `invalid_grant` -> `login_required`
(401, exit 77), `logout`, and no refresh token in any output."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import keyring
import pytest
from joserfc import jwt
from joserfc.jwk import KeySet

from mcpcreds import Client
from mcpcreds.errors import LoginRequired, SecretUnavailable
from tests.blocking_keyring import GATE_ENV, STARTED
from tests.conftest import CANARY, KeyringSession, module_peer, run_cli
from tests.peers.oidc_peer import OidcPeer, approve_in_browser
from tests.sidecar_proc import SidecarProcess, run_sidecar

DEVICE = "urn:ietf:params:oauth:grant-type:device_code"
OIDC_CLIENTS: list[dict[str, Any]] = [
    {"client_id": "c-device", "token_endpoint_auth_method": "none",
     "grant_types": [DEVICE, "refresh_token"], "scope": "tools:read"},
    {"client_id": "c-code", "client_secret": CANARY, "token_endpoint_auth_method": "client_secret_basic",
     "grant_types": ["authorization_code", "refresh_token"], "redirect_uris": ["http://127.0.0.1/callback"],
     "scope": "tools:read tools:call"},
    # no refresh_token grant: the peer issues no refresh token to this client
    {"client_id": "c-code-once", "token_endpoint_auth_method": "none", "grant_types": ["authorization_code"],
     "redirect_uris": ["http://127.0.0.1/callback"], "scope": "tools:read"},
]
URL_LINE = re.compile(r"(https?://\S+)")


@pytest.fixture(scope="module")
def peer(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, 3600)


class Setup:
    def __init__(self, peer: OidcPeer, tmp_path: Path, service: str) -> None:
        self.peer = peer
        self.service = service
        self.socket = tmp_path / "run" / "s.sock"
        self.config = tmp_path / "config.toml"
        self.config.write_text(f"""
[sidecar]
socket = "{self.socket}"
[secrets]
sources = ["env", "keyring"]
keyring_service = "{service}"
keyring_timeout = "30s"  # a bound only a hung keyring crosses, not a busy machine

[[servers]]
name = "dev"
endpoint = "https://dev.example.com/mcp"
auth = {{ kind = "oauth2", grant = "device", issuer = "{peer.issuer}", client_id = "c-device", scopes = ["tools:read"] }}

[services.web]
endpoint = "https://web.example.com/mcp"
auth = {{ kind = "oauth2", grant = "authorization_code", issuer = "{peer.issuer}", client_id = "c-code", client_secret = "{{{{secret:CODE_SECRET}}}}", scope = "tools:read tools:call" }}
[[servers]]
name = "web"
service = "web"

[[servers]]
name = "once"
endpoint = "https://once.example.com/mcp"
auth = {{ kind = "oauth2", grant = "authorization_code", issuer = "{peer.issuer}", client_id = "c-code-once", scope = "tools:read" }}

[[servers]]
name = "reg"
endpoint = "https://reg.example.com/mcp"
auth = {{ kind = "oauth2", grant = "authorization_code", issuer = "{peer.issuer}", scope = "tools:read" }}
""")
        self.env = {"CODE_SECRET": CANARY}
        self.outputs: list[str] = []

    def entry(self, key: str) -> dict[str, Any] | None:
        text = keyring.get_password(self.service, "login." + key.replace(":", ".", 1))
        return json.loads(text) if text else None

    def stored(self, key: str) -> str | None:
        text = keyring.get_password(self.service, "login." + key.replace(":", ".", 1))
        return json.loads(text)["refresh_token"] if text else None

    def cli(self, *args: str) -> tuple[int, str]:
        result = run_cli(*args, "--config", str(self.config), env=self.env)
        self.outputs.append(result.output)
        return result.code, result.output

    def login(self, name: str, *extra: str, browse: bool = True) -> tuple[int, str, str]:
        """Run `mcpcreds login`, open the URL it prints in the 'browser', return (exit, output, url)."""
        proc = subprocess.Popen([sys.executable, "-m", "mcpcreds.cli.main", "login", name, "--config",
                                 str(self.config), *extra], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**_environ(), **self.env})
        assert proc.stderr is not None
        lines: list[str] = []
        url = None
        for line in proc.stderr:  # the line with the URL to open comes first, then the wait
            lines.append(line)
            if "(or open " in line or line.startswith("http"):
                match = URL_LINE.search(line)
                assert match is not None
                url = match.group(1).rstrip(")")
                break
        assert url is not None, "".join(lines)
        if browse:
            approve_in_browser(url)
        out, err = proc.communicate(timeout=30)
        output = "".join(lines) + err + out
        self.outputs.append(output)
        return proc.returncode, output, url


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


@pytest.fixture
def setup(peer: OidcPeer, tmp_path: Path, keyring_session: KeyringSession) -> Setup:
    peer.reset_stats()
    return Setup(peer, tmp_path, f"mcpcreds-login-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def sidecar(setup: Setup) -> Iterator[SidecarProcess]:
    with run_sidecar(setup.config, setup.socket, setup.env) as proc:
        yield proc


def claims(peer: OidcPeer, authorization: str) -> dict[str, Any]:
    token = jwt.decode(authorization[7:], KeySet.import_key_set(peer.jwks()))  # type: ignore[arg-type]
    return dict(token.claims)


def no_refresh_token_anywhere(setup: Setup, sidecar: SidecarProcess, tokens: set[str]) -> None:
    with Client(sidecar.socket) as client:
        status = json.dumps(client.status())
    metrics = subprocess.run(["curl", "-s", "--unix-socket", str(sidecar.socket), "http://x/metrics"],
                             capture_output=True, text=True, check=True).stdout
    texts = (*setup.outputs, sidecar.log, status, metrics)  # the log joined once, not per token
    for token in tokens:
        assert len(token) > 20
        for text in texts:
            assert token not in text


def test_device_login_then_the_sidecar_renews_from_the_refresh_token_with_rotation(
        setup: Setup, sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as client:
        with pytest.raises(LoginRequired) as info:  # nobody logged in yet
            client.headers("dev")
        assert info.value.status == 401 and info.value.details["command"] == "mcpcreds login dev"
        code, output, url = setup.login("dev")
        assert code == 0, output
        assert "enter the code" in output and url.startswith(setup.peer.issuer + "/device?user_code=")
        # told by the login (before it exits), the sidecar redeemed the refresh token and kept the next
        sidecar.wait_for("refresh token rotated")
        second_stored = setup.stored("mcp:dev")
        assert second_stored is not None
        info1 = client.headers_info("dev")
        c = claims(setup.peer, info1["headers"]["Authorization"])
        assert (c["client_id"], c["sub"], c["aud"], c["scope"]) == ("c-device", "alice",
                                                                    "https://dev.example.com/mcp", "tools:read")
        # a renewal (the rotation notice, as after a login) redeems the stored token and keeps the next
        assert client.secret_rotated("login.mcp.dev") == ["mcp:dev"]
        third_stored = setup.stored("mcp:dev")
        assert third_stored not in (None, second_stored)
        info2 = client.headers_info("dev")
        assert info2["fingerprint"] != info1["fingerprint"]
        # and that one works too: had the sidecar used a rotated token without storing it, the
        # keyring would hold a spent one now
        assert client.secret_rotated("login.mcp.dev") == ["mcp:dev"]
    stats = setup.peer.stats()
    assert stats["by_grant"]["refresh_token"] == 3 and stats["by_grant"][DEVICE] >= 1
    fourth_stored = setup.stored("mcp:dev")
    assert len({second_stored, third_stored, fourth_stored}) == 3
    no_refresh_token_anywhere(setup, sidecar, {second_stored, third_stored, fourth_stored})  # type: ignore[arg-type]


def test_a_refused_refresh_token_is_login_required_exit_77_naming_the_command(
        setup: Setup, sidecar: SidecarProcess) -> None:
    keyring.set_password(setup.service, "login.mcp.dev",
                         json.dumps({"v": 1, "refresh_token": "spent-" + CANARY, "client_id": "c-device"}))
    with Client(sidecar.socket) as client, pytest.raises(LoginRequired) as info:
        client.headers("dev")
    assert "invalid_grant" in info.value.message and "`mcpcreds login dev`" in info.value.message
    raw = subprocess.run(["curl", "-s", "-w", "%{http_code}", "--unix-socket", str(sidecar.socket),
                          "http://x/v1/servers/dev/headers"], capture_output=True, text=True, check=True).stdout
    assert raw.endswith("401") and json.loads(raw[:-3])["error"]["code"] == "login_required"
    code, output = setup.cli("headers", "dev", "--socket", str(sidecar.socket))
    assert code == 77 and "mcpcreds login dev" in output
    assert CANARY not in output and CANARY not in sidecar.log and CANARY not in raw


def test_authorization_code_login_with_pkce_and_no_browser(setup: Setup, sidecar: SidecarProcess) -> None:
    code, output, url = setup.login("web", "--no-browser")
    assert code == 0, output
    params = httpx.URL(url).params
    assert params["code_challenge_method"] == "S256" and len(params["code_challenge"]) == 43
    assert params["redirect_uri"].startswith("http://127.0.0.1:") and params["resource"] == "https://web.example.com/mcp"
    assert params["scope"] == "tools:read tools:call" and len(params["state"]) >= 32
    sidecar.wait_for("refresh token rotated")
    with Client(sidecar.socket) as client:
        c = claims(setup.peer, client.headers("web")["Authorization"])
    assert (c["client_id"], c["sub"], c["aud"]) == ("c-code", "alice", "https://web.example.com/mcp")
    assert set(c["scope"].split()) == {"tools:read", "tools:call"}
    stored = setup.stored("service:web")
    assert stored is not None
    # a rotation of the client secret tries the new value on a refresh: a wrong one is refused
    # by the server before the refresh token is spent, and nothing changes
    result = run_cli("secret", "rotate", "CODE_SECRET", "--config", str(setup.config), "--socket",
                     str(sidecar.socket), stdin="not-the-client-secret\n", env=setup.env)
    setup.outputs.append(result.output)
    assert result.code == 1 and "invalid_client" in result.output, result.output
    assert setup.stored("service:web") == stored
    no_refresh_token_anywhere(setup, sidecar, {stored})
    assert CANARY not in "".join(setup.outputs)


def test_a_redirect_with_another_state_is_refused_and_nothing_is_redeemed(setup: Setup) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "mcpcreds.cli.main", "login", "web", "--no-browser", "--config",
                             str(setup.config)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**_environ(), **setup.env})
    assert proc.stderr is not None
    url = next(URL_LINE.search(line).group(1) for line in proc.stderr  # type: ignore[union-attr]
               if line.startswith("http"))
    redirect = httpx.URL(url).params["redirect_uri"]
    assert httpx.get(redirect.replace("/callback", "/favicon.ico")).status_code == 404  # not counted
    answer = httpx.get(redirect, params={"code": "stolen-code", "state": "forged-state"})
    assert answer.status_code == 400
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "state does not match" in err
    assert "forged-state" not in err and "stolen-code" not in err
    assert setup.peer.stats()["token_requests"] == 0 and setup.stored("service:web") is None
    with pytest.raises(httpx.ConnectError):  # one request, then closed
        httpx.get(redirect, params={"code": "c", "state": "s"})


def test_logout_revokes_deletes_and_the_sidecar_asks_for_a_login(setup: Setup, sidecar: SidecarProcess) -> None:
    code, output, _ = setup.login("dev")
    assert code == 0, output
    sidecar.wait_for("refresh token rotated")
    with Client(sidecar.socket) as client:
        client.headers("dev")
        stored = setup.stored("mcp:dev")
        code, output = setup.cli("logout", "dev", "--socket", str(sidecar.socket))
        assert code == 0 and "refresh token revoked" in output, output
        assert setup.stored("mcp:dev") is None
        with pytest.raises(LoginRequired):
            client.headers("dev")
    assert setup.cli("logout", "dev")[0] == 1  # nothing stored any more
    assert stored is not None
    # revoked at the server: the token no longer refreshes
    answer = httpx.post(setup.peer.token_url, data={"grant_type": "refresh_token", "refresh_token": stored,
                                                   "client_id": "c-device"})
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_grant"


def test_the_sidecar_renews_ahead_of_expiry_from_the_refresh_token(setup: Setup, sidecar: SidecarProcess) -> None:
    setup.peer.set_ttl(5)  # renewed by the timer at 45-50 % of the lifetime: 2.5 s of margin
    try:
        code, output, _ = setup.login("dev")
        assert code == 0, output
        sidecar.wait_for("refresh token rotated")
        with Client(sidecar.socket) as client:
            first = client.headers_info("dev")
            stored = setup.stored("mcp:dev")
            renewed = sidecar.wait_for("login renewed", timeout=20)
            second = client.headers_info("dev")
    finally:
        setup.peer.set_ttl(3600)
    assert renewed["key"] == "mcp:dev" and renewed["time"] < first["expires_at"]  # before it expired
    assert second["fingerprint"] != first["fingerprint"] and second["expires_at"] > first["expires_at"]
    assert setup.stored("mcp:dev") not in (None, stored)  # the rotated refresh token was kept
    assert setup.peer.stats()["by_grant"]["refresh_token"] >= 2  # the notice, then the timer


def test_a_sidecar_killed_right_after_keeping_a_rotated_refresh_token_loses_nothing(
        setup: Setup, tmp_path: Path) -> None:
    """kill -9 mid-renewal: the sidecar, told of the login, redeems its refresh token, stores the
    rotated one and is killed before it uses the new access token (tests/crash_keyring.py). The
    restarted sidecar renews from what the keyring holds: had the rotated token been used before it
    was stored, the keyring would hold the spent one (invalid_grant)."""
    crash_config = tmp_path / "crash.toml"
    crash_config.write_text(setup.config.read_text().replace(
        "keyring_service =", 'keyring_backend = "tests.crash_keyring.KillAfterLoginWrite"\nkeyring_service =', 1))
    crashing = SidecarProcess(crash_config, setup.socket, setup.env)
    try:
        crashing.wait_for("ready")
        setup.login("dev")  # tells the sidecar, which dies in its renewal
        assert crashing.wait() == -signal.SIGKILL
    finally:
        crashing.stop()
    rotated = setup.stored("mcp:dev")
    assert rotated is not None and setup.peer.stats()["by_grant"]["refresh_token"] == 1
    with run_sidecar(setup.config, setup.socket, setup.env) as sidecar, Client(sidecar.socket) as client:
        client.headers("dev")  # renewed from the rotated token kept before the crash
        no_refresh_token_anywhere(setup, sidecar, {rotated})
    assert setup.peer.stats()["by_grant"]["refresh_token"] == 2
    assert setup.stored("mcp:dev") not in (None, rotated)


def test_a_rotated_refresh_token_is_stored_before_anyone_gets_the_new_access_token(
        setup: Setup, tmp_path: Path) -> None:
    """Write-then-use, shown by its order: the keyring write of the rotated refresh token is held
    at its start (tests/blocking_keyring.py) while a client waits for the login's headers. While
    it is held, that client has no answer, the login is still renewing without a token (status),
    and a second asker waits too; released, the client gets the new access token and the keyring
    holds the rotated refresh token, which renews again."""
    code, output, _ = setup.login("dev")  # no sidecar yet: it renews from this login when asked
    assert code == 0 and "no sidecar is running" in output, output
    first = setup.stored("mcp:dev")
    assert first is not None
    gate = tmp_path / "gate"
    os.mkfifo(gate, 0o600)
    held_config = tmp_path / "held.toml"
    held_config.write_text(setup.config.read_text().replace(
        "keyring_service =", 'keyring_backend = "tests.blocking_keyring.BlockFirstLoginWrite"\nkeyring_service =',
        1).replace('keyring_timeout = "30s"', "keyring_timeout = 300", 1))
    env = {**setup.env, GATE_ENV: str(gate)}
    with run_sidecar(held_config, setup.socket, env) as sidecar, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as waiting, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as second:
        for conn in (waiting, second):
            conn.settimeout(60)
            conn.connect(str(setup.socket))
        waiting.sendall(b"GET /v1/servers/dev/headers HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sidecar.wait_for(STARTED)["entry"] == "login.mcp.dev"
        # the refresh token is spent at the server and the rotated one is not stored yet
        assert setup.peer.stats()["by_grant"]["refresh_token"] == 1 and setup.stored("mcp:dev") == first
        second.sendall(b"GET /v1/servers/dev/headers HTTP/1.1\r\nHost: x\r\n\r\n")
        with Client(sidecar.socket) as client:  # answered after both requests were read
            (row,) = [r for r in client.status()["logins"] if r["key"] == "mcp:dev"]
        assert (row["state"], row["fingerprint"], row["expires_at"]) == ("renewing", None, None), row
        # anything sent to them before the status answer is in their buffers by now: nothing
        assert select.select([waiting, second], [], [], 0)[0] == []
        with open(gate, "wb") as release:
            release.write(b"x")
        answers = [read_response(conn) for conn in (waiting, second)]
        rotated = setup.stored("mcp:dev")
        assert rotated is not None and rotated != first
        for status, body in answers:
            assert status == 200, body
        tokens = {body["headers"]["Authorization"] for _, body in answers}
        assert len(tokens) == 1  # the one renewal, shared
        assert claims(setup.peer, tokens.pop())["client_id"] == "c-device"
        with Client(sidecar.socket) as client:  # the stored one is the live one: it renews again
            assert client.secret_rotated("login.mcp.dev") == ["mcp:dev"]
        no_refresh_token_anywhere(setup, sidecar, {first, rotated})
    assert setup.peer.stats()["by_grant"]["refresh_token"] == 2
    assert setup.stored("mcp:dev") not in (None, first, rotated)


def test_a_rotated_refresh_token_the_keyring_refused_is_written_by_the_next_renewal(
        setup: Setup, tmp_path: Path) -> None:
    """The keyring refuses the write of the rotated refresh token after the server has spent the
    old one (tests/failing_keyring.py): that renewal fails, and the rotated login stays in memory.
    The next renewal writes it and serves its access token without redeeming the spent refresh
    token again (which the server refuses: invalid_grant, the login lost)."""
    code, output, _ = setup.login("dev")  # no sidecar yet: it renews from this login when asked
    assert code == 0 and "no sidecar is running" in output, output
    first = setup.stored("mcp:dev")
    assert first is not None
    failing_config = tmp_path / "failing.toml"
    failing_config.write_text(setup.config.read_text().replace(
        "keyring_service =", 'keyring_backend = "tests.failing_keyring.FailFirstLoginWrite"\nkeyring_service =', 1))
    with run_sidecar(failing_config, setup.socket, setup.env) as sidecar, Client(sidecar.socket) as client:
        with pytest.raises(SecretUnavailable):
            client.headers("dev")
        assert setup.peer.stats()["by_grant"]["refresh_token"] == 1 and setup.stored("mcp:dev") == first
        assert client.secret_rotated("login.mcp.dev") == ["mcp:dev"]  # renew now, not after the backoff
        info = client.headers_info("dev")
        assert claims(setup.peer, info["headers"]["Authorization"])["client_id"] == "c-device"
        assert setup.peer.stats()["by_grant"]["refresh_token"] == 1  # the spent one was not redeemed
        rotated = setup.stored("mcp:dev")
        assert rotated not in (None, first)
        assert client.secret_rotated("login.mcp.dev") == ["mcp:dev"]  # the stored one renews
        assert client.headers_info("dev")["fingerprint"] != info["fingerprint"]
        no_refresh_token_anywhere(setup, sidecar, {first, rotated})
        assert sidecar.wait_for("rotated refresh token not stored")["level"] == "error"
    assert setup.peer.stats()["by_grant"]["refresh_token"] == 2
    assert setup.stored("mcp:dev") not in (None, first, rotated)


def read_response(conn: socket.socket) -> tuple[int, Any]:
    """One HTTP/1.1 answer with a Content-Length body, read from a raw connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, body
        body += chunk
    return int(lines[0].split()[1]), json.loads(body[:length])


def test_the_keyring_write_that_ends_a_login_waits_for_the_person(setup: Setup, tmp_path: Path) -> None:
    """A keyring slow to store the first login (it asks the person to make or unlock it: here it
    takes 2 s, tests/slow_keyring.py) does not lose the login after the browser step: that write
    waits for a person, past `keyring_timeout` (0.5 s here), which bounds the sidecar's own calls."""
    slow = tmp_path / "slow.toml"
    text = setup.config.read_text()
    assert 'keyring_timeout = "30s"' in text
    slow.write_text(text.replace('keyring_timeout = "30s"', 'keyring_timeout = "0.5s"', 1).replace(
        "keyring_service =", 'keyring_backend = "tests.slow_keyring.SlowFirstLoginWrite"\nkeyring_service =', 1))
    setup.config, usual = slow, setup.config
    try:
        code, output, _ = setup.login("dev")
    finally:
        setup.config = usual
    assert code == 0 and "timed out" not in output, output
    assert setup.stored("mcp:dev") is not None


def test_without_a_working_keyring_the_login_fails_before_anything_is_asked(setup: Setup,
                                                                            tmp_path: Path) -> None:
    result = run_cli("login", "dev", "--config", str(setup.config),
                     env={**setup.env, "DBUS_SESSION_BUS_ADDRESS": f"unix:path={tmp_path}/no-bus"})
    assert result.code == 1 and "keyring" in result.stderr, result.output
    assert "enter the code" not in result.stderr
    assert setup.peer.stats()["token_requests"] == 0 and "by_grant" not in setup.peer.stats()


def test_a_login_without_a_refresh_token_is_served_until_the_resource_refuses_it(
        setup: Setup, sidecar: SidecarProcess) -> None:
    """The peer issues no refresh token to c-code-once: the access token is the login, kept in
    the keyring and served by the sidecar, until a 401 invalidates it: then login_required."""
    code, output, _ = setup.login("once", "--no-browser")
    assert code == 0, output
    assert "issued no refresh token" in output and "mcpcreds login once" in output
    entry = setup.entry("mcp:once")
    assert entry is not None and "refresh_token" not in entry and entry["client_id"] == "c-code-once"
    access = entry["access_token"]
    assert 3500 < entry["expires_at"] - time.time() <= 3600
    sidecar.wait_for("login fetched")  # told by the login
    with Client(sidecar.socket) as client:
        info = client.headers_info("once")
        assert info["headers"]["Authorization"] == f"Bearer {access}"
        c = claims(setup.peer, info["headers"]["Authorization"])
        assert (c["client_id"], c["aud"], c["scope"]) == ("c-code-once", "https://once.example.com/mcp", "tools:read")
        assert client.headers("once") == info["headers"]  # served again, no token request
        assert client.invalidate("once", info["fingerprint"])  # the resource answered 401
        with pytest.raises(LoginRequired) as refused:
            client.headers("once")
    assert "refused" in refused.value.message and refused.value.details["command"] == "mcpcreds login once"
    marked = setup.entry("mcp:once")  # marked expired: a restarted sidecar does not serve it again
    assert marked is not None and marked["access_token"] == access and marked["expires_at"] <= time.time()
    code, output = setup.cli("headers", "once", "--socket", str(sidecar.socket))
    assert code == 77 and "mcpcreds login once" in output
    stats = setup.peer.stats()
    assert stats["by_grant"] == {"authorization_code": 1}  # never a refresh
    no_refresh_token_anywhere(setup, sidecar, {access})


def test_an_expired_login_without_a_refresh_token_is_login_required(setup: Setup, sidecar: SidecarProcess) -> None:
    keyring.set_password(setup.service, "login.mcp.once", json.dumps(
        {"v": 1, "client_id": "c-code-once", "access_token": "expired-" + CANARY, "expires_at": time.time() - 1}))
    with Client(sidecar.socket) as client, pytest.raises(LoginRequired) as info:
        client.headers("once")
    assert "expired" in info.value.message and "`mcpcreds login once`" in info.value.message
    code, output = setup.cli("headers", "once", "--socket", str(sidecar.socket))
    assert code == 77 and "mcpcreds login once" in output
    assert CANARY not in output and CANARY not in sidecar.log
    assert setup.peer.stats()["token_requests"] == 0


def test_without_a_client_id_the_login_registers_a_client_and_the_sidecar_refreshes_as_it(
        setup: Setup, sidecar: SidecarProcess) -> None:
    """RFC 7591 against oidc-provider: a public native client registered for the loopback
    redirect URI, kept in the keyring entry; the sidecar refreshes as that client; the next login
    reuses the registration."""
    code, output, url = setup.login("reg", "--no-browser")
    assert code == 0, output
    entry = setup.entry("mcp:reg")
    assert entry is not None
    registration = entry["registration"]
    client_id = registration["client_id"]
    assert re.search(rf"registered as client {re.escape(client_id)} at ", output)
    assert (registration["auth_method"], registration["issuer"]) == ("none", setup.peer.issuer)
    assert "client_secret" not in registration and entry["client_id"] == client_id
    assert httpx.URL(url).params["client_id"] == client_id
    assert registration["redirect_uri"] == httpx.URL(url).params["redirect_uri"]
    sidecar.wait_for("refresh token rotated")  # told by the login: refreshed as the registered client
    with Client(sidecar.socket) as client:
        c = claims(setup.peer, client.headers("reg")["Authorization"])
    assert (c["client_id"], c["aud"], c["scope"]) == (client_id, "https://reg.example.com/mcp", "tools:read")
    # the next login reuses the registration (the same loopback port, so the same redirect URI)
    code, output, url = setup.login("reg", "--no-browser")
    assert code == 0, output
    assert "registered as client" not in output
    assert httpx.URL(url).params["client_id"] == client_id
    assert setup.entry("mcp:reg")["registration"] == registration  # type: ignore[index]
