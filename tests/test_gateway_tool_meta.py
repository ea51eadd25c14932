"""protocol/tool_meta.py (issue 29, zeph `ToolSecurityMeta`): the metadata inferred from a tool's
name by the documented table; configured metadata over it; the data-flow check per trust; each
flagged-parameter pattern matching and not; JSON pointers (escapes, arrays, absence); and the
bounds a call's arguments are read within (past them: a match, never a long read)."""

from __future__ import annotations

from typing import Any

import pytest

from mcpcreds.config.tool_meta import PATTERNS, SENSITIVITIES, FlaggedParameter, ToolMeta
from mcpcreds.protocol.tool_meta import (
    MAX_DEPTH,
    MAX_SCAN_CHARS,
    MAX_STRINGS,
    MAX_URLS,
    Decision,
    check_call,
    data_flow,
    describe,
    flagged,
    flagged_reason,
    infer,
    meta_for,
    resolve,
    words,
)

# ---------------------------------------------------------------------------- inference

TABLE: list[tuple[str, str, tuple[str, ...]]] = [
    ("read_file", "low", ("filesystem_read",)),
    ("get_file", "low", ("filesystem_read",)),
    ("readFile", "low", ("filesystem_read",)),
    ("list_directory", "low", ("filesystem_read",)),
    ("search_files", "low", ("filesystem_read",)),
    ("write_file", "low", ("filesystem_write",)),
    ("delete_file", "low", ("filesystem_write",)),
    ("write", "low", ("filesystem_write",)),
    ("rm", "low", ("filesystem_write",)),
    ("mkdir", "low", ("filesystem_write",)),
    ("run_command", "high", ("shell",)),
    ("exec", "high", ("shell",)),
    ("bash", "high", ("shell",)),
    ("shell.run", "high", ("shell",)),
    ("runPython", "high", ("shell",)),
    ("query", "low", ("database_read",)),
    ("run_query", "low", ("database_read",)),
    ("sql-select", "low", ("database_read",)),
    ("list_tables", "low", ("database_read",)),
    ("execute_sql", "low", ("database_read", "database_write")),
    ("insert_row", "low", ("database_write",)),
    ("update_record", "low", ("database_write",)),
    ("drop_table", "low", ("database_write",)),
    ("fetch_url", "low", ("network",)),
    ("httpGet", "low", ("network",)),
    ("HTTPRequest", "low", ("network",)),
    ("browse", "low", ("network",)),
    ("download_file", "low", ("filesystem_read", "network")),
    ("create_issue", "low", ("external_api",)),
    ("update_issue", "low", ("external_api",)),
    ("slack.post_message", "medium", ("external_api",)),
    ("send_email", "medium", ("external_api",)),
    ("remember", "low", ("memory_write",)),
    ("add_observations", "low", ("memory_write",)),
    ("update_memory", "low", ("memory_write",)),
    ("get_secret", "high", ()),
    ("getApiKey", "high", ("external_api",)),
    ("list_keys", "high", ()),
    ("read_credentials", "high", ()),
    ("vault-read", "high", ()),
    ("get_user", "medium", ()),
    ("list_customers", "medium", ()),
    ("create_payment", "medium", ()),
    ("get_weather", "none", ()),
    ("echo", "none", ()),
    ("monkey_business", "none", ()),  # whole words: no `key`
    ("keyword_search", "none", ()),
]


@pytest.mark.parametrize(("name", "sensitivity", "capabilities"), TABLE, ids=[n for n, _, _ in TABLE])
def test_the_documented_heuristics(name: str, sensitivity: str, capabilities: tuple[str, ...]) -> None:
    assert infer(name) == ToolMeta(sensitivity, capabilities)  # type: ignore[arg-type]


def test_names_are_cut_into_words() -> None:
    assert words("getHTTPResponse_v2-fast.now") >= {"get", "http", "response", "v", "2", "fast", "now"}
    assert words("list_entries") >= {"list", "entries", "entry"}
    assert words("\uff32\uff25\uff21\uff24\uff3f\uff26\uff29\uff2c\uff25") >= {"read", "file"}  # full-width: NFKC
    assert "key" not in words("monkey") and "key" in words("myKeys")


def test_a_description_adds_capabilities_never_sensitivity() -> None:
    meta = infer("helper", "Runs a shell command and reads the user's password file")
    assert meta.data_sensitivity == "low"  # the name says nothing sensitive
    assert {"shell", "filesystem_read"} <= set(meta.capabilities)
    assert infer("get_secret", "harmless").data_sensitivity == "high"


