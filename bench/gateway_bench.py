"""Gateway benchmark (issue 14): what `/mcp/{server}` costs against calling the server directly.

Run from the repository root (the package installed, with the test extras: the MCP SDK 2.x):

    python bench/gateway_bench.py
    python bench/gateway_bench.py --calls 300 --sessions 500
    python bench/gateway_bench.py --quick           # a smoke run of a few seconds
    python bench/gateway_bench.py --event-loop asyncio   # the sidecar on asyncio's own loop

Processes: the real MCP SDK 2.x server of the tests (`tests/peers/mcp_gateway_peer.py`, uvicorn),
the real sidecar (`mcpcreds serve`), and this client (the MCP SDK 2.x `ClientSession` over
httpx2). The server `bench` has a static API key, `trust = "trusted"` and a rate no call waits
for. Two ways to reach it, measured alternately in the same run:

- `direct`: the SDK client to the server's URL with `auth=creds.auth("bench")` (one
  `POST /v1/servers/bench/call` on the socket before each request: permit and headers);
- `gateway`: the SDK client to `http://mcpcreds/mcp/bench` through `creds.mcp_httpx2_client`.

(a) one `tools/call` (`add`): latency at concurrency 1 (p50, p99), and throughput with 16
    sessions calling at once; target p50 added <= 1 ms, throughput >= 1.0x direct. Each prints
    the CPU per call (user + system, from /proc) of this client, the sidecar and the server, per
    way, over the timed calls; target <= 0.5 ms of the sidecar's per relayed call.
(b) time to the first SSE event of a `tools/call` answer (raw httpx2 POSTs in an initialized
    session, time from sending to the first body bytes; through the gateway, an answer that is one
    message and then ends comes as a JSON body); target gateway <= direct + 1 ms p50.
(c) the sidecar's RSS with `--sessions` MCP sessions each holding its GET SSE stream open through
    the gateway; target <= 150 MB.

Client, sidecar and server share the machine's cores: compare figures of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench and tests

import httpx
import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess

from bench import harness  # before mcpcreds: it puts this checkout's src/ on the path
from mcpcreds import AsyncClient

SERVER = "bench"
KEY = "bench-key-0123456789abcdef0123456789"
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
RPC = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
       "MCP-Protocol-Version": "2025-06-18"}
WAYS = ("direct", "gateway")  # taking turns, `--rounds` times
PROCESSES = ("client", "sidecar", "server")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def pct(values: list[float], q: float) -> float:
    return harness.upper_percentile(sorted(values), q)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Cpu:
    """CPU (user + system, from /proc) of the client, the sidecar and the server over the timed
    parts of one measure, per way: what each spends per call."""

    def __init__(self, sidecar: int, server: int) -> None:
        self.pids = {"client": os.getpid(), "sidecar": sidecar, "server": server}
        self.seconds: dict[str, dict[str, float]] = {way: dict.fromkeys(PROCESSES, 0.0) for way in WAYS}
        self.calls = dict.fromkeys(WAYS, 0)

    def now(self) -> dict[str, float]:
        return {name: harness.cpu_seconds(pid) for name, pid in self.pids.items()}

    def add(self, way: str, before: dict[str, float], calls: int) -> None:
        after = self.now()
        for name in PROCESSES:
            self.seconds[way][name] += after[name] - before[name]
        self.calls[way] += calls

    def per_call_ms(self, way: str) -> dict[str, float]:
        return {name: self.seconds[way][name] / max(1, self.calls[way]) * 1000 for name in PROCESSES}

    def report(self) -> dict[str, dict[str, float]]:
        out = {way: self.per_call_ms(way) for way in WAYS}
        for way, per in out.items():
            each = ", ".join(f"{name} {per[name]:.3f} ms" for name in PROCESSES)
            print(f"    {way:8} CPU per call: {each}, all {sum(per.values()):.3f} ms")
        return out


# ---------------------------------------------------------------------------- the two ways


@asynccontextmanager
async def session(creds: AsyncClient, direct_url: str, way: str) -> AsyncIterator[ClientSession]:
    """An initialized SDK session to the server `SERVER`: through the gateway ("gateway"), else to
    `direct_url` with `auth=creds.auth(SERVER)`."""
    async with AsyncExitStack() as stack:
        if way == "gateway":
            http = await stack.enter_async_context(creds.mcp_httpx2_client(SERVER))
            url = creds.mcp_url(SERVER)
        else:
            http = await stack.enter_async_context(httpx2.AsyncClient(auth=creds.auth(SERVER), timeout=30))
            url = direct_url
        read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        client = await stack.enter_async_context(ClientSession(read, write))
        await client.initialize()
        yield client


async def latency(creds: AsyncClient, peer: GatewayPeer, way: str, calls: int, cpu: Cpu) -> list[float]:
    async with session(creds, peer.url, way) as client:
        for _ in range(20):  # warm-up
            await client.call_tool("add", {"a": 1, "b": 2})
        out = []
        before = cpu.now()
        for _ in range(calls):
            started = time.perf_counter()
            await client.call_tool("add", {"a": 1, "b": 2})
            out.append(time.perf_counter() - started)
        cpu.add(way, before, calls)
        return out


async def throughput(creds: AsyncClient, peer: GatewayPeer, way: str, calls: int, cpu: Cpu,
                     workers: int = 16) -> float:
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(session(creds, peer.url, way)) for _ in range(workers)]
        await asyncio.gather(*(c.call_tool("add", {"a": 1, "b": 2}) for c in clients))  # warm-up

        async def work(client: ClientSession) -> None:
            for _ in range(calls // workers):
                await client.call_tool("add", {"a": 1, "b": 2})

        before, started = cpu.now(), time.perf_counter()
        await asyncio.gather(*(work(c) for c in clients))
        elapsed = time.perf_counter() - started
        cpu.add(way, before, (calls // workers) * workers)
        return (calls // workers) * workers / elapsed


async def first_event(creds: AsyncClient, peer: GatewayPeer, way: str, calls: int) -> list[float]:
    """Raw POSTs of a tools/call in an initialized session: time to the first SSE bytes."""
    if way == "gateway":
        http: Any = creds.mcp_httpx2_client(SERVER)
        url = creds.mcp_url(SERVER)
    else:
        http = httpx2.AsyncClient(auth=creds.auth(SERVER), timeout=30)
        url = peer.url
    async with http:
        init = await http.post(url, json=INIT, headers=RPC)
        await init.aread()
        assert init.status_code == 200, (way, init.status_code, init.text[:300])
        headers = {**RPC, "Mcp-Session-Id": init.headers["mcp-session-id"]}
        await http.post(url, json=INITIALIZED, headers=headers)
        out = []
        for i in range(calls + 20):
            call = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": "x"}}}
            started = time.perf_counter()
            async with http.stream("POST", url, json=call, headers=headers) as answer:
                # the server answers in SSE; the gateway passes an answer of one message that then
                # ends as a JSON body: either way, the time to its first bytes
                assert answer.headers["content-type"].startswith(("text/event-stream", "application/json")), \
                    answer.headers
                seen = False
                async for chunk in answer.aiter_raw():  # read to the end: the connection is reused
                    if chunk and not seen:
                        seen = True
                        if i >= 20:
                            out.append(time.perf_counter() - started)
        await http.request("DELETE", url, headers=headers)
        return out


async def open_sessions(sidecar: SidecarProcess, count: int) -> tuple[int, int]:
    """The sidecar's RSS before and with `count` sessions each holding its GET stream open."""
    pid = sidecar.proc.pid
    before = rss(pid)
    limits = httpx.Limits(max_connections=count + 64, max_keepalive_connections=count + 64)
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(sidecar.socket), limits=limits),
                                 base_url="http://mcpcreds", timeout=60) as http:
        url = f"/mcp/{SERVER}"
        semaphore = asyncio.Semaphore(32)
        streams: list[httpx.Response] = []

        async def one() -> None:
            async with semaphore:
                init = await http.post(url, json=INIT, headers=RPC)
                assert init.status_code == 200, (init.status_code, init.text[:300])  # say why, not KeyError
                sid = init.headers["mcp-session-id"]
                headers = {**RPC, "Mcp-Session-Id": sid}
                await http.post(url, json=INITIALIZED, headers=headers)
                stream = await http.send(http.build_request("GET", url, headers={**headers,
                                                            "Accept": "text/event-stream"}), stream=True)
                assert stream.status_code == 200, stream.status_code
                streams.append(stream)

        await asyncio.gather(*(one() for _ in range(count)))
        status = (await http.get("/v1/status")).json()["gateway"]
        await asyncio.sleep(1.0)  # let the sidecar settle
        with_sessions = rss(pid)
        print(f"    status: sessions={status['sessions']} streams={status['streams']}")
        for stream in streams:
            await stream.aclose()
    return before, with_sessions


