"""A careless config gets nothing: tags judged per credential, no value quoted in an error, no
credential written in the config, every number finite and bounded (issue 12)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from mcpcreds import Client, Forbidden
from mcpcreds.config.load import parse_config
from mcpcreds.errors import ConfigError
from tests.conftest import CANARY, run_cli
from tests.sidecar_proc import run_sidecar

CATALOG = """
[secrets]
sources = ["env"]
[services.crm]
endpoint = "https://crm.example.com/mcp"
tags = ["sensitive"]
headers = { "X-Api-Key" = "{{secret:KEY}}" }
[[servers]]
name = "crm-ro"
service = "crm"
[[servers]]
name = "crm-rw"
service = "crm"
tags = ["egress"]
[[servers]]
name = "web"
endpoint = "https://web.example.com/mcp"
"""


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(text))
    return info.value.errors


# ---------------------------------------------------------------------------- Rule of Two by credential


def test_every_name_of_a_credential_carries_the_tags_of_all_of_them() -> None:
    config = parse_config(tomllib.loads(CATALOG))
    for name in ("crm-ro", "crm-rw", "service:crm"):
        target = config.target(name)
        assert target is not None and target.tags == {"sensitive", "egress"}, name
    # the specs (spawn payloads, GET /v1/servers, grant answers) show the effective tags
    assert config.servers["crm-ro"].spec.to_dict()["tags"] == ["sensitive", "egress"]
    assert config.servers["web"].spec.to_dict()["tags"] == ["untrusted_input"]  # the implied default


@pytest.mark.parametrize("names", [["crm-rw", "web"], ["service:crm", "web"], ["crm-ro", "web"]])
def test_no_name_for_a_credential_slips_past_the_rule_of_two(tmp_path: Path, names: list[str]) -> None:
    socket_path, config = tmp_path / "run" / "s.sock", tmp_path / "config.toml"
    config.write_text(f'[sidecar]\nsocket = "{socket_path}"\n' + CATALOG)
    with run_sidecar(config, socket_path, {"KEY": CANARY}) as proc, Client(proc.socket) as client:
        with pytest.raises(Forbidden, match="Rule of Two"):
            client.grant(names, ttl=60)
        assert client.grant(["crm-ro"], ttl=60)["servers"][0]["tags"] == ["sensitive", "egress"]


def test_spawn_payload_carries_effective_tags(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CATALOG)
    result = run_cli("spawn-payload", "crm-ro", "web", "--config", str(config))
    assert result.code == 0, result.stderr
    specs = {s["name"]: s for s in json.loads(result.stdout)}
    assert specs["crm-ro"]["tags"] == ["sensitive", "egress"]
    assert specs["web"]["tags"] == ["untrusted_input"]


def test_the_config_warning_sees_catalog_entries_too() -> None:
    # `service:mail` can be granted by its cache key even when no [[servers]] entry names it
    text = ('[secrets]\nsources = ["env"]\n'
            '[services.mail]\nendpoint = "https://mail.example.com/mcp"\ntags = ["egress"]\n'
            '[[servers]]\nname = "crm"\nendpoint = "https://crm.example.com/mcp"\ntags = ["sensitive"]\n'
            '[[servers]]\nname = "web"\nendpoint = "https://web.example.com/mcp"\n')
    assert any("trifecta" in w for w in parse_config(tomllib.loads(text)).warnings)
    quiet = text.replace('tags = ["egress"]', 'tags = ["sensitive"]')
    assert not any("trifecta" in w for w in parse_config(tomllib.loads(quiet)).warnings)


# ---------------------------------------------------------------------------- never quote a value

PASTED = "s3cr3tPa55w0rdQ7xZk9LmN2vB"


@pytest.mark.parametrize(
    "body",
    [
        f'endpoint = "https://user:{PASTED}@a.example/mcp"',
        f'endpoint = "https://a.example/mcp"\nheaders = {{ "X-Api-Key" = "{{{{secret:{PASTED}!}}}}" }}',
        f'endpoint = "https://a.example:{PASTED}/mcp"',
        f'endpoint = "https://a.example/mcp"\nrate = "{PASTED}"',
        f'endpoint = "https://a.example/mcp"\ntags = ["{PASTED}"]',
        f'endpoint = "https://a.example/mcp"\n{PASTED} = 1',
        f'endpoint = "https://a.example/mcp"\nauth = {{ kind = "{PASTED}" }}',
        f'service = "{PASTED}"',
    ],
)
def test_a_config_error_names_the_path_never_the_value(body: str) -> None:
    errs = errors_of(f'[[servers]]\nname = "s"\n{body}\n')
    assert errs and all(e.startswith("servers[0]") for e in errs), errs
    assert not any(PASTED in e for e in errs), errs


def test_check_and_a_rejected_reload_never_print_a_pasted_credential(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[[servers]]\nname = "s"\nendpoint = "https://u:{PASTED}@a.example/mcp"\n')
    result = run_cli("check", "--config", str(config))
    assert result.code == 2
    assert "servers[0].endpoint" in result.stderr and PASTED not in result.stderr + result.stdout


# ---------------------------------------------------------------------------- every credential table


def test_a_shadowed_oauth_table_is_validated_all_the_same() -> None:
    base = ('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
            'auth = { kind = "static", token = "{{secret:T}}" }\n')
    errs = errors_of(base + f'oauth = {{ client_id = "c", client_secret = "{PASTED}", '
                     'token_url = "https://a.example/t", colour = "blue" }\n')
    assert any(e.startswith("servers[0].oauth.client_secret: a credential must not") for e in errs), errs
    assert any(e.startswith("servers[0].oauth.colour: unknown key") for e in errs), errs
    config = parse_config(tomllib.loads(base + 'oauth = { client_id = "c", client_secret = "{{secret:S}}", '
                                        'token_url = "https://a.example/t" }\n'))
    assert any("oauth: not used" in w for w in config.warnings)


# ---------------------------------------------------------------------------- literal credentials

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudCJ9.c2lnbmF0dXJlLWJ5dGVz"


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Cookie", "session=abc"),
        ("Proxy-Authorization", "Basic dXNlcjpwYXNz"),
        ("X-Auth", "letmein"),
        ("X-Api-Secret", "hunter2"),
        ("X-Client", f"Bearer {PASTED}"),
        ("X-Client", "ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
        ("X-Client", JWT),
        ("X-Client", "k9Qz7TmV2pL8xW4rN6bY3cH5"),
    ],
)
def test_a_literal_that_looks_like_a_credential_is_refused_in_any_header(header: str, value: str) -> None:
    errs = errors_of(f'[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
                     f'headers = {{ "{header}" = "{value}" }}\n')
    assert len(errs) == 1 and errs[0].startswith(f"servers[0].headers.{header}: "), errs
    assert value not in errs[0]


@pytest.mark.parametrize("query", ["api_key=abc", "token=x", f"q={PASTED}", f"x={JWT}"])
def test_a_credential_in_a_url_query_is_refused(query: str) -> None:
    errs = errors_of(f'[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp?{query}"\n')
    assert len(errs) == 1 and "credential in its query" in errs[0], errs


def test_public_literals_pass_and_literal_headers_opt_out() -> None:
    config = parse_config(tomllib.loads(
        '[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp?page=2&lang=en"\n'
        'headers = { "X-Client" = "mcpcreds-demo", "Accept-Language" = "en-GB", '
        '"X-Session-Tag" = "k9Qz7TmV2pL8xW4rN6bY3cH5", "X-Trace" = "{{secret:T}}" }\n'
        'literal_headers = ["X-Session-Tag"]\n'))
    assert config.servers["s"].headers["X-Session-Tag"].source == "k9Qz7TmV2pL8xW4rN6bY3cH5"
    errs = errors_of('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
                     'headers = { "Authorization" = "Bearer x" }\nliteral_headers = ["Authorization"]\n')
    assert any(e.startswith("servers[0].literal_headers[0]: a credential header") for e in errs), errs


def test_the_example_configs_still_validate() -> None:
    root = Path(__file__).resolve().parent.parent / "examples"
    for path in root.glob("*.toml"):
        parse_config(tomllib.loads(path.read_text()))


# ---------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("request_timeout", "nan"),
        ("request_timeout", "inf"),
        ("idle_timeout", "-inf"),
        ("refresh_ahead", "1e300"),
        ("token_timeout", '"99999999999999999999s"'),
        ("local_share", "nan"),
        ("invalidate_cooldown", "nan"),
        ("max_grants", "0"),
    ],
)
def test_every_number_in_the_config_is_finite_and_bounded(key: str, value: str) -> None:
    errs = errors_of(f"[sidecar]\n{key} = {value}\n")
    assert len(errs) == 1 and errs[0].startswith(f"sidecar.{key}: "), errs


@pytest.mark.parametrize("rate", ["99999999999/1s", "1/0.0000001s", "1/99999w"])
def test_rates_are_bounded(rate: str) -> None:
    errs = errors_of(f'[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\nrate = "{rate}"\n')
    assert len(errs) == 1 and errs[0].startswith("servers[0].rate: invalid rate"), errs


@pytest.mark.parametrize("url", ["https://0177.0.0.1/token", "https://a.exa\\tmple/token",
                                 "https://a.example/to ken", "https://a.example/t\\r\\nX: y"])
def test_a_url_httpx_would_send_differently_is_refused(url: str) -> None:
    errs = errors_of('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
                     f'oauth = {{ client_id = "c", client_secret = "{{{{secret:S}}}}", token_url = "{url}" }}\n')
    assert len(errs) == 1 and errs[0].startswith("servers[0].oauth.token_url: "), errs


@pytest.mark.parametrize("value", ['"0.5s"', '"2d"'])
def test_expires_in_default_is_bounded(value: str) -> None:
    errs = errors_of('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
                     'oauth = { client_id = "c", client_secret = "{{secret:S}}", '
                     f'token_url = "https://a.example/t", expires_in_default = {value} }}\n')
    assert len(errs) == 1 and errs[0].startswith("servers[0].oauth.expires_in_default: "), errs


@pytest.mark.parametrize("entry", [f"https://{PASTED}.example", f"{PASTED}.1", f"*.{PASTED}*"])
def test_an_egress_entry_error_never_quotes_the_entry(entry: str) -> None:
    errs = errors_of('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\n'
                     f'deny_hosts = ["{entry}"]\n')
    assert len(errs) == 1 and errs[0].startswith("servers[0].deny_hosts[0]: ") and PASTED not in errs[0], errs


# ---------------------------------------------------------------------------- gateway keys


def test_gateway_keys_are_inherited_and_a_server_may_only_narrow_expose() -> None:
    base = ('[services.crm]\nendpoint = "https://crm.example.com/mcp"\nexpose = "proxy"\n'
            'rate_methods = ["tools/call"]\n')
    config = parse_config(tomllib.loads(base + '[[servers]]\nname = "ro"\nservice = "crm"\nmax_wait = "5s"\n'))
    ro = config.servers["ro"].gateway
    assert (ro.expose, ro.rate_methods, ro.max_wait) == ("proxy", ("tools/call",), 5.0)
    assert config.target("service:crm") is not None and config.services["service:crm"].gateway.expose == "proxy"
    errs = errors_of(base + '[[servers]]\nname = "rw"\nservice = "crm"\nexpose = "both"\n')
    assert errs == ["servers[0].expose: wider than its service's: a server may only narrow `expose`"]
    assert errors_of('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\nexpose = "all"\n') == [
        "servers[0].expose: expected one of both, proxy, headers"]
    assert errors_of('[[servers]]\nname = "s"\nendpoint = "https://a.example/mcp"\nmax_wait = "2h"\n') == [
        "servers[0].max_wait: expected at most 1h"]


def test_drain_timeout_is_configurable_and_bounded() -> None:
    assert parse_config(tomllib.loads('[sidecar]\ndrain_timeout = "3s"\n')).sidecar.drain_timeout == 3.0
    assert errors_of('[sidecar]\ndrain_timeout = "10m"\n') == ["sidecar.drain_timeout: expected at most 5m"]
