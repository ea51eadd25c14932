"""Grants for child processes, the Rule of Two, and the egress policy of the sidecar's own calls."""

from __future__ import annotations

import json
import socket
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpcreds import Client, Forbidden, UnknownServer
from mcpcreds.broker.broker import Broker
from mcpcreds.config.load import parse_config
from mcpcreds.core.clock import SystemClock
from mcpcreds.core.metrics import Metrics
from mcpcreds.credentials.sources import EnvSource, SecretResolver
from tests.conftest import CANARY, run_cli
from tests.sidecar_proc import SidecarProcess, run_sidecar

CONFIG = """
[sidecar]
socket = "{socket}"
audit_log = "{audit}"
[secrets]
sources = ["env"]
[[servers]]
name = "web"
endpoint = "https://web.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:KEY_WEB}}}}" }}
tags = ["untrusted_input"]
[[servers]]
name = "crm"
endpoint = "https://crm.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:KEY}}}}" }}
tags = ["sensitive"]
[[servers]]
name = "mail"
endpoint = "https://mail.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:KEY_MAIL}}}}" }}
tags = ["egress"]
rate = "10/1s"
"""


def grants_sidecar(root: Path) -> Iterator[SidecarProcess]:
    socket_path, audit = root / "run" / "s.sock", root / "audit.jsonl"
    config = root / "config.toml"
    config.write_text(CONFIG.format(socket=socket_path, audit=audit))
    with run_sidecar(config, socket_path, {"KEY": CANARY, "KEY_WEB": CANARY, "KEY_MAIL": CANARY}) as proc:
        yield proc


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    """One sidecar for the tests that mint, use and revoke grants of their own: a grant is known
    only by its token, and none of them reads the sidecar's log (they share its start-up)."""
    yield from grants_sidecar(tmp_path_factory.mktemp("grants"))


@pytest.fixture
def own_sidecar(tmp_path: Path) -> Iterator[SidecarProcess]:
    """A sidecar for a test that stops it (to read its whole log)."""
    yield from grants_sidecar(tmp_path)


