"""Socket benchmark: the sidecar's cached `GET /v1/servers/{name}/headers` next to a bare echo server.

Run from the repository root (the package installed, e.g. `pip install -e .`):

    python bench/socket_bench.py                  # 5 s per measurement, 1 and 32 connections
    python bench/socket_bench.py --seconds 10 --json

What it measures: requests/s and p50/p99 latency of `GET /v1/servers/bench/headers` on keep-alive
connections to `mcpcreds serve` (a static `Bearer {{secret:BENCH_TOKEN}}` header from the
environment, so after the first call every answer comes from the cache), at 1 and 32 connections.
The same load, from the same generator, is sent in the same run to a baseline: a bare asyncio
`Protocol` on a Unix socket that answers every request (end of request = `\\r\\n\\r\\n`) with one fixed
HTTP/1.1 200 JSON answer of the same size. The sidecar/echo ratio is the share of the bare event
loop's throughput the sidecar keeps.

The load comes from separate OS processes (`--workers`, default 2) each driving its share of the
connections with non-blocking sockets and `selectors`, one request in flight per connection,
timing each request with `time.perf_counter_ns`. Each measurement runs a warm-up (`--warmup`,
default 1 s) and then `--seconds` (default 5 s) of recorded requests. Every process shares the
machine's cores, so compare figures taken in the same run only.

`--sidecar-is-echo` replaces the sidecar with a second copy of the echo server (to check the
harness itself; the ratio should then be close to 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

SERVER_NAME = "bench"
BENCH_TOKEN = "bench-token-0123456789abcdef0123456789abcdef"
REQUEST = (
    f"GET /v1/servers/{SERVER_NAME}/headers HTTP/1.1\r\n"
    "Host: mcpcreds\r\n"
    "Accept: application/json\r\n"
    "\r\n"
).encode("ascii")
# What the sidecar answers for the bench server (a static header: no login, no expiry).
ECHO_BODY = json.dumps(
    {"headers": {"Authorization": f"Bearer {BENCH_TOKEN}"}, "key": f"mcp:{SERVER_NAME}",
     "expires_at": None, "fingerprint": None},
    separators=(",", ":"),
).encode()
ECHO_RESPONSE = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: " + str(len(ECHO_BODY)).encode() + b"\r\n"
    b"\r\n" + ECHO_BODY
)
CONFIG_TEMPLATE = """\
[sidecar]
socket = "{socket}"

[secrets]
sources = ["env"]

[[servers]]
name = "{name}"
endpoint = "https://bench.example.com/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:BENCH_TOKEN}}}}" }}
"""
READY_TIMEOUT = 10.0
READY_POLL = 0.02


class BenchError(Exception):
    """A server did not come up or answered wrongly: the message says which and why."""


# ------------------------------------------------------------------------------------------- HTTP


class ResponseError(Exception):
    pass


def parse_response(buf: bytearray | bytes) -> tuple[int, int] | None:
    """`(length, status)` of the first complete response in `buf`, or None if it is incomplete."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = bytes(buf[:head_end]).lower()
    if not head.startswith(b"http/1.1 "):
        raise ResponseError(f"not an HTTP/1.1 response: {bytes(buf[:40])!r}")
    length = 0
    start = head.find(b"\r\ncontent-length:")
    if start >= 0:
        stop = head.find(b"\r\n", start + 2)
        length = int(head[start + 17 : stop if stop >= 0 else None])
    elif b"\r\ntransfer-encoding:" in head:
        raise ResponseError("chunked responses are not supported by this benchmark")
    total = head_end + 4 + length
    if len(buf) < total:
        return None
    return total, int(head[9:12])


