"""An `mcpcreds exec` child is a principal of its own, not its caller: a hostile child (a real
process started by the real CLI against a real sidecar) tries the sidecar's socket, which it can
reach by path, and its forwarder's /proc files.

- The child runs in a user namespace of its own (every net mode); the sidecar lets a peer in
  another user or network namespace act only within a grant: no other server's headers (the
  cached fast path included), no other exec entry's environment, no grant minted.
- The egress forwarder (the child's own child) is re-executed with an empty environment and is
  undumpable: the caller's canary is not in its /proc/PID/environ, which the child cannot read.
- The child has a mount namespace in which the caller's runtime folder is an empty tmpfs and a
  session bus socket outside it is covered: a real gnome-keyring on a real session bus, holding
  a canary as the caller's refresh token, is out of its reach, and stays so when it tries to
  unmount the cover (as root in its user namespace, and again in a mount namespace of its own);
  the egress proxy, whose socket is in the hidden folder, still answers it.

Secrets are canaries held by the sidecar's and the caller's environments only."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import secretstorage
from jeepney.io.blocking import open_dbus_connection

from mcpcreds import Client
from tests.conftest import KeyringSession
from tests.sidecar_proc import SidecarProcess, run_sidecar

HEADER_CANARY = f"hdr-canary-{secrets.token_hex(16)}"
EXEC_CANARY = f"exec-canary-{secrets.token_hex(16)}"
CALLER_CANARY = f"caller-canary-{secrets.token_hex(16)}"

# the hostile child: every request it makes to the sidecar's socket, one JSON line of answers
HOSTILE = r"""
import json, socket, sys

def ask(method, path, body=None):
    data = b"" if body is None else json.dumps(body).encode()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect(sys.argv[1])
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
        if b"\r\n\r\n" in got:
            head, _, rest = got.partition(b"\r\n\r\n")
            length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
            if length and len(rest) >= length[0]:
                break
    s.close()
    return got.decode(errors="replace")

answers = {
    "headers": ask("GET", "/v1/servers/other/headers"),
    "headers_again": ask("GET", "/v1/servers/other/headers"),
    "session": ask("POST", "/v1/exec/secret/session", {"proxy": False}),
    "grant": ask("POST", "/v1/grants", {"servers": ["other"], "ttl": 60}),
    "health": ask("GET", "/v1/health"),
}
print(json.dumps(answers))
"""

# the hostile child reads its forwarder's (its only child's) environment, then waits for its stdin
SNOOP = r"""
import os, sys
kids = open(f"/proc/self/task/{os.getpid()}/children").read().split()
assert len(kids) == 1, kids
try:
    data = open(f"/proc/{kids[0]}/environ", "rb").read()
    print(kids[0], "read", len(data), sys.argv[1] in data.decode(errors="replace"), flush=True)
except OSError as exc:
    print(kids[0], type(exc).__name__, flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("principal")
    sock = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{sock}"
audit_log = "{workdir / 'audit.jsonl'}"

[secrets]
sources = ["env"]

[[servers]]
name = "other"
endpoint = "https://other.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:HDR}}}}" }}

[exec.secret]
env = {{ API_TOKEN = "{{{{secret:EXEC}}}}" }}

[exec.inherit]

[exec.restricted]
net = "restricted"
allow_hosts = ["example.com"]

[exec.off]
net = "off"
""")
    with run_sidecar(config, sock, env={"HDR": HEADER_CANARY, "EXEC": EXEC_CANARY}) as proc:
        with Client(str(sock)) as client:  # the header is cached: the fast path would answer it
            assert client.request("GET", "/v1/servers/other/headers")["headers"]["X-Api-Key"] == HEADER_CANARY
        yield proc


def _exec(sidecar: SidecarProcess, name: str, *command: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("MCPCREDS_GRANT", "MCPCREDS_SOCKET")}
    return subprocess.run([sys.executable, "-m", "mcpcreds.cli.main", "exec", name, "--", *command],
                          capture_output=True, text=True, timeout=60,
                          env={**environ, "MCPCREDS_CONFIG": str(sidecar.config), **env})


def _status(answer: str) -> int:
    return int(answer.split(" ", 2)[1])


@pytest.mark.parametrize("name", ["inherit", "restricted", "off"])
def test_exec_child_cannot_use_the_sidecars_api(sidecar: SidecarProcess, name: str) -> None:
    done = _exec(sidecar, name, sys.executable, "-c", HOSTILE, str(sidecar.socket))
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    assert {k: _status(v) for k, v in answers.items()} == {
        "headers": 403, "headers_again": 403, "session": 403, "grant": 403, "health": 200}, answers
    assert "within a grant" in answers["headers"] and "within a grant" in answers["grant"]
    seen = done.stdout + done.stderr
    assert HEADER_CANARY not in seen and EXEC_CANARY not in seen
    assert "reach every credential" not in done.stderr  # namespaces were there: no warning
    # the caller, outside: still served
    with Client(str(sidecar.socket)) as client:
        assert client.request("GET", "/v1/servers/other/headers")["headers"]["X-Api-Key"] == HEADER_CANARY


# run as root until the imports are done (/root, where the interpreter lives, is closed to 65534)
AS_NOBODY = r"""
import ctypes, os, sys
from mcpcreds.exec.netns import enter_user_namespace
from mcpcreds.sidecar.peer_ns import in_own_namespaces
os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # a uid change clears `dumpable`; a user's own process has it
ready_read, ready_write = os.pipe()
release_read, release_write = os.pipe()
child = os.fork()
if child == 0:
    enter_user_namespace()
    os.write(ready_write, open("/proc/self/uid_map").read().split("\n")[0].encode())
    os.read(release_read, 1)
    os._exit(0)
