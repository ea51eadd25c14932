"""The relay's CPU per call against its floor: the sidecar's gateway and a byte relay, one client, one server.

Run from the repository root (the package installed, with the test extras: the MCP SDK 2.x):

    python bench/relay_floor.py
    python bench/relay_floor.py --sessions 1,16 --calls 600 --rounds 5
    python bench/relay_floor.py --quick                 # a smoke run of a few seconds
    python bench/relay_floor.py --event-loop asyncio    # both processes on asyncio's own loop
    python bench/relay_floor.py --baseline-ref f0072b8  # and the sidecar of that commit, in turn

A process between an MCP client and its server pays on every call for what the kernel does for
it: being woken when the request arrives, reading it, writing it to the server, being woken for
each piece of the answer (the SDK's server writes an answer's head, its event and the end of the
stream apart), reading them and writing the answer back. The floor is a process that does only
that: `relay` below, on the sidecar's event loop, one upstream TCP connection per client
connection, bytes passed on as they come, nothing parsed. The sidecar's `/mcp/{server}` does that
and its own work: HTTP parsed, JSON-RPC parsed and written again, policy, permit, credential, the
answer judged.

Both are reached by the same client (the MCP SDK 2.x `ClientSession` over httpx2 on a Unix socket,
the library's one-write connections) and relay to the same server (the MCP SDK 2.x server of the
tests), a static API key on every request (the sidecar adds it; the client sends it through the
floor). Each round opens `--sessions` sessions through each way in turn, calls `add` a few times,
then `--calls` times spread over the sessions, and reads the CPU of the process in the path over
those calls (the scheduler's run time of its threads, to the nanosecond), and the part of it spent
in the kernel (system: /proc's clock ticks, sampled). What the sidecar spends above the floor is its
own work; the floor is what any process in the path costs on this machine, at this load.

With `--baseline-ref REF`, the sidecar of `git archive REF` is a third way, in turn with the others
(this checkout's client, peer and bench): its CPU per call against this sidecar's, in the same
rounds, where the CPU of separate runs moves with the machine by more than a change does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench and tests

from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar

from bench import gateway_bench, harness  # before mcpcreds: it puts this checkout's src/ on the path
from bench.relay_instructions import baseline_tree
from mcpcreds import AsyncClient
from mcpcreds.client.gateway_http import gateway_http_client

WAYS = ("sidecar", "floor")  # taking turns, `--rounds` times per level of sessions (and "baseline")
ARGS = {"a": 1, "b": 2}

Opener = Callable[[], AbstractAsyncContextManager[ClientSession]]


async def relay(listen: str, host: str, port: int) -> None:
    """The floor: every connection to `listen` gets its own TCP connection to `host:port`, and the
    bytes of each side are written to the other as they arrive. Serves until its process ends.
    The least a relay can do for this bench's clients: no half-close is passed on (an end from
    either side closes both; HTTP/1.1 clients here never half-close) and no write buffer bounds
    reading (the answers are small)."""
    loop = asyncio.get_running_loop()

    class Upstream(asyncio.Protocol):
        def __init__(self, client: asyncio.Transport) -> None:
            self.client = client

        def data_received(self, data: bytes) -> None:
            self.client.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.client.close()

    class Client(asyncio.Protocol):
        transport: asyncio.Transport
        upstream: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # uvloop's transports are not asyncio.Transport subclasses
            self.transport, self.held = cast(asyncio.Transport, transport), bytearray()
            self.connecting = loop.create_task(self.connect())

        async def connect(self) -> None:
            try:
                upstream, _ = await loop.create_connection(lambda: Upstream(self.transport), host, port)
            except OSError:
                self.transport.close()
                return
            if self.transport.is_closing():
                upstream.close()
                return
            self.upstream = upstream
            if self.held:
                upstream.write(bytes(self.held))

        def data_received(self, data: bytes) -> None:
            if self.upstream is None:
                self.held += data
            else:
                self.upstream.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.upstream is not None:
                self.upstream.close()
            else:
                self.connecting.cancel()

    server = await loop.create_unix_server(Client, listen)
    async with server:
        await server.serve_forever()


def through_floor(relay_socket: Path, peer: GatewayPeer) -> Opener:
    """Sessions to the server's own URL over the floor's socket, the key in every request."""
    @asynccontextmanager
    async def opened() -> AsyncIterator[ClientSession]:
        async with AsyncExitStack() as stack:
            key = {"X-Api-Key": gateway_bench.KEY}
            http = await stack.enter_async_context(
                gateway_http_client("httpx2", str(relay_socket), os.getuid(), gateway_bench.SERVER, key))
            read, write = await stack.enter_async_context(streamable_http_client(peer.url, http_client=http))
            client = await stack.enter_async_context(ClientSession(read, write))
            await client.initialize()
            yield client

    return opened


def sessions_through(creds: AsyncClient, peer: GatewayPeer) -> Opener:
    """Sessions through a sidecar's gateway."""
    def opened() -> AbstractAsyncContextManager[ClientSession]:
        return gateway_bench.session(creds, peer.url, "gateway")

    return opened