# ---------------------------------------------------------------------------- the run


def server_block(peer: GatewayPeer) -> str:
    return harness.static_server(SERVER, {"X-Api-Key": "{{secret:BENCH_KEY}}"}, rate="1000000/1s",
                                 endpoint=peer.url) + 'trust = "trusted"\n'


async def measure(sidecar: SidecarProcess, peer: GatewayPeer, args: argparse.Namespace) -> dict[str, Any]:
    asyncio.get_running_loop().set_exception_handler(client_errors)
    results: dict[str, Any] = {}
    async with AsyncClient(sidecar.socket) as creds:
        print(f"(a) tools/call latency at concurrency 1, {args.calls} calls per way per round, "
              f"{args.rounds} rounds")
        lat: dict[str, list[float]] = {way: [] for way in WAYS}
        cpu = Cpu(sidecar.proc.pid, peer.pid)
        for way in WAYS * args.rounds:
            lat[way] += await latency(creds, peer, way, args.calls, cpu)
        for way, values in lat.items():
            print(f"    {way:8} p50 {ms(pct(values, 0.5))}  p99 {ms(pct(values, 0.99))}  "
                  f"mean {ms(statistics.fmean(values))}")
        added = pct(lat["gateway"], 0.5) - pct(lat["direct"], 0.5)
        print(f"    added p50: {ms(added)} (target <= 1 ms); "
              f"ratio gateway/direct p50 {pct(lat['gateway'], 0.5) / pct(lat['direct'], 0.5):.2f}")
        results["latency"] = {w: {"p50": pct(v, 0.5), "p99": pct(v, 0.99)} for w, v in lat.items()}
        results["latency_cpu_ms_per_call"] = cpu.report()

        print(f"(a) throughput, 16 sessions at once, {args.calls * 4} calls per way per round")
        tput: dict[str, list[float]] = {way: [] for way in WAYS}
        cpu = Cpu(sidecar.proc.pid, peer.pid)
        for way in WAYS * args.rounds:
            tput[way].append(await throughput(creds, peer, way, args.calls * 4, cpu))
        best = {way: statistics.median(v) for way, v in tput.items()}
        for way, value in best.items():
            print(f"    {way:8} {value:8.0f} calls/s (median of {args.rounds})")
        print(f"    ratio gateway/direct {best['gateway'] / best['direct']:.2f} (target >= 1.0)")
        rounds = sorted(g / d for g, d in zip(tput["gateway"], tput["direct"], strict=True))
        print(f"    gateway/direct round by round: min {rounds[0]:.2f}x  "
              f"median {statistics.median(rounds):.2f}x  max {rounds[-1]:.2f}x")
        results["throughput"] = best
        results["throughput_cpu_ms_per_call"] = cpu.report()

        print(f"(b) time to the first SSE event of a tools/call answer, {args.calls} per way per round")
        first: dict[str, list[float]] = {way: [] for way in WAYS}
        for way in WAYS * args.rounds:
            first[way] += await first_event(creds, peer, way, args.calls)
        for way, values in first.items():
            print(f"    {way:8} p50 {ms(pct(values, 0.5))}  p99 {ms(pct(values, 0.99))}")
        print(f"    gateway - direct p50: {ms(pct(first['gateway'], 0.5) - pct(first['direct'], 0.5))} "
              "(target <= 1 ms)")
        results["first_event"] = {w: pct(v, 0.5) for w, v in first.items()}

    print(f"(c) sidecar RSS with {args.sessions} MCP sessions holding their GET SSE stream open")
    before, during = await open_sessions(sidecar, args.sessions)
    print(f"    before {before / 1e6:.1f} MB, with the sessions {during / 1e6:.1f} MB (target <= 150 MB); "
          f"{(during - before) / args.sessions / 1024:.1f} KiB per session")
    results["rss"] = {"before": before, "with_sessions": during}
    return results


