"""TCP listener benchmark: the gateway through `[gateway] listen` against the Unix socket.

Run from the repository root (the package installed, with the test extras: the MCP SDK 2.x):

    python bench/tcp_bench.py
    python bench/tcp_bench.py --seconds 10 --rounds 5 --idle 5000
    python bench/tcp_bench.py --quick           # a smoke run of a few seconds
    python bench/tcp_bench.py --event-loop asyncio   # the sidecar on asyncio's own loop

Processes: the real MCP SDK 2.x server of the tests (`tests/peers/mcp_gateway_peer.py`), one
real sidecar (`mcpcreds serve`) with a loopback TCP listener, and this client. The server `bench`
has a static API key, `trust = "trusted"` and a rate no call waits for. The two ways to the same
sidecar and upstream take turns, `--rounds` times:

- `unix`: the SDK client to `http://mcpcreds/mcp/bench` through `creds.mcp_httpx2_client`;
- `tcp`:  the SDK client to `http://127.0.0.1:PORT/mcp/bench` with a plain `httpx2.AsyncClient`
  (what an MCP client that cannot use a Unix socket does).

(a) 1 and 16 MCP sessions (`--sessions`) calling `tools/call` (`add`) at once for `--seconds`:
    calls/s, p50 per call and the CPU per call of the sidecar and of this client, each way; the
    ratio tcp/unix (goal: within 1.2x), of the medians and round by round.
(b) one session's tools/call answers (SSE), each read to its last byte on a kept connection, as
    the MCP SDK 1.x client reads them: p50 to the last byte, each way.
(c) a new connection's cost: `GET /v1/health` on a fresh connection (one request, then closed),
    over TCP and over the socket, against a request on a kept TCP connection; with no idle
    sockets on the host and with `--idle` idle loopback connections held open by this process.
(d) the uid lookup itself, in this process, with the same sockets: the kernel asked for the one
    connection (`lookup_uid`, NETLINK_SOCK_DIAG) against the whole table read
    (`proc_lookup_uid`, the fallback where the kernel has no sock_diag).

Client, sidecar and server share the machine's cores: compare figures of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import socket
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench and tests

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess

from bench import harness  # before mcpcreds: it puts this checkout's src/ on the path
from mcpcreds import AsyncClient
from mcpcreds.sidecar.tcp_peer import lookup_uid, proc_lookup_uid

SERVER = "bench"
KEY = "bench-key-0123456789abcdef0123456789"
WAYS = ("unix", "tcp")
def listening(sidecar: SidecarProcess) -> tuple[str, int]:
    """The listener's address, from the `ready` log line (the port was 0)."""
    ready = next(e for line in sidecar.lines if (e := json.loads(line)).get("event") == "ready")
    host, _, port = str(ready["gateway_listen"]).rpartition(":")
    return host.strip("[]"), int(port)


# ------------------------------------------------------ (a) and (b) MCP sessions each way


@asynccontextmanager
async def session(creds: AsyncClient, tcp: tuple[str, int], way: str) -> AsyncIterator[ClientSession]:
    async with AsyncExitStack() as stack:
        if way == "unix":
            http = await stack.enter_async_context(creds.mcp_httpx2_client(SERVER))
            url = creds.mcp_url(SERVER)
        else:
            http = await stack.enter_async_context(httpx2.AsyncClient(timeout=60))
            url = f"http://{tcp[0]}:{tcp[1]}/mcp/{SERVER}"
        read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        client = await stack.enter_async_context(ClientSession(read, write))
        await client.initialize()
        yield client


async def sessions_round(creds: AsyncClient, tcp: tuple[str, int], way: str, sessions: int, seconds: float,
                         sidecar_pid: int) -> dict[str, Any]:
    """`sessions` sessions calling in a closed loop for `seconds`: calls/s, latencies, sidecar CPU
    per call."""
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(session(creds, tcp, way)) for _ in range(sessions)]
        await asyncio.gather(*(c.call_tool("add", {"a": 1, "b": 2}) for c in clients))  # warm-up
        samples: list[float] = []
        until = time.monotonic() + seconds

        async def work(client: ClientSession) -> None:
            while time.monotonic() < until:
                t0 = time.perf_counter()
                result = await client.call_tool("add", {"a": 1, "b": 2})
                if result.is_error:
                    raise harness.BenchError(f"{way}: a tools/call failed: {result}")
                samples.append(time.perf_counter() - t0)

        cpu0, mine0, t0 = harness.cpu_seconds(sidecar_pid), time.process_time(), time.perf_counter()
        await asyncio.gather(*(work(c) for c in clients))
        elapsed, cpu = time.perf_counter() - t0, harness.cpu_seconds(sidecar_pid) - cpu0
        mine = time.process_time() - mine0
    if not samples:
        raise harness.BenchError(f"{way}: no call completed in {seconds} s")
    n = len(samples)
    return {"calls": n, "throughput": n / elapsed, "latencies": samples, "cpu_ms_per_call": cpu / n * 1000,
            "client_cpu_ms_per_call": mine / n * 1000}


