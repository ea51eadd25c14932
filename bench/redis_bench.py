"""Redis state benchmark: what a grant costs with the buckets in Redis, next to the memory state
and next to a bare `EVALSHA` of the same bucket script.

Run from the repository root (the package installed, e.g. `pip install -e .`; `redis-server` on
PATH):

    python bench/redis_bench.py
    python bench/redis_bench.py --seconds 5 --concurrency 1,16 --json
    python bench/redis_bench.py --clients 2        # drive from 2 client processes

What it measures, in one run, against one private redis-server on a Unix socket
(`tests/peers/redis_peer.py`): `acquire` requests for `--seconds` each (after `--warmup`), at each
`--concurrency` (requests in flight), for

- `memory`: `await creds.acquire("bench", cost=1, max_wait=1)` against the real sidecar
  (`mcpcreds serve`, its own process) with the memory state;
- `redis`: the same against a second sidecar whose state is the Redis (`state = "unix://..."`):
  every grant is one run of `redis_state.BUCKET_SCRIPT` on the Redis;
- `evalsha`: a bare `EVALSHA` of `BUCKET_SCRIPT` ("take", cost 1, the same burst and rate) from
  `redis.asyncio` on the same Redis: the floor of what the Redis state can cost per grant.

The server's rate is `1000000/1s`, so no acquire ever waits: this measures the cost of a grant.
The load is asyncio tasks over one `AsyncClient` (or one `redis.asyncio.Redis`, whose pool opens
a connection per task in flight) in this process; with `--clients N` the tasks are split over N
client processes instead, in case the client is the bottleneck. The modes alternate in `--rounds`
rounds, so drift hits them alike. Printed per mode: requests/s and p50/p99/mean latency, then
the ratios (redis vs memory, redis vs evalsha), and the Redis commands the server ran per acquire
(`INFO commandstats`, reset before each mode; warmup included) with their server-side time.

Then a decomposition (`--no-decompose` skips it), in this process at the same levels:
`memory.raw` / `redis.raw` send the same acquire to each sidecar as fixed bytes on a bare asyncio
Unix socket per task in flight (the sidecar's own cost, without the client library), `state.bucket` calls
`RedisState.bucket` (redis-py's `Script` call plus the state's error wrapper) and
`limiter.acquire` calls `SharedLimiter.acquire` (that plus the per-key FIFO lock the sidecar
takes around every grant) on the same Redis, without a sidecar.

The clients, the sidecars and redis-server share the machine's cores: compare figures taken in the
same run only.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `import tests.peers.redis_peer`, `tests.sidecar_proc`

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from contextlib import AsyncExitStack, ExitStack  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from multiprocessing.pool import Pool  # noqa: E402
from typing import Any  # noqa: E402

import redis  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
from tests.peers.redis_peer import start_redis  # noqa: E402
from tests.sidecar_proc import SidecarProcess  # noqa: E402

from mcpcreds import AsyncClient  # noqa: E402
from mcpcreds.clock import SystemClock  # noqa: E402
from mcpcreds.rates import parse_rate  # noqa: E402
from mcpcreds.redis_state import BUCKET_SCRIPT, RedisState  # noqa: E402
from mcpcreds.shared import SharedLimiter  # noqa: E402

SERVER = "bench"
RATE = "1000000/1s"
STATE_KEY = "bench-state-key-0123456789abcdef"
FLOOR_KEY = "mcpcreds:{bench-evalsha}:bucket"
DECOMPOSE_KEY = "bench-decompose"
CONFIG = """\
[sidecar]
socket = "{socket}"
{state}
[secrets]
sources = ["env"]
[[servers]]
name = "{name}"
endpoint = "https://bench.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:KEY}}}}" }}
rate = "{rate}"
"""
STATE_LINES = 'state = "{url}"\nstate_key = "{{{{secret:STATE_KEY}}}}"'
ACQUIRE_BODY = b'{"cost": 1, "max_wait": 1}'
ACQUIRE_REQUEST = (f"POST /v1/servers/{SERVER}/acquire HTTP/1.1\r\nHost: mcpcreds\r\n"
                   "Content-Type: application/json\r\n"
                   f"Content-Length: {len(ACQUIRE_BODY)}\r\n\r\n").encode() + ACQUIRE_BODY
MODES = ("memory", "redis", "evalsha")
DECOMPOSITION = ("memory.raw", "redis.raw", "state.bucket", "limiter.acquire")
LABELS = {
    "memory": "sidecar, memory state",
    "redis": "sidecar, Redis state",
    "evalsha": "bare EVALSHA (redis-py asyncio)",
    "memory.raw": "memory sidecar, raw socket",
    "redis.raw": "Redis sidecar, raw socket",
    "state.bucket": "RedisState.bucket, in-process",
    "limiter.acquire": "SharedLimiter.acquire, in-process",
}


@dataclass(frozen=True)
class Targets:
    memory_socket: str
    redis_socket: str  # the sidecar with the Redis state
    redis_server: str  # redis-server's own Unix socket
    rate: str


@dataclass
class Result:
    mode: str
    concurrency: int
    clients: int
    requests: int
    seconds: float
    throughput: float  # requests/s
    p50_ms: float
    p99_ms: float
    mean_ms: float


def summarize(mode: str, concurrency: int, clients: int, samples: list[int], seconds: float) -> Result:
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        raise RuntimeError(f"{mode}: no request completed in {seconds:.2f}s")

    def pct(q: float) -> float:
        return ordered[min(n - 1, int(q * n))] / 1e6

    return Result(mode, concurrency, clients, n, round(seconds, 3), round(n / seconds, 1),
                  round(pct(0.50), 4), round(pct(0.99), 4), round(sum(ordered) / n / 1e6, 4))


Send = Callable[[], Awaitable[None]]


async def _sender(mode: str, targets: Targets, tasks: int, stack: AsyncExitStack) -> Send:
    """One send of `mode` for `tasks` tasks in flight; what it opens is closed by `stack`."""
    rate = parse_rate(targets.rate)
    if mode in ("memory", "redis"):
        socket = targets.memory_socket if mode == "memory" else targets.redis_socket
        creds = await stack.enter_async_context(AsyncClient(socket, grant=""))

        async def acquire() -> None:
            answer = await creds.acquire(SERVER, cost=1, max_wait=1)
            # not `waited == 0`: the Redis state counts its own round trip (and the queue on the
            # per-key lock) as waited, so it is never 0 there
            if answer.get("granted") != 1 or answer.get("waited", 1) > 0.5:
                raise RuntimeError(f"{mode}: unexpected answer {answer}")

        return acquire
    if mode in ("memory.raw", "redis.raw"):
        socket = targets.memory_socket if mode == "memory.raw" else targets.redis_socket
        idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []  # one per task in flight
        for _ in range(tasks):
            reader, writer = await asyncio.open_unix_connection(socket)
            idle.append((reader, writer))
            stack.callback(writer.close)

        async def raw() -> None:
            reader, writer = idle.pop()
            writer.write(ACQUIRE_REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            body = await reader.readexactly(length)
            idle.append((reader, writer))
            if not head.startswith(b"HTTP/1.1 200") or not body.startswith(b'{"granted":1,'):
                raise RuntimeError(f"{mode}: unexpected answer {head + body!r}")

        return raw
    if mode == "evalsha":
        r = aioredis.Redis(unix_socket_path=targets.redis_server)
        stack.push_async_callback(r.aclose)
        sha = await r.script_load(BUCKET_SCRIPT)
        args = (rate.burst, rate.per_second, 1, "take")

        async def evalsha() -> None:
            reply = await r.evalsha(sha, 1, FLOOR_KEY, *args)
            if int(reply[0]) != 1:
                raise RuntimeError(f"evalsha: not granted {reply}")

        return evalsha
    state = RedisState(f"unix://{targets.redis_server}", STATE_KEY)
    stack.push_async_callback(state.aclose)
    if mode == "state.bucket":
        async def bucket() -> None:
            granted, _, _, _ = await state.bucket(DECOMPOSE_KEY, rate, 1, "take")
            if not granted:
                raise RuntimeError("state.bucket: not granted")

        return bucket
    if mode == "limiter.acquire":
        limiter = SharedLimiter(state, SystemClock(), None, 0.5)

        async def take() -> None:
            waited = await limiter.acquire(DECOMPOSE_KEY, rate, 1, 1.0)
            if waited > 0.5:
                raise RuntimeError(f"limiter.acquire: waited {waited}s")

        return take
    raise ValueError(f"unknown mode {mode!r}")


async def _drive(mode: str, targets: Targets, tasks: int, start: float,
                 end: float) -> tuple[list[int], int]:
    """`tasks` loops sending until `end` (time.monotonic(), system-wide on Linux): the latency in ns
    of each request started in [start, end) (those before `start` are the warmup), and the number
    of requests sent in all."""
    async with AsyncExitStack() as stack:
        send = await _sender(mode, targets, tasks, stack)
        samples: list[int] = []
        sent = 0

        async def loop() -> None:
            nonlocal sent
            while True:
                began = time.monotonic()
                if began >= end:
                    return
                t0 = time.perf_counter_ns()
                await send()
                sent += 1
                if began >= start:
                    samples.append(time.perf_counter_ns() - t0)

        await asyncio.gather(*(loop() for _ in range(tasks)))
        return samples, sent


def worker(mode: str, targets: Targets, tasks: int, start: float, end: float) -> tuple[list[int], int]:
    """A client process's share of one measurement."""
    return asyncio.run(_drive(mode, targets, tasks, start, end))


