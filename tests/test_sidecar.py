"""End to end: the real sidecar process on a temp socket, through curl and both clients."""

from __future__ import annotations

import http.client
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpcreds import AsyncClient, Client, SecretUnavailable, SidecarUnavailable, UnknownServer
from tests.conftest import CANARY, run_cli
from tests.peers.fault_idp import fault_idp
from tests.sidecar_proc import SidecarProcess, run_sidecar

CONFIG = """
[sidecar]
socket = "{socket}"
request_timeout = "1s"
[secrets]
sources = ["env", "dir:{creds}"]
cache_ttl = "0s"
[services.crm]
endpoint = "https://crm.example.com/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:MCP_TOKEN}}}}" }}
rate = "60/1m"
[[servers]]
name = "crm-ro"
service = "crm"
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:DOCS_KEY}}}}", "X-Client" = "tests" }}
[[servers]]
name = "broken"
endpoint = "https://broken.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:NOT_ANYWHERE}}}}" }}
"""


class Env:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.run = root / "run"
        self.socket = self.run / "mcpcreds.sock"
        self.creds = root / "creds"
        self.creds.mkdir()
        self.config = root / "config.toml"
        self.write_config()

    def write_config(self, extra: str = "", sidecar: str = "") -> None:
        text = CONFIG.format(socket=self.socket, creds=self.creds)
        self.config.write_text(text.replace("[sidecar]\n", f"[sidecar]\n{sidecar}", 1) + extra)

    def secret_file(self, name: str, value: str) -> None:
        path = self.creds / name
        path.write_text(value)
        path.chmod(0o600)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    e = Env(tmp_path)
    e.secret_file("DOCS_KEY", "docs-one\n")
    return e


