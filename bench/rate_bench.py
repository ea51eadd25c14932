"""Rate benchmark: one shared sidecar bucket against one in-process aiolimiter per process.

Run from the repository root (the package installed, e.g. `pip install -e .`, and matplotlib):

    python bench/rate_bench.py           # 8 processes, "100/1s", 10 s; writes bench/rate_bench.png
    python bench/rate_bench.py --json    # the same, the figures as JSON on stdout
    python bench/rate_bench.py --seconds 10 --processes 8 --rate 100/1s --png bench/rate_bench.png

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

Printed: a table of totals against the bound, permits per second per process (and the sidecar's
running total against the running bound), the sidecar's and the workers' CPU use over the window,
and latency figures. The PNG has one panel per run: permits per second, stacked by process, the
total, and the limit (burst + rate in the first second, the rate after it). The bound holds on the
running total: when a loaded machine hands out the burst slowly, second 1 can show more than the
rate (the rest of the burst) while the running total stays under burst + rate x elapsed.

Exit status: 0 when the sidecar's total is within [98% of the bound, the bound], 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import queue  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from multiprocessing.synchronize import Event  # noqa: E402
from typing import Any  # noqa: E402

from mcpcreds.rates import Rate, parse_rate  # noqa: E402

SERVER_NAME = "bench"
FLOOR = 0.98  # the sidecar must grant at least this share of the bound
START_DELAY = 0.5  # seconds between "every worker is ready" and t0
READY_TIMEOUT = 60.0
CONFIG_TEMPLATE = """\
[sidecar]
socket = "{socket}"

[secrets]
sources = ["env"]

