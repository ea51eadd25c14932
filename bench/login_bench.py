"""Login benchmark (issue 4): one OAuth 2.1 client-credentials login per service for every process.

Run from the repository root (the package installed, e.g. `pip install -e .`; Node for the peer):

    python bench/login_bench.py                  # defaults below; about 50-60 s
    python bench/login_bench.py --json           # the same figures, machine-readable
    python bench/login_bench.py --ttl 3 --lifetimes 10 --processes 8 --calls 125 --interval 0.02 \\
        --refresh-ahead 0.25s                    # every option, at its default
    python bench/login_bench.py --quick          # a smoke run: 2 processes, a 2 s steady run

Targets (from the issue), each checked; the exit status is 1 if one is missed:

- cold burst: 1,000 concurrent cold `headers` calls from 8 client processes cause exactly 1 token
  request at the authorization server, and every call receives the same token (1 fingerprint);
- steady run: over 10 token lifetimes of steady traffic, at most 11 token requests, and no call
  ever receives an expired token.

It runs against a real authorization server (oidc-provider on loopback, `tests/peers/oidc_peer.py`,
issuing RFC 9068 JWT access tokens) and the real sidecar (`mcpcreds serve`, `tests/sidecar_proc.py`).
`--processes` client processes (multiprocessing, spawn) are started once and serve every phase;
in each phase they set up, then are released together by a multiprocessing event.

1. Cold burst. A fresh sidecar, no login yet (the peer's token lifetime is 60 s here, so that no
   renewal can fall inside the burst). Each process opens an `AsyncClient` and fires `--calls`
   concurrent `headers_info("crm-ro")` calls. Reported: token requests seen by the peer, distinct
   fingerprints received, latency p50/p99/max from the release to each answer, and the sidecar's own
   mean time per headers request (its `/metrics`), which tells time in the sidecar from time spent
   queued in the clients and the kernel (the latencies depend on the machine's load; the counts do not).
2. Baseline, in the same run: the status quo, each process fetching its own token from the token
   endpoint with authlib's `AsyncOAuth2Client.fetch_token(grant_type="client_credentials")`.
   Reported: the peer's token requests (one per process) next to the sidecar's.
3. Steady run. The peer's token lifetime is set to `--ttl` seconds and a fresh sidecar is started;
   for `--lifetimes` x `--ttl` seconds each process calls `headers_info("crm-ro")` every `--interval`
   seconds. At receipt each call decodes the JWT payload (no signature check) and compares its `exp`,
   and the answer's `expires_at`, with `time.time()` (expired: now >= exp). Reported: calls, expired
   receipts, the least time left on a received token, how much later the answer's `expires_at` is than
   the JWT's `exp`, distinct tokens and how often a new one appears, token requests at the peer over
   the run (from the first, cold fetch to the end of the run) and the sidecar's status just after it.

`--refresh-ahead` is written into the sidecar's config (`sidecar.refresh_ahead`, default "60s" as in
the contract's example). The sidecar renews a login `refresh_ahead` before it expires, capped at half
its lifetime, so with a 3 s token it renews about every 1.5 s. The peer's `exp` and `expires_in` are
whole seconds, so a token's real lifetime is 2-3 s of the nominal 3 s.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import harness, wire

if TYPE_CHECKING:
    from tests.peers.oidc_peer import OidcPeer

SERVER = "crm-ro"
SERVICE_KEY = "service:crm"
ENDPOINT = "https://crm.example.com/mcp"  # the default `resource` the sidecar sends
CLIENT_ID = "bench"
CLIENT_SECRET = "bench-secret-5f0c1d6e8a2b4f7e9c3a1b0d"
SCOPE = "tools:read"
COLD_TTL = 60  # the peer's token lifetime during the cold burst and the baseline


# ---------------------------------------------------------------------------------------- helpers


def jwt_claims(authorization: str) -> dict[str, Any]:
    """The payload of the bearer JWT in an Authorization value (base64url, no verification)."""
    if not authorization.startswith("Bearer "):
        raise ValueError("not a Bearer authorization")
    parts = authorization[len("Bearer "):].split(".")
    if len(parts) != 3:
        raise ValueError("the access token is not a JWT")
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    claims: Any = json.loads(base64.urlsafe_b64decode(payload))
    if not isinstance(claims, dict) or not isinstance(claims.get("exp"), int | float):
        raise ValueError("the JWT has no numeric exp")
    return claims


def latency_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    p50, p99 = harness.percentiles(values, 0.50, 0.99)
    return {"p50_ms": round(p50 * 1e3, 3), "p99_ms": round(p99 * 1e3, 3),
            "max_ms": round(max(values) * 1e3, 3)}


def ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# ----------------------------------------------------------------------------------- load phases


async def cold(params: dict[str, Any], release: harness.Release) -> dict[str, Any]:
    """One AsyncClient; on `go`, `calls` concurrent headers_info calls."""
    from mcpcreds import AsyncClient

    async with AsyncClient(params["socket"]) as creds:
        await creds.health()  # reachable; touches no login
        release.wait()
        released = time.perf_counter()

        async def one() -> tuple[float, str]:
            info = await creds.headers_info(SERVER)
            return time.perf_counter() - released, f"{info['fingerprint']}"

        outcomes = await asyncio.gather(*(one() for _ in range(params["calls"])), return_exceptions=True)
    latencies = [o[0] for o in outcomes if isinstance(o, tuple)]
    errors = [harness.describe(o) for o in outcomes if isinstance(o, BaseException)]
    return {"latencies": latencies, "fingerprints": sorted({o[1] for o in outcomes if isinstance(o, tuple)}),
            "errors": len(errors), "first_error": errors[0] if errors else ""}


async def baseline(params: dict[str, Any], release: harness.Release) -> dict[str, Any]:
    """The status quo: one direct client-credentials fetch with authlib, on `go`."""
    from authlib.deprecate import AuthlibDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AuthlibDeprecationWarning)
        from authlib.integrations.httpx_client import AsyncOAuth2Client

    token_url = params["token_url"]
    async with AsyncOAuth2Client(CLIENT_ID, CLIENT_SECRET, scope=SCOPE, token_endpoint=token_url) as client:
        release.wait()
        released = time.perf_counter()
        try:
            token = await client.fetch_token(token_url, grant_type="client_credentials", scope=SCOPE,
                                             resource=ENDPOINT)
        except Exception as exc:
            return {"latencies": [], "tokens": 0, "errors": 1, "first_error": harness.describe(exc)}
        took = time.perf_counter() - released
    ok = isinstance(token.get("access_token"), str)
    return {"latencies": [took], "tokens": 1 if ok else 0, "errors": 0 if ok else 1,
            "first_error": "" if ok else "no access_token in the answer"}


async def steady(params: dict[str, Any], release: harness.Release) -> dict[str, Any]:
    """Once released, headers_info every `interval` s from the start for `duration` s,
    checking each token received against the clock."""
    from mcpcreds import AsyncClient

    interval: float = params["interval"]
    calls = expired_exp = expired_expires_at = 0
    errors = harness.Errors()
    latencies: list[float] = []
    tokens: dict[str, tuple[float, float]] = {}  # fingerprint -> (JWT exp, first receipt)
    min_left: float | None = None  # the least time left on a received token (by JWT exp), s
    max_skew: float | None = None  # the answer's expires_at minus the JWT's exp, s
    async with AsyncClient(params["socket"]) as creds:
        await creds.health()
        start = release.wait()
        end = start + float(params["duration"])
        loop_start = time.perf_counter() + (start - time.monotonic())
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        tick = 0
        while time.monotonic() < end:
            sent = time.perf_counter()
            try:
                info = await creds.headers_info(SERVER)
                received = time.time()
                latencies.append(time.perf_counter() - sent)
                claims = jwt_claims(info["headers"]["Authorization"])
            except Exception as exc:
                errors.add(exc)
            else:
                calls += 1
                exp = float(claims["exp"])
                tokens.setdefault(str(info["fingerprint"]), (exp, received))
                min_left = exp - received if min_left is None else min(min_left, exp - received)
                if received >= exp:
                    expired_exp += 1
                expires_at = info.get("expires_at")
                if isinstance(expires_at, int | float):
                    skew = float(expires_at) - exp
                    max_skew = skew if max_skew is None else max(max_skew, skew)
                    if received >= expires_at:
                        expired_expires_at += 1
            # fixed schedule: a slow call delays the next one, it does not cause a burst
            tick = max(tick + 1, int((time.perf_counter() - loop_start) / interval))
            await asyncio.sleep(max(0.0, loop_start + tick * interval - time.perf_counter()))
    return {"calls": calls, "expired_exp": expired_exp, "expired_expires_at": expired_expires_at,
            "errors": errors.count, "first_error": errors.first, "latencies": latencies, "tokens": tokens,
            "min_left": min_left, "max_skew": max_skew}


# ------------------------------------------------------------------------------ the sidecar


@contextlib.contextmanager
def sidecar(peer: OidcPeer, tmp: Path, name: str, refresh_ahead: str) -> Iterator[Path]:
    """A fresh `mcpcreds serve` on its own socket and config; yields the socket path."""
    with harness.oauth_sidecar(tmp / name, service="crm", server=SERVER, endpoint=ENDPOINT,
                               token_url=peer.token_url, client_id=CLIENT_ID, client_secret=CLIENT_SECRET,
                               scope=SCOPE, settings=f'refresh_ahead = "{refresh_ahead}"') as proc:
        yield proc.socket


def headers_route_seconds(socket: Path) -> dict[str, float | None]:
    """The sidecar's own view of the headers route (GET /metrics: from its request parsed to its
    answer written), to tell time spent in the sidecar from time queued in the clients or the kernel."""
    _, text = wire.http_get(str(socket), "/metrics")
    count = total = 0.0
    for line in text.decode().splitlines():
        name, _, value = line.rpartition(" ")
        if "headers" not in name:
            continue
        if name.startswith("mcpcreds_request_seconds_count{"):
            count += float(value)
        elif name.startswith("mcpcreds_request_seconds_sum{"):
            total += float(value)
    return {"requests": count, "mean_ms": round(total / count * 1e3, 3) if count else None}


def first_error(out: list[dict[str, Any]]) -> str:
    return harness.first_error(r["first_error"] for r in out)


# ----------------------------------------------------------------------------------------- phases


def run_cold(pool: harness.Workers, peer: OidcPeer, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    peer.set_ttl(COLD_TTL)
    peer.reset_stats()
    with sidecar(peer, tmp, "cold", args.refresh_ahead) as socket:
        before = 0

        def count() -> None:
            nonlocal before
            before = peer.stats()["token_requests"]

        out = pool.run(cold, [{"socket": str(socket), "calls": args.calls}] * args.processes, timeout=120.0,
                       before_release=count)
        stats = peer.stats()
        status = harness.status_entry(socket, "logins", SERVICE_KEY)
        inside = headers_route_seconds(socket)
    latencies = [lat for r in out for lat in r["latencies"]]
    fingerprints = sorted({f for r in out for f in r["fingerprints"]})
    return {
        "processes": args.processes, "calls": args.processes * args.calls, "answered": len(latencies),
        "errors": sum(r["errors"] for r in out), "first_error": first_error(out),
        "token_requests_before_release": before, "token_requests": stats["token_requests"],
        "fingerprints": len(fingerprints), **latency_ms(latencies),
        "sidecar_side_mean_ms": inside["mean_ms"],
        "sidecar_status": {k: status.get(k) for k in ("token_requests", "renewals", "shared_fetches")},
    }


def run_baseline(pool: harness.Workers, peer: OidcPeer, args: argparse.Namespace) -> dict[str, Any]:
    peer.set_ttl(COLD_TTL)
    peer.reset_stats()
    out = pool.run(baseline, [{"token_url": peer.token_url}] * args.processes, timeout=60.0)
    stats = peer.stats()
    latencies = [lat for r in out for lat in r["latencies"]]
    return {
        "processes": args.processes, "tokens_received": sum(r["tokens"] for r in out),
        "errors": sum(r["errors"] for r in out), "first_error": first_error(out),
        "token_requests": stats["token_requests"], **latency_ms(latencies),
    }


def run_steady(pool: harness.Workers, peer: OidcPeer, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    duration = args.ttl * args.lifetimes
    peer.set_ttl(args.ttl)
    peer.reset_stats()
    with sidecar(peer, tmp, "steady", args.refresh_ahead) as socket:
        before = 0
        stats: dict[str, Any] = {}
        status: dict[str, Any] = {}
        stats_lag = 0.0

        def count() -> None:
            nonlocal before
            before = peer.stats()["token_requests"]

        def at_end(start: float) -> None:
            nonlocal stats, stats_lag, status
            harness.sleep_until(start + duration)
            stats = peer.stats()  # at the end of the run, before any later renewal
            stats_lag = time.monotonic() - (start + duration)
            status = harness.status_entry(socket, "logins", SERVICE_KEY)

        params = {"socket": str(socket), "interval": args.interval, "duration": duration}
        out = pool.run(steady, [params] * args.processes, timeout=duration + 60.0, start_delay=0.2,
                       before_release=count, while_running=at_end)
    first_seen: dict[str, float] = {}  # fingerprint -> first receipt by any process
    for r in out:
        for fp, (_exp, seen) in r["tokens"].items():
            first_seen[fp] = min(seen, first_seen.get(fp, seen))
    arrivals = sorted(first_seen.values())
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    latencies = [lat for r in out for lat in r["latencies"]]
    calls = sum(r["calls"] for r in out)
    lefts = [r["min_left"] for r in out if r["min_left"] is not None]
    skews = [r["max_skew"] for r in out if r["max_skew"] is not None]
    return {
        "processes": args.processes, "ttl_s": args.ttl, "lifetimes": args.lifetimes, "seconds": duration,
        "interval_s": args.interval, "refresh_ahead": args.refresh_ahead, "calls": calls,
        "calls_per_s": round(calls / duration, 1),
        "errors": sum(r["errors"] for r in out), "first_error": first_error(out),
        "expired_receipts": sum(r["expired_exp"] for r in out),
        "expired_by_expires_at": sum(r["expired_expires_at"] for r in out),
        "min_time_left_s": round(min(lefts), 3) if lefts else None,
        "max_expires_at_minus_exp_s": round(max(skews), 3) if skews else None,
        "distinct_tokens": len(first_seen),
        "new_token_every_s": round(sum(gaps) / len(gaps), 3) if gaps else None,
        "shortest_token_gap_s": round(min(gaps), 3) if gaps else None,
        "token_requests_before_start": before,
        "token_requests": stats["token_requests"], "token_issued": stats["token_issued"],
        "stats_read_after_end_s": round(stats_lag, 3),
        **latency_ms(latencies),
        "sidecar_status_after_run": {k: status.get(k) for k in ("state", "token_requests", "renewals",
                                                                "shared_fetches")},
    }


# ------------------------------------------------------------------------------------------- main


def targets(cold: dict[str, Any], steady: dict[str, Any]) -> list[dict[str, Any]]:
    limit = steady["lifetimes"] + 1
    return [
        {"target": "cold burst: token requests == 1", "value": cold["token_requests"],
         "met": cold["token_requests"] == 1},
        {"target": "cold burst: distinct tokens == 1", "value": cold["fingerprints"],
         "met": cold["fingerprints"] == 1},
        {"target": "cold burst: every call answered", "value": cold["errors"], "met": cold["errors"] == 0},
        {"target": "steady: expired receipts == 0", "value": steady["expired_receipts"],
         "met": steady["expired_receipts"] == 0 and steady["expired_by_expires_at"] == 0},
        {"target": f"steady: token requests <= {limit}", "value": steady["token_requests"],
         "met": steady["token_requests"] <= limit},
        {"target": "steady: every call answered", "value": steady["errors"], "met": steady["errors"] == 0},
    ]


def notes(report: dict[str, Any]) -> list[str]:
    """Facts from the figures that bear on a missed steady-run target."""
    steady = report["steady"]
    by_name = {t["target"]: t for t in report["targets"]}
    out = []
    limit = steady["lifetimes"] + 1
    every = steady["new_token_every_s"]
    if not by_name[f"steady: token requests <= {limit}"]["met"] and every:
        out.append(f"note: a new token every {every} s = {every / steady['ttl_s']:.2f} of the "
                   f"{steady['ttl_s']} s lifetime; <= {limit} requests in {steady['seconds']} s needs "
                   f"one every > {steady['seconds'] / limit:.2f} s")
    skew = steady["max_expires_at_minus_exp_s"]
    if steady["expired_receipts"] and skew is not None and skew > 0:
        out.append(f"note: the answers' expires_at was up to {skew} s later than the token's JWT exp; "
                   f"calls received tokens up to {-steady['min_time_left_s']} s past their exp")
    return out


def render(report: dict[str, Any]) -> str:
    cold, base, steady = report["cold_burst"], report["baseline"], report["steady"]
    s = steady["sidecar_status_after_run"]
    out = [
        f"cold burst: {cold['calls']:,} concurrent headers calls from {cold['processes']} processes "
        f"({report['cpus']} CPUs, load average {report['load_average_1m_at_start']} at the start)",
        harness.table([
            ("", "sidecar", "baseline (authlib per process)"),
            ("token requests at the IdP", str(cold["token_requests"]), str(base["token_requests"])),
            ("distinct tokens received", str(cold["fingerprints"]), str(base["tokens_received"])),
            ("calls answered / errors", f"{cold['answered']} / {cold['errors']}",
             f"{base['tokens_received']} / {base['errors']}"),
            ("latency p50 ms", ms(cold["p50_ms"]), ms(base["p50_ms"])),
            ("latency p99 ms", ms(cold["p99_ms"]), ms(base["p99_ms"])),
            ("latency max ms", ms(cold["max_ms"]), ms(base["max_ms"])),
            ("  of which in the sidecar, mean ms", ms(cold["sidecar_side_mean_ms"]), ""),
        ]),
        harness.ratio_line("token requests in the cold burst", ("sidecar", cold["token_requests"]),
                           ("baseline", base["token_requests"])),
        "",
        f"steady run: {steady['lifetimes']} lifetimes of a {steady['ttl_s']} s token "
        f"({steady['seconds']} s), "
        f"{steady['processes']} processes, a call every {steady['interval_s'] * 1e3:.0f} ms each, "
        f"refresh_ahead {steady['refresh_ahead']}",
        harness.table([
            ("figure", "value"),
            ("calls (per s)", f"{steady['calls']:,} ({steady['calls_per_s']:,.0f})"),
            ("errors", str(steady["errors"])),
            ("expired receipts (JWT exp)", str(steady["expired_receipts"])),
            ("expired receipts (expires_at)", str(steady["expired_by_expires_at"])),
            ("least time left at receipt s", f"{steady['min_time_left_s']}"),
            ("max expires_at - JWT exp s", f"{steady['max_expires_at_minus_exp_s']}"),
            ("distinct tokens received", str(steady["distinct_tokens"])),
            ("a new token every s (shortest gap)", f"{steady['new_token_every_s']} "
                                                   f"({steady['shortest_token_gap_s']})"),
            ("token requests at the IdP", str(steady["token_requests"])),
            ("sidecar status after: token_requests / renewals / shared",
             f"{s['token_requests']} / {s['renewals']} / {s['shared_fetches']}"),
            ("latency p50 / p99 / max ms",
             f"{ms(steady['p50_ms'], 2)} / {ms(steady['p99_ms'], 2)} / {ms(steady['max_ms'])}"),
        ]),
        "",
        harness.table([("target", "measured", "met"),
                       *((t["target"], str(t["value"]), "yes" if t["met"] else "NO")
                         for t in report["targets"])]),
    ]
    out.extend(notes(report))
    for name, phase in (("cold burst", cold), ("baseline", base), ("steady run", steady)):
        if phase["first_error"]:
            out.append(f"{name}: first error: {phase['first_error']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--ttl", type=harness.count, default=15,
                   help="token lifetime in the steady run, s (default 15)")
    p.add_argument("--lifetimes", type=harness.count, default=10,
                   help="length of the steady run in lifetimes (10)")
    p.add_argument("--processes", type=harness.count, default=8, help="client processes (default 8)")
    p.add_argument("--calls", type=harness.count, default=125,
                   help="concurrent cold calls per process (default 125)")
    p.add_argument("--interval", type=harness.positive, default=0.02,
                   help="steady: s between calls per process (0.02)")
    p.add_argument("--refresh-ahead", default="0.25s",
                   help="the sidecar's refresh_ahead (default 0.25s: 11 logins in 10 lifetimes "
                        "needs a renewal in the last 1/11 of each)")
    args = harness.parse(p, argv, quick={"ttl": 2, "lifetimes": 1, "processes": 2, "calls": 10})

    started = time.monotonic()
    load = os.getloadavg()[0]  # latencies depend on what else the machine runs; the counts do not
    with harness.workdir("login-bench") as tmp, \
            harness.Workers(args.processes) as pool, \
            harness.oidc_peer(CLIENT_ID, CLIENT_SECRET, SCOPE, COLD_TTL) as peer:  # while the processes start
        harness.progress("cold burst...")
        cold_burst = run_cold(pool, peer, tmp, args)
        harness.progress("baseline...")
        base = run_baseline(pool, peer, args)
        harness.progress(f"steady run ({args.ttl * args.lifetimes} s)...")
        steady_run = run_steady(pool, peer, tmp, args)
    report: dict[str, Any] = {
        **harness.machine(), "load_average_1m_at_start": round(load, 2),
        "wall_s": round(time.monotonic() - started, 1),
        "cold_burst": cold_burst, "baseline": base, "steady": steady_run,
    }
    report["targets"] = targets(cold_burst, steady_run)
    report["ok"] = all(t["met"] for t in report["targets"])
    harness.emit(args, report, render)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    harness.main(main)
