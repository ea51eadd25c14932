"""What every bench needs besides what it measures: the command line, a real sidecar on a fresh
config, the peers, load processes released together, closed-loop asyncio load, latency figures,
ratios against the baseline measured in the same run, and text tables.

A bench starts with

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
    from bench import harness

and ends with `if __name__ == "__main__": harness.main(main)`. Its `main(argv)` builds its options
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
import shlex
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
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


# ------------------------------------------------------------------------------ the command line


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """The bench's parser, described by the first line of its docstring, with `--json`."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc else None)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


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


def oauth_service(service: str, server: str, endpoint: str, token_url: str, client_id: str,
                  secret: str, scope: str, rate: str | None = None) -> str:
    """`[services.<service>]` with a client-credentials login (the client secret from the secret
    `secret`), and a `[[servers]]` entry `server` that uses it."""
    lines = [f"[services.{service}]", f"endpoint = {_toml(endpoint)}"]
    if rate is not None:
        lines.append(f"rate = {_toml(rate)}")
    lines += [f"[services.{service}.oauth]", f"token_url = {_toml(token_url)}",
              f"client_id = {_toml(client_id)}", f"client_secret = {_toml('{{secret:' + secret + '}}')}",
              f"scope = {_toml(scope)}", "",
              "[[servers]]", f"name = {_toml(server)}", f"service = {_toml(service)}"]
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


@contextlib.contextmanager
def sidecar(folder: Path, *blocks: str, env: Mapping[str, str] | None = None,
            settings: str = "") -> Iterator[SidecarProcess]:
    """A real `mcpcreds serve` (this checkout's) on `folder/s.sock`: its config is `[sidecar]` with
    the socket and `settings` (TOML lines), secrets from its environment (`env` added to ours), and
    `blocks` (`static_server`, `oauth_service`). Stopped at the end of the block."""
    from tests.sidecar_proc import run_sidecar

    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    sock = folder / "s.sock"
    config = folder / "config.toml"
    head = f'[sidecar]\nsocket = {_toml(str(sock))}\n{settings}\n\n[secrets]\nsources = ["env"]\n\n'
    config.write_text(head + "\n".join(blocks), encoding="utf-8")
    pythonpath = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    with started(run_sidecar(config, sock, {**(env or {}), "PYTHONPATH": pythonpath}),
                 f"the sidecar ({folder.name})") as proc:
        yield proc


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


@contextlib.contextmanager
def oidc_peer(client_id: str, client_secret: str, scope: str, ttl: int) -> Iterator[OidcPeer]:
    """The oidc-provider peer (Node) with one client-credentials client; tokens live `ttl` s."""
    from tests.peers.oidc_peer import start_oidc_peer

    clients = [{"client_id": client_id, "client_secret": client_secret,
                "token_endpoint_auth_method": "client_secret_basic", "scope": scope}]
    with started(start_oidc_peer(clients, access_token_ttl=ttl), "the oidc peer") as peer:
        yield peer


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

    def _recv(self, pipe: Connection, timeout: float, what: str, expect: str) -> Any:
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

    def run(self, phase: Phase, params: Sequence[Any], *, timeout: float, start_delay: float = 0.0,
            before_release: Callable[[], None] | None = None,
            while_running: Callable[[float], None] | None = None) -> list[Any]:
        """Run `phase` in the first `len(params)` workers, one params each: wait until each is set
        up, call `before_release`, release them together with a start time `start_delay` s ahead,
        call `while_running(start)`, and return their results (each within `timeout` s)."""
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
    ordered = sorted(samples_ns)
    if not ordered:
        raise BenchError(f"{mode}: no request completed in {seconds:.2f} s")
    n = len(ordered)
    return Latency(mode, concurrency, n, round(seconds, 3), round(n / seconds, 1),
                   round(percentile(ordered, 0.50) / 1e6, 4), round(percentile(ordered, 0.99) / 1e6, 4),
                   round(sum(ordered) / n / 1e6, 4), clients)


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


# --------------------------------------------------------------- HTTP/1.1 over a Unix socket


class ResponseError(Exception):
    pass


def request_bytes(method: str, target: str, body: bytes | None = None) -> bytes:
    """One HTTP/1.1 request to the sidecar, as the bytes on the wire (a JSON body if given)."""
    head = f"{method} {target} HTTP/1.1\r\nHost: mcpcreds\r\nAccept: application/json\r\n"
    if body is None:
        return (head + "\r\n").encode()
    return (head + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def parse_response(buf: bytearray | bytes) -> tuple[int, int] | None:
    """`(length, status)` of the first complete response in `buf`, or None if it is incomplete."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = bytes(buf[:head_end]).lower()
    if not head.startswith(b"http/1.1 "):
        raise ResponseError(f"not an HTTP/1.1 response: {bytes(buf[:40])!r}")
    length = 0
    start = head.find(b"\r\ncontent-length:")
    if start >= 0:
        stop = head.find(b"\r\n", start + 2)
        length = int(head[start + 17 : stop if stop >= 0 else None])
    elif b"\r\ntransfer-encoding:" in head:
        raise ResponseError("chunked responses are not supported here")
    total = head_end + 4 + length
    if len(buf) < total:
        return None
    return total, int(head[9:12])


def roundtrip(conn: socket.socket, request: bytes) -> tuple[int, bytes]:
    """Send `request` on a blocking keep-alive connection; `(status, body)` of the answer."""
    conn.sendall(request)
    buf = bytearray()
    while (parsed := parse_response(buf)) is None:
        chunk = conn.recv(65536)
        if not chunk:
            raise ResponseError(f"connection closed after {len(buf)} bytes")
        buf += chunk
    total, code = parsed
    return code, bytes(buf[buf.find(b"\r\n\r\n") + 4 : total])


def http_get(path: str, target: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One GET on a new connection to the Unix socket at `path`: `(status, body)`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        return roundtrip(conn, request_bytes("GET", target))


async def aroundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     request: bytes) -> tuple[int, bytes]:
    """`roundtrip` on an asyncio keep-alive connection."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    parsed = parse_response(head)
    if parsed is None:  # a body follows
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        return int(head[9:12]), await reader.readexactly(length)
    return parsed[1], b""