def _ready(_: int) -> int:
    return os.getpid()


def split(concurrency: int, clients: int) -> list[int]:
    clients = max(1, min(clients, concurrency))
    return [concurrency // clients + (1 if i < concurrency % clients else 0) for i in range(clients)]


def measure(mode: str, targets: Targets, concurrency: int, pool: Pool | None, clients: int,
            warmup: float, seconds: float) -> tuple[list[int], int]:
    """Latency samples of the measured window, and all requests sent (warmup included)."""
    shares = split(concurrency, clients if pool is not None else 1)
    start = time.monotonic() + warmup
    end = start + seconds
    if pool is None:
        return worker(mode, targets, shares[0], start, end)
    parts = pool.starmap(worker, [(mode, targets, n, start, end) for n in shares])
    return [s for part, _ in parts for s in part], sum(sent for _, sent in parts)


def commandstats(r: redis.Redis) -> dict[str, dict[str, float]]:
    info: dict[str, Any] = r.info("commandstats")
    return {name.removeprefix("cmdstat_"): {"calls": float(v["calls"]), "usec": float(v["usec"])}
            for name, v in info.items()}


def per_acquire(stats: dict[str, dict[str, float]], requests: int) -> dict[str, dict[str, float]]:
    """Commands the Redis ran per acquire, and their server-side microseconds per acquire
    (the INFO/CONFIG calls of this bench itself left out)."""
    return {name: {"calls": round(v["calls"] / requests, 3), "usec": round(v["usec"] / requests, 2)}
            for name, v in sorted(stats.items()) if name not in ("info", "config|resetstat", "config")}


def ratios(a: Result, b: Result) -> dict[str, float]:
    return {"throughput": round(a.throughput / b.throughput, 3), "p50": round(a.p50_ms / b.p50_ms, 3),
            "p99": round(a.p99_ms / b.p99_ms, 3), "mean": round(a.mean_ms / b.mean_ms, 3)}


def start_sidecar(workdir: Path, name: str, state: str, env: dict[str, str]) -> SidecarProcess:
    sock = workdir / name / "s.sock"
    config = workdir / f"{name}.toml"
    config.write_text(CONFIG.format(socket=sock, state=state, name=SERVER, rate=RATE))
    sidecar = SidecarProcess(config, sock, env)
    try:
        sidecar.wait_for("ready")
    except BaseException:
        sidecar.stop()
        raise
    return sidecar


def odd_log_lines(sidecar: SidecarProcess) -> list[str]:
    out = []
    for line in sidecar.lines:
        try:
            level = str(json.loads(line).get("level", "")).lower()
        except ValueError:
            level = "unparsed"
        if level not in ("info", "debug"):
            out.append(line.strip())
    return out


def fmt(r: Result) -> str:
    return (f"{LABELS.get(r.mode, r.mode):<34} c={r.concurrency:<3} n={r.requests:<7} "
            f"{r.throughput:>9.1f} req/s   p50 {r.p50_ms:7.3f} ms   p99 {r.p99_ms:7.3f} ms   "
            f"mean {r.mean_ms:7.3f} ms")


def fmt_ratio(label: str, x: dict[str, float]) -> str:
    return (f"  {label:<32} throughput x{x['throughput']:<7} p50 x{x['p50']:<7} p99 x{x['p99']:<7} "
            f"mean x{x['mean']}")


def parse_levels(text: str) -> list[int]:
    levels = [int(part) for part in text.split(",") if part.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("--concurrency: comma-separated whole numbers >= 1")
    return levels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Acquire cost: Redis state vs memory state vs bare EVALSHA.")
    parser.add_argument("--seconds", type=float, default=5.0, help="per mode, level and round (default 5)")
    parser.add_argument("--concurrency", type=parse_levels, default=[1, 16],
                        help="requests in flight, comma-separated (default 1,16)")
    parser.add_argument("--clients", type=int, default=1,
                        help="client processes sharing the load (default 1: tasks in this process)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1)")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each measurement")
    parser.add_argument("--no-decompose", action="store_true", help="skip the in-process decomposition")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="mcpcreds-redis-bench-"))
    os.chmod(workdir, 0o700)
    env = {"KEY": "bench-api-key-0123456789", "STATE_KEY": STATE_KEY}
    report: dict[str, Any] = {
        "python": sys.version.split()[0], "redis_py": redis.__version__, "cpus": os.cpu_count(),
        "seconds": args.seconds, "rounds": args.rounds, "warmup": args.warmup, "clients": args.clients,
        "rate": RATE, "results": [], "ratios": [], "redis_commands_per_acquire": {}, "decomposition": [],
        "sidecar_log_warnings": {}}
    try:
        with ExitStack() as stack:
            server = stack.enter_context(start_redis())
            admin = redis.Redis(unix_socket_path=str(server.socket))
            stack.callback(admin.close)
            report["redis_server"] = admin.info("server")["redis_version"]
            memory = start_sidecar(workdir, "memory", "", env)
            stack.callback(memory.stop)
            shared = start_sidecar(workdir, "redis", STATE_LINES.format(url=server.url), env)
            stack.callback(shared.stop)
            targets = Targets(str(memory.socket), str(shared.socket), str(server.socket), RATE)
            pool: Pool | None = None
            if args.clients > 1:
                pool = multiprocessing.get_context("spawn").Pool(args.clients)
                stack.callback(pool.terminate)
                pool.map(_ready, range(args.clients))  # the processes are up before any clock starts
            if not args.json:
                print(f"redis-server {report['redis_server']}, redis-py {redis.__version__}, "
                      f"{os.cpu_count()} cpus; {args.seconds}s x {args.rounds} round(s) per mode; "
                      f"client: {args.clients} process(es)\n", flush=True)
            for concurrency in args.concurrency:
                samples: dict[str, list[int]] = {mode: [] for mode in MODES}
                stats: dict[str, dict[str, dict[str, float]]] = {mode: {} for mode in MODES}
                sent = dict.fromkeys(MODES, 0)
                for _ in range(args.rounds):
                    for mode in MODES:
                        admin.config_resetstat()
                        got, n = measure(mode, targets, concurrency, pool, args.clients, args.warmup,
                                         args.seconds)
                        samples[mode] += got
                        sent[mode] += n
                        for name, v in commandstats(admin).items():
                            acc = stats[mode].setdefault(name, {"calls": 0.0, "usec": 0.0})
                            acc["calls"] += v["calls"]
                            acc["usec"] += v["usec"]
                elapsed = args.seconds * args.rounds
                used = len(split(concurrency, args.clients if pool is not None else 1))
                results = {mode: summarize(mode, concurrency, used, samples[mode], elapsed) for mode in MODES}
                report["results"] += [asdict(r) for r in results.values()]
                x = {"concurrency": concurrency,
                     "redis_vs_memory": ratios(results["redis"], results["memory"]),
                     "redis_vs_evalsha": ratios(results["redis"], results["evalsha"])}
                report["ratios"].append(x)
                # the warmup's commands count too: divided by every request sent, not only the sampled
                cmds = {mode: per_acquire(stats[mode], max(1, sent[mode])) for mode in MODES}
                report["redis_commands_per_acquire"][str(concurrency)] = cmds
                if not args.json:
                    for r in results.values():
                        print(fmt(r))
                    print(fmt_ratio("redis / memory", x["redis_vs_memory"]))
                    print(fmt_ratio("redis / evalsha", x["redis_vs_evalsha"]))
                    print("  Redis commands per grant (server-side usec):")
                    for mode in ("memory", "redis", "evalsha"):
                        row = ", ".join(f"{name} {v['calls']} ({v['usec']} us)"
                                        for name, v in cmds[mode].items() if v["calls"] >= 0.01) or "none"
                        print(f"    {mode:<8} {row}")
                    print(flush=True)
            if not args.no_decompose:
                if not args.json:
                    print("decomposition (this process, asyncio): acquire as fixed bytes on a bare Unix "
                          "socket per task in flight, then the Redis state's parts without the sidecar:")
                for concurrency in args.concurrency:
                    for mode in DECOMPOSITION:
                        got, _ = measure(mode, targets, concurrency, None, 1, args.warmup, args.seconds)
                        r = summarize(mode, concurrency, 1, got, args.seconds)
                        report["decomposition"].append(asdict(r))
                        if not args.json:
                            print("  " + fmt(r), flush=True)
            for name, sidecar in (("memory", memory), ("redis", shared)):
                report["sidecar_log_warnings"][name] = odd_log_lines(sidecar)
            if not args.json and any(report["sidecar_log_warnings"].values()):
                print("\nsidecar log lines above info:")
                for name, lines in report["sidecar_log_warnings"].items():
                    for line in lines[:10]:
                        print(f"  {name}: {line}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