def client_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler here: anyio 4 leaves a socket's reader callback registered
    after the MCP client cancels the wait on it, and the callback then fails on the cancelled
    future (harmless, in this process only; not the sidecar's)."""
    if not isinstance(context.get("exception"), asyncio.InvalidStateError):
        loop.default_exception_handler(context)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--calls", type=int, default=300, help="tools/call per way per round (default 300)")
    p.add_argument("--rounds", type=harness.count, default=3, help="rounds, the ways alternating (default 3)")
    p.add_argument("--sessions", type=harness.count, default=500,
                   help="MCP sessions held open for (c) (default 500)")
    harness.event_loop_option(p)
    args = harness.parse(p, argv, quick={"calls": 40, "rounds": 1, "sessions": 50})
    if args.calls < 16:
        p.error("--calls must be >= 16")
    with harness.workdir("gwbench") as tmp, \
            harness.started(start_gateway_peer("unused-", KEY), "the MCP peer") as peer, \
            harness.sidecar(tmp / "sidecar", server_block(peer), env={"BENCH_KEY": KEY},
                            settings=harness.loop_setting(args)) as sidecar:
        results = asyncio.run(measure(sidecar, peer, args))
    if args.json:
        harness.emit(args, {**results, **harness.machine(), "calls": args.calls, "rounds": args.rounds,
                            "sessions": args.sessions}, str)
    return 0


if __name__ == "__main__":
    harness.main(main)
