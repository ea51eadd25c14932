"""A refused egress of an exec child is one line on `mcpcreds exec`'s stderr, naming the host.

In process: a real `EgressProxy` and a hold connection that asks for the refusal lines, as the
forwarder does: one line per host and port, on the hold connection before the child's 403, the
host made printable and bounded, at most `MAX_HOSTS` hosts.

End to end, the README's example (`[exec.github]`, `net = "restricted"`, `allow_hosts =
["api.github.com"]`): the config passes `mcpcreds check`; run by the real CLI and sidecar (in a
mount namespace whose /etc/hosts names a loopback upstream `api.github.com`), a stand-in for `npx
-y` that is refused the npm registry and exits at once leaves the one line on stderr, and the MCP
SDK's stdio server reaches `api.github.com` through the proxy while the registry is refused, once
said however often tried.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from mcpcreds.exec.egress_notices import MAX_HOSTS
from mcpcreds.exec.egress_proxy import EgressProxy
from mcpcreds.net.egress import EgressPolicy
from tests.conftest import run_cli
from tests.egress_proxy_rig import basic, running_proxy
from tests.peers.upstream import Upstream, start_upstream
from tests.sidecar_proc import SidecarProcess, run_sidecar

ROOT = Path(__file__).resolve().parents[1]
PEER = str(ROOT / "tests" / "peers" / "mcp_stdio_server.py")
WAIT = 20.0
CANARY = f"notices-canary-{secrets.token_hex(16)}"
RESTRICTED = EgressPolicy("restricted", allow_hosts=("api.github.com",))
REFUSED = 'github: refused egress to registry.npmjs.org:443 (not in allow_hosts; net = "restricted")'
LINE = f"mcpcreds exec {REFUSED}"

# The README's example, as the docs show it (keep the two the same)
def documented_example() -> str:
    """The `[exec.github]` TOML of the exec task page, as a user copies it."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "tasks" / "exec.md").read_text()
    block = page.split("```toml\n", 1)[1].split("```", 1)[0]
    assert block.startswith("[exec.github]\n"), block
    return block


EXAMPLE = documented_example()
# its variant for `npx -y`, which fetches the package from the npm registry at each start
EXAMPLE_NPX = EXAMPLE.replace('allow_hosts = ["api.github.com"]',
                              'allow_hosts = ["api.github.com", "registry.npmjs.org"]')


# ---------------------------------------------------------------------------- in process


