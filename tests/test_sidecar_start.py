"""The sidecar imports what its config uses (issue 33, "speed where users feel it").

A sidecar is started for real (`mcpcreds serve`, as `main` runs it) in a subprocess whose script
prints `sorted(sys.modules)` from a log handler the moment the `ready` line is logged, then exits:
what a sidecar with one static server has imported by then. Run under `python -S` (site-packages
on PYTHONPATH), so no `.pth` file of the machine can import a module first. A behaviour test, not a
timing test: bench/startup_bench.py measures the time.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpcreds.config.load import load_config, parse_config
from mcpcreds.config.reader import PLAIN_URL, check_url
from mcpcreds.core.lean_toml import loads as lean_loads
from mcpcreds.errors import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src"
EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))
# what a config of static servers has no use for: the Redis state, the TLS and signing libraries,
# the HTTP client (needed by the first relayed call, imported after ready), the status tables
UNUSED = ("redis", "cryptography", "httpx", "httpcore", "authlib", "rich", "click", "pygments", "keyring",
          "tomllib")
UNUSED_OWN = ("mcpcreds.state.redis_state", "mcpcreds.credentials.oauth", "mcpcreds.credentials.discovery",
              "mcpcreds.gateway", "mcpcreds.signers", "mcpcreds.exec", "mcpcreds.net.egress_http",
              "mcpcreds.net.upstream")
AT_READY = """
import json, logging, os, sys

class AtReady(logging.Handler):
    def emit(self, record):
        if record.getMessage() == "ready":
            print(json.dumps(sorted(sys.modules)), flush=True)
            os._exit(0)

logging.getLogger("mcpcreds.sidecar").addHandler(AtReady())
from mcpcreds.cli.main import main
main(["serve", "--config", sys.argv[1]])
"""
WARM_UP = """
import json, sys
from mcpcreds.config.load import load_config
from mcpcreds.sidecar.serve import warm_up

config = load_config(sys.argv[1])
before = set(sys.modules)
warm_up(config)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def clean_run(script: str, config: Path) -> list[str]:
    """`script CONFIG` under `python -S`; the JSON list it prints."""
    path = os.pathsep.join([str(SRC), *site.getsitepackages()])
    env = {**os.environ, "PYTHONPATH": path, "START_TOKEN": "start-token-5c1d"}
    proc = subprocess.run([sys.executable, "-S", "-c", script, str(config)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(json.loads(proc.stdout.splitlines()[-1]))


def static_config(folder: Path, expose: str = "both") -> Path:
    folder.chmod(0o700)
    config = folder / "config.toml"
    config.write_text(f"""
[sidecar]
socket = "{folder / 's.sock'}"
[secrets]
sources = ["env"]
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "Authorization" = "Bearer {{{{secret:START_TOKEN}}}}" }}
tool_allowlist = ["search"]
expose = "{expose}"
""")
    return config


def unused(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in UNUSED or m.startswith(UNUSED_OWN)]


def test_a_sidecar_with_one_static_server_imports_nothing_its_config_does_not_use(tmp_path: Path) -> None:
    modules = clean_run(AT_READY, static_config(tmp_path))
    assert "mcpcreds.sidecar.serve" in modules and "mcpcreds.broker.broker" in modules  # read at ready
    assert unused(modules) == []
    assert len(modules) < 400  # ~650 when everything was imported at start


def test_after_ready_the_parts_of_a_relayed_server_are_imported_off_the_loop(tmp_path: Path) -> None:
    """`warm_up` (run in a worker thread once the sidecar is ready) imports what the first
    relayed call needs; for a server whose credential is only handed out, nothing of it."""
    relayed = clean_run(WARM_UP, static_config(tmp_path))
    assert {"httpx", "mcpcreds.gateway.relay", "mcpcreds.net.upstream", "mcpcreds.net.egress_http"} <= set(relayed)
    assert not any(m.split(".")[0] in ("redis", "authlib", "cryptography") for m in relayed)  # nothing signs
    folder = tmp_path / "headers"
    folder.mkdir()
    handed_out = clean_run(WARM_UP, static_config(folder, expose="headers"))
    assert unused(handed_out) == []


@given(st.from_regex(PLAIN_URL, fullmatch=True))
def test_a_url_checked_without_httpx_is_one_httpx_accepts(value: str) -> None:
    """check_url skips httpx.URL for plain URLs (PLAIN_URL): httpx must accept every one of them."""
    assert PLAIN_URL.match(value)
    httpx.URL(value)


@pytest.mark.parametrize("value", [
    "https://docs.example.com/mcp", "http://localhost:8080/mcp", "https://a.example.com:443/x?y=1&z=%20",
    "https://999.1.1.1/mcp", "https://[::1]/mcp", "https://[::zz]/mcp", "https://exa mple.com/", "https://",
    "https://host:99999/", "https://xn--nxasmq6b.example/mcp", "https://b\u00fccher.example/mcp",
    "https://1.2.3.4/mcp", "https://user:pw@example.com/mcp", "ftp://example.com/", "https://example.com/#f",
])
def test_check_url_agrees_with_httpx(value: str) -> None:
    """Whatever PLAIN_URL lets through, the answer is the one httpx.URL would have led to."""
    try:
        httpx.URL(value)
        httpx_ok = True
    except (ValueError, httpx.InvalidURL):
        httpx_ok = False
    problem = check_url(value)
    if not httpx_ok:
        assert problem is not None
    if PLAIN_URL.match(value):
        assert httpx_ok


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_a_config_read_by_the_lean_reader_is_the_one_tomllib_gives(example: Path) -> None:
    """load_config reads plain TOML with lean_toml (its tables are dict subclasses): the Config is
    the one parse_config makes of tomllib's reading."""
    import tomllib

    text = example.read_text(encoding="utf-8")
    lean = lean_loads(text)
    assert lean is not None, "the lean reader no longer reads the examples: the sidecar pays for tomllib"
    assert parse_config(lean, str(example)) == parse_config(tomllib.loads(text), str(example))


def test_a_type_error_names_toml_types_whoever_read_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[[servers]]\nname = "docs"\nendpoint = { url = "https://docs.example.com" }\n')
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert "servers[0].endpoint: expected a URL string, got table" in str(caught.value)