async def part_a(sidecar: SidecarProcess, tcp: tuple[str, int], args: argparse.Namespace) -> dict[str, Any]:
    asyncio.get_running_loop().set_exception_handler(client_errors)
    out: dict[str, Any] = {}
    async with AsyncClient(sidecar.socket) as creds:
        for sessions in args.sessions:
            out[str(sessions)] = await sessions_level(creds, sidecar, tcp, sessions, args)
    return out


async def sessions_level(creds: AsyncClient, sidecar: SidecarProcess, tcp: tuple[str, int], sessions: int,
                         args: argparse.Namespace) -> dict[str, Any]:
    print(f"(a) {sessions} MCP session(s) calling tools/call at once, {args.seconds:g} s per way per round, "
          f"{args.rounds} rounds, the ways taking turns")
    rounds: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for n in range(args.rounds):
        for way in WAYS:
            r = await sessions_round(creds, tcp, way, sessions, args.seconds, sidecar.proc.pid)
            rounds[way].append(r)
            harness.progress(f"    round {n + 1} {way:4}: {r['throughput']:7.1f} calls/s  "
                             f"p50 {statistics.median(r['latencies']) * 1000:7.2f} ms  "
                             f"sidecar CPU {r['cpu_ms_per_call']:5.2f} ms/call  "
                             f"client CPU {r['client_cpu_ms_per_call']:5.2f} ms/call")
    summary: dict[str, Any] = {}
    rows = [["way", "calls/s min", "median", "max", "p50 ms min", "median", "max", "CPU ms/call: sidecar",
             "client"]]
    for way, rs in rounds.items():
        tputs = sorted(r["throughput"] for r in rs)
        p50s = sorted(statistics.median(r["latencies"]) * 1000 for r in rs)
        cpu = statistics.median(r["cpu_ms_per_call"] for r in rs)
        client_cpu = statistics.median(r["client_cpu_ms_per_call"] for r in rs)
        summary[way] = {"throughput": tputs, "p50_ms": p50s, "cpu_ms_per_call": cpu,
                        "client_cpu_ms_per_call": client_cpu}
        rows.append([way, f"{tputs[0]:.1f}", f"{statistics.median(tputs):.1f}", f"{tputs[-1]:.1f}",
                     f"{p50s[0]:.2f}", f"{statistics.median(p50s):.2f}", f"{p50s[-1]:.2f}", f"{cpu:.2f}",
                     f"{client_cpu:.2f}"])
    print(harness.table(rows))
    med = {way: (statistics.median(s["throughput"]), statistics.median(s["p50_ms"]))
           for way, s in summary.items()}
    print(harness.ratio_line("calls/s (goal >= 0.83x)", ("tcp", med["tcp"][0]), ("unix", med["unix"][0])))
    print(harness.ratio_line("p50 (goal <= 1.2x)", ("tcp", med["tcp"][1]), ("unix", med["unix"][1])))
    # each round's tcp over the unix run just before it: what the machine's load did to both
    pairs = list(zip(rounds["unix"], rounds["tcp"], strict=True))
    paired = {"calls/s": sorted(t["throughput"] / u["throughput"] for u, t in pairs),
              "p50": sorted(statistics.median(t["latencies"]) / statistics.median(u["latencies"])
                            for u, t in pairs)}
    for what, values in paired.items():
        print(f"tcp/unix {what} round by round: min {values[0]:.2f}x  "
              f"median {statistics.median(values):.2f}x  max {values[-1]:.2f}x")
    summary["paired"] = paired
    return summary


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
RPC = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
       "MCP-Protocol-Version": "2025-06-18"}


