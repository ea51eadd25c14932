"""Start-up where users feel it: `mcpcreds token NAME` in a clean venv, and a sidecar's ready time.

Run from the repository root:

    python bench/startup_bench.py                       # 30 rounds of the commands, 10 of the starts
    python bench/startup_bench.py --baseline ../old     # also another checkout, in the same rounds
    python bench/startup_bench.py --quick               # a smoke run: 2 rounds, 1,000 servers

What it measures, each figure over several rounds (min / median / max), the commands taking turns
so that a busy machine slows them alike:

- `mcpcreds token NAME` against a real sidecar (a static `Bearer {{secret:...}}` header), as the
  console script of a fresh venv runs it, next to `python -c pass` of that same venv (issue 33's
  goal: at most 2x). The venv is made here (`python -m venv --without-pip`, so no `.pth` file of
  pip or setuptools) and the checkout installed in it, not editable (`pip --python VENV install
  --no-deps .`: the command needs none of the dependencies, and would import none if they were
  there). `python -m mcpcreds token NAME` too (runpy's own imports on top).
- The sidecar's start: from the spawn of `python -m mcpcreds serve --config CONFIG` (this
  interpreter, the checkout's `src` on PYTHONPATH) to its `ready` log line, with one static server
  and with `--servers` (10,000) of them, next to `python -c pass` of this interpreter. Goals: 0.5 s
  and 2 s. And, once per config, what a sidecar has done when `ready` is logged: the CPU seconds
  it used (user and system: less moved by a busy machine than the wall time) and the modules it
  imported (their count, and which of redis, cryptography, httpx, authlib and rich are among them).

With `--baseline DIR` (a checkout of another commit, e.g. `git worktree add ../old main`), DIR is
measured the same way in the same rounds (its own venv; its sidecars from its `src`), and the
ratios after/before are printed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import harness

SERVER = "bench"
TOKEN = "startup-bench-token-0123456789abcdef"
TOKEN_GOAL = 2.0  # x python -c pass
READY_GOALS = {"1 server": 0.5}  # seconds
LARGE_GOAL = 2.0  # seconds, for 10,000 servers (fewer: the same bound)
HEAVY = ("redis", "cryptography", "httpx", "authlib", "rich")
AT_READY = """
import json, logging, os, resource, sys

class AtReady(logging.Handler):
    def emit(self, record):
        if record.getMessage() == "ready":
            used = resource.getrusage(resource.RUSAGE_SELF)
            cpu = used.ru_utime + used.ru_stime
            print(json.dumps({"modules": sorted(sys.modules), "cpu": cpu}), flush=True)
            os._exit(0)