def test_inference_reads_a_bounded_name() -> None:
    assert infer("x" * 10_000 + "_password").data_sensitivity == "none"  # past MAX_NAME_CHARS
    assert infer("get_password_" + "x" * 10_000).data_sensitivity == "high"


def test_configured_metadata_wins_and_says_so() -> None:
    configured = {"run_command": ToolMeta("low", ("shell",))}
    assert meta_for("run_command", configured) == (ToolMeta("low", ("shell",)), "configured")
    assert meta_for("run_commands", configured) == (infer("run_commands"), "inferred")
    listed = {"name": "helper", "description": "fetch a url"}
    assert meta_for(listed, {}) == (ToolMeta("low", ("network",)), "inferred")
    assert meta_for({"name": 7}, {}) == (ToolMeta(), "inferred")


def test_describe_is_json() -> None:
    meta = ToolMeta("high", ("shell",), (FlaggedParameter("/cmd", "shell_metacharacters"),))
    assert describe(meta, "configured") == {
        "data_sensitivity": "high", "capabilities": ["shell"],
        "flagged_parameters": [{"pointer": "/cmd", "pattern": "shell_metacharacters"}], "source": "configured"}


# ---------------------------------------------------------------------------- data flow

EXPECTED = {  # (sensitivity, trust) -> verdict; what the table does not list is allowed
    ("high", "untrusted"): "refuse", ("high", "sandboxed"): "refuse", ("medium", "sandboxed"): "warn",
}


@pytest.mark.parametrize("trust", ["trusted", "untrusted", "sandboxed"])
@pytest.mark.parametrize("sensitivity", SENSITIVITIES)
def test_the_data_flow_check(sensitivity: str, trust: str) -> None:
    decision = data_flow(ToolMeta(sensitivity), trust)  # type: ignore[arg-type]
    verdict = EXPECTED.get((sensitivity, trust), "allow")
    assert decision.verdict == verdict
    assert decision.allowed == (verdict != "refuse")
    assert decision.policy == "data_flow"
    assert bool(decision.reason) == (verdict != "allow")


def test_an_unknown_trust_is_taken_as_sandboxed() -> None:
    assert data_flow(ToolMeta("medium"), "bogus").verdict == "warn"
    assert data_flow(ToolMeta("high"), "").verdict == "refuse"


def test_an_inferred_shell_tool_is_refused_on_an_untrusted_server() -> None:
    decision = data_flow(infer("run_command"), "untrusted")
    assert decision == Decision("refuse", decision.reason, "data_flow") and "tool_metadata" in decision.reason


# ---------------------------------------------------------------------------- patterns

HITS: dict[str, list[str]] = {
    "path_traversal": ["../etc/passwd", "a/../../b", "..", "a\\..\\b", "%2e%2e/x", "%252e%252e%252fx",
                       "\uff0e\uff0e/x", "/etc/passwd", "~/.ssh/id_rsa", "C:\\Windows", "file:///etc/passwd",
                       "file://evil.example/x", "a\0b", "x/.. /y", "/srv/data/../../etc"],
    "shell_metacharacters": ["a; rm -rf /", "a && b", "a | b", "`id`", "$(id)", "${IFS}", "a > f", "a < f",
                             "a\nb", "(x)"],
    "url_with_credentials": ["https://user:pw@example.com/", "see ftp://u@h.example/x", "https://a.example/?token=x",
                             "https://a.example/?x=1&api_key=abc", "https%3A%2F%2Fu%3Ap%40h.example",
                             "http:\\\\u:p@h.example"],
    "private_address": ["10.0.0.1", "http://169.254.169.254/latest/meta-data", "127.0.0.1:8080", "localhost",
                        "[::1]:80", "::1", "http://[::ffff:127.0.0.1]/", "http://2130706433/", "0x7f.1",
                        "http://db/", "redis.internal", "printer.local", "https://api.home.arpa/x",
                        "http://u@192.168.1.1/", "fd00:ec2::254", "http:\\\\10.0.0.1\\x"],
    "sql_injection": ["x' OR '1'='1", "1 or 1=1", "a'; DROP TABLE users", "x\" or \"", "admin'--", "1 /* c */",
                      "1 UNION SELECT password FROM users", "1; delete from t", "sleep(5)", "1 AND pg_sleep (3)",
                      "waitfor delay '0:0:5'", "into outfile '/tmp/x'", "x%27%20OR%201%3D1"],
    "secret_shaped": ["ghp_abcdefghijklmnopqrstuvwxyz0123456789", "Bearer abc.def",
                      "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", "Zx9qLr4TmW2vKp8sNb3YhD7fGj"],
}
MISSES: dict[str, list[str]] = {
    "path_traversal": ["src/main.py", "a/b.c", "...x", "file.txt", "/srv/data", "/srv/data/sub/f",
                       "file:///srv/data/x", "notes..txt"],
    "shell_metacharacters": ["ls -la", "hello world", "a-b_c.d/e", "x=1,y=2"],
    "url_with_credentials": ["https://example.com/path?q=1", "email me@example.com", "https://a.example/@user",
                             "mailto:a@b.example", "no url here"],
    "private_address": ["example.com", "8.8.8.8", "https://example.com/x", "hello world", "1.2.3.256",
                        "http://93.184.216.34/", "2606:4700::1111", "read the docs"],
    "sql_injection": ["O'Brien", "hello world", "SELECT * FROM t", "it's a nice day", "a - b"],
    "secret_shaped": ["hello", "my-project-name", "the quick brown fox", "/srv/data/file.txt"],
}
ROOTS = ("file:///srv/data",)


