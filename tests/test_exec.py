"""`mcpcreds exec` end to end: the real sidecar, the real CLI, a real stdio MCP server (the MCP SDK's,
tests/peers/mcp_stdio_server.py) driven by the SDK's stdio client, a local HTTP upstream, and the
kernel's network namespaces (these tests run as root, as CI does).

The secret is a canary held by the sidecar's environment only; no test process holds it."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from mcpcreds.cli.exec import BASE_VARS
from tests.conftest import run_cli
from tests.peers.upstream import Upstream, start_upstream
from tests.sidecar_proc import SidecarProcess, run_sidecar

ROOT = Path(__file__).resolve().parents[1]
PEER = str(ROOT / "tests" / "peers" / "mcp_stdio_server.py")
PROXY_KEYS = {"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY",
              "https_proxy", "http_proxy", "all_proxy", "no_proxy"}
DECLARED = {"GITHUB_TOKEN", "LOG_LEVEL"}
# unique to this run: other suites on the machine have their own canaries in their argv
CANARY = f"exec-canary-{secrets.token_hex(16)}"


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream() as up:
        yield up


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exec")


@pytest.fixture(scope="module")
def sidecar(workdir: Path) -> Iterator[SidecarProcess]:
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[secrets]
sources = ["env"]

[exec.gh]
env = {{ GITHUB_TOKEN = "{{{{secret:GH_TOKEN}}}}", LOG_LEVEL = "info" }}

[exec.open]
env = {{ LOG_LEVEL = "debug" }}
env_isolation = false

[exec.restricted]
env = {{ GITHUB_TOKEN = "{{{{secret:GH_TOKEN}}}}" }}
net = "restricted"
allow_hosts = ["localhost"]
allow_private = ["localhost"]

[exec.broad]
net = "broad_audited"
authorization = {{ by = "the tests", reason = "reach the test upstream" }}
deny_hosts = ["blocked.localhost"]
allow_private = ["localhost", "127.0.0.1"]

[exec.off]
net = "off"

[exec.missing]
env = {{ API_KEY = "{{{{secret:NOT_SET_ANYWHERE}}}}" }}

[exec.trio]
tags = ["sensitive", "untrusted_input"]
""")
    assert CANARY not in os.environ.values()
    with run_sidecar(config, socket, env={"GH_TOKEN": CANARY}) as proc:
        yield proc


def _launcher_env(sidecar: SidecarProcess, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MCPCREDS_GRANT", "MCPCREDS_SOCKET")}
    return {**env, "MCPCREDS_CONFIG": str(sidecar.config), "LC_TEST": "x", **extra}


def _exec_args(name: str, *command: str) -> list[str]:
    return ["-m", "mcpcreds.cli.main", "exec", name, "--", *command]


@asynccontextmanager
async def mcp_session(sidecar: SidecarProcess, name: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=_exec_args(name, sys.executable, PEER),
                                   env=_launcher_env(sidecar), cwd=str(ROOT))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _call(session: ClientSession, tool: str, **args: Any) -> str:
    result = await session.call_tool(tool, args)
    assert not result.is_error, result
    text = result.content[0].text  # type: ignore[union-attr]
    assert isinstance(text, str)
    return text


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if item)


