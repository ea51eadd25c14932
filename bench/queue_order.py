"""The order of a bucket's queue, in virtual time: status_quo's session openings on the real Limiter.

Run from the repository root:

    python bench/queue_order.py                  # 8 processes, `20/1s`, 20 seeds per order; ~10 s
    python bench/queue_order.py --seeds 50 --processes 8 --rate 20/1s --rtt-ms 20,80
    python bench/queue_order.py --unmetered      # the notification and the GET stream take no permit
    python bench/queue_order.py --quick          # a smoke run: 3 seeds

What status_quo.py measures on real processes (its first tool result), here without the machine:
`--processes` processes, released together, each open an MCP session the way the MCP SDK does and
then call a tool in 2 concurrent loops; every request takes one permit from one `Limiter`
(limits/buckets.py, the sidecar's own code) on a FakeClock, then takes a round trip drawn from
`--rtt-ms` (uniform; the sidecar, the MCP server and the client together). A session's opening:
`initialize`, the initialized notification, then together the GET stream and each loop's first
`tools/call` with its `tools/list` (the SDK sends that one after the call's answer, to check the
result against the tool's schema; here it goes first: the same two permits before the result);
the first tool result is the first of the loops' to come back. Time moves in steps of 2 ms. The
same seeds (round trips, start offsets) for each order:

- one asker: every request is the same asker's, first come, first served (the queue as it was
  before it was ordered by asker);
- by recent use: each process is its own asker (the sidecar's order: a newcomer goes ahead of the
  waiters of askers that had more permits lately);
- an order that knows the opening: the opening requests of processes that have not had a result
  yet go first, the process released first first, then the rest first come, first served. No
  bucket can know that; it shows about how far an order alone can go with this rate: the openings
  need more permits than the burst, and the burst goes to whoever asks first, before any queue
  forms.

`--unmetered`: the initialized notification and the GET stream take no permit (as through the
gateway, which counts JSON-RPC requests; `creds.auth()` takes one per HTTP request), a what-if:
the upstream then sees more HTTP requests than the bucket granted.

Figures: the first tool result, p50 over the processes (the bench's figure), min / median / max
over the seeds, and the median over the seeds of the slowest process's. No figure depends on the
machine: this is a model of the queue, not a measurement of the sidecar (status_quo.py is).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import harness
from mcpcreds.core.clock import FakeClock
from mcpcreds.core.rates import Rate, parse_rate
from mcpcreds.limits.buckets import Limiter

KEY = "service:tools"
STEP = 0.002  # seconds of virtual time per step
LOOPS = 2
ORDERS = ("one asker", "by recent use", "knows the opening")


class Model:
    """One run: the processes, the limiter and the virtual clock."""

    def __init__(self, order: str, rate: Rate, seed: int, rtt: tuple[float, float], unmetered: bool) -> None:
        self.order, self.rate, self.rtt, self.unmetered = order, rate, rtt, unmetered
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self.limiter = Limiter(self.clock, {KEY: rate})
        self.start = self.clock.monotonic()
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self.first: dict[int, float] = {}

    def now(self) -> float:
        return self.clock.monotonic() - self.start

    def sleep(self, seconds: float) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.clock.monotonic() + seconds, future))
        return future

    def asker(self, process: int) -> Hashable:
        if self.order == "one asker":
            return None
        if self.order == "knows the opening":  # see `known_rank`
            return ("opening", process) if process not in self.first else ("loop", process)
        return process

    async def request(self, process: int, metered: bool = True) -> None:
        if metered or not self.unmetered:
            await self.limiter.acquire(KEY, self.rate, 1, 30.0, self.asker(process))
        await self.sleep(self.rng.uniform(*self.rtt))

    async def process(self, process: int, seconds: float) -> None:
        await self.sleep(self.rng.uniform(0.0, 0.03))  # the release reaches the processes in turn
        await self.request(process)  # initialize
        await self.request(process, metered=False)  # the initialized notification

        async def loop() -> None:
            await self.request(process)  # tools/list, before a first call
            while self.now() < seconds:
                await self.request(process)  # tools/call
                self.first.setdefault(process, self.now())

        await asyncio.gather(self.request(process, metered=False), *(loop() for _ in range(LOOPS)))  # GET

    async def run(self, processes: int, seconds: float) -> tuple[float, float]:
        tasks = [asyncio.ensure_future(self.process(p, seconds)) for p in range(processes)]
        while not all(t.done() for t in tasks):
            self.clock.advance(STEP)
            self.limiter.wake(KEY)
            now = self.clock.monotonic()
            due = [s for s in self.sleepers if s[0] <= now]
            for sleeper in due:
                self.sleepers.remove(sleeper)
                sleeper[1].set_result(None)
            for _ in range(8):
                await asyncio.sleep(0)
        for task in tasks:
            task.result()
        self.limiter.close()
        firsts = list(self.first.values())
        return statistics.median(firsts), max(firsts)


def known_rank(use: Callable[..., float]) -> Callable[..., float]:
    """The limiter's recent use, but an opening asker counts as less than every loop, the process
    released first least; the loops count the same (first come, first served among them)."""
    def ranked(lane: Any, asker: Hashable, now: float) -> float:
        if isinstance(asker, tuple):
            return -1e9 + asker[1] if asker[0] == "opening" else 1e9
        return use(lane, asker, now)
    return ranked


async def measure(order: str, args: argparse.Namespace) -> dict[str, Any]:
    rate = parse_rate(args.rate)
    rtt = (args.rtt_ms[0] / 1000, args.rtt_ms[-1] / 1000)
    runs = [await Model(order, rate, seed, rtt, args.unmetered).run(args.processes, 3.0)
            for seed in range(args.seeds)]
    p50s = sorted(r[0] * 1000 for r in runs)
    return {"order": order, "p50_ms": [p50s[0], statistics.median(p50s), p50s[-1]],
            "slowest_ms": statistics.median(r[1] * 1000 for r in runs)}


def render(report: dict[str, Any]) -> str:
    rows = [["order", "first tool result p50, ms: min", "median", "max", "slowest, median"]]
    for r in report["orders"]:
        rows.append([r["order"], *(f"{v:,.0f}" for v in r["p50_ms"]), f"{r['slowest_ms']:,.0f}"])
    one, fair = report["orders"][0], report["orders"][1]
    return "\n".join([
        f"{report['processes']} processes x {LOOPS} loops, `{report['rate']}`, round trips "
        f"{report['rtt_ms'][0]}-{report['rtt_ms'][-1]} ms, {report['seeds']} seeds (virtual time)"
        + (", the notification and the GET stream unmetered" if report["unmetered"] else ""),
        "", harness.table(rows), "",
        harness.ratio_line("first tool result p50 (median over seeds), ms",
                           ("by recent use", fair["p50_ms"][1]), ("one asker", one["p50_ms"][1]))])


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--processes", type=harness.count, default=8, help="client processes (default 8)")
    p.add_argument("--rate", type=harness.rate, default="20/1s", help="the bucket (default 20/1s)")
    p.add_argument("--seeds", type=harness.count, default=20, help="runs per order (default 20)")
    p.add_argument("--rtt-ms", type=harness.levels, default=[20, 80],
                   help="a request's round trip after its permit, uniform between the two (default 20,80)")
    p.add_argument("--unmetered", action="store_true",
                   help="the initialized notification and the GET stream take no permit (a what-if)")
    args = harness.parse(p, argv, quick={"seeds": 3})
    orders = []
    lane = type(Limiter(FakeClock(), {KEY: parse_rate(args.rate)})._lanes[KEY])
    plain = lane.use
    for order in ORDERS:
        lane.use = known_rank(plain) if order == "knows the opening" else plain  # type: ignore[method-assign]
        try:
            orders.append(asyncio.run(measure(order, args)))
        finally:
            lane.use = plain  # type: ignore[method-assign]
    report = {"processes": args.processes, "rate": args.rate, "rtt_ms": args.rtt_ms, "seeds": args.seeds,
              "unmetered": args.unmetered, "orders": orders}
    harness.emit(args, report, render)
    return 0


if __name__ == "__main__":
    harness.main(main)
