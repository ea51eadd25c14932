"""Client benchmark: the latency `auth=creds.auth(...)` adds to each upstream request.

Run from the repository root (the package installed, e.g. `pip install -e .`):

    python bench/client_bench.py
    python bench/client_bench.py --seconds 2 --rounds 5 --json
    python bench/client_bench.py --profile          # and where the time goes (cProfile)
    python bench/client_bench.py --quick            # a smoke run of a few seconds

What it measures: `GET /mcp` requests from one `httpx.AsyncClient` (asyncio; one client per run)
to a local upstream that answers at once (`tests/peers/upstream.py` in its own process: uvicorn
with httptools, requiring `Authorization: Bearer <token>`), at 1 and 16 requests in flight:

- `plain`: the client sends the bearer header itself (`headers=`);
- `auth`: the client gets it from the real sidecar (`mcpcreds serve`, its own process) through
  `auth=creds.auth("bench", lease=True)`, which leases a share of the bucket after a few calls:
  permit and headers are then taken inside the process, the lease renewed in the background;
- `auth, no lease`: `creds.auth("bench", lease=False)`: one `POST /v1/servers/bench/call` round
  trip on the Unix socket (permit + headers) before each upstream request.
The server has a static `Bearer {{secret:BENCH_TOKEN}}` header and `rate = "1000000/1s"`, so no
request ever waits.

For each it prints p50/p99/mean latency per request and throughput, and the differences (`auth` -
`plain`, `auth, no lease` - `plain`): the added latency. The modes alternate in `--rounds` rounds
of `--seconds` each (after a `--warmup`), so drift hits all alike. A decomposition at concurrency
1 follows: the sidecar call alone through `AsyncClient.call` (what `auth=` adds), the same request
on a raw blocking Unix socket (the sidecar's own time plus the kernel), and a bare
`httpx.AsyncClient` request to the upstream. `--profile` runs cProfile over the `auth` mode at
concurrency 1 and prints the cumulative time of the flow's parts.

In-process (`--permit-ops` operations each, same run): a permit + headers from a held lease (the
`AsyncLeaser.take` that `auth=` calls per request: the lease's `aiolimiter.AsyncLimiter`, its
deadline and headers) against `aiolimiter.AsyncLimiter.acquire` alone, in µs per operation, and
their ratio.

The client, the sidecar and the upstream share the machine's cores: compare figures taken in the
same run only.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from aiolimiter import AsyncLimiter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from tests.peers.upstream import start_upstream_process

from bench import harness, wire
from bench.harness import Latency
from mcpcreds import AsyncClient
from mcpcreds.client.calls import Calls

SERVER = "bench"
TOKEN = "bench-token-0123456789abcdef0123456789abcdef"
CONCURRENCY = (1, 16)
CHUNK = 1000  # in-process permits between two yields to the event loop
CALL_REQUEST = wire.request_bytes("POST", f"/v1/servers/{SERVER}/call", b'{"cost": 1, "max_wait": 30.0}')


def upstream_send(http: httpx.AsyncClient) -> harness.Send:
    async def send() -> None:
        response = await http.get("/mcp")
        if response.status_code != 200:
            raise RuntimeError(f"upstream answered {response.status_code}: {response.text}")

    return send


async def measure(upstream: str, sock: Path, concurrency: int, args: argparse.Namespace) -> list[Latency]:
    """`plain` and `auth` alternating in `args.rounds` rounds of `args.seconds`, after a warmup."""
    samples: dict[str, list[int]] = {"plain": [], "auth": [], "auth, no lease": []}
    elapsed = dict.fromkeys(samples, 0.0)
    async with AsyncClient(sock) as creds, \
            httpx.AsyncClient(base_url=upstream, headers={"Authorization": f"Bearer {TOKEN}"}) as plain, \
            httpx.AsyncClient(base_url=upstream, auth=creds.auth(SERVER, lease=True)) as authed, \
            httpx.AsyncClient(base_url=upstream, auth=creds.auth(SERVER, lease=False)) as per_request:
        sends = {"plain": upstream_send(plain), "auth": upstream_send(authed),
                 "auth, no lease": upstream_send(per_request)}
        for send in sends.values():
            await harness.drive(send, concurrency, time.monotonic() + args.warmup)
        for _ in range(args.rounds):
            for mode, send in sends.items():
                started = time.monotonic()
                await harness.drive(send, concurrency, started + args.seconds, samples[mode])
                elapsed[mode] += time.monotonic() - started
    return [harness.summarize(mode, concurrency, samples[mode], elapsed[mode]) for mode in samples]


def added(plain: Latency, auth: Latency) -> dict[str, Any]:
    return {"concurrency": plain.concurrency,
            "p50_ms": round(auth.p50_ms - plain.p50_ms, 4),
            "p99_ms": round(auth.p99_ms - plain.p99_ms, 4),
            "mean_ms": round(auth.mean_ms - plain.mean_ms, 4),
            "throughput_ratio": round(auth.throughput / plain.throughput, 3)}


async def permit_costs(sock: Path, ops: int, rounds: int) -> dict[str, Any]:
    """µs per operation, in-process: a permit + headers from a held lease vs aiolimiter alone."""
    async with AsyncClient(sock) as creds:
        auth = creds.auth(SERVER, lease=True)
        call = Calls.call(SERVER, 1, 30.0)
        for _ in range(10):  # a few calls in a short time: the auth leases (in the background)
            await auth._leased(call)
        for _ in range(500):
            if auth._leaser is not None and auth._leaser.answer is not None:
                break
            await asyncio.sleep(0.01)
        leaser = auth._leaser
        if leaser is None or leaser.answer is None:
            raise harness.BenchError("the auth did not lease (is the server's rate leasable?)")
        baseline = AsyncLimiter(1_000_000_000, 1.0)
        best = {"lease": float("inf"), "aiolimiter": float("inf")}
        for _ in range(rounds):  # alternating; the best round of each (the least disturbed)
            # the loop yields every CHUNK operations, as real requests do at each await: the
            # lease's renewal (a background task) runs then
            t0 = time.perf_counter_ns()
            for i in range(ops):
                if await leaser.take(1) is None:
                    raise harness.BenchError("the lease was dropped during the measure")
                if i % CHUNK == 0:
                    await asyncio.sleep(0)
            best["lease"] = min(best["lease"], (time.perf_counter_ns() - t0) / ops / 1e3)
            t0 = time.perf_counter_ns()
            for i in range(ops):
                await baseline.acquire(1)
                if i % CHUNK == 0:
                    await asyncio.sleep(0)
            best["aiolimiter"] = min(best["aiolimiter"], (time.perf_counter_ns() - t0) / ops / 1e3)
        share, burst = leaser.terms
    return {"lease_us": round(best["lease"], 3), "aiolimiter_us": round(best["aiolimiter"], 3),
            "ratio": round(best["lease"] / best["aiolimiter"], 2), "ops": ops, "rounds": rounds,
            "share": share, "burst": burst}


def raw_call_latency(sock: Path, seconds: float) -> Latency:
    """The sidecar's `call` on one blocking keep-alive Unix socket: no httpx, no event loop."""
    samples: list[int] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(sock))
        started = time.monotonic()
        while time.monotonic() < started + seconds:
            t0 = time.perf_counter_ns()
            wire.roundtrip_ok(conn, CALL_REQUEST)
            samples.append(time.perf_counter_ns() - t0)
        return harness.summarize("sidecar call, raw socket", 1, samples, time.monotonic() - started)


