"""No config value is ever quoted: a canary put in every key of every table (in many shapes: bare,
in a URL, in a template, in a duration, as a wrong type, in an unknown key) never comes back in
`check`'s output, `serve`'s errors, a rejected reload's log or the audit log; nor does one written
as a key in a TOML syntax error (tomllib's own texts quote keys)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpcreds import Client
from mcpcreds.cli.common import EXIT_USAGE
from mcpcreds.cli.main import cmd_check
from mcpcreds.config import model as cfg
from mcpcreds.config.aauth import AAUTH_KEYS, ENROLL_KEYS
from mcpcreds.config.aws import AWS_KEYS
from mcpcreds.config.exec import AUTHORIZATION_KEYS, EXEC_KEYS
from mcpcreds.config.load import parse_config
from mcpcreds.config.servers import AUTH_KEYS, ENTRY_KEYS, OAUTH_KEYS, TRUST_KEYS
from mcpcreds.config.sidecar import GATEWAY_KEYS
from mcpcreds.config.spiffe import SPIFFE_KEYS
from mcpcreds.config.telemetry import TELEMETRY_KEYS
from mcpcreds.errors import ConfigError
from tests.conftest import CANARY, run_cli
from tests.sidecar_proc import run_sidecar

C = CANARY
# shapes a pasted value takes, to reach each parser's deeper checks as well as its first
SHAPES: tuple[Any, ...] = (
    C, f"https://{C}!/x", f"https://u:{C}@a.example/", f"https://a.example/?q={C}", f"https://{C}.example/x",
    f"http://{C}", f"http://{C}:80", f"{{{{secret:{C}!}}}}", f"{{{{{C}}}}}", f"1/{C}", f"{C}s", f"dir:{C}",
    f"/{C}\0", f"{C}.example:99999", f"127.0.0.1:{C}", f"arn:aws:iam::{C}", f"redis://u:{C}@h/",
    f"unix://{C}", f"*.{C}*", f"{C} x", f"{C}\n", "x" * 300 + C, [C], {"k": C}, [[C]], [{"k": C}],
)
SERVER: dict[str, Any] = {"name": "s", "endpoint": "https://a.example/mcp"}
AUTHS: dict[str, dict[str, Any]] = {
    "static": {"kind": "static", "token": "{{secret:T}}"},
    "oauth2": {"kind": "oauth2", "grant": "client_credentials", "token_url": "https://a.example/t",
               "client_id": "c", "client_secret": "{{secret:S}}"},
    "device": {"kind": "oauth2", "grant": "device", "issuer": "https://a.example", "client_id": "c"},
    **{f"aws-{source}": {"kind": "aws", "region": "us-east-1", "service": "execute-api", "source": source}
       for source in ("env", "static", "imds", "web_identity", "sso")},
    **{f"spiffe-{svid}": {"kind": "spiffe", "svid": svid} for svid in ("jwt", "x509")},
}
KEY = "\0the key"  # in a place's path: the value goes in as this key's name (json-quoted)
Place = tuple[str, dict[str, Any], tuple[str | int, ...]]  # where, the config around it, the path


def fields(kind: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


def places() -> Iterator[Place]:
    """Every key the parsers know (their own key lists), and an unknown one, in each table."""
    for table, keys in (("sidecar", fields(cfg.SidecarConfig)), ("secrets", fields(cfg.SecretsConfig)),
                        ("gateway", GATEWAY_KEYS), ("telemetry", TELEMETRY_KEYS)):
        for key in (*keys, "colour"):
            yield f"{table}.{key}", {table: {}}, (table, key)
    for key in ("name", "service", *ENTRY_KEYS, *TRUST_KEYS, "colour"):
        yield f"servers.{key}", {"servers": [dict(SERVER)]}, ("servers", 0, key)
        yield f"services.{key}", {"services": {"x": {"endpoint": SERVER["endpoint"]}}}, ("services", "x", key)
    yield "headers value", {"servers": [{**SERVER, "headers": {}}]}, ("servers", 0, "headers", "X-A")
    for name, auth in AUTHS.items():
        keys = AWS_KEYS if name.startswith("aws") else SPIFFE_KEYS if name.startswith("spiffe") else AUTH_KEYS
        for key in (*keys, "colour"):
            yield f"auth[{name}].{key}", {"servers": [{**SERVER, "auth": auth}]}, ("servers", 0, "auth", key)
    oauth = {"token_url": "https://a.example/t", "client_id": "c", "client_secret": "{{secret:S}}"}
    for key in (*OAUTH_KEYS, "colour"):
        yield f"oauth.{key}", {"servers": [{**SERVER, "oauth": oauth}]}, ("servers", 0, "oauth", key)
    aauth = {"provider": "https://p.example", "enroll": {}}
    for key in (*AAUTH_KEYS, "colour"):
        yield f"aauth.{key}", {"aauth": aauth}, ("aauth", key)
    for key in (*ENROLL_KEYS, "colour"):
        yield f"aauth.enroll.{key}", {"aauth": aauth}, ("aauth", "enroll", key)
    for key in (*EXEC_KEYS, "command", "colour"):
        yield f"exec.{key}", {"exec": {"x": {}}}, ("exec", "x", key)
    yield "exec env value", {"exec": {"x": {"env": {}}}}, ("exec", "x", "env", "A")
    consent = {"net": "broad_audited", "authorization": {"by": "ops", "reason": "why"}}
    for key in (*AUTHORIZATION_KEYS, "colour"):
        yield f"exec.authorization.{key}", {"exec": {"x": consent}}, ("exec", "x", "authorization", key)
    # names that are not names: a service's, an exec entry's (a server's is `servers.name` above)
    yield "a service's name", {"services": {KEY: {"endpoint": SERVER["endpoint"]}}}, ("services", KEY)
    yield "an exec entry's name", {"exec": {KEY: {}}}, ("exec", KEY)


def put(base: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(base)
    node: Any = data
    for step in path[:-1]:
        node = node[step]
    if path[-1] == KEY:
        node[json.dumps(value)] = node.pop(KEY)
    else:
        node[path[-1]] = value
    return data


def toml_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string of the BMP is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def toml(data: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(key)} = {toml_value(value)}\n" for key, value in data.items())


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`check`'s handler, and what main() prints of a ConfigError (building main()'s parser each
    time would take most of the sweep's time; the commands themselves are run below)."""
    try:
        code = cmd_check(argparse.Namespace(config=str(path)))
    except ConfigError as exc:
        print("\n".join([*exc.errors, exc.message]), file=sys.stderr)
        code = EXIT_USAGE
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("where", "base", "keys"), list(places()), ids=[where for where, _, _ in places()])
def test_no_key_of_any_table_quotes_a_canary(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str,
                                             base: dict[str, Any], keys: tuple[str | int, ...]) -> None:
    """`check` on one config per shape of the canary in this key."""
    path, refused, leaks = tmp_path / "config.toml", 0, []
    for n, shape in enumerate(SHAPES):
        path.write_text(toml(put(base, keys, shape)))
        code, out, err = check(path, capsys)
        assert code in (0, 2), (shape, err)
        refused += code == 2
        if code == 2 and C in out + err:
            leaks.append(f"shape #{n}: {err}")
        elif code == 0 and any(C in line for line in err.splitlines() if line.startswith("warning:")):
            leaks.append(f"shape #{n} (accepted, warned): {err}")
    assert not leaks, "\n".join(leaks)
    assert refused, "no shape refused: is the key read at all?"