async def to_last_byte(creds: AsyncClient, tcp: tuple[str, int], way: str, calls: int) -> list[float]:
    """Raw POSTs of a tools/call in an initialized session, each SSE answer read to its end on a
    kept connection (as the MCP SDK 1.x client reads them): seconds to the last byte."""
    http: Any
    if way == "unix":
        http, url = creds.mcp_httpx2_client(SERVER), creds.mcp_url(SERVER)
    else:
        http, url = httpx2.AsyncClient(timeout=60), f"http://{tcp[0]}:{tcp[1]}/mcp/{SERVER}"
    async with http:
        init = await http.post(url, json=INIT, headers=RPC)
        if init.status_code != 200:
            raise harness.BenchError(f"{way}: initialize answered {init.status_code}")
        headers = {**RPC, "Mcp-Session-Id": init.headers["mcp-session-id"]}
        await http.post(url, json=INITIALIZED, headers=headers)
        out = []
        for i in range(calls + 10):
            call = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                    "params": {"name": "add", "arguments": {"a": 1, "b": 2}}}
            t0 = time.perf_counter()
            async with http.stream("POST", url, json=call, headers=headers) as answer:
                body = b"".join([chunk async for chunk in answer.aiter_raw()])
            if i >= 10:
                out.append(time.perf_counter() - t0)
            if b'"result"' not in body:
                raise harness.BenchError(f"{way}: a tools/call answered {body[:200]!r}")
        await http.request("DELETE", url, headers=headers)
        return out


async def part_b(sidecar: SidecarProcess, tcp: tuple[str, int], args: argparse.Namespace) -> dict[str, Any]:
    print(f"\n(b) one session, each tools/call answer read to its last byte on a kept connection, "
          f"{args.answers} per way per round, {args.rounds} rounds")
    asyncio.get_running_loop().set_exception_handler(client_errors)
    samples: dict[str, list[float]] = {way: [] for way in WAYS}
    async with AsyncClient(sidecar.socket) as creds:
        for _ in range(args.rounds):
            for way in WAYS:
                samples[way] += await to_last_byte(creds, tcp, way, args.answers)
    rows = [["way", "p50 ms", "p90 ms", "p99 ms"]]
    out = {}
    for way, values in samples.items():
        p50, p90, p99 = (v * 1000 for v in harness.percentiles(values, 0.5, 0.9, 0.99))
        out[way] = [p50, p90, p99]
        rows.append([way, f"{p50:.2f}", f"{p90:.2f}", f"{p99:.2f}"])
    print(harness.table(rows))
    print(harness.ratio_line("p50 to the last byte", ("tcp", out["tcp"][0]), ("unix", out["unix"][0])))
    return out


def client_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """As gateway_bench.py's: anyio 4 leaves a reader callback behind after the MCP client cancels
    a wait, which then fails on the cancelled future (harmless, this process only)."""
    if not isinstance(context.get("exception"), asyncio.InvalidStateError):
        loop.default_exception_handler(context)


# ---------------------------------------------------------- (c) and (d) a new connection's cost


@contextlib.contextmanager
def idle_connections(count: int) -> Iterator[None]:
    """`count` established loopback connections (both ends here: 2 x count sockets in the host's
    table), held open until the block ends."""
    held: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0), backlog=4096) as server:
        try:
            for _ in range(count):
                client = socket.create_connection(server.getsockname())
                accepted, _ = server.accept()
                held += [client, accepted]
            yield
        finally:
            for sock in held:
                sock.close()


def health_request(host: str) -> bytes:
    return f"GET /v1/health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def read_answer(sock: socket.socket) -> None:
    """One HTTP/1.1 answer with a Content-Length (the health JSON), read whole."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise harness.BenchError(f"the sidecar closed the connection: {data[:200]!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        raise harness.BenchError(f"GET /v1/health answered {head[:100]!r}")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise harness.BenchError("the sidecar closed the connection mid-answer")
        body += chunk


def connection_steps(sidecar: SidecarProcess, tcp: tuple[str, int]) -> tuple[dict[str, Callable[[], None]],
                                                                             socket.socket]:
    host = f"{tcp[0]}:{tcp[1]}"
    tcp_request, unix_request = health_request(host), health_request("mcpcreds")

    def new_tcp() -> None:
        with socket.create_connection(tcp) as sock:
            sock.sendall(tcp_request)
            read_answer(sock)

    def new_unix() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(sidecar.socket))
            sock.sendall(unix_request)
            read_answer(sock)

    kept = socket.create_connection(tcp)

    def kept_tcp() -> None:
        kept.sendall(tcp_request)
        read_answer(kept)

    steps = {"new tcp connection": new_tcp, "new unix connection": new_unix, "kept tcp connection": kept_tcp}
    return steps, kept


def lookup_steps() -> tuple[dict[str, Callable[[], object]], list[socket.socket]]:
    """The two lookups for one real connection of this process."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    peer, ours = accepted.getpeername(), accepted.getsockname()
    steps: dict[str, Callable[[], object]] = {"netlink lookup_uid": lambda: lookup_uid(peer, ours),
                                              "/proc proc_lookup_uid": lambda: proc_lookup_uid(peer, ours)}
    for name, step in steps.items():
        if step() is None:
            raise harness.BenchError(f"{name} found no uid for a connection of this process")
    return steps, [server, client, accepted]


