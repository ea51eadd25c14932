"""`mcpcreds exec`: start-up overhead, and the egress proxy's cost per CONNECT and in throughput.

    python bench/exec_bench.py [--runs 40] [--connects 300] [--megabytes 64]

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
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sidecar_proc import run_sidecar  # noqa: E402


def _echo_server() -> int:
    """A threaded TCP echo/sink on 127.0.0.1: echoes what it reads (the sink test reads the echo)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(262144):
                conn.sendall(data[-1:]) if len(data) > 1 else conn.sendall(data)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
            "p50_ms": statistics.median(times) * 1000, "p99_ms": _pct(times, 0.99) * 1000,
            "mb_per_s": megabytes / seconds}
    print(json.dumps(out))


# ---------------------------------------------------------------------------- the parent side


def _wall(command: list[str], env: dict[str, str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--connects", type=int, default=300)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.connects, args.megabytes)
        return
    with tempfile.TemporaryDirectory(prefix="exec-bench-") as tmp:
        work = Path(tmp)
        sock = work / "run" / "mcpcreds.sock"
        config = work / "config.toml"
        config.write_text(f"""
[sidecar]
socket = "{sock}"
[secrets]
sources = ["env"]
[exec.plain]
env = {{ TOKEN = "{{{{secret:BENCH_TOKEN}}}}" }}
[exec.restricted]
env = {{ TOKEN = "{{{{secret:BENCH_TOKEN}}}}" }}
net = "restricted"
allow_hosts = ["localhost"]
allow_private = ["localhost"]
""")
        with run_sidecar(config, sock, env={"BENCH_TOKEN": "bench-secret"}):
            env = {**os.environ, "MCPCREDS_CONFIG": str(config)}
            exe = [sys.executable, "-m", "mcpcreds.cli.main", "exec"]
            direct = _wall(["/bin/true"], env, args.runs)
            plain = _wall([*exe, "plain", "--", "/bin/true"], env, args.runs)
            restricted = _wall([*exe, "restricted", "--", "/bin/true"], env, args.runs)
            cli = _wall([sys.executable, "-m", "mcpcreds.cli.main", "--version"], env, args.runs)
            rows = (("/bin/true directly", direct), ("mcpcreds --version (interpreter + CLI import)", cli),
                    ("mcpcreds exec (net = inherit)", plain),
                    ("mcpcreds exec (net = restricted, enforced)", restricted))
            for label, times in rows:
                print(f"{label:48s} p50 {statistics.median(times) * 1000:7.1f} ms   "
                      f"p90 {_pct(times, 0.9) * 1000:7.1f} ms")
            port = _echo_server()
            done = subprocess.run([*exe, "restricted", "--advisory", "--", sys.executable, __file__,
                                   "--child", str(port), "--connects", str(args.connects),
                                   "--megabytes", str(args.megabytes)],
                                  env={**env, "MCPCREDS_EXEC_NAMESPACES": "0"}, capture_output=True,
                                  text=True, check=True)
            result = json.loads(done.stdout)
            for label in ("direct", "proxied"):
                r = result[label]
                print(f"{label:8s} connect+1-byte round trip p50 {r['p50_ms']:.3f} ms  "
                      f"p99 {r['p99_ms']:.3f} ms  throughput {r['mb_per_s']:.0f} MB/s")
            added = result["proxied"]["p50_ms"] - result["direct"]["p50_ms"]
            print(f"added per CONNECT, p50: {added:.3f} ms")


if __name__ == "__main__":
    main()