def check(pattern: str, value: Any) -> list[str]:
    meta = ToolMeta("low", (), (FlaggedParameter("/v", pattern),))
    return flagged(meta, {"v": value}, ROOTS)


@pytest.mark.parametrize(("pattern", "value"), [(p, v) for p, vs in HITS.items() for v in vs])
def test_each_pattern_matches(pattern: str, value: str) -> None:
    assert check(pattern, value) == ["/v"]


@pytest.mark.parametrize(("pattern", "value"), [(p, v) for p, vs in MISSES.items() for v in vs])
def test_each_pattern_lets_the_harmless_pass(pattern: str, value: str) -> None:
    assert check(pattern, value) == []


def test_every_pattern_the_config_accepts_is_implemented() -> None:
    assert set(HITS) == set(MISSES) == set(PATTERNS)
    for pattern in PATTERNS:
        assert check(pattern, "plain") == []  # an unknown pattern would count as a match


def test_without_roots_every_absolute_path_is_a_traversal() -> None:
    meta = ToolMeta("low", (), (FlaggedParameter("/p", "path_traversal"),))
    assert flagged(meta, {"p": "/srv/data/x"}) == ["/p"]
    assert flagged(meta, {"p": "/srv/database/x"}, ROOTS) == ["/p"]  # a prefix is no root
    assert flagged(meta, {"p": "/srv/data/x"}, ("file:///",)) == []


def test_values_inside_a_parameter_are_all_read() -> None:
    assert check("private_address", ["example.com", {"host": "10.0.0.1"}]) == ["/v"]
    assert check("private_address", {"10.0.0.1": "key"}) == ["/v"]  # keys too
    assert check("private_address", 2130706433) == ["/v"]  # a number's text
    assert check("private_address", [True, None, 1.5, "example.com"]) == []


# ---------------------------------------------------------------------------- pointers


def test_pointers_resolve_as_rfc_6901_says() -> None:
    doc = {"a/b": {"m~n": ["x", {"": "y"}]}, "c~1": "z", "": "w"}
    assert resolve(doc, ("a/b", "m~n", "1", "")) == (True, "y")
    assert resolve(doc, ()) == (True, doc)
    assert resolve(doc, ("",)) == (True, "w")
    for missing in (("a/b", "m~n", "2"), ("a/b", "m~n", "01"), ("a/b", "m~n", "-"), ("q",), ("c~1", "0")):
        assert resolve(doc, missing) == (False, None), missing


def test_escaped_pointers_reach_their_parameter() -> None:
    meta = ToolMeta("low", (), (FlaggedParameter("/a~1b", "shell_metacharacters"),
                                FlaggedParameter("/c~01", "shell_metacharacters"),
                                FlaggedParameter("/list/1", "shell_metacharacters")))
    assert flagged(meta, {"a/b": ";", "c~1": "ok", "list": ["ok", "ok"]}) == ["/a~1b"]
    assert flagged(meta, {"a/b": "ok", "c~1": "|", "c/": "ok", "list": ["ok", "&"]}) == ["/c~01", "/list/1"]


