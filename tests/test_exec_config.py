"""`[exec.NAME]` in the config: the messages that are the entry's own (not a server's), and the
Rule of Two at config level, which names exec entries as grants do (`exec:NAME`)."""

from __future__ import annotations

import tomllib

import pytest

from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Config
from mcpcreds.errors import ConfigError

SENSITIVE_SERVER = """
[[servers]]
name = "crm"
endpoint = "https://crm.example.com/mcp"
tags = ["sensitive"]
headers = { Authorization = "{{secret:CRM}}" }
tool_allowlist = ["search"]
"""


def parse(text: str) -> Config:
    return parse_config(tomllib.loads(text))


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    return caught.value.errors


def test_restricted_without_allow_hosts_speaks_of_the_child_not_token_endpoints() -> None:
    [error] = errors('[exec.gh]\nnet = "restricted"\n')
    assert error.startswith("exec.gh.allow_hosts: ")
    assert "egress proxy" in error and "token endpoint" not in error
    # a server's message is unchanged
    [server] = errors('[[servers]]\nname = "a"\nendpoint = "https://a.example.com/mcp"\nnet = "restricted"\n')
    assert "token endpoint" in server


def test_a_credential_shaped_literal_in_env_is_refused_without_mentioning_literal_headers() -> None:
    [error] = errors('[exec.gh]\nenv = { LOG_LEVEL = "ghp_' + "a" * 36 + '" }\n')
    assert error.startswith("exec.gh.env.LOG_LEVEL: looks like a credential")
    assert "literal_headers" not in error and "{{secret:NAME}}" in error and "ghp_" not in error


def test_the_trifecta_warning_names_exec_entries() -> None:
    together = parse(SENSITIVE_SERVER + '[exec.gh]\nnet = "broad_audited"\nauthorization = { by = "ops", reason = "r" }\n')
    [warning] = together.warnings
    assert "exec:gh" in warning and "crm" in warning and "refused" in warning
    alone = parse('[exec.trio]\ntags = ["sensitive", "untrusted_input"]\n')
    [warning] = alone.warnings
    assert warning.startswith("exec.trio: ") and "allow_trifecta" in warning
    # `off` carries no egress: no trifecta, no warning
    assert parse(SENSITIVE_SERVER + '[exec.gh]\nnet = "off"\n').warnings == ()