def _cmdlines() -> str:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((entry / "cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue
    return "\n".join(found)


def _audit(workdir: Path, event: str, **match: Any) -> list[dict[str, Any]]:
    # a line the sidecar is still writing (no line end yet) is left for the next read
    lines = [json.loads(line) for line in (workdir / "audit.jsonl").read_text().splitlines(keepends=True)
             if line.endswith("\n")]
    return [e for e in lines if e["event"] == event and all(e.get(k) == v for k, v in match.items())]


def _egress(workdir: Path, session_id: str, count: int) -> list[dict[str, Any]]:
    """The session's `exec_egress` lines once there are `count`, by method and host. A line is
    written when its connection ends, which can come after the next request was refused, or
    after the session: a tool returns once it has its answer, before the proxy has seen both
    sides close."""
    deadline = time.monotonic() + 30
    while len(lines := _audit(workdir, "exec_egress", session=session_id)) < count:
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)
    return sorted(lines, key=lambda e: (e["method"], e["host"]))


def _port(upstream: Upstream) -> int:
    return int(upstream.url.rsplit(":", 1)[1])


# ---------------------------------------------------------------------------- the MCP channel


async def test_stdio_server_gets_exactly_base_and_declared_env(sidecar: SidecarProcess) -> None:
    async with mcp_session(sidecar, "gh") as session:
        tools = {t.name for t in (await session.list_tools()).tools}
        assert {"pid", "fetch", "tunnel", "direct"} <= tools
        pid = int(await _call(session, "pid"))
        env = _environ(pid)
        launcher = _launcher_env(sidecar)
        base = {k for k in launcher if k in BASE_VARS or k.startswith("LC_")}
        assert "LC_TEST" in base and "PATH" in base
        assert set(env) == base | DECLARED
        assert env["GITHUB_TOKEN"] == CANARY and env["LOG_LEVEL"] == "info"
        # the secret: in the child's environment only; not in ours, not in any argv
        assert CANARY not in os.environ.values()
        assert CANARY not in _cmdlines()
        assert (Path(f"/proc/{pid}/ns/net").resolve() == Path("/proc/self/ns/net").resolve()
                or os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"))


async def test_restricted_allows_listed_host_refuses_others_and_direct(
        sidecar: SidecarProcess, upstream: Upstream, workdir: Path) -> None:
    port = _port(upstream)
    async with mcp_session(sidecar, "restricted") as session:
        pid = int(await _call(session, "pid"))
        env = _environ(pid)
        assert set(env) >= PROXY_KEYS and env["NO_PROXY"] == ""
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        session_id = _audit(workdir, "exec", name="restricted")[-1]["session"]
        allowed = await _call(session, "fetch", url=f"http://localhost:{port}/through-proxy")
        assert allowed.startswith("200 "), allowed
        refused = await _call(session, "fetch", url=f"http://127.0.0.1:{port}/not-listed")
        assert refused.startswith("403 ") and "not in allow_hosts" in refused, refused
        tunnelled = await _call(session, "tunnel", host="localhost", port=port)
        assert tunnelled.startswith("HTTP/1.1 200") and "200" in tunnelled.split("|")[1], tunnelled
        denied = await _call(session, "tunnel", host="127.0.0.1", port=port)
        assert denied.startswith("HTTP/1.1 403"), denied
        # ignoring the proxy: the namespace has no way out (its own loopback has no upstream)
        direct = await _call(session, "direct", host="127.0.0.1", port=port)
        assert direct.startswith("error: ConnectionRefusedError"), direct
        outside = await _call(session, "direct", host="192.0.2.1", port=80)
        assert outside.startswith("error: OSError") and "unreachable" in outside, outside
    lines = _egress(workdir, session_id, 4)
    assert [(e["method"], e["host"], e["allowed"]) for e in lines] == [
        ("CONNECT", "127.0.0.1", False), ("CONNECT", "localhost", True),
        ("GET", "127.0.0.1", False), ("GET", "localhost", True)]
    for line in lines:
        assert line["port"] == port and line["duration"] >= 0
    assert all(e["bytes_up"] > 0 and e["bytes_down"] > 0 for e in lines if e["allowed"])
    assert upstream.paths().get("/through-proxy") and upstream.paths().get("/tunnelled")
    assert not upstream.paths().get("/not-listed")


async def test_off_has_no_network_at_all(sidecar: SidecarProcess, upstream: Upstream) -> None:
    port = _port(upstream)
    async with mcp_session(sidecar, "off") as session:
        env = _environ(int(await _call(session, "pid")))
        assert not PROXY_KEYS & set(env)
        fetched = await _call(session, "fetch", url=f"http://localhost:{port}/off")
        assert fetched.startswith("error: ConnectError"), fetched
        assert (await _call(session, "direct", host="127.0.0.1", port=port)).startswith("error:")
        assert "unreachable" in await _call(session, "direct", host="192.0.2.1", port=80)
    assert not upstream.paths().get("/off")


async def test_broad_audited_allows_any_host_but_denied_and_audits_each(
        sidecar: SidecarProcess, upstream: Upstream, workdir: Path) -> None:
    port = _port(upstream)
    async with mcp_session(sidecar, "broad") as session:
        await _call(session, "pid")
        session_id = _audit(workdir, "exec", name="broad")[-1]["session"]
        assert (await _call(session, "fetch", url=f"http://localhost:{port}/a")).startswith("200 ")
        assert (await _call(session, "fetch", url=f"http://127.0.0.1:{port}/b")).startswith("200 ")
        refused = await _call(session, "tunnel", host="blocked.localhost", port=port)
        assert refused.startswith("HTTP/1.1 403"), refused
    lines = _egress(workdir, session_id, 3)
    assert [(e["method"], e["host"], e["allowed"]) for e in lines] == [
        ("CONNECT", "blocked.localhost", False), ("GET", "127.0.0.1", True), ("GET", "localhost", True)]
    assert lines[0]["reason"] == "refused: deny_hosts"


# ---------------------------------------------------------------------------- the process


def _run(sidecar: SidecarProcess, name: str, *command: str, stdin: bytes = b"",
         **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, *_exec_args(name, *command)], input=stdin, capture_output=True,
                          env=_launcher_env(sidecar, **env), timeout=30)


def test_exit_status_is_the_childs_and_exec_replaces_the_process(sidecar: SidecarProcess) -> None:
    assert _run(sidecar, "gh", "sh", "-c", "exit 7").returncode == 7
    # killed by a signal: seen as such by our wait, so there is no wrapper process in between
    assert _run(sidecar, "gh", "sh", "-c", "kill -9 $$").returncode == -signal.SIGKILL
    # a child that exits before reading its stdin
    done = _run(sidecar, "restricted", "true", stdin=b"x" * 1_000_000)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b""  # mcpcreds writes nothing to the MCP channel


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 42), (signal.SIGINT, 43)])
@pytest.mark.parametrize("name", ["gh", "restricted"])
def test_signals_reach_the_child(sidecar: SidecarProcess, sig: int, code: int, name: str) -> None:
    script = ("import os, signal, sys\n"
              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
              "signal.signal(signal.SIGINT, lambda *a: sys.exit(43))\n"
              "print(os.getpid(), flush=True)\n"
              "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, *_exec_args(name, sys.executable, "-c", script)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_launcher_env(sidecar))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the child is up (no sleep)
        assert int(line) == proc.pid  # the process we started *is* the child
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == code
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_restricted_session_ends_with_the_child(sidecar: SidecarProcess, workdir: Path) -> None:
    assert _run(sidecar, "restricted", "sh", "-c", "exit 5").returncode == 5
    session_id = _audit(workdir, "exec", name="restricted")[-1]["session"]
    deadline = time.monotonic() + 20  # a generous bound: the end is pushed by the forwarder's death
    while not _audit(workdir, "exec_session_end", session=session_id, held=True):
        assert time.monotonic() < deadline, "the session outlived its child"
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status  # dead, not yet reaped by whoever adopted it


def test_forwarder_dies_with_the_child_once_it_is_running(
        sidecar: SidecarProcess, upstream: Upstream, workdir: Path) -> None:
    """The forwarder is the child's own child (forked before the execve). Only PR_SET_PDEATHSIG
    ends it when the child exits: the test above passes without it, because `sh -c "exit 5"`
    is usually gone before the forwarder's first look at its parent (the "already gone" check
    at its start). Here the child first fetches through the forwarder (so the forwarder is past
    that check and serving), and names it from /proc before exiting."""
    script = ("import httpx, os, sys\n"
              "status = httpx.get(sys.argv[1]).status_code\n"
              "kids = open(f'/proc/self/task/{os.getpid()}/children').read().split()\n"
              "print(status, *kids)\n")
    url = f"http://localhost:{_port(upstream)}/pdeathsig"
    done = _run(sidecar, "restricted", sys.executable, "-c", script, url)
    assert done.returncode == 0, done.stderr
    status, *kids = done.stdout.split()
    assert status == b"200" and len(kids) == 1, done.stdout
    forwarder = int(kids[0])
    session_id = _audit(workdir, "exec", name="restricted")[-1]["session"]
    deadline = time.monotonic() + 20  # generous: both follow the child's exit at once
    while not (_gone(forwarder) and _audit(workdir, "exec_session_end", session=session_id, held=True)):
        assert time.monotonic() < deadline, "the forwarder (and so the session) outlived its child"
        time.sleep(0.05)


def test_env_isolation_false_drops_every_variable_holding_a_known_secret(sidecar: SidecarProcess) -> None:
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    # the grant names exec:gh too: only a secret the caller could be handed is compared (no oracle)
    minted = run_cli("spawn-payload", "--config", str(sidecar.config), "--grant", "exec:open", "exec:gh",
                     "--ttl", "60")
    grant = json.loads(minted.stdout)["grant"]
    done = _run(sidecar, "open", sys.executable, "-c", dump, COPIED=CANARY, PADDED=f" {CANARY}\n",
                UNRELATED="plain", MCPCREDS_GRANT=grant)
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)
    assert "COPIED" not in env and "PADDED" not in env and "MCPCREDS_GRANT" not in env
    assert env["UNRELATED"] == "plain" and env["LOG_LEVEL"] == "debug" and "LC_TEST" in env


