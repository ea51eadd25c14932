"""The client command of the MCP conformance suite (`npx conformance client --command ...`):
mcpcreds as a new user would set it up for the scenario's MCP server.

    python tests/peers/conformance_client.py SERVER_URL

The suite sets MCP_CONFORMANCE_SCENARIO and, for the client-credentials scenarios,
MCP_CONFORMANCE_CONTEXT (JSON: client_id and client_secret, or private_key_pem and
signing_algorithm). The adapter
1. writes a sidecar config with one server, `conf`, whose endpoint is SERVER_URL: a client
   credentials login from the context, else a person login (grant = "authorization_code", no
   client_id: `mcpcreds login` registers a client, RFC 7591; everything else from discovery);
2. for a person login runs `mcpcreds login conf --no-browser`, fetches the URL it prints and
   follows the redirects as a browser would (the suite's authorization server approves at once
   and redirects to the login's loopback callback), and waits for the login to end;
3. starts the sidecar, and runs the MCP SDK 2.x client with `auth=creds.auth("conf")`:
   initialize, list the tools, call `test-tool` when the server lists it.

Secrets reach the sidecar through its environment (the `env` source); a person login's refresh
token goes to the keyring the environment offers (the test runs the suite with a private
gnome-keyring on its own D-Bus, as tests/test_login_e2e.py does), under a keyring service of
its own per run (the suite issues no refresh token: the login is then its access token). Exit 0
when every step worked; the suite judges the rest from what its servers
saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcpcreds import AsyncClient  # noqa: E402
from tests.sidecar_proc import run_sidecar  # noqa: E402

NAME = "conf"
LOGIN_TIMEOUT = 20  # seconds: `mcpcreds login --timeout`
URL_LINE = re.compile(r"(https?://\S+)")


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def server_auth(context: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The server's `auth` inline table, and the environment its secrets come from."""
    if "client_id" in context and "client_secret" in context:
        return (f'{{ kind = "oauth2", client_id = {_toml(context["client_id"])}, '
                'client_secret = "{{secret:CONF_CLIENT_SECRET}}" }',
                {"CONF_CLIENT_SECRET": context["client_secret"]})
    if "client_id" in context and "private_key_pem" in context:
        alg = context.get("signing_algorithm")
        return (f'{{ kind = "oauth2", client_id = {_toml(context["client_id"])}, '
                'auth_method = "private_key_jwt", private_key = "{{secret:CONF_PRIVATE_KEY}}"'
                + (f", signing_alg = {_toml(alg)}" if alg else "") + " }",
                {"CONF_PRIVATE_KEY": context["private_key_pem"]})
    # a person login with no client_id: `mcpcreds login` registers one (RFC 7591)
    return ('{ kind = "oauth2", grant = "authorization_code" }', {})


def write_config(workdir: Path, url: str, context: dict[str, Any]) -> tuple[Path, Path, dict[str, str]]:
    socket = workdir / "run" / "s.sock"
    auth, env = server_auth(context)
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = {_toml(str(socket))}
[secrets]
sources = ["env", "keyring"]
keyring_service = {_toml("mcpcreds-conformance-" + uuid.uuid4().hex)}

[[servers]]
name = {_toml(NAME)}
endpoint = {_toml(url)}
auth = {auth}
""")
    return config, socket, env


def login(config: Path, env: dict[str, str]) -> None:
    """`mcpcreds login NAME --no-browser`, its URL followed as a browser would."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcpcreds.cli", "login", NAME, "--no-browser", "--config", str(config),
         "--timeout", str(LOGIN_TIMEOUT)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env})
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            sys.stderr.write("login: " + line)
            found = URL_LINE.search(line)
            if found and "code_challenge=" in found.group(1):
                # the suite's server redirects straight to the loopback callback
                httpx.get(found.group(1), follow_redirects=True, timeout=10)
                break
        _, rest = proc.communicate(timeout=LOGIN_TIMEOUT + 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    sys.stderr.write("".join("login: " + line for line in rest.splitlines(keepends=True)))
    if proc.returncode != 0:
        raise SystemExit(f"mcpcreds login exited {proc.returncode}")


async def use_server(socket: Path, url: str) -> None:
    async with AsyncClient(socket=str(socket)) as creds, \
            httpx2.AsyncClient(auth=creds.auth(NAME), timeout=15) as http, \
            streamable_http_client(url, http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        tools = [tool.name for tool in (await session.list_tools()).tools]
        print(json.dumps({"tools": tools}), flush=True)
        if "test-tool" in tools:
            result = await session.call_tool("test-tool", {})
            print(json.dumps({"test-tool": [getattr(c, "text", None) for c in result.content]}), flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    url = argv[1]
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    workdir = Path(tempfile.mkdtemp(prefix="mcc-"))  # short: the socket path has a length limit
    try:
        config, socket, env = write_config(workdir, url, context)
        if "client_id" not in context:
            login(config, env)
        with run_sidecar(config, socket, env) as sidecar:
            try:
                asyncio.run(use_server(socket, url))
            finally:
                sys.stderr.write(sidecar.log)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("conformance-client: ok", flush=True)  # tests/test_conformance.py looks for it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