def everything() -> dict[str, Any]:
    """One config with the canary in every key of every table at once."""
    def canaries(keys: Any, **keep: Any) -> dict[str, Any]:
        return {**{k: C for k in keys}, "colour": C, **keep}

    servers = [canaries(ENTRY_KEYS + TRUST_KEYS, name="s0", endpoint=f"https://u:{C}@a.example/")]
    for i, (name, auth) in enumerate(AUTHS.items(), start=1):
        keys = AWS_KEYS if name.startswith("aws") else SPIFFE_KEYS if name.startswith("spiffe") else AUTH_KEYS
        kept = {k: auth[k] for k in ("kind", "source", "svid") if k in auth}
        servers.append({**SERVER, "name": f"s{i}", "auth": canaries(keys, **kept)})
    servers.append({**SERVER, "name": "o", "oauth": canaries(OAUTH_KEYS), "trust": C})
    servers.append({**SERVER, "name": "o", "service": f"{C}!"})
    return {
        "sidecar": canaries(fields(cfg.SidecarConfig)),
        "secrets": canaries(fields(cfg.SecretsConfig)),
        "gateway": canaries(GATEWAY_KEYS),
        "services": {"x": canaries(ENTRY_KEYS + TRUST_KEYS), f"{C} x": {"endpoint": C}},
        "servers": servers,
        "aauth": canaries(AAUTH_KEYS, enroll=canaries(ENROLL_KEYS)),
        "exec": {"x": canaries(EXEC_KEYS, env={"A": C, "B": [C]}), f"{C}!": {},
                 "y": {"net": "broad_audited", "authorization": canaries(AUTHORIZATION_KEYS)}},
    }


