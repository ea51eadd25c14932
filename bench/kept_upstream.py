"""Tool calls through the gateway to the MCP SDK's own server, on a kept upstream connection,
against the direct call: the gateway's latency on the server most users run.

Run from the repository root (Node for the authorization server peer; the MCP SDK 2.x installed):

    python bench/kept_upstream.py                          # 3 rounds of 200 calls per way
    python bench/kept_upstream.py --baseline-ref 533e7b9   # and the sidecar of that commit, in turn
    python bench/kept_upstream.py --quick                  # a smoke run

Peers on loopback: an authorization server (oidc-provider, `tests/peers/oidc_peer.py`) and the
MCP server of the tests (`tests/peers/mcp_server.py`: the MCP Python SDK 2.x under uvicorn, run on
asyncio's own event loop as the SDK's examples run it; it answers a call as an SSE stream and
verifies RFC 9068 JWTs). A fresh sidecar of this checkout logs in with client credentials; its
server `bench` has `trust = "trusted"` and no rate, so no call waits for a permit.

The ways, in turn in each round, each one SDK session (`gateway_bench.session`) making 5
warm-up calls and then `--calls` sequential `add` calls, each timed:

- `gateway`: the SDK client through `creds.mcp_httpx2_client("bench")` to `creds.mcp_url("bench")`;
  the sidecar keeps its connection to the server from call to call;
- `baseline` (with `--baseline-ref REF`): the same through the sidecar of `git archive REF`,
  on a socket of its own, logged in the same way;
- `direct`: the SDK client to the server's URL with `auth=creds.auth("bench")` (this sidecar). The
  SDK 2.x client closes each SSE answer before its last chunk, so it opens a new connection to the
  server for nearly every call.

Printed: per way and round, the p50 and p90 of a call (ms); then the median of the rounds' p50s
per way, and the ratios gateway / direct and gateway / baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import gateway_bench, harness
from bench.harness import BenchError
from bench.relay_instructions import baseline_tree

SERVER = gateway_bench.SERVER  # the server's name in the sidecar: gateway_bench's sessions call it
CLIENT_ID = "agent"
CLIENT_SECRET = "bench-secret-4e1d7c9a2b6f4a3e9d8c7b6a5f4e3d2c"
SCOPE = "tools:read tools:call"
WARM_UP = 5


async def timed_calls(way: str, socket: Path, url: str, calls: int) -> list[float]:
    """Seconds per `add` call, after WARM_UP calls, in one session (`url`: the server's, for "direct")."""
    from mcpcreds import AsyncClient

    took = []
    async with AsyncClient(socket) as creds, gateway_bench.session(creds, url, way) as client:
        for n in range(WARM_UP + calls):
            started = time.perf_counter()
            result = await client.call_tool("add", {"a": n, "b": 1})
            if result.is_error or (result.structured_content or {}).get("result") != n + 1:
                raise BenchError(f"{way}: add({n}, 1) answered {result!r}")
            if n >= WARM_UP:
                took.append(time.perf_counter() - started)
    return took


@contextlib.contextmanager
def sidecars(tmp: Path, oidc: Any, mcp: Any, ref: str | None) -> Iterator[dict[str, Path]]:
    """The socket of each way's sidecar: this checkout's ("gateway", "direct"), and REF's."""
    def one(folder: str, src: Path = harness.SRC) -> contextlib.AbstractContextManager[Any]:
        return harness.oauth_sidecar(tmp / folder, service="mcp", server=SERVER, endpoint=mcp.url,
                                     token_url=oidc.token_url, client_id=CLIENT_ID,
                                     client_secret=CLIENT_SECRET, scope=SCOPE,
                                     server_lines='trust = "trusted"', src=src)

    with contextlib.ExitStack() as stack:
        ours = stack.enter_context(one("this")).socket
        sockets = {"gateway": ours, "direct": ours}
        if ref is not None:
            tree = baseline_tree(ref, Path(tempfile.mkdtemp(dir=tmp)))
            sockets["baseline"] = stack.enter_context(one("baseline", tree / "src")).socket
        yield sockets


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--calls", type=harness.count, default=200,
                   help="timed calls per way per round (default 200)")
    p.add_argument("--rounds", type=harness.count, default=3, help="rounds, the ways in turn (default 3)")
    p.add_argument("--baseline-ref", help="a git ref whose sidecar is a third way, in the same rounds")
    args = harness.parse(p, argv, quick={"calls": 10, "rounds": 1})
    from tests.peers.mcp_server import start_mcp_server

    report: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "quick")},
                              "rounds": []}
    with harness.workdir("kept-upstream") as tmp, \
            harness.oidc_peer(CLIENT_ID, CLIENT_SECRET, SCOPE, 3600) as oidc, \
            harness.started(start_mcp_server(oidc.issuer, oidc.jwks_uri), "the MCP server peer") as mcp, \
            sidecars(tmp, oidc, mcp, args.baseline_ref) as sockets:
        ways = [w for w in ("gateway", "baseline", "direct") if w in sockets]
        for round_ in range(args.rounds):
            figures = {}
            for way in ways:
                harness.progress(f"round {round_ + 1}: {way} ...")
                took = sorted(asyncio.run(timed_calls(way, sockets[way], mcp.url, args.calls)))
                figures[way] = {"p50_ms": _ms(statistics.median(took)),
                                "p90_ms": _ms(harness.percentile(took, 0.9))}
            report["rounds"].append(figures)
    report["p50_ms"] = {way: statistics.median(r[way]["p50_ms"] for r in report["rounds"]) for way in ways}
    harness.emit(args, report, render)
    return 0


def render(report: dict[str, Any]) -> str:
    ways = list(report["p50_ms"])
    calls = report["config"]["calls"]
    header = f"{'round':<6}" + "".join(f"{way + ' p50':>16}{way + ' p90':>16}" for way in ways)
    lines = [f"{calls} sequential `add` calls per way and round, one SDK session each; ms", "", header]
    for i, figures in enumerate(report["rounds"], 1):
        lines.append(f"{i:<6}" + "".join(f"{figures[w]['p50_ms']:>16.2f}{figures[w]['p90_ms']:>16.2f}"
                                         for w in ways))
    p50 = report["p50_ms"]
    lines += ["", "medians of the rounds' p50: " + ", ".join(f"{w} {p50[w]:.2f} ms" for w in ways),
              harness.ratio_line("call p50 ms", ("gateway", p50["gateway"]), ("direct", p50["direct"]))]
    if "baseline" in p50:
        ref = report["config"]["baseline_ref"]
        lines.append(harness.ratio_line("call p50 ms", ("gateway", p50["gateway"]),
                                        (f"baseline {ref}", p50["baseline"])))
    return "\n".join(lines)


if __name__ == "__main__":
    harness.main(main)
