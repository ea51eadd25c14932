"""The benches still run: each bench's `--quick` mode, as the command line runs it, prints its
baseline from the same run and its ratio (issue 18). No figure is checked, only that it is there.

The benches run a few at a time (WINDOW), each in its own process group (they spawn load processes,
sidecars and peers). Every bench at once was a CPU storm in which a peer could not start within its
own bound (an oidc peer silent for 60 s beside the other soak tests). It is a soak test: `pytest -m soak`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, NamedTuple

import pytest

# a storm of sidecars, peers and load processes: CI runs it with the soak tests (`pytest -m soak`),
# not in the suite's few minutes
pytestmark = pytest.mark.soak

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 100.0  # seconds a bench may take from its start
WINDOW = 2 * (os.cpu_count() or 1)  # benches running at once


class Bench(NamedTuple):
    script: str
    args: tuple[str, ...]
    baseline: str  # a regex a line of stdout must match: the baseline's figures
    ratio: str  # ... and the ratio against it
    codes: tuple[int, ...] = (0,)  # exit statuses that still mean it ran (1: a target missed)


BENCHES = {
    "socket": Bench("socket_bench.py", (), r"^echo\s+1\s+[\d,]+\s", r"^sidecar\s+1\s.*\s\d+\.\d\d$"),
    "client": Bench("client_bench.py", (), r"^plain\s+c=1\s.*req/s", r"^added by auth= \(lease\)\s+c=1\s.*throughput x[\d.]+$"),
    "redis": Bench("redis_bench.py", (), r"^bare EVALSHA .*c=1\s.*req/s", r"^\s+redis / evalsha\s+throughput x[\d.]+"),
    "rate": Bench("rate_bench.py", (), r"^aiolimiter\s+\d+\s",
                  r"^ratio: permits in 1 s: sidecar \d+ / aiolimiter \d+ = [\d.]+x$", (0, 1)),
    "login": Bench("login_bench.py", (), r"^token requests at the IdP\s+1\s+2$",
                   r"^ratio: token requests in the cold burst: sidecar 1 / baseline 2 = 0\.50x$", (0, 1)),
    "status_quo": Bench("status_quo.py", ("--processes", "1", "--seconds", "1"),
                        r"^\| token requests \(at the IdP\) \| \d+ \|(?: \d+ \|)+$",
                        r"^ratio: first request with a valid token, p50 ms: mcpcreds [\d.]+ / status quo [\d.]+ = "),
    "kept_upstream": Bench("kept_upstream.py", (), r"^medians of the rounds' p50: gateway [\d.]+ ms, direct [\d.]+ ms$",
                           r"^ratio: call p50 ms: gateway [\d.,]+ / direct [\d.,]+ = [\d.]+x$"),
    "gateway": Bench("gateway_bench.py", (), r"^\s+direct\s+p50 [\d.]+ ms\s",
                     r"^\s+added p50: -?[\d.]+ ms .*; ratio gateway/direct p50 [\d.]+$"),
    "tcp": Bench("tcp_bench.py", (), r"^unix\s+[\d.]+\s+[\d.]+\s+[\d.]+\s",
                 r"^ratio: calls/s \(goal >= 0\.83x\): tcp [\d.,]+ / unix [\d.,]+ = [\d.]+x$"),
    "relay_floor": Bench("relay_floor.py", (), r"^floor(?:\s+[\d.]+){5}$",
                         r"^ratio: CPU ms per call at 1 session\(s\): sidecar [\d.,]+ / floor [\d.,]+ = [\d.]+x$"),
    "cli": Bench("cli_bench.py", (), r"^python[\d.]* -c pass\s+\d+\s+[\d.]+\s",
                 r"^ratio: whole process p50 ms: mcpcreds headers bench [\d.,]+ / python[\d.]* -c pass [\d.,]+ = [\d.]+x$",
                 (0, 1)),
    "startup": Bench("startup_bench.py", (), r"^venv python -c pass\s+this\s+\d+\s+[\d.]+\s",
                     r"^ratio: this, median ms: mcpcreds token bench [\d.,]+ / venv python -c pass [\d.,]+ = [\d.]+x$",
                     (0, 1)),
    "aauth": Bench("aauth_bench.py", (), r"^\s+ed25519 alone\s+p50\s+[\d.]+ us",
                   r"^ratio: signing p50 us: AAuth signature [\d.]+ / ed25519 alone [\d.]+ = [\d.]+x$"),
    "stdio_vs_mcp_remote": Bench("stdio_vs_mcp_remote.py", (), r"^mcp-remote URL\s+[\d.]+\s+[\d.]+$",
                                 r"^ratio: CPU ms per call, 2 sessions, median of rounds: mcpcreds stdio URL [\d.,]+ / "
                                 r"mcp-remote URL [\d.,]+ = [\d.]+x \(each round: "),
    # a fuzz, not a measurement: no baseline; its summary and no failure
    "api_fuzz": Bench("api_fuzz.py", ("--seed", "1"), r"^api_fuzz: [\d,]+ cases in ", r"^failures: 0$"),
    "queue_order": Bench("queue_order.py", (), r"^one asker\s+[\d,]+\s+[\d,]+\s",
                         r"^ratio: first tool result p50 .*: by recent use [\d,]+ / one asker [\d,]+ = [\d.]+x$"),
}


class Run(NamedTuple):
    proc: subprocess.Popen[bytes]
    out: IO[bytes]
    err: IO[bytes]


class Runs:
    """The benches' quick modes, started in BENCHES' order as the tests ask for them: the one asked
    for and the WINDOW - 1 after it run at once."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.started: dict[str, Run] = {}

    def start(self, name: str) -> None:
        bench = BENCHES[name]
        out = self.stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 (closed by the stack)
        err = self.stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 (closed by the stack)
        proc = subprocess.Popen(
            [sys.executable, f"bench/{bench.script}", "--quick", *bench.args], cwd=ROOT,
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        self.started[name] = Run(proc, out, err)

    def of(self, name: str) -> Run:
        names = list(BENCHES)
        at = names.index(name)
        for ahead in names[at:at + WINDOW]:
            if ahead not in self.started:
                self.start(ahead)
        return self.started[name]


@pytest.fixture(scope="module")
def runs() -> Iterator[Runs]:
    with contextlib.ExitStack() as stack:
        started = Runs(stack)
        try:
            yield started
        finally:
            for run in started.started.values():
                if run.proc.poll() is None:
                    os.killpg(run.proc.pid, signal.SIGKILL)
                    run.proc.wait()


@pytest.mark.parametrize("name", list(BENCHES))
def test_quick_run_prints_baseline_and_ratio(runs: Runs, name: str) -> None:
    bench, run = BENCHES[name], runs.of(name)
    try:
        code = run.proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(run.proc.pid, signal.SIGKILL)
        code = run.proc.wait()
    run.out.seek(0)
    run.err.seek(0)
    stdout = run.out.read().decode(errors="replace")
    stderr = run.err.read().decode(errors="replace")
    where = f"bench/{bench.script} --quick exited {code}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}"
    assert code in bench.codes, where
    assert "Traceback" not in stderr, where
    assert re.search(bench.baseline, stdout, re.MULTILINE), f"no baseline line /{bench.baseline}/\n{where}"
    assert re.search(bench.ratio, stdout, re.MULTILINE), f"no ratio line /{bench.ratio}/\n{where}"
