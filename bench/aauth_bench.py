"""AAuth bench (issue 15): what signing costs.

Run from the repository root (the package installed, e.g. `pip install -e .`):

    python bench/aauth_bench.py              # 5,000 signatures, 2,000 requests per route
    python bench/aauth_bench.py --signatures 5000 --requests 2000 --json
    python bench/aauth_bench.py --quick      # a smoke run: 500 signatures, 200 requests per route

1. In the sidecar's process: `AgentKey.sign` of a typical MCP POST (1 KiB JSON body: the RFC 9530
   digest, the signature base, Ed25519, the three headers), p50/p99 in µs; baseline in the same run,
   the bare Ed25519 signature of a base of the same size (`cryptography`), so the ratio is what the
   HTTP Message Signatures glue adds to the cryptography. Also the same request signed with a P-256
   agent key (`[aauth] alg = "ES256"`), against the Ed25519 one.
2. Over the socket, one keep-alive connection, one request at a time: `POST
   /v1/servers/signed/sign` (a digest and a header to cover) against a cached `GET
   /v1/servers/plain/headers`, same run, same sidecar: the added latency of the sign route.
"""

from __future__ import annotations

import functools
import json
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for bench.harness

from bench import harness, wire

SIGNED_AT = 1_800_000_000  # a fixed `created`: every signature of the run has the same base size


def _p50_p99_us(samples_ns: list[int]) -> tuple[float, float]:
    p50, p99 = harness.percentiles(samples_ns, 0.5, 0.99)
    return p50 / 1e3, p99 / 1e3


def in_process(n: int) -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from mcpcreds.signers import httpsig
    from mcpcreds.signers.aauth import AgentKey

    raw = Ed25519PrivateKey.generate()
    key = AgentKey(raw, Path("/nonexistent"))
    es_key = AgentKey(ec.generate_private_key(ec.SECP256R1()), Path("/nonexistent"))
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "echo", "arguments": {"text": "x" * 900}}}).encode()
    headers = [("accept", "application/json, text/event-stream"), ("content-type", "application/json"),
               ("mcp-session-id", "0" * 32), ("mcp-protocol-version", "2025-06-18")]
    url = "https://tools.example.com/mcp"
    sample = key.sign("POST", url, headers, body, SIGNED_AT)
    components = [("@method", "POST"), ("@authority", "tools.example.com"), ("@path", "/mcp"),
                  ("signature-key", sample.signature_key), ("content-digest", sample.content_digest or "")]
    base = httpsig.signature_base(components, sample.signature_input.partition("=")[2])  # the same size
    samples = harness.in_turns({"glue": functools.partial(key.sign, "POST", url, headers, body, SIGNED_AT),
                                "bare": functools.partial(raw.sign, base),
                                "es": functools.partial(es_key.sign, "POST", url, headers, body, SIGNED_AT)},
                               calls=n, warmup=n // 10)
    (g50, g99), (b50, b99), (e50, e99) = (_p50_p99_us(samples[k]) for k in ("glue", "bare", "es"))
    return {"n": n, "sign_p50_us": round(g50, 1), "sign_p99_us": round(g99, 1),
            "ed25519_p50_us": round(b50, 1), "ed25519_p99_us": round(b99, 1),
            "es256_sign_p50_us": round(e50, 1), "es256_sign_p99_us": round(e99, 1)}


def over_socket(n: int) -> dict[str, Any]:
    digest = "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"
    ask = {"method": "POST", "url": "https://tools.example.com/mcp", "content_digest": digest,
           "headers": {"content-type": "application/json"}}
    sign_body = json.dumps(ask).encode()
    sign = wire.request_bytes("POST", "/v1/servers/signed/sign", sign_body)
    headers = wire.request_bytes("GET", "/v1/servers/plain/headers")
    signed_server = '[[servers]]\nname = "signed"\nendpoint = "https://tools.example.com/mcp"\naauth = true\n'
    plain = harness.static_server("plain", {"Authorization": "Bearer {{secret:BENCH_TOKEN}}"})
    env = {"BENCH_TOKEN": "bench-token-0123456789abcdef"}
    with harness.workdir("aauth") as folder, harness.sidecar(folder, signed_server, plain, env=env) as proc, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(proc.socket))
        results = harness.in_turns({"sign": functools.partial(wire.roundtrip_ok, sock, sign),
                                    "headers": functools.partial(wire.roundtrip_ok, sock, headers)},
                                   calls=n, warmup=max(20, n // 10))  # the warm-up: the key, the cache
    (s50, s99), (h50, h99) = _p50_p99_us(results["sign"]), _p50_p99_us(results["headers"])
    return {"n": n, "sign_route_p50_us": round(s50, 1), "sign_route_p99_us": round(s99, 1),
            "headers_p50_us": round(h50, 1), "headers_p99_us": round(h99, 1)}


def render(report: dict[str, Any]) -> str:
    a, b = report["in_process"], report["socket"]
    return "\n".join([
        f"in process ({a['n']} requests: a 1 KiB MCP POST)",
        f"  ed25519 alone      p50 {a['ed25519_p50_us']:8.1f} us   p99 {a['ed25519_p99_us']:8.1f} us",
        f"  AAuth signature    p50 {a['sign_p50_us']:8.1f} us   p99 {a['sign_p99_us']:8.1f} us",
        harness.ratio_line("signing p50 us", ("AAuth signature", a["sign_p50_us"]),
                           ("ed25519 alone", a["ed25519_p50_us"])),
        f"  AAuth ES256        p50 {a['es256_sign_p50_us']:8.1f} us   p99 {a['es256_sign_p99_us']:8.1f} us",
        harness.ratio_line("signing p50 us", ("AAuth ES256", a["es256_sign_p50_us"]),
                           ("AAuth Ed25519", a["sign_p50_us"])),
        f"over the socket ({b['n']} requests each, 1 connection)",
        f"  cached headers     p50 {b['headers_p50_us']:8.1f} us   p99 {b['headers_p99_us']:8.1f} us",
        f"  sign route         p50 {b['sign_route_p50_us']:8.1f} us   p99 {b['sign_route_p99_us']:8.1f} us",
        f"  added by sign      p50 {b['sign_route_p50_us'] - b['headers_p50_us']:8.1f} us",
        harness.ratio_line("route p50 us", ("sign", b["sign_route_p50_us"]),
                           ("cached headers", b["headers_p50_us"])),
    ])


def main(argv: list[str] | None = None) -> int:
    p = harness.arguments(__doc__)
    p.add_argument("--signatures", type=harness.count, default=5000,
                   help="signatures of each kind (default 5000)")
    p.add_argument("--requests", type=harness.count, default=2000, help="requests per route (default 2000)")
    args = harness.parse(p, argv, quick={"signatures": 500, "requests": 200})
    report = {"machine": harness.machine(), "in_process": in_process(args.signatures),
              "socket": over_socket(args.requests)}
    harness.emit(args, report, render)
    return 0


if __name__ == "__main__":
    harness.main(main)
