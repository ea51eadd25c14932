"""The sidecar's instructions per relayed MCP `tools/call` (callgrind), this checkout against a baseline.

Run from the repository root (valgrind installed; the MCP SDK 2.x of the test extras):

    python bench/relay_instructions.py --baseline-ref cc2ab5c
    python bench/relay_instructions.py --sessions 1,16 --calls 320
    python bench/relay_instructions.py --quick          # a smoke run (no baseline unless asked)
    python bench/relay_instructions.py --event-loop asyncio   # this sidecar on asyncio's own loop
    python bench/relay_instructions.py --host localhost       # the server named by a host name
    python bench/relay_instructions.py --audit                # with the audit log on

CPU time per call moves with whatever else the machine runs (other processes, their caches, the
clock); the instructions a process executes do not. The real sidecar (`mcpcreds serve`, one static
server, `trust = "trusted"`) runs under `valgrind --tool=callgrind` with counting off; the MCP SDK
2.x client of `gateway_bench.py` opens its sessions through the gateway to the peer of the tests
and calls `add` a few times, then counting is switched on (`callgrind_control -i on`) for
`--calls` calls spread over the sessions, and the count is read back: user-space instructions
(`Ir`) of the sidecar per call, the kernel's work in its system calls not included (see
`gateway_bench.py` for CPU time).

With `--host NAME`, the server's endpoint names the peer by that host name (it must resolve to
127.0.0.1, as `localhost` does) instead of the address: what the name's lookups cost.

With `--audit`, every sidecar measured writes its audit log (`audit_log`, a line per `tools/call`).

With `--baseline-ref REF`, the same is measured for the sidecar of `git archive REF` (this checkout's
client, peer and bench), in the same run.
"""

from __future__ import annotations

import asyncio
import glob
import shutil
import subprocess
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench and tests

from tests.peers.mcp_gateway_peer import GatewayPeer, start_gateway_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar

from bench import gateway_bench, harness  # before mcpcreds: it puts this checkout's src/ on the path
from mcpcreds import AsyncClient


async def count(sidecar: SidecarProcess, peer: GatewayPeer, sessions: int, calls: int, out: Path) -> float:
    """Instructions of the sidecar per `tools/call` over `calls` calls from `sessions` sessions."""
    asyncio.get_running_loop().set_exception_handler(gateway_bench.client_errors)
    pid = str(sidecar.proc.pid)
    per_session = max(1, calls // sessions)
    async with AsyncClient(sidecar.socket, timeout=600) as creds, AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(gateway_bench.session(creds, peer.url, "gateway"))
                   for _ in range(sessions)]
        for _ in range(3):  # warm-up: the first calls import and cache what later ones reuse
            await asyncio.gather(*(c.call_tool("add", {"a": 1, "b": 2}) for c in clients))

        async def work(client: Any) -> None:
            for _ in range(per_session):
                await client.call_tool("add", {"a": 1, "b": 2})

        control("-i", "on", pid)
        await asyncio.gather(*(work(c) for c in clients))
        control("-d", pid)
        control("-i", "off", pid)
    total = 0
    for dump in glob.glob(str(out / "callgrind.*")):
        for line in Path(dump).read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    if not total:
        raise harness.BenchError(f"no callgrind count in {out}")
    return total / (per_session * sessions)


def control(*argv: str) -> None:
    done = subprocess.run(["callgrind_control", *argv], capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise harness.BenchError(f"callgrind_control {' '.join(argv)}: {done.stderr.strip()[:200]}")


def measure(tree: Path, peer: GatewayPeer, sessions: int, calls: int, folder: Path,
            setting: str = "", host: str | None = None, audit: bool = False) -> float:
    folder.mkdir(mode=0o700)
    sock, config = folder / "s.sock", folder / "config.toml"
    if audit:
        setting += f'\naudit_log = "{folder}/audit.log"'
    config.write_text(f'[sidecar]\nsocket = "{sock}"\n{setting}\n\n[secrets]\nsources = ["env"]\n\n'
                      + server_block(peer, host), encoding="utf-8")
    wrapper = ("valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={folder}/callgrind.%p")
    env = {"BENCH_KEY": gateway_bench.KEY, "PYTHONPATH": str(tree / "src")}
    with harness.started(run_sidecar(config, sock, env, wrapper), f"the sidecar under callgrind ({tree})") \
            as sidecar:
        return asyncio.run(count(sidecar, peer, sessions, calls, folder))


def server_block(peer: GatewayPeer, host: str | None) -> str:
    block = gateway_bench.server_block(peer)
    if host is None:
        return block
    address = "http://127.0.0.1:"
    if address not in block:
        raise harness.BenchError(f"the peer is not on {address}")
    return block.replace(address, f"http://{host}:")


def baseline_tree(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(harness.ROOT), "archive", ref], capture_output=True,
                             timeout=120)
    if archive.returncode:
        why = archive.stderr.decode(errors="replace").strip()[:200]
        raise harness.BenchError(f"git archive {ref}: {why}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True, timeout=120)
    return into


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--calls", type=harness.count, default=200, help="calls counted per measure (default 200)")
    p.add_argument("--sessions", type=harness.levels, default=[1, 16], help="sessions calling at once (1,16)")
    p.add_argument("--baseline-ref", help="a git ref whose sidecar is measured too, in the same run")
    p.add_argument("--host", type=harness.host_name, help="name the peer by this host name (127.0.0.1)")
    p.add_argument("--audit", action="store_true", help="the sidecars write their audit log")
    harness.event_loop_option(p)
    args = harness.parse(p, argv, quick={"calls": 16, "sessions": [1]})
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise harness.BenchError(f"{tool} not found: install valgrind")
    rows: dict[str, dict[str, float]] = {}
    with harness.workdir("relayir") as tmp, \
            harness.started(start_gateway_peer("unused-", gateway_bench.KEY), "the MCP peer") as peer:
        trees = {"this": harness.ROOT}
        if args.baseline_ref:
            trees[args.baseline_ref] = baseline_tree(args.baseline_ref, Path(tempfile.mkdtemp(dir=tmp)))
        for name, tree in trees.items():
            for sessions in args.sessions:
                harness.progress(f"{name}: {sessions} session(s)")
                rows.setdefault(name, {})[str(sessions)] = measure(
                    tree, peer, sessions, args.calls, tmp / f"{len(rows)}-{sessions}",
                    harness.loop_setting(args) if name == "this" else "", args.host, args.audit)

    def render(report: dict[str, dict[str, float]]) -> str:
        header = ["sidecar", *(f"{s} session(s): M instr/call" for s in args.sessions)]
        lines = [harness.table([header, *([name, *(f"{v[str(s)] / 1e6:.3f}" for s in args.sessions)]
                                          for name, v in report.items())])]
        if args.baseline_ref:
            for s in args.sessions:
                lines.append(harness.ratio_line(f"M instructions per call at {s} session(s)",
                                                ("this", report["this"][str(s)] / 1e6),
                                                (args.baseline_ref, report[args.baseline_ref][str(s)] / 1e6)))
        return "\n".join(lines)

    harness.emit(args, rows, render)
    return 0


if __name__ == "__main__":
    harness.main(main)
