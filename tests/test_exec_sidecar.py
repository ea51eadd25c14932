"""`mcpcreds exec` against a sidecar of its own: `egress.sock` as another uid sees it, its end
at shutdown, and a canary secret that a hostile child tries to push into every place the sidecar
writes (logs, audit lines, status, metrics, error answers).

The canary is held by the sidecar's environment only; the child gets it from `[exec.r]`."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mcpcreds import Client
from tests.conftest import run_cli
from tests.sidecar_proc import run_sidecar

CANARY = f"exec-canary-{secrets.token_hex(16)}"
NOBODY = 65534
NOBODY_CONNECT = ("import socket, sys\n"
                  "s = socket.socket(socket.AF_UNIX)\n"
                  "try:\n    s.connect(sys.argv[1]); print('connected')\n"
                  "except OSError as exc:\n    print(type(exc).__name__)\n")


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("mcpcreds", timeout=20)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(20)
        self.sock.connect(str(self.path))


def _get(path: Path, target: str) -> str:
    conn = _Unix(path)
    try:
        conn.request("GET", target)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _proxy(path: str, token: str, line: str) -> bytes:
    """One request to the egress proxy; everything it answers."""
    credential = base64.b64encode(f"mcpcreds:{token}".encode()).decode()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)
        sock.connect(path)
        sock.sendall(f"{line}\r\nProxy-Authorization: Basic {credential}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    return data


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_egress_socket_closed_to_others_gone_at_shutdown_and_no_secret_anywhere(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "mcpcreds.sock"
    config = tmp_path / "config.toml"
    audit = tmp_path / "audit.jsonl"
    config.write_text(f"""
[sidecar]
socket = "{sock}"
audit_log = "{audit}"

[secrets]
sources = ["env"]

[exec.r]
env = {{ API_TOKEN = "{{{{secret:EXEC_CANARY}}}}" }}
net = "restricted"
allow_hosts = ["localhost"]
allow_private = ["localhost"]
""")
    assert CANARY not in os.environ.values()
    egress = sock.with_name("egress.sock")
    with run_sidecar(config, sock, env={"EXEC_CANARY": CANARY}) as proc:
        # the child's view: its secret in its environment, nothing on stdout but its own
        script = "import hashlib, os; print(hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest())"
        ran = run_cli("exec", "--config", str(config), "r", "--", sys.executable, "-c", script)
        assert ran.code == 0 and ran.stdout == hashlib.sha256(CANARY.encode()).hexdigest() + "\n", ran.stderr
        with Client(str(sock)) as client:
            answer = client.request("POST", "/v1/exec/r/session", {"proxy": True})
        path, token = answer["proxy"]["socket"], answer["proxy"]["token"]
        assert path == str(egress)
        info = egress.lstat()
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == os.getuid() and stat.S_IMODE(egress.parent.lstat().st_mode) == 0o700
        nobody = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                 sys.executable, "-S", "-c", NOBODY_CONNECT, path],
                                capture_output=True, text=True, timeout=30)
        assert nobody.stdout.strip() == "PermissionError", nobody

        # a hostile child (it holds its secret) writes it wherever the sidecar might repeat it
        answers = [_proxy(path, token, f"CONNECT {CANARY}:443 HTTP/1.1"),
                   _proxy(path, token, f"GET http://{CANARY}.localhost/{CANARY} HTTP/1.1"),
                   _proxy(path, CANARY, "CONNECT localhost:443 HTTP/1.1"),
                   _proxy(path, token, f"CONNECT localhost:{CANARY} HTTP/1.1")]
        assert [a.split(b"\r\n", 1)[0][:12] for a in answers] == [b"HTTP/1.1 403", b"HTTP/1.1 403",
                                                                   b"HTTP/1.1 407", b"HTTP/1.1 400"]
        shown = run_cli("exec", "--config", str(config), "--print-env", "r")
        assert shown.code == 0 and "API_TOKEN=***" in shown.stdout
        bad = run_cli("exec", "--config", str(config), f"x/{CANARY}", "--", "true")
        assert bad.code == 2
        status = run_cli("status", "--config", str(config), "--json")
        metrics = _get(sock, "/metrics")
        assert "mcpcreds" in metrics  # answered
        seen = "".join(a.decode(errors="replace") for a in answers)
        seen += shown.output + bad.output + status.output + metrics + ran.stderr
        assert CANARY not in seen
        assert proc.stop() == 0
    assert not egress.exists() and not sock.exists()  # closed and unlinked at shutdown
    log = proc.log
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert CANARY not in log and CANARY not in audit.read_text()
    # the attempts happened and were audited (with the secret masked)
    egress_lines = [e for e in lines if e["event"] == "exec_egress"]
    assert [e["allowed"] for e in egress_lines] == [False, False, False]
    assert [e["host"] for e in egress_lines] == ["***", "***.localhost", "localhost"]
