"""`tool_metadata` on a server and a catalog entry (issue 29, zeph `ToolSecurityMeta`): read into
`Target.content.tool_metadata` (tool name -> ToolMeta), a server's entries over its service's tool
by tool; every part validated and bounded; errors name the path, never a value; `check` and
`help config` know it."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mcpcreds.cli.help_config import entries
from mcpcreds.config.load import parse_config
from mcpcreds.config.model import Config
from mcpcreds.config.tool_meta import (
    CAPABILITIES,
    MAX_FLAGGED,
    MAX_POINTER_CHARS,
    MAX_POINTER_TOKENS,
    MAX_TOOLS,
    PATTERNS,
    FlaggedParameter,
    ToolMeta,
    parse_pointer,
)
from mcpcreds.errors import ConfigError
from tests.conftest import CANARY, run_cli
from tests.test_config_no_echo import SHAPES

SERVER = {"name": "a", "endpoint": "https://a.example.com/mcp"}


def parse(data: dict[str, Any]) -> Config:
    return parse_config(data)


def server(tool_metadata: Any) -> dict[str, Any]:
    return {"servers": [{**SERVER, "tool_metadata": tool_metadata}]}


def errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(data)
    return caught.value.errors


def test_a_server_that_says_nothing_has_no_configured_metadata() -> None:
    assert parse({"servers": [SERVER]}).servers["a"].content.tool_metadata == {}


def test_every_part_is_read() -> None:
    text = """
[[servers]]
name = "a"
endpoint = "https://a.example.com/mcp"
[servers.tool_metadata.run_query]
data_sensitivity = "medium"
capabilities = ["database_write", "database_read"]
flagged_parameters = [{ pointer = "/sql", pattern = "sql_injection" },
                      { pointer = "/opts/a~1b~0c/0", pattern = "private_address" }]