@pytest.fixture
def pasted(tmp_path: Path) -> Path:
    path = tmp_path / "pasted.toml"
    path.write_text(toml(everything()))
    return path


def test_check_and_serve_never_quote_a_canary(pasted: Path) -> None:
    for command in ("check", "serve"):
        result = run_cli(command, "--config", str(pasted))
        assert result.code == 2, result.output
        assert "servers[11].trust: " in result.stderr and "services.<key #2>: " in result.stderr, result.stderr
        assert C not in result.output, result.output


# tomllib's messages quote keys ('Cannot declare ...', 'Duplicate inline table key ...')
TOML_ERRORS = (
    f"x = {{ {C} = 1, {C} = 2 }}\n",
    f"[a.{C}]\n[a.{C}]\n",
    f"a = {{ {C} = 1 }}\n[a.{C}.b]\n",
    f"[[a.{C}]]\n[a.{C}]\n",
    f'"{C}" = "\x01"\n',
)


@pytest.mark.parametrize("text", TOML_ERRORS)
def test_a_toml_syntax_error_says_where_never_what(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    result = run_cli("check", "--config", str(path))
    assert result.code == 2 and "not valid TOML: " in result.stderr and "(at line " in result.stderr, result.stderr
    assert C not in result.output, result.output


def test_a_rejected_reload_never_logs_or_audits_a_canary(tmp_path: Path, pasted: Path) -> None:
    socket_path, audit, config = tmp_path / "run" / "s.sock", tmp_path / "audit.jsonl", tmp_path / "config.toml"
    config.write_text(f'[sidecar]\nsocket = "{socket_path}"\naudit_log = "{audit}"\n'
                      '[[servers]]\nname = "web"\nendpoint = "https://web.example.com/mcp"\n')
    with run_sidecar(config, socket_path) as sidecar:
        for text in (pasted.read_text(), TOML_ERRORS[0]):
            config.write_text(text)
            sidecar.signal(signal.SIGHUP)
            entry = sidecar.wait_for("reload rejected: config invalid; keeping the old one")
            assert entry["errors"], entry
        with Client(sidecar.socket) as client:
            assert client.health()["status"] == "ok"
            assert [s["name"] for s in client.servers()] == ["web"]
        sidecar.stop()
        rejected = [json.loads(line) for line in audit.read_text().splitlines()]
        assert [e.get("outcome") for e in rejected if e.get("event") == "reload"] == ["rejected", "rejected"]
        assert C not in sidecar.log and C not in audit.read_text()


def errors_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.errors


def test_a_duplicate_name_is_not_quoted() -> None:
    twice = errors_of({"servers": [{**SERVER, "name": C}, {**SERVER, "name": C}]})
    assert twice == ["servers[1].name: duplicate server name (servers[0] has it)"]


def test_an_imds_address_from_the_config_is_not_quoted() -> None:
    imds = {"kind": "aws", "region": "us-east-1", "service": "execute-api", "source": "imds",
            "imds_endpoint": "http://10.201.202.203"}
    refused = errors_of({"servers": [{**SERVER, "auth": imds}]})
    assert len(refused) == 1 and refused[0].startswith("servers[0].auth.source: "), refused
    assert "201.202" not in refused[0] and "imds_endpoint" in refused[0], refused
