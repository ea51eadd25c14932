from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mcpcreds.config.load import default_socket_path, find_config_path, load_config, parse_config
from mcpcreds.config.model import Config, McpServerSpec
from mcpcreds.core.rates import Rate
from mcpcreds.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def parse(text: str) -> Config:
    return parse_config(tomllib.loads(text))


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value.errors


CATALOG = """
[services.crm]
endpoint = "https://crm.example.com/mcp"
rate = "60/1m"
tags = ["sensitive"]
headers = { "X-Tenant" = "acme" }
[services.crm.oauth]
token_url = "https://auth.example.com/oauth2/token"
client_id = "agent-7"
client_secret = "{{secret:CRM_CLIENT_SECRET}}"
scope = "tools:read tools:call"
"""


def test_examples_are_valid() -> None:
    paths = sorted(EXAMPLES.glob("*.toml"))
    assert {p.name for p in paths} >= {"demo.toml", "full.toml"}
    for path in paths:
        assert load_config(path).servers


def test_server_inherits_its_service_and_shares_its_key() -> None:
    config = parse(CATALOG + '[[servers]]\nname = "crm-ro"\nservice = "crm"\n'
                   '[[servers]]\nname = "crm-rw"\nservice = "crm"\ntags = ["egress"]\n')
    ro, rw = config.servers["crm-ro"], config.servers["crm-rw"]
    assert ro.key == rw.key == "service:crm"
    assert ro.endpoint == "https://crm.example.com/mcp"
    assert ro.rate == Rate(60, 60.0)
    # one credential, one set of tags: every name for the key carries the union (effective tags)
    assert ro.tags == rw.tags == config.services["service:crm"].tags == {"sensitive", "egress"}
    assert str(ro.headers["X-Tenant"]) == "acme"
    assert ro.auth_kind == "oauth" and ro.login is not None
    assert ro.login.client_id == "agent-7"
    assert ro.login.resource == "https://crm.example.com/mcp"  # RFC 8707 default: the endpoint
    assert ro.secret_names == {"CRM_CLIENT_SECRET"}
    assert config.target("service:crm") is config.services["service:crm"]
    assert config.target("mcp:crm-ro") is ro and config.target("crm-ro") is ro


def test_standalone_server_key_and_default_tags() -> None:
    config = parse('[[servers]]\nname = "docs"\nendpoint = "https://docs.example.com/mcp"\n'
                   'headers = { "X-Api-Key" = "{{secret:DOCS_KEY}}" }\nrate = "5/1s"\n')
    docs = config.servers["docs"]
    assert docs.key == "mcp:docs"
    assert docs.tags == {"untrusted_input"}  # untagged counts as untrusted input
    assert docs.auth_kind is None and docs.login is None
    assert config.target("mcp:docs") is docs
    assert config.target("mcp:nope") is None and config.target("service:docs") is None


@pytest.mark.parametrize("key", ["endpoint", "headers", "auth", "oauth", "rate"])
def test_restating_an_inherited_field_is_an_error(key: str) -> None:
    value = {
        "endpoint": '"https://x.example.com/mcp"',
        "headers": '{ "X-A" = "b" }',
        "auth": '{ kind = "static", token = "{{secret:T}}" }',
        "oauth": '{ client_id = "a", client_secret = "{{secret:S}}", token_url = "https://a.example/t" }',
        "rate": '"1/1s"',
    }[key]
    errs = errors_of(CATALOG + f'[[servers]]\nname = "x"\nservice = "crm"\n{key} = {value}\n')
    assert any(e.startswith(f"servers[0].{key}: inherited from its service") for e in errs), errs


def test_unknown_service() -> None:
    errs = errors_of('[[servers]]\nname = "x"\nservice = "nope"\n')
    assert errs == ["servers[0].service: unknown service (known: none defined)"]


@pytest.mark.parametrize(
    ("endpoint", "ok"),
    [
        ("https://crm.example.com/mcp", True),
        ("https://crm.example.com:8443", True),
        ("http://127.0.0.1:8000/mcp", True),
        ("http://localhost/mcp", True),
        ("http://[::1]:9000/mcp", True),
        ("http://crm.example.com/mcp", False),
        ("http://10.0.0.1/mcp", False),
        ("ftp://crm.example.com", False),
        ("https://user:pw@crm.example.com/mcp", False),
        ("crm.example.com/mcp", False),
        ("https://", False),
    ],
)
def test_endpoint_rules(endpoint: str, ok: bool) -> None:
    text = f'[[servers]]\nname = "s"\nendpoint = "{endpoint}"\n'
    if ok:
        assert parse(text).servers["s"].endpoint == endpoint
    else:
        errs = errors_of(text)
        assert len(errs) == 1 and errs[0].startswith("servers[0].endpoint: ")
        assert "pw" not in errs[0].partition(": ")[2]  # never quotes the URL it refuses