@contextmanager
def baseline_sidecar(ref: str | None, tmp: Path, config: Path, env: dict[str, str]
                     ) -> Iterator[SidecarProcess | None]:
    """The sidecar of `git archive ref` on a socket of its own, with the same server (None: no ref)."""
    if ref is None:
        yield None
        return
    tree = baseline_tree(ref, Path(tempfile.mkdtemp(dir=tmp)))
    sock, its_config = tmp / "b.sock", tmp / "baseline.toml"
    its_config.write_text(config.read_text(encoding="utf-8").replace(str(tmp / "s.sock"), str(sock)),
                          encoding="utf-8")
    with harness.started(run_sidecar(its_config, sock, {**env, "PYTHONPATH": str(tree / "src")}),
                         f"the sidecar of {ref}") as baseline:
        yield baseline


class Usage(NamedTuple):
    """What a round cost the process in the path, per call, in seconds."""

    ran: float  # the scheduler's run time of its threads
    system: float  # the system part of /proc's clock ticks
    ticks: float  # user + system in /proc's clock ticks (sampled: a check on `ran`)


async def one_round(opener: Opener, pid: int, sessions: int, calls: int) -> tuple[Usage, float]:
    """What process `pid` spent per call over `calls` calls from `sessions` sessions, and calls/s."""
    each = max(1, calls // sessions)
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(opener()) for _ in range(sessions)]
        for _ in range(3):  # warm-up; and the way must answer, not fail
            for result in await asyncio.gather(*(c.call_tool("add", ARGS) for c in clients)):
                if result.is_error:
                    raise harness.BenchError(f"add failed: {str(result.content)[:200]}")

        async def work(client: ClientSession) -> None:
            for _ in range(each):
                await client.call_tool("add", ARGS)

        ran, (user, system) = harness.run_seconds(pid), harness.user_system_seconds(pid)
        started = time.perf_counter()
        await asyncio.gather(*(work(c) for c in clients))
        elapsed = time.perf_counter() - started
        ran, (user_after, system_after) = harness.run_seconds(pid) - ran, harness.user_system_seconds(pid)
    done = each * sessions
    system = system_after - system
    usage = Usage(ran / done, system / done, (user_after - user + system) / done)
    return usage, done / elapsed


async def measure(openers: dict[str, tuple[Opener, int]], args: argparse.Namespace) -> dict[str, Any]:
    asyncio.get_running_loop().set_exception_handler(gateway_bench.client_errors)
    report: dict[str, Any] = {}
    ways = list(openers)
    for sessions in args.sessions:
        rounds: dict[str, dict[str, list[float]]] = {
            way: {"cpu_ms": [], "system_ms": [], "ticks_ms": [], "calls_s": []} for way in ways}
        for n in range(args.rounds):
            for way in ways if n % 2 == 0 else ways[::-1]:
                opener, pid = openers[way]
                usage, rate = await one_round(opener, pid, sessions, args.calls)
                rounds[way]["cpu_ms"].append(usage.ran * 1000)
                rounds[way]["system_ms"].append(usage.system * 1000)
                rounds[way]["ticks_ms"].append(usage.ticks * 1000)
                rounds[way]["calls_s"].append(rate)
                harness.progress(f"    {sessions} session(s), round {n + 1} {way:7}: {rate:7.1f} calls/s, "
                                 f"CPU {usage.ran * 1000:.3f} ms/call")
        report[str(sessions)] = rounds
    return report