seen = os.read(ready_read, 64).decode()
root_child, root_outside = int(sys.argv[1]), int(sys.argv[2])
print(seen.split(), in_own_namespaces(os.getpid()), in_own_namespaces(child),
      in_own_namespaces(root_outside), in_own_namespaces(root_child), flush=True)
os.write(release_write, b"x")
os.waitpid(child, 0)
"""
ROOT_CHILD = ("import sys\nfrom mcpcreds.exec.netns import enter_user_namespace\n"
              "enter_user_namespace()\nprint(open('/proc/self/uid_map').read(), flush=True, end='')\n"
              "sys.stdin.read()\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to become 65534)")
def test_user_namespaces_as_an_ordinary_user_and_as_root_are_told_apart() -> None:
    """An ordinary user's child maps its own uid only; root's maps every id, written from outside.
    Both are told apart from their caller, by a peer of the same uid (the namespace links) and
    by another uid (the id maps: root's namespace links are closed to 65534)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    root = subprocess.Popen([sys.executable, "-c", ROOT_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert root.stdout is not None and root.stdin is not None
        assert (root.stdout.readline() + root.stdout.readline()).split() == ["0", "0", "1", "1", "1", "4294967294"]
        from mcpcreds.sidecar.peer_ns import in_own_namespaces

        assert not in_own_namespaces(root.pid) and in_own_namespaces(os.getpid())
        done = subprocess.run([sys.executable, "-c", AS_NOBODY, str(root.pid), str(os.getpid())],
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "['65534', '65534', '1'] True False True False", done.stdout
    finally:
        root.kill()
        root.wait()


def test_without_namespaces_the_child_is_its_caller_and_stderr_says_so(sidecar: SidecarProcess) -> None:
    done = _exec(sidecar, "inherit", sys.executable, "-c", HOSTILE, str(sidecar.socket),
                 MCPCREDS_EXEC_NAMESPACES="0")
    assert done.returncode == 0, done.stderr
    assert "the child can reach every credential you can" in done.stderr
    assert _status(json.loads(done.stdout)["headers"]) == 200  # as documented: not contained


def test_forwarder_holds_nothing_of_the_caller_and_is_unreadable(sidecar: SidecarProcess) -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("MCPCREDS_GRANT", "MCPCREDS_SOCKET")}
    proc = subprocess.Popen([sys.executable, "-m", "mcpcreds.cli.main", "exec", "restricted", "--",
                             sys.executable, "-c", SNOOP, CALLER_CANARY[:12]],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**environ, "MCPCREDS_CONFIG": str(sidecar.config), "CALLER_SECRET": CALLER_CANARY})
    try:
        assert proc.stdout is not None
        forwarder, *seen = proc.stdout.readline().split()  # the child is up, its forwarder too
        assert seen == ["PermissionError"], seen
        # from outside (root may look): the forwarder's environment is empty, whatever the caller's
        assert Path(f"/proc/{forwarder}/environ").read_bytes() == b""
        _out, err = proc.communicate("", timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


SYSTEM_PYTHON = "/usr/bin/python3.11"  # one uid 65534 may run (this one lives under /root)
# as 65534: the CLI's steps (namespaces, forwarder), then the child (by execve) snoops
AS_USER_CLI = r"""
import os, socket, sys
from mcpcreds.exec.netns import enter_network_namespace, start_forwarder
assert enter_network_namespace() == "userns+netns"
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen()
hold, _sidecar_end = socket.socketpair()
forwarder = start_forwarder(listener, "/nonexistent/egress.sock", hold)
listener.close(); hold.close()
os.execve(sys.executable, [sys.executable, "-c", sys.argv[1], str(forwarder)], {"PATH": "/usr/bin"})
"""
SNOOP_PID = r"""
import sys
try:
    data = open(f"/proc/{sys.argv[1]}/environ", "rb").read()
    print("read", b"caller-canary" in data)
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK) or shutil.which("setpriv") is None,
                    reason="needs root, setpriv and a system python 3.11")
def test_an_ordinary_users_forwarder_is_unreadable_to_the_child() -> None:
    """As an ordinary user the child and the forwarder share a uid and a user namespace: only the
    forwarder's clean environment and PR_SET_DUMPABLE 0 keep the caller's variables from it."""
    # the package where nobody can read it: a checkout may sit in a folder only root enters (0700)
    src = Path(tempfile.mkdtemp(prefix="mcpcreds-as-nobody-"))
    try:
        src.chmod(0o755)
        shutil.copytree(Path(__file__).resolve().parents[1] / "src" / "mcpcreds", src / "mcpcreds",
                        ignore=shutil.ignore_patterns("__pycache__"))
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON,
                               "-c", AS_USER_CLI, SNOOP_PID], capture_output=True, text=True, timeout=60, cwd="/",
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(src), "CALLER_SECRET": CALLER_CANARY})
    finally:
        shutil.rmtree(src, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "PermissionError", done.stdout


REFRESH_CANARY = f"refresh-canary-{secrets.token_hex(16)}"
# the hostile child: the caller's keyring (bus address in argv: a child can list a folder for it),
# its runtime folder, the sidecar's socket, then the same after trying to unmount the cover
SESSION_SNOOP = r"""
import base64, ctypes, errno, json, os, socket, sys
from urllib.parse import unquote, urlsplit
bus, canary, sidecar = sys.argv[1:4]
runtime = os.environ["XDG_RUNTIME_DIR"]
libc = ctypes.CDLL(None, use_errno=True)

def keyring():
    try:
        import secretstorage
        from jeepney.io.blocking import open_dbus_connection
        with open_dbus_connection(bus=bus) as conn:
            items = secretstorage.get_default_collection(conn).get_all_items()
            return canary in [item.get_secret().decode() for item in items]
    except Exception as exc:
        return type(exc).__name__

def reach(path):
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
        return "connected"
    except OSError as exc:
        return type(exc).__name__

def proxy():
    url = os.environ.get("HTTPS_PROXY")
    if not url:
        return None
    parts = urlsplit(url)
    credential = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password)}".encode()).decode()
    with socket.create_connection((parts.hostname, parts.port), timeout=20) as s:
        s.sendall(b"CONNECT not-allowed.example:443 HTTP/1.1\r\nHost: not-allowed.example:443\r\n"
                  + f"Proxy-Authorization: Basic {credential}\r\n\r\n".encode())
        return s.recv(4096).split(b"\r\n")[0].decode()