def test_the_whole_arguments_and_absent_ones() -> None:
    meta = ToolMeta("low", (), (FlaggedParameter("", "private_address"),))
    assert flagged(meta, {"a": {"b": ["http://10.1.2.3/"]}}) == [""]
    meta = ToolMeta("low", (), (FlaggedParameter("/url", "private_address"),))
    assert flagged(meta, {}) == [] and flagged(meta, None) == [] and flagged(meta, ["x"]) == []


def test_only_pointers_are_returned_once_each_and_the_reason_names_patterns_only() -> None:
    secret = "https://u:CANARY-pw@10.0.0.1/"
    meta = ToolMeta("low", (), (FlaggedParameter("/u", "url_with_credentials"),
                                FlaggedParameter("/u", "private_address"),
                                FlaggedParameter("/other", "sql_injection")))
    hits = flagged(meta, {"u": secret, "other": "fine"})
    assert hits == ["/u"]
    reason = flagged_reason(meta, hits)
    assert "url_with_credentials" in reason and "private_address" in reason and "sql_injection" not in reason
    assert "CANARY" not in reason and "10.0.0.1" not in reason


def test_a_malformed_pointer_counts_as_a_match() -> None:
    meta = ToolMeta("low", (), (FlaggedParameter("no-slash", "sql_injection"),))
    assert flagged(meta, {"no-slash": "fine"}) == ["no-slash"]


# ---------------------------------------------------------------------------- bounds


def test_past_the_depth_a_parameter_counts_as_matching() -> None:
    deep: Any = "fine"
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert check("sql_injection", deep) == ["/v"]
    shallow: Any = "fine"
    for _ in range(MAX_DEPTH - 1):
        shallow = [shallow]
    assert check("sql_injection", shallow) == []


def test_past_the_string_count_a_parameter_counts_as_matching() -> None:
    assert check("sql_injection", ["fine"] * MAX_STRINGS) == []
    assert check("sql_injection", ["fine"] * (MAX_STRINGS + 1)) == ["/v"]


def test_past_the_character_budget_every_later_parameter_counts_as_matching() -> None:
    meta = ToolMeta("low", (), (FlaggedParameter("/a", "shell_metacharacters"),
                                FlaggedParameter("/b", "shell_metacharacters")))
    assert flagged(meta, {"a": "x" * (MAX_SCAN_CHARS - 10), "b": "y" * 10}) == []
    assert flagged(meta, {"a": "x" * (MAX_SCAN_CHARS - 10), "b": "y" * 11}) == ["/b"]


def test_past_the_url_count_a_value_counts_as_matching() -> None:
    assert check("url_with_credentials", " ".join(["https://a.example/"] * MAX_URLS)) == []
    assert check("url_with_credentials", " ".join(["https://a.example/"] * (MAX_URLS + 1))) == ["/v"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_adversarial_values_are_read_in_linear_time(pattern: str) -> None:
    """Shapes that make a naive regex backtrack (a long scheme-like run before no `://`, long runs of
    spaces after quotes, digits after OR): read within the budget (the test's timeout bounds it)."""
    big = MAX_SCAN_CHARS // 8
    for value in ("a" * big + ":/", "' " + " " * big, "or " + "1" * big, ("'" + " " * 64) * (big // 65),
                  "/" * big, "%" * big, "a:" * (big // 2)):
        check(pattern, value)


# ---------------------------------------------------------------------------- one decision a call


def test_a_call_gets_data_flow_first_then_its_flagged_parameters() -> None:
    meta = ToolMeta("medium", (), (FlaggedParameter("/path", "path_traversal"),))
    bad, good = {"path": "../x"}, {"path": "x"}
    assert check_call(meta, "trusted", good) == Decision("allow")
    assert check_call(meta, "sandboxed", good).verdict == "warn"
    refused = check_call(meta, "sandboxed", bad)
    assert (refused.verdict, refused.policy, refused.parameters) == ("refuse", "flagged_parameter", ("/path",))
    assert "path_traversal" in refused.reason and "../x" not in refused.reason
    high = ToolMeta("high", (), meta.flagged_parameters)
    assert check_call(high, "untrusted", bad) == data_flow(high, "untrusted")
    assert check_call(meta, "trusted", {"path": "/srv/data/x"}, ROOTS) == Decision("allow")
