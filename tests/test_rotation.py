"""Rotation with overlap, against a real keyring and a real authorization server, while
eight processes keep calling through the sidecar."""

from __future__ import annotations

import json
import multiprocessing
import time
import uuid
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest

from mcpcreds import Client, TokenEndpointError
from mcpcreds.config import SecretsConfig
from mcpcreds.sources import KeyringSource
from tests.conftest import CANARY, KeyringSession, run_cli
from tests.peers.oidc_peer import OidcPeer, start_oidc_peer
from tests.sidecar_proc import SidecarProcess, run_sidecar

SECRET = "CRM_SECRET"
CLIENT_ID = "rotating"


@pytest.fixture
def peer() -> Iterator[OidcPeer]:
    clients = [{"client_id": CLIENT_ID, "client_secret": f"{CANARY}-0",
                "token_endpoint_auth_method": "client_secret_basic", "scope": "tools:read"}]
    with start_oidc_peer(clients, access_token_ttl=300) as p:
        yield p


@pytest.fixture
def setup(peer: OidcPeer, keyring_session: KeyringSession, tmp_path: Path) -> Iterator[tuple[SidecarProcess, Path]]:
    service = f"mcpcreds-rot-{uuid.uuid4().hex[:8]}"
    KeyringSource(SecretsConfig(keyring_service=service)).set(SECRET, f"{CANARY}-0")
    socket, audit = tmp_path / "run" / "s.sock", tmp_path / "audit.jsonl"
    config = tmp_path / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{audit}"
[secrets]
sources = ["keyring"]
keyring_service = "{service}"
[services.crm]
endpoint = "https://crm.example.com/mcp"
oauth = {{ token_url = "{peer.token_url}", client_id = "{CLIENT_ID}", client_secret = "{{{{secret:{SECRET}}}}}", scope = "tools:read" }}
[[servers]]
name = "crm"
service = "crm"
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:DOCS_KEY}}}}" }}
""")
    KeyringSource(SecretsConfig(keyring_service=service)).set("DOCS_KEY", "docs-key-0")
    with run_sidecar(config, socket) as proc:
        yield proc, audit


def caller(socket: str, stop: Event, out: Any) -> None:
    """One worker process: call the sidecar until told to stop; report (start time, fp, error)."""
    seen: list[tuple[float, str | None, str | None]] = []
    with Client(socket) as client:
        while not stop.is_set():
            started = time.time()
            try:
                seen.append((started, client.headers_info("crm")["fingerprint"], None))
            except Exception as exc:
                seen.append((started, None, repr(exc)))
            time.sleep(0.02)  # pacing, so eight callers leave the two cores some room
    out.put(seen)


def test_100_rotations_under_load_without_a_failed_call(peer: OidcPeer,
                                                         setup: tuple[SidecarProcess, Path]) -> None:
    sidecar, audit = setup
    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    with Client(sidecar.socket) as client:
        generation = {client.headers_info("crm")["fingerprint"]: 0}
        workers = [ctx.Process(target=caller, args=(str(sidecar.socket), stop, out)) for _ in range(8)]
        for w in workers:
            w.start()
        done_at: list[float] = []
        for i in range(1, 101):
            new = f"{CANARY}-{i}"
            peer.set_secret(CLIENT_ID, new, keep_old=True)  # the IdP accepts old and new
            result = client.secret_rotate(SECRET, new)
            assert result["renewed"] == ["service:crm"]
            done_at.append(time.time())
            generation[client.headers_info("crm")["fingerprint"]] = i
            peer.drop_old(CLIENT_ID)  # the old secret is dead from here on
        time.sleep(0.2)  # let every caller make a few requests after the last rotation
        stop.set()
        results = [out.get(timeout=30) for _ in workers]
        for w in workers:
            w.join(10)
    calls = [c for r in results for c in r]
    assert len(calls) > 400 and [c for c in calls if c[2] is not None] == []
    for seen in results:
        for i, rotated_at in enumerate(done_at, start=1):
            after = [fp for started, fp, _ in seen if started > rotated_at]
            if after:  # the first request that began after rotation i has login i or newer
                assert generation[after[0]] >= i  # type: ignore[index]
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["rotation"] * 100
    assert all(line["keys"] == ["service:crm"] and line["uid"] >= 0 for line in lines)
    assert CANARY not in audit.read_text()


def test_rotation_to_a_wrong_secret_changes_nothing(peer: OidcPeer,
                                                     setup: tuple[SidecarProcess, Path]) -> None:
    sidecar, audit = setup
    with Client(sidecar.socket) as client:
        before = client.headers_info("crm")
        result = run_cli("secret", "rotate", SECRET, "--socket", str(sidecar.socket),
                         stdin=f"{CANARY}-wrong\n")
        assert result.code == 1 and "invalid_client" in result.stderr
        assert CANARY not in result.output
        after = client.headers_info("crm")
        assert after["fingerprint"] == before["fingerprint"]  # the current login stays
        # the old secret is still the stored one: a forced renewal with it works
        assert client.invalidate("crm", before["fingerprint"])
        assert client.headers_info("crm")["fingerprint"] != before["fingerprint"]
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["rotation_failed", "invalidation"]
    assert lines[0]["error"] == "invalid_client" and lines[0]["secret"] == SECRET
    assert CANARY not in audit.read_text() and CANARY not in sidecar.log


def test_cli_rotation_and_forced_static_key(peer: OidcPeer, setup: tuple[SidecarProcess, Path]) -> None:
    sidecar, _ = setup
    sock = ["--socket", str(sidecar.socket)]
    peer.set_secret(CLIENT_ID, f"{CANARY}-cli", keep_old=False)
    result = run_cli("secret", "rotate", SECRET, *sock, stdin=f"{CANARY}-cli\n")
    assert result.code == 0, result.output
    assert "renewed: service:crm" in result.stderr
    refused = run_cli("secret", "rotate", "DOCS_KEY", *sock, stdin="docs-key-1\n")
    assert refused.code == 2 and "--force" in refused.stderr
    forced = run_cli("secret", "rotate", "DOCS_KEY", "--force", *sock, stdin="docs-key-1\n")
    assert forced.code == 0
    with Client(sidecar.socket) as client:
        assert client.headers("docs") == {"X-Api-Key": "docs-key-1"}
        status = client.status()
    assert status["secrets"] == {SECRET: ["service:crm"], "DOCS_KEY": ["mcp:docs"]}


def test_rotated_notice_for_a_change_made_elsewhere(peer: OidcPeer, setup: tuple[SidecarProcess, Path],
                                                    keyring_session: KeyringSession) -> None:
    sidecar, _ = setup
    with Client(sidecar.socket) as client:
        first = client.headers_info("crm")["fingerprint"]
        assert client.secret_rotated(SECRET) == ["service:crm"]
        assert client.headers_info("crm")["fingerprint"] != first
        with pytest.raises(Exception) as info:
            client.secret_rotated("NOT_USED")
        assert getattr(info.value, "code", "") == "unknown_secret"
        with pytest.raises(TokenEndpointError):
            peer.set_secret(CLIENT_ID, "something-else", keep_old=False)
            client.secret_rotate(SECRET, f"{CANARY}-x")