def umount():
    return "unmounted" if libc.umount2(runtime.encode(), 0) == 0 else errno.errorcode[ctypes.get_errno()]

out = {"keyring": keyring(), "runtime": sorted(os.listdir(runtime)), "sidecar": reach(sidecar),
       "proxy": proxy(), "umount": umount()}
out["unshare"] = libc.unshare(0x00020000) == 0  # CLONE_NEWNS: root in its user namespace may
out["umount_again"] = umount()
out["keyring_after"], out["runtime_after"] = keyring(), sorted(os.listdir(runtime))
print(json.dumps(out))
"""


@pytest.fixture
def refresh_token(keyring_session: KeyringSession) -> Iterator[KeyringSession]:
    """The caller's keyring holds a refresh token (a canary), as `mcpcreds login` leaves one."""
    with open_dbus_connection(bus=keyring_session.bus_address) as conn:
        item = secretstorage.get_default_collection(conn).create_item(
            "mcpcreds refresh token", {"service": "exec-principal-test"}, REFRESH_CANARY.encode())
    try:
        yield keyring_session
    finally:
        with open_dbus_connection(bus=keyring_session.bus_address) as conn:
            secretstorage.Item(conn, item.item_path).delete()


def _caller_reads_the_keyring(session: KeyringSession) -> bool:
    with open_dbus_connection(bus=session.bus_address) as conn:
        items = secretstorage.get_default_collection(conn).get_all_items()
        return REFRESH_CANARY in [item.get_secret().decode() for item in items]


