"""A person's login in front of a real MCP server (issue 16): the config names only the MCP
endpoint, `mcpcreds login` finds the authorization server through the server's protected-resource
metadata (RFC 9728, served by the MCP SDK), the device flow is approved in the 'browser', and the
MCP SDK's client then calls a tool with `auth=creds.auth(name)`: the access token the sidecar
renewed from the refresh token, for the server's own resource (aud)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mcpcreds import AsyncClient
from tests.conftest import KeyringSession, module_peer
from tests.peers.mcp_server import McpServerPeer, start_mcp_server
from tests.peers.oidc_peer import OidcPeer
from tests.sidecar_proc import run_sidecar
from tests.test_login_e2e import Setup

OIDC_CLIENTS: list[dict[str, Any]] = [
    {"client_id": "c-device-mcp", "token_endpoint_auth_method": "none",
     "grant_types": ["urn:ietf:params:oauth:grant-type:device_code", "refresh_token"], "scope": "tools:read"},
]


@pytest.fixture(scope="module")
def peer(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, 3600)


@pytest.fixture(scope="module")
def mcp_server(peer: OidcPeer) -> Iterator[McpServerPeer]:
    with start_mcp_server(peer.issuer, peer.jwks_uri) as server:
        yield server


async def test_a_device_login_found_by_resource_metadata_calls_a_tool(
        peer: OidcPeer, mcp_server: McpServerPeer, tmp_path: Path, keyring_session: KeyringSession) -> None:
    setup = Setup(peer, tmp_path, f"mcpcreds-login-mcp-{uuid.uuid4().hex[:8]}")
    setup.config.write_text(f"""
[sidecar]
socket = "{setup.socket}"
[secrets]
sources = ["env", "keyring"]
keyring_service = "{setup.service}"
keyring_timeout = "30s"  # a bound only a hung keyring crosses, not a busy machine
[[servers]]
name = "notes"
endpoint = "{mcp_server.url}"
auth = {{ kind = "oauth2", grant = "device", client_id = "c-device-mcp", scopes = ["tools:read"] }}
""")
    with run_sidecar(setup.config, setup.socket, setup.env) as sidecar:
        code, output, url = setup.login("notes")
        assert code == 0, output
        assert url.startswith(peer.issuer + "/device")  # the authorization server the metadata named
        sidecar.wait_for("refresh token rotated")
        async with (
            AsyncClient(sidecar.socket) as creds,
            httpx2.AsyncClient(auth=creds.auth("notes")) as http,
            streamable_http_client(mcp_server.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool("echo", {"text": "hello"})
        assert not result.is_error and result.structured_content is not None
        assert result.structured_content["result"] == "hello"
        stored = setup.stored("mcp:notes")
        assert stored is not None and stored not in sidecar.log and stored not in output
    # the only unauthenticated requests are discovery's pings for the 401's resource_metadata (the
    # MCP spec's first place to look): every request of the MCP client carried a valid token
    posts = mcp_server.stats()["posts"]
    assert all(p["method"] == "ping" for p in posts if p["status"] == 401), posts
