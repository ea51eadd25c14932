"""`mcpcreds status` on a terminal (issue 19, "status at a glance"): the tables drawn from a
recorded status document on a fixed `now`, exactly; a malformed document still draws; `--watch`
driven for a bounded number of refreshes on a fake clock (granted/refused per minute from two
documents, a sidecar that goes away shown and retried, Ctrl-C exits 0); and the command itself on
a pseudo-terminal against a real sidecar (piped, it stays JSON: tests/test_cli_imports.py)."""

from __future__ import annotations

import copy
import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from mcpcreds.cli.status_view import MAX_ROWS, bar, check_document, duration, per_minute, show, view, watch
from mcpcreds.errors import SidecarUnavailable
from tests.sidecar_proc import SidecarProcess, run_sidecar

NOW = 1_800_000_000.0
# a document as GET /v1/status answers it (recorded from a sidecar, times moved next to NOW)
RECORDED: dict[str, Any] = {
    "version": "0.1.0", "config": "/home/me/.config/mcpcreds/config.toml", "state": "memory",
    "servers": [
        {"name": "crm", "key": "service:crm", "endpoint": "https://crm.example.com/api", "auth": "oauth",
         "rate": "60/1m", "secrets": ["CRM_CLIENT_SECRET"], "tags": []},
        {"name": "docs", "key": "mcp:docs", "endpoint": "https://docs.example.com/mcp", "auth": "headers",
         "rate": None, "secrets": ["DOCS_KEY"], "tags": []},
    ],
    "logins": [
        {"key": "service:crm", "state": "valid", "expires_at": NOW + 3590, "renew_at": NOW + 3290,
         "fingerprint": "a1b2c3d4", "last_error": None, "renewals": 3, "token_requests": 4,
         "shared_fetches": 0},
        {"key": "mcp:ghost", "state": "failing", "expires_at": NOW - 125, "renew_at": NOW - 425,
         "fingerprint": None, "last_error": "invalid_client", "renewals": 0, "token_requests": 2,
         "shared_fetches": 0},
    ],
    "buckets": [
        {"key": "service:crm", "rate": "60/1m", "per_second": 1.0, "level": 6.0, "capacity": 10,
         "waiting": 2, "granted": 120, "refused": 1, "paused_until": NOW + 30, "paused_by": None},
    ],
    "leases": [{"key": "service:crm", "holders": 2, "leased_share": 0.5, "leased_burst": 4,
                "shared_demand": 0.25}],
    "secrets": {"CRM_CLIENT_SECRET": ["service:crm"]},
    "gateway": {"sessions": 3, "streams": 1, "in_flight": 0, "session_limit": 10000, "session_idle": 3600,
                "servers": [{"name": "crm-ro", "sessions": 3, "oldest_session_age": 754.2, "streams": 1,
                             "in_flight": 0}]},
}


def console() -> Console:
    return Console(record=True, width=150, force_terminal=True, color_system=None, legacy_windows=False)


def drawn(status: dict[str, Any], now: float = NOW) -> list[str]:
    out = console()
    show(status, out, now)
    return [line.rstrip() for line in out.export_text().splitlines()]


def row(lines: list[str], first: str) -> list[str]:
    """The cells of the row whose first cell is `first` (columns are separated by │ or spaces)."""
    for line in lines:
        cells = [c.strip() for c in line.replace("│", "  ").replace("┃", "  ").split("  ") if c.strip()]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n" + "\n".join(lines))


def section(lines: list[str], title: str) -> list[str]:
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if lines[i] == ""), len(lines))
    return lines[start:end]


def test_the_watch_note_stays_whole_whatever_the_length_of_the_config_path() -> None:
    """`--watch` names its interval and how to quit; a long config path must not split that note
    across the wrapped header line (as it did under pytest-xdist's longer temporary folders)."""
    for length in range(20, 140):
        status = {**RECORDED, "config": "/" + "c" * (length - 1)}
        console = Console(width=120, record=True, force_terminal=False)
        console.print(view(status, NOW, note="every 0.1s, Ctrl-C quits"))
        assert "every 0.1s, Ctrl-C quits" in console.export_text(), length


