"""`mcpcreds aauth show-key`: the AAuth agent's public key (a JWK) and its RFC 7638 thumbprint, as
the running sidecar reports them in `/v1/status` (the private key never leaves the sidecar).
`mcpcreds aauth rotate-key`: a new agent key (`POST /v1/aauth/rotate-key`), with overlap."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

Handler = Callable[[argparse.Namespace], int]


def cmd_aauth(args: argparse.Namespace) -> int:
    from ..client.calls import Call, whole
    from .common import client_of

    if args.action == "rotate-key":
        with client_of(args) as client:
            rotated = client.run(Call("POST", "/v1/aauth/rotate-key", whole, {}))
        print(f"rotated: thumbprint {rotated.get('thumbprint')} (was {rotated.get('previous')})")
        return 0
    with client_of(args) as client:
        status = client.status()
    agent = status.get("aauth") if isinstance(status, dict) else None
    if not isinstance(agent, dict):
        print("mcpcreds: no AAuth agent key is loaded (no server signs: aauth = true, or [aauth] "
              "default / provider)", file=sys.stderr)
        return 1
    if args.json:
        json.dump({k: agent.get(k) for k in ("public_jwk", "thumbprint", "key_file", "scheme")},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"thumbprint  {agent.get('thumbprint')}")
        print(f"public JWK  {json.dumps(agent.get('public_jwk'), separators=(',', ':'))}")
        print(f"key file    {agent.get('key_file')}")
        print(f"scheme      {agent.get('scheme')}")
    return 0


def add_parser(add_client: Callable[[str, Handler, str], Any]) -> None:
    p = add_client("aauth", cmd_aauth, "the AAuth agent key: `aauth show-key` prints its public JWK and "
                   "thumbprint (the private key stays in the sidecar); `aauth rotate-key` replaces it, "
                   "the old key signing until the new one is ready")
    p.add_argument("action", metavar="ACTION", choices=("show-key", "rotate-key"),
                   help="show-key or rotate-key")
    p.add_argument("--json", action="store_true", help="print JSON")
