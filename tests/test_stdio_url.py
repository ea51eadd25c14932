"""`mcpcreds stdio URL`, in the place of `npx mcp-remote URL` in a desktop client's config: the
MCP SDK's own stdio client launches it with the SDK's reduced environment (plus a temp HOME and
runtime folder), in front of real MCP SDK servers on loopback: one that needs no authorization,
and one that demands a bearer from the real oidc-provider and names it in its protected-resource
metadata. Three clients started at once must add one config entry, start one detached sidecar
(shared by later launches) and, for the server that asks for it, log the person in once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import keyring
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client

from mcpcreds import Client
from mcpcreds.client.launch import Busy, file_lock, start_sidecar
from mcpcreds.config.load import parse_config
from mcpcreds.config.starter import (
    append_entry,
    entry_text,
    same_endpoint,
    server_for_endpoint,
    server_name_for,
    starter_config,
)
from mcpcreds.errors import ConfigError, Forbidden, SidecarUnavailable
from tests.conftest import CANARY, KeyringSession, module_peer, run_cli
from tests.peers import browser
from tests.peers.mcp_server import McpServerPeer, start_mcp_server
from tests.peers.mcp_untrusted_peer import UntrustedPeer, start_untrusted_peer
from tests.peers.oidc_peer import OidcPeer
from tests.sidecar_proc import run_sidecar

ROOT = Path(__file__).resolve().parents[1]
SCOPE = "tools:call"
PRE_REGISTERED = "c-stdio-url-pre"  # what `--client-id` names: registered with the IdP beforehand
# with no --client-id, the login registers its own client (RFC 7591); the first one is declared so
# that the IdP knows the scope the MCP server asks for (the peer's scopes are those of its
# configured clients)
OIDC_CLIENTS: list[dict[str, Any]] = [
    {"client_id": "c-stdio-url-scope", "token_endpoint_auth_method": "none", "grant_types": ["authorization_code"],
     "redirect_uris": ["http://127.0.0.1/callback"], "scope": SCOPE},
    {"client_id": PRE_REGISTERED, "token_endpoint_auth_method": "none",
     "grant_types": ["authorization_code", "refresh_token"], "redirect_uris": ["http://127.0.0.1/callback"],
     "scope": SCOPE},
]
SESSION_TIMEOUT = 120.0  # a whole session, login included, on a loaded machine


# ------------------------------------------------------------------------------------- pure parts


def test_a_server_name_comes_from_the_host_and_is_unique() -> None:
    assert server_name_for("https://mcp.notion.com/mcp", []) == "notion"
    assert server_name_for("https://api.githubcopilot.com/mcp/", []) == "githubcopilot"
    assert server_name_for("https://example.com/mcp", ["example", "example-2"]) == "example-3"
    assert server_name_for("http://127.0.0.1:8931/mcp", []) == "127.0.0.1-8931"
    assert server_name_for("http://[::1]:8931/mcp", []) == "1-8931"
    assert server_name_for("http://localhost/mcp", []) == "localhost"


def test_an_endpoint_is_found_however_it_is_spelled() -> None:
    assert same_endpoint("https://Mcp.Example.com:443/mcp/", "https://mcp.example.com/mcp")
    assert not same_endpoint("https://mcp.example.com/mcp", "https://mcp.example.com/other")
    assert not same_endpoint("http://127.0.0.1:1/mcp", "http://127.0.0.1:2/mcp")
    data = tomllib.loads("""
