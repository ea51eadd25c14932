"""The untrusted pipeline's config (issue 29): a server's and catalog entry's `timeout`, `roots`,
`elicitation_enabled`, `elicitation_timeout_secs`, `sampling_enabled`, `media_passthrough`,
`on_injection` and `pin_tools` as `Target.content`, over `[gateway]`'s defaults; what a sandboxed server gets
whatever it says; the bounds each key is held to (errors name the path, never the value); and
`authorization` on an `[exec.NAME]` entry with `net = "broad_audited"`."""

from __future__ import annotations

import tomllib
from typing import Any, Final

import pytest

from mcpcreds.cli.help_config import entries
from mcpcreds.config.content import DEFAULT_TIMEOUT, MAX_ROOTS, ContentPolicy, check_root
from mcpcreds.config.exec import Authorization
from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Config, Target
from mcpcreds.errors import ConfigError
from tests.conftest import CANARY, run_cli

SERVER = '[[servers]]\nname = "a"\nendpoint = "https://a.example.com/mcp"\n'


def parse(text: str) -> Config:
    return parse_config(tomllib.loads(text))


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    return caught.value.errors


def server(extra: str = "", before: str = "") -> Target:
    return parse(before + SERVER + extra).servers["a"]


# ---------------------------------------------------------------------------- defaults


def test_a_server_that_says_nothing_gets_the_documented_defaults() -> None:
    content = server().content
    assert content == ContentPolicy()
    assert (content.timeout, content.roots, content.elicitation_enabled, content.elicitation_timeout_secs,
            content.media_passthrough, content.on_injection, content.pin_tools, content.sampling_enabled) == (
        DEFAULT_TIMEOUT, None, True, 120, False, "log", None, True)
    assert DEFAULT_TIMEOUT == 300.0
    assert parse("").content_defaults == ContentPolicy()


def test_every_key_is_read_on_a_server() -> None:
    content = server('timeout = "45s"\nroots = ["file:///srv/data", "file://localhost/home/me/p%20q"]\n'
                     'elicitation_enabled = false\nelicitation_timeout_secs = 30\n'
                     'media_passthrough = true\non_injection = "block"\npin_tools = false\n'
                     'sampling_enabled = false\n').content
    assert content == ContentPolicy(45.0, ("file:///srv/data", "file://localhost/home/me/p%20q"), False, 30,
                                    True, "block", False, sampling_enabled=False)


# ---------------------------------------------------------------------------- what trust does


@pytest.mark.parametrize("trust", ["trusted", "untrusted", "sandboxed"])
def test_what_each_trust_level_makes_of_the_defaults(trust: str) -> None:
    target = server(f'trust = "{trust}"\ntool_allowlist = ["t"]\n')
    content, level = target.content, target.trust.trust
    assert content.effective_roots(level) == (() if trust == "sandboxed" else None)
    assert content.effective_elicitation(level) is (trust != "sandboxed")
    assert content.effective_sampling(level) is (trust != "sandboxed")
    assert content.effective_media(level) is False
    assert content.effective_pin_tools(level) is (trust != "trusted")


def test_a_sandboxed_server_never_elicits_samples_nor_passes_media_whatever_it_says() -> None:
    config = parse(SERVER + 'trust = "sandboxed"\ntool_allowlist = ["t"]\nelicitation_enabled = true\n'
                   'media_passthrough = true\nroots = ["file:///srv/box"]\npin_tools = false\n'
                   'sampling_enabled = true\n')
    content = config.servers["a"].content
    assert not content.effective_elicitation("sandboxed") and not content.effective_media("sandboxed")
    assert not content.effective_sampling("sandboxed")
    assert content.effective_roots("sandboxed") == ("file:///srv/box",)  # its own roots, when it has some
    assert content.effective_pin_tools("sandboxed") is False  # the documented opt-out
    assert sorted(config.warnings) == [
        "servers[0].elicitation_enabled: a sandboxed server never elicits: not used",
        "servers[0].media_passthrough: a sandboxed server's media is always withheld: not used",
        "servers[0].sampling_enabled: a sandboxed server never samples: not used"]


