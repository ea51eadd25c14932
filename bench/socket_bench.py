"""Socket benchmark: the sidecar's cached `GET /v1/servers/{name}/headers` next to a bare echo server.

Run from the repository root (the package installed, e.g. `pip install -e .`):

    python bench/socket_bench.py                  # 5 s per measurement, 1 and 32 connections
    python bench/socket_bench.py --seconds 10 --json
    python bench/socket_bench.py --quick          # a smoke run: 0.3 s per measurement, 1 and 8 connections

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

`--client` measures the library's own cost instead (issue 18): `AsyncClient.headers("bench")` at
concurrency 1 against the same request on a raw blocking keep-alive socket to the same sidecar,
one of each in turn (`--calls` pairs after a warm-up), so both see the same machine. It prints
p50 and mean of each, what the client adds (p50) and the client/raw ratio:

    python bench/socket_bench.py --client --calls 20000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import selectors
import socket
import sys
import time
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import harness, wire
from bench.harness import BenchError
from bench.wire import ResponseError
from mcpcreds import AsyncClient

SERVER_NAME = "bench"
BENCH_TOKEN = "bench-token-0123456789abcdef0123456789abcdef"
TARGET = f"/v1/servers/{SERVER_NAME}/headers"
REQUEST = wire.request_bytes("GET", TARGET)
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


async def serve_echo(path: str) -> None:
    """The echo server on `path` (in a process of its own: `harness.server_process`)."""
    server = await asyncio.get_running_loop().create_unix_server(EchoProtocol, path)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def echo_server(path: str, what: str = "the echo server") -> Iterator[str]:
    with harness.server_process(serve_echo, path, socket_path=path, what=what):
        yield path


@contextlib.contextmanager
def sidecar(tmp: Path) -> Iterator[str]:
    """The sidecar with the static bench server, checked to answer what the load will ask."""
    block = harness.static_server(SERVER_NAME, {"Authorization": "Bearer {{secret:BENCH_TOKEN}}"})
    with harness.sidecar(tmp / "sidecar", block, env={"BENCH_TOKEN": BENCH_TOKEN}) as proc:
        path = str(proc.socket)
        status, body = wire.http_get(path, TARGET)
        try:
            headers = json.loads(body)["headers"] if status == 200 else None
        except (ValueError, KeyError, TypeError):
            headers = None
        if not isinstance(headers, dict) or headers.get("Authorization") != f"Bearer {BENCH_TOKEN}":
            raise BenchError(f"GET {TARGET} answered {status}: {body[:300]!r}")
        yield path


# ------------------------------------------------------------------------------------ load workers


@dataclass
class WorkerResult:
    latencies: bytes  # array("q") of nanoseconds, one per request completed in the window
    errors: int
    first_error: str


def load(params: tuple[str, int, float, float], release: harness.Release) -> WorkerResult:
    """A load phase: open `connections` keep-alive connections, then once released drive them,
    one request in flight on each, recording after `warmup` s for `seconds` s."""
    path, connections, warmup, seconds = params
    sel = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    for _ in range(connections):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.setblocking(False)
        socks.append(sock)
    release.wait()
    gc.disable()
    try:
        return _drive(sel, socks, warmup, seconds)
    finally:
        gc.enable()
        sel.close()
        for sock in socks:
            sock.close()


def _drive(sel: selectors.BaseSelector, socks: list[socket.socket], warmup: float,
           seconds: float) -> WorkerResult:
    latencies = array("q")
    record = latencies.append
    perf = time.perf_counter_ns
    errors = harness.Errors()
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
                errors.add("the server closed a keep-alive connection")
                sel.unregister(conn)
                live -= 1
                continue
            buf += chunk
            try:
                parsed = wire.parse_response(buf)
            except ResponseError as exc:
                errors.add(str(exc))
                sel.unregister(conn)
                live -= 1
                continue
            if parsed is None:
                continue
            total, status = parsed
            if len(buf) > total:
                errors.add("more bytes than one response (pipelining is not used)")
            del buf[:]
            if done >= window_start:
                if status == 200:
                    record(done - sent_at[fd])
                else:
                    errors.add(f"HTTP {status}")
            if done < window_end:
                send(conn)
    return WorkerResult(latencies.tobytes(), errors.count, errors.first)


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


def measure(workers: harness.Workers, label: str, path: str, connections: int,
            args: argparse.Namespace) -> Figures:
    shares = harness.split(connections, args.workers)
    parts: list[WorkerResult] = workers.run(load, [(path, n, args.warmup, args.seconds) for n in shares],
                                            timeout=args.warmup + args.seconds + 30.0)
    latencies = array("q")
    for part in parts:
        latencies.frombytes(part.latencies)
    p50, p99 = ([ns / 1e6 for ns in harness.percentiles(latencies, 0.5, 0.99)] if latencies
                else (math.nan, math.nan))
    return Figures(server=label, connections=connections, requests=len(latencies),
                   rps=len(latencies) / args.seconds, p50_ms=p50, p99_ms=p99,
                   errors=sum(p.errors for p in parts),
                   first_error=harness.first_error(p.first_error for p in parts))


# ------------------------------------------------------------------------ the client against raw


async def client_against_raw(path: str, calls: int) -> dict[str, Any]:
    """`calls` pairs, in turn: a raw blocking round trip, then `AsyncClient.headers` (c=1)."""
    perf = time.perf_counter_ns
    samples: dict[str, list[int]] = {"raw socket": [], "AsyncClient.headers": []}
    raw_times, client_times = samples.values()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        async with AsyncClient(path) as creds:
            for _ in range(min(calls, 1000)):  # warm-up: the sidecar's cache, both connections
                wire.roundtrip(conn, REQUEST)
                await creds.headers(SERVER_NAME)
            for _ in range(calls):
                t0 = perf()
                status, _ = wire.roundtrip(conn, REQUEST)
                t1 = perf()
                await creds.headers(SERVER_NAME)
                t2 = perf()
                if status != 200:
                    raise BenchError(f"GET {TARGET} answered {status}")
                raw_times.append(t1 - t0)
                client_times.append(t2 - t1)
    out: dict[str, Any] = {"calls": calls}
    for name, times in samples.items():
        out[name] = {"p50_us": round(harness.percentile(sorted(times), 0.5) / 1e3, 2),
                     "mean_us": round(sum(times) / len(times) / 1e3, 2)}
    raw, client = out["raw socket"], out["AsyncClient.headers"]
    out["added_p50_us"] = round(client["p50_us"] - raw["p50_us"], 2)
    out["ratio_p50"] = round(client["p50_us"] / raw["p50_us"], 3)
    return out


def render_client(report: dict[str, Any]) -> str:
    rows = [("c=1, one of each in turn", "p50 us", "mean us")]
    rows += [(name, f"{report[name]['p50_us']:.1f}", f"{report[name]['mean_us']:.1f}")
             for name in ("raw socket", "AsyncClient.headers")]
    return (harness.table(rows) + f"\nadded by AsyncClient p50: {report['added_p50_us']:+.1f} us; "
            f"ratio AsyncClient/raw p50 {report['ratio_p50']:.2f} ({report['calls']} calls each)")


# ------------------------------------------------------------------------------------------- main


def render(report: dict[str, Any]) -> str:
    results: list[Figures] = report["results"]
    ratios: dict[int, float] = report["ratios"]
    rows = [("server", "connections", "requests/s", "p50 ms", "p99 ms", "sidecar/echo")]
    for r in results:
        ratio = f"{ratios[r.connections]:.2f}" if r.server != "echo" and r.connections in ratios else ""
        rows.append((r.server, str(r.connections), f"{r.rps:,.0f}", f"{r.p50_ms:.3f}", f"{r.p99_ms:.3f}",
                     ratio))
    return harness.table(rows)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--seconds", type=harness.positive, default=5.0,
                   help="recorded duration of each measurement")
    p.add_argument("--warmup", type=float, default=1.0, help="unrecorded warm-up before each measurement")
    p.add_argument("--connections", type=harness.levels, default=[1, 32],
                   help="comma-separated connection counts (default 1,32)")
    p.add_argument("--workers", type=harness.count, default=2, help="load generator processes (default 2)")
    p.add_argument("--sidecar-is-echo", action="store_true",
                   help="benchmark a second echo server in place of the sidecar (harness check)")
    p.add_argument("--client", action="store_true",
                   help="AsyncClient.headers against a raw socket round trip, c=1 (the library's cost)")
    p.add_argument("--calls", type=harness.count, default=20000,
                   help="with --client: calls of each (default 20000)")
    args = harness.parse(p, argv, quick={"seconds": 0.3, "warmup": 0.1, "connections": [1, 8], "calls": 2000})
    if args.client:
        with harness.workdir("socket-bench") as tmp, sidecar(tmp) as path:
            report = asyncio.run(client_against_raw(path, args.calls))
        harness.emit(args, {**harness.machine(), **report}, render_client)
        return 0
    counts: list[int] = args.connections
    if args.warmup < 0:
        p.error("--warmup must be >= 0")

    label = "echo-copy" if args.sidecar_is_echo else "sidecar"
    results: list[Figures] = []
    with harness.workdir("socket-bench") as tmp, contextlib.ExitStack() as stack:
        workers = stack.enter_context(harness.Workers(args.workers))  # they start while the servers do
        if args.sidecar_is_echo:
            sidecar_path = stack.enter_context(echo_server(str(tmp / "s.sock"), "the echo copy"))
        else:
            sidecar_path = stack.enter_context(sidecar(tmp))
        echo_path = stack.enter_context(echo_server(str(tmp / "echo.sock")))
        for connections in counts:
            for name, path in (("echo", echo_path), (label, sidecar_path)):
                harness.progress(f"measuring {name} at {connections} connection(s)...")
                results.append(measure(workers, name, path, connections, args))

    by_key = {(r.server, r.connections): r for r in results}
    ratios = {c: by_key[(label, c)].rps / by_key[("echo", c)].rps
              for c in counts if by_key[("echo", c)].rps > 0}
    if args.json:
        harness.emit(args, {
            "request": f"GET {TARGET}", "seconds": args.seconds, "warmup": args.warmup,
            "workers": args.workers, **harness.machine(), "results": [asdict(r) for r in results],
            "throughput_ratio": {str(c): round(v, 4) for c, v in ratios.items()},
        }, str)
    else:
        harness.emit(args, {"results": results, "ratios": ratios}, render)
    failed = [r for r in results if r.errors]
    for r in failed:
        print(f"socket_bench: {r.server} at {r.connections} connection(s): {r.errors} error(s), "
              f"first: {r.first_error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    harness.main(main)