[services.crm]
endpoint = "https://crm.example.com/mcp"
[[servers]]
name = "crm-ro"
service = "crm"
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
""")
    assert server_for_endpoint(data, "https://docs.example.com/mcp/") == "docs"
    assert server_for_endpoint(data, "https://CRM.example.com/mcp") == "crm-ro"
    assert server_for_endpoint(data, "https://other.example.com/mcp") is None


@pytest.mark.parametrize("keyring_ok", [True, False])
@pytest.mark.parametrize("example", [True, False])
def test_the_starter_config_and_an_added_entry_load_without_a_warning(keyring_ok: bool, example: bool) -> None:
    text = starter_config('/run/user/1000/mc "x"/mcpcreds.sock', keyring_ok, "/home/u/.local/share/s", example)
    text += entry_text("notion", "https://mcp.notion.com/mcp", login=True)
    config = parse_config(tomllib.loads(text))
    assert config.sidecar.socket == '/run/user/1000/mc "x"/mcpcreds.sock'
    assert config.secrets.sources == (("env", "keyring") if keyring_ok else ("env", "dir:/home/u/.local/share/s"))
    assert config.warnings == ()
    notion = config.servers["notion"]
    assert (notion.trust.trust, notion.trust.allow_untrusted_without_allowlist, notion.gateway.expose) == \
        ("untrusted", True, "proxy")
    assert notion.trust.allows("anything") and notion.content.pin_tools is None  # all tools; pinned (not trusted)
    assert notion.login is not None and (notion.login.grant, notion.login.client_id) == ("authorization_code", "")
    assert ("example" in config.servers) is example
    # a client id given (`--client-id`): pre-registered, or the URL of a client ID metadata document
    for client_id in ("c-pre \"registered\"", "https://app.example.com/client.json"):
        added = parse_config(tomllib.loads(text + entry_text("x", "https://x.example.com/mcp", True, client_id)))
        assert added.servers["x"].login.client_id == client_id  # type: ignore[union-attr]


def test_an_entry_is_appended_as_text_and_never_to_a_config_it_would_break(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    mine = "# my comment\n[secrets]\nsources = [\"env\"]  # keep me"  # no newline at the end
    path.write_text(mine)
    append_entry(path, mine, entry_text("a", "https://a.example.com/mcp", login=False))
    text = path.read_text()
    assert text.startswith(mine + "\n") and "# added by `mcpcreds stdio URL`" in text
    assert parse_config(tomllib.loads(text)).servers["a"].login is None
    inline = 'servers = [{ name = "x", endpoint = "https://x.example.com/mcp" }]\n'
    path.write_text(inline)
    with pytest.raises(ConfigError) as info:
        append_entry(path, inline, entry_text("b", "https://b.example.com/mcp", login=False))
    assert "inline array" in str(info.value.errors)
    assert path.read_text() == inline


def test_a_lock_held_elsewhere_is_waited_for_then_refused_with_busy(tmp_path: Path) -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    holder = os.open(tmp_path / "x.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        import fcntl

        fcntl.flock(holder, fcntl.LOCK_EX)  # another open file description: flock conflicts
        with pytest.raises(Busy), file_lock(tmp_path / "x.lock", 1.0, "testing", sleep, lambda: now[0]):
            pass
    finally:
        os.close(holder)
    assert slept[:3] == [0.01, 0.02, 0.04] and max(slept) == 0.2 and sum(slept) == pytest.approx(1.0)
    with file_lock(tmp_path / "x.lock", 1.0, "testing", sleep, lambda: now[0]):
        pass  # free now


# ------------------------------------------------------------------------------------- processes


@dataclass
class Desktop:
    """A user's home and runtime folder, and what a desktop client's config gives the server."""

    home: Path
    run: Path
    extra: dict[str, str]

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "XDG_RUNTIME_DIR": str(self.run), "PYTHONPATH": str(ROOT / "src"),
                **self.extra}

    @property
    def config(self) -> Path:
        return self.home / ".config" / "mcpcreds" / "config.toml"

    @property
    def socket(self) -> Path:
        return self.run / "mcpcreds" / "mcpcreds.sock"

    @property
    def sidecar_log(self) -> Path:
        return self.home / ".local" / "state" / "mcpcreds" / "sidecar.log"

    def servers(self) -> list[dict[str, Any]]:
        return list(tomllib.loads(self.config.read_text()).get("servers", []))


def listener_pid(path: Path) -> int | None:
    """The pid of the process listening on the socket (SO_PEERCRED), None if none listens."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return None
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(pid)


