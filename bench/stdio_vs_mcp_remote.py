"""`mcpcreds stdio URL` against `npx mcp-remote URL`: first call, logins, tokens, throughput.

Run from the repository root (the package installed, with the test extras: the MCP SDK 2.x; Node
with npm, which installs mcp-remote into bench/peers from its lockfile on first use):

    python bench/stdio_vs_mcp_remote.py                # about three minutes
    python bench/stdio_vs_mcp_remote.py --rounds 10
    python bench/stdio_vs_mcp_remote.py --json
    python bench/stdio_vs_mcp_remote.py --quick        # a smoke run
    python bench/stdio_vs_mcp_remote.py --parts throughput --tp-rounds 5   # (d) only, 5 rounds

Both are launched as a desktop client launches a stdio server: by the MCP SDK's stdio client,
with its reduced environment, a HOME of their own (fresh for each round) and a runtime folder;
`mcpcreds stdio URL` as `python -m mcpcreds stdio URL`, mcp-remote as the `mcp-remote` it installs
(`node .../proxy.js URL`: `npx mcp-remote` adds npx's own start to every launch).

(a) First tool result, no authorization: the time from starting the process to the result of
    a `tools/call` (`add`), through initialize and `tools/list`, against a real MCP SDK server on
    loopback (tests/peers/mcp_untrusted_peer.py). `cold`: the first launch in a fresh HOME
    (mcpcreds writes the config and starts its sidecar; mcp-remote has no state yet); `warm`:
    the next launch there (mcpcreds' sidecar is running). p50 of `--rounds`, in turns.
(b) A server that asks for a login: a real MCP SDK server that takes only the real
    oidc-provider's JWTs for its own URL and names it in its protected-resource metadata; three
    clients started at once in a fresh HOME, the browser step done by a 'browser' named in
    $BROWSER (tests/peers/browser.py: the sign-in and consent pages over HTTP). Logins at the
    IdP (authorization code grants), browsers opened, and the time until all three had a result.
(c) Where the tokens end up after (b): every file under HOME that holds the access or refresh
    token, its mode and whether the token is in plain text; mcpcreds' keyring entry.
(d) Throughput, no authorization: `--sessions` stdio sessions of each (16, then 1; mcpcreds'
    sidecar already running), each calling `tools/call` (`add`) in a loop for `--seconds`
    against the server of (a), the two taking turns over `--tp-rounds` rounds. Per round: calls/s,
    p50, and CPU per call (utime + stime from /proc, the processes' reaped children included) of
    everything each side runs (mcpcreds: its bridge processes and the sidecar; mcp-remote: its
    node processes), the server's CPU per call, and this process's (the SDK clients); min, median
    and max over the rounds, and the ratios of each round.

`--parts` picks what runs (`first,logins,throughput`, all by default).

Client, sidecars, servers and the IdP share the machine's cores: compare figures of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench and tests

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from tests.peers import browser
from tests.peers.mcp_server import start_mcp_server
from tests.peers.mcp_untrusted_peer import start_untrusted_peer
from tests.peers.oidc_peer import OidcPeer, start_oidc_peer

from bench import harness  # before mcpcreds: it puts this checkout's src/ on the path

PEERS = Path(__file__).resolve().parent / "peers"
MCP_REMOTE = PEERS / "node_modules" / "mcp-remote" / "dist" / "proxy.js"
NODE = shutil.which("node") or "/usr/bin/node"
SCOPE = "tools:call"
SESSION_TIMEOUT = 180.0
TOOLS = ("mcpcreds", "mcp-remote")
LABELS = {"mcpcreds": "mcpcreds stdio URL", "mcp-remote": "mcp-remote URL"}
PARTS = ("first", "logins", "throughput")


def ensure_mcp_remote() -> None:
    """mcp-remote installed into bench/peers from its lockfile (`npm ci`), once."""
    if MCP_REMOTE.exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise harness.BenchError("npm not found: it installs mcp-remote into bench/peers")
    harness.progress("installing mcp-remote into bench/peers (npm ci) ...")
    try:
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=PEERS, check=True,
                       timeout=300)
    except (subprocess.SubprocessError, OSError) as exc:
        raise harness.BenchError(f"npm ci in bench/peers failed: {harness.describe(exc)}") from None


# ---------------------------------------------------------------------------- a desktop's launches


@dataclass
class Home:
    """A user of a desktop client: its HOME and runtime folder, and what its config adds to the
    SDK's reduced environment."""

    top: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.top / "home"

    @property
    def socket(self) -> Path:
        return self.top / "run" / "mcpcreds" / "mcpcreds.sock"

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "XDG_RUNTIME_DIR": str(self.top / "run"),
                "PYTHONPATH": harness.pythonpath(), **self.extra}

    def command(self, tool: str, url: str) -> tuple[str, list[str]]:
        if tool == "mcpcreds":
            return sys.executable, ["-m", "mcpcreds", "stdio", url]
        return NODE, [str(MCP_REMOTE), url]