class Holder:
    """The hold connection of a session, as the forwarder holds it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def line(self) -> bytes:
        return await asyncio.wait_for(self.reader.readline(), WAIT)

    def answer(self) -> None:
        self.writer.write(b"\n")

    async def rest(self) -> bytes:
        """End the session; everything the proxy sent after what was read."""
        self.writer.write_eof()
        return await asyncio.wait_for(self.reader.read(), WAIT)


@asynccontextmanager
async def proxy_session(tmp_path: Path, notices: bool = True
                        ) -> AsyncIterator[tuple[EgressProxy, str, Holder, Path]]:
    async with running_proxy(tmp_path) as (proxy, audit_path):
        token = proxy.new_session("github", RESTRICTED, os.getuid(), 1)[0]
        reader, writer = await asyncio.open_unix_connection(proxy.path)
        asks = b"Mcpcreds-Notices: 1\r\n" if notices else b""
        writer.write(b"MCPCREDS-HOLD * HTTP/1.1\r\nProxy-Authorization: Basic " + basic(token) + b"\r\n"
                     + asks + b"\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)).startswith(b"HTTP/1.1 200")
        try:
            yield proxy, token, Holder(reader, writer), audit_path
        finally:
            writer.close()


async def _request(proxy: EgressProxy, token: str, first_line: bytes) -> asyncio.Task[bytes]:
    """Send one request; a task for all the proxy answers."""
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    writer.write(first_line + b"\r\nProxy-Authorization: Basic " + basic(token) + b"\r\n\r\n")

    async def answer() -> bytes:
        try:
            return await asyncio.wait_for(reader.read(), WAIT)
        finally:
            writer.close()

    return asyncio.create_task(answer())


def _session_end(audit_path: Path) -> dict[str, Any]:
    lines = [json.loads(line) for line in audit_path.read_text().splitlines()]
    return next(e for e in lines if e["event"] == "exec_session_end")


async def test_a_refusal_is_told_once_per_host_before_the_child_hears_of_it(tmp_path: Path) -> None:
    async with proxy_session(tmp_path) as (proxy, token, holder, audit_path):
        refused = await _request(proxy, token, b"CONNECT registry.npmjs.org:443 HTTP/1.1")
        assert await holder.line() == REFUSED.encode() + b"\n"
        # the refused connection waits for the holder's answer (the line is printed first)
        assert proxy.counts["tunnels"] == 1 and not refused.done()
        holder.answer()
        answer = await refused
        assert answer.startswith(b"HTTP/1.1 403 Forbidden") and b"registry" not in answer
        # the same host again, twice: counted, not told (the next line is another host's)
        for _ in range(2):
            again = await _request(proxy, token, b"CONNECT registry.npmjs.org:443 HTTP/1.1")
            assert (await again).startswith(b"HTTP/1.1 403")
        plain = await _request(proxy, token, b"GET http://Evil.Example/x HTTP/1.1")
        assert await holder.line() == (b"github: refused egress to evil.example:80 "
                                       b'(not in allow_hosts; net = "restricted")\n')
        holder.answer()
        assert (await plain).startswith(b"HTTP/1.1 403")
        assert await holder.rest() == b""
    end = _session_end(audit_path)
    assert end["refused"] == {"registry.npmjs.org:443": 3, "evil.example:80": 1}


async def test_the_childs_host_is_printed_bounded_and_without_control_characters(tmp_path: Path) -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J" + "a" * 1000 + ".example"
    async with proxy_session(tmp_path) as (proxy, token, holder, _audit):
        refused = await _request(proxy, token, f"CONNECT {hostile}:443 HTTP/1.1".encode("latin-1"))
        line = await holder.line()
        holder.answer()
        assert (await refused).startswith(b"HTTP/1.1 403")
    assert line.startswith(b"github: refused egress to ?]0?owned??[2Jaaa") and line.endswith(b"\n")
    assert all(0x20 <= c < 0x7F for c in line[:-1]), line
    assert b"...:443 (not in allow_hosts" in line and len(line) < 400


async def test_at_most_max_hosts_lines_then_one_saying_there_are_more(tmp_path: Path) -> None:
    async with proxy_session(tmp_path) as (proxy, token, holder, audit_path):
        told = []
        for n in range(MAX_HOSTS + 3):
            refused = await _request(proxy, token, f"CONNECT host{n}.example:443 HTTP/1.1".encode())
            if n <= MAX_HOSTS:
                told.append(await holder.line())
                holder.answer()
            assert (await refused).startswith(b"HTTP/1.1 403")
        assert await holder.rest() == b""
    assert told[0].startswith(b"github: refused egress to host0.example:443 ")
    assert told[MAX_HOSTS - 1].startswith(f"github: refused egress to host{MAX_HOSTS - 1}.example:443".encode())
    assert told[MAX_HOSTS].startswith(b"github: refused egress to more hosts than")
    end = _session_end(audit_path)
    assert len(end["refused"]) == MAX_HOSTS and end["refused_more"] == 3


async def test_a_holder_that_did_not_ask_is_sent_nothing(tmp_path: Path) -> None:
    """A forwarder of an older `mcpcreds exec` reads nothing it does not expect."""
    async with proxy_session(tmp_path, notices=False) as (proxy, token, holder, audit_path):
        refused = await _request(proxy, token, b"CONNECT registry.npmjs.org:443 HTTP/1.1")
        assert (await refused).startswith(b"HTTP/1.1 403")
        assert await holder.rest() == b""
    assert _session_end(audit_path)["refused"] == {"registry.npmjs.org:443": 1}


# ---------------------------------------------------------------------------- the README's example


def test_the_examples_pass_check(tmp_path: Path) -> None:
    for text in (EXAMPLE, EXAMPLE_NPX):
        config = tmp_path / "config.toml"
        config.write_text(text)
        checked = run_cli("check", "--config", str(config))
        assert checked.code == 0 and f"{config}: ok" in checked.stdout, checked.output
        assert "warning" not in checked.output.lower(), checked.output


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream() as up:
        yield up


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    """The example's entry; the sidecar's /etc/hosts (its own mount namespace) puts api.github.com
    on loopback, which `allow_private` opens: the upstream stands in for GitHub's API."""
    unshare = shutil.which("unshare")
    assert unshare is not None, "util-linux's unshare is needed (these tests run as root)"
    workdir = tmp_path_factory.mktemp("notices")
    hosts = workdir / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.0.1 api.github.com\n")
    socket = workdir / "run" / "mcpcreds.sock"
    config = workdir / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{socket}"