async def decompose(upstream: str, sock: Path, seconds: float) -> list[Latency]:
    warmup = min(seconds, 0.5)
    async with AsyncClient(sock) as creds:
        async def call() -> None:
            await creds.call(SERVER)

        out = [await harness.measure("sidecar call, AsyncClient.call", call, 1, seconds, warmup)]
    out.append(await asyncio.to_thread(raw_call_latency, sock, seconds))
    async with httpx.AsyncClient(base_url=upstream, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        out.append(await harness.measure("upstream GET, bare httpx", upstream_send(http), 1, seconds, warmup))
    return out


PROFILE_GROUPS = (
    ("whole request: httpx AsyncClient.send (flow + upstream)", "httpx/_client.py", ("send",)),
    ("sidecar round trip: mcpcreds AsyncClient.run (httpx, UDS)", "mcpcreds/client/client.py", ("run",)),
    ("the flow itself: credential_flow + _apply", "mcpcreds/client/auth.py", ("credential_flow", "_apply")),
)


async def profile(upstream: str, sock: Path, requests: int) -> dict[str, Any]:
    """cProfile over `requests` upstream requests through `auth=` at concurrency 1."""
    async with AsyncClient(sock) as creds, \
            httpx.AsyncClient(base_url=upstream, auth=creds.auth(SERVER, lease=True)) as http:
        send = upstream_send(http)
        for _ in range(200):
            await send()
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        for _ in range(requests):
            await send()
        profiler.disable()
        wall = time.perf_counter() - started
    stats = pstats.Stats(profiler)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    groups = {}
    for label, filename, functions in PROFILE_GROUPS:
        cumulative = sum(row[3] for (path, _line, name), row in raw.items()
                         if path.endswith(filename) and name in functions)
        groups[label] = round(cumulative / requests * 1e3, 4)
    whole, sidecar, flow = groups.values()
    groups["the rest: the upstream request (send - sidecar - flow)"] = round(whole - sidecar - flow, 4)
    top = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:15]
    return {
        "requests": requests,
        "wall_ms_per_request_profiled": round(wall / requests * 1e3, 4),
        "cumulative_ms_per_request": groups,
        "top_tottime_ms_per_request": [
            {"function": f"{Path(path).name}:{line}({name})",
             "calls_per_request": round(row[1] / requests, 2), "ms": round(row[2] / requests * 1e3, 4)}
            for (path, line, name), row in top],
    }