# ---------------------------------------------------------------------------- errors and grants


def test_bad_input(sidecar: SidecarProcess, workdir: Path) -> None:
    config = str(sidecar.config)
    unknown = run_cli("exec", "--config", config, "no-such-entry-7f3a", "--", "true")
    assert unknown.code == 2 and "unknown exec entry" in unknown.stderr
    assert "no-such-entry-7f3a" not in unknown.output
    invalid = run_cli("exec", "--config", config, "bad name/" + CANARY, "--", "true")
    assert invalid.code == 2 and CANARY not in invalid.output
    empty = run_cli("exec", "--config", config, "gh", "--")
    assert empty.code == 2 and "no command" in empty.stderr
    marker = workdir / "started"
    missing = run_cli("exec", "--config", config, "missing", "--", "touch", str(marker))
    assert missing.code == 1 and "NOT_SET_ANYWHERE" in missing.stderr and "secret_unavailable" in missing.stderr
    assert not marker.exists()
    not_found = run_cli("exec", "--config", config, "gh", "--", "no-such-command-7f3a")
    assert not_found.code == 127 and not_found.stdout == ""


def test_the_config_and_socket_options_may_follow_the_entry_name(sidecar: SidecarProcess, workdir: Path) -> None:
    """`mcpcreds exec NAME --config X -- CMD`, as docs/reference/cli.md allows it (and `--config=X`, `--socket`)."""
    marker = workdir / "after-name"
    ran = run_cli("exec", "gh", "--config", str(sidecar.config), "--", "touch", str(marker))
    assert ran.code == 0, ran.stderr
    assert marker.exists()
    both = run_cli("exec", "gh", f"--config={sidecar.config}", "--socket", str(sidecar.socket), "--", "true")
    assert both.code == 0, both.stderr
    odd = run_cli("exec", "gh", "--verbose", "--", "true")
    assert odd.code == 2 and "--config PATH" in odd.stderr