def test_explicit_settings_win_for_trusted_and_untrusted() -> None:
    content = server('trust = "trusted"\nmedia_passthrough = true\npin_tools = true\nroots = []\n').content
    assert content.effective_media("trusted") and content.effective_pin_tools("trusted")
    assert content.effective_roots("trusted") == ()  # configured empty: answered, not relayed
    assert not server("elicitation_enabled = false\n").content.effective_elicitation("untrusted")
    assert not server("sampling_enabled = false\n").content.effective_sampling("untrusted")
    assert server('trust = "trusted"\nsampling_enabled = true\n').content.effective_sampling("trusted")


# ---------------------------------------------------------------------------- inheritance


GATEWAY = ('[gateway]\ntimeout = "2m"\nelicitation_enabled = false\nelicitation_timeout_secs = 60\n'
           'media_passthrough = true\non_injection = "block"\npin_tools = false\nsampling_enabled = false\n')
CATALOG = """
[services.crm]
endpoint = "https://crm.example.com/mcp"
timeout = "10s"
roots = ["file:///srv/crm"]
on_injection = "log"

[services.plain]
endpoint = "https://plain.example.com/mcp"
"""


def test_gateway_defaults_reach_every_server_that_says_nothing() -> None:
    config = parse(GATEWAY + SERVER)
    expected = ContentPolicy(120.0, None, False, 60, True, "block", False, sampling_enabled=False)
    assert config.content_defaults == expected and config.servers["a"].content == expected


def test_a_server_overrides_the_gateway_key_by_key() -> None:
    content = server('timeout = 5\npin_tools = true\nsampling_enabled = true\n', before=GATEWAY).content
    assert content == ContentPolicy(5.0, None, False, 60, True, "block", True, sampling_enabled=True)


def test_a_catalog_entry_sits_between_the_gateway_and_its_servers() -> None:
    config = parse(GATEWAY + CATALOG + """
[[servers]]
name = "crm-ro"
service = "crm"

[[servers]]
name = "crm-rw"
service = "crm"
timeout = "30s"
roots = []
elicitation_enabled = true

[[servers]]
name = "p"
service = "plain"
""")
    from_gateway: dict[str, Any] = {"elicitation_enabled": False, "elicitation_timeout_secs": 60, "media_passthrough": True,
                    "pin_tools": False, "sampling_enabled": False}
    service = config.services["service:crm"].content
    assert service == ContentPolicy(10.0, ("file:///srv/crm",), on_injection="log", **from_gateway)
    assert config.servers["crm-ro"].content == service
    assert config.servers["crm-rw"].content == ContentPolicy(30.0, (), True, 60, True, "log", False,
                                                             sampling_enabled=False)
    assert config.servers["p"].content == config.content_defaults  # a catalog entry that says nothing


def test_gateway_takes_no_roots() -> None:
    [error] = errors('[gateway]\nroots = ["file:///srv"]\n')
    assert error.startswith("gateway.roots: unknown key (allowed: listen, timeout, ")


# ---------------------------------------------------------------------------- bounds


