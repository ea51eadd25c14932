"""Redis state benchmark: what a grant costs with the buckets in Redis, next to the memory state
and next to a bare `EVALSHA` of the same bucket script.

Run from the repository root (the package installed, e.g. `pip install -e .`; `redis-server` on
PATH):

    python bench/redis_bench.py
    python bench/redis_bench.py --seconds 5 --concurrency 1,16 --json
    python bench/redis_bench.py --clients 2        # drive from 2 client processes
    python bench/redis_bench.py --quick            # a smoke run of a few seconds

What it measures, in one run, against one private redis-server on a Unix socket
(`tests/peers/redis_peer.py`): `acquire` requests for `--seconds` each (after `--warmup`), at each
`--concurrency` (requests in flight), for

- `memory`: `await creds.acquire("bench", cost=1, max_wait=1)` against the real sidecar
  (`mcpcreds serve`, its own process) with the memory state;
- `redis`: the same against a second sidecar whose state is the Redis (`state = "unix://..."`):
  every grant is decided by a run of `redis_state.BUCKET_SCRIPT` on the Redis, one run for the
  callers of the key that wait together (a batch), sent on the sidecar's pipelined connection;
- `evalsha`: a bare `EVALSHA` of `BUCKET_SCRIPT` ("take", cost 1, the same burst and rate) from
  `redis.asyncio` on the same Redis, one per grant: the baseline (what a client calling the
  script itself pays).

The server's rate is `1000000/1s`, so no acquire ever waits: this measures the cost of a grant.
The load is asyncio tasks over one `AsyncClient` (or one `redis.asyncio.Redis`, whose pool opens
a connection per task in flight) in this process; with `--clients N` the tasks are split over N
client processes instead, in case the client is the bottleneck. The modes alternate in `--rounds`
rounds, so drift hits them alike. Printed per mode: requests/s and p50/p99/mean latency, then
the ratios (redis vs memory, redis vs evalsha; the target is redis / evalsha throughput >= 0.8 at
c=1 and c=16), and the Redis commands the server ran per acquire (`INFO commandstats`, reset
before each mode; warmup included) with their server-side time, and the bucket script's
server-side time: per run (EVALSHA's `usec` / `calls`, the commands the script calls included),
runs per grant (with batching, one run serves several grants) and per grant.

Then a decomposition (`--no-decompose` skips it), in this process at the same levels:
`memory.raw` / `redis.raw` send the same acquire to each sidecar as fixed bytes on a bare asyncio
Unix socket per task in flight (the sidecar's own cost, without the client library); `relay.raw`
sends them to the least relay (`relay`, its own process: each request becomes the same pre-packed
EVALSHA on one pipelined Redis connection, each reply a fixed answer), the floor of any process
that stands between the client and Redis and asks Redis once per grant, with its ratio to the
bare EVALSHA and the Redis sidecar's ratio to it; `state.bucket` calls
`RedisState.bucket` (one EVALSHA on the state's pipelined connection, `redis_pipe.py`, plus its
error wrapper: a bare EVALSHA without redis-py's pool) and `limiter.acquire` calls
`SharedLimiter.acquire` (that plus the per-key queue and batching) on the same Redis, without a
sidecar.

The clients, the sidecars and redis-server share the machine's cores: compare figures taken in the
same run only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import deque
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from tests.peers.redis_peer import start_redis

from bench import harness, wire
from bench.harness import Latency
from mcpcreds import AsyncClient
from mcpcreds.core.clock import SystemClock
from mcpcreds.core.rates import parse_rate
from mcpcreds.state.bucket_scripts import BUCKET_SCRIPT
from mcpcreds.state.lease_asks import MAX_PAUSE
from mcpcreds.state.redis_pipe import pack, parse_reply
from mcpcreds.state.redis_state import RedisState
from mcpcreds.state.shared import SharedLimiter

SERVER = "bench"
RATE = "1000000/1s"
STATE_KEY = "bench-state-key-0123456789abcdef"
FLOOR_KEY = "mcpcreds:{bench-evalsha}:bucket"
RELAY_KEY = "mcpcreds:{bench-relay}:bucket"
DECOMPOSE_KEY = "bench-decompose"
ACQUIRE_REQUEST = wire.request_bytes("POST", f"/v1/servers/{SERVER}/acquire",
                                        b'{"cost": 1, "max_wait": 1}')
MODES = ("memory", "redis", "evalsha")
DECOMPOSITION = ("memory.raw", "redis.raw", "relay.raw", "state.bucket", "limiter.acquire")
GRANTED = b'{"granted":1,"waited":0.0}'
RELAY_ANSWERS = {granted: b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                 % (status, len(body), body)
                 for granted, status, body in ((True, 200, GRANTED), (False, 429, b'{"granted":0}'))}
LABELS = {
    "memory": "sidecar, memory state",
    "redis": "sidecar, Redis state",
    "evalsha": "bare EVALSHA (redis-py asyncio)",
    "memory.raw": "memory sidecar, raw socket",
    "redis.raw": "Redis sidecar, raw socket",
    "relay.raw": "least relay to Redis, raw socket",
    "state.bucket": "RedisState.bucket, pipelined",
    "limiter.acquire": "SharedLimiter.acquire, in-process",
}


@dataclass(frozen=True)
class Targets:
    memory_socket: str
    redis_socket: str  # the sidecar with the Redis state
    redis_server: str  # redis-server's own Unix socket
    rate: str
    relay_socket: str = ""  # `relay`'s process, if started


def bucket_args(rate: str) -> tuple[Any, ...]:
    """The bucket script's ARGV for one "take" of cost 1, as RedisState sends them."""
    parsed = parse_rate(rate)
    return (parsed.burst, parsed.per_second, 1, "take", 0.0, MAX_PAUSE)


