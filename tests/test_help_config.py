"""`mcpcreds help config` (issue 19): every key the config parser accepts is on the page, with a
meaning and the default the parser really applies. The parser is watched while it reads configs
that reach every table (the allowed keys of each `keys()` check are recorded), so a key added to
config.py without a line in help_config.py fails here."""

from __future__ import annotations

import contextlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mcpcreds.cli.help_config import UNDESCRIBED, _toml, entries
from mcpcreds.config import load as cfg
from mcpcreds.config.aws import AWS_KEYS
from mcpcreds.config.reader import Collector
from mcpcreds.config.spiffe import SPIFFE_KEYS
from mcpcreds.errors import ConfigError
from tests.conftest import run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# the tables examples/*.toml leave out
MORE = """
[gateway]
listen = "127.0.0.1:0"
[telemetry]
exporter = "otlp"
[aauth]
provider = "https://agent.example.com"
enroll = { token = "{{secret:ENROLL}}" }
[exec.tool]
env = { "A" = "b" }
net = "off"
[exec.wide]
net = "broad_audited"
authorization = { by = "ops", reason = "needs the package index" }
[[servers]]
name = "st"
endpoint = "https://st.example.com/mcp"
auth = { kind = "static", token = "{{secret:T}}" }
[[servers]]
name = "o2"
endpoint = "https://o2.example.com/mcp"
auth = { kind = "oauth2", client_id = "c", client_secret = "{{secret:S}}", token_url = "https://o2.example.com/t" }
[[servers]]
name = "aws"
endpoint = "https://aws.example.com/mcp"
auth = { kind = "aws", region = "us-east-1", service = "execute-api", source = "env" }
[[servers]]
name = "sp"
endpoint = "https://sp.example.com/mcp"
auth = { kind = "spiffe", svid = "jwt", jwt_svid_file = "/run/spire/svid.jwt", audience = "sp" }
[[servers]]
name = "tm"
endpoint = "https://tm.example.com/mcp"
tool_metadata = { run_query = { data_sensitivity = "medium", flagged_parameters = [{ pointer = "/sql", pattern = "sql_injection" }] } }
[[servers]]
name = "oa"
endpoint = "https://oa.example.com/mcp"
oauth = { client_id = "c", client_secret = "{{secret:S}}", token_url = "https://oa.example.com/t" }
"""

# where a recorded path's keys must appear: the page's heading for it
PATHS = [
    (r"sidecar", "[sidecar]"), (r"secrets", "[secrets]"), (r"gateway", "[gateway]"), (r"aauth", "[aauth]"),
    (r"telemetry", "[telemetry]"),
    (r"aauth\.enroll", "[aauth.enroll]"), (r"exec\.[^.]+", "[exec.NAME]"),
    (r"exec\.[^.]+\.authorization", "authorization = { by, reason } (an [exec.NAME]'s consent)"),
    (r"(servers\[\d+\]|services\.[^.]+)", "[[servers]] and [services.NAME]"),
    (r"(servers\[\d+\]|services\.[^.]+)\.tool_metadata\.[^.]+",
     "tool_metadata = { TOOL = {...} } (a server's tool metadata)"),
    (r"(servers\[\d+\]|services\.[^.]+)\.tool_metadata\.[^.]+\.flagged_parameters\[\d+\]",
     "flagged_parameters = [{ pointer, pattern }] (a tool's)"),
    (r"(servers\[\d+\]|services\.[^.]+)\.oauth", "oauth = {...} (a server's OAuth client)"),
    (r"(servers\[\d+\]|services\.[^.]+)\.auth", "auth = {...} (kind static, oauth2)"),
]


def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    original = Collector.keys

    def keys(self: Any, path: str, table: Any, allowed: tuple[str, ...]) -> None:
        if allowed in (AWS_KEYS, SPIFFE_KEYS):
            path += "<aws>" if allowed == AWS_KEYS else "<spiffe>"
        seen.setdefault(path, set()).update(allowed)
        original(self, path, table, allowed)

    monkeypatch.setattr(Collector, "keys", keys)
    for text in [*(p.read_text() for p in sorted(EXAMPLES.glob("*.toml"))), MORE]:
        with contextlib.suppress(ConfigError):  # the keys are recorded all the same
            cfg.parse_config(tomllib.loads(text))
    return seen