def http_get(path: str, target: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One blocking GET over the Unix socket at `path`: `(status, body)`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: mcpcreds\r\nAccept: application/json\r\n\r\n".encode())
        buf = bytearray()
        while (parsed := parse_response(buf)) is None:
            chunk = sock.recv(65536)
            if not chunk:
                raise ResponseError(f"connection closed after {len(buf)} bytes")
            buf += chunk
        total, status = parsed
        return status, bytes(buf[buf.find(b"\r\n\r\n") + 4 : total])


def wait_ready(path: str, alive: Any, what: str) -> None:
    """Poll until the socket accepts and `GET /v1/health` answers 200; `alive()` False means it died."""
    deadline = time.monotonic() + READY_TIMEOUT
    last = "the socket never appeared"
    while time.monotonic() < deadline:
        if not alive():
            raise BenchError(f"{what} exited before it was ready ({last})")
        try:
            status, body = http_get(path, "/v1/health", timeout=2.0)
        except (OSError, ResponseError) as exc:
            last = f"connect/GET /v1/health: {exc}"
        else:
            if status == 200:
                return
            last = f"GET /v1/health answered {status}: {body[:200]!r}"
        time.sleep(READY_POLL)
    raise BenchError(f"{what} was not ready after {READY_TIMEOUT:.0f} s ({last})")


# ------------------------------------------------------------------------------- the echo baseline


class EchoProtocol(asyncio.Protocol):
    """Answers each request (up to its blank line) with the one fixed response; keep-alive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        count = buf.count(b"\r\n\r\n")
        if count and self.transport is not None:
            self.transport.write(ECHO_RESPONSE * count)
            buf = buf[buf.rfind(b"\r\n\r\n") + 4 :]
        self.buf = buf


async def _serve_echo(path: str) -> None:
    server = await asyncio.get_running_loop().create_unix_server(EchoProtocol, path)
    async with server:
        await server.serve_forever()


def run_echo_server(path: str) -> None:
    """Process target: the echo server on `path`, until terminated."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_echo(path))


# ------------------------------------------------------------------------------------ load workers


@dataclass
class WorkerResult:
    latencies: bytes  # array("q") of nanoseconds, one per request completed in the window
    errors: int
    first_error: str


def run_load_worker(path: str, connections: int, warmup: float, seconds: float, ctl: Connection) -> None:
    """Process target: open `connections` keep-alive connections, then on "go" drive them."""
    gc.disable()
    sel = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    try:
        for _ in range(connections):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            sock.setblocking(False)
            socks.append(sock)
    except OSError as exc:
        ctl.send(("error", f"connect {path}: {exc}"))
        return
    ctl.send(("ready", ""))
    ctl.recv()  # "go"

    latencies = array("q")
    record = latencies.append
    perf = time.perf_counter_ns
    errors = 0
    first_error = ""
    now = perf()
    window_start = now + int(warmup * 1e9)
    window_end = window_start + int(seconds * 1e9)
    bufs: dict[int, bytearray] = {}
    sent_at: dict[int, int] = {}

    def send(sock: socket.socket) -> None:
        fd = sock.fileno()
        sent_at[fd] = perf()
        sent = sock.send(REQUEST)
        if sent != len(REQUEST):  # a short write of ~80 bytes on an idle socket: not expected
            sock.setblocking(True)
            sock.sendall(REQUEST[sent:])
            sock.setblocking(False)

    for sock in socks:
        bufs[sock.fileno()] = bytearray()
        sel.register(sock, selectors.EVENT_READ, sock)
        send(sock)

    live = len(socks)
    while live:
        events = sel.select(0.1)
        now = perf()
        if now >= window_end:
            break
        for key, _ in events:
            conn: socket.socket = key.data
            fd = key.fd
            buf = bufs[fd]
            try:
                chunk = conn.recv(65536)
            except BlockingIOError:
                continue
            done = perf()
            if not chunk:
                errors += 1
                first_error = first_error or "the server closed a keep-alive connection"
                sel.unregister(conn)
                live -= 1
                continue
            buf += chunk
            try:
                parsed = parse_response(buf)
            except ResponseError as exc:
                errors += 1
                first_error = first_error or str(exc)
                sel.unregister(conn)
                live -= 1
                continue
            if parsed is None:
                continue
            total, status = parsed
            if len(buf) > total:
                errors += 1
                first_error = first_error or "more bytes than one response (pipelining is not used)"
            del buf[:]
            if done >= window_start:
                if status == 200:
                    record(done - sent_at[fd])
                else:
                    errors += 1
                    first_error = first_error or f"HTTP {status}"
            if done < window_end:
                send(conn)
    sel.close()
    for sock in socks:
        sock.close()
    ctl.send(("done", WorkerResult(latencies.tobytes(), errors, first_error)))


# ------------------------------------------------------------------------------------ measurement


@dataclass
class Figures:
    server: str
    connections: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    first_error: str


def percentile(sorted_values: list[int], q: float) -> float:
    """Nearest-rank percentile, in the values' unit."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q * len(sorted_values) + 0.5)))
    return float(sorted_values[rank - 1])


def measure(label: str, path: str, connections: int, workers: int, warmup: float,
            seconds: float) -> Figures:
    ctx = multiprocessing.get_context("spawn")
    nworkers = max(1, min(workers, connections))
    shares = [connections // nworkers + (1 if i < connections % nworkers else 0) for i in range(nworkers)]
    procs: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    try:
        for share in shares:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=run_load_worker, args=(path, share, warmup, seconds, child),
                               daemon=True)
            proc.start()
            child.close()
            procs.append((proc, parent))
        for _, pipe in procs:
            kind, message = _recv(pipe, 30.0)
            if kind != "ready":
                raise BenchError(f"{label}: load worker failed: {message}")
        for _, pipe in procs:
            pipe.send("go")
        latencies = array("q")
        errors = 0
        first_error = ""
        for _, pipe in procs:
            kind, result = _recv(pipe, warmup + seconds + 30.0)
            assert kind == "done" and isinstance(result, WorkerResult)
            latencies.frombytes(result.latencies)
            errors += result.errors
            first_error = first_error or result.first_error
    finally:
        for worker, pipe in procs:
            pipe.close()
            worker.join(5)
            if worker.is_alive():
                worker.kill()
                worker.join()
    ordered = sorted(latencies)
    return Figures(
        server=label, connections=connections, requests=len(ordered), rps=len(ordered) / seconds,
        p50_ms=percentile(ordered, 0.50) / 1e6, p99_ms=percentile(ordered, 0.99) / 1e6,
        errors=errors, first_error=first_error,
    )


def _recv(pipe: Connection, timeout: float) -> tuple[str, Any]:
    if not pipe.poll(timeout):
        raise BenchError(f"a load worker did not answer within {timeout:.0f} s")
    try:
        message: tuple[str, Any] = pipe.recv()
    except EOFError:
        raise BenchError("a load worker died (see its traceback above)") from None
    return message


# ---------------------------------------------------------------------------------------- servers


@contextlib.contextmanager
def echo_server(path: str, what: str = "the echo server") -> Iterator[str]:
    proc = multiprocessing.get_context("spawn").Process(target=run_echo_server, args=(path,), daemon=True)
    proc.start()
    try:
        wait_ready(path, proc.is_alive, what)
        yield path
    finally:
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()


@contextlib.contextmanager
def sidecar(tmp: Path) -> Iterator[str]:
    """`python -m mcpcreds.cli serve` on a temp config; fails with its log if it does not come up."""
    path = str(tmp / "s.sock")
    config = tmp / "bench.toml"
    config.write_text(CONFIG_TEMPLATE.format(socket=path, name=SERVER_NAME), encoding="utf-8")
    log_path = tmp / "sidecar.log"
    env = {**os.environ, "BENCH_TOKEN": BENCH_TOKEN}
    command = [sys.executable, "-m", "mcpcreds.cli", "serve", "--config", str(config)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env)
    try:
        try:
            wait_ready(path, lambda: proc.poll() is None, "the sidecar")
            target = REQUEST.split(b" ", 2)[1].decode()  # exactly what the load will ask
            status, body = http_get(path, target)
            if status != 200:
                raise BenchError(f"GET {target} answered {status}: {body[:300]!r}")
            try:
                headers = json.loads(body)["headers"]
            except (ValueError, KeyError, TypeError):
                raise BenchError(
                    f"GET {target}: unexpected body {body[:300]!r}") from None
            if headers.get("Authorization") != f"Bearer {BENCH_TOKEN}":
                raise BenchError(f"GET {target}: wrong headers {sorted(headers)}")
        except BenchError as exc:
            code = proc.poll()
            state = f"exit status {code}" if code is not None else "still running"
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:].strip() or "(no output)"
            raise BenchError(
                f"the sidecar did not come up: {exc}\n  command: {' '.join(command)}\n  process: {state}\n"
                f"  its output:\n    " + tail.replace("\n", "\n    ")
            ) from None
        yield path
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seconds", type=float, default=5.0, help="recorded duration of each measurement")
    p.add_argument("--warmup", type=float, default=1.0, help="unrecorded warm-up before each measurement")
    p.add_argument("--connections", default="1,32", help="comma-separated connection counts (default 1,32)")
    p.add_argument("--workers", type=int, default=2, help="load generator processes (default 2)")
    p.add_argument("--json", action="store_true", help="print machine-readable figures")
    p.add_argument("--sidecar-is-echo", action="store_true",
                   help="benchmark a second echo server in place of the sidecar (harness check)")
    args = p.parse_args(argv)
    try:
        args.connection_counts = [int(c) for c in args.connections.split(",") if c.strip()]
    except ValueError:
        p.error(f"--connections: not a list of integers: {args.connections!r}")
    if not args.connection_counts or min(args.connection_counts) < 1:
        p.error("--connections: each count must be >= 1")
    if args.seconds <= 0 or args.warmup < 0 or args.workers < 1:
        p.error("--seconds must be > 0, --warmup >= 0, --workers >= 1")
    return args


def render_table(results: list[Figures], ratios: dict[int, float]) -> str:
    rows = [("server", "connections", "requests/s", "p50 ms", "p99 ms", "sidecar/echo")]
    for r in results:
        ratio = f"{ratios[r.connections]:.2f}" if r.server != "echo" and r.connections in ratios else ""
        rows.append((r.server, str(r.connections), f"{r.rps:,.0f}", f"{r.p50_ms:.3f}", f"{r.p99_ms:.3f}",
                     ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="mcpcreds-bench-"))
    label = "echo-copy" if args.sidecar_is_echo else "sidecar"
    results: list[Figures] = []
    try:
        with contextlib.ExitStack() as stack:
            if args.sidecar_is_echo:
                sidecar_path = stack.enter_context(echo_server(str(tmp / "s.sock"), "the echo copy"))
            else:
                sidecar_path = stack.enter_context(sidecar(tmp))
            echo_path = stack.enter_context(echo_server(str(tmp / "echo.sock")))
            for connections in args.connection_counts:
                for name, path in (("echo", echo_path), (label, sidecar_path)):
                    if not args.json:
                        print(f"measuring {name} at {connections} connection(s)...", file=sys.stderr)
                    results.append(measure(name, path, connections, args.workers, args.warmup, args.seconds))
    except BenchError as exc:
        print(f"socket_bench: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    by_key = {(r.server, r.connections): r for r in results}
    ratios = {
        c: by_key[(label, c)].rps / by_key[("echo", c)].rps
        for c in args.connection_counts if by_key[("echo", c)].rps > 0
    }
    if args.json:
        print(json.dumps({
            "request": f"GET /v1/servers/{SERVER_NAME}/headers",
            "seconds": args.seconds, "warmup": args.warmup, "workers": args.workers,
            "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "results": [asdict(r) for r in results],
            "throughput_ratio": {str(c): round(v, 4) for c, v in ratios.items()},
        }, indent=2))
    else:
        print(render_table(results, ratios))
    failed = [r for r in results if r.errors]
    for r in failed:
        print(f"socket_bench: {r.server} at {r.connections} connection(s): {r.errors} error(s), "
              f"first: {r.first_error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