async def relay(listen: str, redis_socket: str, command: bytes) -> None:
    """The least a process between the client and Redis does per acquire, a floor for any sidecar
    that asks Redis once per grant. Each acquire request read (the bench's fixed bytes) becomes
    `command` (the same pre-packed EVALSHA) on one pipelined Redis connection, and each reply a
    fixed answer: no HTTP parsing, routing, tasks or futures. Serves `listen` until its process ends."""
    waiting: deque[asyncio.Transport] = deque()

    class Replies(asyncio.Protocol):
        buf = b""

        def data_received(self, data: bytes) -> None:
            buf, pos = self.buf + data, 0
            while (parsed := parse_reply(buf, pos)) is not None:
                reply, pos = parsed
                waiting.popleft().write(RELAY_ANSWERS[reply[0] == 1])
            self.buf = buf[pos:]

    class Requests(asyncio.Protocol):
        buf = b""
        transport: asyncio.Transport

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while len(self.buf) >= len(ACQUIRE_REQUEST):
                self.buf = self.buf[len(ACQUIRE_REQUEST):]
                waiting.append(self.transport)
                to_redis.write(command)

    loop = asyncio.get_running_loop()
    to_redis, _ = await loop.create_unix_connection(Replies, redis_socket)
    await loop.create_unix_server(Requests, listen)
    await loop.create_future()  # until the bench ends this process


def start_relay(stack: ExitStack, folder: Path, redis_socket: str, rate: str) -> str:
    """`relay` in its own process on `folder/relay.sock`; its socket."""
    admin = redis.Redis(unix_socket_path=redis_socket)
    sha = admin.script_load(BUCKET_SCRIPT)
    admin.close()
    listen = str(folder / "relay.sock")
    command = pack(("EVALSHA", sha, 2, RELAY_KEY, RELAY_KEY + "-leases", *bucket_args(rate)))
    stack.enter_context(harness.server_process(relay, listen, redis_socket, command, socket_path=listen,
                                               what="the relay"))
    return listen


async def _sender(mode: str, targets: Targets, tasks: int, stack: AsyncExitStack) -> harness.Send:
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
    if mode in ("memory.raw", "redis.raw", "relay.raw"):
        socket = {"memory.raw": targets.memory_socket, "redis.raw": targets.redis_socket,
                  "relay.raw": targets.relay_socket}[mode]
        idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []  # one per task in flight
        for _ in range(tasks):
            reader, writer = await asyncio.open_unix_connection(socket)
            idle.append((reader, writer))
            stack.callback(writer.close)

        async def raw() -> None:
            reader, writer = idle.pop()
            status, body = await wire.aroundtrip(reader, writer, ACQUIRE_REQUEST)
            idle.append((reader, writer))
            if status != 200 or not body.startswith(b'{"granted":1,'):
                raise RuntimeError(f"{mode}: unexpected answer {status} {body!r}")

        return raw
    if mode == "evalsha":
        r = aioredis.Redis(unix_socket_path=targets.redis_server)
        stack.push_async_callback(r.aclose)
        sha = await r.script_load(BUCKET_SCRIPT)
        args = bucket_args(targets.rate)

        async def evalsha() -> None:
            reply = await r.evalsha(sha, 2, FLOOR_KEY, FLOOR_KEY + "-leases", *args)
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
        stack.push_async_callback(limiter.aclose)  # its lease of the key, given back before the next mode

        async def take() -> None:
            waited = await limiter.acquire(DECOMPOSE_KEY, rate, 1, 1.0)
            # a grant from the sidecar's own lease never yields to the loop; a request's I/O does,
            # and so must this caller, or the limiter's background renewal never runs
            await asyncio.sleep(0)
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
        sent = await harness.drive(send, tasks, end, samples, record_from=start)
        return samples, sent


