"""CLI start-up: whole-process `mcpcreds headers NAME` and `mcpcreds token NAME` next to `python -c pass`.

Run from the repository root:

    python bench/cli_bench.py              # 30 runs of each command
    python bench/cli_bench.py --runs 100 --json
    python bench/cli_bench.py --quick      # a smoke run: 5 runs of each

What it measures: the wall time of whole processes, from `subprocess.run` to its return, against a
real sidecar (`mcpcreds serve`, a static `Bearer {{secret:...}}` header): `mcpcreds headers NAME`
and `mcpcreds token NAME` as the console script of `[project.scripts]` runs them (the `mcpcreds`
next to this interpreter; `python -c "from mcpcreds.cli.main import main; ..."` when there is none),
`python -m mcpcreds headers NAME`, and the baseline `python -c pass` of the same interpreter. The
config is found as a user's is ($MCPCREDS_CONFIG), and every process gets this checkout's `src` on
PYTHONPATH, the baseline too. The commands take turns, run after run, so a busy machine slows them
alike; the first `--warmup` runs of each are not recorded (and write the bytecode caches:
$PYTHONDONTWRITEBYTECODE is unset for every command, so that no run compiles the package again, as
none does once it is installed). Issue 18's target: p50 at most 2x
`python -c pass` (exit 1 when missed).

`--no-site` adds the same pair without `site` (`python -S`, site-packages put on PYTHONPATH): start-up
without any `.pth` file of the machine's site-packages. A `.pth` that imports something (this
sandbox's certifi hook does: re, pathlib, importlib.resources) makes `python -c pass` slower and
preloads modules the CLI would otherwise pay for, which flatters the ratio; `-S` shows the strict one.

It also runs `mcpcreds headers NAME` once under `python -S -X importtime` (no `.pth` file can
import a module before it) and names any heavy module it imported: httpx, authlib, asyncio,
cryptography, redis, keyring, ssl, the config parser, and tomllib, pathlib, socket and threading
(a few ms each, which the fast path does without).
"""

from __future__ import annotations

import dataclasses
import os
import site
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import harness

SERVER = "bench"
TOKEN = "cli-bench-token-0123456789abcdef"
TARGET = 2.0
HEAVY = ("httpx", "httpcore", "authlib", "asyncio", "cryptography", "redis", "keyring", "ssl",
         "mcpcreds.config.load", "mcpcreds.client.auth", "tomllib", "pathlib", "socket", "threading")
CONSOLE_SCRIPT = "import sys; from mcpcreds.cli.main import main; sys.exit(main())"


@dataclasses.dataclass
class Figures:
    command: str
    runs: int
    p50_ms: float
    p90_ms: float
    min_ms: float
    ratio: float  # p50 over the baseline's p50


def console_script() -> list[str]:
    script = Path(sys.executable).with_name("mcpcreds")
    return [str(script)] if script.exists() else [sys.executable, "-c", CONSOLE_SCRIPT]


def heavy_imports(argv: list[str], env: dict[str, str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-S", "-X", "importtime", *argv], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=env, timeout=60)
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
             if line.startswith("import time:") and line.count("|") == 2}
    return sorted(n for n in names if n in HEAVY or n.split(".")[0] in HEAVY)


def render(report: dict[str, Any]) -> str:
    results: list[Figures] = report["results"]
    rows = [("command", "runs", "p50 ms", "p90 ms", "min ms", "x pass")]
    for r in results:
        rows.append((r.command, str(r.runs), f"{r.p50_ms:.1f}", f"{r.p90_ms:.1f}", f"{r.min_ms:.1f}",
                     f"{r.ratio:.2f}"))
    lines = [harness.table(rows), ""]
    for n, r in enumerate(results):
        if n in (0, 4):  # the baselines: python -c pass, python -S -c pass
            continue
        base = results[4 if n > 4 else 0]
        lines.append(harness.ratio_line("whole process p50 ms", (r.command, r.p50_ms),
                                        (base.command, base.p50_ms)))
    heavy = report["heavy_imports"]
    lines.append(f"heavy modules imported by `{results[1].command}`: {', '.join(heavy) or 'none'}")
    lines.append(f"target: p50 <= {TARGET:g}x python -c pass: {'met' if report['met'] else 'missed'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--runs", type=harness.count, default=30,
                   help="recorded runs of each command (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="unrecorded runs of each command first (default 3)")
    p.add_argument("--no-site", action="store_true",
                   help="also measure python -S -c pass and python -S -m mcpcreds headers (no .pth files)")
    args = harness.parse(p, argv, quick={"runs": 5, "warmup": 1})
    if args.warmup < 0:
        p.error("--warmup must be >= 0")

    script = console_script()
    python = Path(sys.executable).name
    block = harness.static_server(SERVER, {"Authorization": "Bearer {{secret:CLI_BENCH_TOKEN}}"})
    with harness.workdir("cli-bench") as tmp, \
            harness.sidecar(tmp / "sidecar", block, env={"CLI_BENCH_TOKEN": TOKEN}) as proc:
        env = harness.client_env(proc.config)
        # as installed: compiled once (the warm-up writes __pycache__), not compiled again each run
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        commands: list[tuple[str, list[str], str | None]] = [
            (f"{python} -c pass", [sys.executable, "-c", "pass"], None),
            (f"mcpcreds headers {SERVER}", [*script, "headers", SERVER], f"Bearer {TOKEN}"),
            (f"mcpcreds token {SERVER}", [*script, "token", SERVER], TOKEN),
            (f"{python} -m mcpcreds headers {SERVER}", [sys.executable, "-m", "mcpcreds", "headers", SERVER],
             f"Bearer {TOKEN}"),
        ]
        env_s = {**env, "PYTHONPATH": os.pathsep.join([env["PYTHONPATH"], *site.getsitepackages()])}
        if args.no_site:
            commands += [
                (f"{python} -S -c pass", [sys.executable, "-S", "-c", "pass"], None),
                (f"{python} -S -m mcpcreds headers {SERVER}",
                 [sys.executable, "-S", "-m", "mcpcreds", "headers", SERVER], f"Bearer {TOKEN}"),
            ]
        samples: dict[str, list[float]] = {name: [] for name, _, _ in commands}
        harness.progress(f"{args.warmup} + {args.runs} runs of {len(commands)} commands, in turns...")
        for n in range(args.warmup + args.runs):
            for name, cmd, expected in commands:
                elapsed = harness.timed_run(cmd, env_s if "-S" in cmd else env, expected)
                if n >= args.warmup:
                    samples[name].append(elapsed * 1000)
        heavy = heavy_imports(["-m", "mcpcreds", "headers", SERVER], env_s)

    results = []
    for name, cmd, _ in commands:
        ordered = sorted(samples[name])
        p50 = statistics.median(ordered)
        base = statistics.median(samples[commands[4 if "-S" in cmd else 0][0]])
        results.append(Figures(name, len(ordered), round(p50, 2), round(harness.percentile(ordered, 0.9), 2),
                               round(ordered[0], 2), round(p50 / base, 3)))
    met = all(r.ratio <= TARGET for r in results[1:3]) and not heavy
    report = {"results": results, "heavy_imports": heavy, "met": met, "target": TARGET,
              "console_script": " ".join(script), **harness.machine()}
    harness.emit(args, report, render)
    return 0 if met else 1


if __name__ == "__main__":
    harness.main(main)