def stop(pid: int) -> None:
    """Stop a detached sidecar (not our child) and wait for it to end (its pidfd readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        os.kill(pid, signal.SIGTERM)
        if not select.select([fd], [], [], 30)[0]:
            os.kill(pid, signal.SIGKILL)
            select.select([fd], [], [], 30)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


@pytest.fixture
def desktop() -> Iterator[Desktop]:
    """A fresh user; whatever sidecar got started for it is stopped at the end."""
    top = Path(tempfile.mkdtemp(prefix="mcpc-url-"))  # short: a socket path has at most 107 bytes
    home, run = top / "home", top / "run"
    home.mkdir()
    run.mkdir(mode=0o700)
    user = Desktop(home, run, {})
    try:
        yield user
    finally:
        if (pid := listener_pid(user.socket)) is not None:
            stop(pid)
        shutil.rmtree(top, ignore_errors=True)


@dataclass
class Launch:
    tools: list[str]
    result: Any
    stderr: str


async def launch(url: str, user: Desktop, tool: str, arguments: dict[str, Any], name: str,
                 options: tuple[str, ...] = ()) -> Launch:
    """A desktop client's launch of `mcpcreds stdio URL`: initialize, list the tools, call one."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcpcreds", "stdio", url, *options],
                                   env=user.env, cwd=str(user.home))
    errfile = user.home / f"stderr-{name}"
    with errfile.open("w+") as errlog:
        try:
            async with (stdio_client(params, errlog=errlog) as (read, write),
                        ClientSession(read, write) as session):
                await session.initialize()
                tools = [t.name for t in (await session.list_tools()).tools]
                result = await session.call_tool(tool, arguments)
        except Exception as exc:  # what the server said is what explains it
            errlog.seek(0)
            raise AssertionError(f"launch {name} failed ({exc!r}); its stderr:\n{errlog.read()}") from None
        errlog.seek(0)
        return Launch(tools, result, errlog.read())


async def launch_together(url: str, user: Desktop, tool: str, arguments: dict[str, Any],
                          count: int = 3) -> list[Launch]:
    return list(await asyncio.wait_for(asyncio.gather(
        *(launch(url, user, tool, arguments, f"{i}") for i in range(count))), SESSION_TIMEOUT))


def relay_by_hand(url: str, user: Desktop) -> tuple[list[dict[str, Any]], str, int]:
    """A launch driven over pipes: initialize, tools/list, then EOF. Every stdout line must be a
    JSON-RPC message; returns them, stderr and the exit status."""
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "by-hand", "version": "0"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
    proc = subprocess.run([sys.executable, "-m", "mcpcreds", "stdio", url],
                          input="".join(json.dumps(m) + "\n" for m in lines), capture_output=True, text=True,
                          env={**get_default_environment(), **user.env}, cwd=user.home, timeout=SESSION_TIMEOUT)
    messages = [json.loads(line) for line in proc.stdout.splitlines()]  # nothing but JSON on stdout
    assert all(m.get("jsonrpc") == "2.0" for m in messages), proc.stdout
    return messages, proc.stderr, proc.returncode


def ready_lines(user: Desktop) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, user.sidecar_log.read_text().splitlines()) if e.get("event") == "ready"]


# ------------------------------------------------------------------------------------- no authorization


@pytest.fixture(scope="module")
def open_server() -> Iterator[UntrustedPeer]:
    with start_untrusted_peer() as peer:
        yield peer


