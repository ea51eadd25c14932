"""The status quo, side by side (issue 6): the MCP SDK's own OAuth client in every process vs mcpcreds.

Run from the repository root (Node for the authorization server peer; the MCP SDK 2.x installed):

    python bench/status_quo.py                   # defaults below; 2-3 min, mostly spawning processes
    python bench/status_quo.py --rounds 3        # three rounds of the five sides, min/median/max
    python bench/status_quo.py --json            # the same figures, machine-readable
    python bench/status_quo.py --processes 8 --tasks 2 --seconds 15 --ttl 5 --rate 20/1s
                                                 # every option, at its default
    python bench/status_quo.py --quick           # a smoke run: 2 processes x 1 loop for 2 s

Both sides run against the same real peers on loopback: an authorization server (oidc-provider,
`tests/peers/oidc_peer.py`) issuing RFC 9068 JWT access tokens that live `--ttl` seconds, and an
MCP server (the MCP Python SDK 2.x over Streamable HTTP, `tests/peers/mcp_server.py`) that
verifies them and serves RFC 9728 protected-resource metadata (PRM). Before either side, one token
and one verified request warm the peers up (the MCP server fetches the JWKS once). For each side,
`--processes` client processes (multiprocessing, spawn) are started and set up (everything that
needs no network: the auth, the `httpx2.AsyncClient` and its transport), then released together;
each opens an MCP session (the SDK's `Client` on `streamable_http_client`, in `--era auto`: it
speaks 2026-07-28, sending `server/discover` first and, to check a tool's structured result, one
`tools/list` per loop that finds none in its own cache) and runs `--tasks` concurrent loops
calling the tool `add` for `--seconds` seconds, then closes its session. The server marks its
`tools/list` and `server/discover` results public for `--cache-ttl-ms` (the SDK's
`cache_hints`), as a server whose tools are the same for every caller may; `--cache-ttl-ms 0`
sends no hints. `--era legacy` opens with the 2025 handshake, where there are none.

- status quo: each process has its own `mcp.client.auth.extensions.client_credentials.
  ClientCredentialsOAuthProvider` (client id and secret, `issuer=`, `scope=`, in-memory token
  storage, as in the SDK's examples) as the `auth=` of its `httpx2.AsyncClient`. It logs in on the
  first 401, through discovery (PRM, then the authorization server's metadata). Nothing limits
  the request rate: the SDK does not know the service's `rate`.
- status quo, paced: the same, each process holding itself to its share of the rate (an
  `aiolimiter.AsyncLimiter` of `burst / processes` per period in front of every request to `/mcp`):
  how the status quo keeps N processes within one bound without a shared bucket.
- mcpcreds: a fresh sidecar (`mcpcreds serve` from this checkout, `tests/sidecar_proc.py`) with
  the service `[services.mcp]` (pinned `token_url`, `rate = --rate`, default `refresh_ahead`), and
  each process uses `AsyncClient(socket).auth("tools")` as the `auth=`: one login and one bucket
  for all processes. Then `--processes` new processes join the running sidecar, which holds a
  fresh login and a full bucket, for one session and one call each (the "warm" row).
- mcpcreds, `lease=False`: the same with `auth("tools", lease=False)`, one `call` round trip per
  request: the per-request path, which the default (leases where they pay) must not be slower
  than, nor use less of the rate than.
- mcpcreds, its gateway: the same sidecar, the server `tools` with `trust = "trusted"`, and each
  process's SDK client on `creds.mcp_httpx2_client("tools")` to `creds.mcp_url("tools")`: no
  credential in the process at all. The gateway reads the JSON-RPC it relays, so it takes a
  permit per JSON-RPC request (its default `rate_methods`), not per HTTP request: notifications,
  a GET stream and the closing DELETE take none, and neither does a request it answers from a
  result the server marked cacheable (`--cache-ttl-ms`). Its rate use and most in any 1 s
  count what it meters, at the server (the server peer's POSTs that are no notification, by the
  time it read them: a process's request waits in the gateway for its permit); the table gives
  the HTTP requests the processes sent beside them. The process sends no token: its "first
  request with a valid token" is left blank.

`--rounds N` runs the five sides in turn N times; the table is the last round's, followed by the
main figures' min / median / max over the rounds.

What is measured, and where:

- token requests: counted by the authorization server (POSTs to its token endpoint), per side,
  from before the side starts (the sidecar included) to the end of its run;
- discovery requests: counted in the client processes, by a counting `httpx2` transport under
  the auth (every request the SDK's auth flow makes goes through it): GETs of the PRM
  (`/.well-known/oauth-protected-resource...`, on the MCP server) and of the authorization
  server's metadata (`/.well-known/oauth-authorization-server`, `openid-configuration`). Neither
  peer counts these GETs itself: the MCP server counts only requests to `/mcp`, the authorization
  server only token requests. The sidecar uses the pinned token URL and makes none;
- 401s: the MCP server's own count of 401 answers on `/mcp`; the transport tells those sent with
  no `Authorization` header (a process with no token yet, or whose token the SDK knows has
  expired: it has no refresh token for a client-credentials login, so it sends the request bare
  to get the 401 that starts a new login) from those sent with a token the server refused (the
  server's `rejected` reasons are listed under the table);
- renewal rounds (status quo): the token requests' send times in the client processes, grouped
  into rounds (a gap of more than 1 s starts a new one); a round's spread is how close together
  the processes logged in;
- first-call latency, from the release, p50 and max over the processes: to the first request to
  `/mcp` sent with a token the server took, and to the first `add` result (which includes opening
  the session: `server/discover` (the 2025 era: initialize, the initialized notification, the
  GET stream), the `tools/list` the SDK sends to check a first result, and, with mcpcreds,
  waiting for permits: every one of those requests takes one from the shared bucket, unless the
  gateway answers it from its cache);
- upstream requests: every HTTP request to `/mcp` (server/discover or initialize, notifications,
  tool calls, retries after a 401, the closing DELETE), which is what the service's `rate` meters
  and what mcpcreds takes one permit for, sent in the `--seconds` window: per second on average
  and the most in any 1 s window, next to what the bucket allows (`burst + burst/per * t`);
- tool calls: `add` results within the window, in total and per process per second;
- concurrency inside a process: how many `/mcp` POSTs were sent while another POST of the same
  process was still waiting for its response headers, and the most in flight at once. The SDK's
  `OAuthClientProvider._auth_flow` holds `context.lock` from before a request until its response
  headers are handed back (not across the response body), so that count is 0 for the status quo.

Oddity worked around (see the closing report of issue 6): the MCP server peer builds
`AuthSettings(issuer_url=AnyHttpUrl(issuer))`, which renders the path-less issuer with a trailing
slash (a plain string would keep it as is: `AuthSettings` sets `url_preserve_empty_path`), so its
PRM advertises `http://127.0.0.1:PORT/` while the authorization server's metadata says
`http://127.0.0.1:PORT`; the SDK's provider compares the two exactly (RFC 8414 3.3) and stops with
"Authorization server metadata issuer mismatch". The PRM also has no `scopes_supported` (no
`required_scopes`), so the SDK requests every scope the authorization server lists (its
`scopes_supported`, which has `openid`) in place of the `scope=` it was given, and the token
request fails with `invalid_scope`. Unless `--no-prm-fix` is given, the status-quo processes'
counting transport rewrites the PRM document it receives into what a correct server would send
(the issuer exactly as the authorization server names itself; `scopes_supported` = the client's
scope) and the report lists the rewrites; the SDK's provider itself is used unchanged, and the
requests it makes are those it would make against a corrected server. With `--no-prm-fix` the
status quo fails.

The processes, the peers and the sidecar share the machine's cores: the status quo's call rates
are bounded by the machine (the MCP server is one Python process), not by any limit, and the
latencies depend on the machine's load; the counts do not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import harness
from bench.harness import BenchError

if TYPE_CHECKING:  # imported where used, so that the spawned client processes stay light
    import httpx2
    from tests.peers.mcp_server import McpServerPeer
    from tests.peers.oidc_peer import OidcPeer

# the status quo, then the same paced to its share of the rate in each process, then mcpcreds'
# `creds.auth(SERVER)`, `creds.auth(SERVER, lease=False)` and its gateway
SIDES = ("status_quo", "status_quo_paced", "mcpcreds", "mcpcreds_no_lease", "mcpcreds_gateway")
SIDE_NAMES = ("status quo", "status quo, paced", "mcpcreds", "mcpcreds, lease=False", "mcpcreds gateway")
SERVER = "tools"
CLIENT_ID = "agent"
CLIENT_SECRET = "bench-secret-0b7c5e2a9d4f4c1e8a6b3d2f1e0c9a8b"
SCOPE = "tools:read tools:call"
ROUND_GAP = 1.0  # token requests more than this far apart (s) belong to different renewal rounds


# ------------------------------------------------------------------------------ worker processes


class InMemoryTokenStorage:
    """The SDK's `TokenStorage` protocol kept in memory, as in the SDK's OAuth client examples."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.client_info: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client_info

    async def set_client_info(self, client_info: Any) -> None:
        self.client_info = client_info