@pytest.fixture
def sidecar(env: Env) -> Iterator[SidecarProcess]:
    with run_sidecar(env.config, env.socket, {"MCP_TOKEN": CANARY}) as proc:
        yield proc


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One sidecar with the default config for the tests that only ask it things (none changes
    its config, its secrets or its process): they share its start-up."""
    e = Env(tmp_path_factory.mktemp("served"))
    e.secret_file("DOCS_KEY", "docs-one\n")
    with run_sidecar(e.config, e.socket, {"MCP_TOKEN": CANARY}):
        yield e


def curl(env: Env, path: str, *args: str) -> tuple[int, dict[str, object] | str]:
    out = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", "--unix-socket", str(env.socket), *args,
         f"http://mcpcreds{path}"], capture_output=True, text=True, timeout=20, check=True).stdout
    body, _, code = out.rpartition("\n")
    try:
        return int(code), json.loads(body)
    except ValueError:
        return int(code), body


def raw(env: Env, data: bytes, timeout: float = 5.0, half_close: bool = False) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(env.socket))
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    return b"".join(chunks)


def test_curl_health_servers_headers(served: Env) -> None:
    assert curl(served, "/v1/health") == (200, {"status": "ok", "version": "0.1.0"})
    code, body = curl(served, "/v1/servers")
    assert code == 200 and isinstance(body, dict)
    names = [s["name"] for s in body["servers"]]  # type: ignore[attr-defined]
    assert names == ["crm-ro", "docs", "broken"]
    assert CANARY not in json.dumps(body)
    code, body = curl(served, "/v1/servers/crm-ro/headers")
    assert code == 200
    assert body == {"headers": {"Authorization": f"Bearer {CANARY}"}, "key": "service:crm",
                    "expires_at": None, "fingerprint": None}
    assert curl(served, "/v1/servers/service:crm/headers")[1] == body
    assert curl(served, "/v1/servers/mcp:docs/headers")[1]["headers"] == {  # type: ignore[index]
        "X-Api-Key": "docs-one", "X-Client": "tests"}


def test_errors_have_the_contract_shape(served: Env) -> None:
    assert curl(served, "/v1/servers/nope/headers") == (
        404, {"error": {"code": "unknown_server", "message": "unknown server: no configured server or cache key has that name"}})
    code, body = curl(served, "/v1/servers/broken/headers")
    assert code == 503 and body["error"]["code"] == "secret_unavailable"  # type: ignore[index]
    assert "NOT_ANYWHERE" in body["error"]["message"]  # type: ignore[index]
    assert curl(served, "/v1/nothing")[0] == 404
    assert curl(served, "/v1/health", "-X", "DELETE")[0] == 405


def test_socket_and_folder_modes(served: Env) -> None:
    assert stat.S_IMODE(served.run.stat().st_mode) == 0o700
    assert stat.S_IMODE(served.socket.stat().st_mode) == 0o600
    assert stat.S_ISSOCK(served.socket.stat().st_mode)


def test_a_group_readable_socket_folder_is_refused(env: Env) -> None:
    env.run.mkdir(mode=0o755)
    env.run.chmod(0o755)
    proc = SidecarProcess(env.config, env.socket)
    assert proc.wait(20) == 1  # waits for the last log line too
    assert "must be 0700" in proc.log


def test_changed_secret_is_picked_up_without_restart(env: Env, sidecar: SidecarProcess) -> None:
    with Client(env.socket) as client:
        assert client.headers("docs")["X-Api-Key"] == "docs-one"
        env.secret_file("DOCS_KEY", "docs-two")
        assert client.headers("docs")["X-Api-Key"] == "docs-two"


async def test_async_client(served: Env) -> None:
    async with AsyncClient(served.socket) as creds:
        assert (await creds.health())["status"] == "ok"
        assert await creds.headers("crm-ro") == {"Authorization": f"Bearer {CANARY}"}
        info = await creds.headers_info("docs")
        assert info["key"] == "mcp:docs"
        with pytest.raises(UnknownServer):
            await creds.headers("nope")
        with pytest.raises(SecretUnavailable):
            await creds.headers("broken")
        assert [s["name"] for s in await creds.servers()] == ["crm-ro", "docs", "broken"]


def test_sync_client_and_cli(served: Env) -> None:
    with Client(served.socket) as client:
        assert client.headers("service:crm") == {"Authorization": f"Bearer {CANARY}"}
        with pytest.raises(UnknownServer):
            client.headers("nope")
    cfg = ["--config", str(served.config)]
    assert run_cli("token", "crm-ro", *cfg).stdout.strip() == CANARY
    result = run_cli("headers", "docs", *cfg)
    assert result.code == 0 and result.stdout.splitlines() == ["X-Api-Key: docs-one", "X-Client: tests"]
    assert json.loads(run_cli("headers", "docs", "--json", *cfg).stdout)["key"] == "mcp:docs"
    assert run_cli("headers", "nope", *cfg).code == 2
    assert run_cli("headers", "broken", *cfg).code == 1
    assert run_cli("token", "docs", *cfg).code == 1
    status = run_cli("status", "--json", *cfg)
    assert status.code == 0 and json.loads(status.stdout)["servers"][0]["key"] == "service:crm"


def test_nothing_listening(tmp_path: Path) -> None:
    with pytest.raises(SidecarUnavailable), Client(tmp_path / "none.sock", connect_retry=0.1) as c:
        c.health()
    result = run_cli("headers", "docs", "--socket", str(tmp_path / "none.sock"))
    assert result.code == 69 and "no mcpcreds sidecar answers" in result.stderr


def test_stale_socket_is_replaced_and_a_live_one_is_not_stolen(env: Env) -> None:
    env.run.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(env.socket))
    stale.close()  # a socket file with nobody listening: what a crashed sidecar leaves
    with run_sidecar(env.config, env.socket) as first:
        assert "removed stale socket" in first.log
        second = SidecarProcess(env.config, env.socket)
        assert second.wait(20) == 1
        assert "another sidecar is already listening" in second.log
        with Client(env.socket) as client:
            assert client.health()["status"] == "ok"


NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # runs as nobody (the test's own interpreter may sit in a 0700 home)
# A client of another uid that holds one keep-alive connection: two answers on it, then it waits
# for the sidecar to close it ("closed"), or says the connection stayed "open".
HOLDER = r"""
import http.client, socket, sys

class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(sys.argv[1])

conn = Conn("mcpcreds")
answers = []
for _ in range(2):
    conn.request("GET", "/v1/servers/crm-ro/headers")
    answer = conn.getresponse()
    answers.append(f"{answer.status}:{answer.read().count(b'Bearer ')}:{conn.sock.fileno()}")