def test_a_child_with_a_grant_reaches_only_its_servers(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as parent:
        minted = parent.grant(["crm"], ttl=60)
        assert [s["name"] for s in minted["servers"]] == ["crm"] and minted["grant"].startswith("mcg_")
    with Client(sidecar.socket, grant=minted["grant"]) as child:
        assert child.headers("crm") == {"X-Api-Key": CANARY}
        assert [s["name"] for s in child.servers()] == ["crm"]
        for name in ("web", "mail", "mcp:web"):
            with pytest.raises(Forbidden):
                child.headers(name)
        with pytest.raises(Forbidden):
            child.acquire("mail")
        with pytest.raises(Forbidden):
            child.status()
        with pytest.raises(Forbidden):
            child.secret_rotated("KEY")
        with pytest.raises(Forbidden):  # a sub-grant can never widen
            child.grant(["crm", "web"])
        with pytest.raises(UnknownServer):
            child.headers("nope")


def test_sub_grants_narrow_and_revocation_cascades(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as parent:
        top = parent.grant(["web", "crm"], ttl=600)
    with Client(sidecar.socket, grant=top["grant"]) as child:
        sub = child.grant(["web"], ttl=6000)
        assert sub["expires_at"] <= top["expires_at"]  # never outlives its parent
    with Client(sidecar.socket, grant=sub["grant"]) as grandchild:
        assert grandchild.headers("web")["X-Api-Key"] == CANARY
        with pytest.raises(Forbidden):
            grandchild.headers("crm")
    with Client(sidecar.socket) as parent:
        assert parent.revoke_grant(top["id"])
    for token in (top["grant"], sub["grant"]):
        with Client(sidecar.socket, grant=token) as revoked, pytest.raises(Forbidden) as info:
            revoked.headers("web")
        assert "expired or revoked" in info.value.message


def test_an_expired_or_made_up_grant_is_refused(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as parent:
        short = parent.grant(["web"], ttl=3)
    out = subprocess_curl(sidecar, "/v1/servers/web/headers", "Bearer mcg_made_up")
    assert out["error"]["code"] == "forbidden"
    with Client(sidecar.socket, grant=short["grant"]) as child:
        assert child.headers("web") == {"X-Api-Key": CANARY}  # it worked while it lived
        # outlive it (wall time only moves one way: no race), then it is refused
        time.sleep(max(0.0, short["expires_at"] - time.time()) + 0.05)
        with pytest.raises(Forbidden):
            child.headers("web")


def subprocess_curl(sidecar: SidecarProcess, path: str, authorization: str) -> dict[str, Any]:
    import subprocess

    out = subprocess.run(["curl", "-s", "--unix-socket", str(sidecar.socket), "-H",
                          f"Authorization: {authorization}", f"http://x{path}"],
                         capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def test_a_grant_completing_the_trifecta_is_refused_with_the_three_names(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as parent:
        with pytest.raises(Forbidden) as info:
            parent.grant(["web", "crm", "mail"])
        assert "(web)" in info.value.message and "(crm)" in info.value.message
        assert "(mail)" in info.value.message
        assert len(parent.grant(["web", "crm"])["servers"]) == 2  # two of three is fine


def test_spawn_payload_with_a_grant(own_sidecar: SidecarProcess) -> None:
    sidecar = own_sidecar
    result = run_cli("spawn-payload", "--grant", "crm", "--socket", str(sidecar.socket))
    assert result.code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["grant"].startswith("mcg_") and [s["name"] for s in payload["servers"]] == ["crm"]
    assert CANARY not in result.stdout
    child = run_cli("headers", "crm", "--socket", str(sidecar.socket), env={"MCPCREDS_GRANT": payload["grant"]})
    assert child.code == 0 and CANARY in child.stdout
    refused = run_cli("headers", "web", "--socket", str(sidecar.socket),
                      env={"MCPCREDS_GRANT": payload["grant"]})
    assert refused.code == 77
    sidecar.stop()
    assert payload["grant"] not in sidecar.log


def test_config_warns_about_the_trifecta_and_allow_trifecta_downgrades(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(socket=tmp_path / "s.sock", audit=tmp_path / "a.jsonl"))
    result = run_cli("check", "--config", str(path))
    assert result.code == 0 and "trifecta" in result.stderr
    allowed = CONFIG.replace("[secrets]", "allow_trifecta = true\n[secrets]")
    path.write_text(allowed.format(socket=tmp_path / "run" / "s.sock", audit=tmp_path / "a.jsonl"))
    with run_sidecar(path, tmp_path / "run" / "s.sock", {"KEY": "k", "KEY_WEB": "k", "KEY_MAIL": "k"}) as proc, Client(proc.socket) as c:
        assert len(c.grant(["web", "crm", "mail"])["servers"]) == 3
        proc.wait_for("grant completes the trifecta (allowed by allow_trifecta)")
    events = [json.loads(line)["event"] for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert events == ["grant", "grant_trifecta_allowed"]


# -- egress policy of the sidecar's own calls


class CountingListener:
    """Accepts and counts TCP connections on 127.0.0.1 (and closes them)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()


def broker_for(oauth: str, extra: str = "") -> Broker:
    config = parse_config(tomllib.loads(f"""
[[servers]]
name = "svc"
endpoint = "https://svc.example.com/mcp"
oauth = {{ client_id = "c", client_secret = "{{{{secret:S}}}}", {oauth} }}
{extra}
"""))
    return Broker(config, SecretResolver([EnvSource({"S": "s3cret"})]), SystemClock(), Metrics())


async def test_net_off_makes_no_connection() -> None:
    listener = CountingListener()
    broker = broker_for(f'token_url = "http://127.0.0.1:{listener.port}/token"', 'net = "off"')
    try:
        with pytest.raises(Forbidden, match="allows no outbound call"):
            await broker.headers(broker.target("svc"))
    finally:
        await broker.aclose()
    assert listener.count == 0


async def test_restricted_blocks_a_token_endpoint_outside_allow_hosts() -> None:
    listener = CountingListener()
    broker = broker_for(f'token_url = "http://127.0.0.1:{listener.port}/token"',
                        'net = "restricted"\nallow_hosts = ["*.example.com"]')
    try:
        with pytest.raises(Forbidden, match="not in allow_hosts"):
            await broker.headers(broker.target("svc"))
    finally:
        await broker.aclose()
    assert listener.count == 0


@pytest.mark.parametrize("address", ["169.254.169.254", "10.0.0.5", "192.168.1.10"])
async def test_private_and_metadata_token_endpoints_are_refused(address: str) -> None:
    broker = broker_for(f'token_url = "https://{address}/token"')
    try:
        with pytest.raises(Forbidden) as info:
            await broker.headers(broker.target("svc"))
    finally:
        await broker.aclose()
    assert address in info.value.message


def test_grant_only_uids_must_present_a_grant(tmp_path: Path) -> None:
    import os
    import signal

    socket_path = tmp_path / "run" / "s.sock"
    config = tmp_path / "config.toml"
    text = CONFIG.format(socket=socket_path, audit=tmp_path / "a.jsonl")
    config.write_text(text)
    with run_sidecar(config, socket_path, {"KEY": CANARY, "KEY_WEB": CANARY, "KEY_MAIL": CANARY}) as proc:
        with Client(proc.socket) as parent:
            parent.headers("crm")  # warms the cached fast path
            minted = parent.grant(["crm"])
        config.write_text(text.replace("[secrets]", f"grant_only_uids = [{os.getuid()}]\n[secrets]", 1))
        proc.signal(signal.SIGHUP)
        proc.wait_for("config reloaded")
        with Client(proc.socket) as bare:
            assert bare.health()["status"] == "ok"
            for _ in range(2):  # the cached fast path refuses too
                with pytest.raises(Forbidden, match="grant_only_uids"):
                    bare.headers("crm")
            with pytest.raises(Forbidden):
                bare.grant(["crm"])  # and cannot mint itself one
        with Client(proc.socket, grant=minted["grant"]) as child:
            assert child.headers("crm") == {"X-Api-Key": CANARY}


def test_a_grant_holder_cannot_pause_a_service_for_long(sidecar: SidecarProcess) -> None:
    with Client(sidecar.socket) as parent:
        minted = parent.grant(["mail"])
    with Client(sidecar.socket, grant=minted["grant"]) as child:
        until = child.backoff("mail", 86400)
    assert until is not None and until <= time.time() + 301


def test_spawn_payload_grant_with_tools_narrows_them(sidecar: SidecarProcess) -> None:
    result = run_cli("spawn-payload", "--grant", "crm", "--tool", "crm:search", "--tool", "crm:get",
                     "--socket", str(sidecar.socket))
    assert result.code == 0, result.output
    assert json.loads(result.stdout)["tools"] == {"crm": ["get", "search"]}
    assert run_cli("spawn-payload", "--grant", "crm", "--tool", "crm", "--socket", str(sidecar.socket)).code == 2
    assert run_cli("spawn-payload", "crm", "--tool", "crm:get", "--socket", str(sidecar.socket)).code == 2
    with Client(sidecar.socket) as parent:
        assert parent.grant(["crm"], tools={"crm": ["search"]})["tools"] == {"crm": ["search"]}
