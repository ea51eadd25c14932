"""The sidecar's logs as an operator reads them: `mcpcreds serve --log-format text|json` and
`--log-level`; by default a readable line with the local time on a terminal, JSON lines (with an
ISO-8601 time beside the unix one) elsewhere."""

from __future__ import annotations

import datetime
import json
import logging
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mcpcreds.core.logs import ConsoleFormatter, JsonFormatter
from tests.conftest import CANARY, run_cli
from tests.sidecar_proc import READY_TIMEOUT, SidecarProcess

AT = 1796613123.214  # 2026-12-07 03:12:03.214 UTC
INDIA = "IST-5:30"  # a POSIX TZ: UTC+05:30 all year, so the local time is known from the UTC one
TEXT_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (DEBUG|INFO|WARNING|ERROR|CRITICAL) ([\w.]+): ")


def record(name: str, message: str, level: int = logging.WARNING, **fields: object) -> logging.LogRecord:
    entry = logging.LogRecord(name, level, __file__, 1, message, (), None)
    entry.created = AT
    entry.__dict__.update(fields)
    return entry


@pytest.fixture
def india(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", INDIA)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_json_line_carries_an_iso_time_and_the_unix_time() -> None:
    line = JsonFormatter().format(record("mcpcreds.gateway", 'upstream "docs" failed: answered HTTP 502',
                                         server="docs", status=502))
    entry = json.loads(line)
    assert entry == {"timestamp": "2026-12-07T03:12:03.214Z", "time": AT, "level": "warning",
                     "logger": "mcpcreds.gateway", "event": 'upstream "docs" failed: answered HTTP 502',
                     "server": "docs", "status": 502}


def test_a_text_line_has_the_date_the_local_time_the_level_and_who_speaks(india: None) -> None:
    fmt = ConsoleFormatter()
    assert fmt.format(record("mcpcreds.gateway", 'upstream "docs" failed: answered HTTP 502', server="docs")) \
        == '2026-12-07 08:42:03 WARNING gateway: upstream "docs" failed: answered HTTP 502 server=docs'
    # an event that names its part already is not prefixed twice
    assert fmt.format(record("mcpcreds.gateway", "gateway: roots/list_changed not sent", logging.INFO)) \
        == "2026-12-07 08:42:03 INFO gateway: roots/list_changed not sent"
    assert fmt.format(record("mcpcreds", "hello", logging.ERROR)) == "2026-12-07 08:42:03 ERROR mcpcreds: hello"


CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[[servers]]
name = "closed"
endpoint = "https://closed.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:LOGS_KEY}}}}" }}
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    folder.mkdir(mode=0o700)
    path = folder / "config.toml"
    path.write_text(CONFIG.format(socket=folder / "s.sock"))
    return path


def local_epoch(stamp: str) -> float:
    """A text line's stamp, read in INDIA's time, as unix time."""
    india = datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=india).timestamp()


def test_serve_log_format_text_and_log_level_warning(config: Path) -> None:
    """Piped, `--log-format text` still writes text; `--log-level warning` leaves out the info
    lines (ready, stopping, stopped) and keeps the config's warning."""
    socket = config.parent / "s.sock"
    started = time.time()
    sidecar = SidecarProcess(config, socket, {"LOGS_KEY": CANARY, "TZ": INDIA},
                             args=["--log-format", "text", "--log-level", "warning"])
    try:
        sidecar.wait_for_line(lambda line: "exposes no tool through the gateway" in line, "the config's warning")
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket), retries=5),
                          base_url="http://mcpcreds") as http:
            assert http.get("/v1/health").json()["status"] == "ok"  # serving: "ready" was not logged
    finally:
        assert sidecar.stop() == 0
    ended = time.time()
    lines = sidecar.log.splitlines()
    assert lines and CANARY not in sidecar.log
    for line in lines:
        match = TEXT_LINE.match(line)
        assert match is not None, line
        assert match[2] in ("WARNING", "ERROR"), line
        assert int(started) - 1 <= local_epoch(match[1]) <= ended + 1, line  # the local time, not UTC
    assert any(re.search(r" WARNING sidecar: servers\[0\]: exposes no tool", line) for line in lines), lines


def test_serve_on_a_terminal_logs_text_and_json_when_asked(config: Path) -> None:
    ready = read_on_a_terminal(config)[0]
    assert TEXT_LINE.match(ready) and " INFO sidecar: ready socket=" in ready and " servers=1" in ready
    lines = read_on_a_terminal(config, "--log-format", "json")
    assert json.loads(lines[0])["event"] == "ready"


def read_on_a_terminal(config: Path, *args: str) -> list[str]:
    """`mcpcreds serve ARGS` with stderr on a pseudo-terminal: its lines up to the one that says
    it is ready (then it is stopped)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mcpcreds", "serve", "--config", str(config), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave,
                            env={**os.environ, "LOGS_KEY": CANARY})
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + READY_TIMEOUT
    try:
        while b"ready" not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, seen
            readable, _, _ = select.select([master], [], [], remaining)
            if readable:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the process ended
                    chunk = b""
                assert chunk, f"serve ended before it was ready: {seen!r}"
                seen += chunk
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        os.close(master)
    text = seen.decode(errors="replace")
    assert CANARY not in text
    ready = [line for line in text.replace("\r\n", "\n").splitlines() if "ready" in line]
    return ready


def test_a_log_level_that_is_not_one_is_a_usage_error() -> None:
    result = run_cli("serve", "--log-level", "verbose")
    assert result.code == 2 and "invalid choice: 'verbose'" in result.stderr
