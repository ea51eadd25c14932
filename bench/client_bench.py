"""Client benchmark: the latency `auth=creds.auth(...)` adds to each upstream request.

Run from the repository root (the package installed, e.g. `pip install -e .`):

    python bench/client_bench.py
    python bench/client_bench.py --seconds 2 --rounds 5 --json
    python bench/client_bench.py --profile          # and where the time goes (cProfile)

What it measures: `GET /mcp` requests from one `httpx.AsyncClient` (asyncio; one client per run)
to a local upstream that answers at once (`tests/peers/upstream.py` in its own process: uvicorn
with httptools, requiring `Authorization: Bearer <token>`), at 1 and 16 requests in flight:

- `plain`: the client sends the bearer header itself (`headers=`);
- `auth`: the client gets it per request from the real sidecar (`mcpcreds serve`, its own
  process) through `auth=creds.auth("bench")`: one `POST /v1/servers/bench/call` round trip on
  the Unix socket (permit + headers) before each upstream request. The server has a static
  `Bearer {{secret:BENCH_TOKEN}}` header and `rate = "1000000/1s"`, so no request ever waits.

For each it prints p50/p99/mean latency per request and throughput, and the difference
(`auth` - `plain`): the added latency. The two modes alternate in `--rounds` rounds of
`--seconds` each (after a `--warmup`), so drift hits both alike. A decomposition at concurrency 1
follows: the sidecar call alone through `AsyncClient.call` (what `auth=` adds), the same request
on a raw blocking Unix socket (the sidecar's own time plus the kernel), and a bare
`httpx.AsyncClient` request to the upstream. `--profile` runs cProfile over the `auth` mode at
concurrency 1 and prints the cumulative time of the flow's parts.

The client, the sidecar and the upstream share the machine's cores: compare figures taken in the
same run only.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `import tests.sidecar_proc`

import argparse  # noqa: E402
import asyncio  # noqa: E402
import cProfile  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
from tests.peers.upstream import start_upstream_process  # noqa: E402
from tests.sidecar_proc import SidecarProcess  # noqa: E402

from mcpcreds import AsyncClient  # noqa: E402

SERVER = "bench"
TOKEN = "bench-token-0123456789abcdef0123456789abcdef"
CONFIG = """\
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[[servers]]
name = "{name}"
endpoint = "{endpoint}"
headers = {{ "Authorization" = "Bearer {{{{secret:BENCH_TOKEN}}}}" }}
rate = "1000000/1s"
"""
CONCURRENCY = (1, 16)
CALL_BODY = b'{"cost": 1, "max_wait": 30.0}'
CALL_REQUEST = (f"POST /v1/servers/{SERVER}/call HTTP/1.1\r\nHost: mcpcreds\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(CALL_BODY)}\r\n\r\n").encode() + CALL_BODY


@dataclass
class Result:
    mode: str
    concurrency: int
    requests: int
    seconds: float
    throughput: float  # requests/s
    p50_ms: float
    p99_ms: float
    mean_ms: float


def summarize(mode: str, concurrency: int, samples: list[int], seconds: float) -> Result:
    ordered = sorted(samples)
    n = len(ordered)

    def pct(q: float) -> float:
        return ordered[min(n - 1, int(q * n))] / 1e6

    return Result(mode, concurrency, n, round(seconds, 3), round(n / seconds, 1), round(pct(0.50), 4),
                  round(pct(0.99), 4), round(sum(ordered) / n / 1e6, 4))


Send = Callable[[], Awaitable[None]]


async def drive(send: Send, concurrency: int, seconds: float, samples: list[int] | None) -> int:
    """`concurrency` loops calling `send` until `seconds` pass; the latency of each call in ns."""
    stop = time.perf_counter() + seconds
    done = 0

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            started = time.perf_counter_ns()
            await send()
            if samples is not None:
                samples.append(time.perf_counter_ns() - started)
            done += 1

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return done


def upstream_send(http: httpx.AsyncClient) -> Send:
    async def send() -> None:
        response = await http.get("/mcp")
        if response.status_code != 200:
            raise RuntimeError(f"upstream answered {response.status_code}: {response.text}")

    return send


async def measure(upstream: str, sock: Path, concurrency: int, args: argparse.Namespace) -> list[Result]:
    samples: dict[str, list[int]] = {"plain": [], "auth": []}
    elapsed = {"plain": 0.0, "auth": 0.0}
    async with AsyncClient(sock) as creds, \
            httpx.AsyncClient(base_url=upstream, headers={"Authorization": f"Bearer {TOKEN}"}) as plain, \
            httpx.AsyncClient(base_url=upstream, auth=creds.auth(SERVER)) as authed:
        sends = {"plain": upstream_send(plain), "auth": upstream_send(authed)}
        for send in sends.values():
            await drive(send, concurrency, args.warmup, None)
        for _ in range(args.rounds):
            for mode, send in sends.items():
                started = time.perf_counter()
                await drive(send, concurrency, args.seconds, samples[mode])
                elapsed[mode] += time.perf_counter() - started
    return [summarize(mode, concurrency, samples[mode], elapsed[mode]) for mode in samples]


def added(plain: Result, auth: Result) -> dict[str, Any]:
    return {"concurrency": plain.concurrency,
            "p50_ms": round(auth.p50_ms - plain.p50_ms, 4),
            "p99_ms": round(auth.p99_ms - plain.p99_ms, 4),
            "mean_ms": round(auth.mean_ms - plain.mean_ms, 4),
            "throughput_ratio": round(auth.throughput / plain.throughput, 3)}


def raw_call_latency(sock: Path, seconds: float) -> Result:
    """The sidecar's `call` on one blocking keep-alive Unix socket: no httpx, no event loop."""
    samples: list[int] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(sock))
        stop = time.perf_counter() + seconds
        started_all = time.perf_counter()
        while time.perf_counter() < stop:
            started = time.perf_counter_ns()
            conn.sendall(CALL_REQUEST)
            buf = b""
            while True:
                buf += conn.recv(65536)
                head_end = buf.find(b"\r\n\r\n")
                if head_end < 0:
                    continue
                length = int(buf.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                if len(buf) >= head_end + 4 + length:
                    break
            if not buf.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"sidecar answered {buf[:200]!r}")
            samples.append(time.perf_counter_ns() - started)
        return summarize("sidecar call, raw socket", 1, samples, time.perf_counter() - started_all)


