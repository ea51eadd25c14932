"""What every bench needs besides what it measures: the command line, a real sidecar on a fresh
config, the peers, load processes released together, closed-loop asyncio load, whole processes
timed, latency figures, ratios against the baseline measured in the same run, and text tables.

A bench starts with

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
    from bench import harness

(and `from bench import wire` for HTTP/1.1 by hand on the sidecar's socket), and ends with
`if __name__ == "__main__": harness.main(main)`. Its `main(argv)` builds its options
with `harness.arguments(__doc__)`, parses them with `harness.parse(parser, argv, quick={...})`
(`--quick` sets the given options for a smoke run of a few seconds; what is given on the command
line still wins) and prints with `harness.emit`. Anything that keeps the bench from measuring (a
sidecar or peer that does not start, a load process that fails) is a `BenchError`: one line on
stderr, exit status 1.

This module imports only the standard library at the top: the load processes import the bench
module, and stay light.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import json
import math
import multiprocessing
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    from tests.peers.oidc_peer import OidcPeer
    from tests.sidecar_proc import SidecarProcess

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:  # measure this checkout's mcpcreds, whatever `pip install -e` points at
    sys.path.insert(0, str(SRC))

READY_TIMEOUT = 90.0  # spawned processes importing httpx, authlib or the MCP SDK on a busy machine
ENDPOINT = "https://bench.example.com/mcp"

T = TypeVar("T")


class BenchError(Exception):
    """Something the bench needs failed: the message says which and why."""


def describe(exc: BaseException) -> str:
    """`Type: message` of an exception (the first cause of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


@dataclasses.dataclass
class Errors:
    """The failures of a load: how many, and what the first one was."""

    count: int = 0
    first: str = ""

    def add(self, error: BaseException | str) -> None:
        self.count += 1
        self.first = self.first or (error if isinstance(error, str) else describe(error))


def first_error(errors: Iterable[str]) -> str:
    """The first of the load processes' first errors ("" where none failed)."""
    return next((e for e in errors if e), "")


# ------------------------------------------------------------------------------ the command line


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """The bench's parser, described by the first line of its docstring, with `--json`."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc else None)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


def event_loop_option(p: argparse.ArgumentParser) -> None:
    """`--event-loop`: the sidecar's `[sidecar] event_loop`, for a run against asyncio's own loop."""
    p.add_argument("--event-loop", choices=("uvloop", "asyncio"), default="uvloop",
                   help="the sidecar's event loop (default uvloop, the sidecar's default)")


def loop_setting(args: argparse.Namespace) -> str:
    """The `[sidecar]` line `--event-loop` asks for ("" for the default: a tree from before the key
    reads a config without it)."""
    return "" if args.event_loop == "uvloop" else f'event_loop = "{args.event_loop}"'


def count(text: str) -> int:
    """An option's whole number >= 1: an argparse type."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a whole number >= 1: {text!r}")
    return value


def positive(text: str) -> float:
    """An option's number > 0 (seconds, an interval): an argparse type."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"not a number > 0: {text!r}")
    return value


def rate(text: str) -> str:
    """An option's rate as a config writes it ("100/1s"), checked: an argparse type."""
    from mcpcreds.core.rates import parse_rate

    try:
        parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def host_name(text: str) -> str:
    """An option's host name (letters, digits, dots and hyphens; at most 253): an argparse type."""
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", text):
        raise argparse.ArgumentTypeError("not a host name (letters, digits, dots and hyphens)")
    return text


def levels(text: str) -> list[int]:
    """An option's comma-separated whole numbers >= 1 (`--concurrency 1,16`): an argparse type."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"not comma-separated whole numbers >= 1: {text!r}")
    return values


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None,
          quick: Mapping[str, Any]) -> argparse.Namespace:
    """Parse `argv` with `--quick` added: it sets `quick` (option destinations and values) unless
    the command line gives them."""
    def word(v: Any) -> str:
        return shlex.quote(",".join(map(str, v)) if isinstance(v, list | tuple) else str(v))

    words = " ".join(f"--{k.replace('_', '-')} {word(v)}" for k, v in quick.items())
    p.add_argument("--quick", action="store_true", help=f"a smoke run of a few seconds: {words}")
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**quick)
        args = p.parse_args(argv)
    return args


def main(run: Callable[[list[str] | None], int]) -> NoReturn:
    """`if __name__ == "__main__": harness.main(main)`: exit with `run`'s status; a BenchError is one
    line on stderr and status 1."""
    try:
        code = run(None)
    except BenchError as exc:
        print(f"{Path(sys.argv[0]).stem}: {exc}", file=sys.stderr)
        code = 1
    sys.exit(code)


def emit(args: argparse.Namespace, report: Any, render: Callable[[Any], str]) -> None:
    """The report as JSON (`--json`; dataclasses as objects) or as `render` writes it."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        raise TypeError(f"not JSON: {type(value).__name__}")

    print(json.dumps(report, indent=2, default=plain) if args.json else render(report), flush=True)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "cpus": os.cpu_count()}