async def test_three_clients_at_once_add_one_entry_and_start_one_shared_sidecar(
        open_server: UntrustedPeer, desktop: Desktop) -> None:
    url = open_server.url
    launches = await launch_together(url, desktop, "add", {"a": 2, "b": 3})
    for one in launches:
        assert not one.result.is_error and one.result.structured_content == {"result": 5}
        assert {"add", "exfiltrate", "read_note"} <= set(one.tools)  # every tool the server lists
    # one entry for the endpoint, not trusted, every tool, gateway only, no login: the server asked none
    entries = [s for s in desktop.servers() if s.get("endpoint") == url]
    assert len(entries) == 1, desktop.config.read_text()
    assert {k: v for k, v in entries[0].items() if k != "name"} == {
        "endpoint": url, "trust": "untrusted", "allow_untrusted_without_allowlist": True, "expose": "proxy"}
    assert desktop.config.read_text().count("# added by `mcpcreds stdio URL`") == 1
    assert sum("added server" in one.stderr for one in launches) == 1
    assert sum("started a sidecar" in one.stderr for one in launches) == 1
    # one sidecar, detached: a session of its own, alive after every launch has exited
    assert len(ready_lines(desktop)) == 1
    pid = listener_pid(desktop.socket)
    assert pid is not None and os.getsid(pid) == pid
    # the untrusted pipeline still applies: the injected description is screened
    messages, stderr, code = relay_by_hand(url, desktop)
    assert code == 0, stderr
    tools = next(m["result"]["tools"] for m in messages if m.get("id") == 2)
    helper = next(t for t in tools if t["name"] == "helper")
    assert "[sanitized]" in helper["description"]
    # a later launch shares it: no start, no entry, the same pid
    assert "started a sidecar" not in stderr and "added server" not in stderr
    assert listener_pid(desktop.socket) == pid and len(ready_lines(desktop)) == 1
    assert len([s for s in desktop.servers() if s.get("endpoint") == url]) == 1
    # and a second `serve` on the live socket refuses to start beside it
    second = subprocess.run([sys.executable, "-m", "mcpcreds", "serve", "--config", str(desktop.config)],
                            capture_output=True, text=True, env={**os.environ, **desktop.env}, timeout=60)
    assert second.returncode != 0 and "already listening" in second.stderr
    assert listener_pid(desktop.socket) == pid


async def test_a_running_sidecar_is_told_to_reload_for_a_new_url(open_server: UntrustedPeer, desktop: Desktop) -> None:
    first = await launch(open_server.url, desktop, "add", {"a": 1, "b": 1}, "first")
    assert first.result.structured_content == {"result": 2}
    pid = listener_pid(desktop.socket)
    other = open_server.url.replace("/mcp", "/mcp/")  # the same server spelled otherwise: no new entry
    again = await launch(other, desktop, "add", {"a": 2, "b": 2}, "again")
    assert again.result.structured_content == {"result": 4} and "added server" not in again.stderr
    # an endpoint the sidecar does not serve yet: appended, the running sidecar reloads (no restart)
    added = await launch(open_server.url + "?tenant=2", desktop, "add", {"a": 3, "b": 3}, "added")
    assert added.result.structured_content == {"result": 6} and "added server" in added.stderr
    assert listener_pid(desktop.socket) == pid and len(ready_lines(desktop)) == 1
    base = f"127.0.0.1-{urlsplit(open_server.url).port}"
    assert [s["name"] for s in desktop.servers()] == [base, f"{base}-2"]
    assert "config reloaded" in desktop.sidecar_log.read_text()


def test_the_reload_route_takes_a_valid_config_and_keeps_the_old_one_otherwise(tmp_path: Path) -> None:
    socket_path, config = tmp_path / "run" / "s.sock", tmp_path / "config.toml"
    base = f'[sidecar]\nsocket = "{socket_path}"\n[secrets]\nsources = ["env"]\n' \
           '[[servers]]\nname = "a"\nendpoint = "https://a.example.com/mcp"\ntool_allowlist = ["t"]\n'
    config.write_text(base)
    with run_sidecar(config, socket_path, {}), Client(socket_path) as client:
        config.write_text(base + '[[servers]]\nname = "b"\nendpoint = "https://b.example.com/mcp"\n'
                                 'tool_allowlist = ["t"]\n')
        assert client.request("POST", "/v1/reload", json={}) == {"reloaded": True, "servers": 2}
        config.write_text(base + f'[[servers]]\nname = "c"\nendpoint = "https://c.example.com/mcp"\n'
                                 f'rate = "{CANARY}"\n')
        answer = client.request("POST", "/v1/reload", json={})
        assert answer["reloaded"] is False and any(e.startswith("servers[1].rate:") for e in answer["errors"])
        assert CANARY not in json.dumps(answer)  # errors name the path, never the value
        assert sorted(spec["name"] for spec in client.servers()) == ["a", "b"]  # the old config kept
        grant = client.grant(["a"])["grant"]
        with Client(socket_path, grant=grant) as child, pytest.raises(Forbidden):  # owner only
            child.request("POST", "/v1/reload", json={})


