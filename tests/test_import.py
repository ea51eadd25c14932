"""`mcpcreds import`: agentd, zeph and mur configs (tests/seeds/, written from each project's
documented shapes) become mcpcreds configs that `mcpcreds check` accepts, each key with a comment
saying where it came from, and a summary of what changes in meaning for that file; no literal
credential of the source (the CANARY values, bare or in a `ghp_` or `sk-` shape) reaches the output
or a message. And `spawn-payload --format agentd`."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mcpcreds.importers.sources import merge
from tests.conftest import CANARY, CliResult, run_cli

SEEDS = Path(__file__).resolve().parent / "seeds"
AGENTD, PROD, ZEPH, MUR = SEEDS / "agentd.yaml", SEEDS / "agentd-prod.yaml", SEEDS / "zeph.toml", SEEDS / "mur.yaml"
MUR_TOML = SEEDS / "mur.toml"
KEY_LINE = re.compile(r'^[A-Za-z0-9_"-][^=]* = ')


def imported(tmp_path: Path, *files: Path, seed: str | None = None) -> tuple[CliResult, dict[str, Any], str]:
    out = tmp_path / "imported.toml"
    args = ["import", *map(str, files), "-o", str(out), *(["--from", seed] if seed else [])]
    result = run_cli(*args)
    assert result.code == 0, result.output
    text = out.read_text()
    for shown in (result.stdout, result.stderr, text):  # CANARY-..., ghp_CANARY..., sk-CANARY-...
        assert "canary" not in shown.lower()
    checked = run_cli("check", "--config", str(out))
    assert checked.code == 0, checked.output  # what it wrote passes mcpcreds check
    return result, tomllib.loads(text), text


def servers(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in config.get("servers", [])}


def section(result: CliResult, title: str) -> list[str]:
    lines = result.stderr.splitlines()
    if not any(line.startswith(title) for line in lines):
        return []
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    found = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        found.append(line.strip())
    return found


# ---------------------------------------------------------------------------- agentd


def test_agentd_catalog_and_servers_carry_over(tmp_path: Path) -> None:
    result, config, text = imported(tmp_path, AGENTD)
    assert set(config["services"]) == {"crm", "docs", "mail", "billing", "s3", "signed"}  # not kind: llm, nor k8s
    crm = config["services"]["crm"]
    assert crm["tool_allowlist"] == ["read_*", "search"] and crm["tool_exclude"] == ["read_secrets"]
    assert crm["oauth"]["client_secret"] == "{{secret:CRM_CLIENT_SECRET}}"  # the literal is taken out
    assert crm["oauth"]["token_url"] == "https://auth.example.com/oauth2/token" and crm["rate"] == "60/1m"
    assert config["services"]["docs"]["headers"] == {"X-Api-Key": "{{secret:DOCS_KEY}}"}  # a template stays
    assert "device_authorization_url" not in config["services"]["mail"]["auth"]
    found = servers(config)
    assert found["crm-ro"] == {"name": "crm-ro", "service": "crm", "timeout": 30.0, "tool_allowlist": ["read_*"],
                               "trust": "untrusted"}
    assert found["crm-inline"]["endpoint"] == "https://crm.example.com/mcp/v2"
    assert found["search"]["headers"] == {"Authorization": "Bearer {{secret:SEARCH_AUTHORIZATION}}"}
    assert found["wiki"]["auth"] == {"kind": "static", "token": "{{secret:WIKI_TOKEN}}"}
    assert "endpoint" not in found["mailer"]  # agentd refuses a reference that restates it: the entry's is used
    assert config.get("sidecar", {}).get("egress") == "open"
    billing = config["services"]["billing"]["oauth"]
    assert billing["scope"] == "billing.read billing.write"  # agentd's list, as one string
    assert billing["client_secret"] == "{{secret:BILLING_CLIENT_SECRET}}"
    assert config["services"]["s3"]["auth"] == {
        "kind": "aws", "region": "eu-west-1", "service": "execute-api", "source": "sso",
        "sso_start_url": "https://acme.awsapps.com/start", "sso_account_id": "123456789012",
        "sso_role_name": "McpReader", "sso_region": "eu-west-1"}
    assert config["services"]["s3"]["rate"] == "600/min"
    assert config["services"]["signed"]["aauth"] is True and found["signer"]["aauth"] is False
    assert found["s3-ro"] == {"name": "s3-ro", "service": "s3", "tool_allowlist": ["get_*"], "trust": "untrusted"}

    differences = section(result, "What changes in meaning for this file:")
    assert any(d.startswith("- services.crm.rate: one bucket shared by every process") for d in differences)
    assert any(d.startswith("- server wiki: agentd exposed every tool of a server with no allow list") for d in differences)
    assert not any("server crm-inline:" in d for d in differences)  # under crm: its allowlist is the ceiling
    assert any(d.startswith("- services.s3.auth: sso_region is written as agentd's one region") for d in differences)
    assert section(result, "Logins to run once:") == ["mcpcreds login service:s3"]  # IAM Identity Center's
    secrets = section(result, "Secrets to store")
    assert [s.split()[3] for s in secrets] == ["CRM_CLIENT_SECRET", "BILLING_CLIENT_SECRET", "SEARCH_AUTHORIZATION",
                                               "WIKI_TOKEN"]
    assert secrets[0].endswith("# services.crm.oauth.client_secret, in clear in the file")
    dropped = section(result, "Not carried over:")
    for path in ("model", "max_steps", "services.model", "mcp.servers[2].debug_token",
                 "services.mail.auth.device_authorization_url", "mcp.servers[4].endpoint",
                 *(f"mcp.servers[5].{key}" for key in ("headers", "auth", "oauth", "aauth", "rate"))):
        assert any(d.startswith(f"- {path}: ") for d in dropped), path
    # irsa is web_identity, whose role and token file agentd takes from the pod: the entry waits for them
    assert any(d.startswith("- services.k8s.auth.source: irsa is web_identity here, which needs role_arn and "
                            "web_identity_token_file") for d in dropped)
    assert any(d.startswith("- agentd services.k8s: refused by mcpcreds check") and "role_arn" in d for d in dropped)
    assert not any("web_identity" in d for d in differences)  # nothing written says it was carried
    warns = section(result, "mcpcreds check warns:")
    assert any("servers[1]: its endpoint is under [services.crm]'s" in w for w in warns)
    assert "10/s" in text and "agentd's parser refuses this form; mcpcreds reads it" in text
    assert re.search(r'^rate = "600/min"  # agentd rate: agentd\'s parser refuses this form', text, re.M)


def test_every_key_written_says_where_it_came_from(tmp_path: Path) -> None:
    for seed in (AGENTD, ZEPH, MUR):
        (tmp_path / seed.stem).mkdir()
        _, _, text = imported(tmp_path / seed.stem, seed)
        keys = [line for line in text.splitlines() if KEY_LINE.match(line)]
        assert keys and all("  # " in line for line in keys), [k for k in keys if "  # " not in k]


def test_agentd_files_merge_in_order_as_a_merge_patch(tmp_path: Path) -> None:
    """`agentd -c agentd.yaml -c agentd-prod.yaml`: a map merges, null removes, a list replaces;
    the overlay closes egress, so its inline server under no catalog entry is left out (as agentd
    refuses it) and said so."""
    result, config, _ = imported(tmp_path, AGENTD, PROD)
    assert config["sidecar"]["egress"] == "closed"
    assert config["services"]["docs"]["rate"] == "5/1s" and "mail" not in config["services"]
    assert list(servers(config)) == ["crm-ro"]
    dropped = section(result, "Not carried over:")
    assert any(d.startswith("- agentd mcp.servers[1]: refused by mcpcreds check") and "sidecar.egress" in d
               for d in dropped)
    assert "(merged in this order, RFC 7396)" in result.stderr
    assert merge({"a": {"b": 1, "c": [1]}, "d": 1}, {"a": {"c": [2], "e": None}, "d": None}) == {"a": {"b": 1, "c": [2]}}


# ---------------------------------------------------------------------------- zeph


def test_zeph_stdio_servers_become_exec_entries_and_http_servers_servers(tmp_path: Path) -> None:
    result, config, _ = imported(tmp_path, ZEPH)
    github = config["exec"]["github"]
    assert github["env"] == {"GITHUB_PERSONAL_ACCESS_TOKEN": "{{secret:GITHUB_PERSONAL_ACCESS_TOKEN}}",
                             "LOG_LEVEL": "info", "OPENAI_API_KEY": "{{secret:GITHUB_OPENAI_API_KEY}}"}
    assert github["env_isolation"] is False  # zeph's default, written out
    assert github["trust"] == "untrusted" and github["tool_allowlist"] == ["get_*", "search_repositories"]
    assert github["roots"] == ["file:///workspace"] and github["timeout"] == 30.0
    assert github["expected_tools"] == ["get_issue", "search_repositories"]
    assert "command" not in github and "args" not in github
    assert config["exec"]["filesystem"]["trust"] == "trusted" and config["exec"]["filesystem"]["env_isolation"]
    found = servers(config)
    tools = found["remote-tools"]
    assert tools["headers"] == {"Authorization": "Bearer {{secret:REMOTE_TOOLS_AUTHORIZATION}}", "X-Client": "zeph"}
    assert (tools["elicitation_enabled"], tools["elicitation_timeout_secs"], tools["media_passthrough"]) == (False, 60, True)
    assert tools["tool_metadata"] == {"run_query": {"data_sensitivity": "high", "capabilities": ["database_read"],
                                                    "flagged_parameters": [{"pointer": "/sql", "pattern": "sql_injection"}]}}
    assert found["sandbox"]["auth"] == {"kind": "oauth2", "grant": "authorization_code", "client_id": "zeph-cli",
                                        "scopes": ["mcp:tools"]}
    assert found["sandbox"]["trust"] == "sandboxed"
    billing = found["billing"]["oauth"]  # the same literal as remote-tools' header: one secret
    assert billing["client_secret"] == "{{secret:REMOTE_TOOLS_AUTHORIZATION}}" and billing["scope"] == "billing:read"
    calendar = found["calendar"]  # transport = { type = "oauth", url, client_id, scopes }
    assert calendar["endpoint"] == "https://calendar.example.com/mcp"
    assert calendar["auth"] == {"kind": "oauth2", "grant": "authorization_code", "client_id": "zeph-calendar",
                                "scopes": ["calendar:read", "calendar:events"]}

    commands = section(result, "Stdio servers: put these in the MCP client's config")
    assert commands == ["mcpcreds exec github -- npx -y @modelcontextprotocol/server-github --token <not shown>",
                        "mcpcreds exec filesystem -- npx -y @modelcontextprotocol/server-filesystem /workspace"]
    assert section(result, "Logins to run once:") == ["mcpcreds login sandbox", "mcpcreds login calendar"]
    assert section(result, "Variables read from the environment") == [
        "GITHUB_PERSONAL_ACCESS_TOKEN    # mcp.servers[0].env.GITHUB_PERSONAL_ACCESS_TOKEN"]
    differences = " ".join(section(result, "What changes in meaning for this file:"))
    assert "server remote-tools: trusted: zeph skipped its SSRF checks" in differences
    assert "exec github: env_isolation = false" in differences
    assert "argument 4 of its command looks like a credential: not shown" in differences
    dropped = section(result, "Not carried over:")
    assert "- mcp.allowed_commands: zeph's own MCP setting (its command allowlist, discovery, dynamic servers): " \
           "not carried over" in dropped
    assert any(d.startswith("- mcp.servers[2].env_isolation: applies to a stdio server only") for d in dropped)
    assert not any("mcp.servers[5]" in d for d in dropped)  # every key of the OAuth transport was carried


# ---------------------------------------------------------------------------- mur


def test_mur_network_modes_carry_over_with_murs_own_import_rules(tmp_path: Path) -> None:
    result, config, _ = imported(tmp_path, MUR)
    execs = config["exec"]
    assert (execs["browser"]["net"], execs["browser"]["allow_hosts"]) == ("restricted", ["example.com", "*.api.example.com"])
    assert execs["browser"]["timeout"] == 120.0
    assert execs["research"] == {"net": "inherit"}  # broad_audited without authorization: downgraded
    assert execs["crawler"]["net"] == "broad_audited" and execs["crawler"]["deny_hosts"] == ["*.internal.example.com"]
    assert execs["crawler"]["authorization"]["by"] == "operator"
    assert execs["crawler"]["authorization"]["reason"] == ("carried over from mur: broad egress authorized on "
                                                           "2026-01-01 00:00 UTC")
    assert execs["sealed"] == {"net": "off"}  # restricted with nothing allowed
    assert execs["local"] == {"net": "off"} and "plain" in execs
    found = servers(config)
    assert found["remote"]["headers"] == {"Authorization": "Bearer {{secret:MUR_REMOTE_TOKEN}}"}
    assert found["notes"]["headers"] == {"Authorization": "Bearer {{secret:NOTES_TOKEN}}"}
    differences = " ".join(section(result, "What changes in meaning for this file:"))
    assert "research: network.mode = broad_audited without an authorization: downgraded to inherit" in differences
    assert "sealed: network.mode = restricted with no allow_hosts (nothing allowed in mur): net = \"off\"" in differences
    assert "exec research, plain: net = inherit: the child reaches the network as its caller does" in differences
    secrets = section(result, "Secrets to store")
    assert secrets == ["mcpcreds secret set MUR_REMOTE_TOKEN    # mcp_servers[6].auth.token: the value mur keeps in "
                       "its keychain under that name",
                       "mcpcreds secret set NOTES_TOKEN    # mcp_servers[7].auth.token, in clear in the file"]
    assert len(section(result, "Stdio servers: put these in the MCP client's config")) == 6
    dropped = section(result, "Not carried over:")
    assert any(d.startswith("- mcp_servers[0].binary_sha256: mcpcreds does not pin the binary") for d in dropped)
    assert any(d.startswith("- mcp_servers[1].network.deny_hosts: mur ignores deny_hosts in mode inherit")
               for d in dropped)


def test_a_mur_toml_profile_with_murs_oauth_login_and_modes_it_does_not_read(tmp_path: Path) -> None:
    """A profile written as TOML: mur's OAuth becomes a person's login to run once (the tokens mur
    stored are not carried over, nor shown); a mode mur does not write is `off`; allow_hosts is
    read in restricted mode only: listed wherever else it is, `off` included."""
    result, config, _ = imported(tmp_path, MUR_TOML)
    assert result.stderr.startswith("mcpcreds import: mur config from ")
    assert servers(config)["tracker"]["auth"] == {"kind": "oauth2", "grant": "authorization_code",
                                                  "token_url": "https://tracker.example.com/oauth/token",
                                                  "client_id": "mur-tracker"}
    assert section(result, "Logins to run once:") == ["mcpcreds login tracker"]
    assert section(result, "Secrets to store") == []
    execs = config["exec"]
    assert (execs["odd"], execs["loose"], execs["shut"]) == ({"net": "off"}, {"net": "inherit"}, {"net": "off"})
    dropped = section(result, "Not carried over:")
    for key in ("access_token", "refresh_token", "expires_at"):
        assert f"- mcp_servers[0].auth.{key}: mur's keychain holds the login: run mcpcreds login for a new one" in dropped
    assert "- mcp_servers[1].network.mode: not a mode mur writes: off written (nothing allowed)" in dropped
    for i in (1, 2, 3):
        assert (f"- mcp_servers[{i}].network.allow_hosts: mur reads allow_hosts in restricted mode only: not "
                "carried over") in dropped


# ---------------------------------------------------------------------------- the command


@pytest.mark.parametrize(("seed", "expected"), [(AGENTD, "agentd"), (ZEPH, "zeph"), (MUR, "mur")])
def test_the_project_is_told_from_the_files_shape(seed: Path, expected: str) -> None:
    result = run_cli("import", str(seed))
    assert result.code == 0 and result.stderr.startswith(f"mcpcreds import: {expected} config from ")
    assert result.stdout.startswith(f"# mcpcreds config, imported from {expected}'s config")


def test_a_file_no_project_wrote_is_refused_unless_named(tmp_path: Path) -> None:
    odd = tmp_path / "odd.yaml"
    odd.write_text("hello: world\n")
    result = run_cli("import", str(odd))
    assert result.code == 2 and "cannot tell which project wrote" in result.stderr and result.stdout == ""
    named = run_cli("import", str(odd), "--from", "mur")
    assert named.code == 0 and "- hello: a mur profile setting with no mcpcreds counterpart" in named.stderr


def test_the_output_never_goes_over_an_existing_file(tmp_path: Path) -> None:
    out = tmp_path / "config.toml"
    out.write_text("# mine\n")
    result = run_cli("import", str(ZEPH), "-o", str(out))
    assert result.code == 2 and "exists: an import never writes over a file" in result.stderr
    assert out.read_text() == "# mine\n"


@pytest.mark.parametrize(("name", "text"), [
    ("broken.yaml", f"services:\n  crm: {{endpoint: {CANARY}\n"),
    ("broken.toml", f'[mcp]\nservers = "{CANARY}\n'),
    ("broken.json", f'{{"mcp_servers": [{CANARY}]}}'),
    ("aliases.yaml", f"a: &x {CANARY}\nb: *x\n"),
])
def test_a_file_that_does_not_parse_is_refused_without_quoting_it(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    result = run_cli("import", str(path))
    assert result.code == 2 and result.stdout == ""
    assert CANARY not in result.output and f"{path}: " in result.stderr


def test_a_credential_shaped_key_is_named_by_its_place(tmp_path: Path) -> None:
    path = tmp_path / "agentd.yaml"
    path.write_text(f"services:\n  crm:\n    endpoint: https://crm.example.com/mcp\n    ghp_{CANARY.replace('-', '')}: 1\n")
    result = run_cli("import", str(path))
    assert result.code == 0 and CANARY.replace("-", "") not in result.output
    assert "- services.crm.<key #2>: not a field of agentd's McpServerSpec" in result.stderr


# ---------------------------------------------------------------------------- spawn-payload --format agentd


def test_spawn_payload_prints_agentds_spec_shape_secret_free(tmp_path: Path) -> None:
    _, _, _ = imported(tmp_path, AGENTD)
    config = str(tmp_path / "imported.toml")
    held = {"CRM_CLIENT_SECRET": CANARY, "SEARCH_AUTHORIZATION": f"ghp_{CANARY}", "DOCS_KEY": f"sk-{CANARY}"}
    result = run_cli("spawn-payload", "--config", config, "--format", "agentd", "crm-ro", "search", "service:docs",
                     env=held)
    assert result.code == 0, result.output
    assert "canary" not in result.output.lower()
    specs = json.loads(result.stdout)
    assert [s["name"] for s in specs] == ["crm-ro", "search", "service:docs"]
    crm = specs[0]
    assert set(crm) <= {"name", "endpoint", "headers", "tags", "aauth", "oauth", "auth", "service", "rate", "allow",
                        "exclude", "timeout"}
    assert (crm["allow"], crm["exclude"], crm["timeout"]) == (["read_*"], ["read_secrets"], "30s")  # the entry's too
    assert crm["endpoint"] == "https://crm.example.com/mcp" and crm["service"] == "crm" and crm["rate"] == "60/1m"
    assert crm["oauth"]["client_secret"] == "{{secret:CRM_CLIENT_SECRET}}" and "trust" not in crm
    assert specs[1]["headers"] == [["Authorization", "Bearer {{secret:SEARCH_AUTHORIZATION}}"]]
    assert specs[2]["headers"] == [["X-Api-Key", "{{secret:DOCS_KEY}}"]]
    assert "exclude" not in specs[1] and specs[1]["allow"] == ["web_*"]
    assert specs[2]["allow"] == []  # the entry names no tool: the gateway shows none, nor does the child
    inline, s3 = json.loads(run_cli("spawn-payload", "--config", config, "--format", "agentd", "crm-inline",
                                    "service:s3").stdout)
    assert (inline["allow"], inline["exclude"]) == (["read_*", "search"], ["read_secrets"])  # the entry's, by the floor
    assert s3["auth"] == {"kind": "aws", "region": "eu-west-1", "service": "execute-api", "source": "sso",
                          "sso_start_url": "https://acme.awsapps.com/start", "account_id": "123456789012",
                          "role_name": "McpReader"}  # agentd's names again
    plain = json.loads(run_cli("spawn-payload", "--config", config, "crm-ro").stdout)
    assert plain[0]["trust"]["tool_allowlist"] == ["read_*"]  # mcpcreds' own shape by default