[servers.tool_metadata."get.thing-2"]
data_sensitivity = "none"
"""
    meta = parse_config(tomllib.loads(text)).servers["a"].content.tool_metadata
    assert meta == {
        "run_query": ToolMeta("medium", ("database_read", "database_write"), (
            FlaggedParameter("/sql", "sql_injection"), FlaggedParameter("/opts/a~1b~0c/0", "private_address"))),
        "get.thing-2": ToolMeta("none", (), ()),
    }


def test_a_server_overrides_its_service_tool_by_tool() -> None:
    config = parse({
        "services": {"x": {"endpoint": "https://x.example.com/mcp",
                           "tool_metadata": {"a": {"data_sensitivity": "high"},
                                             "b": {"data_sensitivity": "high"}}}},
        "servers": [{"name": "s", "service": "x", "tool_metadata": {"b": {"data_sensitivity": "low"},
                                                                     "c": {"data_sensitivity": "medium"}}},
                    {"name": "t", "service": "x"}],
    })
    assert config.servers["s"].content.tool_metadata == {
        "a": ToolMeta("high"), "b": ToolMeta("low"), "c": ToolMeta("medium")}
    assert config.servers["t"].content.tool_metadata == {"a": ToolMeta("high"), "b": ToolMeta("high")}


def test_gateway_takes_no_tool_metadata() -> None:
    refused = errors({"gateway": {"tool_metadata": {}}})
    assert len(refused) == 1 and refused[0].startswith("gateway.tool_metadata: unknown key"), refused


def test_data_sensitivity_is_required_so_an_entry_cannot_lower_it_by_leaving_it_out() -> None:
    refused = errors(server({"run_command": {"flagged_parameters": []}}))
    assert refused == ["servers[0].tool_metadata.run_command.data_sensitivity: required: one of none, low, "
                       "medium, high"]


TM = "servers[0].tool_metadata"
BAD: list[tuple[Any, str, str]] = [
    ("x", TM, "expected a table of tool name"),
    ({"t": "high"}, f"{TM}.t", "expected a { data_sensitivity, capabilities, flagged_parameters } table"),
    ({"t": {"data_sensitivity": "extreme"}}, f"{TM}.t.data_sensitivity", "expected one of none, low"),
    ({"t": {"data_sensitivity": "low", "colour": 1}}, f"{TM}.t.colour", "unknown key"),
    ({"t": {"data_sensitivity": "low", "capabilities": "shell"}}, f"{TM}.t.capabilities", "expected an array"),
    ({"t": {"data_sensitivity": "low", "capabilities": ["shell", "telepathy"]}}, f"{TM}.t.capabilities[1]",
     "expected one of filesystem_read"),
    ({"t": {"data_sensitivity": "low", "capabilities": ["shell", "shell"]}}, f"{TM}.t.capabilities[1]",
     "listed twice (first as [0])"),
    ({"t": {"data_sensitivity": "low", "flagged_parameters": {}}}, f"{TM}.t.flagged_parameters",
     "expected an array"),
    ({"t": {"data_sensitivity": "low", "flagged_parameters": ["/p"]}}, f"{TM}.t.flagged_parameters[0]",
     "expected a { pointer, pattern } table"),
    ({"t": {"data_sensitivity": "low", "flagged_parameters": [{"pattern": "sql_injection"}]}},
     f"{TM}.t.flagged_parameters[0].pointer", "required"),
    ({"t": {"data_sensitivity": "low", "flagged_parameters": [{"pointer": "p", "pattern": "sql_injection"}]}},
     f"{TM}.t.flagged_parameters[0].pointer", "a JSON pointer starts with '/'"),
    ({"t": {"data_sensitivity": "low", "flagged_parameters": [{"pointer": "/a~2", "pattern": "sql_injection"}]}},
     f"{TM}.t.flagged_parameters[0].pointer", "'~' in a JSON pointer is written ~0"),
    ({"t": {"data_sensitivity": "low", "flagged_parameters": [{"pointer": "/a", "pattern": "evil"}]}},
     f"{TM}.t.flagged_parameters[0].pattern", "expected one of path_traversal, shell_metacharacters"),
    ({"t": {"data_sensitivity": "low", "flagged_parameters": [{"pointer": "/a", "pattern": "sql_injection",
                                                               "x": 1}]}},
     f"{TM}.t.flagged_parameters[0].x", "unknown key"),
    ({"t": {"data_sensitivity": "low", "flagged_parameters": [{"pointer": "/a", "pattern": "sql_injection"}] * 2}},
     f"{TM}.t.flagged_parameters[1]", "listed twice (first as [0])"),
    ({"a b": {"data_sensitivity": "low"}}, f"{TM}.<key #1>", "a tool name is 1 to 128"),
    ({"x" * 129: {"data_sensitivity": "low"}}, f"{TM}.<key #1>", "a tool name is 1 to 128"),
]


@pytest.mark.parametrize(("value", "where", "says"), BAD, ids=[f"{w}:{s}" for _, w, s in BAD])
def test_each_bad_value_is_refused_with_its_path(value: Any, where: str, says: str) -> None:
    refused = errors(server(value))
    assert any(e.startswith(f"{where}: {says}") for e in refused), refused


def test_the_parts_are_bounded() -> None:
    many = {f"t{i}": {"data_sensitivity": "low"} for i in range(MAX_TOOLS + 1)}
    assert errors(server(many)) == [f"{TM}: at most {MAX_TOOLS} tools"]
    assert len(parse(server(dict(list(many.items())[:MAX_TOOLS]))).servers["a"].content.tool_metadata) == MAX_TOOLS
    flags = [{"pointer": f"/p{i}", "pattern": "sql_injection"} for i in range(MAX_FLAGGED + 1)]
    assert errors(server({"t": {"data_sensitivity": "low", "flagged_parameters": flags}})) == [
        f"{TM}.t.flagged_parameters: at most {MAX_FLAGGED} flagged parameters a tool"]
    for pointer, says in (("/" + "a" * MAX_POINTER_CHARS, f"at most {MAX_POINTER_CHARS} characters"),
                          ("/a" * (MAX_POINTER_TOKENS + 1), f"at most {MAX_POINTER_TOKENS} steps")):
        flag = [{"pointer": pointer, "pattern": "sql_injection"}]
        refused = errors(server({"t": {"data_sensitivity": "low", "flagged_parameters": flag}}))
        assert refused == [f"{TM}.t.flagged_parameters[0].pointer: a JSON pointer of {says}"], refused


def test_a_server_and_its_service_together_stay_bounded() -> None:
    half = MAX_TOOLS // 2 + 1
    service = {f"s{i}": {"data_sensitivity": "low"} for i in range(half)}
    own = {f"o{i}": {"data_sensitivity": "low"} for i in range(half)}
    refused = errors({"services": {"x": {"endpoint": "https://x.example.com/mcp", "tool_metadata": service}},
                      "servers": [{"name": "s", "service": "x", "tool_metadata": own}]})
    assert refused == [f"servers[0].tool_metadata: at most {MAX_TOOLS} tools, its service's included"]


def test_pointers_read_as_rfc_6901_says() -> None:
    assert parse_pointer("") == ()
    assert parse_pointer("/") == ("",)
    assert parse_pointer("/a~1b/~0/m~01/0") == ("a/b", "~", "m~1", "0")
    for bad in ("a", "/~", "/a~", "/~2x"):
        with pytest.raises(ValueError):
            parse_pointer(bad)


def test_the_lists_are_the_documented_ones() -> None:
    assert CAPABILITIES == ("filesystem_read", "filesystem_write", "network", "shell", "database_read",
                            "database_write", "memory_write", "external_api")
    assert PATTERNS == ("path_traversal", "shell_metacharacters", "url_with_credentials", "private_address",
                        "sql_injection", "secret_shaped")


def _places() -> list[tuple[str, Any]]:
    """Where a pasted value may sit in a tool_metadata table: a function of the value."""
    def flag(**item: Any) -> Any:
        return {"t": {"data_sensitivity": "low", "flagged_parameters": [item]}}

    return [
        ("the table", lambda v: v),
        ("a tool's entry", lambda v: {"t": v}),
        # json-quoted, as the house sweep does (a key that reads as a name is named in the path)
        ("a tool's name", lambda v: {json.dumps(v): {"data_sensitivity": "low"}}),
        ("data_sensitivity", lambda v: {"t": {"data_sensitivity": v}}),
        ("capabilities", lambda v: {"t": {"data_sensitivity": "low", "capabilities": v}}),
        ("a capability", lambda v: {"t": {"data_sensitivity": "low", "capabilities": [v]}}),
        ("flagged_parameters", lambda v: {"t": {"data_sensitivity": "low", "flagged_parameters": v}}),
        ("a flagged parameter", lambda v: {"t": {"data_sensitivity": "low", "flagged_parameters": [v]}}),
        ("pointer", lambda v: flag(pointer=v, pattern="sql_injection")),
        ("pointer under /", lambda v: flag(pointer=f"/{v}~", pattern="sql_injection") if isinstance(v, str)
         else flag(pointer=v, pattern="sql_injection")),
        ("pattern", lambda v: flag(pointer="/p", pattern=v)),
        ("an unknown key", lambda v: flag(pointer="/p", pattern="sql_injection", colour=v)),
    ]


@pytest.mark.parametrize(("where", "place"), _places(), ids=[w for w, _ in _places()])
def test_no_error_quotes_the_value(where: str, place: Any) -> None:
    refusals = 0
    for shape in SHAPES:
        try:
            parse(server(place(shape)))
        except ConfigError as exc:  # a pointer like "/CANARY..." is a pointer: accepted
            refusals += 1
            assert not any(CANARY in e for e in exc.errors), (where, shape, exc.errors)
            assert CANARY not in exc.message
    assert refusals, "no shape refused: is the place read at all?"


def test_check_validates_it(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    base = '[[servers]]\nname = "a"\nendpoint = "https://a.example.com/mcp"\n'
    path.write_text(base + 'tool_metadata = { get_x = { data_sensitivity = "low", capabilities = ["network"] } }\n')
    assert run_cli("check", "--config", str(path)).code == 0
    path.write_text(base + f'tool_metadata = {{ get_x = {{ data_sensitivity = "{CANARY}" }} }}\n')
    result = run_cli("check", "--config", str(path))
    assert result.code == 2 and "servers[0].tool_metadata.get_x.data_sensitivity: " in result.stderr
    assert CANARY not in result.output


def test_help_config_lists_it() -> None:
    page = {(heading, key): default for heading, key, default, _ in entries()}
    assert page[("[[servers]] and [services.NAME]", "tool_metadata")].startswith("none")
    assert page[("tool_metadata = { TOOL = {...} } (a server's tool metadata)", "data_sensitivity")] == "(required)"
    assert page[("flagged_parameters = [{ pointer, pattern }] (a tool's)", "pattern")] == "(required)"