class Traffic:
    """What one process sent: (start, end, method, kind, status, had Authorization) per request,
    times in seconds from the release; and how its `/mcp` POSTs overlapped: the most in flight at
    once, and how many were sent while another was still waiting for its response headers (the
    SDK's auth lock forbids that) or still reading its response body."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.requests: list[tuple[float, float, str, str, int, bool]] = []
        self.heads = self.bodies = self.max_heads = self.max_bodies = 0
        self.posts = self.sent_during_head = self.sent_during_body = 0
        self.head_time = self.body_time = 0.0  # summed over POSTs: until the headers, then the body
        self.prm_fixes: list[str] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def post_sent(self) -> None:
        self.posts += 1
        self.sent_during_head += self.heads > 0
        self.sent_during_body += self.bodies > self.heads
        self.heads += 1
        self.bodies += 1
        self.max_heads = max(self.max_heads, self.heads)
        self.max_bodies = max(self.max_bodies, self.bodies)

    def post_headers(self, took: float) -> None:
        self.heads -= 1
        self.head_time += took

    def post_body_closed(self, took: float) -> None:
        self.bodies -= 1
        self.body_time += took


def _counting_transport(traffic: Traffic, mcp_url: str, token_url: str, issuer: str,
                        prm_fix: bool, pace: Any = None,
                        inner: httpx2.AsyncBaseTransport | None = None) -> httpx2.AsyncBaseTransport:
    """An httpx2 transport (over `inner`, or a new one) that records every request (see
    `Traffic`) and, with `prm_fix`, corrects the MCP server's PRM document (see the module
    docstring); with `pace` (an `aiolimiter.AsyncLimiter`), every request to the MCP server waits
    for it first."""
    import httpx2
    from mcp.client.auth.utils import issuers_match

    def kind_of(request: httpx2.Request) -> str:
        url = str(request.url.copy_with(query=None, fragment=None))
        path = request.url.path
        if url == mcp_url:
            return "mcp"
        if url == token_url:
            return "token"
        if path.startswith("/.well-known/oauth-protected-resource"):
            return "prm"
        if path.startswith("/.well-known/"):
            return "asm"
        return "other"

    class Tracked(httpx2.AsyncByteStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.closed = False
            self.opened = traffic.now()

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self.inner:
                yield chunk

        async def aclose(self) -> None:
            if not self.closed:
                self.closed = True
                traffic.post_body_closed(traffic.now() - self.opened)
            await self.inner.aclose()

    class Counting(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = inner if inner is not None else httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            kind = kind_of(request)
            post = kind == "mcp" and request.method == "POST"
            if pace is not None and kind == "mcp":
                await pace.acquire()
            started = traffic.now()
            if post:
                traffic.post_sent()
            try:
                response = await self.inner.handle_async_request(request)
            except BaseException:
                if post:
                    traffic.post_headers(traffic.now() - started)
                    traffic.post_body_closed(0.0)
                raise
            if post:
                traffic.post_headers(traffic.now() - started)
            traffic.requests.append((started, traffic.now(), request.method, kind, response.status_code,
                                     "authorization" in request.headers))
            if kind == "prm" and prm_fix and response.status_code == 200:
                response = await self.fix_prm(request, response)
            if post:
                response.stream = Tracked(response.stream)
            return response

        async def fix_prm(self, request: httpx2.Request, response: httpx2.Response) -> httpx2.Response:
            document = json.loads(await response.aread())
            servers = document.get("authorization_servers") or []
            fixed = [issuer if s != issuer and issuers_match(s, issuer) else s for s in servers]
            changes = []
            if fixed != servers:
                changes.append(f"authorization_servers {servers} -> {fixed}")
                document["authorization_servers"] = fixed
            if document.get("scopes_supported") is None:
                changes.append(f"scopes_supported None -> {SCOPE.split()}")
                document["scopes_supported"] = SCOPE.split()
            if not changes:
                return response
            for change in changes:
                if change not in traffic.prm_fixes:
                    traffic.prm_fixes.append(change)
            return httpx2.Response(200, json=document, request=request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    return Counting()


async def session_calls(params: dict[str, Any], release: harness.Release) -> dict[str, Any]:
    """Set up, say ready, wait for the release; then one MCP session and `tasks` loops of `add`."""
    import anyio
    import httpx2
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    side: str = params["side"]
    seconds: float = params["seconds"]
    # Everything that needs no network is set up before the release: the processes are running
    # and ready to call, as an agent's workers are, and creating an httpx transport (an SSL
    # context) costs 0.1-0.3 s of CPU here that has nothing to do with credentials.
    traffic = Traffic(0.0)
    pace = None
    if side == "status_quo_paced":  # the rate split evenly: what each process may send on its own
        from aiolimiter import AsyncLimiter

        pace = AsyncLimiter(params["share_per_period"], params["period"])
    creds: Any = None
    module: str | None = None
    url: str = params["url"]
    auth: Any
    http: Any
    timeout = httpx2.Timeout(30.0, read=300.0)
    if side == "mcpcreds_gateway":  # no auth in the process: the sidecar adds the credential
        import mcpcreds
        from mcpcreds import AsyncClient

        module = mcpcreds.__file__
        creds = AsyncClient(params["socket"])
        http = creds.mcp_httpx2_client(SERVER, timeout=timeout)
        url = creds.mcp_url(SERVER)
        # counted as the other sides are: the same recording transport, over the socket's own
        http._transport = _counting_transport(traffic, url, params["token_url"], params["issuer"], False,
                                              inner=http._transport)
    elif side.startswith("status_quo"):
        from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider

        auth = ClientCredentialsOAuthProvider(
            server_url=params["url"], storage=InMemoryTokenStorage(), client_id=CLIENT_ID,
            client_secret=params["client_secret"], scope=SCOPE, issuer=params["issuer"])
    else:
        import mcpcreds
        from mcpcreds import AsyncClient

        module = mcpcreds.__file__
        creds = AsyncClient(params["socket"])
        auth = creds.auth(SERVER, lease=False) if side == "mcpcreds_no_lease" else creds.auth(SERVER)
    if side != "mcpcreds_gateway":
        transport = _counting_transport(traffic, url, params["token_url"], params["issuer"],
                                        params["prm_fix"], pace)
        http = httpx2.AsyncClient(auth=auth, transport=transport, timeout=timeout)
    # anyio loads its asyncio backend lazily; the SDK's provider (an anyio.Lock) loads it above,
    # so load it on both sides, or the mcpcreds processes pay tens of ms of imports after the release.
    await anyio.sleep(0)
    anyio.Lock()
    traffic.t0 = await release.wait_async()
    done: list[float] = []  # completion times of `add` results, from the release
    latencies: list[float] = []
    errors = harness.Errors()
    opened: float | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            if creds is not None:
                await stack.enter_async_context(creds)
            await stack.enter_async_context(http)
            session = await stack.enter_async_context(
                Client(streamable_http_client(url, http_client=http), mode=params["era"]))
            opened = traffic.now()

            async def loop(task: int) -> None:
                n = 0
                while traffic.now() < seconds or (params["one_call"] and n == 0):
                    sent = traffic.now()
                    try:
                        result = await session.call_tool("add", {"a": task, "b": n})
                        value = (result.structured_content or {}).get("result")
                        if result.is_error or value != task + n:
                            raise BenchError(f"add({task}, {n}) answered {result!r}")
                    except Exception as exc:
                        errors.add(exc)
                    else:
                        done.append(traffic.now())
                        latencies.append(traffic.now() - sent)
                    n += 1

            await asyncio.gather(*(loop(task) for task in range(params["tasks"])))
    except Exception as exc:
        errors.add(exc)
    return {"t0": traffic.t0, "requests": traffic.requests, "done": done, "latencies": latencies,
            "opened": opened,
            "errors": errors.count, "first_error": errors.first, "max_heads": traffic.max_heads,
            "max_bodies": traffic.max_bodies, "posts": traffic.posts,
            "sent_during_head": traffic.sent_during_head, "sent_during_body": traffic.sent_during_body,
            "head_time": traffic.head_time, "body_time": traffic.body_time, "prm_fixes": traffic.prm_fixes,
            "mcpcreds_module": module}


# --------------------------------------------------------------------------------- the parent


def run_processes(side: str, params: dict[str, Any], processes: int, seconds: float,
                  before_release: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Spawn the processes, wait until each is set up, release them together, collect the results."""
    with harness.Workers(processes) as workers:
        return workers.run(session_calls, [{**params, "side": side}] * processes, timeout=seconds + 120.0,
                           before_release=before_release)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