def render(args: argparse.Namespace) -> Callable[[dict[str, Any]], str]:
    def lines(report: dict[str, Any]) -> str:
        tick = harness.CLOCK_TICK * 1000 / args.calls
        out = [f"CPU of the process in the path per tools/call, {args.calls} calls per way per round, "
               f"{args.rounds} rounds, the ways taking turns (the scheduler's run time; the system part "
               f"from /proc's clock ticks, {tick:.3f} ms per call at this count, and sampled by the kernel)"]
        for sessions, rounds in report.items():
            rows = [["way", "CPU ms/call min", "median", "max", "system part, median", "calls/s median"]]
            for way in rounds:
                cpu = sorted(rounds[way]["cpu_ms"])
                rows.append([way, f"{cpu[0]:.3f}", f"{statistics.median(cpu):.3f}", f"{cpu[-1]:.3f}",
                             f"{statistics.median(rounds[way]['system_ms']):.3f}",
                             f"{statistics.median(rounds[way]['calls_s']):.1f}"])
            out += ["", f"{sessions} session(s)", harness.table(rows)]
            side, floor = (statistics.median(rounds[w]["cpu_ms"]) for w in WAYS)
            out.append(harness.ratio_line(f"CPU ms per call at {sessions} session(s)",
                                          ("sidecar", side), ("floor", floor)))
            above = sorted(s - f for s, f in zip(rounds["sidecar"]["cpu_ms"], rounds["floor"]["cpu_ms"],
                                                 strict=True))
            out.append(f"the sidecar above the floor, ms per call, round by round: min {above[0]:.3f}  "
                       f"median {statistics.median(above):.3f}  max {above[-1]:.3f}")
            ticks = {way: statistics.median(rounds[way]["ticks_ms"]) for way in rounds}
            out.append("the same CPU in /proc's clock ticks (user + system, median): "
                       + ", ".join(f"{way} {ticks[way]:.3f}" for way in rounds) + " ms per call")
            if "baseline" in rounds:
                base = statistics.median(rounds["baseline"]["cpu_ms"])
                out.append(harness.ratio_line(f"CPU ms per call at {sessions} session(s)",
                                              ("sidecar", side), (f"baseline {args.baseline_ref}", base)))
                ours, theirs = rounds["sidecar"]["cpu_ms"], rounds["baseline"]["cpu_ms"]
                pairs = sorted(s / b for s, b in zip(ours, theirs, strict=True))
                out.append(f"sidecar / baseline, round by round: min {pairs[0]:.2f}x  "
                           f"median {statistics.median(pairs):.2f}x  max {pairs[-1]:.2f}x")
        return "\n".join(out)

    return lines


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--calls", type=harness.count, default=600, help="calls per way per round (default 600)")
    p.add_argument("--sessions", type=harness.levels, default=[1, 16], help="sessions calling at once (1,16)")
    p.add_argument("--rounds", type=harness.count, default=5, help="rounds, ways taking turns (default 5)")
    p.add_argument("--baseline-ref", help="a git ref whose sidecar is a third way, in the same rounds")
    harness.event_loop_option(p)
    args = harness.parse(p, argv, quick={"calls": 40, "sessions": [1], "rounds": 2})
    with harness.workdir("floor") as tmp, \
            harness.started(start_gateway_peer("unused-", gateway_bench.KEY), "the MCP peer") as peer:
        upstream = urlsplit(peer.url)
        if upstream.hostname is None or upstream.port is None:
            raise harness.BenchError(f"the peer's URL names no host and port: {peer.url[:100]}")
        sock, config, floor_sock = tmp / "s.sock", tmp / "config.toml", tmp / "floor.sock"
        config.write_text(f'[sidecar]\nsocket = "{sock}"\n{harness.loop_setting(args)}\n\n[secrets]\n'
                          f'sources = ["env"]\n\n{gateway_bench.server_block(peer)}', encoding="utf-8")
        env = {"BENCH_KEY": gateway_bench.KEY, "PYTHONPATH": harness.pythonpath()}
        with harness.started(run_sidecar(config, sock, env), "the sidecar") as sidecar, \
                harness.server_process(relay, str(floor_sock), upstream.hostname, upstream.port,
                                       socket_path=floor_sock, what="the floor relay",
                                       event_loop=args.event_loop) as floor_pid, \
                baseline_sidecar(args.baseline_ref, tmp, config, env) as baseline:
            async def run() -> dict[str, Any]:
                async with AsyncExitStack() as stack:
                    openers: dict[str, tuple[Opener, int]] = {}
                    for way, proc in (("sidecar", sidecar), ("baseline", baseline)):
                        if proc is not None:
                            creds = await stack.enter_async_context(AsyncClient(proc.socket, timeout=60))
                            openers[way] = (sessions_through(creds, peer), proc.proc.pid)
                        if way == "sidecar":
                            openers["floor"] = (through_floor(floor_sock, peer), floor_pid)
                    return await measure(openers, args)

            report = asyncio.run(run())
    harness.emit(args, report, render(args))
    return 0


if __name__ == "__main__":
    harness.main(main)
