"""The client command of the MCP conformance suite (`npx conformance client --command ...`):
mcpcreds as a new user would set it up for the scenario's MCP server.

    python tests/peers/conformance_client.py SERVER_URL

The suite sets MCP_CONFORMANCE_SCENARIO and, for some scenarios, MCP_CONFORMANCE_CONTEXT (JSON:
client_id and client_secret, or private_key_pem and signing_algorithm; for cross-app access also
idp_issuer, idp_client_id, idp_id_token and idp_token_endpoint). The adapter
1. writes a sidecar config with one server, `conf`, whose endpoint is SERVER_URL, by the
   scenario (MCP_CONFORMANCE_SCENARIO): `client-credentials-*` a client credentials login from
   the context; `cross-app-access-*` an enterprise-managed login (grant = "cross_app": the
   context's ID token exchanged at its IdP, the ID-JAG redeemed as its client); else a person
   login (grant = "authorization_code"), as the pre-registered client the context names
   (`pre-registration`), or with client_id = the suite's client metadata document URL, as its
   own clients use (taken as is where the authorization server advertises Client ID Metadata
   Documents, else `mcpcreds login` registers a client, RFC 7591); everything else from
   discovery;
2. for a person login runs `mcpcreds login conf --no-browser`, fetches the URL it prints and
   follows the redirects as a browser would (the suite's authorization server approves at once
   and redirects to the login's loopback callback), and waits for the login to end (a login
   that fails ends the adapter with a `conformance-client: refused: login exited N: ...` line);
3. starts the sidecar, and runs the MCP SDK 2.x client with `auth=creds.auth("conf")`:
   initialize, list the tools, call `test-tool` when the server lists it. When the session ends
   with `login_required` (a step-up: the server answered `403 insufficient_scope` naming a scope
   the login did not ask for), it does what a person would: runs the command named (the same
   login, which takes the wider scope the sidecar recorded) and starts over, at most MAX_LOGINS
   logins in all. A 403 handed back (a step-up that would not help) ends it with a
   `conformance-client: refused: ...` line.

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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcpcreds import AsyncClient  # noqa: E402
from mcpcreds.errors import LoginRequired  # noqa: E402
from tests.sidecar_proc import run_sidecar  # noqa: E402

NAME = "conf"
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"
MAX_LOGINS = 3  # a step-up is a new login: at most two of them after the first
LOGIN_TIMEOUT = 20  # seconds: `mcpcreds login --timeout`
URL_LINE = re.compile(r"(https?://\S+)")


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def server_auth(scenario: str, context: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The server's `auth` inline table, and the environment its secrets come from."""
    if scenario.startswith("auth/cross-app-access"):
        # enterprise-managed: the person's ID token from the IdP (here the suite's), exchanged at
        # the IdP for an ID-JAG, redeemed at the MCP server's authorization server as this client
        return (f'{{ kind = "oauth2", grant = "cross_app", client_id = {_toml(context["client_id"])}, '
                'client_secret = "{{secret:CONF_CLIENT_SECRET}}", '
                f'idp_issuer = {_toml(context["idp_issuer"])}, idp_client_id = {_toml(context["idp_client_id"])}, '
                'subject_token = "{{secret:CONF_ID_TOKEN}}" }',
                {"CONF_CLIENT_SECRET": context["client_secret"], "CONF_ID_TOKEN": context["idp_id_token"]})
    if "client_id" in context and "client_secret" in context:
        # a client's own login, or a person's login as a pre-registered confidential client
        grant = "" if scenario.startswith("auth/client-credentials") else ', grant = "authorization_code"'
        return (f'{{ kind = "oauth2"{grant}, client_id = {_toml(context["client_id"])}, '
                'client_secret = "{{secret:CONF_CLIENT_SECRET}}" }',
                {"CONF_CLIENT_SECRET": context["client_secret"]})
    if "client_id" in context and "private_key_pem" in context:
        alg = context.get("signing_algorithm")
        return (f'{{ kind = "oauth2", client_id = {_toml(context["client_id"])}, '
                'auth_method = "private_key_jwt", private_key = "{{secret:CONF_PRIVATE_KEY}}"'
                + (f", signing_alg = {_toml(alg)}" if alg else "") + " }",
                {"CONF_PRIVATE_KEY": context["private_key_pem"]})
    # a person login whose client_id is the client's metadata document URL (the suite's, as its
    # own clients use it): taken as is where the server advertises Client ID Metadata Documents,
    # else `mcpcreds login` registers a client (RFC 7591)
    return (f'{{ kind = "oauth2", grant = "authorization_code", client_id = {_toml(CLIENT_METADATA_URL)} }}',
            {})


def write_config(workdir: Path, url: str, scenario: str,
                 context: dict[str, Any]) -> tuple[Path, Path, dict[str, str]]:
    socket = workdir / "run" / "s.sock"
    auth, env = server_auth(scenario, context)
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = {_toml(str(socket))}
[secrets]
sources = ["env", "keyring"]
keyring_service = {_toml("mcpcreds-conformance-" + uuid.uuid4().hex)}
keyring_timeout = "30s"  # a bound only a hung keyring crosses, not a busy machine

[[servers]]
name = {_toml(NAME)}
endpoint = {_toml(url)}
auth = {auth}
""")
    return config, socket, env


def login(config: Path, env: dict[str, str]) -> None:
    """`mcpcreds login NAME --no-browser`, its URL followed as a browser would."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcpcreds.cli.main", "login", NAME, "--no-browser", "--config", str(config),
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
    lines += rest.splitlines(keepends=True)
    sys.stderr.write("".join("login: " + line for line in rest.splitlines(keepends=True)))
    if proc.returncode != 0:
        # the login refused the server (e.g. metadata for another resource): said on stdout, where
        # tests/test_conformance.py reads how the adapter ended
        why = next((line.strip() for line in reversed(lines) if line.startswith("mcpcreds: ")), "")
        print(f"conformance-client: refused: login exited {proc.returncode}: {why}", flush=True)
        raise SystemExit(1)


def login_required(exc: BaseException) -> LoginRequired | None:
    """The LoginRequired an MCP session ended with (the SDK raises it in an exception group)."""
    if isinstance(exc, LoginRequired):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := login_required(inner)) is not None:
                return found
    return None


def innermost(exc: BaseException) -> BaseException:
    """The first exception an exception group holds, at any depth (the SDK's task groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def use_server(socket: Path, url: str) -> None:
    import httpx2  # here: a login that fails ends the adapter without the SDK's import time
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

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
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    workdir = Path(tempfile.mkdtemp(prefix="mcc-"))  # short: the socket path has a length limit
    try:
        config, socket, env = write_config(workdir, url, scenario, context)
        person = 'grant = "authorization_code"' in config.read_text()
        if person:
            login(config, env)
        logins = 1
        with run_sidecar(config, socket, env) as sidecar:
            try:
                while True:
                    try:
                        asyncio.run(use_server(socket, url))
                        break
                    except Exception as exc:  # the SDK raises in an exception group
                        required = login_required(exc)
                        if required is None or not person or logins >= MAX_LOGINS:
                            # the 403 of a step-up that would not help, handed back by creds.auth
                            leaf = innermost(exc)
                            print(f"conformance-client: refused: {type(leaf).__name__}: {leaf}", flush=True)
                            return 1
                        # what a person does when told: run the command named (a step-up)
                        sys.stderr.write(f"adapter: {required.message}\n")
                        login(config, env)
                        logins += 1
            finally:
                sys.stderr.write(sidecar.log)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("conformance-client: ok", flush=True)  # tests/test_conformance.py looks for it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