def test_tags() -> None:
    config = parse('[[servers]]\nname = "s"\nendpoint = "https://a.example"\n'
                   'tags = ["sensitive", "egress", "sensitive"]\n')
    assert config.servers["s"].tags == {"sensitive", "egress"}
    errs = errors_of('[[servers]]\nname = "s"\nendpoint = "https://a.example"\ntags = ["secret"]\n')
    assert errs == ["servers[0].tags[0]: unknown tag: expected one of "
                    "untrusted_input, sensitive, egress"]


@pytest.mark.parametrize("rate", ["0/1s", "10", "-1/1s", "10/1.5m", "x/1s"])
def test_bad_rate_is_reported_with_its_path_never_its_value(rate: str) -> None:
    errs = errors_of(f'[[servers]]\nname = "s"\nendpoint = "https://a.example"\nrate = "{rate}"\n')
    assert len(errs) == 1
    assert errs[0].startswith("servers[0].rate: invalid rate") and repr(rate) not in errs[0]


def test_auth_precedence_over_oauth_over_aauth() -> None:
    base = '[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
    auth = 'auth = { kind = "static", token = "{{secret:T}}" }\n'
    oauth = ('oauth = { client_id = "c", client_secret = "{{secret:S}}", '
             'token_url = "https://a.example/token" }\n')
    aauth = 'aauth = true\n'
    first = parse(base + auth + oauth + aauth)
    assert first.servers["s"].auth_kind == "auth" and not first.servers["s"].aauth
    both = parse(base + oauth + aauth)
    assert both.servers["s"].auth_kind == "oauth" and both.servers["s"].login is not None
    assert not both.servers["s"].aauth  # an oauth server is never also signed
    assert any("servers[0].aauth: not used, `oauth` takes precedence" in w for w in both.warnings)
    only = parse(base + aauth)
    assert only.servers["s"].auth_kind == "aauth" and only.servers["s"].aauth


def test_static_auth_becomes_a_bearer_header() -> None:
    s = parse('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
              'auth = { kind = "static", token = "{{secret:T}}" }\n').servers["s"]
    assert str(s.headers["Authorization"]) == "Bearer {{secret:T}}"
    s = parse('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
              'auth = { kind = "static", header = "X-Key", value = "{{secret:T}}" }\n').servers["s"]
    assert str(s.headers["X-Key"]) == "{{secret:T}}"


def test_oauth2_auth_provider() -> None:
    s = parse('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
              'auth = { kind = "oauth2", issuer = "https://idp.example", client_id = "c", '
              'client_secret = "{{secret:S}}", scopes = ["a", "b"], audience = "api" }\n').servers["s"]
    assert s.login is not None
    assert (s.login.issuer, s.login.scope, s.login.audience) == ("https://idp.example", "a b", "api")
    assert s.login.token_url is None and s.login.resource == "https://a.example/mcp"


@pytest.mark.parametrize(
    ("header", "value", "refused"),
    [
        ("Authorization", "Bearer abc", True),
        ("X-Api-Key", "abc", True),
        ("X-Auth-Token", "abc", True),
        ("client_key", "abc", True),
        ("Authorization", "Bearer {{secret:T}}", False),
        ("X-Client", "literal-is-fine", False),
    ],
)
def test_credential_headers_refuse_literals(header: str, value: str, refused: bool) -> None:
    text = (f'[[servers]]\nname = "s"\nendpoint = "https://a.example"\n'
            f'headers = {{ "{header}" = "{value}" }}\n')
    if refused:
        errs = errors_of(text)
        assert errs[0].startswith(f"servers[0].headers.{header}: a credential must not be written")
        assert value not in errs[0]
    else:
        parse(text)


def test_client_secret_refuses_literal() -> None:
    errs = errors_of(CATALOG.replace("{{secret:CRM_CLIENT_SECRET}}", "hunter2-literal"))
    assert len(errs) == 1 and errs[0].startswith("services.crm.oauth.client_secret: ")
    assert "hunter2" not in errs[0]


def test_bad_template_in_header() -> None:
    errs = errors_of('[[servers]]\nname = "s"\nendpoint = "https://a.example"\n'
                     'headers = { "X-A" = "{{env:HOME}}", "X-B" = "{{secret:X" }\n')
    assert [e.split(":")[0] for e in errs] == ["servers[0].headers.X-A", "servers[0].headers.X-B"]


def test_private_key_jwt_needs_a_private_key() -> None:
    errs = errors_of(CATALOG.replace('scope = "tools:read tools:call"',
                                     'auth_method = "private_key_jwt"'))
    assert errs == ["services.crm.oauth.private_key: required for auth_method = 'private_key_jwt'"]


def test_every_error_is_collected_with_its_path() -> None:
    errs = errors_of("""
[sidecar]
refresh_ahead = "soon"
state = "postgres://x"
[services.crm]
endpoint = "http://crm.example.com"
rate = "10"
[[servers]]
name = "a"
service = "nope"
[[servers]]
name = "b"
endpoint = "https://b.example"
headers = { "Authorization" = "Bearer literal" }
tags = ["bogus"]
colour = "blue"
""")
    paths = [e.split(": ")[0] for e in errs]
    assert paths == ["sidecar.state", "sidecar.refresh_ahead", "services.crm.endpoint",
                     "services.crm.rate", "servers[0].service", "servers[1].colour",
                     "servers[1].headers.Authorization", "servers[1].tags[0]"]