def test_print_env_masks_values(sidecar: SidecarProcess) -> None:
    shown = run_cli("exec", "--config", str(sidecar.config), "--print-env", "restricted",
                    env={"LC_TEST": "x"})
    assert shown.code == 0, shown.stderr
    assert CANARY not in shown.output
    assert "GITHUB_TOKEN=***  (declared)" in shown.stdout and "HTTPS_PROXY=***" in shown.stdout
    assert re.search(r"^PATH=\*\*\*  \(inherited\)$", shown.stdout, re.M)


def test_grants_and_the_rule_of_two(sidecar: SidecarProcess) -> None:
    config = str(sidecar.config)
    granted = run_cli("spawn-payload", "--config", config, "--grant", "exec:gh", "--ttl", "60")
    assert granted.code == 0, granted.stderr
    grant = json.loads(granted.stdout)
    assert grant["servers"][0]["name"] == "exec:gh" and CANARY not in granted.stdout
    within = run_cli("exec", "--config", config, "gh", "--", "true", env={"MCPCREDS_GRANT": grant["grant"]})
    assert within.code == 0, within.stderr
    outside = run_cli("exec", "--config", config, "off", "--", "true", env={"MCPCREDS_GRANT": grant["grant"]})
    assert outside.code == 77 and "not in this grant" in outside.stderr
    trio = run_cli("exec", "--config", config, "trio", "--", "true")
    assert trio.code == 77 and "Rule of Two" in trio.stderr
    mixed = run_cli("spawn-payload", "--config", config, "--grant", "exec:trio")
    assert mixed.code == 77