async def decompose(upstream: str, sock: Path, seconds: float) -> list[Result]:
    out = []
    async with AsyncClient(sock) as creds:
        async def call() -> None:
            await creds.call(SERVER)

        await drive(call, 1, min(seconds, 0.5), None)
        samples: list[int] = []
        started = time.perf_counter()
        await drive(call, 1, seconds, samples)
        out.append(summarize("sidecar call, AsyncClient.call", 1, samples, time.perf_counter() - started))
    out.append(await asyncio.to_thread(raw_call_latency, sock, seconds))
    async with httpx.AsyncClient(base_url=upstream, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        send = upstream_send(http)
        await drive(send, 1, min(seconds, 0.5), None)
        samples = []
        started = time.perf_counter()
        await drive(send, 1, seconds, samples)
        out.append(summarize("upstream GET, bare httpx", 1, samples, time.perf_counter() - started))
    return out


PROFILE_GROUPS = (
    ("whole request: httpx AsyncClient.send (flow + upstream)", "httpx/_client.py", ("send",)),
    ("sidecar round trip: mcpcreds AsyncClient.run (httpx, UDS)", "mcpcreds/client.py", ("run",)),
    ("the flow itself: credential_flow + _apply", "mcpcreds/auth.py", ("credential_flow", "_apply")),
)


async def profile(upstream: str, sock: Path, requests: int) -> dict[str, Any]:
    """cProfile over `requests` upstream requests through `auth=` at concurrency 1."""
    async with AsyncClient(sock) as creds, \
            httpx.AsyncClient(base_url=upstream, auth=creds.auth(SERVER)) as http:
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


def start_sidecar(workdir: Path, upstream: str) -> SidecarProcess:
    sock = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(CONFIG.format(socket=sock, name=SERVER, endpoint=f"{upstream}/mcp"))
    sidecar = SidecarProcess(config, sock, {"BENCH_TOKEN": TOKEN})
    try:
        sidecar.wait_for("ready")
    except BaseException:
        sidecar.stop()
        raise
    return sidecar


def fmt(r: Result) -> str:
    return (f"{r.mode:<34} c={r.concurrency:<3} n={r.requests:<7} {r.throughput:>9.1f} req/s   "
            f"p50 {r.p50_ms:7.3f} ms   p99 {r.p99_ms:7.3f} ms   mean {r.mean_ms:7.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Latency added by auth=creds.auth(...) per request.")
    parser.add_argument("--seconds", type=float, default=1.5, help="per mode and round (default 1.5)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds per mode first (default 0.5)")
    parser.add_argument("--profile", action="store_true", help="cProfile the auth mode at concurrency 1")
    parser.add_argument("--profile-requests", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="mcpcreds-client-bench-"))
    os.chmod(workdir, 0o700)
    report: dict[str, Any] = {"python": sys.version.split()[0], "httpx": httpx.__version__,
                              "cpus": os.cpu_count(), "seconds": args.seconds, "rounds": args.rounds,
                              "results": [], "added": [], "decomposition": []}
    try:
        with start_upstream_process(TOKEN) as upstream:
            sidecar = start_sidecar(workdir, upstream)
            try:
                for concurrency in CONCURRENCY:
                    plain, auth = asyncio.run(measure(upstream, sidecar.socket, concurrency, args))
                    report["results"] += [asdict(plain), asdict(auth)]
                    report["added"].append(added(plain, auth))
                    if not args.json:
                        print(fmt(plain))
                        print(fmt(auth))
                        a = report["added"][-1]
                        print(f"{'added by auth=':<34} c={concurrency:<3} {'':<9}"
                              f"p50 {a['p50_ms']:+7.3f} ms   p99 {a['p99_ms']:+7.3f} ms   "
                              f"mean {a['mean_ms']:+7.3f} ms   throughput x{a['throughput_ratio']}\n",
                              flush=True)
                parts = asyncio.run(decompose(upstream, sidecar.socket, args.seconds))
                report["decomposition"] = [asdict(r) for r in parts]
                if not args.json:
                    print("decomposition at concurrency 1:")
                    for r in parts:
                        print("  " + fmt(r))
                if args.profile:
                    report["profile"] = asyncio.run(profile(upstream, sidecar.socket, args.profile_requests))
                    if not args.json:
                        prof = report["profile"]
                        print(f"\nprofile ({prof['requests']} requests through auth=, c=1; "
                              f"{prof['wall_ms_per_request_profiled']} ms/request under cProfile):")
                        for label, ms in prof["cumulative_ms_per_request"].items():
                            print(f"  {label:<58} {ms:8.4f} ms/request")
                        print("  top functions by own time:")
                        for row in prof["top_tottime_ms_per_request"]:
                            print(f"    {row['function']:<60} {row['calls_per_request']:>6} calls "
                                  f"{row['ms']:8.4f} ms")
            finally:
                sidecar.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