BAD: Final = [
    ('timeout = "0s"', "timeout", "expected a duration from 1s to 1h"),
    ("timeout = 0.5", "timeout", "expected a duration from 1s to 1h"),
    ('timeout = "2h"', "timeout", "expected a duration from 1s to 1h"),
    ("timeout = true", "timeout", "invalid duration"),
    ('timeout = "soon"', "timeout", "invalid duration"),
    ("elicitation_timeout_secs = 0", "elicitation_timeout_secs", "expected a whole number from 1 to 3600"),
    ("elicitation_timeout_secs = 3601", "elicitation_timeout_secs", "expected a whole number from 1 to 3600"),
    ("elicitation_timeout_secs = 1.5", "elicitation_timeout_secs", "expected a whole number from 1 to 3600"),
    ("elicitation_timeout_secs = true", "elicitation_timeout_secs", "expected a whole number from 1 to 3600"),
    ('elicitation_enabled = "yes"', "elicitation_enabled", "expected true or false"),
    ("sampling_enabled = 0", "sampling_enabled", "expected true or false"),
    ("media_passthrough = 1", "media_passthrough", "expected true or false"),
    ('pin_tools = "off"', "pin_tools", "expected true or false"),
    ('on_injection = "drop"', "on_injection", 'expected "log" or "block"'),
    ('on_injection = ["log"]', "on_injection", 'expected "log" or "block"'),
    ('roots = "file:///srv"', "roots", "expected an array of at most 64 file:// URIs"),
    ("roots = [1]", "roots[0]", "expected a file:// URI string"),
    ('roots = ["/srv/data"]', "roots[0]", "expected a file:// URI"),
    ('roots = ["https://a.example/srv"]', "roots[0]", "expected a file:// URI"),
    ('roots = ["file:relative/path"]', "roots[0]", "expected a file:// URI"),
    ('roots = ["file://host.example/srv"]', "roots[0]", "of this machine"),
    ('roots = ["file:///srv/../etc"]', "roots[0]", "no '.' or '..' segments"),
    ('roots = ["file:///srv/%2e%2e/etc"]', "roots[0]", "no '.' or '..' segments"),
    ('roots = ["file:///srv/%00"]', "roots[0]", "no NUL"),
    ('roots = ["file:///srv?x=1"]', "roots[0]", "?query or #fragment"),
    ('roots = ["file:///srv#top"]', "roots[0]", "?query or #fragment"),
    ('roots = ["file:///a b"]', "roots[0]", "visible ASCII"),
    ('roots = ["file:///caf\u00e9"]', "roots[0]", "visible ASCII"),
    ('roots = ["file:///srv", "file:///srv"]', "roots[1]", "listed twice (first as [0])"),
]
TABLES: Final = ("servers[0]", "services.x", "gateway")


@pytest.mark.parametrize(("line", "where", "says", "table"),
                         [(*bad, table) for bad in BAD for table in TABLES
                          if not (table == "gateway" and bad[1].startswith("roots"))])  # [gateway] has none
def test_each_bad_value_is_refused_with_its_path(line: str, where: str, says: str, table: str) -> None:
    text = {"servers[0]": SERVER, "services.x": '[services.x]\nendpoint = "https://x.example.com/mcp"\n',
            "gateway": "[gateway]\n"}[table]
    [error] = errors(text + line + "\n")
    assert error.startswith(f"{table}.{where}: ") and says in error, error


def test_roots_are_bounded_in_number_and_length() -> None:
    many = ", ".join(f'"file:///srv/{i}"' for i in range(MAX_ROOTS))
    assert len(server(f"roots = [{many}]\n").content.roots or ()) == MAX_ROOTS
    [error] = errors(SERVER + f'roots = [{many}, "file:///srv/x"]\n')
    assert error == f"servers[0].roots: at most {MAX_ROOTS} roots"
    assert check_root("file:///" + "a" * 2040) is None
    assert "at most 2048" in (check_root("file:///" + "a" * 2041) or "")


def test_a_bad_root_refuses_the_whole_list_not_just_itself() -> None:
    """A list with one bad entry is an error (the config is refused): never served short."""
    assert errors(SERVER + 'roots = ["file:///ok", "nope"]\n') == [
        'servers[0].roots[1]: expected a file:// URI, e.g. "file:///home/me/project"']


def test_no_error_quotes_the_value() -> None:
    values: list[Any] = [f'"{CANARY}"', f'"file:///{CANARY}/../x"', f'"file://{CANARY}/x"', f'["{CANARY}"]',
                         f'["file:///{CANARY}?q"]', f'"{CANARY}s"', f'{{ {CANARY} = 1 }}']
    for key in ("timeout", "roots", "elicitation_enabled", "elicitation_timeout_secs", "media_passthrough",
                "on_injection", "pin_tools", "sampling_enabled"):
        for value in values:
            found = errors(SERVER + f"{key} = {value}\n")
            assert found and not any(CANARY in e for e in found), (key, value, found)


# ---------------------------------------------------------------------------- broad_audited consent


WIDE = '[exec.wide]\nnet = "broad_audited"\n'


