"""`mcpcreds exec`: start-up overhead, and the egress proxy's cost per CONNECT and in throughput.

    python bench/exec_bench.py [--runs 40] [--connects 300] [--megabytes 64] [--json]
    python bench/exec_bench.py --quick      # a smoke run: --runs 5 --connects 50 --megabytes 8

1. Start-up: the whole process, `mcpcreds exec NAME -- /bin/true` vs `/bin/true`, p50 and p90
   (net = inherit; and net = restricted, which adds the namespace, the proxy session and the
   forwarder).
2. The proxy: from one child started by `mcpcreds exec` (net = restricted, `--advisory` with
   MCPCREDS_EXEC_NAMESPACES=0, so that the same process can also connect directly; the proxied
   path, forwarder then the sidecar's proxy, is the one an enforced child uses), per connection:
   connect, CONNECT (or nothing, directly), send 1 byte, read it back, close; p50/p99. Then
   throughput: `--megabytes` through one tunnel vs one direct connection, to a local sink.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import harness


def _echo_server() -> int:
    """A threaded TCP echo/sink on 127.0.0.1: echoes what it reads (the sink test reads the echo)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(ConnectionResetError):  # a client that closes with data unread
            while data := conn.recv(262144):
                conn.sendall(data[-1:]) if len(data) > 1 else conn.sendall(data)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])


# ---------------------------------------------------------------------------- the child side


def _open(port: int, proxied: bool) -> socket.socket:
    if not proxied:
        return socket.create_connection(("127.0.0.1", port))
    proxy = urlsplit(os.environ["HTTPS_PROXY"])
    sock = socket.create_connection((proxy.hostname, proxy.port))
    credential = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
    sock.sendall(f"CONNECT localhost:{port} HTTP/1.1\r\nProxy-Authorization: Basic {credential}\r\n\r\n"
                 .encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def child(port: int, connects: int, megabytes: int) -> None:
    out: dict[str, dict[str, float]] = {}
    for proxied in (False, True):
        times = []
        for _ in range(connects):
            start = time.perf_counter()
            with _open(port, proxied) as sock:
                sock.sendall(b"x")
                sock.recv(1)
            times.append(time.perf_counter() - start)
        chunk = b"\0" * 262144
        with _open(port, proxied) as sock:
            start = time.perf_counter()
            for _ in range(megabytes * 4):
                sock.sendall(chunk)
                sock.recv(1)
            seconds = time.perf_counter() - start
        out["proxied" if proxied else "direct"] = {
            "p50_ms": statistics.median(times) * 1000,
            "p99_ms": harness.upper_percentile(sorted(times), 0.99) * 1000,
            "mb_per_s": megabytes / seconds}
    print(json.dumps(out))


# ---------------------------------------------------------------------------- the parent side


EXEC_BLOCKS = """[exec.plain]
env = { TOKEN = "{{secret:BENCH_TOKEN}}" }
[exec.restricted]
env = { TOKEN = "{{secret:BENCH_TOKEN}}" }
net = "restricted"
allow_hosts = ["localhost"]
allow_private = ["localhost"]
"""


def render(report: dict[str, Any]) -> str:
    lines = [f"{label:48s} p50 {r['p50_ms']:7.1f} ms   p90 {r['p90_ms']:7.1f} ms"
             for label, r in report["startup"].items()]
    for label in ("direct", "proxied"):
        r = report["proxy"][label]
        lines.append(f"{label:8s} connect+1-byte round trip p50 {r['p50_ms']:.3f} ms  "
                     f"p99 {r['p99_ms']:.3f} ms  throughput {r['mb_per_s']:.0f} MB/s")
    lines.append(f"added per CONNECT, p50: {report['added_per_connect_p50_ms']:.3f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--runs", type=harness.count, default=40,
                   help="whole processes of each command (default 40)")
    p.add_argument("--connects", type=harness.count, default=300, help="connections each way (default 300)")
    p.add_argument("--megabytes", type=harness.count, default=64,
                   help="through one connection each way (default 64)")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = harness.parse(p, argv, quick={"runs": 5, "connects": 50, "megabytes": 8})
    if args.child:
        child(args.child, args.connects, args.megabytes)
        return 0
    with harness.workdir("exec-bench") as tmp, \
            harness.sidecar(tmp, EXEC_BLOCKS, env={"BENCH_TOKEN": "bench-secret"}) as proc:
        env = harness.client_env(proc.config)
        exe = [sys.executable, "-m", "mcpcreds.cli.main", "exec"]
        true, version = "/bin/true directly", "mcpcreds --version (interpreter + CLI import)"
        inherit, restricted = "mcpcreds exec (net = inherit)", "mcpcreds exec (net = restricted, enforced)"
        commands = {true: ["/bin/true"], inherit: [*exe, "plain", "--", "/bin/true"],  # run in this order
                    restricted: [*exe, "restricted", "--", "/bin/true"],
                    version: [sys.executable, "-m", "mcpcreds.cli.main", "--version"]}
        times = {label: sorted(harness.timed_run(argv, env) for _ in range(args.runs))
                 for label, argv in commands.items()}
        startup = {label: {"p50_ms": statistics.median(times[label]) * 1000,
                           "p90_ms": harness.upper_percentile(times[label], 0.9) * 1000}
                   for label in (true, version, inherit, restricted)}  # printed in this order
        port = _echo_server()
        done = subprocess.run([*exe, "restricted", "--advisory", "--", sys.executable, __file__,
                               "--child", str(port), "--connects", str(args.connects),
                               "--megabytes", str(args.megabytes)],
                              env={**env, "MCPCREDS_EXEC_NAMESPACES": "0"}, capture_output=True,
                              text=True, check=True)
    proxy = json.loads(done.stdout)
    report = {"startup": startup, "proxy": proxy, **harness.machine(),
              "added_per_connect_p50_ms": proxy["proxied"]["p50_ms"] - proxy["direct"]["p50_ms"]}
    harness.emit(args, report, render)
    return 0


if __name__ == "__main__":
    harness.main(main)