def test_a_recorded_status_as_tables() -> None:
    lines = drawn(RECORDED)
    assert lines[0].split() == ["mcpcreds", "0.1.0", "config", "/home/me/.config/mcpcreds/config.toml",
                                "state", "memory"]
    servers = section(lines, "servers")
    assert row(servers, "name") == ["name", "key", "auth", "rate", "secrets"]
    assert row(servers, "crm") == ["crm", "service:crm", "oauth", "60/1m", "CRM_CLIENT_SECRET"]
    assert row(servers, "docs") == ["docs", "mcp:docs", "headers", "-", "DOCS_KEY"]
    logins = section(lines, "logins")
    assert row(logins, "key") == ["key", "state", "expires in", "renews in", "token requests", "last error"]
    assert row(logins, "service:crm") == ["service:crm", "valid", "59m50s", "54m50s", "4", "-"]
    assert row(logins, "mcp:ghost") == ["mcp:ghost", "failing", "2m05s ago (expired)", "7m05s overdue", "2",
                                        "invalid_client"]
    buckets = section(lines, "buckets")
    assert row(buckets, "key") == ["key", "rate", "level", "waiting", "granted", "refused", "paused"]
    # one-shot: totals (per minute needs two readings: --watch)
    assert row(buckets, "service:crm") == ["service:crm", "60/1m", "██████░░░░ 6.0/10", "2", "120", "1",
                                           "for 30s"]
    leases = section(lines, "leases")
    assert row(leases, "key") == ["key", "holders", "leased share", "leased burst", "shared demand"]
    assert row(leases, "service:crm") == ["service:crm", "2", "0.5", "4", "0.25"]
    gateway = section(lines, "gateway sessions")
    assert row(gateway, "server") == ["server", "sessions", "oldest", "streams", "in flight"]
    assert row(gateway, "crm-ro") == ["crm-ro", "3", "12m34s", "1", "0"]
    assert "grants" not in lines  # absent parts are not drawn


def test_parts_shown_only_when_present_and_no_live_sessions_said() -> None:
    status = copy.deepcopy(RECORDED)
    status["gateway"]["servers"] = []
    for part in ("logins", "buckets", "leases"):
        del status[part]
    lines = drawn(status)
    assert "gateway: no live sessions" in lines
    assert not {"logins", "buckets", "leases"} & set(lines)


def test_a_malformed_or_hostile_document_still_draws() -> None:
    status: dict[str, Any] = {
        "version": 7, "servers": [{"name": "evil\x1b[2J\x07", "secrets": "not-a-list"}, "junk", None],
        "logins": [{"key": "k", "state": "weird", "expires_at": float("nan"), "renew_at": "soon"}],
        "buckets": [{"key": "b", "level": "full", "capacity": 0, "paused_until": float("inf")}],
        "leases": {"key": "single", "holders": 1},
        "gateway": {"servers": "nope"},
    }
    lines = drawn(status)
    text = "\n".join(lines)
    assert "\x1b" not in text and "\x07" not in text  # a control sequence in a name is not replayed
    assert row(lines, "evil?[2J?") == ["evil?[2J?", "-", "-", "-", "-"]
    assert row(lines, "k") == ["k", "weird", "-", "-", "-", "-"]
    assert row(lines, "b") == ["b", "-", "-", "-", "-", "-", "-"]
    assert row(lines, "single") == ["single", "1"]
    many = {"servers": [{"name": f"s{i}", "key": f"mcp:s{i}"} for i in range(MAX_ROWS + 5)]}
    lines = drawn(many)
    assert f"s{MAX_ROWS - 1}" in "\n".join(lines) and f"s{MAX_ROWS}" not in {r.split()[0] for r in lines if r}
    assert any("… and 5 more" in line for line in lines)


def test_bar_and_duration() -> None:
    assert bar(0, 10) == "░░░░░░░░░░ 0.0/10"
    assert bar(10, 10) == "██████████ 10.0/10"
    assert bar(2.5, 5) == "█████░░░░░ 2.5/5"
    assert bar(99, 5) == "██████████ 99.0/5"  # a level past the burst fills the bar, no more
    assert bar(1, 0) == bar(None, 5) == bar(float("nan"), 5) == "-"
    assert [duration(s) for s in (0, 59.9, 60, 3599, 3600, 86399, 86400 * 3 + 7200)] == [
        "0s", "59s", "1m00s", "59m59s", "1h00m", "23h59m", "3d02h"]


def bucket_doc(granted: int, refused: int) -> dict[str, Any]:
    doc = copy.deepcopy(RECORDED)
    doc["buckets"][0].update(granted=granted, refused=refused)
    return doc


def test_per_minute_from_two_readings() -> None:
    assert per_minute(None, (NOW, bucket_doc(120, 1))) == {}
    assert per_minute((NOW, bucket_doc(120, 1)), (NOW + 30, bucket_doc(150, 4))) == {"service:crm": (60.0, 6.0)}
    assert per_minute((NOW, bucket_doc(120, 1)), (NOW + 30, bucket_doc(5, 0))) == {}  # restarted: counts reset
    assert per_minute((NOW, bucket_doc(120, 1)), (NOW, bucket_doc(150, 4))) == {}  # no time between


class Script:
    """A fake sidecar and clock for watch(): documents (or errors) in turn, sleeps recorded."""

    def __init__(self, answers: list[Any], interrupt_after: int | None = None) -> None:
        self.answers = answers
        self.now = NOW
        self.sleeps: list[float] = []
        self.fetches = 0
        self.interrupt_after = interrupt_after

    def fetch(self) -> dict[str, Any]:
        answer = self.answers[min(self.fetches, len(self.answers) - 1)]
        self.fetches += 1
        if isinstance(answer, Exception):
            raise answer
        return copy.deepcopy(answer)

    def sleep(self, seconds: float) -> None:
        if self.interrupt_after is not None and len(self.sleeps) >= self.interrupt_after:
            raise KeyboardInterrupt
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def frames(out: Console) -> str:
    return out.export_text()


