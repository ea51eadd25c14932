from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from mcpcreds.config.load import load_config
from mcpcreds.config.model import McpServerSpec
from tests.conftest import CANARY, KeyringSession, run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_check_example_config_exits_0_with_a_summary() -> None:
    result = run_cli("check", "--config", str(EXAMPLES / "demo.toml"))
    assert result.code == 0, result.output
    assert "service:search" in result.stdout and "mcp:local-tools" in result.stdout
    assert "5/500ms" in result.stdout


def test_config_option_before_or_after_the_command() -> None:
    assert run_cli("--config", str(EXAMPLES / "demo.toml"), "check").code == 0


def test_five_mistakes_five_errors_exit_2(write_config: Callable[[str], Path]) -> None:
    path = write_config("""
[sidecar]
refresh_ahead = "whenever"
[[servers]]
name = "a"
endpoint = "http://remote.example.com/mcp"
rate = "10/1.5m"
headers = { "Authorization" = "Bearer sk-literal" }
[[servers]]
name = "b"
service = "missing"
""")
    result = run_cli("check", "--config", str(path))
    assert result.code == 2
    lines = result.stderr.splitlines()
    assert [line.split(": ")[0] for line in lines[:-1]] == [
        "sidecar.refresh_ahead", "servers[0].endpoint", "servers[0].headers.Authorization",
        "servers[0].rate", "servers[1].service",
    ]
    assert lines[-1] == f"mcpcreds: 5 configuration errors in {path}"
    assert "sk-literal" not in result.output


def test_missing_config_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("check", "--config", str(tmp_path / "none.toml"))
    assert result.code == 2 and "cannot read config" in result.stderr


def test_spawn_payload_is_secret_free_and_loads_back() -> None:
    config_path = EXAMPLES / "full.toml"
    result = run_cli("spawn-payload", "crm-ro", "docs", "--config", str(config_path),
                     env={"CRM_CLIENT_SECRET": CANARY, "DOCS_KEY": CANARY})
    assert result.code == 0, result.output
    assert CANARY not in result.output
    payload = json.loads(result.stdout)
    config = load_config(config_path)
    assert [McpServerSpec.from_dict(d) for d in payload] == [
        config.servers["crm-ro"].spec, config.servers["docs"].spec]
    assert payload[1]["headers"] == {"X-Api-Key": "{{secret:DOCS_KEY}}"}


def test_spawn_payload_unknown_server() -> None:
    result = run_cli("spawn-payload", "nope", "--config", str(EXAMPLES / "full.toml"))
    assert result.code == 2 and "unknown server 'nope'" in result.stderr


def test_secret_set_list_rm_on_a_real_keyring(keyring_session: KeyringSession,
                                              write_config: Callable[[str], Path]) -> None:
    service = f"mcpcreds-cli-{uuid.uuid4().hex[:8]}"
    path = write_config(f"""
[secrets]
sources = ["keyring"]
keyring_service = "{service}"
keyring_timeout = "30s"  # a bound only a hung keyring crosses, not a busy machine
[[servers]]
name = "docs"
endpoint = "https://docs.example.com/mcp"
headers = {{ "X-Api-Key" = "{{{{secret:DOCS_KEY}}}}" }}
""")
    cfg = ["--config", str(path)]
    result = run_cli("secret", "set", "DOCS_KEY", *cfg, stdin=CANARY + "\n")
    assert result.code == 0, result.output
    assert run_cli("secret", "set", "OTHER", *cfg, stdin="x-value\n").code == 0
    listed = run_cli("secret", "list", *cfg)
    assert listed.stdout.split() == ["DOCS_KEY", "OTHER"]
    assert CANARY not in listed.output
    from mcpcreds.config.model import SecretsConfig
    from mcpcreds.credentials.sources import KeyringSource
    assert KeyringSource(SecretsConfig(keyring_service=service)).get("DOCS_KEY") == CANARY

    refused = run_cli("secret", "rm", "DOCS_KEY", *cfg)
    assert refused.code == 2 and "still used by docs" in refused.stderr
    assert run_cli("secret", "rm", "DOCS_KEY", "--force", *cfg).code == 0
    assert run_cli("secret", "rm", "OTHER", *cfg).code == 0
    assert run_cli("secret", "list", *cfg).stdout.split() == []
    assert run_cli("secret", "rm", "OTHER", *cfg).code == 1


def test_secret_set_refuses_empty_value(write_config: Callable[[str], Path]) -> None:
    path = write_config('[secrets]\nsources = ["env"]\n')
    result = run_cli("secret", "set", "X", "--config", str(path), stdin="\n")
    assert result.code == 2 and "empty secret value" in result.stderr


def test_canary_never_in_check_or_errors(write_config: Callable[[str], Path]) -> None:
    path = write_config(f"""
[[servers]]
name = "a"
endpoint = "https://a.example.com/mcp"
headers = {{ "Authorization" = "Bearer {CANARY}", "X-Other" = "{{{{{CANARY}}}}}" }}
[[servers]]
name = "b"
endpoint = "https://b.example.com/mcp"
auth = {{ kind = "static", token = "{CANARY}" }}
oauth = {{ client_id = "x", client_secret = "{CANARY}", token_url = "https://a.example/t" }}
""")
    result = run_cli("check", "--config", str(path), env={"MCP_TOKEN": CANARY})
    assert result.code == 2
    assert CANARY not in result.output


def test_help_for_every_command() -> None:
    for args in (["--help"], ["check", "--help"], ["secret", "--help"], ["secret", "set", "--help"],
                 ["spawn-payload", "--help"]):
        result = run_cli(*args)
        assert result.code == 0 and "usage: mcpcreds" in result.stdout


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """`mcpcreds check | head -1`: the pipe closes under the CLI; it stops quietly."""
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        proc = subprocess.run([sys.executable, "-m", "mcpcreds", "check", "--config", str(EXAMPLES / "full.toml")],
                              stdout=write, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(write)
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr, proc.stderr.decode()
    assert proc.returncode == 1