audit_log = "{workdir / 'audit.jsonl'}"

[secrets]
sources = ["env"]

{EXAMPLE}allow_private = ["api.github.com"]
""")
    wrapper = (unshare, "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts))
    with run_sidecar(config, socket, env={"GH_TOKEN": CANARY}, wrapper=wrapper) as proc:
        yield proc


def _launcher_env(sidecar: SidecarProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MCPCREDS_GRANT", "MCPCREDS_SOCKET")}
    return {**env, "MCPCREDS_CONFIG": str(sidecar.config)}


# what `npx -y` does when the registry is refused: a few tries through HTTPS_PROXY, then exit 1
NPX_STANDIN = """
import httpx, sys
for _ in range(3):
    try:
        httpx.get("https://registry.npmjs.org/@modelcontextprotocol%2fserver-github", timeout=10)
    except httpx.ProxyError:
        continue
sys.exit(1)
"""


def test_a_child_that_exits_on_the_refusal_leaves_the_line_on_stderr(sidecar: SidecarProcess) -> None:
    done = subprocess.run([sys.executable, "-m", "mcpcreds.cli.main", "exec", "github", "--",
                           sys.executable, "-c", NPX_STANDIN], stdin=subprocess.DEVNULL, capture_output=True,
                          env=_launcher_env(sidecar), timeout=60)
    assert done.returncode == 1, done.stderr
    stderr = done.stderr.decode()
    assert [line for line in stderr.splitlines() if "refused egress" in line] == [LINE], stderr
    assert done.stdout == b"" and CANARY not in stderr


async def test_the_example_reaches_its_host_and_says_which_one_it_refused(
        sidecar: SidecarProcess, upstream: Upstream, tmp_path: Path) -> None:
    port = int(upstream.url.rsplit(":", 1)[1])
    errlog = tmp_path / "stderr.txt"
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "mcpcreds.cli.main", "exec", "github", "--", sys.executable, PEER],
                                   env=_launcher_env(sidecar), cwd=str(ROOT))
    with errlog.open("w") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            reached = await _call(session, "tunnel", host="api.github.com", port=port)
            assert reached.startswith("HTTP/1.1 200") and "200" in reached.split("|")[1], reached
            for _ in range(3):
                refused = await _call(session, "tunnel", host="registry.npmjs.org", port=443)
                assert refused.startswith("HTTP/1.1 403"), refused
            # the lines are on stderr before the child hears of the refusal
            text = errlog.read_text()
            assert [line for line in text.splitlines() if "refused egress" in line] == [LINE], text
    assert upstream.paths().get("/tunnelled")
    assert CANARY not in errlog.read_text()


async def _call(session: ClientSession, tool: str, **args: Any) -> str:
    result = await session.call_tool(tool, args)
    assert not result.is_error, result
    text = result.content[0].text  # type: ignore[union-attr]
    assert isinstance(text, str)
    return text