CLOCK_TICK = 1 / os.sysconf("SC_CLK_TCK")  # the unit of /proc/PID/stat's CPU times (USER_HZ)


def cpu_seconds(pid: int, children: bool = False, gone: float | None = None) -> float:
    """User + system CPU of process `pid` so far, from /proc/PID/stat (one clock tick resolution);
    with `children`, its reaped children's too. A process that is gone: `gone` if given, else OSError."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        if gone is None:
            raise
        return gone
    return sum(int(f) for f in fields[11:15 if children else 13]) * CLOCK_TICK


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def run_seconds(pid: int) -> float:
    """The time the threads of process `pid` have run on a CPU so far, to the nanosecond (the
    scheduler's own count, /proc/PID/task/*/schedstat), where /proc/PID/stat counts clock ticks.
    A thread that has ended no longer counts."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(stat.read_text().split()[0])
    return total / 1e9


def user_system_seconds(pid: int) -> tuple[float, float]:
    """The user and the system CPU of process `pid` so far, apart (see `cpu_seconds`)."""
    fields = _stat_fields(pid)
    return int(fields[11]) * CLOCK_TICK, int(fields[12]) * CLOCK_TICK


@contextlib.contextmanager
def workdir(name: str) -> Iterator[Path]:
    """A private temporary folder (0700: the sidecar refuses a socket folder others can read)."""
    path = Path(tempfile.mkdtemp(prefix=f"mcpcreds-{name}-"))
    path.chmod(0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------ the sidecar and peers


def _toml(value: str) -> str:
    return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's


def static_server(name: str, headers: Mapping[str, str], rate: str | None = None,
                  endpoint: str = ENDPOINT) -> str:
    """A `[[servers]]` block with static headers (values may hold `{{secret:NAME}}`)."""
    pairs = ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in headers.items())
    lines = ["[[servers]]", f"name = {_toml(name)}", f"endpoint = {_toml(endpoint)}",
             f"headers = {{ {pairs} }}"]
    if rate is not None:
        lines.append(f"rate = {_toml(rate)}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def started(cm: contextlib.AbstractContextManager[T], what: str) -> Iterator[T]:
    """Enter `cm` (a peer's or the sidecar's context manager); a failure to start is a BenchError."""
    with contextlib.ExitStack() as stack:
        try:
            value = stack.enter_context(cm)
        except (RuntimeError, TimeoutError, OSError) as exc:
            raise BenchError(f"{what} did not start: {exc}") from None
        yield value


def pythonpath() -> str:
    """PYTHONPATH for a process of this checkout: its `src` first, then the one we were given."""
    return os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)


@contextlib.contextmanager
def sidecar(folder: Path, *blocks: str, env: Mapping[str, str] | None = None,
            settings: str = "", src: Path = SRC) -> Iterator[SidecarProcess]:
    """A real `mcpcreds serve` (this checkout's, or the package in `src`) on `folder/s.sock`: its
    config is `[sidecar]` with the socket and `settings` (TOML lines), secrets from its environment
    (`env` added to ours), and `blocks` (`static_server`, TOML text). Stopped at the end of the block."""
    from tests.sidecar_proc import run_sidecar

    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    sock = folder / "s.sock"
    config = folder / "config.toml"
    head = f'[sidecar]\nsocket = {_toml(str(sock))}\n{settings}\n\n[secrets]\nsources = ["env"]\n\n'
    config.write_text(head + "\n".join(blocks), encoding="utf-8")
    path = pythonpath() if src == SRC else str(src)
    with started(run_sidecar(config, sock, {**(env or {}), "PYTHONPATH": path}),
                 f"the sidecar ({folder.name})") as proc:
        yield proc


def oauth_sidecar(folder: Path, *, service: str, server: str, endpoint: str, token_url: str,
                  client_id: str, client_secret: str, scope: str, rate: str | None = None,
                  settings: str = "", server_lines: str = "",
                  src: Path = SRC) -> contextlib.AbstractContextManager[SidecarProcess]:
    """`sidecar` with `[services.<service>]` (a client-credentials login at `token_url`, the client
    secret from the sidecar's environment) and a `[[servers]]` entry `server` that uses it, with
    `server_lines` (TOML lines) added to it."""
    lines = [f"[services.{service}]", f"endpoint = {_toml(endpoint)}"]
    if rate is not None:
        lines.append(f"rate = {_toml(rate)}")
    lines += [f"[services.{service}.oauth]", f"token_url = {_toml(token_url)}",
              f"client_id = {_toml(client_id)}", 'client_secret = "{{secret:BENCH_SECRET}}"',
              f"scope = {_toml(scope)}", "",
              "[[servers]]", f"name = {_toml(server)}", f"service = {_toml(service)}", server_lines]
    return sidecar(folder, "\n".join(lines) + "\n", env={"BENCH_SECRET": client_secret}, settings=settings,
                   src=src)


def client_env(config: Path) -> dict[str, str]:
    """The environment of a user's process of the sidecar with `config`: ours, with this
    checkout's `src` on PYTHONPATH and the config found as a user's is ($MCPCREDS_CONFIG); a socket
    or grant of ours would point it elsewhere."""
    env = {**os.environ, "PYTHONPATH": pythonpath(), "MCPCREDS_CONFIG": str(config)}
    env.pop("MCPCREDS_SOCKET", None)
    env.pop("MCPCREDS_GRANT", None)
    return env


def log_warnings(proc: SidecarProcess) -> list[str]:
    """The sidecar's log lines above info (and any that are not JSON, such as a traceback)."""
    out = []
    for line in proc.lines:
        try:
            level = str(json.loads(line).get("level", "")).lower()
        except (ValueError, AttributeError):
            level = "unparsed"
        if level not in ("info", "debug"):
            out.append(line.strip())
    return out


def print_log_warnings(procs: Mapping[str, SidecarProcess]) -> dict[str, list[str]]:
    """`log_warnings` of each named sidecar, printed (at most 10 lines each) if there are any."""
    found = {name: log_warnings(proc) for name, proc in procs.items()}
    if any(found.values()):
        print("\nsidecar log lines above info:")
        for name, lines in found.items():
            for text in lines[:10]:
                print(f"  {name}: {text}")
    return found


def status(sock: Path | str) -> dict[str, Any]:
    """The sidecar's `GET /v1/status`."""
    from mcpcreds import Client

    with Client(sock) as client:
        return client.status()


def status_entry(sock: Path | str, section: str, key: str) -> dict[str, Any]:
    """The entry of `GET /v1/status`'s `section` ("logins", "buckets") with this `key`, or {}."""
    for entry in status(sock).get(section, []):
        if entry.get("key") == key:
            return dict(entry)
    return {}


@contextlib.contextmanager
def oidc_peer(client_id: str, client_secret: str, scope: str, ttl: int) -> Iterator[OidcPeer]:
    """The oidc-provider peer (Node) with one client-credentials client; tokens live `ttl` s."""
    from tests.peers.oidc_peer import start_oidc_peer

    clients = [{"client_id": client_id, "client_secret": client_secret,
                "token_endpoint_auth_method": "client_secret_basic", "scope": scope}]
    with started(start_oidc_peer(clients, access_token_ttl=ttl), "the oidc peer") as peer:
        yield peer


def _serve_forever(serve: Callable[..., Coroutine[Any, Any, None]], args: tuple[Any, ...],
                   event_loop: str) -> None:
    factory = None
    if event_loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(*args))