async def client(params: tuple[str, Targets, int, float, float],
                 release: harness.Release) -> tuple[list[int], int]:
    """A client process's share of one measurement (a load phase)."""
    mode, targets, tasks, warmup, seconds = params
    start = await release.wait_async() + warmup
    return await _drive(mode, targets, tasks, start, start + seconds)


def measure(mode: str, targets: Targets, concurrency: int, workers: harness.Workers | None,
            warmup: float, seconds: float) -> tuple[list[int], int]:
    """Latency samples of the measured window, and all requests sent (warmup included)."""
    if workers is None:
        start = time.monotonic() + warmup
        return asyncio.run(_drive(mode, targets, concurrency, start, start + seconds))
    shares = harness.split(concurrency, len(workers.procs))
    parts = workers.run(client, [(mode, targets, n, warmup, seconds) for n in shares],
                        timeout=warmup + seconds + 60.0)
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


def fmt(r: Latency) -> str:
    return harness.line(r, LABELS.get(r.mode, r.mode))


def fmt_ratio(label: str, x: dict[str, float]) -> str:
    return (f"  {label:<32} throughput x{x['throughput']:<7} p50 x{x['p50']:<7} p99 x{x['p99']:<7} "
            f"mean x{x['mean']}")


def script_time(cmds: dict[str, dict[str, float]], stats: dict[str, dict[str, float]]) -> dict[str, float]:
    """The bucket script's server-side time (`INFO commandstats`: EVALSHA's usec is the whole run,
    the commands the script calls included): runs per grant, microseconds per run and per grant."""
    runs = stats.get("evalsha", {"calls": 0.0, "usec": 0.0})
    per_run = runs["usec"] / runs["calls"] if runs["calls"] else 0.0
    per_grant = cmds.get("evalsha", {"calls": 0.0, "usec": 0.0})
    return {"runs_per_grant": per_grant["calls"], "usec_per_run": round(per_run, 1),
            "usec_per_grant": per_grant["usec"]}