print("answered", *answers, flush=True)
try:
    print("closed" if conn.sock.recv(1) == b"" else "data", flush=True)
except TimeoutError:
    print("open", flush=True)
except ConnectionResetError:
    print("reset", flush=True)
"""


def as_nobody(*command: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]


class UnixHttp(http.client.HTTPConnection):
    """A keep-alive HTTP connection to the sidecar's socket (one socket for all its requests)."""

    def __init__(self, path: Path) -> None:
        super().__init__("mcpcreds", timeout=20)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.path))

    def get(self, path: str) -> int:
        self.request("GET", path)
        answer = self.getresponse()
        answer.read()
        return answer.status


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line the process prints, or a TimeoutError (never blocks the test for good)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError("no line from the client process")
    return proc.stdout.readline().strip()


@pytest.fixture
def shared_env() -> Iterator[Env]:
    root = Path(tempfile.mkdtemp(prefix="mcpcreds-peer-"))  # outside pytest's 0700 tmp tree
    try:
        yield Env(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def open_to_others(env: Env) -> None:
    """Let every uid reach the socket (the sidecar insisted on 0700 when it started): from here on
    only its peer uid check keeps anyone out."""
    env.root.chmod(0o755)
    env.run.chmod(0o755)
    env.socket.chmod(0o666)


def test_peer_of_another_uid_is_refused_and_logged(shared_env: Env) -> None:
    env = shared_env
    with run_sidecar(env.config, env.socket, {"MCP_TOKEN": CANARY}) as sidecar:
        open_to_others(env)  # on purpose: SO_PEERCRED must still refuse `nobody`
        result = subprocess.run(
            as_nobody("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", str(env.socket),
                      "http://x/v1/servers/crm-ro/headers"),
            capture_output=True, text=True, timeout=20)
        assert result.stdout == "000"  # closed before any answer
        refused = sidecar.wait_for("peer refused")
        assert refused["uid"] == NOBODY and refused["pid"] > 0
        assert curl(env, "/v1/health")[0] == 200  # our own uid still gets in


def test_an_allowed_second_uid_is_served_until_a_reload_removes_it(shared_env: Env) -> None:
    env = shared_env
    env.write_config(sidecar=f"allow_uids = [{os.getuid()}, {NOBODY}]\n")
    with run_sidecar(env.config, env.socket, {"MCP_TOKEN": CANARY}) as sidecar:
        open_to_others(env)
        ours = UnixHttp(env.socket)
        assert ours.get("/v1/health") == 200
        ours_socket = ours.sock
        holder = subprocess.Popen(as_nobody(SYSTEM_PYTHON, "-c", HOLDER, str(env.socket)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = read_line(holder, 30)
            assert line.startswith("answered "), (line, holder.communicate()[1])
            first, second = (a.split(":") for a in line.split()[1:])
            assert first[:2] == second[:2] == ["200", "1"] and first[2] == second[2]  # one connection
            # the reload takes the second uid off the list while its connection is open
            env.write_config(sidecar=f"allow_uids = [{os.getuid()}]\n")
            sidecar.signal(signal.SIGHUP)
            sidecar.wait_for("config reloaded")
            assert read_line(holder, 40) == "closed"
        finally:
            holder.kill()
            holder.wait()
        refused = subprocess.run(as_nobody("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket",
                                           str(env.socket), "http://x/v1/health"),
                                 capture_output=True, text=True, timeout=20)
        assert refused.stdout == "000"  # a new connection of that uid is refused too
        assert sidecar.wait_for("peer refused")["uid"] == NOBODY
        assert ours.get("/v1/servers/crm-ro/headers") == 200 and ours.sock is ours_socket  # ours stays open
        ours.close()


def test_limits_and_malformed_requests(served: Env) -> None:
    big_header = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    assert raw(served, big_header).startswith(b"HTTP/1.1 431 ")
    big_body = (b"POST /v1/servers/docs/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
                + b"{" * 1000)
    assert raw(served, big_body).startswith(b"HTTP/1.1 413 ")
    assert raw(served, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(served, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    # a head that never ends
    slow = raw(served, b"GET /v1/health HTTP/1.1\r\nHost:", timeout=10)
    assert slow.startswith(b"HTTP/1.1 408 ")
    assert curl(served, "/v1/health")[0] == 200


def test_keep_alive_and_pipelining(served: Env) -> None:
    req = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
    last = b"GET /v1/servers/docs/headers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = raw(served, req * 3 + last)
    assert answer.count(b"HTTP/1.1 200 OK") == 4
    assert answer.endswith(b'"fingerprint":null}')


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.binary(max_size=300),
    st.builds(lambda m, p, h: f"{m} {p} HTTP/1.1\r\n{h}\r\n\r\n".encode(),
              st.sampled_from(["GET", "POST", "PUT", "BREW", "G\x00T"]),
              st.text(max_size=80), st.text(max_size=120)),
), min_size=1, max_size=5))
def test_fuzzed_requests_never_stop_the_service(served: Env,
                                                 batch: list[bytes]) -> None:
    for data in batch:
        raw(served, data, timeout=3, half_close=True)
    assert curl(served, "/v1/health")[0] == 200


def test_sighup_reload_keeps_old_config_when_new_is_invalid(env: Env, sidecar: SidecarProcess) -> None:
    env.write_config('[[servers]]\nname = "extra"\nendpoint = "https://extra.example.com"\n'
                     'headers = { "X-Client" = "x" }\n')
    sidecar.signal(signal.SIGHUP)
    sidecar.wait_for("config reloaded")
    with Client(env.socket) as client:
        assert client.headers("extra") == {"X-Client": "x"}
        env.config.write_text(env.config.read_text() + '\nrate = "nonsense"\n[[bogus]]\n')
        sidecar.signal(signal.SIGHUP)
        rejected = sidecar.wait_for("reload rejected: config invalid; keeping the old one")
        assert rejected["errors"]
        assert client.headers("extra") == {"X-Client": "x"}


def test_sigterm_drains_and_exits_0(env: Env) -> None:
    proc = SidecarProcess(env.config, env.socket, {"MCP_TOKEN": "x"})
    proc.wait_for("ready")
    assert proc.stop() == 0
    assert not env.socket.exists()


IN_FLIGHT = """
[[servers]]
name = "stalled"
endpoint = "{base}/mcp"
oauth = {{ client_id = "c", client_secret = "{{{{secret:DOCS_KEY}}}}", token_url = "{base}/token/stall" }}
[[servers]]
name = "quick"
endpoint = "https://quick.example.com/mcp"
headers = {{ "X-Client" = "q" }}
rate = "1/2s"
[[servers]]
name = "slow"
endpoint = "https://slow.example.com/mcp"
headers = {{ "X-Client" = "s" }}
rate = "1/1m"
"""


def ask(env: Env, method: str, path: str, body: bytes = b"", timeout: float = 40) -> tuple[str, bytes]:
    """One request on its own connection: ("answer", bytes), ("closed", b"") for a clean close
    without an answer, or ("reset" | "timeout", what came)."""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    chunks: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(env.socket))
        s.sendall(head.encode() + body)
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            return "reset", b"".join(chunks)
        except TimeoutError:
            return "timeout", b"".join(chunks)
    data = b"".join(chunks)
    return ("answer" if data.startswith(b"HTTP/1.1 ") else "closed" if not data else "partial"), data


def both_queued(client: Client) -> bool:
    """The slow waiter is queued, and the quick one queued or already granted."""
    rows = {b["key"]: b for b in client.status()["buckets"]}
    quick, slow = rows["mcp:quick"], rows["mcp:slow"]
    return bool(slow["waiting"] == 1 and quick["waiting"] + quick["granted"] == 2)


DRAIN = 5  # s: the quick permit (1/2s) and the login's token_timeout (2s) fall due at most 2 s
# after SIGTERM, leaving 3 s to answer them; the slow permit (1/1m) is far beyond the drain


def test_idle_connections_close_and_sigterm_answers_or_closes_every_request(env: Env) -> None:
    """An idle connection is closed after idle_timeout; one waiting for an answer is not. On
    SIGTERM, what can finish within the drain is answered (a bucket waiter, a login that times
    out), what cannot is closed cleanly when the drain ends; the process exits 0, nothing hangs."""
    with fault_idp() as idp:
        env.write_config(IN_FLIGHT.format(base=idp.base), sidecar=f'idle_timeout = "1s"\ntoken_timeout = "2s"\ndrain_timeout = "{DRAIN}s"\n')
        sidecar = SidecarProcess(env.config, env.socket, {"MCP_TOKEN": CANARY})
        try:
            sidecar.wait_for("ready")
            started = time.monotonic()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
                idle.settimeout(20)
                idle.connect(str(env.socket))
                assert idle.recv(1) == b""  # closed by the sidecar
            assert time.monotonic() - started >= 1.0  # and not before idle_timeout
            with Client(env.socket) as client:
                assert client.acquire("quick")["granted"] == 1 and client.acquire("slow")["granted"] == 1
                with ThreadPoolExecutor(3) as pool:
                    quick = pool.submit(ask, env, "POST", "/v1/servers/quick/acquire", b'{"max_wait": 60}')
                    slow = pool.submit(ask, env, "POST", "/v1/servers/slow/acquire", b'{"max_wait": 3600}')
                    login = pool.submit(ask, env, "GET", "/v1/servers/stalled/headers")
                    assert idp.stalled.wait(20)  # the login is in progress at the IdP
                    deadline = time.monotonic() + 20
                    while not both_queued(client):
                        assert time.monotonic() < deadline, client.status()["buckets"]
                        time.sleep(0.05)
                    sidecar.signal(signal.SIGTERM)
                    assert sidecar.wait(DRAIN + 20) == 0
                    quick_kind, quick_answer = quick.result()
                    login_kind, login_answer = login.result()
                    slow_kind, _ = slow.result()
        finally:
            sidecar.stop()
    assert quick_kind == "answer" and quick_answer.startswith(b"HTTP/1.1 200 ")  # granted in the drain
    assert b'"granted":1' in quick_answer
    assert login_kind == "answer" and login_answer.startswith(b"HTTP/1.1 504 ")  # its token_timeout
    assert slow_kind == "closed"  # its permit is a minute away: closed cleanly when the drain ends
    assert not env.socket.exists()


def test_canary_never_in_logs_status_metrics_or_errors(env: Env, sidecar: SidecarProcess) -> None:
    # spawn payloads for a child, made by a CLI that holds the secret in its own environment too:
    # each names the template, never the value, and the child still gets the value from the sidecar
    template = {"Authorization": "Bearer {{secret:MCP_TOKEN}}"}
    local = run_cli("spawn-payload", "crm-ro", "--config", str(env.config), env={"MCP_TOKEN": CANARY})
    granted = run_cli("spawn-payload", "--grant", "crm-ro", "--socket", str(env.socket), env={"MCP_TOKEN": CANARY})
    assert local.code == 0 and granted.code == 0, local.output + granted.output
    assert json.loads(local.stdout)[0]["headers"] == template
    assert json.loads(granted.stdout)["servers"][0]["headers"] == template
    child = run_cli("token", "crm-ro", "--socket", str(env.socket),
                    env={"MCPCREDS_GRANT": json.loads(granted.stdout)["grant"]})
    assert child.code == 0 and child.stdout.strip() == CANARY
    with Client(env.socket) as client:
        assert client.headers("crm-ro")["Authorization"] == f"Bearer {CANARY}"
        outputs = [json.dumps(client.status()), local.output + granted.output]
        for path in ("/metrics", "/v1/servers", "/v1/openapi.json", f"/v1/servers/{CANARY}/headers",
                     "/v1/servers/broken/headers", f"/v1/secrets/{CANARY}/rotated"):
            outputs.append(str(curl(env, path)[1]))
    outputs.append(raw(env, f"GET /{CANARY} HTTP/1.1\r\nX: {CANARY}\r\nConnection: close\r\n\r\n".encode()).decode())
    # never echoed, so redaction cannot turn the answer into an oracle for a live secret
    assert CANARY not in outputs[5] and "***" not in outputs[5] and "***" not in outputs[7]
    assert sidecar.stop() == 0
    outputs.append(sidecar.log)
    for text in outputs:
        assert CANARY not in text
