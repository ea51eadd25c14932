"""Sidecars on a shared state (a real redis-server), logging in at the shared oidc-provider:
the setup that tests/test_redis_e2e.py and tests/test_redis_faults.py have in common."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from mcpcreds import StateUnavailable
from tests.peers.oidc_peer import OidcPeer
from tests.sidecar_proc import SidecarProcess, run_sidecar

STATE_KEY = "state-key-for-tests-0123456789"
LIVENESS = 30.0  # generous: what must happen by itself (back on Redis, an event seen) happens well within


def oidc_client(client_id: str, secret: str) -> dict[str, Any]:
    """A client_secret_basic client of the shared peer, allowed `tools:read`."""
    return {"client_id": client_id, "client_secret": secret,
            "token_endpoint_auth_method": "client_secret_basic", "scope": "tools:read"}


def oauth_line(peer: OidcPeer, client_id: str) -> str:
    """The `oauth = {...}` line of a server or service logging in as `client_id` (its secret is
    the template {{secret:CRM_SECRET}})."""
    return (f'oauth = {{ token_url = "{peer.token_url}", client_id = "{client_id}", '
            'client_secret = "{{secret:CRM_SECRET}}", scope = "tools:read" }')


def start_on_state(stack: ExitStack, workdir: Path, state_url: str, body: str, env: dict[str, str],
                   extra: str = "") -> SidecarProcess:
    """One sidecar in `workdir` on the shared state `state_url`: the [sidecar] section (plus
    `extra`), env secrets, then `body` (services and servers). STATE_KEY is supplied."""
    workdir.mkdir(parents=True, exist_ok=True)
    socket = workdir / "run" / "s.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
state = "{state_url}"
state_key = "{{{{secret:STATE_KEY}}}}"
{extra}
[secrets]
sources = ["env"]
{body}""")
    return stack.enter_context(run_sidecar(config, socket, {"STATE_KEY": STATE_KEY, **env}))


def until_state_available(call: Callable[[], dict[str, Any]], seconds: float = LIVENESS) -> dict[str, Any]:
    """Call until it no longer fails with StateUnavailable: the sidecar probes Redis again a moment
    after a failure (a liveness bound, not a timing window)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except StateUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