@contextlib.contextmanager
def server_process(serve: Callable[..., Coroutine[Any, Any, None]], *args: Any, socket_path: Path | str,
                   what: str, event_loop: str = "asyncio") -> Iterator[int]:
    """`asyncio.run(serve(*args))` in a spawned process of its own (`serve`: a module-level async
    function that listens on the Unix socket `socket_path` until the process ends), on asyncio's
    loop or uvloop's (`event_loop`), ready once that socket takes a connection; its pid, and it is
    terminated at the end of the block."""
    spawn = multiprocessing.get_context("spawn")
    proc = spawn.Process(target=_serve_forever, args=(serve, args, event_loop), daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if not proc.is_alive():
                raise BenchError(f"{what} exited before it was ready")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(str(socket_path))
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise BenchError(f"{what} was not ready after {READY_TIMEOUT:.0f} s ({exc})") from None
            time.sleep(0.02)
        assert proc.pid is not None  # started
        yield proc.pid
    finally:
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()


# --------------------------------------------------------------------------- load processes


class Release:
    """Handed to a worker phase: `wait()` tells the parent the phase is set up, blocks until every
    worker is released together, and returns the start time the parent chose (`time.monotonic()`:
    one clock for every process on Linux)."""

    def __init__(self, ctl: Connection, go: Event, start_at: Any) -> None:
        self._ctl, self._go, self._start_at = ctl, go, start_at

    def wait(self) -> float:
        self._ctl.send(("ready", None))
        self._go.wait()
        return float(self._start_at.value)

    async def wait_async(self) -> float:
        return await asyncio.to_thread(self.wait)


Phase = Callable[[Any, Release], Any]  # sync, or async (run with asyncio.run); module-level


def _serve(ctl: Connection, go: Event, start_at: Any) -> None:
    """A worker process: run the phases the parent sends, one at a time, until it sends None."""
    while True:
        try:
            command: tuple[Phase, Any] | None = ctl.recv()
        except EOFError:
            return
        if command is None:
            return
        phase, params = command
        try:
            if inspect.iscoroutinefunction(phase):
                result = asyncio.run(phase(params, Release(ctl, go, start_at)))
            else:
                result = phase(params, Release(ctl, go, start_at))
        except Exception as exc:
            ctl.send(("error", describe(exc)))
        else:
            ctl.send(("result", result))


class Workers:
    """`processes` spawned load processes, started once and used by every `run`:

        with harness.Workers(8) as workers:
            results = workers.run(phase, [params] * 8, timeout=60)

    `phase(params, release)` runs in a worker (a module-level function of the bench, sync or
    async): it sets up, calls `release.wait()` (or `await release.wait_async()`), measures, and
    returns a picklable result. An exception in a phase is a BenchError in the parent."""

    def __init__(self, processes: int, ready_timeout: float = READY_TIMEOUT) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready_timeout = ready_timeout
        self.go = ctx.Event()
        self.start_at = ctx.Value("d", 0.0)
        self.procs: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        for _ in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, self.go, self.start_at), daemon=True)
            proc.start()
            child.close()
            self.procs.append((proc, parent))

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recv(self, pipe: Connection, timeout: float | None, what: str, expect: str) -> Any:
        if not pipe.poll(timeout):
            raise BenchError(f"{what}: a load process did not answer within {timeout:.0f} s")
        try:
            kind, payload = pipe.recv()
        except EOFError:
            raise BenchError(f"{what}: a load process died (see its traceback above)") from None
        if kind == "error":
            raise BenchError(f"{what}: a load process failed: {payload}")
        if kind != expect:
            raise BenchError(f"{what}: a load process sent {kind!r}, expected {expect!r}")
        return payload

    def run(self, phase: Phase, params: Sequence[Any], *, timeout: float | None, start_delay: float = 0.0,
            before_release: Callable[[], None] | None = None,
            while_running: Callable[[float], None] | None = None) -> list[Any]:
        """Run `phase` in the first `len(params)` workers, one params each: wait until each is set
        up, call `before_release`, release them together with a start time `start_delay` s ahead,
        call `while_running(start)`, and return their results (each within `timeout` s; None:
        however long it takes)."""
        if len(params) > len(self.procs):
            raise ValueError(f"{len(params)} params for {len(self.procs)} workers")
        pipes = [pipe for _, pipe in self.procs[: len(params)]]
        what = getattr(phase, "__name__", "phase").strip("_")
        self.go.clear()
        for pipe, p in zip(pipes, params, strict=True):
            pipe.send((phase, p))
        for pipe in pipes:
            self._recv(pipe, self.ready_timeout, what, "ready")
        if before_release is not None:
            before_release()
        start = time.monotonic() + start_delay
        self.start_at.value = start
        self.go.set()
        if while_running is not None:
            while_running(start)
        return [self._recv(pipe, timeout, what, "result") for pipe in pipes]

    def close(self) -> None:
        self.go.set()  # a worker left waiting for a release (after an error) goes on
        for _, pipe in self.procs:
            with contextlib.suppress(OSError):
                pipe.send(None)
            pipe.close()
        deadline = time.monotonic() + 10
        for proc, _ in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()