def test_without_namespaces_off_and_restricted_refuse_unless_advisory(
        sidecar: SidecarProcess, upstream: Upstream) -> None:
    no_ns = {"MCPCREDS_EXEC_NAMESPACES": "0"}
    for name in ("off", "restricted"):
        refused = _run(sidecar, name, "touch", "/nonexistent-dir/x", MCPCREDS_EXEC_NAMESPACES="0")
        assert refused.returncode == 1 and b"--advisory" in refused.stderr
    port = _port(upstream)
    script = ("import httpx, socket, sys; r = httpx.get(sys.argv[1]); "
              "socket.create_connection(('127.0.0.1', int(sys.argv[2]))).close(); print(r.status_code)")
    done = subprocess.run([sys.executable, "-m", "mcpcreds.cli.main", "exec", "restricted", "--advisory", "--",
                           sys.executable, "-c", script, f"http://localhost:{port}/advisory", str(port)],
                          capture_output=True, env=_launcher_env(sidecar, **no_ns), timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == b"200" and b"advisory" in done.stderr  # proxied; direct not stopped


def test_unprivileged_user_and_network_namespace() -> None:
    script = ("import encodings.idna, os, socket\n"
              "from mcpcreds.exec.netns import enter_network_namespace\n"  # before: /root is closed to uid 65534
              "os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)\n"
              # a uid change clears `dumpable` (/proc/self/uid_map turns root's); a user's own process has it
              "import ctypes; ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)\n"
              "how = enter_network_namespace()\n"
              "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
              "socket.create_connection(s.getsockname()).close()\n"
              "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=5)\n"
              "except OSError as exc:\n    print(how, os.getuid(), exc.errno)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["userns+netns", "65534", "101"]  # ENETUNREACH


def test_proxy_demands_the_sessions_credential(sidecar: SidecarProcess, upstream: Upstream) -> None:
    from mcpcreds import Client

    with Client(sidecar.socket) as client:
        answer = client.request("POST", "/v1/exec/restricted/session", {"proxy": True})
    path, token = answer["proxy"]["socket"], answer["proxy"]["token"]

    def connect(credential: str | None) -> bytes:
        import socket as sockets

        with sockets.socket(sockets.AF_UNIX) as sock:
            sock.connect(path)
            auth = f"Proxy-Authorization: Basic {credential}\r\n" if credential is not None else ""
            sock.sendall(f"CONNECT localhost:{_port(upstream)} HTTP/1.1\r\n{auth}\r\n".encode())
            return sock.recv(4096).split(b"\r\n", 1)[0]

    import base64

    def basic(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    assert connect(None) == b"HTTP/1.1 407 Proxy Authentication Required"
    assert connect(basic("mcpcreds:not-the-token")) == b"HTTP/1.1 407 Proxy Authentication Required"
    assert connect(basic(f"mcpcreds:{token}")) == b"HTTP/1.1 200 Connection established"
