"""Rotation with overlap, against a real keyring (gnome-keyring) and a real authorization server
(oidc-provider), while processes keep calling through the sidecar."""

from __future__ import annotations

import bisect
import contextlib
import json
import multiprocessing
import threading
import time
import uuid
from collections.abc import Iterator
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import pytest
import secretstorage

from mcpcreds import Client, McpcredsError
from mcpcreds.config.model import SecretsConfig
from mcpcreds.credentials.sources import KeyringSource
from tests.conftest import CANARY, KeyringSession, module_peer, run_cli
from tests.peers.oidc_peer import OidcPeer
from tests.sidecar_proc import SidecarProcess, run_sidecar

SECRET = "CRM_SECRET"
CLIENT_ID = "rotating"
OIDC_CLIENTS = [{"client_id": CLIENT_ID, "client_secret": f"{CANARY}-0",  # on the shared peer (conftest)
                 "token_endpoint_auth_method": "client_secret_basic", "scope": "tools:read"}]


@pytest.fixture
def peer(oidc_session: OidcPeer) -> OidcPeer:
    """The shared IdP, where this client's secret is the first one again (tests rotate it)."""
    oidc_session.set_secret(CLIENT_ID, f"{CANARY}-0", keep_old=False)
    return module_peer(oidc_session, 300)


@pytest.fixture
def keyring(keyring_session: KeyringSession) -> KeyringSource:
    """The sidecar's keyring service, on the real gnome-keyring, seen from the test."""
    return KeyringSource(SecretsConfig(keyring_service=f"mcpcreds-rot-{uuid.uuid4().hex[:8]}"))


def stored_values(service: str) -> list[tuple[str, str]]:
    """Every (name, value) the keyring holds for `service`, read straight from the SecretService
    (all collections, every item): a value left behind next to the new one shows up here."""
    connection = secretstorage.dbus_init()
    try:
        items = secretstorage.search_items(connection, {"service": service})
        pairs = [(item.get_attributes()["username"], item.get_secret().decode()) for item in items]
    finally:
        connection.close()
    return sorted(p for p in pairs if p[0] != "__mcpcreds_index__")


@pytest.fixture
def setup(peer: OidcPeer, keyring: KeyringSource, tmp_path: Path) -> Iterator[tuple[SidecarProcess, Path]]:
    service = keyring.service
    keyring.set(SECRET, f"{CANARY}-0")
    socket, audit = tmp_path / "run" / "s.sock", tmp_path / "audit.jsonl"
    config = tmp_path / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{audit}"
[secrets]
sources = ["keyring"]
keyring_service = "{service}"
cache_ttl = "1h"  # static headers change only when a rotation says so
keyring_timeout = "30s"  # a bound only a hung keyring crosses, not a busy machine
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
    keyring.set("DOCS_KEY", "docs-key-0")
    with run_sidecar(config, socket) as proc:
        yield proc, audit


def caller(socket: str, ready: Barrier, stop: Event, out: Any) -> None:
    """One worker process: call the sidecar until told to stop, then once more (that call began
    after the last rotation); report (monotonic start time, fingerprint, error) per call."""
    seen: list[tuple[float, str | None, str | None]] = []
    with Client(socket) as client:
        while True:
            last = stop.is_set()
            started = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
            try:
                seen.append((started, client.headers_info("crm")["fingerprint"], None))
            except Exception as exc:
                seen.append((started, None, repr(exc)))
            if len(seen) == 1:
                with contextlib.suppress(threading.BrokenBarrierError):
                    ready.wait(120)  # the rotations start once every worker is calling
            if last:
                break
            time.sleep(0.02)  # pacing, so the callers leave the two cores some room
    out.put(seen)