def split(total: int, parts: int) -> list[int]:
    """`total` shared as evenly as can be over at most `parts` parts (none of them empty)."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def sleep_until(when: float) -> None:
    time.sleep(max(0.0, when - time.monotonic()))


# ---------------------------------------------------------- whole processes, calls taking turns


def timed_run(argv: Sequence[str], env: Mapping[str, str], expect: str | None = None) -> float:
    """Wall seconds of the whole process `argv`, from start to exit (a fresh interpreter when it
    is Python); a failure, or `expect` not in its stdout, is a BenchError."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                          timeout=60)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0 or (expect is not None and expect not in proc.stdout):
        raise BenchError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stdout[:200]!r} "
                         f"{proc.stderr.strip()[-300:]}")
    return elapsed


def in_turns(steps: Mapping[str, Callable[[], object]], calls: int, warmup: int) -> dict[str, list[int]]:
    """`warmup` unrecorded rounds, then `calls` recorded, each calling every step once in turn, so
    that all see the same machine: each step's latencies in ns."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    samples: dict[str, list[int]] = {name: [] for name in steps}
    perf = time.perf_counter_ns
    for _ in range(calls):
        for name, step in steps.items():
            t0 = perf()
            step()
            done = perf()
            samples[name].append(done - t0)
    return samples


# ------------------------------------------------------------------- closed-loop load, latency

Send = Callable[[], Awaitable[object]]


async def drive(send: Send, tasks: int, until: float, samples: list[int] | None = None,
                record_from: float = -math.inf) -> int:
    """`tasks` loops awaiting `send()` until `time.monotonic()` reaches `until`; the latency (ns)
    of each call started at or after `record_from` is appended to `samples`. Returns the calls made."""
    calls = 0

    async def loop() -> None:
        nonlocal calls
        while (began := time.monotonic()) < until:
            t0 = time.perf_counter_ns()
            await send()
            calls += 1
            if samples is not None and began >= record_from:
                samples.append(time.perf_counter_ns() - t0)

    await asyncio.gather(*(loop() for _ in range(tasks)))
    return calls


def percentile(ordered: Sequence[T], q: float) -> T:
    """Nearest-rank percentile of sorted values (q in [0, 1])."""
    if not ordered:
        raise ValueError("no values")
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def percentiles(values: Iterable[float], *qs: float) -> list[float]:
    """`percentile` of `values` (sorted here) at each of `qs`."""
    ordered = sorted(values)
    return [percentile(ordered, q) for q in qs]


def upper_percentile(ordered: Sequence[T], q: float) -> T:
    """`ordered[int(q * n)]`: at or above the nearest rank (the upper median for q = 0.5). The
    gateway, exec, rate and status-quo benches' figures were taken with it: kept for those."""
    if not ordered:
        raise ValueError("no values")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclasses.dataclass
