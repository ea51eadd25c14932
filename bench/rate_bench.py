"""Rate benchmark: one shared sidecar bucket against one in-process aiolimiter per process.

Run from the repository root (the package installed, e.g. `pip install -e .`, and matplotlib):

    python bench/rate_bench.py           # 8 processes, "100/1s", 10 s; writes bench/rate_bench.png
    python bench/rate_bench.py --json    # the same, the figures as JSON on stdout
    python bench/rate_bench.py --seconds 10 --processes 8 --rate 100/1s --png bench/rate_bench.png
    python bench/rate_bench.py --rounds 3 --png ''   # three rounds of the sidecar phases, no PNG
    python bench/rate_bench.py --quick   # a smoke run: 2 processes x 2 tasks for 1 s, no PNG

What it measures (issue 5): `--processes` OS processes (spawned) hammer one server whose
`rate = "<burst>/<per>"` for `--seconds`, all released at the same wall-clock instant t0.

1. Sidecar: a real `mcpcreds serve` on a temporary socket. Each process runs `--tasks` (default 4)
   coroutines on one `AsyncClient`, each looping on `call("bench", cost=1, max_wait=<time left>)`,
   so the bucket always has waiters. A grant counts if its answer arrives before t0 + seconds.
   A token bucket that starts full allows at most `burst + burst/per * seconds` permits in the
   window (100 + 100 x 10 = 1100 by default); the sidecar's total must not exceed that bound and
   must reach at least 98% of it. Its `/v1/status` `granted` counter is read as a cross-check.
2. Status quo, in the same run: the same processes, each with its own
   `aiolimiter.AsyncLimiter(burst, per)` and the same coroutines doing `async with limiter:`.
   Every process gets the whole rate, so the total is about `processes` times the bound.

3. `creds.auth()`, in the same run: the same processes and coroutines sending requests through
   an `httpx.AsyncClient(auth=creds.auth("bench"))` to an in-process upstream (an
   `httpx.MockTransport` that notes each arrival), once as the auth comes (`lease="auto"`: leases
   where they pay) and once with `lease=False` (a round trip per request), each against a fresh
   sidecar. Each must use at least 98% of the bound, never more.
4. Redis, in the same run: two fresh sidecars on one fresh redis-server (one bucket in Redis),
   the processes alternating between them, requests through `creds.auth()` (both ways) on
   `--redis-rate` (50/1s) for `--redis-seconds` (4 s): at least 95% of that bound, never more.

`--rounds N` repeats the sidecar phases (1, 3, 4) N times and prints each phase's use of the bound
(min / median / max), its leased permits, each process's first permit after t0 (the median over
the processes) and its grants per second.

Printed: a table of totals against the bound, permits per second per process (and the sidecar's
running total against the running bound), the sidecar's and the workers' CPU use over the window,
and latency figures. The PNG has one panel per run: permits per second, stacked by process, the
total, and the limit (burst + rate in the first second, the rate after it). The bound holds on the
running total: when a loaded machine hands out the burst slowly, second 1 can show more than the
rate (the rest of the burst) while the running total stays under burst + rate x elapsed.

Exit status: 0 when every sidecar phase is within [98% of the bound, the bound] (the Redis ones
within [95%, 100%]), 1 otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import harness
from mcpcreds.core.rates import Rate, parse_rate

SERVER_NAME = "bench"
FLOOR = 0.98  # the sidecar must grant at least this share of the bound
START_DELAY = 0.5  # seconds between "every worker is ready" and t0
SIDECAR = "sidecar"
STATUS_QUO = "aiolimiter"
AUTH = "auth"  # `creds.auth()` as it comes: leases where it takes them
PER_REQUEST = "auth_per_request"  # `creds.auth(lease=False)`: one round trip per request
REDIS_FLOOR = 0.95  # two sidecars on one Redis must use at least this share of its bound
UPSTREAM = "http://upstream.invalid"  # never reached: an in-process transport answers


@dataclass
class WorkerSpec:
    index: int
    mode: str  # SIDECAR or STATUS_QUO
    socket: str
    rate: str
    seconds: float
    tasks: int


@dataclass
class WorkerResult:
    index: int
    grants: list[float] = field(default_factory=list)  # times (time.monotonic()) of granted permits
    late: int = 0  # grants whose answer arrived at or after t0 + seconds (not counted)
    late_grants: list[float] = field(default_factory=list)  # their wall times
    refused: int = 0  # RateLimited answers (max_wait too short for the queue ahead)
    errors: list[str] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)  # the sidecar's "waited" for each counted grant
    overhead: list[float] = field(default_factory=list)  # round trip minus "waited": client + socket + HTTP
    cpu_seconds: float = 0.0  # user + system CPU of the worker during the window
    woke: float = 0.0  # time.monotonic() at which the worker's event loop ran again after sleeping until t0
    t0: float = 0.0  # the release: the window is [t0, t0 + seconds)
    leased: int = 0  # (auth phases) requests whose permit came from the process's lease


@dataclass
class RunSummary:
    name: str
    total: int
    per_process: list[int]
    per_second: list[list[int]]  # [process][second]
    per_second_total: list[int]
    late: int
    refused: int
    errors: list[str]
    worker_cpu_seconds: float
    waited_p50: float | None = None
    waited_max: float | None = None
    overhead_p50: float | None = None
    overhead_p99: float | None = None
    first_grant_after_t0: float | None = None  # seconds from t0 to the first answer
    woke_after_t0: float = 0.0  # the latest worker's wake-up, seconds after t0
    last_answer_after_end: float | None = None  # the last late grant's arrival, seconds after t0 + seconds
    max_burst_seen: float | None = None  # see `max_burst`


# --------------------------------------------------------------------------- load phases


def _cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _window(spec: WorkerSpec, release: harness.Release,
                  hammer: Callable[[WorkerResult, float], Awaitable[None]]) -> WorkerResult:
    """Once released, from t0 to t0 + seconds: `spec.tasks` coroutines of `hammer(result, end)`."""
    t0 = await release.wait_async()
    await asyncio.sleep(max(0.0, t0 - time.monotonic()))
    result = WorkerResult(spec.index, woke=time.monotonic(), t0=t0)
    cpu_start = _cpu_now()
    await asyncio.gather(*(hammer(result, t0 + spec.seconds) for _ in range(spec.tasks)))
    result.cpu_seconds = _cpu_now() - cpu_start
    return result


async def sidecar_worker(spec: WorkerSpec, release: harness.Release) -> WorkerResult:
    """A load phase: `tasks` coroutines on one AsyncClient calling for permits until t0 + seconds."""
    from mcpcreds import AsyncClient, McpcredsError, RateLimited

    async with AsyncClient(spec.socket) as creds:
        # Before t0: open one keep-alive connection per task and have the sidecar resolve the
        # headers once (a GET, which takes no permit), so the window measures the bucket.
        await asyncio.gather(*(creds.headers(SERVER_NAME) for _ in range(spec.tasks)))

        async def hammer(result: WorkerResult, end: float) -> None:
            while True:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return
                sent = time.perf_counter()
                try:
                    answer = await creds.call(SERVER_NAME, cost=1, max_wait=remaining)
                except RateLimited as exc:
                    result.refused += 1
                    if exc.retry_after >= end - time.monotonic():
                        return  # the queue ahead already fills the window: no grant can come in time
                    continue
                except McpcredsError as exc:
                    result.errors.append(f"{type(exc).__name__}: {exc}")
                    return
                now, rtt = time.monotonic(), time.perf_counter() - sent
                if now < end:
                    result.grants.extend([now] * int(answer["granted"]))
                    result.waited.append(float(answer["waited"]))
                    result.overhead.append(rtt - float(answer["waited"]))
                else:
                    result.late += int(answer["granted"])
                    result.late_grants.extend([now] * int(answer["granted"]))

        return await _window(spec, release, hammer)


async def auth_worker(spec: WorkerSpec, release: harness.Release) -> WorkerResult:
    """A load phase: `tasks` coroutines sending requests through one `httpx.AsyncClient` whose
    `auth=` is `creds.auth()` (as it comes, or `lease=False`), to an in-process upstream (an
    `httpx.MockTransport`) that notes when each request arrives: one permit per request, leased or
    asked for, counted where the upstream would count it."""
    import httpx

    from mcpcreds import AsyncClient, McpcredsError

    arrivals: list[float] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        arrivals.append(time.monotonic())
        return httpx.Response(200)

    async with AsyncClient(spec.socket) as creds:
        auth = creds.auth(SERVER_NAME, lease=False) if spec.mode == PER_REQUEST else creds.auth(SERVER_NAME)
        transport = httpx.MockTransport(upstream)
        async with httpx.AsyncClient(auth=auth, transport=transport, base_url=UPSTREAM) as http:
            # before t0: one connection per task, the headers resolved once (no permit taken)
            await asyncio.gather(*(creds.headers(SERVER_NAME) for _ in range(spec.tasks)))
            errors: list[str] = []

            async def hammer(result: WorkerResult, end: float) -> None:
                while time.monotonic() < end:
                    try:
                        await http.get("/mcp")
                    except McpcredsError as exc:
                        errors.append(f"{type(exc).__name__}: {exc}")
                        return

            result = await _window(spec, release, hammer)
    end = result.t0 + spec.seconds
    result.grants = [t for t in arrivals if t < end]
    result.late = len(arrivals) - len(result.grants)
    result.late_grants = [t for t in arrivals if t >= end]
    result.errors = errors
    leaser = getattr(auth, "_leaser", None)
    result.leased = int(leaser.served) if leaser is not None else 0
    return result


async def status_quo_worker(spec: WorkerSpec, release: harness.Release) -> WorkerResult:
    """A load phase: the same coroutines, each process with its own AsyncLimiter."""
    from aiolimiter import AsyncLimiter

    rate = parse_rate(spec.rate)
    limiter = AsyncLimiter(max_rate=rate.burst, time_period=rate.per)

    async def hammer(result: WorkerResult, end: float) -> None:
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            try:
                async with asyncio.timeout(remaining):
                    await limiter.acquire()
            except TimeoutError:
                return
            now = time.monotonic()
            if now < end:
                result.grants.append(now)
            else:
                result.late += 1

    return await _window(spec, release, hammer)


# --------------------------------------------------------------------------- the parent


def run_phase(workers: harness.Workers, phase: harness.Phase, specs: list[WorkerSpec], seconds: float,
              cpu_of: Callable[[], float] | None = None) -> tuple[float, list[WorkerResult], float]:
    """Release the workers together at t0, collect their results.

    Returns (t0, results, CPU seconds that `cpu_of` (e.g. the sidecar's) grew by over the window).
    """
    window_cpu = 0.0
    t0 = 0.0

    def watch(start: float) -> None:
        nonlocal window_cpu, t0
        t0 = start
        if cpu_of is not None:
            harness.sleep_until(start)
            cpu_start = cpu_of()
            harness.sleep_until(start + seconds)
            window_cpu = cpu_of() - cpu_start

    results = workers.run(phase, specs, timeout=START_DELAY + seconds + 60.0, start_delay=START_DELAY,
                          while_running=watch)
    return t0, results, window_cpu


def max_burst(times: list[float], per_second: float) -> float | None:
    """The smallest burst a token bucket refilled at `per_second` needs to have allowed `times`.

    For grants at sorted times t_0..t_n-1, the most granted in any stretch [t_i, t_j] beyond the
    refill over it: max over i <= j of (j - i + 1) - per_second * (t_j - t_i). A sidecar that keeps
    its bucket gives at most the burst here, plus what the jitter of the answers' travel adds.
    """
    if not times:
        return None
    best = -math.inf
    lowest = math.inf  # min over i <= j of (i - 1 - per_second * t_i)
    for j, t in enumerate(sorted(times)):
        lowest = min(lowest, j - 1 - per_second * t)
        best = max(best, j - per_second * t - lowest)
    return best


def summarize(name: str, t0: float, seconds: float, results: list[WorkerResult],
              rate: Rate | None = None) -> RunSummary:
    bins = math.ceil(seconds)
    per_second: list[list[int]] = []
    for res in results:
        counts = [0] * bins
        for t in res.grants:
            counts[min(bins - 1, max(0, int(t - t0)))] += 1
        per_second.append(counts)
    waited = sorted(w for res in results for w in res.waited)
    overhead = [o for res in results for o in res.overhead]
    overhead_p50, overhead_p99 = harness.percentiles(overhead, 0.5, 0.99) if overhead else (None, None)
    late = [t for res in results for t in res.late_grants]
    every = [t for res in results for t in res.grants] + late
    return RunSummary(
        name=name,
        total=sum(len(res.grants) for res in results),
        per_process=[len(res.grants) for res in results],
        per_second=per_second,
        per_second_total=[sum(col) for col in zip(*per_second, strict=True)],
        late=sum(res.late for res in results),
        refused=sum(res.refused for res in results),
        errors=[err for res in results for err in res.errors],
        worker_cpu_seconds=sum(res.cpu_seconds for res in results),
        waited_p50=harness.upper_percentile(waited, 0.5) if waited else None,
        waited_max=waited[-1] if waited else None,
        overhead_p50=overhead_p50,
        overhead_p99=overhead_p99,
        first_grant_after_t0=min(every) - t0 if every else None,
        woke_after_t0=max(res.woke for res in results) - t0,
        last_answer_after_end=max(late) - t0 - seconds if late else None,
        max_burst_seen=max_burst(every, rate.per_second) if rate is not None else None,
    )


WORKERS: dict[str, harness.Phase] = {SIDECAR: sidecar_worker, AUTH: auth_worker, PER_REQUEST: auth_worker}
ENV = {"BENCH_KEY": "bench-key-0123456789", "STATE_KEY": "bench-state-key-0123456789abcdef"}


def run_sidecar_phase(workers: harness.Workers, rate: Rate, seconds: float, processes: int,
                      tasks: int, mode: str = SIDECAR) -> dict[str, Any]:
    """One load phase against a fresh sidecar (memory state, a full bucket): `mode` is what the
    workers do (`call`, or requests through `creds.auth()`)."""
    block = harness.static_server(SERVER_NAME, {"X-Api-Key": "{{secret:BENCH_KEY}}"}, rate=str(rate))
    with harness.workdir("rate-bench") as tmp, harness.sidecar(tmp, block, env=ENV) as sidecar:
        socket = str(sidecar.socket)
        before = harness.status_entry(socket, "buckets", f"mcp:{SERVER_NAME}")
        pid = sidecar.proc.pid
        specs = [WorkerSpec(i, mode, socket, str(rate), seconds, tasks) for i in range(processes)]
        t0, results, window_cpu = run_phase(workers, WORKERS[mode], specs, seconds,
                                            lambda: harness.cpu_seconds(pid, gone=0.0))
        after = harness.status_entry(socket, "buckets", f"mcp:{SERVER_NAME}")
        stray = harness.log_warnings(sidecar)
    summary = summarize(mode, t0, seconds, results, rate)
    return {
        "summary": summary,
        "leased": sum(res.leased for res in results),
        "first_upstream_ms": _first_p50(t0, results),
        "status_before": before,
        "status_after": after,
        "status_granted": int(after.get("granted", 0)) - int(before.get("granted", 0)),
        "status_refused": int(after.get("refused", 0)) - int(before.get("refused", 0)),
        "sidecar_cpu_seconds": round(window_cpu, 3),  # over the window, from /proc/<pid>/stat
        "sidecar_error_lines": stray[:10],
    }


def run_redis_phase(workers: harness.Workers, rate: Rate, seconds: float, processes: int,
                    tasks: int, mode: str) -> dict[str, Any]:
    """One load phase against two fresh sidecars on one fresh redis-server (one bucket in Redis for
    both): the workers alternate between them, requests through `creds.auth()`."""
    from tests.peers.redis_peer import start_redis

    block = harness.static_server(SERVER_NAME, {"X-Api-Key": "{{secret:BENCH_KEY}}"}, rate=str(rate))
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(harness.workdir("rate-bench-redis"))
        server = stack.enter_context(harness.started(start_redis(), "redis-server"))
        state = f'state = "{server.url}"\nstate_key = "{{{{secret:STATE_KEY}}}}"'
        sidecars = [stack.enter_context(harness.sidecar(tmp / f"s{i}", block, env=ENV, settings=state))
                    for i in range(2)]
        specs = [WorkerSpec(i, mode, str(sidecars[i % 2].socket), str(rate), seconds, tasks)
                 for i in range(processes)]
        t0, results, _ = run_phase(workers, WORKERS[mode], specs, seconds)
        stray = [line for s in sidecars for line in harness.log_warnings(s)]
    return {"summary": summarize(mode, t0, seconds, results, rate), "leased": sum(r.leased for r in results),
            "first_upstream_ms": _first_p50(t0, results), "sidecar_error_lines": stray[:10]}


def _first_p50(t0: float, results: list[WorkerResult]) -> float | None:
    """Each process's first permit (its first request at the upstream), ms after t0: the median."""
    firsts = [min(res.grants) - t0 for res in results if res.grants]
    return round(1000 * statistics.median(firsts), 1) if firsts else None


def _limit_per_second(rate: Rate, seconds: float) -> list[float]:
    """The most a bucket that starts full can grant in each whole second of the window."""
    bins = math.ceil(seconds)
    return [rate.burst + rate.per_second * min(1.0, seconds) if i == 0
            else rate.per_second * min(1.0, seconds - i) for i in range(bins)]


def draw(png: Path, rate: Rate, seconds: float, bound: float, runs: list[RunSummary]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = math.ceil(seconds)
    xs = list(range(bins))
    limit = _limit_per_second(rate, seconds)
    fig, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 5.2), squeeze=False)
    colors = [f"C{i}" for i in range(10)]
    for ax, run in zip(axes[0], runs, strict=True):
        bottom = [0] * bins
        for i, counts in enumerate(run.per_second):
            ax.bar(xs, counts, bottom=bottom, width=0.8, color=colors[i % len(colors)],
                   label=f"process {i}" if len(run.per_second) <= 10 else None, alpha=0.85)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        ax.plot(xs, run.per_second_total, "ko-", lw=1.2, ms=4, label="total")
        for x, y in zip(xs, run.per_second_total, strict=True):
            ax.annotate(str(y), (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=8)
        ax.step([x - 0.5 for x in xs] + [bins - 0.5], [*limit, limit[-1]], where="post", color="red",
                lw=2, label=f"limit: {rate.burst} burst, then {rate.per_second:g}/s")
        title = ("one shared sidecar bucket" if run.name == SIDECAR
                 else "status quo: one aiolimiter per process")
        ax.set_title(f"{title}\n{run.total} permits in {seconds:g} s "
                     f"(bound {bound:g}: {run.total / bound:.1%})")
        ax.set_xlabel(f"second of the run (t0 + s), {len(run.per_second)} processes")
        ax.set_ylabel("permits granted in that second")
        ax.set_xticks(xs)
        ax.set_ylim(0, max(max(run.per_second_total), max(limit)) * 1.15)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper right", ncol=2)
    fig.suptitle(f'Permits per second per process, rate = "{rate}", {len(runs[0].per_second)} processes')
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _cumulative(values: list[float]) -> list[float]:
    return [sum(values[: i + 1]) for i in range(len(values))]


def _table(report: dict[str, Any]) -> str:
    side: RunSummary = report["sidecar"]["summary"]
    quo: RunSummary = report["status_quo"]
    bound = report["bound"]
    lines = [
        f'rate "{report["rate"]}", {report["processes"]} processes x {report["tasks"]} tasks, '
        f'{report["seconds"]:g} s window; bound = {report["burst"]} + {report["per_second"]:g} x '
        f'{report["seconds"]:g} = {bound:g}, floor = {FLOOR:.0%} = {report["floor"]:g}',
        "",
        f"{'run':<12}{'total':>8}{'of bound':>10}{'per process min..max':>24}{'late':>6}{'refused':>9}"
        f"{'worker CPU s':>14}",
    ]
    for run in (side, quo):
        lines.append(f"{run.name:<12}{run.total:>8}{run.total / bound:>10.1%}"
                     f"{f'{min(run.per_process)}..{max(run.per_process)}':>24}{run.late:>6}"
                     f"{run.refused:>9}{run.worker_cpu_seconds:>14.2f}")
    sc = report["sidecar"]
    calls = max(1, side.total + side.late + side.refused)
    lines += [
        "",
        f"sidecar /v1/status: granted {sc['status_granted']} (clients counted {side.total} in the window "
        f"+ {side.late} late, the last {1000 * (side.last_answer_after_end or 0):.0f} ms after the end), "
        f"refused {sc['status_refused']}",
        f"CPU over the window: sidecar {sc['sidecar_cpu_seconds']:.2f} s "
        f"({1000 * sc['sidecar_cpu_seconds'] / calls:.2f} ms per call), "
        f"its clients {side.worker_cpu_seconds:.2f} s; sidecar 'waited' p50 {side.waited_p50 or 0:.3f} s, "
        f"max {side.waited_max or 0:.3f} s",
        f"workers awake by t0 + {1000 * side.woke_after_t0:.1f} ms, first grant at t0 + "
        f"{1000 * (side.first_grant_after_t0 or 0):.1f} ms; per call, round trip "
        f"minus 'waited' p50 {1000 * (side.overhead_p50 or 0):.2f} ms, "
        f"p99 {1000 * (side.overhead_p99 or 0):.2f} ms",
        f"token-bucket check on every answer received: smallest burst that explains them "
        f"{side.max_burst_seen or 0:.2f} (the bucket's: {report['burst']})",
        "",
        "permits per second (t0 + s):",
        f"{'':<22}" + "".join(f"{s:>6}" for s in range(len(side.per_second_total))),
        f"{'limit':<22}" + "".join(f"{v:>6.0f}" for v in report["limit_per_second"]),
    ]
    cumulative = _cumulative([float(v) for v in side.per_second_total])
    lines += [
        f"{'bound, cumulative':<22}" + "".join(f"{v:>6.0f}" for v in _cumulative(report["limit_per_second"])),
        f"{'sidecar, cumulative':<22}" + "".join(f"{v:>6.0f}" for v in cumulative),
    ]
    for run in (side, quo):
        lines.append(f"{run.name + ' total':<22}" + "".join(f"{v:>6}" for v in run.per_second_total))
        for i, counts in enumerate(run.per_second):
            lines.append(f"{f'  process {i}':<22}" + "".join(f"{v:>6}" for v in counts))
    errors = side.errors + quo.errors + sc["sidecar_error_lines"]
    if errors:
        lines += ["", "errors:"] + [f"  {e}" for e in errors[:20]]
    lines += ["", harness.ratio_line(f"permits in {report['seconds']:g} s", (SIDECAR, side.total),
                                     (STATUS_QUO, quo.total)),
              f"PNG: {report['png'] or 'not drawn'}", f"verdict: {report['verdict']}"]
    return "\n".join(lines)


def _use(runs: list[dict[str, Any]], bound: float) -> dict[str, Any]:
    """A phase's rounds: use of the bound (min / median / max), permits leased, first permits."""
    uses = [run["summary"].total / bound for run in runs]
    firsts = [run["first_upstream_ms"] for run in runs if run["first_upstream_ms"] is not None]
    return {"use": [round(u, 4) for u in uses], "min": min(uses), "median": statistics.median(uses),
            "max": max(uses), "totals": [run["summary"].total for run in runs],
            "leased": [run["leased"] for run in runs],
            "first_upstream_ms_p50": firsts,
            "max_burst_seen": [round(run["summary"].max_burst_seen or 0.0, 2) for run in runs],
            "per_second": [run["summary"].per_second_total for run in runs],
            "errors": [e for run in runs for e in run["summary"].errors][:5]}


LABELS = {SIDECAR: "call (per request)", AUTH: "auth= as it comes", PER_REQUEST: "auth=, lease=False"}


def _rounds_table(report: dict[str, Any]) -> str:
    lines = [f"{report['rounds']} round(s) of each phase, fresh sidecars each; use of the bound "
             "(burst + rate x window) min / median / max; leased permits; each process's first "
             "permit after t0, median over the processes, per round (ms); the smallest burst that "
             "explains the grants (never over: at most the burst, plus the answers' jitter)", ""]
    groups = (("memory", report["bound"], report["phases"]),
              (f"Redis, 2 sidecars, {report['redis_rate']} for {report['redis_seconds']:g} s",
               report["redis_bound"], report["redis_phases"]))
    for title, bound, phases in groups:
        if not phases:
            continue
        lines.append(f"{title} (bound {bound:g}):")
        for mode, u in phases.items():
            lines.append(f"  {LABELS[mode]:<22} {u['min']:>7.1%} / {u['median']:.1%} / {u['max']:.1%}"
                         f"   totals {u['totals']}  leased {u['leased']}"
                         f"  first ms {u['first_upstream_ms_p50']}"
                         f"  burst seen {u['max_burst_seen']}")
            lines.append(f"  {'':<22} per second (t0 + s), per round: {u['per_second']}")
            lines += [f"  {'':<22} error: {e}" for e in u["errors"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--seconds", type=harness.positive, default=10.0, help="length of the window (default 10)")
    p.add_argument("--processes", type=harness.count, default=8, help="worker processes (default 8)")
    p.add_argument("--tasks", type=harness.count, default=4,
                   help="concurrent coroutines per process (default 4)")
    p.add_argument("--rate", type=harness.rate, default="100/1s",
                   help='the bucket, "<burst>/<per>" (default "100/1s")')
    p.add_argument("--rounds", type=harness.count, default=1,
                   help="rounds of the sidecar phases (default 1; the aiolimiter phase runs once)")
    p.add_argument("--redis-rate", type=harness.rate, default="50/1s",
                   help='the bucket of the two-sidecar Redis phases (default "50/1s")')
    p.add_argument("--redis-seconds", type=harness.positive, default=4.0,
                   help="the window of the Redis phases (default 4)")
    p.add_argument("--no-redis", action="store_true", help="skip the Redis phases (no redis-server)")
    p.add_argument("--png", default=str(harness.ROOT / "bench" / "rate_bench.png"),
                   help="where to draw the figure (default bench/rate_bench.png; '' draws none)")
    args = harness.parse(p, argv, quick={"seconds": 1.0, "processes": 2, "tasks": 2, "png": "",
                                         "redis_seconds": 1.0})
    rate = parse_rate(args.rate)
    redis_rate = parse_rate(args.redis_rate)

    bound = rate.burst + rate.per_second * args.seconds
    floor = FLOOR * bound
    redis_bound = redis_rate.burst + redis_rate.per_second * args.redis_seconds
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in (SIDECAR, AUTH, PER_REQUEST)}
    redis_runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in (AUTH, PER_REQUEST)}
    with harness.Workers(args.processes) as workers:
        status_quo: RunSummary | None = None
        for round_ in range(args.rounds):
            for mode in runs:
                harness.progress(f"round {round_ + 1}: memory, {LABELS[mode]} ...")
                runs[mode].append(run_sidecar_phase(workers, rate, args.seconds, args.processes, args.tasks,
                                                    mode))
            if status_quo is None:
                specs = [WorkerSpec(i, STATUS_QUO, "", args.rate, args.seconds, args.tasks)
                         for i in range(args.processes)]
                t0, results, _ = run_phase(workers, status_quo_worker, specs, args.seconds)
                status_quo = summarize(STATUS_QUO, t0, args.seconds, results)
            for mode in redis_runs if not args.no_redis else ():
                harness.progress(f"round {round_ + 1}: Redis, {LABELS[mode]} ...")
                redis_runs[mode].append(run_redis_phase(workers, redis_rate, args.redis_seconds,
                                                        args.processes, args.tasks, mode))
    assert status_quo is not None
    sidecar = runs[SIDECAR][-1]
    side: RunSummary = sidecar["summary"]

    problems = []
    for mode, mode_runs in runs.items():
        for run in mode_runs:
            total = run["summary"].total
            if total > bound:
                problems.append(f"{LABELS[mode]}: {total} > bound {bound:g}")
            if total < floor:
                problems.append(f"{LABELS[mode]}: {total} < {FLOOR:.0%} of the bound ({floor:g})")
            if run["summary"].errors:
                problems.append(f"{LABELS[mode]}: worker errors")
    for mode, mode_runs in redis_runs.items():
        for run in mode_runs:
            total = run["summary"].total
            if total > redis_bound:
                problems.append(f"Redis, {LABELS[mode]}: {total} > bound {redis_bound:g}")
            if total < REDIS_FLOOR * redis_bound:
                problems.append(f"Redis, {LABELS[mode]}: {total} < {REDIS_FLOOR:.0%} of the bound "
                                f"({REDIS_FLOOR * redis_bound:g})")
    if status_quo.errors:
        problems.append("worker errors (aiolimiter)")
    verdict = "FAIL: " + "; ".join(problems) if problems else (
        f"PASS: sidecar {side.total} permits, {side.total / bound:.1%} of the bound {bound:g}; every "
        f"phase within [{FLOOR:.0%}, 100%] (Redis: [{REDIS_FLOOR:.0%}, 100%])")
    if args.png:
        draw(Path(args.png), rate, args.seconds, bound, [side, status_quo])

    report: dict[str, Any] = {
        "rate": str(args.rate), "burst": rate.burst, "per_second": rate.per_second,
        "seconds": args.seconds, "processes": args.processes, "tasks": args.tasks,
        "bound": bound, "floor": floor, "limit_per_second": _limit_per_second(rate, args.seconds),
        "sidecar": sidecar, "status_quo": status_quo, "png": args.png or None, "verdict": verdict,
        "rounds": args.rounds, "phases": {mode: _use(r, bound) for mode, r in runs.items()},
        "redis_rate": str(args.redis_rate), "redis_seconds": args.redis_seconds, "redis_bound": redis_bound,
        "redis_phases": {mode: _use(r, redis_bound) for mode, r in redis_runs.items() if r},
    }
    harness.emit(args, report, lambda r: _table(r) + "\n\n" + _rounds_table(r))
    return 1 if problems else 0


if __name__ == "__main__":
    harness.main(main)