def test_broad_audited_without_authorization_names_the_fix() -> None:
    [error] = errors(WIDE)
    assert error == ('exec.wide.authorization: net = "broad_audited" needs the operator\'s consent: add '
                     'authorization = { by = "who allowed it", reason = "why" } to this entry')


def test_the_authorization_is_kept_on_the_entry() -> None:
    entry = parse(WIDE + 'authorization = { by = "alice (ops)", reason = "installs from PyPI" }\n').execs["wide"]
    assert entry.authorization == Authorization("alice (ops)", "installs from PyPI")


@pytest.mark.parametrize(("table", "where", "says"), [
    ("{ by = \"alice\" }", "reason", "required: a non-empty string of at most 1024 characters"),
    ("{ reason = \"r\" }", "by", "required: a non-empty string of at most 128 characters"),
    ("{ by = \"  \", reason = \"r\" }", "by", "required: a non-empty string"),
    ("{ by = 7, reason = \"r\" }", "by", "required: a non-empty string"),
    (f"{{ by = \"{'x' * 129}\", reason = \"r\" }}", "by", "at most 128 characters"),
    (f"{{ by = \"a\", reason = \"{'x' * 1025}\" }}", "reason", "at most 1024 characters"),
    ("{ by = \"a\\nb\", reason = \"r\" }", "by", "must not contain control or format characters"),
    ("{ by = \"a\\u200bb\", reason = \"r\" }", "by", "must not contain control or format characters"),
    ("{ by = \"a\", reason = \"ghp_" + "a" * 36 + "\" }", "reason", "looks like a credential"),
    ("{ by = \"a\", reason = \"r\", when = \"now\" }", "when", "unknown key (allowed: by, reason)"),
])
def test_a_bad_authorization_is_refused_with_its_path(table: str, where: str, says: str) -> None:
    [error] = errors(WIDE + f"authorization = {table}\n")
    assert error.startswith(f"exec.wide.authorization.{where}: ") and says in error, error


def test_authorization_must_be_a_table() -> None:
    [error] = errors(WIDE + 'authorization = "alice"\n')
    assert error == 'exec.wide.authorization: expected a table: { by = "who allowed it", reason = "why" }'



def test_an_authorization_on_another_mode_is_warned_about_not_refused() -> None:
    config = parse('[exec.r]\nnet = "off"\nauthorization = { by = "a", reason = "r" }\n')
    assert config.warnings == ('exec.r.authorization: not used unless net = "broad_audited"',)


# ---------------------------------------------------------------------------- the commands


def test_help_config_lists_every_new_key_with_its_default() -> None:
    shown = {(heading, key): default for heading, key, default, _ in entries()}
    server_keys = "[[servers]] and [services.NAME]"
    assert shown[(server_keys, "timeout")] == "[gateway] timeout, else 300"
    assert shown[(server_keys, "elicitation_timeout_secs")] == "[gateway] elicitation_timeout_secs, else 120"
    for key in ("roots", "elicitation_enabled", "media_passthrough", "on_injection", "pin_tools"):
        assert (server_keys, key) in shown
    assert shown[("[gateway]", "timeout")] == "300" and shown[("[gateway]", "elicitation_enabled")] == "true"
    assert shown[(server_keys, "sampling_enabled")] == "[gateway] sampling_enabled, else true"
    assert shown[("[gateway]", "sampling_enabled")] == "true"
    assert shown[("[exec.NAME]", "sampling_enabled")] == "[gateway]'s, else true (never for sandboxed)"
    assert shown[("[gateway]", "on_injection")] == '"log"'
    assert ("[exec.NAME]", "authorization") in shown


def test_check_validates_the_new_keys(tmp_path: Any) -> None:
    path = tmp_path / "config.toml"
    path.write_text(SERVER + 'timeout = "2h"\n' + WIDE)
    result = run_cli("check", "--config", str(path))
    assert result.code == 2
    assert "servers[0].timeout: expected a duration from 1s to 1h" in result.stderr
    assert "exec.wide.authorization: " in result.stderr
    path.write_text(GATEWAY + SERVER + 'roots = ["file:///srv"]\n' + WIDE
                    + 'authorization = { by = "ops", reason = "r" }\n')
    assert run_cli("check", "--config", str(path)).code == 0