@pytest.mark.parametrize(("rotations", "callers"), [
    (10, 4),  # the default run: four processes keep calling (each a fresh interpreter: ~0.5 s)
    pytest.param(100, 8, marks=[pytest.mark.soak, pytest.mark.timeout(900)]),  # CI: pytest -m soak
])
def test_rotations_under_load_without_a_failed_call(rotations: int, callers: int, peer: OidcPeer,
                                                     keyring: KeyringSource,
                                                     setup: tuple[SidecarProcess, Path]) -> None:
    sidecar, audit = setup
    ctx = multiprocessing.get_context("spawn")
    ready, stop, out = ctx.Barrier(callers + 1), ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=caller, args=(str(sidecar.socket), ready, stop, out), daemon=True)
               for _ in range(callers)]
    completed = 0
    rotated_at: list[float] = []
    try:
        with Client(sidecar.socket) as client:
            generation = {client.headers_info("crm")["fingerprint"]: 0}
            for w in workers:
                w.start()
            ready.wait(120)  # every worker has made a call: the rotations happen under load
            for i in range(1, rotations + 1):
                new = f"{CANARY}-{i}"
                peer.set_secret(CLIENT_ID, new, keep_old=True)  # the IdP accepts old and new
                result = client.secret_rotate(SECRET, new)
                rotated_at.append(time.monotonic())
                fingerprint = client.headers_info("crm")["fingerprint"]
                # completed: the login renewed, and a login never served before is the current one
                completed += result["renewed"] == ["service:crm"] and fingerprint not in generation
                generation.setdefault(fingerprint, i)
                peer.drop_old(CLIENT_ID)  # the old secret is dead from here on
        stop.set()  # each worker makes one more call, begun after the last rotation, and reports
        results = [out.get(timeout=60) for _ in workers]
    finally:
        stop.set()
        for w in workers:
            w.join(10)
            if w.is_alive():
                w.terminate()
    assert completed == rotations
    assert [error for seen in results for _, _, error in seen if error is not None] == []
    for seen in results:
        starts = [started for started, _, _ in seen]
        assert starts == sorted(starts)  # each worker's calls, one after the other
        for i, at in enumerate(rotated_at, start=1):
            # the first request a worker began after rotation i returned has login i or newer
            after = bisect.bisect_right(starts, at)
            assert after < len(seen), f"no call began after rotation {i}"
            assert generation.get(seen[after][1], -1) >= i
    assert keyring.get(SECRET) == f"{CANARY}-{rotations}"  # the last rotation is the stored one
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["rotation"] * rotations
    assert all(line["keys"] == ["service:crm"] and line["uid"] >= 0 for line in lines)
    assert CANARY not in audit.read_text()


def test_rotation_to_a_wrong_secret_changes_nothing(peer: OidcPeer, keyring: KeyringSource,
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
        assert stored_values(keyring.service) == [(SECRET, f"{CANARY}-0"), ("DOCS_KEY", "docs-key-0")]
        # the old secret is still the stored one: a forced renewal with it works
        assert client.invalidate("crm", before["fingerprint"])
        assert client.headers_info("crm")["fingerprint"] != before["fingerprint"]
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["rotation_failed", "invalidation"]
    assert lines[0]["error"] == "invalid_client" and lines[0]["secret"] == SECRET
    assert CANARY not in audit.read_text() and CANARY not in sidecar.log


def test_cli_rotation_is_stored_in_the_keyring_and_read_by_a_fresh_sidecar(
        peer: OidcPeer, keyring: KeyringSource, setup: tuple[SidecarProcess, Path]) -> None:
    sidecar, _ = setup
    sock = ["--socket", str(sidecar.socket)]
    peer.set_secret(CLIENT_ID, f"{CANARY}-cli", keep_old=False)  # from here the IdP knows only the new one
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
    # committed: the keyring holds the new values, and no item holds an old one
    assert stored_values(keyring.service) == [(SECRET, f"{CANARY}-cli"), ("DOCS_KEY", "docs-key-1")]
    # a fresh sidecar, which knows only what the keyring holds, logs in and serves the new key
    sidecar.stop()
    peer.reset_stats()
    with run_sidecar(sidecar.config, sidecar.socket) as fresh, Client(fresh.socket) as client:
        assert client.headers("docs") == {"X-Api-Key": "docs-key-1"}
        assert client.headers_info("crm")["fingerprint"]
    stats = peer.stats()
    assert (stats["token_requests"], stats["token_issued"]) == (1, 1)  # the first login, with the new secret


def test_rotated_notice_for_a_change_made_elsewhere(peer: OidcPeer, keyring: KeyringSource,
                                                    setup: tuple[SidecarProcess, Path]) -> None:
    sidecar, audit = setup
    new = f"{CANARY}-elsewhere"
    with Client(sidecar.socket) as client:
        first = client.headers_info("crm")["fingerprint"]
        assert client.headers("docs") == {"X-Api-Key": "docs-key-0"}
        # changed behind the sidecar's back: in the keyring, and at the IdP, which drops the old secret
        keyring.set(SECRET, new)
        keyring.set("DOCS_KEY", "docs-key-elsewhere")
        peer.set_secret(CLIENT_ID, new, keep_old=False)
        peer.reset_stats()
        # until told, the sidecar serves what it holds
        assert client.headers_info("crm")["fingerprint"] == first
        assert client.headers("docs") == {"X-Api-Key": "docs-key-0"}
        assert client.secret_rotated(SECRET) == ["service:crm"]
        stats = peer.stats()
        # the next login was one token request, accepted: it carried the new secret
        assert (stats["token_requests"], stats["token_issued"], stats["by_client"]) == (1, 1, {CLIENT_ID: 1})
        assert client.headers_info("crm")["fingerprint"] != first
        assert client.secret_rotated("DOCS_KEY") == ["mcp:docs"]
        assert client.headers("docs") == {"X-Api-Key": "docs-key-elsewhere"}
        with pytest.raises(McpcredsError) as info:
            client.secret_rotated("NOT_USED")
        assert info.value.code == "unknown_secret"
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(line["how"], line["keys"], line["failed"]) for line in lines] == [
        ("rotated", ["service:crm"], {}), ("rotated", ["mcp:docs"], {})]
    assert CANARY not in audit.read_text() and CANARY not in sidecar.log
