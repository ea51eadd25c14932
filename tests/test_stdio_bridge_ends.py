"""`mcpcreds stdio SERVER`'s ends, with the real sidecar and MCP server of test_gateway_stdio (a
server of this module's own: its `progress` tool waits for a release that never comes here, so a
request in flight stays in flight): a `notifications/cancelled` closes its request's POST, SIGTERM
ends the bridge without waiting, stdin may be a file, and a grant that is not one header line is
never sent.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.peers.mcp_gateway_peer import GatewayPeer
from tests.sidecar_proc import SidecarProcess
from tests.test_gateway_stdio import (  # noqa: F401  (peer, sidecar and workdir: fixtures, this module's own)
    INIT,
    INITIALIZED,
    peer,
    relay_env,
    rpc_lines,
    run_relay,
    sidecar,
    workdir,
)

WAIT = 60.0


def progress_call(id_: int) -> dict[str, Any]:
    """A call that reports progress once, then waits for the release."""
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call",
            "params": {"name": "progress", "arguments": {"steps": 2}, "_meta": {"progressToken": f"p{id_}"}}}


class Bridge:
    """`mcpcreds stdio tools`, its stdout read line by line by a thread."""

    def __init__(self, sidecar_proc: SidecarProcess, folder: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "mcpcreds", "stdio", "tools"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=folder,
                                     env={**os.environ, **relay_env(sidecar_proc, folder)})
        self.lines: queue.Queue[bytes] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            self.lines.put(line)

    def send(self, message: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def next(self) -> dict[str, Any]:
        [message] = rpc_lines(self.lines.get(timeout=WAIT))
        return message

    def until(self, method: str) -> None:
        """Read up to a message of `method` (a notification)."""
        while self.next().get("method") != method:
            pass

    def rest(self) -> list[dict[str, Any]]:
        """What it wrote after the last line read, once it has ended."""
        self.proc.wait(timeout=WAIT)
        out = []
        while not self.lines.empty():
            out.append(self.next())
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def bridge(sidecar: SidecarProcess, workdir: Path) -> Iterator[Bridge]:  # noqa: F811
    b = Bridge(sidecar, workdir)
    try:
        b.send(INIT)
        assert b.next()["id"] == 0
        b.send(INITIALIZED)
        yield b
    finally:
        b.stop()


def deletes(peer: GatewayPeer) -> int:  # noqa: F811
    return int(peer.stats()["requests"].get("DELETE", 0))


def test_a_cancelled_request_is_closed_and_the_others_go_on(bridge: Bridge) -> None:
    bridge.send(progress_call(5))
    bridge.until("notifications/progress")  # the tool now waits for a release that never comes
    bridge.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}})
    bridge.send({"jsonrpc": "2.0", "id": 6, "method": "ping"})
    assert bridge.next() == {"jsonrpc": "2.0", "id": 6, "result": {}}
    assert bridge.proc.stdin is not None
    bridge.proc.stdin.close()  # EOF: the bridge waits for what is in flight; request 5 no longer is
    assert bridge.rest() == [] and bridge.proc.returncode == 0


def test_sigterm_ends_the_session_without_waiting_for_a_request(bridge: Bridge, peer: GatewayPeer) -> None:  # noqa: F811
    bridge.send(progress_call(9))
    bridge.until("notifications/progress")
    before = deletes(peer)
    bridge.proc.send_signal(signal.SIGTERM)
    assert bridge.rest() == [] and bridge.proc.returncode == 0  # no answer: the tool still waits
    assert deletes(peer) == before + 1  # the session was ended before the bridge exited


def test_stdin_may_be_a_file(sidecar: SidecarProcess, workdir: Path, tmp_path: Path) -> None:  # noqa: F811
    lines = tmp_path / "lines"
    lines.write_bytes(b"".join(json.dumps(m).encode() + b"\n" for m in [
        INIT, INITIALIZED, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"jsonrpc": "2.0", "id": 2,
                                                                               "method": "ping"}]))
    with lines.open("rb") as stdin:
        proc = subprocess.run([sys.executable, "-m", "mcpcreds", "stdio", "tools"], stdin=stdin, capture_output=True,
                              timeout=WAIT, cwd=workdir, env={**os.environ, **relay_env(sidecar, workdir)})
    assert proc.returncode == 0, proc.stderr
    answers = {m["id"]: m for m in rpc_lines(proc.stdout)}
    assert set(answers) == {0, 1, 2} and "tools" in answers[1]["result"] and answers[2]["result"] == {}


def test_a_grant_that_is_not_one_header_line_is_never_sent(sidecar: SidecarProcess, workdir: Path,  # noqa: F811
                                                           peer: GatewayPeer) -> None:  # noqa: F811
    before = peer.stats()["requests"]
    result = run_relay(sidecar, workdir, [INIT], MCPCREDS_GRANT="grant\r\nX-Api-Key: planted")
    assert result.returncode == 0
    [answer] = rpc_lines(result.stdout)
    assert answer["id"] == 0 and answer["error"]["code"] == -32000 and "InvalidHeader" in answer["error"]["message"]
    assert peer.stats()["requests"] == before