def table_sockets() -> int:
    count = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(path, "rb") as table:
            count += max(0, table.read().count(b"\n") - 1)
    return count


def part_cd(sidecar: SidecarProcess, tcp: tuple[str, int], args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if 2 * args.idle + 256 > hard:
        raise harness.BenchError(f"--idle {args.idle} needs {2 * args.idle + 256} file descriptors; "
                                 f"the limit is {hard}")
    print(f"\n(c) a new connection: GET /v1/health, {args.connects} per kind per host state, in turns; "
          f"(d) the uid lookup in this process, {args.lookups} each")
    out: dict[str, Any] = {}
    rows = [["host sockets", "kind", "p50 ms", "p90 ms", "p99 ms"]]
    for idle in sorted({0, args.idle}):
        with idle_connections(idle):
            sockets = table_sockets()
            steps, kept = connection_steps(sidecar, tcp)
            lookups, held = lookup_steps()
            try:
                samples = harness.in_turns(steps, args.connects, warmup=20)
                looked = harness.in_turns(lookups, args.lookups, warmup=3)
            finally:
                for sock in [kept, *held]:
                    sock.close()
        figures: dict[str, list[float]] = {}
        for name, ns in {**samples, **looked}.items():
            p50, p90, p99 = (v / 1e6 for v in harness.percentiles(ns, 0.5, 0.9, 0.99))
            figures[name] = [p50, p90, p99]
            rows.append([f"{sockets:,}", name, f"{p50:.3f}", f"{p90:.3f}", f"{p99:.3f}"])
        out[str(sockets)] = figures
        added = figures["new tcp connection"][0] - figures["kept tcp connection"][0]
        over_unix = figures["new tcp connection"][0] - figures["new unix connection"][0]
        rows.append([f"{sockets:,}", "a new tcp connection adds (p50)", f"{added:.3f}", "", ""])
        rows.append([f"{sockets:,}", "new tcp - new unix (p50)", f"{over_unix:.3f}", "", ""])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(harness.table(rows))
    return out


# ---------------------------------------------------------------------------- the run


def server_block(peer: GatewayPeer) -> str:
    return harness.static_server(SERVER, {"X-Api-Key": "{{secret:BENCH_KEY}}"}, rate="1000000/1s",
                                 endpoint=peer.url) + 'trust = "trusted"\n'


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--seconds", type=harness.positive, default=6.0,
                   help="seconds of calls per way per round in (a) (default 6)")
    p.add_argument("--sessions", type=harness.levels, default=[1, 16],
                   help="MCP sessions calling at once in (a), comma-separated levels (default 1,16)")
    p.add_argument("--rounds", type=harness.count, default=3,
                   help="rounds of (a) and (b), the ways in turns (default 3)")
    p.add_argument("--idle", type=harness.count, default=5000,
                   help="idle loopback connections held open for (c) and (d) (default 5000)")
    p.add_argument("--connects", type=harness.count, default=300,
                   help="new connections per kind per host state in (c) (default 300)")
    p.add_argument("--lookups", type=harness.count, default=30,
                   help="lookups per kind per host state in (d) (default 30)")
    p.add_argument("--answers", type=harness.count, default=200,
                   help="answers read to the end per way per round in (b) (default 200)")
    p.add_argument("--skip-sessions", action="store_true", help="only (c) and (d)")
    harness.event_loop_option(p)
    args = harness.parse(p, argv, quick={"seconds": 1.5, "rounds": 1, "answers": 30, "idle": 500,
                                          "connects": 40, "lookups": 5})
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout), \
            harness.workdir("tcpbench") as tmp, \
            harness.started(start_gateway_peer("unused-", KEY), "the MCP peer") as peer, \
            harness.sidecar(tmp / "sidecar", server_block(peer), '[gateway]\nlisten = "127.0.0.1:0"\n',
                            env={"BENCH_KEY": KEY}, settings=harness.loop_setting(args)) as sidecar:
        tcp = listening(sidecar)
        results: dict[str, Any] = {}
        if not args.skip_sessions:
            results["sessions"] = asyncio.run(part_a(sidecar, tcp, args))
            results["kept"] = asyncio.run(part_b(sidecar, tcp, args))
        results["connections"] = part_cd(sidecar, tcp, args)
        harness.print_log_warnings({"sidecar": sidecar})
    if args.json:  # the tables went to stderr
        harness.emit(args, {**results, **harness.machine(), "seconds": args.seconds, "rounds": args.rounds,
                            "idle": args.idle}, str)
    return 0


if __name__ == "__main__":
    harness.main(main)