@pytest.mark.parametrize("bus", ["in-runtime", "elsewhere"])
@pytest.mark.parametrize("name", ["inherit", "restricted", "off"])
def test_exec_child_cannot_reach_the_callers_session_bus_and_keyring(
        sidecar: SidecarProcess, refresh_token: KeyringSession, name: str, bus: str) -> None:
    """`in-runtime`: the bus socket is in the runtime folder (as /run/user/UID/bus is). `elsewhere`:
    the runtime folder is the sidecar's socket folder (egress.sock is there) and the bus socket is
    outside it."""
    session = refresh_token
    runtime = session.env["XDG_RUNTIME_DIR"] if bus == "in-runtime" else str(sidecar.socket.parent)
    before = sorted(os.listdir(runtime))
    assert _caller_reads_the_keyring(session)
    done = _exec(sidecar, name, sys.executable, "-c", SESSION_SNOOP, session.bus_address, REFRESH_CANARY,
                 str(sidecar.socket), XDG_RUNTIME_DIR=runtime, DBUS_SESSION_BUS_ADDRESS=session.bus_address)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["keyring"] in ("FileNotFoundError", "ConnectionRefusedError"), seen  # not True: read
    assert seen["runtime"] == [] and seen["runtime_after"] == [], seen
    assert seen["umount"] in ("EPERM", "EINVAL") and seen["umount_again"] in ("EPERM", "EINVAL"), seen
    assert seen["keyring_after"] == seen["keyring"], seen
    if bus == "elsewhere":
        assert seen["sidecar"] == "FileNotFoundError", seen  # its default folder: the runtime folder
        if name == "restricted":  # the forwarder still reaches egress.sock in the hidden folder
            assert seen["proxy"].startswith("HTTP/1.1 403"), seen
            assert "refused egress to not-allowed.example:443" in done.stderr
    assert REFRESH_CANARY not in done.stdout + done.stderr and "cannot hide" not in done.stderr
    # the caller's own mounts are untouched: its runtime folder and keyring as they were
    assert sorted(os.listdir(runtime)) == before and _caller_reads_the_keyring(session)


# as 65534: the CLI's steps (its user namespace, the cover), then the child (by execve) tries the bus
AS_USER_HIDE = r"""
import os, socket, sys
from mcpcreds.exec.mountns import hide_session
from mcpcreds.exec.netns import enter_user_namespace
runtime, snoop = sys.argv[1:3]
with socket.socket(socket.AF_UNIX) as s:
    s.connect(runtime + "/bus")  # reachable as the caller
enter_user_namespace()
hide_session({"XDG_RUNTIME_DIR": runtime}, os.geteuid())
os.execve(sys.executable, [sys.executable, "-c", snoop, runtime], {"PATH": "/usr/bin"})
"""
USER_SNOOP = r"""
import ctypes, errno, os, socket, sys
runtime = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)

def reach():
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(runtime + "/bus")
        return "connected"
    except OSError as exc:
        return type(exc).__name__

def umount():
    return "unmounted" if libc.umount2(runtime.encode(), 0) == 0 else errno.errorcode[ctypes.get_errno()]

seen = [reach(), os.listdir(runtime), umount()]
nested = libc.unshare(0x10000000 | 0x00020000) == 0  # a user and mount namespace of its own: caps there
print(*seen, nested, umount(), reach())
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK) or shutil.which("setpriv") is None,
                    reason="needs root, setpriv and a system python 3.11")
def test_an_ordinary_users_child_cannot_uncover_its_runtime_folder() -> None:
    """As an ordinary user the cover is made inside the child's user namespace: the child has no
    capability left after `execve`, and in a namespace of its own the cover is locked."""
    top = Path(tempfile.mkdtemp(prefix="mcpcreds-hide-"))
    try:
        top.chmod(0o755)
        shutil.copytree(Path(__file__).resolve().parents[1] / "src" / "mcpcreds", top / "mcpcreds",
                        ignore=shutil.ignore_patterns("__pycache__"))
        runtime = top / "run"
        runtime.mkdir(mode=0o700)
        os.chown(runtime, 65534, 65534)
        with socket.socket(socket.AF_UNIX) as bus:  # the caller's session bus, as it were
            bus.bind(str(runtime / "bus"))
            bus.listen()
            (runtime / "bus").chmod(0o666)
            done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON,
                                   "-c", AS_USER_HIDE, str(runtime), USER_SNOOP], capture_output=True, text=True,
                                  timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(top)})
            assert done.returncode == 0, done.stderr
            assert done.stdout.split() == ["FileNotFoundError", "[]", "EPERM", "True", "EINVAL",
                                           "FileNotFoundError"], done.stdout
            assert sorted(os.listdir(runtime)) == ["bus"]  # the caller's folder as it was
    finally:
        shutil.rmtree(top, ignore_errors=True)