def test_duplicate_server_names() -> None:
    errs = errors_of('[[servers]]\nname = "a"\nendpoint = "https://a.example"\n'
                     '[[servers]]\nname = "a"\nendpoint = "https://b.example"\n')
    assert errs == ["servers[1].name: duplicate server name (servers[0] has it)"]


def test_sidecar_and_secrets_sections() -> None:
    config = parse("""
[sidecar]
socket = "/run/x.sock"
allow_uids = [1000, 1001]
state = "redis://127.0.0.1:6379/0"
state_key = "{{secret:STATE_KEY}}"
on_state_loss = "local"
refresh_ahead = "2m"
audit_log = "/var/log/a.jsonl"
[secrets]
sources = ["dir:/run/credentials/x", "env"]
keyring_service = "other"
""")
    assert config.sidecar.allow_uids == (1000, 1001)
    assert config.sidecar.refresh_ahead == 120.0
    assert config.sidecar.on_state_loss == "local"
    assert config.secrets.sources == ("dir:/run/credentials/x", "env")
    errs = errors_of('[secrets]\nsources = ["vault"]\n[sidecar]\nallow_uids = [-1]\nstate_key = "raw"\n')
    assert [e.split(": ")[0] for e in errs] == ["sidecar.allow_uids[0]", "sidecar.state_key",
                                                 "secrets.sources[0]"]


def test_spec_round_trip_keeps_templates() -> None:
    config = parse(CATALOG + '[[servers]]\nname = "crm-ro"\nservice = "crm"\n')
    spec = config.servers["crm-ro"].spec
    data = spec.to_dict()
    assert data["oauth"]["client_secret"] == "{{secret:CRM_CLIENT_SECRET}}"
    assert data["service"] == "crm" and data["endpoint"] == "https://crm.example.com/mcp"
    assert McpServerSpec.from_dict(data) == spec


def test_search_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MCPCREDS_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert find_config_path() == tmp_path / "mcpcreds" / "config.toml"
    monkeypatch.setenv("MCPCREDS_CONFIG", "/etc/x.toml")
    assert find_config_path() == Path("/etc/x.toml")
    assert find_config_path("/a.toml") == Path("/a.toml")


def test_socket_default_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MCPCREDS_SOCKET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    import os
    assert default_socket_path() == Path(f"/tmp/mcpcreds-{os.getuid()}/mcpcreds.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert default_socket_path() == Path("/run/user/7/mcpcreds/mcpcreds.sock")
    monkeypatch.setenv("MCPCREDS_SOCKET", "/x.sock")
    assert default_socket_path() == Path("/x.sock")
    assert default_socket_path("/cfg.sock") == Path("/cfg.sock")


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.toml")
    assert "cannot read config" in info.value.errors[0]
    bad = tmp_path / "bad.toml"
    bad.write_text("[[servers]\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert "not valid TOML" in info.value.errors[0]




def test_aauth_is_a_boolean_as_the_seed_defines_it() -> None:
    base = '[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
    errs = errors_of(base + 'aauth = { agent = "x", private_key = "-----BEGIN PRIVATE KEY-----abc" }\n')
    assert errs == ["servers[0].aauth: expected true or false (sign requests to this server with the "
                    "AAuth agent key)"]
    assert parse(base + "aauth = false\n").servers["s"].spec.aauth is False


def test_a_server_that_will_expose_no_tool_says_so_and_which_key_fixes_it() -> None:
    """The fail-closed default (not trusted, no allowlist) is never silent: `check` warns."""
    from mcpcreds.config.load import parse_config as parse

    def warnings(server: str) -> list[str]:
        return [w for w in parse(tomllib.loads('[[servers]]\nname = "s"\nendpoint = "https://s.example.com/mcp"\n'
                                              + server)).warnings if "exposes no tool" in w]

    (warned,) = warnings("")  # untrusted by default
    assert warned.startswith("servers[0]: ") and "tool_allowlist" in warned and 'trust = "trusted"' in warned
    assert len(warnings('trust = "sandboxed"')) == 1 and len(warnings("tool_allowlist = []")) == 1
    for fine in ('trust = "trusted"', 'tool_allowlist = ["search"]', "allow_untrusted_without_allowlist = true",
                 'expose = "headers"'):
        assert warnings(fine) == [], fine


def test_a_duplicate_server_name_is_reported_beside_the_other_errors() -> None:
    from mcpcreds.config.load import parse_config as parse
    from mcpcreds.errors import ConfigError

    text = ('[[servers]]\nname = "s"\nendpoint = "not a url"\n'
            '[[servers]]\nname = "s"\nendpoint = "https://s.example.com/mcp"\n')
    with pytest.raises(ConfigError) as refused:
        parse(tomllib.loads(text))
    assert any(e.startswith("servers[1].name: duplicate server name") for e in refused.value.errors), \
        refused.value.errors
    assert any(e.startswith("servers[0].endpoint") for e in refused.value.errors)