class Latency:
    """Requests of one mode at one concurrency: throughput and latency."""

    mode: str
    concurrency: int
    requests: int
    seconds: float
    throughput: float  # requests/s
    p50_ms: float
    p99_ms: float
    mean_ms: float
    clients: int = 1  # processes the requests came from


def summarize(mode: str, concurrency: int, samples_ns: Sequence[int], seconds: float,
              clients: int = 1) -> Latency:
    if not samples_ns:
        raise BenchError(f"{mode}: no request completed in {seconds:.2f} s")
    n = len(samples_ns)
    p50, p99 = percentiles(samples_ns, 0.50, 0.99)
    return Latency(mode, concurrency, n, round(seconds, 3), round(n / seconds, 1), round(p50 / 1e6, 4),
                   round(p99 / 1e6, 4), round(sum(samples_ns) / n / 1e6, 4), clients)


async def measure(mode: str, send: Send, tasks: int, seconds: float, warmup: float = 0.0) -> Latency:
    """`drive` for `warmup` s unrecorded, then `seconds` s recorded: the summary."""
    samples: list[int] = []
    start = time.monotonic() + warmup
    await drive(send, tasks, start + seconds, samples, record_from=start)
    return summarize(mode, tasks, samples, seconds)


def line(r: Latency, label: str | None = None) -> str:
    """One result on one line: label, concurrency, requests, throughput, p50/p99/mean."""
    return (f"{label or r.mode:<34} c={r.concurrency:<3} n={r.requests:<7} {r.throughput:>9.1f} req/s   "
            f"p50 {r.p50_ms:7.3f} ms   p99 {r.p99_ms:7.3f} ms   mean {r.mean_ms:7.3f} ms")


def ratios(a: Latency, b: Latency) -> dict[str, float]:
    """`a` over `b` (the baseline): throughput, p50, p99 and mean latency."""
    return {"throughput": round(a.throughput / b.throughput, 3), "p50": round(a.p50_ms / b.p50_ms, 3),
            "p99": round(a.p99_ms / b.p99_ms, 3), "mean": round(a.mean_ms / b.mean_ms, 3)}


def ratio_line(what: str, subject: tuple[str, float], baseline: tuple[str, float]) -> str:
    """`ratio: <what>: <subject> <value> / <baseline> <value> = <r>x`, the baseline from the same run."""
    (s_name, s), (b_name, b) = subject, baseline
    r = f"{s / b:.2f}x" if b else "n/a (baseline 0)"
    return f"ratio: {what}: {s_name} {s:,.4g} / {b_name} {b:,.4g} = {r}"


def table(rows: Sequence[Sequence[str]]) -> str:
    """Aligned columns, the first left and the rest right, a rule under the header row."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
