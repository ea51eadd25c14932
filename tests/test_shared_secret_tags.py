"""Issue #28 (15): the Rule of Two judges a credential, not a cache key. Two servers that name the
same secret under different cache keys carry the union of their tags, so a grant cannot launder
`sensitive` through the name whose tags leave it out."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mcpcreds import Client, Forbidden
from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Config
from tests.conftest import CANARY
from tests.sidecar_proc import run_sidecar

TWO_NAMES = """
[secrets]
sources = ["env"]
[[servers]]
name = "crm"
endpoint = "https://crm.example.com/mcp"
tags = ["sensitive"]
headers = { "X-Api-Key" = "{{secret:KEY}}" }
[[servers]]
name = "crm-mirror"
endpoint = "https://mirror.example.com/mcp"
tags = ["egress"]
headers = { Authorization = "Bearer {{secret:KEY}}" }
[[servers]]
name = "web"
endpoint = "https://web.example.com/mcp"
"""


def parse(text: str) -> Config:
    return parse_config(tomllib.loads(text))


def tags_of(config: Config, name: str) -> frozenset[str]:
    target = config.target(name)
    assert target is not None
    return target.tags


def test_servers_naming_one_secret_under_two_cache_keys_carry_the_tags_of_both() -> None:
    config = parse(TWO_NAMES)
    assert config.servers["crm"].key != config.servers["crm-mirror"].key
    for name in ("crm", "crm-mirror"):
        assert tags_of(config, name) == {"sensitive", "egress"}, name
    assert config.servers["crm-mirror"].spec.to_dict()["tags"] == ["sensitive", "egress"]
    assert tags_of(config, "web") == {"untrusted_input"}  # it names no secret of theirs
    assert any("trifecta" in w for w in config.warnings)


def test_a_secret_file_shared_by_two_servers_shares_their_tags_and_sharing_is_transitive() -> None:
    config = parse("""
[[servers]]
name = "a"
endpoint = "https://a.example.com/mcp"
tags = ["sensitive"]
headers = { "X-Api-Key" = "{{secret-file:/run/keys/one}}" }
[[servers]]
name = "b"
endpoint = "https://b.example.com/mcp"
tags = ["egress"]
headers = { "X-Api-Key" = "{{secret-file:/run/keys/one}}", "X-Other-Key" = "{{secret-file:/run/keys/two}}" }
[[servers]]
name = "c"
endpoint = "https://c.example.com/mcp"
tags = ["untrusted_input"]
headers = { "X-Api-Key" = "{{secret-file:/run/keys/two}}" }
[[servers]]
name = "d"
endpoint = "https://d.example.com/mcp"
tags = ["egress"]
headers = { "X-Api-Key" = "{{secret-file:/run/keys/three}}" }
""")
    for name in ("a", "b", "c"):
        assert tags_of(config, name) == {"sensitive", "egress", "untrusted_input"}, name
    assert tags_of(config, "d") == {"egress"}


def test_an_exec_entry_whose_env_names_a_servers_secret_carries_that_servers_tags() -> None:
    config = parse(TWO_NAMES + '[exec.gh]\nnet = "off"\nenv = { CRM_KEY = "{{secret:KEY}}" }\n'
                   '[exec.other]\nnet = "off"\nenv = { LOG_LEVEL = "debug" }\n')
    assert config.execs["gh"].tags == {"untrusted_input", "sensitive", "egress"}
    assert config.execs["other"].tags == {"untrusted_input"}
    # the entry's own tags describe its child, not the credential: they stay off the servers
    assert tags_of(config, "crm") == {"sensitive", "egress"}


@pytest.mark.parametrize("names", [["crm-mirror", "web"], ["exec:gh"]])
def test_a_grant_cannot_launder_sensitive_through_another_name_for_the_secret(tmp_path: Path,
                                                                             names: list[str]) -> None:
    socket_path, config = tmp_path / "run" / "s.sock", tmp_path / "config.toml"
    config.write_text(f'[sidecar]\nsocket = "{socket_path}"\n' + TWO_NAMES
                      + '[exec.gh]\nnet = "inherit"\nenv = { CRM_KEY = "{{secret:KEY}}" }\n')
    with run_sidecar(config, socket_path, {"KEY": CANARY}) as proc, Client(proc.socket) as client:
        with pytest.raises(Forbidden, match="Rule of Two"):
            client.grant(names, ttl=60)
        assert client.grant(["crm-mirror"], ttl=60)["servers"][0]["tags"] == ["sensitive", "egress"]


def test_a_proxy_only_secret_is_not_handed_out_through_another_name_for_it(tmp_path: Path) -> None:
    """`expose = "proxy"` is judged per credential too: a second server (another cache key) that
    names the same secret with `expose = "both"` does not hand it out in its headers."""
    socket_path, config = tmp_path / "run" / "s.sock", tmp_path / "config.toml"
    config.write_text(f'[sidecar]\nsocket = "{socket_path}"\n' + TWO_NAMES.replace(
        'tags = ["sensitive"]\n', 'tags = ["sensitive"]\nexpose = "proxy"\n'))
    with run_sidecar(config, socket_path, {"KEY": CANARY}) as proc, Client(proc.socket) as client:
        for name in ("crm", "crm-mirror"):
            with pytest.raises(Forbidden) as refused:
                client.headers(name)
            assert refused.value.code == "proxy_only" and CANARY not in str(refused.value)
        assert client.headers("web") == {}
