"""`aauth` in the config (issue 15): the seed's boolean on servers and services, the global
`[aauth]` table, and which servers sign."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Config, McpServerSpec
from mcpcreds.errors import ConfigError
from tests.conftest import run_cli

OAUTH = ('oauth = { client_id = "c", client_secret = "{{secret:S}}", '
         'token_url = "https://a.example/token" }\n')


def parse(text: str) -> Config:
    return parse_config(tomllib.loads(text))


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value.errors


def server(name: str, extra: str = "") -> str:
    return f'[[servers]]\nname = "{name}"\nendpoint = "https://{name}.example/mcp"\n{extra}'


def signed(config: Config) -> set[str]:
    return {name for name, t in config.servers.items() if t.aauth}


def test_seed_booleans_parse_and_travel_in_the_spec_as_written() -> None:
    config = parse(server("on", "aauth = true\n") + server("off", "aauth = false\n") + server("plain"))
    assert signed(config) == {"on"}
    assert config.servers["on"].auth_kind == "aauth"
    assert config.servers["off"].auth_kind is None
    specs = {n: t.spec.to_dict() for n, t in config.servers.items()}
    assert specs["on"]["aauth"] is True and specs["off"]["aauth"] is False and "aauth" not in specs["plain"]
    assert McpServerSpec.from_dict(specs["on"]).aauth is True
    assert McpServerSpec.from_dict({**specs["on"], "aauth": {"agent": "x"}}).aauth is None


def test_a_table_is_refused_with_its_path() -> None:
    assert errors_of(server("s", 'aauth = { agent = "x" }\n')) == [
        "servers[0].aauth: expected true or false (sign requests to this server with the AAuth agent key)"]


def test_the_global_default_applies_to_servers_without_the_field() -> None:
    servers = server("none") + server("off", "aauth = false\n") + server("on", "aauth = true\n")
    assert signed(parse(servers)) == {"on"}  # no [aauth]: nothing signs unless asked
    provider = '[aauth]\nprovider = "https://agents.example"\n'
    assert signed(parse(provider + servers)) == {"none", "on"}  # a provider: sign all by default
    assert signed(parse('[aauth]\ndefault = true\n' + servers)) == {"none", "on"}
    assert signed(parse(provider + 'default = false\n' + servers)) == {"on"}


def test_auth_and_oauth_win_over_aauth() -> None:
    config = parse('[aauth]\ndefault = true\n' + server("o", OAUTH) + server("o2", OAUTH + "aauth = true\n")
                   + server("a", 'auth = { kind = "static", token = "{{secret:T}}" }\n'))
    assert signed(config) == set()
    assert config.servers["o"].auth_kind == "oauth" and config.servers["a"].auth_kind == "auth"
    assert any(w.startswith("servers[1].aauth: not used, `oauth` takes precedence") for w in config.warnings)


def test_services_carry_it_and_their_servers_inherit_it() -> None:
    config = parse('[services.crm]\nendpoint = "https://crm.example/mcp"\naauth = true\n'
                   '[services.docs]\nendpoint = "https://docs.example/mcp"\n'
                   '[[servers]]\nname = "crm-ro"\nservice = "crm"\n'
                   '[[servers]]\nname = "docs-ro"\nservice = "docs"\n')
    assert config.services["service:crm"].aauth and signed(config) == {"crm-ro"}
    assert errors_of('[services.crm]\nendpoint = "https://crm.example/mcp"\n'
                     '[[servers]]\nname = "x"\nservice = "crm"\naauth = true\n') == [
        "servers[0].aauth: inherited from its service; do not restate it"]


def test_the_global_table() -> None:
    config = parse('[aauth]\nprovider = "https://agents.example"\nkey_file = "/var/lib/m/agent.key"\n'
                   'enroll = { token = "{{secret:ENROLL}}" }\ndefault = false\n')
    assert config.aauth.provider == "https://agents.example" and config.aauth.default is False
    assert config.aauth.key_path(Path("/state")) == Path("/var/lib/m/agent.key")
    assert config.aauth.enroll is not None and config.aauth.enroll.kind == "token"
    assert parse('[aauth]\n').aauth.key_path(Path("/state")) == Path("/state/aauth-agent.key")
    assert parse('[aauth]\nprovider = "https://p.example"\nenroll = "open"\n').aauth.enroll.kind == "open"  # type: ignore[union-attr]
    federated = parse('[aauth]\nprovider = "https://p.example"\nenroll = { assertion_file = "/run/sa/token" }\n')
    assert federated.aauth.enroll is not None and federated.aauth.enroll.assertion_file == "/run/sa/token"
    assert config.aauth.alg == "Ed25519" and parse('[aauth]\nalg = "ES256"\n').aauth.alg == "ES256"


@pytest.mark.parametrize(("table", "error"), [
    ('provider = "http://agents.example"', "aauth.provider: http:// is only allowed for a loopback host"),
    ('key_file = "agent.key"', "aauth.key_file: expected an absolute path"),
    ('default = "yes"', "aauth.default: expected bool, got string"),
    ('enroll = "open"', "aauth.enroll: needs `provider`"),
    ('provider = "https://p.example"\nenroll = { token = "literal-enrollment-token-123" }',
     "aauth.enroll.token: a credential must not be written in the config"),
    ('provider = "https://p.example"\nenroll = { assertion_file = "sa/token" }',
     "aauth.enroll.assertion_file: expected an absolute path"),
    ('provider = "https://p.example"\nenroll = { token = "{{secret:A}}", assertion_file = "/x" }',
     "aauth.enroll: expected exactly one of token, assertion_file"),
    ('agent = "x"', "aauth.agent: unknown key"),
    ('alg = "EdDSA"', 'aauth.alg: expected "Ed25519" or "ES256"'),
])
def test_global_table_errors_name_their_path_never_the_value(table: str, error: str) -> None:
    errs = errors_of(f"[aauth]\n{table}\n")
    assert len(errs) == 1 and errs[0].startswith(error), errs
    assert "literal-enrollment-token-123" not in errs[0]


def test_check_passes_on_a_config_written_for_the_seed(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[secrets]\nsources = ["env"]\n' + server("signed", "aauth = true\n")
                      + server("unsigned", "aauth = false\n"))
    result = run_cli("check", "--config", str(config))
    assert result.code == 0, result.output