[[servers]]
name = "{name}"
endpoint = "https://bench.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:BENCH_KEY}}}}" }}
rate = "{rate}"
"""
SIDECAR = "sidecar"
STATUS_QUO = "aiolimiter"


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
    grants: list[float] = field(default_factory=list)  # wall times (time.time()) of granted permits
    late: int = 0  # grants whose answer arrived at or after t0 + seconds (not counted)
    late_grants: list[float] = field(default_factory=list)  # their wall times
    refused: int = 0  # RateLimited answers (max_wait too short for the queue ahead)
    errors: list[str] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)  # the sidecar's "waited" for each counted grant
    overhead: list[float] = field(default_factory=list)  # round trip minus "waited": client + socket + HTTP
    cpu_seconds: float = 0.0  # user + system CPU of the worker during the window
    woke: float = 0.0  # wall time at which the worker's event loop ran again after sleeping until t0


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


# --------------------------------------------------------------------------- worker processes


def _cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _sidecar_worker(spec: WorkerSpec, result: WorkerResult, ready: Any, go: Event,
                          t0_value: Any) -> None:
    from mcpcreds import AsyncClient, McpcredsError, RateLimited

    async with AsyncClient(spec.socket) as creds:
        # Before t0: open one keep-alive connection per task and have the sidecar resolve the
        # headers once (a GET, which takes no permit), so the window measures the bucket.
        await asyncio.gather(*(creds.headers(SERVER_NAME) for _ in range(spec.tasks)))
        ready.put(spec.index)
        await asyncio.to_thread(go.wait)
        t0 = float(t0_value.value)
        end = t0 + spec.seconds
        await asyncio.sleep(max(0.0, t0 - time.time()))
        result.woke = time.time()
        cpu_start = _cpu_now()

        async def hammer() -> None:
            while True:
                remaining = end - time.time()
                if remaining <= 0:
                    return
                sent = time.perf_counter()
                try:
                    answer = await creds.call(SERVER_NAME, cost=1, max_wait=remaining)
                except RateLimited as exc:
                    result.refused += 1
                    if exc.retry_after >= end - time.time():
                        return  # the queue ahead already fills the window: no grant can come in time
                    continue
                except McpcredsError as exc:
                    result.errors.append(f"{type(exc).__name__}: {exc}")
                    return
                now, rtt = time.time(), time.perf_counter() - sent
                if now < end:
                    result.grants.extend([now] * int(answer["granted"]))
                    result.waited.append(float(answer["waited"]))
                    result.overhead.append(rtt - float(answer["waited"]))
                else:
                    result.late += int(answer["granted"])
                    result.late_grants.extend([now] * int(answer["granted"]))

        await asyncio.gather(*(hammer() for _ in range(spec.tasks)))
        result.cpu_seconds = _cpu_now() - cpu_start


async def _status_quo_worker(spec: WorkerSpec, result: WorkerResult, ready: Any, go: Event,
                             t0_value: Any) -> None:
    from aiolimiter import AsyncLimiter

    rate = parse_rate(spec.rate)
    limiter = AsyncLimiter(max_rate=rate.burst, time_period=rate.per)
    ready.put(spec.index)
    await asyncio.to_thread(go.wait)
    t0 = float(t0_value.value)
    end = t0 + spec.seconds
    await asyncio.sleep(max(0.0, t0 - time.time()))
    result.woke = time.time()
    cpu_start = _cpu_now()

    async def hammer() -> None:
        while True:
            remaining = end - time.time()
            if remaining <= 0:
                return
            try:
                async with asyncio.timeout(remaining):
                    await limiter.acquire()
            except TimeoutError:
                return
            now = time.time()
            if now < end:
                result.grants.append(now)
            else:
                result.late += 1

    await asyncio.gather(*(hammer() for _ in range(spec.tasks)))
    result.cpu_seconds = _cpu_now() - cpu_start


def worker_main(spec: WorkerSpec, ready: Any, go: Event, t0_value: Any, results: Any) -> None:
    """Entry point of a spawned worker: wait for the shared t0, hammer, send back a WorkerResult."""
    result = WorkerResult(spec.index)
    run = _sidecar_worker if spec.mode == SIDECAR else _status_quo_worker
    try:
        asyncio.run(run(spec, result, ready, go, t0_value))
    except Exception as exc:  # reported, not hidden: the parent prints it and fails the run
        result.errors.append(f"{type(exc).__name__}: {exc}")
        ready.put(spec.index)  # never leave the parent waiting for a worker that died early
    results.put(asdict(result))


# --------------------------------------------------------------------------- the parent


def run_phase(mode: str, socket: str, rate: str, seconds: float, processes: int, tasks: int,
              cpu_of: Callable[[], float] | None = None) -> tuple[float, list[WorkerResult], float]:
    """Spawn the workers, release them together at t0, collect their results.

    Returns (t0, results, CPU seconds that `cpu_of` (e.g. the sidecar's) grew by over the window).
    """
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    results_q = ctx.Queue()
    go = ctx.Event()
    t0_value = ctx.Value("d", 0.0)
    workers = [
        ctx.Process(target=worker_main,
                    args=(WorkerSpec(i, mode, socket, rate, seconds, tasks), ready, go, t0_value, results_q),
                    daemon=True)
        for i in range(processes)
    ]
    for proc in workers:
        proc.start()
    try:
        for _ in range(processes):
            ready.get(timeout=READY_TIMEOUT)
        t0 = time.time() + START_DELAY
        t0_value.value = t0
        go.set()
        window_cpu = 0.0
        if cpu_of is not None:
            time.sleep(max(0.0, t0 - time.time()))
            cpu_start = cpu_of()
            time.sleep(max(0.0, t0 + seconds - time.time()))
            window_cpu = cpu_of() - cpu_start
        results: list[WorkerResult] = []
        deadline = time.monotonic() + START_DELAY + seconds + READY_TIMEOUT
        while len(results) < processes:
            try:
                raw = results_q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{mode}: only {len(results)} of {processes} workers answered") from None
            results.append(WorkerResult(**raw))
    finally:
        for proc in workers:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    results.sort(key=lambda r: r.index)
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


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
        waited_p50=waited[len(waited) // 2] if waited else None,
        waited_max=waited[-1] if waited else None,
        overhead_p50=_quantile(overhead, 0.5),
        overhead_p99=_quantile(overhead, 0.99),
        first_grant_after_t0=min(every) - t0 if every else None,
        woke_after_t0=max(res.woke for res in results) - t0,
        last_answer_after_end=max(late) - t0 - seconds if late else None,
        max_burst_seen=max_burst(every, rate.per_second) if rate is not None else None,
    )


def _proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (0.0 where /proc is not there)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sidecar_status(socket: str) -> dict[str, Any]:
    from mcpcreds import Client

    with Client(socket) as creds:
        return creds.status()


def _bucket(status: dict[str, Any]) -> dict[str, Any]:
    for bucket in status.get("buckets", []):
        if bucket.get("key") == f"mcp:{SERVER_NAME}":
            return dict(bucket)
    return {}


def run_sidecar_phase(rate: Rate, seconds: float, processes: int, tasks: int) -> dict[str, Any]:
    from tests.sidecar_proc import run_sidecar

    with tempfile.TemporaryDirectory(prefix="mcpcreds-rate-") as tmp:
        socket = f"{tmp}/s.sock"
        config = Path(tmp) / "config.toml"
        config.write_text(CONFIG_TEMPLATE.format(socket=socket, name=SERVER_NAME, rate=str(rate)))
        with run_sidecar(config, Path(socket), {"BENCH_KEY": "bench-key-0123456789"}) as sidecar:
            before = _bucket(sidecar_status(socket))
            pid = sidecar.proc.pid
            t0, results, window_cpu = run_phase(SIDECAR, socket, str(rate), seconds, processes, tasks,
                                                lambda: _proc_cpu_seconds(pid))
            after = _bucket(sidecar_status(socket))
            stray = [line.strip() for line in sidecar.lines
                     if '"level": "error"' in line or '"level":"error"' in line or "Traceback" in line]
    summary = summarize(SIDECAR, t0, seconds, results, rate)
    return {
        "summary": summary,
        "status_before": before,
        "status_after": after,
        "status_granted": int(after.get("granted", 0)) - int(before.get("granted", 0)),
        "status_refused": int(after.get("refused", 0)) - int(before.get("refused", 0)),
        "sidecar_cpu_seconds": round(window_cpu, 3),  # over the window, from /proc/<pid>/stat
        "sidecar_error_lines": stray[:10],
    }


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
    lines += ["", f"PNG: {report['png']}", f"verdict: {report['verdict']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the window (default 10)")
    parser.add_argument("--processes", type=int, default=8, help="worker processes (default 8)")
    parser.add_argument("--tasks", type=int, default=4, help="concurrent coroutines per process (default 4)")
    parser.add_argument("--rate", default="100/1s", help='the bucket, "<burst>/<per>" (default "100/1s")')
    parser.add_argument("--png", type=Path, default=ROOT / "bench" / "rate_bench.png",
                        help="where to draw the figure (default bench/rate_bench.png)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    try:
        rate = parse_rate(args.rate)
    except ValueError as exc:
        parser.error(str(exc))
    if args.seconds <= 0 or args.processes < 1 or args.tasks < 1:
        parser.error("--seconds, --processes and --tasks must be positive")

    bound = rate.burst + rate.per_second * args.seconds
    floor = FLOOR * bound
    sidecar = run_sidecar_phase(rate, args.seconds, args.processes, args.tasks)
    t0, results, _ = run_phase(STATUS_QUO, "", args.rate, args.seconds, args.processes, args.tasks)
    status_quo = summarize(STATUS_QUO, t0, args.seconds, results)
    side: RunSummary = sidecar["summary"]

    problems = []
    if side.total > bound:
        problems.append(f"sidecar granted {side.total} > bound {bound:g}")
    if side.total < floor:
        problems.append(f"sidecar granted {side.total} < {FLOOR:.0%} of the bound ({floor:g})")
    if side.errors or status_quo.errors:
        problems.append("worker errors")
    verdict = "FAIL: " + "; ".join(problems) if problems else (
        f"PASS: sidecar {side.total} permits, {side.total / bound:.1%} of the bound {bound:g}")
    draw(args.png, rate, args.seconds, bound, [side, status_quo])

    report: dict[str, Any] = {
        "rate": str(args.rate), "burst": rate.burst, "per_second": rate.per_second,
        "seconds": args.seconds, "processes": args.processes, "tasks": args.tasks,
        "bound": bound, "floor": floor, "limit_per_second": _limit_per_second(rate, args.seconds),
        "sidecar": sidecar, "status_quo": status_quo, "png": str(args.png), "verdict": verdict,
    }
    if args.json:
        print(json.dumps(report, default=asdict, indent=2))
    else:
        print(_table(report))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
