"""A private redis-server on a Unix socket, started and stopped by tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class RedisPeer:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: run .ci/run (apt-get install redis-server)")
        self.binary = binary
        self.workdir = workdir
        self.socket = workdir / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait until it accepts: the socket appears, then answers
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None
        self.socket.unlink(missing_ok=True)


@contextmanager
def start_redis() -> Iterator[RedisPeer]:
    workdir = Path(tempfile.mkdtemp(prefix="mcpcreds-redis-"))
    peer = RedisPeer(workdir)
    peer.start()
    try:
        yield peer
    finally:
        peer.stop()
        shutil.rmtree(workdir, ignore_errors=True)