def test_watch_refreshes_with_rates_per_minute_and_survives_a_restart() -> None:
    script = Script([bucket_doc(120, 1), bucket_doc(150, 1),
                     SidecarUnavailable("cannot connect to the sidecar"), bucket_doc(170, 3)])
    out = console()
    assert watch(script.fetch, out, interval=30, count=4, clock=script.clock, sleep=script.sleep) == 0
    assert script.fetches == 4 and script.sleeps == [30, 30, 30]
    lines = [line.rstrip() for line in frames(out).splitlines()]
    # the last frame: the reading before it was 60 s earlier (the failed one is not a reading)
    assert row(lines[-12:], "service:crm")[4:6] == ["20/min", "2/min"]
    assert "every 30s, Ctrl-C quits" in lines[0]
    assert sum("60/min" in line for line in lines) >= 1  # the second frame: 30 granted in 30 s


def test_watch_shows_an_unreachable_sidecar_and_ctrl_c_exits_0() -> None:
    script = Script([SidecarUnavailable("cannot connect to the sidecar")], interrupt_after=2)
    out = console()
    assert watch(script.fetch, out, interval=2, count=None, clock=script.clock, sleep=script.sleep) == 0
    assert script.fetches == 3  # fetched, slept, fetched, slept, fetched, Ctrl-C in the third sleep
    assert "mcpcreds: sidecar_unavailable: cannot connect to the sidecar  (every 2s, Ctrl-C quits)" in frames(out)


# -- the command on a terminal, against a real sidecar

CONFIG = """
[sidecar]
socket = "{socket}"
[secrets]
sources = ["env"]
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:STATUS_VIEW_TOKEN}}}}" }}
rate = "60/1m"
"""
TOKEN = "status-view-canary-7d1e"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    folder = tmp_path_factory.mktemp("status-view")
    folder.chmod(0o700)
    socket = folder / "s.sock"
    config = folder / "config.toml"
    config.write_text(CONFIG.format(socket=socket))
    with run_sidecar(config, socket, {"STATUS_VIEW_TOKEN": TOKEN}) as proc:
        yield proc


def on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run `mcpcreds ARGS` with stdout on a pseudo-terminal; its output and exit code."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "50", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "mcpcreds", *args], stdout=slave, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, b"".join(chunks).decode(errors="replace"), err.decode(errors="replace")


def test_status_on_a_terminal_draws_tables_and_piped_stays_json(sidecar: SidecarProcess, tmp_path: Path) -> None:
    config = str(sidecar.config)
    code, out, err = on_a_terminal("status", "--config", config)
    assert code == 0, err
    assert "servers" in out and "buckets" in out
    assert "docs" in out and "mcp:docs" in out and "60/1m" in out and "STATUS_VIEW_TOKEN" in out
    assert "██████████ 60.0/60" in out  # the full bucket's bar
    assert TOKEN not in out and not out.lstrip().startswith("{")
    piped = subprocess.run([sys.executable, "-m", "mcpcreds", "status", "--config", config],
                           capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and json.loads(piped.stdout)["servers"][0]["name"] == "docs"


def test_status_watch_on_a_terminal_and_refused_when_piped(sidecar: SidecarProcess) -> None:
    config = str(sidecar.config)
    code, out, err = on_a_terminal("status", "--watch", "--count", "2", "--interval", "0.1", "--config", config)
    assert code == 0, err
    # two frames drawn in place (rich.live draws the last once more as it stops); the second has
    # a reading before it: the bucket's granted and refused per minute
    assert out.count("every 0.1s, Ctrl-C quits") >= 2 and "0/min" in out
    assert TOKEN not in out
    piped = subprocess.run([sys.executable, "-m", "mcpcreds", "status", "--watch", "--config", config],
                           capture_output=True, text=True, timeout=60)
    assert piped.returncode == 2 and "mcpcreds status --json" in piped.stderr
    code, _, err = on_a_terminal("status", "--watch", "--interval", "0", "--config", config)
    assert code == 2 and "--interval takes" in err


def test_the_command_refuses_a_document_that_is_not_a_status() -> None:
    """The view draws what it can of odd fields, but `mcpcreds status` refuses an answer without
    the core rows (an impostor or a broken sidecar), rather than exit 0 over an empty table."""
    check_document(RECORDED)
    check_document({"servers": []})
    bad: Any
    for bad in ([], {"servers": "x"}, {"servers": [{"name": 1, "key": "k"}]}, {"servers": [{}]},
                {"servers": [], "logins": "x"}, {"servers": [], "buckets": [{"key": "k", "level": "high",
                                                                            "capacity": 1}]},
                {"servers": [], "buckets": [{"key": "k", "level": 1, "capacity": 1, "paused_until": 1e300}]},
                {"servers": [], "logins": [{"key": "k", "expires_at": float("nan")}]}):
        with pytest.raises(ValueError):
            check_document(bad)