@contextlib.contextmanager
def fresh_home(**extra: str) -> Iterator[Home]:
    """A new user (short paths: a socket path has at most 107 bytes); a sidecar started for it is
    stopped at the end."""
    top = Path(tempfile.mkdtemp(prefix="mcpc-b-"))
    (top / "home").mkdir()
    (top / "run").mkdir(mode=0o700)
    user = Home(top, dict(extra))
    try:
        yield user
    finally:
        stop_sidecar(user.socket)
        shutil.rmtree(top, ignore_errors=True)


def sidecar_pid(path: Path) -> int | None:
    """The pid of the sidecar listening on `path` (by SO_PEERCRED), if one is."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return None
        pid: int = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        return pid


def stop_sidecar(path: Path) -> None:
    """Stop the detached sidecar listening on `path`, if any."""
    pid = sidecar_pid(path)
    if pid is None:
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        os.kill(pid, signal.SIGTERM)
        import select

        if not select.select([fd], [], [], 15)[0]:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


async def first_result(tool: str, url: str, user: Home, name: str, call: str = "add",
                       arguments: dict[str, Any] | None = None) -> float:
    """Seconds from starting the process to the result of its first `tools/call`."""
    command, args = user.command(tool, url)
    params = StdioServerParameters(command=command, args=args, env=user.env, cwd=str(user.home))
    errors = user.top / f"stderr-{tool}-{name}"
    with errors.open("w+") as errlog:
        started = time.perf_counter()
        try:
            async with (stdio_client(params, errlog=errlog) as (read, write),
                        ClientSession(read, write) as session):
                await session.initialize()
                await session.list_tools()
                result = await session.call_tool(call, arguments or {"a": 2, "b": 3})
                took = time.perf_counter() - started
        except Exception as exc:
            errlog.seek(0)
            raise harness.BenchError(f"{LABELS[tool]} ({name}) failed: {harness.describe(exc)}; its stderr: "
                                     f"{errlog.read()[-1500:]}") from None
    if result.is_error:
        raise harness.BenchError(f"{LABELS[tool]} ({name}): the tool call failed: {result.content}")
    return took


# ---------------------------------------------------------------------------- (a) first call


async def first_calls(url: str, rounds: int) -> dict[str, dict[str, list[float]]]:
    times: dict[str, dict[str, list[float]]] = {t: {"cold": [], "warm": []} for t in TOOLS}
    for n in range(rounds):
        for tool in (TOOLS if n % 2 == 0 else TOOLS[::-1]):
            with fresh_home() as user:
                times[tool]["cold"].append(await first_result(tool, url, user, f"cold{n}"))
                times[tool]["warm"].append(await first_result(tool, url, user, f"warm{n}"))
    return times


# ---------------------------------------------------------------------------- (b), (c) logins


@dataclass
class Logins:
    tool: str
    answered: int  # of the clients started at once
    logins: int  # authorization code grants at the IdP
    browsers: int  # times a browser was opened
    seconds: float  # until all of them had a result
    error: str = ""
    token_files: list[dict[str, Any]] = field(default_factory=list)  # files under HOME holding a token
    keyring: str = ""  # mcpcreds: the keyring entry holding the login


def token_files(home: Path, tokens: set[str]) -> list[dict[str, Any]]:
    """Every file under `home` in which one of `tokens` is written in plain text."""
    found = []
    for path in sorted(p for p in home.rglob("*") if p.is_file() and not p.is_symlink()):
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            held = [t for t in tokens if t.encode() in data]
            if held:
                mode = f"{stat.S_IMODE(path.stat().st_mode):04o}"
                found.append({"path": "~/" + str(path.relative_to(home)), "mode": mode, "plaintext": True,
                              "tokens": len(held)})
    return found


def mcp_remote_tokens(home: Path) -> set[str]:
    """The tokens mcp-remote stored (its *_tokens.json under ~/.mcp-auth)."""
    tokens: set[str] = set()
    for path in home.glob(".mcp-auth/*/*_tokens.json"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            tokens.update(v for k, v in data.items()
                          if k in ("access_token", "refresh_token") and isinstance(v, str))
    return tokens


async def logins(tool: str, idp: OidcPeer, url: str, clients: int, keyring_env: dict[str, str]) -> Logins:
    import keyring

    idp.reset_stats()
    with fresh_home(**keyring_env) as user:
        opened = user.top / "browser.log"
        user.extra["BROWSER"] = str(browser.script(user.top, opened))
        started = time.perf_counter()
        results = await asyncio.gather(
            *(asyncio.wait_for(first_result(tool, url, user, f"login{i}", "echo", {"text": "hi"}),
                               SESSION_TIMEOUT) for i in range(clients)), return_exceptions=True)
        seconds = time.perf_counter() - started
        failed = [r for r in results if isinstance(r, BaseException)]
        grants = int(idp.stats().get("by_grant", {}).get("authorization_code", 0))
        report = Logins(tool, clients - len(failed), grants, len(browser.opened(opened)), round(seconds, 3),
                        harness.describe(failed[0])[:600] if failed else "")
        if tool == "mcpcreds":
            config = (user.home / ".config" / "mcpcreds" / "config.toml").read_text()
            name = next(line.split('"')[1] for line in config.splitlines() if line.startswith("name = "))
            entry = f"login.mcp.{name}"
            stored = keyring.get_password("mcpcreds", entry)
            tokens = {json.loads(stored)["refresh_token"]} if stored else set()
            report.keyring = f"{entry} (service mcpcreds, SecretService)" if stored else ""
        else:
            tokens = mcp_remote_tokens(user.home)
        report.token_files = token_files(user.home, tokens)
        if tool == "mcp-remote" and tokens and not report.token_files:
            report.error = report.error or "tokens were found but no file holds them"
    return report


@contextlib.contextmanager
def auth_peers(workdir: Path) -> Iterator[tuple[OidcPeer, str, dict[str, str]]]:
    """The IdP, the MCP server that takes its JWTs, and a private keyring (for mcpcreds' logins)."""
    from tests.conftest import private_keyring

    clients = [{"client_id": "bench-scope", "token_endpoint_auth_method": "none",
                "grant_types": ["authorization_code"], "redirect_uris": ["http://127.0.0.1/callback"],
                "scope": SCOPE}]  # declares the scope: the peer's scopes are its clients'
    with (harness.started(start_oidc_peer(clients, access_token_ttl=3600), "the oidc peer") as idp,
          harness.started(start_mcp_server(idp.issuer, idp.jwks_uri, scopes=(SCOPE,)),
                          "the MCP server") as server,
          harness.started(private_keyring(workdir), "gnome-keyring") as keyring_session):
        old = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
        os.environ["DBUS_SESSION_BUS_ADDRESS"] = keyring_session.bus_address  # this process reads it too
        try:
            yield idp, server.url, {"DBUS_SESSION_BUS_ADDRESS": keyring_session.bus_address}
        finally:
            if old is None:
                os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
            else:
                os.environ["DBUS_SESSION_BUS_ADDRESS"] = old


# ---------------------------------------------------------------------------- (d) throughput


def descendants(pid: int) -> set[int]:
    """The processes below `pid`, from /proc's parent links."""
    below: dict[int, list[int]] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            below.setdefault(int(stat_file.read_text().rsplit(")", 1)[1].split()[1]), []).append(
                int(stat_file.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in below.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def server_pid() -> int:
    """The MCP server of (a), a child of this process."""
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            if b"tests.peers.mcp_untrusted_peer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise harness.BenchError("the MCP server's process was not found")


@dataclass
class Throughput:
    """One side's sessions in one round."""

    tool: str
    sessions: int
    round: int
    calls: int
    seconds: float
    calls_per_s: float
    p50_ms: float
    cpu_ms_per_call: float  # all the side's processes
    sidecar_ms_per_call: float  # mcpcreds: the sidecar's share of it
    bridges: int  # processes of the side besides a sidecar
    server_ms_per_call: float  # the upstream MCP server's
    client_ms_per_call: float  # this process's: the SDK clients


@contextlib.asynccontextmanager
async def open_sessions(tool: str, url: str, user: Home, sessions: int) -> AsyncIterator[list[ClientSession]]:
    """`sessions` stdio sessions of `tool`, initialized, as a desktop client launches them."""
    command, args = user.command(tool, url)
    params = StdioServerParameters(command=command, args=args, env=user.env, cwd=str(user.home))
    async with AsyncExitStack() as stack:
        errlog = stack.enter_context((user.top / f"stderr-{tool}-tp").open("a"))

        async def one() -> ClientSession:
            read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            return session

        opened = [await one() for _ in range(sessions)]  # one at a time: the stack is entered in order
        yield opened


async def call_loop(session: ClientSession, until: float, samples: list[int]) -> None:
    while time.perf_counter() < until:
        started = time.perf_counter_ns()
        result = await session.call_tool("add", {"a": 2, "b": 3})
        samples.append(time.perf_counter_ns() - started)
        if result.is_error:
            raise harness.BenchError(f"the tool call failed: {result.content}")


async def throughput(tool: str, url: str, user: Home, sessions: int, seconds: float, round_: int,
                     server: int) -> Throughput:
    async with open_sessions(tool, url, user, sessions) as opened:
        warm: list[int] = []
        await asyncio.gather(*(call_loop(s, time.perf_counter() + 0.3, warm) for s in opened))
        sidecar = sidecar_pid(user.socket) if tool == "mcpcreds" else None
        side = descendants(os.getpid()) - descendants(server) - {server, sidecar or 0}
        watched = [*side, *([sidecar] if sidecar else []), server]
        before = {pid: harness.cpu_seconds(pid, children=True, gone=0.0) for pid in watched}
        own = time.process_time()
        samples: list[int] = []
        started = time.perf_counter()
        await asyncio.gather(*(call_loop(s, started + seconds, samples) for s in opened))
        took = time.perf_counter() - started
        spent = {pid: harness.cpu_seconds(pid, children=True, gone=0.0) - before[pid] for pid in watched}
        own = time.process_time() - own
    calls = len(samples)
    if not calls:
        raise harness.BenchError(f"{LABELS[tool]}: no call completed in {seconds} s")

    def per_call(cpu: float) -> float:
        return round(cpu / calls * 1000, 3)

    side_cpu = sum(spent[pid] for pid in side) + (spent[sidecar] if sidecar else 0.0)
    return Throughput(tool, sessions, round_, calls, round(took, 3), round(calls / took, 1),
                      round(harness.percentile(sorted(samples), 0.5) / 1e6, 2), per_call(side_cpu),
                      per_call(spent[sidecar]) if sidecar else 0.0, len(side), per_call(spent[server]),
                      per_call(own))


async def throughputs(url: str, levels: list[int], seconds: float, rounds: int) -> list[Throughput]:
    results: list[Throughput] = []
    with fresh_home() as mcpcreds_user, fresh_home() as remote_user:
        users = {"mcpcreds": mcpcreds_user, "mcp-remote": remote_user}
        for tool in TOOLS:  # mcpcreds' sidecar started and its config written: both warm
            await first_result(tool, url, users[tool], "tp-warm")
        server = server_pid()
        for n in range(rounds):
            for sessions in levels:
                for tool in (TOOLS if n % 2 == 0 else TOOLS[::-1]):
                    harness.progress(f"(d) round {n + 1}/{rounds}: {sessions} sessions of {LABELS[tool]} ...")
                    results.append(await throughput(tool, url, users[tool], sessions, seconds, n, server))
    return results


def spread(values: list[float]) -> str:
    """min/median/max."""
    return f"{min(values):.3g}/{statistics.median(values):.3g}/{max(values):.3g}"


def render_throughput(report: dict[str, Any]) -> list[str]:
    results = [Throughput(**r) for r in report["throughput"]]
    out = [f"(d) throughput, no authorization: stdio sessions each calling tools/call for "
           f"{report['seconds']} s, {report['tp_rounds']} rounds in turns; min/median/max over the rounds"]
    for sessions in report["sessions"]:
        of = {t: [r for r in results if r.sessions == sessions and r.tool == t] for t in TOOLS}
        rows = [["", "calls/s", "p50 ms", "CPU ms/call", "of it sidecar", "server ms/call", "client ms/call"]]
        for tool in TOOLS:
            rs = of[tool]
            rows.append([LABELS[tool], spread([r.calls_per_s for r in rs]), spread([r.p50_ms for r in rs]),
                         spread([r.cpu_ms_per_call for r in rs]),
                         spread([r.sidecar_ms_per_call for r in rs]) if tool == "mcpcreds" else "-",
                         spread([r.server_ms_per_call for r in rs]),
                         spread([r.client_ms_per_call for r in rs])])
        label = f"{sessions} session{'s' if sessions > 1 else ''}"
        out += ["", label, harness.table(rows)]
        for what, key in (("calls/s", "calls_per_s"), ("p50 ms", "p50_ms"),
                          ("CPU ms per call", "cpu_ms_per_call")):
            mine = [getattr(r, key) for r in of["mcpcreds"]]
            theirs = [getattr(r, key) for r in of["mcp-remote"]]
            each = [a / b for a, b in zip(mine, theirs, strict=True) if b]
            line = harness.ratio_line(f"{what}, {label}, median of rounds",
                                      (LABELS["mcpcreds"], statistics.median(mine)),
                                      (LABELS["mcp-remote"], statistics.median(theirs)))
            out.append(f"{line} (each round: {spread(each)})" if each else line)
    return out


# ---------------------------------------------------------------------------- the run


def p50(values: list[float]) -> float:
    return round(harness.percentile(sorted(values), 0.5) * 1000, 1)


def render(report: dict[str, Any]) -> str:
    out: list[str] = []
    if "first_call" in report:
        out += render_first(report)
    if "logins" in report:
        out += render_logins(report)
    if "throughput" in report:
        out += render_throughput(report)
    return "\n".join(out).strip("\n")


def render_first(report: dict[str, Any]) -> list[str]:
    first = report["first_call"]

    def ratio(kind: str) -> str:
        return harness.ratio_line(f"first tool result, {kind}, p50 ms",
                                  (LABELS["mcpcreds"], first["mcpcreds"][f"{kind}_p50_ms"]),
                                  (LABELS["mcp-remote"], first["mcp-remote"][f"{kind}_p50_ms"]))

    out = [f"(a) first tool result after the process starts, no authorization: p50 of {report['rounds']} "
           "rounds, ms",
           harness.table([["", "cold (fresh HOME)", "warm"],
                          *[[LABELS[t], f"{first[t]['cold_p50_ms']:.1f}", f"{first[t]['warm_p50_ms']:.1f}"]
                            for t in TOOLS]]),
           ratio("warm"), ratio("cold"), ""]
    return out


def render_logins(report: dict[str, Any]) -> list[str]:
    rows = [["", "answered", "logins at the IdP", "browsers opened", "all answered, s"]]
    for r in report["logins"]:
        rows.append([LABELS[r["tool"]], f"{r['answered']}/{report['clients']}", str(r["logins"]),
                     str(r["browsers"]), f"{r['seconds']:.2f}"])
    out = [f"(b) {report['clients']} clients started at once, a server that asks for a login",
           harness.table(rows)]
    out += [f"  {LABELS[r['tool']]}: {r['error']}" for r in report["logins"] if r["error"]]
    out += ["", "(c) where the tokens are after (b)"]
    for r in report["logins"]:
        files = "; ".join(f"{f['path']} (mode {f['mode']}, plain text)" for f in r["token_files"]) or "none"
        where = f"keyring entry {r['keyring']}; " if r["keyring"] else ""
        out.append(f"  {LABELS[r['tool']]}: {where}files under HOME holding a token: {files}")
    return [*out, ""]


def parts(text: str) -> list[str]:
    """`--parts`: comma-separated names of PARTS."""
    chosen = [p.strip() for p in text.split(",") if p.strip()]
    if not chosen or set(chosen) - set(PARTS):
        raise argparse.ArgumentTypeError(f"not comma-separated parts of {','.join(PARTS)}: {text!r}")
    return chosen


def main(argv: list[str] | None) -> int:
    parser = harness.arguments(__doc__)
    parser.add_argument("--rounds", type=harness.count, default=5, help="launches of each kind (default 5)")
    parser.add_argument("--clients", type=harness.count, default=3, help="clients started at once in (b)")
    parser.add_argument("--sessions", type=harness.levels, default=[16, 1],
                        help="sessions of each side in (d), one figure per level (default 16,1)")
    parser.add_argument("--seconds", type=harness.positive, default=5.0, help="calls per round in (d), s")
    parser.add_argument("--tp-rounds", type=harness.count, default=3, help="rounds of (d) (default 3)")
    parser.add_argument("--parts", type=parts, default=list(PARTS), help="what runs: first,logins,throughput")
    args: argparse.Namespace = harness.parse(parser, argv, quick={"rounds": 1, "sessions": [2], "seconds": 1,
                                                                  "tp_rounds": 1})
    ensure_mcp_remote()
    report: dict[str, Any] = {"machine": harness.machine(), "rounds": args.rounds, "clients": args.clients,
                              "sessions": args.sessions, "seconds": args.seconds, "tp_rounds": args.tp_rounds}
    with harness.started(start_untrusted_peer(), "the MCP server (no authorization)") as open_server:
        if "first" in args.parts:
            harness.progress("(a) first calls ...")
            times = asyncio.run(first_calls(open_server.url, args.rounds))
            report["first_call"] = {
                t: {"cold_p50_ms": p50(times[t]["cold"]), "warm_p50_ms": p50(times[t]["warm"]),
                    "cold_ms": [round(v * 1000, 1) for v in times[t]["cold"]],
                    "warm_ms": [round(v * 1000, 1) for v in times[t]["warm"]]} for t in TOOLS}
        if "throughput" in args.parts:
            report["throughput"] = [vars(r) for r in asyncio.run(
                throughputs(open_server.url, args.sessions, args.seconds, args.tp_rounds))]
    if "logins" in args.parts:
        with harness.workdir("stdio-vs-remote") as workdir, auth_peers(workdir) as (idp, url, keyring_env):
            harness.progress("(b) logins ...")
            report["logins"] = [vars(asyncio.run(logins(t, idp, url, args.clients, keyring_env)))
                                for t in TOOLS]
    harness.emit(args, report, render)
    return 0


if __name__ == "__main__":
    harness.main(main)