def test_a_url_that_is_not_https_nor_loopback_is_refused_before_anything_is_written(desktop: Desktop) -> None:
    proc = subprocess.run([sys.executable, "-m", "mcpcreds", "stdio", "http://example.com/mcp?x=1"],
                          input="", capture_output=True, text=True,
                          env={**get_default_environment(), **desktop.env}, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "http:// is only allowed for a loopback host" in proc.stderr and "example.com" not in proc.stderr
    # a server that cannot be reached is not added: whether it asks for a login cannot be known
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/mcp"  # bound, not listening: refused
        proc = subprocess.run([sys.executable, "-m", "mcpcreds", "stdio", url], input="", capture_output=True,
                              text=True, env={**get_default_environment(), **desktop.env}, timeout=60)
    assert proc.returncode == 1 and proc.stdout == "" and "could not be reached" in proc.stderr
    assert url not in proc.stderr
    assert not desktop.config.exists() and listener_pid(desktop.socket) is None


# ------------------------------------------------------------------------------------- a person's login


@pytest.fixture(scope="module")
def idp(oidc_session: OidcPeer) -> OidcPeer:
    return module_peer(oidc_session, 3600)


@pytest.fixture(scope="module")
def protected(idp: OidcPeer) -> Iterator[McpServerPeer]:
    """An MCP server that demands the IdP's JWTs for its own URL, with a scope, and names the IdP
    and the scope in its protected-resource metadata."""
    with start_mcp_server(idp.issuer, idp.jwks_uri, scopes=(SCOPE,)) as server:
        yield server


async def test_three_clients_at_once_log_the_person_in_once(
        idp: OidcPeer, protected: McpServerPeer, desktop: Desktop, keyring_session: KeyringSession) -> None:
    idp.reset_stats()
    opened = desktop.home / "browser.log"
    desktop.extra.update({"DBUS_SESSION_BUS_ADDRESS": keyring_session.bus_address,
                          "BROWSER": str(browser.script(desktop.home, opened))})
    text = f"hello {uuid.uuid4().hex[:8]}"
    launches = await launch_together(protected.url, desktop, "echo", {"text": text})
    for one in launches:
        assert one.result.structured_content == {"result": text} and set(one.tools) == {"echo", "add"}
    assert len(browser.opened(opened)) == 1  # one browser, one login, for three clients
    assert idp.stats()["by_grant"].get("authorization_code") == 1
    assert sum("asks for a login" in one.stderr for one in launches) == 1
    (entry,) = [s for s in desktop.servers() if s.get("endpoint") == protected.url]
    assert entry["auth"] == {"kind": "oauth2", "grant": "authorization_code"} and entry["expose"] == "proxy"
    entry_name = f"login.mcp.{entry['name']}"
    refresh_tokens = {json.loads(keyring.get_password("mcpcreds", entry_name) or "{}")["refresh_token"]}
    assert len(ready_lines(desktop)) == 1
    # a later launch finds the login: no browser, no new login at the IdP
    again = await launch(protected.url, desktop, "add", {"a": 20, "b": 22}, "again")
    assert again.result.structured_content == {"result": 42}
    assert len(browser.opened(opened)) == 1 and idp.stats()["by_grant"].get("authorization_code") == 1
    # the refresh token (rotated by the sidecar's renewals) is in the keyring only: not in any
    # output, the sidecar's log or the config
    refresh_tokens.add(json.loads(keyring.get_password("mcpcreds", entry_name) or "{}")["refresh_token"])
    for seen in (*(one.stderr for one in launches), again.stderr, desktop.sidecar_log.read_text(),
                 desktop.config.read_text()):
        assert not any(token in seen for token in refresh_tokens)
    # every MCP request that reached the server carried a valid token, but the probe's and discovery's pings
    posts = protected.stats()["posts"]
    assert all(p["method"] == "ping" for p in posts if p["status"] == 401), posts
    # a stored login the IdP refuses (a revoked refresh token) is not a usable one: with the
    # sidecar gone, the next launch starts one, whose renewal is refused, and the person logs in again
    pid = listener_pid(desktop.socket)
    assert pid is not None
    stop(pid)
    stale = json.loads(keyring.get_password("mcpcreds", entry_name) or "{}")
    keyring.set_password("mcpcreds", entry_name, json.dumps({**stale, "refresh_token": "rt-revoked-0123456789"}))
    renewed = await launch(protected.url, desktop, "echo", {"text": "after"}, "renewed")
    assert renewed.result.structured_content == {"result": "after"} and "asks for a login" in renewed.stderr
    assert len(browser.opened(opened)) == 2 and idp.stats()["by_grant"].get("authorization_code") == 2
    assert len(ready_lines(desktop)) == 2


async def test_a_client_id_given_is_written_into_the_entry_and_the_login_uses_it(
        idp: OidcPeer, protected: McpServerPeer, desktop: Desktop, keyring_session: KeyringSession) -> None:
    entry_name = f"login.mcp.127.0.0.1-{urlsplit(protected.url).port}"
    with contextlib.suppress(keyring.errors.PasswordDeleteError):  # another test's login of this server
        keyring.delete_password("mcpcreds", entry_name)
    idp.reset_stats()
    opened = desktop.home / "browser.log"
    desktop.extra.update({"DBUS_SESSION_BUS_ADDRESS": keyring_session.bus_address,
                          "BROWSER": str(browser.script(desktop.home, opened))})
    try:
        done = await asyncio.wait_for(launch(protected.url, desktop, "echo", {"text": "pre"}, "pre",
                                             ("--client-id", PRE_REGISTERED)), SESSION_TIMEOUT)
        assert done.result.structured_content == {"result": "pre"} and len(browser.opened(opened)) == 1
        (entry,) = [s for s in desktop.servers() if s.get("endpoint") == protected.url]
        assert entry["auth"] == {"kind": "oauth2", "grant": "authorization_code", "client_id": PRE_REGISTERED}
        # the login (and any renewal) is the pre-registered client's: none was registered
        assert set(idp.stats()["by_client"]) == {PRE_REGISTERED} and "registered as client" not in done.stderr
        assert json.loads(keyring.get_password("mcpcreds", entry_name) or "{}").get("registration") is None
        checked = run_cli("check", "--config", str(desktop.config))
        assert checked.code == 0, checked.output
        # an entry is never rewritten: another client id for its endpoint is refused, saying what to edit
        before = desktop.config.read_text()
        proc = subprocess.run([sys.executable, "-m", "mcpcreds", "stdio", protected.url, "--client-id", "c-other"],
                              input="", capture_output=True, text=True,
                              env={**get_default_environment(), **desktop.env}, timeout=SESSION_TIMEOUT)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert f"server {entry['name']}" in proc.stderr and "client_id" in proc.stderr
        assert "c-other" not in proc.stderr and desktop.config.read_text() == before
    finally:
        with contextlib.suppress(keyring.errors.PasswordDeleteError):
            keyring.delete_password("mcpcreds", entry_name)


def test_a_start_moves_a_full_log_aside_and_keeps_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    log = state / "sidecar.log"
    log.write_bytes(b"old line\n" * 1_000_000)  # 9 MB: past what is kept
    (state / "sidecar.log.1").write_bytes(b"older\n")
    config = tmp_path / "broken.toml"
    config.write_text("[sidecar\n")  # the sidecar started exits at once, saying why in its log
    with pytest.raises(SidecarUnavailable, match="its log is"):
        start_sidecar(config, str(tmp_path / "no.sock"), None, state, timeout=30.0)
    assert (state / "sidecar.log.1").read_bytes().startswith(b"old line\n")  # the older one dropped
    fresh = log.read_bytes()
    assert 0 < len(fresh) < 100_000 and b"old line" not in fresh
    log.write_bytes(b"small\n")  # under the limit: appended to, not moved
    with pytest.raises(SidecarUnavailable):
        start_sidecar(config, str(tmp_path / "no.sock"), None, state, timeout=30.0)
    assert log.read_bytes().startswith(b"small\n") and len(log.read_bytes()) > 6
