"""API fuzz at length: the socket API fuzz of tests/test_api_fuzz.py, for 100,000 cases and more.

Run from the repository root (the package installed with its test extra, e.g. `pip install -e '.[test]'`):

    python bench/api_fuzz.py                            # 100,000 cases, a fresh sidecar every 25,000
    python bench/api_fuzz.py --cases 1000000 --seed 7   # longer; the seed repeats the same requests
    python bench/api_fuzz.py --json                     # the figures as JSON on stdout
    python bench/api_fuzz.py --quick                    # a smoke run: 50 cases, one worker

What it runs: the generator and the checks of `tests/test_api_fuzz.py` (issue #13), unchanged.
Hypothesis draws batches of `--batch` requests from the shipped OpenAPI document
(every operation, parameters and bodies from its schemas, malformed variants, random methods and
paths, raw HTTP no parser should take); each batch goes over one keep-alive connection to a real
`mcpcreds serve` on a Unix socket (static servers, OAuth logins at the fault IdP, a rate, a
catalog entry, a missing secret), then `GET /v1/health` must answer 200. Every answer is checked:
a status the document lists (generic error statuses for what it does not describe), never 500, a
body valid against the document's schema, no canary secret, token, grant or made-up name where it
does not belong. Every `--round` cases the sidecar is replaced by a fresh one (pauses, grants
and logins start over), and its logs and audit log are searched for the canaries.

Printed: cases, batches, seconds and cases/s (Hypothesis draws every case: generation is part of
the figure, and the share of time spent on the socket is shown), the statuses seen overall and per
operation, the health checks, and every failure (the first `--show` in full, with the request that
caused it). Exit status: 1 when there is any failure, else 0.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from hypothesis import HealthCheck, Phase, given, seed, settings
from tests.test_api_fuzz import (
    Case,
    batches,
    fuzz_sidecar,
    leaks_in_logs,
    run_batch,
)

from bench import harness


def operation(case: Case) -> str:
    if case.raw is not None:
        return "raw HTTP"
    if case.template is None:
        return "off the document"
    return f"{case.method} {case.template}"


@dataclass
class Tally:
    cases: int = 0
    batches: int = 0
    sidecars: int = 0
    health_ok: int = 0
    wire_seconds: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    by_operation: dict[str, Counter[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def record(self, outcomes: list[Any], after: list[str]) -> None:
        self.batches += 1
        self.cases += len(outcomes)
        self.health_ok += not after
        self.failures += after
        for out in outcomes:
            status = str(out.status) if out.status is not None else "none"
            self.statuses[status] += 1
            self.by_operation.setdefault(operation(out.case), Counter())[status] += 1
            if out.problems:
                self.failures.append(out.report())

    def merge(self, other: Tally) -> None:
        self.cases += other.cases
        self.batches += other.batches
        self.health_ok += other.health_ok
        self.wire_seconds += other.wire_seconds
        self.statuses.update(other.statuses)
        for op, counts in other.by_operation.items():
            self.by_operation.setdefault(op, Counter()).update(counts)
        self.failures += other.failures


def fuzz_round(params: tuple[Path, int, int, int], release: harness.Release) -> Tally:
    """About `cases` cases against the sidecar on `socket`, in batches of `batch` (Hypothesis may
    skip an example whose draw it rejects: the caller tops up with another round). A load phase."""
    socket, cases, round_seed, batch = params
    release.wait()
    tally = Tally()

    @settings(max_examples=max(1, -(-cases // batch)), deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(round_seed)
    @given(batches(batch, batch))
    def one(cases_: list[Case]) -> None:
        started = time.perf_counter()
        outcomes, after = run_batch(socket, cases_)
        tally.wire_seconds += time.perf_counter() - started
        tally.record(outcomes, after)

    one()
    return tally


def run(args: argparse.Namespace) -> tuple[Tally, float]:
    tally = Tally()
    started = time.perf_counter()
    with harness.Workers(args.workers) as workers:
        while tally.cases < args.cases:
            with harness.workdir("fuzz") as tmp, fuzz_sidecar(tmp) as target:
                tally.sidecars += 1
                size = min(args.round, args.cases - tally.cases)
                harness.progress(f"sidecar {tally.sidecars}: {size:,} cases from {args.workers} worker(s)...")
                shares = harness.split(size, args.workers)
                params = [(target.socket, share, args.seed + 1000 * tally.sidecars + w, args.batch)
                          for w, share in enumerate(shares)]
                for part in workers.run(fuzz_round, params, timeout=None):
                    tally.merge(part)
                tally.failures += [f"sidecar {tally.sidecars}: {leak}" for leak in leaks_in_logs(target)]
    return tally, time.perf_counter() - started


def render(tally: Tally, seconds: float, args: argparse.Namespace) -> str:
    lines = [
        f"api_fuzz: {tally.cases:,} cases in {tally.batches:,} batches on {tally.sidecars} sidecar(s), "
        f"{seconds:.1f} s: {tally.cases / seconds:,.0f} cases/s "
        f"from {args.workers} worker(s) "
        f"({100 * tally.wire_seconds / (seconds * args.workers):.0f} % of their time on the socket, the rest "
        "drawing cases); "
        f"seed {args.seed}",
        "statuses: " + ", ".join(f"{s} x{n:,}" for s, n in sorted(tally.statuses.items())),
        "by operation:",
    ]
    width = max(len(op) for op in tally.by_operation) if tally.by_operation else 0
    for op in sorted(tally.by_operation):
        counts = tally.by_operation[op]
        lines.append(f"  {op:<{width}}  " + "  ".join(f"{s} x{n:,}" for s, n in sorted(counts.items())))
    lines.append(f"health after each batch: {tally.health_ok:,} of {tally.batches:,} answered 200")
    lines.append(f"failures: {len(tally.failures):,}")
    for report in tally.failures[:args.show]:
        lines.append("  " + report.replace("\n", "\n  "))
    if len(tally.failures) > args.show:
        lines.append(f"  ... and {len(tally.failures) - args.show:,} more")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(__doc__)
    parser.add_argument("--cases", type=int, default=100_000, help="cases to run in all (default 100,000)")
    parser.add_argument("--round", type=int, default=25_000, help="cases per sidecar (default 25,000)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes drawing and sending cases at once (default: 2, or 1 on one core)")
    parser.add_argument("--batch", type=int, default=25, help="cases per batch (default 25)")
    parser.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: random, printed)")
    parser.add_argument("--show", type=int, default=10, help="failures printed in full (default 10)")
    args = harness.parse(parser, argv, quick={"cases": 50, "round": 50, "workers": 1})
    if args.seed is None:
        args.seed = random.randrange(2**32)
    tally, seconds = run(args)
    report = {
        "cases": tally.cases, "batches": tally.batches, "sidecars": tally.sidecars,
        "seconds": round(seconds, 2),
        "cases_per_second": round(tally.cases / seconds, 1), "seed": args.seed,
        "workers": args.workers,
        "socket_share": round(tally.wire_seconds / (seconds * args.workers), 3),
        "statuses": dict(tally.statuses),
        "by_operation": {op: dict(c) for op, c in tally.by_operation.items()},
        "health_ok": tally.health_ok, "failures": tally.failures,
    }
    harness.emit(args, report, lambda _: render(tally, seconds, args))
    return 1 if tally.failures else 0


if __name__ == "__main__":
    harness.main(main)
