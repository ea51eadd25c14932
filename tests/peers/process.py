"""A test peer run as a child process that prints `READY <address>` once it serves."""

from __future__ import annotations

import contextlib
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, cast

import httpx


def _pump_lines(stream: IO[str], sink: queue.Queue[str | None]) -> None:
    for line in stream:
        sink.put(line)
    sink.put(None)


def read_log(workdir: Path) -> str:
    path = workdir / "stderr.log"
    return path.read_text(errors="replace") if path.exists() else ""


class PeerHandle:
    """The test side of an HTTP peer served at `base`: its `/_test/*` controls and its log."""

    def __init__(self, base: str, workdir: Path) -> None:
        self.base = base
        self.url = f"{base}/mcp"
        self._workdir = workdir
        self._http = httpx.Client(base_url=base, timeout=10.0)

    def _post(self, path: str, body: Any = None) -> dict[str, Any]:
        response = self._http.post(path, json=body)
        response.raise_for_status()
        return cast(dict[str, Any], response.json()) if response.content else {}

    def stats(self) -> dict[str, Any]:
        response = self._http.get("/_test/stats")
        response.raise_for_status()
        return cast(dict[str, Any], response.json())

    def log(self) -> str:
        return read_log(self._workdir)

    def close(self) -> None:
        self._http.close()


@contextlib.contextmanager
def ready_process(command: Callable[[Path], list[str]], *, what: str, cwd: Path, timeout: float,
                  env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """Start `command(workdir)` (its stderr in workdir/stderr.log), wait for its READY line without
    polling, and yield (process, address, workdir); stop it and remove workdir afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{what.replace(' ', '-')}-"))
    with (workdir / "stderr.log").open("w") as stderr:
        proc = subprocess.Popen(command(workdir), cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        started = time.monotonic()
        seen: list[str] = []
        address = None
        while address is None:
            try:
                line = lines.get(timeout=max(started + timeout - time.monotonic(), 0.01))
            except queue.Empty:
                line = None
            if line is None:
                state = "still running" if proc.poll() is None else f"exited with {proc.returncode}"
                raise RuntimeError(f"{what} gave no READY line after {time.monotonic() - started:.1f}s "
                                   f"(process {state}); stdout={seen!r}; stderr:\n{read_log(workdir)}")
            if line.startswith("READY "):
                address = line.split(" ", 1)[1].strip()
            else:
                seen.append(line)
        yield proc, address, workdir
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        proc.stdout.close()
        shutil.rmtree(workdir, ignore_errors=True)