def render(report: dict[str, Any]) -> str:
    out = []
    results = report["results"]
    for plain, auth, per_request, a, b in zip(results[::3], results[1::3], results[2::3], report["added"],
                                              report["added_no_lease"], strict=True):
        out += [harness.line(plain), harness.line(auth), harness.line(per_request)]
        for label, d in (("added by auth= (lease)", a), ("added by auth=, no lease", b)):
            out.append(f"{label:<34} c={d['concurrency']:<3} {'':<9}"
                       f"p50 {d['p50_ms']:+7.3f} ms   p99 {d['p99_ms']:+7.3f} ms   "
                       f"mean {d['mean_ms']:+7.3f} ms   throughput x{d['throughput_ratio']}")
        out.append("")
    p = report["permit"]
    out += [f"in-process permit + headers with a lease: {p['lease_us']:.3f} us   "
            f"aiolimiter acquire alone: {p['aiolimiter_us']:.3f} us   ratio x{p['ratio']}   "
            f"(best of {p['rounds']} rounds of {p['ops']}; share {p['share']:g}, burst {p['burst']})", ""]
    out.append("decomposition at concurrency 1:")
    out += ["  " + harness.line(r) for r in report["decomposition"]]
    if prof := report.get("profile"):
        out.append(f"\nprofile ({prof['requests']} requests through auth=, c=1; "
                   f"{prof['wall_ms_per_request_profiled']} ms/request under cProfile):")
        for label, ms in prof["cumulative_ms_per_request"].items():
            out.append(f"  {label:<58} {ms:8.4f} ms/request")
        out.append("  top functions by own time:")
        for row in prof["top_tottime_ms_per_request"]:
            out.append(f"    {row['function']:<60} {row['calls_per_request']:>6} calls {row['ms']:8.4f} ms")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments("Latency added by auth=creds.auth(...) per request.")
    p.add_argument("--seconds", type=float, default=1.5, help="per mode and round (default 1.5)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--warmup", type=float, default=0.5, help="seconds per mode first (default 0.5)")
    p.add_argument("--profile", action="store_true", help="cProfile the auth mode at concurrency 1")
    p.add_argument("--profile-requests", type=int, default=2000)
    p.add_argument("--permit-ops", type=int, default=200_000, help="in-process permits per round")
    args = harness.parse(p, argv, quick={"seconds": 0.5, "rounds": 1, "warmup": 0.1, "profile_requests": 100,
                                                      "permit_ops": 20_000})

    report: dict[str, Any] = {**harness.machine(), "httpx": httpx.__version__, "seconds": args.seconds,
                              "rounds": args.rounds, "results": [], "added": [], "added_no_lease": [],
                              "decomposition": []}
    with harness.workdir("client-bench") as tmp, \
            harness.started(start_upstream_process(TOKEN), "the upstream") as upstream, \
            harness.sidecar(tmp, harness.static_server(
                SERVER, {"Authorization": "Bearer {{secret:BENCH_TOKEN}}"}, rate="1000000/1s",
                endpoint=f"{upstream}/mcp"), env={"BENCH_TOKEN": TOKEN}) as sidecar:
        for concurrency in CONCURRENCY:
            plain, auth, per_request = asyncio.run(measure(upstream, sidecar.socket, concurrency, args))
            report["results"] += [plain, auth, per_request]
            report["added"].append(added(plain, auth))
            report["added_no_lease"].append(added(plain, per_request))
            harness.progress(f"c={concurrency}: measured")
        report["decomposition"] = asyncio.run(decompose(upstream, sidecar.socket, args.seconds))
        report["permit"] = asyncio.run(permit_costs(sidecar.socket, args.permit_ops, args.rounds))
        if args.profile:
            report["profile"] = asyncio.run(profile(upstream, sidecar.socket, args.profile_requests))
    harness.emit(args, report, render)
    return 0


if __name__ == "__main__":
    harness.main(main)
