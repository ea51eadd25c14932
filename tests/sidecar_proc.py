"""Start the real sidecar (`mcpcreds serve`) as a process on a temp socket, for end-to-end tests."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# A bound only a process that never comes up (or never logs the event) crosses, as the peers' 60 s:
# a crash ends the wait at once (its stderr closes), and under a CPU hog on both cores a start
# took more than 20 s.
READY_TIMEOUT = 60.0


class SidecarProcess:
    def __init__(self, config: Path, socket: Path, env: dict[str, str] | None = None,
                 wrapper: tuple[str, ...] = (), args: Sequence[str] = ()) -> None:
        """`wrapper`: argv the sidecar's own is appended to (a command that execs it); `args`:
        more options for `serve`."""
        self.config = config
        self.socket = socket
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "mcpcreds.cli.main", "serve", "--config", str(config), *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env={**os.environ, **(env or {})},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, event: str, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """Block until a log line with this event appears (no polling)."""
        def is_event(line: str) -> bool:
            try:
                entry = json.loads(line)
            except ValueError:
                return False
            return isinstance(entry, dict) and entry.get("event") == event

        return dict(json.loads(self.wait_for_line(is_event, repr(event), timeout)))

    def wait_for_line(self, wanted: Callable[[str], bool], what: str, timeout: float = READY_TIMEOUT) -> str:
        """Block until a log line for which `wanted` holds appears (any format; no polling)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {what} log line; log so far:\n{self.log}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"sidecar exited ({self.proc.wait()}) before {what}:\n{self.log}")
            if wanted(line):
                return line

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = READY_TIMEOUT) -> int:
        """Wait for the process to exit and for its last log line to be read (`log` is complete)."""
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def stop(self, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.wait()


@contextmanager
def run_sidecar(config: Path, socket: Path, env: dict[str, str] | None = None,
                wrapper: tuple[str, ...] = (), args: Sequence[str] = ()) -> Iterator[SidecarProcess]:
    sidecar = SidecarProcess(config, socket, env, wrapper, args)
    try:
        sidecar.wait_for("ready")
        yield sidecar
    finally:
        sidecar.stop()