logging.getLogger("mcpcreds.sidecar").addHandler(AtReady())
from mcpcreds.cli.main import main
main(["serve", "--config", sys.argv[1]])
"""


@dataclasses.dataclass
class Figure:
    name: str
    checkout: str  # "this" or "baseline"
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def row(self) -> dict[str, Any]:
        return {"name": self.name, "checkout": self.checkout, "runs": len(self.seconds),
                "min_ms": round(min(self.seconds) * 1000, 1), "median_ms": round(self.median * 1000, 1),
                "max_ms": round(max(self.seconds) * 1000, 1)}


def make_venv(checkout: Path, folder: Path) -> Path:
    """A fresh venv without pip (so without any `.pth` file), `checkout` installed in it, not editable."""
    harness.progress(f"installing {checkout} in a fresh venv...")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                           "--no-deps", "--disable-pip-version-check", str(checkout)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise harness.BenchError(f"pip could not install {checkout}: {proc.stderr.strip()[-500:]}")
    pth = sorted(p.name for p in folder.glob("lib/python*/site-packages/*.pth"))
    if pth:
        raise harness.BenchError(f"the venv has .pth files ({', '.join(pth)}): not a clean interpreter")
    return python


def config_text(folder: Path, servers: int) -> str:
    head = (f'[sidecar]\nsocket = {json.dumps(str(folder / "s.sock"))}\n\n'
            '[secrets]\nsources = ["env"]\n\n')
    blocks = []
    for n in range(servers):
        name = SERVER if servers == 1 else f"{SERVER}{n}"
        blocks.append(harness.static_server(name, {"Authorization": "Bearer {{secret:STARTUP_BENCH_TOKEN}}"},
                                            endpoint=f"https://{name}.example.com/mcp")
                      + 'tool_allowlist = ["search"]\n')  # a server that exposes a tool: no warning
    return head + "\n".join(blocks)


def sidecar_env(src: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(src), "STARTUP_BENCH_TOKEN": TOKEN}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: compiled once, not at every start
    return env


def time_to_ready(config: Path, src: Path) -> float:
    """Seconds from the spawn of `mcpcreds serve` to its `ready` line; the sidecar is then stopped."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "mcpcreds", "serve", "--config", str(config)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=sidecar_env(src))
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:
            if '"ready"' in line:
                return time.perf_counter() - t0
            seen.append(line)
        raise harness.BenchError(f"the sidecar exited ({proc.wait()}) before ready: {''.join(seen)[-800:]}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def at_ready(config: Path, src: Path) -> tuple[list[str], float]:
    """The modules a sidecar has imported when it logs `ready`, and the CPU seconds it used by then."""
    proc = subprocess.run([sys.executable, "-c", AT_READY, str(config)], capture_output=True, text=True,
                          timeout=300, env=sidecar_env(src))
    if proc.returncode != 0 or not proc.stdout.strip():
        raise harness.BenchError(f"the sidecar did not start: {proc.stderr[-800:]}")
    found = json.loads(proc.stdout.splitlines()[-1])
    return list(found["modules"]), float(found["cpu"])


def render(report: dict[str, Any]) -> str:
    rows = [("figure", "checkout", "runs", "min ms", "median ms", "max ms")]
    rows += [(r["name"], r["checkout"], str(r["runs"]), f"{r['min_ms']:.1f}", f"{r['median_ms']:.1f}",
              f"{r['max_ms']:.1f}") for r in report["figures"]]
    lines = [harness.table(rows), ""]
    lines += report["lines"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--rounds", type=harness.count, default=10,
                   help="recorded rounds of the starts (default 10)")
    p.add_argument("--cli-rounds", type=harness.count, default=30,
                   help="recorded rounds of the CLI commands (default 30: each takes ~20 ms)")
    p.add_argument("--warmup", type=int, default=2,
                   help="unrecorded rounds of the CLI commands first (default 2)")
    p.add_argument("--servers", type=harness.count, default=10_000,
                   help="servers in the large config (default 10,000)")
    p.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                   help="another checkout to measure in the same rounds (its own venv and sidecars)")
    args = harness.parse(p, argv, quick={"rounds": 2, "cli_rounds": 3, "warmup": 1, "servers": 1000})
    checkouts = {"this": harness.ROOT}
    if args.baseline is not None:
        if not (args.baseline / "src" / "mcpcreds").is_dir():
            p.error(f"--baseline {args.baseline}: not a checkout of mcpcreds (no src/mcpcreds)")
        checkouts["baseline"] = args.baseline.resolve()
    large = f"{args.servers:,} servers"
    goals = {**READY_GOALS, large: LARGE_GOAL}

    with harness.workdir("startup-bench") as tmp:
        pythons = {name: make_venv(root, tmp / f"venv-{name}") for name, root in checkouts.items()}
        configs: dict[tuple[str, str], Path] = {}
        for name in checkouts:
            for label, count in (("1 server", 1), (large, args.servers)):
                folder = tmp / f"{name}-{count}"
                folder.mkdir(mode=0o700)
                configs[name, label] = folder / "config.toml"
                configs[name, label].write_text(config_text(folder, count), encoding="utf-8")
        block = harness.static_server(SERVER, {"Authorization": "Bearer {{secret:STARTUP_BENCH_TOKEN}}"})
        with harness.sidecar(tmp / "sidecar", block, env={"STARTUP_BENCH_TOKEN": TOKEN}) as proc:
            env = harness.client_env(proc.config)
            for key in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE"):  # the venv's own package, compiled once
                env.pop(key, None)
            cli: list[tuple[str, str, list[str], str | None]] = []
            for name, python in pythons.items():
                cli += [("venv python -c pass", name, [str(python), "-c", "pass"], None),
                        (f"mcpcreds token {SERVER}", name,
                         [str(python.with_name("mcpcreds")), "token", SERVER], TOKEN),
                        (f"python -m mcpcreds token {SERVER}", name,
                         [str(python), "-m", "mcpcreds", "token", SERVER], TOKEN)]
            figures = {(label, name): Figure(label, name, []) for label, name, _, _ in cli}
            harness.progress(f"{args.warmup} + {args.cli_rounds} rounds of {len(cli)} commands, in turns...")
            for n in range(args.warmup + args.cli_rounds):
                for label, name, cmd, expected in cli:
                    elapsed = harness.timed_run(cmd, env, expected)
                    if n >= args.warmup:
                        figures[label, name].seconds.append(elapsed)

        base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        starts: list[tuple[str, str, Path | None]] = [("python -c pass", "this", None)]
        starts += [(f"sidecar ready, {label}", name, configs[name, label])
                   for label in goals for name in checkouts]
        for label, name, _ in starts:
            figures[label, name] = Figure(label, name, [])
        for name in checkouts:  # compiled once (as installed), before the rounds
            at_ready(configs[name, "1 server"], checkouts[name] / "src")
        harness.progress(f"{args.rounds} rounds of {len(starts)} starts, in turns...")
        for _ in range(args.rounds):
            for label, name, config in starts:
                seconds = (harness.timed_run([sys.executable, "-c", "pass"], base_env) if config is None
                           else time_to_ready(config, checkouts[name] / "src"))
                figures[label, name].seconds.append(seconds)
        imported = {(name, label): at_ready(configs[name, label], checkouts[name] / "src")
                    for name in checkouts for label in goals}

    lines = []
    met = True
    for name in checkouts:
        base = figures["venv python -c pass", name]
        for label in (f"mcpcreds token {SERVER}", f"python -m mcpcreds token {SERVER}"):
            figure = figures[label, name]
            lines.append(harness.ratio_line(f"{name}, median ms", (label, figure.median * 1000),
                                            ("venv python -c pass", base.median * 1000)))
        met &= name != "this" or figures[f"mcpcreds token {SERVER}", name].median <= TOKEN_GOAL * base.median
        for label, goal in goals.items():
            median = figures[f"sidecar ready, {label}", name].median
            modules, cpu = imported[name, label]
            heavy = sorted({m.split(".")[0] for m in modules} & set(HEAVY))
            lines.append(f"{name}: sidecar ready, {label}: median {median:.3f} s (goal <= {goal:g} s); "
                         f"at ready (one start): {cpu:.3f} s of CPU, {len(modules)} modules, of "
                         f"{', '.join(HEAVY)}: {', '.join(heavy) or 'none'}")
            met &= name != "this" or median <= goal
    if "baseline" in checkouts:
        for label in [c[0] for c in cli[:3]] + [f"sidecar ready, {g}" for g in goals]:
            after, before = figures[label, "this"].median, figures[label, "baseline"].median
            lines.append(harness.ratio_line(f"{label}, median ms", ("this", after * 1000),
                                            ("baseline", before * 1000)))
    lines.append(f"goals: token <= {TOKEN_GOAL:g}x venv python -c pass, ready <= "
                 + ", ".join(f"{g:g} s ({label})" for label, g in goals.items()) + ": ")
    lines[-1] += "met" if met else "missed"
    report = {"figures": [f.row() for f in figures.values()], "lines": lines, "met": met, **harness.machine()}
    harness.emit(args, report, render)
    return 0 if met else 1


if __name__ == "__main__":
    harness.main(main)
