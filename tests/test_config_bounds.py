"""What TOML allows but no config needs is a clear error, never a traceback: an integer past
Python's digit limit or past 64 bits, arrays or inline tables nested thousands deep (tomllib
recurses), a uid past 32 bits; in `check`, `serve`, `headers --config` (whose lean reader reads
the config first) and a reload."""

from __future__ import annotations

import signal
import tomllib
from pathlib import Path

import pytest

from mcpcreds import Client
from mcpcreds.config.load import parse_config
from mcpcreds.errors import ConfigError
from tests.conftest import run_cli
from tests.sidecar_proc import run_sidecar

DIGITS = "9" * 5000
# what tomllib itself cannot read: Python's int() refuses 4300+ digits; tomllib recurses per level
UNREADABLE = {
    "a 5000-digit integer": (f"[sidecar]\nmax_grants = {DIGITS}\n", "an integer out of range"),
    "arrays 3000 deep": ("[sidecar]\nx = " + "[" * 3000 + "]" * 3000 + "\n", "nested more than 16 deep"),
    "inline tables 3000 deep": ("[sidecar]\nx = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n",
                                "nested more than 16 deep"),
    "a top-level key 1000 arrays deep": ("x = " + "[" * 1000 + "]" * 1000 + "\n", "nested more than 16 deep"),
}
# what it reads, refused by path before any parser sees it
READABLE = {
    "arrays 100 deep": ("[sidecar]\nx = " + "[" * 100 + "]" * 100 + "\n",
                        [f"sidecar.x{'[0]' * 14}: arrays and tables nest at most 16 deep"]),
    "dotted keys 40 deep": ("[sidecar]\n" + ".".join(["k"] * 40) + " = 1\n",
                            [f"sidecar{'.k' * 15}: arrays and tables nest at most 16 deep"]),
    "a 400-digit duration": (f"[sidecar]\nrequest_timeout = {DIGITS[:400]}\n",
                             ["sidecar.request_timeout: integer out of range (TOML integers are 64-bit)"]),
    "a 400-digit fraction": (f"[sidecar]\nlocal_share = -{DIGITS[:400]}\n",
                             ["sidecar.local_share: integer out of range (TOML integers are 64-bit)"]),
    "2**64 in an array": (f"[sidecar]\nallow_uids = [1, {2**64}]\n",
                          ["sidecar.allow_uids[1]: integer out of range (TOML integers are 64-bit)"]),
    "a uid past 32 bits": (f"[sidecar]\nallow_uids = [{2**40}]\n",
                           ["sidecar.allow_uids[0]: expected a non-negative integer uid"]),
}


@pytest.mark.parametrize("case", list(READABLE))
def test_what_tomllib_reads_is_refused_by_path(case: str) -> None:
    text, expected = READABLE[case]
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(text))
    assert info.value.errors == expected


@pytest.mark.parametrize("case", [*UNREADABLE, *READABLE])
def test_check_says_what_never_a_traceback(tmp_path: Path, case: str) -> None:
    text, says = UNREADABLE[case] if case in UNREADABLE else (READABLE[case][0], READABLE[case][1][0])
    config = tmp_path / "config.toml"
    config.write_text(text)
    result = run_cli("check", "--config", str(config))
    assert result.code == 2 and says in result.stderr, result.output
    assert "Traceback" not in result.output and DIGITS[:50] not in result.output, result.output


@pytest.mark.parametrize("case", list(UNREADABLE))
@pytest.mark.parametrize("command", [("serve",), ("headers", "web")])
def test_serve_and_headers_say_what_never_a_traceback(tmp_path: Path, case: str, command: tuple[str, ...]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(UNREADABLE[case][0])
    result = run_cli(*command, "--config", str(config))
    assert result.code == 2 and UNREADABLE[case][1] in result.stderr, result.output
    assert "Traceback" not in result.output, result.output


def test_a_reload_to_such_a_config_is_rejected_and_the_sidecar_serves_on(tmp_path: Path) -> None:
    socket_path, config = tmp_path / "run" / "s.sock", tmp_path / "config.toml"
    sidecar_table = f'[sidecar]\nsocket = "{socket_path}"\n'
    server = '[[servers]]\nname = "web"\nendpoint = "https://web.example.com/mcp"\n'
    config.write_text(sidecar_table + server)
    with run_sidecar(config, socket_path) as sidecar:
        for text, says in (*UNREADABLE.values(), *((t, e[0]) for t, e in READABLE.values())):
            body = text.removeprefix("[sidecar]\n")
            config.write_text(sidecar_table + body + server if body != text else text + sidecar_table + server)
            sidecar.signal(signal.SIGHUP)
            entry = sidecar.wait_for("reload rejected: config invalid; keeping the old one")
            assert len(entry["errors"]) == 1 and says in entry["errors"][0], entry
        with Client(sidecar.socket) as client:
            assert client.health()["status"] == "ok"
        assert "Traceback" not in sidecar.log