def max_in_window(times: list[float], window: float) -> int:
    """The most of `times` in any half-open window [t, t + window)."""
    ordered = sorted(times)
    best = j = 0
    for i, start in enumerate(ordered):
        while j < len(ordered) and ordered[j] < start + window:
            j += 1
        best = max(best, j - i)
    return best


def renewal_rounds(times: list[float]) -> list[dict[str, float]]:
    """Token request times grouped into rounds: [{"at": s, "requests": n, "spread_ms": ms}]."""
    rounds: list[list[float]] = []
    for t in sorted(times):
        if rounds and t - rounds[-1][-1] <= ROUND_GAP:
            rounds[-1].append(t)
        else:
            rounds.append([t])
    return [{"at": round(r[0], 2), "requests": len(r), "spread_ms": _ms(r[-1] - r[0])} for r in rounds]


def _p50_max(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {"p50": _ms(statistics.median(ordered)) if ordered else None,
            "max": _ms(ordered[-1]) if ordered else None, "all": [_ms(v) for v in ordered]}


def first_calls(out: list[dict[str, Any]], carried: bool = False) -> dict[str, Any]:
    """Per process, from the release: the first request sent (to anywhere), the first request to
    /mcp sent with a token the server took (not answered 401; none when `carried`: through the
    gateway the process sends no token), and the first `add` result; p50 and max over the processes."""
    authorized = [] if carried else [
        min((r[0] for r in proc["requests"] if r[3] == "mcp" and r[5] and r[4] != 401), default=None)
        for proc in out]
    return {"first_request_ms": _p50_max([min(r[0] for r in proc["requests"]) for proc in out
                                          if proc["requests"]]),
            "first_authorized_request_ms": _p50_max([t for t in authorized if t is not None]),
            "first_result_ms": _p50_max([min(proc["done"]) for proc in out if proc["done"]]),
            "processes_without_result": sum(1 for proc in out if not proc["done"]),
            "errors": sum(p["errors"] for p in out),
            "first_error": harness.first_error(p["first_error"] for p in out)}


def summarize(side: str, out: list[dict[str, Any]], oidc_stats: dict[str, Any], mcp_stats: dict[str, Any],
              args: argparse.Namespace) -> dict[str, Any]:
    from mcpcreds.core.rates import parse_rate

    rate = parse_rate(args.rate)
    seconds: float = args.seconds
    requests = [r for proc in out for r in proc["requests"]]
    gateway = side == "mcpcreds_gateway"
    http_sent = [r[0] for r in requests if r[3] == "mcp" and r[0] < seconds]
    upstream = http_sent  # sent below `creds.auth()` (after its permit): when the server gets them
    if gateway:
        # What the gateway meters, a permit per JSON-RPC request, timed at the server (a process
        # sends to the gateway, which holds a request until its permit): the server's POSTs whose
        # method is no notification (MCP names them notifications/*), from the release on.
        t0 = min(p["t0"] for p in out)
        upstream = [post["at"] - t0 for post in mcp_stats["posts"]
                    if post["method"] and not post["method"].startswith("notifications/")
                    and 0 <= post["at"] - t0 < seconds]
    token_sends = [r[0] for r in requests if r[3] == "token"]
    refused = [r[5] for r in requests if r[3] == "mcp" and r[4] == 401]
    per_process = sorted(sum(1 for t in proc["done"] if t <= seconds) / seconds for proc in out)
    latencies = sorted(lat for proc in out for lat in proc["latencies"])
    rounds = renewal_rounds(token_sends)
    posts = max(1, sum(p["posts"] for p in out))
    return {
        "side": side,
        "token_requests": oidc_stats["token_requests"],
        "token_requests_by_client": oidc_stats.get("by_client", {}),
        "token_requests_seen_by_clients": len(token_sends),
        "discovery_requests": {
            "protected_resource_metadata": sum(1 for r in requests if r[3] == "prm"),
            "authorization_server_metadata": sum(1 for r in requests if r[3] == "asm"),
        },
        "unauthorized_at_server": mcp_stats["unauthorized"],
        "unauthorized_sent_without_token": refused.count(False),
        "unauthorized_sent_with_token": refused.count(True),
        "rejected_tokens_at_server": mcp_stats.get("rejected", {}),
        "renewal_rounds": rounds,
        "renewal_round_max_spread_ms": max((r["spread_ms"] for r in rounds if r["requests"] > 1),
                                           default=None),
        "first_call": first_calls(out, gateway),
        "session_open_ms_max": _ms(max(p["opened"] for p in out if p["opened"] is not None))
        if any(p["opened"] is not None for p in out) else None,
        "metered": "JSON-RPC requests" if gateway else "HTTP requests",
        "upstream_http_requests_in_window": len(http_sent),
        "upstream_requests_in_window": len(upstream),
        "upstream_per_second": round(len(upstream) / seconds, 1),
        "upstream_max_in_1s": max_in_window(upstream, 1.0),
        "bucket_allows_in_window": int(rate.burst + rate.per_second * seconds),
        "bucket_allows_in_1s": int(rate.burst + rate.per_second * 1.0),
        "requests_at_server": mcp_stats["requests"],
        "requests_at_server_by_method": mcp_stats.get("by_method", {}),
        "tool_calls_at_server": mcp_stats["tool_calls"],
        "tool_calls_in_window": sum(sum(1 for t in p["done"] if t <= seconds) for p in out),
        "tool_calls_per_second": round(sum(per_process), 1),
        "per_process_calls_per_second": {"min": round(per_process[0], 1),
                                         "median": round(statistics.median(per_process), 1),
                                         "max": round(per_process[-1], 1)} if per_process else None,
        "call_latency_ms": {"p50": _ms(harness.upper_percentile(latencies, 0.5)) if latencies else None,
                            "max": _ms(latencies[-1]) if latencies else None},
        "max_posts_in_flight_until_headers": max(p["max_heads"] for p in out),
        "max_posts_in_flight_until_body_end": max(p["max_bodies"] for p in out),
        "posts": sum(p["posts"] for p in out),
        "posts_sent_while_another_awaited_headers": sum(p["sent_during_head"] for p in out),
        "posts_sent_while_another_read_its_body": sum(p["sent_during_body"] for p in out),
        "post_mean_ms_until_headers": _ms(sum(p["head_time"] for p in out) / posts),
        "post_mean_ms_headers_to_body_end": _ms(sum(p["body_time"] for p in out) / posts),
        "errors": sum(p["errors"] for p in out),
        "first_error": harness.first_error(p["first_error"] for p in out),
        "prm_fixes": sorted({fix for p in out for fix in p["prm_fixes"]}),
        "mcpcreds_modules": sorted({p["mcpcreds_module"] for p in out if p["mcpcreds_module"]}),
    }


def warm_up(oidc: OidcPeer, mcp: McpServerPeer) -> None:
    """One token and one verified request, before either side runs, so that neither pays the
    peers' one-time costs (the MCP server fetches the JWKS at the first token it verifies)."""
    import httpx

    with httpx.Client(timeout=30.0) as http:
        answer = http.post(oidc.token_url, auth=(CLIENT_ID, CLIENT_SECRET),
                           data={"grant_type": "client_credentials", "scope": SCOPE, "resource": mcp.url})
        answer.raise_for_status()
        token = answer.json()["access_token"]
        http.post(mcp.url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                  json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    if mcp.stats()["jwks_fetches"] < 1:
        raise BenchError("warm-up: the MCP server did not verify the warm-up token")


def run_side(side: str, oidc: OidcPeer, mcp: McpServerPeer, tmp: Path,
             args: argparse.Namespace) -> dict[str, Any]:
    from mcpcreds.core.rates import parse_rate

    params: dict[str, Any] = {
        "url": mcp.url, "issuer": oidc.issuer, "token_url": oidc.token_url, "seconds": args.seconds,
        "tasks": args.tasks, "prm_fix": not args.no_prm_fix, "one_call": False, "era": args.era,
    }
    oidc.reset_stats()
    mcp.reset_stats()
    rate = parse_rate(args.rate)
    params["share_per_period"], params["period"] = rate.burst / args.processes, rate.per
    sidecar = side.startswith("mcpcreds")
    with contextlib.ExitStack() as stack:
        if sidecar:
            proc = stack.enter_context(harness.oauth_sidecar(
                tmp / "sidecar", service="mcp", server=SERVER, endpoint=mcp.url, token_url=oidc.token_url,
                client_id=CLIENT_ID, client_secret=CLIENT_SECRET, scope=SCOPE, rate=args.rate,
                server_lines='trust = "trusted"'))
            params["socket"] = str(proc.socket)
        else:
            params["client_secret"] = CLIENT_SECRET  # the status quo: the secret in every process
        out = run_processes(side, params, args.processes, args.seconds)
        oidc_stats = oidc.stats()
        mcp_stats = mcp.stats()
        warm: list[dict[str, Any]] = []
        if sidecar:
            # New processes joining a running sidecar that holds the login: one session and one
            # call each (the status quo has no such case: every new process logs in).
            from mcpcreds import Client

            def prime() -> None:
                """Just before the release: the bucket full again, and a fresh login in the
                sidecar (with short tokens, the one from the run has expired by now)."""
                time.sleep(min(parse_rate(args.rate).per, 10.0))
                with Client(params["socket"]) as creds:
                    creds.headers(SERVER)

            warm = run_processes(side, {**params, "seconds": 0.0, "tasks": 1, "one_call": True},
                                 args.processes, 0.0, prime)
    summary = summarize(side, out, oidc_stats, mcp_stats, args)
    if warm:
        summary["first_call_warm_sidecar"] = first_calls(warm, side == "mcpcreds_gateway")
    return summary


# ------------------------------------------------------------------------------------- output


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def render(report: dict[str, Any]) -> str:
    cfg = report["config"]
    sq, mc = report["status_quo"], report["mcpcreds"]
    n = cfg["processes"]

    def discovery(s: dict[str, Any]) -> str:
        d = s["discovery_requests"]
        total = d["protected_resource_metadata"] + d["authorization_server_metadata"]
        return f"{total} ({d['protected_resource_metadata']} PRM + {d['authorization_server_metadata']} AS)"

    def unauthorized(s: dict[str, Any]) -> str:
        refused = ("an expired token" if set(s["rejected_tokens_at_server"]) == {"ExpiredTokenError"}
                   else "a token the server refused")
        return (f"{s['unauthorized_at_server']} ({s['unauthorized_sent_without_token']} sent without a "
                f"token, {s['unauthorized_sent_with_token']} with {refused})")

    def rounds(s: dict[str, Any]) -> str:
        if s["side"].startswith("mcpcreds"):
            return "by the one sidecar, ahead of expiry"
        if not s["renewal_rounds"]:
            return "-"
        spread = s["renewal_round_max_spread_ms"]
        sizes = "/".join(str(r["requests"]) for r in s["renewal_rounds"])
        return f"{len(s['renewal_rounds'])} rounds of {sizes}; each within {_num(spread)} ms"

    def first(s: dict[str, Any], key: str, which: str) -> str:
        if key not in s:
            return "every new process logs in (as above)"
        f = s[key][which]
        return f"{_num(f['p50'])} / {_num(f['max'])}"

    def overlap(s: dict[str, Any]) -> str:
        return (f"{s['posts_sent_while_another_awaited_headers']} of {s['posts']} "
                f"(most in flight: {s['max_posts_in_flight_until_headers']})")

    def upstream(s: dict[str, Any]) -> str:
        http = ("" if s["upstream_http_requests_in_window"] == s["upstream_requests_in_window"]
                else f"; {s['upstream_http_requests_in_window']} HTTP requests")
        return f"{s['upstream_per_second']:g}/s ({s['upstream_requests_in_window']} {s['metered']}{http})"

    def per_process(s: dict[str, Any]) -> str:
        p = s["per_process_calls_per_second"]
        return "-" if p is None else f"{p['min']:g} / {p['median']:g} / {p['max']:g}"

    sp, gw = report["status_quo_paced"], report["mcpcreds_gateway"]
    sides = tuple(report[side] for side in SIDES)

    def each(fn: Callable[[dict[str, Any]], str]) -> tuple[str, ...]:
        return tuple(fn(s) for s in sides)

    def warm(s: dict[str, Any]) -> str:
        if "first_call_warm_sidecar" not in s:
            return "every new process logs in (as above)"
        return (f"{first(s, 'first_call_warm_sidecar', 'first_authorized_request_ms')}; "
                f"{first(s, 'first_call_warm_sidecar', 'first_result_ms')}")

    rows = [
        ("client secret held by", f"each of the {n} processes", f"each of the {n} processes",
         "the sidecar only", "the sidecar only", "the sidecar only (the token too)"),
        ("token requests (at the IdP)", *each(lambda s: str(s["token_requests"]))),
        ("discovery requests (metadata GETs)", *each(discovery)),
        ("401s at the MCP server", *each(unauthorized)),
        ("renewals", *each(rounds)),
        ("first request with a valid token, p50 / max (ms from the release)",
         *each(lambda s: first(s, "first_call", "first_authorized_request_ms"))),
        ("first tool result, p50 / max (ms from the release)",
         *each(lambda s: first(s, "first_call", "first_result_ms"))),
        (f"the same two for {n} new processes while the sidecar holds the login", *each(warm)),
        (f"upstream requests to /mcp as the side's rate meters them, mean over {cfg['seconds']:g} s "
         f"(rate {cfg['rate']}: "
         f"{sq['bucket_allows_in_window'] / cfg['seconds']:.1f}/s)", *each(upstream)),
        (f"most upstream requests in any 1 s (bucket allows {sq['bucket_allows_in_1s']})",
         *each(lambda s: str(s["upstream_max_in_1s"]))),
        ("tool calls/s, total", *each(lambda s: f"{s['tool_calls_per_second']:g}")),
        (f"tool calls/s per process, min / median / max ({cfg['tasks']} concurrent loops each)",
         *each(per_process)),
        ("/mcp POSTs sent while another of the same process awaited its response headers", *each(overlap)),
        ("failed calls", *each(lambda s: str(s["errors"]))),
    ]
    lines = [
        f"{n} processes x {cfg['tasks']} concurrent `add` loops for {cfg['seconds']:g} s, "
        f"access tokens of {cfg['ttl']} s, service rate `{cfg['rate']}`.",
        "",
        "| | MCP SDK `ClientCredentialsOAuthProvider` in each process | the same, each process paced "
        f"to 1/{n} of the rate (aiolimiter) | mcpcreds, `creds.auth()` "
        "| mcpcreds, `creds.auth(lease=False)` | mcpcreds, its gateway (`/mcp/tools` on the socket) |",
        "|---|---|---|---|---|---|",
        *(f"| {' | '.join(row)} |" for row in rows),
        "",
        harness.ratio_line("token requests", ("mcpcreds", mc["token_requests"]),
                           ("status quo", sq["token_requests"])),
    ]
    firsts = [s["first_call"]["first_authorized_request_ms"]["p50"] for s in (mc, sq)]
    if None not in firsts:
        lines.append(harness.ratio_line("first request with a valid token, p50 ms", ("mcpcreds", firsts[0]),
                                        ("status quo", firsts[1])))
    results = [s["first_call"]["first_result_ms"]["p50"] for s in (mc, sp)]
    if None not in results:
        lines.append(harness.ratio_line("first tool result, p50 ms", ("mcpcreds", results[0]),
                                        ("status quo paced", results[1])))
    results = [s["first_call"]["first_result_ms"]["p50"] for s in (gw, sq)]
    if None not in results:
        lines.append(harness.ratio_line("first tool result, p50 ms", ("mcpcreds gateway", results[0]),
                                        ("status quo", results[1])))
    notes = []
    for side, s in zip(SIDE_NAMES, sides, strict=True):
        if s["first_error"]:
            notes.append(f"{side}: first error: {s['first_error']}")
        if warm_error := s.get("first_call_warm_sidecar", {}).get("first_error"):
            notes.append(f"{side}: first error (warm phase): {warm_error}")
        if s["prm_fixes"]:
            notes.append(f"{side}: PRM rewritten in the client (see the docstring): "
                         f"{'; '.join(s['prm_fixes'])}")
        if s["rejected_tokens_at_server"]:
            notes.append(f"{side}: tokens the server refused, by reason: {s['rejected_tokens_at_server']}")
    if notes:
        lines += ["", *notes]
    if len(report.get("rounds", [])) > 1:
        lines += ["", render_rounds(report)]
    return "\n".join(lines)


def round_figures(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The figures compared across rounds, per side: use of the rate (upstream requests in the
    window over what the bucket allows), first tool result p50 and first valid request p50."""
    out = {}
    for side in SIDES:
        s = report[side]
        warm = s.get("first_call_warm_sidecar", {}).get("first_result_ms", {})
        out[side] = {"use": round(s["upstream_requests_in_window"] / s["bucket_allows_in_window"], 4),
                     "upstream_per_second": s["upstream_per_second"],
                     "upstream_max_in_1s": s["upstream_max_in_1s"],
                     "first_result_p50_ms": s["first_call"]["first_result_ms"]["p50"],
                     "first_authorized_p50_ms": s["first_call"]["first_authorized_request_ms"]["p50"],
                     "warm_first_result_p50_ms": warm.get("p50"), "errors": s["errors"]}
    return out


def render_rounds(report: dict[str, Any]) -> str:
    """Each figure of `round_figures` over the rounds: min / median / max (the table above is the
    last round's)."""
    rounds = report["rounds"]

    def spread(side: str, key: str, fmt: str) -> str:
        values = sorted(v for r in rounds if (v := r[side][key]) is not None)
        if not values:
            return "-"
        return " / ".join(format(v, fmt) for v in (values[0], statistics.median(values), values[-1]))

    lines = [f"{len(rounds)} rounds (sides in turn within each), min / median / max:", "",
             "| | " + " | ".join(SIDES) + " |", "|---|" + "---|" * len(SIDES)]
    for label, key, fmt in (("use of the rate (requests in the window / bucket allows)", "use", ".1%"),
                            ("upstream requests/s", "upstream_per_second", "g"),
                            ("most in any 1 s", "upstream_max_in_1s", "g"),
                            ("first tool result p50, ms", "first_result_p50_ms", "g"),
                            ("first valid request p50, ms", "first_authorized_p50_ms", "g"),
                            ("warm sidecar: first tool result p50, ms", "warm_first_result_p50_ms", "g"),
                            ("failed calls", "errors", "g")):
        lines.append(f"| {label} | " + " | ".join(spread(side, key, fmt) for side in SIDES) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--processes", type=harness.count, default=8, help="client processes per side (default 8)")
    p.add_argument("--tasks", type=harness.count, default=2,
                   help="concurrent call loops per process (default 2)")
    p.add_argument("--seconds", type=harness.positive, default=15.0,
                   help="how long each process calls (default 15)")
    p.add_argument("--ttl", type=harness.count, default=5,
                   help="access token lifetime at the IdP, s (default 5)")
    p.add_argument("--rate", type=harness.rate, default="20/1s",
                   help="the service's rate, for mcpcreds (default 20/1s)")
    p.add_argument("--rounds", type=harness.count, default=1,
                   help="rounds, each running every side in turn (default 1); the table is the last "
                        "round's, then the spread of the main figures over the rounds")
    p.add_argument("--era", choices=("auto", "legacy"), default="auto",
                   help="the SDK Client's mode: auto speaks 2026-07-28 to the server (default), legacy "
                        "the 2025 handshake")
    p.add_argument("--cache-ttl-ms", type=int, default=60_000,
                   help="the server marks its tools/list and server/discover public for this long "
                        "(2026-07-28's caching hints; default 60000; 0: no hints)")
    p.add_argument("--no-prm-fix", action="store_true",
                   help="do not correct the MCP server's PRM document in the status-quo processes")
    args = harness.parse(p, argv, quick={"processes": 2, "tasks": 1, "seconds": 2.0, "ttl": 2})
    from tests.peers.mcp_server import start_mcp_server

    report: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "quick")}}
    with harness.workdir("status-quo-bench") as tmp, \
            harness.oidc_peer(CLIENT_ID, CLIENT_SECRET, SCOPE, args.ttl) as oidc, \
            harness.started(start_mcp_server(oidc.issuer, oidc.jwks_uri, cache_ttl_ms=args.cache_ttl_ms),
                            "the MCP server peer") as mcp:
        warm_up(oidc, mcp)
        report["rounds"] = []
        for round_ in range(args.rounds):
            for side in SIDES:
                harness.progress(f"round {round_ + 1}: running {side} ...")
                report[side] = run_side(side, oidc, mcp, tmp, args)
            report["rounds"].append(round_figures(report))
    harness.emit(args, report, render)
    return 0


if __name__ == "__main__":
    harness.main(main)