def page() -> dict[str, dict[str, tuple[str, str]]]:
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for heading, key, default, meaning in entries():
        out.setdefault(heading, {})[key] = (default, meaning)
    return out


def test_every_key_the_parser_accepts_is_on_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = recorded(monkeypatch)
    shown = page()
    assert seen.pop("") == {"sidecar", "secrets", "services", "servers", "gateway", "exec", "aauth",
                            "telemetry"}
    reached = set()
    heading: str | None
    for path, allowed in seen.items():
        if path.endswith(("<aws>", "<spiffe>")):
            heading = f'auth = {{ kind = "{path.rsplit("<", 1)[1][:-1]}", ... }}'
        else:
            heading = next((h for pattern, h in PATHS if re.fullmatch(pattern, path)), None)
            assert heading is not None, f"a table the page does not know: {path}"
        reached.add(heading)
        missing = allowed - set(shown[heading])
        assert not missing, f"{heading} lacks {sorted(missing)}"
    assert reached == set(shown)  # every section of the page was checked against the parser


def test_every_key_has_a_meaning_and_a_default() -> None:
    for heading, keys in page().items():
        for key, (default, meaning) in keys.items():
            assert meaning != UNDESCRIBED and meaning, (heading, key)
            assert default, (heading, key)


def test_the_defaults_shown_are_the_ones_the_parser_applies() -> None:
    empty = cfg.parse_config({})
    shown = page()
    for heading, parsed in (("[sidecar]", empty.sidecar), ("[secrets]", empty.secrets),
                            ("[telemetry]", empty.telemetry)):
        for key, (default, _) in shown[heading].items():
            value = getattr(parsed, key)
            if value is None or value == ():
                continue  # "none", or a default described in words (the socket, the uids)
            assert default == _toml(value), (heading, key, default, value)
    server = cfg.parse_config(tomllib.loads('[[servers]]\nname = "a"\nendpoint = "https://a.example.com/mcp"\n'))
    gateway = server.servers["a"].gateway
    for key in ("expose", "max_wait"):
        assert shown["[[servers]] and [services.NAME]"][key][0] == _toml(getattr(gateway, key))
    for key, (default, _) in shown["[gateway]"].items():
        value = getattr(empty.content_defaults, key, None)  # listen is not a content key
        if value is not None:  # pin_tools: described in words
            assert default == _toml(value), ("[gateway]", key, default, value)


def test_a_default_taken_from_gateway_names_a_key_gateway_takes() -> None:
    shown = page()
    for heading in ("[exec.NAME]", "[[servers]] and [services.NAME]"):
        for key, (default, _) in shown[heading].items():
            if "[gateway]" in default:
                assert key in shown["[gateway]"], (heading, key, default)
    empty = cfg.parse_config(tomllib.loads('[exec.a]\ntrust = "trusted"\n'))
    assert empty.execs["a"].content.roots is None  # no roots unless the entry sets them


def test_the_command_prints_the_page() -> None:
    result = run_cli("help", "config")
    assert result.code == 0, result.stderr
    for heading, keys in page().items():
        assert f"\n{heading}\n" in result.stdout
        for key, (default, _) in keys.items():
            assert f"  {key} = {default}\n" in result.stdout
    assert "refresh_ahead = 60\n" in result.stdout
    assert run_cli("help", "nothing").code == 2


def test_a_reader_that_leaves_early_gets_no_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """`mcpcreds help config | head -1`: the page is written, the reader has gone; the closed pipe
    is met inside the command (exit 1, no "Exception ignored" at interpreter exit). Stdout's buffer
    holds the whole page, so the first write is the flush, as when head leaves after a line."""
    import io
    import os

    from mcpcreds.cli.main import main

    read, write = os.pipe()
    os.close(read)
    out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(write, "w"), buffer_size=1 << 20), encoding="utf-8")
    monkeypatch.setattr("sys.stdout", out)
    try:
        assert main(["help", "config"]) == 1
    finally:
        with contextlib.suppress(OSError):  # main() pointed the fd at /dev/null: this flush goes there
            out.close()