def measure_level(concurrency: int, targets: Targets, workers: harness.Workers | None, admin: redis.Redis,
                  args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Every mode at one level, `args.rounds` alternating rounds; into `report`, and printed."""
    samples: dict[str, list[int]] = {mode: [] for mode in MODES}
    stats: dict[str, dict[str, dict[str, float]]] = {mode: {} for mode in MODES}
    sent = dict.fromkeys(MODES, 0)
    for _ in range(args.rounds):
        for mode in MODES:
            admin.config_resetstat()
            got, n = measure(mode, targets, concurrency, workers, args.warmup, args.seconds)
            samples[mode] += got
            sent[mode] += n
            for name, v in commandstats(admin).items():
                acc = stats[mode].setdefault(name, {"calls": 0.0, "usec": 0.0})
                acc["calls"] += v["calls"]
                acc["usec"] += v["usec"]
    used = len(harness.split(concurrency, args.clients if workers is not None else 1))
    results = {mode: harness.summarize(mode, concurrency, samples[mode], args.seconds * args.rounds, used)
               for mode in MODES}
    report["results"] += results.values()
    vs_memory = harness.ratios(results["redis"], results["memory"])
    vs_evalsha = harness.ratios(results["redis"], results["evalsha"])
    report["ratios"].append({"concurrency": concurrency, "redis_vs_memory": vs_memory,
                             "redis_vs_evalsha": vs_evalsha})
    # the warmup's commands count too: divided by every request sent, not only the sampled
    cmds = {mode: per_acquire(stats[mode], max(1, sent[mode])) for mode in MODES}
    report["redis_commands_per_acquire"][str(concurrency)] = cmds
    times = {mode: script_time(cmds[mode], stats[mode]) for mode in ("redis", "evalsha")}
    report["script_time"][str(concurrency)] = times
    if not args.json:
        for r in results.values():
            print(fmt(r))
        print(fmt_ratio("redis / memory", vs_memory))
        print(fmt_ratio("redis / evalsha", vs_evalsha))
        print("  Redis commands per grant (server-side usec):")
        for mode in ("memory", "redis", "evalsha"):
            row = ", ".join(f"{name} {v['calls']} ({v['usec']} us)"
                            for name, v in cmds[mode].items() if v["calls"] >= 0.01) or "none"
            print(f"    {mode:<8} {row}")
        print("  the bucket script, server-side:")
        for mode, t in times.items():
            print(f"    {mode:<8} {t['usec_per_run']:.1f} us per run x {t['runs_per_grant']} runs per grant "
                  f"= {t['usec_per_grant']:.2f} us per grant")
        print(harness.ratio_line(f"acquire throughput, c={concurrency} (target >= 0.8x)",
                                 ("Redis state", results["redis"].throughput),
                                 ("bare EVALSHA", results["evalsha"].throughput)))
        print(flush=True)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments("Acquire cost: Redis state vs memory state vs bare EVALSHA.")
    p.add_argument("--seconds", type=float, default=5.0, help="per mode, level and round (default 5)")
    p.add_argument("--concurrency", type=harness.levels, default=[1, 16],
                   help="requests in flight, comma-separated (default 1,16)")
    p.add_argument("--clients", type=int, default=1,
                   help="client processes sharing the load (default 1: tasks in this process)")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds (default 1)")
    p.add_argument("--warmup", type=float, default=0.5, help="seconds before each measurement")
    p.add_argument("--no-decompose", action="store_true", help="skip the in-process decomposition")
    args = harness.parse(p, argv, quick={"seconds": 1.0, "warmup": 0.2, "concurrency": [1, 4]})

    env = {"KEY": "bench-api-key-0123456789", "STATE_KEY": STATE_KEY}
    report: dict[str, Any] = {
        **harness.machine(), "redis_py": redis.__version__, "seconds": args.seconds, "rounds": args.rounds,
        "warmup": args.warmup, "clients": args.clients, "rate": RATE, "results": [], "ratios": [],
        "redis_commands_per_acquire": {}, "script_time": {}, "decomposition": []}
    block = harness.static_server(SERVER, {"X-Api-Key": "{{secret:KEY}}"}, rate=RATE)
    with ExitStack() as stack:
        tmp = stack.enter_context(harness.workdir("redis-bench"))
        workers = stack.enter_context(harness.Workers(args.clients)) if args.clients > 1 else None
        server = stack.enter_context(harness.started(start_redis(), "redis-server"))
        admin = redis.Redis(unix_socket_path=str(server.socket))
        stack.callback(admin.close)
        report["redis_server"] = admin.info("server")["redis_version"]
        memory = stack.enter_context(harness.sidecar(tmp / "memory", block, env=env))
        state = f'state = "{server.url}"\nstate_key = "{{{{secret:STATE_KEY}}}}"'
        shared = stack.enter_context(harness.sidecar(tmp / "redis", block, env=env, settings=state))
        relay_socket = "" if args.no_decompose else start_relay(stack, tmp, str(server.socket), RATE)
        targets = Targets(str(memory.socket), str(shared.socket), str(server.socket), RATE, relay_socket)
        if not args.json:
            print(f"redis-server {report['redis_server']}, redis-py {redis.__version__}, "
                  f"{os.cpu_count()} cpus; {args.seconds}s x {args.rounds} round(s) per mode; "
                  f"client: {args.clients} process(es)\n", flush=True)
        for concurrency in args.concurrency:
            measure_level(concurrency, targets, workers, admin, args, report)
        if not args.no_decompose:
            if not args.json:
                print("decomposition (this process, asyncio): acquire as fixed bytes on a bare Unix "
                      "socket per task in flight, then the Redis state's parts without the sidecar:")
            for concurrency in args.concurrency:
                rows = {}
                for mode in DECOMPOSITION:
                    got, _ = measure(mode, targets, concurrency, None, args.warmup, args.seconds)
                    r = rows[mode] = harness.summarize(mode, concurrency, got, args.seconds)
                    report["decomposition"].append(r)
                    if not args.json:
                        print("  " + fmt(r), flush=True)
                if not args.json:
                    bare = next(r for r in report["results"]
                                if (r.mode, r.concurrency) == ("evalsha", concurrency))
                    relay_rps = rows["relay.raw"].throughput
                    print("  " + harness.ratio_line(f"c={concurrency}, a relay's floor", (
                        "least relay", relay_rps), ("bare EVALSHA", bare.throughput)))
                    print("  " + harness.ratio_line(f"c={concurrency}, the sidecar past the floor", (
                        "Redis sidecar", rows["redis.raw"].throughput), ("least relay", relay_rps)))
        procs = {"memory": memory, "redis": shared}
        report["sidecar_log_warnings"] = (harness.print_log_warnings(procs) if not args.json
                                          else {name: harness.log_warnings(p) for name, p in procs.items()})
    if args.json:
        harness.emit(args, report, str)
    return 0


if __name__ == "__main__":
    harness.main(main)
