"""`mcpcreds stdio URL` against `npx mcp-remote URL`: first call, logins, where the tokens end up.

Run from the repository root (the package installed, with the test extras: the MCP SDK 2.x; Node
with npm, which installs mcp-remote into bench/peers from its lockfile on first use):

    python bench/stdio_vs_mcp_remote.py                # about a minute
    python bench/stdio_vs_mcp_remote.py --rounds 10
    python bench/stdio_vs_mcp_remote.py --json
    python bench/stdio_vs_mcp_remote.py --quick        # a smoke run

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
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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


def stop_sidecar(path: Path) -> None:
    """Stop the detached sidecar listening on `path` (found by SO_PEERCRED), if any."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
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


# ---------------------------------------------------------------------------- the run


def p50(values: list[float]) -> float:
    return round(harness.percentile(sorted(values), 0.5) * 1000, 1)


def render(report: dict[str, Any]) -> str:
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
    rows = [["", "answered", "logins at the IdP", "browsers opened", "all answered, s"]]
    for r in report["logins"]:
        rows.append([LABELS[r["tool"]], f"{r['answered']}/{report['clients']}", str(r["logins"]),
                     str(r["browsers"]), f"{r['seconds']:.2f}"])
    out += [f"(b) {report['clients']} clients started at once, a server that asks for a login",
            harness.table(rows)]
    out += [f"  {LABELS[r['tool']]}: {r['error']}" for r in report["logins"] if r["error"]]
    out += ["", "(c) where the tokens are after (b)"]
    for r in report["logins"]:
        files = "; ".join(f"{f['path']} (mode {f['mode']}, plain text)" for f in r["token_files"]) or "none"
        where = f"keyring entry {r['keyring']}; " if r["keyring"] else ""
        out.append(f"  {LABELS[r['tool']]}: {where}files under HOME holding a token: {files}")
    return "\n".join(out)


def main(argv: list[str] | None) -> int:
    parser = harness.arguments(__doc__)
    parser.add_argument("--rounds", type=harness.count, default=5, help="launches of each kind (default 5)")
    parser.add_argument("--clients", type=harness.count, default=3, help="clients started at once in (b)")
    args: argparse.Namespace = harness.parse(parser, argv, quick={"rounds": 1})
    ensure_mcp_remote()
    report: dict[str, Any] = {"machine": harness.machine(), "rounds": args.rounds, "clients": args.clients}
    with harness.started(start_untrusted_peer(), "the MCP server (no authorization)") as open_server:
        harness.progress("(a) first calls ...")
        times = asyncio.run(first_calls(open_server.url, args.rounds))
    report["first_call"] = {t: {"cold_p50_ms": p50(times[t]["cold"]), "warm_p50_ms": p50(times[t]["warm"]),
                                "cold_ms": [round(v * 1000, 1) for v in times[t]["cold"]],
                                "warm_ms": [round(v * 1000, 1) for v in times[t]["warm"]]} for t in TOOLS}
    with harness.workdir("stdio-vs-remote") as workdir, auth_peers(workdir) as (idp, url, keyring_env):
        harness.progress("(b) logins ...")
        report["logins"] = [vars(asyncio.run(logins(t, idp, url, args.clients, keyring_env))) for t in TOOLS]
    harness.emit(args, report, render)
    return 0


if __name__ == "__main__":
    harness.main(main)
